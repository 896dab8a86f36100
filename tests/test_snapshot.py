"""snapshot.take against the fake node (real pynvml + fake libnvidia-ml), and the delta rules."""

from __future__ import annotations

import pytest

from slurm_hooks.hw import cpustat, nvml
from slurm_hooks.hw.host import Host
from slurm_hooks.records import counters as snapshot
from tests.helpers import BOOT_ID


def take(node, gpus=(0, 1), processes=False, ib=("symbol_error", "link_downed")):
    return snapshot.take(
        Host(str(node.root)),
        "",
        gpus=list(gpus) if gpus is not None else None,
        ib_counters=ib,
        processes=processes,
    )


def test_snapshot_reads_the_fake_counters_of_the_jobs_gpus_only(gpu_node):
    gpu_node.set_states(
        {
            "gpu.1.ecc.volatile.corrected.dram": 3,
            "gpu.1.ecc.aggregate.uncorrected.sram": 2,
            "gpu.1.remapped_rows.corrected": 4,
            "gpu.1.pcie.replay_counter": 9,
            "gpu.1.nvlink.links.5.errors.crc_flit": 11,
            "gpu.1.nvlink.links.7.errors.replay": 1,
            "gpu.1.violation_ns.thermal": 1500,
            "gpu.2.pcie.replay_counter": 99,
        }
    )
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
    assert (
        c["nvlink.crc_flit"] == 11
        and c["nvlink.replay"] == 1
        and gpu1["nvlink"]["5"]["crc_flit"] == 11
    )
    assert c["violation_ns.thermal"] == 1500
    assert gpu1["unavailable"] == {
        "retired_pages": "NOT_SUPPORTED"
    }  # Hopper: row remapping, not page retirement
    assert "processes" not in gpu1  # only the epilog asks
    assert snap["gpus"][0]["counters"]["pcie.replay"] == 0
    assert snap["ib"]["mlx5_0:1"] == {"symbol_error": 0, "link_downed": 0}


def test_epilog_snapshot_lists_processes_and_memory(gpu_node):
    gpu_node.set_states({"gpu.0.processes": "4242:2147483648", "process.4242.name": "train.py"})
    snap = take(gpu_node, gpus=(0,), processes=True)
    gpu0 = snap["gpus"][0]
    assert gpu0["processes"] == [
        {"pid": 4242, "kind": "compute", "used_memory_bytes": 2 << 30, "name": "train.py"}
    ]
    assert gpu0["memory_total_bytes"] == 85520809984


def test_a_failing_nvml_call_is_recorded_not_raised(gpu_node):
    gpu_node.inject_fault("nvmlDeviceGetTotalEccErrors", 1, 15)
    gpu_node.inject_fault("nvmlDeviceGetHandleByIndex", 0, 15)
    snap = take(gpu_node)
    assert snap["gpus"][0]["unavailable"] == {"device": "GPU_IS_LOST"}
    gpu1 = snap["gpus"][1]
    assert (
        gpu1["unavailable"]["ecc"] == "GPU_IS_LOST"
        and "ecc.volatile.corrected" not in gpu1["counters"]
    )
    assert gpu1["counters"]["pcie.replay"] == 0  # the other groups were still read


def test_gpu_outside_nvml_and_no_gpu_job(gpu_node):
    snap = take(gpu_node, gpus=(7, 12))
    assert [g["index"] for g in snap["gpus"]] == [7]
    assert any("GPU 12" in note for note in snap["notes"])
    assert take(gpu_node, gpus=())["gpus"] == []


def test_clock_event_fields_when_the_driver_has_them(gpu_node):
    import pynvml

    field = pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN
    assert (
        field == nvml.FI_CLOCKS_EVENT_HW_THERM_SLOWDOWN
    )  # our constants agree with nvidia-ml-py's
    gpu_node.set_state("gpu.0.fields.%d" % field, 777)
    gpu_node.set_states(
        {
            "gpu.0.clock_event_ns.hw_power_brake_slowdown": 4 * 10**9,
            "gpu.0.violation_ns.power": 55,
            "gpu.0.violation_ns.thermal": 66,
            "gpu.0.violation_ns.sync_boost": 77,
        }
    )
    snap = take(gpu_node, gpus=(0,))
    counters = snap["gpus"][0]["counters"]
    assert counters["clock_event_ns.hw_therm_slowdown"] == 777
    assert counters["clock_event_ns.hw_power_brake_slowdown"] == 4 * 10**9
    # nvml.h: POWER -> SW_POWER_CAP, THERMAL -> SW_THERM_SLOWDOWN, SYNC_BOOST -> SYNC_BOOST (the same counters)
    assert (
        counters["clock_event_ns.sw_power_cap"],
        counters["clock_event_ns.sw_therm_slowdown"],
        counters["clock_event_ns.sync_boost"],
    ) == (55, 66, 77)
    assert not any(k.startswith("clock_event_ns") for k in snap["gpus"][0]["unavailable"])


def test_a_driver_without_the_new_clock_event_fields_leaves_them_out_with_the_reason(gpu_node):
    """Before R535 fields 269-271 answer NOT_SUPPORTED each; the perf-policy ones (74, 76) still answer."""
    gpu_node.set_states(
        {"gpu.0.clock_event_ns.supported": 0, "gpu.0.clock_event_ns.hw_power_brake_slowdown": 9}
    )
    gpu = take(gpu_node, gpus=(0,))["gpus"][0]
    assert "clock_event_ns.hw_power_brake_slowdown" not in gpu["counters"]
    assert {k: v for k, v in gpu["unavailable"].items() if k.startswith("clock_event_ns")} == {
        "clock_event_ns.sw_therm_slowdown": "NOT_SUPPORTED",
        "clock_event_ns.hw_therm_slowdown": "NOT_SUPPORTED",
        "clock_event_ns.hw_power_brake_slowdown": "NOT_SUPPORTED",
    }
    assert (
        gpu["counters"]["clock_event_ns.sw_power_cap"] == 0
        and "violation_ns.thermal" in gpu["counters"]
    )


def test_a_driver_without_field_values_at_all_keeps_the_other_counters(gpu_node):
    gpu_node.inject_fault(
        "nvmlDeviceGetFieldValues", 0, 13
    )  # FUNCTION_NOT_FOUND: symbol absent (pre-R361)
    gpu = take(gpu_node, gpus=(0,))["gpus"][0]
    assert gpu["unavailable"]["clock_events"] == "FUNCTION_NOT_FOUND"
    assert "violation_ns.power" in gpu["counters"] and "energy_mj" in gpu["counters"]


def test_a_driver_without_violation_status_keeps_the_clock_event_counters(gpu_node):
    """nvml.h 13.0 deprecates nvmlDeviceGetViolationStatus ("removed in CUDA 14.0"): a driver without the
    symbol answers FUNCTION_NOT_FOUND; the field values carry the same counters."""
    gpu_node.inject_fault("nvmlDeviceGetViolationStatus", "*", 13)
    gpu_node.set_states({"gpu.0.violation_ns.power": 42})
    gpu = take(gpu_node, gpus=(0,))["gpus"][0]
    assert gpu["unavailable"]["violation"] == "FUNCTION_NOT_FOUND"
    assert not any(k.startswith("violation_ns") for k in gpu["counters"])
    assert gpu["counters"]["clock_event_ns.sw_power_cap"] == 42


def test_infiniband_traffic_is_read_always_and_kept_apart_from_the_error_counters(gpu_node):
    gpu_node.write("/sys/class/infiniband/mlx5_1/ports/1/counters/port_xmit_wait", "123456")
    gpu_node.write("/sys/class/infiniband/mlx5_1/ports/1/counters/port_xmit_data", "2880761508848")
    snap = take(gpu_node, ib=("symbol_error",))
    assert snap["ib"]["mlx5_1:1"] == {"symbol_error": 0}
    assert snap["ib_perf"]["mlx5_1:1"] == {
        "port_xmit_wait": 123456,
        "port_xmit_data": 2880761508848,
        "port_rcv_data": 0,
    }
    assert (
        take(gpu_node, ib=())["ib_perf"]["mlx5_0:1"]["port_xmit_wait"] == 0
    )  # no error counters configured


def test_cpu_times_per_cpu_and_the_slurm_cgroups(fake_node):
    node = fake_node(
        "dgx-h100",
        overrides={
            "job": {"4242": {"cpus": "0-3", "usage_usec": 5000000}},
            "cgroup": {"slurm_usage_usec": 1000000},
            "cpu": {"ticks": {"2": {"steal": 7}}},
        },
    )
    snap = snapshot.take(Host(str(node.root)), "", gpus=(), job_id="4242")
    cpu = snap["cpu"]
    per_cpu = cpustat.parse_proc_stat(cpu["proc_stat"])
    assert cpu["tick_hz"] == 100 and sorted(per_cpu) == list(range(node.spec["cpu"]["count"]))
    assert "intr" not in cpu["proc_stat"]  # only the CPU lines are kept
    assert cpu["job_cpus"] == "0-3" and cpu["usage_usec"] == {"slurm": 6000000, "job": 5000000}
    assert per_cpu[2][1] == 7
    node.add_cpu_ticks({1: {"system": 90}})
    later = cpustat.parse_proc_stat(
        snapshot.take(Host(str(node.root)), "", gpus=(), job_id="4242")["cpu"]["proc_stat"]
    )
    assert later[1][0] - per_cpu[1][0] == 90 and later[0] == per_cpu[0]
    assert snapshot.take(Host(str(node.root)), "", gpus=())["cpu"]["usage_usec"] == {
        "slurm": 6000000
    }


def test_without_nvml_the_snapshot_still_has_the_node_part(tmp_path, write_tree):
    root = write_tree(
        {
            "dev/kmsg": "6,0,100,-;hello\n6,41,200,-;world\n",
            "sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error": "12\n",
            "sys/class/infiniband/mlx5_0/ports/1/counters/link_downed": "junk\n",
        }
    )
    snap = snapshot.take(
        Host(root),
        str(tmp_path / "no-such-libnvidia-ml.so.1"),
        gpus=(0,),
        ib_counters=["symbol_error", "link_downed", "../../etc/shadow"],
    )
    assert snap["kmsg_seq"] == 41 and snap["boot_id"] is None and snap["gpus"] == []
    assert snap["ib"] == {"mlx5_0:1": {"symbol_error": 12}}
    assert any("NVML unusable" in n for n in snap["notes"])
    assert any("link_downed" in n for n in snap["notes"]) and any(
        "etc/shadow" in n for n in snap["notes"]
    )
    nvml.reset_sessions()


@pytest.mark.parametrize(
    "before, after, delta, reset",
    [
        ({"a": 1, "b": 5}, {"a": 4, "b": 5}, {"a": 3, "b": 0}, []),
        (
            {"a": 10},
            {"a": 2},
            {},
            ["a"],
        ),  # went down: driver reload / GPU reset, never a negative delta
        ({}, {"a": 2}, {}, []),  # unknown at start: no delta
        ({"a": 1}, {}, {}, []),
    ],
)
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
