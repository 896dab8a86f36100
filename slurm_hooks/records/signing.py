"""Records that prove their writer: an HMAC-SHA256 with a root-only key shared by the nodes.

Why: on root_squash NFS every node's root writes records as uid 65534, and so can any process that
runs as 65534 anywhere; file ownership cannot tell a node's epilog from a forger, and a forged record
(invented jobs and users) could get a healthy node drained by `report --stragglers --drain`.

Key: [records] key_file (/etc/slurm-hooks/records.key), 32 random bytes or more, owned by root (or
by whoever runs the report) and writable by no one else, the same file on every node and on the
admin host that drains (distributed like munge.key; docs/records.md says how). Munge itself was
considered: a credential expires after its TTL (300 s) and unmunge refuses a replayed one, so it
cannot prove anything about a record read a week later, and one unmunge per record is 100,000
round trips to munged per report.

What is signed: the record's first line (the header the reports read alone: job, node, times, boot
id, summary with the fail-slow figures), a SHA-256 of the rest of the file, and the node directory
and file name the record was written to. The first line then ends `,"body_sha256":"...","mac":"...",`
(the file stays one JSON document). A copy of a genuine record into another node's directory or
under another name does not verify; nor does any change to a byte of it.

Without a key the epilog writes the record unsigned (a missing key never fails a hook), and the
reports read every record as unverified: shown, never drained on.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from typing import Optional, Tuple

from ..core.lazyre import lazy_compile

MIN_KEY_BYTES = 32
MAX_KEY_BYTES = 4096
DOMAIN = b"slurm-hooks.record-mac/1\n"
# a signed first line ends `,"mac":"<64 hex>",\n`; the MAC covers everything before `,"mac":`,
# which ends `,"body_sha256":"<64 hex>"`. Fixed positions: the scan checks 100,000 lines per run.
_MAC_OPEN, _MAC_CLOSE, _HASH_OPEN = b',"mac":"', b'",\n', b',"body_sha256":"'
_MAC_TAIL_LEN = len(_MAC_OPEN) + 64 + len(_MAC_CLOSE)
_HASH_TAIL_LEN = len(_HASH_OPEN) + 64 + 1
_HEX = lazy_compile(rb"^[0-9a-f]{64}$")
VERIFIED, UNSIGNED, BAD_MAC, BAD_BODY = "verified", "unsigned", "bad MAC", "body changed"


class KeyProblem(ValueError):
    """The key file exists but cannot be trusted or read; the message names it and says why."""


def load_key(path: str) -> Optional[bytes]:
    """The key in `path`; None when there is no such file (or path is ""): records then go unsigned
    and unverified. KeyProblem for a key anyone but its owner may change or everyone may read (any
    user could sign a forged record), of another owner than root or us, not a regular file, shorter than MIN_KEY_BYTES or unreadable."""
    if not path:
        return None
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise KeyProblem(
            "%s: cannot read the records key: %s" % (path, exc.strerror or exc)
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise KeyProblem("%s: the records key is not a regular file" % path)
        if info.st_uid not in (0, os.geteuid()):
            raise KeyProblem(
                "%s: the records key belongs to uid %d, not root" % (path, info.st_uid)
            )
        if info.st_mode & 0o022:
            raise KeyProblem(
                "%s: the records key is writable by others (mode %o): chmod 0600"
                % (path, stat.S_IMODE(info.st_mode))
            )
        if info.st_mode & 0o004:  # whoever reads it signs: a forged record would verify
            raise KeyProblem(
                "%s: the records key is readable by everyone (mode %o): chmod 0600"
                % (path, stat.S_IMODE(info.st_mode))
            )
        key = os.read(fd, MAX_KEY_BYTES + 1)
    finally:
        os.close(fd)
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise KeyProblem(
            "%s: the records key has %d bytes, expected %d to %d"
            % (path, len(key), MIN_KEY_BYTES, MAX_KEY_BYTES)
        )
    return key


def _mac(key: bytes, node: str, name: str, signed: bytes) -> bytes:
    message = b"".join((DOMAIN, node.encode("utf-8"), b"\n", name.encode("utf-8"), b"\n", signed))
    return hmac.digest(key, message, "sha256").hex().encode("ascii")


def signed_lines(header_open: bytes, body: bytes, key: bytes, node: str, name: str) -> bytes:
    """The record file: `header_open` (the header object without its closing brace), the body's
    hash and the MAC on the first line, then `body` (the rest of the object and a newline)."""
    signed = header_open + b',"body_sha256":"' + hashlib.sha256(body).hexdigest().encode() + b'"'
    return signed + b',"mac":"' + _mac(key, node, name, signed) + b'",\n' + body


def verify_line(first_line: bytes, key: bytes, node: str, name: str) -> Tuple[str, bytes]:
    """(VERIFIED | UNSIGNED | BAD_MAC, the body's hash the line vouches for) for a record's first
    line (newline included) found at <node directory>/<name>."""
    start = len(first_line) - _MAC_TAIL_LEN
    if (
        start < 0
        or not first_line.endswith(_MAC_CLOSE)
        or first_line[start : start + len(_MAC_OPEN)] != _MAC_OPEN
    ):
        return UNSIGNED, b""
    signed, given = first_line[:start], first_line[start + len(_MAC_OPEN) : -len(_MAC_CLOSE)]
    if not hmac.compare_digest(_mac(key, node, name, signed), given):
        return BAD_MAC, b""
    body_hash = signed[-_HASH_TAIL_LEN + len(_HASH_OPEN) : -1]
    opened = signed[-_HASH_TAIL_LEN : -_HASH_TAIL_LEN + len(_HASH_OPEN)] == _HASH_OPEN
    return VERIFIED, body_hash if opened and _HEX.match(body_hash) else b""


def verify_file(data: bytes, key: bytes, node: str, name: str) -> str:
    """VERIFIED | UNSIGNED | BAD_MAC | BAD_BODY for a whole record file (`record show`)."""
    end = data.find(b"\n")
    if end < 0:
        return UNSIGNED
    status, body_hash = verify_line(data[: end + 1], key, node, name)
    if status != VERIFIED:
        return status
    if hashlib.sha256(data[end + 1 :]).hexdigest().encode() != body_hash:
        return BAD_BODY
    return VERIFIED


class Verifier:
    """What a report checks records with: the key, or why there is none (then every record is
    unverified). `node` and `name`: the record's directory name and file name."""

    def __init__(self, key: Optional[bytes], why_not: str = ""):
        self.key = key
        self.why_not = why_not or ("" if key else "no records key")

    @classmethod
    def from_file(cls, path: str) -> "Verifier":
        try:
            key = load_key(path)
        except KeyProblem as exc:
            return cls(None, str(exc))
        return cls(
            key, "" if key else "no records key at %s" % (path or "([records] key_file empty)")
        )

    def line(self, first_line: bytes, path: str) -> str:
        if self.key is None:
            return UNSIGNED
        directory, _, name = path.rpartition(os.sep)
        node = directory.rpartition(os.sep)[2]
        if node in ("", ".", ".."):  # a bare or relative file name: abspath knows its parent
            node = os.path.basename(os.path.dirname(os.path.abspath(path)))
        return verify_line(first_line, self.key, node, name)[0]
