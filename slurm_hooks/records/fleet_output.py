"""What `slurm-hooks report` prints from a Fleet (fleet_report.py reads and folds the records):
the ranking as JSON (schema slurm-hooks.report/1) or a table, and one job's rows (`report --job`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from .build import SUM_FIELDS
from .signing import VERIFIED

if TYPE_CHECKING:
    from .fleet_report import Fleet


def fleet_to_dict(
    fleet: Fleet, top: Optional[int] = None, everything: bool = False
) -> Dict[str, Any]:
    ranked = [n for n in fleet.ranked() if everything or n.abnormal_jobs]
    return {
        "schema": "slurm-hooks.report/1",
        "records": fleet.records,
        "nodes": len(fleet.nodes),
        "skipped_old": fleet.skipped_old,
        "unreadable": fleet.unreadable_count,
        "unreadable_examples": fleet.unreadable,
        "verified": not fleet.not_verified,
        "not_verified": fleet.not_verified,
        "unverified": fleet.unverified_count,
        "unverified_examples": fleet.unverified,
        "seconds": round(fleet.seconds, 3),
        "ranking": [n.to_dict() for n in (ranked[:top] if top else ranked)],
    }


def render_fleet(fleet: Fleet, top: int = 20, everything: bool = False) -> str:
    ranked = [n for n in fleet.ranked() if everything or n.abnormal_jobs]
    lines = [
        "%d records from %d nodes (%d older ones skipped, %d unreadable) in %.2fs"
        % (
            fleet.records,
            len(fleet.nodes),
            fleet.skipped_old,
            fleet.unreadable_count,
            fleet.seconds,
        )
    ]
    lines.extend("  unreadable: %s" % text for text in fleet.unreadable)
    if fleet.not_verified:
        lines.append(
            "  records NOT verified (%s): anyone able to write the records directory could "
            "have written them" % fleet.not_verified
        )
    if fleet.unverified_count:
        lines.append(
            "  %d record(s) left out: they do not verify with the records key"
            % fleet.unverified_count
        )
        lines.extend("  unverified: %s" % text for text in fleet.unverified)
    excused = [n for n in fleet.nodes.values() if n.sympathetic_xids]
    if excused:
        lines.append(
            "  %d Xid(s) on %d node(s) not counted: another node's fault came first (--xids)"
            % (sum(n.sympathetic_xids for n in excused), len(excused))
        )
    if not ranked:
        lines.append("no node had anything abnormal")
        return "\n".join(lines) + "\n"
    header = (
        "NODE",
        "JOBS",
        "BAD",
        "XID",
        "SXID",
        "ECC-UE",
        "ECC-CE",
        "REMAP",
        "NVLINK",
        "PCIE",
        "IB",
        "THROTTLE",
        "LEFTOVER",
        "WORST JOBS",
    )
    rows = [header]
    for n in ranked[:top]:
        s = n.sums
        rows.append(
            (
                n.node,
                str(n.jobs),
                str(n.abnormal_jobs),
                _n(s["xids"]),
                _n(s["sxids"]),
                _n(s["ecc_uncorrected"]),
                _n(s["ecc_corrected"]),
                _n(s["remapped_rows"] + s["retired_pages"]),
                _n(s["nvlink_errors"]),
                _n(s["pcie_replays"]),
                _n(s["ib_errors"]),
                "%.0fs" % s["throttle_s"],
                _n(s["leftover_processes"]),
                ",".join(job for _, job in sorted(n.worst, reverse=True)),
            )
        )
    lines.extend(_table(rows))
    if len(ranked) > top:
        lines.append("... %d more nodes with abnormal jobs (--top N, --json)" % (len(ranked) - top))
    return "\n".join(lines) + "\n"


def render_job(job_id: str, rows: List[Dict[str, Any]], problems: List[str]) -> str:
    if not rows and not problems:
        return "no record of job %s\n" % job_id
    bad = [r for r in rows if r["abnormal"]]
    runs = sorted({r["job"] for r in rows})
    lines = [
        "job %s: %d node(s), %d with something abnormal%s"
        % (
            job_id,
            len({r["node"] for r in rows}),
            len(bad),
            " (runs: %s; a requeue reruns the job under its id)" % ", ".join(runs)
            if len(runs) > 1
            else "",
        )
    ]
    lines.extend("  unreadable: %s" % p for p in problems)
    unverified = sorted(
        "%s (%s)" % (r["node"], r.get("verified")) for r in rows if r.get("verified") != VERIFIED
    )
    if unverified:
        lines.append("  NOT verified by the records key: %s" % ", ".join(unverified))
    missing = [r["node"] for r in rows if r["prolog_snapshot"] != "ok"]
    if missing:
        lines.append(
            "  no prolog snapshot (no deltas) on: %s" % ", ".join(sorted(str(m) for m in missing))
        )
    for row in bad:
        s = row["summary"]
        numbers = ", ".join("%s=%s" % (k, s[k]) for k in SUM_FIELDS if k != "energy_j" and s.get(k))
        lines.append(
            "  %-20s %s%s%s"
            % (
                row["node"],
                "[%s] " % row["job"] if len(runs) > 1 else "",
                ", ".join(row["abnormal"]),
                "  (%s)" % numbers if numbers else "",
            )
        )
    return "\n".join(lines) + "\n"


def _n(value: float) -> str:
    return "-" if not value else "%d" % value


def _table(rows: List[Tuple[str, ...]]) -> List[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  ".join(
            [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:-1], widths[1:])] + [r[-1]]
        ).rstrip()
        for r in rows
    ]
