"""`check`, `capture`, `list`, `config`: what each verb does, in terms of the library (config, registry, runner,
report_format)."""

from __future__ import annotations

import os
import sys
import threading

from ..core.config import LIVE_SOURCES, Config, load_registry_and_config, render_toml
from ..registry import CONTEXTS, Registry, load_builtin_checks
from ..result import ExitCode, Status


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
    add_json_option(capture, CAPTURE_SCHEMA)
    capture.set_defaults(handler=cmd_capture)

    baseline = sub.add_parser(
        "baseline",
        help="write this node's expected values (GPUs, links, driver, HCAs, CPUs, memory) as config",
        description="Read this node (or --root DIR) once and print its expected values as config "
        "TOML, as NHC's nhc-genconf does: GPU count and model, driver, PCIe generation, NVLinks per "
        "model, HCAs and their rate, CPU and NUMA layout, memory. Take it on a known-good node, "
        "review it, and install it as a conf.d drop-in. Exit code: 0, or 1 when this node fails "
        "checks even under its own baseline (a x8 link; the file is still written, with the "
        "failures listed at its top).",
    )
    baseline.add_argument(
        "-o", "--output", metavar="FILE", help="write to FILE instead of stdout (not replaced)"
    )
    baseline.add_argument("--force", action="store_true", help="replace an existing --output FILE")
    baseline.add_argument(
        "--root", metavar="DIR", help="read a tree (a capture, the fake node) instead of /"
    )
    add_live_option(baseline)
    baseline.set_defaults(handler=cmd_baseline)

    listing = sub.add_parser("list", help="list every check with its contexts and description")
    add_json_option(listing, LIST_SCHEMA)
    listing.set_defaults(handler=cmd_list)

    config = sub.add_parser("config", help="configuration commands")
    config_sub = config.add_subparsers(
        dest="config_command", metavar="SUBCOMMAND", parser_class=Parser
    )
    config_sub.required = True
    config_check = config_sub.add_parser(
        "check", help="validate the configuration and print the effective result"
    )
    add_json_option(config_check, CONFIG_SCHEMA)
    config_check.set_defaults(handler=cmd_config)
    config_sub.add_parser(
        "reference", help="print the configuration reference (Markdown) from the registry"
    ).set_defaults(handler=cmd_config)


LIST_SCHEMA = "slurm-hooks.list/1"
CONFIG_SCHEMA = "slurm-hooks.config/1"
CAPTURE_SCHEMA = "slurm-hooks.capture/1"


def add_json_option(parser, schema: str) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON (schema %s)" % schema)


def print_json(schema: str, document: dict) -> None:
    import json

    print(json.dumps(dict({"schema": schema}, **document), indent=2, default=str))


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


def load(args, names=None) -> "tuple[Registry, Config]":
    """Registry and config for an admin verb; deprecation warnings go to stderr (hooks log them in health runs).
    names: the checks or families the verb runs, when it runs only some (registry.load_builtin_checks)."""
    registry, config = load_registry_and_config(
        args.config, getattr(args, "root", None), getattr(args, "live", ()), names
    )
    for warning in config.warnings:
        print("slurm-hooks: warning: %s" % warning, file=sys.stderr)
    return registry, config


def cmd_check(args) -> int:
    from ..core.report_format import render_table, use_colour, write_json
    from ..core.runner import run_checks, select_checks
    from ..hw.host import Host

    registry, config = load(args, args.names or None)  # `check system`: only what it runs
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
        if args.json:
            print_json(CAPTURE_SCHEMA, {"archive": args.out, "error": str(exc)})
        print("slurm-hooks: %s" % exc, file=sys.stderr)
        return ExitCode.UNKNOWN
    if args.json:
        print_json(CAPTURE_SCHEMA, {"archive": args.out, **meta})
        return ExitCode.OK
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


def cmd_baseline(args) -> int:
    from ..core.atomicio import write_atomic
    from ..core.baseline import take_baseline
    from ..core.report_format import node_name
    from ..hw.host import Host

    registry, config = load(args)
    if args.output and os.path.lexists(args.output) and not args.force:
        print(
            "slurm-hooks baseline: %s exists (--force replaces it)" % args.output, file=sys.stderr
        )
        return ExitCode.UNKNOWN
    root = config.get("general", "root")
    text, report = take_baseline(registry, config, Host(root), node_name(root))
    if args.output:
        try:
            write_atomic(args.output, text.encode(), mode=0o644)
        except OSError as exc:
            print("slurm-hooks baseline: %s: %s" % (args.output, exc.strerror), file=sys.stderr)
            return ExitCode.UNKNOWN
        print("slurm-hooks baseline: wrote %s" % args.output, file=sys.stderr)
    else:
        sys.stdout.write(text)
    if report.status.severity > Status.OK.severity:
        print(
            "slurm-hooks baseline: this node did not pass every check under it (%s): "
            "see the top of the file" % report.status.value,
            file=sys.stderr,
        )
        return ExitCode.WARN
    return ExitCode.OK


def cmd_list(args) -> int:
    registry = load_builtin_checks()
    if args.json:
        print_json(
            LIST_SCHEMA,
            {"checks": [_check_dict(spec) for spec in registry.sorted_checks()]},
        )
        return ExitCode.OK
    rows = [
        (spec.name, ",".join(c for c in CONTEXTS if c in spec.contexts), spec.description)
        for spec in registry.sorted_checks()
    ]
    width = [max(len(r[i]) for r in rows) for i in range(2)]
    for name, contexts, description in rows:
        print("%s  %s  %s" % (name.ljust(width[0]), contexts.ljust(width[1]), description))
    return ExitCode.OK


def _check_dict(spec) -> dict:
    return {
        "name": spec.name,
        "family": spec.family,
        "contexts": [c for c in CONTEXTS if c in spec.contexts],
        "description": spec.description,
        "timeout_s": spec.timeout,
        "enabled_by_default": spec.enabled_by_default,
        "params": [
            {
                "name": p.name,
                "type": p.type.__name__ if p.type is not dict else "table",
                "describe": p.describe_type(),
                "minimum": p.minimum,
                "maximum": p.maximum,
                "above": p.above,
                "choices": list(p.choices) if p.choices else None,
                "default": p.default,
                "help": p.help,
            }
            for p in spec.params
        ],
    }


def cmd_config(args) -> int:
    if args.config_command == "reference":
        from ..core.config import render_reference

        sys.stdout.write(render_reference(load_builtin_checks()))
        return ExitCode.OK
    if args.json:
        return _config_json(args)
    _registry, config = load(args)
    for warning in directory_warnings(config):
        print("slurm-hooks: warning: %s" % warning, file=sys.stderr)
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


def directory_warnings(config: Config) -> "list[str]":
    """Output directories that do not exist. The hooks create them, so a typo in [metrics]
    textfile_dir would quietly start a tree node_exporter never reads; said here, where an admin
    checks the config (not at every load: a stat of a hung file system must not stall a prolog)."""
    found = []
    for key, reader in (
        ("textfile_dir", "node_exporter's --collector.textfile.directory"),
        ("dcgm_job_mapping_dir", "dcgm-exporter's --hpc-job-mapping-dir"),
    ):
        path = config.get("metrics", key)
        if path and not os.path.isdir(path):
            found.append(
                "[metrics] %s = %r does not exist: the hooks would create it, but only %s is "
                "read (a typo?)" % (key, path, reader)
            )
    found.extend(state_dir_warnings(config))
    return found


def state_dir_warnings(config: Config) -> "list[str]":
    """[paths] state_dir someone else could change (core/dir_trust.py): the hooks treat it as lost
    (state rebuilt from Slurm, no drain history believed, no repair rung climbed), so say it here."""
    from ..core.dir_trust import untrusted_because

    path = config.get("paths", "state_dir")
    try:
        why = untrusted_because(path)
    except OSError as exc:
        why = "cannot be checked: %s" % exc
    if not why:
        return []
    return [
        "[paths] state_dir = %r: %s; until then the hooks believe nothing in it (node state "
        "rebuilt from Slurm, drain history unknown: no lemon judged, no repair rung climbed)"
        % (path, why)
    ]


def _config_json(args) -> int:
    """`config check --json`: valid or not, the files read, warnings, and every effective value."""
    from ..core.config import ConfigError

    try:
        _registry, config = load_registry_and_config(args.config)
    except ConfigError as exc:
        print_json(CONFIG_SCHEMA, {"valid": False, "error": str(exc)})
        print("slurm-hooks: configuration error: %s" % exc, file=sys.stderr)
        return ExitCode.UNKNOWN
    print_json(
        CONFIG_SCHEMA,
        {
            "valid": True,
            "sources": list(config.sources),
            "warnings": list(config.warnings) + directory_warnings(config),
            "settings": {k: dict(v) for k, v in config.settings.items()},
            "checks": {
                name: {"enabled": c.enabled, "params": dict(c.params.items())}
                for name, c in sorted(config.checks.items())
            },
        },
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
