"""Host (reads rooted at a path) and the pure procfs/sysfs parsers."""
from __future__ import annotations

import os

import pytest

from slurm_hooks.host import Host, MissingFile, ParseError, format_cpulist, parse_cpulist
from slurm_hooks.parsers import parse_loadavg, parse_meminfo, parse_mounts, parse_swaps


def test_host_reads_under_root_and_missing_is_explicit(write_tree):
    root = write_tree({"proc/loadavg": "1.0 2.0 3.0 1/2 3\n", "sys/x/num": " 42\n", "sys/x/bad": "forty\n"})
    host = Host(root)
    assert host.read_text("/proc/loadavg") == "1.0 2.0 3.0 1/2 3"
    assert host.read_int("/sys/x/num") == 42
    assert host.read_text("/nope", default="d") == "d"
    assert host.read_int("/nope", default=None) is None
    with pytest.raises(MissingFile) as err:
        host.read_text("/sys/missing")
    assert err.value.path == "/sys/missing"
    with pytest.raises(ParseError, match="/sys/x/bad: cannot parse 'forty': expected an integer"):
        host.read_int("/sys/x/bad")


def test_host_reads_are_bounded(write_tree):
    host = Host(write_tree({"big": "x" * 5000}))
    assert len(host.read_text("/big", max_bytes=100)) == 100


@pytest.mark.parametrize("size,max_bytes", [(0, 1 << 20), (5, 1 << 20), (65536, 1 << 20), (65537, 1 << 20),
                                            (200000, 1 << 20), (200000, 65536), (200000, 70000), (200000, 1)])
def test_host_reads_whole_files_across_chunks_up_to_the_bound(write_tree, size, max_bytes):
    content = bytes(i % 251 for i in range(size))  # position-dependent: a lost or repeated chunk shows
    root = write_tree({"blob": content})
    assert Host(root).read_bytes("/blob", max_bytes=max_bytes) == content[:max_bytes]


def test_host_reads_procfs_files_longer_than_a_page():
    with open("/proc/self/maps", "rb") as handle:  # seq_file: returns at most a page per read(2)
        expected = handle.read()
    got = Host("/").read_bytes("/proc/self/maps")
    assert len(got) > 4096 or len(expected) <= 4096
    assert got.splitlines()[0] == expected.splitlines()[0] and got.count(b"\n") >= expected.count(b"\n") - 8


def test_realpath_stays_inside_root(tmp_path):
    root = tmp_path / "root"
    (root / "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0").mkdir(parents=True)
    (root / "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/vendor").write_text("0x10de\n")
    (root / "sys/bus/pci/devices").mkdir(parents=True)
    os.symlink("../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0", root / "sys/bus/pci/devices/0000:01:00.0")
    os.symlink("/etc", root / "abs")  # absolute link: must resolve inside the root, not to the real /etc
    host = Host(str(root))
    assert host.realpath("/sys/bus/pci/devices/0000:01:00.0") == "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"
    assert host.read_int("/sys/bus/pci/devices/0000:01:00.0/vendor", base=16) == 0x10DE
    assert host.realpath("/abs/passwd") == "/etc/passwd"
    assert not host.exists("/abs/passwd")


def test_read_kmsg_from_a_captured_file(write_tree):
    host = Host(write_tree({"dev/kmsg": "6,1,100,-;hello\n4,2,200,-;NVRM: Xid (PCI:0000:18:00): 79, x\n"}))
    assert host.read_kmsg() == ["6,1,100,-;hello", "4,2,200,-;NVRM: Xid (PCI:0000:18:00): 79, x"]
    assert host.read_kmsg(max_records=1) == ["4,2,200,-;NVRM: Xid (PCI:0000:18:00): 79, x"]


@pytest.mark.skipif(not os.path.exists("/dev/kmsg") or os.geteuid() != 0, reason="needs /dev/kmsg and root")
def test_read_live_kmsg_does_not_block():
    records = Host("/").read_kmsg(max_records=50)
    assert isinstance(records, list) and all(";" in r for r in records)


@pytest.mark.parametrize("text,expected", [
    ("0-3,8-11", {0, 1, 2, 3, 8, 9, 10, 11}),
    ("0", {0}),
    ("", set()),
    ("  5-6\n", {5, 6}),
    ("0-55,112-167", set(range(0, 56)) | set(range(112, 168))),
    ("0-6:2", {0, 2, 4, 6}),
])
def test_parse_cpulist(text, expected):
    assert parse_cpulist(text) == frozenset(expected)
    if expected and ":" not in text:
        assert parse_cpulist(format_cpulist(expected)) == frozenset(expected)


@pytest.mark.parametrize("text", ["a-b", "3-1", "1,,x", "-1", "0-99999999"])
def test_parse_cpulist_rejects_garbage(text):
    with pytest.raises(ParseError, match="a CPU list"):
        parse_cpulist(text, "/sys/x/cpulist")


def test_format_cpulist():
    assert format_cpulist({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    assert format_cpulist(set()) == ""


def test_parse_meminfo_system_and_node():
    assert parse_meminfo("MemTotal:       1000 kB\nMemFree: 20 kB\nHugePages_Total:   4\n") == \
        {"MemTotal": 1000, "MemFree": 20, "HugePages_Total": 4}
    assert parse_meminfo("Node 1 MemTotal:  500 kB\nNode 1 MemFree:   7 kB\n")["MemFree"] == 7
    with pytest.raises(ParseError, match="Key: <number>"):
        parse_meminfo("MemTotal: lots kB")


def test_parse_loadavg_mounts_swaps():
    assert parse_loadavg("0.34 0.25 0.11 1/84 4512\n").one == 0.34
    with pytest.raises(ParseError):
        parse_loadavg("garbage")
    mounts = parse_mounts("/dev/sda1 / ext4 rw,relatime 0 0\nsrv:/x /mnt/my\\040dir nfs ro,vers=4 0 0\n")
    assert mounts[1].mountpoint == "/mnt/my dir" and "ro" in mounts[1].options
    with pytest.raises(ParseError):
        parse_mounts("short line")
    swaps = parse_swaps("Filename Type Size Used Priority\n/dev/dm-1 partition 8388604 1024 -2\n")
    assert swaps[0].size_kb == 8388604 and swaps[0].used_kb == 1024
    assert parse_swaps("Filename Type Size Used Priority\n") == []


def test_parse_cpuinfo_topology():
    from slurm_hooks.parsers import parse_cpuinfo_topology

    text = ("processor\t: 0\nphysical id\t: 0\ncore id\t\t: 0\n\nprocessor\t: 1\nphysical id\t: 1\ncore id\t\t: 4\n\n"
            "processor\t: 2\nmodel name\t: Arm\n\nprocessor\t: 3\nphysical id\t: x\ncore id\t: 1\n")
    assert parse_cpuinfo_topology(text) == {0: (0, 0), 1: (1, 4)}


def test_symlink_loop_is_an_error_not_a_hang(tmp_path):
    from slurm_hooks.host import HostError

    root = tmp_path / "root"
    (root / "sys").mkdir(parents=True)
    os.symlink("b", root / "sys" / "a")
    os.symlink("a", root / "sys" / "b")
    with pytest.raises(HostError, match="too many levels"):
        Host(str(root)).read_text("/sys/a/x")
    with pytest.raises(HostError):  # a default covers a missing file, not a broken tree
        Host(str(root)).read_text("/sys/a/x", default="none")
