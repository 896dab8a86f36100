"""`slurm-hooks report --stragglers`: the streaming scan over a records directory, and its outputs.

Records are written in the epilog's layout (records.encode_record: the header line first) under
DIR/<node>/<job>.json with the file's mtime at the job's end; the figures are bench/fleet_synth.py's
noise model, or set by hand where a test needs one exact value.
"""

from __future__ import annotations

import json
import os
import random

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench import fleet_synth
from slurm_hooks.cli.main import main
from slurm_hooks.records import straggler_scan as fleet
from slurm_hooks.result import ExitCode
from tests.helpers import default_settings
from tests.straggler_records import (
    HW,
    KEY,
    NOW,
    healthy,
    settings,
    write,
    write_jobs,
    write_key,
)


def test_a_node_slow_in_every_job_is_the_one_suspect(tmp_path):
    write_jobs(str(tmp_path), jobs=12)
    result = fleet.scan([str(tmp_path)], settings(), now=NOW)
    assert (result.records, result.jobs_scored, result.node_jobs) == (72, 12, 72)
    (suspect,) = result.suspects()
    assert (suspect.node, suspect.metric, suspect.flagged, suspect.window, suspect.users) == (
        "n03",
        HW,
        10,
        10,
        3,
    )
    last_mark, last_flag = suspect.evidence[-1]
    assert (
        last_mark.job == "111"
        and last_mark.nodes == 6
        and (last_flag.value, last_flag.median) == (0.2, 0.0)
    )
    assert result.max_open_jobs <= 2  # streamed: jobs an hour apart are closed as the scan moves on


def test_each_run_of_a_requeued_job_is_scored_as_a_job_of_its_own(tmp_path):
    """Slurm reruns a requeued job under the same id (SLURM_JOB_RESTART_COUNT=1 on the rerun): both
    runs' records used to fall into one job, the rerun's replacing the first's node by node."""
    names = ["n%02d" % i for i in range(6)]
    for restart, end in ((0, NOW - 3000), (1, NOW - 2400)):  # within SETTLE_S of each other
        for node in names:
            perf = dict(healthy(random.Random(node)), **{HW: 0.2 if node == "n03" else 0.0})
            write(str(tmp_path), node, 4242, perf, end, start=end - 600, restart=restart)
    result = fleet.scan([str(tmp_path)], settings(), now=NOW)
    assert (result.records, result.jobs_scored, result.node_jobs) == (12, 2, 12)
    marks = result.windows["n03"].marks
    assert sorted(mark.job for mark in marks) == ["4242", "4242.r1"]


def test_jobs_are_closed_as_the_scan_moves_on_so_memory_follows_open_jobs(tmp_path):
    # 150 jobs over 2.5 days (~2,000 node-jobs, 48 to 74 per node: each node's window of 10 fills
    # several times over); the synthetic fleet below has the size the detection needs
    plan = fleet_synth.make_plan(32, seed=3)
    fleet_synth.write_fleet(str(tmp_path), plan, 150, seed=4, now=NOW, span_days=2.5)
    result = fleet.scan([str(tmp_path)], settings(), now=NOW)
    assert result.jobs_scored == 150 and result.node_jobs > 32 * 10 * 4
    assert result.max_open_jobs <= 3  # a job every 24 minutes; SETTLE_S is 15 minutes
    assert sum(len(w.marks) for w in result.windows.values()) <= 32 * 10


def test_two_of_ten_is_noise_three_of_ten_is_a_suspect(tmp_path):
    write_jobs(str(tmp_path / "a"), jobs=10, slow_every=5)  # jobs 0 and 5
    assert fleet.scan([str(tmp_path / "a")], settings(), now=NOW).suspects() == []
    write_jobs(str(tmp_path / "b"), jobs=10, slow_every=4)  # jobs 0, 4 and 8
    assert [s.node for s in fleet.scan([str(tmp_path / "b")], settings(), now=NOW).suspects()] == [
        "n03"
    ]


def test_small_short_old_and_figureless_jobs_are_not_scored(tmp_path):
    d = str(tmp_path)
    rng = random.Random(2)
    for i in range(3):  # a 3-node job
        write(d, "n%02d" % i, 1, healthy(rng), NOW - 7200)
    for i in range(5):  # a 2-minute job
        write(d, "n%02d" % i, 2, healthy(rng), NOW - 3600, start=NOW - 3720)
    for i in range(5):  # older than the window
        write(d, "n%02d" % i, 3, healthy(rng), NOW - 30 * 86400)
    for i in range(5):  # no perf figures (a record of an older version, or no prolog snapshot)
        write(d, "n%02d" % i, 4, {}, NOW - 1800)
    result = fleet.scan([d], settings(), now=NOW)
    assert result.jobs_scored == 0
    assert result.skipped == {
        "job on fewer than min_job_nodes nodes": 1,
        "shorter than min_job_seconds": 5,
        "older than the window": 5,
        "no perf figures": 5,
    }


def test_records_a_user_could_plant_are_not_read(tmp_path):
    """A shared records directory: a user's own 'node' directory, a record naming another node, a
    symlink, a file of another owner in a node's directory: none of them counts."""
    d = str(tmp_path)
    write_jobs(d, jobs=4, slow=None)
    rng = random.Random(3)
    planted = []
    for j in range(4):  # would make n01 look slow in 4 jobs
        planted.append(
            write(
                d,
                "n01-evil",
                100 + j,
                dict(healthy(rng), **{HW: 0.9}),
                NOW - (4 - j) * 3600,
                record_node="n01",
            )
        )
    os.chown(os.path.join(d, "n01-evil"), 4242, 4242)
    forged = write(d, "n02", 900, healthy(rng), NOW - 600, record_node="n05")
    os.symlink(forged, os.path.join(d, "n02", "901.json"))
    other = write(d, "n02", 902, healthy(rng), NOW - 500)
    os.chown(other, 4242, 4242)
    result = fleet.scan([d], settings(), now=NOW)
    assert result.suspects() == [] and result.jobs_scored == 4
    assert result.skipped == {
        "node directory of another owner": 1,
        "names another node than its directory": 1,
        "record of another owner": 1,
    }
    # named, so an admin finds the squatter (before: only counted)
    assert result.other_owner_dirs == ["n01-evil (uid 4242)"]
    assert fleet.to_dict(result)["other_owner_dirs"] == ["n01-evil (uid 4242)"]
    assert "node names held by another owner or a symlink, not read" in fleet.render(result)


def test_what_was_not_scored_is_in_the_prometheus_file(tmp_path):
    """Red team: a scan that skipped every node directory (a wrong trusted_writers) showed only
    'records 0' to Prometheus; why is now there too."""
    d = str(tmp_path)
    write_jobs(d, jobs=3)
    os.chown(os.path.join(d, "n03"), 4242, 4242)
    result = fleet.scan([d], settings(), now=NOW)
    families = {f.name: f for f in text_string_to_metric_families(fleet.prom_text(result, NOW))}
    (sample,) = families["slurm_hooks_fleet_not_scored"].samples
    assert sample.labels == {"why": "node directory of another owner"} and sample.value == 1.0


def test_a_user_squatting_a_slow_nodes_directory_is_named(tmp_path):
    """A records directory users can write without the sticky bit: a user renames n03's directory
    away and creates their own 'n03'. The node drops out of the report; the report names why."""
    d = str(tmp_path)
    write_jobs(d, jobs=12)
    os.rename(os.path.join(d, "n03"), os.path.join(d, ".hidden"))
    os.mkdir(os.path.join(d, "n03"))
    os.chown(os.path.join(d, "n03"), 4242, 4242)
    result = fleet.scan([d], settings(), now=NOW)
    assert result.suspects() == [] and result.other_owner_dirs == ["n03 (uid 4242)"]


def test_the_default_writer_is_the_anonuid_whatever_this_hosts_passwd_calls_it(
    tmp_path, monkeypatch
):
    """EL7: 'nobody' is uid 99 and NFS root_squash writes as 65534 (nfsnobody). Before, the default
    ["nobody"] was resolved through the admin host's passwd and skipped every node directory."""
    import pwd

    d = str(tmp_path)
    write_jobs(d, jobs=12)
    for root, dirs, files in os.walk(d):
        for name in dirs + files:
            os.chown(os.path.join(root, name), 65534, 65534)
    el7 = {"nobody": 99, "nfsnobody": 65534}
    monkeypatch.setattr(
        pwd,
        "getpwnam",
        lambda name: type("pw", (), {"pw_uid": el7[name]})() if name in el7 else {}[name],
    )
    assert [s.node for s in fleet.scan([d], settings(), now=NOW).suspects()] == ["n03"]
    assert fleet.scan([d], settings(trusted_writers=["nobody"]), now=NOW).suspects() == []
    assert fleet.scan([d], settings(trusted_writers=["nfsnobody"]), now=NOW).suspects() != []


def test_a_symlink_squatting_a_node_name_is_named(tmp_path):
    d = str(tmp_path)
    write_jobs(d, jobs=12)
    os.rename(os.path.join(d, "n03"), os.path.join(d, ".hidden"))
    os.symlink(os.path.join(d, "n01"), os.path.join(d, "n03"))
    result = fleet.scan([d], settings(), now=NOW)
    assert result.suspects() == [] and result.other_owner_dirs == ["n03 (a symlink, uid 0)"]


class _Listing:
    """What os.scandir returns, over entries a test replaces (a file server failing some calls)."""

    def __init__(self, entries):
        self.entries = entries

    def __enter__(self):
        return iter(self.entries)

    def __exit__(self, *exc):
        return False


class _FailingEntry:
    """A DirEntry whose lstat fails with `error` (ESTALE, EIO), as on an NFS server that lost the
    file handle or a storage target that fails: DirEntry.is_dir and .stat both raise then."""

    def __init__(self, real, error):
        self.name, self.path, self.error = real.name, real.path, error

    def is_dir(self, follow_symlinks=True):
        raise self.error

    is_file = is_dir

    def stat(self, follow_symlinks=True):
        raise self.error


def _failing_listings(monkeypatch, failing):
    """os.scandir as the scan sees it, with failing(directory, name) -> an OSError or None."""
    real = os.scandir

    def scandir(path="."):
        if isinstance(path, int):  # a descriptor: not the scan's (the fake node's cleanup walk)
            return real(path)
        with real(path) as entries:
            return _Listing(
                [
                    _FailingEntry(e, failing(os.fspath(path), e.name))
                    if failing(os.fspath(path), e.name)
                    else e
                    for e in entries
                ]
            )

    monkeypatch.setattr(fleet.os, "scandir", scandir)


def test_a_node_directory_the_file_server_fails_is_counted_not_a_crash(tmp_path, monkeypatch):
    """Before: DirEntry.is_dir raising ESTALE for n05 stopped the whole report (a traceback, no
    prom file, no drains)."""
    d = str(tmp_path)
    write_jobs(d, jobs=12)
    stale = OSError(116, "Stale file handle")
    _failing_listings(
        monkeypatch, lambda where, name: stale if (where, name) == (d, "n05") else None
    )
    result = fleet.scan([d], settings(), now=NOW)
    assert [s.node for s in result.suspects()] == ["n03"]
    assert result.unreadable == [os.path.join(d, "n05") + ": Stale file handle"]


def test_records_the_file_server_fails_are_counted_unreadable(tmp_path, monkeypatch):
    """Before: every record of the slow node failing stat (EIO) made it vanish, counted nowhere."""
    d = str(tmp_path)
    write_jobs(d, jobs=12)
    eio = OSError(5, "Input/output error")
    broken = os.path.join(d, "n03")
    _failing_listings(monkeypatch, lambda where, name: eio if where == broken else None)
    result = fleet.scan([d], settings(), now=NOW)
    assert result.suspects() == [] and result.unreadable_count == 12


def test_a_record_whose_summary_is_not_an_object_is_unreadable_not_a_crash(tmp_path, capsys):
    """Before: '"summary": 0' in one header line (a writer's bug) raised AttributeError in the scan:
    no report, no prom file, no drains until the file was removed."""
    d = str(tmp_path)
    write_jobs(d, jobs=12)
    for number, value in enumerate(("0", '"x"', "[]", "null")):
        with open(os.path.join(d, "n01", "99%d.json" % number), "w") as handle:
            handle.write(
                '{"schema":"slurm-hooks.job-record/1","node":"n01","summary":%s,\n"gpus":[]}\n'
                % value
            )
    result = fleet.scan([d], settings(), now=NOW)
    assert [s.node for s in result.suspects()] == ["n03"] and result.unreadable_count == 4


def test_who_may_write_records_is_a_setting(tmp_path):
    """Records on root_squash NFS belong to nobody (65534); elsewhere a process running as nobody
    must not be able to plant them: [fleet] trusted_writers = []."""
    d = str(tmp_path)
    write_jobs(d, jobs=12)
    for root, dirs, files in os.walk(os.path.join(d, "n03")):
        for name in dirs + files + [""]:
            os.chown(os.path.join(root, name), 65534, 65534)
    (suspect,) = fleet.scan([d], settings(), now=NOW).suspects()  # default: ["65534"]
    assert suspect.node == "n03"
    result = fleet.scan([d], settings(trusted_writers=[]), now=NOW)
    assert result.suspects() == [] and result.other_owner_dirs == ["n03 (uid 65534)"]
    assert fleet.scan([d], settings(trusted_writers=["65534"]), now=NOW).suspects() != []
    with pytest.raises(fleet.ScanError, match=r"\[fleet\] trusted_writers: no user 'nosuchuser9'"):
        fleet.scan([d], settings(trusted_writers=["nosuchuser9"]), now=NOW)


def test_a_node_directory_that_cannot_be_listed_is_counted_unreadable(tmp_path, monkeypatch):
    """os.scandir raising EIO for one node directory stands in for a file server that fails it
    (tests run as root, which permissions cannot stop). Before: silently no records, no count."""
    d = str(tmp_path)
    write_jobs(d, jobs=12)
    real_scandir, broken = os.scandir, os.path.join(d, "n03")

    def scandir(path="."):
        if not isinstance(path, int) and os.fspath(path) == broken:
            raise OSError(5, "Input/output error")
        return real_scandir(path)

    monkeypatch.setattr(fleet.os, "scandir", scandir)
    result = fleet.scan([d], settings(), now=NOW)
    assert result.unreadable_count == 1
    assert result.unreadable == [broken + ": cannot list: Input/output error"]


BOOT_A, BOOT_B = "0b6c5d2e-6b1f-4d0a-9d65-3c2f9b1e7a10", "9f3e1c77-20d4-4c8e-b1a2-5e7d6f804b22"


def test_a_repair_sets_the_evidence_from_before_the_reboot_aside(tmp_path):
    """An admin swaps n03's GPU (a reboot) after job 7 of 12, and the node runs clean after it.
    Before the fix its 8 slow jobs of the earlier boot kept it a suspect, so [fleet] drain took
    down the repaired node."""
    d = str(tmp_path / "repaired")
    write_jobs(
        d, jobs=12, slow_in=lambda j: j < 8, boot_of=lambda node, j: BOOT_B if j >= 8 else BOOT_A
    )
    result = fleet.scan([d], settings(), now=NOW)
    assert result.suspects() == []
    # set aside at the third clean job (k = 3): the 7 flags then in its window of 10
    assert result.windows["n03"].before_reboot == 7 and result.before_reboot() == 7
    assert fleet.to_dict(result)["before_reboot"] == 7
    assert "7 flag(s) set aside: their node rebooted and then ran clean" in fleet.render(result)


def test_a_fault_that_survives_the_reboot_keeps_its_evidence(tmp_path):
    """The reboot did not fix n03: its first job after it is flagged again, so the flags from
    before it still count and it is a suspect at once (not k jobs later)."""

    def boots(node, j):
        return BOOT_B if (node == "n03" and j >= 8) else BOOT_A

    write_jobs(str(tmp_path / "one"), jobs=9, boot_of=boots)
    (suspect,) = fleet.scan([str(tmp_path / "one")], settings(), now=NOW).suspects()
    assert (suspect.node, suspect.flagged, suspect.window) == ("n03", 9, 9)


def test_a_slow_node_that_reboots_after_every_job_is_still_found(tmp_path):
    """Red team: with a window that started again at each reboot, a node rebooting more often than
    every k jobs (a flaky GPU, a site that reboots between jobs) could never be a suspect."""
    boots = ["%08d-0000-4000-8000-000000000000" % j for j in range(30)]
    write_jobs(
        str(tmp_path), jobs=30, boot_of=lambda node, j: boots[j] if node == "n03" else BOOT_A
    )
    result = fleet.scan([str(tmp_path)], settings(), now=NOW)
    (suspect,) = result.suspects()
    assert (suspect.node, suspect.flagged, suspect.window) == ("n03", 10, 10)
    assert result.before_reboot() == 0


def test_an_intermittent_node_that_reboots_often_keeps_its_evidence(tmp_path):
    """Red team, round 2: n03 is slow in every job but the first after each reboot, and reboots
    every 3 jobs. With one clean job enough to set the old flags aside it was never a suspect; now
    it takes k (3) clean jobs in a row."""
    boots = ["%08d-0000-4000-8000-000000000000" % (j // 3) for j in range(30)]
    write_jobs(
        str(tmp_path),
        jobs=30,
        boot_of=lambda node, j: boots[j] if node == "n03" else BOOT_A,
        slow_in=lambda j: j % 3 != 0,
    )
    (suspect,) = fleet.scan([str(tmp_path)], settings(), now=NOW).suspects()
    assert (suspect.node, suspect.flagged, suspect.window, suspect.after_reboot) == (
        "n03",
        7,
        10,
        2,
    )


def test_a_repaired_node_is_not_drained_again_on_its_evidence_from_before(tmp_path):
    """Red team, round 2: n03 slow in jobs 0-7 (boot A); repaired, rebooted (boot B), resumed;
    since then one CPU-only job (no GPU figures), so its GPU figures stay on probation and the 8
    old flags still count in the report. Before, the drain took the node down again at once; now
    it waits until a job after the reboot flags it again."""
    from slurm_hooks.slurm import straggler_drain as fleet_drain

    d = str(tmp_path / "jobs")
    write_jobs(d, jobs=8)
    for i in range(6):
        perf = {"foreign_cpu_frac": 0.001, "cpu_steal_frac": 0.0}
        boot = BOOT_B if i == 3 else BOOT_A
        write(d, "n%02d" % i, 900, perf, NOW - 60, user="u9", boot=boot)
    (suspect,) = fleet.scan([d], settings(), now=NOW).suspects()
    assert (suspect.node, suspect.flagged, suspect.after_reboot) == ("n03", 8, 0)
    (row,) = fleet_drain.enact(drain_settings(tmp_path), [suspect], client=ListOnlySlurm())
    assert (row.node, row.outcome) == ("n03", "waiting-after-reboot")


def test_a_late_record_from_before_the_reboot_does_not_count_or_reset(tmp_path):
    d = str(tmp_path)
    write_jobs(d, jobs=6, boot_of=lambda node, j: BOOT_B if j >= 2 else BOOT_A)
    # a record of the old boot whose file turns up last (copied back from a node's local disk)
    write(d, "n03", 99, dict(healthy(random.Random(5)), **{HW: 0.0}), NOW - 100, boot=BOOT_A)
    for i in (0, 1, 2, 4, 5):
        write(d, "n%02d" % i, 99, healthy(random.Random(i)), NOW - 100, boot=BOOT_B)
    result = fleet.scan([d], settings(), now=NOW)
    window = result.windows["n03"]
    assert (window.boot, window.stale, result.stale_boot()) == (BOOT_B, 1, 1)
    assert [s.flagged for s in result.suspects()] == [6]  # the clean late record changed nothing


def test_a_record_of_an_unseen_older_boot_does_not_reset_the_current_one(tmp_path):
    """Red team: a job of n03's previous boot (ended 13 h ago) whose files land among the current
    boot's (a restore, cp without -p), the rest of that boot already out of the window. Before, the
    unseen boot was taken for a new one: n03's current evidence was set aside and every later
    record of its current boot dropped, until its next reboot."""
    d = str(tmp_path)
    write_jobs(d, jobs=12, boot_of=lambda node, j: BOOT_B)
    for i in range(6):
        write(
            d,
            "n%02d" % i,
            50,
            healthy(random.Random(i)),
            NOW - 13 * 3600,
            boot=BOOT_A if i == 3 else BOOT_B,
            mtime=NOW - 10.5 * 3600 + i,
        )
    result = fleet.scan([d], settings(), now=NOW)
    (suspect,) = result.suspects()
    assert (suspect.node, suspect.flagged, suspect.window) == ("n03", 10, 10)
    assert result.windows["n03"].stale == 1 and result.before_reboot() == 0


def test_records_without_a_boot_id_never_start_a_probation(tmp_path):
    """Records of a version before boot_id sit beside new ones in a node's window."""
    d = str(tmp_path)
    write_jobs(d, jobs=12, boot_of=lambda node, j: None if j < 6 else BOOT_A)
    (suspect,) = fleet.scan([d], settings(), now=NOW).suspects()
    assert (suspect.node, suspect.flagged) == ("n03", 10)


def test_jobs_that_say_nothing_about_a_figure_do_not_push_its_evidence_out(tmp_path):
    """Three GPU jobs with n03 in HW slowdown, then ten CPU-only multi-node jobs (no GPU figures in
    their records). Before: the window was the last m jobs of any kind, the three flagged jobs fell
    out of it and n03 was no longer a suspect."""
    d = str(tmp_path)
    write_jobs(d, jobs=3)
    rng = random.Random(4)
    for j in range(10):
        end = NOW - 3600 + j * 60 + 1  # after the GPU jobs
        for i in range(6):
            perf = {"foreign_cpu_frac": 0.001, "cpu_steal_frac": 0.0}
            write(d, "n%02d" % i, 500 + j, perf, end + rng.uniform(0, 5), user="u%d" % (j % 3))
    result = fleet.scan([d], settings(), now=NOW)
    (suspect,) = result.suspects()
    assert (suspect.node, suspect.metric, suspect.flagged, suspect.window) == ("n03", HW, 3, 3)
    assert len(result.windows["n03"].marks) == 10  # the last 10 jobs of any kind: all CPU-only


def test_a_sick_node_is_not_put_in_a_hardware_class_of_its_own():
    """Red team: the class came from the GPUs the epilog could read, so a node whose GPU fell off
    the bus read 'x7' and one whose GPUs all hung had no name: alone in its class, such a node was
    scored on nothing, IB and CPU figures included."""
    from slurm_hooks.records.perf import hardware_class

    name = "NVIDIA H100 80GB HBM3"
    job = {"id": "1", "user": "u", "gpus": list(range(8))}
    assert hardware_class({"job": job, "gpus": [{"name": name}] * 8}) == name + " x8"
    assert hardware_class({"job": job, "gpus": [{"name": name}] * 7}) == name + " x8"  # lost one
    hung = [{"index": i, "unavailable": {"device": "did not answer"}} for i in range(8)]
    assert hardware_class({"job": job, "gpus": hung}) is None  # unknown, not a class of its own
    assert hardware_class({"job": dict(job, gpus=[]), "gpus": []}) is None  # no GPUs
    assert (
        hardware_class({"job": dict(job, gpus=None), "gpus": [{"name": name}] * 4}) == name + " x4"
    )


def test_a_node_of_unknown_hardware_is_compared_with_the_most_nodes_of_its_job(tmp_path):
    """n03 has a bad IB port (20x the stalls) and no hardware class in its records (NVML hung at
    the epilog, or a record of an older version): it is scored with the job's largest class."""
    d = str(tmp_path)
    for j in range(12):
        end = NOW - (12 - j) * 3600
        for i in range(8):
            perf = healthy(random.Random(j * 10 + i))
            hw = H100 if i < 5 else A100
            if i == 3:
                perf["ib_xmit_wait_per_s"], hw = 2e6, None
            write(d, "n%02d" % i, 100 + j, perf, end, user="u%d" % (j % 3), hw=hw)
    result = fleet.scan([d], settings(), now=NOW)
    assert [(s.node, s.metric) for s in result.suspects()] == [("n03", "ib_xmit_wait_per_s")]
    assert result.windows["n03"].marks[-1].nodes == 5  # n00-n04: four H100 nodes and itself


@pytest.mark.parametrize("bad", ["absent", float("nan"), "0.2", True], ids=str)
def test_a_figure_that_is_not_a_number_does_not_push_evidence_out(tmp_path, bad):
    """Red team: n03 slow in jobs 0-2, then ten jobs in which its record's figure is NaN, a string
    or a bool (a writer's bug). Scoring left those values out, but the jobs counted as scored on
    the figure and pushed the three flags out; with the figure absent they did not."""
    import json

    from slurm_hooks.records.stragglers import METRICS

    def every_figure(rng):  # a row with no gap, as real records of a GPU+IB job have
        return dict({m.name: 0.0 for m in METRICS}, **healthy(rng), **{"gpu_power_w.min": 480.0})

    d = str(tmp_path)
    write_jobs(d, jobs=13, slow_in=lambda j: j < 3, perf_of=every_figure)
    for j in range(3, 13):
        path = os.path.join(d, "n03", "%d.json" % (100 + j))
        stamp = os.stat(path).st_mtime
        head, rest = open(path, "rb").read().split(b"\n", 1)
        header = json.loads(head[:-1] + b"}")
        if bad == "absent":
            del header["summary"]["perf"][HW]
        else:
            header["summary"]["perf"][HW] = bad
        with open(path, "wb") as handle:
            handle.write(json.dumps(header)[:-1].encode() + b",\n" + rest)
        os.utime(path, (stamp, stamp))
    (suspect,) = fleet.scan([d], settings(), now=NOW).suspects()
    assert (suspect.node, suspect.metric, suspect.flagged, suspect.window) == ("n03", HW, 3, 3)


H100, A100 = "NVIDIA H100 80GB HBM3 x8", "NVIDIA A100-SXM4-80GB x8"


def mixed_jobs(directory, a100_nodes, nodes=6, jobs=12):
    """Jobs spanning H100 nodes (about 690 W a GPU under load) and A100 nodes (about 390 W): the
    A100s draw less because they are A100s. n01 (an H100) is in HW slowdown in every job."""
    rng = random.Random(8)
    for j in range(jobs):
        end = NOW - (jobs - j) * 3600
        for i in range(nodes):
            node = "n%02d" % i
            a100 = node in a100_nodes
            perf = dict(healthy(rng), **{"gpu_power_w.mean": rng.gauss(390 if a100 else 690, 8)})
            if node == "n01":
                perf[HW] = 0.2
            write(
                directory, node, 300 + j, perf, end, user="u%d" % (j % 3), hw=A100 if a100 else H100
            )


def test_a_job_spanning_two_gpu_models_compares_each_node_with_its_own_kind(tmp_path):
    """Before: the two A100 nodes were suspects on gpu_power_w.mean in every mixed job (z about 11)."""
    d = str(tmp_path / "few")
    mixed_jobs(d, {"n04", "n05"})  # 4 H100 + 2 A100: the A100s are too few to compare
    result = fleet.scan([d], settings(), now=NOW)
    assert [(s.node, s.metric) for s in result.suspects()] == [("n01", HW)]
    assert "n04" not in result.windows and "n05" not in result.windows
    assert result.skipped == {
        "node-jobs of a hardware class on fewer than min_job_nodes nodes of the job": 24
    }
    d = str(tmp_path / "half")
    mixed_jobs(d, {"n04", "n05", "n06", "n07"}, nodes=8)  # 4 + 4: both kinds scored, apart
    result = fleet.scan([d], settings(), now=NOW)
    assert [(s.node, s.metric) for s in result.suspects()] == [("n01", HW)]
    assert result.windows["n05"].marks[-1].nodes == 4 and result.node_jobs == 8 * 12


def test_unreadable_records_are_counted_and_named(tmp_path):
    d = str(tmp_path)
    write_jobs(d, jobs=3)
    with open(os.path.join(d, "n00", "999.json"), "w") as handle:
        handle.write('{"schema": "something else"}\n')
    result = fleet.scan([d], settings(), now=NOW)
    assert result.unreadable_count == 1 and "999.json" in result.unreadable[0]
    with pytest.raises(fleet.ScanError, match="no-such-dir"):
        fleet.scan([str(tmp_path / "no-such-dir")], settings(), now=NOW)


def test_synthetic_fleet_finds_every_persistent_slow_node_and_no_healthy_one(tmp_path):
    """The bench's model at a size a test can afford (48 nodes, 600 jobs): every persistent planted
    node of every kind, nothing else. bench/fleet_synth.py gives the full table."""
    plan = fleet_synth.make_plan(48, seed=21)
    fleet_synth.write_fleet(str(tmp_path), plan, 600, seed=22, now=NOW)
    result = fleet.scan([str(tmp_path)], settings(), now=NOW)
    scores = fleet_synth.evaluate(plan, result.suspects(), result.node_jobs)
    assert scores["false_nodes"] == [], scores
    for kind, row in scores["kinds"].items():
        assert row["recall_persistent"] == 1.0, (kind, row)


# -- the command line ----------------------------------------------------------------------------


@pytest.fixture
def config(tmp_path, monkeypatch):
    path = tmp_path / "config.toml"
    path.write_text(
        '[paths]\nstate_dir = "%s"\nlog_file = ""\nsyslog = false\n[records]\nkey_file = "%s"\n'
        % (tmp_path / "state", write_key(tmp_path / "records.key"))
    )
    monkeypatch.setenv("SLURM_HOOKS_ALLOW_INSECURE_CONFIG", "1")
    monkeypatch.setenv("SLURM_HOOKS_CONFIG", str(path))
    return path


def test_cli_table_json_and_prometheus(tmp_path, config, capsys):
    d = str(tmp_path / "jobs")
    write_jobs(d, jobs=12)
    assert main(["report", "--stragglers", d]) == ExitCode.FOUND
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0].startswith("72 records, 12 multi-node jobs scored (72 node-jobs) on 6 nodes")
    assert lines[1].split() == [
        "NODE",
        "FIGURE",
        "COST",
        "JOBS",
        "WORST-Z",
        "LATEST:",
        "VALUE",
        "VS",
        "JOB",
        "MEDIAN",
        "USERS",
        "FLAGGED",
        "JOBS",
    ]
    assert lines[2].split()[:8] == ["n03", HW, "20.0%", "10/10", "40.0", "0.2", "vs", "0"]

    prom = tmp_path / "textfile" / "stragglers.prom"
    prom.parent.mkdir()
    assert main(["report", "--stragglers", d, "--json", "--prom", str(prom)]) == ExitCode.FOUND
    data = json.loads(capsys.readouterr().out)
    assert data["schema"] == "slurm-hooks.stragglers/1" and data["jobs_scored"] == 12
    (suspect,) = data["suspects"]
    assert (suspect["node"], suspect["metric"], suspect["kind"], suspect["flagged"]) == (
        "n03",
        HW,
        "gpu",
        10,
    )
    assert suspect["evidence"][-1] == {
        "job": "111",
        "end": suspect["evidence"][-1]["end"],
        "nodes": 6,
        "z": 40.0,
        "value": 0.2,
        "median": 0.0,
        "peers": 5,
        "lower_bound": False,
        "cost": 0.2,  # 20 % of the job in HW slowdown, its peers at 0
    }
    assert (suspect["cost"], suspect["basis"]) == (0.2, "k-of-m")
    families = {
        f.name: f for f in text_string_to_metric_families(prom.read_text())
    }  # the real parser
    (sample,) = families["slurm_hooks_fleet_straggler"].samples
    assert sample.labels == {
        "node": "n03",
        "metric": HW,
        "kind": "gpu",
        "reason": "throttle_frac.hw_slowdown higher than the job's other nodes",
    }
    assert sample.value == 1.0
    assert families["slurm_hooks_fleet_suspects"].samples[0].value == 1.0
    assert families["slurm_hooks_fleet_jobs_scored"].samples[0].value == 12.0
    assert families["slurm_hooks_fleet_flags_set_aside"].samples[0].value == 0.0
    assert families["slurm_hooks_fleet_stale_boot_jobs"].samples[0].value == 0.0
    assert families["slurm_hooks_fleet_not_scored"].samples == []  # nothing skipped here
    assert oct(prom.stat().st_mode & 0o777) == "0o644" and not [
        p for p in prom.parent.iterdir() if p != prom
    ]


def test_cli_without_suspects_and_with_mistakes(tmp_path, config, capsys):
    d = str(tmp_path / "jobs")
    write_jobs(d, jobs=5, slow=None)
    assert main(["report", "--stragglers", d]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "no straggler suspects"
    assert main(["report", d, "--prom", str(tmp_path / "x.prom")]) == 3
    assert "--prom and --drain go with --stragglers" in capsys.readouterr().err
    assert main(["report", "--stragglers", str(tmp_path / "nope")]) == 3
    assert "nope: no such file or directory" in capsys.readouterr().err
    assert (
        main(["report", "--stragglers", d, "--prom", str(tmp_path / "missing-dir" / "x.prom")]) == 3
    )
    assert "not written" in capsys.readouterr().err
    assert main(["report", "--stragglers", d, "--job", "1"]) == 3


def test_cli_uses_the_fleet_settings_and_refuses_bad_ones(tmp_path, config, capsys):
    d = str(tmp_path / "jobs")
    write_jobs(d, jobs=12)
    config.write_text(config.read_text() + "[fleet]\nk = 11\nm = 20\nz_threshold = 50.0\n")
    assert main(["report", "--stragglers", d]) == 0
    out = capsys.readouterr().out
    assert (
        "in >= 11 of a node's last 20 jobs, z >= 50" in out and "no straggler suspects" in out
    )  # its z is 40
    config.write_text(config.read_text().replace("k = 11", "k = 30"))
    assert main(["report", "--stragglers", d]) == 3
    assert "[fleet] k = 30 is more than m = 20" in capsys.readouterr().err


# -- the drain step, without Slurm (tests/test_fleet_drain_slurm.py has it with) -------------------


class NoSlurm:
    """A client nothing may call: these cases must end before any request."""

    def __getattr__(self, name):
        raise AssertionError("Slurm was called: %s" % name)


class ListOnlySlurm(NoSlurm):
    """A client that may only list the nodes (an empty cluster here): the fleet lists them once
    per run to see which suspects Slurm holds; any drain or other request fails the test."""

    def set_budget(self, seconds):
        pass

    def list_nodes(self):
        return []


def drain_settings(tmp_path, **fleet_changes):
    values = default_settings()
    values["paths"]["state_dir"] = str(tmp_path / "state")
    values["fleet"].update(drain=True, **fleet_changes)
    return values


def one_suspect(tmp_path):
    write_jobs(str(tmp_path / "jobs"), jobs=12, slow="n03")
    return fleet.scan([str(tmp_path / "jobs")], settings(), now=NOW).suspects()


def test_a_node_name_slurm_would_read_as_a_hostlist_is_never_sent(tmp_path):
    from slurm_hooks.slurm import straggler_drain as fleet_drain

    (suspect,) = one_suspect(tmp_path)
    odd = type(suspect)(
        "n[01-64]", suspect.metric, suspect.flagged, suspect.window, suspect.evidence, suspect.users
    )
    (row,) = fleet_drain.enact(drain_settings(tmp_path), [odd], client=ListOnlySlurm())
    assert (row.node, row.outcome) == ("n[01-64]", "invalid-node-name")


def test_a_node_suspected_only_on_a_report_only_figure_never_reaches_slurm(tmp_path):
    from slurm_hooks.slurm import straggler_drain as fleet_drain

    write_jobs(str(tmp_path / "jobs"), jobs=12, slow_figure="foreign_cpu_frac", slow_value=0.1)
    (suspect,) = fleet.scan([str(tmp_path / "jobs")], settings(), now=NOW).suspects()
    assert (suspect.node, suspect.metric) == ("n03", "foreign_cpu_frac")
    (row,) = fleet_drain.enact(drain_settings(tmp_path), [suspect], client=NoSlurm())
    assert (row.node, row.outcome) == ("n03", "report-only") and "report_only" in row.message


def test_draining_on_one_job_or_one_user_is_accepted_with_a_warning(tmp_path, config, capsys):
    d = str(tmp_path / "jobs")
    write_jobs(d, jobs=4)
    config.write_text(config.read_text() + "[fleet]\nk = 1\nm = 1\ndrain_min_users = 1\n")
    assert main(["report", "--stragglers", d]) == ExitCode.FOUND
    assert "warning" not in capsys.readouterr().err  # reporting on one job harms nobody
    config.write_text(config.read_text() + "drain = true\n")
    assert main(["report", "--stragglers", d]) == ExitCode.FOUND
    err = capsys.readouterr().err
    assert "warning: " in err and "[fleet] k = 1 with drain = true: one slow job drains" in err
    assert "[fleet] drain_min_users = 1 with drain = true: one user's jobs" in err
    assert str(config) in err  # where it was set


def test_settings_that_can_never_drain_or_that_reopen_the_login_attack(tmp_path, config, capsys):
    d = str(tmp_path / "jobs")
    write_jobs(d, jobs=4)
    config.write_text(config.read_text() + "[fleet]\ndrain_min_users = 20\n")  # a typo for 2
    assert (
        main(["report", "--stragglers", d]) == ExitCode.FOUND
    )  # reporting only: it does not matter
    config.write_text(config.read_text() + "drain = true\n")
    assert main(["report", "--stragglers", d]) == 3
    assert "[fleet] drain_min_users = 20 is more than m = 10 with drain" in capsys.readouterr().err
    config.write_text(config.read_text().replace("drain = true\n", ""))
    # an admin adding one figure replaces the default list, and foreign_cpu_frac drains again
    config.write_text(
        config.read_text().replace("drain_min_users = 20", 'report_only = ["cpu_steal_frac"]')
    )
    assert main(["report", "--stragglers", d]) == ExitCode.FOUND
    assert "warning" not in capsys.readouterr().err  # report only: nothing to warn about
    config.write_text(config.read_text() + "drain = true\n")
    assert main(["report", "--stragglers", d]) == ExitCode.FOUND
    assert "report_only does not name foreign_cpu_frac with drain = true" in capsys.readouterr().err


def test_trusted_writers_must_look_like_users(tmp_path, config, capsys):
    config.write_text(config.read_text() + '[fleet]\ntrusted_writers = ["nobody; rm"]\n')
    assert main(["report", "--stragglers", str(tmp_path)]) == 3
    assert (
        "[fleet] trusted_writers: 'nobody; rm' is not a user name or uid" in capsys.readouterr().err
    )
    config.write_text(config.read_text().replace("nobody; rm", "nosuchuser9"))
    assert main(["report", "--stragglers", str(tmp_path)]) == 3
    assert "[fleet] trusted_writers: no user 'nosuchuser9'" in capsys.readouterr().err


def test_report_only_names_figures_of_the_report(tmp_path, config, capsys):
    config.write_text(config.read_text() + '[fleet]\nreport_only = ["foreign_cpu"]\n')
    assert main(["report", "--stragglers", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert "report_only" in err and "'foreign_cpu' is not a figure" in err
    assert "foreign_cpu_frac" in err  # the list to choose from


def test_no_drain_when_the_state_cannot_be_written(tmp_path, monkeypatch):
    """Red team, round 2: with the state directory full (ENOSPC) the drain went ahead and was not
    remembered, so after an admin's resume the next run drained the node again on the same
    evidence. Now the state is written first, and nothing is drained when that fails."""
    from slurm_hooks.core import atomicio
    from slurm_hooks.slurm import straggler_drain as fleet_drain

    suspects = one_suspect(tmp_path)

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomicio, "write_json_atomic", full)
    (row,) = fleet_drain.enact(drain_settings(tmp_path), suspects, client=NoSlurm())
    assert row.outcome == "not-attempted" and "No space left" in row.message


def test_a_corrupt_state_file_keeps_the_report_only_rows(tmp_path):
    from slurm_hooks.slurm import straggler_drain as fleet_drain

    write_jobs(str(tmp_path / "jobs"), jobs=12, slow_figure="foreign_cpu_frac", slow_value=0.1)
    (suspect,) = fleet.scan([str(tmp_path / "jobs")], settings(), now=NOW).suspects()
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "fleet-state.json").write_text("{not json")
    (row,) = fleet_drain.enact(drain_settings(tmp_path), [suspect], client=NoSlurm())
    assert row.outcome == "report-only"  # before: no row at all


def test_a_corrupt_state_file_stops_the_drains(tmp_path):
    from slurm_hooks.slurm import straggler_drain as fleet_drain

    suspects = one_suspect(tmp_path)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "fleet-state.json").write_text("{not json")
    (row,) = fleet_drain.enact(drain_settings(tmp_path), suspects, client=NoSlurm())
    assert row.outcome == "state-corrupt" and "fleet-state.json" in row.message


@pytest.mark.parametrize(
    "content",
    [
        '{"held": []}',
        '{"held": {"n03": "yesterday"}}',
        '{"held": {"n03": NaN}}',
        '{"drains": []}',
        '{"drains": {"n03": "x"}}',
        '{"drains": {"n03": {"time": "1"}}}',
        "[]",
    ],
)
def test_a_state_file_of_another_shape_stops_the_drains_like_a_corrupt_one(tmp_path, content):
    """Red team, round 3: valid JSON of the wrong shape crashed the whole report (AttributeError,
    TypeError: no table, no prom file, every run), or was half ignored and the node drained."""
    from slurm_hooks.slurm import straggler_drain as fleet_drain

    suspects = one_suspect(tmp_path)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "fleet-state.json").write_text(content)
    (row,) = fleet_drain.enact(drain_settings(tmp_path), suspects, client=NoSlurm())
    assert row.outcome == "state-corrupt" and "fleet-state.json" in row.message


def test_a_time_from_a_clock_that_ran_ahead_is_not_believed(tmp_path):
    """Red team, round 3: a 'held' time a year ahead (the admin host's clock before NTP synced)
    made every later job look older than it: the node could never be drained again."""
    import time as clock

    from slurm_hooks.slurm import straggler_drain as fleet_drain

    (suspect,) = one_suspect(tmp_path)
    ahead = {"held": {"n03": clock.time() + 365 * 86400}}
    wanted, rows = fleet_drain.choose([suspect], drain_settings(tmp_path)["fleet"], ahead)
    assert [s.node for s in wanted] == ["n03"] and rows == []
    just_now = {"held": {"n03": clock.time()}}
    wanted, (row,) = fleet_drain.choose([suspect], drain_settings(tmp_path)["fleet"], just_now)
    assert wanted == [] and row.outcome == "too-little-evidence"


def test_the_drain_reason_is_ours_bounded_and_names_the_figure(tmp_path):
    from slurm_hooks.slurm import policy
    from slurm_hooks.slurm import straggler_drain as fleet_drain

    (suspect,) = one_suspect(tmp_path)
    reason = fleet_drain.reason_for(suspect, "sh:", 200)
    assert reason == (
        "sh:fleet.straggler: throttle_frac.hw_slowdown 0.2 vs 0 of its job peers (higher is "
        "worse), 10 of its last 10 jobs, worst z 40 (job 111) -> drain"
    )
    short = fleet_drain.reason_for(suspect, "sh:", 80)
    assert (
        len(short) <= 80
        and short.endswith("... -> drain")
        and policy.read_reason(short, "sh:").checks == (policy.FLEET_CHECK,)
    )
    # the reason the release before wrote is still ours (an upgrade keeps counting it)
    old = fleet_drain.reason_for(suspect, "slurm-hooks:", 200).replace(
        "slurm-hooks:", "slurm-hooks: "
    )
    assert old.startswith("slurm-hooks: fleet.straggler: throttle_frac")
    assert policy.read_reason(old, "sh:").checks == (policy.FLEET_CHECK,)


def test_reading_in_two_processes_gives_the_same_answer(tmp_path, monkeypatch):
    """Above PARALLEL_MIN_RECORDS records two forked processes read the headers (pieces of CHUNK); the
    folding, and so every count and suspect, must not change."""
    plan = fleet_synth.make_plan(24, seed=5)
    fleet_synth.write_fleet(str(tmp_path), plan, 120, seed=6, now=NOW)
    with open(os.path.join(str(tmp_path), "gpu0001", "bad.json"), "w") as handle:
        handle.write("not json\n")
    monkeypatch.setattr(fleet, "CHUNK", 37)  # many pieces, their edges inside jobs
    serial = fleet.to_dict(fleet.scan([str(tmp_path)], settings(), now=NOW, workers=1))
    parallel = fleet.to_dict(fleet.scan([str(tmp_path)], settings(), now=NOW, workers=2))
    for result in (serial, parallel):
        result.pop("seconds")
    assert serial == parallel and serial["suspects"] and serial["unreadable"] == 1


def _plant_header(directory, node, job_id, header_line):
    """A record file whose first line is `header_line` (what someone able to write there could put)."""
    path = os.path.join(directory, node, "%s.json" % job_id)
    with open(path, "wb") as handle:
        handle.write(header_line + b"\n}\n")
    return path


def test_a_crafted_record_is_unreadable_not_a_crash_of_the_whole_report(tmp_path, capsys):
    """Red team of issue 17: a perf value or start time of 400 digits (float() overflows) and a header
    nested 5,000 deep (json's RecursionError) took the whole scan down with a traceback, so no node
    was reported and nothing was drained. Each is one bad record now; the slow node is still found."""
    d = str(tmp_path)
    write_jobs(d, jobs=12)
    huge = "1" + "0" * 400
    perf_line = (
        '{"schema": "slurm-hooks.job-record/1", "job": {"id": "901", "user": "mallory", "gpus": [0]}, '
        '"node": "n01", "start": %.0f, "end": %.0f, "summary": {"perf": {"%s": %s}},'
        % (NOW - 7200, NOW - 3600, HW, huge)
    ).encode()
    start_line = (
        '{"schema": "slurm-hooks.job-record/1", "job": {"id": "902", "user": "mallory", "gpus": [0]}, '
        '"node": "n01", "start": %s, "end": %.0f, "summary": {"perf": {"%s": 0.1}},'
        % (huge, NOW - 3600, HW)
    ).encode()
    nested_line = b'{"schema": "slurm-hooks.job-record/1", "x": ' + b"[" * 5000 + b"]" * 5000 + b","
    _plant_header(d, "n01", 901, perf_line)
    _plant_header(d, "n02", 901, perf_line.replace(b'"n01"', b'"n02"'))
    _plant_header(d, "n04", 901, perf_line.replace(b'"n01"', b'"n04"'))
    _plant_header(d, "n05", 901, perf_line.replace(b'"n01"', b'"n05"'))
    _plant_header(d, "n01", 902, start_line)
    _plant_header(d, "n01", 903, nested_line)
    result = fleet.scan([d], settings(), now=NOW)
    assert [s.node for s in result.suspects()] == ["n03"]
    assert result.unreadable_count >= 1 and any("903.json" in u for u in result.unreadable)
    assert main(["report", d, "--json"]) == 0  # the plain report reads the same files
    json.loads(capsys.readouterr().out)


# -- who wrote a record: the records key (records/signing.py) ------------------------------------


def _forge(directory, node="n02", jobs=12, first_job=500, key=None):
    """What a process running as the records' owner (uid 65534 under root_squash) can do without
    the key: write records of invented jobs and users in which `node` is slow."""
    from slurm_hooks.records.store import encode_record

    for j in range(jobs):
        end = NOW - (jobs - j) * 3600 + 1800
        for i in range(6):
            name = "n%02d" % i
            perf = dict(healthy(random.Random(j * 10 + i)), **{HW: 0.3 if name == node else 0.0})
            record = fleet_synth.header_record(
                str(first_job + j), "forger%d" % (j % 3), name, end - 3600, end, perf
            )
            path = os.path.join(directory, name, "%d.json" % (first_job + j))
            with open(path, "wb") as handle:
                handle.write(encode_record(record, key, name, os.path.basename(path)))
            os.utime(path, (end, end))


def test_forged_records_do_not_verify_and_drain_nothing(tmp_path, config, capsys, monkeypatch):
    """Red team (tracker 24): records forged without the key made a healthy node (n02) a suspect,
    and `report --stragglers --drain` with [fleet] drain = true drained it. Now they are left out,
    counted and named; the genuine records still find the slow node (n03)."""
    from slurm_hooks.records import signing
    from slurm_hooks.slurm import straggler_drain

    d = str(tmp_path / "jobs")
    write_jobs(d, jobs=12)  # signed with the key, as the epilogs do
    _forge(d)  # unsigned
    _forge(d, first_job=700, key=os.urandom(32))  # signed with a key of the forger's
    unchecked = fleet.scan([d], settings(), now=NOW)
    assert {s.node for s in unchecked.suspects()} == {"n02", "n03"}  # the attack, without a key
    checked = fleet.scan([d], settings(), now=NOW, verifier=signing.Verifier(KEY))
    assert {s.node for s in checked.suspects()} == {"n03"}
    assert (checked.unverified_count, checked.records, checked.not_verified) == (144, 72, "")
    assert any(u.endswith("n02/500.json: unsigned") for u in checked.unverified)
    forged = os.path.join(d, "n02", "707.json")
    assert fleet.parse(forged, "n02", 0, 0, signing.Verifier(KEY)) == (
        "unverified",
        forged + ": bad MAC",
    )

    drained = []
    monkeypatch.setattr(
        straggler_drain,
        "enact",
        lambda settings, suspects, **kw: drained.extend(s.node for s in suspects) or [],
    )
    config.write_text(config.read_text() + "[fleet]\ndrain = true\n")
    assert (
        main(["report", "--stragglers", "--drain", "--json", d]) == ExitCode.FOUND
    )  # n03 is a suspect
    data = json.loads(capsys.readouterr().out)
    assert data["verified"] and data["unverified"] == 144 and len(data["unverified_examples"]) == 10
    assert set(drained) == {"n03"}  # what reached the drain library: the genuine suspect only
    assert main(["report", "--json", d]) == 0  # the error ranking leaves them out too
    data = json.loads(capsys.readouterr().out)
    assert (data["records"], data["unverified"], data["verified"]) == (72, 144, True)


def test_a_copied_or_changed_record_does_not_verify(tmp_path):
    """The MAC binds the node directory and file name: a genuine record of the slow node replayed as
    another job, into another node's directory, or with one byte changed, is left out."""
    import shutil

    from slurm_hooks.records import signing

    d = str(tmp_path)
    write_jobs(d, jobs=12)
    shutil.copy(os.path.join(d, "n03", "100.json"), os.path.join(d, "n03", "999.json"))
    shutil.copy(os.path.join(d, "n03", "101.json"), os.path.join(d, "n02", "101.r1.json"))
    path = os.path.join(d, "n03", "102.json")
    data = open(path, "rb").read()
    open(path, "wb").write(data.replace(b'"alice"', b'"alicf"', 1).replace(b'"user', b'"usex', 1))
    result = fleet.scan([d], settings(), now=NOW, verifier=signing.Verifier(KEY))
    why = sorted(os.path.relpath(u, d) for u in result.unverified)
    assert why == ["n02/101.r1.json: bad MAC", "n03/102.json: bad MAC", "n03/999.json: bad MAC"]
    assert result.records == 71 and [s.node for s in result.suspects()] == ["n03"]
    # record show checks the whole file: a change below the header line shows there
    body = os.path.join(d, "n03", "103.json")
    data = open(body, "rb").read()
    assert signing.verify_file(data, KEY, "n03", "103.json") == signing.VERIFIED
    changed = data[:-3] + (b"1" if data[-3:-2] != b"1" else b"2") + data[-2:]
    assert signing.verify_file(changed, KEY, "n03", "103.json") == signing.BAD_BODY


def test_without_a_key_every_record_is_reported_and_nothing_is_drained(
    tmp_path, config, capsys, monkeypatch
):
    """Report-only works without a key: the records are read and shown as unverified, and --drain
    with [fleet] drain = true never reaches the drain library."""
    from slurm_hooks.slurm import straggler_drain

    d = str(tmp_path / "jobs")
    write_jobs(d, jobs=12)
    os.unlink(str(tmp_path / "records.key"))
    monkeypatch.setattr(straggler_drain, "enact", lambda *a, **kw: pytest.fail("drained"))
    config.write_text(config.read_text() + "[fleet]\ndrain = true\n")
    assert (
        main(["report", "--stragglers", "--drain", d]) == ExitCode.FOUND
    )  # n03 named, not drained
    text = capsys.readouterr().out
    assert "records NOT verified (no records key at %s" % (tmp_path / "records.key") in text
    assert "drain n03 (%s): unverified: records not verified" % HW in text
    assert main(["report", d, "--all"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("72 records from 6 nodes") and "records NOT verified" in text


@pytest.mark.parametrize(
    "mode, size, why",
    [
        (0o600, 31, "has 31 bytes, expected 32"),
        (0o620, 32, "writable by others (mode 620)"),
        (0o602, 32, "writable by others (mode 602)"),
        (0o644, 32, "readable by everyone (mode 644)"),  # any user could sign a forged record
        (0o604, 32, "readable by everyone (mode 604)"),
    ],
)
def test_a_key_that_cannot_be_trusted_verifies_nothing(tmp_path, mode, size, why):
    from slurm_hooks.records import signing

    path = write_key(tmp_path / "records.key", os.urandom(size))
    os.chmod(path, mode)
    verifier = signing.Verifier.from_file(path)
    assert verifier.key is None and why in verifier.why_not and path in verifier.why_not
    os.unlink(path)
    os.symlink(str(tmp_path / "elsewhere"), path)  # never followed
    assert signing.Verifier.from_file(path).key is None


def test_a_record_verifies_whichever_way_its_path_is_written(tmp_path, monkeypatch):
    from slurm_hooks.records import signing

    path = write(str(tmp_path), "n01", 7, healthy(random.Random(1)), NOW)
    line = open(path, "rb").readline()
    verifier = signing.Verifier(KEY)
    monkeypatch.chdir(str(tmp_path / "n01"))
    for written in (path, "7.json", "./7.json", "../n01/7.json", str(tmp_path) + "//n01/7.json"):
        assert verifier.line(line, written) == signing.VERIFIED, written
    assert verifier.line(line, str(tmp_path / "n02" / "7.json")) == signing.BAD_MAC
    assert verifier.line(line[:-80] + line[-79:], path) == signing.BAD_MAC  # a byte less
    assert verifier.line(line[:-75] + b",\n", path) == signing.UNSIGNED  # the MAC cut off
