"""One qualification on this node: find the hardware class, run the level's tests bounded, judge
each, compare with the fleet, decide, keep the record. Used by `slurm-hooks qualify`.

The hardware class is "<GPU model> x<count>", the model from /proc/driver/nvidia/gpus/*/information
(the driver's own view, readable without NVML), or [qualify] class / --class where the site names it.

Verdict: fail when a test failed (the reason names the test and its figure); not qualified
(UNKNOWN) when a required tool is missing or a test could not be judged; pass otherwise. A SKIP is
never a pass: only the tools in [qualify] optional_tools may be missing from a passing run.
"""

from __future__ import annotations

import re
import time
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

from ..core.lazyre import lazy_compile
from ..hw.host import Host
from ..result import ExitCode, Status
from . import judge, levels, record, tools

RATE = lazy_compile(r"^\s*([0-9]+(\.[0-9]+)?)\s*Gb/sec")
VERDICT_EXIT = {"pass": ExitCode.OK, "fail": ExitCode.FAIL, "not qualified": ExitCode.UNKNOWN}


def gpu_inventory(host: Host) -> List[str]:
    """The model of each GPU the driver lists, in bus order."""
    models = []
    for bdf in sorted(host.listdir("/proc/driver/nvidia/gpus", default=[])):
        text = host.read_text("/proc/driver/nvidia/gpus/%s/information" % bdf, default="")
        match = re.search(r"^Model:\s*(.+?)\s*$", text, re.M)
        models.append(match.group(1) if match else "unknown")
    return models


def hardware_class(models: List[str]) -> str:
    if not models:
        return "no GPU"
    names = sorted(set(models))
    return "%s x%d" % ("+".join(names), len(models))


def port_rate(host: Host, device: str, port: int) -> Optional[float]:
    """The port's link rate in Gb/s from sysfs ("400 Gb/sec (4X NDR)"), None where unreadable."""
    text = host.read_text("/sys/class/infiniband/%s/ports/%d/rate" % (device, port), default="")
    match = RATE.match(text)
    return float(match.group(1)) if match else None


def parse_ports(values: List[str]) -> List[Tuple[str, int, Optional[int]]]:
    """[qualify] ib_ports entries "mlx5_0:1" or "mlx5_0:1=gpu3" (GPUDirect from GPU 3)."""
    out = []
    for value in values:
        match = re.match(r"^([A-Za-z0-9_.-]{1,64}):(\d{1,3})(=gpu(\d{1,3}))?$", value)
        if not match:
            raise ValueError("%r is not DEVICE:PORT or DEVICE:PORT=gpuN" % value)
        out.append(
            (match.group(1), int(match.group(2)), int(match.group(4)) if match.group(4) else None)
        )
    return out


def run_level(
    settings: Mapping[str, Any],
    level: str,
    node: str,
    host: Host,
    env: Optional[Dict[str, str]] = None,
    class_name: Optional[str] = None,
    records_dir: Optional[str] = None,
    now: Optional[float] = None,
    trusted_uids: Optional[Set[int]] = None,
) -> Dict[str, Any]:
    """The record of one qualification run (not yet written)."""
    started = time.time() if now is None else now
    clock = time.monotonic()
    models = gpu_inventory(host)
    hw_class = class_name or settings.get("class") or hardware_class(models)
    expect = dict((settings.get("classes") or {}).get(hw_class, {}))
    ports = parse_ports(list(settings.get("ib_ports") or []))
    outcomes: List[judge.Outcome] = []
    for test in levels.tests_for(level, len(models), ports):
        if test.server_argv:
            run = tools.run_pair(test.server_argv, test.argv, test.timeout_s, env)
        else:
            run = tools.run(test.argv, test.timeout_s, env)
        rate = None
        if test.tool == "ib_write_bw":
            _, device, port = test.name.split(":")
            rate = port_rate(host, device, int(port))
        outcomes.append(judge.judge(test, run, expect, float(settings["node_fraction"]), rate))
    tool_seconds = sum(o.seconds for o in outcomes)
    if records_dir:
        _fleet(outcomes, records_dir, hw_class, level, node, settings, trusted_uids)
    verdict, reason = decide(outcomes, list(settings.get("optional_tools") or []))
    return {
        "schema": record.SCHEMA,
        "node": node,
        "level": level,
        "class": hw_class,
        "gpus": len(models),
        "started": round(started, 3),
        "seconds": round(time.monotonic() - clock, 3),
        "our_seconds": round(max(0.0, time.monotonic() - clock - tool_seconds), 3),
        "verdict": verdict,
        "reason": reason,
        "tests": [
            {
                "name": o.name,
                "tool": o.tool,
                "status": o.status.value,
                "summary": o.summary,
                "figures": o.figures,
                "seconds": o.seconds,
            }
            for o in outcomes
        ],
    }


def _fleet(outcomes, records_dir, hw_class, level, node, settings, trusted_uids) -> None:
    """A figure well below the class median of the node's peers fails its test, even above the
    class floor (the floor is a spec sheet; the peers are what this fleet actually delivers)."""
    medians = record.class_medians(
        records_dir, hw_class, level, node, int(settings["fleet_min_peers"]), trusted_uids
    )
    fraction = float(settings["fleet_fraction"])
    for outcome in outcomes:
        if outcome.status not in (Status.OK, Status.WARN):
            continue
        for key, value in sorted(outcome.figures.items()):
            if key not in medians or key.startswith("dcgm."):
                continue
            median, peers = medians[key]
            if value < fraction * median:
                outcome.status = Status.FAIL
                outcome.summary = "%s %.1f < %d%% of the %s median %.1f (%d peers)" % (
                    key,
                    value,
                    round(fraction * 100),
                    hw_class,
                    median,
                    peers,
                )
                break


def decide(outcomes: List[judge.Outcome], optional_tools: List[str]) -> Tuple[str, str]:
    failed = [o for o in outcomes if o.status is Status.FAIL]
    if failed:
        return "fail", "; ".join("%s: %s" % (o.name, o.summary) for o in failed)
    missing = [o for o in outcomes if o.status is Status.SKIP and o.tool not in optional_tools]
    unknown = [o for o in outcomes if o.status is Status.UNKNOWN]
    if missing or unknown:
        parts = ["%s: %s" % (o.name, o.summary) for o in missing + unknown]
        return "not qualified", "; ".join(parts)
    if not any(o.status in (Status.OK, Status.WARN) for o in outcomes):
        return "not qualified", "no test ran"
    return "pass", "%d tests passed" % sum(
        1 for o in outcomes if o.status in (Status.OK, Status.WARN)
    )
