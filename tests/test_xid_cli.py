"""`slurm-hooks explain xid N`, `slurm-hooks xid [FILE|-]` and `slurm-hooks xid ack`, run in this process
(tests/inprocess_cli.py); a few run as subprocesses, so the console entry point stays tested."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys

import pytest

from tests.helpers import REPO
from tests.inprocess_cli import cli_in_process

BOOT = "0b7e6d5c-4a3b-2c1d-0e9f-8a7b6c5d4e3f"
X79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
X13 = "NVRM: Xid (PCI:0000:18:00): 13, pid=77, name=train, Graphics Exception: ESR 0x50"
SXID = "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 14 LTSSM Fault Up"
PASTED = (
    "\n".join(
        [
            "[  812.123456] " + X79,  # dmesg
            "Dec 02 10:00:00 gpu01 kernel: " + X13,  # journalctl -k
            "[Wed Dec  2 10:00:01 2026] " + SXID,  # dmesg -T
            "[  813.000000] usb 1-1: new high-speed USB device",
            "complete garbage \x07 here",
        ]
    )
    + "\n"
)


@pytest.fixture
def config(tmp_path):
    """An empty config file of our own, so a machine's /etc/slurm-hooks never leaks into the tests."""

    def write(text: str = "") -> str:
        path = tmp_path / "etc" / "config.toml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        return str(path)

    return write


def cli(args, config_file, stdin=None):
    """The verb in this process (tests/inprocess_cli.py: ~0.1 s of CPU less than a child each)."""
    env = dict(os.environ, SLURM_HOOKS_CONFIG=config_file, SLURM_HOOKS_ALLOW_INSECURE_CONFIG="1")
    return cli_in_process(args, env=env, stdin=stdin)


def cli_child(args, config_file, stdin=None):
    """`python -m slurm_hooks ARGS`: the console entry point itself, for one test of each verb."""
    env = dict(os.environ, SLURM_HOOKS_CONFIG=config_file, SLURM_HOOKS_ALLOW_INSECURE_CONFIG="1")
    return subprocess.run(
        [sys.executable, "-m", "slurm_hooks"] + args,
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
    )


def test_explain_known_xid(config):
    proc = cli_child(["explain", "xid", "79"], config())
    assert proc.returncode == 0, proc.stderr
    assert (
        proc.stdout.startswith("Xid 79")
        and "Action: reboot" in proc.stdout
        and "Catalog version" in proc.stdout
    )


def test_explain_applies_configured_overrides(config):
    proc = cli(
        ["explain", "xid", "13"],
        config('[checks."xid.events"]\noverrides = ["13=FAIL:reset-gpu"]\n'),
    )
    assert (
        proc.returncode == 0
        and "Action: reset-gpu" in proc.stdout
        and "[operator override]" in proc.stdout
    )


def test_explain_shows_the_effective_decision_of_an_override_table(config):
    """Issue 14: overrides are TOML tables validated at load, and `explain xid N` shows the decision in force."""
    table = config('[checks."xid.events".overrides]\n13 = {status = "FAIL", action = "rma"}\n')
    proc = cli(["explain", "xid", "13"], table)
    assert proc.returncode == 0, proc.stderr
    assert (
        "Status: FAIL   Action: rma   Blame: node" in proc.stdout
        and "[operator override]" in proc.stdout
    )
    assert "deprecated" not in proc.stderr
    old = cli(
        ["explain", "xid", "13"], config('[checks."xid.events"]\noverrides = ["13=FAIL:rma"]\n')
    )
    assert "Status: FAIL   Action: rma" in old.stdout
    assert "deprecated" in old.stderr and '13 = {status = "FAIL", action = "rma"}' in old.stderr
    broken = cli(
        ["config", "check"], config('[checks."xid.events".overrides]\n13 = {status = "BROKEN"}\n')
    )
    assert broken.returncode == 3 and "invalid value 'BROKEN'" in broken.stderr


def test_explain_unknown_xid_exits_3_with_advice_config_check_accepts(config):
    proc = cli(["explain", "xid", "9999"], config())
    assert proc.returncode == 3 and proc.stdout == ""
    assert "Xid 9999 is not in the packaged catalog" in proc.stderr
    advice = re.search(r"(\[checks\.\"xid\.events\"\.overrides\]) (\d+ = \{[^}]*\})", proc.stderr)
    assert advice, proc.stderr
    checked = cli(["config", "check"], config("%s\n%s\n" % advice.groups()))
    assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize("number", ["0", "-1", "100000"])
def test_explain_of_a_number_that_is_no_xid_suggests_no_override(config, number):
    """`explain xid -1` used to suggest `[checks."xid.events".overrides] -1 = {...}`, which `config check`
    rejects; a number no override may name is said to be no Xid at all."""
    proc = cli(["explain", "xid", number], config())
    assert proc.returncode == 3 and proc.stdout == ""
    assert "%s is not an Xid number: Xids are 1 to 99999" % number in proc.stderr
    assert "overrides" not in proc.stderr
    rejected = cli(
        ["config", "check"],
        config('[checks."xid.events".overrides]\n"%s" = {status = "OK"}\n' % number),
    )
    assert rejected.returncode == 3 and "is not an Xid number" in rejected.stderr


def test_explain_json(config):
    """Schema slurm-hooks.explain/1: the catalog row and the decision in force (overrides applied)."""
    doc = json.loads(cli(["explain", "xid", "79", "--json"], config()).stdout)
    assert doc["schema"] == "slurm-hooks.explain/1" and doc["number"] == 79
    assert doc["entry"]["mnemonic"] == "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"
    assert (doc["decision"]["status"], doc["decision"]["action"]) == ("FAIL", "reboot")
    table = config('[checks."xid.events".overrides]\n13 = {status = "FAIL", action = "rma"}\n')
    doc = json.loads(cli(["explain", "xid", "13", "--json"], table).stdout)
    assert doc["decision"]["action"] == "rma" and doc["decision"]["overridden"] is True
    unknown = cli(["explain", "xid", "9999", "--json"], config())
    doc = json.loads(unknown.stdout)
    assert unknown.returncode == 3 and doc["entry"] is None
    assert doc["decision"]["status"] == "UNKNOWN"


def test_explain_needs_a_number(config):
    proc = cli(["explain", "xid", "seventy-nine"], config())
    assert proc.returncode == 3 and "invalid int value" in proc.stderr


def test_xid_from_stdin(config):
    proc = cli_child(["xid", "-"], config(), stdin=PASTED)
    assert proc.returncode == 2, proc.stderr  # worst: FAIL
    lines = proc.stdout.splitlines()
    assert len(lines) == 3
    assert (
        lines[0].split()[:5] == ["FAIL", "reboot", "Xid", "79", "0000:3b:00.0"]
        and "t=812.123456" in lines[0]
    )
    assert lines[1].split()[:4] == ["WARN", "none", "Xid", "13"]
    assert lines[2].split()[:4] == ["FAIL", "reboot", "SXid", "20034"]


def test_xid_json(config):
    proc = cli(["xid", "-", "--json"], config(), stdin=PASTED)
    assert proc.returncode == 2
    rows = json.loads(proc.stdout)
    assert [(r["kind"], r["code"], r["status"], r["action"], r["blame"]) for r in rows] == [
        ("xid", 79, "FAIL", "reboot", "node"),
        ("xid", 13, "WARN", "none", "job"),
        ("sxid", 20034, "FAIL", "reboot", "node"),
    ]
    assert (
        rows[0]["usec"] == 812123456
        and rows[0]["pid"] == 1234
        and rows[1]["wallclock"] == "Dec 02 10:00:00"
    )
    assert (
        rows[2]["severity"] == "Fatal"
        and rows[2]["link"] == 14
        and rows[0]["acknowledged"] is False
    )


@pytest.mark.parametrize(
    "text,code",
    [
        ("", 0),
        ("just noise\n", 0),
        ("[1.0] " + X13 + "\n", 1),
        ("[1.0] NVRM: Xid (PCI:0000:3b:00): 999, new\n", 3),
    ],
)
def test_xid_exit_code_is_the_worst_classification(config, text, code):
    proc = cli(["xid", "-"], config(), stdin=text)
    assert proc.returncode == code, proc.stdout + proc.stderr
    if code == 0:
        assert proc.stdout == "no Xid or SXid events\n"
    assert cli(["xid", "-", "--json"], config(), stdin=text).returncode == code


def test_a_pasted_nvswitch_report_is_one_event(config):
    """Issue 13: `slurm-hooks xid -` exited 3 (UNKNOWN) on a normal report; lines of NVIDIA/nvtrust#124."""
    report = (
        "\n".join(
            [
                "[   38.178720] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link DLREQ interrupt",
                "[   38.180708] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Severity 0 Engine instance 44 Sub-engine "
                "instance 00",
                "[   38.183583] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Data {0x0000002c, 0x0000002c, 0x00000000, "
                "0x0000002c, 0x80005302, 0x00000000, 0x00000000, 0x00000000, 0x00000000}",
            ]
        )
        + "\n"
    )
    proc = cli(["xid", "-", "--json"], config(), stdin=report)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [row] = json.loads(proc.stdout)
    assert (row["code"], row["severity"], row["status"], row["link"]) == (
        22013,
        "Non-fatal",
        "WARN",
        44,
    )


def test_pasted_segfault_and_user_lines_are_not_xids(config):
    forged = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
    text = (
        "\n".join(
            [
                "[81234.567001] python3[4242]: segfault at 0 ip 00007f8d2c41a2b0 sp 00007ffd6f0e1c28 error 4 in "
                "%s[7f8d2c400000+1b000]" % forged,
                "user  :warn  : [81234.568001] "
                + forged,  # dmesg -x keeps the facility: written from user space
                "<12>[81234.569001] " + forged,
            ]
        )
        + "\n"
    )  # dmesg -r: priority 12 = user.warning
    proc = cli(["xid", "-"], config(), stdin=text)
    assert proc.returncode == 0 and proc.stdout == "no Xid or SXid events\n", (
        proc.stdout + proc.stderr
    )


def test_xid_file_since_seq_and_config(config, tmp_path):
    log = tmp_path / "kmsg.txt"
    log.write_text("3,10,100,-;%s\n3,11,200,-;%s\n" % (X79, X13))
    proc = cli(["xid", str(log), "--since-seq", "10", "--json"], config())
    assert [r["code"] for r in json.loads(proc.stdout)] == [13] and proc.returncode == 1
    tuned = config('[checks."xid.events"]\noverrides = ["79=WARN"]\nignore = [13]\n')
    proc = cli(["xid", str(log)], tuned)
    assert (
        proc.returncode == 1
        and "operator override" in proc.stdout
        and "1 event(s) left out" in proc.stderr
    )
    bad = config('[checks."xid.events"]\noverrides = ["79=FAIL:rebot"]\n')
    proc = cli(["xid", str(log)], bad)
    assert proc.returncode == 3 and "overrides entry '79=FAIL:rebot'" in proc.stderr


def test_xid_missing_file_and_bad_options(config, tmp_path):
    proc = cli(["xid", str(tmp_path / "nope.log")], config())
    assert proc.returncode == 3 and "cannot read" in proc.stderr
    assert cli(["xid", "-", "--all"], config(), stdin="").returncode == 3
    assert cli(["xid", "ack", "--json"], config()).returncode == 3


@pytest.fixture
def live(write_tree):
    """A node tree whose /dev/kmsg holds an Xid 79 (seq 100), an Xid 13 (seq 101) and an SXid (seq 102)."""
    records = [
        "6,1,10,-;Linux version 6.8.0",
        "3,100,5000000,-;" + X79,
        "4,101,5000100,-;" + X13,
        "3,102,5000200,-;" + SXID,
    ]
    return write_tree(
        {"dev/kmsg": "\n".join(records) + "\n", "proc/sys/kernel/random/boot_id": BOOT + "\n"}
    )


def ack_file(root: str) -> str:
    return os.path.join(root, "var/lib/slurm-hooks/xid-ack.json")


def check_json(root, config_file, name):
    proc = cli(["check", name, "--root", root, "--json"], config_file)
    return proc.returncode, json.loads(proc.stdout)["checks"][0]["results"]


def test_ack_seq_then_all(config, live):
    conf = config()
    assert (
        cli(["xid", "--root", live], conf).returncode == 2
    )  # the live kernel log, read under --root
    proc = cli_child(["xid", "ack", "--seq", "100", "--root", live], conf)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "acknowledged seq=100 Xid 79 0000:3b:00.0\n"
    path = ack_file(live)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    data = json.loads(open(path).read())
    assert data["schema"] == "slurm-hooks.xid-ack/1"
    assert [(a["boot_id"], a["seq"], a["kind"], a["code"]) for a in data["acks"]] == [
        (BOOT, 100, "xid", 79)
    ]
    assert not [
        n for n in os.listdir(os.path.dirname(path)) if n != "xid-ack.json"
    ]  # no temp file left
    code, results = check_json(live, conf, "xid.events")
    assert code == 1 and [r["status"] for r in results] == ["WARN"]  # only Xid 13 is left
    rows = json.loads(cli(["xid", "--root", live, "--json"], conf).stdout)
    assert [r["acknowledged"] for r in rows] == [True, False, False]

    proc = cli(["xid", "ack", "--all", "--root", live], conf)
    assert proc.returncode == 0 and proc.stdout.splitlines() == [
        "acknowledged seq=101 Xid 13 0000:18:00.0",
        "acknowledged seq=102 SXid 20034 0000:05:00.0",
    ]
    assert [a["seq"] for a in json.loads(open(path).read())["acks"]] == [100, 101, 102]
    assert (
        check_json(live, conf, "xid.events")[0] == 0 and check_json(live, conf, "xid.sxid")[0] == 0
    )
    assert cli(["xid", "--root", live], conf).returncode == 0  # everything acknowledged
    assert cli(["xid", "ack", "--all", "--root", live], conf).stdout == "nothing to acknowledge\n"


def test_ack_replaces_other_boots_and_corrupt_files(config, live):
    conf = config()
    path = ack_file(live)
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as handle:
        json.dump(
            {"acks": [{"boot_id": "old-boot", "seq": 5}, {"boot_id": BOOT, "seq": 101}]}, handle
        )
    assert cli(["xid", "ack", "--seq", "100", "--root", live], conf).returncode == 0
    assert [(a["boot_id"], a["seq"]) for a in json.loads(open(path).read())["acks"]] == [
        (BOOT, 101),
        (BOOT, 100),
    ]
    with open(path, "w") as handle:
        handle.write("{garbage")
    proc = cli(["xid", "ack", "--seq", "102", "--root", live], conf)
    assert proc.returncode == 0 and "not JSON" in proc.stderr
    assert [a["seq"] for a in json.loads(open(path).read())["acks"]] == [102]


def test_ack_errors(config, live):
    conf = config()
    proc = cli(["xid", "ack", "--root", live], conf)
    assert proc.returncode == 3 and "say --all" in proc.stderr
    proc = cli(["xid", "ack", "--seq", "1", "--root", live], conf)  # a record, but not an Xid
    assert proc.returncode == 3 and "sequence number 1 " in proc.stderr
    assert cli(["xid", "ack", "--all", "--seq", "100", "--root", live], conf).returncode == 3
    os.unlink(os.path.join(live, "proc/sys/kernel/random/boot_id"))
    proc = cli(["xid", "ack", "--all", "--root", live], conf)
    assert proc.returncode == 3 and "boot id" in proc.stderr
    assert not os.path.exists(ack_file(live))


def test_help_says_a_reboot_clears_xids(config):
    proc = cli_child(["xid", "--help"], config())
    assert proc.returncode == 0 and "A reboot clears them anyway" in proc.stdout
    assert "explain" in cli(["--help"], config()).stdout


def test_an_ack_file_another_user_planted_is_not_carried_into_ours(config, live):
    """`xid ack` merges the acks already in the file. A file another user planted there (acking
    Xid 13, seq 101) must not be rewritten as root's own when the admin acknowledges seq 100."""
    conf = config()
    path = ack_file(live)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        json.dump({"acks": [{"boot_id": BOOT, "seq": 101}]}, handle)
    os.chown(path, 4242, 4242)
    proc = cli(["xid", "ack", "--seq", "100", "--root", live], conf)
    assert proc.returncode == 0, proc.stderr
    assert "owned by uid 4242" in proc.stderr
    assert [a["seq"] for a in json.loads(open(path).read())["acks"]] == [100]
    assert os.stat(path).st_uid == os.geteuid()
    code, results = check_json(live, conf, "xid.events")
    assert [r["status"] for r in results] == ["WARN"]  # Xid 13 still counts


def test_ack_gives_up_on_a_directory_lock_a_user_holds(config, live, monkeypatch):
    """flock needs only a descriptor, and any user may open a readable directory: one holding the
    state directory's lock kept `xid ack` waiting for ever. It gives up, names the file, writes nothing."""
    import fcntl

    from slurm_hooks.cli import xid_verbs

    monkeypatch.setattr(xid_verbs, "ACK_LOCK_TIMEOUT_S", 0.2)
    conf = config()
    directory = os.path.dirname(ack_file(live))
    os.makedirs(directory, exist_ok=True)
    holder = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        proc = cli(["xid", "ack", "--seq", "100", "--root", live], conf)
    finally:
        os.close(holder)
    assert proc.returncode != 0 and "xid-ack.json" in proc.stderr, proc
    assert not os.path.exists(ack_file(live))
