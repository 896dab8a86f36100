"""dcgm-exporter HPC job mapping: which job uses which GPU, for the `hpc_job` label on DCGM metrics.

dcgm-exporter, started with `--hpc-job-mapping-dir DIR` (or DCGM_HPC_JOB_MAPPING_DIR), reads one file
per GPU in DIR, named after the GPU's index ("0", "1", ...), holding the ids of the jobs using that
GPU, one per line. With [metrics] dcgm_job_mapping_dir set, the prolog adds the job's id to the files
of its GPUs (SLURM_JOB_GPUS, translated to NVML indices by the prolog snapshot) and the epilog
removes it from every file.

A job whose epilog never ran (slurmd killed, node crashed mid-job) heals on the GPU's next job: the
prolog keeps, beside its own job, only the jobs that are still running on this node. Running means
a Slurm cgroup for the job exists (cgroup v2: system.slice/*slurmstepd.scope/job_<id>; v1:
<controller>/slurm*/uid_*/job_<id>, the paths of slurm/cgroup.py). Where no Slurm cgroup tree is visible
at all (proctrack/linuxproc without task/cgroup) nothing can be asked, and the prolog relies on
Slurm's default that a GPU belongs to one job at a time: the new job replaces the old entries.
Sites sharing GPUs between jobs (gres/shard, MPS) run task/cgroup, so their jobs are seen running.
A file changed less than RECENT_S ago keeps its jobs: a job whose prolog has just run has no
cgroup yet (slurmd creates it after the prolog), and must not be dropped by a neighbour's prolog.

Files are replaced atomically through a descriptor of DIR (atomicio: no symlink below DIR is
followed) and updated under a lock on DIR itself (jobs sharing a node start and end concurrently),
waited for at most LOCK_TIMEOUT_S. Temp files of writers killed mid-write are removed after an
hour. The files are mode 0644: dcgm-exporter usually does not run as root. Failures (read-only
directory, full disk, a lock held by a hook stuck on a hung file system) are logged and never stop
a hook.
"""

from __future__ import annotations

import os
import time

from ..core import atomicio, locks, logs
from ..core.lazyre import lazy_compile

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    import logging
    from typing import Callable, Iterable, List, Optional

    Alive = Callable[[str], bool]  # job id -> still running on this node

FILE_MODE, DIR_MODE = 0o644, 0o755
LOCK_TIMEOUT_S = 2.0
STALE_TEMP_S = 3600
RECENT_S = 120.0
CGROUP_ROOT = "/sys/fs/cgroup"
_GPU_FILE = lazy_compile(r"^[0-9]{1,4}(\.[0-9]{1,4})?$")  # "3", or a MIG instance "3.1"
_TEMP = lazy_compile(
    r"^\.[0-9]{1,4}(\.[0-9]{1,4})?\.[0-9]+\.[0-9]+\.tmp$"
)  # atomicio's temp files of them


def add_job(
    directory: str,
    job_id: str,
    gpus: Iterable[int],
    alive: Optional[Alive] = None,
    now: Optional[float] = None,
) -> List[str]:
    """Add job_id to the mapping file of each GPU index; returns the files written.

    With `alive`, other jobs in a file not changed for RECENT_S are kept only while alive(job) says
    they still run (module docstring); without it every other job is kept.
    """
    now = time.time() if now is None else now
    written = []
    with locks.locked(directory, LOCK_TIMEOUT_S, create_dir_mode=DIR_MODE, directory=True) as lock:
        for index in sorted(set(gpus)):
            name = str(int(index))
            jobs = _read_jobs(lock.fd, name)
            recent = jobs and now - _mtime(lock.fd, name) < RECENT_S
            keep = [j for j in jobs if j != job_id and (alive is None or recent or alive(j))]
            if keep + [job_id] != jobs:
                _write_jobs(lock.fd, name, keep + [job_id], directory)
                written.append(os.path.join(directory, name))
        atomicio.remove_stale_temps(lock.fd, os.geteuid(), STALE_TEMP_S, names=_TEMP)
    return written


def remove_job(directory: str, job_id: str) -> List[str]:
    """Remove job_id from every GPU's mapping file (an emptied file is removed); returns the files changed."""
    changed = []
    with locks.locked(directory, LOCK_TIMEOUT_S, directory=True) as lock:
        for name, _info in sorted(atomicio.our_entries(lock.fd, _GPU_FILE, os.geteuid())):
            jobs = _read_jobs(lock.fd, name)
            if job_id in jobs:
                remaining = [j for j in jobs if j != job_id]
                if remaining:
                    _write_jobs(lock.fd, name, remaining, directory)
                else:
                    atomicio.remove_ours(lock.fd, name)
                changed.append(os.path.join(directory, name))
        atomicio.remove_stale_temps(lock.fd, os.geteuid(), STALE_TEMP_S, names=_TEMP)
    return changed


def job_liveness(root: str = "/") -> Optional[Alive]:
    """A test of whether a job still runs here, from Slurm's cgroups; None when no Slurm cgroup tree is visible."""
    base = os.path.join(root, CGROUP_ROOT.lstrip("/"))
    parents = []  # directories holding job_<id> directories
    for scope in _listdir(os.path.join(base, "system.slice")):
        if scope.endswith("slurmstepd.scope"):
            parents.append(os.path.join(base, "system.slice", scope))
    for controller in _listdir(base):
        for slurm in _listdir(os.path.join(base, controller)):
            if slurm.startswith("slurm"):
                parents.extend(
                    os.path.join(base, controller, slurm, uid)
                    for uid in _listdir(os.path.join(base, controller, slurm))
                    if uid.startswith("uid_")
                )
    if not parents:
        return None
    return lambda job_id: any(
        os.path.isdir(os.path.join(parent, "job_" + job_id)) for parent in parents
    )


def on_prolog(
    config, job, nvml_indices: Optional[Iterable[int]] = None, log: Optional[logging.Logger] = None
) -> None:
    """nvml_indices: the job's GPUs as NVML indices (from the prolog snapshot); else Slurm's indices,
    which are the same unless minor numbers and NVML indices differ on this node."""
    directory = config.get("metrics", "dcgm_job_mapping_dir")
    gpus = list(nvml_indices) if nvml_indices else list(job.gpus or ())
    if not directory or not job.job_id or not gpus:
        return
    try:
        alive = job_liveness(config.get("general", "root"))
        add_job(directory, job.job_id, gpus, alive if alive is not None else (lambda _job: False))
    except OSError as exc:
        (log or logs.decision_logger()).error(
            logs.kv(event="dcgm-mapping-not-written", job=job.job_id, path=directory, error=exc)
        )


def on_epilog(config, job, log: Optional[logging.Logger] = None) -> None:
    directory = config.get("metrics", "dcgm_job_mapping_dir")
    if not directory or not job.job_id or not os.path.isdir(directory):
        return
    try:
        remove_job(directory, job.job_id)
    except OSError as exc:
        (log or logs.decision_logger()).error(
            logs.kv(event="dcgm-mapping-not-removed", job=job.job_id, path=directory, error=exc)
        )


def _listdir(path: str) -> List[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _mtime(dir_fd: int, name: str) -> float:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mtime
    except OSError:
        return 0.0


def _read_jobs(dir_fd: int, name: str) -> List[str]:
    """The jobs in a GPU's file, read only as we write it (atomicio.read_ours): a FIFO there held
    the hook's mapping step in open() until its deadline, every job, with the directory's lock
    held; a file another user wrote is not ours to keep (it is replaced)."""
    try:
        raw = atomicio.read_ours(name, 1 << 16, dir_fd=dir_fd) or b""
    except ValueError:
        return []
    return [line.strip() for line in raw.decode("utf-8", "replace").splitlines() if line.strip()]


def _write_jobs(dir_fd: int, name: str, jobs: List[str], directory: str) -> None:
    atomicio.write_atomic_at(
        dir_fd, name, ("\n".join(jobs) + "\n").encode("utf-8"), FILE_MODE, where=directory
    )
