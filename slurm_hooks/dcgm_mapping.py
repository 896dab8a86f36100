"""dcgm-exporter HPC job mapping: which job uses which GPU, for the `hpc_job` label on DCGM metrics.

dcgm-exporter, started with `--hpc-job-mapping-dir DIR` (or DCGM_HPC_JOB_MAPPING_DIR), reads one file
per GPU in DIR, named after the GPU's index ("0", "1", ...), holding the ids of the jobs using that
GPU, one per line. With [metrics] dcgm_job_mapping_dir set, the prolog adds the job's id to the files
of its GPUs (SLURM_JOB_GPUS, translated to NVML indices by the prolog snapshot) and the epilog removes it from every file (so a file left behind by a
crashed epilog heals on the GPU's next job). Files are replaced atomically and updated under a lock
on the directory, since jobs sharing a node start and end concurrently. They are mode 0644:
dcgm-exporter usually does not run as root.

Failures (read-only directory, full disk) are logged and never stop a hook.
"""
from __future__ import annotations

import fcntl
import logging
import os
from typing import Iterable, List, Optional

from . import logs
from .atomicio import write_atomic

FILE_MODE, DIR_MODE = 0o644, 0o755


def add_job(directory: str, job_id: str, gpus: Iterable[int]) -> List[str]:
    """Add job_id to the mapping file of each GPU index; returns the files written."""
    written = []
    with _locked(directory):
        for index in sorted(set(gpus)):
            path = os.path.join(directory, str(int(index)))
            jobs = _read_jobs(path)
            if job_id not in jobs:
                _write_jobs(path, jobs + [job_id])
                written.append(path)
    return written


def remove_job(directory: str, job_id: str) -> List[str]:
    """Remove job_id from every GPU's mapping file (an emptied file is removed); returns the files changed."""
    changed = []
    with _locked(directory):
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            if not _is_gpu_file(name) or not os.path.isfile(path):
                continue
            jobs = _read_jobs(path)
            if job_id in jobs:
                remaining = [j for j in jobs if j != job_id]
                if remaining:
                    _write_jobs(path, remaining)
                else:
                    os.unlink(path)
                changed.append(path)
    return changed


def on_prolog(config, job, nvml_indices: Optional[Iterable[int]] = None, log: Optional[logging.Logger] = None) -> None:
    """nvml_indices: the job's GPUs as NVML indices (from the prolog snapshot); else Slurm's indices,
    which are the same unless minor numbers and NVML indices differ on this node."""
    directory = config.get("metrics", "dcgm_job_mapping_dir")
    gpus = list(nvml_indices) if nvml_indices else list(job.gpus or ())
    if not directory or not job.job_id or not gpus:
        return
    try:
        add_job(directory, job.job_id, gpus)
    except OSError as exc:
        (log or logging.getLogger(logs.LOGGER_NAME)).error(
            logs.kv(event="dcgm-mapping-not-written", job=job.job_id, path=directory, error=exc))


def on_epilog(config, job, log: Optional[logging.Logger] = None) -> None:
    directory = config.get("metrics", "dcgm_job_mapping_dir")
    if not directory or not job.job_id or not os.path.isdir(directory):
        return
    try:
        remove_job(directory, job.job_id)
    except OSError as exc:
        (log or logging.getLogger(logs.LOGGER_NAME)).error(
            logs.kv(event="dcgm-mapping-not-removed", job=job.job_id, path=directory, error=exc))


def _is_gpu_file(name: str) -> bool:
    """"3" or a MIG instance "3.1"; never our lock or temp files."""
    return all(part.isdigit() for part in name.split(".")) and name.count(".") <= 1


def _read_jobs(path: str) -> List[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return [line.strip() for line in handle.read(1 << 16).splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def _write_jobs(path: str, jobs: List[str]) -> None:
    write_atomic(path, ("\n".join(jobs) + "\n").encode("utf-8"), mode=FILE_MODE)


class _locked:
    """flock on the directory itself: no lock file for dcgm-exporter to trip over."""

    def __init__(self, directory: str):
        self.directory = directory
        self.fd = -1

    def __enter__(self) -> "_locked":
        os.makedirs(self.directory, mode=DIR_MODE, exist_ok=True)
        self.fd = os.open(self.directory, os.O_RDONLY)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)  # closing releases the lock
