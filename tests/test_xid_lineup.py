"""One job's Xids, lined up (records/xid_lineup.py): the epilog dates each Xid, `report --xids`
blames the node whose fault came first, and the plain report no longer counts the victims' Xids.

The records are built by the epilog's own builder (records/build.py) from real driver lines, each
named with its source below. No public thread shows all nodes' lines of one multi-node failure, so
the test places real lines of separate sources on the nodes of one job and sets their times.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from slurm_hooks.core.runner import JobContext
from slurm_hooks.records import build, xid_lineup
from slurm_hooks.records.fleet_report import aggregate
from slurm_hooks.records.signing import Verifier
from slurm_hooks.records.store import encode_record
from tests.helpers import assert_exposition, cli_with_default_config, default_settings
from tests.inprocess_cli import cli_in_process
from tests.straggler_records import KEY, write_key

# NVIDIA/NVSentinel issue #155, comment by lalitadithya, 2025-10-25: the line their fleet logs when a
# GPU falls off the bus <https://github.com/NVIDIA/NVSentinel/issues/155>
XID79 = "NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus"
# NVIDIA/open-gpu-kernel-modules issue #1150, comment by jed-hacker, 2026-05-18: teardown Xids of the
# job's processes after the fault <https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1150>
XID45_A = "NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149"
XID45_B = "NVRM: Xid (PCI:0000:ed:00): 45, pid=1818992, name=python3, Ch 0000000c caused by previous Xid 145"
# kubernetes-sigs/dra-driver-nvidia-gpu issue #904, comment by guptaNswati, 2026-08-07
# <https://github.com/kubernetes-sigs/dra-driver-nvidia-gpu/issues/904>
XID43 = "NVRM: Xid (PCI:0009:01:00): 43, pid=3188489, name=trigger_xid, channel 0x0b00000a"
# NVIDIA, A100 GPU Memory Error Management, Table 3 "Contained error with MIG disabled"
# <https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/user-visible-statistics.html>
XID94 = (
    "NVRM: Xid (PCI:0000:01:00): 94, pid=7062, Contained: CE User Channel (0x9). RST: No, D-RST: No"
)

T = 1_790_000_000.0  # the wall time of the first fault
UPTIME = 864_000.0  # each node's kernel-log clock at that moment (10 days up)
SETTINGS = default_settings()


def epilog_record(node, job_id, xids, clock_offset=0.0, with_clock=True, clock_error=0.004):
    """The record node's epilog writes: `xids` [(wall time, message)] read from /dev/kmsg.
    clock_offset: the node's wall clock minus true time."""
    end = T + 60.0
    lines = [
        "3,%d,%d,-;%s" % (100 + i, int((UPTIME + (when - T)) * 1e6), message)
        for i, (when, message) in enumerate(xids)
    ]
    before = {"time": T - 3600 + clock_offset, "boot_id": "b-" + node, "kmsg_seq": 99, "gpus": []}
    after = {"time": end + clock_offset, "boot_id": "b-" + node, "kmsg_seq": 200, "gpus": []}
    after["clock_max_error_s"] = clock_error  # chrony-synchronised: a few ms
    after["xid_lines"] = lines
    if with_clock:  # an older version's snapshot has no kernel-log clock
        after["kernel_clock_s"] = UPTIME + (end - T)
    job = JobContext(job_id=str(job_id), user="alice", node_name=node, gpus=None)
    return build.build_record(
        job, node, before, "ok", after, "", None, None, None, SETTINGS, now=end
    )


def write(directory, record, key=KEY):
    node, name = record["node"], "%s.json" % record["job"]["id"]
    path = os.path.join(str(directory), node, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(encode_record(record, key, node, name))
    return path


def one_failure(directory, job=4242, **changes):
    """A 4-node job: gpu-a's GPU falls off the bus; gpu-b and gpu-c log teardown Xids seconds later;
    gpu-d logs a contained memory error of its own; gpu-e logs nothing."""
    nodes = {
        "gpu-a": [(T, XID79)],
        "gpu-b": [(T + 3.2, XID45_A), (T + 3.3, XID45_B)],
        "gpu-c": [(T + 2.9, XID43)],
        "gpu-d": [(T + 30.0, XID94)],
        "gpu-e": [],
    }
    nodes.update(changes)
    for node, xids in nodes.items():
        write(directory, epilog_record(node, job, xids))


def totals(fleet):
    return {n.node: (n.sums["xids"], n.sympathetic_xids) for n in fleet.nodes.values()}


def test_the_epilog_dates_each_xid_from_the_kernel_log_clock():
    record = epilog_record("gpu-b", 7, [(T + 3.2, XID45_A), (T + 3.3, XID45_B)], clock_offset=1.5)
    assert [row["time"] for row in record["xids"]] == [T + 3.2 + 1.5, T + 3.3 + 1.5]
    assert record["summary"]["xid_times"] == [[45, T + 4.7, 2, "job"]]
    older = epilog_record("gpu-b", 7, [(T + 3.2, XID45_A)], with_clock=False)
    assert older["xids"][0]["time"] is None  # no anchor: undated, never guessed
    assert older["summary"]["xid_times"] == [[45, None, 1, "job"]]


def test_the_victims_xids_are_not_counted_against_them(tmp_path):
    one_failure(tmp_path)
    fleet = aggregate([str(tmp_path)], verifier=Verifier(KEY))
    assert totals(fleet) == {
        "gpu-a": (1, 0),  # the cause
        "gpu-b": (0, 2),  # teardown after gpu-a's fault: not counted
        "gpu-c": (0, 1),
        "gpu-d": (1, 0),  # a memory error of its own GPU: a cause, counted
        "gpu-e": (0, 0),
    }
    (job,) = fleet.lineups
    assert (job.verdict, job.causal, job.first[:2]) == ("causal", "gpu-a", ("gpu-a", 79))
    assert "xids" not in dict(fleet.nodes["gpu-b"].reasons)  # no longer an abnormal job for it
    assert fleet.nodes["gpu-b"].abnormal_jobs == 0


def test_without_the_records_key_nothing_is_excused(tmp_path):
    one_failure(tmp_path)
    fleet = aggregate([str(tmp_path)])  # no key: every record could be anyone's
    assert totals(fleet)["gpu-b"] == (2, 0) and totals(fleet)["gpu-c"] == (1, 0)
    assert fleet.lineups[0].causal == "gpu-a"  # shown all the same
    assert "records not verified" in fleet.lineups[0].counted_why["gpu-b"]


def test_a_forged_record_cannot_clear_another_nodes_xids(tmp_path):
    one_failure(tmp_path, **{"gpu-a": []})  # nobody logged a cause: the 45/43 count
    forged = epilog_record("gpu-x", 4242, [(T - 50, XID79)])
    write(tmp_path, forged, key=b"not the key".ljust(32, b"!"))
    unsigned = epilog_record("gpu-y", 4242, [(T - 40, XID79)])
    write(tmp_path, unsigned, key=None)
    fleet = aggregate([str(tmp_path)], verifier=Verifier(KEY))
    assert fleet.unverified_count == 2
    assert totals(fleet)["gpu-b"] == (2, 0) and totals(fleet)["gpu-c"] == (1, 0)
    assert "gpu-x" not in fleet.nodes and "gpu-y" not in fleet.nodes


def test_causes_within_the_clock_tolerance_are_ambiguous(tmp_path):
    one_failure(tmp_path, **{"gpu-d": [(T + 1.0, XID94)]})
    fleet = aggregate([str(tmp_path)], verifier=Verifier(KEY), xid_tolerance=2.0)
    (job,) = fleet.lineups
    assert (job.verdict, job.causal, job.contenders) == ("ambiguous", None, ["gpu-a", "gpu-d"])
    assert totals(fleet)["gpu-a"] == (1, 0) and totals(fleet)["gpu-d"] == (1, 0)
    assert totals(fleet)["gpu-b"] == (0, 2)  # a cause on another node came first either way
    tight = aggregate([str(tmp_path)], verifier=Verifier(KEY), xid_tolerance=0.5)
    assert (tight.lineups[0].verdict, tight.lineups[0].causal) == ("causal", "gpu-a")


def test_a_consequence_before_every_cause_counts_and_clock_skew_within_tolerance_does_not(tmp_path):
    one_failure(tmp_path, **{"gpu-c": [(T - 10.0, XID43)]})
    write(tmp_path, epilog_record("gpu-b", 4242, [(T + 0.5, XID45_A)], clock_offset=-1.8))
    fleet = aggregate([str(tmp_path)], verifier=Verifier(KEY), xid_tolerance=2.0)
    assert totals(fleet)["gpu-c"] == (1, 0)  # 10 s before gpu-a's fault: not its victim
    assert "before any other node's cause" in fleet.lineups[0].counted_why["gpu-c"]
    assert totals(fleet)["gpu-b"] == (0, 1)  # its clock 1.8 s behind: still after, within 2 s


def test_a_node_whose_clock_is_not_synchronised_is_not_ordered(tmp_path):
    one_failure(tmp_path)
    late = epilog_record("gpu-a", 4242, [(T, XID79)], clock_offset=-9.0, clock_error=16.0)
    write(tmp_path, late)  # an unsynchronised clock 9 s behind: its 79 would seem the first anyway
    fleet = aggregate([str(tmp_path)], verifier=Verifier(KEY))
    (job,) = fleet.lineups
    assert (job.verdict, job.causal, job.contenders) == ("ambiguous", None, ["gpu-a", "gpu-d"])
    assert totals(fleet)["gpu-b"] == (2, 0) and totals(fleet)["gpu-c"] == (1, 0)  # unproven
    assert "clock error up to 16s: not ordered" in "\n".join(xid_lineup.render([job], 2.0))


def test_the_epilog_records_the_kernels_bound_on_its_clock_error():
    from slurm_hooks.records import counters

    error = counters.wall_clock_error()  # this machine's, read-only: a number, or 16 s unsynced
    assert error is None or 0 <= error <= counters.UNSYNCED_ERROR_S
    record = epilog_record("gpu-b", 7, [(T + 3.2, XID45_A)], clock_error=0.25)
    assert record["clock_max_error_s"] == 0.25 and record["summary"]["xid_clock_error_s"] == 0.25


def test_an_interpreter_without_ctypes_loses_the_clock_bound_not_the_snapshot(monkeypatch):
    """ctypes is an optional part of CPython (_ctypes needs libffi; minimal and distroless builds
    leave it out). Its ImportError went up through counters.take, and the epilog's whole snapshot
    -- counters, Xid lines -- was lost for a clock bound the record can do without."""
    import sys

    from slurm_hooks.records import counters

    monkeypatch.setitem(sys.modules, "ctypes", None)  # `import ctypes` raises ImportError
    assert counters.wall_clock_error() is None


@pytest.mark.parametrize("garbage", [-1.0, 1e13, "0.004", True])
def test_a_clock_bound_no_kernel_reports_is_not_a_good_clock(tmp_path, garbage):
    """The bound is absent on records of older versions; when present it is what adjtimex said, at
    most 16 s. A value no kernel reports (a struct read with the wrong layout, a hand-edited
    record) read as 'no bound given', and the node's times were ordered as if synchronised."""
    one_failure(tmp_path)
    late = epilog_record("gpu-a", 4242, [(T, XID79)], clock_offset=-9.0, clock_error=garbage)
    write(tmp_path, late)
    fleet = aggregate([str(tmp_path)], verifier=Verifier(KEY))
    (job,) = fleet.lineups
    assert (job.verdict, job.causal) == ("ambiguous", None)
    assert totals(fleet)["gpu-b"] == (2, 0) and totals(fleet)["gpu-c"] == (1, 0)  # unproven


def test_a_maxerror_no_kernel_reports_is_read_as_unsynchronised(monkeypatch):
    """adjtimex read through a struct timex of the wrong layout (an ABI we did not expect) finds
    another field where maxerror should be. A negative one became 0 s, a perfect clock."""
    import ctypes

    from slurm_hooks.records import counters

    class FakeLibc:
        def __init__(self, maxerror):
            self.maxerror = maxerror

        def adjtimex(self, timex_ref):
            timex_ref._obj.maxerror = self.maxerror
            return 0  # TIME_OK, status 0: synchronised

    for maxerror, expected in [(-7, 16.0), (17_000_000, 16.0), (4_000, 0.004)]:
        monkeypatch.setattr(ctypes, "CDLL", lambda *a, m=maxerror, **k: FakeLibc(m))
        assert counters.wall_clock_error() == expected, maxerror


def test_a_node_with_a_cause_of_its_own_keeps_its_consequences_counted(tmp_path):
    one_failure(tmp_path, **{"gpu-b": [(T + 3.0, XID94), (T + 3.2, XID45_A)]})
    fleet = aggregate([str(tmp_path)], verifier=Verifier(KEY))
    assert totals(fleet)["gpu-b"] == (2, 0)


def test_records_of_an_older_version_are_counted_as_before(tmp_path):
    for node, xids in (("gpu-a", [(T, XID79)]), ("gpu-b", [(T + 3.2, XID45_A)])):
        record = epilog_record(node, 9, xids)
        del record["summary"]["xid_times"]
        write(tmp_path, record)
    fleet = aggregate([str(tmp_path)], verifier=Verifier(KEY))
    assert totals(fleet) == {"gpu-a": (1, 0), "gpu-b": (1, 0)} and fleet.lineups == []
    # mixed with a newer one: the old record's Xids could have come first, none is blamed
    write(tmp_path, epilog_record("gpu-c", 9, [(T + 3.0, XID79)]))
    fleet = aggregate([str(tmp_path)], verifier=Verifier(KEY))
    (job,) = fleet.lineups
    assert (job.verdict, job.contenders) == ("ambiguous", ["gpu-a", "gpu-b", "gpu-c"])
    assert totals(fleet)["gpu-b"] == (1, 0)


@pytest.mark.parametrize(
    "hostile",
    [
        "x",
        [],
        [[45]],
        [[45, "soon", 1, "job"]],
        [[45, 1e300, 1, "job"]],
        [[True, T, 1, "job"]],
        [[45, T, 0, "job"]],
        [[45, T, 1, 7]],
        [[45, T, 1, "job"]] * 100,
    ],
)
def test_a_summary_of_a_shape_no_writer_makes_is_not_lined_up(hostile):
    assert xid_lineup.entries_of({"xid_times": hostile}) is None


def test_ties_and_missing_blames_line_up_without_an_error():
    same = [[79, T, 1, None], [79, T, 2, "node"]]
    nodes = [
        xid_lineup.NodeXids("a", xid_lineup.entries_of({"xid_times": same})),
        xid_lineup.NodeXids("b", xid_lineup.entries_of({"xid_times": [[79, T, 1, None]]})),
        xid_lineup.NodeXids("c", xid_lineup.entries_of({"xid_times": [[45, T + 1, 1, None]]})),
    ]
    job = xid_lineup.line_up("7", nodes, 2.0, True)
    assert (job.verdict, job.contenders, job.excused) == ("ambiguous", ["a", "b"], {"c": 1})
    assert "ambiguous" in "\n".join(xid_lineup.render([job], 2.0))


def test_the_nodes_own_xid_check_never_drains_for_a_victims_xids():
    """Why the prolog's kmsg check is left alone: on its own node's lines it already gives Xid 43
    and 45 no action (the drain history, and so the lemon rules, never sees them)."""
    from slurm_hooks.xid.catalog import classify_all
    from slurm_hooks.xid.kmsg import parse_xid

    events = [parse_xid(line) for line in (XID43, XID45_A, XID45_B)]
    decisions = classify_all(events)
    assert [d.action for d in decisions] == ["none"] * 3
    assert all(d.status in ("OK", "WARN") for d in decisions)


def test_the_catalog_calls_the_consequences_teardown_and_keeps_memory_errors_causes():
    from slurm_hooks.xid.catalog import load_catalog

    catalog = load_catalog()
    for xid in xid_lineup.CONSEQUENCE_XIDS:
        entry = catalog.lookup(xid)
        assert entry.immediate in ("IGNORE", "WORKFLOW_XID_45") and entry.job_caused
    assert catalog.lookup(94).component == "gpu-memory" and 94 not in xid_lineup.CONSEQUENCE_XIDS


def _config(tmp_path, key=True):
    path = tmp_path / "config.toml"
    lines = ["[records]", 'dir = "%s"' % (tmp_path / "records")]
    lines.append('key_file = "%s"' % (write_key(tmp_path / "records.key") if key else ""))
    lines.append("xid_clock_tolerance_s = 2.0")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_report_xids_prints_the_line_up_and_its_metrics(tmp_path):
    insecure_ok = dict(os.environ, SLURM_HOOKS_ALLOW_INSECURE_CONFIG="1")
    one_failure(tmp_path / "records")
    prom = tmp_path / "xids.prom"
    config = _config(tmp_path)
    # the first as a child (the console entry point), the others in this process (inprocess_cli.py)
    run = cli_with_default_config(["--config", config, "report", "--xids", "--prom", str(prom)])
    assert run.returncode == 1, run.stderr  # FOUND: a node blamed
    assert "job 4242: first cause Xid 79 on gpu-a" in run.stdout
    assert re.search(r"gpu-b +Xid 45 x2 \+3\.2s +\(victim: 2 not counted\)", run.stdout)
    text = prom.read_text()
    assert_exposition(text)
    assert (
        'slurm_hooks_fleet_xid_causal_node{job="4242",node="gpu-a",xid="79",blame="node"} 1.0'
        in text
    )
    assert 'slurm_hooks_fleet_xid_sympathetic{node="gpu-b"} 2.0' in text
    data = json.loads(
        cli_in_process(["--config", config, "report", "--xids", "--json"], env=insecure_ok).stdout
    )
    assert data["schema"] == "slurm-hooks.xid-lineup/1"
    assert data["jobs"][0]["causal_node"] == "gpu-a" and data["jobs"][0]["excused"] == {
        "gpu-b": 2,
        "gpu-c": 1,
    }
    one = cli_in_process(["--config", config, "report", "--job", "4242"], env=insecure_ok)
    assert "job 4242: first cause Xid 79 on gpu-a" in one.stdout, one.stderr
    plain = json.loads(
        cli_in_process(["--config", config, "report", "--json"], env=insecure_ok).stdout
    )
    ranked = {n["node"]: n for n in plain["ranking"]}
    assert "gpu-b" not in ranked and ranked["gpu-a"]["totals"]["xids"] == 1


# -- xid.pattern: a victim's Xid 43 in three jobs is not a GPU's pattern ------------------------


@pytest.fixture
def pattern_site(tmp_path, monkeypatch):
    """node1's epilogs through the hooks' flow with Slurm in memory; xid.events stood in by a check
    reporting the Xid 43 line above in checks/xid.py's shape (WARN blamed on the job)."""
    from slurm_hooks.core.config import validate
    from slurm_hooks.hooks import run_hook
    from slurm_hooks.registry import Registry
    from slurm_hooks.result import Blame, Result, Status
    from slurm_hooks.slurm import lemon
    from slurm_hooks.slurm.client import SlurmClient
    from tests.doubles.memory_slurm import cluster

    monkeypatch.setattr(lemon, "boot_id", lambda root: "boot-a")
    reg, seen = Registry(), []

    @reg.check(name="xid.events", contexts=("prolog", "epilog", "health"), timeout=2)
    def xid_events(params):
        """stand-in"""
        listed = [{"code": 43, "seq": seq, "pci": "0009:01:00.0", "text": XID43} for seq in seen]
        return Result(
            "xid.events",
            Status.WARN,
            "Xid 43: " + XID43,
            component="gpu:0 0009:01:00.0",
            blame=Blame.JOB,
            details={"events": listed},
        )

    backend = cluster()
    records = tmp_path / "records"

    def run(job, user, seq, key=True, records_dir=None, files_deadline=5.0):
        seen.append(seq)
        config = validate(
            reg,
            {
                "general": {"mode": "enforce"},
                "deadline": {"files": files_deadline},
                "paths": {"state_dir": str(tmp_path / "state"), "log_file": "", "syslog": False},
                "records": {
                    "enabled": False,  # the records below stand for the epilogs' own
                    "dir": str(records_dir or records),
                    "key_file": write_key(tmp_path / "records.key") if key else "",
                },
            },
        )
        env = {"SLURM_JOB_ID": job, "SLURM_JOB_USER": user, "SLURMD_NODENAME": "node1"}
        return run_hook("epilog", reg, config, env, client=SlurmClient(backend))

    run.records, run.backend = records, backend
    return run


def victim_job(directory, job):
    """Job `job`: node2's GPU falls off the bus; node1's GPU logs Xid 43 three seconds later."""
    write(directory, epilog_record("node2", job, [(T, XID79)]))
    write(directory, epilog_record("node1", job, [(T + 3.0, XID43)]))


def test_xid_43_of_a_victim_in_three_jobs_drains_no_node(pattern_site):
    from slurm_hooks.result import ExitCode

    victim_job(pattern_site.records, 101)
    victim_job(pattern_site.records, 102)
    assert pattern_site("101", "alice", 10).exit_code == ExitCode.OK
    assert pattern_site("102", "bob", 20).exit_code == ExitCode.OK
    out = pattern_site("103", "carol", 30)  # its records not written yet: one job, not three
    assert out.exit_code == ExitCode.OK and not pattern_site.backend.nodes["node1"].is_drained


def test_without_the_key_or_the_records_the_pattern_drains_as_before(pattern_site):
    from slurm_hooks.result import ExitCode

    victim_job(pattern_site.records, 101)
    assert pattern_site("101", "alice", 10, key=False).exit_code == ExitCode.OK
    assert pattern_site("102", "bob", 20, key=False).exit_code == ExitCode.OK  # no record at all
    out = pattern_site("103", "carol", 30, key=False)
    assert out.exit_code == ExitCode.NODE_BROKEN and pattern_site.backend.nodes["node1"].is_drained


def test_a_hung_records_lookup_drains_as_before_and_in_time(pattern_site, monkeypatch):
    """The records directory is shared (NFS, Lustre) and may stop answering: the victim lookup then
    never returns (stood in by a lookup that sleeps; a FUSE file system that never answers would
    leave this test's forked children in uninterruptible sleep holding the FUSE device open).
    Nothing is proven, so the GPU's pattern counts as before and drains, within [deadline] files.
    It used to run in the same bounded child as the Xid history: the hang killed both and the
    pattern was lost, so a hung records file system excused a failing GPU."""
    import time

    from slurm_hooks.result import ExitCode
    from slurm_hooks.xid import pattern

    def never_answers(config, node, jobs):
        time.sleep(3600)

    monkeypatch.setattr(pattern, "victim_jobs", never_answers)
    hung = dict(files_deadline=1.5)
    assert pattern_site("101", "alice", 10, **hung).exit_code == ExitCode.OK
    assert pattern_site("102", "bob", 20, **hung).exit_code == ExitCode.OK
    started = time.monotonic()
    out = pattern_site("103", "carol", 30, **hung)
    seconds = time.monotonic() - started
    assert out.exit_code == ExitCode.NODE_BROKEN and pattern_site.backend.nodes["node1"].is_drained
    assert seconds < 1.5 + 1.0, seconds  # the hung lookup costs the files budget, once


def test_a_requeued_attempt_where_only_this_node_logged_xids_keeps_the_job_counted(pattern_site):
    """Job 101's first run: node1 a victim of node2's fault. Slurm requeues it (SLURM_JOB_RESTART_
    COUNT 1, record 101.r1.json) and in that attempt node1 logs Xid 43 alone: nobody else's fault
    explains it. The job is excused only when every attempt of node1's is; the lone attempt was
    skipped (a line-up needs two nodes) and the whole job was cleared, so three jobs of three users
    did not drain."""
    from slurm_hooks.result import ExitCode

    victim_job(pattern_site.records, 101)
    alone = epilog_record("node1", 101, [(T + 30.0, XID43)])
    alone["job"]["restart_count"] = 1
    path = os.path.join(str(pattern_site.records), "node1", "101.r1.json")
    with open(path, "wb") as handle:
        handle.write(encode_record(alone, KEY, "node1", "101.r1.json"))
    assert pattern_site("101", "alice", 10).exit_code == ExitCode.OK
    assert pattern_site("101", "alice", 11).exit_code == ExitCode.OK  # the requeued run's epilog
    assert pattern_site("102", "bob", 20).exit_code == ExitCode.OK
    out = pattern_site("103", "carol", 30)
    assert out.exit_code == ExitCode.NODE_BROKEN and pattern_site.backend.nodes["node1"].is_drained


def test_an_attempt_whose_record_does_not_verify_keeps_the_job_counted(pattern_site):
    """As above, but node1's record of the requeued attempt does not verify (written unsigned while
    the key could not be read, or put there by anyone who can write the shared directory). Records
    that do not verify were left out of node1's attempts, and the verified victim attempt alone
    cleared the job: what cannot be proven must keep the job counted."""
    from slurm_hooks.result import ExitCode

    victim_job(pattern_site.records, 101)
    alone = epilog_record("node1", 101, [(T + 30.0, XID43)])
    alone["job"]["restart_count"] = 1
    path = os.path.join(str(pattern_site.records), "node1", "101.r1.json")
    with open(path, "wb") as handle:
        handle.write(encode_record(alone, None, "node1", "101.r1.json"))
    assert pattern_site("101", "alice", 10).exit_code == ExitCode.OK
    assert pattern_site("102", "bob", 20).exit_code == ExitCode.OK
    out = pattern_site("103", "carol", 30)
    assert out.exit_code == ExitCode.NODE_BROKEN and pattern_site.backend.nodes["node1"].is_drained


def test_a_records_directory_on_a_hung_file_system_drains_as_before(pattern_site, tmp_path):
    """The same on a real file system that never answers (tests/doubles/hungfs.py, FUSE): the
    records lookup is abandoned within [deadline] files and the pattern drains as before."""
    import time

    from slurm_hooks.result import ExitCode
    from tests.doubles.hungfs import HungFileSystem, require_fuse

    require_fuse(tmp_path)
    mount = tmp_path / "hung"
    mount.mkdir()
    with HungFileSystem(str(mount)):
        hung = dict(records_dir=mount / "jobs", files_deadline=1.5)
        assert pattern_site("101", "alice", 10, **hung).exit_code == ExitCode.OK
        assert pattern_site("102", "bob", 20, **hung).exit_code == ExitCode.OK
        started = time.monotonic()
        out = pattern_site("103", "carol", 30, **hung)
        seconds = time.monotonic() - started
    assert out.exit_code == ExitCode.NODE_BROKEN and pattern_site.backend.nodes["node1"].is_drained
    assert seconds < 1.5 + 1.0, seconds
