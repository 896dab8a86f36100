"""File locks (flock(2)) that wait a bounded time: the one place slurm-hooks waits for another process.

A holder that hangs (a hook stuck on a dead file system) must not hang every later hook too. Users:
records/metrics.py (the metrics state file), records/dcgm.py (dcgm-exporter's mapping directory),
slurm/nodelock.py (one drain decision at a time per node) and `slurm-hooks xid ack` (cli/xid_verbs.py,
an admin's command: it may wait as long as it takes). Shell equivalent: `flock -w SECONDS FILE`.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time

from .atomicio import open_dir

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Optional


class LockTimeout(OSError):
    """Another process holds the lock (maybe a hook stuck on a hung file system)."""


def flock_within(fd: int, timeout: Optional[float]) -> bool:
    """flock(LOCK_EX) on `fd`, waiting at most `timeout` seconds (None: as long as it takes); whether
    it was taken. Polls with LOCK_NB, 2 ms doubling to 50 ms; other OSErrors propagate."""
    if timeout is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True
    end = time.monotonic() + timeout
    delay = 0.002
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= end:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


class locked:  # noqa: N801 - used like a function: `with locked(path, timeout):`
    """flock(LOCK_EX) on `path` (a file, or a directory: no lock file then), for at most `timeout`
    seconds (None: no limit), else LockTimeout naming the path. Closing releases the lock."""

    def __init__(
        self,
        path: str,
        timeout: Optional[float],
        create_dir_mode: Optional[int] = None,
        directory: bool = False,
    ):
        self.path, self.timeout, self.directory, self.create_dir_mode = (
            path,
            timeout,
            directory,
            create_dir_mode,
        )
        self.fd = -1

    def __enter__(self) -> "locked":
        if self.directory:
            self.fd = open_dir(self.path, self.create_dir_mode)
        else:
            self.fd = os.open(
                self.path,
                os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                0o600,
            )
        try:
            taken = flock_within(self.fd, self.timeout)
        except BaseException:
            self.__exit__()
            raise
        if not taken:
            self.__exit__()
            raise LockTimeout(
                errno.EWOULDBLOCK,
                "lock held by another process for %.3gs" % self.timeout,
                self.path,
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing releases the lock
            self.fd = -1
