"""Regular expressions compiled on first use instead of at import.

re.compile costs 0.1-1 ms per pattern on this project's 2-core VM (the Xid line pattern alone
~0.7 ms), and a module-level pattern is compiled by every process that imports the module,
whether or not it ever reads the kind of line it is for: xid/kmsg.py holds patterns for six dmesg
and journalctl formats that a prolog reading /dev/kmsg never meets (~5 ms of every prolog's
start-up before this). A LazyPattern compiles on the first attribute other than `pattern` and
`flags`, then keeps the compiled pattern's methods as its own attributes, so a hot loop's
`_RE.match` costs what the compiled pattern's does.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any
_METHODS = ("match", "search", "fullmatch", "finditer", "findall", "sub", "subn", "split")


class LazyPattern:
    """re.compile(pattern, flags), deferred until used. `pattern` and `flags` are readable at once."""

    def __init__(self, pattern: str, flags: int = 0):
        self.pattern = pattern
        self.flags = flags

    def compiled(self) -> "re.Pattern[str]":
        pattern = re.compile(self.pattern, self.flags)
        for name in _METHODS:
            setattr(self, name, getattr(pattern, name))
        self.groups, self.groupindex = pattern.groups, pattern.groupindex
        return pattern

    def __getattr__(self, name: str) -> Any:  # only for attributes not set yet: the first use
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.compiled(), name)

    def __repr__(self) -> str:
        return "LazyPattern(%r)" % self.pattern


def lazy_compile(pattern: str, flags: int = 0) -> LazyPattern:
    return LazyPattern(pattern, flags)
