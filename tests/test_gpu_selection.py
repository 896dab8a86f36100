"""Which NVML devices a job's SLURM_JOB_GPUS indices mean: minor number (/dev/nvidiaN) first, NVML index as
fallback; per-GPU checks look only at the job's GPUs; a GPU Slurm allocated that NVML lacks is node-broken."""

from __future__ import annotations

import pytest

from slurm_hooks.checks.gpu.inventory import GpuDevice, select_gpus
from slurm_hooks.core.runner import JobContext
from slurm_hooks.hw import nvml
from slurm_hooks.result import Action, Blame, Status
from tests.helpers import component
from tests.helpers import run_on_node as run


def devices(minors):
    return tuple(
        GpuDevice(i, "GPU", "GPU-%d" % i, "0000:%02x:00.0" % i, m) for i, m in enumerate(minors)
    )


@pytest.mark.parametrize(
    "minors, requested, chosen, missing, method",
    [
        ([0, 1, 2, 3], None, [0, 1, 2, 3], [], "all"),
        ([0, 1, 2, 3], (1, 3), [1, 3], [], "minor"),
        ([3, 2, 1, 0], (0,), [3], [], "minor"),  # /dev/nvidia0 is NVML index 3
        (
            [0, 1, 3],
            (2, 3),
            [2],
            [2],
            "minor",
        ),  # minor 2 fell off the bus: NVML indices shifted, minors did not
        ([-1, -1, -1], (2,), [2], [], "index"),  # minor numbers unknown: NVML index
        ([0, 0, 1], (1,), [1], [], "index"),  # duplicate minors make no sense: NVML index
        ([0, 1], (5,), [], [5], "minor"),
        ([], (0,), [], [0], "index"),
    ],
)
def test_select_gpus(minors, requested, chosen, missing, method):
    selection = select_gpus(devices(minors), requested)
    assert [d.index for d in selection.devices] == chosen
    assert list(selection.missing) == missing and selection.method == method


@pytest.mark.parametrize(
    "minors, mapping, method",
    [
        ({0: 3, 1: 2, 2: 1, 3: 0}, {3: 0, 2: 1, 1: 2, 0: 3}, "minor"),
        (
            {0: 0, 2: 1, 3: 3},
            {0: 0, 1: 2, 3: 3},
            "minor",
        ),  # NVML index 1 did not answer: the others still map
        ({0: 0, 1: -1}, {0: 0, 1: 1}, "index"),  # one unknown minor: by index
        ({0: 1, 1: 1}, {0: 0, 1: 1}, "index"),
        ({}, {}, "index"),
    ],
)
def test_slurm_to_nvml_one_rule_for_checks_and_snapshots(minors, mapping, method):
    """nvml.slurm_to_nvml is what select_gpus (checks) and counters.read_gpus (records) both use."""
    assert nvml.slurm_to_nvml(minors) == (mapping, method)


REVERSED = {"gpu": {i: {"minor_number": 7 - i} for i in range(8)}}


def test_job_gpus_map_by_minor_number_on_a_node_where_it_differs_from_the_index(
    registry, nvml_node
):
    node = nvml_node("dgx-h100", REVERSED)
    assert node.path("/dev/nvidia0").exists()
    node.inject_fault("nvmlDeviceGetEccMode", 7, nvml.GPU_IS_LOST)  # NVML index 7 = /dev/nvidia0
    slurm0 = run(
        registry, node, ["gpu.ecc"], job=JobContext(job_id="1", gpus=(0,)), context="prolog"
    )
    assert [(r.status, r.component) for r in slurm0] == [(Status.FAIL, component(7))]
    slurm7 = run(
        registry, node, ["gpu.ecc"], job=JobContext(job_id="2", gpus=(7,)), context="prolog"
    )
    assert [(r.status, r.summary) for r in slurm7] == [
        (Status.OK, "ECC on, no uncorrectable errors (GPU 0)")
    ]
    everyone = run(registry, node, ["gpu.ecc"])  # no job: every GPU
    assert [r.component for r in everyone if r.status is Status.FAIL] == [component(7)]


def test_per_gpu_checks_ignore_faults_on_other_jobs_gpus_but_node_checks_still_run(
    registry, nvml_node
):
    node = nvml_node("dgx-h100", {"gpu": {5: {"remapped_rows": {"pending": True}}}})
    job = JobContext(job_id="3", gpus=(0, 1))
    results = {
        r.check: r
        for r in run(registry, node, ["gpu.remap", "gpu.count"], job=job, context="prolog")
    }
    assert results["gpu.remap"].status is Status.OK and results["gpu.remap"].details["gpus"] == [
        0,
        1,
    ]
    assert results["gpu.count"].summary == "8 GPUs, driver 550.54.15"
    with_5 = run(
        registry, node, ["gpu.remap"], job=JobContext(job_id="4", gpus=(4, 5)), context="prolog"
    )
    assert [(r.status, r.component, r.action) for r in with_5] == [
        (Status.FAIL, component(5), Action.RESET_GPU)
    ]


def test_allocated_gpu_that_fell_off_is_node_broken(registry, nvml_node):
    node = nvml_node()
    node.inject_fault("nvmlDeviceGetHandleByIndex", 3, nvml.GPU_IS_LOST)
    job = JobContext(job_id="7", gpus=(3,))
    results = run(registry, node, ["gpu.count", "gpu.ecc"], job=job, context="prolog")
    missing = [
        r
        for r in results
        if r.check == "gpu.count" and r.component == "gpu:3" and "Slurm allocated" in r.summary
    ]
    assert len(missing) == 1
    assert (missing[0].status, missing[0].action, missing[0].effective_blame) == (
        Status.FAIL,
        Action.REBOOT,
        Blame.NODE,
    )
    assert missing[0].details["matched_by"] == "minor" and missing[0].details["missing"] == [3]
    ecc = next(r for r in results if r.check == "gpu.ecc")
    assert ecc.status is Status.SKIP and "see gpu.count" in ecc.summary


def test_job_asking_for_a_gpu_the_node_does_not_have(registry, nvml_node):
    node = nvml_node()
    results = run(
        registry, node, ["gpu.count"], job=JobContext(job_id="8", gpus=(6, 9)), context="prolog"
    )
    fails = [r for r in results if r.status is Status.FAIL]
    assert (
        len(fails) == 1 and fails[0].component == "gpu:9" and fails[0].effective_blame is Blame.NODE
    )
    assert "gres.conf lists GPUs this node lacks" in fails[0].summary
