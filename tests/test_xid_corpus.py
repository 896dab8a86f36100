"""Kernel log lines as they reach us (tracker 23, "Kernel log"; tracker 24's line splitting and kmsg window).

The real lines are in tests/captures/kernel-log/lines.toml, each with its source. The wrappings
built here follow their printers: the driver's Xid format (open-gpu-kernel-modules,
src/nvidia/src/kernel/gpu/rc/kernel_rc.c: "NVRM: Xid (PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u): %d,
pid=%s, name=%s, %s" and the GPU-I-only and plain forms), journalctl's short output ("%b %d %H:%M:%S"
in LC_TIME's language; --no-hostname drops the host word), and the caller id of a
CONFIG_PRINTK_CALLER kernel (kernel/printk/printk.c print_caller(): "[%6s]" of "T<pid>"/"C<cpu>",
as in util-linux's tests/ts/dmesg/cid-input: "[    1.000000] [    T1] example[1]").
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_hooks.core.config import ConfigError, validate
from slurm_hooks.core.config_files import toml_loads
from slurm_hooks.hw import host as host_module
from slurm_hooks.hw.host import Host
from slurm_hooks.xid.catalog import classify, explain, load_catalog, validate_overrides
from slurm_hooks.xid.kmsg import XidEvent, parse_kmsg_record, parse_xid, scan
from tests.fakenode.procfs import xid_message
from tests.helpers import REPO
from tests.inprocess_cli import cli_in_process

CORPUS = Path(__file__).parent / "captures" / "kernel-log" / "lines.toml"
LINES = toml_loads(CORPUS.read_text(encoding="utf-8"))["line"]
X79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
MIG13 = "NVRM: Xid (PCI:0000:01:00 GPU-I:01 GPU-CI:02): 13, pid=9, name=a, Graphics Exception"


# -- the real lines --------------------------------------------------------------------------------


@pytest.mark.parametrize("sample", LINES, ids=[s["text"][:48] for s in LINES])
def test_every_real_line_gives_its_message_and_xid(sample):
    assert sample["source"].strip()
    record = parse_kmsg_record(sample["text"])
    message = record.message if record is not None else sample["text"]  # a bare message is itself
    assert message == sample["message"]
    event = parse_xid(sample["text"])
    if "xid" not in sample:
        assert event is None
        return
    assert event is not None
    assert (event.xid, event.pci) == (sample["xid"], sample["pci"])
    assert (event.gpu_instance, event.compute_instance) == (
        sample.get("gpu_instance"),
        sample.get("compute_instance"),
    )
    assert scan([sample["text"]]) == [event]


# -- MIG: partition-attributed Xids ----------------------------------------------------------------


@pytest.mark.parametrize(
    "frame",
    [
        "3,700,81234567,-;%s",  # /dev/kmsg: the hooks' path (one regex for the whole record)
        "3,700,81234567,-,caller=T1946;%s",  # /dev/kmsg of a caller-id kernel
        "[81234.567001] %s",
        "Dec 03 10:00:00 gpu01 kernel: %s",
        "%s",
    ],
)
def test_a_mig_xid_keeps_the_gpu_and_names_the_partition(frame):
    [event] = scan([frame % MIG13])
    assert (event.xid, event.pci, event.pid, event.process) == (13, "0000:01:00.0", 9, "a")
    assert (event.gpu_instance, event.compute_instance, event.mig) == (1, 2, "GI 1 CI 2")
    assert parse_xid(frame % MIG13) == event


def test_the_fake_node_writes_the_drivers_three_shapes(fake_node):
    """The fake node's Xid records read back: each event carries GPU 1's bus id, and the MIG ids only
    where the spec gave them (the driver's three shapes)."""
    node = fake_node(
        "dgx-h100",
        {
            "kmsg": [
                {
                    "xid": 94,
                    "gpu": 1,
                    "gpu_instance": 5,
                    "pid": "7194",
                    "msg": "Contained: CE User",
                },
                {"xid": 13, "gpu": 1, "gpu_instance": 1, "compute_instance": 2, "msg": "Graphics"},
                {"xid": 79, "gpu": 1, "msg": "GPU has fallen off the bus."},
            ]
        },
    )
    records = Host(str(node.root)).read_kmsg()
    events = scan(records)
    pci = events[0].pci
    assert [(e.xid, e.pci, e.gpu_instance, e.compute_instance) for e in events] == [
        (94, pci, 5, None),
        (13, pci, 1, 2),
        (79, pci, None, None),
    ]
    assert "GPU-I:05): 94, pid=7194, name=<unknown>, Contained: CE User" in records[-3]


def test_xid_message_matches_nvidias_published_line():
    """procfs.xid_message against the line of NVIDIA's A100 memory error document (lines.toml, first entry)."""
    published = LINES[0]["text"]
    built = xid_message("0000:01:00.0", 94, "Contained: CE User Channel (0x9). RST: No, D-RST: No")
    built = built.replace("pid='<unknown>', name=<unknown>, ", "")
    assert built.replace("PCI:0000:01:00)", "PCI:0000:01:00 GPU-I:05)") == published.replace(
        "pid=7194, ", ""
    )


def _xid_cli(text: str, tmp_path, *args: str, child: bool = False) -> subprocess.CompletedProcess:
    """`slurm-hooks xid - ARGS` on text; in this process (tests/inprocess_cli.py) unless child."""
    config = tmp_path / "config.toml"
    config.write_text("")
    env = dict(os.environ, SLURM_HOOKS_CONFIG=str(config), SLURM_HOOKS_ALLOW_INSECURE_CONFIG="1")
    if not child:
        proc = cli_in_process(["xid", "-"] + list(args), env=env, stdin=text)
        return subprocess.CompletedProcess(
            proc.args, proc.returncode, proc.stdout.encode("utf-8"), proc.stderr.encode("utf-8")
        )
    return subprocess.run(
        [sys.executable, "-m", "slurm_hooks", "xid", "-"] + list(args),
        input=text.encode("utf-8"),
        capture_output=True,
        cwd=REPO,
        env=env,
        timeout=60,
    )


def test_slurm_hooks_xid_shows_the_partition(tmp_path):
    text = "[  130.456250] [ T1946] %s\nkwi 15 07:56:59 kernel: %s\n" % (MIG13, LINES[0]["text"])
    [row13, row94] = json.loads(_xid_cli(text, tmp_path, "--json", child=True).stdout)
    assert (row13["code"], row13["pci"], row13["gpu_instance"], row13["compute_instance"]) == (
        13,
        "0000:01:00.0",
        1,
        2,
    )
    assert (row94["code"], row94["gpu_instance"], row94["compute_instance"]) == (94, 5, None)
    table = _xid_cli(text, tmp_path).stdout.decode("utf-8")
    assert "0000:01:00.0 GI 1 CI 2" in table and "0000:01:00.0 GI 5 " in table


# -- wrappings -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        "Dec 03 10:00:00 kernel: %s",  # journalctl --no-hostname -k
        "Dec 03 10:00:00.123456 kernel: %s",  # -o short-precise --no-hostname
        "2026-12-03T10:00:00+0000 kernel: %s",  # -o short-iso --no-hostname
        "kwi 15 07:56:59 gpu01 kernel: %s",  # Polish LC_TIME
        "Okt 06 07:56:59 gpu01 kernel: %s",  # German
        "déc. 06 07:56:59 gpu01 kernel: %s",  # French
        "12月 02 10:00:00 gpu01 kernel: %s",  # Japanese
        "kwi 15 07:56:59 kernel: %s",
        "kernel: %s",  # pasted with date and host trimmed
        "kernel: [82659.755847] %s",
        "[  130.456250] [ T1946] %s",  # dmesg of a CONFIG_PRINTK_CALLER kernel
        "[  130.456250][    T1] %s",  # the console form, no space between
        "[    1.000000] [     C3] %s",
        "<3>[  130.456250] [ T1946] %s",  # dmesg -r
        "kern  :err   : [  130.456250] [ T1946] %s",  # dmesg -x
        "[Thu Dec  3 10:00:00 2026] [ T1946] %s",  # dmesg -T
        "[czw gru  3 10:00:00 2026] %s",  # dmesg -T, Polish
        "[ T1946] %s",  # dmesg -t
        "Dec 03 10:00:00 gpu01 kernel: [  130.456250] [ T1946] %s",  # a syslog file
        "[  130.456250] kernel: %s",  # journalctl -o short-monotonic --no-hostname
    ],
)
def test_every_wrapping_gives_the_xid(line):
    [event] = scan([line % X79])
    assert (event.xid, event.pci, event.pid) == (79, "0000:3b:00.0", 1234)
    assert parse_xid(line % X79) == event


FORGED = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."


@pytest.mark.parametrize(
    "comm",
    ["kernel: NVRM: X", "kernel:", "[ T1] NVRM: Xid", "[ T1] kernel: N", "[1.0] [ T1] NVR", "x"],
)
@pytest.mark.parametrize(
    "frame",
    [
        "6,2001,81234567,-;%s",
        "[81234.567001] %s",
        "[81234.567001] [ T4243] %s",
        "Dec 03 10:00:00 kernel: %s",
        "kwi 03 10:00:00 gpu01 kernel: %s",
        "kernel: %s",
        "kernel: [81234.567001] [ T4243] %s",
        "[ T4243] %s",
        "%s",
    ],
)
@pytest.mark.parametrize("path", [FORGED, "kernel: " + FORGED, "[ T1 ] " + FORGED])
def test_a_users_task_or_file_name_makes_no_xid_in_any_wrapping(frame, comm, path):
    """The segfault line carries the task name (15 characters, the user's) and the binary's name: with the
    new wrappings taken off once each, neither starts a record with the driver's prefix."""
    message = (
        "%s[4243]: segfault at 0 ip 0000000000401126 sp 00007ffe3c1f6e80 error 6 in %s[401000+1000]"
        % (
            comm[:15],
            path,
        )
    )
    line = frame % message
    assert parse_xid(line) is None
    assert scan([line]) == []


WRAPPER_PIECES = [
    "kernel:",
    "kernel: ",
    "[ T1] ",
    "[    C3]",
    "[1.5] ",
    "NVRM: Xid (",
    "PCI:0000:3b:00",
    "): 79, ",
    " ",
    "x",
    "[",
    "]",
]


@settings(max_examples=300, deadline=None)
@given(
    comm=st.lists(st.sampled_from(WRAPPER_PIECES), max_size=6).map("".join),
    frame=st.sampled_from(
        [
            "[81234.567001] %s",
            "[81234.567001] [ T4243] %s",
            "Dec 03 10:00:00 kernel: %s",
            "kwi 03 10:00:00 gpu01 kernel: %s",
            "kernel: %s",
            "kernel: [81234.567001] %s",
            "[ T4243] %s",
            "%s",
        ]
    ),
)
def test_no_task_name_made_of_wrapper_pieces_makes_an_xid(comm, frame):
    """Any task name (the first 15 characters are kept) built from wrapping pieces and prefix fragments, in
    any frame, with a forged Xid as the binary's name: never an Xid."""
    message = (
        "%s[4243]: segfault at 0 ip 0000000000401126 sp 00007ffe3c1f6e80 error 6 in %s[401000+1000]"
        % (
            comm[:15],
            FORGED,
        )
    )
    assert scan([frame % message]) == []


# -- only "\n" separates records (tracker 24) ------------------------------------------------------

SEPARATORS = ["\v", "\f", "\r", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


@pytest.mark.parametrize("sep", SEPARATORS, ids=[repr(s) for s in SEPARATORS])
def test_slurm_hooks_xid_splits_only_at_newline(sep, tmp_path):
    """A binary named 'a<VT>NVRM: Xid ...' crashing: dmesg prints one line; it used to show as Xid 79."""
    line = (
        "[81234.567001] python3[4242]: segfault at 0 ip 00007f8d2c41a2b0 sp 00007ffd6f0e1c28 error 4 in a%s%s[7f8d2c400000+1b000]\n"
        % (sep, FORGED)
    )
    proc = _xid_cli(line, tmp_path, "--json")
    assert json.loads(proc.stdout) == [], proc.stderr
    assert proc.returncode == 0


@pytest.mark.parametrize("sep", SEPARATORS, ids=[repr(s) for s in SEPARATORS])
def test_a_captured_kmsg_file_splits_only_at_newline(sep, write_tree):
    record = (
        "6,2001,81234567,-;python3[4242]: segfault at 0 ip 0 sp 0 error 4 in a%s%s[400000+1000]\n"
    )
    root = write_tree({"dev/kmsg": record % (sep, "6,2002,81234568,-;" + FORGED)})
    records = Host(root).read_kmsg()
    assert len(records) == 1 and scan(records) == []


# -- the live /dev/kmsg keeps the newest records (tracker 24) --------------------------------------


def test_the_live_reader_keeps_the_newest_records(monkeypatch):
    """A flood of 250 records read with max_records=100: the Xid 79 at the end is among those kept."""
    flood = ["6,%d,%d,-;noise %d\n" % (i, i, i) for i in range(249)]
    flood.append("3,249,249,-;%s\n" % X79)
    reads = iter([r.encode() for r in flood])

    def fake_read(fd, size):
        try:
            return next(reads)
        except StopIteration:
            raise BlockingIOError(errno.EAGAIN, "no more") from None

    monkeypatch.setattr(host_module.os, "read", fake_read)
    records = host_module._read_kmsg_device(-1, 100)
    assert len(records) == 100
    assert records[0].startswith("6,150,") and records[-1].endswith(X79)
    assert [e.xid for e in scan(records)] == [79]


def test_the_live_reader_stops_when_a_writer_never_lets_it_end(monkeypatch):
    monkeypatch.setattr(host_module, "KMSG_MAX_READS", 500)
    monkeypatch.setattr(host_module.os, "read", lambda fd, size: b"6,1,1,-;endless\n")
    assert len(host_module._read_kmsg_device(-1, 100)) == 100


# -- the catalog: every listed Xid has a decision, and explain says whose ---------------------------


def test_every_xid_in_the_catalog_has_a_decision():
    """Xids 162-172 came out UNKNOWN (never drained): every listed Xid now decides without the message,
    except the NVLink5 rows, whose decision the message's Fatal/Nonfatal marker carries."""
    cat = load_catalog()
    undecided = [
        e.xid
        for e in cat
        if classify(XidEvent(e.xid, None, None, None, "")).status == "UNKNOWN"
        and e.immediate != "WORKFLOW_NVLINK5_ERR"
    ]
    assert undecided == []
    assert classify(XidEvent(167, None, None, None, "")).action == "reboot"
    assert classify(XidEvent(168, None, None, None, "")).status == "FAIL"


@pytest.mark.parametrize(
    "xid,overrides,source",
    [
        (79, None, "NVIDIA's catalog 2026.12.02, immediate action bucket RESTART_BM"),
        (167, None, "slurm-hooks' own reasoning: NVIDIA's catalog 2026.12.02 lists Xid 167"),
        (
            79,
            {79: {"status": "WARN"}},
            'an operator override ([checks."xid.events"].overrides in /etc/x.toml)',
        ),
    ],
)
def test_explain_says_where_the_decision_comes_from(xid, overrides, source):
    text = explain(xid, overrides, override_source="/etc/x.toml")
    assert "  Decided by: " + source in text


# -- override keys (tracker 24) --------------------------------------------------------------------


@pytest.mark.parametrize("key", ["７９", "٧٩", "۷۹", " 79", "79 ", "079", "+79", "0", "1_9"])
def test_an_override_key_that_only_int_reads_as_79_is_refused(registry, key):
    with pytest.raises(ValueError, match="not an Xid number"):
        validate_overrides({key: {"status": "OK"}})
    with pytest.raises(ConfigError) as refused:
        validate(registry, {"checks": {"xid.events": {"overrides": {key: {"status": "OK"}}}}})
    assert "overrides" in str(refused.value) and repr(key) in str(refused.value)


def test_plain_override_keys_still_load(registry):
    config = validate(registry, {"checks": {"xid.events": {"overrides": {"79": {"status": "OK"}}}}})
    assert config.check("xid.events").params.overrides == {79: {"status": "OK"}}
    assert validate_overrides({79: {"status": "OK"}, "13": {"status": "WARN"}}) == {
        79: {"status": "OK"},
        13: {"status": "WARN"},
    }
