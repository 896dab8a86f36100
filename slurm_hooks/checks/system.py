"""Family `system`: CPU topology, memory, swap, filesystems, required processes, kernel, load.

Where the data comes from: /sys/devices/system/cpu (topology, `lscpu`), /proc/cpuinfo (model),
/proc/meminfo and /sys/devices/system/node/node*/meminfo (`numactl -H`), /proc/swaps (`swapon`),
/proc/mounts + statvfs (`df -h`, `df -i`), /proc/<pid>/comm (`pgrep -x`), /proc/sys/kernel/osrelease
(`uname -r`) and /proc/loadavg (`uptime`).
"""

from __future__ import annotations

import fnmatch

from ..core.structs import Struct
from ..hw.cputopo import CpuLayout, Socket, read_cpu_layout
from ..hw.host import HostError, LiveOnly, format_cpulist, parse_cpulist
from ..hw.procfs import (
    LoadAvg,
    Mount,
    SwapArea,
    holding_mount,
    parse_cpuinfo_models,
    parse_loadavg,
    parse_meminfo,
    parse_mounts,
    parse_swaps,
)
from ..registry import CONTEXTS, DEFAULT_CONTEXTS, Param, absolute_path, check, gatherer
from ..result import Action, Result, Status

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import FrozenSet, List, Optional, Tuple

GIB_KB = 1024 * 1024
ALL = CONTEXTS  # every context


# -- gatherers ---------------------------------------------------------------------------------


class CpuTopology(Struct):
    """What system.cpu judges: the layout (slurm_hooks.hw.cputopo) and the CPU models."""

    layout: CpuLayout
    models: Tuple[str, ...]

    @property
    def threads(self) -> int:
        return len(self.layout.online)


@gatherer("system.cpuinfo")
def read_cpuinfo(ctx) -> str:
    """/proc/cpuinfo (one read; large on big nodes, so shared by every check that needs it)."""
    return ctx.host.read_text("/proc/cpuinfo", default="", max_bytes=16 << 20)


@gatherer("system.cpu_places")
def read_cpu_places(ctx) -> CpuLayout:
    """Online/offline CPUs, cores and sockets from /sys/devices/system/cpu (slurm_hooks.hw.cputopo)."""
    return read_cpu_layout(ctx.host, ctx.get("system.cpuinfo"))


@gatherer("system.cpu")
def read_cpu(ctx) -> CpuTopology:
    """The layout from system.cpu_places; model names from /proc/cpuinfo (every architecture's keys)."""
    return CpuTopology(
        ctx.get("system.cpu_places"), tuple(parse_cpuinfo_models(ctx.get("system.cpuinfo")))
    )


class NumaMemory(Struct):
    node: int
    total_kb: int  # MemTotal of the node
    free_kb: int
    has_cpus: (
        bool  # False: memory-only (GPU memory onlined as NUMA nodes on POWER9/Grace, CXL expanders)
    )


class MemoryState(Struct):
    total_kb: int
    available_kb: int
    numa: Tuple[NumaMemory, ...]


@gatherer("system.memory")
def read_memory(ctx) -> MemoryState:
    """/proc/meminfo and /sys/devices/system/node/node*/{meminfo,cpulist} (`numactl -H`)."""
    host = ctx.host
    info = parse_meminfo(host.read_text("/proc/meminfo"))
    numa = []
    for path in host.glob("/sys/devices/system/node", "node[0-9]*"):
        node = int(path.rsplit("node", 1)[1])
        values = parse_meminfo(host.read_text(path + "/meminfo"), path + "/meminfo")
        cpulist = host.read_text(
            path + "/cpulist", default=None
        )  # absent: assume CPUs, keep judging it
        has_cpus = cpulist is None or bool(parse_cpulist(cpulist, path + "/cpulist"))
        numa.append(NumaMemory(node, values.get("MemTotal", 0), values.get("MemFree", 0), has_cpus))
    return MemoryState(
        info.get("MemTotal", 0),
        info.get("MemAvailable", info.get("MemFree", 0)),
        tuple(sorted(numa, key=lambda n: n.node)),
    )


@gatherer("system.swap")
def read_swap(ctx) -> Tuple[SwapArea, ...]:
    """/proc/swaps."""
    return tuple(parse_swaps(ctx.host.read_text("/proc/swaps", default="")))


class FsState(Struct):
    path: str
    mount: Optional[Mount]  # the mount holding `path` (longest mount point that prefixes it)
    is_mountpoint: bool  # `path` is itself a mount point
    free_percent: Optional[float]  # None when statvfs failed (error says why)
    free_inodes_percent: Optional[float]
    error: Optional[str] = None
    live_only: bool = (
        False  # a tree under --root holds no usage for this path: not judged, not an error
    )


@gatherer("system.filesystems")
def read_filesystems(ctx) -> Tuple[FsState, ...]:
    """/proc/mounts (the kernel's view, not /etc/fstab) and statvfs(2) of each configured path.

    Only the configured paths are stat'ed ([checks."system.filesystems"] mounted + writable):
    statvfs on a dead NFS mount can block, and this runs under the check's timeout. Under a root
    other than / the usage comes from the tree's .slurm-hooks/statvfs.json (a capture's record of
    the node's statvfs), never from the disk that holds the tree, unless root_live_sources says so.
    """
    mounts = parse_mounts(ctx.host.read_text("/proc/mounts"))
    params = ctx.config.check("system.filesystems").params
    live = ctx.host.is_live or "statvfs" in ctx.config.get("general", "root_live_sources")
    states = []
    for path in list(dict.fromkeys(list(params.mounted) + list(params.writable))):
        mount = holding_mount(path, mounts)
        is_mountpoint = mount is not None and mount.mountpoint == path
        try:
            st = ctx.host.statvfs(path) if live else ctx.host.captured_statvfs(path)
        except LiveOnly as exc:
            states.append(FsState(path, mount, is_mountpoint, None, None, str(exc), live_only=True))
            continue
        except HostError as exc:
            states.append(FsState(path, mount, is_mountpoint, None, None, str(exc)))
            continue
        free = 100.0 * st.f_bavail / st.f_blocks if st.f_blocks else 100.0
        inodes = 100.0 * st.f_favail / st.f_files if st.f_files else 100.0
        states.append(FsState(path, mount, is_mountpoint, free, inodes))
    return tuple(states)


@gatherer("system.processes")
def read_process_names(ctx) -> FrozenSet[str]:
    """Names of running processes from /proc/<pid>/comm (what `pgrep -x` matches).

    A node may run 25,000 processes (one comm read each): nothing is read when no name is
    configured, and with only `required` names the scan goes by pid, lowest first, and stops
    once all are found (daemons start at boot, with low pids). `forbidden` needs the full scan.
    """
    params = ctx.config.check("system.processes").params
    if not params.required and not params.forbidden:
        return frozenset()
    wanted = None if params.forbidden else {name[:15] for name in params.required}
    names = set()
    for pid in ctx.host.pids():
        comm = ctx.host.read_pid_file(pid, "comm", max_bytes=64)
        if comm:  # processes exit while we look: a vanished one is simply not running
            names.add(comm.strip())
            if wanted is not None and wanted <= names:
                break
    return frozenset(names)


@gatherer("system.kernel")
def read_kernel_release(ctx) -> str:
    """/proc/sys/kernel/osrelease (`uname -r`)."""
    return ctx.host.read_text("/proc/sys/kernel/osrelease").strip()


@gatherer("system.load")
def read_load(ctx) -> Tuple[LoadAvg, int]:
    """/proc/loadavg and the online CPU count."""
    return parse_loadavg(ctx.host.read_text("/proc/loadavg")), ctx.get("system.cpu").threads


# -- checks ------------------------------------------------------------------------------------


@check(
    name="system.cpu",
    contexts=ALL,
    timeout=1.0,
    needs=("system.cpu",),
    params=(
        Param("sockets", int, 0, "expected sockets (0 = don't check)", minimum=0, maximum=64),
        Param(
            "cores_per_socket",
            int,
            0,
            "expected physical cores in every socket (0 = don't check)",
            minimum=0,
            maximum=4096,
        ),
        Param(
            "threads_per_core",
            int,
            0,
            "expected hardware threads per core in every socket (the most any of its "
            "cores has: hybrid CPUs mix 2-thread and 1-thread cores); 0 = don't check",
            minimum=0,
            maximum=16,
        ),
        Param("allow_offline", bool, False, "accept present CPUs that are not online"),
    ),
)
def cpu_topology(cpu: CpuTopology, params) -> Result:
    """CPU sockets, cores and threads match what this node should have (NHC check_hw_cpuinfo).

    A missing socket, cores disabled in BIOS or CPUs taken offline (by a kernel parameter, an admin
    or the kernel after a machine check) silently shrink every job on the node. Each socket is
    judged on its own, so an uneven layout cannot hide behind an average, and a FAIL names the socket.
    Source: /sys/devices/system/cpu (`lscpu`, `lscpu -e`; see slurm_hooks.hw.cputopo). Fix: check BIOS
    settings and `nosmt`/`maxcpus=` on the kernel command line, online CPUs with
    `echo 1 > /sys/devices/system/cpu/cpuN/online`, or reboot.
    """
    layout = cpu.layout
    details = _cpu_details(cpu)
    wrong = []
    if params.sockets and len(layout.sockets) != params.sockets:
        wrong.append("sockets %d, expected %d" % (len(layout.sockets), params.sockets))
    for socket in layout.sockets:
        if params.cores_per_socket and len(socket.cores) != params.cores_per_socket:
            wrong.append(
                "%s: %d cores, expected %d"
                % (_socket_label(socket), len(socket.cores), params.cores_per_socket)
            )
        if (
            params.threads_per_core
            and max(socket.thread_counts, default=0) != params.threads_per_core
        ):
            wrong.append(
                "%s: %s threads per core, expected %d"
                % (_socket_label(socket), _span(socket.thread_counts), params.threads_per_core)
            )
    if wrong:
        return Result(
            "system.cpu",
            Status.FAIL,
            "CPU topology: "
            + "; ".join(wrong[:4])
            + ("; and %d more" % (len(wrong) - 4) if len(wrong) > 4 else ""),
            details=details,
            action=Action.DRAIN,
        )
    if layout.offline and not params.allow_offline:
        return Result(
            "system.cpu",
            Status.FAIL,
            "%d CPUs offline (present, not online): %s"
            % (len(layout.offline), format_cpulist(layout.offline)),
            details=details,
            action=Action.DRAIN,
        )
    return Result("system.cpu", Status.OK, _cpu_summary(layout), details=details)


def _span(values) -> str:
    values = sorted(set(values))
    if not values:
        return "0"
    return str(values[0]) if len(values) == 1 else "%d-%d" % (values[0], values[-1])


def _socket_label(socket: Socket) -> str:
    return "%s (CPUs %s)" % (socket.name, format_cpulist(socket.cpus))


def _cpu_summary(layout: CpuLayout) -> str:
    threads = [n for socket in layout.sockets for n in socket.thread_counts]
    return "%d sockets x %s cores x %s threads (%d CPUs)" % (
        len(layout.sockets),
        _span(len(s.cores) for s in layout.sockets),
        _span(threads),
        len(layout.online),
    )


def _cpu_details(cpu: CpuTopology) -> dict:
    layout = cpu.layout
    cores = {len(s.cores) for s in layout.sockets}
    threads = {n for s in layout.sockets for n in s.thread_counts}
    details = {
        "sockets": len(layout.sockets),
        "cores_per_socket": cores.pop()
        if len(cores) == 1
        else None,  # None: uneven, see per_socket
        "threads_per_core": threads.pop() if len(threads) == 1 else None,  # None: hybrid or uneven
        "cores": sum(len(s.cores) for s in layout.sockets),
        "online": len(layout.online),
        "offline": sorted(layout.offline),
        "present": format_cpulist(layout.present),
        "models": list(cpu.models),
        "topology_from": layout.source,
        "per_socket": [
            {
                "socket": s.name,
                "cpus": format_cpulist(s.cpus),
                "cores": len(s.cores),
                "threads_per_core": _span(s.thread_counts),
            }
            for s in layout.sockets
        ],
    }
    if layout.notes:
        details["notes"] = list(layout.notes)
    return details


@check(
    name="system.memory",
    contexts=ALL,
    timeout=1.0,
    needs=("system.memory",),
    params=(
        Param(
            "min_total_gib",
            float,
            0.0,
            "FAIL below this much physical memory (0 = don't check)",
            minimum=0.0,
            maximum=float(1 << 24),
        ),
        Param(
            "min_free_percent_per_numa",
            float,
            0.0,
            "WARN when a NUMA node's MemFree is below this percent of its MemTotal (0 = off)",
            minimum=0.0,
            maximum=100.0,
        ),
    ),
)
def memory(mem: MemoryState, params) -> List[Result]:
    """Physical memory present, and free memory on every NUMA node that has CPUs.

    A failed DIMM shows up as less MemTotal; a NUMA node with no free memory makes the job's
    allocations land on the far socket. NUMA nodes without CPUs hold GPU memory (POWER9 + V100,
    Grace Hopper) or CXL memory: they are listed, not judged by the per-node floor (GPU memory is
    meant to fill up). Source: /proc/meminfo, /sys/devices/system/node/node*/{meminfo,cpulist}
    (`numactl -H`). Fix: reseat/replace the DIMM; drop caches or find the process holding memory.
    """
    total_gib = mem.total_kb / GIB_KB
    results = []
    if params.min_total_gib and total_gib < params.min_total_gib:
        results.append(
            Result(
                "system.memory",
                Status.FAIL,
                "%.1f GiB physical memory, expected >= %.1f GiB"
                % (total_gib, params.min_total_gib),
                details={"total_gib": round(total_gib, 2)},
                action=Action.DRAIN,
            )
        )
    for numa in mem.numa:
        percent = 100.0 * numa.free_kb / numa.total_kb if numa.total_kb else 0.0
        if (
            numa.has_cpus
            and params.min_free_percent_per_numa
            and percent < params.min_free_percent_per_numa
        ):
            results.append(
                Result(
                    "system.memory",
                    Status.WARN,
                    "NUMA node %d: %.1f%% free (%.1f GiB), below %.1f%%"
                    % (numa.node, percent, numa.free_kb / GIB_KB, params.min_free_percent_per_numa),
                    component="numa:%d" % numa.node,
                    details={"free_kb": numa.free_kb, "total_kb": numa.total_kb},
                )
            )
    if results:
        return results
    memory_only = [n.node for n in mem.numa if not n.has_cpus]
    nodes = (
        "%d NUMA node(s)" % len(mem.numa)
        if not memory_only
        else "%d NUMA node(s) with CPUs, %d memory-only (GPU or CXL memory: %s)"
        % (len(mem.numa) - len(memory_only), len(memory_only), format_cpulist(memory_only))
    )
    return [
        Result(
            "system.memory",
            Status.OK,
            "%.1f GiB total, %.1f GiB available, %s"
            % (total_gib, mem.available_kb / GIB_KB, nodes),
            details={
                "numa_free_gib": {str(n.node): round(n.free_kb / GIB_KB, 2) for n in mem.numa},
                "memory_only_nodes": memory_only,
            },
        )
    ]


@check(
    name="system.swap",
    contexts=ALL,
    timeout=1.0,
    needs=("system.swap",),
    params=(
        Param("allow_swap", bool, True, "WARN when any swap area is active and this is false"),
        Param(
            "max_used_percent",
            float,
            50.0,
            "WARN when more than this percent of swap is in use",
            minimum=0.0,
            maximum=100.0,
        ),
    ),
)
def swap(areas: Tuple[SwapArea, ...], params) -> Result:
    """Swap usage: a node that swaps runs its job at disk speed.

    Source: /proc/swaps (`swapon --show`). Fix: find the memory hog (leftover process?) or swapoff.
    """
    size = sum(a.size_kb for a in areas)
    used = sum(a.used_kb for a in areas)
    details = {"areas": [a.name for a in areas], "size_kb": size, "used_kb": used}
    if areas and not params.allow_swap:
        return Result(
            "system.swap",
            Status.WARN,
            "swap is active (%s) but not allowed" % ", ".join(details["areas"]),
            details=details,
        )
    if size and 100.0 * used / size > params.max_used_percent:
        return Result(
            "system.swap",
            Status.WARN,
            "%.0f%% of swap in use (%d MiB)" % (100.0 * used / size, used // 1024),
            details=details,
        )
    return Result(
        "system.swap",
        Status.OK,
        "no swap" if not areas else "%d MiB swap, %d MiB used" % (size // 1024, used // 1024),
        details=details,
    )


@check(
    name="system.filesystems",
    contexts=ALL,
    timeout=2.0,
    needs=("system.filesystems",),
    params=(
        Param(
            "mounted",
            list,
            [],
            "paths that must be mount points of their own (e.g. /scratch, /home)",
            item_type=str,
            validate=absolute_path,
        ),
        Param(
            "writable",
            list,
            ["/", "/tmp"],
            "paths whose file system must be read-write with free space and inodes",
            item_type=str,
            validate=absolute_path,
        ),
        Param(
            "min_free_percent",
            float,
            5.0,
            "FAIL when a checked file system has less free space (percent)",
            minimum=0.0,
            maximum=100.0,
        ),
        Param(
            "min_free_inodes_percent",
            float,
            5.0,
            "FAIL when a checked file system has fewer free inodes (percent)",
            minimum=0.0,
            maximum=100.0,
        ),
    ),
)
def filesystems(states: Tuple[FsState, ...], params) -> List[Result]:
    """Required file systems are mounted, writable, and have free space and inodes.

    A missing /scratch mount, a read-only /tmp or a full file system fails the job minutes in.
    Source: /proc/mounts and statvfs(2) (`findmnt`, `df -h`, `df -i`). Fix: mount/remount or fsck,
    clean up, or check the storage server.
    """
    must_mount = set(params.mounted)
    return [_judge_fs(state, state.path in must_mount, params) for state in states] or [
        Result("system.filesystems", Status.SKIP, "no file systems configured")
    ]


def _judge_fs(fs: FsState, must_be_mountpoint: bool, params) -> Result:
    comp = "fs:" + fs.path
    if must_be_mountpoint and not fs.is_mountpoint:
        return Result(
            "system.filesystems",
            Status.FAIL,
            "%s is not mounted" % fs.path,
            component=comp,
            action=Action.DRAIN,
        )
    if fs.mount is not None and "ro" in fs.mount.options:
        return Result(
            "system.filesystems",
            Status.FAIL,
            "%s is on a read-only file system (%s)" % (fs.path, fs.mount.mountpoint),
            component=comp,
            action=Action.DRAIN,
            details={"device": fs.mount.device, "options": list(fs.mount.options)},
        )
    if fs.live_only:
        return Result(
            "system.filesystems",
            Status.SKIP,
            "free space of %s not judged: %s" % (fs.path, fs.error),
            component=comp,
        )
    if fs.error:
        return Result(
            "system.filesystems",
            Status.UNKNOWN,
            "cannot stat %s: %s" % (fs.path, fs.error),
            component=comp,
        )
    details = {
        "free_percent": round(fs.free_percent, 1),
        "free_inodes_percent": round(fs.free_inodes_percent, 1),
        "mount": fs.mount.mountpoint if fs.mount else None,
    }
    if fs.free_percent < params.min_free_percent:
        return Result(
            "system.filesystems",
            Status.FAIL,
            "%s: %.1f%% free space, below %.1f%%"
            % (fs.path, fs.free_percent, params.min_free_percent),
            component=comp,
            details=details,
            action=Action.DRAIN,
        )
    if fs.free_inodes_percent < params.min_free_inodes_percent:
        return Result(
            "system.filesystems",
            Status.FAIL,
            "%s: %.1f%% free inodes, below %.1f%%"
            % (fs.path, fs.free_inodes_percent, params.min_free_inodes_percent),
            component=comp,
            details=details,
            action=Action.DRAIN,
        )
    return Result(
        "system.filesystems",
        Status.OK,
        "%s: %.0f%% free" % (fs.path, fs.free_percent),
        component=comp,
        details=details,
    )


@check(
    name="system.processes",
    contexts=ALL,
    timeout=3.0,
    needs=("system.processes",),
    params=(
        Param(
            "required",
            list,
            [],
            "process names (as in /proc/<pid>/comm) that must be running, e.g. munged",
            item_type=str,
        ),
        Param(
            "forbidden",
            list,
            [],
            "process names that must not be running (e.g. a stray xorg)",
            item_type=str,
        ),
    ),
)
def processes(running: FrozenSet[str], params) -> Result:
    """Required daemons are running and forbidden ones are not.

    Source: /proc/<pid>/comm (`pgrep -x NAME`). Fix: start the service (systemctl start ...) or kill
    the stray process. Names are the kernel's 15-character comm names.
    """
    missing = [name for name in params.required if name[:15] not in running]
    present = [name for name in params.forbidden if name[:15] in running]
    if not params.required and not params.forbidden:
        return Result(
            "system.processes", Status.SKIP, "no required or forbidden processes configured"
        )
    details = {"missing": missing, "forbidden_running": present}
    if missing or present:
        parts = (["not running: " + ", ".join(missing)] if missing else []) + (
            ["running but forbidden: " + ", ".join(present)] if present else []
        )
        return Result(
            "system.processes", Status.FAIL, "; ".join(parts), details=details, action=Action.DRAIN
        )
    return Result(
        "system.processes",
        Status.OK,
        "%d required running, %d forbidden absent" % (len(params.required), len(params.forbidden)),
        details=details,
    )


@check(
    name="system.kernel",
    contexts=ALL,
    timeout=1.0,
    needs=("system.kernel",),
    params=(
        Param(
            "allow",
            list,
            [],
            "kernel releases allowed (shell patterns like '5.15.0-1*'); empty = any",
            item_type=str,
        ),
        Param("deny", list, [], "kernel releases refused (shell patterns)", item_type=str),
    ),
)
def kernel(release: str, params) -> Result:
    """The running kernel is on the allow list and not on the deny list.

    A node rebooted into the wrong kernel lacks matching GPU/IB modules or carries a known bug.
    Source: /proc/sys/kernel/osrelease (`uname -r`). Fix: set the default boot entry and reboot.
    """
    if any(fnmatch.fnmatchcase(release, pattern) for pattern in params.deny):
        return Result(
            "system.kernel",
            Status.FAIL,
            "kernel %s is on the deny list" % release,
            details={"release": release},
            action=Action.REBOOT,
        )
    if params.allow and not any(fnmatch.fnmatchcase(release, pattern) for pattern in params.allow):
        return Result(
            "system.kernel",
            Status.FAIL,
            "kernel %s is not on the allow list (%s)" % (release, ", ".join(params.allow)),
            details={"release": release},
            action=Action.REBOOT,
        )
    return Result("system.kernel", Status.OK, "kernel %s" % release, details={"release": release})


@check(
    name="system.load",
    contexts=DEFAULT_CONTEXTS,
    timeout=1.0,
    needs=("system.load",),
    params=(
        Param(
            "max_load_per_cpu",
            float,
            1.5,
            "WARN when the 1-minute load average per online CPU exceeds this",
            above=0.0,
            maximum=10000.0,
        ),
    ),
)
def load(sample: Tuple[LoadAvg, int], params) -> Result:
    """Load average per CPU before a job starts: a busy idle node hides a leftover or runaway process.

    Source: /proc/loadavg (`uptime`). Fix: look for leftovers (`ps -eo pid,user,pcpu,comm --sort=-pcpu`).
    """
    avg, cpus = sample
    per_cpu = avg.one / cpus if cpus else avg.one
    details = {"load1": avg.one, "load5": avg.five, "cpus": cpus, "per_cpu": round(per_cpu, 2)}
    if params.max_load_per_cpu and per_cpu > params.max_load_per_cpu:
        return Result(
            "system.load",
            Status.WARN,
            "load %.2f on %d CPUs (%.2f per CPU > %.2f)"
            % (avg.one, cpus, per_cpu, params.max_load_per_cpu),
            details=details,
        )
    return Result(
        "system.load", Status.OK, "load %.2f on %d CPUs" % (avg.one, cpus), details=details
    )
