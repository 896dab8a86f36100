"""What in a record's header the reports can use: every reader checks a record before it reads it.

A record file sits on a shared file system and may come from an older or newer version or a
writer's bug; whatever its shape, a reader counts it unreadable and names the file and the field
(tests/test_record_readers.py puts hostile JSON in every field position and runs every reader).
"""

from __future__ import annotations

import json
from typing import Any, Dict, Optional

from .build import ERROR_FIELDS

NUMBER_FIELDS = ERROR_FIELDS + (
    "xids",
    "sxids",
    "throttle_s",
    "leftover_processes",
    "energy_j",
    "leftover_memory_bytes",
)
LARGEST = float(1 << 53)  # a count or a time beyond this is a writer's bug, not a measurement


def number(value: Any) -> bool:
    """A finite JSON number a report can add and print (not a bool, not NaN, not 1e400)."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and -LARGEST <= value <= LARGEST  # False for NaN
    )


def header_problem(record: Dict[str, Any]) -> Optional[str]:
    """What in a record's header the reports cannot use ("summary.xids is 'x', not a number"), or
    None. Every reader checks this first: a record of any shape is counted unreadable and named,
    never a traceback (the file system is shared; writers have bugs; versions differ)."""
    job = record.get("job")
    if job is not None and not isinstance(job, dict):
        return "job is %s, not an object" % _shown(job)
    for where, key, value in (
        ("job.", "id", (job or {}).get("id")),
        ("", "node", record.get("node")),
    ):
        if value is not None and not isinstance(value, str):
            return "%s%s is %s, not a string" % (where, key, _shown(value))
    for key in ("start", "end", "duration_s"):
        if record.get(key) is not None and not number(record[key]):
            return "%s is %s, not a time" % (key, _shown(record[key]))
    summary = record.get("summary")
    if not isinstance(summary, dict):
        return "its summary is %s, not an object" % _shown(summary)
    for key in NUMBER_FIELDS:
        if summary.get(key) is not None and not number(summary[key]):
            return "summary.%s is %s, not a number" % (key, _shown(summary[key]))
    abnormal = summary.get("abnormal")
    if abnormal is not None and not (
        isinstance(abnormal, list) and all(isinstance(a, str) for a in abnormal)
    ):
        return "summary.abnormal is %s, not a list of names" % _shown(abnormal)
    return None


def _shown(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
