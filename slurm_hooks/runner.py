"""Runs the checks of one context against one host, within per-check timeouts and a global deadline.

Hang isolation: every check runs in its own daemon thread and the runner waits at most
min(check timeout, time left before the deadline). A check stuck in a hung NVML call or a blocked
sysfs read is abandoned (reported UNKNOWN with details.timed_out = true) and the run goes on, so a
run never outlasts its deadline by more than the bookkeeping. Whether a timeout drains is policy.

Gatherers run lazily, once per run, the first time a check needs them; their snapshot (or the
exception they raised) is shared by every later check.
"""
from __future__ import annotations

import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from .config import Config
from .host import Host, HostError
from .registry import CheckSpec, Registry
from .result import Blame, Result, Status, worst


@dataclass(frozen=True)
class JobContext:
    """The job a prolog/epilog runs for; validated from slurmd's environment. Empty for manual runs."""

    job_id: Optional[str] = None
    user: Optional[str] = None
    node_name: Optional[str] = None
    gpus: Optional[Tuple[int, ...]] = None  # host GPU indices allocated to the job; None = all GPUs

    def covers_gpu(self, index: int) -> bool:
        return self.gpus is None or index in self.gpus


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

    def get(self, name: str) -> Any:
        if name == "job":
            return self.job
        if name == "settings":
            return self.config.settings
        with self._guard:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:  # a hung gatherer holds its lock: later checks needing it time out too
            if name not in self._cache:
                spec = self.registry.gatherers.get(name)
                if spec is None:
                    raise KeyError("no gatherer named %r" % name)
                try:
                    self._cache[name] = (True, spec.func(self))
                except BaseException as exc:  # cached: every check that needs it reports the same cause
                    self._cache[name] = (False, exc)
            ok, value = self._cache[name]
        if not ok:
            raise value
        return value


@dataclass
class CheckRun:
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


@dataclass
class RunReport:
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


def select_checks(registry: Registry, context: str, names: Sequence[str] = (), all_contexts: bool = False
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


def run_checks(registry: Registry, config: Config, host: Host, context: str, checks: Iterable[CheckSpec],
               job: Optional[JobContext] = None, deadline: Optional[float] = None,
               clock: Callable[[], float] = time.monotonic) -> RunReport:
    """Run `checks` concurrently, each in its own daemon thread, and collect them in order.

    Concurrency keeps one hung check (and the checks that share its gatherer) from starving the
    others of the global budget: the system checks still report while an NVML call hangs. Each
    check gets min(its own timeout, time left before the deadline).
    """
    job = job or JobContext()
    budget = deadline if deadline is not None else config.get("deadline", context if context in
                                                                config.settings["deadline"] else "manual")
    gather = GatherContext(registry, host, config, job)
    start = clock()
    end = start + budget
    started: List[Tuple[CheckSpec, Optional[_Worker]]] = []
    for spec in checks:
        check_config = config.check(spec.name)
        started.append((spec, _Worker(spec, check_config.params, gather, clock) if check_config.enabled else None))
    runs: List[CheckRun] = []
    for spec, worker in started:
        if worker is None:
            runs.append(CheckRun(spec.name, [Result(spec.name, Status.SKIP, "disabled in config")], 0.0))
            continue
        runs.append(worker.collect(min(worker.started + spec.timeout, end), clock, budget))
    deadline_hit = any(run.timed_out for run in runs) and clock() >= end - 1e-3
    return RunReport(context, runs, clock() - start, budget, deadline_hit, job)


class _Worker:
    """One check running in a daemon thread; `collect` waits for it until a point in time."""

    def __init__(self, spec: CheckSpec, params: Any, gather: GatherContext, clock: Callable[[], float]):
        self.spec = spec
        self.box: List[List[Result]] = []
        self.started = clock()
        self.finished: Optional[float] = None
        self.thread = threading.Thread(target=self._run, args=(params, gather, clock), name="check:" + spec.name,
                                       daemon=True)
        self.thread.start()

    def _run(self, params: Any, gather: GatherContext, clock: Callable[[], float]) -> None:
        self.box.append(_execute(self.spec, params, gather))
        self.finished = clock()

    def collect(self, until: float, clock: Callable[[], float], budget: float) -> CheckRun:
        self.thread.join(max(until - clock(), 0.0))
        if self.thread.is_alive() or not self.box:
            limited_by_deadline = until < self.started + self.spec.timeout
            summary = ("not finished when the %.3gs deadline was reached" % budget if limited_by_deadline else
                       "did not finish within its %.3gs timeout (hung NVML call or blocked read?)" % self.spec.timeout)
            result = Result(self.spec.name, Status.UNKNOWN, summary, blame=Blame.CHECK,
                            details={"timed_out": True, "timeout_s": self.spec.timeout, "deadline_s": budget})
            return CheckRun(self.spec.name, [result], clock() - self.started, timed_out=True)
        return CheckRun(self.spec.name, self.box[0], (self.finished or clock()) - self.started)


def _execute(spec: CheckSpec, params: Any, gather: GatherContext) -> List[Result]:
    """Gather what the check needs, call it, and turn anything it raises into UNKNOWN."""
    try:
        snapshots = [gather.get(name) for name in spec.needs]
        returned = spec.func(*snapshots, params)
    except HostError as exc:
        return [Result(spec.name, Status.UNKNOWN, "could not read the host: %s" % exc,
                       details={"error": str(exc), "path": exc.path}, blame=Blame.CHECK)]
    except Exception as exc:  # our bug must never drain a node: UNKNOWN, with the traceback recorded
        return [Result(spec.name, Status.UNKNOWN, "internal error: %s: %s" % (type(exc).__name__, exc),
                       details={"error": repr(exc), "traceback": traceback.format_exc(limit=8)},
                       blame=Blame.CHECK)]
    return _normalise(spec, returned)


def _normalise(spec: CheckSpec, returned: Any) -> List[Result]:
    if isinstance(returned, Result):
        results = [returned]
    elif isinstance(returned, (list, tuple)):
        results = list(returned)
    else:
        results = []
    if not results or not all(isinstance(r, Result) for r in results):
        return [Result(spec.name, Status.UNKNOWN, "internal error: check returned %r, not Result(s)"
                       % (type(returned).__name__,), blame=Blame.CHECK)]
    return [r if r.check == spec.name else replace(r, check=spec.name) for r in results]
