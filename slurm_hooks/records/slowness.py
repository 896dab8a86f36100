"""Oddity is not slowness: a power-cap flag counts only where it cost the node power against its peers.

Round 3: a flag's cost is the share of its peers' power the node did not draw (Flag.cost), and a
suspect on throttle_frac.power needs a median cost of at least COST_SHARE over its flagged jobs
(costly): a leaky GPU at its cap is flagged in every job at a cost near 0 (its power is its
peers'), a low power limit in each of its slow jobs at 5-15 %. Before, each job's flag was kept or
dropped on its own: a leaky-GPU node whose power happened to be 3 % low (noise, a role) in 3 of
its last 10 jobs became a suspect, and the rate test had to leave power out altogether.

`throttle_frac.power` says how long a node's GPUs were held at their power cap. A node with one
leaky GPU that sits at its cap while running at full speed scores z 9-81 on it against peers that
are not capped (issue 30), and was a suspect although its jobs lost nothing. What a low power limit
costs a synchronous job shows in the power the node draws: a capped GPU that is slowed draws less
than its peers running the same kernels. So a flag on throttle_frac.power is kept only when the
node's `gpu_power_w.mean` in that job is at least COST_SHARE below the median of its peers' (the
same job and hardware class); otherwise the power figure is supporting evidence without a cost,
and the flag is dropped. A node whose power figure is absent (GPUs idle more than half the job,
a job under 50 W) has no cost to show and keeps no power-cap flag.

Input: score_rows' flags and the figures_row tuples of one job's class (straggler_scan._close).
"""

from __future__ import annotations

import statistics
from typing import Dict, List, Optional, Sequence, Tuple

from ..core import structs
from . import stragglers

COST_SHARE = 0.03  # a power cap that slows a GPU takes at least this much of its power
CAPPED = "throttle_frac.power"
COST_FIGURE = "gpu_power_w.mean"
_COST_INDEX = [m.name for m in stragglers.METRICS].index(COST_FIGURE)


def keep_costly(
    nodes: Sequence[str],
    rows: Sequence[Sequence[Optional[float]]],
    flags: Dict[str, List[stragglers.Flag]],
) -> Dict[str, List[stragglers.Flag]]:
    """`flags` with each power-cap flag given its cost (the share of the peers' median power the
    node did not draw, 0 when it drew as much) and removed where the node has no power figure or
    too few peers have one (no cost can be shown); in place, returned."""
    for position, node in enumerate(nodes):
        found = flags.get(node)
        if not found or not any(f.metric == CAPPED for f in found):
            continue
        own = rows[position][_COST_INDEX]
        peers = [
            row[_COST_INDEX]
            for other, row in enumerate(rows)
            if other != position and row[_COST_INDEX] is not None
        ]
        if own is None or len(peers) < 2:
            flags[node] = [f for f in found if f.metric != CAPPED]
            continue
        median = statistics.median(peers)
        cost = round(max(0.0, 1.0 - own / median), 4) if median > 0 else 0.0
        flags[node] = [f if f.metric != CAPPED else structs.replace(f, cost=cost) for f in found]
    return flags


def costly(
    suspect: stragglers.Suspect,
    longer: Sequence[Tuple[stragglers.JobMark, stragglers.Flag]] = (),
) -> bool:
    """Whether a suspect costs its jobs something: one on throttle_frac.power only when its flagged
    jobs' median power cost is at least COST_SHARE (the other figures' flags already mean time
    lost: a z of 6 on a time share is at least 3 % of the job). `longer`: the node's latest flagged
    jobs on the figure over the whole report (rate_test's evidence, up to 20), used when it holds
    more jobs than the suspect's: a leaky GPU's power is 3-6 % under its peers' by chance (noise,
    a pipeline role) in about a tenth of its jobs, and 4 such of 7 flagged jobs happened on the
    harsh fleet (seed 31); a low power limit costs power in every job it slows."""
    if suspect.metric != CAPPED:
        return True
    evidence = longer if len(longer) > len(suspect.evidence) else suspect.evidence
    costs = sorted(flag.cost for _, flag in evidence if flag.cost is not None)
    if not costs:
        return False
    middle = len(costs) // 2
    cost = costs[middle] if len(costs) % 2 else (costs[middle - 1] + costs[middle]) / 2
    return cost >= COST_SHARE
