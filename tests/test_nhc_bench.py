"""bench/nhc_compare.py's generated N-CPU node must read as N CPUs to both tools, or the 256-CPU
comparison measures a different node on each side."""

from __future__ import annotations

import os
import re
import shutil

from bench import nhc_compare
from slurm_hooks.hw.cputopo import read_cpu_layout
from slurm_hooks.hw.host import Host


def test_a_generated_256_cpu_node_reads_as_2_sockets_64_cores_2_threads(tmp_path):
    info, tree = nhc_compare.fake_cpus(256, str(tmp_path / "gen"))
    root = tmp_path / "root"
    os.makedirs(root / "proc")
    shutil.copy(info, root / "proc" / "cpuinfo")
    shutil.copytree(tree, root / "sys" / "devices" / "system" / "cpu")
    with open(info) as handle:
        cpuinfo = handle.read()

    layout = read_cpu_layout(Host(str(root)), cpuinfo)  # what system.cpu judges
    assert len(layout.online) == 256 and layout.source == "sysfs sibling lists"
    assert [len(socket.cores) for socket in layout.sockets] == [64, 64]
    assert all(socket.thread_counts == (2,) for socket in layout.sockets)

    # what NHC's nhc_hw_gather_data counts: distinct physical ids, "cpu cores", "siblings"
    assert len(set(re.findall(r"^physical id\s*:\s*(\d+)", cpuinfo, re.M))) == 2
    assert set(re.findall(r"^cpu cores\s*:\s*(\d+)", cpuinfo, re.M)) == {"64"}
    assert set(re.findall(r"^siblings\s*:\s*(\d+)", cpuinfo, re.M)) == {"128"}
    assert len(re.findall(r"^processor\s*:", cpuinfo, re.M)) == 256


def test_both_configurations_are_filled_from_the_node_facts():
    facts = nhc_compare.node_facts()
    nhc = nhc_compare.fill("system.conf", facts)
    ours = nhc_compare.fill("system.toml", facts)
    assert "check_hw_cpuinfo %s %s %s" % (facts["SOCKETS"], facts["CORES"], facts["THREADS"]) in nhc
    assert 'allow = ["%s"]' % facts["KERNEL"] in ours
    assert "{" not in nhc.replace("{}", "")  # every field filled
