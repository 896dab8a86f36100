"""The one log line per decision (core/logs.py: key=value to the log file and syslog/journald).

Its fields come from the run: the job (slurmd's environment), the report (the checks), the decision
(slurm/policy.py) and what was enacted (slurm/drainer.py), with the Slurm calls it cost.
"""

from __future__ import annotations

from ..core import logs
from ..core.runner import JobContext, RunReport
from ..slurm import policy
from ..slurm.policy import Outcome

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Optional

    from ..slurm import drainer


def log_decision(
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
