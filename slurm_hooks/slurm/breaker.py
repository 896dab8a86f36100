"""The circuit breaker's limits, counted from Slurm's own node list (docs/slurm.md, "The circuit breaker").

Three limits, each counted from the same listing every node reads (`scontrol show node`), so no file
is shared between nodes and nothing is lost when one crashes:
 - the share: at most L = min(max(min_nodes, floor(max_percent % of the nodes)), max_nodes) nodes
   carry an automatic drain of ours at once (max_nodes 0: no absolute cap);
 - the rate: at most max_window_drains automatic drains of ours made within window_s seconds;
 - a common cause: at most common_cause_nodes drains of ours led by the same check within
   common_cause_window_s seconds; the next one is a common cause (a driver roll-out, a shared file
   system, a switch), not one more broken node: it is held and alerted.
Time is slurmctld's: a drain's time is Slurm's reason time ('Reason=... [root@2026-12-03T16:40:01]'),
stamped under its node write lock. After our drain (phase 'rank') the window ends at our own drain's
reason time and only drains that rank ahead of ours, by (reason time, node name), count: the same
total order as the share, so each limit holds at rest under simultaneous drains (the argument in
docs/slurm.md). Before it (phase 'count', an early stop) the window ends at the later of this host's
clock and the newest reason time listed. A drain whose time cannot be read counts inside every window
(the safe direction). What the list no longer shows (a node resumed since) is not counted: the rate is
of drains still in place.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Mapping, Optional, Tuple

from .node_state import NodeInfo
from .policy import BreakerState, breaker_limit, drain_key
from .reasons import read_reason


def signature(reason: Optional[str], prefix: str) -> str:
    """The check that leads one of our automatic reasons ('gpu.xid' for 'sh:gpu.xid g3 +gpu.ecc: ...'),
    '' for anything else. The common-cause limit groups drains by it."""
    owner = read_reason(reason, prefix)
    return owner.checks[0] if owner.automatic and owner.checks else ""


def _ours(nodes: Iterable[NodeInfo], this_node: str, prefix: str) -> List[Tuple[NodeInfo, str]]:
    """The other nodes carrying an automatic drain of ours, each with its signature."""
    return [
        (n, signature(n.reason, prefix))
        for n in nodes
        if n.name != this_node and n.is_drained and read_reason(n.reason, prefix).automatic
    ]


def _within(epoch: Optional[int], end: float, seconds: float) -> bool:
    return epoch is None or epoch > end - seconds


def assess(
    nodes: Iterable[NodeInfo],
    this_node: str,
    reason: str,
    prefix: str,
    limits: Mapping[str, Any],
    now: float,
    this_key: Optional[Tuple[int, str]] = None,
) -> BreakerState:
    """Every limit for a drain of this_node with `reason`. this_key None: before the drain (count
    every other drain of ours, window ending at `now` or the newest reason time listed); else after
    it (count the drains ranking ahead of this_key, window ending at this_key's reason time)."""
    nodes = list(nodes)
    ours = _ours(nodes, this_node, prefix)
    if this_key is not None:
        ours = [(n, s) for n, s in ours if drain_key(n.reason_epoch, n.name) < this_key]
        end = float(this_key[0]) if this_key[0] >= 0 else now
    else:
        end = max([now] + [float(n.reason_epoch or 0) for n, _ in ours])
    max_nodes = int(limits.get("max_nodes", 0))
    state = BreakerState(
        len(ours),
        len(nodes),
        breaker_limit(len(nodes), limits["max_percent"], limits["min_nodes"], max_nodes),
        "count" if this_key is None else "rank",
    )
    window_s, window_limit = (
        float(limits.get("window_s", 0)),
        int(limits.get("max_window_drains", 0)),
    )
    if window_limit and window_s:
        recent = sum(1 for n, _ in ours if _within(n.reason_epoch, end, window_s))
        state = state.replace(window_drains=recent, window_limit=window_limit, window_s=window_s)
    cause_s, cause_limit = (
        float(limits.get("common_cause_window_s", 0)),
        int(limits.get("common_cause_nodes", 0)),
    )
    mine = signature(reason, prefix)
    if cause_limit and cause_s and mine:
        same = sum(1 for n, s in ours if s == mine and _within(n.reason_epoch, end, cause_s))
        state = state.replace(
            signature=mine,
            signature_drains=same,
            signature_limit=cause_limit,
            signature_window_s=cause_s,
        )
    return state
