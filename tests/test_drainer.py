"""Drain etiquette, breaker and hook exit codes, against an in-memory Slurm backend.

The in-memory backend only stands in for speed here; the same flows run against the real
slurmctld in tests/test_hooks_slurm.py.
"""
from __future__ import annotations

import pytest

from slurm_hooks import drainer
from slurm_hooks.config import SECTIONS
from slurm_hooks.drainer import Outcome
from slurm_hooks.slurm import Backend, NodeInfo, NodeNotFound, SlurmClient, SlurmUnavailable


class MemoryBackend(Backend):
    name = "memory"

    def __init__(self, nodes):
        super().__init__()
        self.nodes = {n.name: n for n in nodes}
        self.down = False

    def _count(self):
        self.calls += 1
        if self.down:
            raise SlurmUnavailable("Unable to contact slurm controller (connect failure)")

    def show_node(self, name):
        self._count()
        if name not in self.nodes:
            raise NodeNotFound(name)
        return self.nodes[name]

    def list_nodes(self):
        self._count()
        return list(self.nodes.values())

    def drain(self, name, reason):
        self._count()
        node = self.nodes[name]
        self.nodes[name] = NodeInfo(name, node.state, node.flags | {"DRAIN"}, reason)

    def resume(self, name):
        self._count()
        node = self.nodes[name]
        self.nodes[name] = NodeInfo(name, node.state, node.flags - {"DRAIN"}, None)


def settings(**sections):
    values = {section: {k: s.default for k, s in schema.items()} for section, schema in SECTIONS.items()}
    for section, overrides in sections.items():
        values[section].update(overrides)
    return values


def cluster(*extra):
    return MemoryBackend([NodeInfo("node1", "IDLE")] + [NodeInfo("node%d" % (i + 2), "IDLE") for i in range(8)]
                         + list(extra))


REASON = "slurm-hooks: gpu.memory: gpu:3 0000:3b:00.0 row-remap pending -> reset-gpu"


def test_drain_sets_our_reason_in_three_calls():
    backend = cluster()
    client = SlurmClient(backend)
    enacted = drainer.drain(client, "node1", REASON, settings())
    assert enacted.outcome is Outcome.DRAINED
    assert backend.nodes["node1"].reason == REASON and backend.nodes["node1"].is_drained
    assert client.calls == 3  # show, list (breaker), drain


@pytest.mark.parametrize("reason,outcome,kept", [
    ("bad PSU, ticket 4711", Outcome.FOREIGN_DRAIN, True),
    ("slurm-hooks: gpu.ecc: x", Outcome.ALREADY_OURS, True),
    ("Prolog error", Outcome.REFINED, False),
])
def test_existing_drains(reason, outcome, kept):
    backend = cluster()
    backend.nodes["node1"] = NodeInfo("node1", "IDLE", frozenset({"DRAIN"}), reason)
    enacted = drainer.drain(SlurmClient(backend), "node1", REASON, settings())
    assert enacted.outcome is outcome
    assert (backend.nodes["node1"].reason == reason) is kept


def test_states_we_do_not_handle_are_left_alone():
    backend = cluster()
    backend.nodes["node1"] = NodeInfo("node1", "DOWN", frozenset({"NOT_RESPONDING"}), "Not responding")
    enacted = drainer.drain(SlurmClient(backend), "node1", REASON, settings())
    assert enacted.outcome is Outcome.SKIPPED_STATE and "DOWN" in enacted.message
    assert not backend.nodes["node1"].is_drained


def test_breaker_stops_mass_drains():
    backend = cluster()
    for i in (2, 3):
        backend.nodes["node%d" % i] = NodeInfo("node%d" % i, "IDLE", frozenset({"DRAIN"}), "slurm-hooks: gpu.x: y")
    enacted = drainer.drain(SlurmClient(backend), "node1", REASON, settings())
    assert enacted.outcome is Outcome.BREAKER and enacted.breaker.drained_by_us == 2
    assert not backend.nodes["node1"].is_drained
    enacted = drainer.drain(SlurmClient(backend), "node1", REASON, settings(breaker={"min_nodes": 3}))
    assert enacted.outcome is Outcome.DRAINED


def test_observe_mode_makes_no_call():
    backend = cluster()
    client = SlurmClient(backend)
    enacted = drainer.drain(client, "node1", REASON, settings(general={"mode": "observe"}))
    assert enacted.outcome is Outcome.OBSERVE and client.calls == 0 and not backend.nodes["node1"].is_drained


def test_slurm_down_is_an_outcome_not_a_crash():
    backend = cluster()
    backend.down = True
    assert drainer.drain(SlurmClient(backend), "node1", REASON, settings()).outcome is Outcome.SLURM_UNAVAILABLE
    assert drainer.resume(SlurmClient(backend), "node1", settings()).outcome is Outcome.SLURM_UNAVAILABLE


def test_resume_only_our_drains():
    backend = cluster()
    backend.nodes["node1"] = NodeInfo("node1", "IDLE", frozenset({"DRAIN"}), "admin: reseat GPU 3")
    assert drainer.resume(SlurmClient(backend), "node1", settings()).outcome is Outcome.NOT_OURS
    assert backend.nodes["node1"].is_drained
    assert drainer.resume(SlurmClient(backend), "node1", settings(), force=True).outcome is Outcome.RESUMED
    backend.nodes["node1"] = NodeInfo("node1", "IDLE", frozenset({"DRAIN"}), REASON)
    assert drainer.resume(SlurmClient(backend), "node1", settings()).outcome is Outcome.RESUMED
    assert drainer.resume(SlurmClient(backend), "node1", settings()).outcome is Outcome.NOT_DRAINED
