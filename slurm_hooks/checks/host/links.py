"""host.ib_links: InfiniBand ports that flap or take errors, over a window of runs, not one job.

Where the data comes from: /sys/class/infiniband/<hca>/ports/<n>/counters/{link_downed, symbol_error,
link_error_recovery} (Documentation/ABI/testing/sysfs-class-infiniband; `perfquery` shows the same IBTA
PortCounters), and their history between runs (slurm_hooks.hw.counter_window, in [paths] state_dir).

link_downed counts the times the link went down for good (each one stalls every collective of the job
on that port); link_error_recovery the times it retrained successfully; symbol_error the bit errors on
the wire. The IBTA counters are 8 bits (link_downed, link_error_recovery: stop at 255) and 16 bits
(symbol_error: 65535) wide and saturate: a saturated counter cannot show new growth, which is reported
(WARN) until someone clears it (`perfquery -x -R`). Drivers without a PMA (iWARP) write "N/A (no PMA)":
those counters are left out.
"""

from __future__ import annotations

from ...core.lazyre import lazy_compile
from ...core.structs import Struct
from ...hw import counter_window
from ...hw.host import HostError
from ...registry import DEFAULT_CONTEXTS, Param, check, gatherer
from ...result import Action, Blame, Result, Status
from . import common

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

NAME = "host.ib_links"
IB_ROOT = "/sys/class/infiniband"
COUNTERS = {
    "link_downed": 255,
    "link_error_recovery": 255,
    "symbol_error": 65535,
}  # name -> saturation
_NO_PMA = lazy_compile(r"^N/A\b")


class IbCounters(Struct):
    ports: Tuple[str, ...]  # "mlx5_0/1"
    values: Dict[str, int]  # "mlx5_0/1/link_downed" -> value
    unreadable: Tuple[str, ...]  # what could not be read or parsed, with why
    history: Optional[counter_window.History]
    now: float


@gatherer(NAME)
def read_ib_counters(ctx) -> IbCounters:
    """The three link counters of every port under /sys/class/infiniband, and their history."""
    host = ctx.host
    ports: List[str] = []
    values: Dict[str, int] = {}
    unreadable: List[str] = []
    for hca_path in host.glob(IB_ROOT, "*"):
        hca = hca_path.rsplit("/", 1)[1]
        for port in host.listdir(hca_path + "/ports", default=[]):
            key = "%s/%s" % (hca, port)
            ports.append(key)
            for counter in COUNTERS:
                path = "%s/ports/%s/counters/%s" % (hca_path, port, counter)
                try:
                    text = host.read_text(path, default=None, max_bytes=64)
                except HostError as exc:
                    unreadable.append(str(exc))
                    continue
                if text is None or _NO_PMA.match(text.strip()):
                    continue
                try:
                    values["%s/%s" % (key, counter)] = int(text.strip())
                except ValueError:
                    unreadable.append("%s: not a counter value: %r" % (path, text[:40]))
    now = common.clock()
    history = None
    if values:
        keep_s = ctx.config.check(NAME).params.window_hours * 3600.0
        history = common.record_history(ctx, "ib", values, keep_s, now)
    return IbCounters(tuple(ports), values, tuple(unreadable), history, now)


@check(
    name=NAME,
    contexts=DEFAULT_CONTEXTS,
    timeout=2.0,
    needs=(NAME,),
    params=(
        common.window_param(24.0, "link flaps and link errors"),
        Param(
            "flaps_warn",
            int,
            1,
            "WARN when a port went down (link_downed) this many times within the window; 0 = never",
            minimum=0,
            maximum=1 << 20,
        ),
        Param(
            "flaps_fail",
            int,
            0,
            "FAIL (drain) when a port went down this many times within the window; 0 = never",
            minimum=0,
            maximum=1 << 20,
        ),
        Param(
            "recoveries_warn",
            int,
            10,
            "WARN when a port retrained (link_error_recovery) this many times within the window; 0 = never",
            minimum=0,
            maximum=1 << 20,
        ),
        Param(
            "symbol_errors_warn",
            int,
            1000,
            "WARN when a port counted this many symbol errors within the window; 0 = never",
            minimum=0,
            maximum=1 << 40,
        ),
    ),
)
def ib_links(snap: IbCounters, params) -> List[Result]:
    """InfiniBand ports: link flaps and link errors within a window (sysfs port counters, across runs).

    One result per port in trouble. A port's flaps may be the cable, the transceiver or the switch port
    rather than this node's HCA: a FAIL (flaps_fail, off by default) drains the node because every job
    placed on it stalls, and the details say to check the other end (ibdiagnet, the switch's counters).
    """
    if not snap.ports:
        return [Result(NAME, Status.SKIP, "no InfiniBand/RDMA device (/sys/class/infiniband)")]
    window_s = params.window_hours * 3600.0
    limits = {
        "link_downed": (params.flaps_warn, params.flaps_fail),
        "link_error_recovery": (params.recoveries_warn, 0),
        "symbol_error": (params.symbol_errors_warn, 0),
    }
    results = []
    for port in snap.ports:
        status, findings, details = Status.OK, [], {}
        for counter, (warn_at, fail_at) in limits.items():
            key = "%s/%s" % (port, counter)
            if key not in snap.values:
                continue
            points = snap.history.series.get(key, ()) if snap.history else ()
            inc = counter_window.window_increase(points, snap.now, window_s, COUNTERS[counter])
            details[counter] = {
                "in_window": inc.increase,
                "value": inc.current,
                "resets": inc.resets,
            }
            level = Status.OK
            if fail_at and inc.increase >= fail_at:
                level = Status.FAIL
            elif warn_at and inc.increase >= warn_at:
                level = Status.WARN
            if inc.saturated:
                level = max(level, Status.WARN, key=lambda s: s.severity)
                findings.append(
                    "%s saturated at %d (new growth invisible: clear it, perfquery -x -R)"
                    % (counter, inc.current)
                )
            if level is not Status.OK and inc.increase:
                findings.append("%s +%d" % (counter, inc.increase))
            status = max(status, level, key=lambda s: s.severity)
        if status is Status.OK:
            continue
        details["window_hours"] = params.window_hours
        details["other_end"] = (
            "the cable, transceiver or switch port may be at fault: check with ibdiagnet"
        )
        if snap.history and snap.history.note:
            details["history"] = snap.history.note
        results.append(
            Result(
                NAME,
                status,
                "in the last %gh: %s" % (params.window_hours, ", ".join(findings)),
                component="hca:%s" % port,
                details=details,
                action=Action.DRAIN if status is Status.FAIL else Action.NONE,
                blame=Blame.NODE if status is Status.FAIL else None,
            )
        )
    if snap.unreadable:
        results.append(
            Result(
                NAME,
                Status.UNKNOWN,
                "%d port counter(s) unreadable: %s" % (len(snap.unreadable), snap.unreadable[0]),
                details={"unreadable": list(snap.unreadable)},
            )
        )
    if not results:
        counted = len({k.rsplit("/", 1)[0] for k in snap.values})
        return [
            Result(
                NAME,
                Status.OK,
                "%d port(s), %d with counters: no flap or link errors over the thresholds in %gh"
                % (len(snap.ports), counted, params.window_hours),
            )
        ]
    return results
