"""`slurm-hooks mode [enforce|observe]` and `slurm-hooks report --observed`: the explicit step from a
fresh install (observe: nothing is drained) to enforce, and what observe mode saw before it.

The mode is [general] mode in the configuration (/etc/slurm-hooks/config.toml, or --config /
$SLURM_HOOKS_CONFIG, then conf.d/*.toml beside it in name order). Changing it writes one drop-in,
conf.d/99-mode.toml, root's and 0644 like every config file (files others can write are refused),
atomically (a hook starting meanwhile reads the old file or the new one, never half of one). The
packaged config.toml stays unedited, so package upgrades replace it without a .dpkg-dist/.rpmnew.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import List, Optional, Tuple

from ..result import ExitCode

MODE_DROP_IN = "99-mode.toml"
MODES = ("enforce", "observe")


def add_parsers(sub) -> None:
    mode = sub.add_parser(
        "mode",
        help="show the drain mode and where it is set; `mode enforce|observe` sets it",
        description="Without an argument: the effective [general] mode of this node and the file "
        "that sets it. With enforce or observe (root only): write conf.d/%s beside the "
        "configuration so that it wins; before enforce, what observe mode would have drained is "
        "summarised (the full list: slurm-hooks report --observed)." % MODE_DROP_IN,
    )
    mode.add_argument("mode", nargs="?", choices=MODES, help="the mode to switch to")
    mode.add_argument("--json", action="store_true", help="print JSON (schema slurm-hooks.mode/1)")
    mode.set_defaults(handler=cmd_mode)


def config_dir(config_path: Optional[str]) -> str:
    from ..core.config_files import CONFIG_ENV, DEFAULT_CONFIG

    main = config_path or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG
    return os.path.dirname(os.path.abspath(main))


def mode_origin(config_path: Optional[str]) -> Optional[str]:
    """The last file (in the order they are read) that sets [general] mode; None: the built-in default.
    Called after the configuration loaded, so every file parses and is root's."""
    from ..core.config_files import config_files, parse_toml

    files, _required = config_files(config_path)
    origin = None
    for file in files:
        general = parse_toml(file).get("general")
        if isinstance(general, dict) and "mode" in general:
            origin = file
    return origin


def _observed_summary(config) -> Tuple[str, int]:
    from ..core.observed import collect, log_files

    log_file = config.get("paths", "log_file")
    if not log_file:
        return "[paths] log_file is empty: observe mode's decisions went to syslog/journald only", 0
    found, problems = collect(log_files(log_file))
    if problems:
        return "cannot read what observe mode logged: %s" % "; ".join(problems), 0
    if not found:
        return "observe mode logged no would-drain decision in %s (and its rotations)" % log_file, 0
    nodes = sorted({o.node for o in found})
    checks = sorted({o.check for o in found if o.check})
    return (
        "observe mode would have drained %d time(s) (%s; checks: %s), first %s, last %s: "
        "see `slurm-hooks report --observed`"
        % (
            len(found),
            ", ".join(nodes[:5]) + (" ..." if len(nodes) > 5 else ""),
            ", ".join(checks) or "-",
            found[0].time,
            found[-1].time,
        ),
        len(found),
    )


def cmd_mode(args) -> int:
    from .check_verbs import load

    _registry, config = load(args)  # a broken configuration is refused (exit 3) before any change
    current = config.get("general", "mode")
    origin = mode_origin(args.config)
    if args.mode is None:
        summary, count = _observed_summary(config) if current == "observe" else ("", 0)
        if args.json:
            json.dump(
                {
                    "schema": "slurm-hooks.mode/1",
                    "mode": current,
                    "source": origin or "built-in default",
                    "observed_would_drain": count if current == "observe" else None,
                },
                sys.stdout,
            )
            print()
        else:
            print("mode: %s (%s)" % (current, origin or "built-in default"))
            print(
                "  observe: decisions are logged, nothing is drained"
                if current == "observe"
                else "  enforce: node-broken failures drain the node"
            )
            if summary:
                print("  " + summary)
        return ExitCode.OK
    return _switch(args, config, current)


def _switch(args, config, current: str) -> int:
    from ..core import atomicio
    from .check_verbs import load

    directory = os.path.join(config_dir(args.config), "conf.d")
    target = os.path.join(directory, MODE_DROP_IN)
    if os.geteuid() != 0:
        print(
            "slurm-hooks mode: only root can change the mode: it is written to %s, which must be "
            "root's (run: sudo slurm-hooks mode %s)" % (target, args.mode),
            file=sys.stderr,
        )
        return ExitCode.UNKNOWN
    origin = mode_origin(args.config)
    if origin and os.path.dirname(origin) == directory and os.path.basename(origin) > MODE_DROP_IN:
        print(
            "slurm-hooks mode: %s sets [general] mode and is read after %s: remove the setting "
            "there first (nothing written)" % (origin, target),
            file=sys.stderr,
        )
        return ExitCode.REFUSED
    if args.mode == "enforce" and current == "observe":
        print(_observed_summary(config)[0])
    text = (
        "# Written by `slurm-hooks mode %s` at %s UTC; `slurm-hooks mode` shows the mode in effect and\n"
        "# the file it comes from. Read after the other conf.d files (name order), so it wins.\n"
        '[general]\nmode = "%s"\n'
        % (args.mode, time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), args.mode)
    )
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
        problem = _unsafe_directory(directory)
        if problem:  # the hooks would refuse a file there: say so before writing one
            print(
                "slurm-hooks mode: %s: %s (nothing written)" % (directory, problem), file=sys.stderr
            )
            return ExitCode.UNKNOWN
        atomicio.write_atomic(target, text.encode("utf-8"), mode=0o644)
    except OSError as exc:
        print(
            "slurm-hooks mode: cannot write %s: %s" % (target, exc.strerror or exc), file=sys.stderr
        )
        return ExitCode.UNKNOWN
    _registry, after = load(args)
    effective, origin = after.get("general", "mode"), mode_origin(args.config)
    if effective != args.mode:  # a drop-in named after ours (zz-*.toml) still decides
        print(
            "slurm-hooks mode: wrote %s, but %s sets mode = %r after it: the mode is still %s; "
            "remove the setting there" % (target, origin, effective, effective),
            file=sys.stderr,
        )
        return ExitCode.REFUSED
    print("mode: %s (%s)%s" % (effective, target, "" if current != effective else ", unchanged"))
    if effective == "enforce":
        print("  node-broken failures now drain this node; hooks read it at their next run")
    return ExitCode.OK


def _unsafe_directory(directory: str) -> Optional[str]:
    """Why the configuration loader would refuse files in DIRECTORY (core/config_files.check_secure)."""
    from ..core.config_files import INSECURE_OVERRIDE_ENV

    if os.environ.get(INSECURE_OVERRIDE_ENV) == "1":
        return None
    info = os.stat(directory)
    if info.st_uid != 0:
        return "owned by uid %d, not root" % info.st_uid
    if info.st_mode & 0o022:
        return "group- or world-writable (mode %04o): chmod go-w" % (info.st_mode & 0o7777)
    return None


def cmd_observed(args) -> int:
    """`report --observed [LOG...]`: every would-drain decision of observe mode, oldest first."""
    from ..core.observed import collect, log_files
    from .check_verbs import load

    paths: List[str] = list(args.paths)
    if not paths:
        _registry, config = load(args)
        log_file = config.get("paths", "log_file")
        if not log_file:
            print(
                "slurm-hooks report --observed: [paths] log_file is empty; pass the logs "
                "(e.g. journalctl -t slurm-hooks _UID=0 -o short-iso > FILE: _UID=0, as any user "
                "can log under the slurm-hooks tag)",
                file=sys.stderr,
            )
            return ExitCode.UNKNOWN
        paths = log_files(log_file)
        if not paths:
            print("slurm-hooks report --observed: no %s yet (no hook has run)" % log_file)
            return ExitCode.OK
    found, problems = collect(paths)
    for problem in problems:
        print("slurm-hooks report --observed: cannot read %s" % problem, file=sys.stderr)
    if args.json:
        json.dump(
            {
                "schema": "slurm-hooks.observed/1",
                "files": paths,
                "unreadable": problems,
                "would_drain": [_as_dict(o) for o in found],
            },
            sys.stdout,
            indent=1,
        )
        print()
    elif not found:
        print("observe mode would have drained nothing (%s)" % ", ".join(paths))
    else:
        rows = [("TIME", "NODE", "CONTEXT", "JOB", "CHECK", "WOULD DRAIN WITH REASON")]
        rows += [(o.time, o.node, o.context, o.job or "-", o.check or "-", o.reason) for o in found]
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        for row in rows:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[5])
        nodes = len({o.node for o in found})
        print("%d would-drain decision(s) on %d node(s)" % (len(found), nodes))
    if problems and not found:
        return ExitCode.UNKNOWN
    return ExitCode.WARN if found else ExitCode.OK


def _as_dict(observed) -> dict:
    return {
        name: getattr(observed, name)
        for name in ("time", "node", "context", "job", "check", "reason", "source")
    }
