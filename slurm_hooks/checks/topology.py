"""Family `topology`: where GPUs, RDMA NICs and NVMe drives sit in the PCIe tree, ACS, and the IOMMU.

Where the data comes from: the PCIe tree of sysfs (/sys/bus/pci/devices/<bdf> -> /sys/devices/pci*/...,
`lspci -tv`), RDMA devices from /sys/class/infiniband/<hca>/device (`ibv_devices`), NVMe controllers from
/sys/class/nvme/nvmeN/device (`nvme list`), GPU minor numbers from /proc/driver/nvidia/gpus/<bdf>/information,
NVML's nvmlDeviceGetTopologyCommonAncestor for GPU pairs (`nvidia-smi topo -m`) as a cross-check, ACS
from each bridge's config space (`lspci -vvv | grep ACSCtl`), and the IOMMU from /sys/class/iommu,
/sys/kernel/iommu_groups/<n>/type and /proc/cmdline (`dmesg | grep -i iommu`).
"""

from __future__ import annotations

from ..core.structs import Struct, field
from ..hw import nvml, pcie
from ..hw.host import HostError
from ..hw.pcie import Level, PciTree
from ..registry import DEFAULT_CONTEXTS, Param, check, gatherer
from ..result import Action, Result, Status
from .pci import PCI_DEVICES

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

LEVELS = tuple(level.name for level in Level)
VM_VENDORS = (
    "qemu",
    "kvm",
    "vmware",
    "xen",
    "microsoft corporation",
    "innotek",
    "amazon ec2",
    "google",
    "openstack",
    "bochs",
    "parallels",
)


class Endpoint(Struct):
    kind: str  # gpu | nic | nvme
    name: str  # "GPU3" (NVML index) or "GPU@<bdf>", "mlx5_2", "nvme1"
    bdf: str
    index: Optional[int] = None  # NVML index (GPUs)
    minor: int = -1  # /dev/nvidia<minor> (GPUs); Slurm's GPU index
    link_layer: str = ""  # NICs: InfiniBand | Ethernet

    @property
    def component(self) -> str:
        label = (
            "gpu:%d" % self.index
            if self.kind == "gpu" and self.index is not None
            else ("hca:%s" % self.name if self.kind == "nic" else self.name)
        )
        return "%s %s" % (label, self.bdf)


class Topology(Struct):
    tree: PciTree
    gpus: Tuple[Endpoint, ...]
    nics: Tuple[Endpoint, ...]  # RDMA devices only: GPUDirect RDMA needs verbs
    nvmes: Tuple[Endpoint, ...]
    virtualization: str = ""  # '' on bare metal, else what gave the VM away
    nvidia_fs: bool = False  # GPUDirect Storage kernel module loaded
    nvml_levels: Dict[Tuple[int, int], Level] = field(default_factory=dict)
    nvml_error: str = ""

    def level(self, a: Endpoint, b: Endpoint) -> Level:
        return self.tree.level(a.bdf, b.bdf)

    def nearest(self, gpu: Endpoint, others: Tuple[Endpoint, ...]) -> List[Tuple[Level, Endpoint]]:
        return sorted(
            ((self.level(gpu, o), o) for o in others), key=lambda pair: (pair[0], pair[1].name)
        )


class PcieSysfs(Struct):
    """The sysfs half of topology.pcie: no NVML, so it can be read in the check process's sysfs helper
    (core/prefetch.py) while NVML is being asked about the GPUs."""

    gpu_bdfs: Tuple[str, ...]
    nics: Tuple[Tuple[str, str, str], ...]  # (hca, bdf, link layer) of the HCAs in the tree
    nvmes: Tuple[Tuple[str, str], ...]  # (name, bdf) of the NVMe controllers in the tree
    tree: PciTree
    gpu_minors: Dict[str, int]
    virtualization: str
    nvidia_fs: bool


@gatherer("topology.pcie_sysfs")
def read_pcie_sysfs(ctx) -> PcieSysfs:
    host = ctx.host
    gpu_bdfs = sorted(d.bdf for d in ctx.get("pci.devices") if d.is_nvidia_gpu)
    nic_bdfs = [
        (hca, _device_bdf(host, "/sys/class/infiniband/%s/device" % hca))
        for hca in host.listdir("/sys/class/infiniband", default=[])
    ]
    nvme_bdfs = [
        (name, _device_bdf(host, "/sys/class/nvme/%s/device" % name))
        for name in host.listdir("/sys/class/nvme", default=[])
    ]
    endpoints = gpu_bdfs + [bdf for _, bdf in nic_bdfs + nvme_bdfs if bdf]
    tree = pcie.read_pci_tree(host, locality_for=endpoints)
    nics = []
    for hca, bdf in nic_bdfs:
        if bdf in tree.nodes:
            layer = host.read_text("/sys/class/infiniband/%s/ports/1/link_layer" % hca, default="")
            nics.append((hca, bdf, layer.strip()))
    return PcieSysfs(
        tuple(gpu_bdfs),
        tuple(nics),
        tuple((name, bdf) for name, bdf in nvme_bdfs if bdf in tree.nodes),
        tree,
        {bdf: _gpu_minor(host, bdf) for bdf in gpu_bdfs},
        detect_virtualization(host),
        host.isdir("/sys/module/nvidia_fs"),
    )


@gatherer("topology.pcie")
def read_topology(ctx) -> Topology:
    sysfs = ctx.get("topology.pcie_sysfs")
    tree = sysfs.tree
    nvml_index, nvml_levels, nvml_error = _nvml_view(ctx, list(sysfs.gpu_bdfs))
    gpus = []
    for bdf in sysfs.gpu_bdfs:
        index = nvml_index.get(bdf)
        gpus.append(
            Endpoint(
                "gpu",
                "GPU%d" % index if index is not None else "GPU@" + bdf,
                bdf,
                index,
                sysfs.gpu_minors[bdf],
            )
        )
    return Topology(
        tree,
        tuple(g for g in gpus if g.bdf in tree.nodes),
        tuple(Endpoint("nic", hca, bdf, link_layer=layer) for hca, bdf, layer in sysfs.nics),
        tuple(Endpoint("nvme", name, bdf) for name, bdf in sysfs.nvmes),
        sysfs.virtualization,
        sysfs.nvidia_fs,
        nvml_levels,
        nvml_error,
    )


def _device_bdf(host, link: str) -> str:
    """The PCI address a class device's 'device' link resolves to ('' when it is not a PCI device)."""
    try:
        return host.realpath(link).rstrip("/").rsplit("/", 1)[-1].lower()
    except HostError:
        return ""


def _gpu_minor(host, bdf: str) -> int:
    text = host.read_text("/proc/driver/nvidia/gpus/%s/information" % bdf, default="")
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Device Minor" and value.strip().isdigit():
            return int(value.strip())
    return -1


def _nvml_view(
    ctx, gpu_bdfs: List[str]
) -> Tuple[Dict[str, int], Dict[Tuple[int, int], Level], str]:
    """NVML index per bus id, and NVML's level for each GPU pair (nvmlDeviceGetTopologyCommonAncestor)."""
    if not gpu_bdfs:
        return {}, {}, ""
    try:
        inventory = ctx.get("gpu.inventory")
    except (
        Exception
    ) as exc:  # the GPU family reports NVML trouble; here it only costs the cross-check
        return {}, {}, "gpu.inventory failed: %s" % exc
    if inventory.error is not None:
        return {}, {}, str(inventory.error)
    index = {d.bus_id: d.index for d in inventory.devices}
    levels: Dict[Tuple[int, int], Level] = {}
    session = nvml.session(ctx.config.get("nvml", "library"))
    handles = sorted(inventory.handles.items())
    try:
        for i, (a, handle_a) in enumerate(handles):
            for b, handle_b in handles[i + 1 :]:
                level = Level.from_nvml(
                    int(session.call("nvmlDeviceGetTopologyCommonAncestor", handle_a, handle_b))
                )
                if level is not None:
                    levels[(a, b)] = level
    except nvml.NvmlError as exc:
        return index, {}, str(exc)
    return index, levels, ""


def detect_virtualization(host) -> str:
    """'' on bare metal, else the evidence: the CPU 'hypervisor' flag (/proc/cpuinfo, `lscpu | grep Hypervisor`),
    /sys/hypervisor/type, or a virtual DMI vendor (/sys/class/dmi/id/sys_vendor, `systemd-detect-virt`)."""
    vendor = host.read_text("/sys/class/dmi/id/sys_vendor", default="").strip()
    if any(vendor.lower().startswith(v) for v in VM_VENDORS):
        return "DMI vendor %r" % vendor
    hypervisor = host.read_text("/sys/hypervisor/type", default="").strip()
    if hypervisor:
        return "/sys/hypervisor/type %r" % hypervisor
    for line in host.read_lines("/proc/cpuinfo", default=[]):
        if line.startswith("flags"):
            return "CPU flag 'hypervisor'" if "hypervisor" in line.split(":", 1)[-1].split() else ""
    return ""


# -- the per-GPU table every check shows with -v ------------------------------------------------


def gpu_table(topo: Topology) -> str:
    """GPU | PCI | NUMA | nearest RDMA NIC and level | nearest NVMe and level (`nvidia-smi topo -m` levels)."""
    rows = [("GPU", "PCI", "NUMA", "NIC", "NVMe")]
    for gpu in topo.gpus:
        node = topo.tree.nodes[gpu.bdf]
        rows.append(
            (
                gpu.name,
                gpu.bdf,
                str(node.numa_node),
                _best(topo, gpu, topo.nics),
                _best(topo, gpu, topo.nvmes),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _best(topo: Topology, gpu: Endpoint, others: Tuple[Endpoint, ...]) -> str:
    ranked = topo.nearest(gpu, others)
    if not ranked:
        return "-"
    level = ranked[0][0]
    names = [o.name for lvl, o in ranked if lvl == level]
    return "%s %s" % (
        ",".join(names[:2]) + ("+%d" % (len(names) - 2) if len(names) > 2 else ""),
        level.name,
    )


def _no_gpus(name: str, topo: Topology) -> Optional[Result]:
    if not topo.gpus:
        return Result(name, Status.SKIP, "no NVIDIA GPUs on the PCI bus")
    return None


def _locality(
    name: str, topo: Topology, others: Tuple[Endpoint, ...], what: str, params
) -> List[Result]:
    limit = Level.parse(params.max_level)
    bad_status = Status.FAIL if params.on_violation == "fail" else Status.WARN
    table = gpu_table(topo)
    results = []
    for gpu in topo.gpus:
        ranked = topo.nearest(gpu, others)
        if ranked[0][0] <= limit:
            continue
        level, best = ranked[0]
        results.append(
            Result(
                name,
                bad_status,
                "%s (%s, NUMA %d): nearest %s is %s at %s, worse than %s"
                % (
                    gpu.name,
                    gpu.bdf,
                    topo.tree.nodes[gpu.bdf].numa_node,
                    what,
                    best.name,
                    level.name,
                    limit.name,
                ),
                component=gpu.component,
                action=Action.DRAIN if bad_status is Status.FAIL else Action.NONE,
                details={
                    "nearest": {o.name: lvl.name for lvl, o in ranked[:4]},
                    "max_level": limit.name,
                    "fix": "move the %s (or the GPU) to a slot under the same PCIe switch/socket, or, if this "
                    "board is built that way, raise max_level" % what,
                },
            )
        )
    if results:  # the table once, on the first finding
        first = results[0]
        results[0] = Result(
            first.check,
            first.status,
            first.summary,
            first.component,
            dict(first.details, topology=table),
            first.action,
        )
    return results


@check(
    name="topology.gpu-nic",
    contexts=DEFAULT_CONTEXTS,
    timeout=3.0,
    needs=("topology.pcie",),
    params=(
        Param(
            "max_level",
            str,
            "PXB",
            "worst acceptable GPU-to-NIC path; PXB is the level up to which NCCL uses "
            "GPUDirect RDMA by default (NCCL_NET_GDR_LEVEL)",
            choices=LEVELS,
        ),
        Param(
            "on_violation",
            str,
            "fail",
            "status for a GPU without a NIC at max_level or better",
            choices=("fail", "warn"),
        ),
    ),
)
def gpu_nic(topo: Topology, params) -> List[Result]:
    """Every GPU has an RDMA NIC at or better than max_level (default PXB) in the PCIe tree.

    A GPU whose nearest NIC is across the host bridge (PHB/NODE) or the socket (SYS) does not get
    GPUDirect RDMA from NCCL and drags every all-reduce to host-memory bounce buffers. Sources: sysfs
    PCIe tree and /sys/class/infiniband (`nvidia-smi topo -m`, `lspci -tv`); GPU pairs cross-checked
    with nvmlDeviceGetTopologyCommonAncestor. Fix: reseat the NIC/GPU or fix the slot map.
    """
    skip = _no_gpus("topology.gpu-nic", topo)
    if skip:
        return [skip]
    if not topo.nics:
        return [
            Result(
                "topology.gpu-nic",
                Status.SKIP,
                "no RDMA devices in /sys/class/infiniband: not a GPUDirect RDMA node",
                details={"topology": gpu_table(topo)},
            )
        ]
    results = _locality(
        "topology.gpu-nic", topo, topo.nics, "RDMA NIC", params
    ) + _nvml_disagreements(topo)
    if results:
        return results
    limit = Level.parse(params.max_level)
    return [
        Result(
            "topology.gpu-nic",
            Status.OK,
            "%d GPUs, each with an RDMA NIC at %s or better" % (len(topo.gpus), limit.name),
            details={"topology": gpu_table(topo), "nvml_cross_check": topo.nvml_error or "agrees"},
        )
    ]


def _nvml_disagreements(topo: Topology) -> List[Result]:
    by_index = {g.index: g for g in topo.gpus if g.index is not None}
    results = []
    for (a, b), nvml_level in sorted(topo.nvml_levels.items()):
        if a in by_index and b in by_index:
            ours = topo.level(by_index[a], by_index[b])
            if ours != nvml_level:
                results.append(
                    Result(
                        "topology.gpu-nic",
                        Status.WARN,
                        "GPU%d-GPU%d: sysfs says %s, NVML says %s; the PCIe tree may be read wrong "
                        "(a slurm-hooks bug or an unusual platform)"
                        % (a, b, ours.name, nvml_level.name),
                        component="gpu:%d gpu:%d" % (a, b),
                    )
                )
    return results


@check(
    name="topology.gpu-nvme",
    contexts=DEFAULT_CONTEXTS,
    timeout=3.0,
    needs=("topology.pcie",),
    params=(
        Param(
            "required", bool, False, "check even when nvidia_fs (GPUDirect Storage) is not loaded"
        ),
        Param(
            "max_level",
            str,
            "PXB",
            "worst acceptable GPU-to-NVMe path for GPUDirect Storage",
            choices=LEVELS,
        ),
        Param(
            "on_violation",
            str,
            "fail",
            "status for a GPU without an NVMe drive at max_level or better",
            choices=("fail", "warn"),
        ),
    ),
)
def gpu_nvme(topo: Topology, params) -> List[Result]:
    """With GPUDirect Storage, every GPU has an NVMe drive at or better than max_level (default PXB).

    Runs when nvidia_fs is loaded (/sys/module/nvidia_fs) or `required = true`. GDS reads from a
    drive behind another host bridge or socket go through the CPU and lose most of its benefit.
    Sources: sysfs PCIe tree, /sys/class/nvme (`nvidia-smi topo -m`, `gdscheck -p`).
    """
    skip = _no_gpus("topology.gpu-nvme", topo)
    if skip:
        return [skip]
    if not (params.required or topo.nvidia_fs):
        return [
            Result(
                "topology.gpu-nvme",
                Status.SKIP,
                "GPUDirect Storage not in use (nvidia_fs not loaded; "
                "set required = true to check anyway)",
                details={"topology": gpu_table(topo)},
            )
        ]
    if not topo.nvmes:
        return [
            Result(
                "topology.gpu-nvme",
                Status.FAIL,
                "GPUDirect Storage expected but no NVMe controllers in /sys/class/nvme",
                action=Action.DRAIN,
            )
        ]
    results = _locality("topology.gpu-nvme", topo, topo.nvmes, "NVMe drive", params)
    return results or [
        Result(
            "topology.gpu-nvme",
            Status.OK,
            "%d GPUs, each with an NVMe drive at %s or better" % (len(topo.gpus), params.max_level),
            details={"topology": gpu_table(topo)},
        )
    ]


@check(
    name="topology.acs",
    contexts=DEFAULT_CONTEXTS,
    timeout=3.0,
    needs=("topology.pcie",),
    params=(
        Param(
            "fail_bits",
            list,
            ["ReqRedir", "CmpltRedir"],
            "ACSCtl bits that send peer-to-peer traffic up to the root complex (FAIL)",
            item_type=str,
            choices=tuple(bit for bit, _ in pcie.ACS_BITS),
        ),
        Param(
            "warn_bits",
            list,
            [],
            "ACSCtl bits to warn about (e.g. SrcValid, which NCCL's guide also "
            "treats as 'ACS enabled')",
            item_type=str,
            choices=tuple(bit for bit, _ in pcie.ACS_BITS),
        ),
    ),
)
def acs(topo: Topology, params) -> List[Result]:
    """No ACS redirect on the PCIe bridges between a GPU and its nearest NICs or its PCIe peer GPUs.

    ACS Request/Completion Redirect forces peer-to-peer transactions through the root complex
    (IOMMU): GPUDirect RDMA and P2P then crawl or hang. Source: ACS extended capability in
    /sys/bus/pci/devices/<bridge>/config (`lspci -vvv -s BRIDGE | grep ACSCtl`); reading it needs
    root. Fix: disable ACS in the BIOS, or `setpci -s BRIDGE ECAP_ACS+6.w=0000` at boot. Skipped
    inside a VM, where the hypervisor owns the real bridges.
    """
    skip = _no_gpus("topology.acs", topo)
    if skip:
        return [skip]
    if topo.virtualization:
        return [
            Result(
                "topology.acs",
                Status.SKIP,
                "inside a virtual machine (%s): ACS is set on the "
                "hypervisor's bridges; check it there" % topo.virtualization,
            )
        ]
    pairs = _p2p_pairs(topo)
    by_bridge: Dict[str, List[str]] = {}
    for a, b in pairs:
        for bridge in topo.tree.bridges_between(a.bdf, b.bdf):
            by_bridge.setdefault(bridge, []).append("%s-%s" % (a.name, b.name))
    unreadable = sorted(
        b for b in by_bridge if topo.tree.nodes[b].config_error or not topo.tree.nodes[b].config
    )
    results = [
        _judge_bridge(topo, bridge, users, params)
        for bridge, users in sorted(by_bridge.items())
        if bridge not in unreadable
    ]
    results = [r for r in results if r is not None]
    if unreadable:
        node = topo.tree.nodes[unreadable[0]]
        results.append(
            Result(
                "topology.acs",
                Status.UNKNOWN,
                "cannot read the ACS capability of %d bridges (%s): %s; "
                "run as root"
                % (
                    len(unreadable),
                    ", ".join(unreadable[:4]),
                    node.config_error or "no config space",
                ),
                details={"bridges": unreadable},
            )
        )
    if results:
        return results
    return [
        Result(
            "topology.acs",
            Status.OK,
            "ACS redirect off on %d bridges between GPUs and their NICs/peers" % len(by_bridge),
            details={"bridges": sorted(by_bridge), "topology": gpu_table(topo)},
        )
    ]


def _p2p_pairs(topo: Topology) -> List[Tuple[Endpoint, Endpoint]]:
    pairs = []
    for i, gpu in enumerate(topo.gpus):
        ranked = topo.nearest(gpu, topo.nics)
        pairs += [
            (gpu, nic) for level, nic in ranked if level == ranked[0][0] and level <= Level.PXB
        ]
        pairs += [(gpu, peer) for peer in topo.gpus[i + 1 :] if topo.level(gpu, peer) <= Level.PXB]
    return pairs


def _judge_bridge(topo: Topology, bridge: str, users: List[str], params) -> Optional[Result]:
    node = topo.tree.nodes[bridge]
    details = {"paths": sorted(set(users))[:8], "chain": pcie.format_bdf_chain(node.chain)}
    control = pcie.acs_control(node.config)
    if control is None:
        return (
            None  # no ACS capability (switch upstream ports, most endpoints): nothing to redirect
        )
    flags = pcie.acs_flags(control)
    details["ACSCtl"] = " ".join("%s%s" % (k, "+" if v else "-") for k, v in flags.items())
    bad = [b for b in params.fail_bits if flags.get(b)]
    warn = [b for b in params.warn_bits if flags.get(b)]
    if not bad and not warn:
        return None
    status = Status.FAIL if bad else Status.WARN
    details["fix"] = (
        "disable ACS in the BIOS or run `setpci -s %s ECAP_ACS+6.w=0000` at boot" % bridge
    )
    return Result(
        "topology.acs",
        status,
        "bridge %s has ACS %s enabled on the path %s: peer-to-peer traffic is "
        "redirected to the root complex"
        % (bridge, "+".join(bad or warn), ", ".join(sorted(set(users))[:3])),
        component="pci:" + bridge,
        action=Action.DRAIN if bad else Action.NONE,
        details=details,
    )


# -- IOMMU ------------------------------------------------------------------------------------


class IommuState(Struct):
    units: Tuple[str, ...]  # /sys/class/iommu entries (dmar0, ivhd0, ...)
    group_types: Dict[
        str, str
    ]  # GPU/NIC bdf -> /sys/kernel/iommu_groups/<n>/type ('' when no group)
    cmdline: str


@gatherer("topology.iommu")
def read_iommu(ctx) -> IommuState:
    host = ctx.host
    topo = ctx.get("topology.pcie")
    types = {}
    for dev in topo.gpus + topo.nics:
        group = (
            host.realpath("%s/%s/iommu_group" % (PCI_DEVICES, dev.bdf))
            if host.exists("%s/%s/iommu_group" % (PCI_DEVICES, dev.bdf))
            else ""
        )
        types[dev.bdf] = host.read_text(group + "/type", default="?").strip() if group else ""
    return IommuState(
        tuple(host.listdir("/sys/class/iommu", default=[])),
        types,
        host.read_text("/proc/cmdline", default="").strip(),
    )


@check(
    name="topology.iommu",
    contexts=DEFAULT_CONTEXTS,
    timeout=2.0,
    needs=("topology.iommu", "topology.pcie"),
    params=(
        Param(
            "translated",
            str,
            "warn",
            "status when GPUs or NICs sit behind a translating IOMMU (DMA/DMA-FQ "
            "domains) on a GPUDirect node",
            choices=("ok", "warn", "fail"),
        ),
    ),
)
def iommu(state: IommuState, topo: Topology, params) -> Result:
    """The IOMMU is off or in passthrough for GPUs and RDMA NICs (GPUDirect nodes only).

    With translation every peer-to-peer and RDMA transfer needs an IOVA mapping; NVIDIA recommends
    `iommu=pt` (or off) for GPUDirect RDMA, which otherwise fails or slows down. Sources: /sys/class/iommu,
    /sys/kernel/iommu_groups/<n>/type ('identity' = passthrough, 'DMA'/'DMA-FQ' = translated) and
    /proc/cmdline. Default WARN, not FAIL: a kernel command line is set fleet-wide, and draining
    every node for it would do more harm than an alert. Fix: boot with `iommu=pt` (Intel: `intel_iommu=on iommu=pt`).
    """
    if not topo.gpus or not topo.nics:
        return Result(
            "topology.iommu", Status.SKIP, "not a GPUDirect RDMA node (needs GPUs and RDMA NICs)"
        )
    details = {
        "iommu_units": list(state.units),
        "group_types": dict(state.group_types),
        "cmdline": state.cmdline,
    }
    translated = sorted(bdf for bdf, kind in state.group_types.items() if kind.startswith("DMA"))
    if not state.units and not any(state.group_types.values()):
        return Result("topology.iommu", Status.OK, "IOMMU off", details=details)
    if not translated:
        return Result(
            "topology.iommu", Status.OK, "IOMMU in passthrough for GPUs and NICs", details=details
        )
    status = {"ok": Status.OK, "warn": Status.WARN, "fail": Status.FAIL}[params.translated]
    return Result(
        "topology.iommu",
        status,
        "IOMMU translates DMA for %d GPUs/NICs (%s): GPUDirect RDMA needs "
        "passthrough; boot with iommu=pt" % (len(translated), ", ".join(translated[:3])),
        action=Action.DRAIN if status is Status.FAIL else Action.NONE,
        details=details,
    )
