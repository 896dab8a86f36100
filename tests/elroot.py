"""A scratch root laid out like an EL8/EL9 node's, for running an installed RPM with nothing else.

EL9's /usr/bin/python3 and EL8's python39 (/usr/bin/python3.9) are both CPython 3.9 with the
standard library in /usr/lib/python3.9 and packages in /usr/lib/python3.9/site-packages. This
builds that layout from a CPython 3.9 of this machine (pyenv's, or python3.9 on PATH): the
interpreter and its shared libraries at the paths the dynamic loader looks for them, the standard
library under /usr/lib/python3.9 (CPython finds its prefix from the executable's location, so it
runs as /usr/bin/python3.9 in the chroot), /bin/sh, and an empty site-packages. The test then adds
only the package's declared Python dependencies (pip --target into that site-packages) and the
RPM itself (rpm --root), and runs the installed hooks inside it with chroot(2) in a private mount
namespace that sees the host's /proc, /sys and /dev (unshare -m: nothing leaks to the host).

Where the 3.9 comes from: $SLURM_HOOKS_PYTHON39, else python3.9 on PATH, else pyenv's newest 3.9.
Machines of this project's kind carry pyenv's 3.9 (see .ci/rpm.sh).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List, Optional, Sequence

TARGET_VERSION = "3.9"  # EL9's system python3 and EL8's python39 module
SHELL = "/bin/dash" if os.path.exists("/bin/dash") else "/bin/sh"

# Python requirement of the spec (package name or pythonX.Ydist()) -> the PyPI name pip installs.
PYTHON_PACKAGES = {"toml": "toml", "prometheus_client": "prometheus_client"}


def find_python39() -> Optional[str]:
    """A CPython 3.9 of this machine, or None."""
    candidates = [os.environ.get("SLURM_HOOKS_PYTHON39", ""), shutil.which("python3.9") or ""]
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates += sorted(
        glob.glob(os.path.join(pyenv, "versions", "3.9.*", "bin", "python3.9")), reverse=True
    )
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            done = subprocess.run(
                [candidate, "-Ic", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
            )
            if done.stdout.strip() == TARGET_VERSION:
                return candidate
    return None


def python_requirements(requires: Sequence[str]) -> List[str]:
    """PyPI names for the Python packages among an RPM's Requires; every other name must be known.

    Raises ValueError for a requirement this scratch root cannot provide, so a new dependency in the
    spec shows up here instead of being silently left out of the test.
    """
    wanted = []
    for requirement in requires:
        name = requirement.split()[0]
        if name.startswith(("rpmlib(", "config(", "python(abi)")) or name in (
            "/bin/sh",
            "/usr/bin/python3",
            "/usr/bin/python3.9",
            "python3",
            "python39",
            "logrotate",
        ):
            continue
        match = re.fullmatch(r"python3(?:9|\.9)?dist\((.+)\)|python3(?:9)?-(.+)", name)
        module = match and (match.group(1) or match.group(2)).replace("-", "_")
        if not module or module not in PYTHON_PACKAGES:
            raise ValueError("the scratch root does not know how to provide %r" % requirement)
        wanted.append(PYTHON_PACKAGES[module])
    return wanted


def _shared_libraries(binaries: Sequence[str]) -> List[str]:
    """The absolute paths of the shared libraries (and loader) that `ldd` resolves for BINARIES."""
    found = set()
    for binary in binaries:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
        found.update(re.findall(r"(/\S+) \(0x", out))
    return sorted(found)


def _copy(source: str, destination: Path) -> None:
    destination.parent.mkdir(parents=True, exist_ok=True)
    if not destination.exists():
        shutil.copy2(os.path.realpath(source), str(destination))


def build(root: Path, python39: str, python_packages: Sequence[str], python3_link: bool) -> None:
    """Lay out ROOT as described above; python3_link adds /usr/bin/python3 -> python3.9 (EL9)."""
    prefix = subprocess.run(
        [python39, "-Ic", "import sys; print(sys.base_prefix)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    stdlib = os.path.join(prefix, "lib", "python3.9")
    usr_lib = root / "usr/lib/python3.9"
    # Hard links where possible: the standard library is ~180 MB and read-only here.
    shutil.copytree(
        stdlib,
        str(usr_lib),
        symlinks=True,
        copy_function=_link_or_copy,
        ignore=shutil.ignore_patterns(
            "site-packages",
            "test",
            "tests",
            "idlelib",
            "tkinter",
            "turtledemo",
            "ensurepip",
            "config-3.9-*",
        ),
    )
    (usr_lib / "site-packages").mkdir()
    _copy(python39, root / "usr/bin/python3.9")
    if python3_link:
        os.symlink("python3.9", str(root / "usr/bin/python3"))
    _copy(SHELL, root / "bin/sh")
    extensions = glob.glob(os.path.join(stdlib, "lib-dynload", "*.so"))
    for library in _shared_libraries([python39, SHELL] + extensions):
        _copy(library, root / library.lstrip("/"))
    for directory in ("proc", "sys", "dev", "tmp", "run"):
        (root / directory).mkdir(exist_ok=True)
    if python_packages:
        done = subprocess.run(
            [
                python39,
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "--no-compile",
                "--target",
                str(usr_lib / "site-packages"),
            ]
            + list(python_packages),
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            raise RuntimeError(
                "pip could not install %s for Python 3.9: %s"
                % (" ".join(python_packages), done.stderr)
            )


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


def run_chrooted(
    root: Path, argv: Sequence[str], env: Dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess:
    """Run ARGV inside ROOT (chroot) with the host's /proc, /sys and /dev bound in a private mount
    namespace, with exactly ENV (slurmd gives its hooks no PATH either)."""
    binds = " && ".join(
        "mount --rbind /%s %s/%s" % (d, _quote(str(root)), d) for d in ("proc", "sys", "dev")
    )
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    unset = "" if "PATH" in env else "unset PATH && "
    script = '%s && %sexec %s %s "$@"' % (binds, unset, chroot, _quote(str(root)))
    unshare = shutil.which("unshare") or "/usr/bin/unshare"
    outer_env = dict(env)
    outer_env.setdefault(
        "PATH", "/usr/sbin:/usr/bin:/sbin:/bin"
    )  # for mount; unset again before chroot
    return subprocess.run(
        [unshare, "--mount", "--propagation", "private", "/bin/sh", "-c", script, "sh"]
        + list(argv),
        env=outer_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
