"""What observe mode would have drained, read back from the decision log.

In observe mode (`[general] mode = "observe"`, the shipped default) the hooks decide as in enforce
mode but drain nothing: the drain library answers `outcome=observe` with "observe mode: would drain
NODE: REASON" (slurm/drainer.py), and hooks/decision_log.py writes that as one key=value decision line (core/logs.py)
to [paths] log_file (default /var/log/slurm-hooks/slurm-hooks.log, rotated weekly by logrotate into
.1 and .N.gz) and to syslog/journald. `report --stragglers --drain` on an admin host writes the same
outcome with `context=fleet event=straggler-drain`. This module finds those lines in the log and its
rotations (or in files given, e.g. `journalctl -t slurm-hooks _UID=0 -o short-iso` output gathered
from every node: without _UID=0 a user's `logger -t slurm-hooks` line would read as a decision), so an admin sees what enforce mode would have done before switching to it.
"""

from __future__ import annotations

import glob
import gzip
import os
import re
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from .lazyre import lazy_compile
from .structs import Struct

MAX_LOG_BYTES = 256 << 20  # one (uncompressed) log file read at most: a log is weeks of decisions
_FIELD = lazy_compile(r'(?:^|\s)([a-z_]+)=("[^"]*"|\S*)')
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class Observed(Struct):
    time: str  # the line's own time stamp, as the log wrote it (local time of the writing host)
    node: str
    context: str  # prolog, epilog, health, fleet
    job: str
    check: str  # the first check behind the decision (fleet: the straggler figure)
    reason: str  # the drain reason enforce mode would have set
    source: str  # file:line


def log_files(log_file: str) -> List[str]:
    """LOG_FILE and its logrotate rotations (LOG_FILE.1, LOG_FILE.2.gz, ...), oldest first."""

    def age(path: str) -> int:
        match = re.match(re.escape(log_file) + r"\.(\d+)(?:\.gz)?$", path)
        return int(match.group(1)) if match else 0

    rotated = [p for p in glob.glob(glob.escape(log_file) + ".*") if age(p)]
    current = [log_file] if os.path.exists(log_file) else []
    return sorted(rotated, key=age, reverse=True) + current


def parse_fields(line: str) -> Tuple[str, Dict[str, str]]:
    """(what precedes the first key=value: time stamp and level, the fields) of one decision line."""
    fields: Dict[str, str] = {}
    first: Optional[int] = None
    for match in _FIELD.finditer(line):
        if first is None:
            first = match.start()
        value = match.group(2)
        fields[match.group(1)] = value[1:-1] if value.startswith('"') else value
    head = line[:first].strip() if first is not None else line.strip()
    words = head.split()
    if words and words[-1].rstrip(":") in _LEVELS:
        words = words[:-1]
    return " ".join(words), fields


def observed_in(lines: Sequence[str], source: str) -> Iterator[Observed]:
    for number, line in enumerate(lines, 1):
        if "outcome=observe" not in line:
            continue
        head, fields = parse_fields(line)
        if fields.get("outcome") != "observe":
            continue
        stamp = head.split(",")[0]  # logging's "2026-12-03 15:46:39,123": the milliseconds go
        reason = fields.get("reason", "")
        detail = fields.get("detail", "")
        if not reason and "would drain" in detail:  # a fleet line carries the reason in its detail
            reason = detail.split(": ", 2)[-1]
        yield Observed(
            time=stamp,
            node=fields.get("node", "?"),
            context=fields.get("context", "?"),
            job=fields.get("job", ""),
            check=fields.get("check") or fields.get("metric", ""),
            reason=reason,
            source="%s:%d" % (source, number),
        )


def read_lines(path: str) -> List[str]:
    """The lines of a log file (gzip-compressed when it ends in .gz), undecodable bytes escaped.
    OSError (missing, permission denied) is the caller's to report."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as handle:
        data = handle.read(MAX_LOG_BYTES)
    return data.decode("utf-8", "backslashreplace").splitlines()


def collect(paths: Sequence[str]) -> Tuple[List[Observed], List[str]]:
    """(every would-drain decision in PATHS, in file order; problems, one per file not read)."""
    found: List[Observed] = []
    problems: List[str] = []
    for path in paths:
        try:
            lines = read_lines(path)
        except (OSError, EOFError) as exc:  # EOFError: a .gz cut short
            problems.append("%s: %s" % (path, getattr(exc, "strerror", None) or exc))
            continue
        found.extend(observed_in(lines, path))
    return found, problems
