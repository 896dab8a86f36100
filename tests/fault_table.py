"""The fault table: one row (Fault) per injected fault across every check family, with what an admin and
Slurm must see; and Edits, the shared-node edits that inject a row's NVML, file and kernel-log changes and
undo them. test_fault_matrix.py runs every row in process; test_fault_matrix_slurm.py drives a subset
through the real prolog and slurmctld.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from slurm_hooks.core.runner import JobContext
from slurm_hooks.hw import nvml
from slurm_hooks.result import Action, Blame, Status
from tests.helpers import GPU_BDF

NODE = "dgx-h100-01"
JOB = JobContext(job_id="4242", user="alice", node_name=NODE, gpus=tuple(range(8)))
GIB = 1 << 30


def gpu(index: int) -> str:
    return "gpu:%d %s" % (index, GPU_BDF[index])


def xid(bus: str, code: int, text: str) -> str:
    """A kernel log line as the NVIDIA driver prints it (`dmesg | grep Xid`)."""
    return "NVRM: Xid (PCI:%s): %d, pid=1234, name=python3, %s" % (bus[:-2], code, text)


@dataclass(frozen=True)
class Fault:
    id: str
    family: str
    check: str
    status: Status
    component: Optional[str]
    action: Action
    drains: bool  # policy.decide -> Verdict.DRAIN
    words: str  # must appear in the summary: what the admin reads
    overrides: Optional[Dict[str, Any]] = None
    nvml: Dict[str, Any] = field(default_factory=dict)
    files: Dict[str, str] = field(default_factory=dict)
    kmsg: Tuple[str, ...] = ()
    config: Dict[str, Any] = field(default_factory=dict)  # [checks."<check>"] parameters
    settings: Dict[str, Any] = field(default_factory=dict)  # other config sections
    blame: Optional[Blame] = None  # expected effective blame when not the default for the status


SWAPPED_GRES = (
    "NodeName=dgx-h100-[01-16] Name=gpu Type=h100 File=/dev/nvidia[0-3] Cores=56-111\n"
    "NodeName=dgx-h100-[01-16] Name=gpu Type=h100 File=/dev/nvidia[4-7] Cores=0-55\n"
)
SYS_GPUS = {
    "switch": {"sw2": {"numa_node": 0}},
    "nic": {
        "mlx5_6": {"pci": "0000:9e:00.0", "switch": "sw2"},
        "mlx5_7": {"pci": "0000:9f:00.0", "switch": "sw2"},
        "mlx5_8": {"numa_node": 0},
        "mlx5_9": {"numa_node": 0},
    },
}
PINNED_DAEMONS = [
    {"pid": pid, "comm": comm, "cpus": "0-1,112-113", "cgroup": "/system.slice/%s" % unit}
    for pid, comm, unit in (
        (812, "sshd", "ssh.service"),
        (845, "munged", "munge.service"),
        (901, "slurmd", "slurmd.service"),
        (1210, "nvidia-persiste", "nvidia-persistenced.service"),
    )
]
DCGM_ON_JOB_CPUS = {
    "pid": 3001,
    "comm": "nv-hostengine",
    "cpus": "8-15",
    "cgroup": "/system.slice/nvidia-dcgm.service",
}
HOUSEKEEPING = {"housekeeping_cpus": "0-1,112-113"}

FAULTS = [
    # -- GPU (NVML) ----------------------------------------------------------------------------
    Fault(
        "gpu-fell-off-bus",
        "GPU",
        "gpu.count",
        Status.FAIL,
        gpu(5),
        Action.REBOOT,
        True,
        "nvmlDeviceGetHandleByIndex",
        nvml={"fault.nvmlDeviceGetHandleByIndex.5": nvml.GPU_IS_LOST},
    ),
    Fault(
        "driver-not-loaded",
        "GPU",
        "gpu.count",
        Status.FAIL,
        None,
        Action.REBOOT,
        True,
        "modprobe nvidia",
        nvml={"driver_loaded": 0},
    ),
    Fault(
        "gpu-count-below-expected",
        "GPU",
        "gpu.count",
        Status.FAIL,
        "pci:" + GPU_BDF[7],
        Action.REBOOT,
        True,
        "NVML sees 7 of 8",
        nvml={"gpu.count": 7},
    ),
    Fault(
        "ecc-uncorrectable",
        "GPU",
        "gpu.ecc",
        Status.FAIL,
        gpu(3),
        Action.RESET_GPU,
        True,
        "2 uncorrectable ECC errors",
        nvml={"gpu.3.ecc.volatile.uncorrected.dram": 2},
    ),
    Fault(
        "ecc-disabled",
        "GPU",
        "gpu.ecc",
        Status.FAIL,
        gpu(1),
        Action.DRAIN,
        True,
        "ECC is disabled",
        nvml={"gpu.1.ecc.mode": 0, "gpu.1.ecc.pending": 0},
    ),
    Fault(
        "ecc-many-corrected",
        "GPU",
        "gpu.ecc",
        Status.WARN,
        gpu(4),
        Action.NONE,
        False,
        "20000 corrected ECC errors",
        nvml={"gpu.4.ecc.volatile.corrected.dram": 20000},
    ),
    Fault(
        "row-remap-pending",
        "GPU",
        "gpu.remap",
        Status.FAIL,
        gpu(0),
        Action.RESET_GPU,
        True,
        "row remap pending",
        nvml={"gpu.0.remapped_rows.pending": 1},
    ),
    Fault(
        "row-remap-failed",
        "GPU",
        "gpu.remap",
        Status.FAIL,
        gpu(6),
        Action.RMA,
        True,
        "row remapping failed",
        nvml={"gpu.6.remapped_rows.failure": 1},
    ),
    Fault(
        "recovery-node-reboot",
        "GPU",
        "gpu.recovery",
        Status.FAIL,
        gpu(2),
        Action.REBOOT,
        True,
        "NODE_REBOOT",
        nvml={"gpu.2.recovery_action": 2},
    ),
    Fault(
        "recovery-unknown-code",
        "GPU",
        "gpu.recovery",
        Status.UNKNOWN,
        gpu(3),
        Action.NONE,
        False,
        "unknown to slurm-hooks",
        nvml={"gpu.3.recovery_action": 99},
    ),
    Fault(
        "hw-slowdown",
        "GPU",
        "gpu.clocks",
        Status.FAIL,
        gpu(2),
        Action.DRAIN,
        True,
        "HW slowdown active",
        nvml={"gpu.2.clocks_event_reasons": 0x8},
    ),
    Fault(
        "at-slowdown-temperature",
        "GPU",
        "gpu.thermal",
        Status.FAIL,
        gpu(4),
        Action.DRAIN,
        True,
        "at or above the slowdown",
        nvml={"gpu.4.temperature.gpu": 89},
    ),
    Fault(
        "power-limit-lowered",
        "GPU",
        "gpu.power",
        Status.WARN,
        gpu(1),
        Action.NONE,
        False,
        "below the default 700 W",
        nvml={"gpu.1.power.enforced_limit_mw": 500000},
    ),
    Fault(
        "mig-enabled",
        "GPU",
        "gpu.driver",
        Status.FAIL,
        gpu(5),
        Action.DRAIN,
        True,
        "MIG is enabled",
        nvml={"gpu.5.mig.current": 1, "gpu.5.mig.pending": 1},
    ),
    Fault(
        "driver-denied",
        "GPU",
        "gpu.driver",
        Status.FAIL,
        None,
        Action.DRAIN,
        True,
        "driver 550.54.15 is denied",
        config={"deny": ["550.*"]},
    ),
    Fault(
        "leftover-process",
        "GPU",
        "gpu.leftovers",
        Status.FAIL,
        gpu(2),
        Action.DRAIN,
        True,
        "leftover process on the GPU before the job: python3 (pid 4242",
        nvml={"gpu.2.processes": "4242:%d" % (2 * GIB), "process.4242.name": "python3"},
    ),
    Fault(
        "leftover-memory",
        "GPU",
        "gpu.leftovers",
        Status.FAIL,
        gpu(5),
        Action.RESET_GPU,
        True,
        "3072 MiB of GPU memory in use with no process",
        nvml={"gpu.5.memory.used": 3 * GIB},
    ),
    Fault(
        "nvml-gpu-lost-mid-check",
        "GPU",
        "gpu.ecc",
        Status.FAIL,
        gpu(5),
        Action.REBOOT,
        True,
        "GPU fell off the bus",
        nvml={"fault.nvmlDeviceGetEccMode.5": nvml.GPU_IS_LOST},
    ),
    Fault(
        "nvml-no-permission",
        "GPU",
        "gpu.thermal",
        Status.UNKNOWN,
        gpu(2),
        Action.NONE,
        False,
        "",
        nvml={"fault.nvmlDeviceGetTemperatureThreshold.2": nvml.NO_PERMISSION},
    ),
    Fault(
        "nvml-function-missing",
        "GPU",
        "gpu.remap",
        Status.UNKNOWN,
        gpu(1),
        Action.NONE,
        False,
        "",
        nvml={"fault.nvmlDeviceGetRemappedRows.1": nvml.FUNCTION_NOT_FOUND},
    ),
    # -- NVLink ---------------------------------------------------------------------------------
    Fault(
        "nvlink-links-down",
        "NVLink",
        "gpu.nvlink",
        Status.FAIL,
        gpu(6),
        Action.DRAIN,
        True,
        "16 of 18 NVLinks active, 18 expected (inactive: 5,9)",
        nvml={"gpu.6.nvlink.links.5.state": 0, "gpu.6.nvlink.links.9.state": 0},
    ),
    Fault(
        "fabric-registration-failed",
        "NVLink",
        "gpu.nvlink",
        Status.FAIL,
        gpu(0),
        Action.DRAIN,
        True,
        "registration failed",
        nvml={"gpu.0.fabric.state": 3, "gpu.0.fabric.status": 27},
    ),
    Fault(
        "fabric-degraded",
        "NVLink",
        "gpu.nvlink",
        Status.WARN,
        gpu(0),
        Action.NONE,
        False,
        "degraded",
        nvml={"gpu.0.fabric.state": 3, "gpu.0.fabric.health_mask": 1},
    ),
    # -- PCIe -----------------------------------------------------------------------------------
    Fault(
        "gpu-link-x8",
        "PCIe",
        "gpu.pcie",
        Status.FAIL,
        gpu(3),
        Action.DRAIN,
        True,
        "downtrained: x8 of x16",
        overrides={"gpu": {3: {"pcie": {"width": 8}}}},
    ),
    Fault(
        "gpu-link-gen3-under-load",
        "PCIe",
        "gpu.pcie",
        Status.FAIL,
        gpu(2),
        Action.DRAIN,
        True,
        "downtrained under load: Gen3 of Gen5",
        overrides={"gpu": {2: {"pcie": {"gen": 3}, "clocks_event_reasons": 0}}},
    ),
    Fault(
        "slot-max-gen4",
        "PCIe",
        "gpu.pcie",
        Status.WARN,
        gpu(1),
        Action.NONE,
        False,
        "maximum is Gen4, the GPU supports Gen5",
        overrides={"gpu": {1: {"pcie": {"max_gen": 4}}}},
    ),
    Fault(
        "pcie-inforom-corrupted",
        "PCIe",
        "gpu.pcie",
        Status.FAIL,
        gpu(7),
        Action.RMA,
        True,
        "",
        nvml={"fault.nvmlDeviceGetCurrPcieLinkWidth.7": nvml.CORRUPTED_INFOROM},
    ),
    # -- XID / SXID (kernel log) ---------------------------------------------------------------
    Fault(
        "xid79-fell-off-bus",
        "XID",
        "xid.events",
        Status.FAIL,
        gpu(2),
        Action.REBOOT,
        True,
        "Xid 79: GPU has fallen off the bus.",
        kmsg=(xid(GPU_BDF[2], 79, "GPU has fallen off the bus."),),
    ),
    Fault(
        "xid48-double-bit-ecc",
        "XID",
        "xid.events",
        Status.FAIL,
        gpu(4),
        Action.RESET_GPU,
        True,
        "Xid 48",
        kmsg=(
            xid(
                GPU_BDF[4],
                48,
                "An uncorrectable double bit error (DBE) has been detected on GPU in the "
                "framebuffer at partition 6, subpartition 0.",
            ),
        ),
    ),
    Fault(
        "xid13-job-exception",
        "XID",
        "xid.events",
        Status.WARN,
        gpu(0),
        Action.NONE,
        False,
        "Xid 13",
        kmsg=(xid(GPU_BDF[0], 13, "Graphics Exception: ESR 0x50 0x1"),),
        blame=Blame.JOB,
    ),
    Fault(
        "xid31-job-page-fault",
        "XID",
        "xid.events",
        Status.WARN,
        gpu(1),
        Action.NONE,
        False,
        "Xid 31",
        kmsg=(
            xid(
                GPU_BDF[1],
                31,
                "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 "
                "faulted @ 0x7f4c_12000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ",
            ),
        ),
        blame=Blame.JOB,
    ),
    Fault(
        "xid-unknown-code",
        "XID",
        "xid.events",
        Status.UNKNOWN,
        gpu(0),
        Action.NONE,
        False,
        "999",
        kmsg=(xid(GPU_BDF[0], 999, "something new"),),
    ),
    Fault(
        "xid-truncated-line",
        "XID",
        "xid.events",
        Status.OK,
        None,
        Action.NONE,
        False,
        "no Xid since boot",
        kmsg=("NVRM: Xid (PCI:0000:42:00): ",),
    ),
    Fault(
        "sxid-fatal",
        "XID",
        "xid.sxid",
        Status.FAIL,
        "nvswitch:2 0000:05:00.0",
        Action.REBOOT,
        True,
        "SXid 20034",
        kmsg=("nvidia-nvswitch2: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 14 LTSSM Fault Up",),
    ),
    Fault(
        "sxid-non-fatal",
        "XID",
        "xid.sxid",
        Status.WARN,
        "nvswitch:0 0000:06:00.0",
        Action.NONE,
        False,
        "SXid 19084",
        kmsg=(
            "nvidia-nvswitch0: SXid (PCI:0000:06:00.0): 19084, Non-fatal, Link 3 AN1 Heartbeat Timeout",
        ),
        blame=Blame.NODE,
    ),  # the fabric's problem, not the job's; a WARN never drains
    # -- topology -------------------------------------------------------------------------------
    Fault(
        "gpu-nic-across-socket",
        "topology",
        "topology.gpu-nic",
        Status.FAIL,
        gpu(6),
        Action.DRAIN,
        True,
        "nearest RDMA NIC is mlx5_0 at SYS, worse than PXB",
        overrides=SYS_GPUS,
    ),
    Fault(
        "gpu-nic-across-socket-warn-only",
        "topology",
        "topology.gpu-nic",
        Status.WARN,
        gpu(6),
        Action.NONE,
        False,
        "worse than PXB",
        overrides=SYS_GPUS,
        config={"on_violation": "warn"},
    ),
    Fault(
        "gds-nvme-far",
        "topology",
        "topology.gpu-nvme",
        Status.FAIL,
        gpu(0),
        Action.DRAIN,
        True,
        "nearest NVMe drive is nvme0 at NODE, worse than PXB",
        config={"required": True},
    ),
    # -- ACS ------------------------------------------------------------------------------------
    Fault(
        "acs-redirect-on-switch",
        "ACS",
        "topology.acs",
        Status.FAIL,
        "pci:0000:41:00.0",
        Action.DRAIN,
        True,
        "has ACS ReqRedir+CmpltRedir enabled",
        overrides={"switch": {"sw1": {"acs_redirect": True}}},
    ),
    Fault(
        "acs-unreadable-without-root",
        "ACS",
        "topology.acs",
        Status.UNKNOWN,
        None,
        Action.NONE,
        False,
        "extended capabilities need root",
        files={"truncate-config": "0000:17:00.0"},
    ),
    # -- IOMMU ----------------------------------------------------------------------------------
    Fault(
        "iommu-translating",
        "IOMMU",
        "topology.iommu",
        Status.WARN,
        None,
        Action.NONE,
        False,
        "IOMMU translates DMA for 18 GPUs/NICs",
        overrides={"iommu": {"mode": "translated"}},
    ),
    Fault(
        "iommu-translating-strict",
        "IOMMU",
        "topology.iommu",
        Status.FAIL,
        None,
        Action.DRAIN,
        True,
        "boot with iommu=pt",
        overrides={"iommu": {"mode": "translated"}},
        config={"translated": "fail"},
    ),
    # -- peer memory / GPUDirect ---------------------------------------------------------------
    Fault(
        "peermem-without-sysfs",
        "peermem",
        "gpudirect.rdma",
        Status.FAIL,
        None,
        Action.DRAIN,
        True,
        "NCCL will not use GPUDirect RDMA",
        overrides={"modules": {"nvidia_peermem": {"version": ""}}, "memory_peers": {"nv_mem": ""}},
    ),
    Fault(
        "no-peermem-no-dmabuf",
        "peermem",
        "gpudirect.rdma",
        Status.FAIL,
        None,
        Action.DRAIN,
        True,
        "no peer-memory module (modprobe nvidia_peermem)",
        overrides={"modules": {"nvidia_peermem": False}, "memory_peers": {"nv_mem": ""}},
    ),
    Fault(
        "gds-required-nvidia-fs-missing",
        "peermem",
        "gpudirect.storage",
        Status.FAIL,
        None,
        Action.DRAIN,
        True,
        "nvidia_fs is not loaded",
        config={"required": True},
    ),
    # -- HCA ------------------------------------------------------------------------------------
    Fault(
        "hca-port-down",
        "HCA",
        "gpudirect.hca",
        Status.FAIL,
        "hca:mlx5_3/1",
        Action.DRAIN,
        True,
        "mlx5_3/1 is DOWN/Disabled, expected ACTIVE/LinkUp",
        overrides={
            "nic": {"mlx5_3": {"ports": {"1": {"state": "1: DOWN", "phys_state": "3: Disabled"}}}}
        },
    ),
    Fault(
        "hca-port-slow",
        "HCA",
        "gpudirect.hca",
        Status.WARN,
        "hca:mlx5_5/1",
        Action.NONE,
        False,
        "runs at 200 Gb/sec (4X HDR)",
        overrides={"nic": {"mlx5_5": {"ports": {"1": {"rate": "200 Gb/sec (4X HDR)"}}}}},
    ),
    Fault(
        "hca-missing",
        "HCA",
        "gpudirect.hca",
        Status.FAIL,
        "hca:mlx5_10",
        Action.DRAIN,
        True,
        "mlx5_10",
        config={"expected": ["mlx5_%d" % i for i in range(8)] + ["mlx5_10"]},
    ),
    Fault(
        "hca-wrong-link-layer",
        "HCA",
        "gpudirect.hca",
        Status.FAIL,
        "hca:mlx5_8/1",
        Action.DRAIN,
        True,
        "link layer is Ethernet, expected InfiniBand",
        config={"link_layer": "InfiniBand"},
    ),
    # -- NUMA / cpuset --------------------------------------------------------------------------
    Fault(
        "job-cpuset-far-from-gpus",
        "NUMA",
        "numa.job-affinity",
        Status.WARN,
        gpu(0),
        Action.NONE,
        False,
        "has none of the job's CPUs (56-63) on its NUMA node",
        overrides={"job": {"4242": {"cpus": "56-63"}}},
        blame=Blame.JOB,
    ),
    Fault(
        "numa-balancing-on",
        "NUMA",
        "numa.sysctl",
        Status.WARN,
        "sysctl:kernel.numa_balancing",
        Action.NONE,
        False,
        "kernel.numa_balancing = 1, expected 0",
        overrides={"node": {"numa_balancing": 1}},
        config={"numa_balancing": 0},
    ),
    Fault(
        "zone-reclaim-on",
        "NUMA",
        "numa.sysctl",
        Status.WARN,
        "sysctl:vm.zone_reclaim_mode",
        Action.NONE,
        False,
        "vm.zone_reclaim_mode = 1",
        overrides={"node": {"zone_reclaim_mode": 1}},
    ),
    # -- gres.conf ------------------------------------------------------------------------------
    Fault(
        "gres-cores-swapped",
        "gres.conf",
        "numa.gres-affinity",
        Status.FAIL,
        gpu(0),
        Action.DRAIN,
        True,
        "gres.conf Cores give CPUs 56-111,168-223",
        overrides={"slurm": {"gres_conf": SWAPPED_GRES}},
    ),
    Fault(
        "gres-cores-unparsable",
        "gres.conf",
        "numa.gres-affinity",
        Status.UNKNOWN,
        None,
        Action.NONE,
        False,
        "/etc/slurm/gres.conf:1 Cores=",
        overrides={"slurm": {"gres_conf": "Name=gpu File=/dev/nvidia0 Cores=0-x\n"}},
    ),
    # -- housekeeping ---------------------------------------------------------------------------
    Fault(
        "daemon-on-job-cpus",
        "housekeeping",
        "numa.housekeeping",
        Status.WARN,
        "pid:3001",
        Action.NONE,
        False,
        "nv-hostengine (pid 3001",
        overrides={
            "job": {"4242": {"cpus": "2-31"}},
            "process": PINNED_DAEMONS + [DCGM_ON_JOB_CPUS],
        },
        config=HOUSEKEEPING,
    ),
    Fault(
        "daemon-on-job-cpus-strict",
        "housekeeping",
        "numa.housekeeping",
        Status.FAIL,
        "pid:3001",
        Action.DRAIN,
        True,
        "may run on the job's CPUs 8-15",
        overrides={
            "job": {"4242": {"cpus": "2-31"}},
            "process": PINNED_DAEMONS + [DCGM_ON_JOB_CPUS],
        },
        config=dict(HOUSEKEEPING, on_violation="fail"),
    ),
    # -- system ---------------------------------------------------------------------------------
    Fault(
        "cpu-socket-missing",
        "system",
        "system.cpu",
        Status.FAIL,
        None,
        Action.DRAIN,
        True,
        "sockets 2, expected 4",
        config={"sockets": 4},
    ),
    Fault(
        "memory-missing",
        "system",
        "system.memory",
        Status.FAIL,
        None,
        Action.DRAIN,
        True,
        "expected >= 4096.0",
        config={"min_total_gib": 4096.0},
    ),
    Fault(
        "swapping",
        "system",
        "system.swap",
        Status.WARN,
        None,
        Action.NONE,
        False,
        "swap",
        overrides={
            "swap": [
                {
                    "filename": "/dev/dm-1",
                    "type": "partition",
                    "size_kb": 8388608,
                    "used_kb": 7340032,
                    "priority": -2,
                }
            ]
        },
    ),
    Fault(
        "scratch-not-mounted",
        "system",
        "system.filesystems",
        Status.FAIL,
        "fs:/scratch",
        Action.DRAIN,
        True,
        "/scratch is not mounted",
        config={"mounted": ["/scratch"]},
    ),
    Fault(
        "kernel-denied",
        "system",
        "system.kernel",
        Status.FAIL,
        None,
        Action.REBOOT,
        True,
        "5.15.0-1042-nvidia",
        config={"deny": ["5.15.0-1042*"]},
    ),
    Fault(
        "required-daemon-missing",
        "system",
        "system.processes",
        Status.FAIL,
        None,
        Action.DRAIN,
        True,
        "not running: nv-fabricmanager",
        config={"required": ["nvidia-persistenced", "nv-fabricmanager"]},
    ),
    Fault(
        "busy-before-job",
        "system",
        "system.load",
        Status.WARN,
        None,
        Action.NONE,
        False,
        "per CPU",
        overrides={"node": {"loadavg": [900.0, 850.0, 800.0]}},
    ),
    Fault(
        "loadavg-garbage",
        "system",
        "system.load",
        Status.UNKNOWN,
        None,
        Action.NONE,
        False,
        "/proc/loadavg",
        files={"/proc/loadavg": "\x00\xff not a load average"},
    ),
]


class Edits:
    """Shared-node edits (NVML state keys, files, kernel log records), undone in reverse order."""

    def __init__(self, node) -> None:
        self.node = node
        self.undo = []

    def nvml(self, changes: Dict[str, Any]) -> None:
        before = self.node.state()
        self.node.set_states(changes)
        self.undo.append(lambda: self.node.set_states({k: before.get(k) for k in changes}))

    def file(self, path: str, content: str) -> None:
        real = self.node.path(path).resolve()  # write through sysfs symlinks, restore the target
        saved = real.read_bytes()
        real.write_bytes(
            content.encode("utf-8", "surrogateescape") if isinstance(content, str) else content
        )
        self.undo.append(lambda: real.write_bytes(saved))

    def truncate_config_space(self, bdf: str) -> None:
        """What an unprivileged read of /sys/bus/pci/devices/<bdf>/config returns: 64 bytes."""
        real = self.node.path("/sys/bus/pci/devices/%s" % bdf).resolve() / "config"
        saved = real.read_bytes()
        real.write_bytes(saved[:64])
        self.undo.append(lambda: real.write_bytes(saved))

    def kmsg(self, messages) -> None:
        kmsg = self.node.path("/dev/kmsg")
        saved = kmsg.read_bytes()
        for message in messages:
            self.node.add_kmsg(message)
        self.undo.append(lambda: kmsg.write_bytes(saved))

    def restore(self) -> None:
        while self.undo:
            self.undo.pop()()
