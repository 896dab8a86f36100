"""`slurm-hooks capture` (issue #13 section 1) and what `--root` may read (section 2).

A capture of the fake node, unpacked and checked with `--root`, must give the node's verdicts for
every check that does not need the live NVIDIA driver; the GPU checks SKIP saying why. A capture
holds what the checks read and nothing else, with secrets redacted.
"""

from __future__ import annotations

import json
import os
import re
import tarfile

import pytest

from slurm_hooks.hw import capture
from slurm_hooks.hw.host import Host, ReadLog
from slurm_hooks.hw.redact import redact, redact_secrets
from tests.helpers import cli_with_default_config, runs_by_name

SECRET_CONF = (
    "ClusterName=c1\nAccountingStoragePass=hunter2\nSlurmctldHost=head\n"
    "NodeName=dgx-h100-[01-16] CPUs=224 CpuSpecList=0-1 RealMemory=2000000\n"
    "PartitionName=gpu Nodes=ALL Default=YES\n"
)


cli = cli_with_default_config
by_check = runs_by_name


def unpack(archive_path, directory):
    from tests.captures import extract

    with tarfile.open(archive_path) as tar:
        extract(tar, directory)
    (top,) = os.listdir(directory)
    return os.path.join(directory, top)


def verdicts(run):
    """(status, component, summary, action) of each result. A GPU is 'gpu:N <bdf>' when NVML numbered it and
    'pci:<bdf>' when not (under --root): the same GPU, so the component is compared by its PCI address."""

    def where(component):
        return re.sub(r"^(gpu:\d+ |pci:)", "", component) if component else component

    return [(r["status"], where(r["component"]), r["summary"], r["action"]) for r in run["results"]]


@pytest.fixture(scope="module")
def captured_fake(tmp_path_factory):
    """The fake DGX (fake NVML, a slurm.conf holding a password, processes) captured with --live nvml."""
    from tests.fakenode import FakeNode

    node = FakeNode.build_temp(
        "dgx-h100",
        {
            "slurm": {"slurm_conf": SECRET_CONF, "gres_conf": "auto"},
            "kmsg": [
                {
                    "msg": "NVRM: Xid (PCI:0000:18:00): 79, pid=0, GPU has fallen off the bus.",
                    "level": 4,
                }
            ],
        },
    )
    base = tmp_path_factory.mktemp("capture")
    out = str(base / "fake.tar.gz")
    proc = cli(  # a child: capture's subprocess test, its library found as an admin's run finds it
        ["capture", out, "--root", str(node.root), "--live", "nvml"],
        env=node.subprocess_env(),
        child=True,
    )
    assert proc.returncode == 0, proc.stderr
    root = unpack(out, str(base / "unpacked"))
    yield node, out, root, proc.stdout
    node.cleanup()


def test_capture_of_the_fake_node_reproduces_its_verdicts(captured_fake):
    node, _out, root, stdout = captured_fake
    assert os.path.basename(root) == "dgx-h100-01" and "check --root" in stdout
    meta = json.load(open(os.path.join(root, ".slurm-hooks", "capture.json")))
    assert meta["schema"] == "slurm-hooks.capture/1" and meta["node"] == "dgx-h100-01"
    at_capture = by_check(meta["verdicts"])
    proc = cli(["check", "--all-contexts", "--json", "--root", root])
    assert proc.returncode in (0, 1, 2), proc.stderr
    replayed = json.loads(proc.stdout)
    assert replayed["node"] == "dgx-h100-01"  # the capture's name, not this machine's
    replay = by_check(replayed)
    assert set(replay) == set(at_capture)
    assert (
        at_capture["xid.events"]["results"][0]["status"] == "FAIL"
    )  # the capture saw the Xid 79...
    for name, run in at_capture.items():
        if name.startswith("gpu."):  # live-only: NVML answers for the machine it runs on
            assert {r["status"] for r in replay[name]["results"]} == {"SKIP"}, replay[name]
            assert (
                "live-only" in replay[name]["results"][0]["summary"]
                or "NVML unavailable" in replay[name]["results"][0]["summary"]
            )
            continue
        assert verdicts(replay[name]) == verdicts(run), (
            name
        )  # ...and so does the replay, like everything else


def test_capture_holds_what_the_checks_read_and_no_secrets(captured_fake):
    node, out, root, _stdout = captured_fake
    with tarfile.open(out) as tar:
        names = tar.getnames()
    assert not [n for n in names if re.search(r"/proc/(\d+|self)/(environ|cmdline)$", n)]
    assert (
        "dgx-h100-01/proc/cmdline" in names
    )  # the kernel's command line (topology.iommu reads it)
    slurm_conf = open(os.path.join(root, "etc/slurm/slurm.conf")).read()
    assert "hunter2" not in slurm_conf and slurm_conf.startswith("NodeName=dgx-h100-[01-16]")
    status = open(os.path.join(root, "proc/901/status")).read()  # slurmd, a watched daemon
    assert "Cpus_allowed_list:" in status and "Uid:" not in status and "VmRSS" not in status
    meta = json.load(open(os.path.join(root, ".slurm-hooks", "capture.json")))
    assert any("slurm.conf: only NodeName lines kept" in r for r in meta["redactions"])
    # read by a check -> in; never read -> out
    assert os.path.exists(os.path.join(root, "sys/devices/system/cpu/online"))
    assert not os.path.exists(os.path.join(root, "proc/version"))
    assert os.path.islink(os.path.join(root, "sys/bus/pci/devices/0000:18:00.0"))
    assert len(names) < sum(len(files) + len(dirs) for _, dirs, files in os.walk(str(node.root)))


def test_capture_of_this_machine_replays_with_the_same_verdicts(tmp_path):
    out = str(tmp_path / "live.tar.gz")
    proc = cli(["capture", out])
    assert proc.returncode == 0, proc.stderr
    root = unpack(out, str(tmp_path / "unpacked"))
    at_capture = by_check(
        json.load(open(os.path.join(root, ".slurm-hooks", "capture.json")))["verdicts"]
    )
    proc = cli(["check", "--all-contexts", "--json", "--root", root])
    replay = by_check(json.loads(proc.stdout))
    for name, run in at_capture.items():
        if name.startswith("gpu.") or name in ("host.nvme", "host.bmc"):
            # NVML and the host's tools (nvme-cli, ipmitool) answer on the running node only
            assert {r["status"] for r in replay[name]["results"]} == {"SKIP"}
        else:
            assert verdicts(replay[name]) == verdicts(run), name


def test_a_root_that_does_not_exist_is_a_usage_error(tmp_path):
    proc = cli(["check", "--root", str(tmp_path / "nope")])
    assert (
        proc.returncode == 3 and "--root %s: no such directory" % (tmp_path / "nope") in proc.stderr
    )
    assert (
        cli(["capture", str(tmp_path / "x.tar.gz"), "--root", str(tmp_path / "nope")]).returncode
        == 3
    )
    assert not os.path.exists(str(tmp_path / "x.tar.gz"))


def test_redaction_rules():
    status = b"Name:\tsshd\nUmask:\t0022\nPid:\t812\nUid:\t0\t0\t0\t0\nKthread:\t0\nCpus_allowed_list:\t0-3\n"
    kept, note = redact("/proc/812/status", status)
    assert kept == b"Name:\tsshd\nPid:\t812\nKthread:\t0\nCpus_allowed_list:\t0-3\n" and note
    assert redact("/proc/812/environ", b"SECRET=1")[0] is None
    assert redact("/proc/self/cmdline", b"x")[0] is None
    assert redact("/sys/devices/system/cpu/online", b"0-3\n") == (b"0-3\n", "")


def test_plan_keeps_the_symlinks_on_the_way(tmp_path):
    root = tmp_path / "r"
    (root / "sys/devices/pci0000:00/0000:00:01.0").mkdir(parents=True)
    (root / "sys/devices/pci0000:00/0000:00:01.0/vendor").write_text("0x10de\n")
    (root / "sys/devices/pci0000:00/0000:00:01.0/unread").write_text("x\n")
    (root / "sys/bus/pci/devices").mkdir(parents=True)
    os.symlink(
        "../../../devices/pci0000:00/0000:00:01.0", str(root / "sys/bus/pci/devices/0000:00:01.0")
    )
    log = ReadLog()
    host = Host(str(root), log=log)
    assert host.listdir("/sys/bus/pci/devices") == ["0000:00:01.0"]
    assert host.read_text("/sys/bus/pci/devices/0000:00:01.0/vendor") == "0x10de"
    entries, _ = capture.plan(str(root), log)
    assert entries["/sys/bus/pci/devices/0000:00:01.0"] == (
        "link",
        "../../../devices/pci0000:00/0000:00:01.0",
    )
    assert entries["/sys/devices/pci0000:00/0000:00:01.0/vendor"] == ("file", b"0x10de\n")
    assert "/sys/devices/pci0000:00/0000:00:01.0/unread" not in entries


def test_nvml_is_not_read_under_root_unless_asked(registry, nvml_node):
    """A capture of a GPU node analysed on a machine without GPUs said 'NVML is unusable' -> drain, and on a
    machine with GPUs it would have judged the wrong GPUs. Under --root the GPU checks SKIP; --live nvml
    (the fake node's library) reads them."""
    from slurm_hooks.core.config import validate
    from slurm_hooks.core.runner import run_checks, select_checks
    from slurm_hooks.result import Status

    node = nvml_node()
    names = select_checks(registry, "manual", ["gpu", "topology.gpu-nic"])
    plain = run_checks(
        registry, validate(registry, {}), Host(str(node.root)), "manual", names
    ).results()
    gpu = [r for r in plain if r.check.startswith("gpu.")]
    assert gpu and {r.status for r in gpu} == {Status.SKIP}
    count = next(r for r in gpu if r.check == "gpu.count")
    assert count.summary.startswith("NVML is live-only: not read under --root")
    nic = next(r for r in plain if r.check == "topology.gpu-nic")
    assert nic.status is Status.OK  # sysfs alone still judges the PCIe tree
    live = validate(registry, {"general": {"root_live_sources": ["nvml"]}})
    asked = run_checks(registry, live, Host(str(node.root)), "manual", names).results()
    assert next(r for r in asked if r.check == "gpu.count").status is Status.OK


def test_root_live_sources_are_validated(registry):
    from slurm_hooks.core.config import ConfigError, validate

    with pytest.raises(
        ConfigError,
        match=r"\[general\] root_live_sources: 'nvidia' is not one of 'nvml', 'statvfs'",
    ):
        validate(registry, {"general": {"root_live_sources": ["nvidia"]}})


# -- secrets are redacted by content, whatever the file is called (issue 24) --------------------

# Slurm 25.11.7 etc/slurm.conf.example lines (AccountingStoragePass= and JobCompPass= uncommented,
# with invented values), as a site keeps them in slurm-prod.conf with slurm.conf a symlink to it.
SLURM_PROD_CONF = (
    "ClusterName=cluster\nSlurmctldHost=linux0\n"
    "AccountingStoragePass=s3cr3t-acct\nAccountingStorageType=accounting_storage/slurmdbd\n"
    "JobCompPass=s3cr3t-comp\nJobCompType=jobcomp/none\n"
    "NodeName=linux[1-32] CPUs=1 State=UNKNOWN\n"
)


def test_slurm_conf_behind_a_symlink_of_another_name_is_redacted(tmp_path):
    root = tmp_path / "r"
    (root / "etc/slurm").mkdir(parents=True)
    (root / "etc/slurm/slurm-prod.conf").write_text(SLURM_PROD_CONF)
    os.symlink("slurm-prod.conf", str(root / "etc/slurm/slurm.conf"))
    (root / "etc/slurm/other.conf").write_text(SLURM_PROD_CONF)  # read by another name entirely
    log = ReadLog()
    host = Host(str(root), log=log)
    assert "s3cr3t-acct" in host.read_text("/etc/slurm/slurm.conf")
    host.read_text("/etc/slurm/other.conf")
    entries, redactions = capture.plan(str(root), log)
    archived = entries["/etc/slurm/slurm-prod.conf"][1]
    assert b"s3cr3t" not in archived and archived == b"NodeName=linux[1-32] CPUs=1 State=UNKNOWN\n"
    other = entries["/etc/slurm/other.conf"][1]
    assert b"s3cr3t" not in other and b"AccountingStoragePass=<redacted>" in other
    assert b"JobCompPass=<redacted>" in other and b"NodeName=linux[1-32]" in other
    assert any(r.startswith("/etc/slurm/other.conf: 2 secret values") for r in redactions)


@pytest.mark.parametrize(
    "line, redacted",
    [
        (b"StoragePass=password", b"StoragePass=<redacted>"),  # Slurm's slurmdbd.conf.example
        (b"accountingstoragepass = 'a b c'", b"accountingstoragepass = <redacted>"),
        (  # Slurm's jwt docs: AuthAltParameters=jwt_key=...
            b"AuthAltParameters=jwt_key=/var/spool/slurm/statesave/jwt_hs256.key",
            b"AuthAltParameters=jwt_key=<redacted>",
        ),
        (b"MYSQL_PASSWORD: hunter2 x=1", b"MYSQL_PASSWORD: <redacted> x=1"),
        (b"api_token_file=/root/t", b"api_token_file=<redacted>"),
        (b"ClientSecret=abc", b"ClientSecret=<redacted>"),
        # a JSON key is quoted; an escaped quote does not end a JSON string
        (b'{"password": "hunter2", "user": "slurm"}', b'{"password": <redacted>, "user": "slurm"}'),
        (b'"api_token":"a\\"b c"}', b'"api_token":<redacted>}'),
        # a URL's user:password@ (RFC 3986 user information), whatever the key holding it
        (
            b"JobCompLoc=http://slurm:s3cr3t@elastic:9200/slurm",
            b"JobCompLoc=http://slurm:<redacted>@elastic:9200/slurm",
        ),
        (b"url: https://elastic:9200/x@y", None),  # no user information: kept
        # a quote inside an unquoted value is part of it, not its end
        (b'StoragePass=ab"cd x=1', b"StoragePass=<redacted> x=1"),
        (b"StoragePass=pa'ss word", b"StoragePass=<redacted> word"),
        (
            b'AccountingStoragePass = "x y"  # quoted',
            b"AccountingStoragePass = <redacted>  # quoted",
        ),
        # kept: kernel parameters that only look like secrets (Documentation/admin-guide/
        # kernel-parameters.txt) and ordinary slurm.conf keys
        (b"BOOT_IMAGE=/vmlinuz-6.8 iommu.passthrough=1 quiet", None),
        (b"AccountingStorageType=accounting_storage/slurmdbd", None),
        # a real H200 node's kernel log (tests/captures/device/h200-vm): a mitigation, not a secret
        (
            b"6,118,118659,-;Speculative Store Bypass: Mitigation: Speculative Store Bypass disabled",
            None,
        ),
        (b"ldap_bypass_password=x", b"ldap_bypass_password=<redacted>"),
        (b"StorageBypassPass=x", b"StorageBypassPass=<redacted>"),
        # words ending in "by" + Pass are not the mitigation line's key (red team, 2026-12-04)
        (b"StandbyPass=hunter2", b"StandbyPass=<redacted>"),
        (b"HAStandbyPass: hunter2", b"HAStandbyPass: <redacted>"),
        (b"DerbyPass=hunter2", b"DerbyPass=<redacted>"),
        (b"\x01\x00key=value\x00\x10", None),  # binary (PCI config space): left as read
    ],
)
def test_secret_values_are_redacted_by_key_name(line, redacted):
    assert redact_secrets(line)[0] == (line if redacted is None else redacted)


def test_capture_exclude_leaves_out_what_a_site_must_not_share(captured_fake, tmp_path):
    node, _out, _root, _stdout = captured_fake
    out = str(tmp_path / "x.tar.gz")
    proc = cli(
        [
            "capture",
            out,
            "--root",
            str(node.root),
            "--exclude",
            "kernel-log,cmdline",
            "--exclude",
            "processes",
        ],
        env=node.subprocess_env(),
    )
    assert proc.returncode == 0, proc.stderr
    assert "left out: cmdline, kernel-log, processes" in proc.stdout
    with tarfile.open(out) as tar:
        names = tar.getnames()
        meta = json.load(tar.extractfile("dgx-h100-01/.slurm-hooks/capture.json"))
    assert "dgx-h100-01/dev/kmsg" not in names and "dgx-h100-01/proc/cmdline" not in names
    assert not [n for n in names if re.match(r"dgx-h100-01/proc/\d+", n)]
    assert sorted(meta["excluded"]) == ["cmdline", "kernel-log", "processes"]
    verdicts_text = json.dumps(meta["verdicts"])
    cmdline = open(os.path.join(str(node.root), "proc/cmdline")).read().strip()
    assert cmdline and cmdline not in verdicts_text  # topology.iommu quoted it
    assert "Xid" not in verdicts_text and "fallen off the bus" not in verdicts_text
    statuses = by_check(meta["verdicts"])
    assert statuses["xid.events"]["results"][0]["status"] == "FAIL"  # the verdict itself is kept
    assert statuses["xid.events"]["results"][0]["summary"].startswith("(left out")
    bad = cli(["capture", out, "--exclude", "passwords"])
    assert bad.returncode == 3 and "--exclude 'passwords': not one of cmdline" in bad.stderr
