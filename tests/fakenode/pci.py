"""PCI topology of a spec (root ports, switch ports, endpoints) and binary config space.

Config space follows the PCI Local Bus / PCIe Base specs so ``lspci``-style parsers work:
capability list at 0x34 (Power Management 0x01 -> PCI Express 0x10), extended capabilities from 0x100
(AER 0x0001 -> ACS 0x000D on root ports and switch downstream ports).
"""

from __future__ import annotations

import struct
from typing import Any, Dict, List, Optional, Tuple

# PCIe device/port types (PCIe capability register bits 7:4); 0x7 = PCI Express to PCI/PCI-X bridge
PORT_ENDPOINT, PORT_ROOT, PORT_UPSTREAM, PORT_DOWNSTREAM, PORT_PCI_BRIDGE = 0x0, 0x4, 0x5, 0x6, 0x7

# ACS capability/control bits
ACS_SV, ACS_TB, ACS_RR, ACS_CR, ACS_UF, ACS_EC, ACS_DT = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40
ACS_CAP_DEFAULT = ACS_SV | ACS_TB | ACS_RR | ACS_CR | ACS_UF | ACS_DT
ACS_REDIRECT = (
    ACS_SV | ACS_RR | ACS_CR | ACS_UF
)  # what the kernel enables when an IOMMU asks for ACS

CAP_PM, CAP_EXP, ECAP_AER, ECAP_ACS = 0x40, 0x60, 0x100, 0x148
LINK_SPEED = {
    1: "2.5 GT/s PCIe",
    2: "5.0 GT/s PCIe",
    3: "8.0 GT/s PCIe",
    4: "16.0 GT/s PCIe",
    5: "32.0 GT/s PCIe",
    6: "64.0 GT/s PCIe",
}


def bdf_bus(bdf: str) -> int:
    return int(bdf.split(":")[-2], 16)


def bdf_domain(bdf: str) -> str:
    """'0000' of '0000:18:00.0'; every digit of a wider one ('10000' of '10000:01:00.0', VMD)."""
    return bdf.rsplit(":", 2)[0]


def config_space(dev: Dict[str, Any]) -> bytes:
    """4096 bytes of config space for one device dict produced by ``topology``."""
    cfg = bytearray(4096)
    bridge = dev["port_type"] != PORT_ENDPOINT
    struct.pack_into(
        "<HHHH", cfg, 0x00, dev["vendor"], dev["device"], 0x0406 if not bridge else 0x0407, 0x0010
    )
    cls = dev["class"]
    struct.pack_into(
        "<BBBB", cfg, 0x08, dev.get("revision", 0xA1), cls & 0xFF, (cls >> 8) & 0xFF, cls >> 16
    )
    cfg[0x0E] = 0x01 if bridge else 0x00
    cfg[0x34] = CAP_PM
    if bridge:
        struct.pack_into(
            "<BBBB", cfg, 0x18, bdf_bus(dev["bdf"]), dev["secondary"], dev["subordinate"], 0
        )
    else:
        struct.pack_into(
            "<HH", cfg, 0x2C, dev.get("subsys_vendor", dev["vendor"]), dev.get("subsys_device", 0)
        )
    cfg[0x3D] = 0x01  # interrupt pin INTA
    # Power Management capability -> PCI Express capability
    struct.pack_into("<BBHH", cfg, CAP_PM, 0x01, CAP_EXP, 0x0003, 0x0008)
    pcie_caps = (
        0x2
        | (dev["port_type"] << 4)
        | (0x100 if dev["port_type"] in (PORT_ROOT, PORT_DOWNSTREAM) else 0)
    )
    struct.pack_into("<BBH", cfg, CAP_EXP, 0x10, 0x00, pcie_caps)
    struct.pack_into("<I", cfg, CAP_EXP + 0x04, 0x00008FC2)  # DevCap: MPS 512, RBER
    struct.pack_into("<HH", cfg, CAP_EXP + 0x08, 0x5937, 0x0000)  # DevCtl, DevSta
    port_num = dev.get("port_number", 0)
    lnkcap = dev["max_gen"] | (dev["max_width"] << 4) | (0x3 << 10) | (port_num << 24)
    struct.pack_into("<I", cfg, CAP_EXP + 0x0C, lnkcap)
    struct.pack_into("<HH", cfg, CAP_EXP + 0x10, 0x0040, dev["gen"] | (dev["width"] << 4) | 0x2000)
    struct.pack_into(
        "<I", cfg, CAP_EXP + 0x2C, sum(1 << g for g in range(1, dev["max_gen"] + 1))
    )  # LnkCap2
    struct.pack_into("<H", cfg, CAP_EXP + 0x30, dev["max_gen"])  # LnkCtl2 target speed
    # Extended capabilities: AER -> ACS (bridges that forward P2P: root ports, downstream ports)
    has_acs = dev["port_type"] in (PORT_ROOT, PORT_DOWNSTREAM)
    struct.pack_into("<I", cfg, ECAP_AER, ECAP_AER_HDR(ECAP_ACS if has_acs else 0))
    if has_acs:
        struct.pack_into("<I", cfg, ECAP_ACS, 0x000D | (1 << 16))
        struct.pack_into("<HH", cfg, ECAP_ACS + 4, ACS_CAP_DEFAULT, dev["acs_ctrl"])
    return bytes(cfg)


def ECAP_AER_HDR(next_off: int) -> int:  # noqa: N802 - mirrors the spec's register name
    return 0x0001 | (2 << 16) | (next_off << 20)


def parse_ext_caps(cfg: bytes) -> Dict[int, int]:
    """{extended capability id: offset}: a reference parser (used by the tests)."""
    out, off, seen = {}, 0x100, set()
    while off and off not in seen and off + 4 <= len(cfg):
        seen.add(off)
        hdr = struct.unpack_from("<I", cfg, off)[0]
        if hdr == 0:
            break
        out[hdr & 0xFFFF] = off
        off = hdr >> 20
    return out


class BusNumberingError(ValueError):
    """The spec's PCI addresses cannot be a real bus hierarchy; the message names the device."""


def topology(spec: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Every PCI function the spec implies, keyed by address, parents before children.

    Each value: bdf, parent (bdf or None for devices on the host bridge), port_type, vendor, device,
    class, numa_node, cpulist, gen/width/max_gen/max_width, driver, kind ('gpu'|'nic'|'nvme'|'bridge'),
    key (spec id), acs_ctrl (bridges), secondary/subordinate (bridges), switch (the switch or bridge
    an endpoint or port belongs to; '' for root ports and endpoints without one).

    Switches nest: a switch (or a plain bridge, kind "bridge") with a ``parent`` hangs below a
    downstream port generated on that parent, like the DGX-A100's three levels of PCIe switches. A
    bridge's secondary/subordinate bus numbers span exactly what is below it, and the result is
    checked like a real enumeration (BusNumberingError otherwise).
    """
    devs: Dict[str, Dict[str, Any]] = {}
    endpoints = _endpoints(spec)
    below: Dict[
        str, List[Tuple[int, str, Any]]
    ] = {}  # switch -> [(bus, "ep"|"switch", endpoint or name)]
    for ep in endpoints:
        if ep["switch"]:
            below.setdefault(ep["switch"], []).append((bdf_bus(ep["bdf"]), "ep", ep))
    for name, sw in spec["switch"].items():
        if sw["parent"]:
            below.setdefault(sw["parent"], []).append((bdf_bus(sw["upstream"]), "switch", name))
    for name, sw in sorted(spec["switch"].items()):
        if not sw["parent"]:
            _switch_tree(spec, devs, below, name, None)
    for ep in [e for e in endpoints if not e["switch"]]:
        rp = ep["root_port"]
        if rp == "none":
            ep["parent"] = None
            continue
        if rp not in devs:
            c = dict(
                vendor=0x8086,
                device=0x352A,
                numa_node=ep["numa_node"],
                cpulist=ep["cpulist"],
                switch="",
                gen=ep["gen"],
                width=ep["width"],
                max_gen=ep["max_gen"],
                max_width=ep["max_width"],
                kind="bridge",
                key=rp,
                driver="pcieport",
                **{"class": 0x060400},
            )
            _add_bridge(
                devs,
                rp,
                None,
                PORT_ROOT,
                bdf_bus(ep["bdf"]),
                bdf_bus(ep["bdf"]),
                _default_acs(spec),
                c,
            )
        else:
            devs[rp]["subordinate"] = max(devs[rp]["subordinate"], bdf_bus(ep["bdf"]))
        ep["parent"] = rp
    for ep in sorted(endpoints, key=lambda e: e["bdf"]):
        devs[ep["bdf"]] = ep
    check_bus_numbers(devs)
    return devs


def _default_acs(spec: Dict[str, Any]) -> int:
    return ACS_REDIRECT if spec["pcie"]["acs_redirect"] else 0


def _subtree_max(
    spec: Dict[str, Any], below: Dict[str, List[Tuple[int, str, Any]]], name: str
) -> int:
    top = bdf_bus(spec["switch"][name]["upstream"])
    out = top + 1 if spec["switch"][name]["kind"] == "switch" else top
    for bus, what, item in below.get(name, []):
        out = max(out, _subtree_max(spec, below, item) if what == "switch" else bus)
    return out


def _switch_tree(
    spec: Dict[str, Any],
    devs: Dict[str, Dict[str, Any]],
    below: Dict[str, List[Tuple[int, str, Any]]],
    name: str,
    parent: Optional[str],
) -> None:
    """The switch (or bridge) `name` and everything below it; with no parent, also its root port."""
    sw = spec["switch"][name]
    acs = (
        sw["acs_ctrl"]
        if sw["acs_ctrl"] >= 0
        else (
            _default_acs(spec)
            if sw["acs_redirect"] is None
            else (ACS_REDIRECT if sw["acs_redirect"] else 0)
        )
    )
    up, up_bus, last = sw["upstream"], bdf_bus(sw["upstream"]), _subtree_max(spec, below, name)
    common = dict(
        vendor=sw["vendor"],
        device=sw["device"],
        numa_node=sw["numa_node"],
        switch=name,
        cpulist=sw["cpulist"],
        gen=sw["link_gen"],
        width=sw["link_width"],
        max_gen=sw["link_gen"],
        max_width=sw["link_width"],
        kind="bridge",
        key=name,
        driver="pcieport",
        **{"class": 0x060400},
    )
    if parent is None:  # a CPU root port above it: Intel's, as in the example nodes
        _add_bridge(
            devs,
            sw["root_port"],
            None,
            PORT_ROOT,
            up_bus,
            last,
            acs,
            dict(common, vendor=0x8086, device=0x352A, switch=""),
        )
        parent = sw["root_port"]
    children = sorted(below.get(name, []), key=lambda c: c[0])
    if sw["kind"] == "bridge":  # one function; everything below it sits on its secondary bus
        buses = sorted({bus for bus, _, _ in children}) or [up_bus + 1]
        _add_bridge(devs, up, parent, PORT_PCI_BRIDGE, buses[0], last, 0, common)
        for _bus, what, item in children:
            if what == "ep":
                item["parent"] = up
            else:
                _switch_tree(spec, devs, below, item, up)
        return
    _add_bridge(devs, up, parent, PORT_UPSTREAM, up_bus + 1, last, 0, common)
    dom = bdf_domain(up)
    for slot, (bus, what, item) in enumerate(children):
        ds = "%s:%02x:%02x.0" % (dom, up_bus + 1, slot)
        gen, width = (
            (item["gen"], item["width"]) if what == "ep" else (sw["link_gen"], sw["link_width"])
        )
        sub = bus if what == "ep" else _subtree_max(spec, below, item)
        _add_bridge(
            devs,
            ds,
            up,
            PORT_DOWNSTREAM,
            bus,
            sub,
            acs,
            dict(common, gen=gen, width=width),
            port_number=slot,
        )
        if what == "ep":
            item["parent"] = ds
        else:
            _switch_tree(spec, devs, below, item, ds)


def _add_bridge(
    devs: Dict[str, Dict[str, Any]],
    bdf: str,
    parent: Optional[str],
    port_type: int,
    secondary: int,
    subordinate: int,
    acs: int,
    common: Dict[str, Any],
    port_number: int = 0,
) -> None:
    if bdf in devs:
        raise BusNumberingError(
            "%s is used twice (two bridges, or a bridge and a downstream port generated at the "
            "same address)" % bdf
        )
    devs[bdf] = dict(
        common,
        bdf=bdf,
        parent=parent,
        port_type=port_type,
        secondary=secondary,
        subordinate=subordinate,
        acs_ctrl=acs,
        port_number=port_number,
    )


def check_bus_numbers(devs: Dict[str, Dict[str, Any]]) -> None:
    """What enumeration guarantees on a real machine: a device sits on its parent bridge's secondary bus,
    below that bus and within its subordinate range, bridges below one parent cover disjoint bus
    ranges, and no bus is the secondary of two bridges."""
    owner: Dict[Tuple[str, int], str] = {}
    for bdf, d in devs.items():
        parent = devs.get(d["parent"]) if d["parent"] else None
        if parent is not None:
            if bdf_domain(bdf) != bdf_domain(parent["bdf"]) or bdf_bus(bdf) != parent["secondary"]:
                raise BusNumberingError(
                    "%s is below %s, whose secondary bus is %s:%02x"
                    % (bdf, parent["bdf"], bdf_domain(parent["bdf"]), parent["secondary"])
                )
        ancestor = parent
        while ancestor is not None:
            if not ancestor["secondary"] <= bdf_bus(bdf) <= ancestor["subordinate"]:
                raise BusNumberingError(
                    "%s lies outside the bus range [%02x-%02x] of %s above it"
                    % (bdf, ancestor["secondary"], ancestor["subordinate"], ancestor["bdf"])
                )
            ancestor = devs.get(ancestor["parent"]) if ancestor["parent"] else None
        if d["port_type"] != PORT_ENDPOINT:
            if not bdf_bus(bdf) < d["secondary"] <= d["subordinate"]:
                raise BusNumberingError(
                    "bridge %s has secondary/subordinate %02x/%02x: they must be above its own bus"
                    % (bdf, d["secondary"], d["subordinate"])
                )
            key = (bdf_domain(bdf), d["secondary"])
            if key in owner:
                raise BusNumberingError(
                    "bus %s:%02x is the secondary bus of both %s and %s"
                    % (key[0], key[1], owner[key], bdf)
                )
            owner[key] = bdf
    siblings: Dict[Tuple[Optional[str], str], List[Dict[str, Any]]] = {}
    for d in devs.values():
        if d["port_type"] != PORT_ENDPOINT:
            siblings.setdefault((d["parent"], bdf_domain(d["bdf"])), []).append(d)
    for group in siblings.values():
        ranges = sorted((d["secondary"], d["subordinate"], d["bdf"]) for d in group)
        for (_lo1, hi1, a), (lo2, _hi2, b) in zip(
            ranges, ranges[1:]
        ):  # sorted by start: adjacent ones suffice
            if lo2 <= hi1:
                raise BusNumberingError("bridges %s and %s cover overlapping bus ranges" % (a, b))


def _endpoints(spec: Dict[str, Any]) -> List[Dict[str, Any]]:
    out = []
    for idx, g in spec["gpu"].items():
        out.append(
            dict(
                kind="gpu",
                key=idx,
                bdf=g["pci"],
                switch=g["switch"],
                root_port=g["root_port"],
                vendor=g["pci_vendor_id"],
                device=g["pci_device_id"],
                numa_node=g["numa_node"],
                cpulist=g["cpulist"],
                gen=g["pcie"]["gen"],
                width=g["pcie"]["width"],
                max_gen=g["pcie"]["max_gen"],
                max_width=g["pcie"]["max_width"],
                driver=g["driver"],
                subsys_vendor=g["pci_subsystem_id"] & 0xFFFF,
                subsys_device=g["pci_subsystem_id"] >> 16,
                port_type=PORT_ENDPOINT,
                **{"class": g["pci_class"]},
            )
        )
    for kind in ("nic", "nvme"):
        for key, d in spec[kind].items():
            cls = d["class"] if kind == "nic" else 0x010802
            out.append(
                dict(
                    kind=kind,
                    key=key,
                    bdf=d["pci"],
                    switch=d["switch"],
                    root_port=d["root_port"],
                    vendor=d["vendor"],
                    device=d["device"],
                    numa_node=d["numa_node"],
                    cpulist=d["cpulist"],
                    gen=d["link_gen"],
                    width=d["link_width"],
                    max_gen=d["max_link_gen"],
                    max_width=d["max_link_width"],
                    driver=d["driver"],
                    subsys_vendor=d["vendor"],
                    subsys_device=0x0007,
                    port_type=PORT_ENDPOINT,
                    **{"class": cls},
                )
            )
    return out


def sysfs_path(devs: Dict[str, Dict[str, Any]], bdf: str) -> str:
    """'/sys/devices/pci0000:15/0000:15:01.0/.../<bdf>' for a device in ``devs``."""
    chain = []
    cur: Optional[str] = bdf
    while cur is not None:
        chain.append(cur)
        cur = devs[cur]["parent"]
    top = chain[-1]
    return "/sys/devices/pci%s:%02x/%s" % (bdf_domain(top), bdf_bus(top), "/".join(reversed(chain)))


def cpumask(cpus: List[int], nr_cpus: int) -> str:
    """Kernel bitmap format: comma-separated 32-bit hex words, most significant first."""
    words = (max(nr_cpus, 1) + 31) // 32
    val = 0
    for c in cpus:
        val |= 1 << c
    return ",".join("%08x" % ((val >> (32 * i)) & 0xFFFFFFFF) for i in reversed(range(words)))


# -- what the driver answers for nvmlDeviceGetTopologyCommonAncestor -------------------------------------
# nvml.h nvmlGpuTopologyLevel_t; nvidia-smi topo -m prints them as X, PIX, PXB, PHB, NODE, SYS.
NVML_INTERNAL, NVML_SINGLE, NVML_MULTIPLE, NVML_HOSTBRIDGE, NVML_NODE, NVML_SYSTEM = (
    0,
    10,
    20,
    30,
    40,
    50,
)


def chain(devs: Dict[str, Dict[str, Any]], bdf: str) -> List[str]:
    """Addresses from the top of the device's tree (its root port, or itself on a host bridge) down to it."""
    out: List[str] = []
    cur: Optional[str] = bdf
    while cur is not None:
        out.append(cur)
        cur = devs[cur]["parent"]
    return out[::-1]


def locality(devs: Dict[str, Dict[str, Any]], bdf: str) -> int:
    """The device's NUMA node; when it reports none (-1), the nearest bridge above it that does; else -1."""
    for cur in reversed(chain(devs, bdf)):
        if devs[cur]["numa_node"] >= 0:
            return devs[cur]["numa_node"]
    return -1


def nvml_level(devs: Dict[str, Dict[str, Any]], a: str, b: str) -> int:
    """The level NVML reports between two devices, decided the way `nvidia-smi topo -m` describes it.

    Below one root port: PIX when the path crosses at most one PCIe switch or bridge, else PXB.
    Different root ports of one host bridge: PHB. Different host bridges: NODE when both are on the
    same NUMA node, SYS otherwise - by NUMA node, not by socket: a DGX A100 (2 sockets, NPS4, 8 NUMA
    nodes) shows SYS between GPU0 (node 3) and the NICs of node 1 on the same socket (NVIDIA/nccl
    issue #1505, `nvidia-smi topo -m`). A device that reports no node (-1) takes the node of the
    nearest bridge above it; when none has one, the devices' CPU affinity (local_cpulist: every CPU
    for -1) decides, as for `nvidia-smi topo -m`'s "CPU Affinity" column: NODE when equal, else SYS.
    """
    if a == b:
        return NVML_INTERNAL
    ca, cb = chain(devs, a), chain(devs, b)
    common = 0
    while common < min(len(ca), len(cb)) and ca[common] == cb[common]:
        common += 1
    if common:
        crossed = ca[common - 1 : -1] + cb[common:-1]
        bridges = {
            devs[x]["switch"] or x
            for x in crossed
            if devs[x]["port_type"] in (PORT_UPSTREAM, PORT_DOWNSTREAM, PORT_PCI_BRIDGE)
        }
        return NVML_SINGLE if len(bridges) <= 1 else NVML_MULTIPLE
    if (bdf_domain(ca[0]), bdf_bus(ca[0])) == (bdf_domain(cb[0]), bdf_bus(cb[0])):
        return NVML_HOSTBRIDGE
    na, nb = locality(devs, a), locality(devs, b)
    if na >= 0 and nb >= 0:
        return NVML_NODE if na == nb else NVML_SYSTEM
    return NVML_NODE if devs[a]["cpulist"] == devs[b]["cpulist"] else NVML_SYSTEM


def nvml_levels(spec: Dict[str, Any]) -> Dict[Tuple[int, int], int]:
    """{(gpu a, gpu b): level} for every pair of the spec's GPUs."""
    devs = topology(spec)
    gpus = {idx: g["pci"] for idx, g in spec["gpu"].items()}
    return {(i, j): nvml_level(devs, gpus[i], gpus[j]) for i in gpus for j in gpus}
