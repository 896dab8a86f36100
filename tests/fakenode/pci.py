"""PCI topology of a spec (root ports, switch ports, endpoints) and binary config space.

Config space follows the PCI Local Bus / PCIe Base specs so ``lspci``-style parsers work:
capability list at 0x34 (Power Management 0x01 -> PCI Express 0x10), extended capabilities from 0x100
(AER 0x0001 -> ACS 0x000D on root ports and switch downstream ports).
"""

from __future__ import annotations

import struct
from typing import Any, Dict, List, Optional

# PCIe device/port types (PCIe capability register bits 7:4)
PORT_ENDPOINT, PORT_ROOT, PORT_UPSTREAM, PORT_DOWNSTREAM = 0x0, 0x4, 0x5, 0x6

# ACS capability/control bits
ACS_SV, ACS_TB, ACS_RR, ACS_CR, ACS_UF, ACS_EC, ACS_DT = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40
ACS_CAP_DEFAULT = ACS_SV | ACS_TB | ACS_RR | ACS_CR | ACS_UF | ACS_DT
ACS_REDIRECT = ACS_SV | ACS_RR | ACS_CR | ACS_UF      # what the kernel enables when an IOMMU asks for ACS

CAP_PM, CAP_EXP, ECAP_AER, ECAP_ACS = 0x40, 0x60, 0x100, 0x148
LINK_SPEED = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe",
              5: "32.0 GT/s PCIe", 6: "64.0 GT/s PCIe"}


def bdf_bus(bdf: str) -> int:
    return int(bdf.split(":")[1], 16)


def config_space(dev: Dict[str, Any]) -> bytes:
    """4096 bytes of config space for one device dict produced by ``topology``."""
    cfg = bytearray(4096)
    bridge = dev["port_type"] != PORT_ENDPOINT
    struct.pack_into("<HHHH", cfg, 0x00, dev["vendor"], dev["device"], 0x0406 if not bridge else 0x0407, 0x0010)
    cls = dev["class"]
    struct.pack_into("<BBBB", cfg, 0x08, dev.get("revision", 0xA1), cls & 0xFF, (cls >> 8) & 0xFF, cls >> 16)
    cfg[0x0E] = 0x01 if bridge else 0x00
    cfg[0x34] = CAP_PM
    if bridge:
        struct.pack_into("<BBBB", cfg, 0x18, bdf_bus(dev["bdf"]), dev["secondary"], dev["subordinate"], 0)
    else:
        struct.pack_into("<HH", cfg, 0x2C, dev.get("subsys_vendor", dev["vendor"]), dev.get("subsys_device", 0))
    cfg[0x3D] = 0x01  # interrupt pin INTA
    # Power Management capability -> PCI Express capability
    struct.pack_into("<BBHH", cfg, CAP_PM, 0x01, CAP_EXP, 0x0003, 0x0008)
    pcie_caps = 0x2 | (dev["port_type"] << 4) | (0x100 if dev["port_type"] in (PORT_ROOT, PORT_DOWNSTREAM) else 0)
    struct.pack_into("<BBH", cfg, CAP_EXP, 0x10, 0x00, pcie_caps)
    struct.pack_into("<I", cfg, CAP_EXP + 0x04, 0x00008FC2)                     # DevCap: MPS 512, RBER
    struct.pack_into("<HH", cfg, CAP_EXP + 0x08, 0x5937, 0x0000)               # DevCtl, DevSta
    port_num = dev.get("port_number", 0)
    lnkcap = dev["max_gen"] | (dev["max_width"] << 4) | (0x3 << 10) | (port_num << 24)
    struct.pack_into("<I", cfg, CAP_EXP + 0x0C, lnkcap)
    struct.pack_into("<HH", cfg, CAP_EXP + 0x10, 0x0040, dev["gen"] | (dev["width"] << 4) | 0x2000)
    struct.pack_into("<I", cfg, CAP_EXP + 0x2C, sum(1 << g for g in range(1, dev["max_gen"] + 1)))  # LnkCap2
    struct.pack_into("<H", cfg, CAP_EXP + 0x30, dev["max_gen"])                 # LnkCtl2 target speed
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


def topology(spec: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Every PCI function the spec implies, keyed by address, parents before children.

    Each value: bdf, parent (bdf or None for devices on the host bridge), port_type, vendor, device,
    class, numa_node, cpulist, gen/width/max_gen/max_width, driver, kind ('gpu'|'nic'|'nvme'|'bridge'),
    key (spec id), acs_ctrl (bridges), secondary/subordinate (bridges), switch (name or '').
    """
    default_acs = ACS_REDIRECT if spec["pcie"]["acs_redirect"] else 0
    devs: Dict[str, Dict[str, Any]] = {}
    endpoints = _endpoints(spec)
    by_switch: Dict[str, List[Dict[str, Any]]] = {}
    for ep in endpoints:
        by_switch.setdefault(ep["switch"], []).append(ep)
    for name, sw in sorted(spec["switch"].items()):
        eps = sorted(by_switch.get(name, []), key=lambda e: e["bdf"])
        acs = sw["acs_ctrl"] if sw["acs_ctrl"] >= 0 else (
            default_acs if sw["acs_redirect"] is None else (ACS_REDIRECT if sw["acs_redirect"] else 0))
        up_bus = bdf_bus(sw["upstream"])
        last = max([bdf_bus(e["bdf"]) for e in eps] + [up_bus + 1])
        common = dict(vendor=sw["vendor"], device=sw["device"], numa_node=sw["numa_node"], switch=name,
                      cpulist=spec["numa"][sw["numa_node"]]["cpulist"] if sw["numa_node"] >= 0 else "",
                      gen=sw["link_gen"], width=sw["link_width"], max_gen=sw["link_gen"],
                      max_width=sw["link_width"], kind="bridge", key=name, driver="pcieport", **{"class": 0x060400})
        _add_bridge(devs, sw["root_port"], None, PORT_ROOT, up_bus, last, acs, common)
        _add_bridge(devs, sw["upstream"], sw["root_port"], PORT_UPSTREAM, up_bus + 1, last, 0, common)
        dom = sw["upstream"][:4]
        for slot, ep in enumerate(eps):
            ds = "%s:%02x:%02x.0" % (dom, up_bus + 1, slot)
            c = dict(common, gen=ep["gen"], width=ep["width"], max_gen=sw["link_gen"], max_width=sw["link_width"])
            _add_bridge(devs, ds, sw["upstream"], PORT_DOWNSTREAM, bdf_bus(ep["bdf"]), bdf_bus(ep["bdf"]), acs, c,
                        port_number=slot)
            ep["parent"] = ds
    for ep in by_switch.get("", []):
        rp = ep["root_port"]
        if rp != "none":
            if rp not in devs:
                c = dict(vendor=0x8086, device=0x352A, numa_node=ep["numa_node"], cpulist=ep["cpulist"], switch="",
                         gen=ep["gen"], width=ep["width"], max_gen=ep["max_gen"], max_width=ep["max_width"],
                         kind="bridge", key=rp, driver="pcieport", **{"class": 0x060400})
                _add_bridge(devs, rp, None, PORT_ROOT, bdf_bus(ep["bdf"]), bdf_bus(ep["bdf"]), default_acs, c)
            else:
                devs[rp]["subordinate"] = max(devs[rp]["subordinate"], bdf_bus(ep["bdf"]))
            ep["parent"] = rp
        else:
            ep["parent"] = None
    for ep in sorted(endpoints, key=lambda e: e["bdf"]):
        devs[ep["bdf"]] = ep
    return devs


def _add_bridge(devs: Dict[str, Dict[str, Any]], bdf: str, parent: Optional[str], port_type: int, secondary: int,
                subordinate: int, acs: int, common: Dict[str, Any], port_number: int = 0) -> None:
    if bdf in devs:
        return
    devs[bdf] = dict(common, bdf=bdf, parent=parent, port_type=port_type, secondary=secondary,
                     subordinate=subordinate, acs_ctrl=acs, port_number=port_number)


def _endpoints(spec: Dict[str, Any]) -> List[Dict[str, Any]]:
    out = []
    for idx, g in spec["gpu"].items():
        out.append(dict(kind="gpu", key=idx, bdf=g["pci"], switch=g["switch"], root_port=g["root_port"],
                        vendor=g["pci_vendor_id"], device=g["pci_device_id"], numa_node=g["numa_node"],
                        cpulist=g["cpulist"], gen=g["pcie"]["gen"], width=g["pcie"]["width"],
                        max_gen=g["pcie"]["max_gen"], max_width=g["pcie"]["max_width"], driver=g["driver"],
                        subsys_vendor=g["pci_subsystem_id"] & 0xFFFF, subsys_device=g["pci_subsystem_id"] >> 16,
                        port_type=PORT_ENDPOINT, **{"class": g["pci_class"]}))
    for kind in ("nic", "nvme"):
        for key, d in spec[kind].items():
            cls = d["class"] if kind == "nic" else 0x010802
            out.append(dict(kind=kind, key=key, bdf=d["pci"], switch=d["switch"], root_port=d["root_port"],
                            vendor=d["vendor"], device=d["device"], numa_node=d["numa_node"], cpulist=d["cpulist"],
                            gen=d["link_gen"], width=d["link_width"], max_gen=d["max_link_gen"],
                            max_width=d["max_link_width"], driver=d["driver"], subsys_vendor=d["vendor"],
                            subsys_device=0x0007, port_type=PORT_ENDPOINT, **{"class": cls}))
    return out


def sysfs_path(devs: Dict[str, Dict[str, Any]], bdf: str) -> str:
    """'/sys/devices/pci0000:15/0000:15:01.0/.../<bdf>' for a device in ``devs``."""
    chain = []
    cur: Optional[str] = bdf
    while cur is not None:
        chain.append(cur)
        cur = devs[cur]["parent"]
    top = chain[-1]
    return "/sys/devices/pci%s:%s/%s" % (top[:4], top[5:7], "/".join(reversed(chain)))


def cpumask(cpus: List[int], nr_cpus: int) -> str:
    """Kernel bitmap format: comma-separated 32-bit hex words, most significant first."""
    words = (max(nr_cpus, 1) + 31) // 32
    val = 0
    for c in cpus:
        val |= 1 << c
    return ",".join("%08x" % ((val >> (32 * i)) & 0xFFFFFFFF) for i in reversed(range(words)))
