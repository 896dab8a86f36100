"""The sysfs and procfs gatherers, read by a second process while the check process talks to NVML.

The check process (hooks/bounded.py) runs its checks on threads, and threads of one interpreter
take turns (the GIL): importing pynvml, NVML's readings of every GPU and the PCIe tree's walk were
one after the other, ~80 ms of a prolog on the 8-GPU example node. Every node has more than one
core, so the check process forks a helper (`Prefetch.start`) right away, before its threads, that
reads the gatherers in PREFETCHED which the run needs, one after the other, and hands each value
back through a pipe (pickle: a forked copy of our own process, trusted like the process itself).
The check process takes a value from there when a check first asks for it (runner.GatherContext);
the two run on two cores at once.

Nothing here may change a result, only where a value is computed:
- the helper never touches NVML: a gatherer that asks for a `gpu.*` one, or for an NVML session, is
  refused there, and from then on the helper hands back nothing (the check process computes it);
- a gatherer that raised, a value that does not pickle, a helper that died: the check process
  computes that gatherer itself, as it did before this module existed, so an error carries its
  own traceback and a hung read hangs in the check process's own check thread, where the runner's
  timeouts abandon it;
- a helper stuck (a sysfs read that never returns) is waited for at most STALL_S after its last
  value, then given up for the rest of the run; it is killed when the check process ends.
"""

from __future__ import annotations

import _pickle  # the C pickler alone: `pickle` would add ~1 ms of imports to both processes
import os
import select
import threading
import time

from .isolation import SIGKILL

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Optional, Tuple
# What the helper reads, in the order the prolog's checks first ask for them (the kernel log first:
# the counter snapshot, started with the checks, takes its position from it); each is a sysfs or
# procfs gatherer that costs ~1 ms or more on the example node, or is cheaper to send than to read.
PREFETCHED = (
    "xid.log",
    "pci.devices",
    "gpudirect.state",
    "topology.pcie_sysfs",
    "host.edac",
    "host.ib_links",
    "system.cpu_places",
    # system.cpu, not the /proc/cpuinfo it parses (~210 kB for 224 CPUs): the helper reads and parses
    # the file, the check process gets the models and the layout (round 8: ~1 ms of its CPU)
    "system.cpu",
    "numa.sysctl",
)
# Which gatherers a gatherer asks for (checks declare theirs in `needs`, gatherers do not): what is
# read ahead for the checks of a run. A name missing here costs only time, never a result.
ASKS_FOR = {
    "topology.pcie": ("topology.pcie_sysfs",),
    "topology.pcie_sysfs": ("pci.devices",),
    "topology.iommu": ("topology.pcie",),
    "numa.gpus": ("topology.pcie",),
    "numa.cores": ("system.cpu_places",),
    "system.cpu": ("system.cpu_places", "system.cpuinfo"),
    "system.cpu_places": ("system.cpuinfo",),
    "system.load": ("system.cpu",),
    "xid.gpus": ("xid.log",),
    "gpu.count": ("pci.devices",),
}
NVML_PREFIX = "gpu."  # gatherers that ask NVML (gpu.inventory and everything built on it)
STALL_S = 0.25  # the longest wait for the helper after its last value before it is given up
_LENGTH = 4  # bytes of each frame's length prefix
_MAX_FD = 1 << 20  # os.closerange's end (Linux closes the range in one close_range(2) call)
PIPE_BYTES = 1 << 20  # the helper's pipe (_widen): every value of a large node without a wait
_F_SETPIPE_SZ = (
    1031  # <linux/fcntl.h> F_LINUX_SPECIFIC_BASE + 7; fcntl.F_SETPIPE_SZ from Python 3.10
)


class NotHere(LookupError):
    """Raised in the helper when a gatherer asks for one that needs NVML."""


def wanted(needs: Iterable[str]) -> List[str]:
    """PREFETCHED names the gatherers in `needs` (a run's checks' needs) lead to, in PREFETCHED order."""
    seen = set()
    todo = list(needs)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(ASKS_FOR.get(name, ()))
    return [name for name in PREFETCHED if name in seen]


class Prefetch:
    """The check process's side: the helper's pid and the values it has handed back so far."""

    def __init__(self, pid: int, read_fd: int, names: List[str]):
        self.pid, self.fd, self.names = pid, read_fd, set(names)
        self.values: Dict[str, Optional[Tuple[Any]]] = {}  # name -> (value,) or None: compute here
        self.pending = b""
        self.ended = False  # the helper closed its pipe (done, or died)
        self.given_up = False  # the helper stalled: everything left is computed here
        self.last = time.monotonic()
        # the thread of the first check that waits reads the pipe (no reader thread of its own:
        # one more thread on the GIL cost more than it saved); the others wait for this lock
        self.lock = threading.Lock()

    @classmethod
    def start(cls, gather: Any, names: List[str]) -> Optional[Prefetch]:
        """Fork the helper for `names` (call before starting threads); None when there is nothing to
        read or no process can be started (the check process then reads everything itself)."""
        if not names:
            return None
        try:
            read_fd, write_fd = os.pipe()
            _widen(write_fd)
            pid = os.fork()
        except OSError:
            return None
        if pid == 0:  # the helper: never return into the caller's stack
            try:
                # keep none of the hook's pipes open (the check process's result pipe above all: a
                # helper stuck in the kernel must not keep the hook waiting for its EOF); stderr stays
                os.closerange(3, write_fd)
                os.closerange(write_fd + 1, _MAX_FD)
                _serve(gather, names, write_fd)
            finally:
                os._exit(0)
        os.close(write_fd)
        return cls(pid, read_fd, names)

    def take(self, name: str) -> Optional[Tuple[Any]]:
        """(value,) when the helper read `name`, else None: the caller computes it itself."""
        if name not in self.names:
            return None
        with self.lock:
            while name not in self.values and not self.ended and not self.given_up:
                left = self.last + STALL_S - time.monotonic()
                if left <= 0:
                    self.given_up = True
                elif select.select([self.fd], [], [], left)[0]:
                    self._read_some()
            return self.values.pop(name, None)

    def stop(self) -> None:
        """Kill the helper if it still runs (a stuck read) and reap it if it can be; never waits."""
        with self.lock:
            if not self.ended:
                self.ended = True
                os.close(self.fd)
        try:
            os.kill(self.pid, SIGKILL)
        except OSError:
            pass
        try:
            os.waitpid(self.pid, os.WNOHANG)
        except OSError:
            pass

    def _read_some(self) -> None:
        try:
            chunk = os.read(self.fd, 1 << 16)
        except OSError:
            chunk = b""
        if not chunk:
            self.ended = True
            os.close(self.fd)
            return
        self.pending += chunk
        while len(self.pending) >= _LENGTH:
            size = int.from_bytes(self.pending[:_LENGTH], "big")
            if len(self.pending) < _LENGTH + size:
                break
            frame = self.pending[_LENGTH : _LENGTH + size]
            self.pending = self.pending[_LENGTH + size :]
            try:
                name, value = _pickle.loads(frame)
            except Exception:  # noqa: BLE001  (a value that does not load here: computed here)
                continue
            self.values[name] = value
            self.last = time.monotonic()


def _widen(fd: int) -> None:
    """Make the pipe hold PIPE_BYTES, so the helper never waits for the check process to read.

    The check process reads the pipe only when a check asks for a value, and only up to that value;
    the helper's values for the 8-GPU example node were ~350 kB (topology.pcie_sysfs ~130 kB,
    system.cpuinfo ~210 kB for its 224 CPUs: sent parsed since round 8), and with Linux's default
    64 kB pipe it sat ~30 ms blocked in write(2) after the PCIe tree until a check drained it, so
    the values behind it (the CPU and NUMA ones) came late. F_SETPIPE_SZ (Linux >= 2.6.35) is refused above
    /proc/sys/fs/pipe-max-size (1 MiB by default) for a user without CAP_SYS_RESOURCE, or past the
    user's pipe-user-pages limits: then the pipe keeps its size and the helper waits as before."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", _F_SETPIPE_SZ), PIPE_BYTES)
    except (OSError, ImportError):
        pass


def _serve(gather: Any, names: List[str], fd: int) -> None:
    """The helper: read each gatherer with its own copy of the check process's GatherContext and write
    it to `fd` as a frame; after the first refusal (NVML asked for) or a value that does not pickle,
    hand back nothing more."""
    gather.refuse_prefix = NVML_PREFIX
    from ..hw import nvml

    def no_nvml_here(*_args: Any, **_kwargs: Any) -> Any:
        gather.refused = True
        raise LookupError("NVML is not asked from the sysfs helper process")

    nvml.session = no_nvml_here  # this process's copy only: whatever a gatherer calls, no NVML here
    for name in names:
        value: Optional[Tuple[Any]] = None
        try:
            value = (gather.get(name),)
        except BaseException:  # noqa: BLE001  (the check process computes it, and meets the error itself)
            pass
        if gather.refused:
            return
        try:
            frame = _pickle.dumps((name, value), protocol=5)
        except Exception:  # noqa: BLE001  (not picklable: computed there)
            return
        _write_all(fd, len(frame).to_bytes(_LENGTH, "big") + frame)


def _write_all(fd: int, payload: bytes) -> None:
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view) :]
