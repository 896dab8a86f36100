"""CLI verbs over per-job records: `record show JOBID [--node N]` and `report [PATH...]`."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Dict, List, Optional

from ..result import ExitCode


def add_parsers(sub) -> None:
    from .parser import Parser

    record = sub.add_parser("record", help="per-job records written by the epilog")
    record_sub = record.add_subparsers(
        dest="record_command", metavar="SUBCOMMAND", parser_class=Parser
    )
    record_sub.required = True
    show = record_sub.add_parser(
        "show",
        help="print one job's record(s) readably",
        description="Print the record of JOBID on every node it ran on (or on --node).",
    )
    show.add_argument("job_id", metavar="JOBID")
    show.add_argument("--node", metavar="N", help="only the record written by node N")
    show.add_argument(
        "--dir",
        metavar="DIR",
        action="append",
        help="records directory (default: [records] dir; repeatable)",
    )
    show.add_argument("--json", action="store_true", help="print the record(s) as JSON")
    show.set_defaults(handler=cmd_record_show)

    report = sub.add_parser(
        "report",
        help="rank nodes by what went wrong during jobs",
        description="Aggregate per-job records (files or directories, walked recursively; "
        "default: [records] dir): nodes ranked by Xids, error-counter deltas, "
        "throttle time and leftover processes.",
    )
    report.add_argument("paths", nargs="*", metavar="PATH")
    report.add_argument(
        "--since",
        metavar="WHEN",
        help="only jobs that ended after WHEN: 7d, 24h, 90m, "
        "2024-05-01, 2024-05-01T12:00 or Unix seconds",
    )
    report.add_argument(
        "--job", metavar="JOBID", help="the nodes of this job with anything abnormal"
    )
    report.add_argument(
        "--top", type=int, default=20, metavar="N", help="nodes to list (default 20)"
    )
    report.add_argument("--all", action="store_true", help="also list nodes with nothing abnormal")
    report.add_argument(
        "--json",
        action="store_true",
        help="print JSON (schema slurm-hooks.report/1; with --stragglers slurm-hooks.stragglers/1)",
    )
    report.add_argument(
        "--stragglers",
        action="store_true",
        help="find slow nodes: score each node of every "
        "multi-node job against the job's other nodes ([fleet] settings; docs/records.md)",
    )
    report.add_argument(
        "--prom",
        metavar="FILE",
        help="with --stragglers: also write the suspects as Prometheus "
        "metrics to FILE (atomically; e.g. node_exporter's textfile directory)",
    )
    report.add_argument(
        "--drain",
        action="store_true",
        help="with --stragglers: drain suspects when [fleet] "
        "drain = true (breaker, observe mode); without this flag nothing is ever drained",
    )
    report.add_argument(
        "--lemons",
        action="store_true",
        help="list the nodes Slurm shows drained by us as lemons, held for RMA (docs/slurm.md)",
    )
    report.set_defaults(handler=cmd_report)


def _directories(args, given: Optional[List[str]]) -> List[str]:
    if given:
        return list(given)
    from .check_verbs import load

    _registry, config = load(args)
    return [config.get("records", "dir")]


def _error(message: str) -> int:
    print("slurm-hooks: %s" % message, file=sys.stderr)
    return ExitCode.UNKNOWN


def cmd_record_show(args) -> int:
    from ..records.fleet_report import load_record
    from ..records.store import find_records
    from .readable import permission_message, unreadable

    directories = _directories(args, args.dir)
    try:
        paths = find_records(directories, args.job_id, args.node)
    except ValueError as exc:
        return _error(str(exc))
    if not paths:
        where = " on node %s" % args.node if args.node else ""
        denied = unreadable(directories)
        return _error(
            "no record of job %s%s under %s%s"
            % (
                args.job_id,
                where,
                ", ".join(directories),
                ": " + permission_message(denied) if denied else "",
            )
        )
    records = []
    for path in paths:
        try:
            records.append((path, load_record(path)))
        except ValueError as exc:
            return _error(str(exc))
    if args.json:
        json.dump(
            [r for _, r in records] if len(records) > 1 else records[0][1], sys.stdout, indent=2
        )
        sys.stdout.write("\n")
        return ExitCode.OK
    sys.stdout.write("\n".join(render_record(record, path) for path, record in records))
    return ExitCode.OK


def cmd_report(args) -> int:
    from ..records.fleet_report import (
        ReportError,
        aggregate,
        fleet_to_dict,
        job_view,
        parse_since,
        render_fleet,
        render_job,
    )

    if getattr(args, "lemons", False):
        from .lemon_verbs import cmd_lemons

        return cmd_lemons(args)
    if args.stragglers or args.prom or args.drain:
        from .straggler_verbs import cmd_stragglers

        return cmd_stragglers(args)
    from .readable import refuse_unreadable

    paths = _directories(args, args.paths)
    refused = refuse_unreadable(paths)
    if refused is not None:
        return refused
    try:
        if args.job:
            rows, problems = job_view(paths, args.job)
            if args.json:
                json.dump(
                    {
                        "schema": "slurm-hooks.report-job/1",
                        "job": args.job,
                        "nodes": rows,
                        "unreadable": problems,
                    },
                    sys.stdout,
                    indent=2,
                )
                sys.stdout.write("\n")
            else:
                sys.stdout.write(render_job(args.job, rows, problems))
            return ExitCode.FOUND if any(row.get("abnormal") for row in rows) else ExitCode.OK
        fleet = aggregate(paths, parse_since(args.since))
    except (ReportError, ValueError) as exc:
        return _error(str(exc))
    if args.json:
        json.dump(fleet_to_dict(fleet, args.top, args.all), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_fleet(fleet, args.top, args.all))
    # nodes with abnormal jobs are what the report is for: say so to a script (docs/cli.md)
    return ExitCode.FOUND if any(n.abnormal_jobs for n in fleet.nodes.values()) else ExitCode.OK


# -- one record, readably -----------------------------------------------------------------------


def render_record(record: Dict[str, Any], path: str = "") -> str:
    job, summary = record.get("job") or {}, record.get("summary") or {}
    lines = [
        "job %s on %s (user %s, GPUs %s)%s"
        % (
            job.get("id"),
            record.get("node"),
            job.get("user"),
            _gpus(job.get("gpus")),
            "  [%s]" % path if path else "",
        ),
        "  %s -> %s (%s)"
        % (
            _when(record.get("start")),
            _when(record.get("end")),
            _duration(record.get("duration_s")),
        ),
    ]
    if record.get("prolog_snapshot") != "ok":
        lines.append(
            "  prolog snapshot: %s -- no deltas for this job" % record.get("prolog_snapshot")
        )
    if str(record.get("epilog_snapshot", "ok")) != "ok":
        lines.append("  epilog snapshot: %s" % record.get("epilog_snapshot"))
    if record.get("rebooted_during_job"):
        lines.append("  the node rebooted during the job: counters not comparable")
    lines.append("  abnormal: %s" % (", ".join(summary.get("abnormal") or []) or "nothing"))
    lines.append(
        "  throttle %.1fs, energy %.0f J, leftover processes %d, leftover memory %s"
        % (
            summary.get("throttle_s") or 0,
            summary.get("energy_j") or 0,
            summary.get("leftover_processes") or 0,
            _bytes(summary.get("leftover_memory_bytes") or 0),
        )
    )
    for gpu in record.get("gpus") or []:
        lines.extend(_gpu_lines(gpu))
    for port in record.get("ib") or []:
        moved = {k: v for k, v in (port.get("delta") or {}).items() if v}
        if moved:
            lines.append("  ib %s: %s" % (port["port"], _pairs(moved)))
    lines.extend(_event_lines(record))
    lines.extend(_check_lines(record))
    for note in record.get("notes") or []:
        lines.append("  note: %s" % note)
    return "\n".join(lines) + "\n"


def _gpu_lines(gpu: Dict[str, Any]) -> List[str]:
    lines = [
        "  gpu %s %s %s serial %s"
        % (gpu.get("index"), gpu.get("bus_id"), gpu.get("uuid"), gpu.get("serial"))
    ]
    delta = gpu.get("delta")
    moved = {
        k: v
        for k, v in (delta or {}).items()
        if v and not k.startswith(("energy", "violation_ns.low"))
    }
    if delta is None:
        lines.append("    no deltas")
    elif moved:
        lines.append("    changed: %s" % _pairs(moved))
    for link, values in sorted((gpu.get("nvlink_delta") or {}).items(), key=lambda kv: int(kv[0])):
        lines.append("    nvlink %s: %s" % (link, _pairs(values)))
    flags = [k for k, v in (gpu.get("flags") or {}).items() if v]
    if flags:
        lines.append("    flags: %s" % ", ".join(flags))
    for proc in gpu.get("processes") or []:
        lines.append(
            "    leftover process %s (%s) using %s"
            % (proc.get("pid"), proc.get("name"), _bytes(proc.get("used_memory_bytes") or 0))
        )
    if gpu.get("counter_resets"):
        lines.append("    counters reset during the job: %s" % ", ".join(gpu["counter_resets"]))
    if gpu.get("unavailable"):
        lines.append("    not readable: %s" % _pairs(gpu["unavailable"]))
    return lines


def _event_lines(record: Dict[str, Any]) -> List[str]:
    lines = []
    scope = record.get("events_scope")
    suffix = "" if scope == "job" else " (no prolog position: whole boot shown)"
    for event in record.get("xids") or []:
        lines.append(
            "  Xid %s on %s%s: %s -> %s/%s%s"
            % (
                event["xid"],
                event["pci"],
                " (gpu %s)" % event["job_gpu"] if event.get("job_gpu") is not None else "",
                event["text"],
                event["status"],
                event["action"],
                suffix,
            )
        )
    for event in record.get("sxids") or []:
        lines.append(
            "  SXid %s on switch %s link %s: %s -> %s%s"
            % (
                event["sxid"],
                event["switch"],
                event["link"],
                event["text"],
                event["status"],
                suffix,
            )
        )
    return lines


def _check_lines(record: Dict[str, Any]) -> List[str]:
    checks, decision = record.get("checks"), record.get("decision")
    lines = []
    if checks:
        lines.append(
            "  epilog checks: %s (%d passed)"
            % (checks.get("status"), len(checks.get("passed") or []))
        )
        for result in checks.get("results") or []:
            lines.append(
                "    %-7s %s %s: %s"
                % (
                    result["status"],
                    result["check"],
                    result.get("component") or "node",
                    result["summary"],
                )
            )
    if decision:
        lines.append(
            "  decision: %s%s%s"
            % (
                decision.get("verdict"),
                " (%s)" % decision["outcome"] if decision.get("outcome") else "",
                ": %s" % decision["reason"] if decision.get("reason") else "",
            )
        )
    return lines


def _pairs(values: Dict[str, Any]) -> str:
    return ", ".join("%s=%s" % (k, v) for k, v in values.items())


def _gpus(gpus: Any) -> str:
    return "all" if gpus is None else (",".join(str(g) for g in gpus) or "none")


def _when(epoch: Any) -> str:
    return (
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))
        if isinstance(epoch, (int, float))
        else "?"
    )


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return "duration unknown"
    hours, rest = divmod(int(seconds), 3600)
    return "%dh%02dm%02ds" % (hours, rest // 60, rest % 60)


def _bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return "%.0f %s" % (value, unit) if unit == "B" else "%.1f %s" % (value, unit)
        value /= 1024.0
    return str(value)
