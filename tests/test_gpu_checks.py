"""Every per-GPU check against the fake DGX-H100 node, in-process through the real pynvml: the healthy
node passes, and each injected fault is caught with the right status, component and action."""

from __future__ import annotations

import pytest

from slurm_hooks.core.config import ConfigError
from slurm_hooks.core.runner import JobContext
from slurm_hooks.hw import nvml
from slurm_hooks.result import Action, Blame, Status
from tests.helpers import GPU_BDF, component
from tests.helpers import run_on_node as run

PER_GPU_CHECKS = [
    "gpu.ecc",
    "gpu.remap",
    "gpu.recovery",
    "gpu.driver",
    "gpu.clocks",
    "gpu.power",
    "gpu.thermal",
    "gpu.pcie",
    "gpu.nvlink",
    "gpu.leftovers",
]


def test_healthy_node_passes_every_gpu_check(registry, nvml_node):
    node = nvml_node()
    results = run(registry, node, ["gpu"])
    assert {r.check for r in results} == set(PER_GPU_CHECKS) | {"gpu.count"}
    assert [(r.check, r.status, r.summary) for r in results if r.status is not Status.OK] == []
    ecc = next(r for r in results if r.check == "gpu.ecc")
    assert ecc.summary == "ECC on, no uncorrectable errors (GPUs 0,1,2,3,4,5,6,7)"
    driver = next(r for r in results if r.check == "gpu.driver")
    assert driver.summary.startswith("driver 550.54.15, ")


G = lambda index, **spec: {"gpu": {index: spec}}  # noqa: E731  (spec overlay for one GPU)

# (check, spec overlay, config for the check, expected status, GPU index or None, action, words in the summary)
FAULTS = [
    (
        "gpu.ecc",
        G(3, ecc={"volatile": {"uncorrected": {"dram": 2}}}),
        {},
        Status.FAIL,
        3,
        Action.RESET_GPU,
        "2 uncorrectable ECC errors",
    ),
    (
        "gpu.ecc",
        G(1, ecc={"mode": False, "pending": False}),
        {},
        Status.FAIL,
        1,
        Action.DRAIN,
        "ECC is disabled",
    ),
    (
        "gpu.ecc",
        G(1, ecc={"mode": True, "pending": False}),
        {},
        Status.WARN,
        1,
        Action.NONE,
        "pending a GPU reset",
    ),
    (
        "gpu.ecc",
        G(2, ecc={"aggregate": {"uncorrected": {"sram": 3}}}),
        {},
        Status.WARN,
        2,
        Action.NONE,
        "3 lifetime uncorrectable SRAM errors",
    ),
    (
        "gpu.ecc",
        G(4, ecc={"volatile": {"corrected": {"dram": 20000}}}),
        {},
        Status.WARN,
        4,
        Action.NONE,
        "20000 corrected ECC errors",
    ),
    (
        "gpu.remap",
        G(0, remapped_rows={"pending": True}),
        {},
        Status.FAIL,
        0,
        Action.RESET_GPU,
        "row remap pending",
    ),
    (
        "gpu.remap",
        G(6, remapped_rows={"failure": True}),
        {},
        Status.FAIL,
        6,
        Action.RMA,
        "row remapping failed",
    ),
    (
        "gpu.remap",
        G(2, remapped_rows={"uncorrected": 600}),
        {},
        Status.WARN,
        2,
        Action.NONE,
        "600 rows remapped for uncorrectable errors",
    ),
    (
        "gpu.remap",
        G(
            4,
            remapped_rows={"supported": False},
            retired_pages={"supported": True, "pending": True},
        ),
        {},
        Status.FAIL,
        4,
        Action.RESET_GPU,
        "page retirement pending",
    ),
    (
        "gpu.remap",
        G(
            5,
            remapped_rows={"supported": False},
            retired_pages={"supported": True, "double_bit": [0x1000 * i for i in range(1, 64)]},
        ),
        {},
        Status.FAIL,
        5,
        Action.RMA,
        "63 retired pages",
    ),
    ("gpu.recovery", G(7, recovery_action=1), {}, Status.FAIL, 7, Action.RESET_GPU, "GPU_RESET"),
    ("gpu.recovery", G(2, recovery_action=2), {}, Status.FAIL, 2, Action.REBOOT, "NODE_REBOOT"),
    ("gpu.recovery", G(3, recovery_action=3), {}, Status.FAIL, 3, Action.DRAIN, "DRAIN_P2P"),
    (
        "gpu.recovery",
        G(3, recovery_action=99),
        {},
        Status.UNKNOWN,
        3,
        Action.NONE,
        "unknown to slurm-hooks",
    ),
    (
        "gpu.driver",
        {},
        {"deny": ["550.*"]},
        Status.FAIL,
        None,
        Action.DRAIN,
        "driver 550.54.15 is denied",
    ),
    (
        "gpu.driver",
        {},
        {"allow": ["535.*"]},
        Status.FAIL,
        None,
        Action.DRAIN,
        "not in the allow list",
    ),
    (
        "gpu.driver",
        G(3, persistence_mode=False),
        {},
        Status.WARN,
        3,
        Action.NONE,
        "persistence mode is off",
    ),
    (
        "gpu.driver",
        G(3, persistence_mode=False),
        {"persistence": "fail"},
        Status.FAIL,
        3,
        Action.DRAIN,
        "persistence mode is off",
    ),
    (
        "gpu.driver",
        G(1, compute_mode=3),
        {},
        Status.FAIL,
        1,
        Action.DRAIN,
        "compute mode is exclusive_process",
    ),
    (
        "gpu.driver",
        G(5, mig={"current": 1, "pending": 1}),
        {},
        Status.FAIL,
        5,
        Action.DRAIN,
        "MIG is enabled",
    ),
    (
        "gpu.driver",
        G(4, vbios="96.00.99.00.01"),
        {},
        Status.WARN,
        None,
        Action.NONE,
        "run 2 VBIOS versions",
    ),
    (
        "gpu.clocks",
        G(2, clocks_event_reasons=0x8),
        {},
        Status.FAIL,
        2,
        Action.DRAIN,
        "HW slowdown active",
    ),
    (
        "gpu.clocks",
        G(6, clocks_event_reasons=0x80),
        {},
        Status.FAIL,
        6,
        Action.DRAIN,
        "HW power brake",
    ),
    (
        "gpu.clocks",
        G(6, clocks_event_reasons=0x80),
        {"hw_power_brake": "warn"},
        Status.WARN,
        6,
        Action.NONE,
        "HW power brake",
    ),
    (
        "gpu.clocks",
        G(3, clocks_event_reasons=0x21),
        {},
        Status.WARN,
        3,
        Action.NONE,
        "SW thermal slowdown",
    ),
    (
        "gpu.clocks",
        G(0, applications_clocks={"graphics": 1410}),
        {},
        Status.WARN,
        0,
        Action.NONE,
        "nvidia-smi -rac -i 0",
    ),
    (
        "gpu.power",
        G(1, power={"enforced_limit_mw": 500000}),
        {},
        Status.WARN,
        1,
        Action.NONE,
        "power limit 500 W is below the default 700 W",
    ),
    (
        "gpu.power",
        G(7, power={"enforced_limit_mw": 695000}),
        {"min_limit_percent": 99.0},
        Status.OK,
        None,
        Action.NONE,
        "power limit at default",
    ),
    (
        "gpu.thermal",
        G(4, temperature={"gpu": 89}),
        {},
        Status.FAIL,
        4,
        Action.DRAIN,
        "at or above the slowdown",
    ),
    (
        "gpu.thermal",
        G(5, temperature={"gpu": 82}),
        {},
        Status.WARN,
        5,
        Action.NONE,
        "within 10 C of the slowdown",
    ),
    (
        "gpu.pcie",
        G(3, pcie={"width": 8}),
        {},
        Status.FAIL,
        3,
        Action.DRAIN,
        "downtrained: x8 of x16",
    ),
    (
        "gpu.pcie",
        G(2, pcie={"gen": 3}, clocks_event_reasons=0),
        {},
        Status.FAIL,
        2,
        Action.DRAIN,
        "downtrained under load: Gen3 of Gen5",
    ),
    (
        "gpu.pcie",
        G(1, pcie={"max_gen": 4}),
        {},
        Status.WARN,
        1,
        Action.NONE,
        "maximum is Gen4, the GPU supports Gen5",
    ),
    (
        "gpu.pcie",
        G(1, pcie={"max_gen": 4, "gpu_max_gen": 4}),
        {"expected_gen": 5},
        Status.FAIL,
        1,
        Action.DRAIN,
        "only to Gen4, expected Gen5",
    ),
    (
        "gpu.nvlink",
        G(6, nvlink={"links": {5: {"state": False}, 9: {"state": False}}}),
        {},
        Status.FAIL,
        6,
        Action.DRAIN,
        "16 of 18 NVLinks active, 18 expected (inactive: 5,9)",
    ),
    (
        "gpu.nvlink",
        G(0, fabric={"state": 2}),
        {},
        Status.FAIL,
        0,
        Action.DRAIN,
        "registration IN_PROGRESS",
    ),
    (
        "gpu.nvlink",
        G(0, fabric={"state": 3, "status": 27}),
        {},
        Status.FAIL,
        0,
        Action.DRAIN,
        "registration failed",
    ),
    (
        "gpu.nvlink",
        G(0, fabric={"state": 3, "health_mask": 1}),
        {},
        Status.WARN,
        0,
        Action.NONE,
        "degraded",
    ),
    (
        "gpu.leftovers",
        G(2, processes=[{"pid": 4242, "used_memory": 2 << 30, "name": "python3"}]),
        {},
        Status.FAIL,
        2,
        Action.DRAIN,
        "1 leftover process on the GPU before the job: python3 (pid 4242, 2048 MiB)",
    ),
    (
        "gpu.leftovers",
        G(5, memory={"used": 3 << 30}),
        {},
        Status.FAIL,
        5,
        Action.RESET_GPU,
        "3072 MiB of GPU memory in use with no process",
    ),
]


@pytest.mark.parametrize(
    "name, overlay, params, status, gpu, action, words",
    FAULTS,
    ids=["%s-%d" % (f[0], i) for i, f in enumerate(FAULTS)],
)
def test_fault_is_caught(registry, nvml_node, name, overlay, params, status, gpu, action, words):
    node = nvml_node("dgx-h100", overlay)
    results = run(registry, node, [name], {"checks": {name: params}} if params else None)
    worst = [r for r in results if r.status is status]
    assert worst, [(r.status, r.summary) for r in results]
    found = worst[0]
    assert words in found.summary
    assert found.component == (component(gpu) if gpu is not None else None)
    assert found.action is action
    assert all(r.status in (status, Status.OK) for r in results), [
        (r.status, r.summary) for r in results
    ]
    if status is Status.FAIL:
        assert found.effective_blame is Blame.NODE


# (check, NVML function, GPU, code, expected status, action)
NVML_ERRORS = [
    ("gpu.ecc", "nvmlDeviceGetEccMode", 5, nvml.GPU_IS_LOST, Status.FAIL, Action.REBOOT),
    (
        "gpu.power",
        "nvmlDeviceGetEnforcedPowerLimit",
        6,
        nvml.RESET_REQUIRED,
        Status.FAIL,
        Action.RESET_GPU,
    ),
    (
        "gpu.remap",
        "nvmlDeviceGetRemappedRows",
        1,
        nvml.FUNCTION_NOT_FOUND,
        Status.UNKNOWN,
        Action.NONE,
    ),
    (
        "gpu.thermal",
        "nvmlDeviceGetTemperatureThreshold",
        2,
        nvml.NO_PERMISSION,
        Status.UNKNOWN,
        Action.NONE,
    ),
    ("gpu.recovery", "nvmlDeviceGetFieldValues", 4, nvml.NOT_SUPPORTED, Status.SKIP, Action.NONE),
    (
        "gpu.leftovers",
        "nvmlDeviceGetComputeRunningProcesses",
        3,
        nvml.GPU_IS_LOST,
        Status.FAIL,
        Action.REBOOT,
    ),
    (
        "gpu.pcie",
        "nvmlDeviceGetCurrPcieLinkWidth",
        7,
        nvml.CORRUPTED_INFOROM,
        Status.FAIL,
        Action.RMA,
    ),
]


@pytest.mark.parametrize(
    "name, function, gpu, code, status, action",
    NVML_ERRORS,
    ids=["%s-%s" % (e[0], e[1]) for e in NVML_ERRORS],
)
def test_nvml_errors_follow_the_reviewed_table(
    registry, nvml_node, name, function, gpu, code, status, action
):
    node = nvml_node()
    node.inject_fault(function, gpu, code)
    results = run(registry, node, [name])
    found = [r for r in results if r.component == component(gpu)]
    assert len(found) == 1, [(r.status, r.component, r.summary) for r in results]
    assert found[0].status is status and found[0].action is action
    assert found[0].details["nvml_code"] == code
    if status is Status.UNKNOWN:
        assert found[0].effective_blame is Blame.CHECK  # never drains


@pytest.mark.parametrize(
    "choice, status",
    [("skip", Status.SKIP), ("ok", Status.OK), ("warn", Status.WARN), ("unknown", Status.UNKNOWN)],
)
def test_not_supported_outcome_is_configurable(registry, nvml_node, choice, status):
    node = nvml_node("dgx-h100", G(0, nvlink={"count": 0}))  # a PCIe GPU without NVLink
    results = run(
        registry, node, ["gpu.nvlink"], {"checks": {"gpu.nvlink": {"not_supported": choice}}}
    )
    gpu0 = [r for r in results if r.component == component(0)]
    assert [r.status for r in gpu0] == [status]
    assert gpu0[0].summary == "NVLink state not supported on this GPU/driver"
    assert gpu0[0].effective_blame is (Blame.CHECK if status is Status.UNKNOWN else None)


def test_idle_gpu_with_low_link_generation_is_not_downtrained(registry, nvml_node):
    """Idle GPUs drop their PCIe link to Gen1-3 to save power: not a fault while the GPU is idle."""
    node = nvml_node("dgx-h100", G(2, pcie={"gen": 1}, clocks_event_reasons=0x1))
    results = run(registry, node, ["gpu.pcie"])
    assert [r.status for r in results] == [Status.OK]


def test_expected_links_per_model(registry, nvml_node):
    overlay = {
        "gpu": {
            i: {
                "name": "NVIDIA H100 NVL",
                "nvlink": {"links": {j: {"state": False} for j in range(12, 18)}},
            }
            for i in range(8)
        }
    }
    node = nvml_node("dgx-h100", overlay)
    results = run(registry, node, ["gpu.nvlink"])
    assert {r.status for r in results} == {Status.FAIL} and len(results) == 8
    config = {"checks": {"gpu.nvlink": {"expected_links": ["NVIDIA H100 NVL=12", "*=18"]}}}
    assert [r.status for r in run(registry, node, ["gpu.nvlink"], config)] == [Status.OK]
    # a malformed entry is refused when the config is loaded (config check), not UNKNOWN at run time
    bad = {"checks": {"gpu.nvlink": {"expected_links": ["H100 NVL"]}}}
    with pytest.raises(ConfigError, match="MODEL PATTERN=COUNT"):
        run(registry, node, ["gpu.nvlink"], bad)


def test_ignored_leftover_process(registry, nvml_node):
    node = nvml_node(
        "dgx-h100",
        G(2, processes=[{"pid": 77, "used_memory": 1 << 20, "name": "/usr/bin/dcgm-agent"}]),
    )
    assert run(registry, node, ["gpu.leftovers"])[0].status is Status.FAIL
    config = {"checks": {"gpu.leftovers": {"ignore_processes": ["dcgm-agent"]}}}
    assert [r.status for r in run(registry, node, ["gpu.leftovers"], config)] == [Status.OK]


def test_job_without_gpus_skips_per_gpu_checks(registry, nvml_node):
    node = nvml_node()
    results = run(
        registry,
        node,
        ["gpu.ecc", "gpu.count"],
        job=JobContext(job_id="5", gpus=()),
        context="prolog",
    )
    by = {r.check: r for r in results}
    assert (
        by["gpu.ecc"].status is Status.SKIP
        and by["gpu.ecc"].summary == "the job has no GPUs on this node"
    )
    assert by["gpu.count"].status is Status.OK  # node-wide checks still run


def test_per_gpu_checks_without_nvml_skip_and_leave_it_to_gpu_count(registry, nvml_node):
    node = nvml_node()
    node.set_state("driver_loaded", 0)
    results = run(registry, node, ["gpu"])
    by = {r.check: r for r in results}
    assert by["gpu.count"].status is Status.FAIL and by["gpu.count"].action is Action.REBOOT
    assert "modprobe nvidia" in by["gpu.count"].summary
    assert {by[name].status for name in PER_GPU_CHECKS} == {Status.SKIP}
    assert "DRIVER_NOT_LOADED" in by["gpu.ecc"].summary


# -- gpu.count: what NVML cannot read vs what it does not see (issue 13, section 4) --------------------


def _decide(registry, results):
    from slurm_hooks.core.config import validate
    from slurm_hooks.slurm import policy

    return policy.decide(results, validate(registry, {}).settings)


def test_a_gpu_that_requires_a_reset_is_not_also_lost(registry, nvml_node):
    """NVML answers RESET_REQUIRED for every call on GPU 3 (its handle included): it counts 8 GPUs and the bus has 8,
    so nothing fell off the bus. One result, reset-gpu, naming the GPU; the drain reason says reset-gpu."""
    node = nvml_node()
    node.inject_fault("*", 3, nvml.RESET_REQUIRED)
    results = run(registry, node, ["gpu.count"])
    assert [(r.status, r.component, r.action) for r in results] == [
        (Status.FAIL, component(3), Action.RESET_GPU)
    ]
    assert "lost" not in results[0].summary and "NVML sees" not in results[0].summary
    decision = _decide(registry, results)
    assert (
        decision.reason.startswith("sh:gpu.count g3: " + component(3))
        and "-> reset-gpu" in decision.reason
    )


def test_an_unreadable_gpu_is_named_by_the_bus_id_nvml_gave(registry, nvml_node):
    node = nvml_node()
    node.inject_fault(
        "nvmlDeviceGetUUID", 2, nvml.GPU_IS_LOST
    )  # handle and PCI info answered, then lost
    node.inject_fault(
        "*", 5, nvml.RESET_REQUIRED
    )  # nothing answered: two nameless would be ambiguous, one is not
    results = run(registry, node, ["gpu.count"])
    assert sorted((r.component, r.action) for r in results) == [
        (component(2), Action.REBOOT),
        (component(5), Action.RESET_GPU),
    ]


def test_a_gpu_missing_from_nvml_is_named_in_the_component(registry, nvml_node):
    """NVML counts 7 of the 8 GPUs on the bus (fallen off): the lost one is the component tools key on."""
    node = nvml_node()
    node.set_state("gpu.count", 7)
    results = run(registry, node, ["gpu.count"])
    lost = [r for r in results if r.component == "pci:" + GPU_BDF[7]]
    assert [(r.status, r.action) for r in lost] == [(Status.FAIL, Action.REBOOT)], [
        r.summary for r in results
    ]
    assert GPU_BDF[7] in lost[0].summary and "7 of 8" in lost[0].summary
    assert "pci:" + GPU_BDF[7] in _decide(registry, results).reason


def test_a_gpu_in_a_pci_domain_wider_than_16_bits_is_not_lost(registry, nvml_node):
    """Issue 13: VMD/Hyper-V domains. NVML says 00010000:01:00.0, sysfs 10000:01:00.0: the same GPU."""
    node = nvml_node(
        "dgx-h100",
        {
            "gpu": {
                7: {
                    "pci": "10000:01:00.0",
                    "switch": "",
                    "root_port": "10000:00:02.0",
                    "numa_node": 1,
                }
            }
        },
    )
    [count] = run(registry, node, ["gpu.count"])
    assert (count.status, count.summary) == (Status.OK, "8 GPUs, driver 550.54.15")
    [ecc] = [r for r in run(registry, node, ["gpu.ecc"]) if r.status is not Status.OK] or [None]
    assert ecc is None
    node.add_kmsg(
        "NVRM: Xid (PCI:10000:01:00): 79, pid=1, name=x, GPU has fallen off the bus.", level=4
    )
    [xid] = run(registry, node, ["xid.events"])
    assert (xid.status, xid.component) == (Status.FAIL, "gpu:7 10000:01:00.0")
