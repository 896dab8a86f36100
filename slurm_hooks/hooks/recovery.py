"""The health mode's resume: give back what we drained, on proof only.

The proof is in node-state.json (state.py: the drain's reason, reason time and checks) and in this
run's results; when the state is lost, in Slurm's reason for the node (`scontrol show node`), which
names the checks of an automatic drain (slurm/policy.py read_reason).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Dict, Optional

from ..core.config import Config
from ..core.runner import RunReport
from ..slurm import policy
from ..slurm.policy import Outcome

if TYPE_CHECKING:
    from ..slurm import drainer


def recover(
    client, name: str, state: Dict[str, Any], known: bool, report: RunReport, config: Config
) -> drainer.Enacted:
    """Health run found nothing node-broken: resume what we drained, on proof only.

    Proof: Slurm's reason is still exactly the one we recorded, and every check that caused the drain
    ran in this run and passed (OK, WARN, SKIP). UNKNOWN, a timeout or a check that did not run keeps it.
    Lost state (`known` False): one show_node, and a drain whose reason is one of our automatic ones
    (it names its checks) is taken back as ours.
    """
    from ..slurm.drainer import Enacted, resume
    from ..slurm.errors import SlurmError

    if not known:
        try:
            node = client.show_node(name)
        except SlurmError as exc:
            from ..slurm.drainer import slurm_failure

            return slurm_failure(exc, "cannot rebuild the lost local state: ")
        owner = policy.read_reason(node.reason, config.settings.drain.reason_prefix)
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
    from ..slurm.lemon import is_lemon

    return is_lemon(reason, config.settings.drain.reason_prefix)
