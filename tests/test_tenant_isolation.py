"""A shared Redis: tenants with the documented ACL stay in their namespace and cannot change
the code others run; an admin installs the Functions library; a changed library is refused."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from click.testing import CliRunner, Result
from redis.exceptions import NoPermissionError

from distsched import Scheduler, State, TaskSpec, Worker, library, scripts
from distsched.aio import AsyncScheduler
from distsched.cli import cli
from distsched.keys import Keys
from tests.conftest import RedisServer, require_extra, running

SECURITY_PAGE = Path(__file__).resolve().parent.parent / "docs" / "pages" / "security.md"
TENANT_PASSWORD = "tenant-pw"
ADMIN_PASSWORD = "admin-pw"


# --------------------------------------------------------------------------- the recipes


def security_section() -> str:
    return SECURITY_PAGE.read_text("utf-8")


def recipe(user: str) -> list[list[str]]:
    """The ``ACL SETUSER <user> ...`` lines of the Security page, as rule lists."""
    lines = re.findall(rf"^\s*ACL SETUSER {re.escape(user)} (.+)$", security_section(), re.M)
    assert lines, f"the Security page gives no ACL SETUSER {user} lines"
    return [line.split() for line in lines]


def tenant_rules(namespace: str) -> list[list[str]]:
    """The tenant recipe (written for namespace ``mail``) for ``namespace``."""
    return [
        [
            f">{TENANT_PASSWORD}"
            if rule == ">TENANT_SECRET"
            else rule.replace("{mail}", f"{{{namespace}}}")
            for rule in rules
        ]
        for rules in recipe("mail")
    ]


def admin_rules() -> list[list[str]]:
    return [
        [f">{ADMIN_PASSWORD}" if rule == ">ADMIN_SECRET" else rule for rule in rules]
        for rules in recipe("distsched-admin")
    ]


def set_user(admin: redis.Redis, user: str, rules: list[list[str]]) -> None:
    for line in rules:
        admin.execute_command("ACL", "SETUSER", user, *line)  # type: ignore[no-untyped-call]


def allowed_commands(rules: list[list[str]]) -> set[str]:
    return {rule[1:] for line in rules for rule in line if rule.startswith("+")}


class Shared:
    """One real Redis shared by tenants ``mail`` and ``billing`` and the library's admin."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.root = server.client()
        set_user(self.root, "mail", tenant_rules("mail"))
        set_user(self.root, "billing", tenant_rules("billing"))
        set_user(self.root, "distsched-admin", admin_rules())
        self.clients: list[redis.Redis] = []

    def client(self, user: str) -> redis.Redis:
        password = ADMIN_PASSWORD if user == "distsched-admin" else TENANT_PASSWORD
        client = self.server.client(username=user, password=password)
        self.clients.append(client)
        return client

    def url(self, user: str) -> str:
        password = ADMIN_PASSWORD if user == "distsched-admin" else TENANT_PASSWORD
        return f"redis://{user}:{password}@127.0.0.1:{self.server.port}/0"

    def denied(self, user: str) -> list[str]:
        """The commands (or keys, channels) refused to ``user``, from the server's ACL LOG."""
        log = cast(list[dict[str, Any]], self.root.acl_log(count=1000))
        return sorted({f"{e['reason']} {e['object']}" for e in log if e["username"] == user})

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.root.close()


@pytest.fixture
def shared(own_redis: RedisServer) -> Iterator[Shared]:
    shared = Shared(own_redis)
    try:
        yield shared
    finally:
        shared.close()


@pytest.fixture
def installed(shared: Shared) -> Shared:
    """The shared Redis with the library installed by its admin."""
    reports = library.install(shared.client("distsched-admin"))
    assert [r.action for r in reports] == [library.Action.INSTALLED]
    return shared


def until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


# --------------------------------------------------------------------------- a tenant cannot


def test_the_tenant_recipe_gives_no_admin_or_dangerous_command_and_no_key_listing(
    shared: Shared,
) -> None:
    allowed = allowed_commands(tenant_rules("mail"))
    forbidden: set[str] = set()
    for category in ("admin", "dangerous"):
        listed = cast(list[bytes], shared.root.execute_command("ACL", "CAT", category))  # type: ignore[no-untyped-call]
        forbidden.update(name.decode() for name in listed)
    assert allowed and not allowed & forbidden
    assert not any(
        rule.startswith("+@") or rule == "allcommands"
        for line in tenant_rules("mail")
        for rule in line
    )
    assert not allowed & {"keys", "scan", "function|load", "function|delete", "function|flush"}
    assert not allowed & {"function|restore", "script|flush", "script|kill", "flushall", "flushdb"}


def test_a_tenant_cannot_change_the_library_run_admin_commands_or_list_keys(
    installed: Shared,
) -> None:
    billing = Scheduler(installed.client("billing"), namespace="billing")
    billing.schedule("pay", fn="charge", args=(10,))
    mail = installed.client("mail")
    text = scripts.library()
    attempts: list[tuple[str, ...]] = [
        ("FUNCTION", "LOAD", "REPLACE", text),
        ("FUNCTION", "LOAD", text.replace(scripts.library_name(), "distsched_0000000000000000")),
        ("FUNCTION", "DELETE", scripts.library_name()),
        ("FUNCTION", "FLUSH"),
        ("FUNCTION", "RESTORE", "x"),
        ("SCRIPT", "FLUSH"),
        ("SCRIPT", "KILL"),
        ("CONFIG", "SET", "maxmemory", "1"),
        ("CONFIG", "GET", "requirepass"),
        ("ACL", "SETUSER", "mail", "+@all"),
        ("ACL", "LIST"),
        ("FLUSHALL",),
        ("FLUSHDB",),
        ("MONITOR",),
        ("KEYS", "*"),
        ("SCAN", "0"),
        ("SHUTDOWN",),
    ]
    for command in attempts:
        with pytest.raises(NoPermissionError):
            mail.execute_command(*command)  # type: ignore[no-untyped-call]
    # Lua of its own reaches nothing more: the script's commands are checked too.
    with pytest.raises(redis.ResponseError, match=r"(?i)noperm|can't run this command"):
        mail.eval("return redis.call('FLUSHALL')", 0)
    assert library.check(installed.root)[0].found is scripts.Check.SAME
    assert billing.status("pay").state is State.READY
    assert installed.root.config_get("maxmemory") in ({"maxmemory": "0"}, {b"maxmemory": b"0"})
    billing.close()


def test_a_tenant_cannot_read_or_write_another_namespace_nor_its_channels(
    installed: Shared,
) -> None:
    billing = Scheduler(installed.client("billing"), namespace="billing")
    billing.schedule("pay", fn="charge", args=(10,))
    other = Keys("billing")
    mail = installed.client("mail")
    with pytest.raises(NoPermissionError):
        mail.hgetall(other.tasks)
    with pytest.raises(NoPermissionError):
        mail.hset(other.tasks, "pay", b"junk")
    with pytest.raises(NoPermissionError):
        mail.eval("return redis.call('HGETALL', KEYS[1])", 1, other.tasks)
    with pytest.raises(NoPermissionError):
        mail.execute_command("SPUBLISH", other.wake, "x")  # type: ignore[no-untyped-call]
    with pytest.raises(NoPermissionError):
        mail.execute_command("PUBLISH", other.wake, "x")  # type: ignore[no-untyped-call]
    with pytest.raises(NoPermissionError):
        mail.execute_command("SSUBSCRIBE", other.ended)  # type: ignore[no-untyped-call]
    # The scheduler of a tenant pointed at another namespace: every call refused.
    intruder = Scheduler(mail, namespace="billing")
    with pytest.raises(NoPermissionError):
        intruder.status("pay")
    with pytest.raises(NoPermissionError):
        intruder.schedule("pay", fn="steal")
    with pytest.raises(NoPermissionError):
        intruder.next("thief")
    intruder.close()
    info = billing.status("pay")
    assert (info.state, info.fn, info.args) == (State.READY, "charge", (10,))
    billing.close()


# --------------------------------------------------------------------------- a tenant can


def test_a_tenant_with_the_documented_acl_runs_a_worker_schedules_waits_and_serves_the_dashboard(
    installed: Shared,
) -> None:
    require_extra("starlette")
    require_extra("jinja2")
    from starlette.testclient import TestClient

    from distsched.dashboard import create_app

    installed.root.acl_log_reset()
    s = Scheduler.from_url(installed.url("mail"), namespace="mail", lease_s=5.0)
    ran: list[Any] = []
    try:
        s.schedule_many(
            [TaskSpec("a", "add", args=(1, 2)), TaskSpec("b", "add", args=(3, 4), deps=["a"])]
        )
        s.add_schedule("tick", "tick", interval=0.2)

        def add(x: int, y: int) -> int:
            ran.append((x, y))
            return x + y

        worker = Worker(s, {"add": add, "tick": lambda: ran.append("tick")}, concurrency=2)
        with running(worker):
            assert s.wait("b", timeout=20).state is State.SUCCEEDED
            assert s.result("b", timeout=20) == 7
            until(lambda: "tick" in ran, "a recurring task")
            s.schedule("c", fn="add", args=(5, 5))
            assert s.result("c", timeout=20) == 10
        assert {s.status(t).state for t in "abc"} == {State.SUCCEEDED}
        # The scripts ran as Functions from the admin's library, checked once.
        assert s._scripts["schedule"].mode.functions
        with TestClient(create_app(s)) as web:
            for path in ("/", "/api/overview", "/tasks?state=succeeded", "/task?id=b",
                         "/api/task?id=b", "/leases", "/workers"):  # fmt: skip
                page = web.get(path)
                assert page.status_code == 200, (path, page.status_code)
            assert "add" in web.get("/task?id=b").text
    finally:
        s.close()

    async def story() -> int:
        async with AsyncScheduler.from_url(installed.url("mail"), namespace="mail") as a:
            await a.schedule("d", fn="add", args=(1, 1))
            return (await a.status("d")).version

    assert asyncio.run(story()) >= 1
    # The CLI's reads and writes, as the same user.
    for argv in (["status", "b"], ["stats"], ["workers"], ["leases", "list"], ["cancel", "d"]):
        result = runner().invoke(
            cli,
            ["--redis", installed.url("mail"), "--namespace", "mail", *argv],
            catch_exceptions=False,
            env={"DISTSCHED_REDIS_URL": None, "DISTSCHED_NAMESPACE": None},
        )
        assert result.exit_code == 0, (argv, result.stderr)
    # The only command distsched asked for and was refused is INFO, which it does without
    # (redis-py's CLIENT SETINFO, refused on Redis 7.2 or later, it ignores by itself).
    assert set(installed.denied("mail")) - {"command client|setinfo"} == {"command info"}


def test_a_tenant_with_the_stripe_patterns_runs_a_striped_namespace(installed: Shared) -> None:
    stripes = re.search(r"`(~ds:\{mail\{\*\}:\* &ds:\{mail\{\*\}:\*)`", security_section())
    assert stripes, "the Security page gives no stripe patterns"
    rules = stripes.group(1).split()
    installed.root.execute_command("ACL", "SETUSER", "mail", *rules)  # type: ignore[no-untyped-call]
    installed.root.acl_log_reset()
    s = Scheduler.from_url(installed.url("mail"), namespace="mail", stripes=3, lease_s=5.0)
    try:
        s.schedule_many([TaskSpec(f"{{t{i}}}", "double", args=(i,)) for i in range(9)])
        worker = Worker(s, {"double": lambda i: 2 * i}, concurrency=3)
        with running(worker):
            results = [s.result(f"{{t{i}}}", timeout=20) for i in range(9)]
        assert results == [2 * i for i in range(9)]
    finally:
        s.close()
    assert set(installed.denied("mail")) - {"command client|setinfo"} <= {"command info"}


def test_a_tenant_runs_every_script_by_evalsha_before_an_admin_installs_the_library(
    shared: Shared,
) -> None:
    s = Scheduler(shared.client("mail"), namespace="mail")
    try:
        s.schedule("a", fn="f")
        claim = s.next("w")
        assert getattr(claim, "task_id", None) == "a"
        assert not s._scripts["schedule"].mode.functions
    finally:
        s.close()
    assert library.check(shared.root)[0].found is scripts.Check.MISSING


# --------------------------------------------------------------------------- a library replaced


# The library with schedule's payload swapped for a call of ``evil`` (msgpack {fn: evil}):
# the task a producer schedules would run another function than the one it named.
EVIL_PAYLOAD = "'\\129\\162fn\\164evil'"


def tampered_library() -> str:
    text = scripts.library()
    line = "  KEYS, ARGV, k = keys, args, its_keys\n"
    assert text.count(line) == len(scripts.SCRIPT_NAMES)
    # schedule is the first script: ARGV[5] is the payload of its first task.
    return text.replace(line, f"  if #args >= 5 then args[5] = {EVIL_PAYLOAD} end\n" + line, 1)


def test_a_library_replaced_with_other_code_is_refused_and_the_scheduled_function_runs(
    installed: Shared, caplog: pytest.LogCaptureFixture
) -> None:
    admin = installed.client("distsched-admin")
    admin.function_load(tampered_library(), replace=True)
    assert library.check(admin)[0].found is scripts.Check.DIFFERENT
    ran: list[str] = []
    caplog.set_level(logging.INFO, logger="distsched.scripts")
    s = Scheduler(installed.client("mail"), namespace="mail", lease_s=5.0)
    try:
        for i in range(3):
            s.schedule(f"t{i}", fn="good", args=(i,))
        worker = Worker(
            s, {"good": lambda i: ran.append(f"good {i}"), "evil": lambda: ran.append("evil")}
        )
        with running(worker):
            assert [s.result(f"t{i}", timeout=20) for i in range(3)] == [None] * 3
        assert sorted(ran) == ["good 0", "good 1", "good 2"]
        assert s.status("t0").fn == "good"
        assert not s._scripts["claim"].mode.functions
    finally:
        s.close()
    refusals = [
        r for r in caplog.records if r.levelno == logging.ERROR and r.name == "distsched.scripts"
    ]
    # Once per client (the worker calls through its scheduler's).
    assert len(refusals) == 1, [r.getMessage() for r in refusals]
    message = refusals[0].getMessage()
    assert scripts.library_name() in message
    assert f":{installed.server.port}" in message
    # The refusing client changed nothing: the tampered library is still there.
    assert library.check(admin)[0].found is scripts.Check.DIFFERENT


def test_an_asyncio_client_refuses_a_changed_library_too(
    installed: Shared, caplog: pytest.LogCaptureFixture
) -> None:
    installed.client("distsched-admin").function_load(tampered_library(), replace=True)

    async def story() -> tuple[str | None, bool]:
        async with AsyncScheduler.from_url(installed.url("mail"), namespace="mail") as a:
            await a.schedule("x", fn="good")
            return (await a.status("x")).fn, a._scripts["schedule"].mode.functions

    assert asyncio.run(story()) == ("good", False)
    assert any(
        r.levelno == logging.ERROR and scripts.library_name() in r.getMessage()
        for r in caplog.records
    )


def test_a_library_the_client_loads_itself_is_checked_after_the_load(
    own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A client with the right to load checks again after its own load: here another
    client's changed library lands between its "Function not found" and its load."""
    client = own_redis.client()
    s = Scheduler(client, namespace="reload")
    try:
        s.schedule("a", fn="good")  # checked, then FCALL
        assert s._scripts["schedule"].mode.functions
        real = client.execute_command

        def racing(*args: Any, **options: Any) -> Any:
            if args[:2] == ("FUNCTION", "LOAD"):
                real("FUNCTION", "LOAD", tampered_library())  # type: ignore[no-untyped-call]
            return real(*args, **options)  # type: ignore[no-untyped-call]

        client.execute_command = racing  # type: ignore[method-assign]
        client.function_flush()
        s.schedule("b", fn="good")  # "Function not found", "already exists", refused
        assert s.status("b").fn == "good"
        assert not s._scripts["schedule"].mode.functions
    finally:
        s.close()
        client.close()
    assert [r.levelno for r in caplog.records if r.name == "distsched.scripts"] == [logging.ERROR]


def test_a_user_who_may_not_list_functions_runs_by_evalsha_and_warns_once(
    installed: Shared, caplog: pytest.LogCaptureFixture
) -> None:
    installed.root.execute_command("ACL", "SETUSER", "mail", "-function|list")  # type: ignore[no-untyped-call]
    s = Scheduler(installed.client("mail"), namespace="mail")
    try:
        for i in range(5):
            s.schedule(f"a{i}", fn="f")
        assert s.status("a4").state is State.READY
        assert not s._scripts["schedule"].mode.functions
    finally:
        s.close()
    warnings = [
        r for r in caplog.records if r.levelno == logging.WARNING and r.name == "distsched.scripts"
    ]
    assert len(warnings) == 1 and scripts.library_name() in warnings[0].getMessage()


def test_the_library_is_checked_once_per_client_and_server_not_per_call(
    installed: Shared,
) -> None:
    installed.root.config_resetstat()
    s = Scheduler(installed.client("mail"), namespace="mail")
    try:
        for i in range(20):
            s.schedule(f"a{i}", fn="f")
    finally:
        s.close()
    stats = installed.root.info("commandstats")
    assert stats["cmdstat_function|list"]["calls"] == 1
    assert stats["cmdstat_fcall"]["calls"] >= 20


# --------------------------------------------------------------------------- the admin command


def runner() -> CliRunner:
    try:
        return CliRunner(mix_stderr=False)  # type: ignore[call-arg]  # click < 8.2
    except TypeError:
        return CliRunner()


def library_cli(url: str, *args: str) -> Result:
    return runner().invoke(
        cli,
        ["--redis", url, "library", *args],
        catch_exceptions=False,
        env={"DISTSCHED_REDIS_URL": None, "DISTSCHED_NAMESPACE": None},
    )


OLD = "distsched_0123456789abcdef"


def test_library_install_is_idempotent_replaces_other_code_and_prunes_old_versions_on_request(
    shared: Shared,
) -> None:
    url, name = shared.url("distsched-admin"), scripts.library_name()
    node = f"127.0.0.1:{shared.server.port}"
    checked = library_cli(url, "check")
    assert checked.exit_code == 1 and checked.stdout == f"{node}: {name} is missing\n"
    first = library_cli(url, "install")
    assert first.exit_code == 0 and first.stdout == f"{node}: installed {name}\n"
    again = library_cli(url, "install")
    assert again.stdout == f"{node}: {name} already installed, byte for byte: unchanged\n"
    assert library_cli(url, "check").exit_code == 0
    # An old version and a library that is not distsched's; then this one replaced.
    shared.root.function_load(
        f"#!lua name={OLD}\nredis.register_function('{OLD}_x', function() return 1 end)"
    )
    shared.root.function_load(
        "#!lua name=theirs\nredis.register_function('theirs_x', function() return 1 end)"
    )
    shared.root.function_load(tampered_library(), replace=True)
    checked = library_cli(url, "check")
    assert checked.exit_code == 1
    assert checked.stdout.splitlines() == [
        f"{node}: {name} holds OTHER code than this version ships",
        f"  other versions left: {OLD} (--prune deletes them)",
    ]
    replaced = library_cli(url, "install")
    assert replaced.exit_code == 0
    assert replaced.stdout.splitlines()[0] == f"{node}: replaced {name}, which held other code"
    assert library.check(shared.root)[0].found is scripts.Check.SAME
    assert library.check(shared.root)[0].others == (OLD,)
    pruned = library_cli(url, "install", "--prune")
    assert pruned.stdout.splitlines() == [
        f"{node}: {name} already installed, byte for byte: unchanged",
        f"  deleted other versions: {OLD}",
    ]
    names = set(scripts.listed_libraries(shared.root.function_list()))
    assert names == {name, "theirs"}


def test_library_install_as_a_tenant_is_refused_and_changes_nothing_but_check_works(
    shared: Shared,
) -> None:
    result = library_cli(shared.url("mail"), "install")
    assert result.exit_code == 1 and result.stdout == ""
    assert "admin ACL" in result.stderr and "function|load" in result.stderr
    assert shared.root.function_list() == []
    # Checking needs only function|list, which a tenant has.
    checked = library_cli(shared.url("mail"), "check")
    assert checked.exit_code == 1 and checked.stdout.endswith(" is missing\n")
    library.install(shared.client("distsched-admin"))
    assert library_cli(shared.url("mail"), "check").exit_code == 0


def test_library_install_loads_every_master_of_a_cluster_and_reports_each() -> None:
    from redis.cluster import RedisCluster

    from tests.cluster_fixtures import LocalCluster

    local = LocalCluster(masters=3, replicas=0)
    try:
        for node in local.nodes:
            c = node.server.client()
            set_user(c, "distsched-admin", admin_rules())
            set_user(c, "mail", tenant_rules("mail"))
            c.close()
        url = f"redis+cluster://distsched-admin:{ADMIN_PASSWORD}@127.0.0.1:{local.seed.port}"
        masters = sorted(f"127.0.0.1:{node.port}" for node in local.nodes)
        name = scripts.library_name()
        first = library_cli(url, "install")
        assert first.exit_code == 0, first.stderr
        assert sorted(first.stdout.splitlines()) == [f"{m}: installed {name}" for m in masters]
        # The master of namespace mail gets a changed library: check names it.
        tenant = RedisCluster(
            host="127.0.0.1", port=local.seed.port, username="mail", password=TENANT_PASSWORD
        )
        owner = tenant.get_node_from_key(Keys("mail").meta)  # type: ignore[no-untyped-call]
        changed = redis.Redis(host=owner.host, port=owner.port)
        changed.function_load(tampered_library(), replace=True)
        checked = library_cli(url, "check")
        assert checked.exit_code == 1
        assert f"{owner.name}: {name} holds OTHER code" in checked.stdout
        assert checked.stdout.count("is the exact library") == 2
        # A tenant's client refuses to call it there, and runs by EVALSHA.
        s = Scheduler(tenant, namespace="mail")
        s.schedule("a", fn="good")
        assert s.status("a").fn == "good"
        assert not s._scripts["schedule"].mode.functions
        s.close()
        tenant.close()
        again = library_cli(url, "install")
        lines = sorted(again.stdout.splitlines())
        assert sum("replaced" in line for line in lines) == 1
        assert sum("unchanged" in line for line in lines) == 2
        assert library_cli(url, "check").exit_code == 0
        changed.close()
    finally:
        local.close()
