"""§12 under generated input: bad arguments are refused naming their field and write nothing;
odd but valid ids survive every trip; a foreign producer's broken payload fails only its task.

Every generated bad call must raise ``InvalidArgument`` (a ``ValueError``) whose ``field``
names the culprit, and leave every key of the namespace exactly as it was.
"""

from __future__ import annotations

import datetime as dt
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distsched import Claim, Outcome, Scheduler, State, TaskSpec, Worker, limits, validate
from distsched.errors import (
    CycleError,
    InvalidArgument,
    PayloadTooLarge,
    UnknownDependencyError,
)
from distsched.scripts import source
from distsched.wire.calls import schedule_call
from tests.conftest import namespace_keys, put_payload

PAYLOAD_LIMIT = 256
W = "w"

FAST = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture
def busy(redis_client: redis.Redis, namespace: str) -> Iterator[Scheduler]:
    """A namespace holding a task in most states, with a small payload limit."""
    s = Scheduler(redis_client, namespace=namespace, lease_s=30.0, max_payload_bytes=PAYLOAD_LIMIT)
    s.schedule_many([TaskSpec(i, "f") for i in ("done", "run", "bad", "wait")])
    done, run, bad = s.ready(3, W)
    s.complete(done, "ok")
    s.fail(bad, "boom")
    s.submit("pend", fn="f", deps=["wait"])
    s.schedule("gone", fn="f", delay=3600)
    s.cancel("gone")
    assert run.task_id == "run" and s.status("run").state is State.RUNNING
    yield s
    s.close()


def refused(client: redis.Redis, s: Scheduler, field: str, call: Callable[[], object]) -> None:
    before = namespace_keys(client, s.namespace)
    try:
        call()
    except InvalidArgument as exc:
        assert isinstance(exc, ValueError)
        assert exc.field == field, f"expected field {field!r}, got {exc.field!r}: {exc}"
        assert field in str(exc)
    else:
        raise AssertionError(f"accepted a bad {field}")
    assert namespace_keys(client, s.namespace) == before, "a refused call wrote to Redis"


# --------------------------------------------------------------------------- strategies

UTF8_CHARS = st.characters(codec="utf-8")  # every code point but the surrogates
NOT_STR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.binary(max_size=8),
    st.lists(st.text(max_size=3), max_size=2),
    st.tuples(st.text(max_size=3)),
)
LONE_SURROGATE = st.builds(
    lambda a, s, b: a + s + b,
    st.text(max_size=4),
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
    st.text(max_size=4),
)
TOO_LONG = st.text(UTF8_CHARS, min_size=1, max_size=8).map(
    lambda s: s * (513 // len(s.encode("utf-8")) + 1)
)
BAD_ID = st.one_of(NOT_STR, st.just(""), TOO_LONG, LONE_SURROGATE)

# Valid ids that might trip an encoding: separators of the record and of edges, hash-tag
# braces, line breaks, NUL, the longest ids (512 bytes of 1-, 2-, 3- and 4-byte characters),
# the highest code points (valid UTF-8 never holds the bytes 0xFE/0xFF, which bound key ranges)
# and ids that look like the hex-length encodings themselves.
ODD_IDS = [
    "a b", " ", "a|b", "|", "||x||", "{ns}", "}{", "{", "a\nb", "\n", "\r\n", "x\r\ny",
    "\x00", "a\x00b", "\x00\x00\x00", "\t", "ds:{x}:tasks", "005abcde", "fffx", "w|x|y",
    "x" * 512, "é" * 256, "€" * 170 + "ab", "\U0010ffff" * 128, "\uffff", "\ufeff", "\u2028",
    "\x7f\x80", "\u07ff\u0800", "\U00010000", "\ufffd", "😀 ok",
]  # fmt: skip
VALID_ID = st.one_of(
    st.sampled_from(ODD_IDS),
    st.text(UTF8_CHARS, min_size=1, max_size=24),
).filter(lambda s: len(s.encode("utf-8")) <= 512)

NAN_INF = st.sampled_from([math.nan, math.inf, -math.inf])
HUGE_INT = st.sampled_from([10**400, -(10**400)])  # beyond the float range
BAD_TIME = st.one_of(
    NAN_INF,
    HUGE_INT,
    st.floats(min_value=9.1e12, allow_infinity=False),
    st.floats(max_value=-9.1e12, allow_infinity=False),
    st.integers(min_value=9_007_199_254_741),
    st.integers(max_value=-9_007_199_254_741),
    st.text(max_size=5),
    st.booleans(),
    st.datetimes(),  # naive
    st.binary(max_size=3),
    st.lists(st.integers(), max_size=2),
)
VALID_TIME = st.floats(min_value=0, max_value=1e10)
BAD_PRIORITY = st.one_of(
    st.integers(min_value=2**31),
    st.integers(max_value=-(2**31) - 1),
    st.booleans(),
    st.floats(),
    st.text(max_size=3),
    st.none(),
)
BAD_MAX_ATTEMPTS = st.one_of(
    st.integers(max_value=0),
    st.integers(min_value=1_000_001),
    st.booleans(),
    st.floats(),
    st.text(max_size=3),
    st.none(),
)
BAD_BACKOFF = st.one_of(
    st.floats(max_value=-1e-6),
    st.floats(min_value=3600.001),
    st.integers(min_value=3601),
    st.integers(max_value=-1),
    NAN_INF,
    HUGE_INT,
    st.text(max_size=3),
    st.booleans(),
    st.none(),
)
OVERSIZE = st.integers(min_value=PAYLOAD_LIMIT + 1, max_value=4 * PAYLOAD_LIMIT)
UNENCODABLE = st.one_of(
    st.sampled_from([object(), {1, 2}, 2**64, -(2**63) - 1, complex(1, 2), "\ud800"]),
    LONE_SURROGATE,
)
BAD_FN = st.one_of(st.just(""), NOT_STR, LONE_SURROGATE, OVERSIZE.map(lambda n: "f" * n))
BAD_ARGS = st.one_of(
    st.text(max_size=3),
    st.binary(max_size=3),
    st.integers(),
    st.none(),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.frozensets(st.integers(), max_size=2),
    st.lists(UNENCODABLE, min_size=1, max_size=3),
    st.lists(st.lists(UNENCODABLE, min_size=1, max_size=2), min_size=1, max_size=2),
    OVERSIZE.map(lambda n: [b"x" * n]),
)
BAD_KWARGS = st.one_of(
    st.text(max_size=3),
    st.integers(),
    st.lists(st.tuples(st.text(max_size=2), st.integers()), max_size=2),
    st.dictionaries(
        st.one_of(st.integers(), st.binary(max_size=2), st.none(), st.tuples(st.integers())),
        st.integers(),
        min_size=1,
        max_size=2,
    ),
    st.dictionaries(st.text(max_size=2), UNENCODABLE, min_size=1, max_size=2),
    LONE_SURROGATE.map(lambda k: {k: 1}),
    OVERSIZE.map(lambda n: {"k": b"x" * n}),
)
BAD_DEPS = st.one_of(
    VALID_ID,  # a str where a list belongs
    st.binary(max_size=4),
    st.integers(),
    st.none(),
    st.lists(st.lists(VALID_ID, min_size=1, max_size=2), min_size=1, max_size=2),
    st.lists(BAD_ID, min_size=1, max_size=2),
    st.tuples(VALID_ID, BAD_ID),
    VALID_ID.map(lambda d: [d, d]),
    st.just([f"d{i:05d}" for i in range(validate.MAX_DEPS + 1)]),
)
BAD_BOOL = st.one_of(st.integers(), st.none(), st.text(max_size=3), st.floats())


def case(field: str, strategy: st.SearchStrategy[Any], key: str | None = None) -> Any:
    """(expected field, keyword arguments) with one bad value."""
    return strategy.map(lambda v: (field, {key or field: v}))


TARGET = "wait"  # a ready task of the busy namespace: replacing it would be legal
SCHEDULE_CASES = st.one_of(
    case("task_id", BAD_ID),
    case("run_at", BAD_TIME),
    case("delay", BAD_TIME),
    # The server adds its clock to a delay: beyond 2**52 ms the sum would not be exact.
    case("delay", st.floats(min_value=4.6e12, max_value=9.1e12)),
    st.tuples(VALID_TIME, VALID_TIME).map(lambda t: ("delay", {"run_at": t[0], "delay": t[1]})),
    case("priority", BAD_PRIORITY),
    case("max_attempts", BAD_MAX_ATTEMPTS),
    case("backoff", BAD_BACKOFF),
    case("fn", BAD_FN),
    case("args", BAD_ARGS),
    case("kwargs", BAD_KWARGS),
    case("deps", BAD_DEPS),
    case("optional_deps", BAD_DEPS),
    st.just(("deps", {"deps": ["pend", TARGET]})),
    st.just(("optional_deps", {"optional_deps": [TARGET]})),
    st.lists(VALID_ID.filter(lambda d: d != TARGET), min_size=1, max_size=3, unique=True).map(
        lambda ids: ("optional_deps", {"deps": ids, "optional_deps": ids[-1:]})
    ),
    case("allow_unknown", BAD_BOOL),
    # A waitpoint's timeout: at least 1 ms, at most a year, a finite number of seconds.
    case(
        "waitpoint",
        st.one_of(
            st.floats(max_value=0.0004),
            st.floats(min_value=31_536_000.01, allow_infinity=True, allow_nan=False),
            st.just(float("nan")),
            st.text(max_size=3),
        ),
    ),
)


# --------------------------------------------------------------------------- producers


@FAST
@given(
    bad=SCHEDULE_CASES,
    entry=st.sampled_from(["schedule", "submit", "submit_graph", "schedule_many"]),
)
def test_a_bad_schedule_or_submit_argument_is_refused_naming_its_field_and_writes_nothing(
    busy: Scheduler, redis_client: redis.Redis, bad: tuple[str, dict[str, Any]], entry: str
) -> None:
    field, kwargs = bad
    spec: dict[str, Any] = {"task_id": TARGET, "fn": "f", "allow_unknown": True, **kwargs}
    s = busy
    if entry in ("schedule", "submit"):
        task_id = spec.pop("task_id")
        refused(redis_client, s, field, lambda: getattr(s, entry)(task_id, **spec))
    else:
        # A valid task first: the batch is refused as a whole.
        batch = [TaskSpec("fresh", "f"), TaskSpec(**spec)]
        refused(redis_client, s, field, lambda: getattr(s, entry)(batch))


def test_a_payload_over_max_payload_bytes_is_payload_too_large_naming_its_biggest_part(
    busy: Scheduler,
) -> None:
    big = b"x" * PAYLOAD_LIMIT
    cases: list[tuple[str, dict[str, Any]]] = [
        ("args", {"fn": "f", "args": (big,)}),
        ("kwargs", {"fn": "f", "kwargs": {"k": big}}),
        ("fn", {"fn": "f" * PAYLOAD_LIMIT}),
    ]
    for field, kwargs in cases:
        with pytest.raises(PayloadTooLarge) as info:
            busy.schedule("fresh", **kwargs)
        assert info.value.field == field
    busy.schedule("fits", fn="f", args=(b"x" * (PAYLOAD_LIMIT // 2),))


GRAPH_CASES = st.one_of(
    st.one_of(
        st.none(),
        st.integers(),
        st.text(max_size=3),
        st.binary(max_size=3),
        st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
        st.just(iter([TaskSpec("g", "f")])),
        st.lists(
            st.one_of(
                st.none(),
                st.tuples(VALID_ID, st.just("f")),
                st.dictionaries(st.just("task_id"), VALID_ID, min_size=1),
            ),
            min_size=1,
            max_size=2,
        ).map(lambda xs: [TaskSpec("g", "f"), *xs]),
    ).map(lambda specs: ("specs", specs)),
    VALID_ID.map(lambda i: ("task_id", [TaskSpec(i, "f"), TaskSpec("x", "f"), TaskSpec(i, "g")])),
)


@FAST
@given(bad=GRAPH_CASES)
def test_submit_graph_refuses_anything_but_a_sequence_of_distinct_taskspecs(
    busy: Scheduler, redis_client: redis.Redis, bad: tuple[str, Any]
) -> None:
    field, specs = bad
    refused(redis_client, busy, field, lambda: busy.submit_graph(specs))


# --------------------------------------------------------------------------- by id, claims

CALL_CASES = st.one_of(
    BAD_ID.map(lambda v: ("task_id", "cancel", (v,), {})),
    BAD_ID.map(lambda v: ("task_id", "status", (v,), {})),
    BAD_ID.map(lambda v: ("task_id", "retry", (v,), {})),
    BAD_BOOL.map(lambda v: ("cascade", "retry", ("bad",), {"cascade": v})),
    BAD_ID.map(lambda v: ("task_id", "add_deps", (v, ["wait"]), {})),
    BAD_DEPS.map(lambda v: ("deps", "add_deps", ("pend", v), {})),
    st.sampled_from([[], (), ["pend"]]).map(lambda v: ("deps", "add_deps", ("pend", v), {})),
    BAD_BOOL.map(lambda v: ("allow_unknown", "add_deps", ("pend", ["x"]), {"allow_unknown": v})),
    BAD_ID.map(lambda v: ("task_id", "expire_lease", (v,), {})),
    BAD_ID.map(lambda v: ("task_id", "dependency_results", (v,), {})),
    st.one_of(BAD_DEPS.filter(lambda v: v is not None), st.just([])).map(
        lambda v: ("ids", "dependency_results", ("pend", v), {})
    ),
    st.one_of(st.just(""), NOT_STR, LONE_SURROGATE).map(
        lambda v: ("worker_id", "next", (v,), {})
    ),
    st.one_of(st.just(""), NOT_STR, LONE_SURROGATE).map(
        lambda v: ("worker_id", "ready", (1, v), {})
    ),
    st.one_of(st.integers(max_value=0), st.booleans(), st.floats(), st.text(max_size=2),
              st.none()).map(lambda v: ("n", "ready", (v, W), {})),
    BAD_ID.map(lambda v: ("task_id", "amend", (v,), {"priority": 1})),
    BAD_ID.map(lambda v: ("task_id", "pause_task", (v,), {})),
    BAD_ID.map(lambda v: ("task_id", "resume_task", (v,), {})),
    st.one_of(st.integers(min_value=2**31), st.integers(max_value=-(2**31) - 1), st.booleans(),
              st.floats(), st.text(max_size=2)).map(
        lambda v: ("priority", "amend", ("pend",), {"priority": v})
    ),
    st.one_of(st.integers(max_value=0), st.integers(min_value=1_000_001), st.booleans(),
              st.floats(), st.text(max_size=2)).map(
        lambda v: ("max_attempts", "amend", ("pend",), {"max_attempts": v})
    ),
    st.one_of(st.integers(max_value=-1), st.booleans(), st.floats(), st.text(max_size=2)).map(
        lambda v: ("version", "pause_task", ("pend",), {"version": v})
    ),
)  # fmt: skip


@FAST
@given(bad=CALL_CASES)
def test_a_bad_id_worker_id_count_or_flag_is_refused_naming_its_field_and_writes_nothing(
    busy: Scheduler,
    redis_client: redis.Redis,
    bad: tuple[str, str, tuple[Any, ...], dict[str, Any]],
) -> None:
    field, method, args, kwargs = bad
    refused(redis_client, busy, field, lambda: getattr(busy, method)(*args, **kwargs))


def forged(task_id: Any = "run", version: Any = 1, attempt: Any = 1) -> Claim:
    return Claim(task_id, version, attempt, "f", (), {}, 0, 0.0)


CURRENT = "the running task's own claim"
BAD_COUNTER = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(),
    st.text(max_size=3),
    st.integers(max_value=-1),
    st.integers(min_value=2**63),
)
NOT_A_CLAIM = st.one_of(
    NOT_STR,
    st.tuples(VALID_ID, st.integers(), st.integers()),
    st.dictionaries(st.sampled_from(["task_id", "version", "attempt"]), st.integers()),
)
BAD_ERROR = st.one_of(
    st.none(), st.integers(), st.floats(), st.binary(max_size=3), st.lists(st.text(max_size=2))
)
REPORT_CASES = st.one_of(
    NOT_A_CLAIM.map(lambda c: ("claim", c, None)),
    BAD_ID.map(lambda t: ("claim", forged(task_id=t), None)),
    BAD_COUNTER.map(lambda v: ("claim", forged(version=v), None)),
    BAD_COUNTER.map(lambda v: ("claim", forged(attempt=v), None)),
    UNENCODABLE.map(lambda r: ("result", CURRENT, r)),
    BAD_ERROR.map(lambda e: ("error", CURRENT, e)),
)


@FAST
@given(
    bad=REPORT_CASES,
    entry=st.sampled_from(["complete", "fail", "complete_many", "fail_many", "heartbeat",
                           "release", "confirm_cancel"]),
)  # fmt: skip
def test_a_bad_claim_result_or_error_is_refused_naming_its_field_and_writes_nothing(
    busy: Scheduler, redis_client: redis.Redis, bad: tuple[str, Any, Any], entry: str
) -> None:
    s = busy
    info = s.status("run")
    good = forged(version=info.version, attempt=info.attempt)
    field, claim, value = bad
    claim = good if claim is CURRENT else claim
    if field == "result" and entry not in ("complete", "complete_many"):
        entry = "complete"
    if field == "error" and entry not in ("fail", "fail_many"):
        entry = "fail"
    if field == "claim":
        value = "boom" if entry.startswith("fail") else None
    calls: dict[str, Callable[[], object]] = {
        "complete": lambda: s.complete(claim, value),
        "fail": lambda: s.fail(claim, value),
        # The current token first: nothing of the batch may be applied.
        "complete_many": lambda: s.complete_many([(good, None), (claim, value)]),
        "fail_many": lambda: s.fail_many([(good, "boom"), (claim, value)]),
        "heartbeat": lambda: s.heartbeat(claim),
        "release": lambda: s.release([good, claim]),
        "confirm_cancel": lambda: s.confirm_cancel(claim),
    }
    refused(redis_client, s, field, calls[entry])


BAD_FRACTION = st.one_of(
    st.floats().filter(lambda f: not 0.0 <= f <= 1.0),
    st.integers().filter(lambda n: not 0 <= n <= 1),
    st.booleans(),
    st.text(max_size=3),
    st.binary(max_size=3),
    st.none(),
)
BAD_NOTE = st.one_of(
    st.text(min_size=limits.MAX_PROGRESS_NOTE_BYTES + 1, max_size=260),
    st.integers(),
    st.binary(max_size=3),
    LONE_SURROGATE,
)
PROGRESS_CASES = st.one_of(
    NOT_A_CLAIM.map(lambda c: ("claim", c, 0.5, "")),
    BAD_ID.map(lambda t: ("claim", forged(task_id=t), 0.5, "")),
    BAD_COUNTER.map(lambda v: ("claim", forged(version=v), 0.5, "")),
    BAD_FRACTION.map(lambda f: ("fraction", CURRENT, f, "")),
    BAD_NOTE.map(lambda n: ("note", CURRENT, 0.5, n)),
    UNENCODABLE.map(lambda v: ("checkpoint", CURRENT, None, v)),
    st.just(("checkpoint", CURRENT, None, b"x" * limits.MAX_CHECKPOINT_BYTES)),
)


@FAST
@given(bad=PROGRESS_CASES)
def test_a_bad_progress_report_or_checkpoint_is_refused_naming_its_field_and_writes_nothing(
    busy: Scheduler, redis_client: redis.Redis, bad: tuple[str, Any, Any, Any]
) -> None:
    s = busy
    info = s.status("run")
    field, claim, fraction, other = bad
    claim = forged(version=info.version, attempt=info.attempt) if claim is CURRENT else claim
    if field == "checkpoint":
        refused(redis_client, s, field, lambda: s.save_checkpoint(claim, other))
    else:
        refused(redis_client, s, field, lambda: s.report_progress(claim, fraction, other))


# --------------------------------------------------------------------------- valid odd ids


@pytest.fixture
def fresh(redis_client: redis.Redis) -> Iterator[Callable[[], Scheduler]]:
    """A scheduler on a new, empty namespace per call (each Hypothesis example needs one)."""
    made: list[Scheduler] = []

    def make() -> Scheduler:
        s = Scheduler(redis_client, namespace="t" + uuid.uuid4().hex[:12], lease_s=30.0)
        made.append(s)
        return s

    yield make
    for s in made:
        keys = list(namespace_keys(redis_client, s.namespace))
        if keys:
            redis_client.delete(*keys)
        s.close()


@settings(FAST, max_examples=60)
@given(ids=st.lists(VALID_ID, min_size=2, max_size=2, unique=True))
def test_odd_but_valid_ids_round_trip_through_schedule_claim_complete_and_status(
    fresh: Callable[[], Scheduler], ids: list[str]
) -> None:
    a, b = ids
    s = fresh()
    # Errors carry the ids intact.
    with pytest.raises(UnknownDependencyError) as unknown:
        s.submit(b, fn="f", deps=[a])
    assert (unknown.value.task_id, unknown.value.dependency) == (b, a)
    with pytest.raises(CycleError) as cycle:
        s.submit_graph([TaskSpec(a, "f", deps=[b]), TaskSpec(b, "f", deps=[a])])
    assert cycle.value.path in ([a, b, a], [b, a, b])
    assert s.stats()["sequence"] == 0

    va = s.schedule(a, fn="f", args=(a,), kwargs={a: [a]}, priority=1)
    vb = s.submit(b, fn="g", deps=[a], args=(b,))
    assert s.status(b).state is State.PENDING
    assert (s.status(b).deps, s.status(a).dependents) == ((a,), (b,))
    # A worker id holds at most MAX_WORKER_ID_BYTES: the id's head, whole characters.
    worker = f"worker {a}".encode()[: limits.MAX_WORKER_ID_BYTES].decode("utf-8", "ignore")
    claims = s.ready(5, worker)
    assert [(c.task_id, c.version, c.fn, c.args, c.kwargs) for c in claims] == [
        (a, va, "f", (a,), {a: [a]})
    ]
    [claim] = claims
    assert s.heartbeat(claim) is False
    assert s.complete(claim, {"id": a}) is Outcome.APPLIED
    assert s.complete(claim, {"id": a}) is Outcome.DUPLICATE
    info = s.status(a)
    assert (info.task_id, info.state, info.result, info.attempt) == (
        a, State.SUCCEEDED, {"id": a}, 1,
    )  # fmt: skip
    [claim_b] = s.ready(5, W)
    assert (claim_b.task_id, claim_b.version, claim_b.args) == (b, vb, (b,))
    assert s.fail(claim_b, f"failed: {b}") is Outcome.APPLIED
    assert (s.status(b).state, s.status(b).error) == (State.FAILED, f"failed: {b}")
    assert s.retry(b) > vb
    assert s.cancel(b) is State.CANCELLED
    assert s.stats()["counts"]["cancelled"] == 1


# --------------------------------------------------------------------------- foreign payloads


def _not_msgpack(raw: bytes) -> bool:
    try:
        msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception:
        return True
    return False


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]


ANY_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(),
                      st.text(max_size=4), st.binary(max_size=4))  # fmt: skip
NOT_A_LIST = st.one_of(ANY_VALUE, st.dictionaries(st.text(max_size=2), ANY_VALUE, max_size=2))
BROKEN_PAYLOADS = st.one_of(
    st.binary(min_size=1, max_size=24).filter(_not_msgpack),
    st.just(b""),
    st.one_of(ANY_VALUE, st.lists(ANY_VALUE, max_size=3)).map(pack),
    st.one_of(st.just(""), ANY_VALUE.filter(lambda v: not isinstance(v, str)),
              st.lists(st.text(max_size=2), max_size=2)).map(lambda fn: pack({"fn": fn})),
    st.dictionaries(st.text(max_size=3).filter(lambda k: k != "fn"), ANY_VALUE,
                    max_size=3).map(pack),
    # A nil args is empty (JavaScript encoders send nil for undefined).
    NOT_A_LIST.filter(lambda v: v is not None).map(lambda args: pack({"fn": "f", "args": args})),
    st.one_of(ANY_VALUE.filter(lambda v: v is not None), st.lists(ANY_VALUE, max_size=2),
              st.dictionaries(st.integers(-9, 9), ANY_VALUE, min_size=1, max_size=2)).map(
        lambda kwargs: pack({"fn": "f", "args": [], "kwargs": kwargs})
    ),
)  # fmt: skip


def foreign_schedule(client: redis.Redis, s: Scheduler, task_id: str, payload: bytes) -> None:
    """Enqueue a task whose stored payload is then overwritten by hand (the schedule
    script itself refuses a payload a worker cannot decode)."""
    call = schedule_call(s.keys, [TaskSpec(task_id, "f", priority=1)], s.max_payload_bytes)
    client.register_script(source("schedule"))(keys=call.keys, args=call.args)
    put_payload(client, s.keys, task_id, payload)


@settings(FAST, max_examples=12)
@given(payloads=st.lists(BROKEN_PAYLOADS, min_size=1, max_size=3))
def test_a_foreign_payload_that_does_not_decode_fails_only_its_task_and_the_worker_carries_on(
    fresh: Callable[[], Scheduler], redis_client: redis.Redis, payloads: list[bytes]
) -> None:
    s = fresh()
    bad = [f"bad{i}" for i in range(len(payloads))]
    good = ["good0", "good1"]
    for task_id, payload in zip(bad, payloads, strict=True):
        foreign_schedule(redis_client, s, task_id, payload)
    # The good tasks come after the broken ones in the queue.
    for task_id in good:
        s.schedule(task_id, fn="f", args=(task_id,))
    ran: list[str] = []
    worker = Worker(s, {"f": ran.append}, concurrency=2)
    thread = threading.Thread(target=worker.run, name="test-worker-run")
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while s.stats()["counts"]["succeeded"] + s.stats()["counts"]["failed"] < len(bad) + 2:
            assert time.monotonic() < deadline, "the worker did not finish"
            time.sleep(0.01)
    finally:
        worker.stop(5.0)
        thread.join(30)
    assert not thread.is_alive()
    for task_id in bad:
        info = s.status(task_id)
        assert info.state is State.FAILED and info.error and "decode" in info.error, info
        assert info.attempt == 1
    for task_id in good:
        assert s.status(task_id).state is State.SUCCEEDED
    assert sorted(ran) == good
    assert worker.counts["failed"] == len(bad)


# --------------------------------------------------------------------------- times


@FAST
@given(
    run_at=st.one_of(
        # Epochs beyond the year 9999 read as milliseconds and are refused.
        st.floats(min_value=-validate.MAX_EPOCH_S, max_value=validate.MAX_EPOCH_S),
        st.integers(min_value=-int(validate.MAX_EPOCH_S), max_value=int(validate.MAX_EPOCH_S)),
        st.datetimes(min_value=dt.datetime(1, 1, 2), timezones=st.just(dt.timezone.utc)),
    )
)
def test_every_accepted_run_at_is_stored_to_the_millisecond(
    fresh: Callable[[], Scheduler], run_at: float | dt.datetime
) -> None:
    s = fresh()
    s.schedule("t", fn="f", run_at=run_at)
    seconds = run_at.timestamp() if isinstance(run_at, dt.datetime) else float(run_at)
    assert s.status("t").run_at == math.floor(seconds * 1000 + 0.5) / 1000


@FAST
@given(delay=st.floats(min_value=-4.5e12, max_value=4.5e12))
def test_every_accepted_delay_gives_an_exact_run_at_from_the_server_clock(
    fresh: Callable[[], Scheduler], delay: float
) -> None:
    s = fresh()
    before = math.floor(s.server_time() * 1000)
    s.schedule("t", fn="f", delay=delay)
    after = math.ceil(s.server_time() * 1000)
    ms = round(s.status("t").run_at * 1000)
    assert abs(ms) <= validate.MAX_MS
    offset = math.floor(delay * 1000 + 0.5)
    # run_at is float seconds: at these magnitudes its milliseconds are exact to one.
    assert before + offset - 1 <= ms <= after + offset + 1


@pytest.mark.parametrize(
    "value",
    [10**400, -(10**400), 1e308, math.nan, math.inf],
    ids=["huge int", "huge negative int", "1e308", "nan", "inf"],
)
def test_a_lease_or_retention_beyond_any_float_is_refused_naming_its_field(
    redis_client: redis.Redis, namespace: str, value: Any
) -> None:
    with pytest.raises(InvalidArgument) as info:
        Scheduler(redis_client, namespace=namespace, lease_s=value)
    assert info.value.field == "lease_s"
    s = Scheduler(redis_client, namespace=namespace)
    try:
        with pytest.raises(InvalidArgument) as info:
            s.set_retention(value)
        assert info.value.field == "retention_s"
    finally:
        s.close()
    assert namespace_keys(redis_client, namespace) == {}
