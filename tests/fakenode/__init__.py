"""Fake GPU node for tests: one spec -> a sysfs/procfs tree AND a fake libnvidia-ml.so.1 that agree.

    from tests.fakenode import FakeNode
    node = FakeNode.build("dgx-h100", tmp_path, overrides={"gpu": {3: {"remapped_rows": {"pending": True}}}})
    subprocess.run([...], env=node.subprocess_env())      # real pynvml loads the fake via LD_LIBRARY_PATH
    node.inject_fault("nvmlDeviceGetEccMode", 3, 15)       # GPU 3 -> NVMLError_GpuIsLost

See README.md in this directory for the spec keys, state keys and the CLI.
"""

from __future__ import annotations

from .fakenvml import (
    FakeNvmlBuildError,
    build_library,
    exported_symbols,
    find_nvml_header,
    load_into_pynvml,
)
from .node import BuiltNode, FakeNode, build_node, fast_tmpdir
from .spec import SpecError, deep_merge, find_spec, format_cpulist, load_spec, parse_cpulist

__all__ = [
    "BuiltNode",
    "FakeNode",
    "FakeNvmlBuildError",
    "SpecError",
    "build_library",
    "build_node",
    "deep_merge",
    "exported_symbols",
    "fast_tmpdir",
    "find_nvml_header",
    "find_spec",
    "format_cpulist",
    "load_into_pynvml",
    "load_spec",
    "parse_cpulist",
]
