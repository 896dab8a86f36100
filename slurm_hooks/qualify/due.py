"""`slurm-hooks qualify --due` (the shipped slurm-hooks-qualify.timer runs it on an admin host): the
nodes due for a qualification, qualified one after another through Slurm (through_slurm).

Due are:
- **repaired**: drained by us (an automatic reason of ours, not a lemon held for RMA) for an action
  that asks for a repair (`-> reboot` or `-> reset-gpu` in the reason, slurm/reasons.py) and
  rebooted since (Slurm's BootTime later than the reason's time): the repair ladder's reboot
  (slurm/repair.py) or an admin's. Pass resumes the node, anything else drains it again
  (through_slurm.qualify_node). Also repaired: DOWN after the ladder's reboot with [repair]
  next_state = "DOWN" (Slurm's reason '<ours> : reboot issued : reboot complete', its time the
  completion's: rebooted.down_after_our_reboot); qualify_node drains it, then proceeds as for
  a drained node. A reboot still pending (REBOOT_REQUESTED/ISSUED) is waited for.
  A reset-gpu done on the node without a reboot is not seen from here
  (its record is the node's own state file): `qualify --node` it.
- **straggler suspects** queued by `report --stragglers --drain` with [fleet] confirm_with =
  "qualify" (qualify/queue.py), once idle: held by the reservation alone (they are in service).
  A fail drains them through the drain library (breaker, observe mode) with the qualification's
  test and figure AND the straggler figure, as a fleet.straggler drain (an admin clears it, as any
  straggler drain); a pass leaves them in service and is remembered (queue.settle); not qualified
  (a tool missing, the job died) leaves them in service, still queued: unknown is not a fail.
Nodes running jobs, drained by someone else, DOWN (but after our reboot), FAIL, in an admin's reservation are skipped with
the reason (qualify_node's etiquette) and looked at again by the next run.
"""

from __future__ import annotations

import calendar
import re
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..result import Action, Result, Status
from ..slurm import drainer, policy
from ..slurm.lemon import is_lemon
from ..slurm.node_state import NodeInfo, parse_fields
from . import queue
from .rebooted import REBOOT_ACTION as REPAIR_ACTION
from .rebooted import down_after_our_reboot
from .through_slurm import qualify_node, without_our_hold


def boot_epoch(node: NodeInfo) -> Optional[int]:
    """Slurm's BootTime of the node (scontrol prints it in the client's TZ: UTC, client_env), None
    when not known (a backend without the raw line, 'None', a node that never registered)."""
    text = parse_fields(node.raw).get("BootTime", "") if node.raw else ""
    try:
        return calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def repaired(node: NodeInfo, prefix: str) -> Tuple[bool, str]:
    """(due, why) for a node that may be waiting for its qualification after a repair."""
    owner = policy.read_reason(node.reason, prefix)
    if not (node.is_drained or node.is_down) or not owner.automatic:
        return False, ""
    action = REPAIR_ACTION.search(node.reason or "")
    if not action or is_lemon(node.reason, prefix):
        return False, ""
    if node.is_rebooting:  # Slurm has not rebooted it yet (a BootTime may be an older boot's)
        return False, "%s for %s; its reboot is still pending (%s)" % (
            "down" if node.is_down else "drained",
            action.group(1),
            node.state_string,
        )
    if node.is_down:
        return _down_after_reboot(node, prefix, action.group(1))
    booted, drained = boot_epoch(node), node.reason_epoch
    if booted is None or drained is None:
        return False, "drained for %s; its boot or drain time is unknown" % action.group(1)
    if booted <= drained:
        return False, "drained for %s, not rebooted since" % action.group(1)
    return True, "drained for %s at %s, rebooted at %s" % (
        action.group(1),
        _utc(drained),
        _utc(booted),
    )


def _down_after_reboot(node: NodeInfo, prefix: str, action: str) -> Tuple[bool, str]:
    """A node of ours DOWN: due once Slurm says the reboot it issued is complete (the repair
    ladder's nextstate=DOWN; Slurm then replaced the reason's time with the completion's, so
    BootTime cannot be compared with our drain); anything else DOWN (not responding, 'reboot timed
    out') is waited for."""
    if not down_after_our_reboot(node, prefix):
        return False, "down for %s, not after a completed reboot (%s)" % (
            action,
            node.state_string,
        )
    booted = boot_epoch(node)
    return True, "down after our reboot for %s: Slurm's 'reboot complete' at %s, booted at %s" % (
        action,
        node.reason_time or "?",
        _utc(booted) if booted is not None else "?",
    )


def pick(
    nodes: List[NodeInfo], queued: Mapping[str, Any], prefix: str
) -> Tuple[List[Dict[str, str]], List[Dict[str, str]]]:
    """(due, waiting): each {node, kind (repaired | straggler), why}; a node both ways is a repaired
    one (its drain is ours: the pass resumes it)."""
    due, waiting, seen = [], [], set()
    for node in nodes:
        ok, why = repaired(node, prefix)
        if ok:
            due.append({"node": node.name, "kind": "repaired", "why": why})
            seen.add(node.name)
        elif why:
            waiting.append({"node": node.name, "kind": "repaired", "why": why})
    listed = {node.name: node for node in nodes}
    for name in sorted(queued):
        if name in seen:
            continue
        if name not in listed:  # a hand-edited name that is no node (or a path) included
            waiting.append({"node": name, "kind": "straggler", "why": "not a node Slurm lists"})
            continue
        node = listed[name]
        if node.is_drained:  # someone's decision already (ours for another fault, an admin's)
            why = "drained (%s): confirmed once back in service" % (node.reason or "")
            waiting.append({"node": name, "kind": "straggler", "why": why})
            continue
        why = "straggler suspect queued since %s (%s)" % (
            _utc(queued[name]["time"]),
            queued[name].get("metric"),
        )
        due.append({"node": name, "kind": "straggler", "why": why})
    return due, waiting


def run_due(client, settings, level, command, work_dir, env=None) -> Dict[str, Any]:
    """Qualify every due node, one after another; {due: [outcomes], waiting: [...], error?}."""
    from ..slurm.errors import SlurmError

    prefix = settings["drain"]["reason_prefix"]
    path = queue.path_for(settings)
    try:
        queued = queue.read(path)["queued"]
    except (OSError, ValueError) as exc:
        return {"due": [], "waiting": [], "error": "the qualification queue: %s" % exc}
    try:
        nodes = client.list_nodes()
    except SlurmError as exc:
        return {"due": [], "waiting": [], "error": "cannot list the nodes: %s" % exc}
    due, waiting = pick(nodes, queued, prefix)
    outcomes = []
    for entry in due:
        confirm = None
        if entry["kind"] == "straggler":
            confirm = _confirmer(client, settings, entry["node"], queued[entry["node"]])
        try:
            done = qualify_node(
                client, entry["node"], level, settings, command, work_dir, env, confirm
            )
        except ValueError as exc:  # a name Slurm lists that cannot name a file (safe_name)
            done = {"node": entry["node"], "verdict": "not qualified", "reason": str(exc)}
            done["slurm_calls"] = 0
        done.update(kind=entry["kind"], due=entry["why"])
        outcomes.append(done)
        if str(done.get("reason", "")).startswith("interrupted by"):
            break
    return {"due": outcomes, "waiting": waiting}


def _confirmer(client, settings, node: str, entry: Mapping[str, Any]):
    def confirm(out: Dict[str, Any]) -> str:
        verdict = out["verdict"]
        try:
            queue.settle(settings, node, verdict)
        except (OSError, ValueError) as exc:
            out["queue_error"] = str(exc)
        if verdict == "pass":
            return "left in service (the suspicion did not hold; remembered)"
        if verdict != "fail":
            return "left in service, still queued (not qualified is not a fail)"
        reason = confirmed_reason(out.get("reason", ""), entry.get("straggler", ""), settings)
        before = client.calls
        held = without_our_hold(settings)  # done while our reservation holds the node
        enacted = drainer.drain(client, node, reason, held, (), True, refine=False)
        out["slurm_calls"] += client.calls - before
        return "%s: %s" % (enacted.outcome.value, enacted.message)

    return confirm


def confirmed_reason(qualify_reason: str, straggler_reason: str, settings) -> str:
    """'sh:fleet.straggler: qualify <test>: <figure>; straggler <metric figure> -> drain': a
    fleet.straggler drain (an admin clears it; the node's own checks passing prove nothing), the
    qualification's figure first (what `sinfo -R` shows), bounded."""
    prefix = settings["drain"]["reason_prefix"]
    summary = straggler_reason
    head = "%s: " % policy.FLEET_CHECK
    if head in summary:
        summary = summary.split(head, 1)[1]
    summary = re.sub(r"\s*-> \S+$", "", summary).split(" of its job peers")[0]
    first = qualify_reason.split("; ")[0]  # the first failed figure: both must fit the reason
    result = Result(
        policy.FLEET_CHECK,
        Status.FAIL,
        "qualify %s; straggler %s of its job peers" % (first, summary),
        action=Action.DRAIN,
    )
    return policy.format_reason(result, prefix, int(settings["drain"]["max_reason_length"]))


def _utc(moment: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(moment))
