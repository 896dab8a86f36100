"""Whether anyone but us could change what is in a directory: the rule for the directories whose
files decide actions ([paths] state_dir: which drain is ours to lift, the drain history a lemon is
judged by; a qualification's work dir: the job script run as root and the verdict it prints).

atomicio.read_ours refuses a file someone else wrote, but a user who can write the directory, or
rename one above it, can still delete or swap our own files (an old node-state.json put back, the
drain history emptied). A directory is trusted when it and every directory above it is owned by root
or by us, and none is writable by group or others, except that a directory above it may be when it
is sticky (/tmp: there only a name's owner may rename or delete it).

The path is walked as the kernel resolves it, one name at a time, not as os.path.realpath's answer:
a symbolic link on the way counts as much as a directory, since whoever may re-point it decides
where the path leads. So the directory holding a link is judged like any directory passed through,
and the link itself must be owned by root or us (in a sticky directory its owner may replace it).
Read with os.lstat and os.readlink only: the answer costs a system call or two per path component.
"""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import List, Optional, Tuple
_MAX_LINKS = 40  # the kernel's own limit (ELOOP)


def untrusted_because(path: str) -> Optional[str]:
    """None when the directory `path` is trusted; else why not, naming the directory (or link) at
    fault. A directory that does not exist yet is judged by its nearest existing parent (we create
    it 0700). OSError (a hung or vanished file system) is left to the caller: unknown is not trusted."""
    trusted_uids = (0, os.geteuid())
    current = "/"
    why = _judge_directory(current, os.lstat(current), trusted_uids, leaf=False)
    if why:
        return why
    pending = _names(os.path.abspath(path))
    links = 0
    missing = False
    while pending:
        name = pending.pop(0)
        if name == "..":  # current is already resolved: its parent was judged on the way down
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, name)
        try:
            info = os.lstat(candidate)
        except FileNotFoundError:
            missing = True  # the rest is made by us, in current
            break
        if stat.S_ISLNK(info.st_mode):
            if info.st_uid not in trusted_uids:
                return "%s is a symbolic link owned by uid %d, not by root or us (uid %d)" % (
                    candidate,
                    info.st_uid,
                    os.geteuid(),
                )
            links += 1
            if links > _MAX_LINKS:
                return "%s: too many levels of symbolic links" % path
            target = os.readlink(candidate)
            if target.startswith("/"):
                current = "/"
            pending = _names(target) + pending
            continue
        why = _judge_directory(candidate, info, trusted_uids, leaf=False)
        if why:
            return why
        current = candidate
    if missing:
        return None
    return _judge_directory(current, os.lstat(current), trusted_uids, leaf=True)


def _names(path: str) -> List[str]:
    return [name for name in path.split("/") if name not in ("", ".")]


def _judge_directory(
    where: str, info: os.stat_result, trusted_uids: Tuple[int, int], leaf: bool
) -> Optional[str]:
    """Why `where` (lstat `info`) lets someone else change what lies below it, or None. Writable by
    others is excused only above the leaf and only when sticky."""
    if not stat.S_ISDIR(info.st_mode):
        return "%s is not a directory" % where
    if info.st_uid not in trusted_uids:
        return "%s is owned by uid %d, not by root or us (uid %d)" % (
            where,
            info.st_uid,
            os.geteuid(),
        )
    others_write = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if others_write and (leaf or not info.st_mode & stat.S_ISVTX):
        return "%s is writable by others (mode %04o): chmod go-w" % (
            where,
            stat.S_IMODE(info.st_mode),
        )
    return None
