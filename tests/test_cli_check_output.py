"""The human output of `slurm-hooks check`: a check that did not pass names the component (GPU index and
bus id) and the action, and lists its other findings under its row, on the fake dgx-h100 node."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO

CLI = [sys.executable, "-m", "slurm_hooks"]


def _check(node, *names):
    return subprocess.run(
        CLI + ["check", "--root", str(node.root), "--live", "nvml"] + list(names),
        capture_output=True,
        text=True,
        cwd=REPO,
        env=node.subprocess_env(),
        timeout=60,
    )


def _row(out, name):
    return next(line for line in out.splitlines() if line.split()[1:2] == [name])


def test_a_failing_check_names_the_gpu_and_the_action(fake_node):
    node = fake_node(
        "dgx-h100",
        {
            "gpu": {
                2: {"nvlink": {"links": {5: {"state": False}}}},
                1: {"pcie": {"width": 8}},
                3: {"pcie": {"width": 8}},
            }
        },
    )
    proc = _check(node, "gpu.nvlink", "gpu.pcie", "gpu.ecc")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    nvlink = _row(proc.stdout, "gpu.nvlink")
    assert "gpu:2 0000:42:00.0: 17 of 18 NVLinks active" in nvlink and nvlink.endswith("-> drain")
    lines = proc.stdout.splitlines()
    pcie = lines.index(_row(proc.stdout, "gpu.pcie"))
    assert "gpu:1 0000:1a:00.0: PCIe link downtrained: x8 of x16" in lines[pcie]
    assert lines[pcie].endswith("-> drain")
    # the second GPU with the same fault is on its own line, not hidden behind "(+1 more)"
    assert lines[pcie + 1].split()[:3] == ["FAIL", "gpu:3", "0000:44:00.0:"], lines[pcie + 1]
    assert lines[pcie + 1].endswith("-> drain") and "more)" not in proc.stdout
    ok = _row(proc.stdout, "gpu.ecc")  # a passing check keeps its one-line summary
    assert ok.split()[0] == "OK" and "gpu:" not in ok and "->" not in ok


def test_every_gpu_with_the_fault_is_listed_and_verbose_adds_details(fake_node):
    node = fake_node("dgx-h100", {"gpu": {i: {"pcie": {"width": 8}} for i in range(8)}})
    proc = _check(node, "gpu.pcie")
    lines = proc.stdout.splitlines()
    assert proc.returncode == 2 and lines[1].split()[:2] == ["FAIL", "gpu.pcie"]
    assert [line.split()[1] for line in lines[2:9]] == ["gpu:%d" % i for i in range(1, 8)]
    verbose = _check(node, "gpu.pcie", "-v").stdout
    assert verbose.count("-> drain") >= 8 and "gpu:7 0000:c6:00.0" in verbose


def test_more_findings_than_fit_end_with_a_pointer_to_verbose():
    """Twelve GPUs with the same fault (a 16-GPU HGX): eight under the row, then where the rest are."""
    from slurm_hooks.core.report_format import MAX_FINDING_LINES, render_table
    from slurm_hooks.core.runner import CheckRun, RunReport
    from slurm_hooks.result import Action, Result, Status

    results = [
        Result(
            "gpu.pcie",
            Status.FAIL,
            "PCIe link downtrained: x8 of x16",
            component="gpu:%d 0000:%02x:00.0" % (i, 0x10 + i),
            action=Action.DRAIN,
        )
        for i in range(12)
    ] + [Result("gpu.pcie", Status.OK, "PCIe link at full width", component="gpu:12")]
    text = render_table(RunReport("manual", [CheckRun("gpu.pcie", results, 0.01)], 0.01, 30.0))
    lines = text.splitlines()
    assert lines[1].endswith("gpu:0 0000:10:00.0: PCIe link downtrained: x8 of x16 -> drain")
    listed = lines[2 : 2 + MAX_FINDING_LINES]
    assert [line.split()[1] for line in listed] == ["gpu:%d" % i for i in range(1, 9)]
    assert lines[2 + MAX_FINDING_LINES].strip() == "... and 3 more (slurm-hooks check -v gpu.pcie)"
    assert "gpu:12" not in text  # a passing GPU is not a finding
