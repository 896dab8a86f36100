"""`slurm-hooks report --xids [PATH...] [--since] [--json] [--prom FILE] [--top N]`.

A flag of `report`, like --stragglers: the same records, PATH and --since. It prints each job
whose Xids were logged on two nodes or more, lined up by time (records/xid_lineup.py): the node
whose fault came first, "ambiguous" within [records] xid_clock_tolerance_s, and the victims whose
Xids the plain report no longer counts against them. Reading never changes anything.
"""

from __future__ import annotations

import json
import sys
import time

from ..result import ExitCode


def cmd_xid_lineup(args) -> int:
    from ..core.config import ConfigError
    from ..records import xid_lineup
    from ..records.fleet_report import ReportError, aggregate, parse_since
    from ..records.signing import Verifier
    from .check_verbs import load
    from .readable import refuse_unreadable

    if args.stragglers or args.drain or args.job:
        return _error("--xids does not go with --stragglers, --drain or --job")
    try:
        _registry, config = load(args)
    except ConfigError as exc:
        return _error("configuration not read: %s" % exc)
    paths = list(args.paths) or [config.settings.records.dir]
    refused = refuse_unreadable(paths)
    if refused is not None:
        return refused
    tolerance = config.settings.records.xid_clock_tolerance_s
    verifier = Verifier.from_file(config.settings.records.key_file)
    try:
        fleet = aggregate(
            paths, parse_since(args.since), verifier=verifier, xid_tolerance=tolerance
        )
    except (ReportError, ValueError) as exc:
        return _error(str(exc))
    if args.prom:
        from ..records import report_metrics
        from ..records.straggler_output import write_prom

        try:
            write_prom(args.prom, report_metrics.lineup_text(fleet, tolerance, time.time()))
        except OSError as exc:
            return _error("--prom %s: not written: %s" % (args.prom, exc.strerror or exc))
    top = args.top if args.top > 0 else len(fleet.lineups)
    if args.json:
        json.dump(
            {
                "schema": "slurm-hooks.xid-lineup/1",
                "records": fleet.records,
                "unreadable": fleet.unreadable_count,
                "verified": not fleet.not_verified,
                "not_verified": fleet.not_verified,
                "tolerance_s": tolerance,
                "jobs": [j.to_dict() for j in fleet.lineups[:top]],
            },
            sys.stdout,
            indent=2,
        )
        sys.stdout.write("\n")
    else:
        head = "%d records from %d nodes (%d unreadable)" % (
            fleet.records,
            len(fleet.nodes),
            fleet.unreadable_count,
        )
        lines = [head] + xid_lineup.render(fleet.lineups, tolerance, top)
        sys.stdout.write("\n".join(lines) + "\n")
    blamed = any(j.verdict == "causal" for j in fleet.lineups)
    return ExitCode.FOUND if blamed else ExitCode.OK


def xid_tolerance(args) -> float:
    """[records] xid_clock_tolerance_s of this host's config; its default when the config cannot
    be read (the plain report of given PATHs never needed one)."""
    from ..core.config import SECTIONS, ConfigError
    from .check_verbs import load

    try:
        _registry, config = load(args)
    except ConfigError:
        return SECTIONS["records"]["xid_clock_tolerance_s"].default
    return config.settings.records.xid_clock_tolerance_s


def _error(message: str) -> int:
    print("slurm-hooks: %s" % message, file=sys.stderr)
    return ExitCode.UNKNOWN


def job_lineups(rows, args) -> list:
    """`report --job J`: the line-up of the job's records (fleet_report.job_view rows); excusing
    only when the records key verified every one of them."""
    from ..records import xid_lineup
    from ..records.signing import VERIFIED

    trusted = bool(rows) and all(row.get("verified") == VERIFIED for row in rows)
    summaries = [(row["job"], str(row["node"]), row["summary"]) for row in rows]
    return xid_lineup.line_up_all(summaries, xid_tolerance(args), trusted)


def job_lineup_text(lineups, args) -> str:
    from ..records import xid_lineup

    if not lineups:
        return ""
    return "\n".join(xid_lineup.render(lineups, xid_tolerance(args))) + "\n"
