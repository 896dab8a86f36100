"""`slurm-hooks capture OUT.tar.gz`: archive exactly the files the checks read on this node.

The checks run once, every one of them (all contexts), on a Host that records every path it
touches (host.ReadLog). The archive then holds those paths and nothing else, so the list cannot
drift from what the checks read, and `slurm-hooks check --root DIR` on the unpacked tree
reproduces the node's verdicts (docs/admin.md "Captures"). The archive's config.toml is data: it is
compared with the analysing machine's configuration, never applied (hw/replay.py).

What goes in, under one top directory named after the node:
- every file a check read, with the bytes it read (so the archive matches the verdicts even when
  the node changes meanwhile); every directory a check listed, with its sub-directories and
  symlinks; the symlinks on the way to each path (sysfs is mostly links), as links;
- paths a check only tested for existence, as empty files (their content was not needed; device
  nodes such as /dev/nvidia0 are never opened);
- the kernel log records read (/dev/kmsg becomes a regular file, one record per line; the
  dictionary lines after a record are metadata and are dropped);
- .slurm-hooks/: capture.json (what was captured, when, with which version, the verdicts of that
  run), statvfs.json (free space of the file systems the checks stat, which `check --root` reads
  instead of the analysing machine's disks) and config.toml (the effective configuration).
What never goes in, whatever a check did: process environments and command lines (/proc/<pid>/
environ, cmdline), and what hw/redact.py removes (the status lines the checks do not parse,
slurm.conf's lines other than NodeName, the value of every secret-named key in any text file, the
kernel log and the verdicts) or `capture --exclude` leaves out (kernel-log, cmdline, processes).
Live-only sources are not captured: NVML (the driver's view of the GPUs) and statvfs of paths the
checks did not stat. Under --root those checks SKIP and say why.
"""

from __future__ import annotations

import io
import json
import os
import posixpath
import stat
import tarfile
import time
from typing import Any, Dict, List, Optional, Tuple

from .host import CAPTURE_DIR, CAPTURED_STATVFS, Host, ReadLog
from .redact import (
    EXCLUDABLE,
    NEVER,
    excluded,
    hide_excluded_verdicts,
    is_proc_pid_file,
    redact,
    redact_secrets,
)

SCHEMA = "slurm-hooks.capture/1"
_MAX_HOPS = 40


class CaptureError(Exception):
    """The capture could not be written; the message says why."""


class _Tree:
    """The archive's entries by host path: ('dir',), ('link', target), ('file', bytes)."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.entries: Dict[str, Tuple[Any, ...]] = {}

    def real(self, host_path: str) -> str:
        return host_path if self.root == "/" else os.path.join(self.root, host_path.lstrip("/"))

    def add_path(self, host_path: str, hops: int = 0) -> Optional[str]:
        """Add every component of host_path (links as links, then their targets); the resolved host path."""
        if hops > _MAX_HOPS:
            return None
        current = "/"
        parts = [p for p in host_path.split("/") if p and p != "."]
        for index, part in enumerate(parts):
            if part == "..":
                current = posixpath.dirname(current)
                continue
            candidate = posixpath.join(current, part)
            try:
                info = os.lstat(self.real(candidate))
            except OSError:
                return None
            if stat.S_ISLNK(info.st_mode):
                target = os.readlink(self.real(candidate))
                self.entries.setdefault(candidate, ("link", target))
                resolved = (
                    target
                    if target.startswith("/")
                    else posixpath.normpath(posixpath.join(current, target))
                )
                rest = "/".join(parts[index + 1 :])
                return self.add_path(posixpath.join(resolved, rest) if rest else resolved, hops + 1)
            if stat.S_ISDIR(info.st_mode):
                self.entries.setdefault(candidate, ("dir",))
            else:
                self.entries.setdefault(
                    candidate, ("file", b"")
                )  # content set by the caller if it was read
            current = candidate
        return current

    def add_listing(self, host_path: str, names: List[str]) -> None:
        """A listed directory: its sub-directories and symlinks (regular files only when read)."""
        directory = self.add_path(host_path)
        if directory is None:
            return
        for name in names:
            child = posixpath.join(directory, name)
            try:
                info = os.lstat(self.real(child))
            except OSError:
                continue  # gone meanwhile (a process exited)
            if stat.S_ISLNK(info.st_mode):
                self.entries.setdefault(child, ("link", os.readlink(self.real(child))))
            elif stat.S_ISDIR(info.st_mode):
                self.entries.setdefault(child, ("dir",))


def plan(
    root: str, log: ReadLog, exclude: Tuple[str, ...] = ()
) -> Tuple[Dict[str, Tuple[Any, ...]], List[str]]:
    """The archive entries for what `log` recorded on the tree at `root`, and the redactions made.

    `exclude`: `capture --exclude` categories (redact.EXCLUDABLE) left out entirely.
    """
    tree = _Tree(root)
    redactions: List[str] = []
    for path in sorted(log.probed):
        tree.add_path(path)
    for path, names in sorted(log.dirs.items()):
        tree.add_listing(path, names)
    for path, data in sorted(log.files.items()):
        resolved = tree.add_path(path)
        if resolved is None:
            continue
        content, note = redact(resolved, data, aliases=(path,))
        if content is None:
            tree.entries.pop(resolved, None)
        else:
            tree.entries[resolved] = ("file", content)
        if note:
            redactions.append("%s: %s" % (resolved, note))
    for path, records in sorted(log.kmsg.items()):
        resolved = tree.add_path(path) or path
        text = "".join(record.split("\n", 1)[0] + "\n" for record in records)
        content, hidden = redact_secrets(text.encode("utf-8"))
        tree.entries[resolved] = ("file", content)
        if hidden:
            redactions.append("%s: %d secret values replaced" % (resolved, hidden))
    for path, entry in list(tree.entries.items()):
        if entry[0] == "file" and is_proc_pid_file(path, NEVER):
            del tree.entries[path]
    for path in list(tree.entries):
        if exclude and excluded(path, exclude):
            del tree.entries[path]
    if log.statvfs:
        usage = {path: value._asdict() for path, value in sorted(log.statvfs.items())}
        tree.entries[CAPTURED_STATVFS] = (
            "file",
            (json.dumps(usage, indent=1, sort_keys=True) + "\n").encode(),
        )
    return tree.entries, sorted(set(redactions))


def write_archive(
    out: str,
    top: str,
    entries: Dict[str, Tuple[Any, ...]],
    extra: Dict[str, bytes],
    mtime: Optional[int] = None,
) -> int:
    """Write OUT (.tar.gz, .tgz, .tar.xz or .tar) with every entry under `top`/; returns the entry count.

    `mtime` fixes every entry's time (a reproducible archive: the test corpus); default now.
    """
    mode = "w:xz" if out.endswith((".xz", ".txz")) else "w" if out.endswith(".tar") else "w:gz"
    now = int(time.time()) if mtime is None else mtime
    everything = dict(entries)
    for path, data in extra.items():
        everything[path] = ("file", data)
    dirs = {"/"}
    for (
        path
    ) in everything:  # every parent becomes a directory entry, so extraction recreates the tree
        parent = posixpath.dirname(path)
        while parent not in dirs:
            dirs.add(parent)
            parent = posixpath.dirname(parent)
    tmp = out + ".tmp"
    try:
        with tarfile.open(tmp, mode) as archive:
            for path in sorted(dirs | set(p for p, e in everything.items() if e[0] == "dir")):
                archive.addfile(_info(top, path, tarfile.DIRTYPE, now, 0o755))
            for path, entry in sorted(everything.items()):
                if entry[0] == "link":
                    info = _info(top, path, tarfile.SYMTYPE, now, 0o777)
                    info.linkname = entry[1]
                    archive.addfile(info)
                elif entry[0] == "file":
                    info = _info(top, path, tarfile.REGTYPE, now, 0o644)
                    info.size = len(entry[1])
                    archive.addfile(info, io.BytesIO(entry[1]))
        os.replace(tmp, out)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise CaptureError("cannot write %s: %s" % (out, exc.strerror or exc)) from None
    return len(everything) + len(dirs)


def _info(top: str, path: str, kind: bytes, mtime: int, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(top + path.rstrip("/") if path != "/" else top)
    info.type, info.mtime, info.mode, info.uname, info.gname = kind, mtime, mode, "root", "root"
    return info


def node_config(config):
    """The configuration as it applies to the captured node itself: how this capture was taken (--root,
    --live) is not part of it, so `check --root DIR` with it reads the tree and nothing live."""
    from ..core.structs import replace

    general = dict(config.settings["general"], root="/", root_live_sources=[])
    return replace(config, settings=dict(config.settings, general=general))


def capture(
    registry, config, out: str, deadline: Optional[float] = None, exclude: Tuple[str, ...] = ()
) -> Dict[str, Any]:
    """Run every check on the configured root with recording on, and write the archive; returns capture.json.

    `exclude`: categories left out (`capture --exclude`, redact.EXCLUDABLE), named in capture.json.
    """
    from .. import __version__
    from ..core.config import render_toml
    from ..core.report_format import report_to_dict
    from ..core.runner import run_checks

    root = config.get("general", "root")
    log = ReadLog()
    host = Host(root, log=log)
    report = run_checks(
        registry, config, host, "manual", registry.sorted_checks(), deadline=deadline
    )
    hostname = (host.read_text("/proc/sys/kernel/hostname", default="") or "node").strip().split(
        "."
    )[0] or "node"
    entries, redactions = plan(root, log, exclude)
    meta = {
        "schema": SCHEMA,
        "version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "node": hostname,
        "root": root,
        "kernel": host.read_text("/proc/sys/kernel/osrelease", default="").strip(),
        "paths": len(entries),
        "redactions": redactions,
        "excluded": {name: EXCLUDABLE[name] for name in exclude},
        "live_only": [
            "nvml: GPU checks read the driver, which a capture cannot hold; under --root they SKIP",
            "statvfs: only the file systems the checks stat are in %s" % CAPTURED_STATVFS,
        ],
        "verdicts": hide_excluded_verdicts(report_to_dict(report, root), exclude),
    }
    extra = {  # the verdicts and the config quote what was read: the same secrets are hidden there
        CAPTURE_DIR + "/capture.json": redact_secrets((json.dumps(meta, indent=1) + "\n").encode())[
            0
        ],
        CAPTURE_DIR + "/config.toml": redact_secrets(render_toml(node_config(config)).encode())[0],
    }
    meta["entries"] = write_archive(out, hostname, entries, extra)
    return meta
