"""`slurm-hooks qualify` on the fake node with stand-ins for dcgmi, nvbandwidth, all_reduce_perf and
ib_write_bw (tests/qualify_standins: they replay real outputs from tests/captures/diag, plant
faults, hang, crash or print garbage). The detection table of docs/qualify.md is
test_detection_table's parameters."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from slurm_hooks.core.structs import replace
from slurm_hooks.hw.host import Host
from slurm_hooks.qualify import flow, levels, record, tools
from slurm_hooks.result import ExitCode, Status

STANDINS = os.path.join(os.path.dirname(__file__), "qualify_standins")
SETTINGS = {
    "level": "standard",
    "class": "",
    "classes": {},
    "ib_ports": ["mlx5_0:1=gpu0"],
    "optional_tools": [],
    "node_fraction": 0.8,
    "fleet_fraction": 0.85,
    "fleet_min_peers": 3,
}
H100 = "NVIDIA H100 80GB HBM3 x8"
_spec = importlib.util.spec_from_file_location(
    "qualify_standin", os.path.join(STANDINS, "standin.py")
)
standin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(standin)


@pytest.fixture(scope="module")
def node():
    from tests.fakenode import FakeNode

    # the replayed ib_write_bw ran on an HDR (200 Gb/s) port
    built = FakeNode.build_temp(
        "dgx-h100", overrides={"nic": {"mlx5_0": {"ports": {1: {"rate": "200 Gb/sec (4X HDR)"}}}}}
    )
    yield built
    built.cleanup()


@pytest.fixture(autouse=True)
def quick_loopback_settle(monkeypatch):
    """The real ib_write_bw server needs its 0.5 s to listen before the client starts; the stand-in
    server answers without waiting for a client, so the pairs here are started 0.05 s apart (the
    module ran ~14 s of settle sleeps). The server still runs beside the client and is joined."""
    real = tools.run_pair

    def run_pair(server, client, timeout_s, env=None, settle_s=0.5):
        return real(server, client, timeout_s, env, settle_s=min(settle_s, 0.05))

    monkeypatch.setattr(tools, "run_pair", run_pair)


REPLAYS = ""  # rendered_replays' directory


@pytest.fixture(scope="module", autouse=True)
def rendered_replays(tmp_path_factory):
    """The directory of replays the stand-ins print with cat (standin.prepare): standin_env names
    it, and qualify() renders there, in this process, what the level's tools will print."""
    global REPLAYS
    REPLAYS = str(tmp_path_factory.mktemp("replays"))
    yield
    REPLAYS = ""


def standin_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUALIFY_STANDIN_")}
    env["PATH"] = STANDINS + os.pathsep + "/usr/bin:/bin"
    env["QUALIFY_STANDIN_CACHE"] = REPLAYS
    env.update({"QUALIFY_STANDIN_" + k.upper(): v for k, v in extra.items()})
    return env


def render_replays(env, level, ib_ports, gpus=8) -> None:
    """What each tool of `level` prints under env, rendered into env's replay directory; a tool
    whose replay is not there (other arguments, a log, a hang) runs standin.py instead."""
    for test in levels.tests_for(level, gpus, flow.parse_ports(ib_ports)):
        for argv in (test.argv, test.server_argv):
            if argv:
                standin.prepare(argv[0], argv[1:], env)


def qualify(node, level="standard", env=None, settings=None, records_dir=None, **kw):
    env = env if env is not None else standin_env()
    settings = dict(SETTINGS, **(settings or {}))
    render_replays(env, level, settings["ib_ports"])
    return flow.run_level(
        settings,
        level,
        "n1",
        Host(str(node.root)),
        env=env,
        records_dir=records_dir,
        **kw,
    )


def statuses(result) -> dict:
    return {t["name"]: t["status"] for t in result["tests"]}


def test_a_healthy_node_passes_every_level_with_its_figures(node):
    for level in levels.LEVEL_NAMES:
        result = qualify(node, level)
        assert result["verdict"] == "pass", result
        assert result["class"] == H100 and result["gpus"] == 8
    figures = {k: v for t in result["tests"] for k, v in t["figures"].items()}
    assert figures["nvbandwidth.h2d.min"] == 23.90  # GPU 2 of the RTX 4090 capture
    assert figures["nccl.busbw"] == round((97.09 + 97.54 + 95.49 + 97.37 + 95.10) / 5, 2)
    assert figures["ib:mlx5_0:1.gbits"] == pytest.approx(192.45, abs=0.01)


def test_the_tools_get_the_level_arguments(node, tmp_path):
    log = tmp_path / "argv.log"
    qualify(node, "long", env=standin_env(log=str(log)))
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert ["dcgmi", "diag", "-r", "3", "-j"] in calls
    assert ["all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-n", "200", "-g", "8"] in calls
    client = [c for c in calls if c[0] == "ib_write_bw" and c[-1] == "localhost"][0]
    assert "--use_cuda=0" in client and client[1:5] == ["-d", "mlx5_0", "-i", "1"]


# which planted fault each level catches: (fault, level) -> the failing test, or None
DETECTION = [
    ("slow_gpu=2", "quick", None),
    ("slow_gpu=2", "standard", "nvbandwidth"),
    ("slow_gpu=2", "long", "nvbandwidth"),
    ("x8_link=3", "quick", "nvbandwidth"),
    ("x8_link=3", "standard", "nvbandwidth"),
    ("x8_link=3", "long", "nvbandwidth"),
    ("ib_half", "quick", None),
    ("ib_half", "standard", "ib:mlx5_0:1"),
    ("ib_half", "long", "ib:mlx5_0:1"),
    ("dcgm_fail", "quick", None),
    ("dcgm_fail", "standard", None),
    ("dcgm_fail", "long", "dcgm"),
    ("dcgm_fail_memory", "quick", None),
    ("dcgm_fail_memory", "standard", "dcgm"),
    ("dcgm_fail_memory", "long", "dcgm"),
    ("nccl_wrong", "quick", "nccl"),
    ("nccl_wrong", "standard", "nccl"),
    ("nccl_wrong", "long", "nccl"),
]


@pytest.mark.parametrize("fault, level, caught_by", DETECTION)
def test_detection_table(node, fault, level, caught_by):
    result = qualify(node, level, env=standin_env(fault=fault))
    failed = [name for name, status in statuses(result).items() if status == "FAIL"]
    if caught_by is None:
        assert result["verdict"] == "pass", result["reason"]
    else:
        assert result["verdict"] == "fail" and caught_by in failed, result
        assert result["reason"].startswith(caught_by + ": ")


def test_a_slow_gpu_the_quick_level_misses_is_caught_by_a_class_floor(node):
    # the all-reduce is 40% slower: no sibling comparison sees it, the class's floor does
    settings = {"classes": {H100: {"min_busbw_gbs": 80}}}
    result = qualify(node, "quick", env=standin_env(fault="slow_gpu=2"), settings=settings)
    assert result["verdict"] == "fail"
    assert "busbw 57.9 GB/s < 80 (class floor)" in result["reason"]


def test_the_reasons_name_the_test_and_its_figure(node):
    cases = {
        "x8_link=3": "GPU 3 h2d 13.2 GB/s < 80% of the node's median",
        "ib_half": "ib_write_bw mlx5_0:1 96.2 Gb/s = 48% of the port's 200 Gb/s",
        "dcgm_fail_memory": "DCGM memory failed on GPU 0: Persistence Mode",
        "nccl_wrong": "all_reduce_perf #wrong 85",
    }
    for fault, text in cases.items():
        assert text in qualify(node, "standard", env=standin_env(fault=fault))["reason"]
    long_run = qualify(node, "long", env=standin_env(fault="dcgm_fail"))
    assert "DCGM sm_stress failed on GPU 0,2,3: Max stress level of 2128.7" in long_run["reason"]


def test_a_missing_tool_is_skip_naming_it_and_never_a_pass(node, tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("dcgmi", "all_reduce_perf", "ib_write_bw"):  # no nvbandwidth
        os.symlink(os.path.join(STANDINS, tool), bare / tool)
    env = dict(standin_env(), PATH=str(bare) + os.pathsep + "/usr/bin:/bin")
    result = qualify(node, "standard", env=env)
    assert statuses(result)["nvbandwidth"] == "SKIP"
    assert result["verdict"] == "not qualified"
    assert result["reason"] == "nvbandwidth: nvbandwidth is not installed"
    optional = qualify(node, "standard", env=env, settings={"optional_tools": ["nvbandwidth"]})
    assert optional["verdict"] == "pass"
    nothing = qualify(node, "quick", env=dict(env, PATH=str(tmp_path)))
    assert nothing["verdict"] == "not qualified" and set(statuses(nothing).values()) == {"SKIP"}


def short_timeouts(monkeypatch, seconds: float) -> None:
    original = levels.tests_for
    monkeypatch.setattr(
        levels,
        "tests_for",
        lambda *a: [replace(t, timeout_s=seconds) for t in original(*a)],
    )


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("hang", "dcgmi did not finish in 2 s (killed); it printed: starting..."),
        (
            "crash",
            "nvbandwidth was killed by SIGSEGV; it printed: Running host_to_device_memcpy_ce.",
        ),
        (
            "garbage",
            "no nvbandwidth result matrix in the output (nvbandwidth exited 0); it printed:",
        ),
        (
            "exit3",
            "no DCGM diagnostic table or JSON in the output (dcgmi exited 3); it printed: Error:",
        ),
    ],
)
def test_a_hung_crashed_or_babbling_tool_fails_its_test_and_never_hangs_us(
    node, monkeypatch, mode, expected
):
    short_timeouts(monkeypatch, 2.0)
    tool = "dcgmi" if mode in ("hang", "exit3") else "nvbandwidth"
    start = time.monotonic()
    result = qualify(node, "quick", env=standin_env(**{tool: mode}))
    assert time.monotonic() - start < 10
    (test,) = [t for t in result["tests"] if t["tool"] == tool]
    assert test["status"] == "FAIL" and test["summary"].startswith(expected), test
    assert result["verdict"] == "fail"


def test_a_hung_tool_and_its_children_are_killed(tmp_path):
    marker = tmp_path / "child.pid"
    script = "echo $$ > %s; (sleep 300; echo late) & sleep 300" % marker
    start = time.monotonic()
    run = tools.run(["sh", "-c", script], 1.0)
    assert run.timed_out and time.monotonic() - start < 5
    time.sleep(0.2)
    pid = int(marker.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_tool_that_closes_its_output_before_it_exits_is_not_killed():
    """cat (coreutils' close_stdout) and other tools close stdout before they exit: the end of the
    output is not the end of the tool, whose exit status is its own, not the SIGKILL meant for
    what it left behind."""
    run = tools.run(["sh", "-c", "echo done; exec >&- 2>&-; sleep 0.1; exit 3"], 10.0)
    assert run.rc == 3 and not run.timed_out and run.output == "done\n", run


def test_a_tool_that_cannot_be_killed_never_passes(monkeypatch):
    """A tool that prints a passing result, closes its output and then cannot be killed (stuck in
    the kernel in a broken GPU's teardown: here the group's SIGKILL is not sent) came back as
    rc None, not timed out, and the judge let it pass (red team, stop 35). A tool that never
    ended is reported as not finished, whatever it printed, and fails its test."""
    from slurm_hooks.qualify import judge

    spawned = []
    real_popen = tools.subprocess.Popen

    def popen(*args, **kwargs):
        spawned.append(real_popen(*args, **kwargs))
        return spawned[-1]

    monkeypatch.setattr(tools.subprocess, "Popen", popen)
    monkeypatch.setattr(tools, "_kill_group", lambda proc: None)  # the SIGKILL that cannot land
    monkeypatch.setattr(tools, "REAP_AFTER_KILL_S", 0.2)
    monkeypatch.setattr(tools, "AFTER_TOOL_GRACE_S", 0.2)
    argv = ("dcgmi", "diag", "-r", "1", "-j")
    passing = standin.render("dcgmi", list(argv[1:]), {})
    script = "cat <<'EOF'\n%sEOF\nexec >&- 2>&-; exec sleep 30" % passing
    try:
        run = tools.run(["sh", "-c", script], 10.0)
        assert run.timed_out and run.rc is None, run
        outcome = judge.judge(levels.Test("dcgm", "dcgmi", argv, 10.0), run, {}, 1.0)
        assert outcome.status is Status.FAIL, outcome
    finally:
        os.killpg(spawned[0].pid, signal.SIGKILL)


def test_an_interruption_while_the_tool_exits_kills_its_group():
    """qualify turns SIGINT/SIGTERM into an exception. One that lands while run() gives a tool
    whose output ended time to exit (AFTER_TOOL_GRACE_S) left the tool's group running while
    the interrupted qualification put the node back (red team, stop 35)."""

    class Interrupted(Exception):
        pass

    def interrupted(signum, frame):
        raise Interrupted()

    spawned = []
    real_popen = tools.subprocess.Popen

    def popen(*args, **kwargs):
        spawned.append(real_popen(*args, **kwargs))
        return spawned[-1]

    previous = signal.signal(signal.SIGALRM, interrupted)
    try:
        tools.subprocess.Popen = popen
        signal.setitimer(signal.ITIMER_REAL, 0.3)  # in the grace: the output ends at once
        with pytest.raises(Interrupted):
            tools.run(["sh", "-c", "echo result; exec >&- 2>&-; exec sleep 30"], 30.0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        tools.subprocess.Popen = real_popen
    with pytest.raises(ProcessLookupError):
        os.killpg(spawned[0].pid, 0)


def test_output_is_bounded():
    run = tools.run([sys.executable, "-c", "print('x' * 10_000_000)"], 20.0, max_bytes=1000)
    assert run.truncated and run.rc == 0
    assert len(run.output) < 1000 + tools.TAIL_BYTES + 100


def write_peer_passes(records_dir, node_named=False):
    """Standard-level passes of three H100 peers (NCCL busbw 160, 150, 155: median 155);
    `node_named`: each record names its node and start, as qualify's own records do."""
    for peer, busbw in (("p1", 160.0), ("p2", 150.0), ("p3", 155.0)):
        named = {"node": peer, "started": 1.0e9} if node_named else {}
        record.write(
            records_dir,
            peer,
            dict(
                named,
                schema=record.SCHEMA,
                level="standard",
                verdict="pass",
                tests=[{"name": "nccl", "figures": {"nccl.busbw": busbw}}],
                **{"class": H100},
            ),
        )


def test_records_and_the_fleet_median(node, tmp_path):
    records_dir = str(tmp_path)
    write_peer_passes(records_dir)
    result = qualify(node, "standard", records_dir=records_dir)
    assert result["verdict"] == "fail"
    assert "nccl.busbw 96.5 < 85%% of the %s median 155.0 (3 peers)" % H100 in result["reason"]
    # two peers are not a fleet
    os.remove(os.path.join(records_dir, "p3", os.listdir(os.path.join(records_dir, "p3"))[0]))
    assert qualify(node, "standard", records_dir=records_dir)["verdict"] == "pass"
    path = record.write(records_dir, "n1", result)
    assert path.endswith(".qualify") and record.read(path)["verdict"] == "fail"
    assert record.latest_by_node(records_dir)["n1"][0] == path


def test_the_command_prints_writes_and_exits_by_verdict(node, tmp_path):
    """The first run is a `python -m slurm_hooks` child (the verb's one in this tier); the others
    run in this process (tests/inprocess_cli.py)."""
    from tests.inprocess_cli import cli_in_process

    config = tmp_path / "config.toml"
    config.write_text(
        '[general]\nroot = "%s"\n[records]\ndir = "%s"\n[qualify]\nib_ports = ["mlx5_0:1"]\n'
        % (node.root, tmp_path / "records")
    )
    config.chmod(0o600)
    args = ["--config", str(config), "qualify"]
    render_replays(standin_env(), "quick", ["mlx5_0:1"])
    ok = subprocess.run(
        [sys.executable, "-m", "slurm_hooks"] + args + ["--level", "quick"],
        env=standin_env(),
        capture_output=True,
        text=True,
    )
    assert ok.returncode == ExitCode.OK, ok.stderr
    assert "verdict: PASS: 3 tests passed" in ok.stdout and "record: " in ok.stdout
    render_replays(standin_env(fault="ib_half"), "standard", ["mlx5_0:1"])
    bad = cli_in_process(args + ["--json"], env=standin_env(fault="ib_half"))
    assert bad.returncode == ExitCode.FAIL
    doc = json.loads(bad.stdout)
    assert doc["verdict"] == "fail" and doc["record"].endswith(".qualify")
    missing = cli_in_process(args, env=dict(standin_env(), PATH="/usr/bin:/bin"))
    assert missing.returncode == ExitCode.UNKNOWN and "not qualified" in missing.stdout.lower()
    shown = cli_in_process(args + ["--list"], env=standin_env())
    assert shown.returncode == ExitCode.OK
    (line,) = shown.stdout.splitlines()  # the latest of the node's three records
    assert line.startswith("dgx-h100-01") and " standard " in line and " not qualified " in line
    assert "nvbandwidth is not installed" in line


@pytest.mark.parametrize(
    "table, message",
    [
        ('[qualify.classes."H100"]\nmin_busbw_gbs = 1\n', "is not a class name"),
        ('[qualify.classes."X x8"]\nmin_busbw = 1\n', "unknown key 'min_busbw'"),
        ('[qualify.classes."X x8"]\nmin_ib_fraction = 1.5\n', "out of range"),
        ('[qualify]\nib_ports = ["mlx5_0"]\n', "is not DEVICE:PORT"),
        ('[qualify]\noptional_tools = ["nccl"]\n', "'nccl' is not one of the tools"),
        ('[qualify]\nlevel = "fast"\n', "'fast' is not one of"),
    ],
)
def test_bad_qualify_config_is_refused_at_load_with_the_key(tmp_path, table, message):
    from slurm_hooks.core.config import load_registry_and_config
    from slurm_hooks.core.config_files import ConfigError

    config = tmp_path / "config.toml"
    config.write_text(table)
    config.chmod(0o600)
    with pytest.raises(ConfigError, match="qualify") as info:
        load_registry_and_config(str(config))
    assert message in str(info.value)


def test_statuses_are_the_result_vocabulary(node):
    result = qualify(node, "quick", env=standin_env(fault="x8_link=1"))
    assert {t["status"] for t in result["tests"]} <= {s.value for s in Status}


def test_a_record_of_another_owner_or_a_symlink_never_sets_the_median(node, tmp_path):
    """A user who can write in the records directory (or a node that was not ours) must not raise
    the class median and fail every peer's qualification."""
    records_dir = str(tmp_path)
    for peer in ("p1", "p2", "p3"):
        record.write(
            records_dir,
            peer,
            {
                "schema": record.SCHEMA,
                "class": H100,
                "level": "standard",
                "verdict": "pass",
                "tests": [{"name": "nccl", "figures": {"nccl.busbw": 900.0}}],
            },
        )
    p3 = os.path.join(records_dir, "p3")
    (name,) = os.listdir(p3)
    os.rename(os.path.join(p3, name), os.path.join(records_dir, "elsewhere.qualify"))
    os.symlink(os.path.join(records_dir, "elsewhere.qualify"), os.path.join(p3, name))
    assert qualify(node, "standard", records_dir=records_dir)["verdict"] == "pass"  # 2 real peers
    assert record.read(os.path.join(p3, name)) is None
    if os.geteuid() == 0:
        os.remove(os.path.join(p3, name))
        os.rename(os.path.join(records_dir, "elsewhere.qualify"), os.path.join(p3, name))
        os.chown(os.path.join(p3, name), 4242, 4242)
        assert (
            qualify(node, "standard", records_dir=records_dir, trusted_uids={0})["verdict"]
            == "pass"
        )
        os.chown(os.path.join(p3, name), 0, 0)
        assert (
            qualify(node, "standard", records_dir=records_dir, trusted_uids={0})["verdict"]
            == "fail"
        )


def test_the_latest_record_is_the_last_written_even_within_one_second(tmp_path):
    for verdict in ("fail", "not qualified", "pass"):
        record.write(str(tmp_path), "n1", {"schema": record.SCHEMA, "verdict": verdict}, now=1.0e9)
    names = sorted(os.listdir(tmp_path / "n1"))
    assert len(names) == 3
    assert record.latest_by_node(str(tmp_path))["n1"][1]["verdict"] == "pass"


def test_the_job_script_is_never_written_through_a_planted_symlink(tmp_path):
    from slurm_hooks.qualify import through_slurm

    target = tmp_path / "etc-passwd"
    target.write_text("root:x:0:0\n")
    os.symlink(target, tmp_path / "qualify-n1.sh")
    through_slurm._write_new(str(tmp_path / "qualify-n1.sh"), "#!/bin/sh\n", 0o700)
    assert target.read_text() == "root:x:0:0\n"
    assert not os.path.islink(tmp_path / "qualify-n1.sh")
    os.symlink(target, tmp_path / "out")
    assert through_slurm._read_ours(str(tmp_path / "out")) == ""
    with pytest.raises(ValueError):
        through_slurm.qualify_node(None, "../n1", "quick", {}, [], str(tmp_path))


@pytest.mark.parametrize("mode, owner", [(0o777, None), (0o775, None), (0o755, 65534)])
def test_a_tool_planted_where_a_user_can_write_is_never_run(
    node, tmp_path, monkeypatch, mode, owner
):
    """A user plants a dcgmi that prints a clean diagnostic (the stand-in's, which passes) in a
    PATH directory they can write, or own, ahead of the real ones: the qualification runs as root
    and believes the tool's figures, so that tool is not run; the test is UNKNOWN (not qualified,
    never a pass and never a drain on a user's say), naming the place."""
    planted = tmp_path / "planted"
    planted.mkdir()
    for tool in ("dcgmi", "nvbandwidth", "all_reduce_perf", "ib_write_bw"):
        os.symlink(os.path.join(STANDINS, tool), planted / tool)
    planted.chmod(mode)
    if owner is not None:
        os.chown(str(planted), owner, -1)
    env = dict(standin_env(), PATH=str(planted) + os.pathsep + "/usr/bin:/bin")
    result = qualify(node, "quick", env=env)
    assert result["verdict"] == "not qualified", result
    assert set(statuses(result).values()) == {"UNKNOWN"}, result["tests"]
    assert "dcgmi not run: %s" % planted in result["reason"], result["reason"]
    for tool in ("dcgmi", "nvbandwidth"):  # a relative PATH entry ('.', the job's work dir)
        os.symlink(os.path.join(STANDINS, tool), tmp_path / tool)
    monkeypatch.chdir(tmp_path)
    relative = tools.run(["dcgmi", "diag", "-r", "1"], 10.0, dict(env, PATH="."))
    assert relative.refused and not relative.found, relative


def test_a_tool_in_a_safe_place_still_runs():
    run = tools.run([sys.executable, "-c", "print('ok')"], 10.0)
    assert run.found and run.rc == 0 and run.output.strip() == "ok"


def test_a_gpu_nvbandwidth_did_not_measure_is_never_a_pass(node):
    """The driver lists 8 GPUs (/proc/driver/nvidia/gpus) but nvbandwidth measured 3 (the stored
    superbench GH200 capture's host-to-device matrix): a GPU CUDA no longer sees (fallen off the bus, hidden by a
    CUDA_VISIBLE_DEVICES the job inherited) was never tested, so the test is not a pass; UNKNOWN,
    not FAIL (the job's environment can hide it too)."""
    env = standin_env(nvbandwidth="nvbandwidth-v0.6-gh200-superbench.txt")
    result = qualify(node, "quick", env=env)
    (test,) = [t for t in result["tests"] if t["tool"] == "nvbandwidth"]
    assert test["status"] == "UNKNOWN", test
    assert "h2d measured 3 of the node's 8 GPUs" in test["summary"], test
    assert result["verdict"] == "not qualified"


def test_a_library_planted_where_a_user_can_write_is_never_loaded(node, tmp_path, monkeypatch):
    """The tool sits in a safe place, but the admin's environment (exported by sbatch to the job)
    names a library directory a user can write in LD_LIBRARY_PATH, or a preload there: a planted
    libnccl/libcudart would run as root inside the tool and print a pass. Not run: UNKNOWN, not
    qualified, naming the variable. A trailing ':' (the work dir the tool runs in) and a missing
    directory under a safe one are fine."""
    shared = tmp_path / "shared-lib"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "libplanted.so").write_bytes(b"")
    env = dict(standin_env(), LD_LIBRARY_PATH="/usr/lib:%s" % shared)
    result = qualify(node, "quick", env=env)
    assert result["verdict"] == "not qualified", result
    assert set(statuses(result).values()) == {"UNKNOWN"}, result["tests"]
    assert "LD_LIBRARY_PATH entry %r" % str(shared) in result["reason"], result["reason"]
    preload = dict(standin_env(), LD_PRELOAD=str(shared / "libplanted.so"))
    refused = tools.run([sys.executable, "-c", "print('ok')"], 10.0, preload)
    assert refused.refused and "LD_PRELOAD" in refused.refused, refused
    origin = dict(standin_env(), LD_LIBRARY_PATH="$ORIGIN/../lib")  # beside the tool: not judged
    assert tools.run([sys.executable, "-c", "print('ok')"], 10.0, origin).refused
    safe = tmp_path / "safe"
    safe.mkdir(mode=0o755)
    monkeypatch.chdir(str(safe))
    fine = dict(os.environ, LD_LIBRARY_PATH="/usr/lib:%s/gone/lib:" % safe)
    ran = tools.run([sys.executable, "-c", "print('ok')"], 10.0, fine)
    assert ran.found and ran.rc == 0 and not ran.refused, ran


def test_a_peers_directory_renamed_to_the_judged_nodes_name_still_counts(node, tmp_path):
    """Someone who can write the records directory (without the sticky bit, renames are theirs)
    renames peer p3's directory to n1, the node about to be judged: judged by directory name, p3
    was taken for n1's own record and left out, two peers were too few for a median, and the slow
    n1 passed. A record is its writer's node's, wherever its directory was moved."""
    records_dir = str(tmp_path)
    write_peer_passes(records_dir, node_named=True)
    os.rename(os.path.join(records_dir, "p3"), os.path.join(records_dir, "n1"))
    result = qualify(node, "standard", records_dir=records_dir)
    assert result["verdict"] == "fail", result["reason"]
    assert "median 155.0 (3 peers)" in result["reason"], result["reason"]
    assert sorted(record.latest_by_node(records_dir)) == ["p1", "p2", "p3"]
