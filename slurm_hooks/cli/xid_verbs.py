"""CLI verbs about Xids: `explain xid N`, `xid [FILE|-]` (classify kernel log lines), `xid ack`.

Imported on every invocation (prolog included) to build the parser: keep the top level light and
import the catalog, parsers and checks inside the handlers.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Optional, Tuple

from ..result import ExitCode

MAX_INPUT = 64 << 20  # bytes read from a log file or stdin
# `xid ack` waits this long for another ack's directory lock: any user who can read the state
# directory can flock it, and without a limit that held the admin's command for ever
ACK_LOCK_TIMEOUT_S = 10.0

XID_DESCRIPTION = """\
Classify NVIDIA Xid and NVSwitch SXid lines with the packaged catalog, one line per event (or a
JSON list with --json); an NVSwitch report (event, Severity and Data lines) is one event. FILE
holds `dmesg` (plain, -T, -r, -x), `journalctl -k` or /dev/kmsg output; '-' reads stdin (paste it);
no FILE reads this node's kernel log (/dev/kmsg under --root) and marks what was acknowledged.
Exit code by the worst classification, like `check`: 0 OK, 1 WARN, 2 FAIL, 3 UNKNOWN. Operator
overrides and ignore lists come from [checks."xid.events"] / [checks."xid.sxid"].

Only lines the driver wrote count: the message must start with "NVRM: Xid (PCI:...): N" or
"nvidia-nvswitchN: SXid (PCI:...): N" (a crashing program's name in the kernel's segfault line is
not an Xid), and where the format keeps the syslog facility (/dev/kmsg, dmesg -r, dmesg -x) it must
be the kernel's. Plain dmesg and journalctl text lose the facility and are judged by the prefix;
use `journalctl -k` or `dmesg -x`, not /var/log/messages, where `logger -t kernel` forges lines.

`slurm-hooks xid ack --all` (or --seq N, repeatable) clears this boot's Xids/SXids once the GPU is
fixed, so xid.events/xid.sxid stop reporting them. It writes <[paths] state_dir>/xid-ack.json
atomically (mode 0600; needs root). A reboot clears them anyway: acknowledgements are per boot
id (/proc/sys/kernel/random/boot_id), and the kernel log starts afresh.
"""


def add_parsers(sub) -> None:
    from .parser import Parser

    explain = sub.add_parser("explain", help="explain an error code: explain xid 79")
    what = explain.add_subparsers(dest="explain_what", metavar="WHAT", parser_class=Parser)
    what.required = True
    explain_xid = what.add_parser(
        "xid", help="what NVIDIA Xid N means and what slurm-hooks does about it"
    )
    explain_xid.add_argument("number", type=int, metavar="N", help="the Xid number, e.g. 79")
    explain_xid.add_argument(
        "--json", action="store_true", help="print JSON (schema %s)" % EXPLAIN_SCHEMA
    )
    explain_xid.set_defaults(handler=cmd_explain_xid)

    xid = sub.add_parser(
        "xid",
        help="classify Xid/SXid lines from a log, stdin or this node; `xid ack` clears them",
        description=XID_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    xid.add_argument(
        "target",
        nargs="?",
        metavar="FILE|-|ack",
        help="log file, '-' for stdin, nothing for this node's kernel log, or 'ack'",
    )
    xid.add_argument("--json", action="store_true", help="print a JSON list of events")
    xid.add_argument(
        "--since-seq", type=int, metavar="N", help="only /dev/kmsg records after sequence number N"
    )
    xid.add_argument(
        "--all", action="store_true", help="ack: acknowledge every Xid/SXid of this boot"
    )
    xid.add_argument(
        "--seq",
        type=int,
        action="append",
        metavar="N",
        help="ack: acknowledge the record with this /dev/kmsg sequence number (repeatable)",
    )
    xid.add_argument("--root", metavar="DIR", help="read /dev, /proc and the state dir under DIR")
    xid.set_defaults(handler=cmd_xid)


def _error(message: str) -> int:
    print("slurm-hooks: %s" % message, file=sys.stderr)
    return ExitCode.UNKNOWN


def _overrides(config) -> Tuple[Dict[int, Dict[str, str]], Dict[int, Dict[str, str]]]:
    """The configured Xid and SXid overrides (validated when the config was loaded)."""
    from ..checks.xid import _overrides as effective

    return effective(config.check("xid.events").params), effective(config.check("xid.sxid").params)


EXPLAIN_SCHEMA = "slurm-hooks.explain/1"


def cmd_explain_xid(args) -> int:
    from ..core.config import ConfigError
    from ..xid.catalog import explain, load_catalog, validate_overrides
    from .check_verbs import load

    try:  # the numbers an override may name, so the advice below is one `config check` accepts
        validate_overrides({args.number: {"status": "OK"}})
    except ValueError:
        return _error(
            "%d is not an Xid number: Xids are 1 to 99999 (the kernel logs them as "
            "'NVRM: Xid (PCI:...): N, ...')" % args.number
        )
    overrides: Optional[Dict[int, Dict[str, str]]] = None
    sources: Tuple[str, ...] = ()
    try:
        config = load(args)[1]
        overrides, sources = _overrides(config)[0], tuple(config.sources)
    except (ConfigError, ValueError) as exc:  # explain still works on a node with a broken config
        print("slurm-hooks: configuration not applied: %s" % exc, file=sys.stderr)
    catalog = load_catalog()
    if getattr(args, "json", False):
        print(json.dumps(_explain_dict(args.number, overrides, catalog), indent=2))
        return ExitCode.OK if catalog.lookup(args.number) is not None else ExitCode.UNKNOWN
    if catalog.lookup(args.number) is None:
        return _error(
            "Xid %d is not in the packaged catalog (NVIDIA catalog %s): newer than this release, or "
            "not an NVIDIA Xid. xid.events reports it UNKNOWN (never drains); decide for it with "
            '[checks."xid.events".overrides] %d = {status = "FAIL", action = "drain"} (or status '
            '"WARN", "OK").' % (args.number, catalog.version, args.number)
        )
    print(explain(args.number, overrides, catalog, override_source=", ".join(sources) or None))
    return ExitCode.OK


def _explain_dict(number: int, overrides, catalog) -> Dict[str, object]:
    """`explain xid N --json`: the catalog row (null when absent) and the decision in force."""
    from ..xid.catalog import classify
    from ..xid.kmsg import XidEvent

    entry = catalog.lookup(number)
    decision = classify(
        XidEvent(xid=number, pci=None, pid=None, process=None, text=""), overrides, catalog=catalog
    )
    return {
        "schema": EXPLAIN_SCHEMA,
        "kind": "xid",
        "number": number,
        "catalog_version": catalog.version,
        "entry": None
        if entry is None
        else {name: _plain(getattr(entry, name)) for name in type(entry)._fields},
        "decision": {
            name: getattr(decision, name)
            for name in ("status", "action", "blame", "reason", "bucket", "overridden")
        },
    }


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def cmd_xid(args) -> int:
    if args.target == "ack":
        if args.json or args.since_seq is not None:
            return _error("xid ack takes --all or --seq N (and --root), not --json/--since-seq")
        return cmd_ack(args)
    if args.all or args.seq:
        return _error("--all and --seq go with `slurm-hooks xid ack`")
    from ..hw.host import HostError
    from .check_verbs import load

    _registry, config = load(args)
    try:
        overrides, sxid_overrides = _overrides(config)
    except ValueError as exc:
        return _error("configuration error: %s" % exc)
    try:
        xids, sxids, acked = _events(args, config)
    except (OSError, HostError) as exc:
        return _error("cannot read %s: %s" % (args.target or "the kernel log", exc))
    if args.since_seq is not None:
        xids = [e for e in xids if e.seq is not None and e.seq > args.since_seq]
        sxids = [e for e in sxids if e.seq is not None and e.seq > args.since_seq]
    rows = _classify(xids, sxids, acked, config, overrides, sxid_overrides)
    _print_rows(rows, args.json)
    from ..result import Status, worst

    return worst(Status(r["status"]) for r in rows if not r["acknowledged"]).exit_code


def _events(args, config) -> Tuple[List[Any], List[Any], frozenset]:
    from ..xid.kmsg import scan_all

    if args.target is None:
        log = _read_log(args, config)
        for note in log.notes:
            print("slurm-hooks: note: %s" % note, file=sys.stderr)
        return list(log.xids), list(log.sxids), log.acked
    if args.target == "-":
        data = sys.stdin.buffer.read(MAX_INPUT)
    else:
        with open(args.target, "rb") as handle:
            data = handle.read(MAX_INPUT)
    # Only the newline dmesg/journalctl print ends a record: str.splitlines() also splits at VT, FF,
    # CR, U+2028..., characters a user can put in a file name the kernel logs (a segfault line), which
    # would start a forged "line" with the driver's prefix.
    xids, sxids = scan_all(data.decode("utf-8", errors="replace").split("\n"))
    return xids, sxids, frozenset()


def _read_log(args, config):
    from types import SimpleNamespace

    from ..checks.xid import read_kernel_log
    from ..hw.host import Host

    return read_kernel_log(SimpleNamespace(host=Host(config.get("general", "root")), config=config))


def _classify(xids, sxids, acked, config, overrides, sxid_overrides) -> List[Dict[str, Any]]:
    from ..xid.catalog import classify_all, classify_sxid

    rows = []
    ignore = set(config.check("xid.events").params.ignore)
    kept = [e for e in xids if e.xid not in ignore]
    for event, cls in zip(kept, classify_all(kept, overrides)):
        rows.append(
            _row(
                "xid",
                event.xid,
                event,
                cls,
                acked,
                pid=event.pid,
                process=event.process,
                gpu_instance=event.gpu_instance,
                compute_instance=event.compute_instance,
            )
        )
    ignore_sxid = set(config.check("xid.sxid").params.ignore)
    for event in sxids:
        if event.sxid not in ignore_sxid:
            rows.append(
                _row(
                    "sxid",
                    event.sxid,
                    event,
                    classify_sxid(event, sxid_overrides),
                    acked,
                    switch=event.switch,
                    severity=event.severity,
                    link=event.link,
                )
            )
    skipped = len(xids) + len(sxids) - len(rows)
    if skipped:
        print(
            "slurm-hooks: note: %d event(s) left out by the configured ignore lists" % skipped,
            file=sys.stderr,
        )
    return rows


def _row(kind: str, code: int, event, cls, acked, **extra: Any) -> Dict[str, Any]:
    row = {
        "kind": kind,
        "code": code,
        "pci": event.pci,
        "seq": event.seq,
        "usec": event.usec,
        "wallclock": event.wallclock,
    }
    row.update(extra)
    row.update(
        {
            "text": event.text,
            "status": cls.status,
            "action": cls.action,
            "blame": cls.blame,
            "reason": cls.reason,
            "bucket": cls.bucket,
            "overridden": cls.overridden,
            "acknowledged": event.seq is not None and event.seq in acked,
        }
    )
    return row


def _print_rows(rows: List[Dict[str, Any]], as_json: bool) -> None:
    if as_json:
        import json

        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    if not rows:
        print("no Xid or SXid events")
        return
    for r in rows:
        where = (
            "seq=%d" % r["seq"]
            if r["seq"] is not None
            else (
                "t=%.6f" % (r["usec"] / 1e6) if r["usec"] is not None else (r["wallclock"] or "-")
            )
        )
        label = "%s %d" % ("Xid" if r["kind"] == "xid" else "SXid", r["code"])
        pci = r["pci"] or "-"
        if r.get("gpu_instance") is not None:  # MIG: the partition, after the GPU's bus id
            pci += " GI %d" % r["gpu_instance"]
            if r.get("compute_instance") is not None:
                pci += " CI %d" % r["compute_instance"]
        print(
            "%-7s %-9s %-10s %-12s %-12s %s -- %s%s"
            % (
                r["status"],
                r["action"],
                label,
                pci,
                where,
                r["text"] or "-",
                r["reason"],
                "  (acknowledged)" if r["acknowledged"] else "",
            )
        )


def cmd_ack(args) -> int:
    from ..hw.host import Host, HostError
    from .check_verbs import load

    if not args.all and not args.seq:
        return _error(
            "xid ack: say --all, or --seq N for one record (see `slurm-hooks xid` for sequence numbers)"
        )
    if args.all and args.seq:
        return _error("xid ack: --all or --seq, not both")
    _registry, config = load(args)
    try:
        log = _read_log(args, config)
    except HostError as exc:
        return _error("cannot read the kernel log: %s" % exc)
    if log.boot_id is None:
        return _error(
            "cannot read the boot id (/proc/sys/kernel/random/boot_id): nothing acknowledged"
        )
    events = {e.seq: e for e in list(log.xids) + list(log.sxids) if e.seq is not None}
    missing = sorted(set(args.seq or ()) - set(events))
    if missing:
        return _error(
            "no Xid/SXid record with sequence number %s in this boot's kernel log (see `slurm-hooks xid`)"
            % ", ".join(map(str, missing))
        )
    chosen = [
        events[s] for s in sorted(events) if s not in log.acked and (args.all or s in args.seq)
    ]
    if not chosen:
        print("nothing to acknowledge")
        return ExitCode.OK
    from ..checks.xid import ack_path

    path = Host(config.get("general", "root")).real(ack_path(config.get("paths", "state_dir")))
    try:
        write_acks(path, log.boot_id, chosen)
    except OSError as exc:
        return _error("cannot write %s: %s" % (path, exc))
    for event in chosen:
        print(
            "acknowledged seq=%d %s %d %s"
            % (
                event.seq,
                "SXid" if hasattr(event, "sxid") else "Xid",
                getattr(event, "sxid", getattr(event, "xid", 0)),
                event.pci or "-",
            )
        )
    return ExitCode.OK


def write_acks(path: str, boot_id: str, events: List[Any]) -> None:
    """Add events to the ack file: read, merge, write a temp file, fsync, rename (under a directory lock).

    Entries of other boots are dropped: they can never match again. A corrupt file is replaced.
    """
    import os
    import time

    from ..checks.xid import ACK_SCHEMA, parse_acks
    from ..core.atomicio import read_ours, write_json_atomic
    from ..core.locks import locked

    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    with locked(
        directory, ACK_LOCK_TIMEOUT_S, directory=True
    ):  # two admins acking at once must not lose an entry
        try:  # entries kept from a file another user planted would be rewritten as root's own
            raw = read_ours(path, 1 << 20)
            text: Optional[str] = None if raw is None else raw.decode("utf-8", errors="replace")
            problem = None
        except ValueError as exc:
            text, problem = None, str(exc)
        entries, parse_problem = parse_acks(text)
        problem = problem or parse_problem
        if problem:
            print("slurm-hooks: note: %s: %s; rewriting it" % (path, problem), file=sys.stderr)
        keep = [e for e in entries if e["boot_id"] == boot_id]
        seen = {e["seq"] for e in keep}
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        for event in events:
            if event.seq not in seen:
                kind, code = ("sxid", event.sxid) if hasattr(event, "sxid") else ("xid", event.xid)
                keep.append(
                    {
                        "boot_id": boot_id,
                        "seq": event.seq,
                        "kind": kind,
                        "code": code,
                        "pci": event.pci,
                        "acked_at": stamp,
                        "by": _user(),
                    }
                )
        write_json_atomic(
            path, {"schema": ACK_SCHEMA, "acks": keep}
        )  # temp + fsync + rename, mode 0600


def _user() -> str:
    import os

    sudo = os.environ.get("SUDO_USER")
    if sudo:
        return sudo
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return str(os.getuid())
