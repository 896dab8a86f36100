"""The PCIe tree from sysfs, `nvidia-smi topo -m` style path levels, and PCI config-space parsers.

Where the data comes from: ``/sys/bus/pci/devices/<bdf>`` is a symlink into
``/sys/devices/pci<domain>:<bus>/<root port>/<switch upstream>/<switch downstream>/<bdf>``; the
chain of addresses in that path is the device's place in the tree (what `lspci -tv` draws), the
``pci<domain>:<bus>`` directory is its host bridge. ``numa_node`` and ``local_cpulist`` sit next to
it. ``config`` is the binary configuration space (`lspci -xxxx`): only its first 64 bytes are
readable without root, so extended capabilities such as ACS need root.

Levels are the ones `nvidia-smi topo -m` prints and NCCL uses (NCCL_NET_GDR_LEVEL):
PIX (at most one PCIe switch between the two), PXB (several switches, no host bridge),
PHB (through a CPU host bridge), NODE (different host bridges, same NUMA node), SYS (across the
inter-socket link). Smaller is closer.
"""

from __future__ import annotations

import enum
import re
import struct

from ..core.lazyre import lazy_compile
from ..core.structs import Struct, field
from .host import Host, HostError, ParseError, parse_cpulist

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Dict, Iterable, List, Optional, Tuple

PCI_DEVICES = "/sys/bus/pci/devices"
_BDF = lazy_compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")

# PCI Express capability: device/port type in bits 7:4 of the capabilities register.
CAP_ID_EXP = 0x10
PORT_ENDPOINT, PORT_ROOT, PORT_UPSTREAM, PORT_DOWNSTREAM = 0x0, 0x4, 0x5, 0x6
PORT_PCI_BRIDGE = (
    0x7  # PCI Express to PCI/PCI-X bridge: one bridge, devices behind it share its secondary bus
)
ECAP_ID_ACS = 0x000D
# ACS control register bits (PCIe Base spec 7.7.8), named as `lspci -vvv` prints them in ACSCtl.
ACS_BITS = (
    ("SrcValid", 0x01),
    ("TransBlk", 0x02),
    ("ReqRedir", 0x04),
    ("CmpltRedir", 0x08),
    ("UpstreamFwd", 0x10),
    ("EgressCtrl", 0x20),
    ("DirectTrans", 0x40),
)


class Level(enum.IntEnum):
    """Path between two PCI devices, closest first (the numbers are NVML's nvmlGpuTopologyLevel_t)."""

    PIX = 10
    PXB = 20
    PHB = 30
    NODE = 40
    SYS = 50

    @classmethod
    def parse(cls, text: str) -> "Level":
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(
                "%r is not a topology level (one of %s)" % (text, ", ".join(m.name for m in cls))
            ) from None

    @classmethod
    def from_nvml(cls, value: int) -> Optional["Level"]:
        """NVML_TOPOLOGY_SINGLE=10 .. SYSTEM=50; INTERNAL (0, same board) counts as PIX."""
        if value == 0:
            return cls.PIX
        return cls(value) if value in cls._value2member_map_ else None


class PciNode(Struct):
    bdf: str
    chain: Tuple[str, ...]  # addresses from the root port (first) down to this device (last)
    host_bridge: (
        str  # "pci0000:15": the sysfs directory of the host bridge (the innermost, below VMD)
    )
    numa_node: int  # -1 when the platform does not say (single-socket machines), or not read (read_pci_tree)
    local_cpus: frozenset
    config: bytes = field(default=b"", repr=False, compare=False)  # b"" when unreadable
    config_error: Optional[str] = None
    locality: Optional[int] = (
        None  # numa_node, or when that is -1 the nearest bridge's above it (None: numa_node)
    )

    @property
    def parent(self) -> Optional[str]:
        return self.chain[-2] if len(self.chain) > 1 else None

    @property
    def node(self) -> int:
        """The NUMA node the device's traffic enters the CPUs at: its own, else its nearest bridge's, else -1."""
        return self.numa_node if self.locality is None else self.locality


class PciTree(Struct):
    nodes: Dict[str, PciNode]

    def get(self, bdf: str) -> Optional[PciNode]:
        return self.nodes.get(bdf)

    def level(self, a: str, b: str) -> Level:
        """path_level of the devices a and b, remembered per pair: a tree does not change once read,
        and the topology checks ask for ~660 paths on the 8-GPU example node, many of them again
        (their bridges' port types parsed from config space each time: ~1 ms of the check process)."""
        levels = self.__dict__.get("_levels")
        if levels is None:
            levels = {}
            object.__setattr__(self, "_levels", levels)  # a cache, not a field: not compared
        level = levels.get((a, b))
        if level is None:
            level = levels[(a, b)] = path_level(self.nodes[a], self.nodes[b], self.port_type)
        return level

    def bridges_between(self, a: str, b: str) -> List[str]:
        """Bridges a peer-to-peer transfer between a and b passes (empty across host bridges)."""
        na, nb = self.nodes[a], self.nodes[b]
        if na.host_bridge != nb.host_bridge:
            return []
        common = _common_prefix(na.chain, nb.chain)
        start = max(len(common) - 1, 0)
        seen = list(dict.fromkeys(na.chain[start:-1] + nb.chain[start:-1]))
        return [bdf for bdf in seen if bdf in self.nodes]

    def port_type(self, bdf: str) -> Optional[int]:
        node = self.nodes.get(bdf)
        return pcie_port_type(node.config) if node is not None and node.config else None


def read_pci_tree(
    host: Host, with_config: Iterable[str] = (), locality_for: Optional[Iterable[str]] = None
) -> PciTree:
    """Every device under /sys/bus/pci/devices with its chain; config space for bridges and `with_config`.

    numa_node and local_cpulist are read for the devices in `locality_for` (default: all). Levels
    only compare endpoints (GPUs, NICs, NVMe drives); reading both files for every bridge and
    function was two reads per device that nothing used, the largest part of the per-device cost.
    Devices left out get numa_node -1 and no local CPUs.
    """
    wanted = set(with_config)
    local = None if locality_for is None else {bdf.lower() for bdf in locality_for}
    nodes: Dict[str, PciNode] = {}
    for bdf in host.listdir(PCI_DEVICES, default=[]):
        base = "%s/%s" % (PCI_DEVICES, bdf)
        real = host.realpath(base)
        parts = [p.lower() for p in real.split("/")]
        # The innermost host bridge: a VMD domain's root bus (pci10000:00) sits below the VMD endpoint of
        # its parent domain (/sys/devices/pci0000:d7/0000:d7:05.5/pci10001:00/10001:00:00.0/10001:01:00.0).
        top = max((i for i, p in enumerate(parts) if p.startswith("pci") and ":" in p), default=-1)
        chain = tuple(p for p in parts[top + 1 :] if _BDF.match(p))
        if not chain or chain[-1] != bdf.lower():
            continue  # not a PCI function path we understand (virtual functions in odd places): leave it out
        numa, cpus, node = -1, frozenset(), None
        if local is None or bdf.lower() in local:
            numa = host.read_int(base + "/numa_node", default=-1)
            cpus = parse_cpulist(
                host.read_text(base + "/local_cpulist", default=""), base + "/local_cpulist"
            )
            if numa < 0:
                node = _bridge_locality(host, chain)
        nodes[bdf.lower()] = PciNode(
            bdf.lower(), chain, parts[top] if top >= 0 else "?", numa, cpus, locality=node
        )
    is_bridge = {b for n in nodes.values() for b in n.chain[:-1]}
    for bdf in list(nodes):
        if bdf in is_bridge or bdf in wanted:
            nodes[bdf] = _with_config(host, nodes[bdf])
    return PciTree(nodes)


def _bridge_locality(host: Host, chain: Tuple[str, ...]) -> int:
    """For a device that reports no NUMA node: the node of the nearest bridge above it that reports one.

    Linux gives every device the node of its host bridge, so this finds one only where firmware or
    an admin set a bridge's node (its numa_node file is writable); -1 when none knows.
    """
    for bridge in reversed(chain[:-1]):
        numa = host.read_int("%s/%s/numa_node" % (PCI_DEVICES, bridge), default=-1)
        if numa >= 0:
            return numa
    return -1


def _with_config(host: Host, node: PciNode) -> PciNode:
    path = "%s/%s/config" % (PCI_DEVICES, node.bdf)
    try:
        data = host.read_bytes(path, max_bytes=4096)
        error = (
            None
            if len(data) > 0x100
            else (
                "only %d bytes of config space readable: extended capabilities need root"
                % len(data)
            )
        )
    except HostError as exc:
        data, error = b"", str(exc)
    return PciNode(
        node.bdf,
        node.chain,
        node.host_bridge,
        node.numa_node,
        node.local_cpus,
        data,
        error,
        node.locality,
    )


def _common_prefix(a: Tuple[str, ...], b: Tuple[str, ...]) -> Tuple[str, ...]:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def path_level(a: PciNode, b: PciNode, port_type=lambda bdf: None) -> Level:
    """Classify the path between two devices like `nvidia-smi topo -m`.

    Different host bridges: NODE when both sit on the same NUMA node, else SYS - by NUMA node, not
    by socket, as the driver decides (a DGX A100 in NPS4 mode shows SYS between GPUs and NICs of two
    NUMA nodes on one socket: NVIDIA/nccl#1505). A device reporting no node (numa_node -1) takes the
    node of the nearest bridge above it that reports one; where none does, the two devices' local
    CPU sets decide (what `nvidia-smi topo -m` prints as "CPU Affinity"; Linux gives a -1 device
    every CPU): equal -> NODE, different -> SYS. So -1 next to a real node is SYS on a multi-node
    machine, never a NODE by default; two -1 devices (no NUMA information at all) are NODE.
    Same host bridge, different root ports: PHB. Below one root port: count the PCIe switches and
    bridges the path crosses (a switch counts once, by its upstream port): at most one is PIX, more
    is PXB. A bridge's port type comes from its config space when readable, else from its depth
    (root port, upstream, downstream, upstream, ... is how PCIe links nest).
    """
    if a.host_bridge != b.host_bridge:
        na, nb = a.node, b.node
        same_node = na == nb if na >= 0 and nb >= 0 else a.local_cpus == b.local_cpus
        return Level.NODE if same_node else Level.SYS
    common = _common_prefix(a.chain, b.chain)
    if not common:
        return Level.PHB
    on_path = list(dict.fromkeys(a.chain[len(common) - 1 : -1] + b.chain[len(common) : -1]))
    depth = {bdf: i for i, bdf in enumerate(a.chain)}
    depth.update({bdf: i for i, bdf in enumerate(b.chain)})
    switches = 0
    for bdf in on_path:
        kind = port_type(bdf)
        if kind is None:
            kind = (
                PORT_ROOT
                if depth[bdf] == 0
                else (PORT_UPSTREAM if depth[bdf] % 2 else PORT_DOWNSTREAM)
            )
        switches += kind in (PORT_UPSTREAM, PORT_PCI_BRIDGE)
    return Level.PIX if switches <= 1 else Level.PXB


# -- config space --------------------------------------------------------------------------------


def capabilities(cfg: bytes) -> Dict[int, int]:
    """{capability id: offset} of the classic capability list (pointer at 0x34)."""
    found: Dict[int, int] = {}
    if len(cfg) < 0x40 or not (struct.unpack_from("<H", cfg, 0x06)[0] & 0x10):
        return found
    offset, hops = cfg[0x34] & 0xFC, 0
    while offset and offset + 2 <= len(cfg) and hops < 48:
        found.setdefault(cfg[offset], offset)
        offset, hops = cfg[offset + 1] & 0xFC, hops + 1
    return found


def extended_capabilities(cfg: bytes) -> Dict[int, int]:
    """{extended capability id: offset}, walking the list from 0x100 (PCIe config space only)."""
    found: Dict[int, int] = {}
    offset, hops = 0x100, 0
    while offset >= 0x100 and offset + 4 <= len(cfg) and hops < 64:
        header = struct.unpack_from("<I", cfg, offset)[0]
        if header in (0, 0xFFFFFFFF):
            break
        found.setdefault(header & 0xFFFF, offset)
        offset, hops = (header >> 20) & 0xFFC, hops + 1
    return found


def pcie_port_type(cfg: bytes) -> Optional[int]:
    """Device/port type from the PCI Express capability (`lspci -vvv`: 'Express (v2) Root Port')."""
    offset = capabilities(cfg).get(CAP_ID_EXP)
    if offset is None or offset + 4 > len(cfg):
        return None
    return (struct.unpack_from("<H", cfg, offset + 2)[0] >> 4) & 0xF


def acs_control(cfg: bytes) -> Optional[int]:
    """The ACS control register, or None when the device has no ACS capability (or it is unreadable)."""
    offset = extended_capabilities(cfg).get(ECAP_ID_ACS)
    if offset is None or offset + 8 > len(cfg):
        return None
    return struct.unpack_from("<H", cfg, offset + 6)[0]


def acs_flags(control: int) -> Dict[str, bool]:
    """{'SrcValid': True, 'ReqRedir': False, ...} as `lspci -vvv` shows ACSCtl."""
    return {name: bool(control & bit) for name, bit in ACS_BITS}


def parse_lspci_hex_dump(text: str, source: str = "<lspci -xxxx>") -> bytes:
    """`lspci -xxxx -s BDF` output ('000: 86 80 2a 35 ...' lines; a device title line is skipped) -> bytes."""
    data = bytearray()
    for line in text.splitlines():
        line = line.strip()
        if not line or not re.match(r"^[0-9a-fA-F]{2,3}:\s", line):
            continue  # the '0000:15:01.0 PCI bridge: ...' title line
        address, _, rest = line.partition(":")
        if int(address, 16) != len(data):
            raise ParseError(
                source, line, "rows at consecutive offsets (expected %03x)" % len(data)
            )
        try:
            data.extend(int(word, 16) for word in rest.split())
        except ValueError:
            raise ParseError(source, line, "'<offset>: <hex bytes>'") from None
    return bytes(data)


def parse_lspci_acsctl(text: str, source: str = "<lspci -vvv>") -> Optional[Dict[str, bool]]:
    """The ACSCtl line of `lspci -vvv` ('ACSCtl: SrcValid+ TransBlk- ReqRedir+ ...') -> flags; None if absent."""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("ACSCtl:"):
            flags: Dict[str, bool] = {}
            for word in line[len("ACSCtl:") :].split():
                if word[-1:] not in "+-" or len(word) < 2:
                    raise ParseError(source, line, "'Name+' or 'Name-' words")
                flags[word[:-1]] = word.endswith("+")
            return flags
    return None


def format_bdf_chain(chain: Iterable[str]) -> str:
    return " -> ".join(chain)
