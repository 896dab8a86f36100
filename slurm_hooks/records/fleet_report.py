"""Fleet report over per-job records: which nodes keep hurting jobs, and what was wrong with one job.

Input: record files (schema slurm-hooks.job-record/1, docs/records.md) under the given paths, as
written by the epilog into <[records] dir>/<node>/<job>.json, possibly from thousands of nodes on a
shared file system. Records are streamed: each file is parsed, its "summary" folded into per-node
totals, and dropped, so memory grows with the number of nodes, not records. With --since, files
whose mtime is older are skipped without being opened (a record is written at the job's end).

Ranking: hard errors (Xids, SXids, uncorrectable ECC, row remaps, retired pages) first, then soft
errors (correctable ECC, NVLink, PCIe replays, InfiniBand), then GPU-seconds of throttling, then
leftover processes (build.rank_key). Records without a prolog snapshot have no deltas; they
are counted ("no_deltas") but add nothing to the error totals.
"""

from __future__ import annotations

import heapq
import json
import os
import time
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

from ..core.lazyre import lazy_compile
from ..core.structs import Struct, field
from .build import RECORD_SCHEMA, SUM_FIELDS, rank_key
from .header_check import header_problem
from .names import job_label
from .signing import UNSIGNED, VERIFIED, Verifier

WORST_JOBS = 3  # per node, the jobs to look at first
_RELATIVE = lazy_compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class ReportError(Exception):
    """Bad input to the report (an unparsable --since, a missing path); the message says which."""


class NodeTotals(Struct, frozen=False):
    node: str
    jobs: int = 0
    abnormal_jobs: int = 0
    no_deltas: int = 0
    drained: int = 0
    last_end: float = 0.0
    sums: Dict[str, float] = field(default_factory=lambda: dict.fromkeys(SUM_FIELDS, 0))
    reasons: Dict[str, int] = field(default_factory=dict)  # abnormal reason -> jobs
    sympathetic_xids: int = (
        0  # Xids of jobs another node's fault explains: not in sums (xid_lineup)
    )
    worst: List[Tuple[Tuple[float, ...], str]] = field(
        default_factory=list
    )  # min-heap of (rank, job id)

    def add(self, job_id: str, end: float, summary: Dict[str, Any]) -> None:
        self.jobs += 1
        self.last_end = max(self.last_end, end)
        for name in SUM_FIELDS:
            value = summary.get(name) or 0
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.sums[name] += value
        self.no_deltas += 0 if summary.get("deltas") else 1
        self.drained += 1 if summary.get("drained") else 0
        abnormal = summary.get("abnormal") or []
        if abnormal:
            self.abnormal_jobs += 1
            for reason in abnormal:
                self.reasons[reason] = self.reasons.get(reason, 0) + 1
            entry = (rank_key(summary) + (end,), job_id)
            if len(self.worst) < WORST_JOBS:
                heapq.heappush(self.worst, entry)
            else:
                heapq.heappushpop(self.worst, entry)

    def rank(self) -> Tuple[float, ...]:
        return rank_key(self.sums) + (self.abnormal_jobs,)

    def to_dict(self) -> Dict[str, Any]:
        sums = {k: round(v, 3) if isinstance(v, float) else v for k, v in self.sums.items()}
        return {
            "node": self.node,
            "jobs": self.jobs,
            "abnormal_jobs": self.abnormal_jobs,
            "no_deltas": self.no_deltas,
            "drained": self.drained,
            "last_end": self.last_end,
            "totals": sums,
            "reasons": dict(sorted(self.reasons.items())),
            "worst_jobs": [job for _, job in sorted(self.worst, reverse=True)],
            "sympathetic_xids": self.sympathetic_xids,
        }


class Fleet(Struct, frozen=False):
    nodes: Dict[str, NodeTotals] = field(default_factory=dict)
    records: int = 0
    skipped_old: int = 0
    unreadable: List[str] = field(default_factory=list)  # first few only
    unreadable_count: int = 0
    unverified: List[str] = field(
        default_factory=list
    )  # left out: no MAC, or a wrong one (first few)
    unverified_count: int = 0
    not_verified: str = "no records key given"  # "" when a key verified every record counted
    seconds: float = 0.0
    lineups: List[Any] = field(default_factory=list)  # xid_lineup.JobLineup, jobs with Xids

    def ranked(self) -> List[NodeTotals]:
        return sorted(self.nodes.values(), key=lambda n: (_descending(n.rank()), n.node))


# -- input ---------------------------------------------------------------------------------------


def parse_since(text: Optional[str], now: Optional[float] = None) -> Optional[float]:
    """'7d', '24h', '90m', '2024-05-01', '2024-05-01T12:00[:00]' (local time) or Unix seconds -> Unix time."""
    if text is None:
        return None
    now = time.time() if now is None else now
    value = text.strip()
    match = _RELATIVE.match(value)
    if match:
        return now - float(match.group(1)) * _UNIT_S[match.group(2)]
    for pattern in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%d"):
        try:
            return time.mktime(time.strptime(value, pattern))
        except ValueError:
            continue
    try:
        return float(value)
    except ValueError:
        raise ReportError(
            "--since %r: expected 7d, 24h, 90m, 2024-05-01, 2024-05-01T12:00 or Unix seconds" % text
        ) from None


def record_files(
    paths: Iterable[str], since: Optional[float] = None, fleet: Optional[Fleet] = None
) -> Iterator[str]:
    """Record files under paths (files, or directories walked recursively; dot files are temp files)."""
    for path in paths:
        if os.path.isfile(path):
            yield path
        elif os.path.isdir(path):
            yield from _walk(path, since, fleet)
        else:
            raise ReportError("%s: no such file or directory" % path)


def _walk(directory: str, since: Optional[float], fleet: Optional[Fleet]) -> Iterator[str]:
    stack = [directory]
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current) as entries:
                listing = list(entries)
        except OSError:
            continue
        for entry in sorted(listing, key=lambda e: e.name):
            if entry.name.startswith("."):
                continue
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
            elif entry.name.endswith(".json"):
                if since is not None:
                    try:
                        if entry.stat().st_mtime < since:
                            if fleet is not None:
                                fleet.skipped_old += 1
                            continue
                    except OSError:
                        continue
                yield entry.path


def read_header(path: str) -> Dict[str, Any]:
    """The record's first line (schema, job, node, times, summary: records.HEADER_KEYS), parsed alone;
    the whole record when the file is not laid out that way. Parsing ~0.5 KB instead of the whole
    record makes the report several times faster."""
    return read_head(path)[0]


def read_head(path: str) -> Tuple[Dict[str, Any], bytes]:
    """(read_header's answer, the first line it parsed: b"" when it read the whole record)."""
    try:
        with open(path, "rb") as handle:
            first = handle.readline(1 << 16)
            if first.endswith(b",\n"):
                try:
                    header = json.loads(first[:-2] + b"}")
                except (ValueError, RecursionError):  # RecursionError: JSON nested too deep
                    header = None
                if (
                    isinstance(header, dict)
                    and header.get("schema") == RECORD_SCHEMA
                    and "summary" in header
                ):
                    return header, first
    except OSError as exc:
        raise ValueError("%s: unreadable: %s" % (path, exc.strerror or exc)) from None
    return load_record(path), b""


def load_record(path: str) -> Dict[str, Any]:
    """One record; ValueError naming the file when it is not a slurm-hooks job record."""
    try:
        with open(path, "rb") as handle:
            data = json.loads(handle.read(16 << 20))
    except OSError as exc:
        raise ValueError("%s: unreadable: %s" % (path, exc.strerror or exc)) from None
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep to parse
        raise ValueError("%s: not JSON: %s" % (path, exc)) from None
    if not isinstance(data, dict) or data.get("schema") != RECORD_SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise ValueError("%s: schema %r, expected %r" % (path, found, RECORD_SCHEMA))
    if not isinstance(data.get("summary"), dict):
        raise ValueError("%s: no summary block" % path)
    return data


def checked_header(path: str) -> Tuple[Dict[str, Any], bytes]:
    """read_head, then header_problem: ValueError naming the file and the field."""
    record, line = read_head(path)
    problem = header_problem(record)
    if problem:
        raise ValueError("%s: %s" % (path, problem))
    return record, line


# -- aggregation ---------------------------------------------------------------------------------


def aggregate(
    paths: Iterable[str],
    since: Optional[float] = None,
    max_listed_errors: int = 10,
    verifier: Optional[Verifier] = None,
    xid_tolerance: float = 2.0,
) -> Fleet:
    """Per-node totals. verifier: the records key (signing.py); with one, records that do not verify
    are left out and named; without, every record counts and the fleet says it is unverified.
    Records with Xids are counted last, once their jobs are lined up (xid_lineup.py): a victim's
    Xids that another node's earlier fault explains are not counted against it."""
    fleet = Fleet()
    verifier = verifier or Verifier(None, "no records key given")
    fleet.not_verified = verifier.why_not
    started = time.monotonic()
    with_xids: List[Tuple[str, str, float, Dict[str, Any]]] = []
    for path in record_files(paths, since, fleet):
        try:
            record, line = checked_header(path)
        except ValueError as exc:
            fleet.unreadable_count += 1
            if len(fleet.unreadable) < max_listed_errors:
                fleet.unreadable.append(str(exc))
            continue
        status = verifier.line(line, path)
        if verifier.key is not None and status != VERIFIED:
            fleet.unverified_count += 1
            if len(fleet.unverified) < max_listed_errors:
                fleet.unverified.append("%s: %s" % (path, status))
            continue
        end = record.get("end") or 0.0
        if since is not None and end < since:
            fleet.skipped_old += 1
            continue
        node = str(record.get("node") or os.path.basename(os.path.dirname(path)))
        fleet.records += 1
        if record["summary"].get("xids"):
            with_xids.append((job_label(record.get("job")), node, end, record["summary"]))
            continue
        _totals(fleet, node).add(job_label(record.get("job")), end, record["summary"])
    _add_lined_up(fleet, with_xids, xid_tolerance, verifier.key is not None)
    fleet.seconds = time.monotonic() - started
    return fleet


def _totals(fleet: Fleet, node: str) -> NodeTotals:
    totals = fleet.nodes.get(node)
    if totals is None:
        totals = fleet.nodes[node] = NodeTotals(node)
    return totals


def _add_lined_up(
    fleet: Fleet,
    rows: List[Tuple[str, str, float, Dict[str, Any]]],
    tolerance: float,
    trusted: bool,
) -> None:
    """Count the records with Xids, less what their job's line-up excuses (xid_lineup.py)."""
    from . import xid_lineup

    fleet.lineups = xid_lineup.line_up_all(((j, n, s) for j, n, _e, s in rows), tolerance, trusted)
    excused = {(j.job, node): count for j in fleet.lineups for node, count in j.excused.items()}
    for job, node, end, summary in rows:
        count = excused.pop((job, node), 0)  # once: a node's copy of the same record counts whole
        totals = _totals(fleet, node)
        totals.add(job, end, xid_lineup.excused_summary(summary, count))
        totals.sympathetic_xids += count


def job_view(
    paths: List[str], job_id: str, verifier: Optional[Verifier] = None
) -> Tuple[List[Dict[str, Any]], List[str]]:
    """(one row per record of the job: node and run, problems): the job's records found directly, no
    full walk. Each row says whether the records key verified it ("verified")."""
    from .store import find_records

    directories = [p for p in paths if os.path.isdir(p)]
    rows, problems = [], []
    for path in find_records(directories, job_id):
        try:
            record, line = checked_header(path)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        summary = record["summary"]
        status = verifier.line(line, path) if verifier is not None else UNSIGNED
        rows.append(
            {
                "node": record.get("node"),
                "job": job_label(record.get("job")),
                "path": path,
                "verified": status if verifier is not None and verifier.key else "no key",
                "abnormal": summary.get("abnormal") or [],
                "prolog_snapshot": record.get("prolog_snapshot"),
                "duration_s": record.get("duration_s"),
                "summary": summary,
            }
        )
    rows.sort(key=lambda r: (_descending(rank_key(r["summary"])), r["node"] or ""))
    return rows, problems


def _descending(key: Tuple[float, ...]) -> Tuple[float, ...]:
    return tuple(-value for value in key)


# What the report prints lives in fleet_output.py; its names stay reachable here for the verbs and
# tests that read them from the report.
from .fleet_output import fleet_to_dict, render_fleet, render_job  # noqa: E402

__all__ = [
    "Fleet",
    "ReportError",
    "aggregate",
    "fleet_to_dict",
    "job_view",
    "render_fleet",
    "render_job",
]
