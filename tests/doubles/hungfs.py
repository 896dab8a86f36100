"""A file system that never answers: a FUSE mount whose server replies to INIT and to nothing else.

Every lookup, mkdir, open, write or fsync below the mount point then waits for an answer that never
comes, exactly as on an NFS or Lustre mount whose server died (the caller sleeps killably in the
kernel, as with NFS `hard` mounts). The server is a few lines of Python speaking the FUSE kernel
protocol on /dev/fuse directly (include/uapi/linux/fuse.h: fuse_in_header, fuse_out_header,
fuse_init_out), so it needs no libfuse, fusepy or fusermount: only root (mount(2)) and /dev/fuse.

    with HungFileSystem(path) as mount:      # path: an empty directory
        ...                                  # anything under `path` blocks
    # leaving aborts the connection (waiters get ENOTCONN) and detaches the mount

`require_fuse()` skips the test where FUSE cannot be mounted, or fails it when CI=true (.ci/run runs
as root and loads the fuse module).
"""

from __future__ import annotations

import ctypes
import errno
import os
import select
import struct
import threading

import pytest

FUSE_INIT = 26
_IN_HEADER = struct.Struct("<IIQQIIII")  # len, opcode, unique, nodeid, uid, gid, pid, padding
_OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
MNT_DETACH = 2


class FuseUnavailable(Exception):
    pass


def _libc():
    return ctypes.CDLL(None, use_errno=True)


class HungFileSystem:
    def __init__(self, mountpoint: str):
        self.mountpoint = str(mountpoint)
        self.fd = -1
        self.requests = []  # opcodes seen (INIT answered, the rest left waiting)
        self._thread = None
        self._stop = threading.Event()

    def __enter__(self) -> "HungFileSystem":
        if not os.path.exists("/dev/fuse"):
            raise FuseUnavailable("/dev/fuse does not exist (modprobe fuse)")
        self.fd = os.open("/dev/fuse", os.O_RDWR)
        # a process forked while the mount is up (the hook's bounded children, run in-process by a
        # test) would keep the connection open: __exit__'s close would then not abort it, and a
        # child stuck on the mount would sleep uninterruptibly forever. Forks do not keep it.
        os.register_at_fork(after_in_child=self._close_in_child)
        options = "fd=%d,rootmode=40000,user_id=0,group_id=0,allow_other" % self.fd
        if (
            _libc().mount(
                b"slurm-hooks-hung", self.mountpoint.encode(), b"fuse", 0, options.encode()
            )
            != 0
        ):
            code = ctypes.get_errno()
            os.close(self.fd)
            raise FuseUnavailable("mount -t fuse %s: %s" % (self.mountpoint, os.strerror(code)))
        self._thread = threading.Thread(target=self._serve, name="hungfs", daemon=True)
        self._thread.start()
        return self

    def _close_in_child(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:  # poll first: a read blocked in another thread would keep the device open after close()
                if not select.select([self.fd], [], [], 0.05)[0]:
                    continue
                request = os.read(self.fd, 1 << 20)
            except (OSError, ValueError):  # ENODEV once the connection is aborted
                return
            if len(request) < _IN_HEADER.size:
                continue
            _length, opcode, unique, _node, _uid, _gid, _pid, _ = _IN_HEADER.unpack_from(request)
            self.requests.append(opcode)
            if opcode == FUSE_INIT:
                major, minor, readahead, _flags = struct.unpack_from(
                    "<IIII", request, _IN_HEADER.size
                )
                # fuse_init_out (64 bytes): major, minor, max_readahead, flags, max_background,
                # congestion_threshold, max_write, time_gran, max_pages, map_alignment, flags2, unused[7]
                body = struct.pack(
                    "<IIIIHHIIHHI", 7, min(minor, 31), readahead, 0, 16, 12, 1 << 16, 1, 0, 0, 0
                )
                body += b"\0" * (64 - len(body))
                try:
                    os.write(
                        self.fd, _OUT_HEADER.pack(_OUT_HEADER.size + len(body), 0, unique) + body
                    )
                except OSError:
                    return
            # every other request stays unanswered: its caller waits forever

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        if self.fd >= 0:
            os.close(
                self.fd
            )  # the last reference: the connection is aborted, every waiter gets ENOTCONN
            self.fd = -1
        if (
            _libc().umount2(self.mountpoint.encode(), MNT_DETACH) != 0
            and ctypes.get_errno() != errno.EINVAL
        ):
            raise OSError(ctypes.get_errno(), "umount %s" % self.mountpoint)


def require_fuse(tmp_path) -> None:
    """Skip (or with CI=true fail) when a FUSE file system cannot be mounted here."""
    reason = None
    if os.geteuid() != 0:
        reason = "mounting a FUSE file system needs root"
    else:
        probe = tmp_path / ".fuse-probe"
        probe.mkdir()
        try:
            with HungFileSystem(str(probe)):
                pass
        except (FuseUnavailable, OSError) as exc:
            reason = str(exc)
        finally:
            probe.rmdir()
    if reason is None:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(
            "cannot mount a hung FUSE file system: %s -- CI=true, so this is an error, not a skip"
            % reason
        )
    pytest.skip("cannot mount a hung FUSE file system: %s" % reason)
