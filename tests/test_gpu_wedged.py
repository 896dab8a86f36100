"""A GPU whose NVML identification hangs (nvmlDeviceGetHandleByIndex, GetPciInfo, GetMinorNumber, GetName,
GetUUID): the others are still judged, and the hung GPU itself is judged by the rule of
slurm_hooks/checks/gpu/wedged.py (docs/gpu.md, "A GPU that hangs").

Before: gpu.inventory identified the GPUs one after the other in one thread, so one hung GPU held every GPU
check until its 3 s timeout: all UNKNOWN, and a pending row remap on the job's own GPU only alerted.

The checks run in a forked child, as the hooks run them (core/isolation.run_isolated): a thread blocked
in the fake library's hang can only be abandoned, and it dies with that child, not in pytest.
[nvml] identify_timeout is 0.3 s here, so no test waits out the default 1 s.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from slurm_hooks.checks.gpu import wedged
from slurm_hooks.result import Action, Blame, Status
from tests.helpers import fake_node_config

IDENTIFY_S = 0.3
IDENTIFY_CALLS = [
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
]
GPU_CHECKS = [
    "gpu.count",
    "gpu.ecc",
    "gpu.remap",
    "gpu.recovery",
    "gpu.clocks",
    "gpu.thermal",
    "gpu.driver",
    "gpu.leftovers",
]


@pytest.fixture
def run_gpu_checks(registry, tmp_path):
    """run_gpu_checks(node, job_gpus) -> (results by check, decision, seconds): the GPU checks of a prolog
    in a forked child, with the node's state directory under tmp_path (kept between calls)."""
    from slurm_hooks.core.config import validate
    from slurm_hooks.core.isolation import run_isolated
    from slurm_hooks.core.report_format import report_from_dict, report_to_dict
    from slurm_hooks.core.runner import JobContext, run_checks, select_checks
    from slurm_hooks.hw.host import Host
    from slurm_hooks.slurm import policy

    config = validate(
        registry,
        fake_node_config(
            {
                "general": {"mode": "enforce"},
                "nvml": {"identify_timeout": IDENTIFY_S},
                "paths": {"state_dir": str(tmp_path / "state")},
            }
        ),
    )

    def run(node, job_gpus=(0, 1), identify_s=None):
        chosen = config
        if identify_s is not None:
            chosen = validate(
                registry,
                fake_node_config(
                    {
                        "general": {"mode": "enforce"},
                        "nvml": {"identify_timeout": identify_s},
                        "paths": {"state_dir": str(tmp_path / "state")},
                    }
                ),
            )
        job = JobContext(job_id="4242", user="alice", node_name="node1", gpus=tuple(job_gpus))
        specs = select_checks(registry, "prolog", GPU_CHECKS)
        started = time.monotonic()
        data, why = run_isolated(
            lambda: report_to_dict(
                run_checks(registry, chosen, Host(str(node.root)), "prolog", specs, job=job)
            ),
            10.0,
        )
        seconds = time.monotonic() - started
        assert data is not None, why
        report = report_from_dict(data)
        by_check = {run.name: run.results for run in report.runs}
        return by_check, policy.decide(report.results(), chosen.settings), seconds

    run.state_file = tmp_path / "state" / wedged.HISTORY_FILE
    return run


def by_gpu(results):
    return {(r.component or "").split(" ")[0]: r for r in results}


@pytest.mark.parametrize("call", IDENTIFY_CALLS)
def test_a_gpu_hung_in_identification_leaves_the_others_judged(nvml_node, run_gpu_checks, call):
    """GPU 3 hangs in one identification call; GPU 1, the job's, has a pending row remap: it FAILs and the
    node drains, as it would without the wedged sibling, and the run takes the identification bound."""
    from slurm_hooks.slurm.policy import Verdict

    node = nvml_node("dgx-h100", {"gpu": {1: {"remapped_rows": {"pending": True}}}})
    node.inject_hang(call, 3)
    results, decision, seconds = run_gpu_checks(node)
    print("\n[wedged] GPU 3 hung in %s: checks took %.2fs" % (call, seconds))
    remap = by_gpu(results["gpu.remap"])
    assert (remap["gpu:1"].status, remap["gpu:1"].action) == (Status.FAIL, Action.RESET_GPU)
    for name in ("gpu.ecc", "gpu.recovery", "gpu.clocks", "gpu.leftovers"):
        assert [r.status for r in results[name]] == [Status.OK], results[name]
        assert "timed_out" not in results[name][0].details
    hung = [r for r in results["gpu.count"] if r.status is not Status.OK]
    assert [(r.status, r.blame, r.component.split(" ")[0]) for r in hung] == [
        (Status.UNKNOWN, Blame.NODE, "gpu:3")
    ]
    assert hung[0].details["call"] == call and hung[0].details["timed_out"], hung[0].details
    if (
        call != "nvmlDeviceGetHandleByIndex"
    ):  # the bus id is known, or found in sysfs as the one left
        assert hung[0].component.split(" ")[1] == node.spec["gpu"][3]["pci"].lower()
    assert decision.verdict is Verdict.DRAIN and decision.findings[0].check == "gpu.remap"
    assert seconds < IDENTIFY_S + 2.5, seconds


@pytest.mark.slow  # waits out the longest identification and a reading's budget
def test_a_wedged_gpu_and_a_hung_reading_on_another_fit_in_the_check_timeout(
    nvml_node, run_gpu_checks
):
    """GPU 3 hangs in identification for the longest [nvml] identify_timeout (1.5 s) and GPU 1 in
    nvmlDeviceGetTemperature: the readings get what is left of their 2 s budget, so gpu.thermal still
    names GPU 1 and passes GPU 0 within its 3 s timeout instead of timing out as a whole."""
    node = nvml_node("dgx-h100")
    node.inject_hang("nvmlDeviceGetPciInfo", 3)
    node.inject_hang("nvmlDeviceGetTemperature", 1)
    results, _, _ = run_gpu_checks(node, (0, 1), identify_s=1.5)
    thermal = by_gpu(results["gpu.thermal"])
    assert set(thermal) == {"gpu:1"}, results["gpu.thermal"]
    assert "did not answer within" in thermal["gpu:1"].summary
    # gpu.count waits longest (identification, its extra wait, the memory): still inside its 3 s
    assert [r.component.split(" ")[0] for r in results["gpu.count"]] == ["gpu:3"], results[
        "gpu.count"
    ]


def test_the_job_owns_the_hung_gpu(nvml_node, run_gpu_checks):
    """Job GPUs 2,3 and GPU 3 hangs before NVML says its minor number: Slurm's index 3 is unanswered,
    not "missing" (that would be a reboot on the first hang); GPU 2 is judged."""
    node = nvml_node("dgx-h100", {"gpu": {2: {"ecc": {"volatile": {"uncorrected": {"dram": 1}}}}}})
    node.inject_hang("nvmlDeviceGetPciInfo", 3)
    results, decision, _ = run_gpu_checks(node, (2, 3))
    assert [(r.status, r.component.split(" ")[0]) for r in results["gpu.ecc"]] == [
        (Status.FAIL, "gpu:2")
    ]
    count = results["gpu.count"]
    assert [(r.status, r.component.split(" ")[0]) for r in count] == [(Status.UNKNOWN, "gpu:3")]
    assert "Slurm allocated" not in " ".join(r.summary for r in count)


def test_two_runs_in_a_row_fail_and_an_answer_clears_it(nvml_node, run_gpu_checks):
    """The rule: UNKNOWN the first time, FAIL reboot (blame node) the second time in a row; a run in which
    the GPU answers forgets it, so the next hang is a first one again. GPU 3 is not the job's (0,1): a
    wedged GPU needs a reboot, which takes the whole node, so it drains the node."""
    from slurm_hooks.slurm.policy import Verdict

    node = nvml_node("dgx-h100")
    node.inject_hang("nvmlDeviceGetUUID", 3)
    first, decision, _ = run_gpu_checks(node)
    assert [(r.status, r.blame) for r in first["gpu.count"]] == [(Status.UNKNOWN, Blame.NODE)]
    assert first["gpu.count"][0].details["runs"] == 1
    assert decision.verdict is Verdict.ALERT
    saved = json.loads(run_gpu_checks.state_file.read_text())
    assert saved["schema"] == wedged.SCHEMA and list(saved["gpus"]) == ["3"], saved
    assert saved["gpus"]["3"]["call"] == "nvmlDeviceGetUUID"

    second, decision, _ = run_gpu_checks(node)
    [result] = second["gpu.count"]
    assert (result.status, result.action, result.blame) == (Status.FAIL, Action.REBOOT, Blame.NODE)
    assert "in 2 consecutive runs" in result.summary and result.details["runs"] == 2
    assert decision.verdict is Verdict.DRAIN and decision.reason.endswith("-> reboot")
    for name in ("gpu.ecc", "gpu.remap"):
        assert [r.status for r in second[name]] == [Status.OK]

    node.clear_faults()
    third, decision, _ = run_gpu_checks(node)
    assert [r.status for r in third["gpu.count"]] == [Status.OK]
    assert json.loads(run_gpu_checks.state_file.read_text())["gpus"] == {}
    node.inject_hang("nvmlDeviceGetUUID", 3)
    fourth, _, _ = run_gpu_checks(node)
    assert [(r.status, r.details["runs"]) for r in fourth["gpu.count"]] == [(Status.UNKNOWN, 1)]


@pytest.mark.parametrize("hung", [list(range(8)), [0, 2, 3, 5, 7]], ids=["all", "5-of-8"])
def test_most_gpus_hung_is_the_driver_and_never_drains(nvml_node, run_gpu_checks, hung):
    """Every GPU (or most) hanging is the driver as a whole: no evidence against one GPU. UNKNOWN (blame
    check) in every run, however many, and nothing is remembered against a GPU."""
    from slurm_hooks.slurm.policy import Verdict

    node = nvml_node("dgx-h100")
    for index in hung:
        node.inject_hang("nvmlDeviceGetHandleByIndex", index)
    for _ in range(3):
        results, decision, seconds = run_gpu_checks(node)
        [count] = results["gpu.count"]
        assert (count.status, count.blame) == (Status.UNKNOWN, Blame.CHECK), count
        assert "driver as a whole" in count.summary and count.details["hung"] == hung
        assert decision.verdict is Verdict.ALERT
        assert seconds < IDENTIFY_S + 2.5, seconds
    assert not run_gpu_checks.state_file.exists()


def test_a_hung_state_directory_makes_a_hang_a_first_one(nvml_node, run_gpu_checks, tmp_path):
    """The memory cannot be read (the state directory's file system stops answering, a FUSE mount
    that never replies): the hang counts as a first one, UNKNOWN, with the reason - never a FAIL
    without the earlier run on record."""
    from tests.doubles.hungfs import HungFileSystem, require_fuse

    require_fuse(tmp_path)
    node = nvml_node("dgx-h100")
    node.inject_hang("nvmlDeviceGetName", 3)
    run_gpu_checks(node)
    assert (
        run_gpu_checks.state_file.exists()
    )  # the first hang is on record, then the mount hides it
    with HungFileSystem(str(run_gpu_checks.state_file.parent)):
        results, _, seconds = run_gpu_checks(node)
    [count] = results["gpu.count"]
    assert (count.status, count.details.get("runs")) == (Status.UNKNOWN, 1), count
    assert "did not answer within" in count.details.get("memory", ""), (
        dict(count.details),
        count.summary,
    )
    assert seconds < IDENTIFY_S + wedged.HISTORY_WAIT_S + 2.5


def test_a_memory_someone_else_could_write_is_not_believed(nvml_node, run_gpu_checks):
    """A FIFO where the file should be (once a hang: open() never returned), a file of another
    owner, one others may write, a symbolic link: none is read as the memory (a planted second
    'hung run' would fail a GPU on its first hang). The hang counts as a first one, without waiting."""
    node = nvml_node("dgx-h100")
    node.inject_hang("nvmlDeviceGetName", 3)
    run_gpu_checks(node)
    memory = run_gpu_checks.state_file
    planted = (
        memory.read_bytes()
    )  # a true record of one hung run: believed, it would make this a second
    elsewhere = memory.parent / "elsewhere.json"
    elsewhere.write_bytes(planted)
    elsewhere.chmod(0o600)

    def fifo():
        os.mkfifo(str(memory))

    def other_owner():
        memory.write_bytes(planted)
        os.chown(str(memory), 4242, 4242)

    def others_write():
        memory.write_bytes(planted)
        memory.chmod(0o666)

    def symlink():
        memory.symlink_to(elsewhere)

    for plant, why in (
        (fifo, "not a regular file"),
        (other_owner, "owned by uid 4242"),
        (others_write, "lets others write it"),
        (symlink, "a symbolic link"),
    ):
        memory.unlink()
        plant()
        results, _, seconds = run_gpu_checks(node)
        [count] = results["gpu.count"]
        assert (count.status, count.details.get("runs")) == (Status.UNKNOWN, 1), (why, count)
        assert why in count.details.get("memory", ""), (why, dict(count.details))
        assert seconds < IDENTIFY_S + 2.5, (why, seconds)


# -- the memory's rule, on its own -----------------------------------------------------------------


def observe(old, hung, started, now, count=8, answered=None):
    if answered is None:
        answered = [i for i in range(count) if i not in hung]
    return wedged.update_history(old, hung, answered, count, started, now)


def test_history_counts_consecutive_runs_only():
    new, runs, note = observe(None, {3: ""}, 100.0, 101.0)
    assert (runs, note) == ({3: 1}, "")
    new, runs, _ = observe(new, {3: "0000:5d:00.0"}, 200.0, 201.0)
    assert runs == {3: 2} and new["gpus"]["3"]["first"] == 101.0
    assert new["gpus"]["3"]["bus_id"] == "0000:5d:00.0"
    cleared, runs, _ = observe(new, {}, 300.0, 301.0)
    assert (cleared["gpus"], runs) == ({}, {})


def test_a_gpu_not_asked_keeps_its_entry():
    new, _, _ = observe(None, {3: ""}, 100.0, 101.0)
    kept, runs, _ = observe(new, {}, 200.0, 201.0, answered=[0, 1, 2, 4, 5, 6, 7])
    assert runs == {} and kept["gpus"] == new["gpus"]
    _, runs, _ = observe(kept, {3: ""}, 300.0, 301.0)
    assert runs == {3: 2}


def test_a_run_overlapping_the_one_that_recorded_the_hang_is_not_a_second_run():
    """Two prologs of one node starting together both see GPU 3 hang: one observation, not two."""
    new, _, _ = observe(None, {3: ""}, 100.0, 101.0)
    again, runs, _ = observe(new, {3: ""}, 100.5, 101.5)  # began before the first one recorded
    assert runs == {3: 1} and again["gpus"]["3"]["first"] == 101.0
    _, runs, _ = observe(again, {3: ""}, 102.0, 103.0)
    assert runs == {3: 2}


@pytest.mark.parametrize(
    "change",
    [
        {"count": 7},  # a GPU fell off: indices moved
        {"bus_id": "0000:9a:00.0"},  # another GPU at this index
        {"seen": 10_000.0},  # recorded "in the future": a clock that ran ahead
        {"runs": True},
        {"runs": "2"},
        {"runs": 0},
        {"first": None},
        {"first": float("-inf")},
        {"seen": float("nan")},
    ],
)
def test_an_entry_that_cannot_be_believed_starts_again(change):
    old = {
        "schema": wedged.SCHEMA,
        "gpus": {
            "3": dict(
                {"runs": 1, "first": 100.0, "seen": 100.0, "count": 8, "bus_id": "0000:5d:00.0"},
                **change,
            )
        },
    }
    _, runs, _ = observe(old, {3: "0000:5d:00.0"}, 200.0, 201.0)
    assert runs == {3: 1}


@pytest.mark.parametrize("old", [[1, 2], {"schema": "other/1", "gpus": {}}, "x"])
def test_a_file_of_another_shape_starts_again_and_says_so(old):
    new, runs, note = observe(old, {3: ""}, 200.0, 201.0)
    assert runs == {3: 1} and "not ours" in note and new["schema"] == wedged.SCHEMA


def test_the_memory_is_bounded():
    new, runs, _ = observe(None, {i: "" for i in range(500)}, 1.0, 2.0, count=1000)
    assert len(new["gpus"]) == wedged.MAX_ENTRIES == len(runs)


def test_driver_wide_means_more_than_half():
    assert [wedged.driver_wide(h, 8) for h in (0, 1, 4, 5, 8)] == [False, False, False, True, True]
    assert wedged.driver_wide(1, 1) and not wedged.driver_wide(1, 2)


def test_without_persistence_mode_a_slow_gpu_is_never_failed(nvml_node, run_gpu_checks):
    """Persistence mode off: nvmlDeviceGetHandleByIndex initialises an idle GPU (nvml.h), which can take
    seconds, while GPUs in use answer at once. Two runs in a row must not FAIL (and drain) such a GPU:
    UNKNOWN with the advice, and nothing remembered."""
    from slurm_hooks.slurm.policy import Verdict

    node = nvml_node("dgx-h100", {"gpu_defaults": {"persistence_mode": False}})
    node.inject_hang("nvmlDeviceGetHandleByIndex", 3)
    for _ in range(2):
        results, decision, _ = run_gpu_checks(node)
        [count] = results["gpu.count"]
        assert count.status is Status.UNKNOWN and "persistence mode" in count.summary, count
        assert decision.verdict is Verdict.ALERT
    assert not run_gpu_checks.state_file.exists()


def test_a_driver_counting_billions_of_gpus_gets_no_thread_each():
    """nvmlDeviceGetCount is the driver's word; a broken one saying 4 billion must not start 4 billion
    threads: only the first MAX_IDENTIFIED are identified, the rest are errors."""
    from slurm_hooks.checks.gpu.devices import MAX_IDENTIFIED, identify_all
    from slurm_hooks.hw import nvml

    class Session:
        def call(self, function, *args):
            raise nvml.NvmlError(nvml.GPU_IS_LOST, function)

    found = identify_all(Session(), 2**32 - 1, 0.5)
    assert len(found) == MAX_IDENTIFIED + 1
    assert all(error.code == nvml.GPU_IS_LOST for _, _, error, _ in found[:MAX_IDENTIFIED])
    assert found[-1][2].code == nvml.UNKNOWN_ERROR and "4294967295 GPUs" in str(found[-1][2])


def test_a_gpu_whose_persistence_mode_cannot_be_read_is_still_identified(nvml_node, run_gpu_checks):
    """The persistence mode is read after identification: its failure does not make the GPU unreadable."""
    node = nvml_node("dgx-h100")
    node.inject_fault("nvmlDeviceGetPersistenceMode", 2, 3)  # NOT_SUPPORTED
    results, _, _ = run_gpu_checks(node)
    assert [r.status for r in results["gpu.count"]] == [Status.OK], results["gpu.count"]


def test_a_gpu_hung_reading_its_vbios_leaves_the_state_checks_judged(nvml_node, run_gpu_checks):
    """gpu.driver compares the VBIOS of every GPU of the node; it read them one after the other with no
    bound, so a GPU hanging in nvmlDeviceGetVbiosVersion made gpu.driver, gpu.clocks and gpu.thermal
    time out as a whole. Now that GPU is left out of the comparison and the checks are judged."""
    node = nvml_node("dgx-h100", {"gpu": {0: {"clocks_event_reasons": 0x8}}})  # HW slowdown
    node.inject_hang("nvmlDeviceGetVbiosVersion", 6)
    results, _, seconds = run_gpu_checks(node)
    clocks = by_gpu(results["gpu.clocks"])
    assert clocks["gpu:0"].status is Status.FAIL, results["gpu.clocks"]
    assert [r.status for r in results["gpu.thermal"]] == [Status.OK]
    assert seconds < 2.5, seconds


def test_a_gpu_that_answers_a_little_late_is_slow_not_hung(nvml_node, run_gpu_checks):
    """GPU 3 answers nvmlDeviceGetPciInfo after 1.6 s (a busy driver) with identify_timeout 1 s: the other
    checks go on without it, and gpu.count waits 0.75 s more for it alone: it answered, so it is slow,
    not hung - UNKNOWN blame check, however often, and nothing remembered against it."""
    from slurm_hooks.slurm.policy import Verdict

    node = nvml_node("dgx-h100")
    node.inject_delay("nvmlDeviceGetPciInfo", 3, 1600)
    for _ in range(2):
        results, decision, _ = run_gpu_checks(node, identify_s=1.0)
        [count] = results["gpu.count"]
        assert (count.status, count.blame) == (Status.UNKNOWN, Blame.CHECK), count
        assert "a slow driver, not a hung GPU" in count.summary and count.details["slow"] == [3]
        assert decision.verdict is Verdict.ALERT
    assert not run_gpu_checks.state_file.exists()


def test_answered_late_tells_a_late_answer_from_a_hang():
    import threading

    from slurm_hooks.checks.gpu.devices import HungGpu
    from slurm_hooks.checks.gpu.inventory import GpuInventory

    release = threading.Event()
    late = threading.Thread(target=release.wait, args=(0.2,), daemon=True)
    stuck = threading.Thread(target=release.wait, args=(30,), daemon=True)
    late.start()
    stuck.start()
    inventory = GpuInventory(
        count=8,
        hung=(HungGpu(3, "nvmlDeviceGetPciInfo"), HungGpu(5, "nvmlDeviceGetUUID")),
        pending={3: late, 5: stuck},
    )
    started = time.monotonic()
    assert wedged.answered_late(inventory, 1.0) == (3,)
    assert time.monotonic() - started < 1.5
    assert wedged.answered_late(inventory, 0.0) == (3,)  # GPU 5 is still not answering
    release.set()
