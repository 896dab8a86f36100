"""`dcgmi diag -r N` output: the JSON of `-j` (DCGM 2.x/3.x "DCGM GPU Diagnostic", 4.x "DCGM
Diagnostic" with a test_summary per test) and the text table (3.x "Pass - GPU: 1" lines, 4.x
"GPU0: Pass" lines). Samples: tests/captures/diag/dcgm-*.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Optional, Tuple

from ..core.lazyre import lazy_compile
from ..core.structs import Struct, field
from . import ParseError

# worst first: a test is as bad as its worst GPU
ORDER = ("fail", "warn", "notrun", "pass", "skip")
_STATUS_WORDS = {
    "pass": "pass",
    "fail": "fail",
    "warn": "warn",
    "warning": "warn",
    "skip": "skip",
    "not run": "notrun",
    "not_run": "notrun",
    "notrun": "notrun",
}


class DiagTest(Struct, frozen=False):
    category: str
    name: str
    status: str  # one of ORDER
    gpus: Dict[int, str] = field(default_factory=dict)  # GPU index -> status, where DCGM says
    messages: List[str] = field(default_factory=list)


class DiagReport(Struct, frozen=False):
    form: str  # "json" or "text"
    version: Optional[str] = None
    tests: List[DiagTest] = field(default_factory=list)

    def failed(self) -> List[DiagTest]:
        return [t for t in self.tests if t.status == "fail"]

    def ran(self) -> List[DiagTest]:
        return [t for t in self.tests if t.status not in ("skip", "notrun")]


def status_word(text: str) -> Optional[str]:
    return _STATUS_WORDS.get(text.strip().lower())


def worst(statuses) -> str:
    found = [s for s in statuses if s in ORDER]
    return min(found, key=ORDER.index) if found else "skip"


def parse(text: str) -> DiagReport:
    """The report of either form; ParseError when the output holds neither (an error message)."""
    start, end = text.find("{"), text.rfind("}")
    if start != -1 and end > start and '"test_categories"' in text[start : end + 1]:
        return parse_json(text[start : end + 1])
    return parse_text(text)


def parse_json(text: str) -> DiagReport:
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: "[[[[..." nested past the stack
        raise ParseError("dcgmi JSON does not parse: %s" % type(exc).__name__) from None
    if not isinstance(doc, dict):
        raise ParseError("dcgmi JSON is not an object")
    body = doc.get("DCGM Diagnostic") or doc.get("DCGM GPU Diagnostic")
    if not isinstance(body, dict) or not isinstance(body.get("test_categories"), list):
        raise ParseError(
            "dcgmi JSON has no 'DCGM Diagnostic' or 'DCGM GPU Diagnostic' test_categories"
        )
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    version = meta.get("version") or body.get("version")
    report = DiagReport("json", str(version) if version else None)
    for category in body["test_categories"]:
        if not isinstance(category, dict):
            raise ParseError("dcgmi JSON: a test category is not an object")
        for test in category.get("tests") or []:
            report.tests.append(_json_test(str(category.get("category", "")), test))
    return report


def _json_test(category: str, test: Any) -> DiagTest:
    if not isinstance(test, dict) or not isinstance(test.get("name"), str):
        raise ParseError("dcgmi JSON: a test without a name in category %r" % category)
    out = DiagTest(category, test["name"], "skip")
    statuses = []
    for result in test.get("results") or []:
        if not isinstance(result, dict):
            continue
        status = status_word(str(result.get("status", "")))
        if status is None:
            raise ParseError(
                "dcgmi JSON: test %r has status %r" % (test["name"], result.get("status"))
            )
        statuses.append(status)
        for gpu in _json_gpus(result):
            out.gpus[gpu] = worst([out.gpus.get(gpu, "skip"), status])
        for warning in result.get("warnings") or []:
            message = warning.get("warning") if isinstance(warning, dict) else warning
            if message:
                out.messages.append(str(message))
    summary = test.get("test_summary")
    if isinstance(summary, dict) and status_word(str(summary.get("status", ""))):
        statuses.append(status_word(str(summary["status"])))
    out.status = worst(statuses)
    return out


def _json_gpus(result: Dict[str, Any]) -> List[int]:
    if "entity_id" in result and result.get("entity_group", "GPU") == "GPU":
        try:
            return [int(result["entity_id"])]
        except (TypeError, ValueError):
            return []
    ids = str(result.get("gpu_ids", ""))
    return [int(i) for i in re.findall(r"\d+", ids)]


_CATEGORY = lazy_compile(r"^[|+]-+\s+([A-Za-z][A-Za-z ]*?)\s+-+[+|]")
_GPU_3X = lazy_compile(r"^(Pass|Fail|Warn|Skip)\s*-\s*GPU:\s*(\d+)$", re.I)
_GPU_4X = lazy_compile(r"^GPU\s*(\d+):\s*(Pass|Fail|Warn|Skip|Not Run)$", re.I)
_NOTE_ROWS = ("warning", "info", "error")


def parse_text(text: str) -> DiagReport:
    report = DiagReport("text")
    category, current, note = "", None, None  # note: the message being continued
    seen_table = False
    for line in text.splitlines():
        line = line.rstrip()
        match = _CATEGORY.match(line)
        if match:
            category, current, note, seen_table = match.group(1).strip(), None, None, True
            continue
        cells = _cells(line)
        if cells is None:
            continue
        seen_table = True
        left, right = cells
        if left.lower() in ("diagnostic",) and right.lower() == "result":
            continue
        if category.lower() == "metadata":
            if left.lower() == "dcgm version":
                report.version = right
            continue
        if left and left.lower() not in _NOTE_ROWS:
            status, gpu = _right_status(right)
            current = DiagTest(category, left, status or "skip")
            if gpu is not None:
                current.gpus[gpu] = status
            if status is None:
                raise ParseError("dcgmi table: test %r has result %r" % (left, right))
            report.tests.append(current)
            note = None
            continue
        if left:  # a Warning/Info row of the current test
            note = [right]
            if current is not None and left.lower() != "info":
                current.messages.append(right)
            continue
        status, gpu = _right_status(right)
        if status is not None and gpu is not None and current is not None:
            current.gpus[gpu] = status
            current.status = worst([current.status, status])
        elif (
            note is not None
            and current is not None
            and current.messages
            and note[0] is current.messages[-1]
        ):
            current.messages[-1] = current.messages[-1] + right
            note = [current.messages[-1]]
    if not seen_table or (not report.tests and report.version is None):
        raise ParseError("no DCGM diagnostic table or JSON in the output")
    return report


def _cells(line: str) -> Optional[Tuple[str, str]]:
    if not line.startswith("|") or not line.endswith("|") or set(line) <= set("|=+-"):
        return None
    parts = line.split("|")
    if len(parts) != 4:
        return None
    return parts[1].strip(), parts[2].strip()


def _right_status(right: str) -> Tuple[Optional[str], Optional[int]]:
    match = _GPU_3X.match(right)
    if match:
        return status_word(match.group(1)), int(match.group(2))
    match = _GPU_4X.match(right)
    if match:
        return status_word(match.group(2)), int(match.group(1))
    return status_word(right), None
