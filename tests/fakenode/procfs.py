"""/proc, /dev and /etc for a resolved spec."""

from __future__ import annotations

from typing import Any, Dict, List

from .fsutil import Tree
from .spec import cpu_location, format_cpulist
from .sysfs import MODULE_SIZES, module_users, online_cpus


def write_procfs(t: Tree, spec: Dict[str, Any]) -> None:
    node = spec["node"]
    t.write("/proc/cpuinfo", cpuinfo(spec), newline=False)
    t.write("/proc/meminfo", meminfo(spec), newline=False)
    la = node["loadavg"]
    t.write(
        "/proc/loadavg",
        "%.2f %.2f %.2f 2/%d 48213" % (la[0], la[1], la[2], 1200 + spec["cpu"]["count"]),
    )
    t.write(
        "/proc/uptime",
        "%.2f %.2f" % (node["uptime_s"], node["uptime_s"] * spec["cpu"]["count"] * 0.95),
    )
    t.write("/proc/swaps", swaps(spec), newline=False)
    t.write("/proc/stat", proc_stat(spec), newline=False)
    mounts = "".join(
        "%s %s %s %s 0 0\n" % (m["device"], m["mountpoint"], m["fstype"], m["options"])
        for m in spec["mounts"]
    )
    t.write("/proc/mounts", mounts, newline=False)
    t.write("/proc/self/mounts", mounts, newline=False)
    for directory in [m["mountpoint"] for m in spec["mounts"]] + ["/tmp", "/var/tmp"]:
        t.mkdir(directory)  # exist as directories, as on the node
    t.write("/.slurm-hooks/statvfs.json", statvfs_record(spec))
    t.write("/proc/cmdline", node["cmdline"])
    t.write("/proc/version", proc_version(spec))
    t.write("/proc/sys/kernel/osrelease", node["kernel_release"])
    t.write("/proc/sys/kernel/hostname", node["hostname"])
    t.write("/proc/sys/kernel/numa_balancing", node["numa_balancing"])
    t.write(
        "/proc/sys/kernel/tainted",
        12288 if any(m["taint"] for m in spec["modules"].values()) else 0,
    )
    t.write("/proc/sys/vm/zone_reclaim_mode", node["zone_reclaim_mode"])
    t.write("/proc/modules", proc_modules(spec), newline=False)
    t.write("/etc/hostname", node["hostname"])
    t.write(
        "/etc/os-release",
        'PRETTY_NAME="%s"\nNAME="%s"\n' % (node["os_release"], node["os_release"].split()[0]),
        newline=False,
    )
    _nvidia(t, spec)
    _dev(t, spec)
    write_slurm_side(t, spec)


def statvfs_record(spec: Dict[str, Any]) -> str:
    """What statvfs(2) says for every mount point and /tmp, /var/tmp (from the mount holding each), in the
    format `slurm-hooks capture` records it (host.CAPTURED_STATVFS): `check --root` reads free space here."""
    import json

    mounts = sorted(spec["mounts"], key=lambda m: len(m["mountpoint"]))
    out = {}
    for path in [m["mountpoint"] for m in mounts] + ["/tmp", "/var/tmp"]:
        holder = [
            m
            for m in mounts
            if (path.rstrip("/") + "/").startswith(m["mountpoint"].rstrip("/") + "/")
        ][-1]
        blocks, files = 250000000, 60000000
        out[path] = {
            "f_blocks": blocks,
            "f_bavail": int(blocks * holder["free_percent"] / 100),
            "f_files": files,
            "f_favail": int(files * holder["free_inodes_percent"] / 100),
        }
    return json.dumps(out, indent=1, sort_keys=True)


def cpuinfo(spec: Dict[str, Any]) -> str:
    """One block per *online* CPU, as the kernel lists them."""
    c = spec["cpu"]
    flags = list(c["flags"])
    if spec["node"]["virtualization"] != "none" and "hypervisor" not in flags:
        flags.append("hypervisor")
    siblings = c["cores_per_socket"] * c["threads_per_core"]
    out = []
    for i in online_cpus(spec):
        sock, core, thread = cpu_location(spec, i)
        apic = (sock * 128) + core * 2 + thread
        rows = [
            ("processor", i),
            ("vendor_id", c["vendor_id"]),
            ("cpu family", c["family"]),
            ("model", c["model"]),
            ("model name", c["model_name"]),
            ("stepping", c["stepping"]),
            ("microcode", "0x2b000590"),
            ("cpu MHz", "%.3f" % c["mhz"]),
            ("cache size", "%d KB" % c["cache_kb"]),
            ("physical id", sock),
            ("siblings", siblings),
            ("core id", core),
            ("cpu cores", c["cores_per_socket"]),
            ("apicid", apic),
            ("initial apicid", apic),
            ("fpu", "yes"),
            ("fpu_exception", "yes"),
            ("cpuid level", 32),
            ("wp", "yes"),
            ("flags", " ".join(flags)),
            ("bugs", "spectre_v1 spectre_v2 spec_store_bypass swapgs eibrs_pbrsb"),
            ("bogomips", "%.2f" % (c["mhz"] * 2)),
            ("clflush size", 64),
            ("cache_alignment", 64),
            ("address sizes", "46 bits physical, 57 bits virtual"),
        ]
        out.append(
            "".join("%s%s: %s\n" % (k, "\t" if len(k) >= 8 else "\t\t", v) for k, v in rows)
            + "power management:\n"
        )
    return "\n".join(out) + "\n"


def meminfo(spec: Dict[str, Any]) -> str:
    total = spec["memory"]["total_kb"]
    free = spec["memory"]["free_kb"]
    swap_total = sum(s["size_kb"] for s in spec["swap"])
    swap_free = swap_total - sum(s["used_kb"] for s in spec["swap"])
    hp_size = spec["memory"]["hugepagesize_kb"]
    key = "%dkB" % hp_size
    hp_total = sum(n["hugepages"].get(key, {}).get("nr", 0) for n in spec["numa"].values())
    hp_free = sum(n["hugepages"].get(key, {}).get("free", 0) for n in spec["numa"].values())
    cached = (total - free) // 4
    rows = [
        ("MemTotal", total),
        ("MemFree", free),
        ("MemAvailable", free + cached),
        ("Buffers", 1048576),
        ("Cached", cached),
        ("SwapCached", 0),
        ("Active", cached // 2),
        ("Inactive", cached // 2),
        ("SwapTotal", swap_total),
        ("SwapFree", swap_free),
        ("Dirty", 128),
        ("Writeback", 0),
        ("AnonPages", (total - free) // 8),
        ("Mapped", 524288),
        ("Shmem", 65536),
        ("Slab", 4194304),
        ("PageTables", 131072),
        ("CommitLimit", total // 2 + swap_total),
        ("Committed_AS", (total - free) // 4),
        ("VmallocTotal", 34359738367),
        ("HardwareCorrupted", 0),
        ("AnonHugePages", 0),
    ]
    lines = ["%-16s%8d kB" % (k + ":", v) for k, v in rows]
    lines += [
        "%-16s%8d" % (k + ":", v)
        for k, v in (
            ("HugePages_Total", hp_total),
            ("HugePages_Free", hp_free),
            ("HugePages_Rsvd", 0),
            ("HugePages_Surp", 0),
        )
    ]
    lines += [
        "%-16s%8d kB" % ("Hugepagesize:", hp_size),
        "%-16s%8d kB" % ("Hugetlb:", hp_total * hp_size),
    ]
    return "\n".join(lines) + "\n"


def swaps(spec: Dict[str, Any]) -> str:
    out = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
    for s in spec["swap"]:
        out += "%-40s%-16s%-16d%-16d%d\n" % (
            s["filename"],
            s["type"],
            s["size_kb"],
            s["used_kb"],
            s["priority"],
        )
    return out


def proc_version(spec: Dict[str, Any]) -> str:
    node = spec["node"]
    if node["proc_version"]:
        return node["proc_version"]
    return (
        "Linux version %s (buildd@lcy02-amd64-080) (x86_64-linux-gnu-gcc-12 (Ubuntu 12.3.0-1ubuntu1~22.04) "
        "12.3.0, GNU ld (GNU Binutils for Ubuntu) 2.38) #115-Ubuntu SMP Mon Apr 15 09:52:04 UTC 2024"
        % node["kernel_release"]
    )


def proc_modules(spec: Dict[str, Any]) -> str:
    users = module_users(spec)
    out = []
    for name, m in spec["modules"].items():
        deps = "".join(u + "," for u in users[name]) or "-"
        size = m["size"] or MODULE_SIZES.get(name, 16384)
        taint = " " + m["taint"] if m["taint"] else ""
        out.append("%s %d %d %s Live 0x%016x%s\n" % (name, size, len(users[name]), deps, 0, taint))
    return "".join(out)


def xid_message(
    pci: str,
    xid: int,
    text: str,
    pid: str = "'<unknown>'",
    name: str = "<unknown>",
    gpu_instance: int = -1,
    compute_instance: int = -1,
) -> str:
    """An Xid report as the driver prints it (open-gpu-kernel-modules, src/nvidia/src/kernel/gpu/rc/
    kernel_rc.c): "NVRM: Xid (PCI:%04x:%02x:%02x[ GPU-I:%02u[ GPU-CI:%02u]]): %d, pid=%s, name=%s, %s";
    the bus id without its function, the MIG ids only when the driver attributes the Xid to a partition."""
    domain, bus, devfn = pci.split(":")
    where = "PCI:%04x:%02x:%02x" % (int(domain, 16), int(bus, 16), int(devfn.split(".")[0], 16))
    if gpu_instance >= 0:
        where += " GPU-I:%02u" % gpu_instance
        if compute_instance >= 0:
            where += " GPU-CI:%02u" % compute_instance
    return "NVRM: Xid (%s): %d, pid=%s, name=%s, %s" % (where, xid, pid, name, text)


def _kmsg_message(spec: Dict[str, Any], m: Dict[str, Any]) -> str:
    if m["xid"] <= 0:
        return m["msg"]
    gpu = spec["gpu"][m["gpu"]]
    return xid_message(
        gpu["pci"],
        m["xid"],
        m["msg"],
        m["pid"],
        m["name"],
        m["gpu_instance"],
        m["compute_instance"],
    )


def kmsg_records(spec: Dict[str, Any]) -> List[str]:
    """'/dev/kmsg' records: 'prio,seq,usec,flags;message' with prio = facility*8 + level."""
    node, lines = spec["node"], []
    if node["kmsg_boot_lines"]:
        lines.append((5, 0, "Linux version " + proc_version(spec)[len("Linux version ") :]))
        lines.append((6, 0, "Command line: " + node["cmdline"]))
        mode = spec["iommu"]["mode"]
        if mode != "off":
            lines.append(
                (
                    6,
                    0,
                    "DMAR: IOMMU enabled"
                    if spec["iommu"]["vendor"] == "intel"
                    else "AMD-Vi: IOMMU enabled",
                )
            )
            lines.append(
                (
                    6,
                    0,
                    "iommu: Default domain type: %s (set via kernel command line)"
                    % ("Passthrough" if mode == "passthrough" else "Translated"),
                )
            )
        for nic in spec["nic"].values():
            if nic["driver"] == "mlx5_core":
                lines.append(
                    (6, 0, "mlx5_core %s: firmware version: %s" % (nic["pci"], nic["fw_ver"]))
                )
        if "nvidia" in spec["modules"]:
            lines.append((4, 0, "nvidia: loading out-of-tree module taints kernel."))
            lines.append(
                (6, 0, "nvidia-nvlink: Nvlink Core is being initialized, major device number 234")
            )
            lines.append(
                (
                    6,
                    0,
                    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  %s  Tue Mar  5 22:23:56 UTC 2024"
                    % spec["nvml"]["driver_version"],
                )
            )
    records, ts = [], 0
    n_user = len(spec["kmsg"])
    for seq, (level, fac, msg) in enumerate(lines):
        ts = 1000 + seq * 250000
        records.append("%d,%d,%d,-;%s" % (fac * 8 + level, seq, ts, msg))
    up_us = int(spec["node"]["uptime_s"] * 1e6)
    for i, m in enumerate(spec["kmsg"]):
        seq = len(records)
        t_us = m["ts_us"] if m["ts_us"] >= 0 else max(up_us - (n_user - i) * 1000000, ts + 1 + i)
        records.append(
            "%d,%d,%d,-;%s" % (m["facility"] * 8 + m["level"], seq, t_us, _kmsg_message(spec, m))
        )
    return records


def _nvidia(t: Tree, spec: Dict[str, Any]) -> None:
    if "nvidia" not in spec["modules"]:
        return
    drv = spec["nvml"]["driver_version"]
    t.write(
        "/proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  %s  Tue Mar  5 22:23:56 UTC 2024\n"
        "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)" % drv,
    )
    for g in spec["gpu"].values():
        info = [
            ("Model", g["name"]),
            ("IRQ", 0),
            ("GPU UUID", g["uuid"]),
            ("Video BIOS", g["vbios"]),
            ("Bus Type", "PCIe"),
            ("DMA Size", "52 bits"),
            ("DMA Mask", "0xfffffffffffff"),
            ("Bus Location", g["pci"]),
            ("Device Minor", g["minor_number"]),
            ("GPU Excluded", "No"),
        ]
        t.write(
            "/proc/driver/nvidia/gpus/%s/information" % g["pci"],
            "".join("%-22s%s\n" % (k + ":", v) for k, v in info),
            newline=False,
        )


def _dev(t: Tree, spec: Dict[str, Any]) -> None:
    t.write("/dev/kmsg", "".join(r + "\n" for r in kmsg_records(spec)), newline=False)
    if "nvidia" in spec["modules"]:
        for g in spec["gpu"].values():
            t.write("/dev/nvidia%d" % g["minor_number"], "", newline=False)
        t.write("/dev/nvidiactl", "", newline=False)
    if "nvidia_uvm" in spec["modules"]:
        t.write("/dev/nvidia-uvm", "", newline=False)
        t.write("/dev/nvidia-uvm-tools", "", newline=False)
    rdma = [n for n in spec["nic"].values() if n["rdma"]]
    for i, nic in enumerate(sorted(rdma, key=lambda n: n["name"])):
        t.write("/dev/infiniband/uverbs%d" % i, "", newline=False)
        t.write("/sys/class/infiniband_verbs/uverbs%d/ibdev" % i, nic["name"])
    for name in sorted(spec["nvme"]):
        t.write("/dev/%s" % name, "", newline=False)
        t.write("/dev/%sn1" % name, "", newline=False)


# ---------------------------------------------------------------- Slurm side: cgroups, config, processes, IRQs


def write_slurm_side(t: Tree, spec: Dict[str, Any]) -> None:
    """cgroup tree with the spec's job cgroups, /etc/slurm files, /proc/<pid>/*, /proc/irq and /proc/interrupts."""
    _cgroups(t, spec)
    if spec["slurm"]["gres_conf"]:
        text = spec["slurm"]["gres_conf"]
        t.write("/etc/slurm/gres.conf", gres_conf_auto(spec) if text == "auto" else text)
    if spec["slurm"]["slurm_conf"]:
        t.write("/etc/slurm/slurm.conf", spec["slurm"]["slurm_conf"])
    every = format_cpulist(list(range(spec["cpu"]["count"])))
    for p in spec["process"]:
        base = "/proc/%d" % p["pid"]
        cpus = p["cpus"] or every
        t.write(base + "/comm", p["comm"])
        t.write(base + "/cmdline", b"" if p["kthread"] else p["comm"].encode() + b"\0")
        t.write(
            base + "/status",
            "Name:\t%s\nState:\tS (sleeping)\nTgid:\t%d\nPid:\t%d\nPPid:\t%d\nKthread:\t%d\n"
            "Cpus_allowed_list:\t%s\nMems_allowed_list:\t%s\n"
            % (
                p["comm"],
                p["pid"],
                p["pid"],
                0 if p["pid"] == 1 else 1,
                p["kthread"],
                cpus,
                format_cpulist(sorted(spec["numa"])),
            ),
            newline=False,
        )
        if spec["cgroup"]["version"] == "v1":
            cg = "12:cpuset:%s\n11:memory:%s\n1:name=systemd:%s\n" % ((p["cgroup"],) * 3)
        else:
            cg = "0::%s\n" % p["cgroup"]
        t.write(base + "/cgroup", cg, newline=False)
    _extra_processes(t, spec)
    _irqs(t, spec)


_USER_COMMS = (
    "python3",
    "bash",
    "sleep",
    "srun",
    "torchrun",
    "pt_elastic",
    "ray::IDLE",
    "node",
    "sshd",
    "tmux: server",
)


def _extra_processes(t: Tree, spec: Dict[str, Any]) -> None:
    """[node] extra_processes user processes (pids 100000...), with /proc/<pid>/{comm,status,cgroup} the size and
    shape a real kernel writes (status ~1.3 KiB): the 25,000-process nodes of the scale benchmarks."""
    count = spec["node"]["extra_processes"]
    every = format_cpulist(list(range(spec["cpu"]["count"])))
    mems = format_cpulist(sorted(spec["numa"]))
    for i in range(count):
        pid = 100000 + i
        comm = _USER_COMMS[i % len(_USER_COMMS)]
        base = "/proc/%d" % pid
        t.write(base + "/comm", comm)
        t.write(base + "/status", _status_text(comm, pid, every, mems), newline=False)
        t.write(
            base + "/cgroup",
            "0::/user.slice/user-%d.slice/session-%d.scope\n" % (1000 + i % 50, i % 300),
            newline=False,
        )


def _status_text(comm: str, pid: int, cpus: str, mems: str) -> str:
    rows = [
        ("Name", comm),
        ("Umask", "0022"),
        ("State", "S (sleeping)"),
        ("Tgid", pid),
        ("Ngid", 0),
        ("Pid", pid),
        ("PPid", pid - 1),
        ("TracerPid", 0),
        ("Uid", "1000\t1000\t1000\t1000"),
        ("Gid", "1000\t1000\t1000\t1000"),
        ("FDSize", 64),
        ("Groups", "1000"),
        ("NStgid", pid),
        ("NSpid", pid),
        ("NSpgid", pid),
        ("NSsid", pid),
        ("Kthread", 0),
        ("VmPeak", "   12200 kB"),
        ("VmSize", "   12200 kB"),
        ("VmLck", "       0 kB"),
        ("VmPin", "       0 kB"),
        ("VmHWM", "    4352 kB"),
        ("VmRSS", "    4352 kB"),
        ("RssAnon", "     640 kB"),
        ("RssFile", "    3712 kB"),
        ("RssShmem", "       0 kB"),
        ("VmData", "     748 kB"),
        ("VmStk", "     132 kB"),
        ("VmExe", "     892 kB"),
        ("VmLib", "    1900 kB"),
        ("VmPTE", "      60 kB"),
        ("VmSwap", "       0 kB"),
        ("HugetlbPages", "       0 kB"),
        ("CoreDumping", 0),
        ("THP_enabled", 1),
        ("Threads", 1),
        ("SigQ", "0/514689"),
        ("SigPnd", "0000000000000000"),
        ("ShdPnd", "0000000000000000"),
        ("SigBlk", "0000000000010000"),
        ("SigIgn", "0000000000380004"),
        ("SigCgt", "000000004b817efb"),
        ("CapInh", "0000000000000000"),
        ("CapPrm", "0000000000000000"),
        ("CapEff", "0000000000000000"),
        ("CapBnd", "000001ffffffffff"),
        ("CapAmb", "0000000000000000"),
        ("NoNewPrivs", 0),
        ("Seccomp", 0),
        ("Seccomp_filters", 0),
        ("Speculation_Store_Bypass", "thread vulnerable"),
        ("SpeculationIndirectBranch", "conditional enabled"),
        ("Cpus_allowed", "ff" * 4),
        ("Cpus_allowed_list", cpus),
        ("Mems_allowed", "00000000,00000003"),
        ("Mems_allowed_list", mems),
        ("voluntary_ctxt_switches", 151),
        ("nonvoluntary_ctxt_switches", 2),
    ]
    return "".join("%s:\t%s\n" % row for row in rows)


def gres_conf_auto(spec: Dict[str, Any]) -> str:
    """A correct gres.conf: one line per NUMA node, Cores = Slurm logical core indices of that node."""
    c = spec["cpu"]
    lines = ['# generated by tests/fakenode from the spec (slurm.gres_conf = "auto")']
    for nid, node in sorted(spec["numa"].items()):
        minors = [g["minor_number"] for g in spec["gpu"].values() if g["numa_node"] == nid]
        if not minors:
            continue
        cores = sorted(
            {
                loc[0] * c["cores_per_socket"] + loc[1]
                for loc in (cpu_location(spec, x) for x in node["cpus"])
            }
        )
        gpu_type = "h100" if "H100" in next(iter(spec["gpu"].values()))["name"] else "gpu"
        lines.append(
            "NodeName=%s Name=gpu Type=%s File=/dev/nvidia[%s] Cores=%s"
            % (spec["node"]["hostname"], gpu_type, format_cpulist(minors), format_cpulist(cores))
        )
    return "\n".join(lines) + "\n"


STAT_COLUMNS = (
    "user",
    "nice",
    "system",
    "idle",
    "iowait",
    "irq",
    "softirq",
    "steal",
    "guest",
    "guest_nice",
)


def cpu_ticks(spec: Dict[str, Any]) -> Dict[int, Dict[str, int]]:
    """Per online CPU, /proc/stat's columns: [cpu] ticks where given, else a mostly idle CPU since boot."""
    up = int(spec["node"]["uptime_s"] * 100)  # USER_HZ
    base = {
        "user": up * 4 // 100,
        "nice": 0,
        "system": up // 100,
        "idle": up * 94 // 100,
        "iowait": up // 1000,
        "irq": 0,
        "softirq": up // 2000,
        "steal": 0,
        "guest": 0,
        "guest_nice": 0,
    }
    given = spec["cpu"].get("ticks") or {}
    return {
        c: dict(base, **{k: int(v) for k, v in (given.get(str(c)) or given.get(c) or {}).items()})
        for c in online_cpus(spec)
    }


def format_proc_stat(ticks: Dict[int, Dict[str, int]], btime: int = 1717000000) -> str:
    """The text of /proc/stat as Linux writes it (fs/proc/stat.c): an all-CPU line with two spaces after
    "cpu", one line per online CPU, then the interrupt and process counters."""
    total = {k: sum(t[k] for t in ticks.values()) for k in STAT_COLUMNS}
    lines = ["cpu  " + " ".join(str(total[k]) for k in STAT_COLUMNS)]
    lines += [
        "cpu%d %s" % (c, " ".join(str(t[k]) for k in STAT_COLUMNS))
        for c, t in sorted(ticks.items())
    ]
    lines += [
        "intr 73777505 41 9 0 0 0",
        "ctxt 38014093",
        "btime %d" % btime,
        "processes 26442",
        "procs_running 2",
        "procs_blocked 0",
        "softirq 5057579 250191 1481983 1647 211099 186066 0 1783454 622196 12499 508444",
    ]
    return "\n".join(lines) + "\n"


def parse_proc_stat_ticks(text: str) -> Dict[int, Dict[str, int]]:
    out = {}
    for line in text.splitlines():
        if line.startswith("cpu") and not line.startswith("cpu "):
            name, *values = line.split()
            out[int(name[3:])] = dict(zip(STAT_COLUMNS, (int(v) for v in values)))
    return out


def proc_stat(spec: Dict[str, Any]) -> str:
    return format_proc_stat(cpu_ticks(spec))


def cpu_stat(usage_usec: int) -> str:
    """cgroup v2 cpu.stat (kernel/sched/core.c cpu_extra_stat_show + cgroup_base_stat_cputime_show):
    usage split 90/10 into user/system; no CFS quota, so nothing throttled."""
    return (
        "usage_usec %d\nuser_usec %d\nsystem_usec %d\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n"
        "nr_bursts 0\nburst_usec 0\n"
        % (usage_usec, usage_usec * 9 // 10, usage_usec - usage_usec * 9 // 10)
    )


def _cgroups(t: Tree, spec: Dict[str, Any]) -> None:
    version = spec["cgroup"]["version"]
    every = format_cpulist(list(range(spec["cpu"]["count"])))
    nodes = format_cpulist(sorted(spec["numa"]))
    if version == "v2":
        root = "/sys/fs/cgroup"
        t.write(root + "/cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc")
        t.write(root + "/cgroup.subtree_control", "cpuset cpu io memory pids")
        t.write(root + "/cpuset.cpus.effective", every)
        t.write(
            root + "/system.slice/slurmstepd.scope/cgroup.subtree_control", "cpuset cpu memory pids"
        )
        scope_usage = spec["cgroup"]["slurm_usage_usec"] + sum(
            j["usage_usec"] for j in spec["job"].values()
        )
        t.write(
            root + "/system.slice/slurmstepd.scope/cpu.stat", cpu_stat(scope_usage), newline=False
        )
        for job_id, j in spec["job"].items():
            d = "%s/system.slice/slurmstepd.scope/job_%s" % (root, job_id)
            t.write(d + "/cpu.stat", cpu_stat(j["usage_usec"]), newline=False)
            t.write(d + "/cpuset.cpus", j["cpus"])
            t.write(d + "/cpuset.cpus.effective", j["cpus"])
            t.write(d + "/cpuset.mems.effective", j["mems"])
            t.write(d + "/cgroup.procs", "".join("%d\n" % pid for pid in j["pids"]), newline=False)
    elif version == "v1":
        root = "/sys/fs/cgroup/cpuset"
        t.write(root + "/cpuset.cpus", every)
        t.write(root + "/cpuset.mems", nodes)
        t.write(root + "/slurm/cpuset.cpus", every)
        for job_id, j in spec["job"].items():
            d = "%s/slurm/uid_%d/job_%s" % (root, j["uid"], job_id)
            t.write(d + "/cpuset.cpus", j["cpus"])
            t.write(d + "/cpuset.effective_cpus", j["cpus"])
            t.write(d + "/cpuset.mems", j["mems"])
            t.write(d + "/tasks", "".join("%d\n" % pid for pid in j["pids"]), newline=False)


def _irqs(t: Tree, spec: Dict[str, Any]) -> None:
    ncpu = spec["cpu"]["count"]
    every = format_cpulist(list(range(ncpu)))
    header = " " * 11 + "".join("CPU%-8d" % i for i in range(ncpu)) + "\n"
    body = []
    for q in sorted(spec["irq"], key=lambda x: x["irq"]):
        bdf = q["name"].split("@pci:", 1)[1] if "@pci:" in q["name"] else "0000:00:00.0"
        cpus = q["cpus"] or _local_cpus(spec, bdf) or every
        t.write("/proc/irq/%d/smp_affinity_list" % q["irq"], cpus)
        t.write("/proc/irq/%d/node" % q["irq"], 0)
        body.append(
            "%4d: %s  IR-PCI-MSIX-%s    0-edge      %s\n"
            % (q["irq"], " ".join(["0"] * ncpu), bdf, q["name"])
        )
    body.append(" NMI: %s   Non-maskable interrupts\n" % " ".join(["0"] * ncpu))
    t.write("/proc/interrupts", header + "".join(body), newline=False)


def _local_cpus(spec: Dict[str, Any], bdf: str) -> str:
    for kind in ("gpu", "nic", "nvme"):
        for d in spec[kind].values():
            if d["pci"] == bdf:
                return d.get("cpulist", "")
    return ""
