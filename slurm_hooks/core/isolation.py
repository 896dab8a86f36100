"""Work that may hang or crash runs where the hook can walk away from it.

`run_isolated` runs the checks in a forked child so that a crash in C code (an NVML call that
aborts or segfaults) or a hang that ignores everything cannot take the hook down with it: the
parent waits at most `timeout` seconds for the child's JSON on a pipe, then SIGKILLs it.

`run_steps` runs the steps after the checks (state file, counter snapshot file, record and
retention, metrics, dcgm-exporter mapping and their locks) in one forked child, each step in its own
thread, so that a records file system that never answers (NFS, Lustre) costs at most `timeout`
and holds up neither the other steps nor the hook's exit. The parent learns from the child which
step began and which ended; what did not end is reported with its path.

The parent never blocks on a child: stdin/stdout of a child are /dev/null and its stderr is a pipe
the parent relays, so a child stuck in the kernel (an unkillable read on a dead file system)
keeps no file descriptor of slurmd's open; after SIGKILL the parent reaps for at most REAP_WAIT_S
and otherwise leaves the child to init. What a crash or timeout means (alert or drain) is
policy's call; here it only becomes a clear answer. fork() costs ~1 ms and reuses the modules
already imported, unlike a new interpreter.

Only a child process can be walked away from: a thread blocked on a dead file system may sleep
uninterruptibly (FUSE waits that way once its server has read the request), and a process with
such a thread cannot exit, so slurmd would wait on it. File work on paths that may hang therefore
never runs in the hook's own process, not even a small read.
"""

from __future__ import annotations

import json
import os
import select
import sys
import threading
import time

from .structs import Struct

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

# signal.SIGKILL: 9 on every Linux architecture (POSIX's one fixed number). The signal module's
# import, ~0.6 ms of every hook for its IntEnums, is left to the rare path that names a signal.
SIGKILL = 9

EXIT_CHILD_ERROR = 70
REAP_WAIT_S = 0.2  # after SIGKILL: a child in uninterruptible sleep is left to init after this
MAX_RELAYED_STDERR = 64 << 10  # bytes of a child's stderr passed on (a flood must not cost time)


# -- the checks' child -----------------------------------------------------------------------


def run_isolated(
    work: Callable[[], Any],
    timeout: float,
    what: str = "the check process",
    while_waiting: Optional[Callable[[], Any]] = None,
) -> Tuple[Optional[Any], str]:
    """(value, "") when the child returned JSON-able `value`, else (None, why it did not).

    `while_waiting` runs in this process right after the fork, on the other core while the child
    works (the hook sets up its logger there). What it raises is dropped: it must not leave the
    child unwatched, and the caller meets the same error when it does that work again itself.
    """

    def child(result_fd: int) -> int:
        payload = json.dumps(work()).encode("utf-8")
        _write_all(result_fd, payload)
        return 0

    pid, result_fd, err_fd = _fork(child)
    end = time.monotonic() + timeout
    if while_waiting is not None:
        try:
            while_waiting()
        except Exception:  # noqa: BLE001  (the caller repeats it and meets the error there)
            pass
    data, timed_out = _collect(pid, result_fd, err_fd, end)
    status = _reap(pid, timed_out)
    if timed_out:
        return None, "%s did not finish within %.3gs and was killed" % (what, timeout)
    if status is not None and os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return None, "%s died of signal %d (%s)" % (what, sig, _signal_name(sig))
    if status is not None and os.WEXITSTATUS(status) != 0:
        return None, "%s failed with exit code %d" % (what, os.WEXITSTATUS(status))
    try:  # status None: the child wrote everything but cannot be reaped (a thread stuck in the kernel)
        return json.loads(data.decode("utf-8")), ""
    except ValueError as exc:
        return None, "%s returned malformed output: %s" % (what, exc)


# -- the steps after the checks --------------------------------------------------------------


class Step(Struct):
    """One piece of work after the checks: `name` for the log, `path` it touches, `run` does it (never raises)."""

    name: str
    path: str
    run: Callable[[], Any]


class StepOutcome(Struct):
    name: str
    path: str
    state: str  # "done" | "failed" (raised: our bug, logged by the child) | "running" (abandoned) | "not-started"
    seconds: float = 0.0

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed")


def run_steps(steps: Sequence[Step], timeout: float) -> List[StepOutcome]:
    """Run every step at once in a forked child (one thread each) for at most `timeout` seconds.

    Returns one StepOutcome per step; a step still "running" at the deadline was abandoned (its
    child is killed). Steps log their own errors; a step that raises is "failed" and its traceback
    goes to stderr.
    """
    if not steps:
        return []
    lock = threading.Lock()

    def child(result_fd: int) -> int:
        def one(index: int, step: Step) -> None:
            _note(result_fd, lock, "B %d\n" % index)
            try:
                step.run()
                _note(result_fd, lock, "E %d\n" % index)
            except BaseException:  # a step's own bug: the others go on
                import traceback  # only on a crash: with linecache and tokenize it is ~3 ms

                traceback.print_exc()
                _note(result_fd, lock, "F %d\n" % index)

        threads = [
            threading.Thread(target=one, args=(i, s), name="bounded:%s" % s.name, daemon=True)
            for i, s in enumerate(steps)
        ]
        for thread in threads:
            thread.start()
        end = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(end - time.monotonic(), 0.0))
        return 0  # the parent reads from the pipe what finished; stuck threads die with os._exit

    started = time.monotonic()
    pid, result_fd, err_fd = _fork(child)
    marks: Dict[int, Tuple[str, float]] = {}

    def on_line(line: str) -> None:
        kind, _, index = line.partition(" ")
        if index.strip().isdigit():
            marks[int(index)] = (kind, time.monotonic() - started)

    _collect(pid, result_fd, err_fd, started + timeout, on_line)
    _reap(pid, kill=True)  # finished children have exited; a stuck one is killed
    outcomes = []
    waited = time.monotonic() - started
    for index, step in enumerate(steps):
        kind, seconds = marks.get(index, ("", waited))
        state = {"E": "done", "F": "failed", "B": "running"}.get(kind, "not-started")
        outcomes.append(
            StepOutcome(
                step.name, step.path, state, round(seconds if state != "running" else waited, 3)
            )
        )
    return outcomes


def _note(fd: int, lock: threading.Lock, text: str) -> None:
    with lock:  # one short line per write: atomic on a pipe (< PIPE_BUF)
        os.write(fd, text.encode("ascii"))


# -- many small items ------------------------------------------------------------------------


class _Mapper:
    """map_bounded's state: one worker reads the items in order; a slow item gets a fresh worker for the rest."""

    def __init__(self, count: int, func: Callable[[int], Any], park_s: float):
        self.func, self.park_s = func, park_s
        self.cond = threading.Condition()
        self.next = 0
        self.count = count
        self.results: Dict[int, Tuple[bool, Any]] = {}
        self.running: Dict[int, float] = {}  # item -> start time
        self.parked: set = set()

    def work(self) -> None:
        while True:
            with self.cond:
                if self.next >= self.count:
                    return
                index = self.next
                self.next += 1
                self.running[index] = time.monotonic()
            try:
                value: Tuple[bool, Any] = (True, self.func(index))
            except Exception as exc:  # handed to the caller with the item
                value = (True, exc)
            with self.cond:
                self.running.pop(index, None)
                self.results[index] = value
                if (
                    len(self.results) == self.count
                ):  # the caller polls for parking; wake it only at the end
                    self.cond.notify_all()
                if index in self.parked:  # a replacement took over the queue
                    return

    def spawn(self) -> None:
        threading.Thread(target=self.work, name="check:map", daemon=True).start()

    def run(self, budget: float) -> List[Tuple[bool, Any]]:
        end = time.monotonic() + budget
        with self.cond:
            self.spawn()
            while len(self.results) < self.count:
                now = time.monotonic()
                if now >= end:
                    break
                for index, started in self.running.items():
                    if index not in self.parked and now - started >= self.park_s:
                        self.parked.add(index)
                        if self.next < self.count:
                            self.spawn()
                # workers notify only when everything is done (one wake-up on the happy path); an item
                # that has just started is looked at again within park_s
                self.cond.wait(max(min(self.park_s, end - now), 0.001))
            return [self.results.get(i, (False, None)) for i in range(self.count)]


def map_bounded(
    count: int, func: Callable[[int], Any], budget: float, park_s: float = 0.1
) -> List[Tuple[bool, Any]]:
    """func(i) for i in range(count), in order, within `budget` seconds: one answer per item.

    (True, value) for an item that finished (value is the exception if it raised one), (False,
    None) for one still running (hung: abandoned) or never started when the budget ran out. Items
    run one after the other on a worker thread; an item running longer than `park_s` gets a new
    worker for the items behind it, so one hung item (one GPU whose NVML calls never return) costs
    that item only. Used by the per-GPU NVML readers.
    """
    if count <= 0:
        return []
    return _Mapper(count, func, park_s).run(budget)


# -- plumbing --------------------------------------------------------------------------------


def _fork(child: Callable[[int], int]) -> Tuple[int, int, int]:
    """Fork; the child runs child(result_fd) with /dev/null as stdin/stdout and a pipe as stderr."""
    result_r, result_w = os.pipe()
    err_r, err_w = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    pid = os.fork()
    if pid == 0:  # child: never return into the caller's stack
        code = EXIT_CHILD_ERROR
        try:
            os.close(result_r)
            os.close(err_r)
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)
            os.dup2(err_w, 2)
            for fd in (null, err_w):
                if fd > 2:
                    os.close(fd)
            code = child(result_w)
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            try:
                os.close(
                    result_w
                )  # EOF for the parent even if a thread of ours stays stuck in the kernel
                sys.stderr.flush()
                os.close(2)
            except BaseException:
                pass
            os._exit(code)
    os.close(result_w)
    os.close(err_w)
    return pid, result_r, err_r


def _write_all(fd: int, payload: bytes) -> None:
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view) :]


def _collect(
    pid: int,
    result_fd: int,
    err_fd: int,
    deadline: float,
    on_line: Optional[Callable[[str], None]] = None,
) -> Tuple[bytes, bool]:
    """Read the child's result pipe (and relay its stderr) until EOF or `deadline`: (data, timed_out)."""
    chunks: List[bytes] = []
    pending = b""
    open_fds = {result_fd, err_fd}
    relayed = 0
    timed_out = False
    try:
        while result_fd in open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select(list(open_fds), [], [], left)
            if not ready:
                timed_out = True
                break
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    open_fds.discard(fd)
                elif fd == err_fd:
                    relayed += _relay(chunk, MAX_RELAYED_STDERR - relayed)
                elif on_line is not None:
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        on_line(line.decode("ascii", "replace"))
                else:
                    chunks.append(chunk)
        if err_fd in open_fds and not timed_out:  # the child closes stderr last: take what is left
            while select.select([err_fd], [], [], 0.05)[0]:
                chunk = os.read(err_fd, 1 << 16)
                if not chunk:
                    break
                relayed += _relay(chunk, MAX_RELAYED_STDERR - relayed)
    finally:
        os.close(result_fd)
        os.close(err_fd)
    return b"".join(chunks), timed_out


def _relay(chunk: bytes, room: int) -> int:
    if room <= 0:
        return 0
    try:
        sys.stderr.write(chunk[:room].decode("utf-8", "replace"))
    except (OSError, ValueError):  # our own stderr is gone: nothing to relay to
        pass
    return min(len(chunk), room)


def _reap(pid: int, kill: bool) -> Optional[int]:
    """The child's wait status; None when it could not be reaped within REAP_WAIT_S (left to init).

    Waits on a pidfd (Linux >= 5.3: woken the moment the child exits), else polls.
    """
    if kill:
        try:
            os.kill(pid, SIGKILL)
        except ProcessLookupError:
            pass
    end = time.monotonic() + REAP_WAIT_S
    pidfd = _pidfd(pid)
    delay = 0.0005
    try:
        while True:
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return None
            if done:
                return status
            left = end - time.monotonic()
            if left <= 0:
                return None
            if pidfd >= 0:
                select.select([pidfd], [], [], left)
            else:
                time.sleep(min(delay, left))
                delay = min(delay * 2, 0.02)
    finally:
        if pidfd >= 0:
            os.close(pidfd)


def _pidfd(pid: int) -> int:
    opener = getattr(
        os, "pidfd_open", None
    )  # Python >= 3.9 on Linux; the kernel may still lack it (ENOSYS)
    if opener is None:
        return -1
    try:
        return opener(pid)
    except OSError:
        return -1


def _signal_name(sig: int) -> str:
    import signal  # only for a child that died of one

    try:
        return signal.Signals(sig).name
    except ValueError:
        return "unknown"
