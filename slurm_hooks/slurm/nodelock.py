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

from ..core.locks import flock_within

TYPE_CHECKING = False  # not typing's: a draining hook need not import it either
if TYPE_CHECKING:
    from typing import Optional, Tuple

LOCK_DIR = "/run/slurm-hooks"
LOCK_DIR_ENV = "SLURM_HOOKS_LOCK_DIR"
_MAX_FD = 1 << 20  # os.closerange's end (one close_range(2) call on Linux)
REMOVED_RETRIES = 20  # looks for a new lock file while holders keep removing theirs
# file systems whose server can stop answering (statfs(2) magic names as /proc/self/mounts
# writes them); any "fuse.*" too (sshfs, s3fs, gcsfuse...)
NETWORK_FS = frozenset(
    (
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ncpfs",
        "lustre",
        "gpfs",
        "ceph",
        "glusterfs",
        "beegfs",
        "9p",
        "afs",
        "ocfs2",
        "gfs2",
        "fuse",
        "fuseblk",
    )
)
OPEN_FLOOR_S = 0.1  # the least time one look for the lock file is given (NodeLock._open)


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

    def _open(self, seconds: float) -> bool:
        """The lock file (_find_file), looked for by a forked child that hands its descriptor back
        over a socket (SCM_RIGHTS: the same open file, so our flock on it is the lock), waited for
        at most `seconds`. With /run unusable the lock falls back to state_dir, which may be on a
        file system that stopped answering (NFS): a makedirs, lstat or open there never returns,
        and a thread stuck so would keep this process from exiting (slurmd would wait for the
        hook). The child is killed instead and left to init if it cannot die, as the check
        process is (core/isolation.py), and the hook goes on without the lock, saying so."""
        import socket

        from ..core.isolation import _reap

        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError as exc:  # no descriptor left (EMFILE): go on without the lock, as below
            self.error = "cannot start the lock's opener: %s" % exc
            return False
        try:
            pid = os.fork()
        except OSError as exc:
            ours.close()
            theirs.close()
            self.error = "cannot start the lock's opener: %s" % exc
            return False
        if pid == 0:  # the child: never return into the caller's stack
            try:
                # it may outlive us stuck in the kernel: it keeps none of our descriptors (slurmd's
                # pipes, the hook's), or whoever reads them would wait for it
                keep = theirs.fileno()
                null = os.open(os.devnull, os.O_RDWR)
                for standard in (0, 1, 2):
                    os.dup2(null, standard)
                os.closerange(3, keep)
                os.closerange(keep + 1, _MAX_FD)
                fd, path, error = self._find_file()
                # the path as the file system has it (any bytes but NUL), then why, if anything
                message = os.fsencode(path) + b"\0" + error.encode("utf-8", "replace")
                socket.send_fds(theirs, [message], [fd] if fd >= 0 else [])
            finally:
                os._exit(0)
        theirs.close()
        hung = False
        try:
            ours.settimeout(max(seconds, 0.0))
            message, fds = _receive(ours)
        except socket.timeout:
            message, fds, hung = b"", [], True
        except OSError:
            message, fds = b"", []
        finally:
            ours.close()
        _reap(pid, kill=not message)
        if not message:
            self.error = (
                "%s: did not answer within %.1fs (hung file system?)"
                % (" or ".join(self.dirs), seconds)
                if hung
                else "the lock's opener (pid %d) ended without an answer" % pid
            )
            return False
        raw_path, _, error = message.partition(b"\0")
        path = os.fsdecode(raw_path)
        if error:
            self.error = error.decode("utf-8", "replace")
        if not fds:
            return False
        os.set_inheritable(fds[0], False)  # close-on-exec, as opened: no command we start keeps it
        self.fd, self.path = fds[0], path
        return True

    def _find_file(self) -> Tuple[int, str, str]:
        """(fd, path, "") of the lock file in the first directory that will do, else (-1, "", why). A
        directory others can write (core/dir_trust: $SLURM_HOOKS_LOCK_DIR=/tmp, a 0777 one) is
        passed over: its lock name is predictable, so a local user could hold it first (every drain
        then waits out its bound and goes on unlocked) or unlink it under the holder (two holders
        at once). A file that is not a regular file of ours with one link is passed over too, but
        for one its holder just removed (no link left: the holder is done), looked for again.
        A directory on a network file system is passed over: the lock is held while the hook
        talks to Slurm, and a server that stops answering then would hang its flock, unlink or
        close, which no child can bound (the descriptor is ours)."""
        from ..core.dir_trust import untrusted_because

        error = ""
        for directory in self.dirs:
            try:
                why = untrusted_because(directory)
                if why:
                    error = "%s: not used for the drain lock: %s" % (directory, why)
                    continue
                os.makedirs(directory, mode=0o700, exist_ok=True)
                kind = mount_type(os.path.realpath(directory))
                if is_network_fs(kind):
                    error = "%s: not used for the drain lock: on a %s file system" % (
                        directory,
                        kind,
                    )
                    continue
                path = os.path.join(directory, self.name)
                for _attempt in range(REMOVED_RETRIES):
                    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                    info = os.fstat(fd)
                    ours = stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()
                    if ours and info.st_nlink == 0:  # removed by its holder meanwhile: a new one
                        os.close(fd)
                        fd = -1
                        continue
                    break
                if not ours or info.st_nlink != 1:
                    if fd >= 0:
                        os.close(fd)
                    error = "%s: not a regular file of uid %d with one link" % (
                        path,
                        os.geteuid(),
                    )
                    continue
                return fd, path, error
            except OSError as exc:
                error = "%s: %s" % (directory, exc)
        return -1, "", error

    def __enter__(self) -> "NodeLock":
        self.started = time.time()
        start = time.monotonic()
        # each look for the file may take OPEN_FLOOR_S even at the bound's end (a directory that
        # answers does in microseconds): a late one is then never mistaken for a hung one
        while self._open(max(self.timeout - (time.monotonic() - start), OPEN_FLOOR_S)):
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


def _receive(sock) -> Tuple[bytes, list]:
    """One message and the descriptor passed with it, close-on-exec from the moment it exists here
    (MSG_CMSG_CLOEXEC: socket.recv_fds of Python 3.9-3.11 does not pass its flags on)."""
    import array
    import socket

    fds = array.array("i")
    message, ancillary, _flags, _address = sock.recvmsg(
        1 << 16, socket.CMSG_SPACE(fds.itemsize), getattr(socket, "MSG_CMSG_CLOEXEC", 0)
    )
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    return message, list(fds)


def mount_type(path: str, mounts: Optional[str] = None) -> str:
    """The file system type of the mount holding absolute `path` (hw/procfs.holding_mount, as `df`
    finds it) in `mounts`, /proc/self/mounts by default; "" when unknown. Reading /proc never
    waits on a file server."""
    from ..hw.procfs import ParseError, holding_mount, parse_mounts

    if mounts is None:
        try:
            with open("/proc/self/mounts", encoding="utf-8", errors="surrogateescape") as handle:
                mounts = handle.read()
        except OSError:
            return ""
    try:
        mount = holding_mount(path, parse_mounts(mounts, "/proc/self/mounts"))
    except ParseError:
        return ""
    return mount.fstype if mount is not None else ""


def is_network_fs(kind: str) -> bool:
    return kind in NETWORK_FS or kind.startswith("fuse.")
