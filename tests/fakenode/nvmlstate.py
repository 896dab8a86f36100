"""The fake NVML state file: 'key = value' lines generated from a resolved spec.

State keys mirror spec keys: ``gpu.<i>.<spec key path>`` (e.g. ``gpu.3.ecc.volatile.uncorrected.dram``,
``gpu.0.nvlink.links.5.state``, ``gpu.2.remapped_rows.pending``).  Lists become comma-separated
(``gpu.0.retired_pages.single_bit = 0x1a2b000,0x1a2c000``), processes become ``pid:bytes`` pairs, booleans
1/0.  Fault injection lines: ``fault|hang|crash|delay_ms.<function>.<gpu index|*> = value``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from .pci import nvml_levels
from .spec import format_cpulist

SKIP_GPU_KEYS = {
    "fault",
    "hang",
    "crash",
    "delay_ms",
    "processes",
    "graphics_processes",
    "driver",
    "fields",
}


def fmt_value(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, (list, tuple)):
        return ",".join(
            hex(x) if isinstance(x, int) and not isinstance(x, bool) else fmt_value(x) for x in v
        )
    text = str(v)
    if "\n" in text:
        raise ValueError("state values cannot contain newlines: %r" % text)
    return text


HEX_KEYS = {
    "pci_vendor_id",
    "pci_device_id",
    "pci_subsystem_id",
    "pci_class",
    "clocks_event_reasons",
    "supported_clocks_event_reasons",
}


def _flatten(prefix: str, value: Any, out: List[str]) -> None:
    if value is None:
        return
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten("%s.%s" % (prefix, k), v, out)
    elif prefix.rsplit(".", 1)[-1] in HEX_KEYS and isinstance(value, int):
        out.append("%s = %#x" % (prefix, value))
    else:
        out.append("%s = %s" % (prefix, fmt_value(value)))


def _injections(scope: str, table: Dict[str, Any], kind: str, out: List[str]) -> None:
    for fn, v in sorted(table.items()):
        out.append("%s.%s.%s = %s" % (kind, fn, scope, fmt_value(v)))


def state_lines(spec: Dict[str, Any]) -> List[str]:
    nvml = spec["nvml"]
    out = [
        "# fakenvml state generated from %s" % spec.get("_source", "<spec>"),
        "# 'key = value'; edit freely (FakeNode.set_state); re-read by the library when the file changes",
        "driver_loaded = %s" % fmt_value(nvml["driver_loaded"]),
        "driver_version = %s" % nvml["driver_version"],
        "nvml_version = %s" % nvml["nvml_version"],
        "cuda_driver_version = %d" % nvml["cuda_driver_version"],
        "gpu.count = %d" % len(spec["gpu"]),
    ]
    for kind in ("fault", "hang", "crash", "delay_ms"):
        _injections("*", nvml[kind], kind, out)
    levels = nvml_levels(spec)
    for idx, g in spec["gpu"].items():
        p = "gpu.%d" % idx
        out.append("")
        for k, v in g.items():
            if k not in SKIP_GPU_KEYS:
                _flatten("%s.%s" % (p, k), v, out)
        sock_cpus = [
            c
            for n in spec["numa"].values()
            for c in n["cpus"]
            if _socket_of(spec, c) == g["socket"]
        ]
        out.append("%s.socket_cpulist = %s" % (p, format_cpulist(sock_cpus)))
        # nvmlDeviceGetTopologyCommonAncestor towards every other GPU, decided from the PCI tree (pci.nvml_level)
        for other in spec["gpu"]:
            out.append("%s.topology.%d = %d" % (p, other, levels[(idx, other)]))
        out.append(
            "%s.processes = %s"
            % (p, ",".join("%d:%d" % (x["pid"], x["used_memory"]) for x in g["processes"]))
        )
        out.append(
            "%s.graphics_processes = %s"
            % (p, ",".join("%d:%d" % (x["pid"], x["used_memory"]) for x in g["graphics_processes"]))
        )
        for fid, v in sorted(g["fields"].items(), key=lambda kv: int(kv[0])):
            out.append("%s.fields.%d = %s" % (p, int(fid), fmt_value(v)))
        for kind in ("fault", "hang", "crash", "delay_ms"):
            _injections(str(idx), g[kind], kind, out)
    names = {}
    for g in spec["gpu"].values():
        for x in g["processes"] + g["graphics_processes"]:
            names[x["pid"]] = x["name"]
    for pid in sorted(names):
        out.append("process.%d.name = %s" % (pid, names[pid]))
    return out


def _socket_of(spec: Dict[str, Any], cpu: int) -> int:
    from .spec import cpu_location

    return cpu_location(spec, cpu)[0]


def write_state(path: Union[str, Path], lines: List[str]) -> None:
    """Atomic replace (new inode), so the C library never reads a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".fakenvml.", dir=str(path.parent))
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, str(path))


def read_state(path: Union[str, Path]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for line in Path(path).read_text().splitlines():
        s = line.strip()
        if not s or s.startswith("#") or "=" not in s:
            continue
        k, v = s.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def update_state(path: Union[str, Path], changes: Dict[str, Optional[Any]]) -> None:
    """Set (value) or delete (None) keys, keeping the rest of the file (and its comments) in place."""
    lines = Path(path).read_text().splitlines()
    pending = dict(changes)
    out = []
    for line in lines:
        s = line.strip()
        key = s.split("=", 1)[0].strip() if "=" in s and not s.startswith("#") else None
        if key is not None and key in pending:
            v = pending.pop(key)
            if v is not None:
                out.append("%s = %s" % (key, fmt_value(v)))
            continue
        out.append(line)
    out.extend("%s = %s" % (k, fmt_value(v)) for k, v in pending.items() if v is not None)
    write_state(path, out)
