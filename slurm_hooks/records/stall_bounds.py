"""A saturated stall counter still proves a lower bound: score it upwards against measured peers.

Where it comes from: the epilog's `summary.perf["ib_xmit_wait_per_s.lower_bound"]`
(perf._wait_lower_bound over ib_counter_trust.lower_bounds): when a port's 32-bit port_xmit_wait
saturated or was cleared during the job, the stall figure is unmeasurable, but the counter surely
counted max - start (or its value after the clear) inside the job, so the worst port's stall rate
was AT LEAST that over the job's wall time. A port stalling 1e7 times a second saturates within
minutes: before this the stalled node was exactly the one never scored (issue 30: 0 of 8 planted
IB stalls found on the harsh fleet).

How a bound is scored, per job and hardware class (straggler_scan._close), only for a node whose
measured figure is absent because its counter could not be trusted:
  baseline = each peer's least known stall rate: its measured ib_xmit_wait_per_s, or its own lower
             bound where its counter could not be trusted either (a peer stuck at the maximum
             with no bound is left out); at least min_job_nodes - 1 such peers;
  z = (bound - median) / scale, scale as stragglers.robust_z (the peers' MAD, the figure's floor
             5e4/s and relative 0.5: at z 6 the bound must be at least 4x the median); flagged at
             z >= threshold, as a flag on ib_xmit_wait_per_s marked `bound` (shown as ">=").
Why peers' bounds and not only their measured figures: where a subnet manager clears counters or
ports saturate, few peers have a measured figure (86 % of node-jobs had none on the harsh fleet,
bench/fleet_harsh.py), and a baseline of measured peers alone is rarely there. A peer's bound
understates it, so this baseline is biased LOW, and that is the risk this takes: a healthy node
whose bound is 4x its peers' least rates. Measured on healthy harsh fleets (docs/records.md):
no false suspect from it; a fabric-wide stall (a degraded leaf) raises every peer alike and is
then the switch's (topology_groups).
A bound is only ever scored upwards: even the least the node can have stalled is far above its
peers. A scored bound below that is a job that did not flag the node, as a measured one: in the
k-of-m window (when it was not, a node whose counter is cleared in every job became a suspect on
any 3 flags of the report window, "3 of 3") and for the rate test (rate_test), flagged or not:
counting only the flagged bounds as trials made the fleet's flag rate on the figure 0.37 on the
harsh fleet, and no intermittent stall stood out against it. An intermittent stall that a small
bound (a counter cleared late in the job) hides from the k-of-m window is the rate test's.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Set, Tuple

from . import stragglers

FIGURE = "ib_xmit_wait_per_s"
BOUND_FIGURE = FIGURE + ".lower_bound"  # perf.WAIT_LOWER_BOUND (not imported: perf is heavy)
_METRIC = stragglers.METRIC_BY_NAME[FIGURE]
_INDEX = [m.name for m in stragglers.METRICS].index(FIGURE)
BIT = stragglers.METRIC_BIT[FIGURE]


def bound_of(perf: Dict[str, object]) -> Optional[float]:
    """The record's lower bound, when its measured figure is absent and the bound is a finite
    positive number (anything else in a record is not believed)."""
    value = perf.get(BOUND_FIGURE)
    # stragglers._number: a finite float, or an int that has one (float() of a 400-digit int in
    # a crafted record raised OverflowError and stopped the whole report)
    if FIGURE in perf or not stragglers._number(value):
        return None
    value = float(value)  # type: ignore[arg-type]
    return value if value > 0 else None


def flag_bounds(
    nodes: Sequence[str],
    rows: Sequence[Sequence[Optional[float]]],
    bounds: Sequence[Optional[float]],
    flags: Dict[str, List[stragglers.Flag]],
    min_nodes: int,
    threshold: float,
) -> Tuple[Set[str], Set[str]]:
    """Add a bound flag to each node (nodes[i], rows[i] its figures_row, bounds[i] its bound or
    None) whose bound stands out; returns (those nodes, the nodes whose bound was scored)."""
    measured = [row[_INDEX] for row in rows]
    least = [m if m is not None else b for m, b in zip(measured, bounds)]
    known = [i for i, v in enumerate(least) if v is not None]  # value position -> node position
    flagged: Set[str] = set()
    tried: Set[str] = set()
    if len(known) < max(min_nodes, 2):  # the node and min_nodes - 1 peers
        return flagged, tried
    # each node's peers' median and MAD, leaving it out: O(n log n) for the job (a 256-node job
    # with every node's counter cleared is common where a subnet manager clears counters)
    stats = stragglers._LeaveOneOut([least[i] for i in known])
    for rank, position in enumerate(known):
        bound = bounds[position]
        if bound is None or measured[position] is not None:
            continue
        tried.add(nodes[position])
        median, mad = stats(rank)
        z = stragglers.robust_z(bound, median, mad, _METRIC)
        if z >= threshold:
            node = nodes[position]
            flags[node].append(
                stragglers.Flag(FIGURE, round(z, 2), bound, median, len(known) - 1, True)
            )
            flagged.add(node)
    return flagged, tried
