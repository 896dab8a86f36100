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

import contextlib
import re
import threading

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Iterator

_compile = re.compile  # the real one, whatever re.compile is while compiled_on_use() lasts
_METHODS = ("match", "search", "fullmatch", "finditer", "findall", "sub", "subn", "split")


class LazyPattern:
    """re.compile(pattern, flags), deferred until used. `pattern` and `flags` are readable at once."""

    def __init__(self, pattern: str, flags: int = 0):
        self.pattern = pattern
        self.flags = flags

    def compiled(self) -> "re.Pattern[str]":
        pattern = _compile(self.pattern, self.flags)
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


@contextlib.contextmanager
def compiled_on_use() -> Iterator[None]:
    """While it lasts, re.compile called from this thread returns a LazyPattern (str patterns).

    For importing a standard module whose module-level patterns a hook never uses: `logging`
    compiles the '{' style's two at import, `string` Template's (pynvml imports string too): ~1 ms
    of the prolog's process, ~0.35 ms of its check process (round 8). A LazyPattern answers match, search,
    sub, finditer... as the compiled pattern would, compiling it on the first use. Other threads
    (a check process runs several) get re.compile's own answer meanwhile."""
    real = re.compile
    me = threading.get_ident()

    def compile_on_use(pattern: Any, flags: int = 0) -> Any:
        if isinstance(pattern, str) and threading.get_ident() == me:
            return LazyPattern(pattern, flags)
        return real(pattern, flags)

    re.compile = compile_on_use  # type: ignore[assignment]
    try:
        yield
    finally:
        if re.compile is compile_on_use:
            re.compile = real
