"""Running a node's own diagnostic tools (nvme, ipmitool): found on a fixed path, bounded in time and output.

Only the health context (and manual runs) use them: a tool is a process start plus an ioctl that may
wait on firmware (a BMC can take seconds to answer, or never). Rules: no shell (argv lists), a fixed
search path (slurmd's environment is not ours to trust), LC_ALL=C (nvme-cli 2.3-2.4 printed JSON
counters with the locale's thousands separators), stdin closed, its own process group killed on
timeout, and at most MAX_OUTPUT bytes kept. A tool that is not installed is MISSING (the check SKIPs);
one that does not answer in time is TIMEOUT (UNKNOWN, never a drain).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, List, Optional, Sequence

from ..core.structs import Struct

if TYPE_CHECKING:
    import subprocess

# subprocess (with signal, selectors and locale: ~3 ms) is imported by run_tool, not here: the
# prolog and epilog load this module with the checks that may run a tool, and never run one.

SEARCH_PATH = ("/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/sbin", "/usr/local/bin")
MAX_OUTPUT = 4 << 20
OK, MISSING, TIMEOUT, FAILED = "ok", "missing", "timeout", "failed"


class ToolRun(Struct):
    outcome: str  # OK (exit 0), MISSING, TIMEOUT, FAILED (could not start, or exit status not 0)
    argv: List[str]
    stdout: str = ""
    error: str = ""  # why it failed: stderr's last line, the exit status, the OSError


def find_tool(command: str) -> Optional[str]:
    """The executable for `command`: itself when absolute, else the first in SEARCH_PATH; None if absent."""
    if os.path.isabs(command):
        return command if os.access(command, os.X_OK) else None
    if "/" in command:
        return None
    for directory in SEARCH_PATH:
        path = os.path.join(directory, command)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def run_tool(command: str, args: Sequence[str], timeout: float) -> ToolRun:
    """`command args...` with a timeout; never raises for the tool's own failures."""
    path = find_tool(command)
    argv = [path or command] + list(args)
    if path is None:
        return ToolRun(
            MISSING,
            argv,
            error="%s: not installed (looked in %s)" % (command, ":".join(SEARCH_PATH)),
        )
    import subprocess

    env = {"PATH": ":".join(SEARCH_PATH), "LC_ALL": "C", "LANG": "C"}
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,  # its own process group: a timeout kills its children too
            close_fds=True,
        )
    except OSError as exc:
        return ToolRun(FAILED, argv, error="%s: %s" % (argv[0], exc.strerror or exc))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return ToolRun(
            TIMEOUT, argv, error="%s did not answer within %gs (killed)" % (argv[0], timeout)
        )
    stdout = out[:MAX_OUTPUT].decode("utf-8", errors="replace")
    if proc.returncode != 0:
        last = err[-2000:].decode("utf-8", errors="replace").strip().splitlines()
        why = last[-1] if last else "no message"
        return ToolRun(FAILED, argv, stdout, "exit status %d: %s" % (proc.returncode, why))
    return ToolRun(OK, argv, stdout)


def _kill_group(proc: "subprocess.Popen[bytes]") -> None:
    import signal
    import subprocess

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:  # a process in uninterruptible sleep (an ioctl to dead firmware) may not die: do not wait on it
        proc.communicate(timeout=1.0)
    except subprocess.TimeoutExpired:
        pass
