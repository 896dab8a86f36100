"""Crash-safe small files: write to a temp file in the same directory, fsync, rename, fsync the directory.

A reader sees the old content or the new one, never a torn file, even after kill -9 or power loss.
Errors (ENOSPC, EROFS, EACCES) propagate as OSError with the path; callers decide whether to go on.

Directories users can write to (a shared records directory often allows it) are handled through
directory file descriptors: below the configured directory nothing is ever looked up through a
symbolic link (openat with O_NOFOLLOW), the temp file is created with O_EXCL|O_NOFOLLOW and
renamed over the final name (a rename replaces a planted symlink, it never follows it), and only
regular files we own, with names we write, are ever removed (`remove_ours`).
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import re
import stat
import time

from .lazyre import lazy_compile

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Callable, Iterator, List, Optional, Tuple

_serial = itertools.count()
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
TEMP_NAME = lazy_compile(r"^\.(.+)\.[0-9]+\.[0-9]+\.tmp$")  # ".<final name>.<pid>.<serial>.tmp"


class UnsafePath(OSError):
    """A path below a directory we write to is not what we created (a symlink, another owner)."""


def write_atomic(path: str, data: bytes, mode: int = 0o600) -> None:
    directory = os.path.dirname(os.path.abspath(path)) or "."
    dir_fd = open_dir(directory, create_mode=0o700)
    try:
        write_atomic_at(dir_fd, os.path.basename(path), data, mode, where=directory)
    finally:
        os.close(dir_fd)


def write_atomic_at(
    dir_fd: int,
    name: str,
    data: bytes,
    mode: int = 0o600,
    where: str = "",
    owner_check: Optional[Callable[[os.stat_result], None]] = None,
) -> os.stat_result:
    """Write `data` to dir_fd/name atomically; returns the new file's stat (its owner is who we are there).

    `owner_check(stat of our temp file)` may raise before anything is renamed into place (it is how
    a caller learns which uid our writes get on this file system, e.g. nobody under NFS root_squash).
    """
    # O_EXCL with pid + counter instead of tempfile.mkstemp: same safety, without importing tempfile
    # (and random, shutil...) on the prolog's path. Leftovers of a killed writer start with '.'.
    tmp = ".%s.%d.%d.tmp" % (name, os.getpid(), next(_serial))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    label = os.path.join(where, name) if where else name
    try:
        fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
    except (
        FileExistsError
    ):  # left by a killed process that had our pid: nobody else can be writing it
        os.unlink(tmp, dir_fd=dir_fd)
        fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
    try:
        info = os.fstat(fd)
        if owner_check is not None:
            owner_check(info)
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as exc:
        _discard(fd, tmp, dir_fd)
        if exc.filename in (None, tmp, name):
            exc.filename = label
        raise
    except BaseException:
        _discard(fd, tmp, dir_fd)
        raise
    os.fsync(dir_fd)
    return info


def _discard(fd: int, tmp: str, dir_fd: int) -> None:
    if fd >= 0:
        os.close(fd)
    try:
        os.unlink(tmp, dir_fd=dir_fd)
    except OSError:
        pass


def write_json_atomic(path: str, value: Any, mode: int = 0o600, compact: bool = False) -> None:
    """`value` as JSON in `path`, replaced atomically. Indented for the files an admin reads;
    `compact` for large machine-read ones (the prolog's start snapshot, ~100 kB on an 8-GPU node):
    without indent, json uses its C encoder, ~5x faster than the Python one indent needs."""
    if compact:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    else:
        text = json.dumps(value, indent=1, sort_keys=True)
    write_atomic(path, (text + "\n").encode("utf-8"), mode)


def read_json(path: str, default: Any = None) -> Any:
    """The JSON in path; `default` when it is missing. A corrupt or untrusted file (read_ours)
    raises ValueError naming it."""
    raw = read_ours(path, 16 << 20)
    if raw is None:
        return default
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError("%s: corrupt JSON: %s" % (path, exc)) from None


_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def read_ours(path: str, limit: int, dir_fd: Optional[int] = None) -> Optional[bytes]:
    """Up to `limit` bytes of a state file we wrote; None when it is missing.

    What these files say decides actions (which drain is ours to lift, which GPU hung before), so a
    file anyone else could have written is not believed: the last component must be a regular file
    (not a symbolic link, a FIFO that would block, a device) with one name, owned by us or by root,
    and writable by no one else. Our writers make exactly that (write_atomic: 0600 or 0644, our uid). Anything
    else raises ValueError naming the file and why; callers treat it as unreadable (state unknown,
    history started again), never as content. With `dir_fd`, the file is basename(path) in that
    directory (a directory opened without following symlinks) and `path` only names it."""
    try:
        if dir_fd is None:
            fd = os.open(path, _READ_FLAGS)
        else:
            fd = os.open(os.path.basename(path), _READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError("%s: a symbolic link, not a file we wrote: not read" % path) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("%s: not a regular file: not read" % path)
        if info.st_uid not in (os.geteuid(), 0):
            raise ValueError(
                "%s: owned by uid %d, not by us (uid %d) or root: not read"
                % (path, info.st_uid, os.geteuid())
            )
        if info.st_nlink != 1:  # a second name: a hard link someone made to another file of root's
            raise ValueError(
                "%s: has %d links, not the one we made: not read" % (path, info.st_nlink)
            )
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ValueError(
                "%s: mode %04o lets others write it: not read" % (path, stat.S_IMODE(info.st_mode))
            )
        os.set_blocking(fd, True)
        chunks = []
        left = limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


# -- directories by file descriptor ----------------------------------------------------------


def open_dir(path: str, create_mode: Optional[int] = None) -> int:
    """A descriptor of directory `path` (a configured path: symlinks in it are the admin's and followed);
    created with its parents when `create_mode` is given."""
    try:
        return os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        if create_mode is None:
            raise
    os.makedirs(path, mode=create_mode, exist_ok=True)
    return os.open(path, _DIR_FLAGS)


def open_subdir(dir_fd: int, name: str, create_mode: Optional[int] = None, where: str = "") -> int:
    """A descriptor of dir_fd/name, never through a symlink (ELOOP/ENOTDIR -> UnsafePath); made if missing."""
    label = os.path.join(where, name) if where else name
    for _ in range(2):
        try:
            return os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=dir_fd)
        except FileNotFoundError:
            if create_mode is None:
                raise
            try:
                os.mkdir(name, create_mode, dir_fd=dir_fd)
            except FileExistsError:  # another hook made it meanwhile
                pass
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise UnsafePath(
                    exc.errno,
                    "not a directory we made (a symlink or a file): refusing to use it",
                    label,
                ) from None
            raise
    raise UnsafePath(errno.ENOENT, "vanished while being created", label)


def check_owner(dir_fd: int, uid: int, where: str) -> None:
    """Refuse a directory owned by anyone but `uid` (who our own files belong to on that file system)."""
    info = os.fstat(dir_fd)
    if info.st_uid != uid:
        raise UnsafePath(
            errno.EPERM,
            "owned by uid %d, not by slurm-hooks (uid %d): refusing to write there "
            "(someone else made it; remove it or fix its owner)" % (info.st_uid, uid),
            where,
        )


def our_entries(
    dir_fd: int, names: "re.Pattern[str]", uid: int
) -> Iterator[Tuple[str, os.stat_result]]:
    """(name, lstat) of the regular files in dir_fd that we own (uid, one link) and whose name matches."""
    try:
        with os.scandir(dir_fd) as entries:
            listed = [entry.name for entry in entries]
    except OSError:
        return
    for name in listed:
        if not names.match(name):
            continue
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_uid == uid and info.st_nlink == 1:
            yield name, info


def remove_ours(dir_fd: int, name: str) -> bool:
    try:
        os.unlink(name, dir_fd=dir_fd)
        return True
    except OSError:
        return False


def remove_stale_temps(
    dir_fd: int,
    uid: int,
    max_age_s: float,
    now: Optional[float] = None,
    names: "re.Pattern[str]" = TEMP_NAME,
) -> List[str]:
    """Temp files of writers killed mid-write (ours, older than max_age_s); returns the names removed."""
    now = time.time() if now is None else now
    return [
        name
        for name, info in list(our_entries(dir_fd, names, uid))
        if now - info.st_mtime > max_age_s and remove_ours(dir_fd, name)
    ]
