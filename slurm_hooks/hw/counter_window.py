"""Error counters over a time window, across runs: how much did a counter grow in the last N hours?

A hardware error counter (EDAC's ce_count, an InfiniBand port's link_downed) counts since boot, driver
load or the last manual clear. "3 correctable errors" means nothing without "since when"; "3 in the
last 24 hours" does. One run of the hooks sees one value, so the values are kept between runs:

    <[paths] state_dir>/host-<family>.json   {"version": 1, "series": {key: [[unix time, boot id, value], ...]}}

(a tree under ``--root`` keeps its history inside the tree, at its own state_dir, symlinks resolved
within the root: judging a captured or fake node never mixes its counters with the live node's, and a
crafted tree cannot make us write outside it). The file is replaced atomically
(core.atomicio) under a bounded lock (core.locks); a corrupt or unreadable file starts a new history
and says so, it never stops the check. Each series is bounded: points older than the longest window
are dropped (but the newest of them stays, as the window's baseline), runs of equal values keep only
their first and last points, and at most MAX_POINTS are kept.

Resets are explicit: a new boot id, or a value lower than the previous one, means the counter started
again from zero, so the increase across that step is the new value (a lower bound: errors between the
last sample and the reset are lost). A counter at its saturation value (IBTA's 8- and 16-bit port
counters stop at 255 and 65535) cannot say how much it grew: the window reports it as saturated.
"""

from __future__ import annotations

import errno
import json
import os

from ..core import locks
from ..core.atomicio import open_dir, read_ours, write_atomic_at
from ..core.structs import Struct

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Sequence, Tuple

    Point = Tuple[float, str, int]  # (unix time, boot id, value)

VERSION = 1
MAX_POINTS = 512  # per series: a counter that changes at every 5-minute health check for 42 hours
MAX_SERIES = 4096  # per file: more DIMMs and ports than any node has; a bound on a corrupt config
MAX_BYTES = (
    16 << 20
)  # MAX_SERIES x MAX_POINTS points would be far more: a file past this is corrupt
LOCK_TIMEOUT_S = 0.5
SPAN_FRACTION = 0.25  # see window_increase
REWRITE_S = (
    600.0  # unchanged counters are written again only after this long (keeps the file fresh)
)


class Increase(Struct):
    """What a counter did inside the window (see window_increase)."""

    increase: int  # growth inside the window (a lower bound when resets or saturation hide some)
    covered_s: (
        float  # how much of the window the history covers (less than the window: young history)
    )
    resets: int  # steps where the counter went back to zero (reboot, driver reload, manual clear)
    saturated: bool  # the counter sits at its maximum: growth past it cannot be seen
    current: int


class History(Struct):
    """The series of one family after this run's sample, and why it may be incomplete."""

    series: Dict[str, Tuple[Point, ...]]
    note: Optional[str] = (
        None  # the state could not be read or written: the history is this run only
    )


def state_path(state_dir: str, family: str) -> str:
    """Where the history of `family` lives in a (real) state directory."""
    return os.path.join(state_dir, "host-%s.json" % family)


def record(
    path: str,
    values: Dict[str, int],
    now: float,
    boot_id: str,
    keep_s: float,
    zero_at: Optional[Dict[str, float]] = None,
    dir_fd: Optional[int] = None,
) -> History:
    """Append this run's values to the history in `path` and return every series (this run's included).

    `zero_at`: per key, a time the source says the counter was zero (EDAC's seconds_since_reset); it
    becomes a point of the history unless the history already has points after it, so a counter reset
    within the window counts whole from the first run on, and a reset the runs did not see is one.
    `dir_fd`: the directory of `path`, already open (a tree under --root: opened component by
    component without following a symlink, so a link swapped in after the check resolved the path
    cannot lead the write out of the tree); without it, the directory of `path` is opened here.

    Series not in `values` (a DIMM or port that went away) are dropped. Errors reading or writing the
    file (no permission in a manual run, a full disk, a held lock) leave the history to this run only,
    with a note; they never raise.
    """
    note = None
    old: Dict[str, List[Point]] = {}
    name = os.path.basename(path)
    opened = -1
    try:
        if dir_fd is None:
            dir_fd = opened = open_dir(os.path.dirname(path), create_mode=0o700)
        with _locked_at(dir_fd, name + ".lock", path + ".lock"):
            try:
                old = _load(path, dir_fd)
            except ValueError as exc:  # corrupt: start again, say so
                note = "history reset: %s" % exc
            merged = _merge(old, values, now, boot_id, keep_s, zero_at or {})
            if _unchanged(old, values, now, boot_id):
                return History(merged, note)  # a prolog per job must not fsync a file per job
            document = {"version": VERSION, "series": {k: list(v) for k, v in merged.items()}}
            data = (json.dumps(document, indent=1, sort_keys=True) + "\n").encode("utf-8")
            write_atomic_at(dir_fd, name, data, where=os.path.dirname(path))
        return History(merged, note)
    except OSError as exc:
        try:  # a read-only state dir (a manual run as a user) may still be readable
            old = _load(path, dir_fd) if dir_fd is not None else {}
        except (OSError, ValueError):
            old = {}
        merged = _merge(old, values, now, boot_id, keep_s, zero_at or {})
        return History(merged, "history not saved (%s): %s" % (path, exc.strerror or exc))
    finally:
        if opened >= 0:
            os.close(opened)


def this_run_only(
    values: Dict[str, int],
    now: float,
    boot_id: str,
    keep_s: float,
    zero_at: Optional[Dict[str, float]],
    note: str,
) -> History:
    """The history of this run alone, with `note` saying why nothing was kept (no directory)."""
    return History(_merge({}, values, now, boot_id, keep_s, zero_at or {}), note)


class _locked_at:  # noqa: N801 - used like a function: `with _locked_at(dir_fd, name, label):`
    """An exclusive lock (core/locks.flock_within) on dir_fd/name (made if missing, never through a
    symlink), LOCK_TIMEOUT_S at most."""

    def __init__(self, dir_fd: int, name: str, label: str):
        self.dir_fd, self.name, self.label, self.fd = dir_fd, name, label, -1

    def __enter__(self) -> "_locked_at":
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        self.fd = os.open(self.name, flags, 0o600, dir_fd=self.dir_fd)
        if not locks.flock_within(self.fd, LOCK_TIMEOUT_S):
            os.close(self.fd)
            raise locks.LockTimeout(errno.EWOULDBLOCK, "lock held by another process", self.label)
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # closing releases the lock


def _unchanged(
    old: Dict[str, List[Point]], values: Dict[str, int], now: float, boot_id: str
) -> bool:
    """Nothing new to say: same series, same values on the same boot, last written under REWRITE_S ago."""
    if set(old) != set(values):
        return False
    for key, value in values.items():
        points = old[key]
        if not points or points[-1][1:] != (boot_id, int(value)) or now - points[-1][0] > REWRITE_S:
            return False
    return True


def _read_json_file(path: str, dir_fd: int):
    """The JSON in `path` (None when missing), read only as we write it (atomicio.read_ours): not
    through a symlink (in a tree under --root, one to a live node's file read that file), not a FIFO
    (it blocked the check until its timeout), and not a file another user could have written: a
    history planted in a state directory others can write (a value of 0 an hour ago) made the
    current since-boot count a rate and drained a healthy node, or hid a real one. ValueError otherwise."""
    raw = read_ours(path, MAX_BYTES + 1, dir_fd=dir_fd)
    if raw is None:
        return None
    if len(raw) > MAX_BYTES:
        raise ValueError("%s: larger than %d bytes" % (path, MAX_BYTES))
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError("%s: corrupt JSON: %s" % (path, exc)) from None


def _load(path: str, dir_fd: int) -> Dict[str, List[Point]]:
    data = _read_json_file(path, dir_fd)
    if data is None:
        return {}
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise ValueError("%s: not a version %d history" % (path, VERSION))
    series = data.get("series")
    if not isinstance(series, dict):
        raise ValueError("%s: 'series' is not a table" % path)
    out: Dict[str, List[Point]] = {}
    for key, points in list(series.items())[:MAX_SERIES]:
        try:
            out[str(key)] = [(float(t), str(b), int(v)) for t, b, v in points][-MAX_POINTS:]
        except (TypeError, ValueError):
            raise ValueError(
                "%s: series %r holds something other than [time, boot, value] points" % (path, key)
            ) from None
    return out


def _merge(
    old: Dict[str, List[Point]],
    values: Dict[str, int],
    now: float,
    boot_id: str,
    keep_s: float,
    zero_at: Dict[str, float],
) -> Dict[str, Tuple[Point, ...]]:
    merged: Dict[str, Tuple[Point, ...]] = {}
    for key in sorted(values)[:MAX_SERIES]:
        points = [
            p for p in old.get(key, []) if p[0] <= now
        ]  # a clock that went back: drop the future
        zero = zero_at.get(key)
        if zero is not None and zero < now and not any(p[0] >= zero for p in points):
            points.append((zero, boot_id, 0))
        points.append((now, boot_id, int(values[key])))
        merged[key] = tuple(_compact(points, now - keep_s))
    return merged


def _compact(points: List[Point], horizon: float) -> List[Point]:
    """Drop what no window can need: points before the newest one at or before `horizon` (the
    baseline), and the middle of runs of equal values on one boot; then keep the last MAX_POINTS."""
    older = [i for i, p in enumerate(points) if p[0] <= horizon]
    if older:
        points = points[older[-1] :]
    kept: List[Point] = []
    for i, point in enumerate(points):
        if 0 < i < len(points) - 1:
            before, after = points[i - 1], points[i + 1]
            if before[1:] == point[1:] == after[1:]:
                continue  # same boot, same value on both sides: the first and the last say it all
        kept.append(point)
    return kept[-MAX_POINTS:]


def window_increase(
    points: Sequence[Point],
    now: float,
    window_s: float,
    saturate_at: Optional[int] = None,
) -> Increase:
    """How much the counter grew in (now - window_s, now], from its points (oldest first).

    The step from the last point before the window into it is counted whole when that point is at
    most SPAN_FRACTION of a window older than the window's start (the health check samples every few
    minutes, small against a window of hours); an older step is not counted at all: its growth cannot
    be placed in time (a first run on a node up for months sees its whole since-boot count in one step).
    """
    pts = sorted(points, key=lambda p: p[0])
    if not pts:
        return Increase(0, 0.0, 0, False, 0)
    current = pts[-1][2]
    start = now - window_s
    base = max((i for i, p in enumerate(pts) if p[0] <= start), default=0)
    increase = resets = 0
    covered_from = now
    for prev, cur in zip(pts[base:], pts[base + 1 :]):
        if prev[0] < start - window_s * SPAN_FRACTION:
            continue  # a step from long before the window: its growth cannot be placed in time
        covered_from = min(covered_from, max(prev[0], start))
        if cur[1] != prev[1] or cur[2] < prev[2]:
            resets += 1
            increase += cur[2]
        else:
            increase += cur[2] - prev[2]
    covered = now - covered_from
    saturated = saturate_at is not None and current >= saturate_at
    return Increase(increase, max(0.0, covered), resets, saturated, current)
