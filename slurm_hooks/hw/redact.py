"""What `slurm-hooks capture` removes from the files it archives, and what a site may leave out.

Three layers, all applied to the bytes a check read before they enter the archive:
- by path: /proc/<pid>/environ, cmdline and the memory maps never go in; /proc/<pid>/status keeps
  only the lines the checks parse (no Uid/Gid/Groups, no memory figures); a file named slurm.conf
  (by the name the check asked for or the name its symlinks lead to) keeps only NodeName lines;
- by content, in every text file and in the kernel log: the value of any `KEY=value` or
  `KEY: value` whose key names a secret (ends in Pass, Passwd, Password, Passphrase, Pwd, Secret,
  Token, Key(s), Credential(s), or holds Password, Passwd, Secret or Token anywhere:
  AccountingStoragePass, JobCompPass, StoragePass, jwt_key, api_token) becomes <redacted>, and so
  does the password of a URL's user:password@ whatever its key, so a
  secret is removed whatever the file is called (a slurm.conf that is a symlink to
  slurm-prod.conf kept its AccountingStoragePass);
- by choice (`capture --exclude`): whole categories a site must not share (EXCLUDABLE).
Binary files (a NUL before the end: PCI config space) are left as read: a key=value inside them is
not text, and changing them would change the verdicts.
"""

from __future__ import annotations

import posixpath
from typing import Any, Dict, Iterable, Optional, Tuple

from ..core.lazyre import lazy_compile

NEVER = (
    "environ",
    "cmdline",
    "mem",
    "pagemap",
    "kcore",
    "auxv",
    "maps",
    "smaps",
)  # /proc/<pid>/ files
STATUS_KEEP = ("Name", "Kthread", "Cpus_allowed_list", "Mems_allowed_list", "Tgid", "Pid", "PPid")
REDACTED = b"<redacted>"

# `KEY=` or `KEY:` at the start of a token, the key possibly quoted (JSON's `"password": "x"`).
# Linear time: the lookbehind lets a key start only where a token starts, and a key is at most 128
# characters (a pattern that let any position start a key and searched it for a secret word took
# 20 s on 10 KB without separators)
_ASSIGNMENT = lazy_compile(rb"(?<![A-Za-z0-9_.\-])([A-Za-z0-9_.\-]{1,128})[\"']?[ \t]*[=:][ \t]*")
# a quoted value (backslash escapes inside: JSON's "a\"b c"), else everything up to the next
# whitespace: a quote inside an unquoted value is part of the secret (StoragePass=ab"cd kept "cd)
_VALUE = lazy_compile(rb"\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*'|\S+")
# the password of a URL's user information (RFC 3986 "scheme://user:password@host"), whatever its key:
# JobCompLoc=http://slurm:s3cr3t@elastic:9200 names no secret in its key
_URL_PASSWORD = lazy_compile(
    rb"([A-Za-z][A-Za-z0-9+.\-]{0,31}://[^\s/:@\"']{0,64}:)[^\s/@\"']{1,128}(?=@)"
)
_SECRET_SUFFIXES = (
    "pass",
    "passwd",
    "password",
    "passphrase",
    "pwd",
    "secret",
    "token",
    "key",
    "keys",
    "credential",
    "credentials",
)
_SECRET_WORDS = ("password", "passwd", "secret", "token")
# whole keys ending in a secret's suffix that name none: the kernel log's CPU mitigation line
# ("Speculative Store Bypass: Mitigation: ...", seen in a real H200 node's capture, where
# "Mitigation:" was replaced). Whole keys only: StandbyPass, DerbyPass end in "bypass" too
_NOT_SECRET_KEYS = frozenset(("bypass",))


def is_secret_key(key: str) -> bool:
    """AccountingStoragePass, jwt_key, api_token_file, StandbyPass: yes; iommu.passthrough,
    AuthType, Bypass: no."""
    lower = key.lower()
    if lower in _NOT_SECRET_KEYS:
        return False
    return lower.endswith(_SECRET_SUFFIXES) or any(word in lower for word in _SECRET_WORDS)


# capture --exclude NAME: what each category leaves out of the archive (host paths)
EXCLUDABLE: Dict[str, str] = {
    "kernel-log": "the kernel log records (/dev/kmsg): the Xid checks are UNKNOWN on replay",
    "cmdline": "the kernel command line (/proc/cmdline): topology.iommu judges an empty one on replay",
    "processes": "every /proc/<pid>/ entry (process names, cgroups, CPU masks): "
    "system.processes and numa.housekeeping see no process on replay",
}


# the checks whose results quote what a category holds (an Xid line, the command line, process
# names): with the category excluded, capture.json keeps their status only
QUOTED_BY: Dict[str, Tuple[str, ...]] = {
    "kernel-log": ("xid.",),
    "cmdline": ("topology.iommu",),
    "processes": ("system.processes", "numa.housekeeping"),
}


def hide_excluded_verdicts(report: Dict[str, Any], exclude: Iterable[str]) -> Dict[str, Any]:
    """The capture run's report (report_format.report_to_dict) with the summaries and details of
    the checks quoting an excluded category replaced by a note; statuses are kept."""
    prefixes = {p: name for name in exclude for p in QUOTED_BY.get(name, ())}
    for run in report.get("checks", []):
        hit = next((n for p, n in prefixes.items() if run.get("name", "").startswith(p)), None)
        if hit is None:
            continue
        for result in run.get("results", []):
            result["summary"] = "(left out: capture --exclude %s)" % hit
            result["details"] = {}
    return report


def is_proc_pid_file(path: str, names: Tuple[str, ...]) -> bool:
    parts = path.strip("/").split("/")
    return (
        len(parts) == 3
        and parts[0] == "proc"
        and (parts[1].isdigit() or parts[1] == "self")
        and parts[2] in names
    )


def redact_secrets(data: bytes) -> Tuple[bytes, int]:
    """(data with every secret-named key's value replaced by <redacted>, how many were replaced)."""
    if b"\0" in data.rstrip(b"\0\n"):
        return data, 0  # binary (PCI config space): not key=value text
    pieces, done, count = [], 0, 0
    for match in _ASSIGNMENT.finditer(data):
        if match.start() < done or not is_secret_key(match.group(1).decode("ascii")):
            continue  # inside a value already replaced, or not a secret's key
        value = _VALUE.match(data, match.end())
        if value is None:
            continue
        pieces += [data[done : match.end()], REDACTED]
        done = value.end()
        count += 1
    if count:
        pieces.append(data[done:])
        data = b"".join(pieces)
    if b"://" not in data:
        return data, count
    data, in_urls = _URL_PASSWORD.subn(lambda m: m.group(1) + REDACTED, data)
    return data, count + in_urls


def redact(host_path: str, data: bytes, aliases: Iterable[str] = ()) -> Tuple[Optional[bytes], str]:
    """(content to archive or None to leave the file out, what was removed or '').

    `aliases` are other host paths of the same file (the path a check asked for, before its
    symlinks were resolved): a name rule applies when any of them matches.
    """
    if is_proc_pid_file(host_path, NEVER):
        return None, "left out"
    notes = []
    if is_proc_pid_file(host_path, ("status",)):
        lines = data.decode("utf-8", "replace").splitlines()
        kept = [line for line in lines if line.split(":", 1)[0] in STATUS_KEEP]
        data = ("\n".join(kept) + "\n").encode()
        notes.append("only %s kept" % ", ".join(STATUS_KEEP))
    names = {posixpath.basename(path) for path in (host_path, *aliases)}
    if "slurm.conf" in names:
        lines = data.decode("utf-8", "replace").splitlines()
        kept = [line for line in lines if line.strip().lower().startswith("nodename=")]
        data = ("\n".join(kept) + "\n").encode()
        notes.append("only NodeName lines kept")
    data, hidden = redact_secrets(data)
    if hidden:
        notes.append("%d secret value%s replaced" % (hidden, "s" if hidden > 1 else ""))
    return data, "; ".join(notes)


def excluded(host_path: str, categories: Iterable[str]) -> bool:
    """Whether a host path falls in one of the `capture --exclude` categories."""
    categories = set(categories)
    parts = host_path.strip("/").split("/")
    if "kernel-log" in categories and host_path == "/dev/kmsg":
        return True
    if "cmdline" in categories and host_path == "/proc/cmdline":
        return True
    return (
        "processes" in categories
        and len(parts) >= 2
        and parts[0] == "proc"
        and (parts[1].isdigit() or parts[1] in ("self", "thread-self"))
    )


def parse_exclude(values: Iterable[str]) -> Tuple[str, ...]:
    """`--exclude kernel-log,cmdline` (repeatable) -> the categories; ValueError naming an unknown one."""
    chosen = []
    for value in values:
        for name in value.split(","):
            name = name.strip()
            if not name:
                continue
            if name not in EXCLUDABLE:
                raise ValueError(
                    "--exclude %r: not one of %s" % (name, ", ".join(sorted(EXCLUDABLE)))
                )
            chosen.append(name)
    return tuple(sorted(set(chosen)))
