"""Intermittent slow nodes: a node's flag rate on a figure against the fleet's (a binomial tail test).

The k-of-m rule (stragglers.NodeWindow) looks at a node's last m jobs (10): a node slow in 20-30 %
of its jobs shows 2-3 flags there, and crosses k = 3 in about half the reports (an independent
run caught such nodes in 25-59 % of reports). Over the whole report window the same node has tens
of scored jobs, and a flag rate far above the fleet's: 4 flags in 30 jobs where the fleet's nodes
are flagged on that figure in 1 job of 500 does not happen by chance.

Per figure: p = the fleet's flag rate (flagged node-jobs / scored node-jobs, with one flag and two
jobs added so that a clean fleet does not give p = 0); a node flagged f times in its n scored jobs
is a suspect when P(X >= f) for X ~ Binomial(n, p) is below ALPHA divided by the number of
node x figure pairs tested (Bonferroni: a fleet of 1,000 nodes and 14 figures makes 14,000 tests,
so the fleet as a whole has about ALPHA chance of one false suspect per report), and f >= k. Each
node's flags count once per job, so one bad job cannot look like several.

Round 3: its suspects are node suspects (Suspect.basis "rate"), drained like the k-of-m ones; the
fleet's rate leaves out nodes under a leaf switch suspected on the figure (fleet_rate), and a node
not flagged since a reboot is set aside only when its clean run is unlikely at its own rate
(_repaired). Power-cap flags count too: slowness.costly judges their cost afterwards.

Input: each scored node-job's figures (JobMark.scored bits) and flags, from straggler_scan._close.
Memory: node x figure counters plus the last MAX_EVIDENCE flagged jobs of each.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

from . import stragglers

ALPHA = 0.01  # the fleet-wide chance of one false suspect from this test per report
MAX_EVIDENCE = 20


def binomial_tail(flags: int, jobs: int, p: float) -> float:
    """P(X >= flags) for X ~ Binomial(jobs, p), in log space (jobs may be thousands)."""
    if flags <= 0:
        return 1.0
    if flags > jobs or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    log_p, log_q = math.log(p), math.log1p(-p)
    total = 0.0
    for i in range(flags, jobs + 1):
        term = math.exp(
            math.lgamma(jobs + 1)
            - math.lgamma(i + 1)
            - math.lgamma(jobs - i + 1)
            + i * log_p
            + (jobs - i) * log_q
        )
        total += term
        if i > flags and term < total * 1e-12:  # the terms only shrink past the mode
            break
    return min(1.0, total)


class FlagRates:
    """Per node and figure: scored jobs, flagged jobs (and the latest flagged ones as evidence)."""

    __slots__ = ("masks", "flagged", "evidence", "fleet_flagged", "_scored")

    def __init__(self) -> None:
        # (node, scored-figures mask) -> jobs: one dict increment per node-job (a fleet has few
        # masks); the per-figure counts are made from it when asked (scored)
        self.masks: Dict[Tuple[str, int], int] = {}
        self.flagged: Dict[Tuple[str, int], int] = {}
        self.evidence: Dict[Tuple[str, int], List[Tuple[stragglers.JobMark, stragglers.Flag]]] = {}
        self.fleet_flagged = [0] * len(stragglers.METRICS)
        self._scored: Optional[Tuple[Dict[Tuple[str, int], int], List[int]]] = None

    def add(self, node: str, mark: stragglers.JobMark, scored: Optional[int] = None) -> None:
        """One scored node-job (mark.scored, or `scored` when given: the figures it was scored on;
        mark.flags its flags)."""
        key = (node, mark.scored if scored is None else scored)
        self.masks[key] = self.masks.get(key, 0) + 1
        self._scored = None
        if not mark.flags:
            return
        seen = set()
        for flag in mark.flags:
            bit = stragglers.METRIC_BIT.get(flag.metric)
            if bit is None or flag.metric in seen:
                continue
            seen.add(flag.metric)
            index = bit.bit_length() - 1
            key = (node, index)
            self.flagged[key] = self.flagged.get(key, 0) + 1
            self.fleet_flagged[index] += 1
            kept = self.evidence.setdefault(key, [])
            kept.append((mark, flag))
            if len(kept) > MAX_EVIDENCE:
                del kept[0]

    def flags_of(self, node: str, metric: str) -> List[Tuple[stragglers.JobMark, stragglers.Flag]]:
        """The node's latest flagged jobs on the figure (up to MAX_EVIDENCE), oldest first."""
        bit = stragglers.METRIC_BIT.get(metric)
        return self.evidence.get((node, bit.bit_length() - 1), []) if bit else []

    def scored(self) -> Tuple[Dict[Tuple[str, int], int], List[int]]:
        """({(node, figure index): scored jobs}, scored node-jobs per figure)."""
        if self._scored is None:
            per_node: Dict[Tuple[str, int], int] = {}
            fleet = [0] * len(stragglers.METRICS)
            for (node, mask), count in self.masks.items():
                index = 0
                while mask:
                    if mask & 1:
                        per_node[(node, index)] = per_node.get((node, index), 0) + count
                        fleet[index] += count
                    mask >>= 1
                    index += 1
            self._scored = (per_node, fleet)
        return self._scored

    def fleet_rate(self, index: int, explained: Sequence[str] = ()) -> float:
        """The fleet's flag rate on the figure, leaving out the `explained` nodes (those under a
        leaf switch suspected on the figure: a degraded leaf flags its 16 nodes in a third of their
        jobs, and a fleet rate raised by it hid every intermittent stall elsewhere)."""
        flagged, scored = self.fleet_flagged[index], self.scored()[1][index]
        per_node = self.scored()[0]
        for node in explained:
            flagged -= self.flagged.get((node, index), 0)
            scored -= per_node.get((node, index), 0)
        return (max(flagged, 0) + 1.0) / (max(scored, 0) + 2.0)

    def suspects(
        self,
        k: int,
        known: Sequence[stragglers.Suspect],
        alpha: float = ALPHA,
        windows: Optional[Dict[str, stragglers.NodeWindow]] = None,
        explained: Optional[Dict[str, Sequence[str]]] = None,
    ) -> List[stragglers.Suspect]:
        """Node x figure pairs whose flag rate fails the test and that `known` (the k-of-m
        suspects) does not already hold: Suspect rows (basis "rate"), flagged/window = f / n over
        the report. `explained`: {figure: nodes under a leaf suspected on it} (fleet_rate). With the
        nodes' `windows`, after_reboot counts the evidence since the node's
        last reboot (0 keeps a repaired node from a drain, as for a k-of-m suspect)."""
        have = {(s.node, s.metric) for s in known}
        scored = self.scored()[0]
        tests = max(1, len(scored))
        rates = {
            i: self.fleet_rate(i, (explained or {}).get(m.name, ()))
            for i, m in enumerate(stragglers.METRICS)
        }
        out: List[stragglers.Suspect] = []
        for key, flags in self.flagged.items():
            node, index = key
            name = stragglers.METRICS[index].name
            if flags < k or (node, name) in have:
                continue
            jobs = scored.get(key, flags)
            if binomial_tail(flags, jobs, rates[index]) * tests >= alpha:
                continue
            evidence = tuple(self.evidence[key])
            users = len({mark.user for mark, _ in evidence if mark.user})
            window = (windows or {}).get(node)
            after = None
            if window is not None and window.reboot_at:
                after = sum(1 for mark, _ in evidence if mark.end >= window.boot_first_end)
                if not after and _repaired(window, flags, jobs, index):
                    continue  # rebooted and clean since, longer than its rate explains
            out.append(
                stragglers.Suspect(node, name, flags, jobs, evidence, users, after, basis="rate")
            )
        return out


REPAIR_ALPHA = 0.05  # a clean run after a reboot this unlikely at the node's own rate: a repair


def _repaired(window: stragglers.NodeWindow, flags: int, jobs: int, index: int) -> bool:
    """Whether a node not flagged on the figure since its last reboot looks repaired: it passed
    the reboot probation (k clean jobs on the figure, NodeWindow) and its clean run since the
    reboot is one its own flag rate f/n would give less than REPAIR_ALPHA of the time. A node slow
    in 3 of 4 jobs is repaired after 3 clean ones; one slow in 1 of 20 (an intermittent stall)
    needs about 60: k clean jobs dropped it at every reboot (1 % of node-jobs on the harsh fleet).
    One not yet repaired stays a suspect with after_reboot = 0: listed, not drained
    (straggler_drain) until a job after the reboot flags it again."""
    if window.on_probation & (1 << index):
        return False
    since = window.scored - window.reboot_at + 1  # the node's jobs since the reboot, any figure
    trials = since * min(1.0, jobs / max(window.scored, 1))  # about as many scored on the figure
    return (1.0 - flags / max(jobs, 1)) ** trials < REPAIR_ALPHA


def render(suspects: Sequence[stragglers.Suspect], top: int = 20) -> List[str]:
    """Lines for the text report."""
    if not suspects:
        return []
    lines = ["suspects by rate: flagged far more often than the fleet over the window:"]
    for s in suspects[:top]:
        lines.append(
            "  %s %s: %d of %d scored jobs, worst z %.1f"
            % (s.node, s.metric, s.flagged, s.window, s.worst_z)
        )
    return lines
