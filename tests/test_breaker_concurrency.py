"""The circuit breaker under concurrency, against a real slurmctld with 21 nodes (issue 12 §1).

A bad check or config reaches many nodes at once; that is the case the breaker exists for. Here 20
processes -- one per node, each with everything imported first -- call the drain library at one
agreed instant (they overlap within a few tens of milliseconds on 2 cores), through the scontrol
backend, against one real slurmctld whose nodes have no slurmd (SLURM-NOTES "Many nodes on one host":
State=IDLE, SlurmdTimeout=0, so they stay IDLE+NOT_RESPONDING and take DRAIN/RESUME like real ones).

The promise (docs/slurm.md, "The circuit breaker"): at rest, never more nodes drained by slurm-hooks
than the limit (21 nodes, 10 %, min_nodes 2 -> 2). Before this was fixed, the same trials left 8 to 16
nodes drained. Also measured (printed; run with -s): the transient overshoot (the most nodes drained by
us at any instant, polled with scontrol every ~50 ms while the trial runs), the time one drain() takes, and the Slurm
calls per drain.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from pathlib import Path

import pytest

from slurm_hooks.core.config import SECTIONS
from slurm_hooks.slurm import drainer
from slurm_hooks.slurm.client import ScontrolBackend, SlurmClient
from slurm_hooks.slurm.node_state import parse_nodes

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

NODE_COUNT = 21
DRAINERS = 20  # node02..node21 fail at once; node01 stays healthy
TRIALS = 5
LIMIT = 2  # max(min_nodes 2, floor(10 % of 21))
PREFIX = "sh:"
NODES = tuple("node%02d" % i for i in range(1, NODE_COUNT + 1))


def settings(breaker=None):
    # not tests.helpers.default_settings: this module also runs as the drivers' script (tests/ first
    # on sys.path, no `tests` package), so it writes the same thing out
    values = {
        section: {k: s.default for k, s in schema.items()} for section, schema in SECTIONS.items()
    }
    values["general"]["mode"] = "enforce"  # drains are expected; the shipped default observes
    values["drain"]["timeout"] = 20.0  # 20 clients at once on 2 cores: let slow answers finish
    values["breaker"].update(breaker or {})
    return values


def drained_by_us(env):
    """Names of nodes that are DRAIN with an automatic slurm-hooks reason, as slurmctld says now."""
    out = ScontrolBackend(env=env, timeout=20.0)._run(["--all", "--oneliner", "show", "node"])
    return sorted(
        n.name for n in parse_nodes(out) if n.is_drained and (n.reason or "").startswith(PREFIX)
    )


TRIAL_REASON = "sh:gpu.count g0: GPU 0 fell off the bus (trial) -> reboot"


def _drain_at(env, node, start_at, out_fd, breaker=None, reason=TRIAL_REASON):
    """One node's prolog deciding to drain: everything is imported (fork), wait for the agreed instant."""
    import json
    import os

    client = SlurmClient(backend=ScontrolBackend(env=env, timeout=20.0))
    answered = []  # (operation, when slurmctld's answer was back): the read-to-write gaps
    client.after_request = lambda op: answered.append((op[0], time.time()))
    while time.time() < start_at:
        time.sleep(min(0.001, max(0.0, start_at - time.time())))
    began = time.time()
    try:
        enacted = drainer.drain(client, node, reason, settings(breaker))
        outcome, message = enacted.outcome.value, enacted.message
    except Exception as exc:  # reported to the parent, which fails the test with it
        outcome, message = "crash", repr(exc)
    row = json.dumps([node, outcome, message, began, time.time(), client.calls, answered]) + "\n"
    os.write(
        out_fd, row.encode()
    )  # one write per child: a line shorter than PIPE_BUF arrives whole


def driver(env, nodes, start_at, breaker=None, reasons=None):
    """Run in a fresh, single-threaded interpreter (forking a process that has threads -- pytest's,
    the cluster's refusing listener -- can deadlock): import everything, fork one child per node, and
    print each child's result line."""
    import os

    read_fd, write_fd = os.pipe()
    children = []
    for node in nodes:
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            try:
                _drain_at(
                    env, node, start_at, write_fd, breaker, (reasons or {}).get(node, TRIAL_REASON)
                )
            finally:
                os._exit(0)
        children.append(pid)
    os.close(write_fd)
    with os.fdopen(read_fd) as rows:
        for line in rows:
            print(line, end="", flush=True)
    for pid in children:
        os.waitpid(pid, 0)


class Monitor(threading.Thread):
    """Polls the node list while a trial runs; keeps the largest number of nodes drained by us."""

    def __init__(self, env):
        super().__init__(daemon=True)
        self.env, self.peak, self.polls = env, 0, 0
        self.stopping = threading.Event()

    def run(self):
        while not self.stopping.is_set():
            try:
                self.peak = max(self.peak, len(drained_by_us(self.env)))
                self.polls += 1
            except Exception:  # noqa: BLE001 - a poll that fails under load is just skipped
                pass
            time.sleep(0.05)


@pytest.fixture(scope="module")
def many(slurm_cluster_factory):
    return slurm_cluster_factory(
        "breaker",
        nodes=NODES,
        with_slurmd=False,
        extra_node_state="IDLE",
        slurmd_timeout=0,
        message_timeout=20,
    )


def _reset(cluster):
    for name in NODES:
        if "DRAIN" in cluster.node_state(name).split("+"):
            cluster.scontrol("update", "NodeName=%s" % name, "State=UNDRAIN")
    assert drained_by_us(cluster.env) == []


ADMIN_REASON = "admin: bulk drain for a firmware update"
ADMIN_DRAINS = 10


class AdminBulkDrain(threading.Thread):
    """An admin's bulk drain of up to 10 nodes (one scontrol call), fired while the breaker undoes
    drains: once the nodes drained by us have peaked and started to fall, it drains (up to 10 of)
    those still drained by us. Some of their drainers have read the re-count that decides the undo and not yet sent the
    RESUME: before the fix those RESUMEs dropped the admin's drain (the node went back into service)."""

    def __init__(self, env, cluster):
        super().__init__(daemon=True)
        self.env, self.cluster, self.nodes, self.at, self.done = env, cluster, [], 0.0, 0.0
        self.stopping = threading.Event()

    def run(self):
        peak = 0
        while not self.stopping.is_set():
            try:
                now = drained_by_us(self.env)
            except Exception:  # noqa: BLE001 - a poll that fails under load is just skipped
                continue
            peak = max(peak, len(now))
            if peak > LIMIT and len(now) < peak and len(now) > LIMIT:
                self.nodes = now[:ADMIN_DRAINS]
                self.at = time.time()
                self.cluster.scontrol(
                    "update",
                    "NodeName=" + ",".join(self.nodes),
                    "State=DRAIN",
                    "Reason=" + ADMIN_REASON,
                )
                self.done = time.time()
                return
            time.sleep(0.005)


def run_trial(cluster, admin=False, breaker=None, reasons=None):
    import json
    import subprocess
    import sys

    start_at = (
        time.time() + 1.5
    )  # the driver has imported everything and forked every child by then
    args = json.dumps([cluster.env, list(NODES[1 : 1 + DRAINERS]), start_at, breaker, reasons])
    driver_proc = subprocess.Popen(
        [sys.executable, __file__, args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(Path(__file__).resolve().parent.parent),
    )
    monitor = AdminBulkDrain(cluster.env, cluster) if admin else Monitor(cluster.env)
    monitor.start()
    out, _ = driver_proc.communicate(timeout=180)
    monitor.stopping.set()
    monitor.join(30)
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert len(rows) == DRAINERS, out
    return rows, monitor


def admin_reasons(env):
    out = ScontrolBackend(env=env, timeout=20.0)._run(["--all", "--oneliner", "show", "node"])
    return {n.name: n.reason for n in parse_nodes(out) if n.is_drained}


ADMIN_TRIALS = 4


def test_every_undo_rereads_its_node_while_an_admin_bulk_drains(many):
    """Issue tracker 24: 20 drains race, and an admin bulk-drains 10 of the nodes while the breaker
    undoes. Every undo must be made on a read of the node right before its RESUME (before the fix it
    acted on the re-count listing; this assertion failed then). Slurm has no compare-and-set, so an
    admin's drain overlapping the last read and the RESUME can still be lost: the losses are printed
    (run with -s), figures before and after the fix in docs/slurm.md. The breaker's limit holds."""
    lost_per_trial, gaps, inside, outside = [], [], set(), {}
    for trial in range(ADMIN_TRIALS):
        _reset(many)
        rows, admin = run_trial(many, admin=True)
        if not admin.nodes:  # every drain tripped the breaker before draining: nothing to undo
            print("\n[breaker+admin trial %d] no undo to race: %s" % (trial + 1, rows))
            continue
        reasons = admin_reasons(many.env)
        lost = sorted(n for n in admin.nodes if reasons.get(n) != ADMIN_REASON)
        lost_per_trial.append(len(lost))
        print(
            "\n[breaker+admin trial %d] admin drains lost %d of %d %s; outcomes %s"
            % (trial + 1, len(lost), len(admin.nodes), lost, sorted(r[1] for r in rows))
        )
        assert len(drained_by_us(many.env)) <= LIMIT, rows
        for row in rows:  # the read right before the undo, and the RESUME's answer
            ops = row[6]
            if not ops or ops[-1][0] != "resume":
                continue
            # every undo is made on a read of the node right before it (before the fix: on the
            # re-count listing, so an admin's drain anywhere after that listing was RESUMEd)
            assert ops[-2][0] == "show_node", (row[0], ops)
            gaps.append(ops[-1][1] - ops[-2][1])
            # the admin's request was in flight from admin.at to admin.done
            if row[0] in admin.nodes and admin.at < ops[-1][1] and admin.done > ops[-2][1]:
                inside.add((trial, row[0]))
        outside[trial] = {
            n: [(op, round(t - admin.at, 3)) for op, t in r[6]]
            for r in rows
            for n in lost
            if r[0] == n and (trial, n) not in inside
        }
    assert lost_per_trial, "no trial had an undo for the admin to race"
    print(
        "\n[breaker+admin] admin drains lost per trial: %s; read-before-undo -> RESUME answered: "
        "median %.0f ms, max %.0f ms; admin drains that overlapped that gap: %d; lost outside it "
        "(timelines from the admin's request): %s"
        % (
            lost_per_trial,
            statistics.median(gaps) * 1000 if gaps else -1,
            max(gaps) * 1000 if gaps else -1,
            len(inside),
            {t: v for t, v in outside.items() if v},
        )
    )


def test_twenty_simultaneous_drains_never_exceed_the_limit(many):
    figures = []
    for trial in range(TRIALS):
        _reset(many)
        rows, monitor = run_trial(many)
        crashed = [
            r for r in rows if r[1] in ("crash", "slurm-unavailable", "slurm-error", "cannot-count")
        ]
        assert not crashed, crashed
        began = [r[3] for r in rows]
        at_rest = drained_by_us(many.env)
        kept = sorted(r[0] for r in rows if r[1] == "drained")
        figures.append(
            {
                "at_rest": len(at_rest),
                "peak": monitor.peak,
                "polls": monitor.polls,
                "spread_ms": (max(began) - min(began)) * 1000,
                "drain_s": [r[4] - r[3] for r in rows],
                "calls": {r[1]: r[5] for r in rows},
            }
        )
        print(
            "\n[breaker trial %d] drained at rest %d (limit %d), peak %d over %d polls, start spread %.0f ms, "
            "outcomes %s"
            % (
                trial + 1,
                len(at_rest),
                LIMIT,
                monitor.peak,
                monitor.polls,
                figures[-1]["spread_ms"],
                sorted(r[1] for r in rows),
            )
        )
        assert len(at_rest) <= LIMIT, (at_rest, rows)
        # and the breaker is not over-eager: exactly the limit stays drained, and those are the nodes
        # whose drain() said so
        assert len(at_rest) == LIMIT and kept == at_rest, (at_rest, rows)
    times = [t for f in figures for t in f["drain_s"]]
    print(
        "\n[breaker] %d trials x %d drains: max at rest %d, max transient %d, drain() median %.2fs max %.2fs, "
        "start spread max %.0f ms; Slurm calls by outcome %s"
        % (
            TRIALS,
            DRAINERS,
            max(f["at_rest"] for f in figures),
            max(f["peak"] for f in figures),
            statistics.median(times),
            max(times),
            max(f["spread_ms"] for f in figures),
            figures[-1]["calls"],
        )
    )


WIDE = {"max_percent": 100.0, "min_nodes": 0, "max_nodes": 0}  # the share does not bind


def test_the_rate_window_holds_under_twenty_simultaneous_drains_and_slides(many):
    """Tracker 27: at most max_window_drains automatic drains within window_s, counted from Slurm's
    reason times, under the same 20-way race; once the window has passed, as many again may drain."""
    window_s, per_window = 4.0, 3
    limits = dict(WIDE, max_window_drains=per_window, window_s=window_s, common_cause_nodes=0)
    figures = []
    for trial in range(2):
        _reset(many)
        rows, _ = run_trial(many, breaker=limits)
        first = drained_by_us(many.env)
        assert len(first) == per_window, (first, rows)
        time.sleep(window_s + 1.2)  # slurmctld's clock passes the window of the first burst
        rows2, _ = run_trial(many, breaker=limits)
        second = drained_by_us(many.env)
        figures.append((len(first), len(second), sorted(r[1] for r in rows + rows2)))
        print(
            "\n[breaker window trial %d] at rest after burst 1: %d, after burst 2: %d; %s"
            % (trial + 1, len(first), len(second), figures[-1][2])
        )
        assert len(second) == 2 * per_window and set(first) < set(second), (second, rows2)


def test_a_common_cause_holds_each_check_under_twenty_simultaneous_drains(many):
    """Tracker 27: ten nodes fail gpu.xid and ten fail gpu.ecc in the same instant; with
    common_cause_nodes 3, exactly three of each stay drained and the rest are held as a common cause."""
    limits = dict(WIDE, max_window_drains=0, common_cause_nodes=3, common_cause_window_s=600.0)
    racers = NODES[1 : 1 + DRAINERS]
    reasons = {
        n: (
            "sh:gpu.xid g0: gpu:0 Xid 79 (trial) -> reboot"
            if i % 2
            else "sh:gpu.ecc g1: DBE -> rma"
        )
        for i, n in enumerate(racers)
    }
    for trial in range(3):
        _reset(many)
        rows, monitor = run_trial(many, breaker=limits, reasons=reasons)
        at_rest = admin_reasons(many.env)
        by_check = {}
        for name, reason in at_rest.items():
            by_check.setdefault(reason.split(" ")[0], []).append(name)
        held = [r for r in rows if r[1] in ("breaker-tripped", "breaker-undone")]
        print(
            "\n[breaker common-cause trial %d] at rest %s; peak %d; held %d, of them with "
            "'common cause' %d"
            % (
                trial + 1,
                {k: len(v) for k, v in by_check.items()},
                monitor.peak,
                len(held),
                sum("common cause" in r[2] for r in held),
            )
        )
        assert {k: len(v) for k, v in by_check.items()} == {"sh:gpu.xid": 3, "sh:gpu.ecc": 3}, rows
        assert len(held) == 14 and all("common cause" in r[2] for r in held), held


def test_the_absolute_cap_holds_under_twenty_simultaneous_drains(many):
    """Tracker 27: max_nodes caps the drains at once whatever the share allows (here 100 %)."""
    _reset(many)
    rows, monitor = run_trial(many, breaker=dict(WIDE, max_nodes=4, common_cause_nodes=0))
    at_rest = drained_by_us(many.env)
    print("\n[breaker max_nodes 4] at rest %d, peak %d" % (len(at_rest), monitor.peak))
    assert len(at_rest) == 4 and sorted(r[0] for r in rows if r[1] == "drained") == at_rest, rows


if __name__ == "__main__":  # the driver process of run_trial
    import json

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    driver(*json.loads(sys.argv[1]))
