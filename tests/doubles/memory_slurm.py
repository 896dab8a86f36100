"""An in-memory slurmctld (MemoryBackend, a slurm.client.Backend) for the drain flow's tests.

It stands in for speed and for interleavings a real controller will not produce on cue (a drain landing
in the same second, an admin drain between our read and our write). It follows src/slurmctld/node_mgr.c
of 22.05 to 26.05 where it matters: update_node stamps a reason with the controller's clock in whole
seconds; RESUME with a Reason sets it first; RESUME clears the reason except on 24.11/25.11 with
accounting_storage/none (keep_reason_on_resume: clusteracct_storage_g_node_up returns before clearing
it); slurmctld's own drains (_drain_node) keep an existing reason with its old time and user. The same
flows run against the real slurmctld in tests/test_e2e_slurm.py, test_drain_slurm.py and
test_breaker_concurrency.py. cluster() is node1..node9, idle; settings() the default [sections].
"""

from __future__ import annotations

import time

from slurm_hooks.slurm.client import Backend
from slurm_hooks.slurm.errors import (
    InvalidNodeState,
    NodeNotFound,
    SlurmCommandError,
    SlurmUnavailable,
)
from slurm_hooks.slurm.node_state import NodeInfo

T0 = 1796256000.0  # 2026-12-02T00:00:00Z


def stamp(clock):
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(int(clock)))


class MemoryBackend(Backend):
    name = "memory"

    def __init__(self, nodes, keep_reason_on_resume=False):
        super().__init__()
        self.nodes = {n.name: n for n in nodes}
        self.down = False
        self.clock = T0 + 0.25
        self.keep_reason_on_resume = (
            keep_reason_on_resume  # 24.11/25.11 with accounting_storage/none
        )
        self.before = {}  # op -> callable run before that op is served (interleavings)
        self.failing = set()  # ops that raise SlurmUnavailable
        self.log = []
        self.reboots = []  # (node, reason, next_state) of every reboot request

    def advance_clock(self, seconds):
        hook = self.before.pop("settle", None)
        if hook:
            hook()
        self.clock += seconds

    def controller_time(self):
        """The simulated controller's clock, for the breaker's windows (drainer._now)."""
        return self.clock

    def _serve(self, op):
        self.calls += 1
        self.log.append(op)
        hook = self.before.pop(op, None)
        if hook:
            hook()
        if self.down or op in self.failing:
            raise SlurmUnavailable("Unable to contact slurm controller (connect failure)")
        self.clock += 0.004

    def show_node(self, name):
        self._serve("show")
        if name not in self.nodes:
            raise NodeNotFound(name)
        return self.nodes[name]

    def list_nodes(self):
        self._serve("list")
        return list(self.nodes.values())

    def set_reason(self, name, reason, user="root", flags_add=(), flags_del=()):
        n = self.nodes[name]
        self.nodes[name] = NodeInfo(
            name,
            n.state,
            (n.flags | set(flags_add)) - set(flags_del),
            reason,
            user if reason else None,
            stamp(self.clock) if reason else None,
        )

    def drain(self, name, reason):
        self._serve("drain")
        self.admin_drain(name, reason)

    def admin_drain(self, name, reason, flag="DRAIN"):
        """scontrol update NodeName=name State=DRAIN|FAIL Reason=reason (no call counted). Like
        update_node, the same state and reason again change nothing (the reason time stays)."""
        n = self.nodes[name]
        if flag in n.flags and n.reason == reason:
            return
        self.set_reason(name, reason, flags_add={flag})

    def ctld_drain(self, name, reason="Epilog error"):
        """slurmctld's own drain (node_mgr.c _drain_node): an existing reason stays, time and user too."""
        n = self.nodes[name]
        if n.is_drained:
            return
        if n.reason is None or n.reason.startswith("Not responding"):
            self.set_reason(name, reason, user="slurm", flags_add={"DRAIN"})
        else:
            self.nodes[name] = NodeInfo(
                name, n.state, n.flags | {"DRAIN"}, n.reason, n.reason_user, n.reason_time
            )

    def reboot(self, name, reason, next_state):
        """scontrol reboot ASAP nextstate=X reason=R: as 22.05 does on an idle node (docs/slurm.md):
        DRAIN+REBOOT_ISSUED at once, ' : reboot issued' appended to the reason; DRAIN refused."""
        self._serve("reboot")
        if next_state not in ("DOWN", "RESUME"):
            raise SlurmCommandError(["scontrol", "reboot"], 1, "")
        self.set_reason(name, reason + " : reboot issued", flags_add={"DRAIN", "REBOOT_ISSUED"})
        self.reboots.append((name, reason, next_state))

    def resume(self, name, reason=None):
        self._serve("resume")
        self.admin_resume(name, reason)

    def admin_resume(self, name, reason=None):
        n = self.nodes[name]
        if not (n.is_drained or n.is_failed or n.is_down):
            raise InvalidNodeState(
                ["scontrol"], 1, "slurm_update error: Invalid node state specified"
            )
        if reason:
            self.set_reason(name, reason)
            n = self.nodes[name]
        keep = self.keep_reason_on_resume
        self.nodes[name] = NodeInfo(
            name,
            n.state,
            n.flags - {"DRAIN", "FAIL"},
            n.reason if keep else None,
            n.reason_user if keep else None,
            n.reason_time if keep else None,
        )


def settings(**sections):
    from tests.helpers import default_settings

    return default_settings(**sections)


def cluster(*extra, **kw):
    return MemoryBackend(
        [NodeInfo("node1", "IDLE")]
        + [NodeInfo("node%d" % (i + 2), "IDLE") for i in range(8)]
        + list(extra),
        **kw,
    )


REASON = "sh:gpu.memory g3: gpu:3 0000:3b:00.0 row-remap pending -> reset-gpu"
