"""Host health beyond the GPU (tracker 28): EDAC memory errors, InfiniBand link flaps, NVMe and BMC health.

Real samples: tests/captures/host/ (README.md there names every source). Counters over a window need
history across runs: each test gives the checks its own [paths] state_dir and moves the clock
(slurm_hooks.checks.host.common.clock) between runs.
"""

from __future__ import annotations

import json
import os

import pytest

from slurm_hooks.hw import counter_window
from slurm_hooks.hw.edac import read_edac
from slurm_hooks.hw.host import Host
from slurm_hooks.result import Action, Blame, Status
from tests.helpers import REPO
from tests.helpers import run_on_node as run

CAPTURES = os.path.join(REPO, "tests", "captures", "host")
NODE_EXPORTER = os.path.join(CAPTURES, "node_exporter")
HOUR = 3600.0
T0 = 1_700_000_000.0


@pytest.fixture
def at(monkeypatch):
    """at(t): the host checks' clock reads t from now on."""

    def move(t):
        monkeypatch.setattr("slurm_hooks.checks.host.common.clock", lambda: t)

    return move


def _config(tmp_path, checks=None, **extra):
    config = {"paths": {"state_dir": str(tmp_path / "state")}, "checks": checks or {}}
    config.update(extra)
    return config


def _captured(tmp_path):
    """node_exporter's tree, copied: a tree under --root keeps the checks' history inside it."""
    import shutil

    root = tmp_path / "node_exporter"
    shutil.copytree(NODE_EXPORTER, str(root))
    return type("Captured", (), {"root": str(root)})


def _bad(results):
    return [r for r in results if r.status not in (Status.OK, Status.SKIP)]


# -- EDAC ---------------------------------------------------------------------------------------


def test_edac_csrow_layout_of_node_exporters_fixture():
    """node_exporter's sysfs fixture: the csrow layout, CEs per channel with its label, UEs per csrow."""
    (mc,) = read_edac(Host(NODE_EXPORTER))
    assert (mc.name, mc.ce, mc.ue, mc.ce_noinfo, mc.ue_noinfo) == ("mc0", 1, 5, 2, 6)
    by_key = {d.key: d for d in mc.dimms}
    assert by_key["mc0/csrow0/ch1"].label == "mc0csrow0channel1"
    assert by_key["mc0/csrow0/ch1"].ce == 0 and by_key["mc0/csrow0/ch1"].ue is None
    assert by_key["mc0/csrow2"].ue == 5
    assert by_key["mc0/csrow2"].label == "mc0csrow2channel0 or mc0csrow2channel1"


def test_edac_capture_fails_each_csrow_with_ues_and_the_unplaced_ones(registry, tmp_path, at):
    at(T0)
    node = _captured(tmp_path)
    results = run(registry, node, ["host.edac"], _config(tmp_path))
    failed = {r.component: r for r in results if r.status is Status.FAIL}
    assert set(failed) == {
        "dimm:mc0/csrow0 mc0csrow0channel0 or mc0csrow0channel1",
        "dimm:mc0/csrow1 mc0csrow1channel0 or mc0csrow1channel1",
        "dimm:mc0/csrow2 mc0csrow2channel0 or mc0csrow2channel1",
        "memory:mc0 (errors not placed on a DIMM)",
    }
    assert all(r.action is Action.RMA and r.effective_blame is Blame.NODE for r in failed.values())
    assert failed["memory:mc0 (errors not placed on a DIMM)"].details["ue_count"] == 6


def test_edac_healthy_fake_node_and_a_node_without_edac(registry, fake_node, tmp_path, at):
    at(T0)
    (ok,) = run(registry, fake_node(), ["host.edac"], _config(tmp_path))
    assert ok.status is Status.OK and "8 memory controller(s), 16 DIMM" in ok.summary
    (skip,) = run(registry, fake_node("cpu-only"), ["host.edac"], _config(tmp_path))
    assert skip.status is Status.SKIP


def test_edac_ue_names_the_dimm_label(registry, fake_node, tmp_path, at):
    at(T0)
    node = fake_node(overrides={"memory": {"edac": {"mc5": {"dimms": {"dimm1": {"ue_count": 1}}}}}})
    (bad,) = _bad(run(registry, node, ["host.edac"], _config(tmp_path)))
    # mc5 is socket 1's second IMC: the driver's label says so
    assert bad.component == "dimm:mc5/dimm1 CPU_SrcID#1_MC#1_Chan#1_DIMM#0"
    assert (bad.status, bad.action, bad.effective_blame) == (Status.FAIL, Action.RMA, Blame.NODE)


def _set_ce(node, mc, dimm, value):
    node.write("/sys/devices/system/edac/mc/%s/%s/dimm_ce_count" % (mc, dimm), str(value))


def test_edac_ce_rate_over_a_window_across_runs(registry, fake_node, tmp_path, at):
    """10 CEs within 24 h WARN (mcelog's default); the same 10 a day later are history, not a rate."""
    node = fake_node()
    config = _config(tmp_path)
    at(T0)
    _set_ce(node, "mc2", "dimm0", 40)  # since-reset count from long ago: a baseline, not a rate
    assert not _bad(run(registry, node, ["host.edac"], config))
    at(T0 + HOUR)
    _set_ce(node, "mc2", "dimm0", 49)
    assert not _bad(run(registry, node, ["host.edac"], config))  # 9 < 10
    at(T0 + 2 * HOUR)
    _set_ce(node, "mc2", "dimm0", 50)
    (warn,) = _bad(run(registry, node, ["host.edac"], config))
    assert warn.status is Status.WARN and warn.effective_blame is None
    assert warn.component == "dimm:mc2/dimm0 CPU_SrcID#0_MC#2_Chan#0_DIMM#0"
    assert warn.details["ce_in_window"] == 10 and warn.details["ce_count"] == 50
    at(T0 + 27 * HOUR)  # no new error for a day
    assert not _bad(run(registry, node, ["host.edac"], config))
    # the same growth with ce_status = "fail" drains (FAIL, blamed on the node)
    strict = _config(tmp_path / "strict", {"host.edac": {"ce_status": "fail"}})
    at(T0)
    _set_ce(node, "mc2", "dimm0", 0)
    run(registry, node, ["host.edac"], strict)
    at(T0 + HOUR)
    _set_ce(node, "mc2", "dimm0", 25)
    (fail,) = _bad(run(registry, node, ["host.edac"], strict))
    assert (fail.status, fail.effective_blame) == (Status.FAIL, Blame.NODE)


def test_edac_reboot_resets_and_young_counters(registry, fake_node, tmp_path, at):
    """A counter that went down (reboot, driver reload) started again from zero; counters reset within
    the window (seconds_since_reset) count whole even on the first run."""
    node = fake_node(overrides={"memory": {"edac": {"mc1": {"seconds_since_reset": 600}}}})
    config = _config(tmp_path)
    at(T0)
    _set_ce(node, "mc1", "dimm1", 11)  # 11 CEs in the 10 minutes since the driver loaded
    (young,) = _bad(run(registry, node, ["host.edac"], config))
    assert young.details["ce_in_window"] == 11
    node.write("/proc/sys/kernel/random/boot_id", "another-boot")
    node.write("/sys/devices/system/edac/mc/mc1/seconds_since_reset", "7200")
    at(T0 + 3 * HOUR)
    _set_ce(node, "mc1", "dimm1", 3)  # after the reboot: 11 before + 3 after are in the window
    (after,) = _bad(run(registry, node, ["host.edac"], config))
    assert after.details["ce_in_window"] == 14 and after.details["resets"] >= 1


def test_edac_history_that_cannot_be_kept_never_breaks_the_check(registry, fake_node, tmp_path, at):
    node = fake_node(overrides={"memory": {"edac": {"mc0": {"dimms": {"dimm0": {"ue_count": 2}}}}}})
    at(T0)
    state = node.path(str(tmp_path / "state"))  # a fake node keeps its history in its tree
    state.mkdir(parents=True)
    corrupt = counter_window.state_path(str(state), "edac")
    with open(corrupt, "w") as handle:
        handle.write('{"version": 1, "series": {"mc0/dimm0": [[1, "b", "x"]]}}')
    results = run(registry, node, ["host.edac"], _config(tmp_path))
    assert [r.status for r in results] == [Status.FAIL]  # the UE is judged all the same
    with open(corrupt) as handle:
        assert json.load(handle)["series"]["mc0/dimm0"][-1][2] == 0  # started again, and saved
    node.write("/var/lib/blocked", "a file where the state directory should be")
    results = run(registry, node, ["host.edac"], {"paths": {"state_dir": "/var/lib/blocked"}})
    assert [r.status for r in results] == [Status.FAIL]


def test_window_increase_resets_saturation_and_unplaceable_steps():
    day = 24 * HOUR
    pts = [(T0, "a", 250), (T0 + HOUR, "a", 255)]
    inc = counter_window.window_increase(pts, T0 + HOUR, day, saturate_at=255)
    assert (inc.increase, inc.saturated, inc.resets) == (5, True, 0)
    pts = [(T0, "a", 7), (T0 + HOUR, "a", 2), (T0 + 2 * HOUR, "b", 1)]  # cleared, then rebooted
    inc = counter_window.window_increase(pts, T0 + 2 * HOUR, day)
    assert (inc.increase, inc.resets) == (3, 2)
    pts = [(T0 - 10 * day, "a", 0), (T0, "a", 500)]  # growth over ten days: not placeable in a day
    assert counter_window.window_increase(pts, T0, day).increase == 0
    assert counter_window.window_increase([], T0, day).increase == 0


def test_a_crafted_tree_cannot_make_the_history_leave_it(registry, fake_node, tmp_path, at):
    """A captured tree whose state directory is a symlink to an absolute path: resolved inside the tree."""
    node = fake_node()
    outside = tmp_path / "outside"
    outside.mkdir()
    os.makedirs(str(node.path("/var/lib")), exist_ok=True)
    os.symlink(str(outside), str(node.path("/var/lib/slurm-hooks")))
    at(T0)
    run(registry, node, ["host.edac"], {"paths": {"state_dir": "/var/lib/slurm-hooks"}})
    assert os.listdir(str(outside)) == []
    assert os.path.exists(str(node.path(str(outside) + "/host-edac.json")))


def test_history_is_bounded(tmp_path):
    path = str(tmp_path / "h.json")
    for i in range(counter_window.MAX_POINTS + 50):
        history = counter_window.record(path, {"k": i}, T0 + i, "b", 1e9)
    assert len(history.series["k"]) == counter_window.MAX_POINTS
    for i in range(100):  # an unchanged counter keeps two points, whatever the number of runs
        history = counter_window.record(path, {"k": 7}, T0 + 1000 * i, "b", 1e9)
    assert sum(1 for p in history.series["k"] if p[2] == 7) == 2


# -- InfiniBand links ----------------------------------------------------------------------------


def _set_ib(node, port, counter, value):
    hca, num = port.split("/")
    node.write("/sys/class/infiniband/%s/ports/%s/counters/%s" % (hca, num, counter), str(value))


def test_ib_capture_leaves_out_counters_without_a_pma(registry, tmp_path, at):
    """node_exporter's fixture: mlx4_0 counts; i40iw0 (iWARP) writes "N/A (no PMA)" in every counter."""
    at(T0)
    node = _captured(tmp_path)
    (ok,) = run(registry, node, ["host.ib_links"], _config(tmp_path))
    assert ok.status is Status.OK and ok.summary.startswith("3 port(s), 2 with counters")


def test_ib_flaps_over_a_window(registry, fake_node, tmp_path, at):
    node = fake_node()
    config = _config(tmp_path)
    at(T0)
    _set_ib(node, "mlx5_3/1", "link_downed", 4)  # since boot, long ago: a baseline
    assert not _bad(run(registry, node, ["host.ib_links"], config))
    at(T0 + HOUR)
    _set_ib(node, "mlx5_3/1", "link_downed", 5)  # went down once
    (warn,) = _bad(run(registry, node, ["host.ib_links"], config))
    assert (warn.status, warn.component) == (Status.WARN, "hca:mlx5_3/1")
    assert warn.details["link_downed"]["in_window"] == 1 and warn.effective_blame is None
    at(T0 + 26 * HOUR)  # a quiet day later
    assert not _bad(run(registry, node, ["host.ib_links"], config))
    # flaps_fail = 3: three flaps in a day drain (blamed on the node, the other end named)
    strict = _config(tmp_path / "strict", {"host.ib_links": {"flaps_fail": 3}})
    at(T0)
    run(registry, node, ["host.ib_links"], strict)
    for hour, value in ((1, 6), (2, 7), (3, 8)):
        at(T0 + hour * HOUR)
        _set_ib(node, "mlx5_3/1", "link_downed", value)
        (bad,) = _bad(run(registry, node, ["host.ib_links"], strict))
    assert (bad.status, bad.action, bad.effective_blame) == (Status.FAIL, Action.DRAIN, Blame.NODE)
    assert "ibdiagnet" in bad.details["other_end"]


def test_ib_counters_that_reset_or_saturate(registry, fake_node, tmp_path, at):
    node = fake_node()
    config = _config(tmp_path, {"host.ib_links": {"flaps_warn": 3}})
    at(T0)
    _set_ib(node, "mlx5_0/1", "link_downed", 200)
    run(registry, node, ["host.ib_links"], config)
    at(T0 + HOUR)
    _set_ib(node, "mlx5_0/1", "link_downed", 2)  # cleared (perfquery -R), then two flaps
    assert not _bad(run(registry, node, ["host.ib_links"], config))  # 2 < 3: a reset is no flap
    at(T0 + 2 * HOUR)
    _set_ib(node, "mlx5_0/1", "link_downed", 1)  # cleared again, one more: 3 in the window
    (warn,) = _bad(run(registry, node, ["host.ib_links"], config))
    assert warn.details["link_downed"] == {"in_window": 3, "value": 1, "resets": 2}
    at(T0 + 3 * HOUR)
    _set_ib(node, "mlx5_1/1", "symbol_error", 65535)  # 16 bits: saturated, growth invisible
    saturated = [
        r for r in _bad(run(registry, node, ["host.ib_links"], config)) if "mlx5_1" in r.component
    ]
    assert saturated[0].status is Status.WARN and "saturated at 65535" in saturated[0].summary


def test_ib_garbage_in_a_counter_is_unknown_never_fail(registry, fake_node, tmp_path, at):
    node = fake_node()
    at(T0)
    _set_ib(node, "mlx5_2/1", "link_downed", "lots")
    results = run(
        registry, node, ["host.ib_links"], _config(tmp_path, {"host.ib_links": {"flaps_fail": 1}})
    )
    assert [r.status for r in results] == [Status.UNKNOWN]
    assert "link_downed" in results[0].summary and "'lots'" in results[0].summary


# -- NVMe ----------------------------------------------------------------------------------------

NVME_SAMPLES = os.path.join(CAPTURES, "nvme")


def _fake_nvme_cli(tmp_path, answers):
    """An `nvme` executable answering `smart-log /dev/<ctrl> -o json` from files: {ctrl: path or shell}."""
    lines = ["#!/bin/sh", 'case "$2" in']
    for ctrl, answer in answers.items():
        body = answer if answer.startswith("!") else "cat '%s'" % answer
        lines.append("  /dev/%s) %s ;;" % (ctrl, body.lstrip("!")))
    lines += ['  *) echo "$2: No such file or directory" >&2; exit 1 ;;', "esac"]
    script = tmp_path / "nvme"
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    return str(script)


def _nvme_config(tmp_path, command, **params):
    params = dict({"command": command, "tool_timeout": 2.0}, **params)
    return _config(
        tmp_path, {"host.nvme": params}, general={"root_live_sources": ["nvml", "tools"]}
    )


def test_parse_smart_log_real_samples():
    from slurm_hooks.checks.host.nvme import parse_smart_log

    def sample(name):
        with open(os.path.join(NVME_SAMPLES, name)) as handle:
            return parse_smart_log(handle.read(), name)

    wd = sample("wd-2tb-nvme-cli-issue-1037.json")
    assert wd == {
        "critical_warning": 0,
        "avail_spare": 100,
        "spare_thresh": 10,
        "percent_used": 3,
        "media_errors": 0,
    }
    assert sample("wd-2tb-nvme-cli-2.3-strings.json") == wd  # "201,526,305" strings read the same
    samsung = sample("samsung-mzvl2512-smartmontools-issue-537-H.json")
    assert samsung["critical_warning"] == 4 and samsung["percent_used"] == 100
    with pytest.raises(ValueError, match="percent_used"):
        parse_smart_log('{"critical_warning": 0, "percent_used": "lots"}', "x")
    with pytest.raises(ValueError, match="not JSON"):
        parse_smart_log("Permission denied", "x")


def test_nvme_verdicts_on_real_logs(registry, fake_node, tmp_path, at):
    """A worn-out Samsung's 0x04 (it sets it at 100% used, smartmontools #537) WARNs; a drive whose media
    went read-only FAILs (its scratch space cannot be written); the healthy WD is OK."""
    node = fake_node()
    read_only = tmp_path / "ro.json"
    read_only.write_text(json.dumps({"critical_warning": 8, "avail_spare": 3, "spare_thresh": 10}))
    command = _fake_nvme_cli(
        tmp_path,
        {
            "nvme0": os.path.join(NVME_SAMPLES, "wd-2tb-nvme-cli-issue-1037.json"),
            "nvme1": os.path.join(NVME_SAMPLES, "samsung-mzvl2512-smartmontools-issue-537-H.json"),
            "nvme2": str(read_only),
            "nvme3": os.path.join(NVME_SAMPLES, "wd-2tb-nvme-cli-2.3-strings.json"),
        },
    )
    at(T0)
    results = {
        r.component.split()[0]: r
        for r in run(
            registry, node, ["host.nvme"], _nvme_config(tmp_path, command), context="health"
        )
    }
    assert set(results) == {"nvme:nvme1", "nvme:nvme2"}
    assert (
        results["nvme:nvme1"].status is Status.WARN
        and "reliability degraded" in results["nvme:nvme1"].summary
    )
    assert "100% of its rated endurance" in results["nvme:nvme1"].summary
    ro = results["nvme:nvme2"]
    assert (ro.status, ro.action, ro.effective_blame) == (Status.FAIL, Action.RMA, Blame.NODE)
    assert "read-only" in ro.summary and "spare 3% under its threshold 10%" in ro.summary


def test_nvme_missing_hung_or_refused_tool_never_drains(registry, fake_node, tmp_path, at):
    node = fake_node()
    at(T0)
    (skip,) = run(
        registry,
        node,
        ["host.nvme"],
        _nvme_config(tmp_path, str(tmp_path / "absent")),
        context="health",
    )
    assert skip.status is Status.SKIP and "not installed" in skip.summary
    command = _fake_nvme_cli(
        tmp_path, {"nvme0": "!sleep 30", "nvme1": "!echo 'Permission denied' >&2; exit 1"}
    )
    results = run(
        registry,
        node,
        ["host.nvme"],
        _nvme_config(tmp_path, command, tool_timeout=0.5, devices=["nvme0", "nvme1"]),
        context="health",
    )
    assert [r.status for r in results] == [Status.UNKNOWN, Status.UNKNOWN]
    assert "did not answer within 0.5s" in results[0].summary
    assert "Permission denied" in results[1].summary
    # not in the prolog (a process per drive), and a tree under --root does not run this machine's tool
    assert registry.checks["host.nvme"].contexts == frozenset({"health", "manual"})
    (rooted,) = run(
        registry,
        node,
        ["host.nvme"],
        _config(tmp_path, {"host.nvme": {"command": command}}),
        context="health",
    )
    assert rooted.status is Status.SKIP and "running node" in rooted.summary


def test_nvme_new_media_errors_over_a_window(registry, fake_node, tmp_path, at):
    node = fake_node()
    log = tmp_path / "log.json"
    command = _fake_nvme_cli(tmp_path, {"nvme0": str(log)})
    config = _nvme_config(tmp_path, command, devices=["nvme0"])
    at(T0)
    log.write_text(json.dumps({"critical_warning": 0, "media_errors": "12"}))  # old, lifetime
    assert not _bad(run(registry, node, ["host.nvme"], config, context="health"))
    at(T0 + HOUR)
    log.write_text(json.dumps({"critical_warning": 0, "media_errors": "13"}))
    (warn,) = _bad(run(registry, node, ["host.nvme"], config, context="health"))
    assert warn.status is Status.WARN and warn.details["media_errors_in_window"] == 1


# -- BMC -----------------------------------------------------------------------------------------

IPMI_SAMPLES = os.path.join(CAPTURES, "ipmitool")


def _ipmi_text(name):
    with open(os.path.join(IPMI_SAMPLES, name)) as handle:
        return handle.read()


def _fake_ipmitool(tmp_path, sdr, sel, extra=""):
    """An `ipmitool` answering `sdr list` and `sel elist` from files (`extra`: shell run first)."""
    script = tmp_path / "ipmitool"
    script.write_text(
        "#!/bin/sh\n%s\ncase \"$1\" in\n  sdr) cat '%s' ;;\n  sel) cat '%s' ;;\nesac\n"
        % (extra, sdr, sel)
    )
    script.chmod(0o755)
    return str(script)


def _bmc_config(tmp_path, command, **params):
    params = dict({"command": command, "tool_timeout": 2.0}, **params)
    return _config(tmp_path, {"host.bmc": params}, general={"root_live_sources": ["nvml", "tools"]})


def test_parse_ipmitool_real_outputs():
    from slurm_hooks.checks.host.bmc import parse_sdr, parse_sel

    r320 = parse_sdr(_ipmi_text("dell-r320-sdr-list-full.txt"))
    assert len(r320) == 17 and [s.name for s in r320 if s.status == "cr"] == ["Fan3B", "Fan4B"]
    elist = parse_sdr(_ipmi_text("dell-sdr-elist-all.txt"))
    assert [(s.name, s.status, s.reading) for s in elist][2] == (
        "Ambient Temp",
        "ok",
        "19 degrees C",
    )
    # ipmitool #176: a lost redundancy reads "ok" in the SDR: the SEL has to be read as well
    assert {s.status for s in parse_sdr(_ipmi_text("sdr-redundancy-lost-reads-ok.txt"))} == {"ok"}
    sel = parse_sel(_ipmi_text("sel-elist-power-unit.txt"))
    assert [(r.record_id, r.asserted) for r in sel] == [("30", True), ("31", False), ("32", True)]
    quanta = parse_sel(_ipmi_text("sel-elist-quanta-ecc.txt"))
    assert [r.record_id for r in quanta] == ["3a", "e"] and quanta[
        0
    ].text == "Memory #0x88 | Correctable ECC (CPU0_G1)"


def test_bmc_sensors_past_thresholds_warn(registry, fake_node, tmp_path, at):
    node = fake_node()
    sel = tmp_path / "sel.txt"
    sel.write_text(_ipmi_text("sel-elist-power-unit.txt"))
    command = _fake_ipmitool(
        tmp_path, os.path.join(IPMI_SAMPLES, "dell-r320-sdr-list-full.txt"), sel
    )
    at(T0)
    results = run(registry, node, ["host.bmc"], _bmc_config(tmp_path, command), context="health")
    assert [(r.status, r.component) for r in results] == [
        (Status.WARN, "bmc-sensor:Fan3B"),
        (Status.WARN, "bmc-sensor:Fan4B"),
    ]
    assert "critical (0 RPM)" in results[0].summary and results[0].effective_blame is None
    quiet = run(
        registry,
        node,
        ["host.bmc"],
        _bmc_config(tmp_path, command, ignore_sensors=["Fan3B", "Fan4B"]),
        context="health",
    )
    assert [r.status for r in quiet] == [Status.OK]
    strict = run(
        registry,
        node,
        ["host.bmc"],
        _bmc_config(tmp_path, command, sensor_status="fail"),
        context="health",
    )
    assert {(r.status, r.effective_blame) for r in strict} == {(Status.FAIL, Blame.NODE)}


def test_bmc_judges_only_sel_records_new_since_the_last_run(registry, fake_node, tmp_path, at):
    node = fake_node()
    sdr = tmp_path / "sdr.txt"
    sdr.write_text(_ipmi_text("dell-sdr-elist-all.txt"))
    sel = tmp_path / "sel.txt"
    old = _ipmi_text("sel-elist-quanta-ecc.txt")
    sel.write_text(old)
    command = _fake_ipmitool(tmp_path, sdr, sel)
    config = _bmc_config(tmp_path, command)
    at(T0)
    (first,) = run(registry, node, ["host.bmc"], config, context="health")
    assert first.status is Status.OK and "first run" in first.summary
    # A PSU failure, in ipmitool's words (lib/ipmi_sel.c: Power Supply "Failure detected"), and one
    # more correctable ECC (left to host.edac)
    sel.write_text(
        old
        + "  3b | 12/15/22 | 01:02:03 CET | Power Supply #0x62 | Failure detected () | Asserted\n"
        + "  3c | 12/15/22 | 01:05:00 CET | Memory #0x88 | Correctable ECC (CPU0_G1) | Asserted\n"
    )
    (psu,) = run(registry, node, ["host.bmc"], config, context="health")
    assert (psu.status, psu.component) == (Status.WARN, "bmc-sel:3b")
    assert "power supply" in psu.summary
    (again,) = run(registry, node, ["host.bmc"], config, context="health")  # seen: not judged twice
    assert again.status is Status.OK


def test_bmc_missing_or_hung_ipmitool_never_drains(registry, fake_node, tmp_path, at):
    node = fake_node()
    at(T0)
    (skip,) = run(
        registry,
        node,
        ["host.bmc"],
        _bmc_config(tmp_path, str(tmp_path / "absent")),
        context="health",
    )
    assert skip.status is Status.SKIP and "not installed" in skip.summary
    hung = _fake_ipmitool(tmp_path, "/dev/null", "/dev/null", extra="sleep 30")
    results = run(
        registry,
        node,
        ["host.bmc"],
        _bmc_config(tmp_path, hung, tool_timeout=0.3),
        context="health",
    )
    assert [r.status for r in results] == [Status.UNKNOWN, Status.UNKNOWN]
    assert "did not answer" in results[0].summary
    assert registry.checks["host.bmc"].contexts == frozenset({"health", "manual"})


def test_edac_garbage_in_a_counter_is_unknown_never_fail(registry, fake_node, tmp_path, at):
    node = fake_node()
    node.write("/sys/devices/system/edac/mc/mc0/dimm0/dimm_ue_count", "1x")
    at(T0)
    results = run(registry, node, ["host.edac"], _config(tmp_path))
    assert [r.status for r in results] == [Status.UNKNOWN]
    assert "dimm_ue_count" in results[0].summary


def test_edac_ignored_findings_are_said_to_be_ignored(registry, fake_node, tmp_path, at):
    node = fake_node(overrides={"memory": {"edac": {"mc0": {"dimms": {"dimm0": {"ue_count": 3}}}}}})
    at(T0)
    config = _config(tmp_path, {"host.edac": {"ue_status": "ignore"}})
    (ok,) = run(registry, node, ["host.edac"], config)
    assert ok.status is Status.OK and "1 finding(s) ignored" in ok.summary
    assert "3 uncorrectable" in ok.details["ignored"][0]


# -- machine checks in the kernel log -------------------------------------------------------------

KERNEL_LOG = os.path.join(CAPTURES, "kernel-log")


def _replay_kernel_log(node, name, facility=0):
    """The real lines of a capture, as the kernel's /dev/kmsg records on the fake node."""
    from slurm_hooks.xid.kmsg import parse_kmsg_record

    with open(os.path.join(KERNEL_LOG, name)) as handle:
        for line in handle.read().splitlines():
            node.add_kmsg(parse_kmsg_record(line).message, level=4, facility=facility)


def test_mce_uncorrected_corrected_and_invalid_records(registry, fake_node, tmp_path):
    node = fake_node()
    _replay_kernel_log(node, "mce-journal-nuc-boot.txt")
    _replay_kernel_log(node, "mce-journal-nuc6-corrected.txt")
    _replay_kernel_log(node, "mce-dmesg-sandybridge.txt")
    results = run(registry, node, ["host.mce"], _config(tmp_path), context="health")
    # NUC: UC + PCC on CPU 0 bank 4; the NUC6's corrected ones (under 10 per bank) and the Sandy
    # Bridge's status 0 (VAL clear) are not findings
    assert [(r.status, r.component) for r in results] == [(Status.WARN, "cpu:0 bank 4")]
    assert "0xa600000000020408, processor context corrupt" in results[0].summary
    strict = _config(tmp_path, {"host.mce": {"corrected_warn": 2}})
    components = [r.component for r in run(registry, node, ["host.mce"], strict, context="health")]
    assert components == ["cpu:0 bank 4", "cpu:3 bank 6"]  # CPU 3 logged two corrected ones


def test_mce_written_by_a_user_is_not_the_kernels(registry, fake_node, tmp_path):
    node = fake_node()
    _replay_kernel_log(node, "mce-journal-nuc-boot.txt", facility=1)  # LOG_USER: `echo > /dev/kmsg`
    node.add_kmsg(
        "Memory failure: 0x1f3e2a: recovery action for dirty LRU page: Recovered", facility=1
    )
    (ok,) = run(registry, node, ["host.mce"], _config(tmp_path), context="health")
    assert ok.status is Status.OK
    node.add_kmsg("Memory failure: 0x1f3e2a: recovery action for dirty LRU page: Recovered")
    (page,) = run(registry, node, ["host.mce"], _config(tmp_path), context="health")
    assert page.status is Status.WARN and "0x1f3e2a" in page.summary


# -- decisions through the hooks ----------------------------------------------------------------


def _hook_config(registry, node, tmp_path, **checks):
    from slurm_hooks.core.config import validate

    only_host = {
        name: {"enabled": False} for name in registry.checks if not name.startswith("host.")
    }
    only_host.update(checks)
    return validate(
        registry,
        {
            "general": {"root": str(node.root), "mode": "enforce"},  # a drain is expected: enforce
            "paths": {"state_dir": str(tmp_path / "state"), "log_file": "", "syslog": False},
            "records": {"enabled": False},
            "checks": only_host,
        },
    )


def test_prolog_drains_for_an_uncorrectable_dimm_but_not_for_a_flapping_port(
    registry, fake_node, tmp_path, at
):
    from slurm_hooks.hooks import run_hook
    from slurm_hooks.slurm.client import SlurmClient
    from slurm_hooks.slurm.drainer import Outcome
    from tests.doubles.memory_slurm import cluster

    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_USER": "alice", "SLURMD_NODENAME": "node1"}
    node = fake_node()
    at(T0)
    config = _hook_config(registry, node, tmp_path)
    run_hook("prolog", registry, config, env, client=SlurmClient(cluster()))
    at(T0 + HOUR)
    _set_ib(node, "mlx5_4/1", "link_downed", 2)  # two flaps: WARN by default, no drain
    backend = cluster()
    outcome = run_hook("prolog", registry, config, env, client=SlurmClient(backend))
    assert outcome.exit_code == 0 and backend.calls == 0
    node.write("/sys/devices/system/edac/mc/mc6/dimm0/dimm_ue_count", "1")
    backend = cluster()
    outcome = run_hook("prolog", registry, config, env, client=SlurmClient(backend))
    assert outcome.enacted.outcome is Outcome.DRAINED
    assert "host.edac" in backend.nodes["node1"].reason


def test_a_crafted_tree_history_file_is_never_followed_out_of_it(registry, fake_node, tmp_path, at):
    """The history file itself a symlink to a file outside the tree (the live node's history): not
    read, and replaced inside the tree; a FIFO in its place does not hold the check to its timeout."""
    node = fake_node()
    os.makedirs(str(node.path("/var/lib/slurm-hooks")), exist_ok=True)
    history = str(node.path("/var/lib/slurm-hooks/host-edac.json"))
    config = {"paths": {"state_dir": "/var/lib/slurm-hooks"}}
    at(T0)
    run(registry, node, ["host.edac"], config)  # the tree's own history, for its keys and boot id
    with open(history) as handle:
        series = json.load(handle)["series"]
    keys = sorted(series)
    boot = series[keys[0]][-1][1]
    live = tmp_path / "live-host-edac.json"  # a history outside the tree: 0 CEs an hour ago
    live.write_text(json.dumps({"version": 1, "series": {keys[0]: [[T0 - HOUR, boot, 0]]}}))
    os.unlink(history)
    os.symlink(str(live), history)
    mc, dimm = keys[0].split("/")
    _set_ce(node, mc, dimm, 40)  # read against the outside file, 40 CEs in the last hour: WARN
    at(T0 + 1)
    results = run(registry, node, ["host.edac"], config)
    assert _bad(results) == [], [r.summary for r in results]
    assert (
        not os.path.islink(history) and json.loads(live.read_text())["series"][keys[0]][0][2] == 0
    )
    os.unlink(history)
    os.mkfifo(history)
    at(T0 + 2)
    results = run(registry, node, ["host.edac"], config)
    assert [r.status for r in results] == [Status.OK], [r.summary for r in results]


def test_a_state_directory_swapped_for_a_symlink_after_resolution_is_not_followed(
    registry, fake_node, tmp_path, at, monkeypatch
):
    """Whoever can write the tree swaps its state directory for a symlink out of it between the
    check resolving the path inside the tree and the write (a race, made certain here): refused,
    nothing written outside, the check still judges."""
    node = fake_node(overrides={"memory": {"edac": {"mc0": {"dimms": {"dimm0": {"ue_count": 1}}}}}})
    outside = tmp_path / "outside"
    outside.mkdir()
    state = str(node.path("/var/lib/slurm-hooks"))
    os.makedirs(state)
    resolve = Host.realpath

    def resolve_then_swap(self, host_path):
        resolved = resolve(self, host_path)
        if host_path == "/var/lib/slurm-hooks" and not os.path.islink(state):
            os.rmdir(state)
            os.symlink(str(outside), state)
        return resolved

    monkeypatch.setattr(Host, "realpath", resolve_then_swap)
    at(T0)
    results = run(registry, node, ["host.edac"], {"paths": {"state_dir": "/var/lib/slurm-hooks"}})
    assert [r.status for r in results] == [Status.FAIL]  # the UE is judged all the same
    assert os.listdir(str(outside)) == []


def test_a_history_another_user_planted_neither_drains_nor_hides(registry, fake_node, tmp_path, at):
    """A state directory others can write (a typo'd [paths] state_dir under /tmp, a shared one):
    a user plants host-edac.json saying the DIMM had 0 corrected errors an hour ago on this boot.
    Believed, the since-boot count of 40 became 40 in the last hour and failed the node (drained
    with ce_status = "fail"); a file that is not ours is read as no history, and replaced."""
    node = fake_node()
    os.makedirs(str(node.path("/var/lib/slurm-hooks")), exist_ok=True)
    history = str(node.path("/var/lib/slurm-hooks/host-edac.json"))
    config = {
        "paths": {"state_dir": "/var/lib/slurm-hooks"},
        "checks": {"host.edac": {"ce_status": "fail"}},
    }
    at(T0)
    run(registry, node, ["host.edac"], config)
    with open(history) as handle:
        series = json.load(handle)["series"]
    key = sorted(series)[0]
    boot = series[key][-1][1]
    os.unlink(history)
    with open(history, "w") as handle:
        json.dump({"version": 1, "series": {key: [[T0 - HOUR, boot, 0]]}}, handle)
    os.chown(history, 4242, 4242)
    mc, dimm = key.split("/")
    _set_ce(node, mc, dimm, 40)
    at(T0 + 60)
    results = run(registry, node, ["host.edac"], config)
    assert _bad(results) == [], [r.summary for r in results]
    assert os.stat(history).st_uid == os.geteuid()  # replaced by our own history
