"""snapshot.take against the fake node (real pynvml + fake libnvidia-ml), and the delta rules."""
from __future__ import annotations

import pytest

from slurm_hooks import nvml, snapshot
from slurm_hooks.host import Host

BOOT_ID = "8c4f5a7e-1111-2222-3333-444455556666"


def _reset_sessions():
    reset = getattr(nvml, "reset_sessions", None)
    if reset is not None:
        reset()
    else:
        nvml._sessions.clear()


@pytest.fixture
def gpu_node(fake_node):
    """A DGX-H100 fake node loaded into this process's pynvml; unloaded afterwards."""
    import pynvml

    from tests.fakenode import fakenvml

    node = fake_node("dgx-h100")
    node.write("/proc/sys/kernel/random/boot_id", BOOT_ID)
    node.load_into_pynvml()
    _reset_sessions()
    yield node
    try:
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        pass
    fakenvml.unload_from_pynvml()
    _reset_sessions()


def take(node, gpus=(0, 1), processes=False, ib=("symbol_error", "link_downed")):
    return snapshot.take(Host(str(node.root)), "", gpus=list(gpus) if gpus is not None else None,
                         ib_counters=ib, processes=processes)


def test_snapshot_reads_the_fake_counters_of_the_jobs_gpus_only(gpu_node):
    gpu_node.set_states({"gpu.1.ecc.volatile.corrected.dram": 3, "gpu.1.ecc.aggregate.uncorrected.sram": 2,
                         "gpu.1.remapped_rows.corrected": 4, "gpu.1.pcie.replay_counter": 9,
                         "gpu.1.nvlink.links.5.errors.crc_flit": 11, "gpu.1.nvlink.links.7.errors.replay": 1,
                         "gpu.1.violation_ns.thermal": 1500, "gpu.2.pcie.replay_counter": 99})
    snap = take(gpu_node)
    assert snap["schema"] == snapshot.SNAPSHOT_SCHEMA and snap["boot_id"] == BOOT_ID
    assert isinstance(snap["kmsg_seq"], int) and snap["kmsg_seq"] >= 0
    assert [g["index"] for g in snap["gpus"]] == [0, 1]
    gpu1 = snap["gpus"][1]
    assert gpu1["bus_id"] == gpu_node.spec["gpu"][1]["pci"] and gpu1["uuid"].startswith("GPU-")
    assert gpu1["serial"] and gpu1["name"] == "NVIDIA H100 80GB HBM3"
    c = gpu1["counters"]
    assert c["ecc.volatile.corrected"] == 3 and c["ecc.aggregate.uncorrected"] == 2
    assert c["remapped_rows.corrected"] == 4 and c["pcie.replay"] == 9
    assert c["nvlink.crc_flit"] == 11 and c["nvlink.replay"] == 1 and gpu1["nvlink"]["5"]["crc_flit"] == 11
    assert c["violation_ns.thermal"] == 1500
    assert gpu1["unavailable"] == {"retired_pages": "NOT_SUPPORTED"}  # Hopper: row remapping, not page retirement
    assert "processes" not in gpu1  # only the epilog asks
    assert snap["gpus"][0]["counters"]["pcie.replay"] == 0
    assert snap["ib"]["mlx5_0:1"] == {"symbol_error": 0, "link_downed": 0}


def test_epilog_snapshot_lists_processes_and_memory(gpu_node):
    gpu_node.set_states({"gpu.0.processes": "4242:2147483648", "process.4242.name": "train.py"})
    snap = take(gpu_node, gpus=(0,), processes=True)
    gpu0 = snap["gpus"][0]
    assert gpu0["processes"] == [{"pid": 4242, "kind": "compute", "used_memory_bytes": 2 << 30, "name": "train.py"}]
    assert gpu0["memory_total_bytes"] == 85520809984


def test_a_failing_nvml_call_is_recorded_not_raised(gpu_node):
    gpu_node.inject_fault("nvmlDeviceGetTotalEccErrors", 1, 15)
    gpu_node.inject_fault("nvmlDeviceGetHandleByIndex", 0, 15)
    snap = take(gpu_node)
    assert snap["gpus"][0]["unavailable"] == {"device": "GPU_IS_LOST"}
    gpu1 = snap["gpus"][1]
    assert gpu1["unavailable"]["ecc"] == "GPU_IS_LOST" and "ecc.volatile.corrected" not in gpu1["counters"]
    assert gpu1["counters"]["pcie.replay"] == 0  # the other groups were still read


def test_gpu_outside_nvml_and_no_gpu_job(gpu_node):
    snap = take(gpu_node, gpus=(7, 12))
    assert [g["index"] for g in snap["gpus"]] == [7]
    assert any("GPU 12" in note for note in snap["notes"])
    assert take(gpu_node, gpus=())["gpus"] == []


def test_clock_event_fields_when_the_driver_has_them(gpu_node):
    import pynvml

    field = pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN
    gpu_node.set_state("gpu.0.fields.%d" % field, 777)
    snap = take(gpu_node, gpus=(0,))
    assert snap["gpus"][0]["counters"]["clock_event_ns.hw_therm_slowdown"] == 777
    assert "clock_event_ns.sw_power_cap" not in snap["gpus"][0]["counters"]  # NOT_SUPPORTED: left out


def test_without_nvml_the_snapshot_still_has_the_node_part(tmp_path, write_tree):
    root = write_tree({"dev/kmsg": "6,0,100,-;hello\n6,41,200,-;world\n",
                       "sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error": "12\n",
                       "sys/class/infiniband/mlx5_0/ports/1/counters/link_downed": "junk\n"})
    snap = snapshot.take(Host(root), str(tmp_path / "no-such-libnvidia-ml.so.1"), gpus=(0,),
                         ib_counters=["symbol_error", "link_downed", "../../etc/shadow"])
    assert snap["kmsg_seq"] == 41 and snap["boot_id"] is None and snap["gpus"] == []
    assert snap["ib"] == {"mlx5_0:1": {"symbol_error": 12}}
    assert any("NVML unusable" in n for n in snap["notes"])
    assert any("link_downed" in n for n in snap["notes"]) and any("etc/shadow" in n for n in snap["notes"])
    _reset_sessions()


@pytest.mark.parametrize("before, after, delta, reset", [
    ({"a": 1, "b": 5}, {"a": 4, "b": 5}, {"a": 3, "b": 0}, []),
    ({"a": 10}, {"a": 2}, {}, ["a"]),  # went down: driver reload / GPU reset, never a negative delta
    ({}, {"a": 2}, {}, []),  # unknown at start: no delta
    ({"a": 1}, {}, {}, []),
])
def test_deltas(before, after, delta, reset):
    assert snapshot.deltas(before, after) == (delta, reset)


def test_bus_id_is_normalised_to_the_sysfs_form():
    assert snapshot._bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert snapshot._bus_id(b"00000001:18:00.0") == "0001:18:00.0"


def test_slurm_gpu_indices_are_minor_numbers_not_nvml_indices(gpu_node):
    """gres.conf's /dev/nvidiaN is NVML minor number N; here minors 0 and 1 are swapped against NVML order."""
    gpu_node.set_states({"gpu.0.minor_number": 1, "gpu.1.minor_number": 0})
    snap = take(gpu_node, gpus=(0,))
    assert [(g["index"], g["minor"]) for g in snap["gpus"]] == [(1, 0)]
    assert snap["gpus"][0]["bus_id"] == gpu_node.spec["gpu"][1]["pci"]


def test_duplicate_minor_numbers_fall_back_to_nvml_indices(gpu_node):
    gpu_node.set_states({"gpu.0.minor_number": 5})  # 5 twice: cannot be trusted
    snap = take(gpu_node, gpus=(0, 5))
    assert [g["index"] for g in snap["gpus"]] == [0, 5]
