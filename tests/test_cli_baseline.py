"""`slurm-hooks baseline`: a known-good node's values as config, loadable unchanged, that every check passes
on that node and that catches the faults the defaults cannot (a slower slot, SMT turned off).
The first test runs its commands as `python -m slurm_hooks` children; the others in this process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.captures import unpack
from tests.helpers import REPO
from tests.inprocess_cli import cli_in_process

CLI = [sys.executable, "-m", "slurm_hooks"]


def _run(args, env=None, node=None, child=False):
    """The command in this process (tests/inprocess_cli.py; `--live nvml` reads node's library),
    or with child=True as `python -m slurm_hooks`, as the first test runs every verb it uses."""
    if not child:
        return cli_in_process(args, env=env, nvml_node=node if "--live" in args else None)
    return subprocess.run(
        CLI + args, capture_output=True, text=True, cwd=REPO, env=env, timeout=120
    )


def _env(node=None):
    import os

    env = node.subprocess_env() if node is not None else dict(os.environ)
    env["SLURM_HOOKS_ALLOW_INSECURE_CONFIG"] = "1"
    return env


def _baseline(node, tmp_path, child=False):
    out = tmp_path / "baseline.toml"
    proc = _run(
        ["baseline", "--root", str(node.root), "--live", "nvml", "-o", str(out)],
        _env(node),
        node,
        child,
    )
    assert proc.returncode == 0, proc.stderr
    return out


def _check(node, config, *names, child=False):
    proc = _run(
        ["--config", str(config), "check", "--json", "--all-contexts", "--root", str(node.root)]
        + ["--live", "nvml"]
        + list(names),
        _env(node),
        node,
        child,
    )
    return proc.returncode, json.loads(proc.stdout)


def test_baseline_of_a_good_node_loads_and_every_check_passes_on_it(fake_node, tmp_path):
    node = fake_node("dgx-h100")
    config = _baseline(node, tmp_path, child=True)
    text = config.read_text()
    loaded = _run(["--config", str(config), "config", "check"], _env(), child=True)
    assert loaded.returncode == 0, loaded.stderr
    effective = loaded.stdout
    for line in (  # the values the fake node's spec sets, now in the effective config
        "expected = 8",
        'expected_links = ["NVIDIA H100 80GB HBM3=18"]',
        'allow = ["550.54.15"]',
        "expected_gen = 5",
        "sockets = 2",
        "cores_per_socket = 56",
        "threads_per_core = 2",
        "expect_gpus = true",
    ):
        assert line in effective, (line, text)
    assert '"mlx5_0", "mlx5_1"' in text and "mlx5_9" in text
    code, report = _check(node, config, child=True)
    bad = [(c["name"], c["status"]) for c in report["checks"] if c["status"] not in ("OK", "SKIP")]
    assert code == 0 and bad == [], bad


def test_a_node_checked_against_the_baseline_fails_on_a_planted_fault(fake_node, tmp_path):
    config = _baseline(fake_node("dgx-h100"), tmp_path)
    x8 = fake_node("dgx-h100", {"gpu": {1: {"pcie": {"width": 8}}}})
    code, report = _check(x8, config, "gpu.pcie")
    results = report["checks"][0]["results"]
    assert code == 2 and [(r["status"], r["component"]) for r in results] == [
        ("FAIL", "gpu:1 0000:1a:00.0")
    ]


def test_the_baseline_catches_what_the_defaults_only_warn_about_or_miss(fake_node, tmp_path):
    config = _baseline(fake_node("dgx-h100"), tmp_path)
    default = tmp_path / "default.toml"
    default.write_text("")
    # a GPU in a Gen4 slot: the defaults WARN (link below the GPU's maximum), the baseline says Gen5
    gen4 = fake_node("dgx-h100", {"gpu": {2: {"pcie": {"gen": 4, "max_gen": 4}}}})
    assert _check(gen4, default, "gpu.pcie")[0] == 1
    code, report = _check(gen4, config, "gpu.pcie")
    results = report["checks"][0]["results"]
    assert code == 2 and [(r["status"], r["component"]) for r in results][0] == (
        "FAIL",
        "gpu:2 0000:42:00.0",
    ), results
    # SMT turned off (nosmt): 112 CPUs instead of 224, every one online, the defaults see nothing wrong
    nosmt = fake_node(
        "dgx-h100",
        {
            "cpu": {"threads_per_core": 1},
            "numa": {0: {"cpulist": "0-55"}, 1: {"cpulist": "56-111"}},
        },
    )
    assert _check(nosmt, default, "system.cpu")[0] == 0
    code, report = _check(nosmt, config, "system.cpu")
    assert code == 2 and "threads per core, expected 2" in json.dumps(report)


def test_baseline_of_a_capture_reads_the_tree_only(tmp_path):
    """A real machine's capture (hwloc's 2-package Xeon with NVMe and DAX) under --root: no NVML read,
    the CPU and memory values come from the tree, and the output loads."""
    root = unpack("32em64t-2n8c+dax+nvme+mic+dimms", str(tmp_path))
    proc = _run(["baseline", "--root", root], _env())
    assert proc.returncode in (0, 1), proc.stderr
    config = tmp_path / "capture.toml"
    config.write_text(proc.stdout)
    assert "sockets = 2" in proc.stdout and "min_total_gib" in proc.stdout
    assert "gpu.driver" not in proc.stdout  # NVML is live-only: nothing read under --root
    assert _run(["--config", str(config), "config", "check"], _env()).returncode == 0


def test_baseline_does_not_replace_a_file_without_force(fake_node, tmp_path):
    node = fake_node("dgx-h100")
    config = tmp_path / "site.toml"
    config.write_text("# an admin's hand-written file\n")
    proc = _run(["baseline", "--root", str(node.root), "-o", str(config)], _env(node))
    assert proc.returncode == 3 and "exists" in proc.stderr
    assert config.read_text() == "# an admin's hand-written file\n"


def test_names_read_from_a_crafted_tree_stay_data(fake_node, tmp_path):
    """An HCA directory named to close the string and open a table of its own (a crafted capture)
    stays one string in `expected`; nothing of it becomes config."""
    node = fake_node("dgx-h100")
    evil = 'mlx5_x"]\n[checks."system.load"]\nenabled = false\n#'
    port = "/sys/class/infiniband/%s/ports/1/" % evil
    for name, text in (
        ("state", "4: ACTIVE"),
        ("phys_state", "5: LinkUp"),
        ("rate", "400 Gb/sec (4X NDR)"),
        ("link_layer", "InfiniBand"),
    ):
        node.write(port + name, text + "\n")
    config = _baseline(node, tmp_path)
    proc = _run(["--config", str(config), "config", "check", "--json"], _env())
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0 and doc["valid"], proc.stdout + proc.stderr
    assert doc["checks"]["system.load"]["enabled"] is True
    assert evil in doc["checks"]["gpudirect.hca"]["params"]["expected"]


@pytest.mark.parametrize("spec", ["dgx-a100", "cpu-only"])
def test_every_check_passes_on_the_node_its_baseline_came_from(fake_node, tmp_path, spec):
    node = fake_node(spec)
    config = _baseline(node, tmp_path)
    code, report = _check(node, config)
    bad = [(c["name"], c["status"]) for c in report["checks"] if c["status"] not in ("OK", "SKIP")]
    assert code == 0 and bad == [], (bad, config.read_text())
    assert ("gpu.driver" in config.read_text()) is (spec != "cpu-only")


def test_a_fault_no_baseline_can_express_is_listed_and_exits_1(fake_node, tmp_path):
    """A x8 link is a fault whatever the config: a baseline taken on that node says so at its top and
    exits 1, and the file is still written."""
    node = fake_node("dgx-h100", {"gpu": {1: {"pcie": {"width": 8}}}})
    out = tmp_path / "baseline.toml"
    proc = _run(
        ["baseline", "--root", str(node.root), "--live", "nvml", "-o", str(out)], _env(node), node
    )
    assert proc.returncode == 1 and "did not pass every check" in proc.stderr
    head = out.read_text().split("\n[", 1)[0]
    assert "#   FAIL gpu.pcie: gpu:1 0000:1a:00.0: PCIe link downtrained: x8 of x16" in head
    assert "expected = 8" in out.read_text()
