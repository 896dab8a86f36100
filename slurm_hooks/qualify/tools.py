"""Running one qualification tool, bounded: argv (never a shell), its own process group killed
whole at the timeout (the tools fork: mpirun, nvvs under dcgmi), stdout and stderr together kept up
to a size bound (the head, and the tail where the output is larger), stdin closed.

A tool that is not installed is reported as such (the caller makes it a SKIP naming the tool);
everything else (exit code, timeout, signal, output) is data for the judge, never an exception.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import threading
import time
from typing import Dict, List, Optional, Sequence

from ..core.structs import Struct

MAX_OUTPUT_BYTES = 4 << 20  # head kept; an nccl-tests run of every size prints ~10 KB
TAIL_BYTES = 64 << 10  # and the tail, where the summary lines are
REAP_AFTER_KILL_S = 5.0  # a tool's group not gone this long after SIGKILL is unkillable (D state)
AFTER_TOOL_GRACE_S = (
    1.0  # after the tool exits, how long a child still holding its stdout may keep it
)


class ToolRun(Struct, frozen=False):
    argv: List[str]
    found: bool
    rc: Optional[int] = None  # None: killed at the timeout; negative: killed by that signal
    timed_out: bool = False
    output: str = ""
    truncated: bool = False
    seconds: float = 0.0
    refused: str = ""  # found only where someone else could have put it (unsafe_place): not run

    def tail(self, lines: int = 8, width: int = 400) -> str:
        text = "\n".join(self.output.rstrip().splitlines()[-lines:])
        return text[-width:]

    def how_it_ended(self) -> str:
        if self.refused:
            return self.refused
        if not self.found:
            return "%s is not installed" % self.argv[0]
        if self.timed_out:
            return "%s did not finish in %.0f s (killed)" % (self.argv[0], self.seconds)
        if self.rc is not None and self.rc < 0:
            try:
                name = signal.Signals(-self.rc).name
            except ValueError:
                name = "signal %d" % -self.rc
            return "%s was killed by %s" % (self.argv[0], name)
        return "%s exited %s" % (self.argv[0], self.rc)


def find(tool: str, path: Optional[str] = None) -> Optional[str]:
    """The tool's executable on PATH (or `path`); None when it is not installed."""
    return shutil.which(tool, path=path)


def unsafe_place(executable: str) -> str:
    """Why an executable we would run (as root, and believe the figures of) could be someone
    else's: '' when it and every directory above it is owned by root or us and writable by no one
    else (a sticky directory above it excepted, as /tmp). A PATH entry a user can write (a relative
    one, '.', a group-writable /opt/tools) would otherwise let them plant a tool that prints a
    pass; the job's PATH is the submitting admin's (sbatch exports it)."""
    if not os.path.isabs(executable):
        return "%s is not an absolute path (a relative PATH entry)" % executable
    # the path as found (a symlink in a writable directory can be swapped) and what it points to
    return _chain(os.path.normpath(executable)) or _chain(os.path.realpath(executable))


# the dynamic loader's variables (ld.so(8)): a library they name is loaded into the tool, as root
LOADER_LISTS = (("LD_PRELOAD", " :"), ("LD_AUDIT", ":"), ("LD_LIBRARY_PATH", ":;"))


def unsafe_loader_env(env: Dict[str, str]) -> str:
    """Why the loader would load a library someone else could have put there: '' when every entry of
    LD_PRELOAD, LD_AUDIT and LD_LIBRARY_PATH (the submitting admin's, exported by sbatch like PATH)
    passes unsafe_place. A library directory a user can write (a module's group-writable /opt/lib,
    a home directory) let them plant a libcudart or libnccl that runs as root and prints a pass,
    though the tool itself sits in a safe place. An empty or relative entry is the directory the
    tool runs in (the checked work dir); an entry that does not exist is judged by the nearest
    directory above it that does (only its writers could make it)."""
    for name, separators in LOADER_LISTS:
        text = env.get(name, "")
        for separator in separators[1:]:
            text = text.replace(separator, separators[0])
        for entry in text.split(separators[0]):
            if (
                "$" in entry
            ):  # $ORIGIN, $LIB, $PLATFORM: ld.so expands them, we cannot judge the place
                return "%s entry %r: names a place ld.so works out at run time" % (name, entry)
            place = os.path.abspath(entry or ".")
            while not os.path.lexists(place) and os.path.dirname(place) != place:
                place = os.path.dirname(place)
            why = unsafe_place(place)
            if why:
                return "%s entry %r: %s" % (name, entry, why)
    return ""


def _chain(path: str) -> str:
    import stat

    trusted = (0, os.geteuid())
    current, first = path, True
    while True:
        try:
            info = os.lstat(current)
        except OSError as exc:
            return "%s: %s" % (current, exc)
        if info.st_uid not in trusted:
            return "%s is owned by uid %d, not root or us" % (current, info.st_uid)
        writable = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if (
            writable
            and not stat.S_ISLNK(info.st_mode)  # a symlink's own mode means nothing
            and (first or not info.st_mode & stat.S_ISVTX)
        ):
            return "%s is writable by others (mode %04o)" % (current, info.st_mode & 0o7777)
        parent = os.path.dirname(current)
        if parent == current:
            return ""
        current, first = parent, False


def run(
    argv: Sequence[str],
    timeout_s: float,
    env: Optional[Dict[str, str]] = None,
    max_bytes: int = MAX_OUTPUT_BYTES,
) -> ToolRun:
    argv = [str(a) for a in argv]
    path = (env or os.environ).get("PATH")
    executable = find(argv[0], path)
    if executable is None:
        return ToolRun(argv, False)
    unsafe = unsafe_place(executable) or unsafe_loader_env(env if env is not None else os.environ)
    if unsafe:
        return ToolRun(argv, False, refused="%s not run: %s" % (argv[0], unsafe))
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            [executable] + argv[1:],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: killed whole, children included
            close_fds=True,
            env=env,
        )
    except OSError as exc:  # not executable, a broken interpreter line
        return ToolRun(argv, True, rc=127, output="%s: %s" % (executable, exc))
    try:
        head, tail, truncated, timed_out = _read(proc, start + timeout_s, max_bytes)
        if not timed_out:  # the output ended, the tool may not have yet: it can close stdout
            try:  # first (cat does), and the group's SIGKILL would be taken for its own end
                proc.wait(
                    timeout=max(0.0, min(AFTER_TOOL_GRACE_S, start + timeout_s - time.monotonic()))
                )
            except subprocess.TimeoutExpired:
                pass
    except BaseException:  # interrupted (a signal turned into an exception): leave no tool behind
        _kill_group(proc)
        proc.wait()
        raise
    _kill_group(proc)  # a child left behind by the tool (or the whole tool, at the timeout)
    try:
        rc: Optional[int] = proc.wait(timeout=REAP_AFTER_KILL_S)
    except subprocess.TimeoutExpired:  # unkillable (D state): leave it, report the timeout: a
        rc = None  # tool that never ended is never a pass, whatever it printed before
        timed_out = True
    data = bytes(head) + ((b"\n[... output cut ...]\n" + bytes(tail)) if truncated else b"")
    return ToolRun(
        argv,
        True,
        rc=None if timed_out else rc,
        timed_out=timed_out,
        output=data.decode("utf-8", "replace"),
        truncated=truncated,
        seconds=time.monotonic() - start,
    )


def _read(proc: subprocess.Popen, deadline: float, max_bytes: int):
    head, tail = bytearray(), bytearray()
    truncated = timed_out = False
    exited_at: Optional[float] = None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    try:
        while True:
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > AFTER_TOOL_GRACE_S:
                break  # the tool is gone; a grandchild keeps the pipe open
            if not selector.select(timeout=min(0.2, deadline - now)):
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            room = max_bytes - len(head)
            head += chunk[:room]
            if len(chunk) > room:
                truncated = True
                tail += chunk[room:]
                del tail[:-TAIL_BYTES]
    finally:
        selector.close()
        proc.stdout.close()
    return head, tail, truncated, timed_out


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_pair(
    server: Sequence[str],
    client: Sequence[str],
    timeout_s: float,
    env: Optional[Dict[str, str]] = None,
    settle_s: float = 0.5,
) -> ToolRun:
    """A server and a client of the same tool on this node (ib_write_bw loopback): the server is
    started, the client run after settle_s; the client's run is returned, with the server's
    output after it where the client printed no result (the server may say why)."""
    box: List[ToolRun] = []
    thread = threading.Thread(target=lambda: box.append(run(server, timeout_s, env)), daemon=True)
    thread.start()
    time.sleep(settle_s)
    result = run(client, timeout_s, env)
    thread.join(timeout_s + 10)
    if box and result.found and result.rc != 0:
        result.output += "\n[server] " + box[0].tail(lines=4)
    return result
