"""What `report --stragglers` could not judge, node by node: a blind spot says so.

Two kinds, both from the records' header line (docs/records.md):

- untrusted: the record's `summary.perf_untrusted` ({figure: "not scored: saturated (...)"}, made
  by ib_counter_trust): the node's counter saturated or was cleared, so the figure is unmeasurable
  there. This is evidence, not an absence: a port stalling on credits saturates its 32-bit
  port_xmit_wait first, so the worst port is exactly the one whose figure goes missing.
- missing: a figure the job's other nodes were scored on and this node's record does not have (a
  driver without the power-brake counter, cgroup v1 without foreign CPU time, an NVML that hung).

Before this, both were silently scored as fewer figures. Bounded: nodes x figures counters.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from . import rate_test, stragglers

MIN_SHARE = 0.5  # of a node's scored jobs saturated, at least, to be named (saturating)
MAX_REASON = 300  # characters of a record's reason kept (it comes from a file on a shared disk)


def untrusted_of(summary: Dict[str, Any]) -> Optional[Tuple[Tuple[str, str], ...]]:
    """summary.perf_untrusted as ((figure, reason), ...) for the figures the detector knows; None
    when there is none (or it is not the shape we write: a bad field is ignored, not believed)."""
    found = summary.get("perf_untrusted")
    if not isinstance(found, dict) or not found:
        return None
    out = tuple(
        (name, why[:MAX_REASON])
        for name, why in sorted(found.items())
        if name in stragglers.METRIC_BY_NAME and isinstance(why, str)
    )
    return out or None


def _kind(reason: str) -> str:
    """ "not scored: saturated (...)" -> "saturated"."""
    head = reason.split("(", 1)[0]
    return head.replace("not scored:", "").strip() or "untrusted"


class BlindSpots:
    """Per node and figure: in how many scored jobs the figure was untrusted (and why) or missing."""

    __slots__ = ("untrusted", "missing", "example")

    def __init__(self) -> None:
        self.untrusted: Dict[Tuple[str, str, str], int] = {}  # (node, figure, kind) -> jobs
        self.missing: Dict[Tuple[str, str], int] = {}  # (node, figure) -> jobs
        self.example: Dict[Tuple[str, str, str], str] = {}  # the latest reason of each

    def add(
        self,
        node: str,
        untrusted: Optional[Sequence[Tuple[str, str]]],
        missing_bits: int,
        scored: Sequence[int],
    ) -> None:
        """One node-job: its untrusted figures, and the METRIC_BIT bits of figures the job scored
        (`scored`: their indices) that the node did not have."""
        covered = set()
        for figure, why in untrusted or ():
            key = (node, figure, _kind(why))
            self.untrusted[key] = self.untrusted.get(key, 0) + 1
            self.example[key] = why
            covered.add(figure)
        if missing_bits:
            for index in scored:
                name = stragglers.METRICS[index].name
                if missing_bits >> index & 1 and name not in covered:
                    self.missing[(node, name)] = self.missing.get((node, name), 0) + 1

    def rows(self) -> List[Dict[str, Any]]:
        """One row per node x figure x why, most jobs first."""
        out = [
            {"node": n, "metric": f, "why": kind, "jobs": c, "example": self.example[(n, f, kind)]}
            for (n, f, kind), c in self.untrusted.items()
        ]
        out.extend(
            {"node": n, "metric": f, "why": "missing", "jobs": c, "example": None}
            for (n, f), c in self.missing.items()
        )
        return sorted(
            out, key=lambda r: (r["why"] == "missing", -r["jobs"], r["node"], r["metric"])
        )

    def render(self, top: int = 10) -> List[str]:
        """Lines for the text report: the untrusted figures first (they hide the worst ports)."""
        rows = self.rows()
        if not rows:
            return []
        lines = ["cannot be judged (node, figure: why, in how many scored jobs):"]
        for row in rows[:top]:
            why = (
                "not scored: %s" % row["why"]
                if row["why"] != "missing"
                else "not in its records while its peers had it"
            )
            lines.append(
                "  %s %s: %s in %d job(s)" % (row["node"], row["metric"], why, row["jobs"])
            )
        if len(rows) > top:
            lines.append("  ... %d more (--json: not_judged)" % (len(rows) - top))
        return lines


def saturating(
    blind: BlindSpots,
    windows: Mapping[str, stragglers.NodeWindow],
    alpha: float = rate_test.ALPHA,
    least: int = 3,
) -> List[Dict[str, Any]]:
    """Nodes whose counter saturates on a figure far more often than the fleet's (rate_test's
    binomial tail, Bonferroni over the nodes): the port that stalls most is the one a 32-bit
    counter cannot measure, so saturating often is itself the evidence. Per figure, the fleet's
    rate is saturated node-jobs / scored node-jobs (plus one and two). A counter stays saturated
    until something clears it, so a node's saturated jobs are not independent draws (one busy job
    can leave it stuck for the next ones) and the binomial tail alone overstates the evidence:
    the node must also be saturated in at least MIN_SHARE of its jobs (in a healthy harsh fleet
    the tail alone named 2 nodes of 192). Reported, never drained."""
    total_jobs = sum(w.scored for w in windows.values())
    per_figure: Dict[str, Dict[str, int]] = {}
    for (node, figure, kind), count in blind.untrusted.items():
        if kind == "saturated" and node in windows:
            per_figure.setdefault(figure, {})[node] = count
    out: List[Dict[str, Any]] = []
    for figure, counts in sorted(per_figure.items()):
        rate = (sum(counts.values()) + 1.0) / (total_jobs + 2.0)
        for node, count in sorted(counts.items()):
            jobs = max(windows[node].scored, count)
            if count < least or count < MIN_SHARE * jobs:
                continue
            p_value = rate_test.binomial_tail(count, jobs, rate) * max(1, len(windows))
            if p_value < alpha:
                out.append(
                    {
                        "node": node,
                        "metric": figure,
                        "saturated_jobs": count,
                        "jobs": jobs,
                        "fleet_rate": round(rate, 6),
                    }
                )
    return sorted(out, key=lambda r: (-r["saturated_jobs"] / r["jobs"], r["node"]))


def render_saturating(
    rows: Sequence[Dict[str, Any]], switches: Sequence[Dict[str, Any]], top: int = 20
) -> List[str]:
    """Lines for `saturating` and the leaves where it concentrates (topology_groups.group_rows)."""
    if not rows and not switches:
        return []
    lines = ["counters saturated far more often than the fleet's (reported, not drained):"]
    lines.extend(
        "  %(node)s %(metric)s: counter saturated in %(saturated_jobs)d of %(jobs)d jobs "
        "(fleet: %(fleet_rate)g): a stalled port a 32-bit counter cannot measure" % row
        for row in rows[:top]
    )
    lines.extend(
        "  %s %s: %d of its %d nodes saturate the counter far more often than the fleet: the "
        "switch (%s)"
        % (w["switch"], w["metric"], len(w["nodes"]), w["scored_nodes"], ",".join(w["nodes"][:8]))
        for w in switches
    )
    return lines
