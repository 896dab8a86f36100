"""The real-machine corpus: /sys and /proc subsets of real machines, from public test suites.

manifest.toml names each capture, where it comes from (repository, path, commit, licence), the
facts that source states about the machine (`truth`) and the checks that may report UNKNOWN
because the capture truly lacks a file (`unknown`, check -> the missing file). Each
`<name>.tar.xz` holds one tree under `<name>/`: exactly the files the checks and the fact readers
below read from the source archive (tests/captures/build.py makes them with slurm_hooks.capture,
the same recording `slurm-hooks capture` uses). tests/test_captures.py runs every check on each.
"""

from __future__ import annotations

import os
import tarfile
from typing import Any, Dict, List

from slurm_hooks.core.config_files import toml_loads
from slurm_hooks.hw.host import Host, format_cpulist, parse_cpulist
from slurm_hooks.hw.procfs import parse_cpuinfo_models, parse_meminfo

HERE = os.path.dirname(os.path.abspath(__file__))
ABSENT = (
    "/.slurm-hooks/absent.txt"  # in each archive: paths the checks looked for that the source lacks
)
MANIFEST = os.path.join(HERE, "manifest.toml")


def manifest() -> Dict[str, Dict[str, Any]]:
    with open(MANIFEST, encoding="utf-8") as handle:
        return toml_loads(handle.read())["capture"]


def archive(name: str) -> str:
    return os.path.join(HERE, name + ".tar.xz")


def unpack(name: str, directory: str) -> str:
    """Extract capture `name` under `directory`; returns its root (the tree holding sys/ and proc/)."""
    with tarfile.open(archive(name)) as tar:
        members = tar.getmembers()
        for member in members:  # our own archives, but refuse anything that would land outside
            if (
                member.name.startswith("/")
                or ".." in member.name.split("/")
                or not (member.name == name or member.name.startswith(name + "/"))
            ):
                raise ValueError("%s: unexpected member %r" % (archive(name), member.name))
        extract(tar, directory, members)
    return os.path.join(directory, name)


def extract(tar: tarfile.TarFile, directory: str, members=None) -> None:
    """extractall with the 'tar' filter where Python has filters (3.12+ warns without one; sysfs links are
    relative, which every filter keeps)."""
    if hasattr(tarfile, "tar_filter"):
        tar.extractall(directory, members, filter="tar")
    else:
        tar.extractall(directory, members)


def corpus_config(entry: Dict[str, Any]) -> Dict[str, Any]:
    """The configuration a capture is recorded and checked with: what its source states is expected of the
    node (system.cpu), plus settings that make the NUMA checks read processes and IRQs where a capture has them."""
    truth = entry.get("truth", {})
    cpu = {
        key: truth[key]
        for key in ("sockets", "cores_per_socket")
        if isinstance(truth.get(key), int)
    }
    threads = truth.get("threads_per_core")
    if threads:  # hybrid: the most threads any core has (what the check compares)
        cpu["threads_per_core"] = max(threads) if isinstance(threads, list) else threads
    return {
        "checks": {
            "system.cpu": cpu,
            "numa.housekeeping": {"housekeeping_cpus": "0", "irqs": ["*"]},
        }
    }


def facts(host: Host) -> Dict[str, Any]:
    """What the corpus test compares with a source's stated facts, read the way the checks read them."""
    from slurm_hooks.hw import pcie
    from slurm_hooks.hw.cputopo import read_cpu_layout

    cpuinfo = host.read_text("/proc/cpuinfo", default="", max_bytes=16 << 20)
    layout = read_cpu_layout(host, cpuinfo)
    numa: Dict[int, Any] = {}
    memory_only = []
    for path in host.glob("/sys/devices/system/node", "node[0-9]*"):
        node = int(path.rsplit("node", 1)[1])
        text = host.read_text(path + "/meminfo", default=None)
        numa[node] = (
            None
            if text is None
            else parse_meminfo(text, path + "/meminfo").get("MemTotal", 0) / 1024.0
        )
        if not parse_cpulist(host.read_text(path + "/cpulist", default="0"), path + "/cpulist"):
            memory_only.append(node)
    tree = pcie.read_pci_tree(host)
    return {
        "sockets": len(layout.sockets),
        "cores_per_socket": [len(s.cores) for s in layout.sockets],
        "cores": len(layout.cores),
        "cpus": len(layout.online),
        "online": format_cpulist(layout.online),
        "offline": format_cpulist(layout.offline),
        # the kernel's own lists, kept in the captures to show what the old reading counted
        "possible": host.read_text("/sys/devices/system/cpu/possible", default=None),
        "kernel_offline": host.read_text("/sys/devices/system/cpu/offline", default=None),
        "threads_per_core": sorted({n for s in layout.sockets for n in s.thread_counts}),
        "models": parse_cpuinfo_models(cpuinfo),
        "numa_mib": numa,
        "memory_only_nodes": memory_only,
        "pci": tree,
    }


def absent(root: str) -> List[str]:
    """The paths the build found missing from the source archive (what a check may miss here)."""
    with open(os.path.join(root, ABSENT.lstrip("/")), encoding="utf-8") as handle:
        return handle.read().split()
