"""host.nvme: NVMe drives' own health (SMART / health information log), in the health context.

Where the data comes from: the controllers under /sys/class/nvme (model, serial), and `nvme smart-log
/dev/nvmeN -o json` (nvme-cli, src/nvme-print-json.c json_smart_log) for each: critical_warning (a
number, or with -H an object whose "value" is the number), avail_spare and spare_thresh (percent),
percent_used, media_errors. The kernel exposes none of these in sysfs (only the composite temperature,
through hwmon), so the tool is needed; it needs root, and is run with a timeout (slurm_hooks.hw.tools).
Counters may be numbers or, from nvme-cli releases between commits 2a8bc94 and 134ea78 (2023), strings
with thousands separators ("2,752,848"): both are read.

critical_warning bits (NVMe base specification, SMART / Health Information log, byte 0): 0x01 spare
below threshold, 0x02 temperature, 0x04 reliability degraded, 0x08 media read-only, 0x10 volatile
memory backup failed, 0x20 persistent memory region read-only.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Optional, Tuple

from ...core.lazyre import lazy_compile
from ...core.structs import Struct
from ...hw import counter_window, tools
from ...registry import Param, check, gatherer
from ...result import Action, Blame, Result, Status
from . import common

NAME = "host.nvme"
NVME_CLASS = "/sys/class/nvme"
_CONTROLLER = lazy_compile(r"^nvme[0-9]+$")
WARNING_BITS = (
    (0x01, "available spare below its threshold"),
    (0x02, "temperature outside its thresholds"),
    (
        0x04,
        "reliability degraded (media or internal errors; some drives also set it past 100% used)",
    ),
    (0x08, "media placed in read-only mode"),
    (0x10, "volatile memory backup failed"),
    (0x20, "persistent memory region read-only"),
)
READ_ONLY = 0x08


class DriveHealth(Struct):
    name: str  # nvme0
    model: str
    serial: str
    outcome: str  # tools.OK / MISSING / TIMEOUT / FAILED, or "unparsable"
    error: str = ""
    critical_warning: int = 0
    avail_spare: Optional[int] = None
    spare_thresh: Optional[int] = None
    percent_used: Optional[int] = None
    media_errors: Optional[int] = None


class NvmeSnapshot(Struct):
    drives: Tuple[DriveHealth, ...]
    history: Optional[counter_window.History]
    now: float
    skipped: str = ""  # why nothing was asked (no drives, a tree under --root)


def parse_smart_log(text: str, source: str) -> Dict[str, int]:
    """The fields we judge from `nvme smart-log -o json`; ValueError naming the source and the key."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError("%s: not JSON: %s" % (source, exc)) from None
    if not isinstance(data, dict):
        raise ValueError("%s: not a JSON object" % source)
    out: Dict[str, int] = {}
    warning = data.get("critical_warning")
    if isinstance(warning, dict):  # nvme smart-log -H: {"value": 4, "available_spare": 0, ...}
        warning = warning.get("value")
    for key, value in (("critical_warning", warning),) + tuple(
        (k, data.get(k)) for k in ("avail_spare", "spare_thresh", "percent_used", "media_errors")
    ):
        if value is None:
            continue
        out[key] = _number(value, "%s: %s" % (source, key))
    if "critical_warning" not in out:
        raise ValueError("%s: no critical_warning: not a smart-log" % source)
    return out


def _number(value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise ValueError("%s: %r is not a number" % (where, value))
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.match(r"^[0-9][0-9,]*$", value.strip()):
        return int(value.strip().replace(",", ""))
    raise ValueError("%s: %r is not a number" % (where, value))


@gatherer(NAME)
def read_nvme_health(ctx) -> NvmeSnapshot:
    """`nvme smart-log /dev/<ctrl> -o json` for each controller in /sys/class/nvme (or those configured)."""
    params = ctx.config.check(NAME).params
    now = common.clock()
    live = ctx.host.is_live or "tools" in ctx.config.get("general", "root_live_sources")
    names = [n for n in ctx.host.listdir(NVME_CLASS, default=[]) if _CONTROLLER.match(n)]
    if params.devices:
        names = [n for n in names if n in params.devices]
    if not names:
        return NvmeSnapshot((), None, now, "no NVMe controller in /sys/class/nvme")
    if not live:
        return NvmeSnapshot((), None, now, "the SMART log is read by a tool on the running node")
    drives = []
    for name in names:
        base = "%s/%s" % (NVME_CLASS, name)
        model = ctx.host.read_text(base + "/model", default="").strip()
        serial = ctx.host.read_text(base + "/serial", default="").strip()
        run = tools.run_tool(
            params.command, ["smart-log", "/dev/" + name, "-o", "json"], params.tool_timeout
        )
        if run.outcome != tools.OK:
            drives.append(DriveHealth(name, model, serial, run.outcome, run.error))
            continue
        try:
            fields = parse_smart_log(run.stdout, "nvme smart-log /dev/%s" % name)
        except ValueError as exc:
            drives.append(DriveHealth(name, model, serial, "unparsable", str(exc)))
            continue
        drives.append(DriveHealth(name, model, serial, tools.OK, **fields))
    media = {
        "%s/%s/media_errors" % (d.name, d.serial): d.media_errors
        for d in drives
        if d.media_errors is not None
    }
    history = None
    if media:
        history = common.record_history(ctx, "nvme", media, params.window_hours * 3600.0, now)
    return NvmeSnapshot(tuple(drives), history, now)


@check(
    name=NAME,
    contexts=("health", "manual"),
    timeout=30.0,
    needs=(NAME,),
    params=(
        Param(
            "command",
            str,
            "nvme",
            "the nvme-cli executable (a name looked up in /usr/sbin, /usr/bin, ...; or a path)",
        ),
        Param(
            "tool_timeout", float, 5.0, "seconds one `nvme smart-log` may take", above=0, maximum=60
        ),
        Param(
            "devices",
            list,
            [],
            "controllers to judge (e.g. nvme1, nvme2: the scratch drives); empty = all",
            item_type=str,
        ),
        common.status_param(
            "readonly_status", "fail", "a drive whose media went read-only (critical_warning 0x08)"
        ),
        common.status_param(
            "warning_status", "warn", "any other critical_warning bit, spare under its threshold"
        ),
        Param(
            "percent_used_warn",
            int,
            100,
            "WARN at this percent of rated endurance used; 0 = never",
            minimum=0,
            maximum=255,
        ),
        common.window_param(24.0, "new media errors"),
        Param(
            "media_errors_warn",
            int,
            1,
            "WARN at this many new media errors within the window; 0 = never",
            minimum=0,
            maximum=1 << 40,
        ),
    ),
)
def nvme(snap: NvmeSnapshot, params) -> List[Result]:
    """NVMe drives: no critical warning, spare above its threshold, no new media errors (nvme smart-log).

    Health context only (a process per drive, root needed). A missing nvme-cli is SKIP; a drive whose
    log cannot be read (no permission, timeout, unparsable output) is UNKNOWN, never a drain.
    """
    if not snap.drives:
        return [Result(NAME, Status.SKIP, snap.skipped or "no NVMe drive")]
    if all(d.outcome == tools.MISSING for d in snap.drives):
        return [Result(NAME, Status.SKIP, snap.drives[0].error)]
    results = [_judge(d, snap, params) for d in snap.drives]
    bad = [r for r in results if r.status is not Status.OK]
    if bad:
        return bad
    return [
        Result(
            NAME,
            Status.OK,
            "%d NVMe drive(s): no critical warning, spare and wear within limits" % len(results),
        )
    ]


def _judge(drive: DriveHealth, snap: NvmeSnapshot, params) -> Result:
    component = "nvme:%s %s %s" % (drive.name, drive.model, drive.serial)
    if drive.outcome != tools.OK:
        return Result(
            NAME,
            Status.UNKNOWN,
            "%s: SMART log not read: %s" % (drive.name, drive.error),
            component=component,
        )
    findings: List[Tuple[Status, str]] = []
    ro_status = common.STATUS_OF[params.readonly_status]
    warn_status = common.STATUS_OF[params.warning_status]
    for bit, meaning in WARNING_BITS:
        if drive.critical_warning & bit:
            findings.append((ro_status if bit == READ_ONLY else warn_status, meaning))
    if (
        drive.avail_spare is not None
        and drive.spare_thresh is not None
        and drive.avail_spare < drive.spare_thresh
    ):
        findings.append(
            (
                warn_status,
                "spare %d%% under its threshold %d%%" % (drive.avail_spare, drive.spare_thresh),
            )
        )
    if (
        params.percent_used_warn
        and drive.percent_used is not None
        and drive.percent_used >= params.percent_used_warn
    ):
        findings.append((Status.WARN, "%d%% of its rated endurance used" % drive.percent_used))
    details: Dict[str, Any] = {
        "critical_warning": drive.critical_warning,
        "avail_spare": drive.avail_spare,
        "spare_thresh": drive.spare_thresh,
        "percent_used": drive.percent_used,
        "media_errors": drive.media_errors,
    }
    if drive.media_errors is not None and snap.history is not None:
        points = snap.history.series.get("%s/%s/media_errors" % (drive.name, drive.serial), ())
        inc = counter_window.window_increase(points, snap.now, params.window_hours * 3600.0)
        details["media_errors_in_window"] = inc.increase
        if params.media_errors_warn and inc.increase >= params.media_errors_warn:
            findings.append(
                (Status.WARN, "%d new media error(s) in %gh" % (inc.increase, params.window_hours))
            )
    findings = [f for f in findings if f[0] is not Status.OK]
    if not findings:
        return Result(
            NAME, Status.OK, "%s healthy" % drive.name, component=component, details=details
        )
    status = max((f[0] for f in findings), key=lambda s: s.severity)
    return Result(
        NAME,
        status,
        "; ".join(f[1] for f in findings),
        component=component,
        details=details,
        action=Action.RMA if status is Status.FAIL else Action.NONE,
        blame=Blame.NODE if status is Status.FAIL else None,
    )
