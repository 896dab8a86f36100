"""The prolog, epilog and health modes: run checks, decide, drain or resume, log, pick the exit code.

Fail open on our own problems: a broken config, a hostile job environment or a crash in our code
logs loudly and exits 0, because a hook that exits non-zero makes slurmctld drain the node — and a
bug of ours must never drain a cluster. Only a node-broken FAIL (policy.decide) drains.

The exit code follows the node, not the wish: ExitCode.NODE_BROKEN (10) only when the node carries DRAIN now
(we drained it, it already was, or someone else's drain is on it). Whenever we do not drain -- the
breaker, the breaker cannot count, Slurm unreachable, a state we leave alone (MAINT reservation,
DOWN, FAIL...) -- the hook exits 0, because a non-zero exit makes slurmctld drain the node itself
('Prolog error'), behind the breaker's back. The job then runs; the CRITICAL/ERROR line says why.

Local state (paths.state_dir/node-state.json) remembers the drain we made (Slurm's exact reason and
reason time: the proof it is ours) and drains we could not deliver; the health mode re-runs those
checks and resumes only when every one of them passed, or retries. A missing state file means the
state is lost (diskless node after a reboot, a write that failed): the health mode then asks Slurm
once and rebuilds it from our reason, which names the checks. The happy path makes no Slurm call.

Bounded after the checks too: the exit code is decided before anything is written, and the steps
after the decision (the epilog's record with its retention, metrics, dcgm-exporter mapping) run
in a forked child for at most [deadline] files (isolation.run_steps); the prolog's snapshot file
is written by the check child under the same bound, and so is the state file read and written. A step that did not finish (a records file system that never
answers) is logged with its path (event=step-abandoned) and counted in the metrics.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Sequence, Tuple

from .core import logs
from .core.atomicio import read_json, write_json_atomic
from .core.config import Config, ConfigError
from .core.report_format import report_from_dict, report_to_dict
from .core.runner import CheckRun, GatherContext, JobContext, RunReport, run_checks, select_checks
from .core.structs import Struct
from .registry import JOB_CONTEXTS, Registry
from .result import ExitCode, Result, Status
from .slurm import policy
from .slurm.jobenv import JobEnvError, job_from_env
from .slurm.policy import Outcome

if TYPE_CHECKING:
    from .slurm import drainer
    from .xid.kmsg import KmsgView

OPT_OUT_TOKEN = "slurm_hooks=skip"
ISOLATION_GRACE_S = 1.0
# drainer.py (and the Slurm client) is imported only when a drain or resume is on the table: the
# happy path neither talks to nor loads anything of Slurm's.


class HookResult(Struct, frozen=False):
    exit_code: int
    report: Optional[RunReport] = None
    decision: Optional[policy.Decision] = None
    enacted: Optional[drainer.Enacted] = None
    slurm_calls: int = 0


def node_name(job: JobContext, explicit: Optional[str] = None) -> str:
    """SLURMD_NODENAME (what slurmd calls this node), else --node, else the short host name."""
    return job.node_name or explicit or os.uname().nodename.split(".")[0]


def state_path(config: Config) -> str:
    return os.path.join(config.get("paths", "state_dir"), "node-state.json")


def read_state(
    config: Config, log, notes: Optional[Dict[str, Any]] = None
) -> Tuple[Dict[str, Any], bool]:
    """(node-state.json, known), read in a child process bounded by [deadline] files: a state directory
    that never answers costs that much, once, and the hook goes on without what it remembers.

    known is False when the file is missing, unreadable or did not answer: what we drained is then
    unknown here, and the health mode rebuilds it from Slurm (one call)."""
    from .core.isolation import run_isolated

    path = state_path(config)

    def read() -> Dict[str, Any]:
        try:
            return {"state": read_json(path, default=None)}
        except (OSError, ValueError) as exc:
            return {"error": str(exc)}

    try:
        answer, why = run_isolated(read, config.get("deadline", "files"), "reading the state file")
    except OSError as exc:  # no process left to fork (EAGAIN, ENOMEM): go on without the state
        answer, why = None, "cannot start the reader: %s" % exc
    if answer is None or "error" in answer:
        log.error(logs.kv(event="state-unreadable", path=path, error=why or answer["error"]))
        if notes is not None:  # the state directory did not answer: later reads there are skipped
            notes["unanswered"] = answer is None
        return {}, False
    state = answer["state"]
    return (state, True) if isinstance(state, dict) else ({}, False)


def save_state(config: Config, state: Mapping[str, Any], log) -> None:
    from .core.isolation import Step

    path = state_path(config)

    def write() -> None:
        try:
            write_json_atomic(path, dict(state))
        except (
            OSError
        ) as exc:  # full disk, read-only /var: the decision still stands, only memory is lost
            log.error(logs.kv(event="state-not-saved", path=path, error=exc))
            try:  # an outdated file would claim to know; without one the next health run asks Slurm
                os.unlink(path)
            except OSError:
                pass

    _run_bounded(config, [Step("state", path, write)], log)


def _run_bounded(
    config: Config,
    steps: Sequence[Any],
    log,
    context: str = "",
    job: Optional[JobContext] = None,
    earlier: Sequence[Any] = (),
) -> None:
    """isolation.run_steps within [deadline] files; what did not finish (there, or in `earlier`: outcomes of
    steps run elsewhere under the same bound) is logged with its path and counted."""
    from .core.isolation import Step, run_steps

    limit = config.get("deadline", "files")
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
    if abandoned and config.get("metrics", "textfile_dir"):
        from .records import metrics

        names = [o.name for o in abandoned]
        run_steps(
            [
                Step(
                    "metrics",
                    config.get("metrics", "textfile_dir"),
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
) -> Tuple[RunReport, Any]:
    """Run the context's checks (plus extra_names) in a forked child, bounded by the deadline.

    The prolog's/epilog's counter snapshot (records/store.py) is taken in the same child right after the
    checks, so NVML starts once per hook, in a thread bounded by [records] snapshot_timeout (a GPU
    whose NVML calls hang is given up inside it, the others are recorded). The prolog also stores
    it there, in a thread bounded by [deadline] files: the default prolog then needs no child of
    its own for its files. Returns (report, [snapshot or None, why(, stored)] or None); None when
    the child died, and records/store.py then takes the snapshot in a child of its own. `stored`:
    {"state": "done" | "running" (abandoned), "path": ...}.
    """
    from .core.isolation import run_isolated
    from .hw.host import Host
    from .records.store import wanted as records_wanted

    specs = select_checks(registry, context)
    for name in extra_names:
        if name in registry.checks and registry.checks[name] not in specs:
            specs.append(registry.checks[name])
    deadline = config.get("deadline", context)
    root = config.get("general", "root")
    snapshot_s = (
        config.get("records", "snapshot_timeout") if records_wanted(config, job, context) else 0.0
    )
    store_s = config.get("deadline", "files") if snapshot_s and context == "prolog" else 0.0

    def work() -> Dict[str, Any]:
        host = Host(root)
        gather = GatherContext(registry, host, config, job)
        report = run_checks(registry, config, host, context, specs, job=job, gather=gather)
        gathered = None
        if snapshot_s:
            kernel_log = getattr(
                gather.peek("xid.log"), "kmsg", None
            )  # /dev/kmsg read once per hook
            gathered = _snapshot_bounded(config, job, context == "epilog", snapshot_s, kernel_log)
            if store_s and gathered[0] is not None:
                gathered.append(_store_bounded(config, job, gathered, store_s))
        return {"report": report_to_dict(report, root), "snapshot": gathered}

    data, why = run_isolated(work, deadline + snapshot_s + store_s + ISOLATION_GRACE_S)
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


def _snapshot_bounded(
    config: Config,
    job: JobContext,
    epilog: bool,
    timeout: float,
    kernel_log: Optional[KmsgView] = None,
) -> Optional[list]:
    """store.take_snapshot in a thread of the check child, abandoned after `timeout` (NVML can hang)."""
    import threading

    from .records.store import take_snapshot

    box: list = []

    def take() -> None:
        try:
            box.append([take_snapshot(config, job, epilog, kernel_log), ""])
        except Exception as exc:  # recorded as the reason the record has no snapshot
            box.append([None, "snapshot failed: %r" % exc])

    worker = threading.Thread(target=take, name="check:snapshot", daemon=True)
    worker.start()
    worker.join(timeout)
    return box[0] if box else [None, "snapshot did not finish within %.3gs" % timeout]


def _store_bounded(
    config: Config, job: JobContext, gathered: list, timeout: float
) -> Dict[str, Any]:
    """The prolog's snapshot file, written in a thread of the check child for at most `timeout` seconds
    (the state directory may hang); its outcome for the parent's log."""
    import threading

    from .records.store import snapshot_path, store_prolog_snapshot

    try:
        path = snapshot_path(config, job.job_id)
    except ValueError:
        path = config.get("paths", "state_dir")
    worker = threading.Thread(
        target=store_prolog_snapshot,
        args=(config, job, tuple(gathered[:2])),
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


def opted_out(env: Mapping[str, str], config: Config) -> bool:
    if not config.get("drain", "allow_job_opt_out"):
        return False
    return any(
        OPT_OUT_TOKEN in env.get(var, "") for var in ("SLURM_JOB_EXTRA", "SLURM_JOB_COMMENT")
    )


def run_hook(
    context: str,
    registry: Registry,
    config: Config,
    env: Mapping[str, str],
    node: Optional[str] = None,
    client=None,
) -> HookResult:
    log = logs.setup(config.settings)
    try:
        job = job_from_env(env, require_job=context in JOB_CONTEXTS)
    except JobEnvError as exc:
        log.critical(
            logs.kv(context=context, event="bad-job-environment", error=exc, decision="fail-open")
        )
        return HookResult(0)
    name = node_name(job, node)
    if (
        context == "health"
    ):  # deprecated spellings still work; say how to write them, every few minutes at most
        for warning in config.warnings:
            log.warning(
                logs.kv(context=context, node=name, event="config-deprecated", detail=warning)
            )
    if context == "prolog" and opted_out(env, config):
        log.warning(logs.kv(context=context, job=job.job_id, node=name, event="job-opted-out"))
        return HookResult(0)
    # Only health needs the state before its checks; a prolog/epilog reads it when it drains (the happy
    # path reads nothing, so it pays no bounded child for it).
    state, known = read_state(config, log) if context == "health" else ({}, True)
    remembered = [
        c
        for entry in (state.get("drained"), state.get("pending"))
        if entry
        for c in entry.get("checks", [])
    ]
    report, gathered = run_isolated_checks(
        registry, config, context, job, remembered if context == "health" else ()
    )
    if context == "epilog":  # the Xids a job's epilog sees first happened during that job
        _xid_pattern(config, job, report)
    decision = policy.decide(report.results(), config.settings)
    draining = decision.verdict is policy.Verdict.DRAIN
    if (
        context == "health"
        and not draining
        and state.get("pending")
        and not policy.unproven(state["pending"].get("checks", []), report.results())
    ):
        state.pop(
            "pending"
        )  # an undelivered drain whose checks all pass now: forget it, no Slurm call
        save_state(config, state, log)
    enacted = None
    rebuild = (
        not known and config.get("general", "mode") != "observe"
    )  # observe resumes nothing: no need
    if draining or (context == "health" and (state.get("drained") or rebuild)):
        enacted, client, decision = _enact(
            context, name, job, config, log, decision, report, client
        )
    calls = client.calls if client is not None else 0
    code = ExitCode.NODE_BROKEN if enacted is not None and enacted.node_drained else ExitCode.OK
    _log_decision(
        log,
        context,
        name,
        job,
        report,
        decision,
        enacted,
        calls,
        client.backend_name if client is not None else None,
    )
    _after_decision(context, config, job, name, report, decision, enacted, log, gathered)
    return HookResult(code, report, decision, enacted, calls)


def _xid_pattern(config: Config, job: JobContext, report: RunReport) -> None:
    """Application Xids repeating on one GPU across jobs and users (xid/pattern.py) join the run's
    results as a node-broken xid.pattern finding; nothing is read without such Xids."""
    from .core.runner import CheckRun
    from .xid import pattern

    found = pattern.apply(config, job, report.results(), time.time())
    if found:
        report.runs.append(CheckRun(pattern.CHECK, found, 0.0))


def _after_decision(
    context: str,
    config: Config,
    job: JobContext,
    name: str,
    report: RunReport,
    decision: policy.Decision,
    enacted,
    log,
    gathered,
) -> None:
    """Snapshot file or record, dcgm-exporter mapping and metrics: bounded, the exit code already decided."""
    from .core.isolation import Step, StepOutcome
    from .records import metrics, store

    if gathered is None and store.wanted(
        config, job, context
    ):  # the check child died: one more try
        try:
            gathered = store.gather(config, job, epilog=context == "epilog")
        except OSError as exc:  # no process left to fork
            gathered = (None, "snapshot not taken: %s" % exc)
    stored = (
        gathered[2] if gathered and len(gathered) > 2 else None
    )  # the check child wrote the snapshot file
    steps = store.steps(
        context,
        config,
        job,
        name,
        report,
        decision,
        enacted,
        log,
        tuple(gathered[:2]) if gathered else None,
        snapshot_stored=stored is not None,
    )
    if config.get(
        "metrics", "textfile_dir"
    ):  # prometheus_client is imported only then, in the child
        steps.append(
            Step(
                "metrics",
                config.get("metrics", "textfile_dir"),
                lambda: metrics.write_textfile(config, context, report, decision, enacted, log=log),
            )
        )
    earlier = (
        [StepOutcome("snapshot", stored["path"], stored["state"], stored["seconds"])]
        if stored
        else []
    )
    _run_bounded(config, steps, log, context, job, earlier)


def _enact(
    context: str,
    name: str,
    job: JobContext,
    config: Config,
    log,
    decision: policy.Decision,
    report: RunReport,
    client,
) -> Tuple[drainer.Enacted, Any, policy.Decision]:
    """Drain, or (health) resume / rebuild lost state, under the node's lock and one Slurm budget.
    The decision comes back with the reason the drain was made with (a lemon's asks for RMA)."""
    from .slurm import drainer, nodelock  # only now: the happy path loads nothing of Slurm's

    client = client or drainer.make_client(config.settings)
    budget = drainer.slurm_budget(config.settings)
    client.set_budget(budget)
    with nodelock.NodeLock(config.get("paths", "state_dir"), name, budget) as lock:
        if not lock.acquired:
            log.warning(
                logs.kv(
                    context=context, node=name, event="drain-lock-unavailable", error=lock.error
                )
            )
        notes: Dict[str, Any] = {}
        # fresh: another hook of this node may have just acted
        state, known = read_state(config, log, notes)
        if decision.verdict is policy.Verdict.DRAIN:
            judged: Dict[str, Any] = {"why": ""}
            fresh = state.get("drained") if lock.waited > 0.05 else None
            if (
                fresh and fresh.get("time", 0) >= lock.started
            ):  # it drained while we waited: no second drain
                enacted = drainer.Enacted(
                    Outcome.ALREADY_OURS,
                    "drained a moment ago by another hook of this node: %s" % fresh.get("reason"),
                    node_drained=True,
                )
            else:
                decision, judged = _judge_lemon(config, decision, notes.get("unanswered", False))
                enacted = drainer.drain(
                    client,
                    name,
                    decision.reason,
                    config.settings,
                    (state.get("drained"), state.get("pending")),
                    known,
                )
                judged["steps"] = _repair(config, client, name, decision, enacted, judged, log)
                _remember_lemon(config, state, enacted, decision, judged, log)
            _remember_drain(state, enacted, decision, job, context)
            _remember_repair(client, name, state, enacted, judged)
        else:
            enacted = _recover(client, name, state, known, report, config)
        save_state(config, state, log)
    return enacted, client, decision


def _judge_lemon(
    config: Config, decision: policy.Decision, state_dir_hung: bool = False
) -> Tuple[policy.Decision, dict]:
    """The drain's reason, asking for RMA when this node is a lemon (slurm/lemon.py). When the state
    directory did not answer this run (the state read was abandoned), the history there is not read
    a second time: a hung directory costs [deadline] files once for reading, not once per file."""
    from .core.structs import replace
    from .slurm import lemon

    judged = lemon.decide(
        config,
        decision.findings[0],
        decision.checks,
        decision.reason,
        len(decision.findings) - 1,
        read=not state_dir_hung,
    )
    return (replace(decision, reason=judged["reason"]) if judged["why"] else decision), judged


def _repair(config: Config, client, name: str, decision, enacted, judged: dict, log) -> list:
    """The remediation ladder after a new drain (slurm/repair.py): opt-in, never for a lemon."""
    from .slurm import repair

    observe = enacted.outcome is Outcome.OBSERVE
    if judged["why"] or not (enacted.outcome in policy.NEW_DRAINS or observe):
        return []
    if judged.get("history_unknown"):
        # the attempts cap cannot be counted: no rung is climbed on an unknown history
        log.warning(logs.kv(event="repair-skipped", node=name, why="drain history unreadable"))
        return []
    steps = repair.run_ladder(
        client,
        name,
        decision.reason,
        decision.findings[0].action,
        judged["gpu"],
        enacted.node,
        config.settings["repair"],
        judged["history"],
        judged["time"],
        observe,
        config.get("general", "root"),
    )
    for step in steps:
        log.warning(logs.kv(event="repair", node=name, rung=step["rung"], result=step["result"]))
    judged["repair"] = repair.made(steps)
    return steps


def _remember_repair(client, name: str, state: Dict[str, Any], enacted, judged: dict) -> None:
    """The drain's record carries the lemon verdict and the repair steps. A reboot request makes
    Slurm append ' : reboot issued' to our reason with a new time: the record follows, so the drain
    stays provably ours."""
    drained = state.get("drained")
    if not drained or enacted.outcome not in policy.DELIVERED:
        return
    if judged.get("why"):
        drained["lemon"] = judged["why"]
    if not judged.get("steps"):
        return
    drained["repair"] = judged["steps"]
    if judged.get("repair") == "reboot":
        from .slurm.errors import SlurmError

        try:
            node = client.show_node(name)
        except SlurmError:
            return
        if node.reason and node.reason.startswith(drained.get("reason") or "\0"):
            drained.update(reason=node.reason, reason_time=node.reason_time)


def _remember_lemon(config: Config, state, enacted, decision, judged: dict, log) -> None:
    """A new drain of ours joins the node's drain history (bounded); a lemon is logged CRITICAL."""
    from .slurm import lemon

    if enacted.outcome not in policy.NEW_DRAINS or not lemon.keeps_history(config):
        return
    if judged.get("history_unknown"):
        # written from an unread history, the file would lose every earlier drain: leave it as it is
        log.warning(logs.kv(event="drain-history-not-updated", why="it could not be read"))
        return
    if judged["why"]:
        log.critical(
            logs.kv(
                event="lemon-node", reason=decision.reason, detail="held for RMA: " + judged["why"]
            )
        )
    _run_bounded(
        config, [lemon.history_step(config, judged, decision.reason, decision.checks)], log
    )


def _remember_drain(
    state: Dict[str, Any],
    enacted: drainer.Enacted,
    decision: policy.Decision,
    job: JobContext,
    context: str,
) -> None:
    """Record what Slurm now shows as our drain (its exact reason and reason time prove it is ours)."""
    outcome = enacted.outcome
    entry = {
        "reason": decision.reason,
        "checks": list(decision.checks),
        "time": time.time(),
        "job": job.job_id,
        "context": context,
    }
    node = enacted.node
    old = state.get("drained") or {}
    pending = state.get("pending") or {}
    checks = list(
        dict.fromkeys(
            list(old.get("checks", [])) + list(pending.get("checks", [])) + list(decision.checks)
        )
    )
    if (
        outcome is Outcome.ALREADY_OURS and node is None and old
    ):  # another hook of this node just drained
        state["drained"] = dict(old, checks=checks)
        state.pop("pending", None)
    elif outcome in policy.DELIVERED and node is not None and node.reason:
        if (
            outcome is Outcome.ALREADY_OURS
        ):  # the drain recorded (or pending), seen again: keep its story
            base = (
                old
                if old.get("reason") == node.reason
                else pending
                if pending.get("reason") == node.reason
                else {}
            )
            entry = dict(
                entry,
                **{k: v for k, v in base.items() if k in ("time", "job", "context")},
                checks=checks,
            )
        entry.update(reason=node.reason, reason_time=node.reason_time, confirmed=enacted.confirmed)
        state["drained"] = entry
        state.pop("pending", None)
    elif (
        outcome in policy.DELIVERED
    ):  # drained, but not seen back (re-count failed): what we asked for
        entry.update(confirmed=enacted.confirmed)
        state["drained"] = dict(state.get("drained") or {}, **entry)
        state.pop("pending", None)
    elif outcome in policy.UNDELIVERED:
        # delivered by a later health run, if the checks still fail; if the request landed after all (a
        # timeout after slurmctld acted), the drain matching it is ours but was never ranked: confirmed False
        state["pending"] = dict(entry, confirmed=False)
    elif outcome in (
        Outcome.BREAKER,
        Outcome.BREAKER_UNDONE,
        Outcome.FOREIGN_DRAIN,
        Outcome.NOT_DRAINED,
    ):
        state.pop("pending", None)  # decided: nothing of ours to deliver or to track
        if outcome is not Outcome.BREAKER:
            state.pop("drained", None)


def _recover(
    client, name: str, state: Dict[str, Any], known: bool, report: RunReport, config: Config
) -> drainer.Enacted:
    """Health run found nothing node-broken: resume what we drained, on proof only.

    Proof: Slurm's reason is still exactly the one we recorded, and every check that caused the drain
    ran in this run and passed (OK, WARN, SKIP). UNKNOWN, a timeout or a check that did not run keeps it.
    Lost state (`known` False): one show_node, and a drain whose reason is one of our automatic ones
    (it names its checks) is taken back as ours.
    """
    from .slurm.drainer import Enacted, resume
    from .slurm.errors import SlurmError

    if not known:
        try:
            node = client.show_node(name)
        except SlurmError as exc:
            from .slurm.drainer import slurm_failure

            return slurm_failure(exc, "cannot rebuild the lost local state: ")
        owner = policy.read_reason(node.reason, config.get("drain", "reason_prefix"))
        # a straggler drain (slurm/straggler_drain.py, from the admin host) is not this node's: its checks passing
        # prove nothing about being slower than its peers; an admin clears it
        if (
            not (node.is_drained and owner.automatic and not node.is_failed)
            or policy.FLEET_CHECK in owner.checks
        ):
            state.pop("drained", None)
            return Enacted(
                Outcome.NOT_DRAINED,
                "local state rebuilt from Slurm: no drain of ours on %s (%s)"
                % (name, node.state_string),
                node,
            )
        state["drained"] = {
            "reason": node.reason,
            "reason_time": node.reason_time,
            "checks": list(owner.checks),
            "complete": owner.complete,
            "time": time.time(),
            "context": "rebuilt",
            "confirmed": True,
        }
        if lemon_reason(node.reason, config):
            state["drained"]["lemon"] = "the drain reason asks for RMA"
    record = state.get("drained")
    if not record:  # another hook of this node resumed or dropped it while we ran
        return Enacted(Outcome.NOT_DRAINED, "no drain of ours is recorded any more")
    if record.get("lemon") or lemon_reason(record.get("reason"), config):
        return Enacted(
            Outcome.UNPROVEN,
            "drain kept: a lemon held for RMA (%s); never resumed automatically, an admin clears it "
            "with slurm-hooks resume" % (record.get("lemon") or "reason"),
            node_drained=True,
        )
    missing = policy.unproven(record.get("checks", []), report.results())
    if not record.get("complete", True):
        missing.append("the drain reason does not name every check that caused it")
    if not record.get("checks"):
        missing.append("no check is recorded for this drain")
    if missing:
        return Enacted(
            Outcome.UNPROVEN,
            "drain kept%s: %s"
            % (" (local state rebuilt from Slurm)" if not known else "", "; ".join(missing)),
            node_drained=True,
        )
    enacted = resume(client, name, config.settings, expected=record)
    if enacted.outcome in policy.NOT_OURS_NOW:
        state.pop("drained", None)  # resumed, or someone else took over the node: not ours to track
    return enacted


def lemon_reason(reason: Optional[str], config: Config) -> bool:
    from .slurm.lemon import is_lemon

    return is_lemon(reason, config.get("drain", "reason_prefix"))


def _log_decision(
    log,
    context: str,
    name: str,
    job: JobContext,
    report: RunReport,
    decision: policy.Decision,
    enacted: Optional[drainer.Enacted],
    slurm_calls: int,
    slurm_backend: Optional[str] = None,
) -> None:
    """One line per decision; slurm_calls (requests sent to slurmctld, 0 on the happy path) lets an
    operator, and the end-to-end tests, see what a hook cost the controller; slurm_backend (scontrol or
    pyslurm) how it talked to it, once it did."""
    level = "info"
    if enacted is not None and (enacted.outcome in policy.BREAKER_HELD or not enacted.confirmed):
        level = "critical"
    elif decision.verdict is policy.Verdict.DRAIN or (
        enacted and enacted.outcome is Outcome.SLURM_UNAVAILABLE
    ):
        level = "error"
    elif decision.verdict is policy.Verdict.ALERT:
        level = "warning"
    first = decision.findings[0] if decision.findings else None
    getattr(log, level)(
        logs.kv(
            context=context,
            job=job.job_id,
            user=job.user,
            node=name,
            status=report.status.value,
            decision=decision.verdict.value,
            blame=decision.blame.value if decision.blame else None,
            outcome=enacted.outcome.value if enacted else None,
            check=first.check if first else None,
            component=first.component if first else None,
            reason=decision.reason or (first.summary if first else None),
            detail=enacted.message if enacted else None,
            slurm_calls=slurm_calls,
            slurm_backend=slurm_backend,
            duration_ms=int(report.duration * 1000),
        )
    )


def fail_open(
    context: str,
    error: Exception,
    config_path: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    event: str = "config-error",
) -> int:
    """A problem of ours (a refused config, a bug): let the job run, and say so where the admin looks.

    One CRITICAL decision line (syslog/journald and the log file, with the [paths] that could be
    salvaged from the broken files: config.salvage_settings) and, for a refused configuration,
    slurm_hooks_config_error 1 in the metrics: every job on this node now runs unchecked.
    """
    from .core.config import salvage_settings

    env = env or {}
    text = "%s: %s" % (type(error).__name__, error)
    try:
        settings = salvage_settings(config_path)
        log = logs.setup(
            settings, create_dirs=False
        )  # an installed node has its log directory (the package's)
        log.critical(
            logs.kv(
                context=context,
                job=env.get("SLURM_JOB_ID"),
                node=env.get("SLURMD_NODENAME"),
                event=event,
                decision="fail-open",
                error=text,
                detail="failing open (exit 0): jobs run unchecked until this is fixed (slurm-hooks config check)",
            )
        )
        if event == "config-error" and settings["metrics"]["textfile_dir"]:
            from .core.isolation import Step, run_steps
            from .records import metrics

            run_steps(
                [
                    Step(
                        "metrics",
                        settings["metrics"]["textfile_dir"],
                        lambda: metrics.write_config_error(settings, context, text, log),
                    )
                ],
                settings["deadline"]["files"],
            )
    except Exception:  # noqa: BLE001  (logging itself broke: the plain fallback below)
        message = "slurm-hooks %s: %s -- failing open (exit 0)" % (context, text)
        print(message, file=sys.stderr)
        try:
            import syslog

            syslog.openlog("slurm-hooks")
            syslog.syslog(syslog.LOG_CRIT, message.replace("\x00", "\\x00"))
        except Exception:  # noqa: BLE001  (syslog is best effort here)
            pass
    return ExitCode.OK


def main_hook(
    context: str,
    config_path: Optional[str],
    env: Mapping[str, str],
    node: Optional[str] = None,
    root: Optional[str] = None,
) -> int:
    from .core.config import load_registry_and_config

    try:
        registry, config = load_registry_and_config(config_path, root)
    except ConfigError as exc:
        return fail_open(context, exc, config_path, env)
    except (
        Exception
    ) as exc:  # our bug (a site check that breaks the registry...) must never drain the node
        import traceback

        traceback.print_exc()
        return fail_open(context, exc, config_path, env, event="internal-error")
    try:
        return run_hook(context, registry, config, env, node).exit_code
    except Exception as exc:  # our bug must never drain the node
        import traceback

        traceback.print_exc()
        return fail_open(context, exc, config_path, env, event="internal-error")
