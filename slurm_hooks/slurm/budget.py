"""How long a hook may spend on slurmctld for one drain or resume.

Its own module, free of the Slurm client, because config validation needs the figure at every load
(core/config.py warns when [deadline] plus this budget passes what Slurm allows a hook), and the
happy path of a hook loads nothing of Slurm's: importing drainer.py for it cost ~5 ms of every
prolog (the client, the breaker, node_state and `calendar` with it).
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Mapping
# slurmctld stamps a reason with time(NULL) (whole seconds) under its node write lock. One second
# after our drain request returned, its clock has passed our drain's second, so any drain not yet
# visible will get a later time and sort after ours. 0.1 s covers clock rate differences (NTP slews
# at most 0.5 ms/s) and scheduling; see docs/slurm.md.
SETTLE_S = 1.1


def slurm_budget(settings: Mapping[str, Mapping[str, Any]], backoff: float = 0.5) -> float:
    """Seconds one hook may spend on Slurm for a drain or resume, lock wait included: the documented
    `timeout x attempts + backoff` of one call, plus the breaker's settle wait."""
    drain = settings["drain"]
    attempts = int(drain["attempts"])
    return float(drain["timeout"]) * attempts + backoff * (2 ** (attempts - 1) - 1) + SETTLE_S
