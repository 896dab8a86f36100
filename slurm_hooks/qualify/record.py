"""Qualification records: one JSON file per run, DIR/<node>/<UTC time>.qualify beside the node's job
records ([records] dir), written like them (atomicio: temp file, fsync, rename, no symlink below DIR
followed; store.write_record's directory rules). The `.qualify` suffix keeps them out of the job
record readers (report, retention, the straggler scan read `*.json`). The last KEEP of a node are kept.

They are the fleet's memory: the class median of a figure is taken over the latest passing record
of every other node of the same hardware class.
"""

from __future__ import annotations

import json
import os
import stat
import statistics
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from ..core import atomicio
from ..core.lazyre import lazy_compile
from ..records.store import RECORD_DIR_MODE, RECORD_MODE, safe_name

SUFFIX = ".qualify"
NAME = lazy_compile(r"^\d{8}T\d{6}Z(-\d+)?\.qualify$")


def _order(name: str) -> Tuple[str, int]:
    """Oldest first: the time, then the counter of runs in the same second ('-' sorts before '.')."""
    stamp, _, rest = name.partition("-")
    return (stamp.split(".")[0], int(rest.split(".")[0]) if rest else 0)


KEEP = 50
MAX_RECORD_BYTES = 1 << 20
SCHEMA = "slurm-hooks.qualify/1"


def write(directory: str, node: str, record: Dict[str, Any], now: Optional[float] = None) -> str:
    """The record's path after writing it; OSError/atomicio errors propagate (the caller reports)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    base_fd = atomicio.open_dir(directory, create_mode=RECORD_DIR_MODE)
    try:
        node_fd = atomicio.open_subdir(
            base_fd, safe_name(node, "node name"), RECORD_DIR_MODE, directory
        )
    finally:
        os.close(base_fd)
    try:
        name = stamp + SUFFIX
        existing = set(os.listdir(node_fd))
        counter = 1
        while name in existing:  # two runs in one second
            name = "%s-%d%s" % (stamp, counter, SUFFIX)
            counter += 1
        data = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
        atomicio.write_atomic_at(
            node_fd, name, data, RECORD_MODE, where=os.path.join(directory, node)
        )
        for old in sorted((n for n in os.listdir(node_fd) if NAME.match(n)), key=_order)[:-KEEP]:
            atomicio.remove_ours(node_fd, old)
    finally:
        os.close(node_fd)
    return os.path.join(directory, node, name)


def read(path: str, trusted: Optional[Set[int]] = None) -> Optional[Dict[str, Any]]:
    """A record, or None for a file that is not one (too large, not JSON, another schema, a
    symlink, or, with `trusted`, a file of another owner: a user who can write in the records
    directory must not set the fleet's median and fail every peer's qualification)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (trusted is not None and info.st_uid not in trusted):
            return None
        with os.fdopen(fd, "rb") as handle:
            fd = -1
            data = handle.read(MAX_RECORD_BYTES + 1)
    except OSError:
        return None
    finally:
        if fd != -1:
            os.close(fd)
    if len(data) > MAX_RECORD_BYTES:
        return None
    try:
        record = json.loads(data)
    except ValueError:
        return None
    return record if isinstance(record, dict) and record.get("schema") == SCHEMA else None


def latest_by_node(
    directory: str, trusted: Optional[Set[int]] = None
) -> Dict[str, Tuple[str, Dict[str, Any]]]:
    """node -> (path, record) of its newest qualification record under DIR (owned by a `trusted`
    uid, root, us or DIR's owner, when `trusted` is given). The node is the one the record names
    (its writer's `node`; the directory's name only for a record without one): a directory name is
    whatever someone who can write DIR renamed it to, and a peer's directory renamed to the judged
    node's name left the peer out of the class median (too few peers: a slow node passed)."""
    if trusted is not None:
        try:
            trusted = set(trusted) | {0, os.geteuid(), os.stat(directory).st_uid}
        except OSError:
            return {}
    out: Dict[str, Tuple[str, Dict[str, Any]]] = {}
    try:
        nodes = sorted(e.name for e in os.scandir(directory) if e.is_dir(follow_symlinks=False))
    except OSError:
        return out
    for node in nodes:
        if node.startswith("."):
            continue
        try:
            names = sorted(
                (n for n in os.listdir(os.path.join(directory, node)) if NAME.match(n)), key=_order
            )
        except OSError:
            continue
        for name in reversed(names):
            record = read(os.path.join(directory, node, name), trusted)
            if record is not None:
                named = record.get("node")
                owner = named if isinstance(named, str) and named else node
                if owner not in out or _started(record) > _started(out[owner][1]):
                    out[owner] = (os.path.join(directory, node, name), record)
                break
    return out


def _started(record: Dict[str, Any]) -> float:
    started = record.get("started")
    ok = isinstance(started, (int, float)) and not isinstance(started, bool)
    return float(started) if ok else 0.0


def class_medians(
    directory: str,
    hardware_class: str,
    level: str,
    exclude_node: str,
    min_peers: int,
    trusted: Optional[Set[int]] = None,
) -> Dict[str, Tuple[float, int]]:
    """figure -> (median, peers) over the latest passing record of every other node of the class
    at the same level; figures seen on fewer than min_peers nodes are left out."""
    values: Dict[str, List[float]] = {}
    for node, (_path, record) in latest_by_node(
        directory, trusted if trusted is not None else set()
    ).items():
        if node == exclude_node or record.get("class") != hardware_class:
            continue
        if record.get("level") != level or record.get("verdict") != "pass":
            continue
        for test in record.get("tests", []):
            for key, value in (test.get("figures") or {}).items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    values.setdefault(key, []).append(float(value))
    return {
        key: (statistics.median(found), len(found))
        for key, found in values.items()
        if len(found) >= min_peers
    }
