"""Fail-slow detection: score each node of a multi-node job against the job's OTHER nodes.

Pure functions, no I/O (fleet.py streams the records into them). Input: the `summary.perf`
figures of the epilog records (docs/records.md, /work FLEET contract): one flat {metric: number}
per job x node; a metric that could not be measured is absent, never 0.

Scoring, per job and metric (docs/records.md "Finding slow nodes"):
  baseline = the job's other nodes that have the metric (never the node itself, so one extreme node
             cannot drag its own baseline);
  median, MAD of the baseline; scale = max(1.4826 x MAD, floor, relative x |median|), so identical
             healthy peers (MAD 0) do not turn a rounding difference into an infinite z;
  z = (value - median) / scale in the metric's bad direction only (lower power is bad, higher
             power is not); flagged when z >= the threshold.
A node's window: its last m scored multi-node jobs; flagged on one metric in k of them -> suspect.
"""

from __future__ import annotations

import collections
import math
import sys
from typing import Deque, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from ..core.structs import Struct, field

MAD_TO_SIGMA = 1.4826  # MAD x this estimates the standard deviation of normal data
IDLE_LIMIT = 0.5  # gpu_idle_frac above which a node's power figures are not scored (figures_row)
Z_LIMIT = 1e6  # the largest z reported
# An int past this has no float (float() raises OverflowError); one in a record is not a figure.
_MAX_FIGURE = sys.float_info.max
_NUMBERS = (float, int)  # what a figure may be (type() is exact: a bool is not a number here)
_FLOAT = {float}
_FLOAT_OR_NONE = {float, type(None)}


class Metric(Struct):
    """How one perf metric is scored. worse: +1 when a higher value is worse, -1 when lower is.
    floor (metric units) and relative (x |baseline median|): the smallest scale a z is measured in.
    min_median: jobs whose baseline median is below it are not scored on this metric (a job that
    does not use its GPUs or the fabric says nothing about power or bytes). busy_only: a node
    whose GPUs the job left idle (gpu_idle_frac above IDLE_LIMIT) is not scored on it."""

    name: str
    worse: int
    floor: float
    relative: float
    kind: str  # what a flag on it points at, for the reader: gpu | fabric | cpu
    min_median: float = 0.0
    busy_only: bool = False


# The bad direction of each metric (docs/records.md gives the argument for each choice).
METRICS: Tuple[Metric, ...] = (
    Metric("throttle_frac.hw_slowdown", +1, 0.005, 0.25, "gpu"),
    Metric("throttle_frac.thermal", +1, 0.01, 0.25, "gpu"),
    Metric("throttle_frac.power", +1, 0.01, 0.25, "gpu"),
    Metric("throttle_frac.power_brake", +1, 0.005, 0.25, "gpu"),
    Metric("throttle_frac.sync_boost", +1, 0.02, 0.25, "gpu"),
    Metric("gpu_power_w.mean", -1, 10.0, 0.04, "gpu", min_median=50.0, busy_only=True),
    Metric("gpu_power_w.min", -1, 10.0, 0.04, "gpu", min_median=50.0, busy_only=True),
    Metric("pcie_replays_per_h", +1, 20.0, 0.5, "gpu"),
    Metric("nvlink_errors_per_h", +1, 20.0, 0.5, "gpu"),
    Metric("ib_xmit_wait_per_s", +1, 5e4, 0.5, "fabric"),
    Metric("ib_xmit_bytes_per_s", -1, 1e6, 0.15, "fabric", min_median=1e7),
    Metric("ib_rcv_bytes_per_s", -1, 1e6, 0.15, "fabric", min_median=1e7),
    Metric("foreign_cpu_frac", +1, 0.005, 0.5, "cpu"),
    Metric("cpu_steal_frac", +1, 0.005, 0.5, "cpu"),
)
METRIC_BY_NAME: Dict[str, Metric] = {m.name: m for m in METRICS}
METRIC_BIT: Dict[str, int] = {m.name: 1 << i for i, m in enumerate(METRICS)}
ALL_METRICS = (1 << len(METRICS)) - 1


class Flag(Struct):
    """One node flagged on one metric in one job: its value against the median of its peers."""

    metric: str
    z: float
    value: float
    median: float
    peers: int
    # a lower bound (stall_bounds: a saturated counter's least possible rate), not a measurement
    bound: bool = False
    # what it cost the job, as a share of its time (flag_cost; slowness.keep_costly for a power
    # cap): time throttled or lost beyond the peers'; None where a figure gives no time
    cost: Optional[float] = None


# Figures whose excess over the peers' median is itself a share of the job's time lost: time held
# in a throttle state, CPU time on the job's cores that was not the job's.
_TIME_SHARES = frozenset(
    (
        "throttle_frac.hw_slowdown",
        "throttle_frac.thermal",
        "throttle_frac.power_brake",
        "throttle_frac.sync_boost",
        "foreign_cpu_frac",
        "cpu_steal_frac",
    )
)
_POWER_SHARES = frozenset(("gpu_power_w.mean", "gpu_power_w.min"))


def flag_cost(name: str, value: float, median: float) -> Optional[float]:
    """The estimated cost to a synchronous job of a flagged figure, as a share of the job's time:
    the excess time throttled (or the foreign CPU time) over the peers' median; for power, the
    share of its peers' power the node did not draw (a GPU's clocks, and so a compute-bound step,
    follow its power); None for figures that give no time (link retries, stalls counted in ticks
    of unknown length, bytes)."""
    if name in _TIME_SHARES:
        return round(min(1.0, max(0.0, value - median)), 4)
    if name in _POWER_SHARES and median > 0:
        return round(min(1.0, max(0.0, 1.0 - value / median)), 4)
    return None


class JobMark:
    """A node's part in one scored job: the metrics it was flagged on (empty: nothing stood out).
    A plain class with slots: the report makes one per node-job (100,000 of them)."""

    __slots__ = ("job", "end", "nodes", "user", "flags", "start", "scored")

    def __init__(
        self,
        job: str,
        end: float,
        nodes: int,
        user: Optional[str] = None,
        flags: Tuple[Flag, ...] = (),
        start: Optional[float] = None,
        scored: int = ALL_METRICS,
    ) -> None:
        self.job, self.end, self.nodes, self.user, self.flags, self.start = (
            job,
            end,
            nodes,
            user,
            flags,
            start,
        )
        self.scored = scored  # the METRICS (bits: METRIC_BIT) the node was scored on in this job

    def __repr__(self) -> str:
        return "JobMark(job=%r, nodes=%d, flags=%r)" % (self.job, self.nodes, self.flags)


# -- one job -------------------------------------------------------------------------------------


def _median_without(ordered: Sequence[float], pos: int) -> float:
    """Median of the sorted values `ordered` with the one at index `pos` left out (len >= 2)."""
    c = (len(ordered) - 1) // 2  # the middle of what is left
    if len(ordered) % 2 == 0:  # an odd number left: one middle value
        return ordered[c] if pos > c else ordered[c + 1]
    if pos > c:
        return (ordered[c - 1] + ordered[c]) * 0.5
    if pos == c:
        return (ordered[c - 1] + ordered[c + 1]) * 0.5
    return (ordered[c] + ordered[c + 1]) * 0.5


def _ranked(values: Sequence[float]) -> Tuple[List[float], List[int]]:
    """(values sorted, position of each original index in that order)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    position = [0] * len(values)
    for rank, index in enumerate(order):
        position[index] = rank
    return [values[i] for i in order], position


class _LeaveOneOut:
    """(median, MAD) of all values but one, for any one: O(n log n) for the whole job.

    Leaving one value out moves the median to one of at most three values, so the absolute
    deviations are sorted once per distinct median (lazily) and a node's MAD is a leave-one-out
    median of those. tests/test_stragglers.py checks it against the naive computation."""

    def __init__(self, values: Sequence[float]) -> None:
        if len(values) < 2:
            raise ValueError("need at least two values")
        self.values = values
        self.ordered, self.position = _ranked(values)
        self.deviations: Dict[float, Tuple[List[float], List[int]]] = {}

    def bounds(self) -> Tuple[float, float]:
        """The lowest and highest value a leave-one-out median can take."""
        c = (len(self.ordered) - 1) // 2
        return self.ordered[max(c - 1, 0)], self.ordered[min(c + 1, len(self.ordered) - 1)]

    def __call__(self, index: int) -> Tuple[float, float]:
        median = _median_without(self.ordered, self.position[index])
        ranked = self.deviations.get(median)
        if ranked is None:
            ranked = self.deviations[median] = _ranked([abs(v - median) for v in self.values])
        return median, _median_without(ranked[0], ranked[1][index])


def leave_one_out(values: Sequence[float]) -> List[Tuple[float, float]]:
    """(median, MAD) of the OTHER values, for each value."""
    stats = _LeaveOneOut(values)
    return [stats(i) for i in range(len(values))]


def robust_z(value: float, median: float, mad: float, metric: Metric) -> float:
    """How far `value` is from its peers' median in the metric's bad direction, in robust sigmas."""
    scale = max(MAD_TO_SIGMA * mad, metric.floor, metric.relative * abs(median))
    # capped: a finite but absurd figure (1e308) would make z infinite, and --json unparsable
    return max(-Z_LIMIT, min(Z_LIMIT, metric.worse * (value - median) / scale))


def figures_row(
    perf: Mapping[str, float], metrics: Sequence[Metric] = METRICS
) -> Tuple[Optional[float], ...]:
    """summary.perf as a tuple in the order of `metrics` (None where absent, or not a finite number:
    a NaN, a bool or a string from a writer's bug is no figure): what score_rows takes, and what the
    report's reader processes send back (a tuple pickles and transposes cheaply).

    The power figures are None on a node whose most idle job GPU had its clocks lowered for lack
    of work (gpu_idle_frac) more than IDLE_LIMIT (half) of the job: a GPU the job did not use
    draws little power without being slow. Without this, a job that left one node's GPUs idle (a
    coordinator node, or a user doing it on purpose) flagged that node on power; a GPU held down by
    a fault is busy, so it is still scored. Limits: a spin kernel keeps an unused GPU "busy" at low
    power (a forger can still do that), and a node whose GPUs a fault starves of work more than
    half the job (a downtrained link, a throttled host) is not scored on power (the prolog's PCIe
    and NUMA checks see those faults). Drivers without the counter (NVML 13) score power as before."""
    get = perf.get
    row = [get(metric.name) for metric in metrics]
    present = [v for v in row if v is not None]
    if not _FLOAT.issuperset(map(type, present)) or not all(map(math.isfinite, present)):
        row = [v if _number(v) else None for v in row]  # rare: an int, or not a figure at all
    idle = get("gpu_idle_frac")
    if type(idle) in _NUMBERS and idle > IDLE_LIMIT:
        row = [None if metric.busy_only else v for metric, v in zip(metrics, row)]
    return tuple(row)


def score_job(
    perf_by_node: Mapping[str, Mapping[str, float]],
    min_nodes: int,
    threshold: float,
    metrics: Sequence[Metric] = METRICS,
) -> Dict[str, List[Flag]]:
    """{node: flags} for one job, from {node: summary.perf}. Each metric is scored among the nodes
    that have it, and only when at least `min_nodes` do (the node plus min_nodes - 1 peers)."""
    nodes = list(perf_by_node)
    return score_rows(
        nodes, [figures_row(perf_by_node[n], metrics) for n in nodes], min_nodes, threshold, metrics
    )


def score_rows(
    nodes: Sequence[str],
    rows: Sequence[Sequence[Optional[float]]],
    min_nodes: int,
    threshold: float,
    metrics: Sequence[Metric] = METRICS,
    scored: Optional[List[int]] = None,
) -> Dict[str, List[Flag]]:
    """score_job on figures_row tuples (rows[i] belongs to nodes[i]). `scored`, when given, gets the
    index of each metric that was scored in this job (enough nodes have it, the job's median is
    above its min_median): a node that has such a figure was scored on it.

    Exact, but quick (the report scores 100,000 node-jobs in a fraction of a second): a leave-one-out
    median lies between the order statistics just around the middle, and the scale is at least the
    floor, so a value nearer the middle than threshold x that floor cannot be flagged; only the
    values past that cut-off (found on the sorted values, usually none) get their peers' median and
    MAD computed."""
    flags: Dict[str, List[Flag]] = {node: [] for node in nodes}
    need = max(min_nodes, 2)
    if len(nodes) < need:
        return flags
    for position, (metric, column) in enumerate(zip(metrics, zip(*rows))):  # transposed in C
        types = set(map(type, column))
        if types == _FLOAT and all(map(math.isfinite, column)):
            values = column  # the usual case, checked in C
        elif types <= _FLOAT_OR_NONE:  # some nodes without the figure (figures_row's None)
            values = tuple([v for v in column if v is not None])
            if not all(map(math.isfinite, values)):
                values = tuple([v for v in values if math.isfinite(v)])
        else:
            values = tuple(
                float(v) for v in column if type(v) in _NUMBERS and -_MAX_FIGURE <= v <= _MAX_FIGURE
            )  # no bool/nan/inf, no int too large for a float
        if len(values) < need:
            continue
        ordered = sorted(values)
        middle = (len(ordered) - 1) // 2
        low, high = ordered[max(middle - 1, 0)], ordered[min(middle + 1, len(ordered) - 1)]
        if metric.worse < 0 and high < metric.min_median:
            continue
        if scored is not None:
            scored.append(position)
        smallest = metric.floor
        if (low > 0) == (high > 0):
            smallest = max(smallest, metric.relative * min(abs(low), abs(high)))
        reach = (
            threshold * smallest * (1 - 1e-9)
        )  # a hair wider than exact: rounding never hides a node
        if metric.worse > 0:
            if ordered[-1] < low + reach:
                continue
            candidates = [i for i, v in enumerate(values) if v >= low + reach]
        else:
            if ordered[0] > high - reach:
                continue
            candidates = [i for i, v in enumerate(values) if v <= high - reach]
        present = [
            i
            for i, v in enumerate(column)
            if type(v) in _NUMBERS and -_MAX_FIGURE <= v <= _MAX_FIGURE
        ]  # value -> node: the same filter as `values`
        stats = _LeaveOneOut(values)
        for index in candidates:
            median, mad = stats(index)
            if metric.worse < 0 and median < metric.min_median:
                continue
            z = robust_z(values[index], median, mad, metric)
            if z >= threshold:
                value = values[index]
                flags[nodes[present[index]]].append(
                    Flag(
                        metric.name,
                        round(z, 2),
                        value,
                        median,
                        len(values) - 1,
                        cost=flag_cost(metric.name, value, median),
                    )
                )
    return flags


def _number(value: object) -> bool:
    """A finite float, or an int that has one (a 400-digit int in a record would overflow float())."""
    return (type(value) is float or type(value) is int) and -_MAX_FIGURE <= value <= _MAX_FIGURE  # type: ignore[operator]


# -- a node's window -----------------------------------------------------------------------------


class Suspect(Struct):
    """A node flagged on `metric` in `flagged` of its last `window` scored jobs."""

    node: str
    metric: str
    flagged: int
    window: int
    evidence: Tuple[Tuple[JobMark, Flag], ...]  # the flagged jobs, oldest first
    users: int  # distinct job users among the flagged jobs
    # flagged jobs since the node's last reboot (None: no reboot seen); 0 keeps it from a drain
    after_reboot: Optional[int] = None
    basis: str = "k-of-m"  # or "rate": its flag rate over the window stands out (rate_test)

    @property
    def cost(self) -> Optional[float]:
        """The median estimated cost of its flagged jobs (Flag.cost), None where none is known."""
        known = sorted(flag.cost for _, flag in self.evidence if flag.cost is not None)
        if not known:
            return None
        middle = len(known) // 2
        return known[middle] if len(known) % 2 else (known[middle - 1] + known[middle]) / 2

    @property
    def kind(self) -> str:
        metric = METRIC_BY_NAME.get(self.metric)
        return metric.kind if metric else "?"

    @property
    def worst_z(self) -> float:
        return max(flag.z for _, flag in self.evidence)


def by_cost(suspect: Suspect) -> Tuple[object, ...]:
    """Sort key: what a suspect costs its jobs (Suspect.cost, highest first; unknown after the
    known), then its evidence. The report lists and the fleet drains in this order (issue 30: rank
    and drain by the cost to the job, not by z or flag counts alone)."""
    cost = suspect.cost
    return (
        cost is None,
        -(cost or 0.0),
        -suspect.flagged,
        -suspect.worst_z,
        suspect.node,
        suspect.metric,
    )


_BIT_INDICES: Dict[int, Tuple[int, ...]] = {}  # bitmask -> its set bits (a fleet has few masks)
PRUNE_RUNS = 64  # a node's runs + flagged jobs before old ones are dropped (NodeWindow)


def _bit_indices(bits: int) -> Tuple[int, ...]:
    found = _BIT_INDICES.get(bits)
    if found is None:
        found = _BIT_INDICES[bits] = tuple(i for i in range(bits.bit_length()) if bits >> i & 1)
    return found


class NodeWindow(Struct, frozen=False):
    """A node's evidence: for each figure, its last m scored multi-node jobs in which the node was
    scored on that figure (after a reboot: see below). Bounded: memory is nodes x m (x the figures,
    at worst), plus the node's earlier boot ids.

    Per figure, so that jobs which say nothing about a figure (CPU-only jobs have no GPU figures,
    jobs under min_median W no power figures) do not push its evidence out: with one window of the
    last m jobs of any kind, ten CPU-only jobs erased a slow GPU's evidence.

    How, without a deque per figure (14 appends per node-job slowed the report by a sixth): the
    node's jobs are numbered; `runs` holds the jobs as runs of one scored-figures mask ([mask, count],
    newest last: on a fleet most jobs score the same figures, so adding one is usually one increment),
    and `flagged` holds only the jobs with a flag, with their number. A figure's window is then found
    by walking the runs back until m jobs scored on it are covered (window_start). Runs and flags
    older than every figure's window are dropped once they outgrow PRUNE_RUNS.

    What a reboot does: it puts the node's evidence on probation, figure by figure. Once the node
    has run `streak` ([fleet] k) scored jobs in a row after the reboot without a flag on a figure,
    the figure's flags from before that clean run are set aside (`cut`): a repair (a GPU or HCA
    swapped, a pinned daemon fixed) comes with a reboot, and a repaired node runs clean. A node
    that is still slow, even only in some of its jobs, is flagged again before k clean jobs in a
    row and keeps its evidence, however often it reboots (a flaky GPU that crashes the node, a site
    that reboots between jobs); with one clean job enough, a node slow in half its jobs lost its
    evidence at most reboots. Until a figure is flagged again after the reboot, its suspect has
    after_reboot = 0 and is not drained (straggler_drain.choose): a repaired node, resumed, is not
    drained again on what it did before the repair. Boots are told apart by the record's
    `boot_id` (the kernel's, at the epilog) and ordered by the jobs' end times: a record of a boot
    that ended before the current boot's first job is a late one and is not counted. A record
    without a boot id (an older version) never starts a probation."""

    node: str
    size: int
    streak: int = 1  # clean jobs in a row after a reboot that set a figure's old flags aside
    marks: Deque[JobMark] = field(default_factory=collections.deque)  # the last m, any figure
    runs: Deque[List[int]] = field(default_factory=collections.deque)  # [mask, count], oldest first
    flagged: Deque[Tuple[int, JobMark]] = field(default_factory=collections.deque)  # (number, mark)
    scored: int = 0  # all scored jobs of this node, not only those in the window: the last number
    boot: Optional[str] = None  # the boot of the newest job with one
    boot_first_end: float = 0.0  # the earliest end of a job of that boot
    earlier_boots: Set[str] = field(default_factory=set)
    reboot_at: int = 0  # the number of the first job of the current boot (after a reboot)
    on_probation: int = 0  # figures (bits) whose evidence from before reboot_at still counts
    cut: Dict[int, int] = field(default_factory=dict)  # figure bit -> first job number that counts
    clean: Dict[int, int] = field(
        default_factory=dict
    )  # figure bit -> clean jobs in a row (probation)
    before_reboot: int = 0  # flags set aside: from before a reboot the node then ran clean after
    stale: int = 0  # jobs not counted: they ended in a boot the node had already left
    # runs + flagged before the next _prune: PRUNE_RUNS, then twice what the last one left
    prune_at: int = field(default_factory=lambda: PRUNE_RUNS)
    # mutable: an assignment needs no frozen check (Struct.__setattr__ is a Python call, and add()
    # assigns about 3 times per node-job: 1.3 of 32 profiled seconds on 101,552 records)
    __setattr__ = object.__setattr__

    def add(self, mark: JobMark, boot: Optional[str] = None) -> None:
        if self.marks.maxlen != self.size:
            self.marks = collections.deque(self.marks, maxlen=self.size)
        if boot is not None:
            if boot != self.boot:
                if boot in self.earlier_boots or (
                    self.boot is not None and mark.end < self.boot_first_end
                ):  # a boot the node had left before the current one began
                    self.earlier_boots.add(boot)
                    self.stale += 1
                    return
                if self.boot is not None:
                    self.earlier_boots.add(self.boot)
                    self.reboot_at = self.scored + 1
                    for index in _bit_indices(ALL_METRICS & ~self.on_probation):
                        self.clean[1 << index] = 0  # newly on probation: its clean run starts now
                    self.on_probation = ALL_METRICS
                self.boot, self.boot_first_end = boot, mark.end
            elif mark.end < self.boot_first_end:
                self.boot_first_end = mark.end
        self.marks.append(mark)  # the oldest falls out
        self.scored += 1
        runs = self.runs
        if runs and runs[-1][0] == mark.scored:
            runs[-1][1] += 1
        else:
            runs.append([mark.scored, 1])
        if mark.flags:
            self.flagged.append((self.scored, mark))
        if self.on_probation:
            self._probation(mark)
        if len(runs) + len(self.flagged) > self.prune_at:
            self._prune()

    def _probation(self, mark: JobMark) -> None:
        """A job after a reboot: for each figure on probation it was scored on, a flag restarts the
        clean run, no flag lengthens it; a clean run of `streak` jobs sets the figure's flags from
        before it aside and ends the probation."""
        flagged_bits = 0
        for flag in mark.flags:
            flagged_bits |= METRIC_BIT.get(flag.metric, 0)
        watched = mark.scored & self.on_probation
        if not watched:
            return
        for index in _bit_indices(watched):
            bit = 1 << index
            if bit & flagged_bits:
                self.clean[bit] = 0
                continue
            run = self.clean.get(bit, 0) + 1
            self.clean[bit] = run
            if run < self.streak:
                continue
            first_clean = self.scored - run + 1
            if self.flagged and self.flagged[0][0] < first_clean:  # count what is set aside
                name, start = METRICS[index].name, self.window_start(bit)[0]
                self.before_reboot += sum(
                    1
                    for number, earlier in self.flagged
                    if start <= number < first_clean
                    and any(f.metric == name for f in earlier.flags)
                )
            self.cut[bit] = first_clean
            self.on_probation &= ~bit

    def window_start(self, bit: int) -> Tuple[int, int]:
        """(number of the oldest job in the figure's window, jobs in it) for the figure's bit: its
        last m jobs scored on it, none before the figure's cut (a reboot it ran clean after)."""
        floor = self.cut.get(bit, 0)
        need, end, start = self.size, self.scored, self.scored + 1
        for mask, count in reversed(self.runs):
            if end < floor:
                break
            first = max(end - count + 1, floor)
            if mask & bit:
                usable = end - first + 1
                if usable >= need:
                    return end - need + 1, self.size
                need -= usable
                start = first
            end -= count
        return start, self.size - need

    def _prune(self) -> None:
        """Forget what no figure's window reaches: a run's mask keeps only the figures whose window
        reaches into the run, runs left with none before every window are dropped, equal neighbours
        merge, and a flagged job stays only while one of its flags' windows reaches it. Then each
        run left holds a job of some figure's window, or lies between two that do, so at most
        2 x figures x m + 1 runs remain (m flagged jobs per figure), however the masks alternate."""
        bits = 0
        for mask, _count in self.runs:
            bits |= mask
        starts = {1 << i: self.window_start(1 << i)[0] for i in _bit_indices(bits)}
        runs: Deque[List[int]] = collections.deque()
        last = self.scored - sum(count for _, count in self.runs)
        for mask, count in self.runs:
            last += count
            reached = 0
            for bit, start in starts.items():
                if mask & bit and last >= start:
                    reached |= bit
            if not runs and not reached:
                continue  # older than every window
            if runs and runs[-1][0] == reached:
                runs[-1][1] += count
            else:
                runs.append([reached, count])
        self.runs = runs
        by_name = {METRICS[i].name: starts.get(1 << i) for i in range(len(METRICS))}
        self.flagged = collections.deque(
            (number, mark)
            for number, mark in self.flagged
            if any(number >= (by_name.get(f.metric) or self.scored + 1) for f in mark.flags)
        )
        self.prune_at = max(PRUNE_RUNS, 2 * (len(runs) + len(self.flagged)))

    def suspects(self, k: int) -> List[Suspect]:
        by_metric: Dict[str, List[Tuple[int, JobMark, Flag]]] = {}
        for number, mark in self.flagged:
            for flag in mark.flags:
                by_metric.setdefault(flag.metric, []).append((number, mark, flag))
        out = []
        for name, flagged in by_metric.items():
            if len(flagged) < k or name not in METRIC_BIT:
                continue
            start, jobs = self.window_start(METRIC_BIT[name])
            evidence = [(mark, flag) for number, mark, flag in flagged if number >= start]
            if len(evidence) >= k:
                users = len({mark.user for mark, _ in evidence if mark.user})
                numbers = [number for number, _mark, _flag in flagged if number >= start]
                after = sum(1 for n in numbers if n >= self.reboot_at) if self.reboot_at else None
                out.append(
                    Suspect(self.node, name, len(evidence), jobs, tuple(evidence), users, after)
                )
        return sorted(out, key=lambda s: (-s.flagged, -s.worst_z, s.metric))

    def flagged_jobs(self) -> int:
        return sum(1 for mark in self.marks if mark.flags)
