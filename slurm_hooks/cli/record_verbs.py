"""CLI verbs over per-job records: `record show JOBID [--node N]` and `report [PATH...]`."""

from __future__ import annotations

import json
import sys
from typing import List, Optional

from ..result import ExitCode
from .record_render import render_record, verified_label


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
        "--observed",
        action="store_true",
        help="what observe mode would have drained: the would-drain decisions in the decision "
        "log ([paths] log_file and its rotations, or the log files given as PATH)",
    )
    report.add_argument(
        "--lemons",
        action="store_true",
        help="list the nodes Slurm shows drained by us as lemons, held for RMA (docs/slurm.md)",
    )
    report.add_argument(
        "--xids",
        action="store_true",
        help="line up each multi-node job's Xids by time: the node whose fault came first, and "
        "the victims' Xids not counted against them (--prom FILE: as metrics; docs/records.md)",
    )
    report.set_defaults(handler=cmd_report)


def _directories(args, given: Optional[List[str]]) -> List[str]:
    if given:
        return list(given)
    from .check_verbs import load

    _registry, config = load(args)
    return [config.get("records", "dir")]


def _verifier(args):
    """The records key of this host's config ([records] key_file), as a signing.Verifier. A config
    that cannot be read leaves the report working, unverified (a report of given PATHs never
    needed one)."""
    from ..core.config import ConfigError
    from ..records.signing import Verifier
    from .check_verbs import load

    try:
        _registry, config = load(args)
    except ConfigError as exc:
        return Verifier(None, "configuration not read: %s" % exc)
    return Verifier.from_file(config.get("records", "key_file"))


def _error(message: str) -> int:
    print("slurm-hooks: %s" % message, file=sys.stderr)
    return ExitCode.UNKNOWN


def cmd_record_show(args) -> int:
    from ..records.fleet_report import load_record
    from ..records.header_check import header_problem
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
    records, shown = [], []
    verifier = _verifier(args) if not args.json else None
    for path in paths:
        try:
            record = load_record(path)
            problem = header_problem(record)
            if problem:
                raise ValueError("%s: %s" % (path, problem))
            shown.append(
                render_record(record, path, verified_label(verifier, path)) if not args.json else ""
            )
            records.append((path, record))
        except ValueError as exc:
            return _error(str(exc))
        except (TypeError, KeyError, AttributeError, IndexError, OverflowError) as exc:
            # a body of a shape no version wrote (the header is checked above): name the file
            return _error("%s: cannot show this record: %s: %s" % (path, type(exc).__name__, exc))
    if args.json:
        shown_json = [r for _, r in records] if len(records) > 1 else records[0][1]
        # one write, not json.dump's one per token (~1,000 for a record)
        sys.stdout.write(json.dumps(shown_json, indent=2) + "\n")
        return ExitCode.OK
    sys.stdout.write("\n".join(shown))
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

    if getattr(args, "observed", False):
        from .mode_verbs import cmd_observed

        return cmd_observed(args)
    if getattr(args, "lemons", False):
        from .lemon_verbs import cmd_lemons

        return cmd_lemons(args)
    if getattr(args, "xids", False):
        from .lineup_verbs import cmd_xid_lineup

        return cmd_xid_lineup(args)
    if args.stragglers or args.prom or args.drain:
        from .straggler_verbs import cmd_stragglers

        return cmd_stragglers(args)
    from . import lineup_verbs
    from .readable import refuse_unreadable

    paths = _directories(args, args.paths)
    refused = refuse_unreadable(paths)
    if refused is not None:
        return refused
    try:
        if args.job:
            rows, problems = job_view(paths, args.job, _verifier(args))
            lineups = lineup_verbs.job_lineups(rows, args)
            if args.json:
                json.dump(
                    {
                        "schema": "slurm-hooks.report-job/1",
                        "job": args.job,
                        "nodes": rows,
                        "unreadable": problems,
                        "xid_lineup": [j.to_dict() for j in lineups],
                    },
                    sys.stdout,
                    indent=2,
                )
                sys.stdout.write("\n")
            else:
                sys.stdout.write(render_job(args.job, rows, problems))
                sys.stdout.write(lineup_verbs.job_lineup_text(lineups, args))
            return ExitCode.FOUND if any(row.get("abnormal") for row in rows) else ExitCode.OK
        fleet = aggregate(
            paths,
            parse_since(args.since),
            verifier=_verifier(args),
            xid_tolerance=lineup_verbs.xid_tolerance(args),
        )
    except (ReportError, ValueError) as exc:
        return _error(str(exc))
    from ..qualify import latest
    from .qualify_verbs import qualification_rows

    qualified = qualification_rows(args, paths)
    if args.json:
        doc = fleet_to_dict(fleet, args.top, args.all)
        doc["qualifications"] = qualified
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_fleet(fleet, args.top, args.all))
        sys.stdout.write("".join(line + "\n" for line in latest.render(qualified)))
    # nodes with abnormal jobs, or whose latest qualification did not pass, are what the report
    # is for: say so to a script (docs/cli.md)
    abnormal = any(n.abnormal_jobs for n in fleet.nodes.values())
    return ExitCode.FOUND if abnormal or latest.needs_a_look(qualified) else ExitCode.OK
