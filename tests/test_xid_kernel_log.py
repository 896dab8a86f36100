"""Who wrote an Xid line, and NVSwitch SXid reports as the driver writes them (issue 13, section 3).

Real shapes, each with its source:

- the kernel's segfault report: arch/x86/mm/fault.c show_signal_msg() in torvalds/linux,
  ``"%s%s[%d]: segfault at %lx ip %px sp %px error %lx"`` (KERN_INFO for pid > 1) continued with
  print_vma_addr(KERN_CONT " in ", ip) -> ``" in <basename>[<start>+<size>]"`` and, since 6.2,
  ``" likely on CPU %d (core %d, socket %d)"``; newer kernels print the same with ``in %pav``. A
  real one as printed by dmesg -T: ``a.out[40342]: segfault at 0 ip 00000000004005b1 sp
  00007ffc5b1be400 error 4 in a.out[400000+1000]``. The task name (comm) is at most 15 characters
  (TASK_COMM_LEN 16) and is the user's, as is the binary's base name.
- a user-space write to /dev/kmsg: kernel/printk/printk.c devkmsg_write() gives facility 1 (LOG_USER)
  and the default level 4 unless the text starts with "<N>": priority 12; a "<N>" prefix sets the
  level and only a non-zero facility ("if (LOG_FACILITY(u) != 0) facility = LOG_FACILITY(u)"), so no
  user-space write, root's included, carries the kernel facility 0.
- NVSwitch reports: NVIDIA/nvtrust issue #124 (driver 570.195.03, `dmesg`), lines copied verbatim:
  event ("22013, Non-fatal, Link 44 Minion Link DLREQ interrupt"), "Severity 0 Engine instance 44
  Sub-engine instance 00", "Data {...}" (nine words); the Fatal LTSSM report of Red Hat solution
  6619941 as quoted in leptonai/gpud's tests ("20034, Fatal, Link 30 LTSSM Fault Up", "Severity 1 ...",
  eight data words: an older driver); the print format and the severity numbers from
  NVIDIA/open-gpu-kernel-modules (src/common/nvswitch/kernel/error_nvswitch.c
  _nvswitch_dump_error_entry; ctrl_dev_nvswitch.h NVSWITCH_ERROR_SEVERITY_NONFATAL = 0, _FATAL = 1).
- ``dmesg -x --time-format iso`` output: leptonai/gpud PR #338 ("kern  :err   : 2025-01-25T10:34:54,859532+00:00
  nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 12028, Data {...}").
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_hooks.xid import kmsg as K
from slurm_hooks.xid.catalog import classify_sxid
from slurm_hooks.xid.kmsg import (
    parse_kmsg_record,
    parse_sxid,
    parse_sxid_line,
    parse_xid,
    scan,
    scan_all,
    scan_sxid,
)

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."

# -- the segfault line ---------------------------------------------------------------------------

# A binary named like an Xid line (a legal file name: no '/'), crashing: the kernel logs its name.
FORGED_BINARY = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
SEGFAULT_6X = (
    "python3[4242]: segfault at 0 ip 00007f8d2c41a2b0 sp 00007ffd6f0e1c28 error 4 in %s[7f8d2c400000+1b000]"
    " likely on CPU 7 (core 7, socket 0)" % FORGED_BINARY
)
SEGFAULT_OLD = (
    "a.out[40342]: segfault at 0 ip 00000000004005b1 sp 00007ffc5b1be400 error 4 in %s[400000+1000]"
    % FORGED_BINARY
)
# The task name is the user's too (prctl PR_SET_NAME, 15 characters): the prefix's first 15 characters.
COMM = "NVRM: Xid (PCI:"
SEGFAULT_COMM = (
    "%s[4243]: segfault at 0 ip 0000000000401126 sp 00007ffe3c1f6e80 error 6 in %s[401000+1000]"
    % (COMM, FORGED_BINARY)
)
TRAPS = (
    "traps: %s[4244] general protection fault ip:401126 sp:7ffe3c1f6e80 error:0 in %s[401000+1000]"
    % (COMM, FORGED_BINARY)
)


@pytest.mark.parametrize("message", [SEGFAULT_6X, SEGFAULT_OLD, SEGFAULT_COMM, TRAPS])
@pytest.mark.parametrize(
    "frame",
    [
        "6,2001,81234567,-;%s",  # /dev/kmsg: KERN_INFO, kernel facility: the kernel wrote it
        "[81234.567001] %s",  # dmesg
        "[Thu Dec  3 10:00:00 2026] %s",  # dmesg -T
        "<6>[81234.567001] %s",  # dmesg -r
        "kern  :info  : [81234.567001] %s",  # dmesg -x
        "Dec 03 10:00:00 gpu01 kernel: %s",  # journalctl -k
        "%s",  # a pasted message
    ],
)
def test_a_users_file_name_in_the_kernels_segfault_line_is_no_xid(frame, message):
    line = frame % message
    assert parse_xid(line) is None
    assert scan([line]) == [] and scan_sxid([line]) == []


def test_the_real_line_in_the_same_frames_is_an_xid():
    """The control: the driver's own line, in every frame the forged ones used, is found."""
    for frame in (
        "6,2001,81234567,-;%s",
        "4,2001,81234567,-;%s",
        "[81234.567001] %s",
        "<4>[81234.567001] %s",
        "kern  :warn  : [81234.567001] %s",
        "Dec 03 10:00:00 gpu01 kernel: %s",
        "%s",
    ):
        event = parse_xid(frame % XID79)
        assert event is not None and (event.xid, event.pci, event.pid) == (
            79,
            "0000:3b:00.0",
            1234,
        ), frame


@pytest.mark.parametrize(
    "line",
    [
        "12,2002,81234568,-;" + XID79,  # echo "NVRM: Xid ..." > /dev/kmsg (as root)
        "14,2002,81234568,-;" + XID79,  # echo "<6>NVRM: ..." > /dev/kmsg: user.info
        "11,2002,81234568,-;" + XID79,  # echo "<3>NVRM: ..." (kern.err asked): user.err
        "<12>[81234.568001] " + XID79,  # dmesg -r of such a record
        "user  :warn  : [81234.568001] " + XID79,  # dmesg -x of it
        "daemon:err   : [81234.568001] " + XID79,
        "12,2003,81234569,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 14 LTSSM Fault Up",
    ],
)
def test_records_not_of_the_kernel_facility_are_not_the_drivers(line):
    assert parse_xid(line) is None and parse_sxid(line) is None
    assert scan_all([line]) == ([], [])


def test_kmsg_records_keep_their_facility():
    assert parse_kmsg_record("4,1,2,-;" + XID79).facility == 0
    assert parse_kmsg_record("12,1,2,-;x").facility == 1
    rec = parse_kmsg_record("kern  :err   : 2025-01-25T10:34:54,859532+00:00 nvidia-nvswitch1: x")
    assert (rec.source, rec.facility, rec.level, rec.wallclock) == (
        "dmesg-x",
        0,
        3,
        "2025-01-25T10:34:54,859532+00:00",
    )
    rec = parse_kmsg_record("<12>[  5.000001] hello")
    assert (rec.source, rec.facility, rec.level, rec.usec, rec.message) == (
        "dmesg-r",
        1,
        4,
        5000001,
        "hello",
    )
    assert (
        parse_kmsg_record("[5.0] x").facility is None
    )  # plain dmesg drops it: judged by the prefix alone


@pytest.mark.parametrize(
    "message",
    [
        "NVRM: Xid (PCI:[4243]: segfault at 0 ip 0000000000401126 sp 00007ffe3c1f6e80 error 6",
        "NVRM: Xid (PCI: (4243): drop_caches: 3",
        "NVRM: Xid (PCI:: page allocation failure: order:5, mode:0x40cc0(GFP_KERNEL|__GFP_COMP)",
        "NVRM: Xid (PCI:0000:3b): 79, one field short",
        "NVRM: Xid (PCI:0000:3b:00:00): 79, one field too many",
        " NVRM: Xid (PCI:0000:3b:00): 79, indented",
        "xNVRM: Xid (PCI:0000:3b:00): 79, glued",
    ],
)
def test_a_prefix_is_the_whole_prefix_with_a_well_formed_bus_id(message):
    assert parse_xid(message) is None


def test_wide_pci_domains_are_kept():
    """VMD and Hyper-V domains are wider than 16 bits; the driver prints %04x, i.e. every digit."""
    event = parse_xid(
        "4,1,2,-;NVRM: Xid (PCI:10000:01:00): 79, pid=1, name=x, GPU has fallen off the bus."
    )
    assert event is not None and event.pci == "10000:01:00.0"
    sx = parse_sxid(
        "4,1,2,-;nvidia-nvswitch0: SXid (PCI:10001:05:00.0): 20034, Fatal, Link 1 LTSSM Fault Up"
    )
    assert sx is not None and sx.pci == "10001:05:00.0"
    assert (
        K.normalize_pci("00010000:3B:00.0") == "10000:3b:00.0"
    )  # NVML's 8-digit form of the same domain


# -- NVSwitch reports ----------------------------------------------------------------------------

# NVIDIA/nvtrust#124: the first Data line is the tail of a report whose other lines came before.
NVTRUST_124 = """\
[   38.175561] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Data {0x0000002b, 0x0000002b, 0x00000000, 0x0000002b, 0x80005302, 0x00000000, 0x00000000, 0x00000000, 0x00000000}
[   38.178720] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link DLREQ interrupt
[   38.180708] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Severity 0 Engine instance 44 Sub-engine instance 00
[   38.183583] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Data {0x0000002c, 0x0000002c, 0x00000000, 0x0000002c, 0x80005302, 0x00000000, 0x00000000, 0x00000000, 0x00000000}
[   38.187830] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 45 Minion Link DLREQ interrupt
[   38.189818] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Severity 0 Engine instance 45 Sub-engine instance 00
[   38.191863] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Data {0x0000002d, 0x0000002d, 0x00000000, 0x0000002d, 0x80005302, 0x00000000, 0x00000000, 0x00000000, 0x00000000}
""".splitlines()  # noqa: E501 - real lines, kept whole

# Red Hat solution 6619941 (quoted in leptonai/gpud's tests): a fatal report of an older driver (8 data words).
LTSSM_FATAL = """\
[131453.740743] nvidia-nvswitch0: SXid (PCI:0000:a9:00.0): 20034, Fatal, Link 30 LTSSM Fault Up
[131453.740754] nvidia-nvswitch0: SXid (PCI:0000:a9:00.0): 20034, Severity 1 Engine instance 30 Sub-engine instance 00
[131453.740758] nvidia-nvswitch0: SXid (PCI:0000:a9:00.0): 20034, Data {0x50610002, 0x10100030, 0x00000000, 0x10100030, 0x00000000, 0x00000000, 0x00000000, 0x00000000}
""".splitlines()  # noqa: E501


def test_a_report_is_one_event_with_its_severity():
    events = scan_sxid(NVTRUST_124)
    assert [
        (e.sxid, e.switch, e.pci, e.severity, e.link, e.severity_level, e.instance, e.lines)
        for e in events
    ] == [
        (22013, 3, "0000:04:00.0", "Non-fatal", 44, 0, 44, 3),
        (22013, 3, "0000:04:00.0", "Non-fatal", 45, 0, 45, 3),
    ]  # the leading Data line alone (its report began before the log) is not an event
    assert events[0].data == (0x2C, 0x2C, 0, 0x2C, 0x80005302, 0, 0, 0, 0)
    assert events[0].usec == 38178720 and events[0].text == "Link 44 Minion Link DLREQ interrupt"
    assert [classify_sxid(e).status for e in events] == [
        "WARN",
        "WARN",
    ]  # never UNKNOWN "without severity"

    (fatal,) = scan_sxid(LTSSM_FATAL)
    assert (fatal.severity, fatal.severity_level, fatal.link, len(fatal.data), fatal.lines) == (
        "Fatal",
        1,
        30,
        8,
        3,
    )
    cls = classify_sxid(fatal)
    assert (cls.status, cls.action) == ("FAIL", "reboot")


def test_reports_of_several_switches_interleave():
    """Switches log concurrently, so their lines interleave (the order seen on HGX boards in shared-NVSwitch
    mode); lines join the open report of their own switch, bus id and code. Built from the nvtrust lines."""
    mine = [line for line in NVTRUST_124[1:4]]
    other = [
        line.replace("nvswitch3", "nvswitch1")
        .replace("0000:04:00.0", "0000:06:00.0")
        .replace("Non-fatal", "Fatal")
        .replace("Severity 0", "Severity 1")
        for line in mine
    ]
    lines = [mine[0], other[0], other[1], mine[1], other[2], mine[2]]
    events = scan_sxid(lines)
    assert [(e.switch, e.severity, e.lines) for e in events] == [
        (3, "Non-fatal", 3),
        (1, "Fatal", 3),
    ]


def test_a_severity_line_whose_event_line_is_gone_still_says_how_bad():
    """The ring buffer drops the oldest lines first; a window (the epilog's) may start inside a report."""
    events = scan_sxid(LTSSM_FATAL[1:])
    assert [(e.severity, e.severity_level, e.lines, e.text) for e in events] == [
        ("Fatal", 1, 2, "Severity 1 Engine instance 30 Sub-engine instance 00")
    ]
    assert scan_sxid(LTSSM_FATAL[2:]) == []  # a Data line alone says nothing about the fault


def test_a_report_is_as_severe_as_its_worst_line():
    lines = [LTSSM_FATAL[0].replace("Fatal, ", "Non-fatal, "), LTSSM_FATAL[1], LTSSM_FATAL[2]]
    (event,) = scan_sxid(lines)
    assert (
        event.severity == "Fatal"
    )  # the event line said Non-fatal, the driver's severity field says fatal
    no_word = [LTSSM_FATAL[0].replace("Fatal, ", ""), LTSSM_FATAL[1]]
    assert scan_sxid(no_word)[0].severity == "Fatal"


def test_continuation_lines_alone_are_not_events():
    assert parse_sxid(NVTRUST_124[2]) is None and parse_sxid(NVTRUST_124[0]) is None
    assert parse_sxid_line(NVTRUST_124[2].split("] ", 1)[1]).kind == "severity"
    assert parse_sxid_line(NVTRUST_124[0].split("] ", 1)[1]).kind == "data"


def test_dmesg_x_iso_lines_from_the_field():
    line = (
        "kern  :err   : 2025-01-25T10:34:54,859532+00:00 nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 12028, Data "
        "{0x000001c0, 0x00bd5c8a, 0x00000500, 0x00000064, 0x00000000, 0x40008000, 0x5a001100, 0x00000000, 0x00000000}"
    )
    head = (
        "kern  :err   : 2025-01-25T10:34:54,859000+00:00 nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 12028, "
        "Non-fatal, Link 3 egress non-posted PRIV error (First)"
    )
    (event,) = scan_sxid([head, line])
    assert (event.sxid, event.severity, event.wallclock, len(event.data)) == (
        12028,
        "Non-fatal",
        "2025-01-25T10:34:54,859000+00:00",
        9,
    )


def test_xid_and_sxid_positions_and_windows():
    lines = [
        "4,%d,%d,-;%s" % (300 + i, 1000 + i, line.split("] ", 1)[1])
        for i, line in enumerate(LTSSM_FATAL)
    ]
    lines.insert(1, "4,299,999,-;" + XID79)
    xids, sxids = scan_all(lines)
    assert [e.seq for e in xids] == [299] and [(e.seq, e.lines) for e in sxids] == [(300, 3)]
    xids, sxids = scan_all(lines, since_seq=300)  # the window starts after the event line
    assert xids == [] and [(e.seq, e.severity, e.lines) for e in sxids] == [(301, "Fatal", 2)]


# -- properties --------------------------------------------------------------------------------------

_FRAMES = st.sampled_from(
    [
        "",
        "6,1,2,-;",
        "4,1,2,c;",
        "12,1,2,-;",
        "[1.0] ",
        "<4>[1.0] ",
        "<12>[1.0] ",
        "kern  :warn  : [1.0] ",
        "user  :warn  : [1.0] ",
        "kern  :err   : 2025-01-25T10:34:54,85+00:00 ",
        "[Thu Dec  3 10:00:00 2026] ",
        "Dec 03 10:00:00 h kernel: ",
    ]
)
_PIECES = st.sampled_from(
    [
        XID79,
        NVTRUST_124[1].split("] ", 1)[1],
        NVTRUST_124[2].split("] ", 1)[1],
        NVTRUST_124[3].split("] ", 1)[1],
        "python3[1]: segfault at 0 ip 0 sp 0 error 4 in ",
        COMM,
        "NVRM: ",
        "nvidia-nvswitch0: SXid (PCI:",
        "(PCI:0000:3b:00): 79, ",
    ]
)


@settings(max_examples=300, deadline=None)
@given(frame=_FRAMES, pieces=st.lists(st.one_of(_PIECES, st.text(max_size=20)), max_size=5))
def test_an_event_is_always_a_drivers_message(frame, pieces):
    line = frame + "".join(pieces)
    xids, sxids = scan_all([line, line.encode("utf-8", "surrogatepass")])
    record = parse_kmsg_record(line)
    for event in xids:
        assert event.raw.startswith("NVRM: Xid (") and (
            record is None or record.facility in (None, 0)
        )
    for event in sxids:
        assert event.raw.startswith("nvidia-nvswitch")
    if record is not None and record.facility not in (None, 0):
        assert (xids, sxids) == ([], [])


def test_one_kind_at_a_time():
    """xid.sxid parses only the SXid lines and xid.events only the Xid lines of the same read (KernelLog)."""
    lines = [
        "4,%d,%d,-;%s" % (300 + i, 1000 + i, line.split("] ", 1)[1])
        for i, line in enumerate(LTSSM_FATAL)
    ]
    lines.insert(1, "4,299,999,-;" + XID79)
    both = scan_all(lines)
    assert scan_all(lines, kinds=("xid",)) == (both[0], []) and scan_all(
        lines, kinds=("sxid",)
    ) == ([], both[1])
    from slurm_hooks.checks.xid import KernelLog

    log = KernelLog("boot", tuple(lines), frozenset())
    assert (
        log.sxids == tuple(both[1]) and "xids" not in log.parsed
    )  # the Xid lines are not parsed for SXids
    assert log.xids == tuple(both[0]) and log.xids is log.xids
