"""Runs the checks of one context against one host, within per-check timeouts and a global deadline.

Hang isolation: every check runs in its own daemon thread and the runner waits at most
min(check timeout, time left before the deadline). A check stuck in a hung NVML call or a blocked
sysfs read is abandoned (reported UNKNOWN with details.timed_out = true) and the run goes on, so a
run never outlasts its deadline by more than the bookkeeping, and it ends as soon as every check
has ended or been abandoned: a check hung for good costs its own timeout, not the deadline.
`deadline_hit` is true only when the deadline cut a check short (or kept one from starting).
Whether a timeout drains is policy.

Gatherers run lazily, once per run, the first time a check needs them; their snapshot (or the
exception they raised) is shared by every later check.
"""

from __future__ import annotations

import threading
import time

from ..hw.host import Host, HostError
from ..registry import CheckSpec, Registry, load_gatherer
from ..result import Blame, Result, Status, worst
from .config import Config
from .structs import Struct, field, replace

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple


class JobContext(Struct):
    """The job a prolog/epilog runs for; validated from slurmd's environment. Empty for manual runs."""

    job_id: Optional[str] = None
    user: Optional[str] = None
    node_name: Optional[str] = None
    gpus: Optional[Tuple[int, ...]] = None  # host GPU indices allocated to the job; None = all GPUs
    restart_count: Optional[int] = None  # times Slurm requeued the job (SLURM_JOB_RESTART_COUNT)


class GatherContext:
    """What a gatherer sees: the Host, the job, node settings and the other gatherers (cached)."""

    def __init__(self, registry: Registry, host: Host, config: Config, job: JobContext):
        self.registry = registry
        self.host = host
        self.config = config
        self.job = job
        self._cache: Dict[str, Tuple[bool, Any]] = {}
        self._locks: Dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self.prefetch: Any = None  # core/prefetch.Prefetch: values read by the sysfs helper process
        self.refuse_prefix = ""  # in that helper: gatherers it must not run (NVML's)
        self.refused = False
        # read what only a result's details show (NVML's CPU affinity beside sysfs's); the hooks'
        # check child turns it off: a hook's details reach no one (policy reads timed_out and
        # crashed), and on a real driver nvmlDeviceGetCpuAffinity took ~11 ms a GPU
        # (tests/captures/device/h200-vm/nvml-calls.json)
        self.informational_reads = True

    def get(self, name: str) -> Any:
        if name == "job":
            return self.job
        if name == "settings":
            return self.config.settings
        if self.refuse_prefix and name.startswith(self.refuse_prefix):
            self.refused = True
            raise LookupError("gatherer %r is not run in the sysfs helper process" % name)
        with self._guard:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:  # a hung gatherer holds its lock: later checks needing it time out too
            if name not in self._cache and self.prefetch is not None:
                fetched = self.prefetch.take(name)
                if fetched is not None:
                    self._cache[name] = (True, fetched[0])
            if name not in self._cache:
                spec = self.registry.gatherers.get(name) or load_gatherer(self.registry, name)
                if spec is None:
                    raise KeyError("no gatherer named %r" % name)
                try:
                    self._cache[name] = (True, spec.func(self))
                except (
                    BaseException
                ) as exc:  # cached: every check that needs it reports the same cause
                    self._cache[name] = (False, exc)
            ok, value = self._cache[name]
        if not ok:
            raise value
        return value

    def peek(self, name: str) -> Any:
        """What gatherer `name` returned in this run, or None (not run, failed, or still running)."""
        ok, value = self._cache.get(name, (False, None))
        return value if ok else None


class CheckRun(Struct, frozen=False):
    name: str
    results: List[Result]
    duration: float
    timed_out: bool = False

    @property
    def status(self) -> Status:
        return worst(r.status for r in self.results)

    def headline(self) -> Result:
        """The result that decides the check's status (first of the worst)."""
        status = self.status
        return next(r for r in self.results if r.status is status)


class RunReport(Struct, frozen=False):
    context: str
    runs: List[CheckRun]
    duration: float
    deadline: float
    deadline_hit: bool = False
    job: JobContext = field(default_factory=JobContext)

    @property
    def status(self) -> Status:
        return worst(run.status for run in self.runs)

    def results(self) -> List[Result]:
        return [r for run in self.runs for r in run.results]


def select_checks(
    registry: Registry, context: str, names: Sequence[str] = (), all_contexts: bool = False
) -> List[CheckSpec]:
    """Checks to run: named ones (a name may be a family like 'gpu'), else those of the context."""
    if names:
        chosen = []
        for name in names:
            matches = [s for s in registry.sorted_checks() if s.name == name or s.family == name]
            if not matches:
                raise KeyError(name)
            chosen.extend(m for m in matches if m not in chosen)
        return chosen
    if all_contexts:
        return registry.sorted_checks()
    return registry.for_context(context)


def run_checks(
    registry: Registry,
    config: Config,
    host: Host,
    context: str,
    checks: Iterable[CheckSpec],
    job: Optional[JobContext] = None,
    deadline: Optional[float] = None,
    clock: Callable[[], float] = time.monotonic,
    gather: Optional[GatherContext] = None,
) -> RunReport:
    """Run `checks` on a small pool of daemon threads and collect them in order (see _Scheduler).

    Each check gets min(its own timeout, time left before the deadline); a hung one (an NVML call
    that never returns, a blocked read) is abandoned and reported UNKNOWN with details.timed_out.
    A caller that passes its own `gather` (same host and job) can look at the snapshots afterwards.
    """
    job = job or JobContext()
    budget = (
        deadline
        if deadline is not None
        else config.get("deadline", context if context in config.settings["deadline"] else "manual")
    )
    gather = gather or GatherContext(registry, host, config, job)
    start = clock()
    specs = list(checks)
    enabled = [
        (spec, config.check(spec.name).params) for spec in specs if config.check(spec.name).enabled
    ]
    scheduler = _Scheduler(enabled, gather, clock, budget, start + budget)
    done = scheduler.run()
    runs = [
        done.get(spec.name)
        or CheckRun(spec.name, [Result(spec.name, Status.SKIP, "disabled in config")], 0.0)
        for spec in specs
    ]
    return RunReport(context, runs, clock() - start, budget, scheduler.deadline_cut, job)


class _Scheduler:
    """Runs checks on POOL_SIZE worker threads taking them from a queue, in order.

    A few threads, not one per check: with ~30 checks a thread each costs more in GIL hand-offs
    than the checks themselves. A check running longer than PARKED_S is "parked" (probably stuck
    on NVML or a blocked read, or waiting for a gatherer that is): an extra worker is started for
    the rest of the queue, so one hang cannot starve the other checks of the global budget. A
    check past its timeout is reported and its worker abandoned; if that worker ever comes back,
    it finds its result already written and exits.
    """

    POOL_SIZE = 3
    PARKED_S = 0.1

    def __init__(
        self,
        items: List[Tuple[CheckSpec, Any]],
        gather: GatherContext,
        clock: Callable[[], float],
        budget: float,
        end: float,
    ):
        self.pending = list(items)
        self.gather, self.clock, self.budget, self.end = gather, clock, budget, end
        self.cond = threading.Condition()
        self.running: Dict[str, Tuple[CheckSpec, float]] = {}  # name -> (spec, start)
        self.done: Dict[str, CheckRun] = {}
        self.parked: set = set()
        self.workers = 0
        self.deadline_cut = (
            False  # the global deadline, not a check's own timeout, ended some check
        )

    def run(self) -> Dict[str, CheckRun]:
        with self.cond:
            for _ in range(min(self.POOL_SIZE, len(self.pending))):
                self._spawn()
            while True:
                now = self.clock()
                wake = self._expire(now)
                if (
                    not self.pending and not self.running
                ):  # all ended or abandoned: do not sit out the deadline
                    break
                if now >= self.end:
                    self._give_up()
                    break
                self.cond.wait(max(min(wake, self.end) - now, 0.001))
        return self.done

    def _spawn(self) -> None:
        self.workers += 1
        threading.Thread(
            target=self._work, name="check:worker-%d" % self.workers, daemon=True
        ).start()

    def _expire(self, now: float) -> float:
        """Time out what is past its limit, park what is slow; returns when to look again."""
        wake = self.end
        for name, (spec, started) in list(self.running.items()):
            limit = min(started + spec.timeout, self.end)
            if now >= limit:
                del self.running[name]
                by_deadline = limit < started + spec.timeout
                self.deadline_cut = self.deadline_cut or by_deadline
                self.done[name] = _timed_out(spec, now - started, by_deadline, self.budget)
                continue
            if name not in self.parked:
                if now - started >= self.PARKED_S:
                    self.parked.add(name)
                    if self.pending:
                        self._spawn()
                else:
                    wake = min(wake, started + self.PARKED_S)
            wake = min(wake, limit)
        return wake

    def _give_up(self) -> None:
        now = self.clock()
        self.deadline_cut = self.deadline_cut or bool(self.running or self.pending)
        for name, (spec, started) in list(self.running.items()):
            self.done[name] = _timed_out(spec, now - started, True, self.budget)
        for spec, _params in self.pending:
            self.done[spec.name] = _timed_out(spec, 0.0, True, self.budget, started=False)
        self.running.clear()
        self.pending = []

    def _work(self) -> None:
        while True:
            with self.cond:
                if not self.pending:
                    return
                spec, params = self.pending.pop(0)
                started = self.clock()
                self.running[spec.name] = (spec, started)
                self.cond.notify_all()  # the scheduler times this one from now
            results = _execute(spec, params, self.gather)
            with self.cond:
                if (
                    spec.name in self.done
                ):  # reported as timed out; a replacement took over the queue
                    return
                self.running.pop(spec.name, None)
                self.done[spec.name] = CheckRun(spec.name, results, self.clock() - started)
                self.cond.notify_all()


def _timed_out(
    spec: CheckSpec, waited: float, by_deadline: bool, budget: float, started: bool = True
) -> CheckRun:
    if not started:
        summary = "not started: the %.3gs deadline was reached" % budget
    elif by_deadline:
        summary = "not finished when the %.3gs deadline was reached" % budget
    else:
        summary = (
            "did not finish within its %.3gs timeout (hung NVML call or blocked read?)"
            % spec.timeout
        )
    result = Result(
        spec.name,
        Status.UNKNOWN,
        summary,
        blame=Blame.CHECK,
        details={"timed_out": True, "timeout_s": spec.timeout, "deadline_s": budget},
    )
    return CheckRun(spec.name, [result], waited, timed_out=True)


def _execute(spec: CheckSpec, params: Any, gather: GatherContext) -> List[Result]:
    """Gather what the check needs, call it, and turn anything it raises into UNKNOWN."""
    try:
        snapshots = [gather.get(name) for name in spec.needs]
        returned = spec.func(*snapshots, params)
    except HostError as exc:
        return [
            Result(
                spec.name,
                Status.UNKNOWN,
                "could not read the host: %s" % exc,
                details={"error": str(exc), "path": exc.path},
                blame=Blame.CHECK,
            )
        ]
    except (
        Exception
    ) as exc:  # our bug must never drain a node: UNKNOWN, with the traceback recorded
        import traceback  # only now: with linecache and tokenize it is ~3 ms of an admin verb's start

        return [
            Result(
                spec.name,
                Status.UNKNOWN,
                "internal error: %s: %s" % (type(exc).__name__, exc),
                details={"error": repr(exc), "traceback": traceback.format_exc(limit=8)},
                blame=Blame.CHECK,
            )
        ]
    return _normalise(spec, returned)


def _normalise(spec: CheckSpec, returned: Any) -> List[Result]:
    if isinstance(returned, Result):
        results = [returned]
    elif isinstance(returned, (list, tuple)):
        results = list(returned)
    else:
        results = []
    if not results or not all(isinstance(r, Result) for r in results):
        return [
            Result(
                spec.name,
                Status.UNKNOWN,
                "internal error: check returned %r, not Result(s)" % (type(returned).__name__,),
                blame=Blame.CHECK,
            )
        ]
    return [r if r.check == spec.name else replace(r, check=spec.name) for r in results]
