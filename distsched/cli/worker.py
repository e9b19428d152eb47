"""``distsched worker``: run an app's functions, in one process or several under a
supervisor."""

from __future__ import annotations

import dataclasses
import importlib
import logging
import math
import os
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import click

from distsched.cli.common import connect, duration_option, memory_warning_option, settings_of
from distsched.client import Scheduler
from distsched.errors import InvalidArgument
from distsched.hooks import validate_hooks
from distsched.keys import validate_namespace
from distsched.tasks import TaskHandle, Tasks, served_functions
from distsched.tracebacks import one_line
from distsched.validate import validate_worker_id


def import_object(spec: str, field: str) -> Any:
    """The object ``module:attribute`` names (``attribute`` may be dotted)."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise InvalidArgument(field, f"must be 'module:attribute', got {spec!r}")
    # Like other task runners: modules next to where the worker is started are importable.
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (
            module_name == exc.name or module_name.startswith(exc.name + ".")
        ):
            raise InvalidArgument(field, f"cannot import module {module_name!r}") from None
        raise
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise InvalidArgument(
                field, f"module {module_name!r} has no attribute {attribute!r}"
            ) from None
    return target


def load_hooks(spec: str) -> list[Any]:
    """Import ``module:attribute``: a hook object, a class (made with no arguments), or
    a list of either (see :mod:`distsched.hooks`)."""
    target = import_object(spec, "hooks")
    items = list(target) if isinstance(target, (list, tuple)) else [target]
    return validate_hooks([item() if isinstance(item, type) else item for item in items])


def load_app(spec: str) -> dict[str, Callable[..., Any]]:
    """Import ``module:attribute``: a :class:`~distsched.tasks.Tasks`, a module of task
    handles, a mapping name -> callable, or a list of callables or handles."""
    target = import_object(spec, "app")
    if isinstance(target, (Mapping, Tasks, ModuleType)):
        functions = served_functions(target)
    elif isinstance(target, (list, tuple)):
        functions = {
            f.name if isinstance(f, TaskHandle) else getattr(f, "__name__", ""): (
                f.fn if isinstance(f, TaskHandle) else f
            )
            for f in target
        }
    else:
        raise InvalidArgument(
            "app",
            f"{spec} must be a Tasks, a mapping of name -> function or a list of functions, "
            f"got {type(target).__name__}",
        )
    bad = [
        name
        for name, fn in functions.items()
        if not isinstance(name, str) or not name or not callable(fn)
    ]
    if bad or not functions:
        raise InvalidArgument("app", f"{spec} must name at least one function, by str names")
    return functions


class Processes(click.ParamType):  # type: ignore[type-arg]  # generic in click >= 8.2
    """A number of worker processes: an int >= 1, or ``auto`` for one per core."""

    name = "processes"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif str(value).strip().lower() == "auto":
            return os.cpu_count() or 1
        else:
            try:
                number = int(str(value).strip())
            except ValueError:
                number = 0
        if number < 1:
            raise InvalidArgument("processes", f"must be an int >= 1 or 'auto', got {value!r}")
        return number


@click.command()
@click.argument("app")
@click.option(
    "--processes",
    type=Processes(),
    default="1",
    show_default=True,
    metavar="N|auto",
    help="Worker processes, each with --concurrency slots, under one supervisor that "
    "restarts a process that dies and forwards SIGTERM/SIGINT; auto: one per core.",
)
@click.option(
    "--concurrency",
    type=int,
    default=8,
    show_default=True,
    help="How many task functions may run at once in this process.",
)
@duration_option(
    "--lease",
    "lease_s",
    field="lease_s",
    default="30s",
    help="Lease length (seconds, or 500ms, 30s, 2m); heartbeats renew it every third of it.",
)
@duration_option(
    "--grace",
    field="grace",
    default="30s",
    help="On SIGTERM/SIGINT, how long running functions get before they are cancelled.",
)
@duration_option(
    "--timeout",
    field="timeout",
    metavar="DURATION",
    help="The time limit of a run whose task sets none (default: no limit); see README, "
    "Time limits.",
)
@duration_option(
    "--timeout-grace",
    field="timeout_grace",
    default="5s",
    help="How long a function past its time limit gets to stop before its attempt is "
    "reported failed (with --processes, a def function that still runs then ends with "
    "its process, which is replaced).",
)
@click.option(
    "--max-unsent",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help="Finished tasks whose outcome is not reported yet that may wait before they take "
    "slots again (claiming stops): leases held stay within --concurrency + N. "
    "Default: 2 x --concurrency.",
)
@memory_warning_option(
    "Log a warning (every 10 min) when the memory ended tasks will take at the current "
    "rate and retention exceeds this share of the server's maxmemory."
)
@click.option(
    "--serve",
    "serve",
    multiple=True,
    metavar="NS[:WEIGHT]",
    help="Serve this namespace from the worker's one pool of --concurrency slots, with "
    "this weight (default 1); repeat for each namespace. Under load each namespace holds "
    "slots in proportion to its weight. Without it the worker serves --namespace.",
)
@click.option(
    "--strict",
    is_flag=True,
    help="With --serve: the order of the --serve options decides instead of weights (a "
    "namespace gets only the slots those before it leave).",
)
@click.option("--worker-id", default=None, help="Worker id (default: host:pid:random).")
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    metavar="PORT",
    help="Serve Prometheus metrics at http://ADDR:PORT/metrics (0: any free port). "
    "Needs distsched[metrics].",
)
@click.option(
    "--metrics-addr",
    default="127.0.0.1",
    show_default=True,
    metavar="ADDR",
    help="Address the metrics endpoint listens on.",
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
    help="Least severe log lines written: DEBUG adds one line per success.",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="text for people; json: one JSON object per line (time, level, logger, message, "
    "task_id, fn, version, attempt, duration, outcome, error, traceback).",
)
@click.option(
    "--hooks",
    "hook_specs",
    multiple=True,
    metavar="MODULE:OBJECT",
    help="Worker hooks (before_task, after_task, on_failure; see distsched.hooks): an "
    "object, a class made with no arguments, or a list of them. Repeatable.",
)
@click.option(
    "--otel",
    is_flag=True,
    help="Trace every run as an OpenTelemetry span (distsched.otel.TracingHooks), linked to "
    "the producer's trace; needs the otel extra and a configured tracer provider.",
)
@click.pass_context
def worker(ctx: click.Context, /, app: str, **given: Any) -> None:
    """Run the functions of APP (module:attribute) for the namespace's tasks.

    The attribute is a mapping of name -> function, or a list of functions
    registered under their __name__. SIGTERM or SIGINT shuts down gracefully.
    """
    from distsched.worker.logs import configure

    options = WorkerOptions(**given)
    if not math.isfinite(options.grace) or options.grace < 0:
        raise InvalidArgument("grace", "must be a finite number of seconds >= 0")
    if options.strict and not options.serve:
        raise InvalidArgument("strict", "orders the --serve namespaces: give them")
    _served(options.serve)
    if options.worker_id is not None:
        validate_worker_id(options.worker_id)
    functions = load_app(app)
    hooks = _hooks(options)
    scheduler = connect(ctx, lease_s=options.lease_s)
    scheduler.client.ping()  # an unreachable Redis is an error now, not endless retries
    if options.processes > 1:
        scheduler.close()
        configure(options.log_level.upper(), options.log_format)
        ctx.exit(_supervise(ctx, app, options))
    _run_one(ctx, scheduler, functions, hooks, options)


@dataclasses.dataclass(frozen=True)
class WorkerOptions:
    """The options of ``distsched worker`` but APP, as given."""

    processes: int
    concurrency: int
    lease_s: float
    grace: float
    timeout: float | None
    timeout_grace: float
    max_unsent: int | None
    memory_warning: float
    serve: tuple[str, ...]
    strict: bool
    worker_id: str | None
    metrics_port: int | None
    metrics_addr: str
    log_level: str
    log_format: str
    hook_specs: tuple[str, ...]
    otel: bool


def _served(specs: tuple[str, ...]) -> list[tuple[str, float]]:
    """``--serve NS[:WEIGHT]`` options as (namespace, weight) pairs, checked."""
    pairs = []
    for spec in specs:
        name, _, weight_text = spec.rpartition(":") if ":" in spec else (spec, "", "1")
        try:
            weight = float(weight_text)
        except ValueError:
            weight = math.nan
        if not math.isfinite(weight) or weight <= 0:
            raise InvalidArgument("serve", f"{spec!r}: the weight must be a number > 0")
        pairs.append((validate_namespace(name), weight))
    return pairs


def _hooks(options: WorkerOptions) -> list[Any]:
    hooks = [hook for spec in options.hook_specs for hook in load_hooks(spec)]
    if options.otel:
        from distsched.otel import TracingHooks

        hooks.append(TracingHooks())
    return hooks


def _run_one(
    ctx: click.Context,
    scheduler: Scheduler,
    functions: dict[str, Callable[..., Any]],
    hooks: list[Any],
    options: WorkerOptions,
) -> None:
    """This process is the worker: run it until it is told to stop."""
    from distsched.worker import Worker
    from distsched.worker.logs import configure
    from distsched.worker.pool import WorkerPool
    from distsched.worker.supervisor import EXIT_REPLACE, PROCESS_ENV

    metrics = _serve_metrics(ctx, options.metrics_port, options.metrics_addr)
    # A process of a supervisor ends itself to end a def function past its time limit.
    supervised = PROCESS_ENV in os.environ
    common: dict[str, Any] = {
        "concurrency": options.concurrency,
        "worker_id": options.worker_id,
        "grace": options.grace,
        "metrics": metrics,
        "hooks": hooks,
        "timeout": options.timeout,
        "timeout_grace": options.timeout_grace,
        "stop_on_overrun": supervised,
        "max_unsent": options.max_unsent,
        "memory_warning": options.memory_warning,
    }
    pool: Worker | WorkerPool
    if options.serve:
        served = [
            (Scheduler(scheduler.client, namespace=name, lease_s=options.lease_s), weight)
            for name, weight in _served(options.serve)
        ]
        pool = WorkerPool(served, functions, strict=options.strict, **common)
    else:
        pool = Worker(scheduler, functions, **common)
    # Last, once nothing can fail with a one-line error any more.
    configure(options.log_level.upper(), options.log_format)
    pool.run()  # it logs its start-up line and its shutdown summary
    if pool.ended_by_overrun:
        # Its outcomes are reported; the function that ignored its time limit (and any
        # thread it started) ends with the process, which the supervisor replaces.
        logging.shutdown()
        os._exit(EXIT_REPLACE)


def _supervise(ctx: click.Context, app: str, options: WorkerOptions) -> int:
    """``worker --processes N``: N one-process workers under a supervisor; its exit status."""
    from distsched.worker.supervisor import Supervisor

    settings = settings_of(ctx)
    worker_id, metrics_port = options.worker_id, options.metrics_port

    def child_args(index: int) -> list[str]:
        # Each process its own id and metrics port (PORT + index; 0 stays "any free").
        args = [] if worker_id is None else ["--worker-id", f"{worker_id}-{index}"]
        if metrics_port is not None:
            args += ["--metrics-port", str(metrics_port + index if metrics_port else 0)]
        return args

    # The URL (it may hold a password) and the namespace travel in the environment,
    # not on a command line that every local user can read.
    env = {k: v for k, v in os.environ.items() if k != "DISTSCHED_CLUSTER"}
    env.update(DISTSCHED_REDIS_URL=settings.url, DISTSCHED_NAMESPACE=settings.namespace)
    # A child's shutdown: its grace, then the cancel wait and the last reports (10 s
    # each by default), with a margin.
    supervisor = Supervisor(
        _child_command(app, options),
        options.processes,
        env=env,
        stop_timeout=options.grace + 30.0,
        child_args=child_args,
    )
    return supervisor.run()


def _child_command(app: str, options: WorkerOptions) -> list[str]:
    """The command of one supervised process: the same options, one process each."""
    given: list[tuple[str, ...]] = [
        ("--processes", "1"),
        ("--concurrency", str(options.concurrency)),
        ("--lease", repr(options.lease_s)),
        ("--grace", repr(options.grace)),
        ("--metrics-addr", options.metrics_addr),
        ("--log-level", options.log_level),
        ("--log-format", options.log_format),
        *(("--hooks", spec) for spec in options.hook_specs),
    ]
    if options.otel:
        given.append(("--otel",))
    if options.timeout is not None:
        given.append(("--timeout", repr(options.timeout)))
    given.append(("--timeout-grace", repr(options.timeout_grace)))
    if options.max_unsent is not None:
        given.append(("--max-unsent", str(options.max_unsent)))
    given += [("--serve", spec) for spec in options.serve]
    if options.strict:
        given.append(("--strict",))
    given.append(("--memory-warning", repr(options.memory_warning)))
    return [sys.executable, "-m", "distsched.cli", "worker", app, *(a for g in given for a in g)]


def _serve_metrics(ctx: click.Context, port: int | None, addr: str) -> Any:
    """Start the metrics endpoint (closed when the command ends); None without a port."""
    if port is None:
        return None
    from distsched.metrics import PrometheusMetrics, process_registry, serve_metrics

    metrics = PrometheusMetrics(process_registry())
    try:
        server = serve_metrics(port, addr, metrics.registry)
    except OSError as exc:
        raise click.ClickException(
            f"cannot serve metrics on {addr}:{port}: {one_line(exc)}"
        ) from None
    ctx.call_on_close(server.close)
    click.echo(f"metrics at http://{addr}:{server.port}/metrics", err=True)
    return metrics
