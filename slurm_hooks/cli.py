"""Command line front end: argument parsing and dispatch only; the work lives in the library.

Imports are lazy so that `slurm-hooks prolog` pays only for what it uses (start-up time is the
prolog's cost floor).
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

EXIT_UNKNOWN = 3  # Nagios UNKNOWN: also used for usage and configuration errors


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would exit 2, which means FAIL to Nagios
        self.print_usage(sys.stderr)
        self.exit(EXIT_UNKNOWN, "%s: error: %s\n" % (self.prog, message))


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(prog="slurm-hooks", description="GPU node checks for Slurm prolog/epilog/health and admins.")
    parser.add_argument("--version", action="version", version="slurm-hooks " + __version__)
    parser.add_argument("--config", metavar="FILE", help="config file (default /etc/slurm-hooks/config.toml "
                                                          "plus conf.d/*.toml beside it)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    check = sub.add_parser("check", help="run checks now and print the results",
                           description="Run checks (default: those of the 'manual' context). Exit code: 0 OK, "
                                       "1 WARN, 2 FAIL, 3 UNKNOWN (Nagios).")
    check.add_argument("names", nargs="*", metavar="NAME", help="check names or families (e.g. system.cpu, gpu)")
    check.add_argument("--all-contexts", action="store_true", help="run every check, whatever its contexts")
    check.add_argument("--context", choices=("prolog", "epilog", "health", "manual"), default="manual",
                       help="run the checks of this context (default manual)")
    _add_run_options(check)

    sub.add_parser("list", help="list every check with its contexts and description")

    config = sub.add_parser("config", help="configuration commands")
    config_sub = config.add_subparsers(dest="config_command", metavar="SUBCOMMAND", parser_class=_Parser)
    config_sub.required = True
    config_sub.add_parser("check", help="validate the configuration and print the effective result")
    config_sub.add_parser("reference", help="print the configuration reference (Markdown) from the registry")
    return parser


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON (schema slurm-hooks.check/1)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show every result with its details")
    parser.add_argument("--root", metavar="DIR", help="read /sys, /proc, /dev under DIR (a captured or fake tree)")
    parser.add_argument("--deadline", type=float, metavar="SECONDS", help="override the run's global deadline")


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return EXIT_UNKNOWN
    from . import commands
    from .config import ConfigError

    handler = {"check": commands.cmd_check, "list": commands.cmd_list, "config": commands.cmd_config}[args.command]
    try:
        code = handler(args)
    except ConfigError as exc:
        print("slurm-hooks: configuration error: %s" % exc, file=sys.stderr)
        return EXIT_UNKNOWN
    except BrokenPipeError:
        return 0
    return commands.finish(code)


if __name__ == "__main__":
    sys.exit(main())
