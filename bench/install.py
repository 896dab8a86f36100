"""A throw-away regular (non-editable) install of this checkout, laid out the way the RPM installs it.

The development venv holds slurm-hooks as an *editable* install: a .pth path line to the checkout
(pyproject's package-dir; before it, setuptools' editable finder, ~8-13 ms of pathlib, fnmatch and
re in every interpreter start, which no node pays), and the checkout's other top-level folders on
sys.path. The latency figures are the product's claims, so they are measured on what nodes run:
the package in a site-packages directory and a console script like the one the spec writes
(`#!python -s`, import, call). Dependencies (nvidia-ml-py, ...) come from the development
venv through a plain .pth path line, which adds that directory without running its .pth files.
"""

from __future__ import annotations

import compileall
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from typing import List, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def entry_point(source: str = REPO) -> Tuple[str, str]:
    """(module, function) of the `slurm-hooks` console script in source/pyproject.toml, as the spec reads it."""
    with open(os.path.join(source, "pyproject.toml")) as handle:
        match = re.search(r'^slurm-hooks = "([\w.]+):(\w+)"$', handle.read(), re.M)
    if match is None:
        raise RuntimeError("%s/pyproject.toml declares no slurm-hooks console script" % source)
    return match.group(1), match.group(2)


def make_install(base: str, source: str = REPO) -> Tuple[str, List[str]]:
    """Create base/venv with a copy of source/slurm_hooks; returns (its python, the console script's argv)."""
    module, function = entry_point(source)
    venv = os.path.join(base, "venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
    python = os.path.join(venv, "bin", "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    shutil.copytree(
        os.path.join(source, "slurm_hooks"),
        os.path.join(site, "slurm_hooks"),
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    compileall.compile_dir(
        os.path.join(site, "slurm_hooks"), quiet=1
    )  # as the spec's %install does
    with open(os.path.join(site, "dev-venv-dependencies.pth"), "w") as handle:
        handle.write(
            sysconfig.get_path("purelib") + "\n"
        )  # this (development) interpreter's packages
    script = os.path.join(venv, "bin", "slurm-hooks")
    with open(script, "w") as handle:
        handle.write(
            "#!%s -s\nimport sys\n\nfrom %s import %s\n\nsys.exit(%s())\n"
            % (python, module, function, function)
        )
    os.chmod(script, 0o755)
    return python, [script]
