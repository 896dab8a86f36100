"""The qualification levels: which tools run, with which arguments, bounded by how long.

quick (a few minutes, after every repair): DCGM level 1 (deployment: driver, libraries,
persistence, page retirement), host<->device copy bandwidth of every GPU (a x8 or Gen3 link, a GPU
behind a bad switch port), and an all-reduce over the node's GPUs at large sizes (NVLink, a slow or
erroring GPU, #wrong). standard (the default; ~15 minutes): DCGM level 2 (adds PCIe and memory
plugins), device<->device copies (a slow GPU among its peers), all-reduce over every size, and
ib_write_bw loopback on each configured port (GPUDirect RDMA where the port's GPU is named).
long (a burn-in of an hour or more): DCGM level 3 (stress plugins), every nvbandwidth testcase,
a long all-reduce, and ib_write_bw with --use_cuda for 30 s per port.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from ..core.structs import Struct, field

LEVEL_NAMES = ("quick", "standard", "long")
TOOLS = ("dcgmi", "nvbandwidth", "all_reduce_perf", "ib_write_bw")


class Test(Struct):
    name: str  # dcgm, nvbandwidth, nccl, ib:<device>:<port>
    tool: str
    argv: Tuple[str, ...]
    timeout_s: float
    server_argv: Tuple[str, ...] = ()  # a loopback pair: started first, the client is argv
    figures: Tuple[str, ...] = field(default_factory=tuple)  # nvbandwidth testcases judged
    gpus: int = 0  # the GPUs the driver lists: each must be measured (nvbandwidth); 0 unknown


H2D, D2H, D2D = (
    "host_to_device_memcpy_ce",
    "device_to_host_memcpy_ce",
    "device_to_device_memcpy_read_ce",
)


def tests_for(level: str, gpus: int, ib_ports: List[Tuple[str, int, Optional[int]]]) -> List[Test]:
    """The tests of `level` on a node with `gpus` GPUs and the configured IB ports (device, port,
    the GPU index for --use_cuda or None)."""
    if level not in LEVEL_NAMES:
        raise ValueError("no qualification level %r (one of %s)" % (level, ", ".join(LEVEL_NAMES)))
    count = str(max(gpus, 1))
    if level == "quick":
        dcgm_level, dcgm_s = "1", 300.0
        nvb = (H2D, D2H)
        nccl = ("-b", "512M", "-e", "1G", "-f", "2")
        nccl_s = 300.0
    elif level == "standard":
        dcgm_level, dcgm_s = "2", 900.0
        nvb = (H2D, D2H, D2D)
        nccl = ("-b", "8", "-e", "4G", "-f", "2")
        nccl_s = 600.0
    else:
        dcgm_level, dcgm_s = "3", 3600.0
        nvb = ()  # every testcase
        nccl = ("-b", "8", "-e", "8G", "-f", "2", "-n", "200")
        nccl_s = 3600.0
    tests = [
        Test("dcgm", "dcgmi", ("dcgmi", "diag", "-r", dcgm_level, "-j"), dcgm_s),
        Test(
            "nvbandwidth",
            "nvbandwidth",
            ("nvbandwidth",) + (("-t",) + nvb if nvb else ()),
            600.0 if level != "long" else 1800.0,
            figures=nvb or (H2D, D2H, D2D),
            gpus=gpus,
        ),
        Test("nccl", "all_reduce_perf", ("all_reduce_perf",) + nccl + ("-g", count), nccl_s),
    ]
    if level == "quick":
        return tests
    for device, port, gpu in ib_ports:
        common = ("ib_write_bw", "-d", device, "-i", str(port), "-s", "8388608", "--report_gbits")
        if level == "long":
            common += ("-D", "30")
        if gpu is not None:
            common += ("--use_cuda=%d" % gpu,)
        tests.append(
            Test(
                "ib:%s:%d" % (device, port),
                "ib_write_bw",
                common + ("localhost",),
                120.0 if level != "long" else 300.0,
                server_argv=common,
            )
        )
    return tests
