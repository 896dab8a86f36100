"""Carrying out a drain decision: under the node's lock (slurm/nodelock.py), with one Slurm budget.

A drain is judged against the node's drain history first (slurm/lemon.py: a lemon's reason asks for
RMA), the remediation ladder may run after it (slurm/repair.py, opt-in), and the outcome is recorded
in node-state.json (state.py) and the drain history. In the health mode without a drain,
recovery.py decides whether what we drained can be resumed. Everything of Slurm's is imported here,
only when a run enacts something.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Tuple

from ..core import logs
from ..core.config import Config
from ..core.runner import JobContext, RunReport
from ..slurm import policy
from ..slurm.policy import Outcome
from .bounded import run_bounded
from .recovery import recover
from .state import read_state, remember_drain, save_state

if TYPE_CHECKING:
    from ..slurm import drainer


def enact(
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
    from ..slurm import drainer, nodelock  # only now: the happy path loads nothing of Slurm's

    client = client or drainer.make_client(config.settings)
    budget = drainer.slurm_budget(config.settings)
    client.set_budget(budget)
    with nodelock.NodeLock(config.settings.paths.state_dir, name, budget) as lock:
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
                decision, judged = _judge_lemon(
                    config, decision, notes.get("unanswered", False) or "untrusted" in notes
                )
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
            remember_drain(state, enacted, decision, job, context)
            _remember_repair(client, name, state, enacted, judged)
        else:
            enacted = recover(client, name, state, known, report, config)
        save_state(config, state, log)
    return enacted, client, decision


def _judge_lemon(
    config: Config, decision: policy.Decision, history_unbelievable: bool = False
) -> Tuple[policy.Decision, dict]:
    """The drain's reason, asking for RMA when this node is a lemon (slurm/lemon.py). When the state
    directory did not answer this run (the state read was abandoned), the history there is not read
    a second time: a hung directory costs [deadline] files once for reading, not once per file. A
    directory others can write (state.read_state) is not read either: its history could have been
    emptied, so it is unknown, and no repair rung is climbed on it."""
    from ..core.structs import replace
    from ..slurm import lemon

    judged = lemon.decide(
        config,
        decision.findings[0],
        decision.checks,
        decision.reason,
        len(decision.findings) - 1,
        read=not history_unbelievable,
    )
    return (replace(decision, reason=judged["reason"]) if judged["why"] else decision), judged


def _repair(config: Config, client, name: str, decision, enacted, judged: dict, log) -> list:
    """The remediation ladder after a new drain (slurm/repair.py): opt-in, never for a lemon."""
    from ..slurm import repair

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
        config.settings.repair,
        judged["history"],
        judged["time"],
        observe,
        config.settings.general.root,
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
        from ..slurm.errors import SlurmError

        try:
            node = client.show_node(name)
        except SlurmError:
            return
        if node.reason and node.reason.startswith(drained.get("reason") or "\0"):
            drained.update(reason=node.reason, reason_time=node.reason_time)


def _remember_lemon(config: Config, state, enacted, decision, judged: dict, log) -> None:
    """A new drain of ours joins the node's drain history (bounded); a lemon is logged CRITICAL."""
    from ..slurm import lemon

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
    run_bounded(config, [lemon.history_step(config, judged, decision.reason, decision.checks)], log)
