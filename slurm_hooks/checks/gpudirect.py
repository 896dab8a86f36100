"""Family `gpudirect`: GPUDirect RDMA readiness, HCA port health, GPUDirect Storage.

Where the data comes from: /sys/kernel/mm/memory_peers/{nv_mem,nv_mem_nc}/version and
/sys/module/nvidia_peermem/version (the files NCCL's IB transport looks for), /proc/modules (`lsmod`),
/proc/sys/kernel/osrelease (`uname -r`), /proc/driver/nvidia/version (open vs proprietary kernel
module), /sys/class/infiniband/<hca>/ports/<n>/{state,phys_state,rate,link_layer} (`ibstat`,
`ibv_devinfo`), /sys/module/nvidia_fs (`lsmod | grep nvidia_fs`, `gdscheck -p`).
"""

from __future__ import annotations

import re

from ..core.structs import Struct
from ..hw.host import ParseError
from ..hw.pcie import Level
from ..registry import DEFAULT_CONTEXTS, Param, check, gatherer
from ..result import Action, Result, Status
from .topology import Topology

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

PEER_FILES = (
    "/sys/kernel/mm/memory_peers/nv_mem/version",
    "/sys/kernel/mm/memory_peers/nv_mem_nc/version",
    "/sys/module/nvidia_peermem/version",
)
PEER_MODULES = ("nvidia_peermem", "nv_peer_mem")


class IbPort(Struct):
    hca: str
    port: int
    state: str  # "4: ACTIVE" -> "ACTIVE"
    phys_state: str  # "5: LinkUp" -> "LinkUp"
    rate_gbps: Optional[float]  # None when the rate file is unreadable
    rate_text: str
    link_layer: str

    @property
    def name(self) -> str:
        return "%s/%d" % (self.hca, self.port)


class GpuDirectState(Struct):
    peer_files: Tuple[str, ...]  # which of PEER_FILES exist
    modules: Tuple[str, ...]  # names in /proc/modules
    kernel_release: str
    nvidia_module: str  # first line of /proc/driver/nvidia/version ('' when absent)
    ports: Tuple[IbPort, ...]
    hcas: Tuple[str, ...]
    nvidia_fs_version: Optional[str]  # None: /sys/module/nvidia_fs absent


def parse_rate(text: str, source: str = "rate") -> float:
    """sysfs IB rate ('400 Gb/sec (4X NDR)', '2.5 Gb/sec (1X SDR)', '0 GB/sec') -> Gb/s."""
    match = re.match(r"^\s*(\d+(?:\.\d+)?)\s*(G|M)b/sec\b", text, re.IGNORECASE)
    if not match:
        raise ParseError(source, text, "'<number> Gb/sec (<width> <speed>)'")
    value = float(match.group(1))
    return value / 1000.0 if match.group(2).upper() == "M" else value


def _state_word(text: str) -> str:
    """'4: ACTIVE' -> 'ACTIVE'; 'LinkUp' stays."""
    return text.split(":", 1)[-1].strip()


def parse_kernel_version(release: str) -> Tuple[int, int]:
    """'5.15.0-1042-nvidia' -> (5, 15); unparsable -> (0, 0)."""
    match = re.match(r"^(\d+)\.(\d+)", release.strip())
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


@gatherer("gpudirect.state")
def read_state(ctx) -> GpuDirectState:
    host = ctx.host
    modules = tuple(
        line.split()[0] for line in host.read_lines("/proc/modules", default=[]) if line.strip()
    )
    ports, hcas = [], host.listdir("/sys/class/infiniband", default=[])
    for hca in hcas:
        base = "/sys/class/infiniband/%s/ports" % hca
        for port in host.listdir(base, default=[]):
            if not port.isdigit():
                continue
            pdir = "%s/%s" % (base, port)
            rate_text = host.read_text(pdir + "/rate", default="").strip()
            try:
                rate: Optional[float] = parse_rate(rate_text, pdir + "/rate")
            except ParseError:
                rate = None
            ports.append(
                IbPort(
                    hca,
                    int(port),
                    _state_word(host.read_text(pdir + "/state", default="?")),
                    _state_word(host.read_text(pdir + "/phys_state", default="?")),
                    rate,
                    rate_text,
                    host.read_text(pdir + "/link_layer", default="").strip(),
                )
            )
    nvidia_fs = (
        host.read_text("/sys/module/nvidia_fs/version", default="")
        if host.isdir("/sys/module/nvidia_fs")
        else None
    )
    return GpuDirectState(
        tuple(p for p in PEER_FILES if host.exists(p)),
        modules,
        host.read_text("/proc/sys/kernel/osrelease", default="").strip(),
        host.read_text("/proc/driver/nvidia/version", default="").split("\n", 1)[0].strip(),
        tuple(ports),
        tuple(hcas),
        nvidia_fs.strip() if nvidia_fs is not None else None,
    )


def _gpudirect_node(state: GpuDirectState, topo: Topology) -> Optional[str]:
    if not topo.gpus:
        return "no NVIDIA GPUs on the PCI bus"
    if not state.hcas:
        return "no RDMA devices in /sys/class/infiniband"
    return None


@check(
    name="gpudirect.rdma",
    contexts=DEFAULT_CONTEXTS,
    timeout=2.0,
    needs=("gpudirect.state", "topology.pcie"),
    params=(
        Param(
            "mode",
            str,
            "auto",
            "auto: peermem, else DMA-BUF when its prerequisites hold; peermem: require the "
            "peer-memory module; dmabuf: require DMA-BUF prerequisites (kernel >= 5.12, open GPU kernel module)",
            choices=("auto", "peermem", "dmabuf"),
        ),
    ),
)
def rdma(state: GpuDirectState, topo: Topology, params) -> Result:
    """GPUDirect RDMA is ready the way NCCL decides it.

    NCCL uses GPUDirect RDMA when one of /sys/kernel/mm/memory_peers/nv_mem/version,
    .../nv_mem_nc/version or /sys/module/nvidia_peermem/version exists (peer memory), or through
    DMA-BUF (kernel >= 5.12 and the open GPU kernel module). A peer-memory module listed in
    /proc/modules without its version file means NCCL will not find it (old/mismatched build):
    FAIL. Fix: `modprobe nvidia_peermem` (driver >= 470), rebuild it against the running MOFED, or use
    the open kernel module for DMA-BUF. Skipped on nodes without GPUs or RDMA devices.
    """
    reason = _gpudirect_node(state, topo)
    if reason:
        return Result("gpudirect.rdma", Status.SKIP, "not a GPUDirect RDMA node: " + reason)
    loaded = [m for m in PEER_MODULES if m in state.modules]
    kernel = parse_kernel_version(state.kernel_release)
    open_module = "open kernel module" in state.nvidia_module.lower()
    dmabuf_ok = kernel >= (5, 12) and open_module
    details = {
        "peer_files": list(state.peer_files),
        "peer_modules_loaded": loaded,
        "kernel": state.kernel_release,
        "nvidia_module": state.nvidia_module,
        "dmabuf_prerequisites": dmabuf_ok,
    }
    if params.mode != "dmabuf":
        if state.peer_files:
            return Result(
                "gpudirect.rdma",
                Status.OK,
                "peer memory ready (%s)" % state.peer_files[0],
                details=details,
            )
        if loaded:
            return Result(
                "gpudirect.rdma",
                Status.FAIL,
                "%s is loaded (/proc/modules) but none of %s exists: NCCL "
                "will not use GPUDirect RDMA; rebuild/reload it for this driver and MOFED"
                % (loaded[0], ", ".join(PEER_FILES)),
                action=Action.DRAIN,
                details=details,
            )
    if params.mode != "peermem" and dmabuf_ok:
        return Result(
            "gpudirect.rdma",
            Status.OK,
            "DMA-BUF ready (kernel %s, open GPU kernel module)" % state.kernel_release,
            details=details,
        )
    missing = []
    if params.mode != "dmabuf":
        missing.append("no peer-memory module (modprobe nvidia_peermem)")
    if params.mode != "peermem":
        missing.append(
            "DMA-BUF needs kernel >= 5.12 (have %s) and the open GPU kernel module (have %s)"
            % (
                state.kernel_release or "?",
                "open"
                if open_module
                else (state.nvidia_module[:60] or "no /proc/driver/nvidia/version"),
            )
        )
    return Result(
        "gpudirect.rdma",
        Status.FAIL,
        "GPUDirect RDMA not available: " + "; ".join(missing),
        action=Action.DRAIN,
        details=details,
    )


@check(
    name="gpudirect.hca",
    contexts=DEFAULT_CONTEXTS,
    timeout=2.0,
    needs=("gpudirect.state",),
    params=(
        Param(
            "expected",
            list,
            [],
            "HCA names that must be present (e.g. mlx5_0..mlx5_7); empty = whatever is there",
            item_type=str,
        ),
        Param(
            "ignore",
            list,
            [],
            "ports not to check, as 'hca' or 'hca/port' (e.g. an unused second port)",
            item_type=str,
        ),
        Param(
            "link_layer",
            str,
            "",
            "required link layer of every checked port: InfiniBand or Ethernet (RoCE); empty = any",
            choices=("", "InfiniBand", "Ethernet"),
        ),
        Param(
            "min_rate_gbps",
            float,
            0.0,
            "FAIL below this rate; 0 = WARN when a port is slower than the fastest "
            "port with the same link layer on this node (a down-trained link)",
            minimum=0.0,
            maximum=100000.0,
        ),
    ),
)
def hca(state: GpuDirectState, params) -> List[Result]:
    """Each expected HCA is present and each of its ports is ACTIVE, LinkUp, at full rate, on the right link layer.

    Judged per port, never 'any port passes': NCCL spreads rings over every NIC, so one slow or down
    port slows or breaks the whole job. Source: /sys/class/infiniband/<hca>/ports/<n>/{state,phys_state,
    rate,link_layer} (`ibstat`). Fix: reseat/replace the cable or transceiver, check the switch port,
    `ibportstate`/`mlxlink` for the link partner.
    """
    results = [
        Result(
            "gpudirect.hca",
            Status.FAIL,
            "HCA %s missing from /sys/class/infiniband" % name,
            component="hca:" + name,
            action=Action.DRAIN,
        )
        for name in params.expected
        if name not in state.hcas
    ]
    ignored = set(params.ignore)
    ports = [p for p in state.ports if p.hca not in ignored and p.name not in ignored]
    if params.expected:
        ports = [p for p in ports if p.hca in params.expected]
    fastest: Dict[str, float] = {}
    for port in ports:
        if port.rate_gbps is not None:
            fastest[port.link_layer] = max(fastest.get(port.link_layer, 0.0), port.rate_gbps)
    judged = [_judge_port(port, params, fastest.get(port.link_layer, 0.0)) for port in ports]
    results += [r for r in judged if r.status is not Status.OK]
    if results:
        return results
    if not judged:
        return [Result("gpudirect.hca", Status.SKIP, "no RDMA devices in /sys/class/infiniband")]
    table = "\n".join(
        "%-10s %-7s %-7s %-22s %s" % (p.name, p.state, p.phys_state, p.rate_text, p.link_layer)
        for p in ports
    )
    return [
        Result(
            "gpudirect.hca",
            Status.OK,
            "%d ports on %d HCAs ACTIVE/LinkUp at full rate"
            % (len(ports), len({p.hca for p in ports})),
            details={"ports": table},
        )
    ]


def _judge_port(port: IbPort, params, fastest: float) -> Result:
    comp = "hca:" + port.name
    details = {
        "state": port.state,
        "phys_state": port.phys_state,
        "rate": port.rate_text,
        "link_layer": port.link_layer,
    }
    if port.state != "ACTIVE" or port.phys_state != "LinkUp":
        return Result(
            "gpudirect.hca",
            Status.FAIL,
            "%s is %s/%s, expected ACTIVE/LinkUp: check cable, transceiver "
            "and switch port (ibstat %s)" % (port.name, port.state, port.phys_state, port.hca),
            component=comp,
            action=Action.DRAIN,
            details=details,
        )
    if params.link_layer and port.link_layer != params.link_layer:
        return Result(
            "gpudirect.hca",
            Status.FAIL,
            "%s link layer is %s, expected %s (mlxconfig LINK_TYPE_P%d)"
            % (port.name, port.link_layer or "?", params.link_layer, port.port),
            component=comp,
            action=Action.DRAIN,
            details=details,
        )
    if port.rate_gbps is None:
        return Result(
            "gpudirect.hca",
            Status.UNKNOWN,
            "%s: unreadable rate %r" % (port.name, port.rate_text),
            component=comp,
            details=details,
        )
    if params.min_rate_gbps and port.rate_gbps < params.min_rate_gbps:
        return Result(
            "gpudirect.hca",
            Status.FAIL,
            "%s runs at %s, below the required %g Gb/s: down-trained "
            "link (cable/transceiver)" % (port.name, port.rate_text, params.min_rate_gbps),
            component=comp,
            action=Action.DRAIN,
            details=details,
        )
    if not params.min_rate_gbps and port.rate_gbps < fastest:
        return Result(
            "gpudirect.hca",
            Status.WARN,
            "%s runs at %s while other %s ports run at %g Gb/s: "
            "down-trained link? (set min_rate_gbps to make this a failure)"
            % (port.name, port.rate_text, port.link_layer or "", fastest),
            component=comp,
            details=details,
        )
    return Result(
        "gpudirect.hca",
        Status.OK,
        "%s ACTIVE, %s, %s" % (port.name, port.rate_text, port.link_layer),
        component=comp,
        details=details,
    )


@check(
    name="gpudirect.storage",
    contexts=DEFAULT_CONTEXTS,
    timeout=2.0,
    needs=("gpudirect.state", "topology.pcie"),
    params=(
        Param("required", bool, False, "this node must have GPUDirect Storage (nvidia_fs loaded)"),
    ),
)
def storage(state: GpuDirectState, topo: Topology, params) -> Result:
    """GPUDirect Storage: the nvidia_fs kernel module is loaded (when required, or when present at all).

    Source: /sys/module/nvidia_fs (`lsmod | grep nvidia_fs`; `gdscheck -p` for the full picture). NVMe
    locality to the GPUs is judged by topology.gpu-nvme. Fix: `modprobe nvidia_fs` (nvidia-gds package).
    """
    if state.nvidia_fs_version is None:
        if params.required:
            return Result(
                "gpudirect.storage",
                Status.FAIL,
                "nvidia_fs is not loaded: GPUDirect Storage falls back "
                "to bounce buffers (modprobe nvidia_fs)",
                action=Action.DRAIN,
            )
        return Result(
            "gpudirect.storage", Status.SKIP, "GPUDirect Storage not in use (nvidia_fs not loaded)"
        )
    local = sum(
        1 for n in topo.nvmes if any(topo.tree.level(g.bdf, n.bdf) <= Level.PXB for g in topo.gpus)
    )
    return Result(
        "gpudirect.storage",
        Status.OK,
        "nvidia_fs %s loaded; %d NVMe drives at PXB or better to a GPU"
        % (state.nvidia_fs_version or "(no version)", local),
        details={"nvme": [n.name for n in topo.nvmes]},
    )
