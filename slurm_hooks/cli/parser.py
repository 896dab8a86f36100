"""The argparse pieces of the command line, kept apart from main.py so the prolog never imports argparse.

argparse brings shutil, gettext and locale with it (a few ms); `slurm-hooks prolog|epilog|health`
parse their few options by hand (cli.parse_hook_args) and only the admin verbs build parsers.
"""

from __future__ import annotations

import argparse
import sys
from typing import Dict

from ..result import ExitCode

_translated: Dict[str, str] = {}
_gettext = argparse._


def _remembered_gettext(message: str) -> str:
    """argparse's gettext, asked once per message. gettext finds no catalogue for argparse's messages
    on most nodes and does not remember that, so each of the ~25 messages met while building one
    verb's parsers re-read the locale variables and stat()ed the catalogue paths again (~3 ms of
    every admin verb). The translation is the same for the life of the process."""
    found = _translated.get(message)
    if found is None:
        found = _translated[message] = _gettext(message)
    return found


argparse._ = _remembered_gettext  # type: ignore[attr-defined]  # argparse's own `from gettext import gettext as _`


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would exit 2, which means FAIL to Nagios
        self.print_usage(sys.stderr)
        self.exit(ExitCode.UNKNOWN, "%s: error: %s\n" % (self.prog, message))

    def _get_formatter(self) -> argparse.HelpFormatter:
        # argparse sizes its formatter with shutil.get_terminal_size, and shutil imports bz2, lzma
        # and zlib (~2.5 ms of every admin verb, which builds a formatter for each subparser's prog
        # whether or not help is printed): the same width, found the way shutil finds it
        return self.formatter_class(prog=self.prog, width=terminal_width() - 2)


def terminal_width() -> int:
    """$COLUMNS, else the terminal of stdout, else 80: what shutil.get_terminal_size(...).columns gives."""
    import os

    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by every verb that runs checks."""
    parser.add_argument(
        "--json", action="store_true", help="print JSON (schema slurm-hooks.check/1)"
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show every result with its details"
    )
    parser.add_argument(
        "--root", metavar="DIR", help="read /sys, /proc, /dev under DIR (a captured or fake tree)"
    )
    parser.add_argument(
        "--deadline",
        type=deadline_seconds,
        metavar="SECONDS",
        help="override the run's global deadline (0 < SECONDS <= 3600)",
    )


def deadline_seconds(text: str) -> float:
    """--deadline: a finite number of seconds in (0, 3600]; anything else is a usage error (exit 3)."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number of seconds" % text) from None
    if not math.isfinite(value) or not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(
            "%r: the deadline must be a finite number of seconds, > 0 and <= 3600" % text
        )
    return value
