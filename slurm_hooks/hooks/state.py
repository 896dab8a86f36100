"""The node's local state: paths.state_dir/node-state.json ([paths] state_dir in the config).

It holds {"drained": {...}, "pending": {...}}: the drain we made, with Slurm's exact reason and reason
time (read back from `scontrol show node` after the drain: the proof it is ours), the checks that
caused it, and a drain we could not deliver (pending). Read and written in a bounded child
([deadline] files): a state directory that never answers costs that much, once.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Tuple

from ..core import logs
from ..core.atomicio import read_json, write_json_atomic
from ..core.config import Config
from ..core.runner import JobContext
from ..slurm import policy
from ..slurm.policy import Outcome
from .bounded import run_bounded

if TYPE_CHECKING:
    from ..slurm import drainer


def state_path(config: Config) -> str:
    return os.path.join(config.settings.paths.state_dir, "node-state.json")


def read_state(
    config: Config, log, notes: Optional[Dict[str, Any]] = None
) -> Tuple[Dict[str, Any], bool]:
    """(node-state.json, known), read in a child process bounded by [deadline] files: a state directory
    that never answers costs that much, once, and the hook goes on without what it remembers.

    known is False when the file is missing, unreadable or did not answer: what we drained is then
    unknown here, and the health mode rebuilds it from Slurm (one call). It is also False when
    someone else could change the state directory (core/dir_trust.py: they could delete or put
    back our own files): the hook then goes on as with a lost state, logs why, and notes
    ["untrusted"] so the drain history there is not believed either (enactment.py)."""
    from ..core.dir_trust import untrusted_because
    from ..core.isolation import run_isolated

    path = state_path(config)

    def read() -> Dict[str, Any]:
        try:
            why = untrusted_because(os.path.dirname(path))
            if why:
                return {"untrusted": why}
            return {"state": read_json(path, default=None)}
        except (OSError, ValueError) as exc:
            return {"error": str(exc)}

    try:
        answer, why = run_isolated(read, config.settings.deadline.files, "reading the state file")
    except OSError as exc:  # no process left to fork (EAGAIN, ENOMEM): go on without the state
        answer, why = None, "cannot start the reader: %s" % exc
    if answer is not None and "untrusted" in answer:
        log.error(logs.kv(event="state-dir-untrusted", path=path, error=answer["untrusted"]))
        if notes is not None:
            notes["untrusted"] = answer["untrusted"]
        return {}, False
    if answer is None or "error" in answer:
        log.error(logs.kv(event="state-unreadable", path=path, error=why or answer["error"]))
        if notes is not None:  # the state directory did not answer: later reads there are skipped
            notes["unanswered"] = answer is None
        return {}, False
    state = answer["state"]
    return (state, True) if isinstance(state, dict) else ({}, False)


def save_state(config: Config, state: Mapping[str, Any], log) -> None:
    from ..core.isolation import Step

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

    run_bounded(config, [Step("state", path, write)], log)


def remember_drain(
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
