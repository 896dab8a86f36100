"""Where pynvml comes from: an installed nvidia-ml-py first, else the copy the RPM bundles.

nvidia-ml-py (NVIDIA's Python binding of libnvidia-ml.so.1, one pure-Python module `pynvml.py`) is
rarely packaged by distributions: RHEL/Rocky and EPEL don't ship it. The RPM therefore bundles the
module from the nvidia-ml-py wheel as slurm_hooks/_vendor/pynvml.py (see packaging/slurm-hooks.spec,
`rpm -q --provides slurm-hooks` names its version). A pynvml installed on the node (pip, or a
distribution package) still wins: it is usually newer, and newer drivers add NVML functions. The
bundled directory is appended to sys.path, never prepended, so it can shadow nothing.

Checking which one a node uses: `python3 -c 'from slurm_hooks.vendor import import_pynvml;
print(import_pynvml().__file__)'`. In a development checkout there is no _vendor directory and
an ImportError means nvidia-ml-py is not installed (`pip install nvidia-ml-py`).
"""
from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

VENDOR_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_vendor")


def import_pynvml() -> ModuleType:
    """Import pynvml: the node's own nvidia-ml-py if importable, else the bundled copy.

    Raises ImportError (from the first attempt, which names the missing module) when neither exists;
    nvml.py turns that into "nvidia-ml-py is not installed".
    """
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        if not os.path.isfile(os.path.join(VENDOR_DIR, "pynvml.py")):
            raise
    if VENDOR_DIR not in sys.path:
        sys.path.append(VENDOR_DIR)
    return importlib.import_module("pynvml")
