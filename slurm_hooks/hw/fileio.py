"""Bounded reads below Host (hw/host.py): the system calls, without the Host's path mapping.

read_file/read_fd read sysfs and procfs files, which may return less than asked before their end;
file_kind says what a descriptor is (under a root only regular files are read: a device node or
FIFO that tar made from a crafted archive is never opened for data); read_log_tail reads a
captured kernel log from its end; statvfs_entry checks one record of a capture's statvfs.json.
Kept apart from host.py so that it stays within its size; errors are for Host to name.
"""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, List, Optional, Sequence, Tuple
CHUNK = 1 << 16  # one read(2) of a sysfs attribute (<= one page) or a typical procfs file
KMSG_FILE_MAX_BYTES = 32 << 20  # a captured kernel log: 100,000 records of ~300 bytes


def read_file(path: str, max_bytes: int) -> bytes:
    """At most max_bytes of a file, read in CHUNK pieces until EOF.

    Not open(path, "rb").read(max_bytes): that allocates a max_bytes (1 MiB) buffer per call, which
    made a 5-byte sysfs read cost ~25 us instead of ~8 us, and a prolog does ~500 of them. sysfs and
    procfs may return less than asked before the end, so read until a read returns nothing.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return read_fd(fd, max_bytes)
    finally:
        os.close(fd)


def read_fd(fd: int, max_bytes: int) -> bytes:
    chunk = os.read(fd, min(CHUNK, max_bytes))
    if not chunk or len(chunk) >= max_bytes:
        return chunk
    chunks = [chunk]
    size = len(chunk)
    while size < max_bytes:
        chunk = os.read(fd, min(CHUNK, max_bytes - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def file_kind(fd: int) -> Optional[str]:
    """None for a regular file, else what it is ('a character device', 'a FIFO', ...)."""
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode):
        return None
    for test, kind in (
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return kind
    return "a socket"


def read_log_tail(fd: int, max_records: int) -> List[str]:
    """The newest max_records lines of a kernel log kept as a file (one record per line), reading
    at most KMSG_FILE_MAX_BYTES from its end."""
    size = os.fstat(fd).st_size
    start = max(0, size - KMSG_FILE_MAX_BYTES)
    with os.fdopen(os.dup(fd), "rb") as handle:
        handle.seek(start)
        data = handle.read(KMSG_FILE_MAX_BYTES)
    # "\n" only, as the capture wrote them: splitlines() would also cut at VT, FF or U+2028 that a
    # user's process name put into a record, making a forged record of its tail
    lines = data.decode("utf-8", errors="replace").split("\n")
    if lines and not lines[-1]:
        lines.pop()
    if start and lines:
        lines = lines[1:]  # the first line was cut by the seek
    return lines[-max_records:]


def statvfs_entry(entry: Any, fields: Sequence[str]) -> Tuple[Optional[List[int]], str]:
    """(values, '') for one statvfs.json record, or (None, what was expected).

    Checked the way statvfs(2) fills it: whole, non-negative counts, the available part no larger
    than the total (f_bavail <= f_blocks, f_favail <= f_files). A float such as 1e400, a negative
    count or a nested object is refused.
    """
    if not isinstance(entry, dict):
        return None, "an object {%s}" % ", ".join(fields)
    values = []
    for key in fields:
        value = entry.get(key)
        if type(value) is not int or not 0 <= value < 1 << 64:
            return None, "%s as a whole number >= 0" % key
        values.append(value)
    named = dict(zip(fields, values))
    if named["f_bavail"] > named["f_blocks"] or named["f_favail"] > named["f_files"]:
        return None, "f_bavail <= f_blocks and f_favail <= f_files"
    return values, ""
