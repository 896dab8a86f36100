"""Tests for slurm_hooks.xid.kmsg (kernel-log parsing) and slurm_hooks.xid.catalog (the packaged Xid catalog, classification)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_hooks.xid import catalog as X
from slurm_hooks.xid import kmsg as K
from slurm_hooks.xid.catalog import (
    Classification,
    XidCatalog,
    classify,
    classify_all,
    classify_sxid,
    explain,
    load_catalog,
    validate_overrides,
)
from slurm_hooks.xid.kmsg import (
    KmsgRecord,
    SxidEvent,
    XidEvent,
    normalize_pci,
    parse_kmsg_record,
    parse_sxid,
    parse_xid,
    scan,
    scan_sxid,
)

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."


def ev(xid: int, text: str = "", pci: str = "0000:3b:00.0") -> XidEvent:
    return XidEvent(xid=xid, pci=pci, pid=None, process=None, text=text)


# ------------------------------------------------------------------------------------------
# parse_kmsg_record
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line, expected",
    [
        # /dev/kmsg
        (
            "6,339,5140900,-;" + XID79,
            dict(
                source="kmsg", priority=6, seq=339, usec=5140900, message=XID79, continuation=False
            ),
        ),
        (
            "3,1000,2000,c,caller=T123;NVRM: part one",
            dict(
                source="kmsg",
                priority=3,
                seq=1000,
                usec=2000,
                message="NVRM: part one",
                continuation=True,
            ),
        ),
        (
            "<4>,7,8,-;hello; world",
            dict(source="kmsg", priority=4, seq=7, usec=8, message="hello; world"),
        ),
        ("6,1,2,-;", dict(source="kmsg", seq=1, message="")),
        # plain dmesg
        (
            "[12345.678901] " + XID79,
            dict(source="dmesg", usec=12345678901, seq=None, message=XID79),
        ),
        ("[    1.5] NVRM: loading", dict(source="dmesg", usec=1500000, message="NVRM: loading")),
        # journalctl -o short-monotonic
        (
            "[ 7.000001] gpu01 kernel: " + XID79,
            dict(source="dmesg", usec=7000001, host="gpu01", message=XID79),
        ),
        # dmesg -T
        (
            "[Wed Dec  2 10:00:00 2026] " + XID79,
            dict(source="dmesg-T", wallclock="Wed Dec  2 10:00:00 2026", usec=None, message=XID79),
        ),
        # journalctl -k
        (
            "Dec 02 10:00:00 gpu01 kernel: " + XID79,
            dict(source="journal", wallclock="Dec 02 10:00:00", host="gpu01", message=XID79),
        ),
        (
            "Dec  2 10:00:00 gpu01 kernel: [ 99.000002] " + XID79,
            dict(source="journal", host="gpu01", usec=99000002, message=XID79),
        ),
        (
            "2026-12-02T10:00:00+0000 gpu01 kernel: " + XID79,
            dict(
                source="journal", wallclock="2026-12-02T10:00:00+0000", host="gpu01", message=XID79
            ),
        ),
        # trailing newline stripped, bytes accepted
        ("6,2,3,-;msg\n", dict(source="kmsg", message="msg")),
        (b"6,2,3,-;msg", dict(source="kmsg", message="msg")),
    ],
)
def test_parse_kmsg_record_formats(line, expected):
    rec = parse_kmsg_record(line)
    assert isinstance(rec, KmsgRecord)
    for k, v in expected.items():
        assert getattr(rec, k) == v, k


def test_kmsg_level_from_priority():
    assert parse_kmsg_record("30,1,1,-;x").level == 6  # facility 3 (daemon), level 6
    assert parse_kmsg_record("[1.0] x").level is None


@pytest.mark.parametrize(
    "line",
    [
        "",
        "\n",
        " SUBSYSTEM=pci",  # kmsg continuation (dictionary) lines
        " DEVICE=+pci:0000:3b:00.0",
        "\tKEY=value",
        "garbage",
        "6,abc,1,-;msg",  # seq not a number
        "6,1;msg",  # truncated header
        "6,1,2,-",  # no ';'
        "[abc] msg",
        "[Wed Dec  2 10:00 2026] msg",  # no seconds (the day and month names are LC_TIME's: any word)
        "Dec 02 10:00:00 gpu01 systemd[1]: Started foo",  # not a kernel line
        "x" * (K.MAX_LINE + 1),
        "6,1,2,-;" + "A" * (K.MAX_LINE + 10),
        b"\xff\xfe\x00\x81garbage".decode("utf-8", "replace"),
        None,
        12345,
    ],
)
def test_parse_kmsg_record_rejects(line):
    assert parse_kmsg_record(line) is None


# ------------------------------------------------------------------------------------------
# parse_xid
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "message, xid, pci, pid, process, text",
    [
        (XID79, 79, "0000:3b:00.0", 1234, "python", "GPU has fallen off the bus."),
        (
            "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
            79,
            "0000:3b:00.0",
            None,
            None,
            "GPU has fallen off the bus.",
        ),
        (
            "NVRM: Xid (PCI:0000:3b:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception: ESR 0x405840=0x80",
            13,
            "0000:3b:00.0",
            None,
            None,
            "Graphics Exception: ESR 0x405840=0x80",
        ),
        (
            "NVRM: Xid (0000:3b:00): 31, pid=4321, name=pt_main_thread, Ch 00000010, intr 00000000. MMU Fault",
            31,
            "0000:3b:00.0",
            4321,
            "pt_main_thread",
            "Ch 00000010, intr 00000000. MMU Fault",
        ),
        (
            "NVRM: Xid (0000:3b:00): 31, pid=..., name=..., MMU Fault",
            31,
            "0000:3b:00.0",
            None,
            "...",
            "MMU Fault",
        ),
        (
            "NVRM: Xid (PCI:0001:00:00): 48, pid=77, An uncorrectable double bit error (DBE) has been detected on GPU "
            "in the framebuffer at partition 1, subpartition 0.",
            48,
            "0001:00:00.0",
            77,
            None,
            "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 1, "
            "subpartition 0.",
        ),
        (
            "NVRM: Xid (PCI:0000:18:00): 94, pid=910, name=python3, Contained: SM (0x1). RST: No, D-RST: No",
            94,
            "0000:18:00.0",
            910,
            "python3",
            "Contained: SM (0x1). RST: No, D-RST: No",
        ),
        (
            "NVRM: Xid (PCI:0003:00:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link "
            "14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
            74,
            "0003:00:00.0",
            None,
            None,
            "NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
        ),
        (
            "NVRM: Xid (PCI:0000:65:00): 74, pid=<n/a>, name=<unknown>, NVLink: fatal error detected on link 2",
            74,
            "0000:65:00.0",
            None,
            None,
            "NVLink: fatal error detected on link 2",
        ),
        (
            "NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000)",
            149,
            "0018:01:00.0",
            None,
            None,
            "NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000)",
        ),
        (
            "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
            154,
            "0000:3b:00.0",
            None,
            None,
            "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
        ),
        (
            "NVRM: Xid (0000:03:00): 14, Channel 00000001",
            14,
            "0000:03:00.0",
            None,
            None,
            "Channel 00000001",
        ),
        (
            "NVRM: Xid (PCI:0000:B3:00.0): 63, pid=1, Row Remapper: New row marked for remapping",
            63,
            "0000:b3:00.0",
            1,
            None,
            "Row Remapper: New row marked for remapping",
        ),
        (
            "NVRM: Xid (PCI:0000:3b:00): 43, pid=55, name=a b c, Ch 00000008",
            43,
            "0000:3b:00.0",
            55,
            "a b c",
            "Ch 00000008",
        ),
        ("NVRM: Xid (PCI:0000:3b:00): 79", 79, "0000:3b:00.0", None, None, ""),
        # still found behind a log prefix
        (
            "Dec 02 10:00:00 gpu01 kernel: " + XID79,
            79,
            "0000:3b:00.0",
            1234,
            "python",
            "GPU has fallen off the bus.",
        ),
    ],
)
def test_parse_xid_variants(message, xid, pci, pid, process, text):
    e = parse_xid(message)
    assert e is not None
    assert (e.xid, e.pci, e.pid, e.process, e.text) == (xid, pci, pid, process, text)


@pytest.mark.parametrize(
    "message",
    [
        "",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
        "NVRM: GPU at PCI:0000:3b:00: GPU-b850f46d-d5ea-c752-ddf3-c4453e44d3f7",
        "NVRM: Xid (PCI:0000:3b:00): , pid=1",  # no number
        "NVRM: Xid (PCI:0000:3b:00): abc",
        "NVRM: Xid (PCI:0000:3b:00",  # truncated
        "NVRM: Xid (PCI:zzzz:3b:00): 79, x",  # not an address
        "NVRM: Xid (PCI:0000:3b:ff): 79, x",  # device number out of range
        "NVRM: Xid (PCI:0000:3b:00): 79123456, x",  # absurd code
        "Xid 79 GPU has fallen off the bus",  # not a driver line
        "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 14 LTSSM Fault Up",
        "x" * (K.MAX_LINE + 1),
        "NVRM: Xid (PCI:0000:3b:00): 79, " + "y" * K.MAX_LINE,
        b"\x80\x81NVRM: Xid (\xff".decode("utf-8", "replace"),
        None,
    ],
)
def test_parse_xid_rejects(message):
    assert parse_xid(message) is None


@pytest.mark.parametrize(
    "addr, expected",
    [
        ("PCI:0000:3b:00", "0000:3b:00.0"),
        ("0000:3B:00", "0000:3b:00.0"),
        ("00000000:3B:00.0", "0000:3b:00.0"),
        ("0001:00:00", "0001:00:00.0"),
        ("3b:00.1", "0000:3b:00.1"),
        ("10000:01:00", "10000:01:00.0"),
        ("0000:3b", None),
        ("0000:3b:00.9", None),
        ("nonsense", None),
    ],
)
def test_normalize_pci(addr, expected):
    assert normalize_pci(addr) == expected


# ------------------------------------------------------------------------------------------
# parse_sxid
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "message, sxid, switch, pci, severity, link, text",
    [
        (
            "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 14 LTSSM Fault Up",
            20034,
            0,
            "0000:05:00.0",
            "Fatal",
            14,
            "Link 14 LTSSM Fault Up",
        ),
        (
            "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)",
            12028,
            3,
            "0000:05:00.0",
            "Non-fatal",
            32,
            "Link 32 egress non-posted PRIV error (First)",
        ),
        (
            "[123.456789] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 20009, Non-fatal, Link 28 RX Short Error Rate",
            20009,
            0,
            "0000:c3:00.0",
            "Non-fatal",
            28,
            "Link 28 RX Short Error Rate",
        ),
        (
            "nvidia-nvswitch2: SXid (PCI:0000:0b:00.0): 11001, Fatal, ingress invalid command",
            11001,
            2,
            "0000:0b:00.0",
            "Fatal",
            None,
            "ingress invalid command",
        ),
        (
            "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 22013, Minion Link 4 NA interrupt",
            22013,
            1,
            "0000:06:00.0",
            None,
            4,
            "Minion Link 4 NA interrupt",
        ),
    ],
)
def test_parse_sxid(message, sxid, switch, pci, severity, link, text):
    e = parse_sxid(message)
    assert isinstance(e, SxidEvent)
    assert (e.sxid, e.switch, e.pci, e.severity, e.link, e.text) == (
        sxid,
        switch,
        pci,
        severity,
        link,
        text,
    )
    assert e.fatal is (None if severity is None else severity == "Fatal")


@pytest.mark.parametrize(
    "message",
    [
        "",
        XID79,
        "nvidia-nvswitch0: SXid (PCI:garbage): 1, Fatal",
        "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): Fatal",
        "nvidia-nvswitch0: probe",
        None,
    ],
)
def test_parse_sxid_rejects(message):
    assert parse_sxid(message) is None


# ------------------------------------------------------------------------------------------
# Fuzz: nothing ever raises
# ------------------------------------------------------------------------------------------

_PREFIXES = st.sampled_from(
    [
        "",
        "6,1,2,-;",
        "[1.0] ",
        "[Wed Dec  2 10:00:00 2026] ",
        "Dec 02 10:00:00 h kernel: ",
        " ",
        "NVRM: Xid (",
        "NVRM: Xid (PCI:0000:3b:00): ",
        "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): ",
        "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Severity ",
        "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Data {",
        "kern  :err   : [1.0] ",
        "<12>[1.0] ",
        "12,1,2,-;",
    ]
)


@settings(max_examples=400, deadline=None)
@given(prefix=_PREFIXES, body=st.text(max_size=300))
def test_fuzz_text_never_raises(prefix, body):
    line = prefix + body
    rec = parse_kmsg_record(line)
    assert rec is None or isinstance(rec, KmsgRecord)
    e = parse_xid(line)
    assert e is None or (isinstance(e, XidEvent) and isinstance(e.xid, int))
    s = parse_sxid(line)
    assert s is None or isinstance(s, SxidEvent)
    if e is not None:
        c = classify(e)
        assert c.status in X.STATUSES and c.action in X.ACTIONS and c.blame in X.BLAMES
    assert isinstance(scan([line, line]), list)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=400))
def test_fuzz_bytes_never_raise(data):
    assert parse_kmsg_record(data) is None or True
    text = data.decode("utf-8", "replace")
    parse_kmsg_record(text)
    parse_xid(text)
    parse_sxid(data)
    scan([data, text])
    scan_sxid([data, text])


def test_random_garbage_returns_none():
    assert parse_kmsg_record(b"\x00\x01\x02\xff\xfe") is None
    assert parse_xid(b"\x00\x01\x02\xff\xfe") is None


# ------------------------------------------------------------------------------------------
# Catalog integrity
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cat() -> XidCatalog:
    return load_catalog()


def test_catalog_source_and_date_present(cat):
    src = cat.source
    assert src["url"] == "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
    assert src["title"] == "Analyzing Xid Errors with the Xid Catalog"
    assert src["retrieved"] == "2026-12-02"
    assert src["newest_driver_referenced"] == "R575"
    assert cat.version and cat.schema_version == 1
    assert cat.sxid["source"]["url"].startswith("https://docs.nvidia.com/")


def test_catalog_entries_valid(cat):
    entries = list(cat)
    assert len(entries) == 172
    numbers = [e.xid for e in entries]
    assert numbers == sorted(set(numbers)), "Xid numbers must be unique"
    assert numbers == list(range(1, 173))
    for e in entries:
        assert e.immediate in X.IMMEDIATE_BUCKETS, e.xid
        assert e.immediate in cat.buckets, e.xid
        assert e.investigatory in cat.investigatory_buckets, e.xid
        assert e.mnemonic and e.description and e.component, e.xid
        assert set(e.applies_to) <= {"A100", "H100", "B100", "GB200"}, e.xid
        if e.job_caused:
            assert e.job_caused_basis, e.xid


def test_catalog_raw_json_keys_unique():
    import importlib.resources as ir

    path = ir.files("slurm_hooks") / "data" / "xid_catalog.json"

    def no_dupes(pairs):
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), keys
        return dict(pairs)

    json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=no_dupes)


@pytest.mark.parametrize(
    "xid, immediate, investigatory, job_caused, component",
    [
        (13, "RESTART_APP", "WORKFLOW_XID_13", True, "graphics-compute"),
        (31, "RESTART_APP", "WORKFLOW_XID_31", True, "mmu"),
        (32, "RESTART_APP", "CHECK_APP/CUDA", False, "pcie"),
        (38, "IGNORE", "CONTACT_SUPPORT", False, "graphics-firmware"),
        (43, "IGNORE", "CONTACT_SUPPORT", True, "gpu"),
        (44, "IGNORE", "CONTACT_SUPPORT", False, "graphics-compute"),
        (45, "WORKFLOW_XID_45", "WORKFLOW_XID_45", True, "gpu"),
        (48, "WORKFLOW_XID_48", "WORKFLOW_XID_48", False, "gpu-memory"),
        (61, "CONTACT_SUPPORT", "N/A", False, "pmu"),
        (62, "RESET_GPU", "CONTACT_SUPPORT", False, "pmu"),
        (63, "IGNORE", "IGNORE", False, "gpu-memory"),
        (64, "RESET_GPU", "CONTACT_SUPPORT", False, "gpu-memory"),
        (68, "RESTART_APP", "CONTACT_SUPPORT", False, "video-decoder"),
        (69, "RESTART_APP", "CHECK_APP/CUDA", True, "graphics-compute"),
        (74, "WORKFLOW_NVLINK_ERR", "CONTACT_SUPPORT", False, "nvlink"),
        (79, "RESTART_BM", "CONTACT_SUPPORT", False, "pcie"),
        (92, "IGNORE", "CONTACT_SUPPORT", False, "gpu-memory"),
        (94, "RESTART_APP", "IGNORE (sympathetic)", False, "gpu-memory"),
        (95, "RESET_GPU", "IGNORE (sympathetic)", False, "gpu-memory"),
        (109, "RESET_GPU", "CONTACT_SUPPORT", False, "gpu"),
        (110, "RESET_GPU", "INVESTIGATE_SW", False, "security"),
        (119, "RESET_GPU", "INVESTIGATE_SW", False, "gsp"),
        (120, "RESET_GPU", "INVESTIGATE_SW", False, "gsp"),
        (121, "IGNORE", "CONTACT_SUPPORT", False, "c2c"),
        (136, "RESET_GPU", "INVESTIGATE_LINK_SI", False, "nvlink"),
        (137, "IGNORE", "XID_137_FLOW", True, "nvlink"),
        (140, "RESET_GPU", "CONTACT_SUPPORT", False, "gpu-memory"),
        (143, "RESET_GPU", "CONTACT_SUPPORT", False, "gpu"),
        (144, "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", False, "nvlink"),
        (150, "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", False, "nvlink"),
        (154, "XID_154", "N/A", False, "gpu"),
        (159, "CHECK_UVM", "SYMPATHETIC_REPORT_SOLO", False, "c2c"),
        (167, "UNKNOWN", "UNKNOWN", False, "pcie"),
    ],
)
def test_catalog_known_rows(cat, xid, immediate, investigatory, job_caused, component):
    e = cat.lookup(xid)
    assert e is not None
    assert (e.immediate, e.investigatory, e.job_caused, e.component) == (
        immediate,
        investigatory,
        job_caused,
        component,
    )


def test_catalog_lookup_misses(cat):
    assert cat.lookup(0) is None
    assert cat.lookup(9999) is None
    assert cat.lookup("nope") is None  # type: ignore[arg-type]
    assert cat.lookup(79).mnemonic == "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"
    assert 79 in cat and 9999 not in cat


def test_catalog_rejects_bad_data(cat):
    data = json.loads(json.dumps(cat.raw))
    data["xids"].append(dict(data["xids"][0]))
    with pytest.raises(ValueError, match="duplicate entry for Xid 1"):
        XidCatalog(data=data)
    data = json.loads(json.dumps(cat.raw))
    data["xids"][78]["immediate"] = "PRAY"
    with pytest.raises(ValueError, match="Xid 79 has unknown bucket 'PRAY'"):
        XidCatalog(data=data)


def test_catalog_loads_from_path(tmp_path, cat):
    p = tmp_path / "c.json"
    p.write_text(json.dumps(cat.raw), encoding="utf-8")
    assert len(XidCatalog(path=p)) == len(cat)


# ------------------------------------------------------------------------------------------
# Classification
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "xid, text, status, action, blame",
    [
        # RESET_GPU
        (62, "", "FAIL", "reset-gpu", "node"),
        (64, "", "FAIL", "reset-gpu", "node"),
        (95, "", "FAIL", "reset-gpu", "node"),
        (109, "", "FAIL", "reset-gpu", "node"),
        (119, "", "FAIL", "reset-gpu", "node"),
        (140, "", "FAIL", "reset-gpu", "node"),
        # RESTART_BM
        (79, "GPU has fallen off the bus.", "FAIL", "reboot", "node"),
        # RESTART_VM
        (151, "", "FAIL", "reboot", "node"),
        # CONTACT_SUPPORT
        (61, "", "FAIL", "drain", "node"),
        (142, "", "FAIL", "drain", "node"),
        # CHECK_MECHANICALS / UPDATE_SWFW / CHECK_UVM
        (54, "", "FAIL", "drain", "node"),
        (78, "", "FAIL", "drain", "node"),
        (159, "", "FAIL", "reset-gpu", "node"),
        # RESTART_APP: the application stopped, the node stays in service; blamed on the job only where the
        # catalog says the application typically causes it
        (13, "Graphics Exception", "WARN", "none", "job"),
        (31, "MMU Fault", "WARN", "none", "job"),
        (
            32,
            "",
            "WARN",
            "none",
            "node",
        ),  # push buffer DMA faults reflect PCIe quality, not the application
        # Xid 94, contained ECC error: a hardware error that killed the job (issue 13 section 4)
        (94, "Contained: SM (0x1)", "WARN", "none", "node"),
        (94, "Contained: SM (0x1). RST: No, D-RST: No", "WARN", "none", "node"),
        # IGNORE
        (43, "", "OK", "none", "job"),
        (63, "", "OK", "none", "node"),
        (92, "", "OK", "none", "node"),
        (121, "", "OK", "none", "node"),
        # WORKFLOW_XID_48
        (48, "An uncorrectable double bit error (DBE)", "FAIL", "reset-gpu", "node"),
        # WORKFLOW_NVLINK_ERR
        (
            74,
            "NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
            "FAIL",
            "reset-gpu",
            "node",
        ),
        (74, "NVLink: fatal error detected on link 2", "FAIL", "reset-gpu", "node"),
        (
            74,
            "NVLink: fatal error detected on link 14(0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
            "FAIL",
            "reset-gpu",
            "node",
        ),
        (
            74,
            "NVLink: error on link 3(0x800001, 0x0, 0x0, 0x0, 0x100000, 0x0, 0x0)",
            "WARN",
            "none",
            "node",
        ),
        (
            74,
            "NVLink: error on link 3(0x800003, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
            "FAIL",
            "reset-gpu",
            "node",
        ),
        # WORKFLOW_NVLINK5_ERR
        (
            149,
            "NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000)",
            "FAIL",
            "reset-gpu",
            "node",
        ),
        (
            149,
            "NETIR_BER_EVENT Nonfatal XC0 i0 Link 03 (0x00086226 0x00000001)",
            "WARN",
            "none",
            "node",
        ),
        (145, "RLW_REMAP", "UNKNOWN", "none", "check"),
        # XID_154
        (
            154,
            "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
            "FAIL",
            "reboot",
            "node",
        ),
        (
            154,
            "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
            "FAIL",
            "reset-gpu",
            "node",
        ),
        (
            154,
            "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)",
            "OK",
            "none",
            "node",
        ),
        (
            154,
            "GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)",
            "FAIL",
            "drain",
            "node",
        ),
        (
            154,
            "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
            "FAIL",
            "reset-gpu",
            "node",
        ),
        (154, "something new", "WARN", "none", "node"),
        # the catalog lists it without a bucket: our own decision (tracker 23), see test_xid_corpus.py
        (167, "", "FAIL", "reboot", "node"),
        (172, "", "FAIL", "reset-gpu", "node"),
        (163, "", "WARN", "none", "node"),
        # not in the catalog at all
        (500, "", "UNKNOWN", "none", "check"),
    ],
)
def test_classify_table(xid, text, status, action, blame):
    c = classify(ev(xid, text))
    assert isinstance(c, Classification)
    assert (c.status, c.action, c.blame) == (status, action, blame)
    assert c.xid == xid and c.reason and not c.overridden


def test_classify_every_catalog_entry_is_well_formed(cat):
    for e in cat:
        c = classify(ev(e.xid))
        assert c.status in X.STATUSES and c.action in X.ACTIONS and c.blame in X.BLAMES, e.xid
        if c.status in ("OK", "WARN", "UNKNOWN"):
            assert c.action == "none", e.xid
        if c.status == "UNKNOWN":
            assert c.blame == "check", e.xid
        if c.blame == "job":
            assert c.status in ("OK", "WARN"), e.xid  # a job-caused Xid never drains by default


def test_classify_values_match_result_enums():
    from slurm_hooks.result import Action, Blame, Status

    assert set(X.STATUSES) <= {s.value for s in Status}
    assert set(X.ACTIONS) == {a.value for a in Action}
    assert set(X.BLAMES) == {b.value for b in Blame}


def test_classify_xid45_solo_vs_with_others():
    solo = classify(ev(45), related=[])
    assert (solo.status, solo.action, solo.blame) == ("WARN", "none", "job")
    assert "Fabric Manager" in solo.reason
    with48 = classify(ev(45), related=[48, 45])
    assert (with48.status, with48.action, with48.blame) == ("OK", "none", "job")
    assert "48" in with48.reason


def test_classify_xid48_with_remap():
    c = classify(ev(48), related=[63])
    assert (c.status, c.action) == ("FAIL", "reset-gpu")
    assert "drain and reset" in c.reason
    assert "drain and reset" not in classify(ev(48)).reason


def test_classify_all_groups_by_gpu():
    events = [ev(48, pci="0000:3b:00.0"), ev(45, pci="0000:3b:00.0"), ev(45, pci="0000:86:00.0")]
    cs = classify_all(events)
    assert [(c.xid, c.status) for c in cs] == [(48, "FAIL"), (45, "OK"), (45, "WARN")]


# ------------------------------------------------------------------------------------------
# Overrides
# ------------------------------------------------------------------------------------------


def test_overrides_applied():
    ov = {
        "79": {"status": "FAIL", "action": "rma"},
        "13": {"status": "OK"},
        92: {"status": "WARN"},
        "500": {"status": "FAIL", "action": "drain", "reason": "site policy"},
    }
    c79 = classify(ev(79), ov)
    assert (c79.status, c79.action, c79.blame, c79.overridden) == ("FAIL", "rma", "node", True)
    c13 = classify(ev(13), ov)
    assert (c13.status, c13.action, c13.blame) == ("OK", "none", "job")
    assert "operator override" in c13.reason and "WARN" in c13.reason
    c92 = classify(ev(92), ov)
    assert (c92.status, c92.action) == ("WARN", "none")
    c500 = classify(ev(500), ov)
    assert (c500.status, c500.action, c500.blame, c500.reason) == (
        "FAIL",
        "drain",
        "node",
        "site policy",
    )
    # untouched Xids keep the catalog decision
    assert classify(ev(64), ov).overridden is False


def test_override_fail_status_only_picks_sane_action():
    c = classify(ev(13), {"13": {"status": "FAIL"}})
    assert (c.status, c.action, c.blame) == ("FAIL", "drain", "node")
    c = classify(ev(79), {"79": {"status": "FAIL", "blame": "job"}})
    assert (c.status, c.action, c.blame) == ("FAIL", "reboot", "job")


def test_override_action_only_implies_fail():
    c = classify(ev(31), {"31": {"action": "reset-gpu"}})
    assert (c.status, c.action, c.blame) == ("FAIL", "reset-gpu", "node")
    c = classify(ev(79), {"79": {"action": "none"}})
    assert (c.status, c.action) == ("WARN", "none")


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"79": {"severity": "FAIL"}}, r"Xid 79: unknown key 'severity'"),
        ({"79": {"status": "BROKEN"}}, r"Xid 79: key 'status' has invalid value 'BROKEN'"),
        ({"13": {"action": "explode"}}, r"Xid 13: key 'action' has invalid value 'explode'"),
        ({"13": {"blame": "user"}}, r"Xid 13: key 'blame' has invalid value 'user'"),
        (
            {"13": {"status": "OK", "action": "drain"}},
            r"Xid 13: key 'action' 'drain' contradicts status 'OK'",
        ),
        ({"13": {"status": 1}}, r"Xid 13: key 'status' must be a string"),
        ({"13": "OK"}, r"Xid 13 must be a mapping"),
        ({"13": {}}, r"Xid 13 is empty"),
        ({"abc": {"status": "OK"}}, r"key 'abc' is not an Xid number"),
        ({"-5": {"status": "OK"}}, r"key '-5' is not an Xid number"),
        ({True: {"status": "OK"}}, r"is not an Xid number"),
        (["79"], r"must be a mapping"),
    ],
)
def test_overrides_invalid(overrides, message):
    with pytest.raises(ValueError, match=message):
        validate_overrides(overrides)
    with pytest.raises(ValueError):
        classify(ev(13), overrides)


def test_overrides_normalised():
    assert validate_overrides(
        {"79": {"status": "fail", "action": "REBOOT"}, 13: {"blame": "Node"}}
    ) == {
        79: {"status": "FAIL", "action": "reboot"},
        13: {"blame": "node"},
    }
    assert validate_overrides(None) == {}


# ------------------------------------------------------------------------------------------
# SXid classification
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line, status, action, blame",
    [
        (
            "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 14 LTSSM Fault Up",
            "FAIL",
            "reboot",
            "node",
        ),
        (
            "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20009, Non-fatal, Link 28 RX Short Error Rate",
            "WARN",
            "none",
            "node",
        ),
        (
            "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 22013, Minion Link 4 NA interrupt",
            "UNKNOWN",
            "none",
            "check",
        ),
    ],
)
def test_classify_sxid(line, status, action, blame):
    c = classify_sxid(parse_sxid(line))
    assert (c.status, c.action, c.blame) == (status, action, blame)


def test_classify_sxid_override():
    e = parse_sxid(
        "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20009, Non-fatal, Link 28 RX Short Error Rate"
    )
    c = classify_sxid(e, {"20009": {"status": "OK"}})
    assert (c.status, c.action, c.overridden) == ("OK", "none", True)
    with pytest.raises(ValueError, match="20009: unknown key 'x'"):
        classify_sxid(e, {"20009": {"x": "y"}})


# ------------------------------------------------------------------------------------------
# explain
# ------------------------------------------------------------------------------------------


def test_explain_79():
    text = explain(79)
    for needle in [
        "Xid 79",
        "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
        "GPU has fallen off the bus",
        "RESTART_BM",
        "Status: FAIL",
        "Action: reboot",
        "node-broken",
        "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html",
        "retrieved 2026-12-02",
        "Catalog version: 2026.12.02",
    ]:
        assert needle in text, needle


def test_explain_job_caused_13():
    text = explain("13")
    assert "Status: WARN" in text and "Action: none" in text
    assert "job-broken" in text
    assert "Caused by the job:    typically yes" in text
    assert "WORKFLOW_XID_13" in text


def test_explain_unknown_and_override():
    text = explain(9999)
    assert (
        "not in the packaged catalog" in text and "Status: UNKNOWN" in text and "no drain" in text
    )
    text = explain(13, overrides={"13": {"status": "FAIL", "action": "drain"}})
    assert "Status: FAIL" in text and "operator override" in text
    assert "not an Xid number" in explain("abc")


# ------------------------------------------------------------------------------------------
# scan
# ------------------------------------------------------------------------------------------

KMSG = [
    "6,100,1000000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module",
    " SUBSYSTEM=pci",
    " DEVICE=+pci:0000:3b:00.0",
    "4,101,2000000,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=11, name=a, Graphics Exception",
    "4,102,3000000,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 14 LTSSM Fault Up",
    "4,103,4000000,-;NVRM: Xid (PCI:0000:86:00): 79, pid=12, name=b, GPU has fallen off the bus.",
    "garbage \x00\xff",
    "4,104,5000000,-;NVRM: Xid (PCI:0000:86:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
]


def test_scan_all():
    evs = scan(KMSG)
    assert [(e.xid, e.seq, e.usec, e.pci) for e in evs] == [
        (13, 101, 2000000, "0000:3b:00.0"),
        (79, 103, 4000000, "0000:86:00.0"),
        (154, 104, 5000000, "0000:86:00.0"),
    ]


@pytest.mark.parametrize(
    "since_seq, since_usec, expected",
    [
        (None, None, [13, 79, 154]),
        (100, None, [13, 79, 154]),
        (101, None, [79, 154]),
        (103, None, [154]),
        (104, None, []),
        (None, 2000000, [79, 154]),
        (None, 4999999, [154]),
        (101, 4000000, [154]),
    ],
)
def test_scan_since(since_seq, since_usec, expected):
    assert [e.xid for e in scan(KMSG, since_seq=since_seq, since_usec=since_usec)] == expected


def test_scan_mixed_formats_and_unpositioned_records():
    lines = [
        "[10.000000] NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=x, MMU Fault",
        "[Wed Dec  2 10:00:00 2026] NVRM: Xid (PCI:0000:3b:00): 43, pid=2, name=y, Ch 1",
        "Dec 02 10:00:01 gpu01 kernel: NVRM: Xid (PCI:0000:3b:00): 45, pid=3, name=z, Ch 2",
        "NVRM: Xid (PCI:0000:3b:00): 48, pid=4, DBE",  # bare message, no position
    ]
    evs = scan(lines)
    assert [e.xid for e in evs] == [31, 43, 45, 48]
    assert evs[1].wallclock == "Wed Dec  2 10:00:00 2026"
    # with a position filter, records without that position are not re-reported
    assert [e.xid for e in scan(lines, since_usec=0)] == [31]
    assert scan(lines, since_seq=0) == []


def test_scan_sxid():
    out = scan_sxid(KMSG)
    assert [(s.sxid, s.severity, s.seq) for s in out] == [(20034, "Fatal", 102)]
    assert scan_sxid(KMSG, since_seq=102) == []


def test_scan_bytes_lines():
    raw = [line.encode("utf-8") for line in KMSG] + [b"\xff\xfe4,105,6,-;junk"]
    assert [e.xid for e in scan(raw)] == [13, 79, 154]


def test_kmsg_view_keeps_the_newest_sequence_number_and_the_xid_lines():
    from slurm_hooks.xid.kmsg import view

    records = [
        "6,5,100,-;eth0: link up",
        "3,6,200,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
        " SUBSYSTEM=pci\n DEVICE=+pci:0000:18:00.0",
        "4,7,300,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 3",
        "not a kmsg record at all",
        "",
    ]
    seen = view(records)
    assert seen.last_seq == 7  # the newest record that has one: garbage after it is skipped
    assert seen.xid_lines == (
        records[1].split("\n")[0],
        records[2],
    )  # message lines only, oldest first
    assert view([]).last_seq is None and view(["junk"]).xid_lines == ()


def test_a_window_without_events_does_not_load_the_catalog(monkeypatch):
    """Round 7: the packaged catalog (~3 ms of JSON and rows) is read only when there is an Xid to
    classify; a node without Xids (every prolog's case) never reads it, and one Xid still does."""
    loads = []
    real = X.XidCatalog

    def counting(*args, **kwargs):
        loads.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(X, "XidCatalog", counting)
    monkeypatch.setattr(X, "_CATALOG", None)
    assert X.classify_all([], {}) == []
    assert loads == []
    with pytest.raises(ValueError):  # the overrides are still validated without events
        X.classify_all([], {"79": {"status": "BOGUS"}})
    [cls] = X.classify_all([ev(79)], {})
    assert loads == [1] and cls.status == "FAIL"
