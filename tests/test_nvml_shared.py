"""Answers shared within one hook run (nvml.share_within_run, the check process's): what identifies a GPU,
its persistence mode and its link states are asked once for the checks and the counter snapshot."""

from __future__ import annotations

import collections
import os
import subprocess
import sys

import pytest

from bench.nodeenv import BenchNode
from slurm_hooks.hw import nvml
from slurm_hooks.hw.host import Host
from slurm_hooks.records import counters
from tests.helpers import REPO, run_on_node


@pytest.fixture
def sharing():
    """share_within_run around this test."""
    with nvml.share_within_run():
        yield


@pytest.fixture
def library_calls(monkeypatch):
    """{function: calls that reached pynvml}."""
    calls = collections.Counter()
    real = nvml.NvmlSession._call

    def counted(self, function, *args, **kwargs):
        calls[function] += 1
        return real(self, function, *args, **kwargs)

    monkeypatch.setattr(nvml.NvmlSession, "_call", counted)
    return calls


def link_state(node, gpu, link):
    session = nvml.session()
    return session.call(
        "nvmlDeviceGetNvLinkState", session.call("nvmlDeviceGetHandleByIndex", gpu), link
    )


def test_a_shared_link_state_is_read_once_per_device_and_link(gpu_node, sharing, library_calls):
    assert link_state(gpu_node, 1, 5) == 1
    gpu_node.set_states({"gpu.1.nvlink.links.5.state": 0, "gpu.2.nvlink.links.5.state": 0})
    # a new handle object for the same device: the same reading
    assert link_state(gpu_node, 1, 5) == 1
    assert link_state(gpu_node, 2, 5) == 0 and link_state(gpu_node, 1, 6) == 1  # others are asked
    assert library_calls["nvmlDeviceGetNvLinkState"] == 3
    assert library_calls["nvmlDeviceGetHandleByIndex"] == 2


def test_without_sharing_every_call_reaches_the_library(gpu_node, library_calls):
    assert link_state(gpu_node, 1, 5) == 1
    gpu_node.set_states({"gpu.1.nvlink.links.5.state": 0})
    assert link_state(gpu_node, 1, 5) == 0
    assert library_calls["nvmlDeviceGetNvLinkState"] == 2


def test_nothing_is_shared_once_the_run_is_over(gpu_node, library_calls):
    """A run made in this process (a test, or a caller that runs the check process's work inline)
    leaves nothing behind: the next run asks again."""
    with nvml.share_within_run():
        assert link_state(gpu_node, 1, 5) == 1
        assert link_state(gpu_node, 1, 5) == 1
    gpu_node.set_states({"gpu.1.nvlink.links.5.state": 0})
    assert nvml._shared is None
    assert link_state(gpu_node, 1, 5) == 0
    assert library_calls["nvmlDeviceGetNvLinkState"] == 2


def test_an_error_and_a_counter_are_never_shared(gpu_node, sharing, library_calls):
    session = nvml.session()
    handle = session.call("nvmlDeviceGetHandleByIndex", 0)
    gpu_node.inject_fault("nvmlDeviceGetNvLinkState", 0, 15)
    with pytest.raises(nvml.NvmlError):
        session.call("nvmlDeviceGetNvLinkState", handle, 3)
    gpu_node.clear_faults()
    assert session.call("nvmlDeviceGetNvLinkState", handle, 3) == 1  # asked again, answered
    gpu_node.set_states({"gpu.0.pcie.replay_counter": 4})
    assert session.call("nvmlDeviceGetPcieReplayCounter", handle) == 4
    gpu_node.set_states({"gpu.0.pcie.replay_counter": 5})
    assert session.call("nvmlDeviceGetPcieReplayCounter", handle) == 5
    assert library_calls["nvmlDeviceGetNvLinkState"] == 2


def test_checks_and_snapshot_give_the_same_results_with_fewer_calls(
    registry, gpu_node, library_calls
):
    """The NVLink check and the snapshot as one prolog's check process runs them: same results and
    records with the answers shared, each link's state read once instead of twice."""
    gpu_node.set_states({"gpu.3.nvlink.links.5.state": 0, "gpu.3.nvlink.links.5.errors.replay": 2})

    def one_run():
        results = run_on_node(registry, gpu_node, ["gpu"])
        snap = counters.take(Host(str(gpu_node.root)), "", gpus=None)
        return (
            [(r.check, r.status, r.summary, r.component) for r in results],
            [
                {k: v for k, v in g.items() if k not in ("counters", "flags")}
                | {"counters": {k: v for k, v in g["counters"].items() if "energy" not in k}}
                for g in snap["gpus"]
            ],
        )

    alone = one_run()
    calls_alone = dict(library_calls)
    library_calls.clear()
    with nvml.share_within_run():
        shared = one_run()
    assert shared == alone
    assert any("inactive: 5" in summary for _, _, summary, _ in alone[0])
    assert calls_alone["nvmlDeviceGetNvLinkState"] == 8 * 18 + 8 * 19
    assert library_calls["nvmlDeviceGetNvLinkState"] == 8 * 19  # the probe past the last link too
    assert (
        library_calls["nvmlDeviceGetPersistenceMode"] < calls_alone["nvmlDeviceGetPersistenceMode"]
    )
    assert library_calls["nvmlDeviceGetUUID"] < calls_alone["nvmlDeviceGetUUID"]


def test_one_prolog_asks_nvml_each_shared_question_once(tmp_path):
    """The real prolog on the 8-GPU fake node (18 NVLinks per GPU), every NVML call counted by the fake
    library ($FAKE_NVML_CALL_LOG, every process of the hook): link states once per GPU and link (plus
    the probe past the last one), the error counters of links 0-11 in one field-values call per GPU
    and only links 12-17 per link, each GPU's handle, minor and UUID asked once."""
    node = BenchNode.create("dgx-h100")
    try:
        log = tmp_path / "nvml-calls"
        env = dict(
            node.hook_env("prolog", 4242),
            FAKE_NVML_CALL_LOG=str(log),
            PATH=os.environ.get("PATH", "/usr/bin:/bin"),
            PYTHONPATH=REPO,
        )
        done = subprocess.run(
            [sys.executable, "-m", "slurm_hooks", "prolog"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert "status=OK" in node.decision_lines()[-1]
    finally:
        node.cleanup()
    calls = collections.Counter(log.read_text().split())
    assert calls["nvmlDeviceGetNvLinkErrorCounter"] == 8 * 6 * 5
    # two threads asking the same question at the same moment both ask: a few more than once each,
    # never the unshared count (checks 8 x 18 + snapshot 8 x 19 link states; 2 or 3 per GPU below)
    assert 8 * 19 <= calls["nvmlDeviceGetNvLinkState"] < 8 * 19 + 8 * 18 // 2
    assert 8 <= calls["nvmlDeviceGetMinorNumber"] < 8 * 2
    for asked_twice_before in ("nvmlDeviceGetUUID", "nvmlDeviceGetName"):
        assert 8 <= calls[asked_twice_before] < 8 * 2 - 4, asked_twice_before
    assert sum(calls.values()) < 1000, calls.most_common(10)
    # NVML's CPU affinity is only shown beside sysfs's in a report's details, which no one reads in
    # a hook; the real driver took ~11 ms a GPU for it (tests/captures/device/h200-vm)
    assert calls["nvmlDeviceGetCpuAffinity"] == 0, calls["nvmlDeviceGetCpuAffinity"]


def test_an_answer_that_comes_back_after_its_run_is_not_kept_for_the_next(monkeypatch):
    """A check thread whose NVML call hangs past the run (its deadline passed, the run went on and
    ended) gets its answer late: it must land in its own run's memory, not in the next run's (a
    reading from before as the new run's), and must not fail because the run's memory is gone."""
    import threading

    released = threading.Event()
    asked = collections.Counter()

    def slow_call(self, function, *args, **kwargs):
        asked[function] += 1
        if asked[function] == 1:
            released.wait(10)
            return "late answer"
        return "fresh answer"

    monkeypatch.setattr(nvml.NvmlSession, "_call", slow_call)
    session = nvml.NvmlSession("late-answer-library")
    outcome = {}

    def check_thread():
        try:
            outcome["value"] = session.call("nvmlDeviceGetPersistenceMode", 3)
        except Exception as exc:  # what the thread would die with
            outcome["error"] = exc

    with nvml.share_within_run():
        hung = threading.Thread(target=check_thread, daemon=True)
        hung.start()
        while not asked["nvmlDeviceGetPersistenceMode"]:
            released.wait(0.001)
    with nvml.share_within_run():  # the next run in this process
        released.set()
        hung.join(10)
        assert outcome == {"value": "late answer"}, outcome
        assert session.call("nvmlDeviceGetPersistenceMode", 3) == "fresh answer"
    assert asked["nvmlDeviceGetPersistenceMode"] == 2
