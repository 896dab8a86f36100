"""A Slurm job's CPU set from its cgroup, a process's cgroup and CPU affinity, and IRQ names.

Where Slurm puts a job (task/cgroup + proctrack/cgroup):
- cgroup v2 (CgroupPlugin=cgroup/v2, Slurm 22.05+):
  ``/sys/fs/cgroup/system.slice/slurmstepd.scope/job_<id>/cpuset.cpus.effective``
  (``<nodename>_slurmstepd.scope`` when slurmd runs with multiple-slurmd support).
- cgroup v1: ``/sys/fs/cgroup/cpuset/slurm/uid_<uid>/job_<id>/cpuset.cpus``
  (``slurm_<nodename>`` with multiple slurmd).
Shell equivalent: ``cat /sys/fs/cgroup/system.slice/slurmstepd.scope/job_$SLURM_JOB_ID/cpuset.cpus.effective``.

The job's cgroup is created by the job's first slurmstepd. With PrologFlags=Contain that is the
extern step, which slurmd spawns right *after* the prolog has finished, so a prolog running in
slurmd usually finds no cgroup yet; with PrologFlags=RunInJob (newer Slurm) the prolog runs inside
the extern step and the cgroup exists. The cgroup only limits CPUs when cgroup.conf has
ConstrainCores=yes; otherwise it holds every CPU of the node.

A process: /proc/<pid>/status ``Cpus_allowed_list`` (`taskset -cp PID`) and /proc/<pid>/cgroup
(`cat /proc/PID/cgroup`; v2 is the '0::/path' line, v1 the line naming the cpuset controller).
"""

from __future__ import annotations

from ..core.lazyre import lazy_compile
from ..core.structs import Struct
from ..hw.host import Host, parse_cpulist

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import FrozenSet, List, Optional, Tuple

CGROUP_ROOT = "/sys/fs/cgroup"
_JOB_ID = lazy_compile(r"^[0-9]{1,10}$")


class JobCpuset(Struct):
    """What we found for a job. `cpus` is None when no cgroup was found; `reason` then says why."""

    job_id: str
    cpus: Optional[FrozenSet[int]] = None
    path: str = ""  # host path of the file the CPUs came from
    version: str = ""  # "v2" | "v1" | "" (not found)
    reason: str = ""
    searched: tuple = ()


def cgroup_version(host: Host) -> str:
    """'v2' (unified: cgroup.controllers at the root), 'v1' (a cpuset hierarchy), or '' (neither)."""
    if host.exists(CGROUP_ROOT + "/cgroup.controllers"):
        return "v2"
    if host.isdir(CGROUP_ROOT + "/cpuset"):
        return "v1"
    return ""


def find_job_cpuset(host: Host, job_id: str) -> JobCpuset:
    """The job's CPUs from its Slurm cgroup (v2 first, then v1); see the module docstring for paths."""
    if not _JOB_ID.match(job_id or ""):
        return JobCpuset(str(job_id), reason="not a Slurm job id: %r" % job_id)
    candidates: List[str] = []
    for scope in host.glob(CGROUP_ROOT + "/system.slice", "*slurmstepd.scope"):
        candidates.append("%s/job_%s/cpuset.cpus.effective" % (scope, job_id))
    for slurm_dir in host.glob(CGROUP_ROOT + "/cpuset", "slurm*"):
        for uid_dir in host.glob(slurm_dir, "uid_*"):
            candidates.append("%s/job_%s/cpuset.cpus" % (uid_dir, job_id))
    for path in candidates:
        text = host.read_text(path, default=None)
        if text is None:
            continue
        if path.endswith("cpuset.cpus") and not text.strip():  # v1: empty means 'not set here'
            continue
        return JobCpuset(
            job_id,
            parse_cpulist(text, path),
            path,
            "v2" if "/system.slice/" in path else "v1",
            searched=tuple(candidates),
        )
    version = cgroup_version(host)
    return JobCpuset(
        job_id,
        version=version,
        searched=tuple(candidates),
        reason="no cgroup for job %s under %s (cgroup %s)"
        % (job_id, CGROUP_ROOT, version or "not mounted"),
    )


class ProcessAffinity(Struct):
    pid: int
    comm: str
    cpus: FrozenSet[int]
    cgroup: str  # v2 path ('/system.slice/sshd.service'), else the v1 cpuset path, '' if unknown


def read_process(
    host: Host, pid: int, cgroup: Optional[str] = None, comm: Optional[str] = None
) -> Optional[ProcessAffinity]:
    """One process's name, allowed CPUs and cgroup; None when it exited meanwhile or is a kernel thread.

    `cgroup` and `comm` when the caller already read them (a scan of 25,000 processes reads each file once).
    """
    base = "/proc/%d" % pid
    status = host.read_text(base + "/status", default=None)
    if status is None:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if fields.get("Kthread", "0").strip() == "1":
        return None
    allowed = fields.get("Cpus_allowed_list")
    if allowed is None:
        return None
    if comm is None:
        comm = host.read_text(base + "/comm", default=fields.get("Name", "?")).strip()
    cpus = parse_cpulist(allowed.strip(), base + "/status Cpus_allowed_list")
    if cgroup is None:
        cgroup = process_cgroup(host.read_text(base + "/cgroup", default=""))
    return ProcessAffinity(pid, comm, cpus, cgroup)


def process_cgroup(text: str) -> str:
    """/proc/<pid>/cgroup -> the v2 path ('0::/x'), else the v1 cpuset controller's path, else ''."""
    v1 = ""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            return parts[2]
        if "cpuset" in parts[1].split(","):
            v1 = parts[2]
    return v1


def parse_interrupts(text: str, source: str = "/proc/interrupts") -> List[Tuple[int, str]]:
    """/proc/interrupts -> [(irq number, action name)] for numbered IRQs (NMI/LOC/... rows are skipped)."""
    lines = text.splitlines()
    if not lines:
        return []
    ncpu = len(lines[0].split())
    out = []
    for line in lines[1:]:
        label, _, rest = line.partition(":")
        if not label.strip().isdigit():
            continue
        fields = rest.split()
        if len(fields) <= ncpu:
            continue  # an IRQ without a chip/action description
        out.append((int(label), fields[-1]))
    return out
