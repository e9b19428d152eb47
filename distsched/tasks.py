"""Typed tasks: functions made task handles, scheduled with their own arguments.

::

    tasks = Tasks()

    @tasks.task(max_attempts=3)
    def send_welcome(user_id: int) -> str: ...

    tasks.bind(Scheduler.from_url(url))
    send_welcome.schedule("welcome:42", 42)                       # checked by mypy
    send_welcome.options(delay=60).schedule("welcome:43", 43)     # with task options
    Worker(scheduler, tasks).run()                                # serves every handle

A handle schedules by name (the function's ``__name__`` unless ``name=`` is given), so
producers in other languages, and the name-based ``Scheduler.schedule(fn=...)``, reach the
same function. Task options cannot sit among the function's own keywords in a typed call
(PEP 612 allows no extra keyword beside ``**kwargs: P.kwargs``), so they go through
:meth:`TaskHandle.options`, or as defaults on the decorator.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, cast, overload

from distsched.context import current_task
from distsched.errors import DistschedError, InvalidArgument
from distsched.limits import DEFAULT_MAX_PAYLOAD_BYTES
from distsched.model import Options, TaskSpec
from distsched.wire.calls import schedule_values

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from distsched.aio import AsyncScheduler
    from distsched.client import Scheduler

P = ParamSpec("P")
R = TypeVar("R")

__all__ = ["AsyncTask", "NotBoundError", "Task", "TaskHandle", "Tasks", "served_functions"]


class NotBoundError(DistschedError, RuntimeError):
    """A handle was asked to schedule before its :class:`Tasks` had a scheduler."""


class TaskHandle(Generic[P, R]):
    """What the two kinds of handle share: scheduling, results, options.

    ``R`` is what the function returns (for an ``async def`` function, what it returns
    once awaited), so :meth:`result` is typed.
    """

    def __init__(self, fn: Callable[P, Any], name: str, registry: Tasks, defaults: Options) -> None:
        self.fn = fn
        self.name = name
        self.registry = registry
        self.defaults: Options = defaults
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", name)
        self.__qualname__ = getattr(fn, "__qualname__", name)
        self.__module__ = getattr(fn, "__module__", __name__)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    def options(self, **options: Unpack[Options]) -> TaskHandle[P, R]:
        """This handle with ``options`` (delay, priority, deps, max_attempts, timeout...)
        over its defaults, for the next calls made through it."""
        handle = type(self).__new__(type(self))
        handle.__dict__.update(self.__dict__)
        handle.defaults = cast(Options, {**self.defaults, **options})
        return handle

    def spec(self, task_id: str, /, *args: P.args, **kwargs: P.kwargs) -> TaskSpec:
        """The :class:`TaskSpec` of calling the function with these arguments as
        ``task_id``: for ``schedule_many`` and ``submit_graph``."""
        return TaskSpec(
            task_id,
            self.name,
            args=list(args),
            kwargs=dict(kwargs),
            **cast(dict[str, Any], self.defaults),
        )

    def schedule(self, task_id: str, /, *args: P.args, **kwargs: P.kwargs) -> int:
        """Schedule a call of the function with these arguments as ``task_id``; return the
        version (see :meth:`Scheduler.schedule`)."""
        return self.registry.scheduler.schedule(task_id, **self._options(args, kwargs))

    async def schedule_async(self, task_id: str, /, *args: P.args, **kwargs: P.kwargs) -> int:
        """:meth:`schedule` through the bound :class:`~distsched.aio.AsyncScheduler`."""
        return await self.registry.async_scheduler.schedule(task_id, **self._options(args, kwargs))

    def result(self, task_id: str, timeout: float | None = None) -> R:
        """Wait for ``task_id`` to end; its result (see :meth:`Scheduler.result`)."""
        return cast(R, self.registry.scheduler.result(task_id, timeout))

    async def result_async(self, task_id: str, timeout: float | None = None) -> R:
        """:meth:`result` through the bound :class:`~distsched.aio.AsyncScheduler`."""
        return cast(R, await self.registry.async_scheduler.result(task_id, timeout))

    def dependency_result(self, dep_id: str) -> R:
        """Inside a running task: the result of its dependency ``dep_id``, a task of this
        handle's function, typed (see :meth:`TaskContext.dependency_result`)."""
        return cast(R, current_task().dependency_result(dep_id))

    async def dependency_result_async(self, dep_id: str) -> R:
        """The ``async def`` flavour of :meth:`dependency_result`."""
        return cast(R, await current_task().dependency_result_async(dep_id))

    def _options(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return {**self.defaults, "fn": self.name, "args": list(args), "kwargs": kwargs}


class Task(TaskHandle[P, R]):
    """A ``def`` function as a task. Calling the handle calls the function here."""

    fn: Callable[P, R]

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def options(self, **options: Unpack[Options]) -> Task[P, R]:
        return cast(Task[P, R], super().options(**options))


class AsyncTask(TaskHandle[P, R]):
    """An ``async def`` function as a task. Calling the handle makes its coroutine."""

    fn: Callable[P, Coroutine[Any, Any, R]]

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
        return self.fn(*args, **kwargs)

    def options(self, **options: Unpack[Options]) -> AsyncTask[P, R]:
        return cast(AsyncTask[P, R], super().options(**options))


class Tasks:
    """A set of task handles, and the scheduler they schedule through.

    ``Tasks(scheduler)`` or :meth:`bind` later (a ``Scheduler`` for :meth:`~TaskHandle.schedule`,
    an ``AsyncScheduler`` for :meth:`~TaskHandle.schedule_async`; both may be bound). A
    :class:`~distsched.Worker` given a ``Tasks`` serves every handle in it.
    """

    def __init__(
        self,
        scheduler: Scheduler | AsyncScheduler | None = None,
    ) -> None:
        self._handles: dict[str, TaskHandle[Any, Any]] = {}
        self._scheduler: Scheduler | None = None
        self._async_scheduler: AsyncScheduler | None = None
        if scheduler is not None:
            self.bind(scheduler)

    def bind(self, scheduler: Scheduler | AsyncScheduler | None) -> None:
        """Schedule through ``scheduler`` from now on (None unbinds both kinds)."""
        from distsched.aio import AsyncScheduler
        from distsched.client import Scheduler

        if scheduler is None:
            self._scheduler = self._async_scheduler = None
        elif isinstance(scheduler, AsyncScheduler):
            self._async_scheduler = scheduler
        elif isinstance(scheduler, Scheduler):
            self._scheduler = scheduler
        else:
            raise InvalidArgument(
                "scheduler", f"must be a Scheduler or an AsyncScheduler, got {scheduler!r}"
            )

    @property
    def scheduler(self) -> Scheduler:
        """The bound ``Scheduler``; ``NotBoundError`` when there is none."""
        if self._scheduler is None:
            raise NotBoundError("no Scheduler bound: Tasks(scheduler) or tasks.bind(scheduler)")
        return self._scheduler

    @property
    def async_scheduler(self) -> AsyncScheduler:
        """The bound ``AsyncScheduler``; ``NotBoundError`` when there is none."""
        if self._async_scheduler is None:
            raise NotBoundError("no AsyncScheduler bound: tasks.bind(AsyncScheduler.from_url(...))")
        return self._async_scheduler

    @overload
    def task(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> AsyncTask[P, R]: ...  # type: ignore[overload-overlap]

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(self, /, *, name: str | None = None, **defaults: Unpack[Options]) -> _Decorator: ...

    def task(self, fn: Any = None, /, *, name: str | None = None, **defaults: Any) -> Any:
        """Make ``fn`` a task handle: ``@tasks.task`` or ``@tasks.task(name=..., **options)``.

        ``name`` is what producers schedule (default: the function's ``__name__``);
        ``options`` are defaults of every call (``max_attempts``, ``timeout``...).
        """
        if fn is None:
            return _Decorator(self, name, cast(Options, defaults))
        return self._add(fn, name, cast(Options, defaults))

    def _add(self, fn: Callable[..., Any], name: str | None, defaults: Options) -> Any:
        if not callable(fn):
            raise InvalidArgument("fn", f"must be a function, got {fn!r}")
        name = name if name is not None else getattr(fn, "__name__", "")
        if not isinstance(name, str) or not name or name == "<lambda>":
            raise InvalidArgument("name", f"must be a non-empty str naming the task, got {name!r}")
        _check_defaults(defaults)
        if name in self._handles:
            raise InvalidArgument("name", f"a task named {name!r} is already in this Tasks")
        kind: type[TaskHandle[Any, Any]]
        kind = AsyncTask if inspect.iscoroutinefunction(fn) else Task
        handle = kind(fn, name, self, defaults)
        self._handles[name] = handle
        return handle

    def __iter__(self) -> Iterator[TaskHandle[Any, Any]]:
        return iter(list(self._handles.values()))

    def __len__(self) -> int:
        return len(self._handles)

    def __getitem__(self, name: str) -> TaskHandle[Any, Any]:
        return self._handles[name]

    @property
    def functions(self) -> dict[str, Callable[..., Any]]:
        """Name -> function of every handle: what a worker serves."""
        return {name: handle.fn for name, handle in self._handles.items()}


class _Decorator:
    """``@tasks.task(...)`` with options: applied to the function next."""

    def __init__(self, registry: Tasks, name: str | None, defaults: Options) -> None:
        self.registry, self.name, self.defaults = registry, name, defaults

    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> AsyncTask[P, R]: ...  # type: ignore[overload-overlap]

    @overload
    def __call__(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    def __call__(self, fn: Any, /) -> Any:
        return self.registry._add(fn, self.name, self.defaults)


_NOT_DEFAULTS = ("fn", "args", "kwargs")


def _check_defaults(defaults: Mapping[str, Any]) -> None:
    """The options a handle carries are TaskSpec fields, checked now rather than at the
    first schedule."""
    for field in _NOT_DEFAULTS:
        if field in defaults:
            raise InvalidArgument(field, "is given by the handle's call, not as an option")
    try:
        spec = TaskSpec("t", "f", **defaults)
    except TypeError as exc:
        raise InvalidArgument("options", str(exc)) from None
    # What schedule would refuse (a bad max_attempts, both delay and run_at...).
    schedule_values(spec, DEFAULT_MAX_PAYLOAD_BYTES)


def served_functions(
    functions: Mapping[str, Callable[..., Any]]
    | Tasks
    | ModuleType
    | Iterable[TaskHandle[Any, Any]],
) -> dict[str, Callable[..., Any]]:
    """Name -> function for a worker: from a mapping (handles in it are unwrapped), a
    :class:`Tasks`, a module (every handle defined in it), or handles."""
    if isinstance(functions, Tasks):
        return functions.functions
    if isinstance(functions, Mapping):
        return {name: fn.fn if isinstance(fn, TaskHandle) else fn for name, fn in functions.items()}
    if isinstance(functions, ModuleType):
        handles = [v for v in vars(functions).values() if isinstance(v, TaskHandle)]
        return {h.name: h.fn for h in handles}
    if isinstance(functions, Iterable) and not isinstance(functions, (str, bytes)):
        items = list(functions)
        if all(isinstance(h, TaskHandle) for h in items):
            return {h.name: h.fn for h in items}
    raise InvalidArgument(
        "functions",
        "must be a mapping of name -> function, a Tasks, a module of task handles, "
        f"or task handles; got {type(functions).__name__}",
    )
