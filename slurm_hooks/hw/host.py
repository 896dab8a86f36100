"""Host: every read of /sys, /proc, /dev, /etc and the kernel log goes through here.

``Host("/")`` reads the live machine; ``Host("/tmp/captured")`` reads a captured or fake tree
the same way (``slurm-hooks check --root DIR``). Paths given to a Host are absolute *host* paths
("/sys/bus/pci/devices"); they are mapped under the root, and symlinks are resolved inside it so
a captured tree never leaks into the real machine. Reads are bounded in size. A missing file
raises MissingFile unless the caller passes ``default=`` (then a missing optional file is explicit).

A Host given a ReadLog records every path it touches and what it read: `slurm-hooks capture`
archives exactly that (slurm_hooks.hw.capture), so the list of captured files cannot drift from
what the checks read.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import posixpath
import stat

from ..core.structs import TupleRecord
from .fileio import CHUNK as _CHUNK
from .fileio import file_kind, statvfs_entry
from .fileio import read_fd as _read_fd
from .fileio import read_file as _read_file
from .fileio import read_log_tail as _read_log_file

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Set, Tuple

DEFAULT_MAX_BYTES = 1 << 20  # 1 MiB: more than any sysfs/procfs file we read
_MISSING: Any = object()
_MAX_SYMLINKS = 40
CAPTURE_DIR = (
    "/.slurm-hooks"  # a capture's own metadata, beside sys/ and proc/ (slurm_hooks.hw.capture)
)
CAPTURED_STATVFS = CAPTURE_DIR + "/statvfs.json"


class HostError(Exception):
    """A read from the host failed; names the host path."""

    def __init__(self, path: str, message: str):
        super().__init__("%s: %s" % (path, message))
        self.path = path


class MissingFile(HostError):
    """The file does not exist (and no default was given)."""


class LiveOnly(HostError):
    """The value exists only on the running machine (statvfs, NVML) and this tree does not hold it."""


class ParseError(HostError):
    """The file exists but its content is not what we expected."""

    def __init__(self, path: str, value: str, expected: str):
        shown = value if len(value) <= 80 else value[:77] + "..."
        super().__init__(path, "cannot parse %r: expected %s" % (shown, expected))
        self.value = value
        self.expected = expected


class FsUsage(TupleRecord):
    """The statvfs(2) fields the checks use (os.statvfs_result has the same names)."""

    f_blocks: int
    f_bavail: int
    f_files: int
    f_favail: int


class ReadLog:
    """Every host path a Host touched in a run, with what it read (`slurm-hooks capture`).

    Checks run in threads; each record is one dict/set operation, atomic under the GIL.
    """

    def __init__(self) -> None:
        self.files: Dict[str, bytes] = {}  # host path -> the bytes read (bounded like the read)
        self.dirs: Dict[str, List[str]] = {}  # host path -> the entries listed
        self.probed: Set[str] = set()  # exists/isdir/realpath/readlink: the path itself matters
        self.missing: Set[str] = set()  # asked for and absent
        self.statvfs: Dict[str, FsUsage] = {}
        self.kmsg: Dict[str, List[str]] = {}  # kernel log records read from a character device


class Host:
    def __init__(self, root: str = "/", log: Optional[ReadLog] = None):
        self.root = os.path.abspath(root)
        self._live = self.root == "/"
        self._dir_cache: Dict[str, str] = {}
        # resolved paths already found not to be links: a link's target shares its directories with
        # its siblings' (/sys/bus/pci/devices/* -> ../../../devices/pci0000:00/0000:00:01.0/...), so
        # each is lstat'ed once per run, not once per link through it (the directory cache's rule)
        self._not_links: Set[str] = set()
        # pids(): the real /proc, and under a root the pids whose entry is a real directory
        self._proc_scan: Optional[Tuple[str, Optional[Set[int]]]] = None
        self._pid_open_flags = os.O_RDONLY | os.O_CLOEXEC
        if not self._live:  # the last component is never followed, a FIFO never waited on
            self._pid_open_flags |= os.O_NOFOLLOW | os.O_NONBLOCK
        self.log = log

    def __repr__(self) -> str:
        return "Host(%r)" % self.root

    @property
    def is_live(self) -> bool:
        return self._live

    # -- paths -------------------------------------------------------------------------------
    def path(self, host_path: str) -> str:
        """The real filesystem path of a host path (no symlink resolution)."""
        if not host_path.startswith("/"):
            raise ValueError("host paths are absolute, got %r" % host_path)
        if self._live:
            return host_path
        return (
            self.root + host_path
        )  # abspath'd root has no trailing slash; one concatenation per read

    def real(self, host_path: str) -> str:
        """The real filesystem path to open for a host path.

        Under a non-/ root, symlinks (absolute ones included) are resolved inside the root so a
        captured tree can never make us read the live machine's files.
        """
        return host_path if self._live else self.path(self.realpath(host_path))

    def real_link(self, host_path: str) -> str:
        """The real path of a symlink itself (its directory resolved, the link not followed)."""
        if self.is_live:
            return host_path
        directory, base = posixpath.split(host_path)
        return posixpath.join(self.real(directory), base)

    def realpath(self, host_path: str) -> str:
        """Resolve symlinks like os.path.realpath, but never outside the root; returns a host path.

        Parent directories come from a cache (a run reads many files in few sysfs directories),
        so resolving costs one lstat per new path component. Iterative, not recursive: a crafted
        tree's link whose target has thousands of components is walked, not a RecursionError,
        and more than 40 links in one resolution is ELOOP, as in the kernel.
        """
        if self.log is not None:
            self.log.probed.add(host_path)
        directory, base = posixpath.split(host_path)
        if not base:
            return "/" if directory == "/" else self._resolve_dir(directory, host_path)
        return self._walk(self._resolve_dir(directory, host_path), [base], host_path)

    def _resolve_dir(self, directory: str, asked: str) -> str:
        """The resolved host path of `directory`, caching it and every ancestor resolved on the way."""
        cached = self._dir_cache.get(directory)
        if cached is not None:
            return cached
        pending = []
        probe = directory
        while probe not in ("/", "") and probe not in self._dir_cache:
            pending.append(probe)
            probe = posixpath.dirname(probe)
        current = self._dir_cache.get(probe, "/")
        for prefix in reversed(pending):
            current = self._walk(current, [posixpath.basename(prefix)], asked)
            self._dir_cache[prefix] = current
        return current

    def _walk(self, current: str, parts: List[str], asked: str) -> str:
        """Resolve the components `parts` below the resolved host path `current`, following links."""
        pending = list(reversed(parts))
        hops = 0
        while pending:
            part = pending.pop()
            if part in ("", "."):
                continue
            if part == "..":
                current = posixpath.dirname(current)
                continue
            candidate = current + "/" + part if current != "/" else "/" + part
            if candidate in self._not_links:
                current = candidate
                continue
            real = candidate if self._live else self.root + candidate
            if not os.path.islink(real):
                self._not_links.add(candidate)
                current = candidate
                continue
            hops += 1
            if hops > _MAX_SYMLINKS:
                raise HostError(asked, "too many levels of symbolic links")
            try:
                target = os.readlink(real)
            except OSError as exc:
                raise HostError(asked, exc.strerror or str(exc)) from None
            if target.startswith("/"):
                current = "/"
            pending.extend(reversed(target.split("/")))
        return current

    # -- reads -------------------------------------------------------------------------------
    def read_bytes(
        self, host_path: str, default: Any = _MISSING, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> bytes:
        try:
            if self._live:
                data = _read_file(host_path, max_bytes)
            else:
                data = self._read_in_tree(host_path, max_bytes)
        except FileNotFoundError:
            if self.log is not None:
                self.log.missing.add(host_path)
            if default is not _MISSING:
                return default
            raise MissingFile(host_path, "no such file") from None
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR,) and default is not _MISSING:
                return default
            raise HostError(host_path, exc.strerror or str(exc)) from None
        if self.log is not None:
            self.log.files[host_path] = data
        return data

    def _read_in_tree(self, host_path: str, max_bytes: int) -> bytes:
        """read_bytes under a root: the file's directory resolved inside the root (cached), the file
        itself opened without following a link. Only when it is a link (ELOOP) is it resolved
        (realpath), so a plain file costs no lstat and no walk: a prolog reads ~700 of them."""
        directory, base = posixpath.split(host_path)
        if self.log is None and base not in ("", ".", ".."):  # a capture records what realpath saw
            resolved = self._resolve_dir(directory, host_path)
            plain = self.root + (resolved if resolved != "/" else "") + "/" + base
            try:
                return _read_tree_file(plain, host_path, max_bytes)
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
        return _read_tree_file(self.real(host_path), host_path, max_bytes)

    def read_text(
        self, host_path: str, default: Any = _MISSING, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> str:
        """File content decoded as UTF-8 (bad bytes replaced), trailing newline stripped."""
        data = self.read_bytes(
            host_path, default=_MISSING if default is _MISSING else None, max_bytes=max_bytes
        )
        if data is None:
            return default
        return data.decode("utf-8", errors="replace").rstrip("\n")

    def read_int(self, host_path: str, default: Any = _MISSING, base: int = 10) -> int:
        text = self.read_text(host_path, default=None if default is not _MISSING else _MISSING)
        if text is None:
            return default
        try:
            return int(text.strip().rstrip("\0"), base)  # "\n\0": see parse_cpulist
        except ValueError:
            raise ParseError(host_path, text, "an integer (base %d)" % base) from None

    def exists(self, host_path: str) -> bool:
        if self.log is not None:
            self.log.probed.add(host_path)
        return os.path.lexists(self.real(host_path))

    def isdir(self, host_path: str) -> bool:
        if self.log is not None:
            self.log.probed.add(host_path)
        return os.path.isdir(self.real(host_path))

    def listdir(self, host_path: str, default: Any = _MISSING) -> List[str]:
        try:
            names = sorted(os.listdir(self.real(host_path)))
        except (FileNotFoundError, NotADirectoryError):
            if self.log is not None:
                self.log.missing.add(host_path)
            if default is not _MISSING:
                return default
            raise MissingFile(host_path, "no such directory") from None
        except OSError as exc:
            raise HostError(host_path, exc.strerror or str(exc)) from None
        if self.log is not None:
            self.log.dirs[host_path] = names
        return names

    # -- /proc/<pid>/ scans -------------------------------------------------------------------
    def pids(self) -> List[int]:
        """The process ids in /proc, ascending (`ls /proc`); [] without a /proc.

        One scandir(3): under a root, the directory entry's own type says whether /proc/<pid> is
        a real directory, so read_pid_file() can open files below it without resolving the path
        component by component (two lstat(2) per file were 56 % of a 100,000-process scan). An
        entry that is a symlink in a tree is read the slow, contained way.
        """
        real = self.real("/proc")
        pids: List[int] = []
        direct: Optional[Set[int]] = None if self._live else set()
        try:
            with os.scandir(real) as entries:
                for entry in entries:
                    if entry.name.isdigit():
                        pid = int(entry.name)
                        pids.append(pid)
                        # "0123" or Unicode digits name another entry than "/proc/<pid>" opens
                        canonical = entry.name == str(pid)
                        if direct is not None and canonical and entry.is_dir(follow_symlinks=False):
                            direct.add(pid)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise HostError("/proc", exc.strerror or str(exc)) from None
        pids.sort()
        self._proc_scan = (real, direct)
        if self.log is not None:
            self.log.dirs["/proc"] = sorted(str(pid) for pid in pids)
        return pids

    def read_pid_file(
        self, pid: int, name: str, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> Optional[str]:
        """/proc/<pid>/<name> as text (trailing newline stripped); None when the process is gone.

        For the pids of the last pids() call; any other pid, a name with a "/", or a /proc/<pid>
        that is a symlink in a tree goes through read_text (resolved inside the root). The hot
        loop of a 100,000-process scan: one open, one read (procfs' per-process files are
        seq_files, which fill the buffer up to EOF; a regular file in a tree likewise), close.
        """
        scan = self._proc_scan
        if scan is None or (scan[1] is not None and pid not in scan[1]) or "/" in name:
            return self.read_text("/proc/%d/%s" % (pid, name), default=None, max_bytes=max_bytes)
        try:
            path = "%s/%d/%s" % (scan[0], pid, name)
            flags = self._pid_open_flags
            fd = (
                os.open(path, flags)
                if self._live
                else _open_tree(path, "/proc/%d/%s" % (pid, name), flags)
            )
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ESRCH, errno.ENOTDIR):  # exited meanwhile
                if self.log is not None:
                    self.log.missing.add("/proc/%d/%s" % (pid, name))
                return None
            raise HostError("/proc/%d/%s" % (pid, name), exc.strerror or str(exc)) from None
        try:
            first = min(max_bytes, _CHUNK)
            data = os.read(fd, first)
            if len(data) >= first and max_bytes > first:  # a long file: read on to max_bytes
                data += _read_fd(fd, max_bytes - first)
        except OSError as exc:
            if exc.errno == errno.ESRCH:  # exited between open and read
                return None
            raise HostError("/proc/%d/%s" % (pid, name), exc.strerror or str(exc)) from None
        finally:
            os.close(fd)
        if self.log is not None:
            self.log.files["/proc/%d/%s" % (pid, name)] = data
        return data.decode("utf-8", errors="replace").rstrip("\n")

    def glob(self, host_dir: str, pattern: str) -> List[str]:
        """Host paths of the entries of host_dir matching a shell pattern (sorted)."""
        return [
            host_dir.rstrip("/") + "/" + name
            for name in self.listdir(host_dir, default=[])
            if fnmatch.fnmatchcase(name, pattern)
        ]

    def statvfs(self, host_path: str) -> FsUsage:
        """Filesystem usage of the file system holding host_path (statvfs(2), like `df`).

        Under a root other than / this stats the analysing machine's file system that holds the
        tree: callers use captured_statvfs there unless told to read it live.
        """
        try:
            st = os.statvfs(self.real(host_path))
        except OSError as exc:
            raise HostError(host_path, exc.strerror or str(exc)) from None
        usage = FsUsage(st.f_blocks, st.f_bavail, st.f_files, st.f_favail)
        if self.log is not None:
            self.log.statvfs[host_path] = usage
        return usage

    def captured_statvfs(self, host_path: str) -> FsUsage:
        """What statvfs(2) said for host_path on the captured node (CAPTURED_STATVFS in the tree).

        Raises LiveOnly when the tree holds no such record: free space is a property of the running
        machine, and the analysing machine's own disk says nothing about the captured node.
        """
        import json  # only under --root

        text = self.read_text(CAPTURED_STATVFS, default=None)
        if text is None:
            raise LiveOnly(
                host_path,
                "free space is only known on the running node (statvfs(2)), and this "
                "tree has no %s" % CAPTURED_STATVFS,
            )
        expected = "a JSON object {path: {%s}}" % ", ".join(FsUsage._fields)
        try:
            table = json.loads(text)
        except (ValueError, RecursionError):  # RecursionError: a crafted [[[[...]]]]
            raise ParseError(CAPTURED_STATVFS, text, expected) from None
        if not isinstance(table, dict):
            raise ParseError(CAPTURED_STATVFS, text, expected)
        entry = table.get(host_path)
        usage = None if entry is None else _captured_usage(entry, host_path)
        if usage is None:
            raise LiveOnly(
                host_path, "not in this tree's %s (the capture did not stat it)" % CAPTURED_STATVFS
            )
        return usage

    def read_lines(
        self, host_path: str, default: Any = _MISSING, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> List[str]:
        text = self.read_text(
            host_path, default=None if default is not _MISSING else _MISSING, max_bytes=max_bytes
        )
        if text is None:
            return default
        return text.splitlines()

    def read_kmsg(self, host_path: str = "/dev/kmsg", max_records: int = 100000) -> List[str]:
        """Raw kernel log records, oldest first.

        On the live /dev/kmsg (a character device) each read() returns one record
        ("prio,seq,usec,flags;message") and EAGAIN at the end (we open it non-blocking, so it
        never waits for new messages); EPIPE means a record was overwritten while reading and
        is skipped. In a captured tree /dev/kmsg is a regular file with one record per line.
        Needs root (or CAP_SYSLOG) when dmesg_restrict=1; that is reported as a HostError.
        """
        real = self.real(host_path)
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if self._live else os.O_NOFOLLOW)
        try:
            fd = os.open(real, flags)
        except FileNotFoundError:
            raise MissingFile(host_path, "no such file") from None
        except OSError as exc:
            raise HostError(host_path, exc.strerror or str(exc)) from None
        try:
            if not self._live:
                _require_regular(fd, host_path)
            if not _is_char_device(fd):
                records = _read_log_file(fd, max_records)
            else:
                records = _read_kmsg_device(fd, max_records)
            if self.log is not None:
                self.log.kmsg[host_path] = records
            return records
        finally:
            os.close(fd)


def _captured_usage(entry: Any, host_path: str) -> FsUsage:
    """One statvfs.json record (fileio.statvfs_entry), else a ParseError naming the file and path."""
    values, expected = statvfs_entry(entry, FsUsage._fields)
    if values is None:
        raise ParseError("%s (entry %s)" % (CAPTURED_STATVFS, host_path), repr(entry), expected)
    return FsUsage(*values)


_NOT_REGULAR = (
    "not a regular file (%s): in a captured tree only regular files are read, so a device node "
    "that tar created (the analysing machine's own /dev/kmsg, /dev/zero) is never opened for data"
)


def _read_tree_file(real: str, host_path: str, max_bytes: int) -> bytes:
    """At most max_bytes of a regular file in a captured or fake tree (Host with a root other than /).

    Opened without following a last symlink (Host.real resolved them inside the tree already)
    and non-blocking; a device node or socket is a HostError (_open_tree).
    """
    fd = _open_tree(real, host_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        return _read_fd(fd, max_bytes)
    finally:
        os.close(fd)


def _open_tree(real: str, host_path: str, flags: int) -> int:
    """A descriptor of a regular file in a tree (opened with `flags`, which hold O_NONBLOCK).

    A FIFO is the one exception, reopened blocking: it is how the fake node stands for a sysfs
    read that hangs in a driver (tests/prolog_rig.py make_fifo), it carries nothing from the
    analysing machine, and its wait is bounded by the check's timeout like any hung read.
    Anything else that is not a regular file is a HostError naming the path and what it is.
    """
    fd = os.open(real, flags)
    kind = file_kind(fd)
    if kind is None:
        return fd
    os.close(fd)
    if kind == "a FIFO":
        return os.open(real, flags & ~os.O_NONBLOCK)
    raise HostError(host_path, _NOT_REGULAR % kind)


def _require_regular(fd: int, host_path: str) -> None:
    kind = file_kind(fd)
    if kind is not None:
        raise HostError(host_path, _NOT_REGULAR % kind)


def _is_char_device(fd: int) -> bool:
    return stat.S_ISCHR(os.fstat(fd).st_mode)


#: Reads of a live /dev/kmsg per call, at most: a ring buffer holds a few 10,000 records, but a process
#: writing to /dev/kmsg as fast as we read would otherwise keep the loop going for ever.
KMSG_MAX_READS = 1_000_000


def _read_kmsg_device(fd: int, max_records: int) -> List[str]:
    """The newest ``max_records`` records of the live device, oldest first.

    The device is read from its oldest record to its end (it cannot seek to "N records before the
    end"); only the newest ``max_records`` are kept, so memory stays bounded and a recent Xid is
    never the one dropped from a flooded log.
    """
    import collections

    records: "collections.deque[str]" = collections.deque(maxlen=max_records)
    for _ in range(KMSG_MAX_READS):
        try:
            chunk = os.read(fd, 8192)
        except BlockingIOError:
            break
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # ring buffer overwrote the record we were at
                continue
            if exc.errno == errno.EINVAL:  # record longer than our buffer: cannot happen at 8 KiB
                break
            raise HostError("/dev/kmsg", exc.strerror or str(exc)) from None
        if not chunk:
            break
        records.append(chunk.decode("utf-8", errors="replace").rstrip("\n"))
    return list(records)


def parse_cpulist(text: str, source: str = "<cpulist>") -> frozenset:
    """'0-3,8-11' -> {0,1,2,3,8,9,10,11}; '' -> empty. Raises ParseError naming the source.

    Some kernels (5.x, the topology *_list files turned into binary attributes) end a list with
    "\n\0": a trailing NUL is accepted.
    """
    cpus = set()
    text = text.strip().rstrip("\0").strip()
    if not text:
        return frozenset()
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo_text, hi_text = part.split("-", 1)
                step = 1
                if ":" in hi_text:  # kernel 'a-b:c/d' stride syntax is rare; accept a-b:step only
                    hi_text, step_text = hi_text.split(":", 1)
                    step = int(step_text.split("/")[0])
                lo, hi = int(lo_text), int(hi_text)
                if lo > hi or lo < 0 or hi - lo > 1 << 16:
                    raise ValueError
                cpus.update(range(lo, hi + 1, step))
            else:
                value = int(part)
                if value < 0:
                    raise ValueError
                cpus.add(value)
        except ValueError:
            raise ParseError(source, text, "a CPU list like '0-3,8-11'") from None
    return frozenset(cpus)


def parse_cpumask(text: str, source: str = "<cpumask>") -> frozenset:
    """'00000000,0000000f' (comma-separated 32-bit hex words, most significant first) -> {0,1,2,3}.

    The mask files (thread_siblings, core_siblings, local_cpus) are all that kernels before 2.6.26
    wrote; later ones add the *_list twins. Raises ParseError naming the source.
    """
    words = text.strip().rstrip("\0").strip().split(",")
    cpus = set()
    try:
        for position, word in enumerate(reversed(words)):
            value = int(word, 16)
            cpus.update(32 * position + bit for bit in range(32) if value >> bit & 1)
    except ValueError:
        raise ParseError(source, text, "a CPU mask like '00000000,0000000f'") from None
    return frozenset(cpus)


def format_cpulist(cpus) -> str:
    """{0,1,2,3,8} -> '0-3,8' (the kernel's own cpulist style)."""
    ordered = sorted(cpus)
    ranges: List[str] = []
    start = prev = None
    for cpu in ordered:
        if start is None:
            start = prev = cpu
        elif cpu == prev + 1:
            prev = cpu
        else:
            ranges.append(str(start) if start == prev else "%d-%d" % (start, prev))
            start = prev = cpu
    if start is not None:
        ranges.append(str(start) if start == prev else "%d-%d" % (start, prev))
    return ",".join(ranges)
