"""Durable per-job records: a counter snapshot at prolog, a JSON record per job x node at epilog.

Prolog (`prolog_snapshot`): counters.take() for the job's GPUs and the node, run in a forked child
bounded by [records] snapshot_timeout (NVML can hang), stored as <[paths] state_dir>/snapshots/<job>.json
(mode 0600, written atomically: temp file + fsync + rename + fsync of the directory).

Epilog (`epilog_record`): snapshot again (with leftover processes and memory), read the Xid/SXid
lines of the kernel log, and write <[records] dir>/<node>/<job>.json (build.RECORD_SCHEMA,
documented in docs/records.md): deltas since the prolog, Xids logged during the job, leftover GPU
processes, the epilog's check results, the decision, timings, GPU UUIDs and serials. Only the
validated job id, user and GPU list come from the job; never its environment. Then the node's
directory is trimmed to [records] max_records and max_mb (oldest first). One directory per node
keeps retention local to the node that writes, so the records directory may be a shared file system.

The records directory may be writable by users (shared file systems often are). Below it nothing is
ever looked up through a symlink (directory descriptors, O_NOFOLLOW: atomicio), DIR/<node> must be
owned by whoever our own files belong to there (root, or nobody under NFS root_squash: learnt from
the temp file we create), and retention removes only regular files we own, named like our records
or temp files, in DIR/<node>/. A planted symlink or a directory someone else made is refused and
logged (event=record-not-written), never followed.

Everything here fails soft: a full disk, a read-only /var/log or a bug of ours is logged (event=
record-not-written ...) and the hook goes on; earlier records are never touched by a failed write.
hooks/bounded.py runs these steps in a bounded child (isolation.run_steps): a records file system that never
answers costs at most [deadline] files, and what did not finish is logged with its path.
A missing prolog snapshot (prolog skipped or failed, node rebooted, state dir wiped) still gives a
record, marked "prolog_snapshot": "missing" and without deltas.
"""

from __future__ import annotations

import errno
import os
import stat
import time

from ..core import atomicio, logs
from ..core.atomicio import read_json, write_json_atomic
from ..core.config import Config
from ..core.lazyre import lazy_compile
from ..core.runner import JobContext
from ..registry import JOB_CONTEXTS

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    import logging
    from typing import Any, Dict, List, Optional, Tuple

    from ..xid.kmsg import KmsgView

    Gathered = Optional[
        Tuple[Optional[Dict[str, Any]], str]
    ]  # (snapshot, why not) taken by the caller, or None

SNAPSHOT_DIR = "snapshots"
RECORD_MODE, RECORD_DIR_MODE = (
    0o640,
    0o750,
)  # readable by the directory's group (setgid dir: admins)
STALE_TEMP_S = 3600  # a temp file this old was left by a writer killed mid-write
GPU_SHARE = 0.6  # of [records] snapshot_timeout: after it a GPU whose NVML calls hang is given up (the rest stand)
_SAFE_NAME = lazy_compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
RECORD_NAME = lazy_compile(
    r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\.json$"
)  # <job id>.json: what retention may remove
OUR_TEMP = lazy_compile(r"^\..+\.tmp$")  # atomicio's temp files (".<name>.<pid>.<n>.tmp")


def _log(log: Optional[logging.Logger]) -> logging.Logger:
    return log or logs.decision_logger()


def safe_name(value: Optional[str], what: str) -> str:
    """Job ids and node names become file names: refuse anything but a plain name."""
    if not value or not _SAFE_NAME.match(value) or value in (".", ".."):
        raise ValueError("%s %r cannot be used as a file name" % (what, value))
    return value


# -- paths -------------------------------------------------------------------------------------


def snapshot_path(config: Config, job_id: str) -> str:
    return os.path.join(
        config.get("paths", "state_dir"), SNAPSHOT_DIR, safe_name(job_id, "job id") + ".json"
    )


def record_path(directory: str, node: str, job_id: str, attempt: int = 0) -> str:
    """DIR/<node>/<job>.json, or <job>.r<N>.json for the attempt after the N-th requeue (names.py)."""
    from .names import record_name

    return os.path.join(
        directory, safe_name(node, "node name"), record_name(safe_name(job_id, "job id"), attempt)
    )


# -- gathering, isolated -----------------------------------------------------------------------


def take_snapshot(
    config: Config, job: JobContext, epilog: bool, kernel_log: Optional[KmsgView] = None
) -> Dict[str, Any]:
    """counters.take for the job's GPUs and the node, in this process (callers bound it in time).

    In the epilog the snapshot also carries the kernel log's Xid/SXid lines (`xid_lines`).
    `kernel_log`: the hook's own read of /dev/kmsg (the Xid checks'), else it is read here.
    """
    from ..hw.host import Host, HostError
    from . import counters

    settings = config.settings
    host = Host(settings["general"]["root"])
    if kernel_log is None and epilog:  # one read for both the position and the Xid lines
        try:
            kernel_log = counters.read_kernel_log(host)
        except HostError:  # counters.take reads again and records why it could not
            pass
    snap = counters.take(
        host,
        settings["nvml"]["library"],
        job.gpus,
        settings["records"]["ib_counters"],
        processes=epilog,
        kernel_log=kernel_log,
        gpu_budget=GPU_SHARE * settings["records"]["snapshot_timeout"],
        job_id=job.job_id,
    )
    if epilog:
        try:
            snap["xid_lines"] = counters.read_xid_lines(host, kernel_log)
        except HostError as exc:
            snap["notes"].append("kernel log unreadable: %s" % exc)
    return snap


def wanted(config: Config, job: JobContext, context: str) -> bool:
    """Whether this hook run takes a snapshot at all."""
    return context in JOB_CONTEXTS and bool(job.job_id) and config.get("records", "enabled")


def gather(config: Config, job: JobContext, epilog: bool) -> Tuple[Optional[Dict[str, Any]], str]:
    """take_snapshot in a forked child within [records] snapshot_timeout; (snapshot, "") or (None, why).

    hooks/bounded.py normally takes the snapshot in the child that ran the checks (one NVML start-up per
    hook) and passes it in as `gathered`; this is the fallback when that child could not.
    """
    from ..core.isolation import run_isolated

    return run_isolated(
        lambda: take_snapshot(config, job, epilog), config.get("records", "snapshot_timeout")
    )


# -- prolog ------------------------------------------------------------------------------------


def prolog_snapshot(
    config: Config, job: JobContext, log: Optional[logging.Logger] = None, gathered: Gathered = None
) -> Optional[str]:
    """Take and store the job's start snapshot; its path, or None (disabled, no job, or failed: logged)."""
    return _prolog(config, job, _log(log), gathered)[0]


def _prolog(
    config: Config, job: JobContext, log: logging.Logger, gathered: Gathered = None
) -> Tuple[Optional[str], Optional[Dict[str, Any]]]:
    if not config.get("records", "enabled") or not job.job_id:
        return None, None
    snap = None
    try:
        path = snapshot_path(config, job.job_id)
        snap, why = gathered if gathered is not None else gather(config, job, epilog=False)
        if snap is None:
            log.error(logs.kv(event="snapshot-failed", context="prolog", job=job.job_id, error=why))
            return None, None
        if job.restart_count is not None:  # the attempt this prolog belongs to (names.attempt_of)
            snap = dict(snap, restart_count=job.restart_count)
        write_json_atomic(path, snap, mode=0o600, compact=True)  # read back by the epilog only
        prune_snapshots(
            os.path.dirname(path), config.get("records", "snapshot_max_age_days") * 86400.0
        )
        return path, snap
    except ValueError as exc:  # a job id that cannot be a file name (jobenv lets none through)
        log.error(logs.kv(event="snapshot-not-written", job=job.job_id, error=exc))
    except OSError as exc:
        log.error(logs.kv(event="snapshot-not-written", job=job.job_id, error=_oserror(exc)))
    except Exception as exc:  # our bug: the job must still start
        log.exception(logs.kv(event="snapshot-bug", job=job.job_id, error=repr(exc)))
    return None, snap


def store_prolog_snapshot(
    config: Config, job: JobContext, gathered: Gathered, log: Optional[logging.Logger] = None
) -> Optional[str]:
    """Write a snapshot already taken (hooks/bounded.py does it in the check child); its path or None."""
    return _prolog(config, job, _log(log), gathered)[0]


def prune_snapshots(directory: str, max_age_s: float, now: Optional[float] = None) -> int:
    """Remove start snapshots whose epilog never came (node crashed mid-job) once older than max_age_s,
    and temp files of killed writers; only regular files we own with our names (never through a symlink)."""
    now = time.time() if now is None else now
    try:
        dir_fd = atomicio.open_dir(directory)
    except OSError:
        return 0
    try:
        uid = os.geteuid()
        removed = 0
        for name, info in list(atomicio.our_entries(dir_fd, RECORD_NAME, uid)):
            if now - info.st_mtime > max_age_s and atomicio.remove_ours(dir_fd, name):
                removed += 1
        atomicio.remove_stale_temps(dir_fd, uid, STALE_TEMP_S, now, OUR_TEMP)
        return removed
    finally:
        os.close(dir_fd)


def load_snapshot(config: Config, job_id: str) -> Tuple[Optional[Dict[str, Any]], str]:
    """(snapshot, "ok") or (None, "missing" | "corrupt: ...")."""
    try:
        snap = read_json(snapshot_path(config, job_id))
    except (OSError, ValueError) as exc:
        return None, "corrupt: %s" % exc
    if snap is None:
        return None, "missing"
    if not isinstance(snap, dict) or not isinstance(snap.get("gpus"), list):
        return None, "corrupt: not a slurm-hooks snapshot"
    return snap, "ok"


# -- epilog ------------------------------------------------------------------------------------


def epilog_record(
    config: Config,
    job: JobContext,
    node: str,
    report=None,
    decision=None,
    enacted=None,
    log: Optional[logging.Logger] = None,
    gathered: Gathered = None,
) -> Optional[str]:
    """Build and write the job's record on this node; its path, or None (disabled, no job, failed: logged)."""
    from .build import build_record
    from .names import attempt_of

    log = _log(log)
    if not config.get("records", "enabled") or not job.job_id:
        return None
    path = None
    try:
        started = time.monotonic()
        before, prolog_state = load_snapshot(config, job.job_id)
        attempt = attempt_of(job.restart_count, before)
        path = record_path(config.get("records", "dir"), node, job.job_id, attempt)
        after, why = gathered if gathered is not None else gather(config, job, epilog=True)
        record = build_record(
            job, node, before, prolog_state, after, why, report, decision, enacted, config.settings
        )
        record["job"]["restart_count"] = attempt
        record["timings"]["record_build_s"] = round(time.monotonic() - started, 4)
        path = write_record(
            path,
            record,
            max_records=config.get("records", "max_records"),
            max_bytes=config.get("records", "max_mb") << 20,
            key=_records_key(config, log),
        )
        _remove_quietly(snapshot_path(config, job.job_id))
        return path
    except ValueError as exc:  # a node name or job id that cannot be a file name
        log.error(logs.kv(event="record-not-written", job=job.job_id, node=node, error=exc))
    except OSError as exc:
        log.error(
            logs.kv(
                event="record-not-written",
                job=job.job_id,
                node=node,
                path=path,
                error=_oserror(exc),
            )
        )
    except Exception as exc:  # our bug must not fail the epilog (that would drain the node)
        log.exception(logs.kv(event="record-bug", job=job.job_id, node=node, error=repr(exc)))
    _remove_quietly(
        snapshot_path(config, job.job_id)
    )  # the job is over: its start snapshot is useless now
    return None


HEADER_KEYS = (
    "schema",
    "version",
    "job",
    "node",
    "start",
    "end",
    "boot_id",
    "prolog_snapshot",
    "summary",
)


def write_record(
    path: str,
    record: Dict[str, Any],
    max_records: Optional[int] = None,
    max_bytes: Optional[int] = None,
    key: Optional[bytes] = None,
) -> str:
    """Compact JSON, atomically, at DIR/<node>/<job>.json; then retention when max_records is given.
    Returns the path written: an earlier record of ours at that name is never replaced, the next
    free name is taken instead (names.py: a requeued job's attempts all stay).

    Directories are created group-readable (see RECORD_DIR_MODE). DIR is the configured path; below
    it nothing is followed through a symlink, and DIR/<node> must belong to us (module docstring).
    The first line holds the header keys (HEADER_KEYS, the summary among them) and ends with ",":
    the file is one JSON document, and `report` can read just that line (report.read_header).
    """
    node_dir = os.path.dirname(path)
    base_fd = atomicio.open_dir(os.path.dirname(node_dir), create_mode=RECORD_DIR_MODE)
    try:
        node_fd = atomicio.open_subdir(
            base_fd, os.path.basename(node_dir), RECORD_DIR_MODE, os.path.dirname(node_dir)
        )
    finally:
        os.close(base_fd)
    try:

        def ours(
            info: os.stat_result,
        ) -> None:  # our temp file's owner is who we are on this file system
            atomicio.check_owner(node_fd, info.st_uid, node_dir)

        name = _free_name(node_fd, os.path.basename(path))
        written = atomicio.write_atomic_at(
            node_fd,
            name,
            encode_record(record, key, os.path.basename(node_dir), name),
            RECORD_MODE,
            where=node_dir,
            owner_check=ours,
        )
        if max_records is not None:
            _retain(
                node_fd,
                written.st_uid,
                max_records,
                max_bytes if max_bytes is not None else 1 << 62,
            )
        return os.path.join(node_dir, name)
    finally:
        os.close(node_fd)


def _free_name(node_fd: int, name: str) -> str:
    """`name`, or `<stem>.<k>.json` when `name` holds a record of ours already (a regular file owned
    by us); anything else there (a planted symlink, a user's file) is replaced by the rename."""
    from .names import MAX_COPIES

    stem = name[: -len(".json")]
    for copy in range(1, MAX_COPIES + 1):
        candidate = name if copy == 1 else "%s.%d.json" % (stem, copy)
        try:
            info = os.stat(candidate, dir_fd=node_fd, follow_symlinks=False)
        except FileNotFoundError:
            return candidate
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            return candidate
    raise OSError(errno.EEXIST, "%d records of this job already" % MAX_COPIES, name)


def encode_record(
    record: Dict[str, Any], key: Optional[bytes] = None, node: str = "", name: str = ""
) -> bytes:
    """The file's bytes: the header line, then the body. With a key, signed for DIR/<node>/<name>
    (signing.py: the header line ends with the body's hash and the MAC)."""
    import json

    def dump(part: Dict[str, Any]) -> str:
        return json.dumps(part, separators=(",", ":"), allow_nan=False)

    header = {k: record[k] for k in HEADER_KEYS if k in record}
    body = {k: v for k, v in record.items() if k not in header}
    if not header or not body:
        return (dump(record) + "\n").encode("utf-8")
    header_open, rest = dump(header)[:-1].encode("utf-8"), (dump(body)[1:] + "\n").encode("utf-8")
    if key is not None:
        from .signing import signed_lines

        return signed_lines(header_open, rest, key, node, name)
    return header_open + b",\n" + rest


def enforce_retention(
    directory: str, max_records: int, max_bytes: int, now: Optional[float] = None
) -> List[str]:
    """Delete the oldest records (by mtime) until at most max_records files and max_bytes remain.

    Also removes temp files left by writers killed mid-write once they are STALE_TEMP_S old. Returns
    the removed paths. Only this node's directory is ever touched, and in it only regular files we
    own whose names are ours (a symlink, a hard link or a user's file is never removed).
    """
    try:
        dir_fd = atomicio.open_dir(directory)
    except OSError:
        return []
    try:
        return [
            os.path.join(directory, name)
            for name in _retain(dir_fd, os.geteuid(), max_records, max_bytes, now)
        ]
    finally:
        os.close(dir_fd)


def _retain(
    dir_fd: int, uid: int, max_records: int, max_bytes: int, now: Optional[float] = None
) -> List[str]:
    """enforce_retention on a directory descriptor, for files owned by `uid`; returns the names removed."""
    now = time.time() if now is None else now
    atomicio.remove_stale_temps(dir_fd, uid, STALE_TEMP_S, now, OUR_TEMP)
    records = sorted(
        (info.st_mtime, info.st_size, name)
        for name, info in atomicio.our_entries(dir_fd, RECORD_NAME, uid)
    )
    total = sum(size for _, size, _ in records)
    removed: List[str] = []
    for _mtime, size, name in records:
        if len(records) - len(removed) <= max_records and total <= max_bytes:
            break
        if atomicio.remove_ours(dir_fd, name):
            removed.append(name)
            total -= size
    return removed


# -- finding records (record show, report --job) ------------------------------------------------


def find_records(directories: List[str], job_id: str, node: Optional[str] = None) -> List[str]:
    """Paths of the records of job_id, every attempt (names.py), on node when given, under the
    records directories. Names are tried, not listed (a node directory holds 10,000 records)."""
    safe_name(job_id, "job id")
    found = []
    for directory in directories:
        if node is not None:
            found.extend(_attempts(os.path.join(directory, safe_name(node, "node name")), job_id))
            continue
        found.extend(_attempts(directory, job_id))  # a node directory given directly
        for entry in _scan(directory):
            if entry.is_dir() and not entry.name.startswith("."):
                found.extend(_attempts(entry.path, job_id))
    return sorted(found)


def _attempts(directory: str, job_id: str) -> List[str]:
    """The records of job_id in one node directory: restart counts 0..names.PROBED_RESTARTS, and
    for each its `.<k>` names while they exist."""
    from .names import MAX_COPIES, PROBED_RESTARTS, record_name

    found = []
    prefix = os.path.join(directory, "")  # joined once: ~18 names are tried per node directory
    for attempt in range(PROBED_RESTARTS + 1):
        for copy in range(1, MAX_COPIES + 1):
            path = prefix + record_name(job_id, attempt, copy)
            try:  # os.path.isfile, without its wrapper
                if not stat.S_ISREG(os.stat(path).st_mode):
                    break
            except (OSError, ValueError):
                break
            found.append(path)
    return found


# -- what hooks.run_hook runs after its decision -----------------------------------------------


def steps(
    context: str,
    config: Config,
    job: JobContext,
    node: str,
    report=None,
    decision=None,
    enacted=None,
    log: Optional[logging.Logger] = None,
    gathered: Gathered = None,
    snapshot_stored: bool = False,
) -> list:
    """The prolog's snapshot file (unless `snapshot_stored`: hooks/bounded.py wrote it already) or the epilog's
    record, and the dcgm-exporter job mapping, as isolation.Steps (name, path, work) that hooks/
    runs in a bounded child. Each step logs its own errors and never raises."""
    from ..core.isolation import Step

    log = _log(log)
    out = []
    mapping_dir = config.get("metrics", "dcgm_job_mapping_dir")
    wanted_here = config.get("records", "enabled") and bool(job.job_id)
    if context == "prolog":
        if wanted_here and not snapshot_stored:
            out.append(
                Step(
                    "snapshot",
                    _path_or_dir(
                        lambda: snapshot_path(config, job.job_id), config.get("paths", "state_dir")
                    ),
                    lambda: _prolog(config, job, log, gathered),
                )
            )
        snap = gathered[0] if gathered else None
        # dcgm-exporter names files by NVML index; Slurm's indices are minor numbers (see counters.read_gpus)
        indices = [g["index"] for g in snap["gpus"]] if snap and snap.get("gpus") else None
        if mapping_dir and job.job_id:
            from . import dcgm  # only with a mapping directory: the prolog's tail waits for imports

            out.append(
                Step(
                    "dcgm-mapping",
                    mapping_dir,
                    lambda: dcgm.on_prolog(config, job, indices, log=log),
                )
            )
    elif context == "epilog":
        if mapping_dir and job.job_id:
            from . import dcgm

            out.append(
                Step("dcgm-mapping", mapping_dir, lambda: dcgm.on_epilog(config, job, log=log))
            )
        if wanted_here:
            out.append(
                Step(
                    "record",
                    _path_or_dir(
                        lambda: record_path(config.get("records", "dir"), node, job.job_id),
                        config.get("records", "dir"),
                    ),
                    lambda: epilog_record(
                        config, job, node, report, decision, enacted, log, gathered
                    ),
                )
            )
    return out


def on_hook(
    context: str,
    config: Config,
    job: JobContext,
    node: str,
    report=None,
    decision=None,
    enacted=None,
    log: Optional[logging.Logger] = None,
    gathered: Gathered = None,
) -> Optional[str]:
    """The steps of `steps`, one after the other in this process (tests; hooks/bounded.py bounds them instead);
    the snapshot's or record's path when one was written."""
    if gathered is None and wanted(config, job, context):
        gathered = gather(config, job, epilog=context == "epilog")
    written = None
    for step in steps(context, config, job, node, report, decision, enacted, log, gathered):
        value = step.run()
        if step.name in ("snapshot", "record"):
            written = value[0] if isinstance(value, tuple) else value
    return written


def _records_key(config: Config, log: logging.Logger) -> Optional[bytes]:
    """[records] key_file's key, or None: no key file means unsigned records; a key that cannot be
    trusted or read is logged (event=records-key-unusable) and the record goes unsigned. Never
    raises: the epilog must not fail over its record's signature."""
    from ..core.config import SECTIONS
    from .signing import KeyProblem, load_key

    path = config.get("records", "key_file")
    try:
        key = load_key(path)
        if key is None and path and path != SECTIONS["records"]["key_file"].default:
            # a path set on purpose and not there: a typo or an undistributed key, not report-only
            log.warning(logs.kv(event="records-key-missing", path=path, decision="unsigned"))
        return key
    except KeyProblem as exc:
        log.warning(logs.kv(event="records-key-unusable", path=path, error=exc))
    except Exception as exc:  # our bug: an unsigned record is still a record
        log.exception(logs.kv(event="records-key-bug", path=path, error=repr(exc)))
    return None


def _path_or_dir(path, fallback: str) -> str:
    try:
        return path()
    except ValueError:
        return fallback


# -- helpers -----------------------------------------------------------------------------------


def _scan(directory: str) -> List[os.DirEntry]:
    try:
        with os.scandir(directory) as entries:
            return list(entries)
    except OSError:
        return []


def _remove_quietly(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


def _oserror(exc: OSError) -> str:
    """'No space left on device (ENOSPC): /var/log/...' -- what an operator greps for."""
    code = errno.errorcode.get(exc.errno or 0, "")
    where = exc.filename or ""
    return "%s%s%s" % (
        exc.strerror or exc,
        " (%s)" % code if code else "",
        ": %s" % where if where else "",
    )
