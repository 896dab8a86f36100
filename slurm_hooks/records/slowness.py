"""Oddity is not slowness: a power-cap flag counts only where it cost the node power against its peers.

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
from typing import Dict, List, Optional, Sequence

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
    """`flags` with each power-cap flag that shows no power cost removed (in place; returned)."""
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
        costly = (
            own is not None
            and len(peers) >= 2
            and own <= (1.0 - COST_SHARE) * statistics.median(peers)
        )
        if not costly:
            flags[node] = [f for f in found if f.metric != CAPPED]
    return flags
