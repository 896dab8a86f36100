"""CPU time of the node's CPUs and of Slurm's jobs, read at the prolog and the epilog (snapshot.take).

Where each number comes from:

- Per CPU, since boot, in USER_HZ ticks (os.sysconf("SC_CLK_TCK"), 100 on every Linux we run on):
  /proc/stat `cpuN user nice system idle iowait irq softirq steal guest guest_nice` (`mpstat -P ALL`).
  "busy" = user + nice + system + irq + softirq (guest time is already inside user/nice); "steal" = time a
  hypervisor ran something else while this virtual CPU wanted to run. One file for every CPU.
- The job's CPUs: its Slurm cgroup's cpuset (cgroup.find_job_cpuset), when the cgroup exists at that moment.
- CPU time used by Slurm's jobs, in microseconds: cgroup v2 `cpu.stat` `usage_usec` of the job's cgroup
  (`<scope>/job_<id>`) and of the slurmstepd scope above every job (`/sys/fs/cgroup/system.slice/
  *slurmstepd.scope`). Shell: `grep usage_usec /sys/fs/cgroup/system.slice/slurmstepd.scope/cpu.stat`.

Why the scope as well as the job: slurmd runs the epilog only after every step of the job has ended
(src/slurmd/slurmd/req.c, _rpc_terminate_job: pause_for_job_completion, then run_epilog), and the last
slurmstepd removes job_<id> on its way out (src/plugins/cgroup/v2/cgroup_v2.c, cgroup_p_step_destroy). So
the epilog finds no job cgroup (unless PrologFlags=RunInJob), and with PrologFlags=Contain the prolog finds
none yet (the extern step starts after it). A removed cgroup's usage stays counted in its parent's
usage_usec, so the scope's usage between prolog and epilog is the CPU time of every Slurm job (and their
slurmstepds) in the job's window: exactly the job's on a node it has to itself, an overestimate of it on a
shared node, which only makes `foreign_cpu_frac` smaller (never a false "slow").
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

from .cgroup import CGROUP_ROOT, find_job_cpuset
from .host import Host, HostError, format_cpulist

PROC_STAT = "/proc/stat"
_BUSY_COLUMNS = (0, 1, 2, 5, 6)  # user nice system irq softirq (after the cpuN name)
_STEAL_COLUMN = 7


def tick_hz() -> int:
    """USER_HZ, the unit of /proc/stat (sysconf(_SC_CLK_TCK)); 100 where it cannot be asked."""
    try:
        return int(os.sysconf("SC_CLK_TCK")) or 100
    except (ValueError, OSError, AttributeError):
        return 100


def parse_proc_stat(text: str) -> Dict[int, Tuple[int, Optional[int]]]:
    """/proc/stat text -> {cpu: (busy ticks, steal ticks or None on a kernel without the column)}.

    Only the per-CPU `cpuN` lines; offline CPUs have none. A malformed line is skipped, not guessed.
    """
    out: Dict[int, Tuple[int, Optional[int]]] = {}
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, _, rest = line.partition(" ")
        try:
            cpu = int(name[3:])
            values = [int(v) for v in rest.split()]
        except ValueError:
            continue
        if len(values) < 7:
            continue
        steal = values[_STEAL_COLUMN] if len(values) > _STEAL_COLUMN else None
        out[cpu] = (sum(values[i] for i in _BUSY_COLUMNS), steal)
    return out


def parse_usage_usec(text: str) -> Optional[int]:
    """cgroup v2 cpu.stat text -> its usage_usec (None when the key is missing)."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def read_cpu_times(host: Host, job_id: Optional[str], notes: List[str]) -> Dict[str, Any]:
    """{"tick_hz", "ids", "busy", "steal"} from /proc/stat, plus "job_cpus" (cpulist) and "usage_usec"
    ({"job": n, "slurm": n}, each only when found). What could not be read is said in `notes`."""
    out: Dict[str, Any] = {"tick_hz": tick_hz()}
    try:
        per_cpu = parse_proc_stat(host.read_text(PROC_STAT))
    except HostError as exc:
        notes.append("CPU times unreadable: %s" % exc)
        per_cpu = {}
    ids = sorted(per_cpu)
    out["ids"] = format_cpulist(ids)
    out["busy"] = [per_cpu[c][0] for c in ids]
    if ids and all(per_cpu[c][1] is not None for c in ids):
        out["steal"] = [per_cpu[c][1] for c in ids]
    out["job_cpus"] = None
    if job_id:
        try:
            found = find_job_cpuset(host, job_id)
            out["job_cpus"] = format_cpulist(found.cpus) if found.cpus else None
        except HostError as exc:
            notes.append("job cpuset unreadable: %s" % exc)
    out["usage_usec"] = _slurm_usage(host, job_id, notes)
    return out


def _slurm_usage(host: Host, job_id: Optional[str], notes: List[str]) -> Dict[str, int]:
    """usage_usec of every slurmstepd scope (summed: one per slurmd) and of the job's cgroup in them."""
    usage: Dict[str, int] = {}
    for scope in host.glob(CGROUP_ROOT + "/system.slice", "*slurmstepd.scope"):
        paths = [("slurm", scope + "/cpu.stat")]
        if job_id and job_id.isdigit() and job_id.isascii():  # a path component: only a Slurm job number
            paths.append(("job", "%s/job_%s/cpu.stat" % (scope, job_id)))
        for key, path in paths:
            try:
                value = parse_usage_usec(host.read_text(path, default=""))
            except HostError as exc:
                notes.append("cgroup CPU usage unreadable: %s" % exc)
                continue
            if value is not None:
                usage[key] = usage.get(key, 0) + value
    return usage
