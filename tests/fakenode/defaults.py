"""Default values for every spec key.  These dicts double as the schema: a key not listed here is a
spec error, and a value must have the type of its default (``None``: any type; ``OPEN``: free table).

Units follow the source they imitate: NVML values in NVML units (mW, MHz, bytes, C), sysfs/procfs
values in kB.  See README.md for the meaning of each key.
"""

from __future__ import annotations

from typing import Any


class Open:
    """Schema marker: a table with arbitrary keys whose values follow ``item`` (None = anything)."""

    def __init__(self, item: Any = None) -> None:
        self.item = item


OPEN = Open()

TOP_LEVEL = (
    "node",
    "cpu",
    "memory",
    "numa",
    "pcie",
    "iommu",
    "nvml",
    "memory_peers",
    "modules",
    "swap",
    "mounts",
    "kmsg",
    "switch_defaults",
    "switch",
    "gpu_defaults",
    "gpu",
    "nic",
    "nvme",
    "cgroup",
    "slurm",
    "job",
    "process",
    "irq",
)

VIRT = ("none", "kvm", "vmware", "xen", "hyperv", "other")

NODE = {
    "hostname": "node01",
    "kernel_release": "5.15.0-105-generic",
    "proc_version": "",  # /proc/version; derived from kernel_release when empty
    "cmdline": "",  # /proc/cmdline; derived from iommu mode when empty
    "virtualization": "none",  # none (bare metal) | kvm | vmware | xen | hyperv | other
    "os_release": "Ubuntu 22.04.4 LTS",
    "dmi_sys_vendor": "",
    "dmi_product_name": "",
    "loadavg": [0.12, 0.18, 0.15],
    "uptime_s": 864000.0,
    "numa_balancing": 0,
    "zone_reclaim_mode": 0,
    "thp": "madvise",  # transparent_hugepage/enabled selection
    "kmsg_boot_lines": True,  # prepend realistic boot lines to /dev/kmsg
    "extra_processes": 0,  # this many more user processes in /proc (pids from 100000): scale benchmarks
}

CPU = {
    "sockets": 1,
    "cores_per_socket": 8,
    "threads_per_core": 2,
    "possible": 0,  # CPU slots the firmware lists (cpu/possible); 0 = the CPUs present. More is
    # normal (VMware guests, hot-plug servers): the kernel's cpu/offline lists them
    "offline": "",  # present CPUs taken offline (cpulist): no topology, cpuN/online = 0
    "ticks": OPEN,  # /proc/stat per CPU: {"<cpu>" = {user, nice, system, idle, iowait, irq, softirq,
    # steal}} in USER_HZ ticks; unset columns derive from [node] uptime_s
    "model_name": "Intel(R) Xeon(R) Platinum 8480C",
    "vendor_id": "GenuineIntel",
    "family": 6,
    "model": 143,
    "stepping": 8,
    "mhz": 2000.0,
    "cache_kb": 107520,
    "flags": [
        "fpu",
        "vme",
        "de",
        "pse",
        "tsc",
        "msr",
        "pae",
        "mce",
        "cx8",
        "apic",
        "sep",
        "mtrr",
        "pge",
        "mca",
        "cmov",
        "pat",
        "pse36",
        "clflush",
        "dts",
        "acpi",
        "mmx",
        "fxsr",
        "sse",
        "sse2",
        "ss",
        "ht",
        "tm",
        "pbe",
        "syscall",
        "nx",
        "pdpe1gb",
        "rdtscp",
        "lm",
        "constant_tsc",
        "rep_good",
        "nopl",
        "xtopology",
        "nonstop_tsc",
        "cpuid",
        "pni",
        "pclmulqdq",
        "monitor",
        "ssse3",
        "fma",
        "cx16",
        "sse4_1",
        "sse4_2",
        "x2apic",
        "movbe",
        "popcnt",
        "aes",
        "xsave",
        "avx",
        "f16c",
        "rdrand",
        "lahf_lm",
        "abm",
        "avx2",
        "bmi1",
        "bmi2",
        "erms",
        "avx512f",
        "avx512dq",
        "avx512bw",
        "avx512vl",
        "amx_tile",
        "amx_bf16",
    ],
}

EDAC_DIMM = {  # /sys/devices/system/edac/mc/mcN/dimmM/ (Documentation/ABI/testing/sysfs-devices-edac)
    "label": None,  # dimm_label; None: the i10nm/skx driver's "CPU_SrcID#<socket>_MC#<mc>_Chan#<c>_DIMM#<d>"
    "location": None,  # dimm_location; None: "channel <c> slot <d> " (the driver's two layers)
    "size": 65536,  # MiB
    "ce_count": 0,  # dimm_ce_count
    "ue_count": 0,  # dimm_ue_count
}

EDAC_MC = {  # /sys/devices/system/edac/mc/mcN/
    "seconds_since_reset": 86400 * 7,
    "ce_noinfo_count": 0,
    "ue_noinfo_count": 0,
    "dimms": Open(EDAC_DIMM),  # "dimm<M>" -> overrides of the generated DIMM (or a new one)
}

MEMORY = {
    "total_kb": 263842184,  # split evenly over NUMA nodes that do not set mem_total_kb
    "free_kb": 0,  # 0: 90% of total
    "hugepagesize_kb": 2048,
    # EDAC, as i10nm_edac lays out a Sapphire Rapids node: per socket `edac_controllers` integrated
    # memory controllers (one mcN each, numbered across sockets), `edac_channels` channels of one DIMM
    # each (dimm0, dimm1, ...). 0 controllers: no EDAC driver (no /sys/devices/system/edac/mc/mc*).
    "edac_controllers": 0,
    "edac_channels": 2,
    "edac": Open(EDAC_MC),  # "mc<N>" -> overrides (error counts, labels)
}

NUMA = {
    "cpulist": "",  # default: the CPUs of socket <id>
    "mem_total_kb": 0,
    "mem_free_kb": 0,
    "distance": [],  # default: 10 local, 21 remote
    "hugepages": Open({"nr": 0, "free": 0, "surplus": 0}),  # keyed by size: "2048kB", "1048576kB"
}

PCIE = {
    "acs_redirect": False,  # default ACS P2P redirect for every bridge (root ports, switch ports)
}

IOMMU = {
    "mode": "passthrough",  # off | passthrough | translated
    "vendor": "intel",  # intel (dmarN) | amd (ivhdN)
}

NVML = {
    "library": None,  # install the fake libnvidia-ml.so.1 (default: when there are GPUs)
    "driver_loaded": True,  # False: nvmlInit returns NVML_ERROR_DRIVER_NOT_LOADED
    "driver_version": "550.54.15",
    "cuda_driver_version": 12040,
    "nvml_version": "",  # default "<cuda major>.<driver>-fakenvml"; must contain "fake"
    "fault": OPEN,  # {function = code}: system-wide (all GPUs / system calls)
    "hang": OPEN,  # {function = true}
    "crash": OPEN,  # {function = true}
    "delay_ms": OPEN,  # {function = ms}
}

MEMORY_PEERS = Open("")  # {client name: version} -> /sys/kernel/mm/memory_peers/<name>/version

MODULE = {"version": "", "taint": "", "size": 0, "loaded": True}

SWAP = {"filename": "/swap.img", "type": "file", "size_kb": 8388604, "used_kb": 0, "priority": -2}

MOUNT = {
    "device": "",
    "mountpoint": "",
    "fstype": "",
    "options": "rw,relatime",
    "free_percent": 50.0,
    "free_inodes_percent": 90.0,
}  # what statvfs(2) says (.slurm-hooks/statvfs.json)

MOUNTS = [
    "/dev/nvme0n1p2 / ext4 rw,relatime",
    "proc /proc proc rw,nosuid,nodev,noexec,relatime",
    "sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime",
    "devtmpfs /dev devtmpfs rw,nosuid,relatime,mode=755",
    "tmpfs /dev/shm tmpfs rw,nosuid,nodev",
    "tmpfs /run tmpfs rw,nosuid,nodev,noexec,relatime,mode=755",
    "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime",
    "/dev/nvme0n1p1 /boot/efi vfat rw,relatime",
]

# A record appended to /dev/kmsg. With `xid` > 0 the record is the driver's Xid report about GPU `gpu`
# (its index), `msg` its text, written as the driver prints it (xid_message): with `gpu_instance`
# (and `compute_instance`) >= 0 it is attributed to that MIG partition.
KMSG = {
    "msg": "",
    "level": 6,
    "facility": 0,
    "ts_us": -1,
    "xid": 0,
    "gpu": 0,
    "gpu_instance": -1,
    "compute_instance": -1,
    "pid": "'<unknown>'",
    "name": "<unknown>",
}

SWITCH = {
    "kind": "switch",  # switch | bridge (one PCIe-to-PCI bridge function, no downstream ports)
    "root_port": "",  # PCI address of the CPU root port above it (top-level switches and bridges)
    "parent": "",  # or: the switch/bridge it hangs below (a downstream port is generated there)
    "upstream": "",  # the switch's upstream port (downstream ports follow on bus+1), or the bridge
    "numa_node": None,  # default: the parent's, else 0; -1 = the platform does not say
    "vendor": 0x1000,  # Broadcom / PLX PEX89xxx
    "device": 0xC030,
    "acs_redirect": None,  # None: [pcie].acs_redirect
    "acs_ctrl": -1,  # explicit ACS control register for the switch's bridges (-1: from acs_redirect)
    "link_gen": 5,
    "link_width": 16,
}

_DEV = {
    "pci": "",
    "switch": "",
    "root_port": "",  # only without a switch; "" = auto, "none" = directly on the host bridge
    "numa_node": None,  # default: the switch's, else 0
}

GPU = dict(
    _DEV,
    **{
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "",
        "serial": "",
        "vbios": "96.00.74.00.01",
        "board_part_number": "692-2G520-0200-000",
        "inforom_image": "G520.0200.00.05",
        "pci_vendor_id": 0x10DE,
        "pci_device_id": 0x2330,
        "pci_subsystem_id": 0x16C110DE,
        "pci_class": 0x030200,
        "minor_number": -1,  # default: the index
        "architecture": 9,  # NVML_DEVICE_ARCH_HOPPER
        "brand": 14,  # NVML_BRAND_NVIDIA
        "cuda_cc": "9.0",
        "persistence_mode": True,
        "compute_mode": 0,  # NVML_COMPUTEMODE_DEFAULT
        "mig": {"supported": True, "current": 0, "pending": 0},
        "pcie": {
            "gen": 5,
            "width": 16,
            "max_gen": 5,
            "max_width": 16,
            "gpu_max_gen": 5,
            "replay_counter": 0,
            "max_speed": 32000,
            "speed": 32000,
        },
        "ecc": {
            "supported": True,
            "mode": True,
            "pending": True,
            "default": True,
            "locations": ["dram", "sram"],  # locations nvmlDeviceGetMemoryErrorCounter supports
            "volatile": {"corrected": Open(0), "uncorrected": Open(0)},
            "aggregate": {"corrected": Open(0), "uncorrected": Open(0)},
        },
        "remapped_rows": {
            "supported": True,
            "corrected": 0,
            "uncorrected": 0,
            "pending": False,
            "failure": False,
        },
        "retired_pages": {"supported": None, "single_bit": [], "double_bit": [], "pending": False},
        "temperature": {
            "gpu": 33,
            "memory": 31,
            "shutdown": 92,
            "slowdown": 89,
            "mem_max": 95,
            "gpu_max": 87,
        },
        "clocks_event_reasons": 0x1,  # nvmlClocksEventReasonGpuIdle
        "supported_clocks_event_reasons": 0x1FF,
        "power": {
            "usage_mw": 71000,
            "limit_mw": 700000,
            "default_limit_mw": 700000,
            "enforced_limit_mw": 700000,
            "min_limit_mw": 200000,
            "max_limit_mw": 700000,
            "management": True,
            "energy_mj": 123456789,
        },
        "clocks": {"graphics": 345, "sm": 345, "mem": 2619, "video": 765},
        "max_clocks": {"graphics": 1980, "sm": 1980, "mem": 2619, "video": 1545},
        "applications_clocks": {"graphics": 1980, "mem": 2619},
        "default_applications_clocks": {"graphics": 1980, "mem": 2619},
        "nvlink": {
            "count": 18,
            "version": 6,
            "remote_type": 2,
            "links": OPEN,
        },  # 6 = NVLink 4.0, 2 = NVSwitch
        "processes": [],  # [{pid, used_memory (bytes), name}]
        "graphics_processes": [],
        "memory": {
            "total": 85520809984,
            "reserved": 556793856,
            "used": None,
        },  # used: default sum of processes
        "bar1_total": 137438953472,
        "utilization": {"gpu": 0, "memory": 0},
        "violation_ns": {
            "power": 0,
            "thermal": 0,
            "sync_boost": 0,
            "board_limit": 0,
            "low_utilization": 0,
            "reliability": 0,
        },
        # NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN / _HW_POWER_BRAKE_SLOWDOWN (ns); supported = false:
        # a pre-R535 driver (fields 269-271 NOT_SUPPORTED). SW power cap/thermal/sync boost are violation_ns.
        "clock_event_ns": {"supported": True, "hw_therm_slowdown": 0, "hw_power_brake_slowdown": 0},
        "fabric": {"state": 0, "status": 0, "clique_id": 0, "cluster_uuid": "", "health_mask": 0},
        "recovery_action": 0,  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
        "fields": OPEN,  # {field id: value} for nvmlDeviceGetFieldValues
        "fault": OPEN,  # {function = nvmlReturn_t code} for this GPU
        "hang": OPEN,
        "crash": OPEN,
        "delay_ms": OPEN,
        "driver": "nvidia",
    },
)

NVLINK_LINK = {
    "state": True,
    "remote_bus_id": "",
    "errors": {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0, "ecc_data": 0},
}

PROCESS = {"pid": 0, "used_memory": 0, "name": "python3"}

IB_COUNTERS = {
    "symbol_error": 0,
    "link_downed": 0,
    "port_rcv_errors": 0,
    "link_error_recovery": 0,
    "port_xmit_discards": 0,
    "port_rcv_remote_physical_errors": 0,
    "port_rcv_switch_relay_errors": 0,
    "local_link_integrity_errors": 0,
    "excessive_buffer_overrun_errors": 0,
    "port_xmit_constraint_errors": 0,
    "port_rcv_constraint_errors": 0,
    "VL15_dropped": 0,
    "port_xmit_wait": 0,
    "port_xmit_data": 0,
    "port_rcv_data": 0,
    "port_xmit_packets": 0,
    "port_rcv_packets": 0,
}

IB_PORT = {
    "state": "4: ACTIVE",
    "phys_state": "5: LinkUp",
    "rate": "400 Gb/sec (4X NDR)",
    "link_layer": "",
    "lid": "0x1",
    "sm_lid": "0x1",
    "counters": OPEN,
}

NIC = dict(
    _DEV,
    **{
        "vendor": 0x15B3,
        "device": 0x1021,  # ConnectX-7
        "class": -1,  # default 0x020700 InfiniBand / 0x020000 Ethernet
        "link_layer": "InfiniBand",
        "rdma": None,  # /sys/class/infiniband entry (default: Mellanox vendor)
        "netdev": "",  # default ibp<bus>s<dev> / enp<bus>s<dev>
        "mac": "",
        "mtu": 4092,
        "operstate": "up",
        "fw_ver": "28.39.1002",
        "board_id": "MT_0000000838",
        "hca_type": "MT4129",
        "node_guid": "",
        "driver": "mlx5_core",
        "link_gen": 5,
        "link_width": 16,
        "max_link_gen": 5,
        "max_link_width": 16,
        "ports": OPEN,  # {1 = {state, phys_state, rate, link_layer, counters = {...}}}
    },
)

NVME = dict(
    _DEV,
    **{
        "vendor": 0x144D,
        "device": 0xA824,
        "model": "SAMSUNG MZWLR3T8HBLS-00007",
        "serial": "S6EWNA0T500123",
        "firmware_rev": "MPK7525Q",
        "driver": "nvme",
        "link_gen": 4,
        "link_width": 4,
        "max_link_gen": 4,
        "max_link_width": 4,
    },
)


# ---- Slurm side of the node: cgroups, gres.conf/slurm.conf, jobs, host processes, IRQs

CGROUP = {
    "version": "v2",  # v2 (unified, /sys/fs/cgroup/cgroup.controllers) | v1 (cpuset hierarchy) | none
    "slurm_usage_usec": 0,  # v2: cpu.stat usage_usec of system.slice/slurmstepd.scope (every job's CPU time)
}

SLURM = {
    "gres_conf": "",  # /etc/slurm/gres.conf text; "auto" = correct Cores per GPU; "" = no file
    "slurm_conf": "",  # /etc/slurm/slurm.conf text; "" = no file
}

JOB = {  # [job.<id>]: the job's Slurm cgroup (as task/cgroup writes it)
    "cpus": "",  # cpuset.cpus(.effective); required
    "mems": "",  # default: the NUMA nodes holding those CPUs
    "uid": 1000,  # cgroup v1 path: /sys/fs/cgroup/cpuset/slurm/uid_<uid>/job_<id>
    "pids": [],  # cgroup.procs
    "usage_usec": 0,  # v2: cpu.stat usage_usec (added to the scope's too, as the kernel counts it)
}

HOST_PROCESS = {  # [[process]]: /proc/<pid>/{comm,status,cgroup,cmdline}
    "pid": 0,
    "comm": "",
    "cpus": "",  # Cpus_allowed_list; "" = every CPU
    "cgroup": "/system.slice/unknown.service",
    "kthread": False,
}

# Daemons every node runs, unpinned (systemd's default); [[process]] entries with the same pid replace them.
HOST_PROCESSES = [
    {"pid": 1, "comm": "systemd", "cgroup": "/init.scope"},
    {"pid": 2, "comm": "kthreadd", "cgroup": "/", "kthread": True},
    {"pid": 812, "comm": "sshd", "cgroup": "/system.slice/ssh.service"},
    {"pid": 845, "comm": "munged", "cgroup": "/system.slice/munge.service"},
    {"pid": 901, "comm": "slurmd", "cgroup": "/system.slice/slurmd.service"},
    {"pid": 1210, "comm": "nvidia-persiste", "cgroup": "/system.slice/nvidia-persistenced.service"},
]

IRQ = {  # [[irq]]: /proc/interrupts line + /proc/irq/<n>/smp_affinity_list
    "irq": 0,
    "name": "",  # action name, e.g. mlx5_comp0@pci:0000:19:00.0 or nvme0q1
    "cpus": "",  # "" = the device's local CPUs
}
