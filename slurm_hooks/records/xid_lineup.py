"""One job's Xids, lined up: which node's fault came first, and which Xids only followed it.

When a multi-node job dies of one node's fault (a GPU fallen off the bus, an uncorrectable ECC
error), the job's processes on every other node are torn down too, and their GPUs log Xids of
their own: 43 ("GPU stopped processing": NVIDIA's catalog, immediate action IGNORE, the GPU
stays healthy) and 45 ("Preemptive cleanup, due to previous errors": the WORKFLOW_XID_45 bucket,
"with other Xids: ignore and follow those"). Those are consequences; counted per node, every
victim of one bad node looks as bad as the node that killed the job.

Input: the summaries of a job's records (build.xid_times: per Xid code the first time, the count
and the first event's blame), one per node, as `report` reads them from the records' headers.
Each time is the node's wall clock, dated in the epilog from the kernel log's clock (build.py
_kernel_time), so two nodes' times differ by their clock offset too: `tolerance` seconds
([records] xid_clock_tolerance_s).

Rules (docs/records.md, "One job's Xids, lined up"):
- a cause is any Xid not in CONSEQUENCE_XIDS (79, 48, 94, 13, ...); each node's first dated
  cause is its entry in the line-up;
- the causal node is the one whose first cause came first by more than `tolerance`; when
  another node's came within `tolerance` of it, or another node logged a cause without a time,
  the order is unknown: "ambiguous", none blamed;
- a node whose only Xids are consequences, all dated, the first no earlier than `tolerance`
  before another node's first cause, is a victim: its Xids are "excused" (not counted against
  it). A node that logged a cause of its own, or a consequence that came before every cause,
  or an Xid without a time, keeps every Xid counted;
- a node whose epilog found its wall clock unsynchronised, or its error bound (adjtimex's
  maxerror, summary.xid_clock_error_s) above `tolerance`, has no times in the line-up;
- nothing is excused unless the records were verified with the records key (`trusted`): a
  forged record of another node must not clear a node's Xids (DESIGN principle 19).

What a job's user can do: cause application Xids (13, 31, 43, 45) on the nodes of their own job,
and so make one of them the job's first cause; the line-up then names that Xid's blame (job),
and what it excuses is only 43/45, Xids that never mean a broken GPU. A hardware Xid is never
excused, whoever came first.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ..core.structs import Struct, field

# NVIDIA's Xid catalog: 43 GPU stopped processing (IGNORE; the GPU remains healthy), 45 preemptive
# cleanup due to previous errors (WORKFLOW_XID_45: with other Xids, follow those). 94 and 95, whose
# investigatory column says "IGNORE (sympathetic)", follow an uncorrectable memory error of the
# same GPU: on their node they are that GPU's fault, so in a line-up across nodes they are causes.
CONSEQUENCE_XIDS = frozenset({43, 45})
# NTP_PHASE_LIMIT: the kernel caps adjtimex's maxerror at 16 s (an unsynchronised clock reports it)
MAX_CLOCK_ERROR_S = 16.0
MAX_CODES = 64  # entries of one summary's xid_times read (the writer keeps 16 and one "more")

Entry = Tuple[Optional[int], Optional[float], int, Optional[str]]  # xid, first time, count, blame


class NodeXids(Struct):
    """One node's Xids in one job (one record's summary)."""

    node: str
    entries: Tuple[Entry, ...]
    clock_error: Optional[float] = None  # the kernel's bound on its wall-clock error, seconds

    @property
    def total(self) -> int:
        return sum(e[2] for e in self.entries)

    def first_cause(self) -> Optional[Tuple[float, int, Optional[str]]]:
        """(time, xid, blame) of the node's earliest dated cause, or None."""
        dated = [
            (e[1], e[0], e[3])
            for e in self.entries
            if e[0] is not None and e[0] not in CONSEQUENCE_XIDS and e[1] is not None
        ]
        return min(dated, key=lambda c: (c[0], c[1])) if dated else None  # a blame may be None

    def undated_cause(self) -> bool:
        """A cause without a time (an older record, or a clock not to be trusted)."""
        return any(e[0] not in CONSEQUENCE_XIDS and e[1] is None for e in self.entries)

    def only_consequences(self) -> bool:
        """Every Xid known and a consequence, and each code dated."""
        return bool(self.entries) and all(
            e[0] in CONSEQUENCE_XIDS and e[1] is not None for e in self.entries
        )

    def first_time(self) -> Optional[float]:
        times = [e[1] for e in self.entries if e[1] is not None]
        return min(times) if times else None


class JobLineup(Struct, frozen=False):
    """The line-up of one job attempt over the nodes that logged Xids in it."""

    job: str
    nodes: List[NodeXids]
    verdict: str = "no-cause"  # causal | ambiguous | no-cause
    causal: Optional[str] = None  # the node blamed (verdict causal)
    first: Optional[Tuple[str, int, float, Optional[str]]] = None  # node, xid, time, blame
    contenders: List[str] = field(default_factory=list)  # nodes within tolerance of the first
    excused: Dict[str, int] = field(default_factory=dict)  # node -> Xids not counted
    counted_why: Dict[str, str] = field(default_factory=dict)  # victim-looking nodes kept, why
    trusted: bool = False

    def to_dict(self) -> Dict[str, Any]:
        return {
            "job": self.job,
            "verdict": self.verdict,
            "causal_node": self.causal,
            "first": None
            if self.first is None
            else dict(zip(("node", "xid", "time", "blame"), self.first)),
            "contenders": list(self.contenders),
            "excused": dict(sorted(self.excused.items())),
            "counted": dict(sorted(self.counted_why.items())),
            "verified": self.trusted,
            "nodes": [
                {
                    "node": n.node,
                    "xids": [
                        dict(zip(("xid", "first_time", "count", "blame"), e)) for e in n.entries
                    ],
                    "clock_error_s": n.clock_error,
                }
                for n in self.nodes
            ],
        }


def entries_of(summary: Any) -> Optional[Tuple[Entry, ...]]:
    """A summary's xid_times as entries; None when absent or of a shape no writer makes (a
    record of an older version, or a hostile one: then it is simply not lined up)."""
    raw = summary.get("xid_times") if isinstance(summary, dict) else None
    if not isinstance(raw, list) or not raw or len(raw) > MAX_CODES:
        return None
    out = []
    for item in raw:
        if not isinstance(item, list) or len(item) != 4:
            return None
        xid, when, count, blame = item
        if xid is not None and not _count(xid):
            return None
        if when is not None and not _number(when):
            return None
        if not _count(count) or count < 1 or (blame is not None and not isinstance(blame, str)):
            return None
        out.append((xid, float(when) if when is not None else None, count, blame))
    return tuple(out)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e12


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 31


def line_up(job: str, nodes: Sequence[NodeXids], tolerance: float, trusted: bool) -> JobLineup:
    """The line-up of one job (module docstring: the rules)."""
    result = JobLineup(
        job,
        sorted(nodes, key=lambda n: (n.first_time() is None, n.first_time() or 0, n.node)),
        trusted=trusted,
    )
    causes = sorted(
        ((cause, n.node) for n in nodes for cause in [n.first_cause()] if cause is not None),
        key=lambda c: (c[0][0], c[0][1], c[1]),
    )
    if not causes:
        return result
    (first_time, xid, blame), first_node = causes[0]
    result.first = (first_node, xid, first_time, blame)
    result.contenders = sorted(
        {node for (when, _x, _b), node in causes if when <= first_time + tolerance}
        | {n.node for n in nodes if n.undated_cause()}  # could have come first: unknown
    )
    if len(result.contenders) > 1:
        result.verdict = "ambiguous"
    else:
        result.verdict, result.causal = "causal", first_node
    for n in nodes:
        why = _victim_problem(n, causes, tolerance, trusted)
        if why is None:
            result.excused[n.node] = n.total
        elif n.node not in result.contenders and any(e[0] in CONSEQUENCE_XIDS for e in n.entries):
            result.counted_why[n.node] = why
    return result


def _victim_problem(
    n: NodeXids,
    causes: Sequence[Tuple[Tuple[float, int, Optional[str]], str]],
    tolerance: float,
    trusted: bool,
) -> Optional[str]:
    """None when the node's Xids are all explained by another node's earlier cause; else why not."""
    if not n.only_consequences():
        return "logged a cause or an undated Xid of its own"
    others = [when for (when, _x, _b), node in causes if node != n.node]
    if not others:
        return "no other node logged a cause"
    first = n.first_time()
    if first is None or min(others) > first + tolerance:
        return "its Xid came before any other node's cause"
    if not trusted:
        return "records not verified: nothing is excused"
    return None


def line_up_all(
    rows: Iterable[Tuple[str, str, Dict[str, Any]]], tolerance: float, trusted: bool
) -> List[JobLineup]:
    """Line-ups of every job with Xids on two nodes or more. rows: (job label, node, summary);
    a node's second record of the same job label (a copy) is left out."""
    by_job: Dict[str, Dict[str, NodeXids]] = {}
    for job, node, summary in rows:
        entries = entries_of(summary)
        if entries is None:  # an older version's record: Xids of unknown kind and time
            count = summary.get("xids") if isinstance(summary, dict) else None
            if not _count(count) or not count:
                continue
            entries = ((None, None, count, None),)
        given = summary.get("xid_clock_error_s")
        error = float(given) if _number(given) and given <= MAX_CLOCK_ERROR_S else None
        # its times cannot be ordered: undated. A bound no kernel reports (not a number, negative,
        # beyond the kernel's cap) is no good clock either; only an absent one means "not asked"
        if (error is not None and error > tolerance) or (given is not None and error is None):
            entries = tuple((e[0], None, e[2], e[3]) for e in entries)
        by_job.setdefault(job, {}).setdefault(node, NodeXids(node, entries, error))
    return [
        line_up(job, list(nodes.values()), tolerance, trusted)
        for job, nodes in sorted(by_job.items())
        if len(nodes) > 1 and any(e[1] is not None for n in nodes.values() for e in n.entries)
    ]


def excused_summary(summary: Dict[str, Any], excused: int) -> Dict[str, Any]:
    """The summary as counted for its node: `excused` Xids fewer, and no "xids" among its
    abnormal reasons when none is left."""
    if not excused:
        return summary
    out = dict(summary)
    out["xids"] = max(0, (summary.get("xids") or 0) - excused)
    if not out["xids"]:
        out["abnormal"] = [a for a in summary.get("abnormal") or [] if a != "xids"]
    return out


def render(lineups: Sequence[JobLineup], tolerance: float, top: int = 20) -> List[str]:
    """The report's section: one line per job, the blamed node first."""
    if not lineups:
        return ["no job with Xids on two nodes or more"]
    causal = sum(1 for j in lineups if j.verdict == "causal")
    ambiguous = sum(1 for j in lineups if j.verdict == "ambiguous")
    excused = sum(sum(j.excused.values()) for j in lineups)
    lines = [
        "Xids lined up by job (clock tolerance %gs): %d job(s) with Xids on several nodes, "
        "%d with a causal node, %d ambiguous, %d Xid(s) on victims not counted"
        % (tolerance, len(lineups), causal, ambiguous, excused)
    ]
    if lineups and not lineups[0].trusted:
        lines.append(
            "  records NOT verified: the line-up is shown, but no node's Xids are excused by "
            "another node's record ([records] key_file)"
        )
    for j in lineups[:top]:
        lines.append("  job %s: %s" % (j.job, _verdict_text(j)))
        start = j.first[2] if j.first else None
        for n in j.nodes:
            codes = ", ".join(_entry_text(e, start) for e in n.entries)
            mark = ""
            if n.clock_error is not None and n.clock_error > tolerance:
                mark = "  (clock error up to %gs: not ordered)" % n.clock_error
            elif n.node in j.excused:
                mark = "  (victim: %d not counted)" % j.excused[n.node]
            elif n.node in j.counted_why:
                mark = "  (counted: %s)" % j.counted_why[n.node]
            lines.append("    %-20s %s%s" % (n.node, codes, mark))
    if len(lineups) > top:
        lines.append("  ... %d more jobs (--top N, --json)" % (len(lineups) - top))
    return lines


def _verdict_text(j: JobLineup) -> str:
    if j.first is None:
        return "no node logged a dated cause (only Xids 43/45, or no times): none blamed"
    node, xid, _when, blame = j.first
    if j.verdict == "ambiguous":
        return "ambiguous: first causes on %s within the clock tolerance, none blamed" % (
            ", ".join(j.contenders)
        )
    whose = "the application's" if blame == "job" else "the node's"
    return "first cause Xid %d on %s (%s fault by the catalog)" % (xid, node, whose)


def _entry_text(entry: Entry, start: Optional[float]) -> str:
    xid, when, count, _blame = entry
    name = "Xid %s" % xid if xid is not None else "more Xids"
    times = "" if count == 1 else " x%d" % count
    if when is None:
        return name + times + " (no time)"
    if start is None:
        return name + times
    return "%s%s %+.1fs" % (name, times, when - start)
