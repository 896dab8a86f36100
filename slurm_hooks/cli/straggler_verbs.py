"""`slurm-hooks report --stragglers [PATH...] [--since] [--json] [--prom FILE] [--drain]`.

A flag of `report` rather than a verb of its own: it reads the same records directory with the same
PATH and --since, and admins look for "which nodes hurt jobs" in one place. Reading never changes
anything; --drain (what the shipped slurm-hooks-stragglers.service passes) acts only when [fleet]
drain = true, so a report run by hand cannot drain a node.
"""

from __future__ import annotations

import json
import sys
import time

from ..result import ExitCode


def cmd_stragglers(args) -> ExitCode:
    from ..records import signing
    from ..records import straggler_scan as fleet
    from ..records.fleet_report import ReportError, parse_since
    from .check_verbs import load

    if not args.stragglers:
        return _error("--prom and --drain go with --stragglers")
    if args.job or args.all:
        return _error("--job and --all do not go with --stragglers")
    _registry, config = load(args)
    paths = list(args.paths) or [config.get("records", "dir")]
    from .readable import refuse_unreadable

    refused = refuse_unreadable(paths)
    if refused is not None:
        return ExitCode(refused)
    try:
        since = parse_since(args.since)
        verifier = signing.Verifier.from_file(config.get("records", "key_file"))
        result = fleet.scan(paths, config.settings["fleet"], since=since, verifier=verifier)
    except (ReportError, fleet.ScanError) as exc:
        return _error(str(exc))
    topology_path = config.settings["fleet"].get("topology_conf") or ""
    if topology_path:  # a broken topology.conf stops the report (and its drains): never guess
        from ..hw.host import HostError
        from ..slurm import topology_conf

        try:
            result.leaf_of = topology_conf.load(topology_path).leaf_of
        except HostError as exc:
            return _error("[fleet] topology_conf: %s" % exc)
    drains = None
    if args.drain:
        from ..core import logs
        from ..slurm import straggler_drain as fleet_drain

        log = logs.setup(config.settings)
        if result.not_verified and config.settings["fleet"]["drain"]:
            drains = _unverified(result, log)
        else:
            drains = fleet_drain.enact(config.settings, result.suspects(), log=log)
    if args.prom:
        outcomes = None
        if drains is not None:
            outcomes = {}
            for row in drains:
                outcomes[row.outcome] = outcomes.get(row.outcome, 0) + 1
        from ..records.report_metrics import straggler_rows_text

        text = fleet.prom_text(result, time.time(), outcomes) + straggler_rows_text(result)
        try:
            fleet.write_prom(args.prom, text)
        except OSError as exc:
            return _error("--prom %s: not written: %s" % (args.prom, exc.strerror or exc))
    if args.json:
        data = fleet.to_dict(result, args.top if args.top > 0 else None)
        if drains is not None:
            data["drains"] = [row.to_dict() for row in drains]
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(fleet.render(result, args.top))
        for row in drains or ():
            sys.stdout.write(
                "drain %s (%s): %s: %s\n" % (row.node, row.metric, row.outcome, row.message)
            )
    return _exit_code(result.suspects(), drains)


def _exit_code(suspects, drains) -> ExitCode:
    """FOUND (1) with suspects, OK without; UNKNOWN when --drain could not reach or use Slurm (the
    drains it meant to make were not made). Table: docs/cli.md."""
    from ..slurm.policy import Outcome

    outcomes = {outcome.value: outcome for outcome in Outcome}
    failed = (Outcome.SLURM_UNAVAILABLE, Outcome.SLURM_ERROR)
    if any(outcomes.get(row.outcome) in failed for row in drains or ()):
        return ExitCode.UNKNOWN
    return ExitCode.FOUND if suspects else ExitCode.OK


def _unverified(result, log) -> list:
    """No drain on records no key verified (docs/records.md, "Who wrote a record"): anyone running
    as the records' owner (uid 65534 on root_squash NFS) could have written them. One row per node."""
    from ..core import logs
    from ..slurm.straggler_drain import FleetDrain

    rows, seen = [], set()
    for suspect in result.suspects():
        if suspect.node in seen:
            continue
        seen.add(suspect.node)
        message = "records not verified (%s): not drained" % result.not_verified
        log.warning(
            logs.kv(
                context="fleet",
                event="straggler-drain",
                node=suspect.node,
                metric=suspect.metric,
                outcome="unverified",
                error=result.not_verified,
            )
        )
        rows.append(FleetDrain(suspect.node, suspect.metric, "unverified", message))
    return rows


def _error(message: str) -> ExitCode:
    print("slurm-hooks: %s" % message, file=sys.stderr)
    return ExitCode.UNKNOWN
