"""Family `gpudirect` on fake nodes: peer memory / DMA-BUF readiness, HCA ports, GPUDirect Storage."""

from __future__ import annotations

import json
import subprocess
import sys

from slurm_hooks.result import Action, Status
from tests.helpers import REPO
from tests.helpers import run_on_node as run

PEERMEM_WITHOUT_SYSFS = {
    "modules": {"nvidia_peermem": {"version": ""}},
    "memory_peers": {"nv_mem": ""},
}
NO_PEERMEM = {"modules": {"nvidia_peermem": False}, "memory_peers": {"nv_mem": ""}}
OPEN_MODULE = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  (dvs-builder@U16)\n"


def test_healthy_dgx(registry, nvml_node):
    results = run(registry, nvml_node(), ["gpudirect"])
    assert [(r.check, r.status) for r in results] == [
        ("gpudirect.hca", Status.OK),
        ("gpudirect.rdma", Status.OK),
        ("gpudirect.storage", Status.SKIP),
    ]
    assert results[0].summary == "10 ports on 10 HCAs ACTIVE/LinkUp at full rate"
    assert (
        "mlx5_8/1" in results[0].details["ports"]
        and "200 Gb/sec (4X HDR)" in results[0].details["ports"]
    )
    assert results[1].summary == "peer memory ready (/sys/kernel/mm/memory_peers/nv_mem/version)"


def test_peermem_loaded_without_sysfs_version_file(registry, nvml_node):
    node = nvml_node(overrides=PEERMEM_WITHOUT_SYSFS)
    assert "nvidia_peermem " in node.path("/proc/modules").read_text()
    (result,) = run(registry, node, ["gpudirect.rdma"])
    assert result.status is Status.FAIL and result.action is Action.DRAIN
    assert result.summary.startswith(
        "nvidia_peermem is loaded (/proc/modules) but none of "
        "/sys/kernel/mm/memory_peers/nv_mem/version"
    )
    assert "NCCL will not use GPUDirect RDMA" in result.summary


def test_dmabuf_needs_the_open_kernel_module(registry, nvml_node):
    node = nvml_node(overrides=NO_PEERMEM)
    (proprietary,) = run(registry, node, ["gpudirect.rdma"])
    assert proprietary.status is Status.FAIL
    assert "no peer-memory module (modprobe nvidia_peermem)" in proprietary.summary
    assert (
        "DMA-BUF needs kernel >= 5.12 (have 5.15.0-1042-nvidia) and the open GPU kernel module"
        in proprietary.summary
    )
    node.write("/proc/driver/nvidia/version", OPEN_MODULE)
    (open_module,) = run(registry, node, ["gpudirect.rdma"])
    assert (open_module.status, open_module.summary) == (
        Status.OK,
        "DMA-BUF ready (kernel 5.15.0-1042-nvidia, open GPU kernel module)",
    )
    (peermem_only,) = run(
        registry, node, ["gpudirect.rdma"], {"checks": {"gpudirect.rdma": {"mode": "peermem"}}}
    )
    assert peermem_only.status is Status.FAIL


def test_one_port_down_and_one_slow(registry, nvml_node):
    node = nvml_node(
        overrides={
            "nic": {
                "mlx5_3": {"ports": {"1": {"state": "1: DOWN", "phys_state": "3: Disabled"}}},
                "mlx5_5": {"ports": {"1": {"rate": "200 Gb/sec (4X HDR)"}}},
            }
        }
    )
    results = run(registry, node, ["gpudirect.hca"])
    assert [(r.status, r.component) for r in results] == [
        (Status.FAIL, "hca:mlx5_3/1"),
        (Status.WARN, "hca:mlx5_5/1"),
    ]
    assert results[0].summary == (
        "mlx5_3/1 is DOWN/Disabled, expected ACTIVE/LinkUp: check cable, transceiver and "
        "switch port (ibstat mlx5_3)"
    )
    assert results[1].summary.startswith(
        "mlx5_5/1 runs at 200 Gb/sec (4X HDR) while other InfiniBand ports run at 400 Gb/s"
    )
    compute = ["mlx5_%d" % i for i in range(8)]
    strict = run(
        registry,
        node,
        ["gpudirect.hca"],
        {
            "checks": {
                "gpudirect.hca": {
                    "expected": compute + ["mlx5_10"],
                    "min_rate_gbps": 400.0,
                    "link_layer": "InfiniBand",
                }
            }
        },
    )
    assert [(r.status, r.component) for r in strict] == [
        (Status.FAIL, "hca:mlx5_10"),
        (Status.FAIL, "hca:mlx5_3/1"),
        (Status.FAIL, "hca:mlx5_5/1"),
    ]
    assert "below the required 400 Gb/s" in strict[2].summary


def test_link_layer_mismatch_and_ignored_ports(registry, nvml_node):
    node = nvml_node()
    results = run(
        registry,
        node,
        ["gpudirect.hca"],
        {"checks": {"gpudirect.hca": {"link_layer": "InfiniBand"}}},
    )
    assert [(r.status, r.component) for r in results] == [
        (Status.FAIL, "hca:mlx5_8/1"),
        (Status.FAIL, "hca:mlx5_9/1"),
    ]
    assert "link layer is Ethernet, expected InfiniBand" in results[0].summary
    ok = run(
        registry,
        node,
        ["gpudirect.hca"],
        {
            "checks": {
                "gpudirect.hca": {"link_layer": "InfiniBand", "ignore": ["mlx5_8", "mlx5_9/1"]}
            }
        },
    )
    assert [r.status for r in ok] == [Status.OK]


def test_gds_required_but_nvidia_fs_missing(registry, nvml_node):
    (result,) = run(
        registry,
        nvml_node(),
        ["gpudirect.storage"],
        {"checks": {"gpudirect.storage": {"required": True}}},
    )
    assert result.status is Status.FAIL and "nvidia_fs is not loaded" in result.summary


def test_cpu_node_is_not_a_gpudirect_node(registry, fake_node):
    results = run(registry, fake_node("cpu-only"), ["gpudirect"])
    assert [(r.check, r.status) for r in results] == [
        ("gpudirect.hca", Status.OK),
        ("gpudirect.rdma", Status.SKIP),
        ("gpudirect.storage", Status.SKIP),
    ]
    assert results[1].summary == "not a GPUDirect RDMA node: no NVIDIA GPUs on the PCI bus"


def test_cli_explains_the_topology_with_verbose(fake_node):
    """What an admin sees: `slurm-hooks check -v` prints the per-GPU table (subprocess, LD_LIBRARY_PATH)."""
    node = fake_node("dgx-h100", overrides={"switch": {"sw1": {"acs_redirect": True}}})
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm_hooks",
            "check",
            "-v",
            "--root",
            str(node.root),
            "--live",
            "nvml",
            "topology.gpu-nic",
            "topology.acs",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=node.subprocess_env(),
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "GPU3  0000:44:00.0  0     mlx5_2,mlx5_3 PIX  nvme0,nvme1 NODE" in proc.stdout
    assert (
        "FAIL    pci:0000:41:00.0: bridge 0000:41:00.0 has ACS ReqRedir+CmpltRedir enabled"
        in proc.stdout
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm_hooks",
            "check",
            "--json",
            "--root",
            str(node.root),
            "--live",
            "nvml",
            "gpudirect",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=node.subprocess_env(),
        timeout=60,
    )
    assert json.loads(proc.stdout)["status"] == "OK"
