"""``distsched bench``: the scheduler measured against raw Redis, in one run.

Sections (each on fresh namespaces):

- ``ceiling``: sequential and pipelined EVALSHA of ``return 1`` from one client,
  the most script calls one client can get from this Redis;
- ``enqueue``: one ``schedule`` call per task, and batched ``schedule_many``;
- ``e2e``: queued no-op tasks drained by one real worker process (``def``, then
  ``async def`` no-ops), then by ``--processes`` of them, with every task checked to
  have run exactly once and Redis's CPU per drained task (``INFO cpu``);
- ``lateness``: how late delayed tasks start against the Redis clock, and how late the
  tasks of a schedule's slots start with an idle worker (woken by the fire time);
- ``claim``: claim rate with small and very large queues, one and 100 per call, in the
  default order and in the priority order (ten priorities, so ranks interleave);
- ``dag``: a long chain, a wide fan-out/fan-in, and the longest single script
  call while 100,000 dependents are released or blocked;
- ``memory``: Redis memory per queued no-op task;
- ``wake``: a trickle of tasks (each scheduled once the one before has finished)
  with 1, 8 (and 32, ``--wake-processes``) idle worker processes: script calls and
  Redis CPU per task, which must not grow with the number of idle workers, and the
  wake-up latency (task start - run_at on the Redis clock);
- ``dashboard``: Redis commands each dashboard page sends with a few tasks and with
  many (they must be equal), and the drain rate of a worker process with and without
  a dashboard client polling the overview every second (needs the dashboard extra);
- ``fairness``: starvation (light keys' tasks trickling in behind one heavy key's backlog,
  drained by one worker process, with fairness keys and without: the light tasks' wait)
  and shares (backlogged keys of weights 1, 1, 2, 4, 8: each key's share of the claims
  against its weight's share);
- ``profile``: on the bench's own server only (it changes SLOWLOG settings, restored
  after), every command logged while ``schedule`` is called once per task, then while
  one worker process drains those tasks: Redis time per script (INFO commandstats
  counts every FCALL as one command), split into the commands the scripts run and
  their own Lua;
- ``worst``: on the bench's own server only (SLOWLOG settings restored after), the
  worst input the caps of ``distsched.limits`` accept for every script, each run a few
  times: the longest single call per script, the input that made it, and whether it
  stayed under 50 ms (``distsched.tools.bench.worst``).

Worker processes run ``python -m distsched.tools.bench worker URL NAMESPACE``: a
``Worker`` whose no-op records each run (task id, version, attempt, start time,
``run_at``) and writes them to a file when SIGTERM stops it.

Figures are printed next to the project's targets, as information, with the machine,
the Redis version and the client libraries they were measured with. Progress is logged
on ``distsched.bench`` (the CLI writes it to stderr).
"""

from __future__ import annotations

from distsched.tools.bench.config import SECTIONS, BenchConfig
from distsched.tools.bench.procs import NOOP, Run, WorkerProcesses, check_exactly_once
from distsched.tools.bench.report import progress_lines
from distsched.tools.bench.runner import bench_command, run_bench
from distsched.tools.bench.slowlog import profile_slowlog

__all__ = [
    "NOOP",
    "SECTIONS",
    "BenchConfig",
    "Run",
    "WorkerProcesses",
    "bench_command",
    "check_exactly_once",
    "profile_slowlog",
    "progress_lines",
    "run_bench",
]
