"""Blame the leaf switch, not its nodes: suspects on one figure concentrated under one switch.

A degraded leaf switch (a bad uplink, a failing ASIC, a hot rack) slows every node under it the
same way; scored against the job's other nodes, each node under it comes out worse, and the fleet
report used to list each as a suspect of its own (up to 32 in one independent run, more than all
planted stragglers together), each eligible for a drain. Draining the nodes does not fix a switch.

Input: the node suspects of a pass (stragglers.Suspect), the nodes' windows (to know who was
scored on the figure at all), and Slurm's topology (slurm/topology_conf.py: node -> leaf switch or
block). Rule, per leaf and figure: the leaf's suspects S among its nodes scored on that figure N;
the leaf is the suspect when |S| >= 2 and |S| >= CONCENTRATED x N (half of them), or when |S| >=
FEW_SUSPECTS (3) under a leaf of at most SMALL_LEAF (8) scored nodes. Then the leaf gets one row
with its nodes, and **none** of those nodes stays a node suspect for that figure (nothing drains
them for it); their suspects on other figures stand. Only SWITCH_FIGURES are grouped: what a
leaf can cause (the fabric's figures, and thermal throttling for a hot rack). A node under no leaf of the file is judged
alone, as before.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from . import stragglers

CONCENTRATED = 0.5  # share of the leaf's scored nodes that makes the leaf the suspect
FEW_SUSPECTS = 3  # ... or this many suspects under a small leaf
SMALL_LEAF = 8
MIN_SUSPECTS = 2  # one suspect is a node, never a switch
# What a leaf can do to every node under it: stall or starve their fabric, and (a hot rack under
# one leaf) heat their GPUs. Not a GPU's HW slowdown, power, PCIe or NVLink errors, nor a CPU:
# three broken GPUs in one 8-node leaf were "the switch's" and none of them was drained (red team)
SWITCH_FIGURES = frozenset(
    [m.name for m in stragglers.METRICS if m.kind == "fabric"] + ["throttle_frac.thermal"]
)


class SwitchSuspect:
    """A leaf switch (or block) suspected on `metric`: `nodes` of its `scored` nodes were suspects."""

    __slots__ = ("switch", "metric", "nodes", "scored", "worst_z", "flagged")

    def __init__(
        self, switch: str, metric: str, suspects: Sequence[stragglers.Suspect], scored: int
    ):
        self.switch, self.metric, self.scored = switch, metric, scored
        self.nodes = sorted(s.node for s in suspects)
        self.worst_z = max(s.worst_z for s in suspects)
        self.flagged = sum(s.flagged for s in suspects)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "switch": self.switch,
            "metric": self.metric,
            "nodes": self.nodes,
            "suspect_nodes": len(self.nodes),
            "scored_nodes": self.scored,
            "flagged_jobs": self.flagged,
            "worst_z": self.worst_z,
        }


def scored_on(window: stragglers.NodeWindow, metric: str) -> bool:
    """Whether the node was scored on the figure in the jobs its window holds."""
    bit = stragglers.METRIC_BIT.get(metric)
    return bool(bit) and window.window_start(bit)[1] > 0


def concentrated(suspects: int, scored: int) -> bool:
    if suspects < MIN_SUSPECTS:
        return False
    return suspects >= CONCENTRATED * scored or (suspects >= FEW_SUSPECTS and scored <= SMALL_LEAF)


def blame(
    suspects: Sequence[stragglers.Suspect],
    windows: Mapping[str, stragglers.NodeWindow],
    leaf_of: Optional[Mapping[str, str]],
) -> Tuple[List[stragglers.Suspect], List[SwitchSuspect]]:
    """(the node suspects that stay, the switch suspects), by the rule of the module docstring."""
    if not leaf_of or not suspects:
        return list(suspects), []
    grouped: Dict[Tuple[str, str], List[stragglers.Suspect]] = {}
    for suspect in suspects:
        leaf = leaf_of.get(suspect.node)
        if leaf is not None and suspect.metric in SWITCH_FIGURES:
            grouped.setdefault((leaf, suspect.metric), []).append(suspect)
    if not any(len(group) >= MIN_SUSPECTS for group in grouped.values()):
        return list(suspects), []
    by_leaf: Dict[str, List[str]] = {}
    for node in windows:
        leaf = leaf_of.get(node)
        if leaf is not None:
            by_leaf.setdefault(leaf, []).append(node)
    switches: List[SwitchSuspect] = []
    blamed = set()
    for (leaf, metric), group in sorted(grouped.items()):
        if len(group) < MIN_SUSPECTS:
            continue
        scored = sum(1 for node in by_leaf.get(leaf, ()) if scored_on(windows[node], metric))
        if concentrated(len(group), max(scored, len(group))):
            switches.append(SwitchSuspect(leaf, metric, group, max(scored, len(group))))
            blamed.update((s.node, metric) for s in group)
    kept = [s for s in suspects if (s.node, s.metric) not in blamed]
    switches.sort(key=lambda w: (-len(w.nodes), -w.worst_z, w.switch, w.metric))
    return kept, switches


def render(switches: Sequence[SwitchSuspect], top: int = 20) -> List[str]:
    """Lines for the text report."""
    if not switches:
        return []
    lines = [
        "switch suspects (their nodes are not node suspects on the figure, and are not drained for it):"
    ]
    for row in switches[:top]:
        shown = ",".join(row.nodes[:8]) + (",..." if len(row.nodes) > 8 else "")
        lines.append(
            "  %s %s: %d of its %d scored nodes, worst z %.1f (%s)"
            % (row.switch, row.metric, len(row.nodes), row.scored, row.worst_z, shown)
        )
    if len(switches) > top:
        lines.append("  ... %d more (--json: switch_suspects)" % (len(switches) - top))
    return lines


def group_rows(
    rows: Sequence[Dict[str, Any]],
    windows: Mapping[str, stragglers.NodeWindow],
    leaf_of: Optional[Mapping[str, str]],
) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """The same rule for report rows of a kind (blind_spots.saturating: {"node", "metric", ...}):
    (rows that stay the nodes', one switch row per concentrated leaf and figure). Every node the
    report saw under the leaf counts as scored there (a saturated figure is not scored at all)."""
    if not leaf_of or not rows:
        return list(rows), []
    grouped: Dict[Tuple[str, str], List[Dict[str, Any]]] = {}
    for row in rows:
        leaf = leaf_of.get(row["node"])
        if leaf is not None:
            grouped.setdefault((leaf, row["metric"]), []).append(row)
    seen: Dict[str, int] = {}
    for node in windows:
        leaf = leaf_of.get(node)
        if leaf is not None:
            seen[leaf] = seen.get(leaf, 0) + 1
    switches, moved = [], set()
    for (leaf, metric), group in sorted(grouped.items()):
        if concentrated(len(group), max(seen.get(leaf, 0), len(group))):
            switches.append(
                {
                    "switch": leaf,
                    "metric": metric,
                    "why": "saturating",
                    "nodes": sorted(r["node"] for r in group),
                    "suspect_nodes": len(group),
                    "scored_nodes": max(seen.get(leaf, 0), len(group)),
                }
            )
            moved.update((r["node"], metric) for r in group)
    return [r for r in rows if (r["node"], r["metric"]) not in moved], switches


def suspect_leaves(
    switches: Sequence[SwitchSuspect], saturating_switches: Sequence[Dict[str, Any]]
) -> Set[Tuple[str, str]]:
    """(leaf, figure) of every switch suspect, from node suspects or from saturating counters."""
    return {(w.switch, w.metric) for w in switches} | {
        (row["switch"], row["metric"]) for row in saturating_switches
    }


def split_under(
    suspects: Sequence[stragglers.Suspect],
    leaf_of: Optional[Mapping[str, str]],
    leaves: Set[Tuple[str, str]],
) -> Tuple[List[stragglers.Suspect], List[stragglers.Suspect]]:
    """(suspects that stay the nodes', suspects under a leaf already suspected on their figure):
    the switch explains the latter (a degraded leaf whose other nodes saturate their counters
    leaves a few measurable ones flagged), so they are not drained for that figure either."""
    if not leaf_of or not leaves:
        return list(suspects), []
    kept, under = [], []
    for suspect in suspects:
        if (leaf_of.get(suspect.node), suspect.metric) in leaves:
            under.append(suspect)
        else:
            kept.append(suspect)
    return kept, under


def render_under(
    suspects: Sequence[stragglers.Suspect], leaf_of: Optional[Mapping[str, str]], top: int = 20
) -> List[str]:
    """Lines for the node suspects a suspect switch explains (split_under)."""
    if not suspects:
        return []
    lines = ["under a suspect switch (the switch's, not drained for the figure):"]
    lines.extend(
        "  %s %s: under %s" % (s.node, s.metric, (leaf_of or {}).get(s.node))
        for s in suspects[:top]
    )
    return lines
