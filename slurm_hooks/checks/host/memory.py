"""host.edac: DIMMs that log memory errors, from the kernel's EDAC counters.

Where the data comes from: /sys/devices/system/edac/mc (slurm_hooks.hw.edac; what `edac-util -v` and
`ras-mc-ctl --error-count` print), and the history of those counters between runs
(slurm_hooks.hw.counter_window, in [paths] state_dir).

Uncorrectable errors (UE) since the counters were last reset (boot, EDAC driver load) fail the node:
the memory returned wrong data once, and the kernel may have poisoned pages; the DIMM goes back to the
vendor. Correctable errors (CE) are normal in small numbers; a DIMM whose CEs grow fast is one that is
about to fail. The default threshold, 10 CEs in 24 hours per DIMM, is mcelog's default
`memory-ce-threshold = 10 / 24h` (mcelog.conf); crossing it is WARN by default (a guess at someone
else's hardware must not drain a fleet): set ce_status = "fail" to drain.
"""

from __future__ import annotations

from ...core.structs import Struct
from ...hw import counter_window
from ...hw.edac import Controller, Dimm, read_edac
from ...registry import DEFAULT_CONTEXTS, Param, check, gatherer
from ...result import Action, Blame, Result, Status
from . import common

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

NAME = "host.edac"


class EdacSnapshot(Struct):
    controllers: Tuple[Controller, ...]
    history: Optional[counter_window.History]  # None when there is nothing to keep (no EDAC)
    now: float


def _ce_series(controllers: Tuple[Controller, ...]) -> Dict[str, int]:
    values = {"%s/noinfo" % mc.name: mc.ce_noinfo for mc in controllers}
    values.update({d.key: d.ce for mc in controllers for d in mc.dimms if d.ce is not None})
    return values


@gatherer(NAME)
def read_memory_errors(ctx) -> EdacSnapshot:
    """/sys/devices/system/edac/mc/mc*/ (hw.edac) and the CE history in [paths] state_dir."""
    controllers = read_edac(ctx.host)
    now = common.clock()
    if not controllers:
        return EdacSnapshot(controllers, None, now)
    keep_s = ctx.config.check(NAME).params.window_hours * 3600.0
    zero_at = {}  # the counters were zero when the driver loaded or they were last reset
    for mc in controllers:
        if mc.seconds_since_reset is not None:
            for key in [d.key for d in mc.dimms if d.ce is not None] + ["%s/noinfo" % mc.name]:
                zero_at[key] = now - mc.seconds_since_reset
    history = common.record_history(ctx, "edac", _ce_series(controllers), keep_s, now, zero_at)
    return EdacSnapshot(controllers, history, now)


@check(
    name=NAME,
    contexts=DEFAULT_CONTEXTS,
    timeout=2.0,
    needs=(NAME,),
    params=(
        common.window_param(24.0, "correctable errors"),
        Param(
            "ce_threshold",
            int,
            10,
            "correctable errors of one DIMM within the window that need attention (mcelog's 10 / 24h)",
            minimum=1,
            maximum=1 << 40,
        ),
        common.status_param("ce_status", "warn", "a DIMM at or over ce_threshold"),
        common.status_param("ue_status", "fail", "an uncorrectable memory error since boot"),
    ),
)
def edac(snap: EdacSnapshot, params) -> List[Result]:
    """Memory DIMMs: no uncorrectable errors since boot, correctable ones under a rate (EDAC counters).

    One result per DIMM in trouble, named by its EDAC label (set the labels with `edac-ctl
    --register-labels` so that the component names the slot a technician pulls). SKIP when the
    kernel has no EDAC driver for this memory controller (most VMs, some platforms).
    """
    if not snap.controllers:
        return [
            Result(NAME, Status.SKIP, "no EDAC memory controller (/sys/devices/system/edac/mc)")
        ]
    window_s = params.window_hours * 3600.0
    ue_status, ce_status = common.STATUS_OF[params.ue_status], common.STATUS_OF[params.ce_status]
    results: List[Result] = []
    note = snap.history.note if snap.history else None
    for mc in snap.controllers:
        for dimm in mc.dimms:
            if dimm.ue:
                results.append(_ue_result(mc, dimm, dimm.ue, ue_status))
            if dimm.ce is not None:
                results.extend(_ce_result(snap, mc, dimm, window_s, params.ce_threshold, ce_status))
        if mc.ue_noinfo:
            results.append(_ue_result(mc, None, mc.ue_noinfo, ue_status))
        results.extend(_ce_result(snap, mc, None, window_s, params.ce_threshold, ce_status))
    counted = sum(len(mc.dimms) for mc in snap.controllers)
    if not any(r.status is not Status.OK for r in results):
        ignored = len(results)  # findings whose status is "ignore" in the config
        return [
            Result(
                NAME,
                Status.OK,
                "%d memory controller(s), %d DIMM counter(s): %s"
                % (
                    len(snap.controllers),
                    counted,
                    "%d finding(s) ignored by configuration" % ignored
                    if ignored
                    else "no uncorrectable error, correctable ones under %d per %gh"
                    % (params.ce_threshold, params.window_hours),
                ),
                details=dict(
                    {"history": note} if note else {}, ignored=[r.summary for r in results]
                ),
            )
        ]
    return [r for r in results if r.status is not Status.OK]


def _component(mc: Controller, dimm: Optional[Dimm]) -> str:
    if dimm is None:
        return "memory:%s (errors not placed on a DIMM)" % mc.name
    return "dimm:%s%s" % (dimm.key, " %s" % dimm.label if dimm.label else "")


def _ue_result(mc: Controller, dimm: Optional[Dimm], count: int, status: Status) -> Result:
    where = _component(mc, dimm)
    return Result(
        NAME,
        status,
        "%d uncorrectable memory error(s) since the counters were reset: %s"
        % (
            count,
            "replace the DIMM" if dimm is not None else "find the DIMM (mcelog, the BMC's SEL)",
        ),
        component=where,
        details={"ue_count": count, "seconds_since_reset": mc.seconds_since_reset},
        action=Action.RMA if status is Status.FAIL else Action.NONE,
        blame=Blame.NODE if status is Status.FAIL else None,
    )


def _ce_result(
    snap: EdacSnapshot,
    mc: Controller,
    dimm: Optional[Dimm],
    window_s: float,
    threshold: int,
    status: Status,
) -> List[Result]:
    key = dimm.key if dimm is not None else "%s/noinfo" % mc.name
    points = snap.history.series.get(key, ()) if snap.history else ()
    inc = counter_window.window_increase(points, snap.now, window_s)
    if inc.increase < threshold:
        return []
    where = _component(mc, dimm)
    return [
        Result(
            NAME,
            status,
            "%d correctable memory error(s) in the last %.1fh (threshold %d per %gh)"
            % (inc.increase, inc.covered_s / 3600.0, threshold, window_s / 3600.0),
            component=where,
            details={
                "ce_in_window": inc.increase,
                "ce_count": inc.current,
                "window_covered_s": round(inc.covered_s),
                "resets": inc.resets,
                "history": snap.history.note if snap.history else None,
            },
            action=Action.RMA if status is Status.FAIL else Action.NONE,
            blame=Blame.NODE if status is Status.FAIL else None,
        )
    ]
