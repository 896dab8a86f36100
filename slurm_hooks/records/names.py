"""Record file names: one file per job attempt on a node, so a requeued job never replaces its first run.

Slurm requeues a job under the same job id (after a node failure, a prolog that drained the node,
`scontrol requeue`, preemption) and counts the restarts: slurmd gives its prolog and epilog
SLURM_JOB_RESTART_COUNT (jobenv.restart_count). The epilog names the record

    <job>.json          the first run (restart count 0, or unknown: every record written before this)
    <job>.r<N>.json     the run after the N-th requeue
    <stem>.<k>.json     k = 2, 3, ...: the name above already holds an earlier record of ours

The count is the one the node's prolog saw (kept in its snapshot): slurmctld's `scontrol requeue`
counts the restart before it kills the running attempt, so that attempt's epilog already sees N+1
(job_mgr.c, _job_requeue_op). Without a prolog snapshot the epilog's count is all there is, and the
next attempt can then ask for the same name: it takes the next free `.<k>` instead of replacing it.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

PROBED_RESTARTS = 16  # `record show`/`report --job` look for attempts up to <job>.r16.json
MAX_COPIES = 100  # `.<k>` names tried before giving up (the record is then not written, logged)


def attempt_of(
    job_restart_count: Optional[int], prolog_snapshot: Optional[Mapping[str, Any]]
) -> int:
    """The restart count of the attempt a record describes: the prolog's (its snapshot), else the
    epilog's, else 0."""
    if prolog_snapshot is not None:
        seen = prolog_snapshot.get("restart_count")
        if isinstance(seen, int) and not isinstance(seen, bool) and seen >= 0:
            return seen
    return job_restart_count if job_restart_count else 0


def record_name(job_id: str, attempt: int = 0, copy: int = 1) -> str:
    """'4242.json', '4242.r1.json', '4242.r1.2.json' (module docstring)."""
    return "%s%s%s.json" % (
        job_id,
        ".r%d" % attempt if attempt else "",
        ".%d" % copy if copy > 1 else "",
    )


def restart_count(job: Any) -> int:
    """A record's `job.restart_count`: a non-negative int, 0 when absent or not a count."""
    value = job.get("restart_count") if isinstance(job, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 16:
        return value
    return 0


def job_label(job: Any) -> str:
    """How reports name one attempt of a job: '4242' for the first run, '4242.r1' after a requeue."""
    job_id = job.get("id") if isinstance(job, dict) else None
    attempt = restart_count(job)
    return "%s%s" % (job_id, ".r%d" % attempt if attempt else "")
