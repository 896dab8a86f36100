"""What `report --stragglers` prints: the table, the JSON document (schema SCHEMA) and the
Prometheus text file, made from a finished StragglerScan (straggler_scan.py reads the records and
scores them; this module only shows the result)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Tuple

from . import blind_spots, rate_test, stragglers, topology_groups

if TYPE_CHECKING:
    from .straggler_scan import StragglerScan

SCHEMA = "slurm-hooks.stragglers/1"


def suspect_to_dict(suspect: stragglers.Suspect) -> Dict[str, Any]:
    return {
        "node": suspect.node,
        "metric": suspect.metric,
        "kind": suspect.kind,
        "flagged": suspect.flagged,
        "window": suspect.window,
        "basis": suspect.basis,
        "cost": suspect.cost,
        "users": suspect.users,
        "worst_z": suspect.worst_z,
        "evidence": [
            {
                "job": mark.job,
                "end": mark.end,
                "nodes": mark.nodes,
                "z": flag.z,
                "value": flag.value,
                "median": flag.median,
                "peers": flag.peers,
                "lower_bound": flag.bound,  # value is the least it can have been (stall_bounds)
                "cost": flag.cost,
            }
            for mark, flag in suspect.evidence
        ],
    }


def to_dict(result: StragglerScan, top: Optional[int] = None) -> Dict[str, Any]:
    suspects = result.suspects()
    return {
        "schema": SCHEMA,
        "records": result.records,
        "jobs_scored": result.jobs_scored,
        "node_jobs": result.node_jobs,
        "nodes": len(result.windows),
        "skipped": dict(sorted(result.skipped.items())),
        "before_reboot": result.before_reboot(),
        "stale_boot": result.stale_boot(),
        "unreadable": result.unreadable_count,
        "unreadable_examples": result.unreadable,
        "verified": not result.not_verified,
        "not_verified": result.not_verified,
        "unverified": result.unverified_count,
        "unverified_examples": result.unverified,
        "other_owner_dirs": result.other_owner_dirs,
        "seconds": round(result.seconds, 3),
        "max_open_jobs": result.max_open_jobs,
        "settings": {
            "k": result.k,
            "m": result.m,
            "z_threshold": result.threshold,
            "min_job_nodes": result.min_nodes,
        },
        "suspects": [suspect_to_dict(s) for s in (suspects[:top] if top else suspects)],
        "not_judged": result.blind.rows(),
        "switch_suspects": [w.to_dict() for w in result.switches()] + result.saturating()[1],
        "under_switch": [suspect_to_dict(s) for s in result.under_switch()],
        "rate_suspects": [suspect_to_dict(s) for s in result.rate_suspects()],
        "odd_not_slow": [suspect_to_dict(s) for s in result.odd_not_slow()],
        "saturating": result.saturating()[0],
    }


def render(result: StragglerScan, top: int = 20) -> str:
    suspects = result.suspects()
    lines = [
        "%d records, %d multi-node jobs scored (%d node-jobs) on %d nodes in %.2fs; suspect: flagged on one "
        "figure in >= %d of a node's last %d jobs, z >= %g"
        % (
            result.records,
            result.jobs_scored,
            result.node_jobs,
            len(result.windows),
            result.seconds,
            result.k,
            result.m,
            result.threshold,
        )
    ]
    if result.unreadable_count:
        lines.append(
            "  %d unreadable record(s), e.g. %s" % (result.unreadable_count, result.unreadable[0])
        )
    if result.not_verified:
        lines.append(
            "  records NOT verified (%s): every record was read as it is; report only, nothing "
            "is drained on them (docs/records.md, [records] key_file)" % result.not_verified
        )
    if result.unverified_count:
        lines.append(
            "  %d record(s) left out: they do not verify with the records key (forged, copied or "
            "changed, or written without the key), e.g. %s"
            % (result.unverified_count, ", ".join(result.unverified[:3]))
        )
    if result.before_reboot():
        lines.append(
            "  %d flag(s) set aside: their node rebooted and then ran clean on the figure (a "
            "repair)" % result.before_reboot()
        )
    if result.stale_boot():
        lines.append(
            "  %d node-job(s) not counted: they ended in a boot their node had already left"
            % result.stale_boot()
        )
    if result.other_owner_dirs:
        lines.append(
            "  node names held by another owner or a symlink, not read (a user's? see [fleet] "
            "trusted_writers): %s" % ", ".join(result.other_owner_dirs)
        )
    if result.skipped:
        lines.append(
            "  not scored: %s" % ", ".join("%s %d" % kv for kv in sorted(result.skipped.items()))
        )
    lines.extend(result.blind.render())
    lines.extend(topology_groups.render(result.switches(), top))
    lines.extend(topology_groups.render_under(result.under_switch(), result.leaf_of, top))
    lines.extend(rate_test.render(result.rate_suspects(), top))
    lines.extend(_render_odd(result.odd_not_slow(), top))
    lines.extend(blind_spots.render_saturating(*result.saturating(), top=top))
    if not suspects:
        lines.append("no straggler suspects")
        return "\n".join(lines) + "\n"
    rows = [
        (
            "NODE",
            "FIGURE",
            "COST",
            "JOBS",
            "WORST-Z",
            "LATEST: VALUE VS JOB MEDIAN",
            "USERS",
            "FLAGGED JOBS",
        )
    ]
    for s in suspects[:top]:
        mark, flag = s.evidence[-1]
        rows.append(
            (
                s.node,
                s.metric,
                _cost_text(s.cost),
                "%d/%d%s" % (s.flagged, s.window, " rate" if s.basis == "rate" else ""),
                "%.1f" % s.worst_z,
                "%s%s vs %s" % (">= " if flag.bound else "", _num(flag.value), _num(flag.median)),
                str(s.users),
                ",".join(m.job for m, _ in s.evidence[-6:])
                + (",..." if len(s.evidence) > 6 else ""),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines.extend("  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1] for r in rows)
    if len(suspects) > top:
        lines.append("... %d more (--top N, --json)" % (len(suspects) - top))
    return "\n".join(lines) + "\n"


def _cost_text(cost: Optional[float]) -> str:
    """A suspect's estimated cost as a share of its jobs' time ("?": its figure gives no time)."""
    return "?" if cost is None else "%.1f%%" % (100 * cost)


def _render_odd(odd: List[stragglers.Suspect], top: int) -> List[str]:
    if not odd:
        return []
    lines = ["odd but not slow (their flags cost their jobs nothing; never drained for it):"]
    for s in odd[:top]:
        lines.append(
            "  %s %s: %d of %d jobs, worst z %.1f, cost %s"
            % (s.node, s.metric, s.flagged, s.window, s.worst_z, _cost_text(s.cost))
        )
    return lines


def _num(value: float) -> str:
    return "%.4g" % value


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def prom_text(result: StragglerScan, now: float, drains: Optional[Dict[str, int]] = None) -> str:
    """Prometheus text exposition (node_exporter textfile collector) of this pass."""
    out = []

    def family(
        name: str, kind: str, text: str, samples: Iterable[Tuple[Dict[str, str], float]]
    ) -> None:
        out.append("# HELP %s %s" % (name, text))
        out.append("# TYPE %s %s" % (name, kind))
        for labels, value in samples:
            names = ",".join('%s="%s"' % (k, _label(v)) for k, v in labels.items())
            out.append("%s%s %s" % (name, "{%s}" % names if names else "", repr(float(value))))

    suspects = result.suspects()
    family(
        "slurm_hooks_fleet_straggler",
        "gauge",
        "1 for each node and figure flagged in k of the node's last m "
        "multi-node jobs (slurm-hooks report --stragglers)",
        (
            (
                {
                    "node": s.node,
                    "metric": s.metric,
                    "kind": s.kind,
                    "reason": _reason_label(s.metric),
                },
                1,
            )
            for s in suspects
        ),
    )
    family(
        "slurm_hooks_fleet_straggler_flagged_jobs",
        "gauge",
        "jobs of the node's window flagged on the figure",
        (({"node": s.node, "metric": s.metric}, s.flagged) for s in suspects),
    )
    family(
        "slurm_hooks_fleet_straggler_worst_z",
        "gauge",
        "largest robust z of the node on the figure in its window",
        (({"node": s.node, "metric": s.metric}, s.worst_z) for s in suspects),
    )
    family(
        "slurm_hooks_fleet_suspects",
        "gauge",
        "straggler suspects (node x figure) in this pass",
        [({}, len(suspects))],
    )
    family(
        "slurm_hooks_fleet_not_scored",
        "gauge",
        "records, node directories or node-jobs the last pass did not score, by why (node "
        "directory of another owner: see [fleet] trusted_writers)",
        (({"why": why}, count) for why, count in sorted(result.skipped.items())),
    )
    for name, value, text in (
        ("records", result.records, "record header lines read in the last pass"),
        (
            "flags_set_aside",
            result.before_reboot(),
            "flags set aside: their node rebooted and then ran clean on the figure",
        ),
        (
            "stale_boot_jobs",
            result.stale_boot(),
            "node-jobs not counted: they ended in a boot their node had already left",
        ),
        ("jobs_scored", result.jobs_scored, "multi-node jobs scored in the last pass"),
        ("node_jobs", result.node_jobs, "node x job pairs scored in the last pass"),
        ("unreadable_records", result.unreadable_count, "records that could not be read"),
        (
            "unverified_records",
            result.unverified_count,
            "records left out: they do not verify with the records key",
        ),
        (
            "records_verified",
            0 if result.not_verified else 1,
            "1 when the records were verified with the records key (0: report only, no drains)",
        ),
        ("run_duration_seconds", round(result.seconds, 3), "duration of the last pass"),
        ("last_run_timestamp_seconds", round(now, 3), "end of the last pass (Unix time)"),
    ):
        family("slurm_hooks_fleet_" + name, "gauge", text, [({}, value)])
    if drains is not None:
        family(
            "slurm_hooks_fleet_drain_outcomes",
            "gauge",
            "drain outcomes of the last pass (drained, observe, "
            "breaker-tripped, foreign-drain-kept...)",
            (({"outcome": k}, v) for k, v in sorted(drains.items())),
        )
    return "\n".join(out) + "\n"


def _reason_label(metric: str) -> str:
    spec = stragglers.METRIC_BY_NAME.get(metric)
    if spec is None:
        return metric
    return "%s %s than the job's other nodes" % (metric, "higher" if spec.worse > 0 else "lower")


def write_prom(path: str, text: str) -> None:
    """Atomically (temp file, fsync, rename): a scrape never reads half a file."""
    from ..core import atomicio

    directory = os.path.dirname(os.path.abspath(path))
    dir_fd = atomicio.open_dir(directory)
    try:
        atomicio.write_atomic_at(
            dir_fd, os.path.basename(path), text.encode("utf-8"), 0o644, where=directory
        )
    finally:
        os.close(dir_fd)
