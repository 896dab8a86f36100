"""Host (reads rooted at a path) and the pure procfs/sysfs parsers."""

from __future__ import annotations

import os

import pytest

from slurm_hooks.hw.host import Host, MissingFile, ParseError, format_cpulist, parse_cpulist
from slurm_hooks.hw.procfs import parse_loadavg, parse_meminfo, parse_mounts, parse_swaps


def test_host_reads_under_root_and_missing_is_explicit(write_tree):
    root = write_tree(
        {"proc/loadavg": "1.0 2.0 3.0 1/2 3\n", "sys/x/num": " 42\n", "sys/x/bad": "forty\n"}
    )
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


@pytest.mark.parametrize(
    "size,max_bytes",
    [
        (0, 1 << 20),
        (5, 1 << 20),
        (65536, 1 << 20),
        (65537, 1 << 20),
        (200000, 1 << 20),
        (200000, 65536),
        (200000, 70000),
        (200000, 1),
    ],
)
def test_host_reads_whole_files_across_chunks_up_to_the_bound(write_tree, size, max_bytes):
    content = bytes(
        i % 251 for i in range(size)
    )  # position-dependent: a lost or repeated chunk shows
    root = write_tree({"blob": content})
    assert Host(root).read_bytes("/blob", max_bytes=max_bytes) == content[:max_bytes]


def test_host_reads_procfs_files_longer_than_a_page():
    with open("/proc/self/maps", "rb") as handle:  # seq_file: returns at most a page per read(2)
        expected = handle.read()
    got = Host("/").read_bytes("/proc/self/maps")
    assert len(got) > 4096 or len(expected) <= 4096
    assert (
        got.splitlines()[0] == expected.splitlines()[0]
        and got.count(b"\n") >= expected.count(b"\n") - 8
    )


def test_realpath_stays_inside_root(tmp_path):
    root = tmp_path / "root"
    (root / "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0").mkdir(parents=True)
    (root / "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/vendor").write_text("0x10de\n")
    (root / "sys/bus/pci/devices").mkdir(parents=True)
    os.symlink(
        "../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0",
        root / "sys/bus/pci/devices/0000:01:00.0",
    )
    os.symlink(
        "/etc", root / "abs"
    )  # absolute link: must resolve inside the root, not to the real /etc
    host = Host(str(root))
    assert (
        host.realpath("/sys/bus/pci/devices/0000:01:00.0")
        == "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"
    )
    assert host.read_int("/sys/bus/pci/devices/0000:01:00.0/vendor", base=16) == 0x10DE
    assert host.realpath("/abs/passwd") == "/etc/passwd"
    assert not host.exists("/abs/passwd")


def test_sibling_links_share_the_lstat_of_their_common_directories(tmp_path, monkeypatch):
    """/sys/bus/pci/devices/* all point into the same bridges' directories: each directory on the
    way is looked at (lstat) once per run, not once per link through it (a prolog resolves ~100
    such links: 593 lstat for the example node's PCI tree before, 165 after). A link met anywhere
    is still followed, and every path still resolves inside the root."""
    root = tmp_path / "root"
    bridge = root / "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"
    functions = ["0000:02:%02x.0" % i for i in range(20)]
    for function in functions:
        (bridge / function).mkdir(parents=True)
    (root / "sys/bus/pci/devices").mkdir(parents=True)
    for function in functions:
        os.symlink(
            "../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0/" + function,
            root / "sys/bus/pci/devices" / function,
        )
    os.symlink("0000:00:01.0", root / "sys/devices/pci0000:00/alias")  # a link in the middle
    looked = []
    islink = os.path.islink
    monkeypatch.setattr(os.path, "islink", lambda path: looked.append(path) or islink(path))
    host = Host(str(root))
    for function in functions:
        assert host.realpath("/sys/bus/pci/devices/" + function) == (
            "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/" + function
        )
    assert len(looked) == len(set(looked))  # no path looked at twice
    # the directories once, then each link and its target
    assert len(looked) <= 8 + 2 * len(functions)
    assert host.realpath("/sys/devices/pci0000:00/alias/0000:01:00.0") == (
        "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"
    )


def test_read_kmsg_from_a_captured_file(write_tree):
    host = Host(
        write_tree({"dev/kmsg": "6,1,100,-;hello\n4,2,200,-;NVRM: Xid (PCI:0000:18:00): 79, x\n"})
    )
    assert host.read_kmsg() == ["6,1,100,-;hello", "4,2,200,-;NVRM: Xid (PCI:0000:18:00): 79, x"]
    assert host.read_kmsg(max_records=1) == ["4,2,200,-;NVRM: Xid (PCI:0000:18:00): 79, x"]


@pytest.mark.skipif(
    not os.path.exists("/dev/kmsg") or os.geteuid() != 0, reason="needs /dev/kmsg and root"
)
def test_read_live_kmsg_does_not_block():
    records = Host("/").read_kmsg(max_records=50)
    assert isinstance(records, list) and all(";" in r for r in records)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("0-3,8-11", {0, 1, 2, 3, 8, 9, 10, 11}),
        ("0", {0}),
        ("", set()),
        ("  5-6\n", {5, 6}),
        ("0-55,112-167", set(range(0, 56)) | set(range(112, 168))),
        ("0-6:2", {0, 2, 4, 6}),
    ],
)
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
    assert parse_meminfo("MemTotal:       1000 kB\nMemFree: 20 kB\nHugePages_Total:   4\n") == {
        "MemTotal": 1000,
        "MemFree": 20,
        "HugePages_Total": 4,
    }
    assert parse_meminfo("Node 1 MemTotal:  500 kB\nNode 1 MemFree:   7 kB\n")["MemFree"] == 7
    with pytest.raises(ParseError, match="Key: <number>"):
        parse_meminfo("MemTotal: lots kB")


def test_parse_loadavg_mounts_swaps():
    assert parse_loadavg("0.34 0.25 0.11 1/84 4512\n").one == 0.34
    with pytest.raises(ParseError):
        parse_loadavg("garbage")
    mounts = parse_mounts(
        "/dev/sda1 / ext4 rw,relatime 0 0\nsrv:/x /mnt/my\\040dir nfs ro,vers=4 0 0\n"
    )
    assert mounts[1].mountpoint == "/mnt/my dir" and "ro" in mounts[1].options
    with pytest.raises(ParseError):
        parse_mounts("short line")
    swaps = parse_swaps("Filename Type Size Used Priority\n/dev/dm-1 partition 8388604 1024 -2\n")
    assert swaps[0].size_kb == 8388604 and swaps[0].used_kb == 1024
    assert parse_swaps("Filename Type Size Used Priority\n") == []


def test_parse_cpuinfo_topology():
    from slurm_hooks.hw.procfs import parse_cpuinfo_topology

    text = (
        "processor\t: 0\nphysical id\t: 0\ncore id\t\t: 0\n\nprocessor\t: 1\nphysical id\t: 1\ncore id\t\t: 4\n\n"
        "processor\t: 2\nmodel name\t: Arm\n\nprocessor\t: 3\nphysical id\t: x\ncore id\t: 1\n"
    )
    assert parse_cpuinfo_topology(text) == {0: (0, 0), 1: (1, 4)}


def test_symlink_loop_is_an_error_not_a_hang(tmp_path):
    from slurm_hooks.hw.host import HostError

    root = tmp_path / "root"
    (root / "sys").mkdir(parents=True)
    os.symlink("b", root / "sys" / "a")
    os.symlink("a", root / "sys" / "b")
    with pytest.raises(HostError, match="too many levels"):
        Host(str(root)).read_text("/sys/a/x")
    with pytest.raises(HostError):  # a default covers a missing file, not a broken tree
        Host(str(root)).read_text("/sys/a/x", default="none")


@pytest.mark.parametrize(
    "raw,expected",
    [
        (
            b"0-63\n\0",
            set(range(64)),
        ),  # Kunpeng 920, 5.x kernel: topology/*_list (tests/captures/128arm-...)
        (b"6\n\0", {6}),
        (b"\n\0", set()),
    ],
)
def test_sysfs_lists_may_end_with_newline_nul(write_tree, raw, expected):
    host = Host(write_tree({"sys/list": raw, "sys/id": b"-1\n\0"}))
    assert parse_cpulist(host.read_text("/sys/list"), "/sys/list") == frozenset(expected)
    assert host.read_int("/sys/id") == -1


@pytest.mark.parametrize(
    "text,expected",
    [
        ("00000000,0000000f", {0, 1, 2, 3}),
        ("f0", {4, 5, 6, 7}),
        ("00000001,00000000\n", {32}),
        ("0,ffffffff\n\0", set(range(32))),
    ],
)
def test_parse_cpumask(text, expected):
    from slurm_hooks.hw.host import parse_cpumask

    assert parse_cpumask(text) == frozenset(expected)


def test_parse_cpumask_rejects_garbage():
    from slurm_hooks.hw.host import parse_cpumask

    with pytest.raises(ParseError, match="/sys/x/thread_siblings.*a CPU mask"):
        parse_cpumask("zz,00", "/sys/x/thread_siblings")


@pytest.mark.parametrize(
    "text,models",
    [
        (
            "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) CPU           X7550  @ 2.00GHz\n",
            ["Intel(R) Xeon(R) CPU X7550 @ 2.00GHz"],
        ),
        (
            "processor\t: 0\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd4f\n",
            ["Neoverse-V2"],
        ),  # NVIDIA Grace
        ("processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd99\n", ["ARM part 0xd99"]),
        (
            "processor\t: 0\nCPU implementer\t: 0x99\nCPU part\t: 0x001\n",
            ["implementer 0x99 part 0x001"],
        ),
        (
            "processor\t: 0\ncpu\t\t: POWER10 (architected), altivec supported\n",
            ["POWER10 (architected), altivec supported"],
        ),
        (
            "processor\t: 0\nhart\t\t: 0\nisa\t\t: rv64imafdc\nuarch\t\t: sifive,u74-mc\n",
            ["sifive,u74-mc"],
        ),
        ("processor\t\t: 0\nModel Name\t\t: Loongson-3A6000\n", ["Loongson-3A6000"]),
        (
            "vendor_id       : IBM/S390\nprocessor 0: version = FF,  identification = 000123,  machine = 3931\n",
            ["IBM/S390 machine 3931"],
        ),
        ("processor\t: 0\nisa\t\t: rv64imafdcv\nmvendorid\t: 0x5b7\n", []),
    ],
)
def test_parse_cpuinfo_models(text, models):
    from slurm_hooks.hw.procfs import parse_cpuinfo_models

    assert parse_cpuinfo_models(text) == models


def test_read_log_records_what_a_host_touched(write_tree):
    from slurm_hooks.hw.host import ReadLog

    root = write_tree({"proc/loadavg": "1 2 3 1/2 3\n", "sys/d/a": "x", "sys/d/b": "y"})
    log = ReadLog()
    host = Host(root, log=log)
    host.read_text("/proc/loadavg")
    host.read_text("/proc/nope", default=None)
    host.listdir("/sys/d")
    host.exists("/sys/d/b")
    assert log.files == {"/proc/loadavg": b"1 2 3 1/2 3\n"}
    assert (
        log.dirs == {"/sys/d": ["a", "b"]}
        and "/sys/d/b" in log.probed
        and log.missing == {"/proc/nope"}
    )


def test_captured_statvfs_is_read_from_the_tree_never_the_analysing_disk(write_tree, tmp_path):
    from slurm_hooks.hw.host import LiveOnly

    usage = '{"/tmp": {"f_blocks": 1000, "f_bavail": 10, "f_files": 100, "f_favail": 50}}'
    host = Host(write_tree({".slurm-hooks/statvfs.json": usage, "tmp/x": ""}))
    assert host.captured_statvfs("/tmp") == (1000, 10, 100, 50)
    with pytest.raises(LiveOnly, match="did not stat it"):
        host.captured_statvfs("/scratch")
    (tmp_path / "bare" / "tmp").mkdir(parents=True)
    with pytest.raises(LiveOnly, match="only known on the running node"):
        Host(str(tmp_path / "bare")).captured_statvfs("/tmp")
    with pytest.raises(ParseError, match="statvfs.json"):
        Host(
            write_tree({".slurm-hooks/statvfs.json": "[1, 2]"}, root=tmp_path / "bad")
        ).captured_statvfs("/tmp")
