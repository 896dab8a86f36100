"""Everything a hook runs with a time bound, so that a hung GPU or file system never outlasts it.

The checks run in a forked child bounded by [deadline] <context> (isolation.run_isolated), and the
counter snapshot (records/store.py: NVML, /dev/kmsg) in a thread of that child bounded by [records]
snapshot_timeout; the prolog's snapshot file is written there too, within [deadline] files. The file
steps after the decision (state file, record, metrics, dcgm-exporter mapping) run one after the other
in a forked child within [deadline] files (isolation.run_steps); what did not finish is logged with
its path (event=step-abandoned) and counted in the metrics.
"""

from __future__ import annotations

import time

from ..core import logs
from ..core.config import Config
from ..core.report_format import report_from_dict, report_to_dict
from ..core.runner import CheckRun, GatherContext, JobContext, RunReport, run_checks, select_checks
from ..registry import Registry
from ..result import Result, Status

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Optional, Sequence, Tuple

    from ..xid.kmsg import KmsgView


ISOLATION_GRACE_S = 1.0


def run_bounded(
    config: Config,
    steps: Sequence[Any],
    log,
    context: str = "",
    job: Optional[JobContext] = None,
    earlier: Sequence[Any] = (),
) -> None:
    """isolation.run_steps within [deadline] files; what did not finish (there, or in `earlier`: outcomes of
    steps run elsewhere under the same bound) is logged with its path and counted."""
    from ..core.isolation import Step, run_steps

    limit = config.settings.deadline.files
    try:
        outcomes = list(earlier) + (run_steps(steps, limit) if steps else [])
    except (
        OSError
    ) as exc:  # no process left to fork: the decision stands, the steps are lost and said so
        for step in steps:
            log.error(
                logs.kv(
                    context=context or None,
                    job=job.job_id if job else None,
                    event="step-abandoned",
                    step=step.name,
                    path=step.path,
                    state="not-started",
                    error="cannot start: %s" % exc,
                )
            )
        outcomes = list(earlier)
    abandoned = [o for o in outcomes if not o.finished]
    for outcome in abandoned:
        log.error(
            logs.kv(
                context=context or None,
                job=job.job_id if job else None,
                event="step-abandoned",
                step=outcome.name,
                path=outcome.path,
                state=outcome.state,
                waited_s=outcome.seconds,
                error="did not finish within [deadline] files = %gs (hung file system?)" % limit,
            )
        )
    if abandoned and config.settings.metrics.textfile_dir:
        from ..records import metrics

        names = [o.name for o in abandoned]
        run_steps(
            [
                Step(
                    "metrics",
                    config.settings.metrics.textfile_dir,
                    lambda: metrics.count_abandoned(config.settings, names, log),
                )
            ],
            min(limit, 1.0),
        )


def run_isolated_checks(
    registry: Registry,
    config: Config,
    context: str,
    job: JobContext,
    extra_names: Sequence[str] = (),
    while_waiting: Optional[Callable[[], Any]] = None,
) -> Tuple[RunReport, Any]:
    """Run the context's checks (plus extra_names) in a forked child, bounded by the deadline.

    The prolog's/epilog's counter snapshot (records/store.py) is taken in the same child right after the
    checks, so NVML starts once per hook, in a thread bounded by [records] snapshot_timeout (a GPU
    whose NVML calls hang is given up inside it, the others are recorded). The prolog also stores
    it there, in a thread bounded by [deadline] files: the default prolog then needs no child of
    its own for its files. Returns (report, [snapshot or None, why(, stored)] or None); None when
    the child died, and records/store.py then takes the snapshot in a child of its own. `stored`:
    {"state": "done" | "running" (abandoned), "path": ...}. `while_waiting` runs in this process
    once the child is started (isolation.run_isolated).
    """
    from ..core import prefetch
    from ..core.isolation import run_isolated
    from ..hw.host import Host
    from ..records.store import wanted as records_wanted

    specs = select_checks(registry, context)
    for name in extra_names:
        if name in registry.checks and registry.checks[name] not in specs:
            specs.append(registry.checks[name])
    deadline = config.get("deadline", context)
    root = config.settings.general.root
    snapshot_s = (
        config.settings.records.snapshot_timeout if records_wanted(config, job, context) else 0.0
    )
    store_s = config.settings.deadline.files if snapshot_s and context == "prolog" else 0.0

    def work() -> Dict[str, Any]:
        from ..hw import nvml

        with nvml.share_within_run():  # one run: its checks and its snapshot ask NVML once
            return run()

    def run() -> Dict[str, Any]:
        host = Host(root)
        gather = GatherContext(registry, host, config, job)
        gather.informational_reads = False  # no one reads a hook's details
        # the sysfs/procfs gatherers are read by a helper process on another core meanwhile
        # (core/prefetch.py); forked now, before this process starts any thread
        needs = (n for s in specs if config.check(s.name).enabled for n in s.needs)
        gather.prefetch = prefetch.Prefetch.start(gather, prefetch.wanted(needs))
        snapshot = None
        if snapshot_s:  # taken while the checks run: its NVML calls leave the GIL to them
            reads_kmsg = any("xid.log" in prefetch.wanted(s.needs) for s in specs)
            snapshot = _snapshot_start(
                config, job, context == "epilog", lambda: _kernel_log(gather, reads_kmsg)
            )
        try:
            report = run_checks(registry, config, host, context, specs, job=job, gather=gather)
        finally:
            if gather.prefetch is not None:
                gather.prefetch.stop()
        gathered = None
        if snapshot is not None:
            gathered = _snapshot_finish(snapshot, snapshot_s)
            if store_s and gathered[0] is not None:
                gathered.append(_store_bounded(config, job, gathered, store_s))
                # stored here: the parent needs only its GPU indices (store.steps, dcgm-exporter
                # mapping), not ~35 kB of counters through JSON both ways (~1.5 ms on 8 GPUs)
                gathered[0] = {"gpus": [{"index": g["index"]} for g in gathered[0].get("gpus", [])]}
        return {"report": report_to_dict(report, root), "snapshot": gathered}

    data, why = run_isolated(
        work, deadline + snapshot_s + store_s + ISOLATION_GRACE_S, while_waiting=while_waiting
    )
    if data is not None:
        return report_from_dict(data["report"]), data["snapshot"]
    crashed = Result(
        "slurm-hooks.runner",
        Status.UNKNOWN,
        why,
        details={"crashed": True, "timed_out": True, "checks": [s.name for s in specs]},
    )
    return RunReport(
        context,
        [CheckRun("slurm-hooks.runner", [crashed], deadline, timed_out=True)],
        deadline,
        deadline,
        True,
        job,
    ), None


def _kernel_log(gather: GatherContext, reads_kmsg: bool) -> Optional[KmsgView]:
    """The Xid checks' read of /dev/kmsg when they run (one read per hook), else None: the snapshot
    then reads it itself."""
    if not reads_kmsg:
        return None
    try:
        return getattr(gather.get("xid.log"), "kmsg", None)
    except Exception:  # noqa: BLE001  (xid.events reports an unreadable log; the snapshot reads it)
        return None


def _snapshot_start(
    config: Config,
    job: JobContext,
    epilog: bool,
    kernel_log: Callable[[], Optional[KmsgView]],
) -> Tuple[Any, list, float]:
    """store.take_snapshot in a thread of the check child, started with the checks (NVML can hang:
    _snapshot_finish waits for it a bounded time)."""
    import threading

    from ..records.store import take_snapshot

    box: list = []

    def take() -> None:
        try:
            box.append([take_snapshot(config, job, epilog, kernel_log()), ""])
        except Exception as exc:  # recorded as the reason the record has no snapshot
            box.append([None, "snapshot failed: %r" % exc])

    worker = threading.Thread(target=take, name="check:snapshot", daemon=True)
    worker.start()
    return worker, box, time.monotonic()


def _snapshot_finish(snapshot: Tuple[Any, list, float], timeout: float) -> list:
    """The snapshot, or why there is none: waited for until `timeout` after the checks ended (it ran
    alongside them before), so the child's bound is what it was when it was taken after them."""
    worker, box, _started = snapshot
    worker.join(timeout)
    return box[0] if box else [None, "snapshot did not finish within %.3gs" % timeout]


def _store_bounded(
    config: Config, job: JobContext, gathered: list, timeout: float
) -> Dict[str, Any]:
    """The prolog's snapshot file, written in a thread of the check child for at most `timeout` seconds
    (the state directory may hang); its outcome for the parent's log."""
    import threading

    from ..records.store import snapshot_path, store_prolog_snapshot

    try:
        path = snapshot_path(config, job.job_id)
    except ValueError:
        path = config.settings.paths.state_dir
    worker = threading.Thread(
        target=store_prolog_snapshot,
        # this process was forked before the hook set its logger up: its own, made if it logs
        args=(config, job, tuple(gathered[:2]), logs.LazyLogger(config.settings)),
        name="bounded:snapshot-file",
        daemon=True,
    )
    started = time.monotonic()
    worker.start()
    worker.join(timeout)
    return {
        "state": "running" if worker.is_alive() else "done",
        "path": path,
        "seconds": round(time.monotonic() - started, 3),
    }
