"""/sys for a resolved spec: PCI devices, class links, IOMMU, CPU/NUMA topology, modules."""

from __future__ import annotations

from typing import Any, Dict, List

from . import pci
from .fsutil import Tree
from .spec import cpu_location, format_cpulist

DRIVERS_DIR = "/sys/bus/pci/drivers"


def write_sysfs(t: Tree, spec: Dict[str, Any], devs: Dict[str, Dict[str, Any]]) -> Dict[str, str]:
    """Write everything under /sys; returns {bdf: /sys/devices/... path}."""
    paths = {bdf: pci.sysfs_path(devs, bdf) for bdf in devs}
    nr = spec["cpu"]["count"]
    for bdf, d in devs.items():
        _pci_device(t, d, paths[bdf], nr)
    for nic in spec["nic"].values():
        _nic(t, nic, paths[nic["pci"]])
    for name, nv in sorted(spec["nvme"].items()):
        base = "%s/nvme/%s" % (paths[nv["pci"]], name)
        for k in ("model", "serial", "firmware_rev"):
            t.write("%s/%s" % (base, k), nv[k])
        t.write(base + "/state", "live")
        t.link(base + "/device", paths[nv["pci"]])
        t.link("/sys/class/nvme/" + name, base)
    t.mkdir("/sys/devices/virtual/net/lo")
    t.write("/sys/devices/virtual/net/lo/operstate", "unknown")
    t.link("/sys/class/net/lo", "/sys/devices/virtual/net/lo")
    _iommu(t, spec, devs, paths)
    _cpus(t, spec)
    _numa(t, spec)
    _edac(t, spec)
    _modules(t, spec)
    _misc(t, spec)
    return paths


def _pci_device(t: Tree, d: Dict[str, Any], path: str, nr_cpus: int) -> None:
    w = lambda name, val: t.write("%s/%s" % (path, name), val)  # noqa: E731
    w("vendor", "0x%04x" % d["vendor"])
    w("device", "0x%04x" % d["device"])
    w("subsystem_vendor", "0x%04x" % d.get("subsys_vendor", d["vendor"]))
    w("subsystem_device", "0x%04x" % d.get("subsys_device", 0))
    w("class", "0x%06x" % d["class"])
    w("revision", "0xa1")
    w("numa_node", d["numa_node"])
    cpus = _cpus_of(d["cpulist"], nr_cpus)
    w("local_cpulist", format_cpulist(cpus))
    w("local_cpus", pci.cpumask(cpus, nr_cpus))
    w("current_link_speed", pci.LINK_SPEED.get(d["gen"], "Unknown"))
    w("current_link_width", d["width"])
    w("max_link_speed", pci.LINK_SPEED.get(d["max_gen"], "Unknown"))
    w("max_link_width", d["max_width"])
    w("enable", 1)
    w("irq", 0)
    w("d3cold_allowed", 1)
    w("config", pci.config_space(d))
    if d["port_type"] != pci.PORT_ENDPOINT:
        w("secondary_bus_number", d["secondary"])
        w("subordinate_bus_number", d["subordinate"])
    t.link(path + "/subsystem", "/sys/bus/pci")
    t.link("/sys/bus/pci/devices/" + d["bdf"], path)
    if d.get("driver"):
        drv = "%s/%s" % (DRIVERS_DIR, d["driver"])
        t.mkdir(drv)
        t.link(path + "/driver", drv)
        t.link("%s/%s" % (drv, d["bdf"]), path)


def _cpus_of(cpulist: str, nr: int) -> List[int]:
    from .spec import parse_cpulist

    return parse_cpulist(cpulist) if cpulist else list(range(nr))


def _nic(t: Tree, nic: Dict[str, Any], dev: str) -> None:
    net = "%s/net/%s" % (dev, nic["netdev"])
    t.write(net + "/operstate", nic["operstate"])
    t.write(net + "/mtu", nic["mtu"])
    t.write(net + "/type", 32 if nic["link_layer"] == "InfiniBand" else 1)
    guid = nic["node_guid"].replace(":", "")
    gbytes = [guid[i : i + 2] for i in range(0, len(guid), 2)]
    if nic["mac"]:
        mac = nic["mac"]
    elif nic["link_layer"] == "InfiniBand":
        mac = "00:00:10:29:fe:80:00:00:00:00:00:00:" + ":".join(gbytes)
    else:
        mac = "94:6d:ae:" + ":".join(gbytes[-3:])
    t.write(net + "/address", mac)
    t.link(net + "/device", dev)
    t.link("/sys/class/net/" + nic["netdev"], net)
    if not nic["rdma"]:
        return
    ib = "%s/infiniband/%s" % (dev, nic["name"])
    for k in ("fw_ver", "board_id", "hca_type", "node_guid"):
        t.write("%s/%s" % (ib, k), nic[k])
    t.write(ib + "/sys_image_guid", nic["node_guid"])
    t.write(ib + "/node_type", "1: CA")
    t.link(ib + "/device", dev)
    for num, port in nic["ports"].items():
        pd = "%s/ports/%d" % (ib, num)
        for k in ("state", "phys_state", "rate", "link_layer", "lid", "sm_lid"):
            t.write("%s/%s" % (pd, k), port[k])
        t.write(pd + "/gid_attrs/ndevs/0", nic["netdev"])
        for k, v in port["counters"].items():
            t.write("%s/counters/%s" % (pd, k), v)
    t.link("/sys/class/infiniband/" + nic["name"], ib)


def _iommu(
    t: Tree, spec: Dict[str, Any], devs: Dict[str, Dict[str, Any]], paths: Dict[str, str]
) -> None:
    """Groups: bridges alone; endpoints below a switch whose ports lack ACS redirect share one group."""
    t.mkdir("/sys/class/iommu")
    t.mkdir("/sys/kernel/iommu_groups")
    mode = spec["iommu"]["mode"]
    if mode == "off":
        return
    prefix = "dmar" if spec["iommu"]["vendor"] == "intel" else "ivhd"
    gtype = "identity" if mode == "passthrough" else "DMA-FQ"
    groups: Dict[str, int] = {}
    for bdf in sorted(devs):
        d = devs[bdf]
        parent = devs.get(d["parent"]) if d["parent"] else None
        isolated = parent is None or (parent["acs_ctrl"] & pci.ACS_REDIRECT) == pci.ACS_REDIRECT
        key = (
            bdf
            if (d["port_type"] != pci.PORT_ENDPOINT or isolated or not d["switch"])
            else "sw:" + d["switch"]
        )
        g = groups.setdefault(key, len(groups))
        gdir = "/sys/kernel/iommu_groups/%d" % g
        t.write(gdir + "/type", gtype)
        t.write(gdir + "/reserved_regions", "0x00000000fee00000 0x00000000feefffff msi")
        t.link("%s/devices/%s" % (gdir, bdf), paths[bdf])
        t.link(paths[bdf] + "/iommu_group", gdir)
        unit = "/sys/devices/virtual/iommu/%s%d" % (prefix, max(d["numa_node"], 0))
        t.link("%s/devices/%s" % (unit, bdf), paths[bdf])
        t.link(paths[bdf] + "/iommu", unit)
        t.link("/sys/class/iommu/%s%d" % (prefix, max(d["numa_node"], 0)), unit)


def online_cpus(spec: Dict[str, Any]) -> List[int]:
    """Present CPUs minus cpu.offline."""
    from .spec import parse_cpulist

    gone = set(parse_cpulist(spec["cpu"]["offline"])) if spec["cpu"]["offline"] else set()
    return [i for i in range(spec["cpu"]["count"]) if i not in gone]


def _cpus(t: Tree, spec: Dict[str, Any]) -> None:
    """/sys/devices/system/cpu as an x86 kernel writes it: present/possible/online/offline, cpuN/online, and the
    topology of online CPUs (an offline x86 CPU loses its topology directory) with *_list and mask files."""
    c = spec["cpu"]
    n = c["count"]
    possible = max(c["possible"], n)
    online = online_cpus(spec)
    base = "/sys/devices/system/cpu"
    t.write(base + "/possible", format_cpulist(list(range(possible))))
    t.write(base + "/present", format_cpulist(list(range(n))))
    t.write(base + "/online", format_cpulist(online))
    t.write(
        base + "/offline", format_cpulist(sorted(set(range(possible)) - set(online)))
    )  # "" -> "\n", as the kernel
    t.write(base + "/kernel_max", 8191)
    t.write(base + "/smt/control", "on" if c["threads_per_core"] > 1 else "notsupported")
    t.write(base + "/smt/active", 1 if c["threads_per_core"] > 1 else 0)
    loc = [cpu_location(spec, i) for i in range(n)]
    up = set(online)
    by_core: Dict[tuple, List[int]] = {}
    for i in online:
        by_core.setdefault(loc[i][:2], []).append(i)
    pkg = {s: [i for i in online if loc[i][0] == s] for s in range(c["sockets"])}
    # (list, mask) text per group of CPUs: a socket's is the same for each of its ~100 CPUs
    group_text: Dict[tuple, tuple] = {}

    def texts(cpus: List[int]) -> tuple:
        key = tuple(cpus)
        if key not in group_text:
            group_text[key] = (format_cpulist(cpus), pci.cpumask(cpus, possible))
        return group_text[key]

    for i in range(n):
        if i:
            t.write("%s/cpu%d/online" % (base, i), 1 if i in up else 0)
        if i not in up:
            t.mkdir("%s/cpu%d" % (base, i))
            continue
        sock, core, _ = loc[i]
        top = "%s/cpu%d/topology" % (base, i)
        t.write(top + "/physical_package_id", sock)
        t.write(top + "/die_id", 0)
        t.write(top + "/core_id", core)
        for names, cpus in (
            (("thread_siblings", "core_cpus"), by_core[(sock, core)]),
            (("core_siblings", "package_cpus", "die_cpus"), pkg[sock]),
        ):
            as_list, as_mask = texts(cpus)
            for name in names:
                t.write("%s/%s_list" % (top, name), as_list)
                t.write("%s/%s" % (top, name), as_mask)


def _numa(t: Tree, spec: Dict[str, Any]) -> None:
    base = "/sys/devices/system/node"
    ids = sorted(spec["numa"])
    lst = format_cpulist(ids)
    for k in ("online", "possible", "has_cpu", "has_memory", "has_normal_memory"):
        t.write("%s/%s" % (base, k), lst)
    for nid in ids:
        node = spec["numa"][nid]
        d = "%s/node%d" % (base, nid)
        t.write(d + "/cpulist", node["cpulist"])
        t.write(d + "/cpumap", pci.cpumask(node["cpus"], spec["cpu"]["count"]))
        t.write(d + "/distance", " ".join(map(str, node["distance"])))
        t.write(d + "/meminfo", node_meminfo(nid, node))
        pages = {"2048kB": {}, "1048576kB": {}}
        pages.update(node["hugepages"])
        for size, hp in sorted(pages.items()):
            hd = "%s/hugepages/hugepages-%s" % (d, size)
            t.write(hd + "/nr_hugepages", hp.get("nr", 0))
            t.write(hd + "/free_hugepages", hp.get("free", 0))
            t.write(hd + "/surplus_hugepages", hp.get("surplus", 0))


def node_meminfo(nid: int, node: Dict[str, Any]) -> str:
    hp = node["hugepages"].get("2048kB", {})
    rows = [
        ("MemTotal", node["mem_total_kb"], True),
        ("MemFree", node["mem_free_kb"], True),
        ("MemUsed", node["mem_total_kb"] - node["mem_free_kb"], True),
        ("Active", 0, True),
        ("Inactive", 0, True),
        ("Dirty", 0, True),
        ("FilePages", 0, True),
        ("AnonPages", 0, True),
        ("Shmem", 0, True),
        ("HugePages_Total", hp.get("nr", 0), False),
        ("HugePages_Free", hp.get("free", 0), False),
        ("HugePages_Surp", hp.get("surplus", 0), False),
    ]
    return "".join(
        "Node %d %-15s %8d%s\n" % (nid, k + ":", v, " kB" if kb else "") for k, v, kb in rows
    )


MODULE_DEPS = {
    "nvidia_uvm": ["nvidia"],
    "nvidia_modeset": ["nvidia"],
    "nvidia_drm": ["nvidia_modeset"],
    "nvidia_peermem": ["nvidia", "ib_core"],
    "nvidia_fs": [],
    "mlx5_ib": ["ib_uverbs", "ib_core", "mlx5_core"],
    "ib_uverbs": ["ib_core"],
    "rdma_ucm": ["ib_uverbs", "ib_core"],
    "nvme": ["nvme_core"],
}
MODULE_SIZES = {
    "nvidia": 56848384,
    "nvidia_uvm": 1437696,
    "nvidia_modeset": 1511424,
    "nvidia_peermem": 16384,
    "nvidia_fs": 262144,
    "mlx5_core": 2289664,
    "mlx5_ib": 454656,
    "ib_core": 434176,
    "ib_uverbs": 159744,
    "nvme": 49152,
    "nvme_core": 139264,
}


def module_users(spec: Dict[str, Any]) -> Dict[str, List[str]]:
    users: Dict[str, List[str]] = {m: [] for m in spec["modules"]}
    for m in spec["modules"]:
        for dep in MODULE_DEPS.get(m, []):
            if dep in users:
                users[dep].append(m)
    return users


def _modules(t: Tree, spec: Dict[str, Any]) -> None:
    users = module_users(spec)
    for name, m in spec["modules"].items():
        d = "/sys/module/" + name
        t.write(d + "/initstate", "live")
        t.write(d + "/refcnt", len(users[name]))
        if m["version"]:
            t.write(d + "/version", m["version"])
        if m["taint"]:
            t.write(d + "/taint", m["taint"].strip("()"))
        for u in users[name]:
            t.link("%s/holders/%s" % (d, u), "/sys/module/" + u)
    for name, version in spec["memory_peers"].items():
        if (
            version
        ):  # "" = the peer-memory client is not registered (an overlay cannot delete a key)
            t.write("/sys/kernel/mm/memory_peers/%s/version" % name, version)


def _edac(t: Tree, spec: Dict[str, Any]) -> None:
    """/sys/devices/system/edac/mc as i10nm_edac writes it (drivers/edac/edac_mc_sysfs.c, skx_common.c)."""
    memory = spec["memory"]
    per_socket, channels = memory["edac_controllers"], memory["edac_channels"]
    base = "/sys/devices/system/edac/mc"
    for n in range(per_socket * spec["cpu"]["sockets"]):
        socket, imc = divmod(n, per_socket)
        over = memory["edac"].get("mc%d" % n, {})
        dimms = {
            "dimm%d" % c: {"channel": c, "slot": 0} for c in range(channels)
        }  # one DIMM per channel
        for name, dimm_over in over.get("dimms", {}).items():
            dimms.setdefault(name, {"channel": 0, "slot": 0}).update(dimm_over)
        mc = "%s/mc%d" % (base, n)
        ce = ue = 0
        for name, d in sorted(dimms.items()):
            label = d.get("label")
            if label is None:
                label = "CPU_SrcID#%d_MC#%d_Chan#%d_DIMM#%d" % (
                    socket,
                    imc,
                    d["channel"],
                    d["slot"],
                )
            location = d.get("location")
            if location is None:
                location = "channel %d slot %d " % (d["channel"], d["slot"])
            ce += d.get("ce_count", 0)
            ue += d.get("ue_count", 0)
            t.write(  # an unset label reads as nothing at all (dimmdev_label_show)
                "%s/%s/dimm_label" % (mc, name), label + "\n" if label else "", newline=False
            )
            t.write("%s/%s/dimm_location" % (mc, name), location)
            t.write("%s/%s/size" % (mc, name), d.get("size", 65536))
            t.write("%s/%s/dimm_ce_count" % (mc, name), d.get("ce_count", 0))
            t.write("%s/%s/dimm_ue_count" % (mc, name), d.get("ue_count", 0))
        ce_noinfo, ue_noinfo = over.get("ce_noinfo_count", 0), over.get("ue_noinfo_count", 0)
        t.write(mc + "/mc_name", "Intel_10nm Socket#%d IMC#%d" % (socket, imc))
        t.write(mc + "/ce_count", ce + ce_noinfo)
        t.write(mc + "/ue_count", ue + ue_noinfo)
        t.write(mc + "/ce_noinfo_count", ce_noinfo)
        t.write(mc + "/ue_noinfo_count", ue_noinfo)
        t.write(mc + "/seconds_since_reset", over.get("seconds_since_reset", 86400 * 7))


def _misc(t: Tree, spec: Dict[str, Any]) -> None:
    node = spec["node"]
    thp = " ".join("[%s]" % x if x == node["thp"] else x for x in ("always", "madvise", "never"))
    t.write("/sys/kernel/mm/transparent_hugepage/enabled", thp)
    t.mkdir("/sys/hypervisor")
    if node["virtualization"] == "xen":
        t.write("/sys/hypervisor/type", "xen")
    vm_vendor = {
        "kvm": ("QEMU", "Standard PC (Q35 + ICH9, 2009)"),
        "vmware": ("VMware, Inc.", "VMware7,1"),
        "xen": ("Xen", "HVM domU"),
        "hyperv": ("Microsoft Corporation", "Virtual Machine"),
        "other": ("Unknown", "Virtual Machine"),
        "none": ("Supermicro", "SYS-821GE-TNHR"),
    }
    vendor, product = vm_vendor[node["virtualization"]]
    dmi = "/sys/devices/virtual/dmi/id"
    t.write(dmi + "/sys_vendor", node["dmi_sys_vendor"] or vendor)
    t.write(dmi + "/product_name", node["dmi_product_name"] or product)
    t.link("/sys/class/dmi/id", dmi)
