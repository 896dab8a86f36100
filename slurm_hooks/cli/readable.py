"""Records directories this user may not read: said as permission denied, not as absent records.

The hooks write records as root (directories 0700, files 0600); run by another user, `record show`
would say "no record" and `report` would report nothing, hiding the real cause.
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional

from ..result import ExitCode


def unreadable(directories: List[str]) -> List[str]:
    """The records directories, and node directories in them, that this user may not list: as a
    user other than root the records (mode 0700/0600, written by the hooks as root) look absent
    otherwise, and "no record" would hide the real cause."""
    denied = []
    for top in directories:
        try:
            with os.scandir(top) as entries:
                subdirs = [e.path for e in entries if e.is_dir(follow_symlinks=False)]
        except PermissionError:
            denied.append(top)
            continue
        except OSError:  # absent or not a directory: the report says so itself
            continue
        denied.extend(d for d in subdirs if not os.access(d, os.R_OK | os.X_OK))
    return denied


def permission_message(denied: List[str]) -> str:
    return "permission denied reading %s%s (records are written by root: run this as root)" % (
        ", ".join(denied[:3]),
        " and %d more" % (len(denied) - 3) if len(denied) > 3 else "",
    )


def refuse_unreadable(directories: List[str]) -> Optional[int]:
    """UNKNOWN when a whole records directory cannot be read; a warning for node directories."""
    denied = unreadable(directories)
    if any(d in directories for d in denied):
        print(
            "slurm-hooks: %s" % permission_message([d for d in denied if d in directories]),
            file=sys.stderr,
        )
        return ExitCode.UNKNOWN
    if denied:
        print("slurm-hooks: warning: left out: %s" % permission_message(denied), file=sys.stderr)
    return None
