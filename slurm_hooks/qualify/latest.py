"""Each node's latest qualification as `slurm-hooks report` (and `qualify --list`) shows it: level,
verdict, the failing test and its figure, when, and the record's path.

Input: the qualification records (record.py: <records dir>/<node>/<UTC time>.qualify), the newest
of each node written by a trusted uid (record.latest_by_node). Pure apart from that read.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Iterable, List, Optional, Set

from . import record


def rows(directories: Iterable[str], trusted: Optional[Set[int]] = None) -> List[Dict[str, Any]]:
    """One row per node, its newest record over all the directories (a node in two directories
    shows the newer run)."""
    newest: Dict[str, Dict[str, Any]] = {}
    for directory in directories:
        for node, (path, rec) in record.latest_by_node(directory, trusted).items():
            row = to_row(node, path, rec)
            if node not in newest or (row["started"] or 0) > (newest[node]["started"] or 0):
                newest[node] = row
    return [newest[node] for node in sorted(newest)]


def to_row(node: str, path: str, rec: Dict[str, Any]) -> Dict[str, Any]:
    started = rec.get("started")
    if isinstance(started, bool) or not isinstance(started, (int, float)):
        started = None
    failed = _first_failed(rec.get("tests"))
    return {
        "node": node,
        "level": _text(rec.get("level")),
        "class": _text(rec.get("class")),
        "verdict": _text(rec.get("verdict")) or "?",
        "failed_test": failed.get("name") if failed else None,
        "figure": failed.get("summary") if failed else None,
        "reason": _text(rec.get("reason")),
        "started": started,
        "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))
        if started is not None and 0 <= started < 1 << 36
        else None,
        "record": path,
    }


def needs_a_look(rows_: List[Dict[str, Any]]) -> bool:
    """A node whose latest qualification did not pass is a node to look at (report's FOUND)."""
    return any(row["verdict"] != "pass" for row in rows_)


def render(rows_: List[Dict[str, Any]]) -> List[str]:
    """The report's text section: a heading and one line per node (empty without records)."""
    if not rows_:
        return []
    lines = ["latest qualification of %d node(s) (docs/qualify.md):" % len(rows_)]
    for row in rows_:
        lines.append(
            "  %-20s %-20s %-8s %-13s %s"
            % (
                row["node"],
                row["when_utc"] or "?",
                row["level"] or "?",
                row["verdict"].upper(),
                "%s: %s" % (row["failed_test"], row["figure"])
                if row["failed_test"]
                else row["reason"] or "",
            )
        )
        lines.append("      record: %s" % row["record"])
    return lines


def _first_failed(tests: Any) -> Optional[Dict[str, Any]]:
    if not isinstance(tests, list):
        return None
    for test in tests:
        if isinstance(test, dict) and test.get("status") == "FAIL":
            return {"name": _text(test.get("name")), "summary": _text(test.get("summary"))}
    return None


def _text(value: Any) -> str:
    """A record's field as one printable line: records are ours, but a field of another type or a
    newline must not break the report's layout."""
    if value is None:
        return ""
    return " ".join(str(value).split())[:500]
