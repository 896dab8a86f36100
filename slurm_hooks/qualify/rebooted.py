"""A node DOWN after a reboot Slurm issued for a drain of ours: what `qualify --due` (due.py) and
`qualify --node` (through_slurm.py) both recognise. Slurm's words are measured on 22.05
(tests/captures/slurm/22.05.8/show-node-down-after-reboot.txt) and read in 25.11's source
(src/slurmctld/node_mgr.c, validate_node_specs).
"""

from __future__ import annotations

import re

from ..slurm import policy
from ..slurm.lemon import is_lemon

# what slurmctld appends to the reason when a node it rebooted registers again (node_mgr.c,
# validate_node_specs; 22.05 shows '<reason> : reboot issued : reboot complete', the node DOWN
# when the reboot's nextstate was DOWN): its own word that the reboot it issued is done
REBOOT_COMPLETE = " : reboot complete"
REBOOT_ACTION = re.compile(r"-> (reboot|reset-gpu)\b")


def down_after_our_reboot(info, prefix: str) -> bool:
    """DOWN after a reboot Slurm issued for a drain of ours (the repair ladder's `scontrol reboot
    nextstate=DOWN`): our automatic reason asking for a repair, Slurm's 'reboot complete' after it,
    no reboot still pending and a slurmd that answers. An admin's DOWN has their reason: never
    this. A node we drained again for the qualification (DOWN+DRAIN, the same reason) still is."""
    reason = (info.reason or "").rstrip()
    return (
        info.is_down
        and not info.is_rebooting
        and not info.is_not_responding
        and not info.is_failed
        and policy.read_reason(reason, prefix).automatic
        and not is_lemon(reason, prefix)
        and bool(REBOOT_ACTION.search(reason))
        and reason.endswith(REBOOT_COMPLETE)
    )
