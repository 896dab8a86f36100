"""Slurm's configuration-file syntax (slurm.conf, gres.conf), read the way Slurm's own parser reads it.

Behaviour taken from Slurm 25.11 src/common/parse_config.c (s_p_parse_file, _get_next_line,
_keyvalue_regex, _parse_include_directive) and src/common/read_config.c (get_extra_conf_path):

- per physical line, everything from a '#' not escaped by an odd number of backslashes is a comment;
- an odd number of backslashes at the end of a line (trailing blanks allowed) continues it: the next
  line is appended as it is, with no blank added (``Name=gpu \\`` + ``File=x`` keeps the blank
  written before the backslash);
- then every ``\\x`` becomes ``x`` (``\\#`` is a '#', ``\\\\`` one backslash);
- a line is ``Key=Value`` words; keys are case-insensitive, blanks around '=' are allowed, a value is
  either ``"quoted, with blanks"`` (quotes removed) or a run of non-blank characters, and
  ``Key+=`` / ``-=`` / ``*=`` / ``/=`` are operators Slurm keeps apart (we keep the key);
- a line starting with ``include`` (any case) and a blank names a file to read in its place; a
  relative name is taken from the directory of the top-level file (Slurm: the directory of
  slurm.conf, where gres.conf also lives), ``%c`` is the ClusterName set earlier, and a name with
  '*' is refused (Slurm does not expand globs).

Slurm follows includes without any bound; we stop at MAX_DEPTH nested files, MAX_FILES files and
MAX_BYTES in all, so an include loop or a huge include is a clear ParseError, never a hang.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat

from ..core.lazyre import lazy_compile
from ..hw.host import HostError, ParseError

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Tuple

    # (path, at most this many bytes) -> the file's bytes, None if it does not exist; raises HostError
    Reader = Callable[[str, int], Optional[bytes]]

MAX_DEPTH = 8  # nested includes; real sites use one or two levels
MAX_FILES = 64
MAX_BYTES = 4 << 20  # all files together; a 4,000-node slurm.conf is ~400 KB

_KEY_VALUE = lazy_compile(
    r'[ \t\r\f\v]*([A-Za-z0-9_.]+)[ \t\r\f\v]*([-*+/]?)=[ \t\r\f\v]*(?:"([^"]*)"|(\S+))(?=\s|$)'
)


# a line made only of Key=Value words (no quotes, no blanks around '='): split() reads it right
_PLAIN_LINE = lazy_compile(r'\s*(?:[A-Za-z0-9_.]+[-*+/]?=[^\s"]\S*(?:\s+|\Z))*\Z')


class ConfLine:
    """One logical line. A plain slotted class: a 4,000-node slurm.conf makes 4,000 of them per run."""

    __slots__ = ("where", "text", "pairs", "leftover")

    def __init__(self, where: str, text: str, pairs: Tuple[Tuple[str, str], ...], leftover: str):
        self.where = where  # "file:line" of the line's first physical line
        self.text = text  # the logical line: comments, continuations and escapes resolved
        self.pairs = pairs  # (key lower-case, value) in order
        self.leftover = leftover  # what is not Key=Value (Slurm: "Parse error"); '' when clean

    def __repr__(self) -> str:
        return "ConfLine(%r, %r)" % (self.where, self.text)

    def first_key(self) -> str:
        return self.pairs[0][0] if self.pairs else ""

    def fields(self) -> Dict[str, str]:
        """The pairs as a dict (a repeated key: the last one, as Slurm's hash table keeps it)."""
        return dict(self.pairs)


def split_pairs(text: str) -> Tuple[Tuple[Tuple[str, str], ...], str]:
    """One logical line -> ((key lower, value), ...), leftover text that is not Key=Value."""
    if _PLAIN_LINE.match(text):  # the common line, Key=Value words: split, as fast as before
        pairs = []
        for word in text.split():
            key, _, value = word.partition("=")
            pairs.append(((key[:-1] if key[-1] in "-*+/" else key).lower(), value))
        return tuple(pairs), ""
    pairs = []
    position = 0
    while True:
        match = _KEY_VALUE.match(text, position)
        if not match:
            break
        value = match.group(3) if match.group(3) is not None else match.group(4)
        pairs.append((match.group(1).lower(), value))
        position = match.end()
    return tuple(pairs), text[position:].strip()


def logical_lines(text: str) -> List[Tuple[int, str]]:
    """File text -> [(first physical line number, logical line)], as _get_next_line builds them."""
    out: List[Tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.split("\n"), 1):
        line = _strip_comment(raw) if "#" in raw else raw
        if not pending and "\\" not in line:  # the common line: nothing to join or unescape
            out.append((number, line))
            continue
        joined, continued = _strip_continuation(line)
        if not pending:
            start = number
        pending += joined
        if not continued:
            out.append((start, _strip_escapes(pending)))
            pending = ""
    if pending:  # a backslash on the very last line: Slurm reads to EOF and keeps what it has
        out.append((start, _strip_escapes(pending)))
    return out


def _strip_comment(line: str) -> str:
    position = line.find("#")
    while position >= 0:
        before = line[:position]
        if (len(before) - len(before.rstrip("\\"))) % 2 == 0:  # not escaped by an odd run of '\'
            return before
        position = line.find("#", position + 1)
    return line


def _strip_continuation(line: str) -> Tuple[str, bool]:
    body = line.rstrip()
    count = len(body) - len(body.rstrip("\\"))
    if count % 2 == 1:
        return body[:-1], True
    return line, False


def _strip_escapes(line: str) -> str:
    # Slurm's _strip_escapes: a backslash is dropped and the next character kept as it is
    return re.sub(r"\\(.?)", r"\1", line, flags=re.S) if "\\" in line else line


def read_top(path: str, read: Reader) -> Optional[str]:
    """The top-level file's text (None: it does not exist), read whole up to MAX_BYTES: a bigger one
    is a ParseError, never a silently cut file (Host.read_text stops at 1 MiB without a word)."""
    data = read(path, MAX_BYTES + 1)
    if data is None:
        return None
    if len(data) > MAX_BYTES:
        raise ParseError(path, path, "at most %d bytes of configuration in all" % MAX_BYTES)
    return data.decode("utf-8", errors="replace")


def read_conf(path: str, read: Optional[Reader], text: Optional[str] = None) -> List[ConfLine]:
    """Every logical line of `path` and the files it includes, in Slurm's order.

    `text`: the top-level file's content when the caller has it already; `read` None: text only
    (an include is then an error). Errors (a missing or unreadable include, a loop, too many or too
    large files) are ParseError/HostError naming the file.
    """
    state = _ReadState(read, posixpath.dirname(path) or ".")
    if text is None:
        text = state.load(path, path)
    else:
        state.count(path, len(text.encode("utf-8", "replace")))
    out: List[ConfLine] = []
    state.parse(path, text, out, (path,))
    return out


class _ReadState:
    def __init__(self, read: Optional[Reader], top_dir: str):
        self.read, self.top_dir = read, top_dir
        self.files, self.bytes = 0, 0
        self.cluster_name = ""

    def count(self, path: str, size: int) -> None:
        self.files += 1
        self.bytes += size
        if self.files > MAX_FILES:
            raise ParseError(path, path, "at most %d included files" % MAX_FILES)
        if self.bytes > MAX_BYTES:
            raise ParseError(path, path, "at most %d bytes of configuration in all" % MAX_BYTES)

    def load(self, path: str, where: str) -> str:
        left = MAX_BYTES - self.bytes
        data = self.read(path, left + 1) if self.read is not None else None
        if data is None:
            raise HostError(path, "no such file (%s)" % where)
        self.count(path, len(data))
        return data.decode("utf-8", errors="replace")

    def parse(self, path: str, text: str, out: List[ConfLine], chain: Tuple[str, ...]) -> None:
        for number, line in logical_lines(text):
            where = "%s:%d" % (path, number)
            included = _include_target(line)
            if included is not None:
                self._include(included, where, line, out, chain)
                continue
            pairs, leftover = split_pairs(line)
            if pairs and pairs[0][0] == "clustername":
                self.cluster_name = pairs[0][1].lower()
            if pairs or leftover:
                out.append(ConfLine(where, line.strip(), pairs, leftover))

    def _include(
        self, name: str, where: str, line: str, out: List[ConfLine], chain: Tuple[str, ...]
    ) -> None:
        if self.read is None:
            raise ParseError(where, line, "no include (reading text, not files)")
        if "%c" in name:
            if not self.cluster_name:
                raise ParseError(where, line, "ClusterName set before an include with %c")
            name = name.replace("%c", self.cluster_name)
        if "*" in name:
            raise ParseError(where, line, "one file name (Slurm does not expand '*' in include)")
        target = posixpath.normpath(posixpath.join(self.top_dir, name))
        if target in chain:
            raise ParseError(where, line, "no include loop (%s)" % " -> ".join(chain + (target,)))
        if len(chain) > MAX_DEPTH:
            raise ParseError(where, line, "includes nested at most %d deep" % MAX_DEPTH)
        self.parse(target, self.load(target, "included at " + where), out, chain + (target,))


def _include_target(line: str) -> Optional[str]:
    """'include /etc/slurm/nodes.conf' -> the file name (Slurm: 'include' at the very start, any case)."""
    if line[:7].lower() != "include" or len(line) == 7 or not line[7].isspace():
        return None
    words = line[7:].split()
    if len(words) > 1:  # Slurm: the rest of the line must be blank ("Parse error")
        raise ParseError("include", line, "one file name after include")
    return words[0] if words else None


def host_reader(host) -> Reader:
    """A Reader over a Host (rooted at / or at a capture): regular files only, so an include of
    /dev/zero or a FIFO is an error instead of megabytes of zeros or a read that never returns."""

    def read(path: str, max_bytes: int) -> Optional[bytes]:
        try:
            mode = os.stat(host.real(path)).st_mode
        except FileNotFoundError:  # through the Host, so a capture records the file as absent
            return host.read_bytes(path, default=None, max_bytes=max_bytes)
        except OSError as exc:
            raise HostError(path, exc.strerror or str(exc)) from None
        if not stat.S_ISREG(mode):
            raise HostError(path, "not a regular file")
        return host.read_bytes(path, default=None, max_bytes=max_bytes)

    return read
