"""Where pynvml comes from: an installed nvidia-ml-py first, else the copy the RPM bundles.

nvidia-ml-py (NVIDIA's Python binding of libnvidia-ml.so.1, one pure-Python module `pynvml.py`) is
rarely packaged by distributions: RHEL/Rocky and EPEL don't ship it. The RPM therefore bundles the
module from the nvidia-ml-py wheel as slurm_hooks/_vendor/pynvml.py (see packaging/slurm-hooks.spec,
`rpm -q --provides slurm-hooks` names its version). A pynvml installed on the node (pip, or a
distribution package) still wins: it is usually newer, and newer drivers add NVML functions. The
bundled directory is appended to sys.path, never prepended, so it can shadow nothing.

Checking which one a node uses: `python3 -c 'from slurm_hooks.hw.pynvml_import import import_pynvml;
print(import_pynvml().__file__)'`. In a development checkout there is no _vendor directory and
an ImportError means nvidia-ml-py is not installed (`pip install nvidia-ml-py`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from types import ModuleType

from ..core.lazyre import compiled_on_use

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Iterator
VENDOR_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_vendor"
)  # slurm_hooks/_vendor


def import_pynvml() -> ModuleType:
    """Import pynvml: the node's own nvidia-ml-py if importable, else the bundled copy.

    Raises ImportError (from the first attempt, which names the missing module) when neither exists;
    nvml.py turns that into "nvidia-ml-py is not installed".
    """
    # with `string`'s Template pattern (pynvml imports string, and never uses it) compiled on use
    with _lazy_ctypes_util(), compiled_on_use():
        try:
            return importlib.import_module("pynvml")
        except ImportError:
            if not os.path.isfile(os.path.join(VENDOR_DIR, "pynvml.py")):
                raise
        if VENDOR_DIR not in sys.path:
            sys.path.append(VENDOR_DIR)
        return importlib.import_module("pynvml")


@contextlib.contextmanager
def _lazy_ctypes_util() -> Iterator[None]:
    """While pynvml imports, `ctypes.util` is a stand-in whose find_library loads the real one.

    pynvml.py does `from ctypes.util import find_library` at the top and never calls it (it opens
    libnvidia-ml.so.1 by name), but ctypes.util imports subprocess, shutil and tempfile: ~3 ms of
    every prolog's check process on 2 cores, a tenth of its Python start-up. The stand-in leaves
    sys.modules afterwards, so any later `import ctypes.util` gets the real module; if pynvml ever
    calls find_library, the call is passed to the real function.
    """
    if "ctypes.util" in sys.modules:
        yield
        return
    stand_in = ModuleType(
        "ctypes.util", "slurm-hooks stand-in: the real ctypes.util loads on first use"
    )

    def find_library(name: str):
        if sys.modules.get("ctypes.util") is stand_in:
            del sys.modules["ctypes.util"]
        real = importlib.import_module("ctypes.util")
        return real.find_library(name)

    stand_in.find_library = find_library  # type: ignore[attr-defined]
    sys.modules["ctypes.util"] = stand_in
    try:
        yield
    finally:
        if sys.modules.get("ctypes.util") is stand_in:
            del sys.modules["ctypes.util"]
