"""run_hook: the order of one prolog, epilog or health run.

Job environment (slurm/jobenv.py, what slurmd exports) -> the context's checks in a bounded child
(bounded.py) -> policy.decide -> a drain, resume or state rebuild when one is on the table
(enactment.py, recovery.py) -> one decision line (decision_log.py) -> the exit code -> the bounded
file steps after the decision (records/store.py, records/metrics.py). The state file (state.py) is
read before the checks by the health mode only: the prolog's and epilog's happy path reads nothing.
"""

from __future__ import annotations

import os
import time

from ..core import logs
from ..core.config import Config
from ..core.runner import JobContext, RunReport
from ..core.structs import Struct
from ..registry import JOB_CONTEXTS, Registry
from ..result import ExitCode
from ..slurm import policy
from ..slurm.jobenv import JobEnvError, job_from_env
from .bounded import run_bounded, run_isolated_checks
from .decision_log import log_decision

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Dict, Mapping, Optional

    from ..slurm import drainer

# state.py and enactment.py (and through it recovery.py, nodelock, lemon and repair) are imported only
# when a run needs them: the happy path neither talks to Slurm nor loads what drains
# (tests/test_hooks.py, test_a_healthy_prolog_loads_neither_the_state_nor_the_drain_modules).


OPT_OUT_TOKEN = "slurm_hooks=skip"


class HookResult(Struct, frozen=False):
    exit_code: int
    report: Optional[RunReport] = None
    decision: Optional[policy.Decision] = None
    enacted: Optional[drainer.Enacted] = None
    slurm_calls: int = 0


def node_name(job: JobContext, explicit: Optional[str] = None) -> str:
    """SLURMD_NODENAME (what slurmd calls this node), else --node, else the short host name."""
    return job.node_name or explicit or os.uname().nodename.split(".")[0]


def opted_out(env: Mapping[str, str], config: Config) -> bool:
    if not config.settings.drain.allow_job_opt_out:
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
    logger = logs.LazyLogger(config.settings)
    try:
        job = job_from_env(env, require_job=context in JOB_CONTEXTS)
    except JobEnvError as exc:
        logger().critical(
            logs.kv(context=context, event="bad-job-environment", error=exc, decision="fail-open")
        )
        return HookResult(0)
    name = node_name(job, node)
    if (
        context == "health"
    ):  # deprecated spellings still work; say how to write them, every few minutes at most
        log = logger()
        for warning in config.warnings:
            log.warning(
                logs.kv(context=context, node=name, event="config-deprecated", detail=warning)
            )
    if context == "prolog" and opted_out(env, config):
        logger().warning(logs.kv(context=context, job=job.job_id, node=name, event="job-opted-out"))
        return HookResult(0)
    # Only health needs the state before its checks; a prolog/epilog reads it when it drains (the happy
    # path reads nothing, so it pays no bounded child for it, nor loads state.py).
    state: Dict[str, Any] = {}
    known = True
    if context == "health":
        from .state import read_state

        state, known = read_state(config, logger())
    remembered = [
        c
        for entry in (state.get("drained"), state.get("pending"))
        if entry
        for c in entry.get("checks", [])
    ]
    # the logger (and the logging module) is set up while the check process runs, not before it
    report, gathered = run_isolated_checks(
        registry, config, context, job, remembered if context == "health" else (), logger
    )
    log = logger()
    if context == "epilog":  # the Xids a job's epilog sees first happened during that job
        _xid_pattern(config, job, report, log)
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
        from .state import save_state

        save_state(config, state, log)
    enacted = None
    rebuild = (
        not known and config.settings.general.mode != "observe"
    )  # observe resumes nothing: no need
    if draining or (context == "health" and (state.get("drained") or rebuild)):
        from .enactment import enact  # only now: the happy path does not load it

        enacted, client, decision = enact(context, name, job, config, log, decision, report, client)
    calls = client.calls if client is not None else 0
    code = ExitCode.NODE_BROKEN if enacted is not None and enacted.node_drained else ExitCode.OK
    log_decision(
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


def _xid_pattern(config: Config, job: JobContext, report: RunReport, log) -> None:
    """Application Xids repeating on one GPU across jobs and users (xid/pattern.py) join the run's
    results as a node-broken xid.pattern finding; nothing is read without such Xids. A bug of this
    step (its history file, the records lookup) is logged and leaves the run as its checks judged
    it: the step may add a finding, never take the epilog's others away."""
    from ..core.runner import CheckRun
    from ..xid import pattern

    try:
        found = pattern.apply(config, job, report.results(), time.time())
    except Exception as exc:  # noqa: BLE001  (our bug: the checks' findings still stand)
        log.error(
            logs.kv(
                context="epilog",
                job=job.job_id,
                event="xid-pattern-failed",
                error=repr(exc),
                decision="judged without xid.pattern",
            )
        )
        return
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
    from ..core.isolation import Step, StepOutcome
    from ..records import store

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
    if (
        config.settings.metrics.textfile_dir
    ):  # prometheus_client is imported only then, in the child
        from ..records import metrics  # only then: ~0.4 ms of the prolog's tail, where it waits

        steps.append(
            Step(
                "metrics",
                config.settings.metrics.textfile_dir,
                lambda: metrics.write_textfile(config, context, report, decision, enacted, log=log),
            )
        )
    earlier = (
        [StepOutcome("snapshot", stored["path"], stored["state"], stored["seconds"])]
        if stored
        else []
    )
    run_bounded(config, steps, log, context, job, earlier)
