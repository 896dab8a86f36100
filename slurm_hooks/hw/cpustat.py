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

from ..slurm.cgroup import CGROUP_ROOT, find_job_cpuset
from .host import Host, HostError, format_cpulist

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

PROC_STAT = "/proc/stat"


def tick_hz() -> int:
    """USER_HZ, the unit of /proc/stat (sysconf(_SC_CLK_TCK)); 100 where it cannot be asked."""
    try:
        return int(os.sysconf("SC_CLK_TCK")) or 100
    except (ValueError, OSError, AttributeError):
        return 100


def parse_proc_stat(text: str) -> Dict[int, Tuple[int, Optional[int]]]:
    """/proc/stat text -> {cpu: (busy ticks, steal ticks or None on a kernel without the column)}.

    Only the per-CPU `cpuN` lines, which come first (fs/proc/stat.c); offline CPUs have none. A
    malformed line is skipped, not guessed. Runs in the prolog: one split per line, five additions.
    """
    out: Dict[int, Tuple[int, Optional[int]]] = {}
    for line in text.split("\n"):
        if not line.startswith("cpu"):
            if out:
                break  # past the CPU lines: intr, ctxt, ... (the intr line can be long)
            continue
        f = line.split()
        if len(f) < 8 or not f[0][3:].isdigit():
            continue  # the all-CPU "cpu" line, or a kernel older than anything we run on
        try:
            busy = (
                int(f[1]) + int(f[2]) + int(f[3]) + int(f[6]) + int(f[7])
            )  # user nice system irq softirq
            out[int(f[0][3:])] = (busy, int(f[8]) if len(f) > 8 else None)
        except ValueError:
            continue
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


def cpu_lines(text: str) -> str:
    """The CPU lines of /proc/stat (everything before the `intr` line): what a snapshot keeps. The
    prolog only slices the text; the epilog's record build parses both (parse_proc_stat)."""
    end = text.find("\nintr ")
    return text[: end + 1] if end >= 0 else text


def read_cpu_times(host: Host, job_id: Optional[str], notes: List[str]) -> Dict[str, Any]:
    """{"tick_hz", "proc_stat" (its CPU lines), "job_cpus" (cpulist or None), "usage_usec" ({"job": n,
    "slurm": n}, each only when found)}. What could not be read is said in `notes`."""
    out: Dict[str, Any] = {"tick_hz": tick_hz(), "proc_stat": "", "job_cpus": None}
    try:
        out["proc_stat"] = cpu_lines(host.read_text(PROC_STAT))
    except HostError as exc:
        notes.append("CPU times unreadable: %s" % exc)
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
        if (
            job_id and job_id.isdigit() and job_id.isascii()
        ):  # a path component: only a Slurm job number
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
