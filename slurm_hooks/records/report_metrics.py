"""Prometheus text for the report's newer rows (node_exporter textfile collector).

`report --stragglers --prom FILE` writes straggler_scan.prom_text (the node suspects) followed by
`straggler_rows_text` here: the leaf switches blamed instead of their nodes (topology_groups),
the nodes under them not drained, the nodes flagged far more often than the fleet (rate_test),
the figures that could not be judged (blind_spots: untrusted or missing) and the counters that
saturate far more often than the fleet's. `report --xids --prom FILE` writes `lineup_text`: per
job the node blamed (xid_lineup) and per node the Xids not counted against it.

Names follow the fleet's: slurm_hooks_fleet_<what>, gauges of the last pass; labels `node`,
`metric` (the figure), `switch`. Every family is written even when empty (HELP and TYPE alone), so
an alert on its absence means the pass did not run, not that nothing was found.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Tuple

Sample = Tuple[Dict[str, str], float]


def _label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def family(out: List[str], name: str, text: str, samples: Iterable[Sample]) -> None:
    """One gauge family in the text exposition format (version 0.0.4)."""
    out.append("# HELP %s %s" % (name, text.replace("\\", "\\\\").replace("\n", "\\n")))
    out.append("# TYPE %s gauge" % name)
    for labels, value in samples:
        names = ",".join('%s="%s"' % (k, _label(v)) for k, v in labels.items())
        out.append("%s%s %s" % (name, "{%s}" % names if names else "", repr(float(value))))


def straggler_rows_text(result) -> str:
    """The rows a straggler_scan.StragglerScan adds beside its node suspects."""
    out: List[str] = []
    switches = result.switches()
    family(
        out,
        "slurm_hooks_fleet_switch_suspect",
        "1 for a leaf switch (or block) of topology.conf blamed on a figure instead of its nodes",
        (({"switch": w.switch, "metric": w.metric}, 1) for w in switches),
    )
    family(
        out,
        "slurm_hooks_fleet_switch_suspect_nodes",
        "nodes under the suspect switch that were suspects on the figure (none is drained for it)",
        (({"switch": w.switch, "metric": w.metric}, len(w.nodes)) for w in switches),
    )
    family(
        out,
        "slurm_hooks_fleet_under_suspect_switch",
        "1 for a node suspect under a leaf already suspected on the figure (not drained)",
        (({"node": s.node, "metric": s.metric}, 1) for s in result.under_switch()),
    )
    family(
        out,
        "slurm_hooks_fleet_rate_suspect_flagged_ratio",
        "share of the node's scored jobs flagged on the figure, for nodes flagged far more often "
        "than the fleet (rate test; reported, not drained)",
        (
            ({"node": s.node, "metric": s.metric}, round(s.flagged / max(1, s.window), 6))
            for s in result.rate_suspects()
        ),
    )
    family(
        out,
        "slurm_hooks_fleet_not_judged_jobs",
        "scored jobs in which the node's figure could not be judged, by why (saturated, "
        "cleared, missing...)",
        (
            ({"node": r["node"], "metric": r["metric"], "why": r["why"]}, r["jobs"])
            for r in result.blind.rows()
        ),
    )
    rows, saturating_switches = result.saturating()
    family(
        out,
        "slurm_hooks_fleet_saturating_ratio",
        "share of the node's jobs in which its counter was saturated, for nodes saturating far "
        "more often than the fleet (the figure is unmeasurable there)",
        (
            ({"node": r["node"], "metric": r["metric"]}, r["saturated_jobs"] / max(1, r["jobs"]))
            for r in rows
        ),
    )
    family(
        out,
        "slurm_hooks_fleet_saturating_switch_nodes",
        "nodes under the leaf switch whose counters saturate far more often than the fleet's",
        (
            ({"switch": w["switch"], "metric": w["metric"]}, len(w["nodes"]))
            for w in saturating_switches
        ),
    )
    return "\n".join(out) + "\n"


def lineup_text(fleet, tolerance: float, now: float) -> str:
    """`report --xids --prom`: the line-ups of a fleet_report.Fleet (xid_lineup.JobLineup)."""
    out: List[str] = []
    lineups = fleet.lineups
    family(
        out,
        "slurm_hooks_fleet_xid_causal_node",
        "1 for the node whose Xid came first in a multi-node job (blame: the catalog's, job or "
        "node; report --xids)",
        (
            ({"job": j.job, "node": j.causal, "xid": str(j.first[1]), "blame": j.first[3] or ""}, 1)
            for j in lineups
            if j.verdict == "causal" and j.first is not None
        ),
    )
    family(
        out,
        "slurm_hooks_fleet_xid_lineup_jobs",
        "jobs with Xids on several nodes, by verdict (causal, ambiguous, no-cause)",
        (
            ({"verdict": verdict}, sum(1 for j in lineups if j.verdict == verdict))
            for verdict in ("causal", "ambiguous", "no-cause")
        ),
    )
    family(
        out,
        "slurm_hooks_fleet_xid_sympathetic",
        "Xids on the node that another node's earlier fault explains: not counted against it",
        (
            ({"node": n.node}, n.sympathetic_xids)
            for n in sorted(fleet.nodes.values(), key=lambda n: n.node)
            if n.sympathetic_xids
        ),
    )
    for name, value, text in (
        ("xid_clock_tolerance_seconds", tolerance, "[records] xid_clock_tolerance_s of the pass"),
        (
            "xid_records_verified",
            0 if fleet.not_verified else 1,
            "1 when the records were verified with the records key (0: nothing excused)",
        ),
        ("xid_lineup_timestamp_seconds", round(now, 3), "end of the last pass (Unix time)"),
    ):
        family(out, "slurm_hooks_fleet_" + name, text, [({}, value)])
    return "\n".join(out) + "\n"
