"""Command line front end: argument parsing and dispatch only; the work lives in the library.

Each group of verbs lives in its own module (VERB_MODULES) exposing add_parsers(subparsers), which
sets `handler` on each parser. Handlers import what they need lazily, so `slurm-hooks prolog`
pays only for what it uses (start-up time is the prolog's cost floor).
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

EXIT_UNKNOWN = 3  # Nagios UNKNOWN: also used for usage and configuration errors
VERB_MODULES = ("slurm_hooks.commands", "slurm_hooks.xid_commands", "slurm_hooks.hook_commands",
                "slurm_hooks.record_commands")


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would exit 2, which means FAIL to Nagios
        self.print_usage(sys.stderr)
        self.exit(EXIT_UNKNOWN, "%s: error: %s\n" % (self.prog, message))


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = Parser(prog="slurm-hooks", description="GPU node checks for Slurm prolog/epilog/health and admins.")
    parser.add_argument("--version", action="version", version="slurm-hooks " + __version__)
    parser.add_argument("--config", metavar="FILE", help="config file (default /etc/slurm-hooks/config.toml "
                                                          "plus conf.d/*.toml beside it)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in VERB_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:  # a verb group not present in this build
            if exc.name != name:
                raise
            continue
        module.add_parsers(sub)
    return parser


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by every verb that runs checks."""
    parser.add_argument("--json", action="store_true", help="print JSON (schema slurm-hooks.check/1)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show every result with its details")
    parser.add_argument("--root", metavar="DIR", help="read /sys, /proc, /dev under DIR (a captured or fake tree)")
    parser.add_argument("--deadline", type=float, metavar="SECONDS", help="override the run's global deadline")


HOOK_VERBS = ("prolog", "epilog", "health")


def hook_parser() -> argparse.ArgumentParser:
    """The prolog/epilog/health command line alone: slurmd runs these before/after every job, so they
    skip building the full parser (every verb module imported, dozens of sub-parsers)."""
    parser = Parser(prog="slurm-hooks")
    parser.add_argument("--config", metavar="FILE")
    parser.add_argument("context", choices=HOOK_VERBS)
    parser.add_argument("--root", metavar="DIR")
    parser.add_argument("--node", metavar="NAME")
    return parser


def _is_hook_call(argv: List[str]) -> bool:
    words = [w for i, w in enumerate(argv) if not (w.startswith("-") or (i and argv[i - 1] == "--config"))]
    return bool(words) and words[0] in HOOK_VERBS and not any(w in ("-h", "--help", "--version") for w in argv)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if _is_hook_call(argv):
        from .hook_commands import cmd_hook

        args = hook_parser().parse_args(argv)
        return _finish(cmd_hook, args)
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_UNKNOWN
    return _finish(handler, args)


def _finish(handler, args: argparse.Namespace) -> int:
    from .commands import finish
    from .config import ConfigError

    try:
        code = handler(args)
    except ConfigError as exc:
        print("slurm-hooks: configuration error: %s" % exc, file=sys.stderr)
        return EXIT_UNKNOWN
    except BrokenPipeError:
        return 0
    return finish(code)


if __name__ == "__main__":
    sys.exit(main())
