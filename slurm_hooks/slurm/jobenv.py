"""The job's identity from the environment slurmd gives prolog/epilog scripts — untrusted input.

slurmd sets SLURM_JOB_ID, SLURM_JOB_USER, SLURMD_NODENAME, SLURM_SCRIPT_CONTEXT and, for jobs with
GPUs, SLURM_JOB_GPUS (and CUDA_VISIBLE_DEVICES) to the GPU indices of the allocation, e.g. "0,1".
A user controls parts of a job's environment, so every value is validated against a strict pattern
and rejected with a message naming the variable; nothing from here ever reaches a shell.

The user name is data, not an identifier we act on: whatever slurmd passes is accepted (winbind's
`CORP\alice`, `josé`, names longer than 64 characters, anything a directory service allows), so a
user's name can never make the checks be skipped. It is only ever recorded: logs.kv escapes it for
the decision log, the record stores it as JSON, and no path is built from it. Only its length is
bounded (MAX_USER characters, the rest marked as cut).
"""

from __future__ import annotations

from ..core.lazyre import lazy_compile
from ..core.runner import JobContext

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Mapping, Optional, Tuple

MAX_GPUS = 1024
MAX_USER = 256  # characters of SLURM_JOB_USER kept; longer names are cut and marked
_JOB_ID = lazy_compile(r"^[1-9][0-9]{0,9}$")
_NODE = lazy_compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_RESTARTS = lazy_compile(r"^[0-9]{1,5}$")  # a uint16 in Slurm
_INDEX_LIST = lazy_compile(r"^[0-9]{1,4}(-[0-9]{1,4})?(,[0-9]{1,4}(-[0-9]{1,4})?)*$")


class JobEnvError(ValueError):
    """A job environment variable is missing or malformed; the message names it."""


def _shown(value: str) -> str:
    return repr(value if len(value) <= 40 else value[:37] + "...")


def parse_gpu_indices(value: str, variable: str = "SLURM_JOB_GPUS") -> Tuple[int, ...]:
    """'0,1,3' or '0-3' -> (0, 1, 3); '' -> (); 'NoDevFiles' -> () (Slurm's marker for no device files)."""
    value = value.strip()
    if value in ("", "NoDevFiles"):
        return ()
    if not _INDEX_LIST.fullmatch(value):
        raise JobEnvError(
            "%s=%s: expected GPU indices like '0,1' or '0-3'" % (variable, _shown(value))
        )
    indices = set()
    for part in value.split(","):
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        if first > last or last >= MAX_GPUS:
            raise JobEnvError("%s=%s: bad range %r" % (variable, _shown(value), part))
        indices.update(range(first, last + 1))
    return tuple(sorted(indices))


def job_from_env(env: Mapping[str, str], require_job: bool = True) -> JobContext:
    """Validate slurmd's variables; `require_job=False` for health/manual runs (no job)."""
    job_id = _get(env, "SLURM_JOB_ID", _JOB_ID, "a positive job number", required=require_job)
    user = (
        env.get("SLURM_JOB_USER") or None
    )  # data: never a reason to refuse the job (module docstring)
    if user is not None and len(user) > MAX_USER:
        user = user[:MAX_USER] + "...(%d characters)" % len(user)
    node = _get(env, "SLURMD_NODENAME", _NODE, "a node name", required=False)
    gpus: Optional[Tuple[int, ...]] = None  # None: all GPUs (no job, or a manual run)
    if job_id is not None:
        if "SLURM_JOB_GPUS" in env:
            gpus = parse_gpu_indices(env["SLURM_JOB_GPUS"], "SLURM_JOB_GPUS")
        elif "CUDA_VISIBLE_DEVICES" in env:
            gpus = parse_gpu_indices(env["CUDA_VISIBLE_DEVICES"], "CUDA_VISIBLE_DEVICES")
        else:
            gpus = ()  # the job asked for no GPUs: per-GPU checks have nothing of its to check
    return JobContext(
        job_id=job_id, user=user, node_name=node, gpus=gpus, restart_count=restart_count(env)
    )


def restart_count(env: Mapping[str, str]) -> Optional[int]:
    """How often Slurm requeued the job: SLURM_JOB_RESTART_COUNT, which slurmd's prolog and epilog get
    (src/plugins/prep/script/prep_script_slurmd.c, from the job credential; also in 22.05), else
    SLURM_RESTART_COUNT (the batch and task environment's name). None when absent or malformed: the
    count only names the job's records, it must never stop a hook."""
    for name in ("SLURM_JOB_RESTART_COUNT", "SLURM_RESTART_COUNT"):
        value = env.get(name)
        if value is not None and _RESTARTS.fullmatch(value):
            return int(value)
    return None


def _get(
    env: Mapping[str, str], name: str, pattern, expected: str, required: bool
) -> Optional[str]:
    value = env.get(name)
    if value is None or value == "":
        if required:
            raise JobEnvError(
                "%s is not set: run me from slurmd's Prolog/Epilog (or set it)" % name
            )
        return None
    if not pattern.fullmatch(value):
        raise JobEnvError("%s=%s: expected %s" % (name, _shown(value), expected))
    return value
