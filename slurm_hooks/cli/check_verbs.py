"""`check`, `capture`, `list`, `config`: what each verb does, in terms of the library (config, registry, runner,
report_format)."""

from __future__ import annotations

import os
import sys
import threading

from ..core.config import LIVE_SOURCES, Config, load_registry_and_config, render_toml
from ..registry import CONTEXTS, Registry, load_builtin_checks
from ..result import ExitCode


def add_parsers(sub) -> None:
    from .parser import Parser, add_run_options

    check = sub.add_parser(
        "check",
        help="run checks now and print the results",
        description="Run checks (default: those of the 'manual' context). Exit code: 0 OK, "
        "1 WARN, 2 FAIL, 3 UNKNOWN (Nagios).",
    )
    check.add_argument(
        "names", nargs="*", metavar="NAME", help="check names or families (e.g. system.cpu, gpu)"
    )
    check.add_argument(
        "--all-contexts", action="store_true", help="run every check, whatever its contexts"
    )
    check.add_argument(
        "--context",
        choices=CONTEXTS,
        default="manual",
        help="run the checks of this context (default manual)",
    )
    add_run_options(check)
    add_live_option(check)
    check.set_defaults(handler=cmd_check)

    capture = sub.add_parser(
        "capture",
        help="archive the files the checks read on this node (for a ticket or the test corpus)",
        description="Run every check once, recording each file it reads, and "
        "archive exactly those files (redacted: see docs/admin.md 'Captures'). Unpack it and run "
        "`slurm-hooks check --root DIR` to see this node's verdicts elsewhere (this machine's "
        "configuration applies; the captured one's differences are shown).",
    )
    capture.add_argument(
        "out", metavar="OUT.tar.gz", help="archive to write (.tar.gz, .tar.xz or .tar)"
    )
    capture.add_argument(
        "--root", metavar="DIR", help="capture a tree (a fake node, another capture) instead of /"
    )
    capture.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="WHAT",
        help="leave out what this site must not share, comma-separated, repeatable: "
        "kernel-log, cmdline, processes (docs/admin.md 'Captures': what a capture contains)",
    )
    add_live_option(capture)
    capture.set_defaults(handler=cmd_capture)

    sub.add_parser("list", help="list every check with its contexts and description").set_defaults(
        handler=cmd_list
    )

    config = sub.add_parser("config", help="configuration commands")
    config_sub = config.add_subparsers(
        dest="config_command", metavar="SUBCOMMAND", parser_class=Parser
    )
    config_sub.required = True
    config_sub.add_parser(
        "check", help="validate the configuration and print the effective result"
    ).set_defaults(handler=cmd_config)
    config_sub.add_parser(
        "reference", help="print the configuration reference (Markdown) from the registry"
    ).set_defaults(handler=cmd_config)


def add_live_option(parser) -> None:
    parser.add_argument(
        "--live",
        action="append",
        default=[],
        metavar="SOURCE",
        choices=LIVE_SOURCES,
        help="with --root: still read this live source of the running machine (%s); repeatable. "
        "'nvml' is how the fake node's library is used" % ", ".join(LIVE_SOURCES),
    )


def load(args) -> "tuple[Registry, Config]":
    """Registry and config for an admin verb; deprecation warnings go to stderr (hooks log them in health runs)."""
    registry, config = load_registry_and_config(
        args.config, getattr(args, "root", None), getattr(args, "live", ())
    )
    for warning in config.warnings:
        print("slurm-hooks: warning: %s" % warning, file=sys.stderr)
    return registry, config


def cmd_check(args) -> int:
    from ..core.report_format import render_table, use_colour, write_json
    from ..core.runner import run_checks, select_checks
    from ..hw.host import Host

    registry, config = load(args)
    try:
        specs = select_checks(registry, args.context, args.names, args.all_contexts)
    except KeyError as exc:
        print(
            "slurm-hooks: no check or family named %s (see `slurm-hooks list`)" % exc,
            file=sys.stderr,
        )
        return ExitCode.UNKNOWN
    root = config.get("general", "root")
    host = Host(root)
    if not host.is_live:
        from ..hw.replay import captured_config_differences, render_differences

        sys.stderr.write(render_differences(*captured_config_differences(host, config)))
    report = run_checks(registry, config, host, args.context, specs, deadline=args.deadline)
    if args.json:
        write_json(report, sys.stdout, root)
    else:
        sys.stdout.write(render_table(report, verbose=args.verbose, colour=use_colour(sys.stdout)))
    return report.status.exit_code


def cmd_capture(args) -> int:
    from ..hw.capture import CaptureError, capture
    from ..hw.redact import parse_exclude

    try:
        exclude = parse_exclude(args.exclude)
    except ValueError as exc:
        print("slurm-hooks: %s" % exc, file=sys.stderr)
        return ExitCode.UNKNOWN
    registry, config = load(args)
    try:
        meta = capture(registry, config, args.out, exclude=exclude)
    except CaptureError as exc:
        print("slurm-hooks: %s" % exc, file=sys.stderr)
        return ExitCode.UNKNOWN
    print(
        "%s: %d entries from %s (%s); redacted: %d files; left out: %s; check it with:\n  mkdir DIR && tar xf %s -C DIR && "
        "slurm-hooks check --root DIR/%s"
        % (
            args.out,
            meta["entries"],
            meta["node"],
            meta["root"],
            len(meta["redactions"]),
            ", ".join(exclude) or "nothing (--exclude)",
            args.out,
            meta["node"],
        )
    )
    return ExitCode.OK


def cmd_list(args) -> int:
    registry = load_builtin_checks()
    rows = [
        (spec.name, ",".join(c for c in CONTEXTS if c in spec.contexts), spec.description)
        for spec in registry.sorted_checks()
    ]
    width = [max(len(r[i]) for r in rows) for i in range(2)]
    for name, contexts, description in rows:
        print("%s  %s  %s" % (name.ljust(width[0]), contexts.ljust(width[1]), description))
    return ExitCode.OK


def cmd_config(args) -> int:
    if args.config_command == "reference":
        from ..core.config import render_reference

        sys.stdout.write(render_reference(load_builtin_checks()))
        return ExitCode.OK
    _registry, config = load(args)
    sys.stdout.write(render_toml(config))
    print(
        "# configuration is valid%s"
        % (
            " (%d deprecation warning%s above)"
            % (len(config.warnings), "s" if len(config.warnings) > 1 else "")
            if config.warnings
            else ""
        ),
        file=sys.stderr,
    )
    return ExitCode.OK


def finish(code: int) -> int:
    """Exit now if a timed-out check thread is still stuck (e.g. in a hung NVML call).

    Interpreter shutdown could otherwise wait on, or crash in, a thread blocked in C code; the
    results are already written, so flush and leave with os._exit.
    """
    stuck = [
        t
        for t in threading.enumerate()
        if t.name.startswith(("check:", "bounded:")) and t.is_alive()
    ]
    if stuck:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
