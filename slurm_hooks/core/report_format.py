"""Rendering of a RunReport: an aligned human table and a stable JSON document (schema in README)."""

from __future__ import annotations

import os
from collections import Counter

from .. import __version__
from ..result import Status
from .runner import RunReport

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, TextIO

JSON_SCHEMA = "slurm-hooks.check/1"
_COLOURS = {
    Status.OK: "32",
    Status.WARN: "33",
    Status.FAIL: "31;1",
    Status.UNKNOWN: "35",
    Status.SKIP: "2",
}


def report_to_dict(report: RunReport, root: str = "/") -> Dict[str, Any]:
    job = report.job
    return {
        "schema": JSON_SCHEMA,
        "version": __version__,
        "context": report.context,
        "node": job.node_name or node_name(root),
        "root": root,
        "status": report.status.value,
        "exit_code": int(
            report.status.exit_code
        ),  # a plain number in the JSON document, whatever the Python
        "duration_s": round(report.duration, 4),
        "deadline_s": report.deadline,
        "deadline_hit": report.deadline_hit,
        "job": None
        if job.job_id is None
        else {
            "id": job.job_id,
            "user": job.user,
            "gpus": list(job.gpus) if job.gpus is not None else None,
        },
        "checks": [
            {
                "name": run.name,
                "status": run.status.value,
                "duration_s": round(run.duration, 4),
                "timed_out": run.timed_out,
                "results": [r.to_dict() for r in run.results],
            }
            for run in report.runs
        ],
    }


def node_name(root: str = "/") -> Optional[str]:
    """This machine's name; under a root other than /, the tree's /proc/sys/kernel/hostname (None if absent):
    the analysing machine's name would label a capture with the wrong node."""
    if os.path.abspath(root) == "/":
        return os.uname().nodename
    from ..hw.host import Host

    return (Host(root).read_text("/proc/sys/kernel/hostname", default="") or "").strip() or None


def write_json(report: RunReport, stream: TextIO, root: str = "/") -> None:
    import json  # only for --json: the table needs none of it

    json.dump(report_to_dict(report, root), stream, indent=2, sort_keys=False)
    stream.write("\n")


def use_colour(stream: TextIO) -> bool:
    return hasattr(stream, "isatty") and stream.isatty() and "NO_COLOR" not in os.environ


MAX_FINDING_LINES = 8  # further findings of one check under its row (all of them with -v)


def render_table(report: RunReport, verbose: bool = False, colour: bool = False) -> str:
    """One row per check; a check that did not pass names the component (GPU index and bus id, HCA
    port, NUMA node) and the action of its worst finding, and lists its other findings under it."""
    rows = [("STATUS", "CHECK", "TIME", "SUMMARY")]
    extra: Dict[int, List[str]] = {}
    for run in report.runs:
        head = run.headline()
        passed = run.status.severity <= Status.OK.severity
        rows.append(
            (
                run.status.value,
                run.name,
                _ms(run.duration),
                head.summary if passed else finding(head),
            )
        )
        if verbose:
            extra[len(rows) - 1] = _detail_lines(run)
        elif not passed:
            extra[len(rows) - 1] = _other_findings(run, head)
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = []
    for i, row in enumerate(rows):
        status = row[0].ljust(widths[0])
        if colour and i > 0:
            status = "\033[%sm%s\033[0m" % (_COLOURS[Status(row[0])], status)
        lines.append(
            "  ".join([status, row[1].ljust(widths[1]), row[2].rjust(widths[2]), row[3]]).rstrip()
        )
        lines.extend(extra.get(i, []))
    lines.append(_footer(report))
    return "\n".join(lines) + "\n"


def finding(result) -> str:
    """'gpu:2 0000:1c:00.0: 17 of 18 NVLinks active ... -> drain': where, what, and what to do."""
    text = result.summary
    if result.component:
        text = "%s: %s" % (result.component, text)
    if result.action.value != "none":
        text += " -> %s" % result.action.value
    return text


def _other_findings(run, head) -> List[str]:
    others = sorted(
        (r for r in run.results if r is not head and r.status.severity > Status.OK.severity),
        key=lambda r: -r.status.severity,
    )
    lines = ["    %-7s %s" % (r.status.value, finding(r)) for r in others[:MAX_FINDING_LINES]]
    if len(others) > MAX_FINDING_LINES:
        lines.append(
            "    ... and %d more (slurm-hooks check -v %s)"
            % (len(others) - MAX_FINDING_LINES, run.name)
        )
    return lines


def _detail_lines(run) -> List[str]:
    import json  # --verbose only

    lines = []
    for result in run.results:
        lines.append(
            "    %-7s %s"
            % (
                result.status.value,
                finding(result) if result.component else "node: " + finding(result),
            )
        )
        for key, value in result.details.items():
            if key == "traceback":
                continue
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            if "\n" in text:
                lines.append("        %s:" % key)
                lines.extend("          " + line for line in text.splitlines())
            else:
                lines.append("        %s: %s" % (key, text))
    return lines


def _footer(report: RunReport) -> str:
    counts = Counter(run.status for run in report.runs)
    parts = [
        "%d %s" % (counts[s], s.value)
        for s in (Status.FAIL, Status.UNKNOWN, Status.WARN, Status.OK, Status.SKIP)
        if counts[s]
    ]
    text = "overall: %s (%s) in %.3fs" % (
        report.status.value,
        ", ".join(parts) or "no checks",
        report.duration,
    )
    if report.deadline_hit:
        text += " -- deadline of %.3gs reached" % report.deadline
    return text


def _ms(seconds: float) -> str:
    return "%dms" % round(seconds * 1000) if seconds < 10 else "%.1fs" % seconds


def report_from_dict(data: Dict[str, Any]) -> RunReport:
    """Inverse of report_to_dict (the isolated check process sends its report as this JSON)."""
    from ..result import result_from_dict
    from .runner import CheckRun, JobContext

    job_data = data.get("job") or {}
    gpus = job_data.get("gpus")
    job = JobContext(
        job_id=job_data.get("id"),
        user=job_data.get("user"),
        node_name=data.get("node"),
        gpus=tuple(gpus) if gpus is not None else None,
    )
    runs = [
        CheckRun(
            run["name"],
            [result_from_dict(r) for r in run["results"]],
            run["duration_s"],
            run["timed_out"],
        )
        for run in data["checks"]
    ]
    return RunReport(
        data["context"], runs, data["duration_s"], data["deadline_s"], data["deadline_hit"], job
    )
