"""One drain/resume decision at a time per node: a bounded lock shared by the hooks of one node.

Two jobs starting on one node run two prologs at once; both may decide to drain. drainer's flow
(read, count, drain, re-count) is not atomic in Slurm, so the hooks take this lock around it and
the second finds the first's fresh record (hooks/enactment.py). flock(2) on a file in /run/slurm-hooks
(tmpfs: local, never hangs), or in state_dir when /run cannot be used (a non-root test run).
$SLURM_HOOKS_LOCK_DIR names another directory for /run/slurm-hooks, or with "off" leaves only
state_dir (the test suite does: its hooks, run as root, never make the host's /run/slurm-hooks).
"""

from __future__ import annotations

import os
import stat
import time
from typing import Optional, Tuple

from ..core.locks import flock_within

LOCK_DIR = "/run/slurm-hooks"
LOCK_DIR_ENV = "SLURM_HOOKS_LOCK_DIR"


def lock_dirs(state_dir: str) -> Tuple[str, ...]:
    """The directories the lock is tried in, in order: LOCK_DIR ($SLURM_HOOKS_LOCK_DIR when it names
    an absolute path), then state_dir; state_dir alone when the variable is "off", empty or relative
    (as for the parsed-configuration cache's $SLURM_HOOKS_CONFIG_CACHE, core/config_cache.py)."""
    chosen = os.environ.get(LOCK_DIR_ENV, LOCK_DIR)
    if not chosen or chosen == "off" or not os.path.isabs(chosen):
        return (state_dir,)
    return (chosen, state_dir)


class NodeLock:
    """Serialises the drain/resume decisions of the hooks of one node (two prologs of two jobs on one
    node deciding at once must make one drain). flock on a file in /run/slurm-hooks (tmpfs: local,
    never hangs), or in state_dir when /run cannot be used (a non-root test run). Waits at most
    `timeout` seconds; without the lock the caller goes on (logged): bounded beats exclusive.
    The holder removes the file before releasing it, so no lock files pile up; a waiter that then
    holds a lock on a removed file notices (the path is gone or another file) and tries again.
    """

    def __init__(self, state_dir: str, node: str, timeout: float) -> None:
        import hashlib

        digest = hashlib.sha1(("%s\0%s" % (os.path.abspath(state_dir), node)).encode()).hexdigest()[
            :16
        ]
        self.name = "drain-%s.lock" % digest
        self.dirs = lock_dirs(state_dir)
        self.timeout = timeout
        self.fd = -1
        self.path = ""
        self.acquired = False
        self.started = time.time()
        self.waited = 0.0
        self.error: Optional[str] = None

    def _open(self) -> bool:
        """The lock file in the first directory that will do. A directory others can write
        (core/dir_trust: $SLURM_HOOKS_LOCK_DIR=/tmp, a 0777 one) is passed over: its lock name is
        predictable, so a local user could hold it first (every drain then waits out its bound and
        goes on unlocked) or unlink it under the holder (two holders at once). A file that is not
        a regular file of ours with one link is passed over too."""
        from ..core.dir_trust import untrusted_because

        for directory in self.dirs:
            try:
                why = untrusted_because(directory)
                if why:
                    self.error = "%s: not used for the drain lock: %s" % (directory, why)
                    continue
                os.makedirs(directory, mode=0o700, exist_ok=True)
                path = os.path.join(directory, self.name)
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                info = os.fstat(fd)
                if (
                    not stat.S_ISREG(info.st_mode)
                    or info.st_uid != os.geteuid()
                    or info.st_nlink != 1
                ):
                    os.close(fd)
                    self.error = "%s: not a regular file of uid %d with one link" % (
                        path,
                        os.geteuid(),
                    )
                    continue
                self.fd = fd
                self.path = path
                return True
            except OSError as exc:
                self.error = "%s: %s" % (directory, exc)
        return False

    def __enter__(self) -> "NodeLock":
        self.started = time.time()
        start = time.monotonic()
        while self._open():
            try:
                taken = flock_within(self.fd, max(0.0, self.timeout - (time.monotonic() - start)))
            except OSError:  # e.g. ENOLCK: try again (bounded below)
                taken = False
            if taken:
                try:
                    same = os.stat(self.path).st_ino == os.fstat(self.fd).st_ino
                except OSError:
                    same = False
                if same:
                    self.acquired = True
                    break
            os.close(self.fd)
            self.fd = -1
            if time.monotonic() - start >= self.timeout:
                self.error = "still held by another hook after %.1fs" % self.timeout
                break
            time.sleep(0.02)
        self.waited = time.monotonic() - start
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            if self.acquired:
                try:
                    os.unlink(self.path)
                except OSError:
                    pass
            os.close(self.fd)  # releases the flock
            self.fd = -1
