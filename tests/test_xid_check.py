"""Family `xid`: xid.events and xid.sxid run through the runner against fixture trees (/dev/kmsg as a file)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from slurm_hooks.checks import xid as xc
from slurm_hooks.checks.gpu.inventory import GpuDevice, GpuInventory
from slurm_hooks.core.config import ConfigError, validate
from slurm_hooks.core.runner import JobContext, run_checks
from slurm_hooks.hw import nvml
from slurm_hooks.hw.host import Host
from slurm_hooks.registry import GathererSpec, Registry
from slurm_hooks.result import Action, Blame, Status

BOOT = "3f1c2a9e-5b7d-4e21-9c0a-1d2e3f4a5b6c"
STATE = "/var/lib/slurm-hooks"
BUS = {0: "0000:18:00.0", 1: "0000:2a:00.0", 2: "0000:3b:00.0"}
X79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
X13 = "NVRM: Xid (PCI:0000:18:00): 13, pid=77, name=train, Graphics Exception: ESR 0x50 0x1"
X999 = "NVRM: Xid (PCI:0000:18:00): 999, pid=77, name=train, something new"
SX_FATAL = "nvidia-nvswitch2: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 14 LTSSM Fault Up"
SX_NONFATAL = (
    "nvidia-nvswitch0: SXid (PCI:0000:06:00.0): 19084, Non-fatal, Link 3 AN1 Heartbeat Timeout"
)
BOOT_NOISE = [
    "6,0,0,-;Linux version 6.8.0 (buildd@lcy02) #1 SMP",
    " SUBSYSTEM=cpu",
    "4,1,1200,-;ACPI: bogus Xid word",
]


def kmsg(*messages: str, first_seq: int = 100) -> str:
    lines = list(BOOT_NOISE)
    lines += ["3,%d,%d,-;%s" % (first_seq + i, 5000000 + i, m) for i, m in enumerate(messages)]
    return "\n".join(lines) + "\n"


@pytest.fixture
def node(write_tree):
    """node(*messages, ack=None) -> root of a tree with /dev/kmsg, boot_id and (optionally) the ack file."""

    def build(*messages: str, ack=None, boot_id: str = BOOT, raw_kmsg=None):
        files = {
            "dev/kmsg": raw_kmsg if raw_kmsg is not None else kmsg(*messages),
            "proc/sys/kernel/random/boot_id": boot_id + "\n",
        }
        if ack is not None:
            files[STATE.lstrip("/") + "/xid-ack.json"] = (
                ack if isinstance(ack, str) else json.dumps(ack)
            )
        return write_tree(files)

    return build


def with_inventory(registry, inventory_or_func) -> Registry:
    """The real checks with the gpu.inventory gatherer replaced (no NVML on this machine)."""
    func = inventory_or_func if callable(inventory_or_func) else (lambda ctx: inventory_or_func)
    gatherers = dict(registry.gatherers)
    gatherers["gpu.inventory"] = GathererSpec("gpu.inventory", func)
    return Registry(checks=dict(registry.checks), gatherers=gatherers)


GPUS = GpuInventory(
    driver_version="550.54.15",
    devices=tuple(GpuDevice(i, "NVIDIA H100 80GB HBM3", "GPU-%d" % i, b) for i, b in BUS.items()),
    count=3,
)
NO_NVML = GpuInventory(error=nvml.NvmlError(nvml.LIBRARY_NOT_FOUND, "nvmlInit"))


def run(registry, root, name="xid.events", context="manual", job=None, inventory=GPUS, **params):
    reg = with_inventory(registry, inventory)
    config = validate(reg, {"checks": {name: params}} if params else {})
    report = run_checks(reg, config, Host(root), context, [reg.checks[name]], job=job)
    return report.runs[0].results


def test_healthy_node_is_ok(registry, node):
    root = node("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15")
    [result] = run(registry, root)
    assert (result.status, result.summary) == (Status.OK, "no Xid since boot")
    assert result.details["boot_id"] == BOOT
    [sxid] = run(registry, root, "xid.sxid")
    assert (sxid.status, sxid.summary) == (Status.OK, "no SXid since boot")


def test_xid79_fails_node_with_the_gpu_component(registry, node):
    [result] = run(registry, node(X79))
    assert (
        result.status is Status.FAIL
        and result.action is Action.REBOOT
        and result.blame is Blame.NODE
    )
    assert result.component == "gpu:2 0000:3b:00.0"
    assert result.summary == "Xid 79: GPU has fallen off the bus."
    [event] = result.details["events"]
    assert (event["code"], event["seq"], event["pid"], event["process"]) == (
        79,
        100,
        1234,
        "python",
    )
    assert "RESTART_BM" in result.details["reason"]


def test_without_nvml_the_component_is_the_pci_address(registry, node):
    [result] = run(registry, node(X79), inventory=NO_NVML)
    assert result.status is Status.FAIL and result.component == "pci:0000:3b:00.0"
    assert any("GPU indices unknown" in n for n in result.details["notes"])


def test_xid13_warns_and_blames_the_job(registry, node):
    [result] = run(registry, node(X13))
    assert (
        result.status is Status.WARN and result.blame is Blame.JOB and result.action is Action.NONE
    )
    assert result.component == "gpu:0 0000:18:00.0" and result.summary.startswith(
        "Xid 13: Graphics Exception"
    )


def test_unknown_xid_is_unknown_and_never_node_broken(registry, node):
    [result] = run(registry, node(X999))
    assert (
        result.status is Status.UNKNOWN
        and result.blame is Blame.CHECK
        and result.action is Action.NONE
    )


def test_one_result_per_gpu_and_status(registry, node):
    x79_again = X79.replace("pid=1234", "pid=1300")
    results = run(
        registry,
        node(X79, X13, x79_again, "NVRM: Xid (PCI:0000:3b:00): 13, pid=9, Graphics Exception"),
    )
    by = {(r.component, r.status): r for r in results}
    assert set(by) == {
        ("gpu:2 0000:3b:00.0", Status.FAIL),
        ("gpu:2 0000:3b:00.0", Status.WARN),
        ("gpu:0 0000:18:00.0", Status.WARN),
    }
    fail = by[("gpu:2 0000:3b:00.0", Status.FAIL)]
    assert "(2 events)" in fail.summary and [e["seq"] for e in fail.details["events"]] == [100, 102]


def test_garbage_lines_are_ignored(registry, node):
    garbage = (
        "\n".join(
            [
                "",
                "not a record",
                "3,abc,1,-;NVRM: Xid (PCI:0000:3b:00): 79, x",  # bad header: who wrote it is unknown
                "NVRM: Xid (PCI:zz:zz): 79, bad address",
                "NVRM: Xid (PCI:0000:3b:00): notanumber",
                "6,5,6,-;user said: my Xid is fine",
                "\x00\xff\xfe binary",
                "6,7,8,-;" + "x" * 20000,
                " DEVICE=+pci:0000:3b:00.0",
            ]
        )
        + "\n"
    )
    [result] = run(registry, node(raw_kmsg=garbage))
    assert (result.status, result.summary) == (Status.OK, "no Xid since boot")


def test_a_users_xid_is_no_xid(registry, node):
    """Issue 13: a binary named like an Xid line crashes; the kernel's segfault line carries its name (KERN_INFO,
    kernel facility), and root's echo into /dev/kmsg gets the user facility. Neither drains."""
    forged = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
    raw = kmsg() + "".join(
        [
            "6,200,6000000,-;python3[4242]: segfault at 0 ip 00007f8d2c41a2b0 sp 00007ffd6f0e1c28 error 4 in "
            "%s[7f8d2c400000+1b000] likely on CPU 7 (core 7, socket 0)\n" % forged,
            "12,201,6000001,-;%s\n" % forged,
            "12,202,6000002,-;" + SX_FATAL + "\n",
        ]
    )
    for name in ("xid.events", "xid.sxid"):
        [result] = run(registry, node(raw_kmsg=raw), name)
        assert result.status is Status.OK, (name, result)
    [result] = run(
        registry, node(raw_kmsg=raw + "4,203,6000003,-;%s\n" % forged)
    )  # the driver's own line
    assert result.status is Status.FAIL and result.details["events"][0]["seq"] == 203


def test_an_nvswitch_report_is_one_event(registry, node):
    """Issue 13: the Severity and Data lines of a report are not events 'without severity' (UNKNOWN)."""
    report = [
        SX_NONFATAL,
        "nvidia-nvswitch0: SXid (PCI:0000:06:00.0): 19084, Severity 0 Engine instance 03 "
        "Sub-engine instance 00",
        "nvidia-nvswitch0: SXid (PCI:0000:06:00.0): 19084, Data {0x00000003, "
        "0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000}",
    ]
    [result] = run(registry, node(*report), "xid.sxid")
    assert result.status is Status.WARN and result.summary.startswith(
        "SXid 19084: Link 3 AN1 Heartbeat Timeout"
    )
    assert "events)" not in result.summary and [e["seq"] for e in result.details["events"]] == [100]


@pytest.mark.parametrize(
    "gpus,status", [((0, 1), Status.OK), ((2,), Status.FAIL), (None, Status.FAIL)]
)
def test_job_sees_only_xids_on_its_gpus(registry, node, gpus, status):
    job = JobContext(job_id="42", user="alice", gpus=gpus)
    [result] = run(registry, node(X79), context="prolog", job=job)
    assert result.status is status
    if status is Status.OK:
        assert result.details["other_gpus"] == 1 and "1 other gpus" in result.summary


def test_unmapped_xids_count_for_every_job(registry, node):
    job = JobContext(job_id="42", gpus=(0,))
    stray = "NVRM: Xid (PCI:0000:99:00): 79, GPU has fallen off the bus."  # NVML no longer lists it
    [result] = run(registry, node(stray), context="prolog", job=job)
    assert result.status is Status.FAIL and result.component == "pci:0000:99:00.0"
    [result] = run(registry, node(X79), context="prolog", job=job, inventory=NO_NVML)
    assert result.status is Status.FAIL


def test_acknowledged_xids_are_cleared(registry, node):
    ack = {"schema": xc.ACK_SCHEMA, "acks": [{"boot_id": BOOT, "seq": 100, "code": 79}]}
    [result] = run(registry, node(X79, X13, ack=ack))
    assert result.status is Status.WARN  # 79 (seq 100) acknowledged, 13 (seq 101) not
    [result] = run(registry, node(X79, ack=ack))
    assert result.status is Status.OK and result.details["acknowledged"] == 1
    assert "1 acknowledged" in result.summary
    [result] = run(
        registry, node(X79, ack=[{"boot_id": "another-boot", "seq": 100}])
    )  # bare list form
    assert result.status is Status.FAIL  # an ack of another boot never matches


@pytest.mark.parametrize(
    "ack,note",
    [
        ("{not json", "not JSON"),
        ('{"acks": 5}', "no 'acks' list"),
        ('[{"boot_id": "%s", "seq": "100"}, 7]' % BOOT, "2 malformed entries"),
    ],
)
def test_corrupt_ack_file_is_treated_as_empty(registry, node, ack, note):
    [result] = run(registry, node(X79, ack=ack))
    assert result.status is Status.FAIL
    assert any(note in n for n in result.details["notes"]), result.details


def test_an_ack_file_another_user_wrote_excuses_nothing(registry, node):
    """An ack excuses a real fault. One planted by another user (a state directory others can
    write), acknowledging this boot's Xid 79, is not believed: the Xid fails the check."""
    ack = {"schema": xc.ACK_SCHEMA, "acks": [{"boot_id": BOOT, "seq": 100, "code": 79}]}
    root = node(X79, ack=ack)
    planted = os.path.join(root, STATE.lstrip("/"), "xid-ack.json")
    os.chown(planted, 4242, 4242)
    [result] = run(registry, root)
    assert result.status is Status.FAIL, result.summary
    assert any("owned by uid 4242" in n for n in result.details["notes"]), result.details
    os.chown(planted, os.geteuid(), os.getegid())
    os.chmod(planted, 0o666)  # ours, but anyone could have rewritten it
    [result] = run(registry, root)
    assert result.status is Status.FAIL, result.summary


def test_unreadable_ack_file_and_missing_boot_id(registry, node, tmp_path):
    root = node(X79)
    os.makedirs(os.path.join(root, STATE.lstrip("/"), "xid-ack.json"))  # a directory: read fails
    [result] = run(registry, root)
    assert result.status is Status.FAIL and any(
        "cannot read the ack file" in n for n in result.details["notes"]
    )
    os.unlink(os.path.join(root, "proc/sys/kernel/random/boot_id"))
    [result] = run(registry, root)
    assert result.status is Status.FAIL and any(
        "acknowledgements not applied" in n for n in result.details["notes"]
    )


def test_missing_kmsg_is_unknown(registry, tmp_path):
    [result] = run(registry, str(tmp_path))
    assert result.status is Status.UNKNOWN and "/dev/kmsg" in result.summary


@pytest.mark.parametrize(
    "overrides,status,action",
    [
        (["79=WARN"], Status.WARN, Action.NONE),
        (["79=FAIL:rma"], Status.FAIL, Action.RMA),
        (["13=FAIL:reset-gpu"], Status.FAIL, Action.RESET_GPU),
        (["13=OK", "79=OK"], Status.OK, Action.NONE),
        (["13=fail"], Status.FAIL, Action.DRAIN),  # FAIL without an action: drain; case-insensitive
    ],
)
def test_overrides(registry, node, overrides, status, action):
    root = node(X13) if overrides[0].startswith("13") else node(X79)
    if len(overrides) == 2:
        root = node(X13, X79)
    results = run(registry, root, overrides=overrides)
    worst = max(results, key=lambda r: r.status.severity)
    assert (worst.status, worst.action) == (status, action)
    if status is Status.FAIL and overrides[0].startswith("13"):
        assert worst.blame is Blame.NODE and "operator override" in worst.details["reason"]


@pytest.mark.parametrize(
    "entry,fragment",
    [
        ("79=FAIL:rebot", "invalid value 'rebot'"),
        ("79", "expected CODE=STATUS[:ACTION]"),
        ("x=OK", "not an Xid number"),
        ("79=OK:reboot", "contradicts status"),
        ("79=FAIL:none", "FAIL needs an action"),
        ("79=BAD", "invalid value 'BAD'"),
    ],
)
def test_bad_override_is_refused_at_load_naming_the_entry(registry, entry, fragment):
    """Issue 14: a bad override used to load fine and surface as UNKNOWN in every prolog; it is refused when
    the configuration is loaded (`config check`, every hook), naming the entry."""
    with pytest.raises(ConfigError) as refused:
        validate(registry, {"checks": {"xid.events": {"overrides": ["13=OK", entry]}}})
    assert "overrides entry %r" % entry in str(refused.value) and fragment in str(refused.value)


@pytest.mark.parametrize(
    "table,fragment",
    [
        ({"79": {"status": "BROKEN", "action": "rma"}}, "invalid value 'BROKEN'"),
        ({"79": {"status": "FAIL", "action": "rebot"}}, "invalid value 'rebot'"),
        ({"79": "FAIL:rma"}, "a table like"),
        ({"x": {"status": "OK"}}, "not an Xid number"),
        ({"79": {"status": "OK", "action": "reboot"}}, "contradicts status"),
        ({"79": {"status": "FAIL", "action": "none"}}, "FAIL needs an action"),
        ({"79": {"stat": "FAIL"}}, "unknown key 'stat'"),
        ({"79": {}}, "is empty"),
        ("79=FAIL", "expected a table"),
    ],
)
def test_bad_override_table_is_refused_at_load(registry, table, fragment):
    with pytest.raises(ConfigError, match="overrides") as refused:
        validate(registry, {"checks": {"xid.events": {"overrides": table}}})
    assert fragment in str(refused.value), str(refused.value)


def test_override_tables_apply_and_the_old_list_form_warns_with_the_table_to_write(registry, node):
    table = {"79": {"status": "WARN"}}
    [result] = run(registry, node(X79), overrides=table)
    assert result.status is Status.WARN
    config = validate(registry, {"checks": {"xid.events": {"overrides": ["79=FAIL:rma", "13=OK"]}}})
    assert config.check("xid.events").params.overrides == {
        79: {"status": "FAIL", "action": "rma"},
        13: {"status": "OK"},
    }
    [warning] = config.warnings
    assert "deprecated" in warning and '[checks."xid.events".overrides]' in warning
    assert '79 = {status = "FAIL", action = "rma"}' in warning and '13 = {status = "OK"}' in warning
    assert validate(registry, {"checks": {"xid.events": {"overrides": table}}}).warnings == ()


def test_duplicate_override():
    with pytest.raises(ValueError, match="overridden twice"):
        xc.parse_overrides(["79=OK", "79=WARN"])
    assert xc.parse_overrides([" 79 = fail : Reboot "]) == {
        79: {"status": "FAIL", "action": "reboot"}
    }


def test_ignored_xids_are_left_out(registry, node):
    [result] = run(registry, node(X79, X13), ignore=[79, 13])
    assert (
        result.status is Status.OK
        and result.details["ignored"] == 2
        and result.summary == "no Xid since boot"
    )


def test_hung_nvml_does_not_hide_an_xid(registry, node, monkeypatch):
    monkeypatch.setattr(xc, "NVML_WAIT_S", 0.2)
    started = time.monotonic()
    [result] = run(registry, node(X79), inventory=lambda ctx: time.sleep(30))
    assert time.monotonic() - started < 2
    assert result.status is Status.FAIL and result.component == "pci:0000:3b:00.0"
    assert any("did not answer" in n for n in result.details["notes"])


def test_sxid_fatal_fails_and_nonfatal_warns(registry, node):
    results = run(registry, node(SX_FATAL, SX_NONFATAL, X79), "xid.sxid")
    by = {r.component: r for r in results}
    fatal, nonfatal = by["nvswitch:2 0000:05:00.0"], by["nvswitch:0 0000:06:00.0"]
    assert (fatal.status, fatal.action, fatal.blame) == (Status.FAIL, Action.REBOOT, Blame.NODE)
    assert fatal.summary == "SXid 20034: Link 14 LTSSM Fault Up"
    assert (nonfatal.status, nonfatal.action) == (Status.WARN, Action.NONE)
    unmarked = "nvidia-nvswitch1: SXid (PCI:0000:07:00.0): 11012, Link 1 something"
    assert run(registry, node(unmarked), "xid.sxid")[0].status is Status.UNKNOWN


def test_sxid_overrides_ignore_and_ack(registry, node):
    root = node(SX_FATAL, SX_NONFATAL)
    assert [r.status for r in run(registry, root, "xid.sxid", overrides=["20034=WARN"])] == [
        Status.WARN
    ] * 2
    assert [
        r.status for r in run(registry, root, "xid.sxid", overrides={"20034": {"status": "WARN"}})
    ] == [Status.WARN] * 2
    assert run(registry, root, "xid.sxid", ignore=[20034, 19084])[0].status is Status.OK
    ack = {"acks": [{"boot_id": BOOT, "seq": 100}, {"boot_id": BOOT, "seq": 101}]}
    assert run(registry, node(SX_FATAL, SX_NONFATAL, ack=ack), "xid.sxid")[0].status is Status.OK
    with pytest.raises(ConfigError, match="'20034=FAIL:explode'"):
        run(registry, root, "xid.sxid", overrides=["20034=FAIL:explode"])


def test_fake_gpu_node_maps_xids_to_gpu_indices(tmp_path):
    """End to end through the fake libnvidia-ml.so.1: the bus id in the Xid becomes the NVML index."""
    fakenode = pytest.importorskip("tests.fakenode")
    xid_line = (
        "NVRM: Xid (PCI:0000:44:00): 79, pid=4242, name=train.py, GPU has fallen off the bus."
    )
    try:
        built = fakenode.FakeNode.build("dgx-h100", tmp_path, overrides={"kmsg": [xid_line]})
    except fakenode.FakeNvmlBuildError as exc:
        pytest.skip("fake NVML cannot be built here: %s" % exc)
    index = next(i for i, gpu in built.spec["gpu"].items() if gpu["pci"] == "0000:44:00.0")
    env = built.subprocess_env()
    env.pop("SLURM_HOOKS_CONFIG", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm_hooks",
            "check",
            "xid.events",
            "--root",
            str(built.root),
            "--live",
            "nvml",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    report = json.loads(proc.stdout)
    [result] = report["checks"][0]["results"]
    assert index != 0 and result["component"] == "gpu:%d 0000:44:00.0" % index, proc.stderr
    assert (result["status"], result["action"]) == ("FAIL", "reboot")


def test_nvml_is_not_asked_without_xids(registry, node):
    def no_nvml(ctx):
        raise AssertionError("NVML asked on the happy path")

    [result] = run(registry, node(SX_FATAL), inventory=no_nvml)
    assert result.status is Status.OK and "notes" not in result.details


def test_a_mig_xid_counts_for_its_gpu_and_names_the_partition(registry, node):
    """Tracker 23: "(PCI:0000:3b:00 GPU-I:01 GPU-CI:02)" was no Xid at all; it is GPU 2's, with the partition shown."""
    mig79 = X79.replace("(PCI:0000:3b:00)", "(PCI:0000:3b:00 GPU-I:01 GPU-CI:02)")
    [result] = run(registry, node(mig79))
    assert result.status is Status.FAIL and result.component == "gpu:2 0000:3b:00.0"
    assert result.summary == "Xid 79 (MIG GI 1 CI 2): GPU has fallen off the bus."
    [event] = result.details["events"]
    assert (event["gpu_instance"], event["compute_instance"]) == (1, 2)
    [job_result] = run(
        registry, node(mig79), context="prolog", job=JobContext(job_id="7", gpus=(0,))
    )
    assert job_result.status is Status.OK  # another job's GPU: left out, as for a whole GPU
