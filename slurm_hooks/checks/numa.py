"""Family `numa`: job CPU/GPU affinity, gres.conf Cores, housekeeping CPUs and IRQs, NUMA sysctls.

Where the data comes from: each GPU's /sys/bus/pci/devices/<bdf>/{numa_node,local_cpulist}
(`nvidia-smi topo -m` "CPU Affinity"), cross-checked with nvmlDeviceGetCpuAffinity; the job's cgroup
(slurm_hooks.slurm.cgroup); /etc/slurm/gres.conf (slurm_hooks.slurm.gres); /sys/devices/system/cpu/cpuN/topology
(`lscpu -e`); /proc/<pid>/{comm,status,cgroup} (`taskset -cp PID`); /proc/interrupts and
/proc/irq/<n>/smp_affinity_list (`cat /proc/irq/N/smp_affinity_list`); /proc/sys/kernel/numa_balancing,
/proc/sys/vm/zone_reclaim_mode, /sys/devices/system/node/node<N>/hugepages (`numactl -H`, `sysctl`).
"""

from __future__ import annotations

import fnmatch
import re

from ..core.structs import Struct
from ..hw import nvml
from ..hw.host import HostError, format_cpulist, parse_cpulist
from ..registry import DEFAULT_CONTEXTS, Param, absolute_path, check, gatherer
from ..result import Action, Blame, Result, Status
from ..slurm import cgroup, conffile, gres
from .topology import Endpoint, Topology

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Dict, FrozenSet, List, Optional, Tuple


class GpuPlace(Struct):
    gpu: Endpoint
    numa_node: int
    local_cpus: FrozenSet[int]  # sysfs local_cpulist
    nvml_cpus: Optional[FrozenSet[int]] = (
        None  # nvmlDeviceGetCpuAffinity; None when NVML is unusable or in a hook (not shown)
    )


@gatherer("numa.gpus")
def read_gpu_places(ctx) -> Tuple[GpuPlace, ...]:
    topo: Topology = ctx.get("topology.pcie")
    # NVML's view is only shown beside sysfs's (details.nvml_cpu_affinity): not read in a hook
    nvml_cpus = _nvml_affinity(ctx, topo) if ctx.informational_reads else {}
    return tuple(
        GpuPlace(
            g,
            topo.tree.nodes[g.bdf].numa_node,
            topo.tree.nodes[g.bdf].local_cpus,
            nvml_cpus.get(g.index),
        )
        for g in topo.gpus
    )


def _nvml_affinity(ctx, topo: Topology) -> Dict[int, FrozenSet[int]]:
    """nvmlDeviceGetCpuAffinity: an array of unsigned longs, bit c of word w = CPU 64*w + c."""
    if not topo.gpus or all(g.index is None for g in topo.gpus):
        return {}
    inventory = ctx.get("gpu.inventory")
    session = nvml.session(ctx.config.get("nvml", "library"))
    words = max(1, (len(ctx.host.listdir("/sys/devices/system/cpu", default=[])) + 63) // 64 + 1)
    out = {}
    for index, handle in inventory.handles.items():
        try:
            array = session.call("nvmlDeviceGetCpuAffinity", handle, words)
        except nvml.NvmlError:
            continue  # sysfs stays authoritative; the cross-check is best effort
        out[index] = frozenset(
            64 * w + bit for w, value in enumerate(array) for bit in range(64) if value >> bit & 1
        )
    return out


def _host_name(ctx) -> str:
    return (
        ctx.job.node_name
        or ctx.host.read_text("/proc/sys/kernel/hostname", default="").strip().split(".")[0]
    )


@gatherer("numa.job")
def read_job_cpuset(ctx) -> Optional[cgroup.JobCpuset]:
    return cgroup.find_job_cpuset(ctx.host, ctx.job.job_id) if ctx.job.job_id else None


@gatherer("numa.cores")
def read_cores(ctx) -> List[FrozenSet[int]]:
    """CPUs of each core in Slurm's logical core order: socket by socket, cores identified by the kernel's
    sibling lists (the system.cpu_places gatherer, slurm_hooks.hw.cputopo)."""
    return ctx.get("system.cpu_places").cores


class GresSource(Struct):
    path: str
    node: str
    conf: Optional[gres.GresConf]  # None: file absent
    error: str = ""


@gatherer("numa.gres")
def read_gres(ctx) -> GresSource:
    path = ctx.config.check("numa.gres-affinity").params.gres_conf
    read = conffile.host_reader(ctx.host)
    try:
        text = conffile.read_top(path, read)
        if text is None:
            return GresSource(path, _host_name(ctx), None)
        conf = gres.parse_gres_conf(text, path, read)
        return GresSource(path, _host_name(ctx), conf)
    except HostError as exc:  # a parse error, or an include missing or unreadable
        return GresSource(path, _host_name(ctx), None, str(exc))


def _table(places: Tuple[GpuPlace, ...], extra: Dict[int, str], title: str) -> str:
    rows = [("GPU", "PCI", "NUMA", "local CPUs", title)]
    for p in places:
        rows.append(
            (
                p.gpu.name,
                p.gpu.bdf,
                str(p.numa_node),
                format_cpulist(p.local_cpus) or "-",
                extra.get(id(p), "-"),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _job_places(
    places: Tuple[GpuPlace, ...], job_gpus: Optional[Tuple[int, ...]]
) -> List[GpuPlace]:
    """The job's GPUs: Slurm's indices are /dev/nvidia<minor> numbers (NVML index when minors are unknown)."""
    if job_gpus is None:
        return list(places)
    by_minor = all(p.gpu.minor >= 0 for p in places)
    return [p for p in places if (p.gpu.minor if by_minor else p.gpu.index) in job_gpus]


@check(
    name="numa.job-affinity",
    contexts=("prolog", "manual"),
    timeout=3.0,
    needs=("numa.gpus", "numa.job", "job"),
    params=(
        Param(
            "policy",
            str,
            "some",
            "some: each allocated GPU has at least one allocated CPU on its NUMA node; "
            "all: every allocated CPU is local to one of the job's GPUs",
            choices=("some", "all"),
        ),
        Param(
            "on_violation",
            str,
            "warn",
            "status for a misplaced job (blamed on the job's allocation, never "
            "drains the node; gres-affinity catches the node-side cause)",
            choices=("warn", "fail"),
        ),
    ),
)
def job_affinity(
    places: Tuple[GpuPlace, ...], job_cpus: Optional[cgroup.JobCpuset], job, params
) -> List[Result]:
    """The job's allocated CPUs are on the NUMA nodes of its allocated GPUs.

    Source: the job's cgroup cpuset (v2 .../slurmstepd.scope/job_<id>/cpuset.cpus.effective, v1
    cpuset/slurm/uid_<uid>/job_<id>/cpuset.cpus) and each GPU's local_cpulist. The cgroup exists before
    the prolog only with PrologFlags=RunInJob (TaskPlugin=task/cgroup, ProctrackType=proctrack/cgroup,
    ConstrainCores=yes); with Contain alone slurmd creates it after the prolog, and the check SKIPs
    saying so. Fix: gres.conf Cores= (see numa.gres-affinity), or --gres-flags=enforce-binding.
    """
    if job_cpus is None:
        return [
            Result(
                "numa.job-affinity", Status.SKIP, "no job (runs in the prolog, or with a job id)"
            )
        ]
    if job_cpus.cpus is None:
        return [
            Result(
                "numa.job-affinity",
                Status.SKIP,
                "job %s's cgroup is not visible to the prolog (%s): it "
                "exists before the prolog only with PrologFlags=RunInJob and TaskPlugin=task/cgroup"
                % (job_cpus.job_id, job_cpus.reason),
                details={"searched": list(job_cpus.searched)},
            )
        ]
    mine = _job_places(places, job.gpus)
    if not mine:
        return [
            Result(
                "numa.job-affinity",
                Status.SKIP,
                "job %s has no GPUs on this node" % job_cpus.job_id,
            )
        ]
    cpus = job_cpus.cpus
    extra = {id(p): format_cpulist(cpus & p.local_cpus) or "none" for p in mine}
    details = {
        "job_cpus": format_cpulist(cpus),
        "cgroup": job_cpus.path,
        "gpus": _table(tuple(mine), extra, "job CPUs local"),
        "nvml_cpu_affinity": _nvml_agreement(mine),
    }
    bad_status = Status.FAIL if params.on_violation == "fail" else Status.WARN
    results = [
        Result(
            "numa.job-affinity",
            bad_status,
            "%s (NUMA %d, CPUs %s) has none of the job's CPUs (%s) "
            "on its NUMA node: its host threads and NCCL proxy run across the socket"
            % (p.gpu.name, p.numa_node, format_cpulist(p.local_cpus), format_cpulist(cpus)),
            component=p.gpu.component,
            blame=Blame.JOB,
            details=details,
        )
        for p in mine
        if p.local_cpus and not cpus & p.local_cpus
    ]
    if not results and params.policy == "all":
        local = frozenset().union(*(p.local_cpus for p in mine))
        remote = cpus - local
        if remote:
            results.append(
                Result(
                    "numa.job-affinity",
                    bad_status,
                    "job CPUs %s are not local to any of its GPUs" % format_cpulist(remote),
                    blame=Blame.JOB,
                    details=details,
                )
            )
    return results or [
        Result(
            "numa.job-affinity",
            Status.OK,
            "job %s: CPUs %s local to its %d GPUs (%s)"
            % (job_cpus.job_id, format_cpulist(cpus), len(mine), params.policy),
            details=details,
        )
    ]


@check(
    name="numa.gres-affinity",
    contexts=DEFAULT_CONTEXTS,
    timeout=3.0,
    needs=("numa.gpus", "numa.gres", "numa.cores"),
    params=(
        Param(
            "gres_conf",
            str,
            "/etc/slurm/gres.conf",
            "gres.conf to read (or a saved `slurmd -G` output)",
            validate=absolute_path,
        ),
        Param(
            "exact",
            bool,
            False,
            "Cores= must cover every core local to the GPU (default: a subset is fine)",
        ),
    ),
)
def gres_affinity(
    places: Tuple[GpuPlace, ...], source: GresSource, core_cpus, params
) -> List[Result]:
    """gres.conf Cores= of each GPU are CPUs local to that GPU (a very common misconfiguration).

    Slurm binds a job's CPUs to its GPUs through Cores=; swapped or stale Cores put every job's
    threads across the socket from its GPUs. Cores= are logical core indices (socket-major, `lstopo -l`),
    mapped to CPUs with /sys/devices/system/cpu/cpuN/topology. Source: gres.conf and the GPU's
    local_cpulist (`nvidia-smi topo -m`). Fix: correct Cores= (or use AutoDetect=nvml), then restart slurmd.
    """
    name = "numa.gres-affinity"
    if source.error:
        # UNKNOWN, not FAIL: slurmd may accept a line our parser does not (our limitation must not drain)
        return [Result(name, Status.UNKNOWN, "cannot parse %s: %s" % (source.path, source.error))]
    if source.conf is None:
        return [Result(name, Status.SKIP, "no %s" % source.path)]
    lines = source.conf.gpu_lines(source.node)
    by_minor = {
        (p.gpu.minor if p.gpu.minor >= 0 else p.gpu.index): p for p in places
    }  # Slurm's index
    results, extra = [], {}
    for line in lines:
        if line.cores is None:
            continue
        cpus, missing = gres.cores_to_cpus(line.cores, core_cpus)
        for dev in line.files:
            place = by_minor.get(gres.device_minor(dev))
            if place is None:
                continue
            extra[id(place)] = format_cpulist(cpus)
            results += _judge_gres(
                place, dev, line, cpus, missing, len(core_cpus), source.path, params
            )
    autodetect = source.conf.autodetect_for(source.node)
    if not extra:
        why = (
            ("AutoDetect=%s: slurmd takes Cores from the driver" % autodetect)
            if autodetect not in ("", "off")
            else "no GPU lines with Cores= for node %s" % source.node
        )
        return [
            Result(name, Status.SKIP if not autodetect or autodetect == "off" else Status.OK, why)
        ]
    details = {
        "gpus": _table(places, extra, "gres Cores CPUs"),
        "file": source.path,
        "node": source.node,
        "nvml_cpu_affinity": _nvml_agreement(places),
    }
    bad = [r for r in results if r.status is not Status.OK]
    if bad:  # the table once, on the first finding: -v output stays readable with 8 failing GPUs
        bad[0] = Result(
            bad[0].check,
            bad[0].status,
            bad[0].summary,
            bad[0].component,
            dict(bad[0].details, **details),
            bad[0].action,
        )
    return bad or [
        Result(
            name,
            Status.OK,
            "Cores= of %d GPUs in %s are local to them" % (len(extra), source.path),
            details=details,
        )
    ]


def _nvml_agreement(places) -> Dict[str, str]:
    """Per GPU: does nvmlDeviceGetCpuAffinity agree with sysfs local_cpulist? (informational cross-check)"""
    return {
        p.gpu.name: "n/a"
        if p.nvml_cpus is None
        else (
            "agrees" if p.nvml_cpus == p.local_cpus else "NVML says " + format_cpulist(p.nvml_cpus)
        )
        for p in places
    }


def _judge_gres(
    place: GpuPlace,
    dev: str,
    line: gres.GresLine,
    cpus: FrozenSet[int],
    missing: List[int],
    n_cores: int,
    path: str,
    params,
) -> List[Result]:
    where = "%s:%d" % (path, line.line_no)
    if missing:
        return [
            Result(
                "numa.gres-affinity",
                Status.FAIL,
                "%s line %d: Cores %s beyond this node's %d cores"
                % (path, line.line_no, ",".join(map(str, missing[:4])), n_cores),
                component=place.gpu.component,
                action=Action.DRAIN,
                details={"line": where},
            )
        ]
    if not place.local_cpus:
        return [
            Result(
                "numa.gres-affinity",
                Status.OK,
                "%s: the platform reports no local CPUs" % dev,
                component=place.gpu.component,
            )
        ]
    foreign = cpus - place.local_cpus
    short = place.local_cpus - cpus if params.exact else frozenset()
    if foreign or short:
        return [
            Result(
                "numa.gres-affinity",
                Status.FAIL,
                "%s (%s, %s): gres.conf Cores give CPUs %s, but the GPU's "
                "local CPUs (NUMA %d) are %s; fix Cores= in %s and restart slurmd"
                % (
                    place.gpu.name,
                    dev,
                    place.gpu.bdf,
                    format_cpulist(cpus),
                    place.numa_node,
                    format_cpulist(place.local_cpus),
                    where,
                ),
                component=place.gpu.component,
                action=Action.DRAIN,
                details={
                    "line": line.text,
                    "not_local": format_cpulist(foreign) or None,
                    "local_not_listed": format_cpulist(short) or None,
                },
            )
        ]
    return [
        Result(
            "numa.gres-affinity", Status.OK, "%s Cores local" % dev, component=place.gpu.component
        )
    ]


# -- housekeeping CPUs: system daemons and device IRQs stay off the job's CPUs ---------------------


class Irq(Struct):
    number: int
    name: str  # the action name(s) at the end of the /proc/interrupts line
    cpus: FrozenSet[int]


class HousekeepingState(Struct):
    processes: Tuple[cgroup.ProcessAffinity, ...]
    irqs: Tuple[Irq, ...]
    slurm_node: Dict[str, str]  # this node's slurm.conf NodeName line (CpuSpecList, CoreSpecCount)
    slurm_conf: str


@gatherer("numa.housekeeping")
def read_housekeeping(ctx) -> HousekeepingState:
    host, params = ctx.host, ctx.config.check("numa.housekeeping").params
    slurm_text = (
        (conffile.read_top(params.slurm_conf, conffile.host_reader(host)) or "")
        if not params.housekeeping_cpus
        else ""
    )
    node = (
        gres.parse_slurm_node_line(
            slurm_text, _host_name(ctx), params.slurm_conf, conffile.host_reader(host)
        )
        if slurm_text
        else {}
    )
    if not params.housekeeping_cpus and "cpuspeclist" not in node:
        return HousekeepingState(
            (), (), node, params.slurm_conf
        )  # nothing to compare against: skip the /proc walk
    processes = _watched_processes(host, params) if params.processes or params.cgroups else []
    irqs = []
    for number, name in (
        cgroup.parse_interrupts(host.read_text("/proc/interrupts", default=""))
        if params.irqs
        else ()
    ):
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in params.irqs):
            path = "/proc/irq/%d/smp_affinity_list" % number
            text = host.read_text(path, default=None)
            if text is not None:
                irqs.append(Irq(number, name, parse_cpulist(text, path)))
    return HousekeepingState(tuple(processes), tuple(irqs), node, params.slurm_conf)


def _watched_processes(host, params) -> List[cgroup.ProcessAffinity]:
    """The processes named in `processes` or living in a watched cgroup, with their allowed CPUs.

    A node can run 25,000 processes: each one's small /proc/<pid>/cgroup (and comm, when names are
    watched) decides first, and only the few that are watched have their /proc/<pid>/status read.
    """
    names = set(n[:15] for n in params.processes)
    found = []
    watched: Dict[str, bool] = {}  # cgroup path -> _in_cgroups: thousands of processes share one
    for pid in host.pids():
        text = host.read_pid_file(pid, "cgroup")
        if text is None:
            continue  # exited meanwhile
        path = cgroup.process_cgroup(text)
        comm = (host.read_pid_file(pid, "comm", max_bytes=64) or "").strip() if names else None
        in_watched = watched.get(path)
        if in_watched is None:
            in_watched = watched[path] = _in_cgroups(path, params)
        if comm in names or in_watched:
            proc = cgroup.read_process(host, pid, path, comm)
            if proc is not None:
                found.append(proc)
    return found


def _in_cgroups(path: str, params) -> bool:
    return (
        bool(path)
        and any(fnmatch.fnmatchcase(path, p) for p in params.cgroups)
        and not any(fnmatch.fnmatchcase(path, p) for p in params.exclude_cgroups)
    )


def housekeeping_cpus(
    params, state: HousekeepingState, core_cpus: List[FrozenSet[int]]
) -> Tuple[Optional[FrozenSet[int]], str]:
    """The housekeeping CPU set and where it came from, or (None, why not).

    From `housekeeping_cpus`, else from slurm.conf CpuSpecList (Slurm abstract CPU ids: core by core,
    threads of a core consecutive; the whole core is reserved). CoreSpecCount is not derived: Slurm
    picks those cores itself, so set housekeeping_cpus to what `scontrol show node` reports.
    """
    if params.housekeeping_cpus:
        return parse_cpulist(
            params.housekeeping_cpus, 'checks."numa.housekeeping".housekeeping_cpus'
        ), "config"
    spec = state.slurm_node.get("cpuspeclist")
    if spec:
        cpus = gres.spec_cpus(parse_cpulist(spec, state.slurm_conf + " CpuSpecList"), core_cpus)
        return cpus, "%s CpuSpecList=%s" % (state.slurm_conf, spec)
    if state.slurm_node.get("corespeccount"):
        return None, (
            "%s sets CoreSpecCount=%s, whose cores Slurm picks itself: set housekeeping_cpus"
            % (state.slurm_conf, state.slurm_node["corespeccount"])
        )
    return (
        None,
        "no housekeeping_cpus configured and no CpuSpecList for this node in %s" % state.slurm_conf,
    )


def _valid_cpulist(text: str) -> None:
    try:
        parse_cpulist(text, "housekeeping_cpus")
    except HostError as exc:
        raise ValueError("%r is not a CPU list like '0-1,112-113' (%s)" % (text, exc)) from None


@check(
    name="numa.housekeeping",
    contexts=DEFAULT_CONTEXTS,
    timeout=3.0,
    needs=("numa.housekeeping", "numa.cores", "numa.job"),
    params=(
        Param(
            "housekeeping_cpus",
            str,
            "",
            "CPUs reserved for the system, e.g. '0-1,112-113'; empty = derive "
            "from slurm.conf CpuSpecList",
            validate=_valid_cpulist,
        ),
        Param(
            "slurm_conf",
            str,
            "/etc/slurm/slurm.conf",
            "where to look for this node's CpuSpecList",
            validate=absolute_path,
        ),
        Param(
            "processes",
            list,
            [],
            "process names (comm) that must stay on housekeeping CPUs",
            item_type=str,
        ),
        Param(
            "cgroups",
            list,
            ["/system.slice/*"],
            "cgroup v2 path patterns whose processes must stay on housekeeping CPUs",
            item_type=str,
        ),
        Param(
            "exclude_cgroups",
            list,
            ["/system.slice/slurmstepd.scope*", "/system.slice/*_slurmstepd.scope*"],
            "cgroup patterns exempt (the jobs' own steps)",
            item_type=str,
        ),
        Param(
            "irqs",
            list,
            [],
            "interrupt names in /proc/interrupts (patterns, e.g. 'mlx5_comp*@pci:*') whose "
            "affinity must stay on housekeeping CPUs; empty = don't check IRQs",
            item_type=str,
        ),
        Param(
            "on_violation",
            str,
            "warn",
            "status for a process or IRQ outside the housekeeping CPUs",
            choices=("warn", "fail"),
        ),
    ),
)
def housekeeping(
    state: HousekeepingState, core_cpus, job_cpus: Optional[cgroup.JobCpuset], params
) -> List[Result]:
    """System daemons and device interrupts stay on the housekeeping CPUs, off the job's CPUs.

    A daemon or IRQ allowed onto job CPUs steals cycles from (and adds jitter to) a synchronous
    training step. Sources: /proc/<pid>/status Cpus_allowed_list and /proc/<pid>/cgroup (`taskset -cp PID`,
    `systemctl show -p AllowedCPUs`), /proc/irq/<n>/smp_affinity_list. Fix: CPUAffinity= in systemd's
    system.conf or the unit, irqbalance banned CPUs / set_irq_affinity. NVMe queue IRQs are
    kernel-managed (spread over all CPUs by design): leave them out of `irqs`.
    """
    allowed, origin = housekeeping_cpus(params, state, core_cpus)
    if allowed is None:
        return [Result("numa.housekeeping", Status.SKIP, origin)]
    job = job_cpus.cpus if job_cpus is not None and job_cpus.cpus is not None else frozenset()
    status = Status.FAIL if params.on_violation == "fail" else Status.WARN
    results = []
    for proc in state.processes:
        if not proc.cpus <= allowed:
            results.append(
                _violation(
                    status,
                    "%s (pid %d, %s)" % (proc.comm, proc.pid, proc.cgroup or "no cgroup"),
                    proc.cpus,
                    allowed,
                    job,
                    "pid:%d" % proc.pid,
                )
            )
    for irq in state.irqs:
        if not irq.cpus <= allowed:
            results.append(
                _violation(
                    status,
                    "IRQ %d %s" % (irq.number, irq.name),
                    irq.cpus,
                    allowed,
                    job,
                    "irq:%d" % irq.number,
                )
            )
    details = {
        "housekeeping_cpus": format_cpulist(allowed),
        "from": origin,
        "processes": len(state.processes),
        "irqs": len(state.irqs),
        "job_cpus": format_cpulist(job) or None,
    }
    if len(results) > 20:
        results = results[:20] + [
            Result(
                "numa.housekeeping",
                status,
                "... and %d more outside %s" % (len(results) - 20, format_cpulist(allowed)),
                action=_action(status),
            )
        ]
    return results or [
        Result(
            "numa.housekeeping",
            Status.OK,
            "%d processes and %d IRQs on housekeeping CPUs %s"
            % (len(state.processes), len(state.irqs), format_cpulist(allowed)),
            details=details,
        )
    ]


def _action(status: Status) -> Action:
    """A node-broken FAIL names what to do: drain until an admin fixes the setting; a WARN asks nothing."""
    return Action.DRAIN if status is Status.FAIL else Action.NONE


def _violation(
    status: Status,
    who: str,
    cpus: FrozenSet[int],
    allowed: FrozenSet[int],
    job: FrozenSet[int],
    component: str,
) -> Result:
    on_job = cpus & job
    where = (
        ("on the job's CPUs %s" % format_cpulist(on_job))
        if on_job
        else ("on CPUs %s outside the housekeeping set" % format_cpulist(cpus - allowed))
    )
    return Result(
        "numa.housekeeping",
        status,
        "%s may run %s; pin it to %s" % (who, where, format_cpulist(allowed)),
        component=component,
        action=_action(status),
        details={
            "allowed_cpus": format_cpulist(cpus),
            "housekeeping_cpus": format_cpulist(allowed),
            "job_cpus_hit": format_cpulist(on_job) or None,
        },
    )


# -- NUMA sysctls and hugepages ---------------------------------------------------------------


class NumaSysctls(Struct):
    numa_balancing: Optional[int]
    zone_reclaim_mode: Optional[int]
    hugepages: Dict[int, Dict[str, Tuple[int, int]]]  # node -> size ('2048kB') -> (nr, free)


@gatherer("numa.sysctl")
def read_sysctls(ctx) -> NumaSysctls:
    host = ctx.host
    pages: Dict[int, Dict[str, Tuple[int, int]]] = {}
    for node_dir in host.glob("/sys/devices/system/node", "node[0-9]*"):
        node = int(node_dir.rsplit("node", 1)[1])
        for size_dir in host.glob(node_dir + "/hugepages", "hugepages-*"):
            size = size_dir.rsplit("hugepages-", 1)[1]
            pages.setdefault(node, {})[size] = (
                host.read_int(size_dir + "/nr_hugepages", default=0),
                host.read_int(size_dir + "/free_hugepages", default=0),
            )
    return NumaSysctls(
        host.read_int("/proc/sys/kernel/numa_balancing", default=None),
        host.read_int("/proc/sys/vm/zone_reclaim_mode", default=None),
        pages,
    )


def _valid_hugepages(specs: List[str]) -> None:
    for spec in specs:
        size, sep, count = spec.partition("=")
        if not sep or not re.match(r"^\d+kB$", size.strip()) or not count.strip().isdigit():
            raise ValueError("%r is not SIZE=COUNT (e.g. '1048576kB=8')" % spec)


@check(
    name="numa.sysctl",
    contexts=DEFAULT_CONTEXTS,
    timeout=2.0,
    needs=("numa.sysctl",),
    params=(
        Param(
            "numa_balancing",
            int,
            -1,
            "required kernel.numa_balancing (0 = off, usual for GPU nodes); -1 = don't check",
            minimum=-1,
            maximum=3,
        ),
        Param(
            "zone_reclaim_mode",
            int,
            0,
            "required vm.zone_reclaim_mode; 0 (the kernel default) allocates remote "
            "memory instead of stalling to reclaim local page cache; -1 = don't check",
            minimum=-1,
            maximum=7,
        ),
        Param(
            "hugepages",
            list,
            [],
            "per-NUMA-node hugepage pools, e.g. ['1048576kB=8'] (nr_hugepages on every node)",
            item_type=str,
            validate=_valid_hugepages,
        ),
        Param(
            "on_mismatch",
            str,
            "warn",
            "status for a setting that differs",
            choices=("warn", "fail"),
        ),
    ),
)
def sysctl(state: NumaSysctls, params) -> List[Result]:
    """kernel.numa_balancing, vm.zone_reclaim_mode and per-node hugepages are as configured.

    Sources: /proc/sys/kernel/numa_balancing, /proc/sys/vm/zone_reclaim_mode (`sysctl`), and
    /sys/devices/system/node/node<N>/hugepages/hugepages-<size>/{nr,free}_hugepages (`numactl -H`).
    Free memory per NUMA node is system.memory's min_free_percent_per_numa. Fix: /etc/sysctl.d and
    the hugepage boot parameters or a per-node hugepages service.
    """
    status = Status.FAIL if params.on_mismatch == "fail" else Status.WARN
    results = []
    for key, want, have in (
        ("kernel.numa_balancing", params.numa_balancing, state.numa_balancing),
        ("vm.zone_reclaim_mode", params.zone_reclaim_mode, state.zone_reclaim_mode),
    ):
        if want >= 0 and have is not None and have != want:
            results.append(
                Result(
                    "numa.sysctl",
                    status,
                    "%s = %d, expected %d (sysctl -w %s=%d)" % (key, have, want, key, want),
                    component="sysctl:" + key,
                    action=_action(status),
                )
            )
    for spec in params.hugepages:
        size, sep, count = spec.partition("=")
        if not sep or not count.strip().isdigit():
            return [
                Result(
                    "numa.sysctl",
                    Status.UNKNOWN,
                    'checks."numa.sysctl".hugepages: %r is not SIZE=COUNT '
                    "(e.g. '1048576kB=8')" % spec,
                )
            ]
        for node, sizes in sorted(state.hugepages.items()):
            nr, free = sizes.get(size.strip(), (0, 0))
            if nr != int(count):
                results.append(
                    Result(
                        "numa.sysctl",
                        status,
                        "NUMA node %d has %d hugepages of %s, expected %s "
                        "(%d free)" % (node, nr, size, count, free),
                        component="numa:%d" % node,
                        action=_action(status),
                    )
                )
    details = {
        "numa_balancing": state.numa_balancing,
        "zone_reclaim_mode": state.zone_reclaim_mode,
        "hugepages": {
            str(n): {s: "%d nr, %d free" % v for s, v in sizes.items()}
            for n, sizes in sorted(state.hugepages.items())
        },
    }
    return results or [
        Result(
            "numa.sysctl",
            Status.OK,
            "numa_balancing=%s zone_reclaim_mode=%s, hugepages as "
            "configured" % (state.numa_balancing, state.zone_reclaim_mode),
            details=details,
        )
    ]
