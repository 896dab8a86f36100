"""Validators of the [qualify] settings (core/config.py declares the section and calls these at load):
a typo in a class table or a port must stop the load with the key named, not silently judge nothing.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from ..core.lazyre import lazy_compile

# [qualify.classes."<model> x<count>"] keys: floors a node of that class must reach
CLASS_KEYS = {
    "min_busbw_gbs": "all_reduce_perf bus bandwidth at >= 256 MiB, GB/s",
    "min_h2d_gbs": "nvbandwidth host_to_device_memcpy_ce of every GPU, GB/s",
    "min_d2h_gbs": "nvbandwidth device_to_host_memcpy_ce of every GPU, GB/s",
    "min_d2d_gbs": "nvbandwidth device_to_device_memcpy_read_ce of every GPU pair, GB/s",
    "min_ib_fraction": "ib_write_bw as a fraction of the port's link rate (0 < f <= 1; default 0.8)",
}
_CLASS_NAME = lazy_compile(r"^.{1,200} x[0-9]{1,3}$")
_PORT = lazy_compile(r"^[A-Za-z0-9_.-]{1,64}:\d{1,3}(=gpu\d{1,3})?$")


def check_classes(value: Any) -> Optional[str]:
    for name, table in value.items():
        if not _CLASS_NAME.match(name):
            return (
                "%r is not a class name '<GPU model> x<count>' (e.g. 'NVIDIA H100 80GB HBM3 x8')"
                % name
            )
        if not isinstance(table, dict):
            return "%r must be a table of %s" % (name, ", ".join(sorted(CLASS_KEYS)))
        for key, number in table.items():
            if key not in CLASS_KEYS:
                return "%r: unknown key %r (one of %s)" % (name, key, ", ".join(sorted(CLASS_KEYS)))
            if (
                isinstance(number, bool)
                or not isinstance(number, (int, float))
                or not math.isfinite(number)
            ):
                return "%r: %s = %r is not a number" % (name, key, number)
            if number <= 0 or (key == "min_ib_fraction" and number > 1):
                return "%r: %s = %r is out of range (%s)" % (name, key, number, CLASS_KEYS[key])
    return None


def check_ports(values: Any) -> Optional[str]:
    bad = [v for v in values if not _PORT.match(v)]
    return (
        "%r is not DEVICE:PORT or DEVICE:PORT=gpuN (e.g. 'mlx5_0:1=gpu0')" % bad[0] if bad else None
    )


def check_tools(values: Any) -> Optional[str]:
    from .levels import TOOLS

    bad = [v for v in values if v not in TOOLS]
    return "%r is not one of the tools (%s)" % (bad[0], ", ".join(TOOLS)) if bad else None
