"""What talking to slurmctld can raise (client.py, node_state.py): one hierarchy under SlurmError,
so the drain flow turns each kind into its own outcome (drainer.slurm_failure)."""

from __future__ import annotations

from typing import Optional, Sequence

# ---------------------------------------------------------------------------------------------
# errors


class SlurmError(Exception):
    """Base class of everything the Slurm client raises."""


class SlurmParseError(SlurmError, ValueError):
    """Slurm output we do not understand (the text is in the message, truncated)."""


class SlurmUnavailable(SlurmError):
    """slurmctld could not be reached in the time allowed (down, hung, munge broken, no client)."""


class SlurmClientMissing(SlurmUnavailable):
    """The Slurm client itself cannot run here (``scontrol`` not installed or not executable).

    A SlurmUnavailable for the drain flow (nothing reached slurmctld), but a different message for
    the admin: installing the client fixes it, waiting for slurmctld does not."""


class NodeNotFound(SlurmError):
    """Slurm does not know this node name."""

    def __init__(self, node: str, detail: str = "") -> None:
        super().__init__("node %r not found%s" % (node, ": " + detail.strip() if detail else ""))
        self.node = node


class SlurmCommandError(SlurmError):
    """Slurm refused the request (non-zero rc / RPC error that is not transient): not retried."""

    def __init__(self, argv: Sequence[str], returncode: Optional[int], stderr: str) -> None:
        super().__init__("%s failed (rc=%s): %s" % (" ".join(argv), returncode, stderr.strip()))
        self.argv, self.returncode, self.stderr = tuple(argv), returncode, stderr


class InvalidNodeState(SlurmCommandError):
    """slurmctld refused a state change for the node's current state, e.g. RESUME of a node that is
    no longer drained: "Invalid node state specified" (22.05, 24.11), "Invalid node state
    transition" (26.05)."""
