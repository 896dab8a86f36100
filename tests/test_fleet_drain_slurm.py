"""`slurm-hooks report --stragglers --drain` from an admin host, against a real slurmctld.

Twelve nodes without slurmd (SLURM-NOTES "Many nodes on one host": State=IDLE, SlurmdTimeout=0: they
take DRAIN/RESUME like real ones); the CLI runs as the systemd service runs it, as a subprocess
with the cluster's SLURM_CONF, over records written in the epilog's layout. Breaker limit:
max(2, 10 % of 12) = 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from slurm_hooks.core.config import validate
from slurm_hooks.hooks.recovery import recover
from slurm_hooks.registry import load_builtin_checks
from slurm_hooks.slurm import drainer, policy
from slurm_hooks.slurm.client import ScontrolBackend, SlurmClient
from tests.helpers import REPO, default_settings
from tests.slurm_rig import ctld_reason
from tests.straggler_records import HW, KEY, write_jobs, write_key

pytestmark = pytest.mark.slurm

NODES = tuple("n%02d" % i for i in range(12))
SLOW = "n03"


@pytest.fixture(scope="module")
def cluster(slurm_cluster_factory):
    return slurm_cluster_factory(
        "fleet", nodes=NODES, with_slurmd=False, extra_node_state="IDLE", slurmd_timeout=0
    )


@pytest.fixture
def site(cluster, tmp_path):
    """A records directory with 12 jobs on n00..n05 (n03 slow in each, 3 users) and a config; the
    cluster's nodes undrained afterwards."""
    records = tmp_path / "jobs"
    write_jobs(str(records), jobs=12, slow=SLOW)
    yield Site(cluster, tmp_path, records)
    for name in NODES:
        if "DRAIN" in cluster.node_state(name).split("+"):
            cluster.scontrol("update", "NodeName=%s" % name, "State=UNDRAIN")


class Site:
    def __init__(self, cluster, base, records):
        self.cluster, self.base, self.records = cluster, base, records
        self.config = base / "config.toml"
        self.state_dir = base / "state"
        self.write_config()

    def write_config(self, extra=""):
        self.config.write_text(
            '[general]\n%s\n[paths]\nstate_dir = "%s"\nlog_file = ""\nsyslog = false\n'
            '[records]\nkey_file = "%s"\n'  # the records are signed with it (straggler_records)
            '[drain]\nbackend = "scontrol"\n[fleet]\ndrain = true\nconfirm_with = "none"\n%s'
            % (
                'mode = "%s"' % ("observe" if "observe" in extra else "enforce"),
                self.state_dir,
                write_key(self.base / "records.key"),
                extra.replace("observe", ""),
            )
        )

    def run(self, *extra):
        env = dict(
            self.cluster.env,
            SLURM_HOOKS_ALLOW_INSECURE_CONFIG="1",
            SLURM_HOOKS_CONFIG_CACHE="off",  # run by slurmd as root: no cache in the host's /run
            SLURM_HOOKS_LOCK_DIR="off",  # nor the node lock (slurm/nodelock.py): state_dir holds it
            SLURM_HOOKS_CONFIG=str(self.config),
            PYTHONPATH=REPO,
        )
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "slurm_hooks",
                "report",
                "--stragglers",
                "--json",
                "--drain",
                str(self.records),
            ]
            + list(extra),
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        data = json.loads(done.stdout)
        # 0: no suspect; 1 (FOUND): suspects named (docs/cli.md's exit codes); anything else failed
        assert done.returncode == (1 if data.get("suspects") else 0), (done.returncode, done.stderr)
        return data

    def scan(self):
        from slurm_hooks.core.config import SECTIONS
        from slurm_hooks.records import straggler_scan as fleet

        return fleet.scan(
            [str(self.records)], {k: s.default for k, s in SECTIONS["fleet"].items()}
        ).suspects()

    def reason(self, node=SLOW):
        return ctld_reason(self.cluster, node)

    def drained(self, node=SLOW):
        return "DRAIN" in self.cluster.node_state(node).split("+")


def outcomes(data):
    return [(row["node"], row["outcome"]) for row in data["drains"]]


def test_drain_off_by_default_reports_only(site):
    site.config.write_text(site.config.read_text().replace("drain = true", ""))
    data = site.run()
    assert [s["node"] for s in data["suspects"]] == [SLOW]
    assert outcomes(data) == [(SLOW, "disabled")] and not site.drained()


def test_a_suspect_is_drained_once_with_a_reason_of_ours_and_left_to_an_admin(site, cluster):
    data = site.run()
    assert outcomes(data) == [(SLOW, "drained")], data["drains"]
    reason = site.reason()
    assert reason.startswith(
        "sh:fleet.straggler: throttle_frac.hw_slowdown 0.2 vs 0 of its job peers"
    )
    assert reason.endswith("-> drain") and "10 of its last 10 jobs" in reason
    assert policy.read_reason(reason, "sh:").checks == (
        policy.FLEET_CHECK,
    )  # the breaker counts it
    state = json.loads((site.state_dir / "fleet-state.json").read_text())["drains"][SLOW]
    assert state["reason"] == reason and state["reason_time"] and state["metric"] == HW
    assert [n for n in NODES if n != SLOW and site.drained(n)] == []

    # the next timer run: no new evidence, no Slurm call
    assert outcomes(site.run()) == [(SLOW, "too-little-evidence")] and site.drained()

    # the node's own health run never adopts or resumes it, even with its local state lost
    config = validate(load_builtin_checks(), {"drain": {"backend": "scontrol"}})
    client = SlurmClient(backend=ScontrolBackend(env=cluster.env))
    state = {}
    enacted = recover(client, SLOW, state, False, NoResults(), config)
    assert enacted.outcome is drainer.Outcome.NOT_DRAINED and not enacted.node_drained, enacted
    assert state == {} and site.reason() == reason and site.drained()

    # an admin clears it; the evidence it was drained on does not drain it again
    resumed = drainer.resume(client, SLOW, config.settings, by_admin=True)
    assert resumed.outcome is drainer.Outcome.RESUMED, resumed
    data = site.run()
    assert [s["node"] for s in data["suspects"]] == [SLOW] and not site.drained()
    assert outcomes(data) == [(SLOW, "too-little-evidence")]
    assert "0 flagged job(s) of 0 user(s) since our drain of it" in data["drains"][0]["message"]

    # ... jobs that started after the drain do, when it is still slow in k of them
    soon = time.time() + 5
    write_jobs(str(site.records), jobs=3, slow=SLOW, first_job=500, seed=7)
    for node_dir in site.records.iterdir():
        for job in ("500", "501", "502"):
            _shift(node_dir / ("%s.json" % job), soon + int(job) * 10)
    assert outcomes(site.run()) == [(SLOW, "drained")] and site.drained()


class NoResults:
    """A health run in which no check failed (hooks/recovery.py recover only asks for the results)."""

    def results(self):
        return []


def _shift(path, start):
    """Move a written record's job to start at `start` (after the drain), an hour long."""
    from slurm_hooks.records.store import encode_record

    record = json.loads(path.read_bytes())
    record["start"], record["end"] = start, start + 3600
    for signature in ("body_sha256", "mac"):  # signed again below, as its node's epilog would
        record.pop(signature, None)
    path.write_bytes(encode_record(record, KEY, path.parent.name, path.name))
    os.utime(path, (start + 3600, start + 3600))


def test_observe_mode_drains_nothing(site):
    site.write_config("observe")
    assert outcomes(site.run()) == [(SLOW, "observe")] and not site.drained()


@pytest.mark.parametrize("reason", ["admin: reseat GPU 3", "Prolog error"])
def test_an_existing_drain_is_never_replaced(site, cluster, reason):
    """An admin's drain, and Slurm's own Prolog error (the node's hooks refine that one, not the fleet)."""
    cluster.scontrol("update", "NodeName=%s" % SLOW, "State=DRAIN", "Reason=%s" % reason)
    data = site.run()
    assert outcomes(data) == [(SLOW, "left-alone")] and data["drains"][0]["message"].startswith(
        "already drained"
    )
    assert site.reason() == reason


def test_a_drain_appearing_after_the_listing_is_kept_too(site, cluster):
    """Between the run's node listing and its drain an admin drains the node (the drain library reads
    the node again, right before draining); Slurm's own Prolog error is not refined either."""
    from slurm_hooks.slurm import straggler_drain as fleet_drain

    settings = default_settings()
    settings["paths"]["state_dir"] = str(site.state_dir)
    settings["fleet"]["drain"] = True
    settings["fleet"]["confirm_with"] = "none"  # the drain itself is what this tests
    client = SlurmClient(backend=ScontrolBackend(env=cluster.env))
    listing = client.list_nodes

    def list_then_admin_drains():
        nodes = listing()
        cluster.scontrol("update", "NodeName=%s" % SLOW, "State=DRAIN", "Reason=Prolog error")
        return nodes

    client.list_nodes = list_then_admin_drains
    suspects = [s for s in site.scan() if s.node == SLOW]
    (row,) = fleet_drain.enact(settings, suspects, client=client)
    assert row.outcome == "foreign-drain-kept" and site.reason() == "Prolog error", row


def test_a_suspect_slurm_does_not_know_is_left_alone(site):
    write_jobs(
        str(site.records / "more"),
        jobs=12,
        slow="gone17",
        first_job=700,
        seed=11,
        names=["n06", "n07", "n08", "gone17", "n09"],
    )
    data = site.run(str(site.records / "more"))
    assert ("gone17", "left-alone") in outcomes(data)


def test_the_circuit_breaker_counts_the_nodes_own_drains_and_stops_the_fleets(site, cluster):
    for node in ("n10", "n11"):
        cluster.scontrol(
            "update", "NodeName=%s" % node, "State=DRAIN", "Reason=slurm-hooks: gpu.ecc: x -> drain"
        )
    assert outcomes(site.run()) == [(SLOW, "breaker-tripped")] and not site.drained()


def test_one_users_jobs_are_not_enough_evidence(site):
    from slurm_hooks.records.store import encode_record

    for path in site.records.rglob("*.json"):  # as the epilogs would have written them: signed
        record = json.loads(path.read_bytes())
        record["job"]["user"] = "mallory"
        for signature in ("body_sha256", "mac"):
            record.pop(signature, None)
        stamp = path.stat().st_mtime
        path.write_bytes(encode_record(record, KEY, path.parent.name, path.name))
        os.utime(path, (stamp, stamp))
    data = site.run()
    assert data["suspects"][0]["users"] == 1 and not site.drained()
    # said, not silently dropped (before: no row at all, as if it were no suspect)
    assert outcomes(data) == [(SLOW, "too-little-evidence")]
    assert "10 flagged job(s) of 1 user(s)" in data["drains"][0]["message"]


def test_at_most_max_drains_per_run_the_worst_first(site):
    write_jobs(
        str(site.records / "more"), jobs=12, slow="n05", first_job=700, seed=11
    )  # n05 in another set
    site.write_config("max_drains_per_run = 1\nmax_drained = 5\n")  # the per-run cap alone
    data = site.run(str(site.records / "more"))
    assert len({s["node"] for s in data["suspects"]}) == 2
    # the one cut by the cap has a row saying so (before: no row, as if it were no suspect)
    assert sorted(o for _, o in outcomes(data)) == ["drained", "per-run-cap"], data["drains"]
    assert sum(site.drained(n) for n in NODES) == 1


def test_a_figure_anyone_outside_slurm_can_move_is_reported_not_drained(site):
    """n05's foreign_cpu_frac is 10 % in every job: an ssh login running `yes` on its cores looks
    exactly so. Reported, never drained unless [fleet] report_only is emptied (pam_slurm_adopt)."""
    more = str(site.records / "more")
    write_jobs(
        more,
        jobs=12,
        slow="n05",
        first_job=700,
        seed=11,
        slow_figure="foreign_cpu_frac",
        slow_value=0.1,
    )
    data = site.run(more)
    assert ("n05", "foreign_cpu_frac") in [(s["node"], s["metric"]) for s in data["suspects"]]
    assert sorted(outcomes(data)) == [(SLOW, "drained"), ("n05", "report-only")], data["drains"]
    assert not site.drained("n05")
    site.write_config("report_only = []\nmax_drained = 5\n")
    assert sorted(outcomes(site.run(more))) == [(SLOW, "too-little-evidence"), ("n05", "drained")]
    assert site.drained("n05") and "fleet.straggler: foreign_cpu_frac" in site.reason("n05")


def test_a_node_slurm_already_holds_does_not_use_up_max_drains_per_run(site, cluster):
    """Before: the worst suspect, drained by an admin for repair, took the one place of every run for
    the 14 days its evidence stays in its window, and the next slow node was never drained."""
    write_jobs(str(site.records / "more"), jobs=12, slow="n05", first_job=700, seed=11)
    site.write_config("max_drains_per_run = 1\n")
    cluster.scontrol("update", "NodeName=%s" % SLOW, "State=DRAIN", "Reason=admin: reseat GPU 3")
    data = site.run(str(site.records / "more"))
    assert sorted(outcomes(data)) == [(SLOW, "left-alone"), ("n05", "drained")], data["drains"]


def test_a_suspect_an_admin_drained_repaired_and_resumed_is_not_drained_again(site, cluster):
    """Red team, round 2: an admin drains the suspect for repair, swaps its GPU and resumes it.
    Before, the next timer run drained it again on the evidence from before the repair (the rule
    "only jobs started after the drain" was for our own drains); now any drain or DOWN the fleet
    saw counts the same way."""
    cluster.scontrol("update", "NodeName=%s" % SLOW, "State=DRAIN", "Reason=admin: reseat GPU 3")
    assert outcomes(site.run()) == [(SLOW, "left-alone")]
    cluster.scontrol("update", "NodeName=%s" % SLOW, "State=RESUME")
    data = site.run()
    assert outcomes(data) == [(SLOW, "too-little-evidence")] and not site.drained(), data["drains"]
    assert "since Slurm held it" in data["drains"][0]["message"]


def test_a_suspect_held_while_waiting_after_a_reboot_is_remembered_too(site, cluster):
    """Red team, round 3: only suspects chosen for a drain were remembered as held. n03 rebooted
    and ran one clean job (waiting-after-reboot); an admin drained it, swapped the GPU, resumed it,
    and its first job after that had a one-off glitch: all its flags from before the repair
    counted again and it was drained. Now every suspect Slurm holds is remembered."""
    from tests.straggler_records import write

    write_jobs(str(site.records), jobs=12, slow=SLOW, boot_of=lambda node, j: "boot-a")
    for i in range(6):  # the crash and reboot: one clean job on a new boot
        node = "n%02d" % i
        write(
            str(site.records),
            node,
            600,
            {HW: 0.0},
            time.time() - 60,
            user="u7",
            boot="boot-b" if node == SLOW else "boot-a",
        )
    cluster.scontrol("update", "NodeName=%s" % SLOW, "State=DRAIN", "Reason=admin: swap GPU 3")
    data = site.run()
    assert outcomes(data) == [(SLOW, "waiting-after-reboot")], data["drains"]
    held = json.loads((site.state_dir / "fleet-state.json").read_text())["held"]
    assert SLOW in held
    cluster.scontrol("update", "NodeName=%s" % SLOW, "State=RESUME")
    start = time.time() + 1
    for i in range(6):  # the first job after the repair: a one-off glitch on the repaired node
        node = "n%02d" % i
        perf = {HW: 0.2 if node == SLOW else 0.0}
        write(
            str(site.records),
            node,
            601,
            perf,
            start + 400,
            start=start,
            user="u8",
            boot="boot-c" if node == SLOW else "boot-a",
            mtime=time.time(),
        )
    data = site.run()
    assert outcomes(data) == [(SLOW, "too-little-evidence")] and not site.drained(), data["drains"]


def test_a_drain_whose_breaker_recount_failed_is_recounted_by_the_next_run(site, cluster):
    """slurmctld stops answering right after our drain (the rank step's listing fails): the drain stays,
    marked unconfirmed in the state file, and the next run redoes the breaker's count (drainer.confirm)
    and marks it confirmed. Before, nothing ever re-counted it: the next runs do not choose the node."""
    from slurm_hooks.slurm import straggler_drain as fleet_drain
    from slurm_hooks.slurm.errors import SlurmUnavailable

    settings = default_settings()
    settings["paths"]["state_dir"] = str(site.state_dir)
    settings["fleet"]["drain"] = True
    settings["fleet"]["confirm_with"] = "none"  # the drain itself is what this tests
    client = SlurmClient(backend=ScontrolBackend(env=cluster.env))
    listing, calls = client.list_nodes, []

    def third_listing_fails():  # ours (who is held), the breaker's count, then the rank step's
        calls.append(1)
        if len(calls) == 3:
            raise SlurmUnavailable("slurmctld went away")
        return listing()

    client.list_nodes = third_listing_fails
    suspects = [s for s in site.scan() if s.node == SLOW]
    (row,) = fleet_drain.enact(settings, suspects, client=client)
    assert row.outcome == "drained" and "re-count failed" in row.message and site.drained(), row
    assert (
        json.loads((site.state_dir / "fleet-state.json").read_text())["drains"][SLOW]["confirmed"]
        is False
    )

    # one row: the re-count (before: a second one for the same node, counted twice in the prom file)
    (again,) = fleet_drain.enact(
        settings, suspects, client=SlurmClient(backend=ScontrolBackend(env=cluster.env))
    )
    assert again.outcome == "already-drained-by-us" and site.drained(), again
    assert (
        json.loads((site.state_dir / "fleet-state.json").read_text())["drains"][SLOW]["confirmed"]
        is True
    )


def test_the_fleet_stops_at_its_own_budget_so_the_breaker_keeps_room_for_real_faults(site, cluster):
    """Red team of issue 17: two users could get healthy nodes drained as stragglers run after run
    (only an admin clears one) until the shared breaker was full, and then a node with a real Xid 79
    was not drained. The fleet stops at [fleet] max_drained nodes carrying its drain; a resumed node
    whose Reason outlived the RESUME (24.11, 25.11) does not count."""
    from slurm_hooks.core.config import SECTIONS
    from slurm_hooks.slurm import straggler_drain as fleet_drain

    write_jobs(str(site.records / "more"), jobs=12, slow="n05", first_job=700, seed=11)
    # a drain of the release before (its format, 'slurm-hooks: fleet.straggler: ...'): still counted
    earlier = fleet_drain.reason_for(site.scan()[0], "slurm-hooks:", 200)
    earlier = earlier.replace("slurm-hooks:", "slurm-hooks: ", 1)
    assert earlier.startswith("slurm-hooks: fleet.straggler: ")
    cluster.scontrol("update", "NodeName=n09", "State=DRAIN", "Reason=%s" % earlier)
    site.write_config("max_drained = 1\n")
    data = site.run(str(site.records / "more"))
    assert sorted(outcomes(data)) == [(SLOW, "fleet-budget-full"), ("n05", "fleet-budget-full")]
    assert not site.drained() and not site.drained("n05")
    cluster.scontrol("update", "NodeName=n09", "State=RESUME")
    data = site.run(str(site.records / "more"))
    assert sorted(o for _, o in outcomes(data)) == ["drained", "fleet-budget-full"], data["drains"]
    # the breaker's smallest limit is 2: room left
    assert SECTIONS["fleet"]["max_drained"].default == 1


def test_a_drain_time_from_a_clock_that_ran_ahead_is_kept_as_now(site, cluster):
    """Red team, round 4 (tracker 24, Low): the admin host's clock ran a year ahead when we drained
    the suspect. The time was then dropped as unbelievable, so after an admin's resume the next run
    drained the node again on the very evidence it was drained for. Now a time after now becomes
    now (and is written back): only jobs that started after it count."""
    assert outcomes(site.run()) == [(SLOW, "drained")]
    path = site.state_dir / "fleet-state.json"
    state = json.loads(path.read_text())
    state["drains"][SLOW]["time"] = time.time() + 365 * 86400  # the clock ran ahead
    path.write_text(json.dumps(state))
    cluster.scontrol("update", "NodeName=%s" % SLOW, "State=RESUME")  # an admin repaired it

    before = time.time()
    data = site.run()
    assert outcomes(data) == [(SLOW, "too-little-evidence")] and not site.drained(), data["drains"]
    kept = json.loads(path.read_text())["drains"][SLOW]["time"]
    assert before <= kept <= time.time() + 1, kept  # clamped to now, and kept

    # new jobs after that moment, still slow, drain it again: the clamp does not block forever
    soon = time.time() + 5
    write_jobs(str(site.records), jobs=3, slow=SLOW, first_job=500, seed=7)
    for node_dir in site.records.iterdir():
        for job in ("500", "501", "502"):
            _shift(node_dir / ("%s.json" % job), soon + int(job) * 10)
    assert outcomes(site.run()) == [(SLOW, "drained")] and site.drained()


def test_a_hold_time_from_a_clock_that_ran_ahead_is_kept_as_now_too():
    from slurm_hooks.slurm import straggler_drain

    now = 1_800_000_000.0
    state = {
        "drains": {"n01": {"time": now + 86400}, "n02": {"time": now + 60}},
        "held": {"n03": now + 86400, "n04": now - 60},
    }
    assert straggler_drain._clamp_future(state, now) == ["n01", "n03"]
    assert state["drains"]["n01"]["time"] == now and state["held"]["n03"] == now
    assert state["drains"]["n02"]["time"] == now + 60 and state["held"]["n04"] == now - 60
