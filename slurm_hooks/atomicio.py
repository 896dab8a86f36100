"""Crash-safe small files: write to a temp file in the same directory, fsync, rename, fsync the directory.

A reader sees the old content or the new one, never a torn file, even after kill -9 or power loss.
Errors (ENOSPC, EROFS, EACCES) propagate as OSError with the path; callers decide whether to go on.
"""
from __future__ import annotations

import itertools
import json
import os
from typing import Any

_serial = itertools.count()


def write_atomic(path: str, data: bytes, mode: int = 0o600) -> None:
    directory = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    # O_EXCL with pid + counter instead of tempfile.mkstemp: same safety, without importing tempfile
    # (and random, shutil...) on the prolog's path. Leftovers of a killed writer start with '.'.
    tmp = os.path.join(directory, ".%s.%d.%d.tmp" % (os.path.basename(path), os.getpid(), next(_serial)))
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # left by a killed process that had our pid: nobody else can be writing it
        os.unlink(tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_json_atomic(path: str, value: Any, mode: int = 0o600) -> None:
    write_atomic(path, (json.dumps(value, indent=1, sort_keys=True) + "\n").encode("utf-8"), mode)


def read_json(path: str, default: Any = None) -> Any:
    """The JSON in path; `default` when it is missing. A corrupt file raises ValueError naming it."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(16 << 20)
    except FileNotFoundError:
        return default
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError("%s: corrupt JSON: %s" % (path, exc)) from None
