"""A throw-away regular (non-editable) install of this checkout, laid out the way the RPM installs it.

The development venv holds slurm-hooks as an *editable* install: every interpreter start there runs
setuptools' editable finder from a .pth file (~8 ms: pathlib, importlib.util, urllib), which no
node pays. The latency figures are the product's claims, so they are measured on what nodes run:
the package in a site-packages directory and a console script like the one the spec writes
(`#!python -s`, import, call). Dependencies (nvidia-ml-py, psutil, ...) come from the development
venv through a plain .pth path line, which adds that directory without running its .pth files.
"""
from __future__ import annotations

import compileall
import os
import shutil
import subprocess
import sys
import sysconfig
from typing import List, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRY_POINT = ("slurm_hooks.cli", "run")  # pyproject.toml [project.scripts] slurm-hooks


def make_install(base: str) -> Tuple[str, List[str]]:
    """Create base/venv with a copy of slurm_hooks; returns (its python, the console script's argv)."""
    venv = os.path.join(base, "venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
    python = os.path.join(venv, "bin", "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    shutil.copytree(os.path.join(REPO, "slurm_hooks"), os.path.join(site, "slurm_hooks"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    compileall.compile_dir(os.path.join(site, "slurm_hooks"), quiet=1)  # as the spec's %install does
    with open(os.path.join(site, "dev-venv-dependencies.pth"), "w") as handle:
        handle.write(sysconfig.get_path("purelib") + "\n")  # this (development) interpreter's packages
    script = os.path.join(venv, "bin", "slurm-hooks")
    with open(script, "w") as handle:
        handle.write("#!%s -s\nimport sys\n\nfrom %s import %s\n\nsys.exit(%s())\n"
                     % (python, ENTRY_POINT[0], ENTRY_POINT[1], ENTRY_POINT[1]))
    os.chmod(script, 0o755)
    return python, [script]


def check_entry_point() -> None:
    """ENTRY_POINT must be what pyproject.toml declares (the spec reads it from there too)."""
    with open(os.path.join(REPO, "pyproject.toml")) as handle:
        text = handle.read()
    declared = 'slurm-hooks = "%s:%s"' % ENTRY_POINT
    if declared not in text:
        raise RuntimeError("bench/install.py: pyproject.toml no longer declares %s" % declared)
