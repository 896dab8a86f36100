"""Whether anyone but us could change what is in a directory: the rule for the directories whose
files decide actions ([paths] state_dir: which drain is ours to lift, the drain history a lemon is
judged by; a qualification's work dir: the job script run as root and the verdict it prints).

atomicio.read_ours refuses a file someone else wrote, but a user who can write the directory, or
rename one above it, can still delete or swap our own files (an old node-state.json put back, the
drain history emptied). A directory is trusted when it and every directory above it is owned by root
or by us, and none is writable by group or others, except that a directory above it may be when it
is sticky (/tmp: there only a name's owner may rename or delete it). Read with os.stat only: the
answer costs one system call per path component.
"""

from __future__ import annotations

import os
import stat
from typing import Optional


def untrusted_because(path: str) -> Optional[str]:
    """None when the directory `path` is trusted; else why not, naming the directory at fault. A
    directory that does not exist yet is judged by its nearest existing parent (we create it 0700).
    OSError (a hung or vanished file system) is left to the caller: unknown is not trusted."""
    trusted_uids = (0, os.geteuid())
    leaf = os.path.realpath(path)
    current = leaf
    while not os.path.lexists(current):
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    while True:
        info = os.stat(current)
        if not stat.S_ISDIR(info.st_mode):
            return "%s is not a directory" % current
        if info.st_uid not in trusted_uids:
            return "%s is owned by uid %d, not by root or us (uid %d)" % (
                current,
                info.st_uid,
                os.geteuid(),
            )
        others_write = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if others_write and (current == leaf or not info.st_mode & stat.S_ISVTX):
            return "%s is writable by others (mode %04o): chmod go-w" % (
                current,
                stat.S_IMODE(info.st_mode),
            )
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent
