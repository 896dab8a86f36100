"""Run the checks in a forked child so that a crash in C code (an NVML call that aborts or segfaults)
or a hang that ignores everything cannot take the hook down with it.

The parent waits at most `timeout` seconds for the child's JSON on a pipe, then SIGKILLs it. What a
crash or timeout means (alert or drain) is policy's call; here it only becomes a clear result.
fork() costs ~1 ms and reuses the already-imported modules, unlike starting a new interpreter.
"""
from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
import traceback
from typing import Any, Callable, Optional, Tuple

EXIT_CHILD_ERROR = 70


def run_isolated(work: Callable[[], Any], timeout: float) -> Tuple[Optional[Any], str]:
    """(value, "") when the child returned JSON-able `value`, else (None, why it did not)."""
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # child: never return into the caller's stack
        os.close(read_fd)
        code = 0
        try:
            payload = json.dumps(work()).encode("utf-8")
            view = memoryview(payload)
            while view:
                view = view[os.write(write_fd, view):]
        except BaseException:
            traceback.print_exc()
            code = EXIT_CHILD_ERROR
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(write_fd)
    try:
        data, timed_out = _read_until(read_fd, time.monotonic() + timeout)
    finally:
        os.close(read_fd)
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if timed_out:
        return None, "the check process did not finish within %.3gs and was killed" % timeout
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return None, "the check process died of signal %d (%s)" % (sig, _signal_name(sig))
    if os.WEXITSTATUS(status) != 0:
        return None, "the check process failed with exit code %d" % os.WEXITSTATUS(status)
    try:
        return json.loads(data.decode("utf-8")), ""
    except ValueError as exc:
        return None, "the check process returned malformed output: %s" % exc


def _read_until(fd: int, deadline: float) -> Tuple[bytes, bool]:
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return b"".join(chunks), True
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return b"".join(chunks), True
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks), False
        chunks.append(chunk)


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return "unknown"
