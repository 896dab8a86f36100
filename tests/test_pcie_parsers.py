"""Parser tables: PCI config space (binary and `lspci` text), cpulists, IB rates, gres.conf, hostlists, levels."""

from __future__ import annotations

import struct

import pytest

from slurm_hooks.checks.gpudirect import parse_kernel_version, parse_rate
from slurm_hooks.hw import pcie
from slurm_hooks.hw.host import ParseError, parse_cpulist
from slurm_hooks.hw.pcie import Level, PciNode
from slurm_hooks.slurm import cgroup, gres
from tests.fakenode import pci as fakepci


def bridge_config(port_type, acs_ctrl):
    """Config space as the fake node writes it (PM -> PCIe capability, AER -> ACS extended capability)."""
    dev = dict(
        vendor=0x1000,
        device=0xC030,
        port_type=port_type,
        bdf="0000:17:00.0",
        secondary=0x18,
        subordinate=0x18,
        gen=5,
        width=16,
        max_gen=5,
        max_width=16,
        acs_ctrl=acs_ctrl,
        **{"class": 0x060400},
    )
    return fakepci.config_space(dev)


def hex_dump(
    cfg, title="0000:17:00.0 PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0)"
):
    rows = [title] + [
        "%03x: %s" % (o, " ".join("%02x" % b for b in cfg[o : o + 16]))
        for o in range(0, len(cfg), 16)
    ]
    return "\n".join(rows) + "\n"


@pytest.mark.parametrize(
    "port_type,acs,expect_type,expect_acs",
    [
        (fakepci.PORT_DOWNSTREAM, fakepci.ACS_REDIRECT, pcie.PORT_DOWNSTREAM, 0x1D),
        (fakepci.PORT_DOWNSTREAM, 0, pcie.PORT_DOWNSTREAM, 0),
        (fakepci.PORT_ROOT, fakepci.ACS_SV, pcie.PORT_ROOT, 0x01),
        (
            fakepci.PORT_UPSTREAM,
            0,
            pcie.PORT_UPSTREAM,
            None,
        ),  # upstream ports carry no ACS capability
    ],
)
def test_binary_config_space(port_type, acs, expect_type, expect_acs):
    cfg = bridge_config(port_type, acs)
    assert pcie.pcie_port_type(cfg) == expect_type
    assert pcie.acs_control(cfg) == expect_acs
    assert pcie.acs_control(pcie.parse_lspci_hex_dump(hex_dump(cfg))) == expect_acs


def test_acs_flags_named_like_lspci():
    flags = pcie.acs_flags(fakepci.ACS_REDIRECT)
    assert flags == {
        "SrcValid": True,
        "TransBlk": False,
        "ReqRedir": True,
        "CmpltRedir": True,
        "UpstreamFwd": True,
        "EgressCtrl": False,
        "DirectTrans": False,
    }


def test_unprivileged_config_read_has_no_extended_capabilities():
    cfg = bridge_config(fakepci.PORT_DOWNSTREAM, fakepci.ACS_REDIRECT)[
        :64
    ]  # what a non-root read returns
    assert pcie.acs_control(cfg) is None and pcie.pcie_port_type(cfg) is None


def test_looping_capability_list_terminates():
    cfg = bytearray(bridge_config(fakepci.PORT_DOWNSTREAM, 0))
    struct.pack_into("<I", cfg, 0x148, 0x000D | (1 << 16) | (0x148 << 20))  # ACS points at itself
    assert pcie.extended_capabilities(bytes(cfg))[0x000D] == 0x148


def test_lspci_hex_dump_errors_name_the_line():
    with pytest.raises(ParseError, match="consecutive offsets"):
        pcie.parse_lspci_hex_dump("000: 86 80\n020: 00 00\n")
    with pytest.raises(ParseError, match="hex bytes"):
        pcie.parse_lspci_hex_dump("000: 86 zz\n")


@pytest.mark.parametrize(
    "text,expected",
    [
        (
            "\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-",
            {
                "SrcValid": True,
                "TransBlk": False,
                "ReqRedir": True,
                "CmpltRedir": True,
                "UpstreamFwd": True,
                "EgressCtrl": False,
                "DirectTrans": False,
            },
        ),
        (
            "\tCapabilities: [148 v1] Access Control Services\n\t\tACSCap:\tSrcValid+ TransBlk+\n\t\tACSCtl:\tSrcValid- "
            "TransBlk-",
            {"SrcValid": False, "TransBlk": False},
        ),
        ("\tCapabilities: [100 v2] Advanced Error Reporting", None),
    ],
)
def test_lspci_acsctl(text, expected):
    assert pcie.parse_lspci_acsctl(text) == expected


@pytest.mark.parametrize(
    "text,cpus",
    [
        ("0-3,8-11", {0, 1, 2, 3, 8, 9, 10, 11}),
        ("5", {5}),
        ("", set()),
        ("0-55,112-167\n", set(range(56)) | set(range(112, 168))),
    ],
)
def test_cpulists(text, cpus):
    assert parse_cpulist(text) == frozenset(cpus)


@pytest.mark.parametrize(
    "text,gbps",
    [
        ("400 Gb/sec (4X NDR)", 400.0),
        ("200 Gb/sec (4X HDR)", 200.0),
        ("2.5 Gb/sec (1X SDR)", 2.5),
        ("100 Gb/sec (2X HDR)", 100.0),
        ("25 Gb/sec (1X EDR)", 25.0),
        ("0 GB/sec", 0.0),
    ],
)
def test_ib_rates(text, gbps):
    assert parse_rate(text) == gbps


def test_ib_rate_garbage_names_the_file():
    with pytest.raises(ParseError, match="ports/1/rate"):
        parse_rate("fast", "/sys/class/infiniband/mlx5_0/ports/1/rate")


@pytest.mark.parametrize(
    "release,version", [("5.15.0-1042-nvidia", (5, 15)), ("6.8.0", (6, 8)), ("x", (0, 0))]
)
def test_kernel_versions(release, version):
    assert parse_kernel_version(release) == version


@pytest.mark.parametrize(
    "text,names",
    [
        ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
        ("gpu[01-02],login1", ["gpu01", "gpu02", "login1"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("node7", ["node7"]),
    ],
)
def test_hostlists(text, names):
    assert gres.expand_hostlist(text) == names


@pytest.mark.parametrize("bad", ["gpu[01-", "gpu[3-1]", "gpu[a-b]"])
def test_bad_hostlists(bad):
    with pytest.raises(ParseError, match="hostlist"):
        gres.expand_hostlist(bad)


def test_gres_conf_lines():
    conf = gres.parse_gres_conf(
        "# DGX nodes\n"
        "AutoDetect=off\n"
        "NodeName=gpu[01-16] Name=gpu Type=h100 File=/dev/nvidia[0-3] Cores=0-55\n"
        "NodeName=gpu[01-16] Name=gpu Type=h100 File=/dev/nvidia[4-7] Cores=56-111  # socket 1\n"
        "Name=gpu File=/dev/nvidia0 CPUs=0-3\n"
        "NodeName=gpu99 AutoDetect=nvml\n"
    )
    assert conf.autodetect == "off" and conf.autodetect_for("gpu99") == "nvml"
    lines = conf.gpu_lines("gpu07")
    assert [ln.files for ln in lines] == [
        tuple("/dev/nvidia%d" % i for i in range(4)),
        tuple("/dev/nvidia%d" % i for i in range(4, 8)),
        ("/dev/nvidia0",),
    ]
    assert lines[0].cores == frozenset(range(56)) and lines[1].cores == frozenset(range(56, 112))
    assert lines[2].cores == frozenset(range(4)) and lines[2].line_no == 5
    assert len(conf.gpu_lines("other")) == 1  # only the line without NodeName


def test_slurmd_minus_g_output_parses_like_gres_conf():
    text = (
        "slurmd: Gres Name=gpu Type=h100 Count=1 Index=0 ID=7696487 File=/dev/nvidia0 Cores=0-55 CoreCnt=224 "
        "Links=-1,0,0,0 Flags=HAS_FILE,HAS_TYPE,ENV_NVML\n"
    )
    (line,) = gres.parse_gres_conf(text, "slurmd -G").gpu_lines("any")
    assert line.files == ("/dev/nvidia0",) and line.cores == frozenset(range(56))


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("Name=gpu File=/dev/nvidia0 Cores=0-x\n", "gres.conf:1 Cores="),
        ("Name=gpu File /dev/nvidia0\n", "gres.conf:1"),
        ("NodeName=gpu[1- Name=gpu\n", "hostlist"),
    ],
)
def test_gres_conf_errors_name_file_and_line(text, fragment):
    with pytest.raises(ParseError, match=fragment.replace("[", r"\[")):
        gres.parse_gres_conf(text, "/etc/slurm/gres.conf")


def test_logical_cores_and_spec_mapping():
    # 2 sockets x 2 cores x 2 threads, Linux x86 numbering: first threads 0-3, siblings 4-7
    rows = [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1), (4, 0, 0), (5, 0, 1), (6, 1, 0), (7, 1, 1)]
    cores = gres.logical_cores(rows)
    assert cores == [frozenset({0, 4}), frozenset({1, 5}), frozenset({2, 6}), frozenset({3, 7})]
    assert gres.cores_to_cpus([1, 2, 9], cores) == (frozenset({1, 5, 2, 6}), [9])
    assert gres.spec_cpus([0, 3], cores) == frozenset(
        {0, 4, 1, 5}
    )  # abstract ids 0 and 3: cores 0 and 1


def test_slurm_node_line():
    text = (
        "NodeName=DEFAULT CoresPerSocket=56\nNodeName=gpu[01-04] CPUs=224 CpuSpecList=0,1 Gres=gpu:h100:8\n"
        "NodeName=login1 CPUs=8\n"
    )
    assert gres.parse_slurm_node_line(text, "gpu03")["cpuspeclist"] == "0,1"
    assert gres.parse_slurm_node_line(text, "gpu03")["corespersocket"] == "56"
    assert gres.parse_slurm_node_line(text, "gpu09") == {}


@pytest.mark.parametrize(
    "text,path",
    [
        ("0::/system.slice/sshd.service\n", "/system.slice/sshd.service"),
        (
            "12:cpuset:/slurm/uid_1000/job_7\n11:memory:/x\n1:name=systemd:/y\n",
            "/slurm/uid_1000/job_7",
        ),
        ("", ""),
    ],
)
def test_process_cgroup(text, path):
    assert cgroup.process_cgroup(text) == path


def test_interrupts():
    text = (
        "           CPU0       CPU1\n  0:         10          0   IO-APIC   2-edge      timer\n"
        " 120:          0          5  IR-PCI-MSIX-0000:19:00.0    0-edge      mlx5_comp0@pci:0000:19:00.0\n"
        " NMI:          0          0   Non-maskable interrupts\n"
    )
    assert cgroup.parse_interrupts(text) == [(0, "timer"), (120, "mlx5_comp0@pci:0000:19:00.0")]


ALL_CPUS = frozenset(range(224))  # what Linux gives a device without a NUMA node as local_cpulist
NODE_CPUS = {
    0: frozenset(range(0, 56)) | frozenset(range(112, 168)),
    1: frozenset(range(56, 112)) | frozenset(range(168, 224)),
}


def node(bdf, chain, bridge="pci0000:15", numa=0, locality=None):
    return PciNode(
        bdf, tuple(chain), bridge, numa, NODE_CPUS.get(numa, ALL_CPUS), locality=locality
    )


@pytest.mark.parametrize(
    "a,b,level",
    [
        # same switch: GPU and NIC behind two downstream ports of one switch
        (node("18", ["rp", "up", "dn0", "18"]), node("19", ["rp", "up", "dn1", "19"]), Level.PIX),
        # two functions of one card on a root port
        (node("aa.0", ["rp", "aa.0"]), node("aa.1", ["rp", "aa.1"]), Level.PIX),
        # nested switches: the GPU sits behind a second switch
        (
            node("g", ["rp", "up", "dn0", "up2", "dn2", "g"]),
            node("n", ["rp", "up", "dn1", "n"]),
            Level.PXB,
        ),
        # two root ports of one host bridge
        (node("g", ["rp1", "g"]), node("n", ["rp2", "n"]), Level.PHB),
        (node("g", ["rp1", "g"]), node("n", ["rp2", "n"], bridge="pci0000:3f"), Level.NODE),
        (node("g", ["rp1", "g"]), node("n", ["rp2", "n"], bridge="pci0000:97", numa=1), Level.SYS),
        # numa_node -1 (issue 18): not "the same node as anything". The nearest bridge's node when one has it ...
        (
            node("g", ["rp1", "g"], numa=-1, locality=1),
            node("n", ["rp2", "n"], bridge="pci0000:97", numa=1),
            Level.NODE,
        ),
        (
            node("g", ["rp1", "g"], numa=-1, locality=0),
            node("n", ["rp2", "n"], bridge="pci0000:97", numa=1),
            Level.SYS,
        ),
        # ... else the CPU affinity: every CPU next to one node's is SYS, two devices without a node are NODE
        (
            node("g", ["rp1", "g"], numa=-1),
            node("n", ["rp2", "n"], bridge="pci0000:97", numa=1),
            Level.SYS,
        ),
        (
            node("g", ["rp1", "g"], numa=-1),
            node("n", ["rp2", "n"], bridge="pci0000:97", numa=-1),
            Level.NODE,
        ),
        # a PCIe-to-PCI bridge (port type 7) below a root port counts like a switch: two devices behind it are PIX
        (node("a", ["rp", "br", "a"]), node("b", ["rp", "br", "b"]), Level.PIX),
    ],
)
def test_path_levels(a, b, level):
    assert pcie.path_level(a, b) == level and pcie.path_level(b, a) == level


def test_vmd_domains_keep_their_digits_and_their_own_host_bridge(write_tree):
    """NVMe behind Intel VMD: the real sysfs shape (md-raid-utilities/ledmon issue #56, /sys/block/nvme*n1 links):
    ../devices/pci0000:d7/0000:d7:05.5/pci10001:00/10001:00:00.0/10001:01:00.0. The VMD domain is its own host
    bridge below the VMD endpoint of domain 0000; its bus ids keep all five digits."""
    from slurm_hooks.hw.host import Host

    files = {}
    for rp, dev in (("10001:00:00.0", "10001:01:00.0"), ("10001:00:01.0", "10001:02:00.0")):
        real = "sys/devices/pci0000:d7/0000:d7:05.5/pci10001:00/%s/%s" % (rp, dev)
        files[real + "/numa_node"] = "1\n"
        files[real + "/local_cpulist"] = "56-111,168-223\n"
    root = write_tree(files)
    import os

    os.makedirs(os.path.join(root, "sys/bus/pci/devices"))
    for rel in (
        "0000:d7:05.5",
        "0000:d7:05.5/pci10001:00/10001:00:00.0",
        "0000:d7:05.5/pci10001:00/10001:00:01.0",
        "0000:d7:05.5/pci10001:00/10001:00:00.0/10001:01:00.0",
        "0000:d7:05.5/pci10001:00/10001:00:01.0/10001:02:00.0",
    ):
        os.makedirs(os.path.join(root, "sys/devices/pci0000:d7", rel), exist_ok=True)
        os.symlink(
            "../../../devices/pci0000:d7/" + rel,
            os.path.join(root, "sys/bus/pci/devices", rel.split("/")[-1]),
        )
    tree = pcie.read_pci_tree(Host(root))
    nvme0 = tree.nodes["10001:01:00.0"]
    assert (nvme0.host_bridge, nvme0.chain, nvme0.numa_node) == (
        "pci10001:00",
        ("10001:00:00.0", "10001:01:00.0"),
        1,
    )
    assert tree.nodes["0000:d7:05.5"].host_bridge == "pci0000:d7"
    assert (
        tree.level("10001:01:00.0", "10001:02:00.0") is Level.PHB
    )  # two root ports of the VMD host bridge


def test_levels_parse_and_map_nvml():
    assert (
        Level.parse("pxb") is Level.PXB
        and Level.from_nvml(0) is Level.PIX
        and Level.from_nvml(50) is Level.SYS
    )
    assert Level.from_nvml(7) is None
    with pytest.raises(ValueError, match="not a topology level"):
        Level.parse("NV12")
