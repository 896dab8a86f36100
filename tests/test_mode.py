"""Safe by default: a fresh install observes (drains nothing), `slurm-hooks mode` shows the mode and
where it is set, `slurm-hooks mode enforce|observe` is the one explicit step (a root-owned 0644
drop-in written atomically), `slurm-hooks report --observed` lists what observe mode would have
drained; and [drain] slurm_bin_dir, where Slurm's commands live when they are not on the PATH."""

from __future__ import annotations

import gzip
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_hooks.cli.main import main
from slurm_hooks.core.config import ConfigError, validate
from tests.helpers import GPU_BDF, REPO

XID79 = (
    "NVRM: Xid (PCI:%s): 79, pid=1234, name=python3, GPU has fallen off the bus."
    % (GPU_BDF[2][:-2])
)  # the driver's wording, as in tests/fault_table.py


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A configuration directory like /etc/slurm-hooks (root's, 0755) with a config.toml that sets no
    mode, its decision log under the test's directory."""
    etc = tmp_path / "etc"
    (etc / "conf.d").mkdir(parents=True)
    os.chmod(str(tmp_path), 0o755)
    os.chmod(str(etc), 0o755)
    log = tmp_path / "log" / "slurm-hooks.log"
    config = etc / "config.toml"
    config.write_text(
        '[paths]\nlog_file = "%s"\nstate_dir = "%s"\nsyslog = false\n[records]\nenabled = false\n'
        % (log, tmp_path / "state")
    )
    monkeypatch.delenv("SLURM_HOOKS_CONFIG", raising=False)
    return {"config": config, "etc": etc, "log": log, "tmp": tmp_path}


def cli(*args):
    return [sys.executable, "-m", "slurm_hooks"] + list(args)


def test_the_default_mode_is_observe(registry):
    """Before: "enforce" (a fresh install drained on its first FAIL, before the admin said so)."""
    assert validate(registry, {}).get("general", "mode") == "observe"
    text = Path(REPO, "packaging", "config.toml").read_text()
    assert '#mode = "observe"' in text and "slurm-hooks mode enforce" in text


def test_a_fresh_install_logs_what_it_would_drain_and_report_observed_lists_it(
    site, fake_node, capsys
):
    """A real prolog with a config that sets no mode, on a node with an Xid 79 on GPU 2: it decides
    to drain, drains nothing (no Slurm call), exits 0; report --observed shows node, time, check and
    the reason it would have drained with."""
    node = fake_node()
    node.add_kmsg(XID79)
    with open(str(site["config"]), "a") as handle:
        handle.write('[general]\nroot = "%s"\nroot_live_sources = ["nvml"]\n' % node.root)
    env = dict(
        node.env,
        SLURM_JOB_ID="4242",
        SLURM_JOB_USER="alice",
        SLURM_JOB_UID="1000",
        SLURM_JOB_GPUS="0,1,2,3",
        SLURMD_NODENAME="gpu-a07",
        SLURM_SCRIPT_CONTEXT="prolog_slurmd",
        PATH="/nonexistent",  # no scontrol: a drain attempt would show as slurm_calls/slurm errors
        PYTHONPATH=REPO,
    )
    done = subprocess.run(
        cli("--config", str(site["config"]), "prolog"), env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    line = site["log"].read_text().splitlines()[-1]
    assert "decision=drain" in line and "outcome=observe" in line and "slurm_calls=0" in line

    code = main(["--config", str(site["config"]), "report", "--observed"])
    out = capsys.readouterr().out
    assert code == 1, out  # something would have been drained: not a clean bill
    row = next(r for r in out.splitlines() if "gpu-a07" in r)
    assert row.split()[:2] == [line[:10], line[11:19]]  # the decision's own time
    assert "prolog" in row and "4242" in row and "xid.events" in row
    assert "Xid 79" in row and "gpu:2" in row and "-> reboot" in row
    assert "1 would-drain decision(s) on 1 node(s)" in out

    assert main(["--config", str(site["config"]), "report", "--observed", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["schema"] == "slurm-hooks.observed/1"
    [entry] = data["would_drain"]
    assert (entry["node"], entry["check"], entry["job"]) == ("gpu-a07", "xid.events", "4242")
    assert entry["reason"].startswith("sh:xid.events g2: gpu:2")


def test_report_observed_reads_rotations_and_is_not_fooled_by_values(site, capsys):
    """logrotate leaves .1 and .N.gz; a user-controlled value that spells `outcome=observe node=x`
    is quoted by the logger (core/logs.kv) and must not become a decision of its own."""
    from slurm_hooks.core import logs

    site["log"].parent.mkdir()

    def line(stamp, **fields):
        return "%s ERROR %s\n" % (stamp, logs.kv(**fields))

    old = line(
        "2026-11-20 03:00:01,001",
        context="health",
        node="gpu-b01",
        status="FAIL",
        decision="drain",
        outcome="observe",
        check="gpu.count",
        reason="slurm-hooks: gpu.count: 7 of 8 GPUs -> reboot",
    )
    with gzip.open(str(site["log"]) + ".2.gz", "wt") as handle:
        handle.write(old)
    Path(str(site["log"]) + ".1").write_text(
        line(
            "2026-11-27 04:00:00,000",
            context="prolog",
            node="gpu-b02",
            status="OK",
            decision="pass",
            reason="python3 outcome=observe node=victim check=forged",
        )
    )
    site["log"].write_text(
        line(
            "2026-12-01 05:00:00,000",
            context="fleet",
            event="straggler-drain",
            node="gpu-b03",
            metric="throttle_frac.hw_slowdown",
            outcome="observe",
            detail="observe mode: would drain gpu-b03: slurm-hooks: fleet.straggler: slow",
        )
    )
    assert main(["--config", str(site["config"]), "report", "--observed", "--json"]) == 1
    found = json.loads(capsys.readouterr().out)["would_drain"]
    assert [(f["node"], f["time"], f["check"]) for f in found] == [
        ("gpu-b01", "2026-11-20 03:00:01", "gpu.count"),
        ("gpu-b03", "2026-12-01 05:00:00", "throttle_frac.hw_slowdown"),
    ]
    assert found[1]["reason"] == "slurm-hooks: fleet.straggler: slow"


def test_report_observed_says_when_nothing_would_have_been_drained(site, capsys):
    site["log"].parent.mkdir()
    site["log"].write_text("2026-12-01 05:00:00,000 INFO context=prolog node=n1 decision=pass\n")
    assert main(["--config", str(site["config"]), "report", "--observed"]) == 0
    assert "observe mode would have drained nothing" in capsys.readouterr().out


def test_mode_shows_where_it_comes_from_and_switches_with_one_drop_in(site, capsys):
    config = str(site["config"])
    assert main(["--config", config, "mode"]) == 0
    assert capsys.readouterr().out.startswith("mode: observe (built-in default)")

    assert main(["--config", config, "mode", "enforce"]) == 0
    drop_in = site["etc"] / "conf.d" / "99-mode.toml"
    info = drop_in.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o644)
    assert 'mode = "enforce"' in drop_in.read_text()
    assert sorted(p.name for p in drop_in.parent.iterdir()) == ["99-mode.toml"]  # no temp file
    assert "mode: enforce (%s)" % drop_in in capsys.readouterr().out

    assert main(["--config", config, "mode", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["mode"], shown["source"]) == ("enforce", str(drop_in))
    # what the hooks read: the effective configuration
    done = subprocess.run(
        cli("--config", config, "config", "check"),
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=REPO),
    )
    assert done.returncode == 0 and 'mode = "enforce"' in done.stdout, done.stderr

    assert main(["--config", config, "mode", "observe"]) == 0
    assert 'mode = "observe"' in drop_in.read_text()


def test_mode_enforce_first_shows_what_observe_mode_saw(site, capsys):
    site["log"].parent.mkdir()
    site["log"].write_text(
        "2026-12-01 05:00:00,000 ERROR context=prolog job=7 node=gpu-c01 status=FAIL "
        'decision=drain outcome=observe check=gpu.ecc reason="slurm-hooks: gpu.ecc: x"\n'
    )
    assert main(["--config", str(site["config"]), "mode", "enforce"]) == 0
    out = capsys.readouterr().out
    assert "observe mode would have drained 1 time(s) (gpu-c01; checks: gpu.ecc)" in out
    assert "slurm-hooks report --observed" in out


def test_mode_is_not_changed_when_a_later_drop_in_would_still_decide(site, capsys):
    later = site["etc"] / "conf.d" / "zz-site.toml"
    later.write_text('[general]\nmode = "observe"\n')
    assert main(["--config", str(site["config"]), "mode", "enforce"]) == 1
    assert str(later) in capsys.readouterr().err
    assert not (site["etc"] / "conf.d" / "99-mode.toml").exists()


def test_mode_change_needs_root(site, capsys, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert main(["--config", str(site["config"]), "mode", "enforce"]) == 3
    err = capsys.readouterr().err
    assert "only root can change the mode" in err and "99-mode.toml" in err
    assert not (site["etc"] / "conf.d" / "99-mode.toml").exists()


def test_mode_refuses_to_switch_a_broken_configuration(site, capsys):
    (site["etc"] / "conf.d" / "50-typo.toml").write_text("[general]\nmood = 1\n")
    assert main(["--config", str(site["config"]), "mode", "enforce"]) == 3
    assert "mood" in capsys.readouterr().err
    assert not (site["etc"] / "conf.d" / "99-mode.toml").exists()


# -- [drain] slurm_bin_dir ------------------------------------------------------------------------


def _bin_dir(tmp_path, scontrol_text="#!/bin/sh\necho 'NodeName=n1 State=IDLE'\n"):
    directory = tmp_path / "opt" / "slurm" / "bin"
    directory.mkdir(parents=True)
    for part in (tmp_path / "opt", tmp_path / "opt" / "slurm", directory):
        os.chmod(str(part), 0o755)
    if scontrol_text is not None:
        (directory / "scontrol").write_text(scontrol_text)
        os.chmod(str(directory / "scontrol"), 0o755)
    return directory


def test_slurm_bin_dir_is_where_scontrol_runs_from_without_a_path(registry, tmp_path, monkeypatch):
    """Before: unknown key; sites edited PATH in the hook scripts (undone by the next upgrade)."""
    from slurm_hooks.slurm import drainer

    directory = _bin_dir(  # ${0%/*}: the shell's own dirname (no PATH to find dirname with)
        tmp_path, '#!/bin/sh\necho "$0 $*" > "${0%/*}/called"\necho NodeName=n1 State=IDLE\n'
    )
    monkeypatch.setenv("PATH", "/nonexistent")
    settings = validate(registry, {"drain": {"slurm_bin_dir": str(directory)}}).settings
    client = drainer.make_client(settings)
    assert client.show_node("n1").name == "n1"
    assert (directory / "called").read_text().startswith(str(directory / "scontrol") + " ")


@pytest.mark.parametrize(
    "case, words",
    [
        ("relative", "must be an absolute path"),
        ("missing", "No such file or directory"),
        ("no-scontrol", "holds no executable scontrol"),
        ("group-writable", "group- or world-writable"),
        ("not-root", "not root"),
    ],
)
def test_a_bad_slurm_bin_dir_is_refused_by_name(registry, tmp_path, monkeypatch, case, words):
    monkeypatch.delenv("SLURM_HOOKS_ALLOW_INSECURE_CONFIG", raising=False)
    if case == "relative":
        value = "opt/slurm/bin"
    elif case == "missing":
        value = str(tmp_path / "nowhere")
    else:
        directory = _bin_dir(tmp_path, None if case == "no-scontrol" else "#!/bin/sh\n")
        if case == "group-writable":
            os.chmod(str(directory), 0o775)
        if case == "not-root":
            if os.geteuid() != 0:
                pytest.skip("chown needs root")
            os.chown(str(directory), 65534, 65534)
        value = str(directory)
    with pytest.raises(ConfigError) as caught:
        validate(registry, {"drain": {"slurm_bin_dir": value}})
    assert "[drain] slurm_bin_dir" in str(caught.value) and words in str(caught.value)


def test_mode_writes_nothing_into_a_conf_d_others_can_write(site, capsys, monkeypatch):
    monkeypatch.delenv("SLURM_HOOKS_ALLOW_INSECURE_CONFIG", raising=False)
    conf_d = site["etc"] / "conf.d"
    os.chmod(str(conf_d), 0o777)
    assert main(["--config", str(site["config"]), "mode", "enforce"]) == 3
    assert "group- or world-writable" in capsys.readouterr().err
    assert not (conf_d / "99-mode.toml").exists()
