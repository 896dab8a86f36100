"""Job environment validation: slurmd's variables are untrusted input."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_hooks.slurm.jobenv import JobEnvError, job_from_env, parse_gpu_indices


@pytest.mark.parametrize(
    "value,expected",
    [
        ("0,1", (0, 1)),
        ("0-3", (0, 1, 2, 3)),
        ("3,1,1", (1, 3)),
        ("", ()),
        ("NoDevFiles", ()),
        ("0-1,6-7", (0, 1, 6, 7)),
    ],
)
def test_gpu_indices(value, expected):
    assert parse_gpu_indices(value) == expected


@pytest.mark.parametrize(
    "value", ["0;rm -rf /", "$(id)", "a", "1,", "-1", "3-1", "0-5000", "1 2", "0,,1", "GPU-abc"]
)
def test_gpu_indices_garbage(value):
    with pytest.raises(JobEnvError, match="SLURM_JOB_GPUS"):
        parse_gpu_indices(value)


def test_job_from_env_prolog():
    job = job_from_env(
        {
            "SLURM_JOB_ID": "1234",
            "SLURM_JOB_USER": "alice",
            "SLURMD_NODENAME": "gpu-a001",
            "SLURM_JOB_GPUS": "0,1",
            "CUDA_VISIBLE_DEVICES": "0,1",
        }
    )
    assert (job.job_id, job.user, job.node_name, job.gpus) == ("1234", "alice", "gpu-a001", (0, 1))
    assert job_from_env({"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "2"}).gpus == (2,)
    assert job_from_env({"SLURM_JOB_ID": "7"}).gpus == ()
    assert job_from_env({}, require_job=False).gpus is None


@pytest.mark.parametrize(
    "env,name",
    [
        ({}, "SLURM_JOB_ID is not set"),
        ({"SLURM_JOB_ID": "12; reboot"}, "SLURM_JOB_ID="),
        ({"SLURM_JOB_ID": "0"}, "SLURM_JOB_ID="),
        ({"SLURM_JOB_ID": "12\n"}, "SLURM_JOB_ID="),
        ({"SLURM_JOB_ID": "1", "SLURMD_NODENAME": "../../etc"}, "SLURMD_NODENAME="),
        ({"SLURM_JOB_ID": "1" * 500}, "SLURM_JOB_ID='1111"),
    ],
)
def test_job_from_env_rejects(env, name):
    with pytest.raises(JobEnvError, match=name.replace("(", r"\(").replace("$", r"\$")):
        job_from_env(env)


@given(
    st.dictionaries(
        st.sampled_from(
            [
                "SLURM_JOB_ID",
                "SLURM_JOB_USER",
                "SLURMD_NODENAME",
                "SLURM_JOB_GPUS",
                "CUDA_VISIBLE_DEVICES",
            ]
        ),
        st.text(max_size=300),
    )
)
def test_hostile_environment_never_crashes(env):
    try:
        job = job_from_env(env)
    except JobEnvError as exc:
        assert any(name in str(exc) for name in env) or "SLURM_JOB_ID" in str(exc)
        assert len(str(exc)) < 300
    else:
        assert job.job_id.isdigit()
        assert job.gpus is not None and all(0 <= g < 1024 for g in job.gpus)


@pytest.mark.parametrize(
    "user",
    [
        "CORP\\alice",  # winbind's DOMAIN\user
        "jos\u00e9",
        "a" * 65,  # longer than the 64 characters the old pattern allowed
        "alice smith",
        "bob`id`$(reboot)",  # data, never a shell word
        "eve\u202egnp.exe",  # a bidi override
        "nul\x00byte",
    ],
)
def test_any_user_name_is_data_and_never_refuses_the_job(user):
    """Issue 14: `CORP\\alice`, `jos\u00e9` or a name over 64 characters made every prolog skip its checks
    (fail open). A user name is recorded, never a reason to refuse the job."""
    job = job_from_env({"SLURM_JOB_ID": "7", "SLURM_JOB_USER": user, "SLURM_JOB_GPUS": "0"})
    assert job.user == user and job.job_id == "7" and job.gpus == (0,)


def test_a_huge_user_name_is_cut_and_marked():
    job = job_from_env({"SLURM_JOB_ID": "7", "SLURM_JOB_USER": "u" * 20000})
    assert (
        len(job.user) < 300
        and job.user.startswith("u" * 256)
        and job.user.endswith("(20000 characters)")
    )
