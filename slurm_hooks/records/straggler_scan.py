"""`slurm-hooks report --stragglers`: stream the records' header lines, group them by job, score.

Input: <[records] dir>/<node>/<job>.json as written by each node's epilog (docs/records.md), on a
shared file system, read on an admin host. Records of one job are spread over the node
directories and written within seconds of each other (each node's epilog, at the job's end), in
any order. The files are listed with their mtimes, then read in mtime order, header line only
(fleet_report.read_header); a job's records are held until no more can arrive (SETTLE_S after its first
record), then it is scored (stragglers.score_rows) and dropped, and each node keeps only, per
figure, its last m jobs scored on it (stragglers.NodeWindow). Memory: the file listing, the jobs
still open, and nodes x figures x m marks at worst; no record is kept once folded.

Whose records count: the node's name is its directory's name, and a record naming another node is
skipped. A node directory, and each record in it, must belong to root, to the owner of the
records directory, or to a uid of [fleet] trusted_writers (65534 by default: NFS root_squash):
a user who can create a directory in a shared records directory cannot plant records for someone
else's node (that could get it drained). The report names the directories it did not read.
Ownership cannot tell a node's root from any process of uid 65534, though: with the records key
(signing.py) a record counts only when its MAC verifies for its node directory and file name; the
others are left out, counted and named. Without a key every record is read, the result says so,
and nothing may be drained on it (cli/straggler_verbs.py).
"""

from __future__ import annotations

import collections
import json
import os
import stat
import time
from typing import Any, Deque, Dict, Iterable, Iterator, List, Optional, Set, Tuple

from ..core.structs import Struct, field
from . import (
    blind_spots,
    rate_test,
    signing,
    slowness,
    stall_bounds,
    stragglers,
    topology_groups,
)
from .build import RECORD_SCHEMA
from .names import job_label

SETTLE_S = 900.0  # a job's records are all written within this long of its first one (epilogs end together)
NOBODY_UID = 65534  # NFS root_squash's default anonuid: who root's writes belong to there
MAX_LISTED_ERRORS = 10


class ScanError(Exception):
    """A path that is not there (the message names it)."""


class OpenJob(Struct, frozen=False):
    job_id: str
    first_seen: float
    # node -> (figures_row, start, end, user, boot id, hardware class)
    entries: Dict[str, Tuple[Any, ...]] = field(default_factory=dict)


class StragglerScan(Struct, frozen=False):
    """What one pass found: each node's window, and counts of what was read and what was skipped."""

    k: int
    m: int
    threshold: float
    min_nodes: int
    windows: Dict[str, stragglers.NodeWindow] = field(default_factory=dict)
    records: int = 0  # header lines read
    jobs_scored: int = 0
    node_jobs: int = 0  # (node, job) pairs scored
    skipped: Dict[str, int] = field(
        default_factory=dict
    )  # why a record or job was not scored -> count
    unreadable: List[str] = field(default_factory=list)  # first few only
    unreadable_count: int = 0
    # node directories not read because of their owner (first few): a user squatting a node's name
    other_owner_dirs: List[str] = field(default_factory=list)
    # records left out because they did not verify with the records key (signing.py), first few
    unverified: List[str] = field(default_factory=list)
    unverified_count: int = 0
    # why the records could not be verified at all ("" when a key verified them): then every record
    # is read, the report says so, and nothing may be drained on it
    not_verified: str = "no records key given"
    seconds: float = 0.0
    max_open_jobs: int = (
        0  # the most jobs held at once (streaming: jobs ending within SETTLE_S of each other)
    )
    blind: blind_spots.BlindSpots = field(default_factory=blind_spots.BlindSpots)
    leaf_of: Optional[Dict[str, str]] = None  # node -> leaf switch ([fleet] topology_conf)
    rates: rate_test.FlagRates = field(default_factory=rate_test.FlagRates)
    grouped: Optional[Tuple[Any, ...]] = (
        None  # _grouped, (leaf_of, _grouped()) once the scan is done
    )

    def skip(self, why: str, count: int = 1) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + count

    def name_other(self, what: str) -> None:
        if len(self.other_owner_dirs) < MAX_LISTED_ERRORS:
            self.other_owner_dirs.append(what)

    def left_unverified(self, why: str) -> None:
        self.unverified_count += 1
        if len(self.unverified) < MAX_LISTED_ERRORS:
            self.unverified.append(why)

    def cannot_read(self, why: str) -> None:
        self.unreadable_count += 1
        if len(self.unreadable) < MAX_LISTED_ERRORS:
            self.unreadable.append(why)

    def before_reboot(self) -> int:
        """Flags set aside because the node rebooted and then ran clean (NodeWindow)."""
        return sum(window.before_reboot for window in self.windows.values())

    def stale_boot(self) -> int:
        """Node-jobs not counted: they ended in a boot their node had already left (NodeWindow)."""
        return sum(window.stale for window in self.windows.values())

    def suspects(self) -> List[stragglers.Suspect]:
        """The node suspects; those concentrated under one leaf switch are the switch's (switches)."""
        return self._grouped()[0]

    def switches(self) -> List[topology_groups.SwitchSuspect]:
        return self._grouped()[1]

    def saturating(self) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
        """(nodes whose counter saturates far more often than the fleet's, leaf switches where such
        nodes concentrate): blind_spots.saturating, grouped like the suspects."""
        rows = blind_spots.saturating(self.blind, self.windows)
        return topology_groups.group_rows(rows, self.windows, self.leaf_of)

    def rate_suspects(self) -> List[stragglers.Suspect]:
        """The suspects (node suspects, drained like them) found by the rate test (rate_test): a
        node flagged far more often than the fleet over the whole window, not a k-of-m suspect."""
        return [s for s in self.suspects() if s.basis == "rate"]

    def odd_not_slow(self) -> List[stragglers.Suspect]:
        """Would-be suspects whose flags cost their jobs nothing (slowness.costly): reported, never
        a suspect (a leaky GPU at its power cap while the node runs at full power)."""
        return self._grouped()[3]

    def under_switch(self) -> List[stragglers.Suspect]:
        """Node suspects under a leaf already suspected on their figure: the switch's, not drained."""
        return self._grouped()[2]

    def _grouped(
        self,
    ) -> Tuple[
        List[stragglers.Suspect],
        List[topology_groups.SwitchSuspect],
        List[stragglers.Suspect],
        List[stragglers.Suspect],
    ]:
        """(node suspects by cost, switch suspects, suspects under a suspect switch, odd but not
        slow). Computed once per pass: windows do not change after the scan."""
        if self.grouped is not None and self.grouped[0] is self.leaf_of:
            return self.grouped[1]
        found = [s for window in self.windows.values() for s in window.suspects(self.k)]
        explained: Dict[str, List[str]] = {}  # figure -> nodes under a leaf suspected on it
        leaves = [
            (w.switch, w.metric)
            for w in topology_groups.blame(found, self.windows, self.leaf_of)[1]
        ]
        leaves += [(row["switch"], row["metric"]) for row in self.saturating()[1]]
        for name, metric in leaves:
            explained.setdefault(metric, []).extend(
                n for n, leaf in (self.leaf_of or {}).items() if leaf == name
            )
        found += self.rates.suspects(self.k, found, windows=self.windows, explained=explained)
        costly = {id(s) for s in found if slowness.costly(s, self.rates.flags_of(s.node, s.metric))}
        odd = [s for s in found if id(s) not in costly]
        found = [s for s in found if id(s) in costly]
        found.sort(key=_by_cost)
        kept, switches = topology_groups.blame(found, self.windows, self.leaf_of)
        leaves = topology_groups.suspect_leaves(switches, self.saturating()[1])
        kept, under = topology_groups.split_under(kept, self.leaf_of, leaves)
        self.grouped = (self.leaf_of, (kept, switches, under, odd))  # again if leaf_of is set
        return kept, switches, under, odd


_by_cost = stragglers.by_cost  # suspects ordered by what they cost their jobs (issue 30)


# -- listing -------------------------------------------------------------------------------------


def trusted_uids(names: Iterable[str]) -> Set[int]:
    """[fleet] trusted_writers -> uids (a name through the admin host's passwd, or a number).
    ScanError naming the setting for a user this host does not know."""
    import pwd

    uids = {0}
    for name in names:
        if name.isdigit():
            uids.add(int(name))
            continue
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            raise ScanError(
                "[fleet] trusted_writers: no user %r on this host (a user name or a uid)" % name
            ) from None
    return uids


def list_records(
    paths: Iterable[str],
    since: Optional[float],
    scan: StragglerScan,
    writers: Optional[Set[int]] = None,
) -> List[Tuple[float, str, str]]:
    """(mtime, node, path) of every record to read, oldest first. A PATH is a records directory
    (its subdirectories are node directories), a node directory, or one record file. writers: the
    uids trusted besides the directory's owner (trusted_uids; default root and 65534)."""
    writers = {0, NOBODY_UID} if writers is None else writers
    found: List[Tuple[float, str, str]] = []
    for path in paths:
        try:
            info = os.stat(path)
        except OSError:
            raise ScanError("%s: no such file or directory" % path) from None
        if os.path.isfile(path):
            found.append(
                (info.st_mtime, os.path.basename(os.path.dirname(os.path.abspath(path))), path)
            )
            continue
        trusted = writers | {info.st_uid}
        parent = os.stat(os.path.dirname(os.path.abspath(path)) or "/").st_uid
        _node_dir(
            path,
            os.path.basename(os.path.abspath(path)),
            info.st_uid,
            trusted | {parent},
            since,
            scan,
            found,
        )
        for entry in _entries(path, scan):
            if entry.name.startswith("."):
                continue
            entry_info = _lstat(entry, scan)  # one lstat, not is_dir(): that one can raise too
            if entry_info is None:
                continue
            owner = entry_info.st_uid
            if stat.S_ISLNK(entry_info.st_mode):  # a node's name taken by a link: a squatter
                scan.skip("symlink where a node directory would be")
                scan.name_other("%s (a symlink, uid %d)" % (entry.name, owner))
                continue
            if not stat.S_ISDIR(entry_info.st_mode):
                continue
            if owner not in trusted:
                scan.skip("node directory of another owner")
                scan.name_other("%s (uid %d)" % (entry.name, owner))
                continue
            _node_dir(entry.path, entry.name, owner, trusted, since, scan, found)
    found.sort()
    return found


def _node_dir(
    directory: str,
    node: str,
    owner: int,
    trusted: set,
    since: Optional[float],
    scan: StragglerScan,
    found: List[Tuple[float, str, str]],
) -> None:
    """The records directly in `directory` (node directory `node`, owned by `owner`)."""
    if owner not in trusted:
        return
    for entry in _entries(directory, scan):
        if entry.name.startswith(".") or not entry.name.endswith(".json"):
            continue
        info = _lstat(entry, scan)
        if info is None or not stat.S_ISREG(info.st_mode):
            continue
        if info.st_uid != owner:
            scan.skip("record of another owner")
            continue
        if since is not None and info.st_mtime < since:
            scan.skip("older than the window")
            continue
        found.append((info.st_mtime, node, entry.path))


def _lstat(entry: os.DirEntry, scan: StragglerScan) -> Optional[os.stat_result]:
    """The entry's own stat; None when it is gone (removed since the listing: retention) or cannot
    be read (counted unreadable: a file server failing one node's files must not hide the node)."""
    try:
        return entry.stat(follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        scan.cannot_read("%s: %s" % (entry.path, exc.strerror or exc))
        return None


def _entries(directory: str, scan: StragglerScan) -> List[os.DirEntry]:
    """The directory's entries; one that cannot be listed is counted unreadable (a node directory
    made unreadable would otherwise hide the node, uncounted)."""
    try:
        with os.scandir(directory) as entries:
            return list(entries)
    except OSError as exc:
        scan.cannot_read("%s: cannot list: %s" % (directory, exc.strerror or exc))
        return []


# -- folding -------------------------------------------------------------------------------------

PARALLEL_MIN_RECORDS = (
    20000  # below this, one process reads the headers (a fork costs more than it saves)
)
CHUNK = 1000  # records per piece of work handed to a reader process
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
HEAD_BYTES = 16384  # a header line is about 1 KB; a record without one is read whole (fleet_report.read_header)


def scan(
    paths: Iterable[str],
    fleet: Dict[str, Any],
    since: Optional[float] = None,
    now: Optional[float] = None,
    workers: Optional[int] = None,
    verifier: Optional[signing.Verifier] = None,
) -> StragglerScan:
    """One pass over the records under `paths` with the [fleet] settings `fleet`. `since` (Unix time)
    defaults to now - window_days. workers: processes reading headers (None: 2 when there are many
    records and 2 CPUs; reading and parsing the headers is most of the work). verifier: the records
    key (signing.Verifier); with one, a record that does not verify is left out and named; without
    (None), every record is read and the result says it is unverified (not_verified)."""
    started = time.monotonic()
    now = time.time() if now is None else now
    since = now - fleet["window_days"] * 86400.0 if since is None else since
    result = StragglerScan(
        k=fleet["k"], m=fleet["m"], threshold=fleet["z_threshold"], min_nodes=fleet["min_job_nodes"]
    )
    verifier = verifier or signing.Verifier(None, "no records key given")
    result.not_verified = verifier.why_not
    listing = list_records(paths, since, result, trusted_uids(fleet["trusted_writers"]))
    if workers is None:
        workers = min(2, os.cpu_count() or 1) if len(listing) >= PARALLEL_MIN_RECORDS else 1
    open_jobs: Dict[str, OpenJob] = {}
    order: Deque[Tuple[float, str]] = collections.deque()
    for mtime, node, outcome in _parsed(
        listing, since, fleet["min_job_seconds"], workers, verifier
    ):
        while order and order[0][0] < mtime - SETTLE_S:
            _close(open_jobs.pop(order.popleft()[1]), result, fleet)
        if outcome[0] == "unreadable":
            result.cannot_read(outcome[1])
            continue
        if outcome[0] == "unverified":
            result.left_unverified(outcome[1])
            continue
        result.records += 1
        if outcome[0] == "skip":
            result.skip(outcome[1])
            continue
        _, job_id, entry = outcome
        job = open_jobs.get(job_id)
        if job is None:
            job = open_jobs[job_id] = OpenJob(job_id, mtime)
            order.append((mtime, job_id))
            result.max_open_jobs = max(result.max_open_jobs, len(open_jobs))
        job.entries[node] = entry  # the same node twice (a path given twice): the later record
    while order:
        _close(open_jobs.pop(order.popleft()[1]), result, fleet)
    result.seconds = time.monotonic() - started
    return result


def _parsed(
    listing: List[Tuple[float, str, str]],
    since: float,
    min_seconds: float,
    workers: int,
    verifier: signing.Verifier,
) -> Iterator[Tuple[float, str, Tuple[Any, ...]]]:
    """(mtime, node, parse outcome) in listing order. With workers > 1, forked processes read and
    parse pieces of the listing ahead of the caller, at most 2 pieces each (the results wait in
    memory only that far ahead)."""
    if workers <= 1:
        for mtime, node, path in listing:
            yield mtime, node, parse(path, node, since, min_seconds, verifier)
        return
    import multiprocessing

    pieces = iter([listing[i : i + CHUNK] for i in range(0, len(listing), CHUNK)])
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        pending: Deque[Tuple[List[Tuple[float, str, str]], Any]] = collections.deque()
        for piece in pieces:
            pending.append(
                (piece, pool.apply_async(_parse_piece, (piece, since, min_seconds, verifier)))
            )
            if len(pending) >= 2 * workers:
                break
        while pending:
            piece, answer = pending.popleft()
            outcomes = answer.get()
            following = next(pieces, None)
            if following is not None:
                pending.append(
                    (
                        following,
                        pool.apply_async(_parse_piece, (following, since, min_seconds, verifier)),
                    )
                )
            for (mtime, node, _path), outcome in zip(piece, outcomes):
                yield mtime, node, outcome


def _parse_piece(
    piece: List[Tuple[float, str, str]],
    since: float,
    min_seconds: float,
    verifier: signing.Verifier,
) -> List[Tuple[Any, ...]]:
    return [parse(path, node, since, min_seconds, verifier) for _mtime, node, path in piece]


def read_header(path: str) -> Dict[str, Any]:
    return read_head(path)[0]


def read_head(path: str) -> Tuple[Dict[str, Any], bytes]:
    """(the record's first line parsed alone, that line) (report.read_header, without a file object:
    the report reads 100,000 of them); the line is b"" when the record is not laid out that way.
    Never through a symlink. ValueError naming the file."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
        try:
            head = os.read(fd, HEAD_BYTES)
        finally:
            os.close(fd)
    except OSError as exc:
        raise ValueError("%s: unreadable: %s" % (path, exc.strerror or exc)) from None
    end = head.find(b"\n")
    if end > 0 and head[end - 1 : end] == b",":
        try:
            header = json.loads(head[: end - 1] + b"}")
        except (ValueError, RecursionError):  # RecursionError: JSON nested too deep
            header = None
        if (
            isinstance(header, dict)
            and header.get("schema") == RECORD_SCHEMA
            and isinstance(header.get("summary"), dict)
        ):
            return header, head[: end + 1]
    from .fleet_report import read_header as read_slowly

    return read_slowly(path), b""


def parse(
    path: str,
    node: str,
    since: float,
    min_seconds: float,
    verifier: Optional[signing.Verifier] = None,
) -> Tuple[Any, ...]:
    """One record -> ("ok", job id, (figures_row(perf), start, end, user, boot id, hardware class))
    | ("skip", why) | ("unreadable", why) | ("unverified", why): with a key, a record whose first
    line does not verify for <node>/<file name> (signing.py)."""
    try:
        header, line = read_head(path)
    except ValueError as exc:
        return ("unreadable", str(exc))
    if verifier is not None and verifier.key is not None:
        status = verifier.line(line, path)
        if status != signing.VERIFIED:
            return ("unverified", "%s: %s" % (path, status))
    job = header.get("job") if isinstance(header.get("job"), dict) else {}
    summary = header.get("summary")
    if not isinstance(summary, dict):  # a writer's bug: fleet_report.read_header only wants the key
        return ("unreadable", "%s: its summary is not an object" % path)
    perf = summary.get("perf")
    start, end = header.get("start"), header.get("end")
    if header.get("node") != node:
        return ("skip", "names another node than its directory")
    if not isinstance(perf, dict) or not perf:
        return ("skip", "no perf figures")
    if not (stragglers._number(start) and stragglers._number(end)):
        return ("skip", "no start or end time")
    if end - start < min_seconds:
        return ("skip", "shorter than min_job_seconds")
    if end < since:
        return ("skip", "older than the window")
    if not isinstance(job.get("id"), str) or not job["id"]:
        return ("skip", "no job id")
    user = job.get("user") if isinstance(job.get("user"), str) else None
    boot = header.get("boot_id")
    boot = boot if isinstance(boot, str) and 0 < len(boot) <= 64 else None
    hw = summary.get("hw_class")
    hw = hw if isinstance(hw, str) and len(hw) <= 512 else None
    row = stragglers.figures_row(perf)
    untrusted = blind_spots.untrusted_of(summary)
    bound = stall_bounds.bound_of(perf) if untrusted else None  # a saturated counter's least rate
    return ("ok", job_label(job), (row, float(start), float(end), user, boot, hw, untrusted, bound))


def _close(job: OpenJob, result: StragglerScan, fleet: Dict[str, Any]) -> None:
    """Score a job whose records are all in; fold each node's part into its window. Nodes are
    scored only against the job's nodes of the same hardware class (perf.hardware_class): a class
    with fewer than min_job_nodes nodes in the job is not scored."""
    nodes = len(job.entries)
    if nodes < fleet["min_job_nodes"]:
        result.skip("job on fewer than min_job_nodes nodes")
        return
    classes: Dict[Optional[str], List[str]] = {}
    for node in sorted(job.entries):
        classes.setdefault(job.entries[node][5], []).append(node)
    if None in classes and len(classes) > 1:  # unknown hardware: compared with the most nodes
        unknown = classes.pop(None)
        largest = max(classes, key=lambda c: (len(classes[c]), c))
        classes[largest] = sorted(classes[largest] + unknown)
    ends = sorted(e[2] for e in job.entries.values())
    start = min(e[1] for e in job.entries.values())
    user = next((e[3] for e in job.entries.values() if e[3]), None)
    scored = False
    for names in classes.values():
        if len(names) < fleet["min_job_nodes"]:
            result.skip(
                "node-jobs of a hardware class on fewer than min_job_nodes nodes of the job",
                len(names),
            )
            continue
        metrics: List[int] = []
        flags = stragglers.score_rows(
            names,
            [job.entries[n][0] for n in names],
            fleet["min_job_nodes"],
            fleet["z_threshold"],
            scored=metrics,
        )
        slowness.keep_costly(
            names, [job.entries[n][0] for n in names], flags
        )  # oddity is not slowness
        bounded: Set[str] = set()
        tried: Set[str] = set()
        if any(job.entries[n][7] is not None for n in names):
            bounded, tried = stall_bounds.flag_bounds(
                names,
                [job.entries[n][0] for n in names],
                [job.entries[n][7] for n in names],
                flags,
                fleet["min_job_nodes"],
                fleet["z_threshold"],
            )
        scored = True
        every = sum(1 << i for i in metrics)  # the figures scored in this job
        for node in names:
            window = result.windows.get(node)
            if window is None:
                window = result.windows[node] = stragglers.NodeWindow(node, fleet["m"], fleet["k"])
            row = job.entries[node][0]  # figures_row: each value a finite number or None
            bits = every
            if None in row:  # the node was scored on the figures it has
                for i in metrics:
                    if row[i] is None:
                        bits &= ~(1 << i)
            if None in row or job.entries[node][6]:  # what this node could not be judged on
                result.blind.add(node, job.entries[node][6], every & ~bits, metrics)
            # a scored bound is a scored job on the figure, flagged or not: in the k-of-m window
            # as in the rate test. Counting only the flagged ones made a node whose counter is
            # always cleared or saturated a suspect on any 3 flags of the report window (3 of
            # 3: the jobs between them never counted), a node with a measured counter on 3 of
            # its last 10 jobs (red team, round 3)
            if node in tried:
                bits |= stall_bounds.BIT
            mark = stragglers.JobMark(
                job.job_id, ends[len(ends) // 2], len(names), user, tuple(flags[node]), start, bits
            )
            window.add(mark, job.entries[node][4])
            result.rates.add(node, mark)  # the whole report window: rate_test
            result.node_jobs += 1
    result.jobs_scored += scored


# What the scan shows (the table, --json, --prom) lives in straggler_output.py; its names stay
# reachable here for the verbs and tests that read them from the scan.
from .straggler_output import (  # noqa: E402
    SCHEMA,
    prom_text,
    render,
    suspect_to_dict,
    to_dict,
    write_prom,
)

__all__ = [
    "SCHEMA",
    "ScanError",
    "StragglerScan",
    "prom_text",
    "render",
    "scan",
    "suspect_to_dict",
    "to_dict",
    "write_prom",
]
