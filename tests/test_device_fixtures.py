"""What a real NVIDIA node answered (tests/captures/device/h200-vm, recorded by tools/device_smoke.py
on the H200 machine a session was lent on 2026-12-04), held against the parts we wrote:

- a `slurm-hooks capture` of that node, checked elsewhere with `check --root`, must give the very
  verdicts the node gave live, except the checks that only the running node can answer (NVML, the
  BMC tool), which must say so;
- the fake node built from tests/fakenode/specs/h200-pcie-vm.toml (the same machine, written by
  hand from its nvidia-smi -q) must answer NVML as the real driver did: the same error or success
  for every function slurm_hooks calls, the same values where they are properties of the GPU and
  not of the moment, the same field-value returns;
- the checks on that fake node must reach the real node's verdict for every GPU check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile

import pytest

from tests.captures import HERE, extract
from tests.helpers import REPO, cli_with_default_config

MACHINE = os.path.join(HERE, "device", "h200-vm")
# checks only the running node answers: under --root they SKIP and say why (capture.json's live_only)
LIVE_ONLY = ("gpu.", "host.bmc")
# answers that belong to the moment or to the one board (UUID, serial), or are ctypes objects whose
# repr is an address: compared by kind (value or error) only
MOMENTARY = {
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetPcieReplayCounter",  # 2 on the first machine lent, 0 on the last
    "nvmlSystemGetNVMLVersion",  # the fake's must say it is the fake
}


def _load(name):
    with open(os.path.join(MACHINE, name), encoding="utf-8") as handle:
        return json.load(handle)


def _verdicts(report):
    return {
        (r["check"], r.get("component")): (r["status"], r["summary"])
        for run in report["checks"]
        for r in run["results"]
    }


def _check(args, env=None, child=False):
    """`check --all-contexts --json ARGS` with the built-in defaults, as the machine ran it (its
    capture's config.toml says: built-in defaults); the report as a dict."""
    done = cli_with_default_config(["check", "--all-contexts", "--json"] + args, env, child)
    assert done.returncode in (0, 1, 2), done.stderr
    return json.loads(done.stdout)


def test_the_capture_replays_to_the_verdicts_the_node_gave_live(tmp_path):
    with tarfile.open(os.path.join(MACHINE, "capture.tar.xz")) as tar:
        extract(tar, str(tmp_path))
    replay = _verdicts(_check(["--root", str(tmp_path / "vm")]))
    live = _verdicts(_load("check.json"))
    assert len(live) >= 30
    compared = 0
    for key, (status, summary) in live.items():
        check = key[0]
        if check.startswith(LIVE_ONLY):
            continue
        assert replay.get(key) == (status, summary), (key, replay.get(key), status, summary)
        compared += 1
    for (check, _component), (status, summary) in replay.items():
        if check.startswith(LIVE_ONLY):
            assert status == "SKIP", (check, summary)
            assert "live-only" in summary or "NOT_LIVE" in summary or "running node" in summary
    assert compared >= 20, compared


def _outcome(answer):
    if "fields" in answer:
        return {name: (f["nvmlReturn"], f["value"]) for name, f in answer["fields"].items()}
    if "error" in answer:
        return "error " + answer["error"].split(":")[0]
    return answer.get("value")


def _kind(outcome):
    return outcome if isinstance(outcome, str) and outcome.startswith("error ") else "value"


@pytest.fixture(scope="module")
def fake_answers(tmp_path_factory):
    """tools/device_smoke.py's NVML probe run against the fake library of the h200-pcie-vm node."""
    from tests.fakenode import load_spec
    from tests.fakenode.node import build_node

    node = build_node(load_spec("h200-pcie-vm"), str(tmp_path_factory.mktemp("h200") / "node"))
    try:
        env = node.subprocess_env()
        env["PYTHONPATH"] = os.pathsep.join([REPO, os.path.join(REPO, "tools")])
        code = (
            "import json, device_smoke as d; "
            "print(json.dumps(d.probe_nvml(d.nvml_names(%r))))" % os.path.join(REPO, "slurm_hooks")
        )
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        yield node, json.loads(done.stdout)
    finally:
        node.cleanup()


def test_the_fake_h200_answers_nvml_as_the_real_driver_did(fake_answers):
    _node, fake = fake_answers
    real = _load("nvml-calls.json")
    assert real["count"]["value"] == fake["count"]["value"] == "1"
    assert set(real["functions"]) == set(fake["functions"])
    differences = []
    for name, answer in real["functions"].items():
        mine = fake["functions"][name]
        assert mine.get("exported") is True or not answer.get("exported"), name
        for key in ("per_gpu", "system", "per_gpu_by_args"):
            if key not in answer:
                continue
            if key == "per_gpu_by_args":
                pairs = [
                    (args, _outcome(a), _outcome(b))
                    for args in answer[key]
                    for a, b in zip(answer[key][args], mine[key][args])
                ]
            elif key == "system":
                pairs = [(None, _outcome(answer[key]), _outcome(mine[key]))]
            else:
                pairs = [(None, _outcome(a), _outcome(b)) for a, b in zip(answer[key], mine[key])]
            for args, theirs, ours in pairs:
                same_kind = _kind(theirs) == _kind(ours)
                object_repr = isinstance(theirs, str) and theirs.startswith("<pynvml.")
                if not same_kind or (name not in MOMENTARY and not object_repr and theirs != ours):
                    differences.append((name, args, theirs, ours))
    assert not differences, differences


def test_the_checks_on_the_fake_h200_reach_the_real_nodes_gpu_verdicts(fake_answers):
    node, _answers = fake_answers
    # a process of its own: this worker's pynvml may hold another node's library already
    report = _check(["--root", str(node.root), "--live", "nvml"], node.subprocess_env(), child=True)
    fake = _verdicts(report)
    real = _verdicts(_load("check.json"))
    gpu = {key: verdict for key, verdict in real.items() if key[0].startswith("gpu.")}
    assert len(gpu) >= 10
    assert {key: fake.get(key) for key in gpu} == gpu
