"""Fake-node specs for the cost-growth benchmarks: N GPUs in NVL-style groups, or many PCIe devices.

Each function returns a plain spec dict that ``tests.fakenode.load_spec`` accepts (the same keys as
tests/fakenode/specs/*.toml, documented in tests/fakenode/README.md).

``gpu_node_spec(n)``: n GPUs in groups of ``group`` (default 4). Each group is one CPU socket (one NUMA
node) and one PCIe switch holding its GPUs and one ConnectX-7 InfiniBand HCA per GPU, like a GB200
NVL72 compute tray (4 GPUs per tray); 72 GPUs = 18 groups. The CPU count stays fixed (288 threads,
split evenly over the sockets) so that only GPU-proportional work grows; hence ceil(n / group) must
divide 144. One NUMA node per socket keeps sysfs's and NVML's GPU-to-GPU distances in agreement.

``pcie_node_spec(extra)``: the shipped 8-GPU example node (dgx-h100) plus ``extra`` NVMe drives placed
directly on host bridges (no GPUDirect Storage, so no GPU-to-NVMe locality check applies to them):
every endpoint adds a PCI function to walk in /sys/bus/pci/devices, like the SR-IOV functions or
drive shelves of a storage-heavy node.
"""

from __future__ import annotations

from typing import Any, Dict, List

TOTAL_CORES = 144
FIRST_GROUP_BUS = 0x10  # each group uses 3 bridge buses + one bus per endpoint
EXTRA_NVME_FIRST_BUS = (
    0x50  # free in dgx-h100 (which uses 00-02, 15-1b, 3f-45, 97-9d, a9-aa, c1-c7, e0-e2)
)
EXTRA_NVME_LAST_BUS = 0x8F
DEVICES_PER_BUS = 32


def gpu_node_spec(gpus: int, group: int = 4, hostname: str = "bench-gpu") -> Dict[str, Any]:
    """A healthy node with `gpus` GPUs (1..72), `group` GPUs + as many HCAs per NUMA node/PCIe switch."""
    if gpus < 1:
        raise ValueError("gpus must be >= 1, got %d" % gpus)
    groups = (gpus + group - 1) // group
    if TOTAL_CORES % groups:
        raise ValueError(
            "%d GPUs in groups of %d make %d sockets, which do not split %d cores evenly"
            % (gpus, group, groups, TOTAL_CORES)
        )
    endpoints_per_group = 2 * group
    last_bus = FIRST_GROUP_BUS + groups * (3 + endpoints_per_group) - 1
    if last_bus > 0xFF:
        raise ValueError("%d groups need PCI buses up to 0x%x (> 0xff)" % (groups, last_bus))
    spec: Dict[str, Any] = {
        "node": {
            "hostname": hostname,
            "kernel_release": "6.8.0-1017-nvidia-64k",
            "dmi_sys_vendor": "NVIDIA",
            "dmi_product_name": "bench-%dgpu" % gpus,
        },
        "cpu": {
            "sockets": groups,
            "cores_per_socket": TOTAL_CORES // groups,
            "threads_per_core": 2,
        },
        "memory": {"total_kb": 240 * 1024 * 1024 * groups},
        "iommu": {"mode": "passthrough", "vendor": "intel"},
        "pcie": {"acs_redirect": False},
        "modules": {"nvidia_peermem": "550.54.15"},
        "memory_peers": {"nv_mem": "550.54.15"},
        "switch": {},
        "gpu": {},
        "nic": {},
        "gpu_defaults": {"name": "NVIDIA H100 80GB HBM3", "vbios": "96.00.74.00.01"},
    }
    for g in range(groups):
        root_bus = FIRST_GROUP_BUS + g * (3 + endpoints_per_group)
        switch = "sw%d" % g
        spec["switch"][switch] = {
            "root_port": "0000:%02x:01.0" % root_bus,
            "upstream": "0000:%02x:00.0" % (root_bus + 1),
            "numa_node": g,
        }
        endpoint_bus = root_bus + 3
        for slot in range(group):
            index = g * group + slot
            if index >= gpus:
                break
            spec["gpu"][index] = {
                "pci": "0000:%02x:00.0" % (endpoint_bus + 2 * slot),
                "switch": switch,
            }
            spec["nic"]["mlx5_%d" % index] = {
                "pci": "0000:%02x:00.0" % (endpoint_bus + 2 * slot + 1),
                "switch": switch,
            }
    return spec


def pcie_node_spec(extra: int) -> Dict[str, Any]:
    """Overrides for the dgx-h100 example: `extra` more NVMe drives on host bridges (up to 2048)."""
    capacity = (EXTRA_NVME_LAST_BUS - EXTRA_NVME_FIRST_BUS + 1) * DEVICES_PER_BUS
    if not 0 <= extra <= capacity:
        raise ValueError("extra PCIe devices must be 0..%d, got %d" % (capacity, extra))
    drives: Dict[str, Any] = {}
    for n in range(extra):
        bus, device = divmod(n, DEVICES_PER_BUS)
        drives["nvme%d" % (100 + n)] = {
            "pci": "0000:%02x:%02x.0" % (EXTRA_NVME_FIRST_BUS + bus, device),
            "root_port": "none",
            "numa_node": n % 2,
        }
    return {"nvme": drives} if drives else {}


def pci_function_count(spec: Dict[str, Any]) -> int:
    """PCI functions (endpoints and bridges) a resolved spec puts under /sys/bus/pci/devices."""
    from tests.fakenode import pci

    return len(pci.topology(spec))


def gpu_counts(quick: bool) -> List[int]:
    return [1, 8, 16, 72] if not quick else [1, 8, 72]
