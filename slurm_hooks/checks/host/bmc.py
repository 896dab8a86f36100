"""host.bmc: what the BMC already knows (sensors past their thresholds, new system event log records).

Where the data comes from: `ipmitool sdr list` (name | reading | status; `sdr elist`'s five columns are
read too) and `ipmitool sel elist` (id | date | time | sensor | event | Asserted/Deasserted), through
the local KCS/SSIF interface (/dev/ipmi0, root), each bounded by `tool_timeout` (slurm_hooks.hw.tools).
Health context and manual runs only: a BMC may take seconds to answer, or never.

Sensor status codes (ipmitool lib/ipmi_sdr.c): ok, nc (non-critical), cr (critical), nr
(non-recoverable), ns (no reading: sensor absent or disabled), us (unspecified). A discrete sensor can
read "ok" while its state says otherwise (ipmitool issue #176: a power unit's "Redundancy Lost"), so
the SEL is read too. The SEL is history that survives reboots and repairs: only records that appeared
since the previous run are judged (the records seen are kept in [paths] state_dir/host-sel.json);
the first run only takes note of what is there.
"""

from __future__ import annotations

import os
import re
from typing import Dict, List, Optional, Tuple

from ...core import locks
from ...core.atomicio import read_json, write_json_atomic
from ...core.structs import Struct
from ...hw import tools
from ...registry import Param, check, gatherer
from ...result import Result, Status
from . import common

NAME = "host.bmc"
MAX_SEL_KEPT = 4096  # SEL records remembered (a SEL holds at most 65534; BMCs keep far fewer)
SENSOR_BAD = {"cr": "critical", "nr": "non-recoverable"}
# SEL events worth a look (ipmitool's event texts, lib/ipmi_sel.c); "Correctable ECC" is left to host.edac.
SEL_PATTERNS = (
    (
        "memory",
        re.compile(r"Uncorrectable ECC|Uncorrectable machine check|Memory.*(Parity|Failed)", re.I),
    ),
    (
        "power supply",
        re.compile(
            r"Power Supply.*(Failure detected|AC lost|Predictive failure|Config Error)|Power Supply AC lost",
            re.I,
        ),
    ),
    ("fan", re.compile(r"Fan.*(Lower Critical|Lower Non-recoverable)", re.I)),
    ("temperature", re.compile(r"Temp.*(Upper Critical|Upper Non-recoverable)", re.I)),
    ("processor", re.compile(r"IERR|Thermal Trip|CATERR|Machine Check", re.I)),
)


class Sensor(Struct):
    name: str
    reading: str
    status: str


class SelRecord(Struct):
    key: str  # the whole line, spaces normalised: a record's identity across runs
    record_id: str
    text: str  # sensor | event
    asserted: bool


class BmcSnapshot(Struct):
    sensors: Tuple[Sensor, ...]
    sdr_error: str  # "" or why `sdr list` gave nothing (tools outcome and message)
    sdr_outcome: str
    new_records: Tuple[SelRecord, ...]
    sel_count: int
    sel_error: str
    sel_outcome: str
    first_run: bool
    note: str = ""


def parse_sdr(text: str) -> List[Sensor]:
    """`ipmitool sdr list` (3 columns) or `sdr elist` (5 columns: name | id | status | entity | reading)."""
    sensors = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) == 3:
            sensors.append(Sensor(cells[0], cells[1], cells[2].lower()))
        elif len(cells) == 5:
            sensors.append(Sensor(cells[0], cells[4], cells[2].lower()))
    return sensors


def parse_sel(text: str) -> List[SelRecord]:
    """`ipmitool sel elist`: "  3a | 12/14/22 | 23:09:44 CET | Memory #0x88 | Correctable ECC (CPU0_G1) | Asserted"."""
    records = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) < 5 or not re.match(r"^[0-9a-fA-F]+$", cells[0]):
            continue
        direction = cells[5].lower() if len(cells) > 5 else "asserted"
        records.append(
            SelRecord(
                " | ".join(cells), cells[0], " | ".join(cells[3:5]), direction != "deasserted"
            )
        )
    return records


@gatherer(NAME)
def read_bmc(ctx) -> BmcSnapshot:
    """`ipmitool sdr list` and `ipmitool sel elist` (bounded), and the SEL records seen before."""
    params = ctx.config.check(NAME).params
    live = ctx.host.is_live or "tools" in ctx.config.get("general", "root_live_sources")
    if not live:
        return BmcSnapshot(
            (),
            "the BMC is asked by a tool on the running node",
            tools.MISSING,
            (),
            0,
            "",
            tools.MISSING,
            False,
        )
    sdr = tools.run_tool(params.command, ["sdr", "list"], params.tool_timeout)
    sensors = tuple(parse_sdr(sdr.stdout)) if sdr.outcome == tools.OK else ()
    sel = tools.run_tool(params.command, ["sel", "elist"], params.tool_timeout)
    records = parse_sel(sel.stdout) if sel.outcome == tools.OK else []
    new: List[SelRecord] = []
    first, note = False, ""
    if sel.outcome == tools.OK:
        new, first, note = _new_records(ctx, records)
    return BmcSnapshot(
        sensors,
        sdr.error,
        sdr.outcome,
        tuple(new),
        len(records),
        sel.error,
        sel.outcome,
        first,
        note,
    )


def _new_records(ctx, records: List[SelRecord]) -> Tuple[List[SelRecord], bool, str]:
    """Records not seen by the previous run; remembers this run's. Errors keep the history to this run."""
    state_dir = ctx.config.get("paths", "state_dir")
    if not ctx.host.is_live:
        state_dir = ctx.host.real(state_dir)
    path = os.path.join(state_dir, "host-sel.json")
    keys = [r.key for r in records][-MAX_SEL_KEPT:]
    try:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        with locks.locked(path + ".lock", 0.5):
            try:
                old = read_json(path, default=None)
            except ValueError as exc:
                old, note = None, "SEL history reset: %s" % exc
            else:
                note = ""
            seen = set(old.get("seen", [])) if isinstance(old, dict) else None
            if seen is None or set(keys) != seen:
                write_json_atomic(path, {"version": 1, "seen": keys})
    except OSError as exc:
        return [], True, "SEL history not kept (%s): %s" % (path, exc.strerror or exc)
    if seen is None:
        return [], True, note
    return [r for r in records if r.key not in seen], False, note


@check(
    name=NAME,
    contexts=("health", "manual"),
    timeout=40.0,
    needs=(NAME,),
    params=(
        Param(
            "command",
            str,
            "ipmitool",
            "the ipmitool executable (a name looked up in /usr/sbin, /usr/bin, ...; or a path)",
        ),
        Param(
            "tool_timeout",
            float,
            15.0,
            "seconds one ipmitool call may take (two per run)",
            above=0,
            maximum=60,
        ),
        common.status_param(
            "sensor_status", "warn", "a sensor in critical (cr) or non-recoverable (nr) state"
        ),
        common.status_param(
            "sel_status",
            "warn",
            "a new SEL record about memory, power supplies, fans, temperature or CPUs",
        ),
        Param(
            "ignore_sensors",
            list,
            [],
            "sensor names not to judge (a fan slot left empty on purpose)",
            item_type=str,
        ),
    ),
)
def bmc(snap: BmcSnapshot, params) -> List[Result]:
    """BMC: no sensor past its critical threshold, no new SEL record of a failing part (ipmitool).

    Health context only, two bounded ipmitool calls. No ipmitool is SKIP; a BMC that does not answer
    (timeout, no /dev/ipmi0, not root) is UNKNOWN, never a drain; everything it reports is WARN by
    default (sensor_status, sel_status): a BMC's thresholds and event texts vary by vendor.
    """
    if snap.sdr_outcome == tools.MISSING and snap.sel_outcome == tools.MISSING:
        return [Result(NAME, Status.SKIP, snap.sdr_error or "ipmitool not installed")]
    results: List[Result] = []
    sensor_status = common.STATUS_OF[params.sensor_status]
    for sensor in snap.sensors:
        if (
            sensor.status in SENSOR_BAD
            and sensor.name not in params.ignore_sensors
            and sensor_status is not Status.OK
        ):
            results.append(
                Result(
                    NAME,
                    sensor_status,
                    "BMC sensor %s is %s (%s)"
                    % (sensor.name, SENSOR_BAD[sensor.status], sensor.reading),
                    component="bmc-sensor:%s" % sensor.name,
                    details={"status": sensor.status, "reading": sensor.reading},
                )
            )
    sel_status = common.STATUS_OF[params.sel_status]
    for record in snap.new_records:
        kind = _classify(record)
        if kind and record.asserted and sel_status is not Status.OK:
            results.append(
                Result(
                    NAME,
                    sel_status,
                    "new BMC event (%s): %s" % (kind, record.text),
                    component="bmc-sel:%s" % record.record_id,
                    details={"record": record.key},
                )
            )
    for outcome, error, what in (
        (snap.sdr_outcome, snap.sdr_error, "sdr list"),
        (snap.sel_outcome, snap.sel_error, "sel elist"),
    ):
        if outcome not in (tools.OK, tools.MISSING):
            results.append(Result(NAME, Status.UNKNOWN, "ipmitool %s: %s" % (what, error)))
    if results:
        return results
    details: Dict[str, object] = {"sel_records": snap.sel_count}
    if snap.note:
        details["history"] = snap.note
    return [
        Result(
            NAME,
            Status.OK,
            "%d sensor(s) within thresholds, %d SEL record(s)%s"
            % (
                len(snap.sensors),
                snap.sel_count,
                " (first run: taken as seen)" if snap.first_run else ", none new of concern",
            ),
            details=details,
        )
    ]


def _classify(record: SelRecord) -> Optional[str]:
    for kind, pattern in SEL_PATTERNS:
        if pattern.search(record.text):
            return kind
    return None
