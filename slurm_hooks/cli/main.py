"""Command line front end: argument parsing and dispatch only; the work lives in the library.

Each group of verbs lives in its own module (VERB_MODULES) exposing add_parsers(subparsers), which
sets `handler` on each parser. Handlers import what they need lazily, so `slurm-hooks prolog`
pays only for what it uses (start-up time is the prolog's cost floor).
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
from types import SimpleNamespace

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    import argparse
    from typing import Dict, List, Optional

VERB_MODULES = (
    "slurm_hooks.cli.check_verbs",
    "slurm_hooks.cli.xid_verbs",
    "slurm_hooks.cli.hook_verbs",
    "slurm_hooks.cli.record_verbs",
    "slurm_hooks.cli.mode_verbs",
    "slurm_hooks.cli.qualify_verbs",
)


# Which module adds each verb (tests/test_cli_verbs.py compares it with the parsers the modules add):
# an admin verb builds only its own module's parsers. Building all six (21 parsers, their imports,
# and argparse's gettext look-up for each message) was ~25 ms of `slurm-hooks check system`, twice
# what its checks take. Help, a bare command line and an unknown verb still build them all.
VERB_OWNERS = {
    "check": "slurm_hooks.cli.check_verbs",
    "capture": "slurm_hooks.cli.check_verbs",
    "baseline": "slurm_hooks.cli.check_verbs",
    "list": "slurm_hooks.cli.check_verbs",
    "config": "slurm_hooks.cli.check_verbs",
    "explain": "slurm_hooks.cli.xid_verbs",
    "xid": "slurm_hooks.cli.xid_verbs",
    "prolog": "slurm_hooks.cli.hook_verbs",
    "epilog": "slurm_hooks.cli.hook_verbs",
    "health": "slurm_hooks.cli.hook_verbs",
    "drain": "slurm_hooks.cli.hook_verbs",
    "resume": "slurm_hooks.cli.hook_verbs",
    "status": "slurm_hooks.cli.hook_verbs",
    "record": "slurm_hooks.cli.record_verbs",
    "report": "slurm_hooks.cli.record_verbs",
    "mode": "slurm_hooks.cli.mode_verbs",
    "qualify": "slurm_hooks.cli.qualify_verbs",
}


def verb_of(argv: List[str]) -> Optional[str]:
    """The verb of a command line (the first word after the global options), or None."""
    words = list(argv)
    while words:
        word = words.pop(0)
        if word == "--config":
            if words:
                words.pop(0)
            continue
        if word.startswith("--config="):
            continue
        return None if word.startswith("-") else word
    return None


def build_parser(verb: Optional[str] = None) -> argparse.ArgumentParser:
    """The command line parser; with a known verb, only the parsers of the module that adds it."""
    from .. import __version__
    from .parser import Parser

    parser = Parser(
        prog="slurm-hooks", description="GPU node checks for Slurm prolog/epilog/health and admins."
    )
    parser.add_argument("--version", action="version", version="slurm-hooks " + __version__)
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="config file (default /etc/slurm-hooks/config.toml plus conf.d/*.toml beside it)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    owner = VERB_OWNERS.get(verb or "")
    for name in (owner,) if owner else VERB_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:  # a verb group not present in this build
            if exc.name != name:
                raise
            continue
        module.add_parsers(sub)
    return parser


_GLOBAL_OPTIONS = ("--config",)
_HOOK_OPTIONS = ("--root", "--node")


def parse_hook_args(argv: List[str]) -> Optional[Dict[str, Optional[str]]]:
    """`[--config FILE] prolog|epilog|health [--root DIR] [--node NAME]` parsed without argparse.

    slurmd runs these before/after every job, and argparse (with the shutil, gettext and locale it
    pulls in) costs a few ms of every prolog. Anything else, help and mistakes included, returns
    None and goes through the full parser, which also gives the error messages.
    """
    from ..registry import HOOK_CONTEXTS  # here, not at the top: run() turns gc off first

    values: Dict[str, Optional[str]] = {"config": None, "context": None, "root": None, "node": None}
    words = list(argv)
    while words:
        word = words.pop(0)
        name, eq, value = word.partition("=")
        allowed = _HOOK_OPTIONS if values["context"] else _GLOBAL_OPTIONS
        if name in allowed:
            if not eq:
                if not words or words[0].startswith("-"):
                    return None
                value = words.pop(0)
            values[name[2:]] = value
        elif values["context"] is None and word in HOOK_CONTEXTS:
            values["context"] = word
        else:
            return None
    return values if values["context"] else None


_CHECK_FLAGS = {
    "--json": "json",
    "-v": "verbose",
    "--verbose": "verbose",
    "--all-contexts": "all_contexts",
}


def parse_check_args(argv: List[str]) -> Optional[SimpleNamespace]:
    """`[--config FILE] check [NAME...] [--json] [-v] [--all-contexts]` parsed without argparse.

    The form a cron job or a health-check wrapper runs every few minutes (`slurm-hooks check system`,
    NHC's place): argparse, its gettext and locale and the parsers of the verb cost ~8 ms of a
    ~50 ms run. The result has every attribute the full parser gives (tests/test_cli_verbs.py
    compares them); anything else (--context, --root, --deadline, --live, help, abbreviations, a
    mistake) returns None and goes through argparse, which also words the errors.
    """
    words = list(argv)
    config = None
    while words and words[0].startswith("--config"):
        name, eq, value = words.pop(0).partition("=")
        if name != "--config":
            return None
        if not eq:
            if not words or words[0].startswith("-"):
                return None
            value = words.pop(0)
        config = value
    if not words or words.pop(0) != "check":
        return None
    values = dict(json=False, verbose=False, all_contexts=False)
    names = []
    for word in words:
        if word in _CHECK_FLAGS:
            values[_CHECK_FLAGS[word]] = True
        elif word.startswith("-") or not word:
            return None
        else:
            names.append(word)
    return SimpleNamespace(
        config=config,
        command="check",
        names=names,
        context="manual",
        root=None,
        deadline=None,
        live=[],
        **values,
    )


def run() -> None:
    """The console script's entry point (/usr/bin/slurm-hooks): main() on sys.argv, then exit.

    A hook verb leaves through os._exit once its logs and std streams are flushed: interpreter
    teardown (finalizing every module and object) cost ~6 ms of each prolog on 2 cores (8 %,
    bench/results.md), and a hook has nothing left to clean up: its check process is reaped, its
    files are written and closed. So does `check` in its cron form (parse_check_args: it printed its
    report, writes no file, and NVML needs no nvmlShutdown at exit: the driver releases a process's
    handles when it ends). Other admin verbs exit normally.
    """
    # No cyclic garbage collection in a hook's processes (the forked ones inherit it): a run lasts a
    # fraction of a second and its few cycles go with the process, while the collector traversed
    # the heap ~40 times per prolog (~5 ms on 2 cores, parent and check process). Off before the
    # package's first import (this module imports none at its top): the imports that decide what
    # the command line is made 4 more collections (~0.8 ms); an admin verb turns it back on.
    gc.disable()
    argv = sys.argv[1:]
    short_lived = parse_hook_args(argv) is not None or parse_check_args(argv) is not None
    if not short_lived:
        gc.enable()
    code = main(argv)
    if not short_lived:
        sys.exit(code)
    _exit_now(code)


def _exit_now(code: int) -> None:
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()  # flush and close the decision log's handlers
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (
            OSError,
            ValueError,
        ):  # slurmd closed the pipe, or the stream is closed: nothing to keep
            pass
    os._exit(code)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    hook_args = parse_hook_args(argv)
    if hook_args is not None:
        from .hook_verbs import cmd_hook

        return _finish(cmd_hook, SimpleNamespace(**hook_args))
    check_args = parse_check_args(argv)
    if check_args is not None:
        from .check_verbs import cmd_check

        check_args.handler = cmd_check
        return _finish(cmd_check, check_args)
    parser = build_parser(verb_of(argv))
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        from ..result import ExitCode

        parser.print_help()
        return ExitCode.UNKNOWN
    return _finish(handler, args)


def _finish(
    handler, args
) -> int:  # args: argparse.Namespace, or a SimpleNamespace from parse_hook_args
    from ..core.config import ConfigError
    from ..result import ExitCode
    from .check_verbs import finish

    try:
        code = handler(args)
    except ConfigError as exc:
        print("slurm-hooks: configuration error: %s" % exc, file=sys.stderr)
        return ExitCode.UNKNOWN
    except BrokenPipeError:
        return ExitCode.OK
    return finish(code)


if __name__ == "__main__":
    run()
