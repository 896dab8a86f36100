"""The prolog, epilog and health modes: run checks, decide, drain or resume, log, pick the exit code.

Fail open on our own problems: a broken config, a hostile job environment or a crash in our code
logs loudly and exits 0, because a hook that exits non-zero makes slurmctld drain the node — and a
bug of ours must never drain a cluster. Only a node-broken FAIL (policy.decide) drains.

The exit code follows the node, not the wish: ExitCode.NODE_BROKEN (10) only when the node carries DRAIN now
(we drained it, it already was, or someone else's drain is on it). Whenever we do not drain -- the
breaker, the breaker cannot count, Slurm unreachable, a state we leave alone (MAINT reservation,
DOWN, FAIL...) -- the hook exits 0, because a non-zero exit makes slurmctld drain the node itself
('Prolog error'), behind the breaker's back. The job then runs; the CRITICAL/ERROR line says why.

Local state (paths.state_dir/node-state.json) remembers the drain we made (Slurm's exact reason and
reason time: the proof it is ours) and drains we could not deliver; the health mode re-runs those
checks and resumes only when every one of them passed, or retries. A missing state file means the
state is lost (diskless node after a reboot, a write that failed): the health mode then asks Slurm
once and rebuilds it from our reason, which names the checks. The happy path makes no Slurm call.

Bounded after the checks too: the exit code is decided before anything is written, and the steps
after the decision (the epilog's record with its retention, metrics, dcgm-exporter mapping) run
in a forked child for at most [deadline] files (isolation.run_steps); the prolog's snapshot file
is written by the check child under the same bound, and so is the state file read and written. A step that did not finish (a records file system that never
answers) is logged with its path (event=step-abandoned) and counted in the metrics.

One module per job:
  fail_open     main_hook (the console script's prolog/epilog/health entry) and fail_open
  flow          run_hook: the order of a run (job environment, checks, decision, enactment, steps after)
  bounded       everything with a time bound: the checks' forked child (with the counter snapshot)
                and the file steps after the decision (isolation.run_steps)
  state         node-state.json: where it is, its bounded read and write, what a drain records there
  enactment     a drain under the node's lock: lemon verdict, repair ladder, drain history
  recovery      the health mode's resume on proof, and rebuilding a lost state from Slurm
  decision_log  the one log line per decision

What the prolog's happy path needs (fail_open, flow, bounded, decision_log) is imported with the package;
state, enactment and recovery only when a run needs them (the names below stay importable from here).
"""

from __future__ import annotations

from .bounded import ISOLATION_GRACE_S, run_isolated_checks
from .fail_open import fail_open, main_hook
from .flow import OPT_OUT_TOKEN, HookResult, node_name, opted_out, run_hook

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any

# name -> the submodule that defines it, imported on first use (PEP 562): the happy path does not load them
_LOADED_ON_USE = {
    "state_path": "state",
    "read_state": "state",
    "save_state": "state",
    "lemon_reason": "recovery",
}

__all__ = [
    "ISOLATION_GRACE_S",
    "OPT_OUT_TOKEN",
    "HookResult",
    "fail_open",
    "main_hook",
    "node_name",
    "opted_out",
    "run_hook",
    "run_isolated_checks",
    *_LOADED_ON_USE,
]


def __getattr__(name: str) -> Any:
    submodule = _LOADED_ON_USE.get(name)
    if submodule is None:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    from importlib import import_module

    return getattr(import_module("%s.%s" % (__name__, submodule)), name)
