"""`qualify`: run a qualification level on this node, print each test with its figures, keep the
record, exit by the verdict (0 pass, 2 fail, 3 not qualified). docs/qualify.md."""

from __future__ import annotations

import json
import sys

from ..result import ExitCode


def add_parsers(sub) -> None:
    qualify = sub.add_parser(
        "qualify",
        help="prove this node good with active diagnostics (DCGM, nvbandwidth, NCCL, ib_write_bw)",
        description="Run a qualification level on this node: each tool bounded, its output "
        "judged against the node's own GPUs, [qualify] classes and the fleet's earlier records. "
        "Exit code: 0 pass, 2 fail, 3 not qualified (a tool missing or not judged).",
    )
    qualify.add_argument(
        "--level", choices=("quick", "standard", "long"), help="default: [qualify] level"
    )
    qualify.add_argument("--json", action="store_true", help="print the record as JSON")
    qualify.add_argument(
        "--root", metavar="DIR", help="read /proc and /sys under DIR (a fake node)"
    )
    qualify.add_argument(
        "--class", dest="class_name", metavar="CLASS", help="this node's hardware class"
    )
    qualify.add_argument(
        "--no-record", action="store_true", help="do not write the qualification record"
    )
    qualify.add_argument(
        "--node",
        metavar="NODES",
        help="from an admin host: qualify NODES (a node or a hostlist such as gpu[01-04,07], "
        "each drained by us), one after another, each as a Slurm job in a maintenance "
        "reservation of ours; pass resumes it, anything else drains it again with the reason",
    )
    qualify.add_argument(
        "--work-dir",
        metavar="DIR",
        help="with --node: where the job's script and output go (visible on the node; default "
        "[paths] state_dir)",
    )
    qualify.add_argument(
        "--list",
        action="store_true",
        help="show the latest qualification of every node under [records] dir (runs nothing)",
    )
    qualify.add_argument(
        "--sweep",
        action="store_true",
        help="from an admin host: delete the reservations of ours whose qualification is over "
        "(past its level's bound, or its owner process gone); done at the start of every "
        "--node and --due run too",
    )
    qualify.add_argument(
        "--due",
        action="store_true",
        help="from an admin host (slurm-hooks-qualify.timer): qualify the nodes due: drained by "
        "us for reboot/reset-gpu and rebooted since, and straggler suspects queued by "
        "report --stragglers --drain ([fleet] confirm_with), once idle",
    )
    qualify.set_defaults(handler=cmd_qualify)


def cmd_qualify(args) -> int:
    from ..core.report_format import node_name
    from ..hw.host import Host
    from ..qualify import flow, record
    from .check_verbs import load

    _registry, config = load(args)
    if args.list:
        return list_records(args, config)
    if args.due:
        return qualify_due(args, config)
    if args.sweep and args.node is None:
        return sweep_only(args, config)
    if args.node is not None:  # '--node ""' is a usage error, not this node
        return qualify_through_slurm(args, config)
    settings = config.settings["qualify"]
    root = config.get("general", "root")
    node = node_name(root) or "unknown"
    records_dir = config.get("records", "dir") if config.get("records", "enabled") else None
    trusted = trusted_writers(config)
    result = flow.run_level(
        settings,
        args.level or settings["level"],
        node,
        Host(root),
        class_name=args.class_name,
        records_dir=records_dir,
        trusted_uids=trusted,
    )
    if records_dir and not args.no_record:
        try:
            result["record"] = record.write(records_dir, node, result)
        except (OSError, ValueError) as exc:  # atomicio.UnsafePath is a ValueError/OSError
            print("slurm-hooks: qualification record not written: %s" % exc, file=sys.stderr)
    if args.json:
        json.dump(result, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(result))
    return flow.VERDICT_EXIT.get(result["verdict"], ExitCode.UNKNOWN)


def _through_slurm_setup(args, config):
    """What a run through Slurm needs, for --node and --due alike: the command the job runs (this
    interpreter, isolated; this config), the level, the work directory (made 0700 and checked:
    no one else may write it or a directory above it), a Slurm client, and the stale reservations
    swept first. None (said on stderr) when the work directory is unsafe: nothing is held yet."""
    import os

    from ..qualify.batch import check_work_dir
    from ..slurm.drainer import make_client

    command = job_command()
    if args.config:
        command += ["--config", os.path.abspath(args.config)]
    command.append("qualify")
    level = args.level or config.settings["qualify"]["level"]
    work_dir = args.work_dir or config.get("paths", "state_dir")
    os.makedirs(work_dir, mode=0o700, exist_ok=True)
    try:
        check_work_dir(work_dir)
    except (OSError, ValueError) as exc:
        print("slurm-hooks: qualify: %s" % exc, file=sys.stderr)
        return None
    client = make_client(config.settings)
    return command, level, work_dir, client, sweep_reservations(client, config)


def qualify_through_slurm(args, config) -> int:

    from ..qualify.batch import exit_code, expand_nodes, qualify_nodes

    try:
        nodes = expand_nodes(args.node)
    except ValueError as exc:  # not a hostlist, too many names, a name that is a path
        print("slurm-hooks: qualify --node: %s" % exc, file=sys.stderr)
        return ExitCode.UNKNOWN
    ready = _through_slurm_setup(args, config)
    if ready is None:
        return ExitCode.UNKNOWN
    command, level, work_dir, client, swept = ready
    outcomes = qualify_nodes(client, nodes, level, config.settings, command, work_dir)
    for done in outcomes:
        done["exit_code"] = int(exit_code(done))
    code = max(done["exit_code"] for done in outcomes)
    if args.json:
        doc = {"schema": "slurm-hooks.qualify-nodes/1", "level": level, "exit_code": code}
        doc["nodes"], doc["swept"] = outcomes, swept
        json.dump(doc, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
        return code
    for done in outcomes:
        print(
            "qualify %s on %s: %s: %s"
            % (level, done["node"], done["verdict"].upper(), done.get("reason", ""))
        )
        for key in (
            "job_id",
            "reservation",
            "enacted",
            "reservation_deleted",
            "reservation_kept",
            "slurm_calls",
        ):
            if key in done:
                print("  %s: %s" % (key, done[key]))
    return code


def qualify_due(args, config) -> int:
    """Exit 0: every due node passed or was skipped (with its reason; the next run looks again);
    2: a qualification failed (the node is drained: a finding); 3: not qualified, or the nodes or
    the queue could not be read."""

    from ..qualify.batch import exit_code
    from ..qualify.due import run_due

    ready = _through_slurm_setup(args, config)
    if ready is None:
        return ExitCode.UNKNOWN
    command, level, work_dir, client, swept = ready
    done = run_due(client, config.settings, level, command, work_dir)
    codes = [ExitCode.UNKNOWN] if done.get("error") else [ExitCode.OK]
    for node in done["due"]:
        node["exit_code"] = int(exit_code(node))
        codes.append(ExitCode.OK if node["exit_code"] == ExitCode.REFUSED else node["exit_code"])
    code = max(codes)
    if args.json:
        doc = dict(done, schema="slurm-hooks.qualify-due/1", level=level, exit_code=code)
        doc["swept"] = swept
        json.dump(doc, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
        return code
    if done.get("error"):
        print("slurm-hooks: qualify --due: %s" % done["error"], file=sys.stderr)
    if not done["due"]:
        print("no node is due for qualification")
    for node in done["due"]:
        print(
            "qualify %s on %s (%s: %s): %s: %s"
            % (
                level,
                node["node"],
                node["kind"],
                node["due"],
                node["verdict"].upper(),
                node.get("reason", ""),
            )
        )
        if node.get("enacted"):
            print("  enacted: %s" % node["enacted"])
    for node in done["waiting"]:
        print("not due: %s (%s): %s" % (node["node"], node["kind"], node["why"]))
    return code


def job_command() -> list:
    """How the qualification job starts us on the node: this Python in isolated mode (-I). Plain
    `python -m` puts the job's working directory first on sys.path (the admin's directory, or /tmp
    where Slurm finds it missing on the node), where a user could leave a `slurm_hooks` package
    that runs as root and prints a pass; -I also ignores PYTHONPATH and the user site."""
    return [sys.executable, "-I", "-m", "slurm_hooks"]


def sweep_reservations(client, config) -> dict:
    """The stale-reservation sweep (qualify/sweep.py) at the start of a run; what it deleted is
    said on stderr (the run's own output stays one document)."""
    from ..qualify.sweep import sweep
    from ..slurm.client import client_env

    swept = sweep(client, config.settings, client_env(None))
    for gone in swept["deleted"]:
        print(
            "slurm-hooks: qualify: deleted the stale reservation %s (%s); node %s %s"
            % (gone["name"], gone["why"], gone["node"], gone["node_action"]),
            file=sys.stderr,
        )
    if swept.get("error"):
        print("slurm-hooks: qualify: sweep: %s" % swept["error"], file=sys.stderr)
    return swept


def sweep_only(args, config) -> int:
    """`qualify --sweep`: 0 when the reservations could be listed (whatever was deleted), 3 not."""
    from ..slurm.drainer import make_client

    swept = sweep_reservations(make_client(config.settings), config)
    if args.json:
        json.dump(dict(swept, schema="slurm-hooks.qualify-sweep/1"), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(
            "%d stale reservation(s) of ours deleted, %d kept"
            % (len(swept["deleted"]), len(swept["kept"]))
        )
        for kept in swept["kept"]:
            print("  kept %s: %s" % (kept["name"], kept["why"]))
    return ExitCode.UNKNOWN if swept.get("error") else ExitCode.OK


def list_records(args, config) -> int:
    """The latest qualification record of every node: when, level, class, verdict, reason."""
    import time

    from ..qualify import record

    latest = record.latest_by_node(config.get("records", "dir"), trusted_writers(config))
    rows = []
    for node, (path, rec) in sorted(latest.items()):
        when = rec.get("started")
        rows.append(
            {
                "node": node,
                "when": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(when))
                if isinstance(when, (int, float))
                else "?",
                "level": rec.get("level"),
                "class": rec.get("class"),
                "verdict": rec.get("verdict"),
                "reason": rec.get("reason"),
                "record": path,
            }
        )
    if args.json:
        json.dump(rows, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
        return ExitCode.OK
    if not rows:
        print("no qualification records under %s" % config.get("records", "dir"))
    for row in rows:
        print(
            "%-20s %-20s %-8s %-13s %s: %s"
            % (row["node"], row["when"], row["level"], row["verdict"], row["class"], row["reason"])
        )
    return ExitCode.OK


def qualification_rows(args, paths) -> list:
    """Each node's latest qualification under the report's PATHs (qualify/latest.py), trusting the
    writers [fleet] trusted_writers names; with a configuration that cannot be read, root's and
    ours only (a report of given PATHs needs no configuration)."""
    from ..core.config import ConfigError
    from ..qualify import latest
    from .check_verbs import load

    try:
        _registry, config = load(args)
        trusted = trusted_writers(config)
    except ConfigError:
        trusted = {0}
    return latest.rows(paths, trusted)


def trusted_writers(config) -> "set[int]":
    """Whose records may set the fleet's median: [fleet] trusted_writers (as for report
    --stragglers), with root, us and the records directory's owner (record.latest_by_node)."""
    from ..records.straggler_scan import ScanError, trusted_uids

    try:
        return trusted_uids(config.get("fleet", "trusted_writers"))
    except ScanError as exc:
        print("slurm-hooks: warning: %s" % exc, file=sys.stderr)
        return {0}


def render(result) -> str:
    lines = [
        "qualify %s on %s (%s), %.1f s (ours %.2f s)"
        % (
            result["level"],
            result["node"],
            result["class"],
            result["seconds"],
            result["our_seconds"],
        )
    ]
    for test in result["tests"]:
        lines.append(
            "  %-7s %-16s %s (%.1f s)"
            % (test["status"], test["name"], test["summary"], test["seconds"])
        )
    lines.append("verdict: %s: %s" % (result["verdict"].upper(), result["reason"]))
    if result.get("record"):
        lines.append("record: %s" % result["record"])
    return "\n".join(lines) + "\n"
