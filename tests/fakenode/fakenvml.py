"""Compile fakenvml.c into a fake libnvidia-ml.so.1 and load it into pynvml.

The library is compiled once per (source, header, compiler) content hash into a cache directory
($FAKENVML_CACHE_DIR, default <tmp>/fakenvml-<uid>) and copied into each node's lib dir, where it finds its
state file ('fakenvml.state' next to the .so) unless $FAKE_NVML_STATE says otherwise.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, List, Optional, Union

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "fakenvml.c"
SONAME = "libnvidia-ml.so.1"
STATE_NAME = "fakenvml.state"
CFLAGS = [
    "-std=gnu11",
    "-O0",
    "-fPIC",
    "-shared",
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-Wno-deprecated-declarations",
    "-Werror=missing-prototypes",
    "-Werror=implicit-function-declaration",
    "-Werror=incompatible-pointer-types",
    "-Werror=int-conversion",
    "-Wl,-soname," + SONAME,
]


class FakeNvmlBuildError(RuntimeError):
    """gcc or nvml.h missing, or the fake library did not compile."""


def find_nvml_header() -> Path:
    """nvml.h from the nvidia-nvml-dev wheel (found through package metadata), $FAKENVML_INCLUDE, or system."""
    env = os.environ.get("FAKENVML_INCLUDE")
    if env:
        p = Path(env) / "nvml.h"
        if p.is_file():
            return p
        raise FakeNvmlBuildError("FAKENVML_INCLUDE=%s has no nvml.h" % env)
    try:
        from importlib import metadata

        for f in metadata.files("nvidia-nvml-dev") or []:
            if f.name == "nvml.h":
                p = Path(str(f.locate())).resolve()
                if p.is_file():
                    return p
    except Exception:  # PackageNotFoundError or a broken install: fall through to system paths
        pass
    for cand in ("/usr/local/cuda/include/nvml.h", "/usr/include/nvml.h"):
        if Path(cand).is_file():
            return Path(cand)
    raise FakeNvmlBuildError(
        "nvml.h not found: install the 'nvidia-nvml-dev' wheel (pip install nvidia-nvml-dev, "
        "part of the [test] extra) or set FAKENVML_INCLUDE to a directory containing nvml.h"
    )


def _compiler() -> str:
    cc = os.environ.get("CC", "gcc")
    path = shutil.which(cc)
    if not path:
        raise FakeNvmlBuildError(
            "C compiler %r not found: install gcc (apt-get install gcc) or set CC" % cc
        )
    return path


def cache_dir() -> Path:
    env = os.environ.get("FAKENVML_CACHE_DIR")
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(env) if env else Path(tempfile.gettempdir()) / ("fakenvml-%d" % uid)


def build_library(header: Optional[Path] = None) -> Path:
    """Compile (or reuse) the fake library; returns the cached .so path."""
    header = header or find_nvml_header()
    cc = _compiler()
    try:
        ccver = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise FakeNvmlBuildError("cannot run %s: %s" % (cc, exc)) from None
    h = hashlib.sha256()
    for part in (
        SOURCE.read_bytes(),
        header.read_bytes(),
        ccver.encode(),
        " ".join(CFLAGS).encode(),
    ):
        h.update(hashlib.sha256(part).digest())
    out_dir = cache_dir() / h.hexdigest()[:16]
    lib = out_dir / SONAME
    if lib.is_file():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / (".%s.%d.tmp" % (SONAME, os.getpid()))
    cmd = (
        [cc] + CFLAGS + ["-I", str(header.parent), "-o", str(tmp), str(SOURCE), "-lpthread", "-ldl"]
    )
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise FakeNvmlBuildError(
            "compiling %s against %s failed:\n%s\n%s"
            % (SOURCE.name, header, " ".join(cmd), proc.stderr[-4000:])
        )
    os.replace(str(tmp), str(lib))  # atomic: parallel test workers may race here
    return lib


def install_library(lib_dir: Union[str, Path]) -> Path:
    """Copy the compiled library into ``lib_dir`` (a real copy: dladdr must see this path)."""
    lib_dir = Path(lib_dir)
    lib_dir.mkdir(parents=True, exist_ok=True)
    dst = lib_dir / SONAME
    shutil.copyfile(str(build_library()), str(dst))
    link = lib_dir / "libnvidia-ml.so"
    if not link.exists():
        os.symlink(SONAME, str(link))
    return dst


def exported_symbols(lib: Union[str, Path]) -> List[str]:
    """Names of the nvml* functions the library defines (via nm -D)."""
    nm = shutil.which("nm")
    if not nm:
        raise FakeNvmlBuildError("nm not found (binutils)")
    out = subprocess.run(
        [nm, "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True
    ).stdout
    return sorted(
        p[-1] for p in (line.split() for line in out.splitlines()) if p and p[-1].startswith("nvml")
    )


def load_into_pynvml(lib_path: Union[str, Path]) -> Any:
    """Make the REAL pynvml use the fake library in this process; returns the pynvml module.

    pynvml 12/13 loads ``CDLL("libnvidia-ml.so.1")`` lazily in nvmlInit() only when ``pynvml.nvmlLib`` is None,
    and caches function pointers in ``_nvmlGetFunctionPointer_cache``; so we set the former and clear the latter.
    Call before nvmlInit (or after nvmlShutdown).  The library finds its state next to itself unless
    $FAKE_NVML_STATE is set in this process.
    """
    import ctypes

    import pynvml

    lib = ctypes.CDLL(os.path.abspath(str(lib_path)))
    with pynvml.libLoadLock:
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
    return pynvml


def unload_from_pynvml() -> None:
    """Forget the library pynvml uses (the next nvmlInit loads libnvidia-ml.so.1 by soname again)."""
    import pynvml

    with pynvml.libLoadLock:
        pynvml.nvmlLib = None
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0


if __name__ == "__main__":  # pragma: no cover - manual helper
    print(build_library())
    sys.exit(0)
