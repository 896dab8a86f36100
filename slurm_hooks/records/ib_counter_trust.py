"""Which InfiniBand traffic deltas can be trusted: a saturated or cleared counter is not a figure.

Where the counters come from (kernel drivers/infiniband/core/sysfs.c, the PORT_PMA_ATTR table):
`counters/port_xmit_wait` is the PMA PortCounters field PortXmitWait, **32 bits** (bit offset 320),
and the kernel has no 64-bit version of it in sysfs: the extended set it switches to when the HCA
supports it (PORT_PMA_ATTR_EXT: IB_PMA_CLASS_CAP_EXT_WIDTH) covers only port_xmit_data,
port_rcv_data, the packet counts and the unicast/multicast packets. A 64-bit PortXmitWait exists
only in the MAD-level PortCountersExtended of HCAs that set IsAdditionalPortCountersExtended
(infiniband-diags perfquery.c decodes it as IB_PC_EXT_XMT_WAIT_F with `perfquery -x`), which a
hook would have to query over umad, not read from a file; mlx5's hw_counters/
(drivers/infiniband/hw/mlx5/counters.c: queue, congestion and extended error counters) has no
xmit-wait counter either. So on every kernel the xmit-wait
figure comes from a counter that sticks at 0xFFFFFFFF (IBA: PMA counters saturate, they do not
wrap) until someone clears it (a subnet manager's perfmgr, `perfquery -R`, a driver reload).

And that is the port that matters: a port stalling on credits 1e7 times a second reaches 2^32 in
about seven minutes, a healthy one in hours or never. Before this module a counter at its maximum
in both snapshots was dropped and the figure taken from the other ports (a stalled port vanished
from the max), and a counter that hit its maximum during the job gave a too-small delta (the same).
Now each traffic counter of each port is judged:

- saturated: at the 32-bit maximum at the prolog or at the epilog: the delta is at best a lower
  bound (it stopped counting) — the figure is not measurable;
- cleared: lower at the epilog than at the prolog (reset during the job): the delta is unknown;

and a figure built from such a counter (the worst port's xmit wait, the sum of the ports' bytes)
is reported as unmeasurable with the reason, never computed from the ports that are left.

What such a counter still proves (issue 30, round 3): it counted at least so many ticks inside the
job. One that reached the maximum during the job counted max - start; one cleared during the job
counted at least its epilog value after the clear, within the job's time. So the stall rate was at
least that many ticks over the job's wall time: a LOWER BOUND (`lower_bounds`; perf makes
`ib_xmit_wait_per_s.lower_bound` of it). A counter at the maximum at both snapshots proves
nothing (it may have stopped before the job began). The report scores a bound only upwards, against
each peer's least known rate (stall_bounds: its measured figure or its own bound), so a bound can make a
node a suspect when even its least possible stall rate is far above its peers', never clear it.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Mapping

COUNTER_32BIT_MAX = (1 << 32) - 1  # where a 32-bit PMA counter stops (it saturates, never wraps)
SATURATED = "saturated"
CLEARED = "cleared"
# perf figure -> the traffic counter it is made of (perf._infiniband)
FIGURE_COUNTER = {
    "ib_xmit_wait_per_s": "port_xmit_wait",
    "ib_xmit_bytes_per_s": "port_xmit_data",
    "ib_rcv_bytes_per_s": "port_rcv_data",
}


def judge(before: Mapping[str, object], after: Mapping[str, object]) -> Dict[str, str]:
    """{counter: why its delta cannot be trusted} for one port's traffic counters at the two snapshots."""
    out: Dict[str, str] = {}
    for name, end in after.items():
        start = before.get(name)
        if type(start) is not int or type(end) is not int:
            continue
        if end < start:
            out[name] = "%s: %d at the prolog, %d at the epilog (reset during the job)" % (
                CLEARED,
                start,
                end,
            )
        elif start >= COUNTER_32BIT_MAX and end == start:
            out[name] = "%s: at the 32-bit maximum %d at the prolog and the epilog" % (
                SATURATED,
                COUNTER_32BIT_MAX,
            )
        elif end == COUNTER_32BIT_MAX:
            out[name] = "%s: reached the 32-bit maximum %d during the job (from %d)" % (
                SATURATED,
                COUNTER_32BIT_MAX,
                start,
            )
    return out


def lower_bounds(before: Mapping[str, object], after: Mapping[str, object]) -> Dict[str, int]:
    """{counter: ticks it surely counted during the job} for one port's untrusted counters (judge):
    max - start for one that reached the maximum during the job, the epilog value for one cleared
    during it (counted since the clear, which was inside the job); none for a counter stuck at the
    maximum at both snapshots, or for a bound of 0."""
    out: Dict[str, int] = {}
    for name, end in after.items():
        start = before.get(name)
        if type(start) is not int or type(end) is not int:
            continue
        if end < start:
            bound = end  # cleared: at least what it counted after the clear
        elif end == COUNTER_32BIT_MAX and start < end:
            bound = end - start  # hit the maximum: at least what it counted up to it
        else:
            continue
        if 0 < bound <= COUNTER_32BIT_MAX:
            out[name] = bound
    return out


def untrusted_figures(ports: Iterable[Mapping[str, object]]) -> Dict[str, str]:
    """{perf figure: "not scored: <saturated|cleared> (<port> <counter> ...)"} over a record's `ib`
    entries (each with `port` and `traffic_untrusted`). One untrusted port spoils the figure: the
    worst port's stalls are a max over ports, and the bytes a sum."""
    out: Dict[str, str] = {}
    for figure, counter in FIGURE_COUNTER.items():
        reasons: List[str] = []
        for port in ports:
            why = (port.get("traffic_untrusted") or {}).get(counter)  # type: ignore[union-attr]
            if isinstance(why, str):
                reasons.append("%s %s %s" % (port.get("port"), counter, why))
        if reasons:
            kind = SATURATED if any(SATURATED in r for r in reasons) else CLEARED
            shown = "; ".join(reasons[:2])  # the header line stays short with 8 HCAs
            if len(reasons) > 2:
                shown += "; and %d more port(s)" % (len(reasons) - 2)
            out[figure] = "not scored: %s (%s)" % (kind, shown)
    return out
