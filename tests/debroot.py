"""A Debian root of its own for installing the .deb: an overlay of this machine's / with its writes on a
tmpfs, so apt-get, dpkg and maintainer scripts change nothing of the host (tests/test_deb.py).

    layers/            tmpfs: upper/ (every file the root writes) and work/ (overlayfs' own)
    root/              overlay: lowerdir=/ (read-only view of the host), upperdir=layers/upper
      proc sys         fresh proc and sysfs instances (not binds of the host's)
      dev              a tmpfs with the few device nodes a package install and the hooks use
      run tmp          tmpfs: nothing of the host's run time state, no host temp files written

Only the host's root file system is the lower layer: other mounts of the host (its /proc, a /tmp
of its own) do not show through, which is why the mounts above are made fresh. The mounts sit
under the test's temp directory in the host's mount namespace (slurmd, a host process, runs the
installed hooks through `chroot ROOT`), and close() undoes them; deleting through a leftover
mount would only write whiteouts to the tmpfs, never touch the host.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List, Optional, Sequence

PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
CHROOT = shutil.which("chroot", path=PATH) or "/usr/sbin/chroot"  # found here: ENV may have no PATH
DEVICES = (  # name, major, minor: what dpkg, apt, python and the hooks open
    ("null", 1, 3),
    ("zero", 1, 5),
    ("full", 1, 7),
    ("random", 1, 8),
    ("urandom", 1, 9),
    ("kmsg", 1, 11),
    ("tty", 5, 0),
)


class RootError(RuntimeError):
    """The root could not be set up (no overlayfs, not root): the caller skips or fails."""


def _mount(argv: Sequence[str]) -> None:
    done = subprocess.run(["mount"] + list(argv), capture_output=True, text=True)
    if done.returncode != 0:
        raise RootError("mount %s: %s" % (" ".join(argv), done.stderr.strip()))


class DebRoot:
    def __init__(self, base: Path) -> None:
        self.base = Path(base)
        self.layers = self.base / "layers"
        self.path = self.base / "root"
        self.mounted: List[Path] = []

    def open(self) -> "DebRoot":
        if os.geteuid() != 0:
            raise RootError("mounting an overlay root needs root")
        with open("/proc/filesystems") as handle:
            if "overlay" not in handle.read().split():
                raise RootError("no overlayfs in this kernel (modprobe overlay)")
        self.layers.mkdir(parents=True)
        self.path.mkdir()
        try:
            self._mount_here(["-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(self.layers)])
            (self.layers / "upper").mkdir()
            (self.layers / "work").mkdir()
            self._mount_here(
                [
                    "-t",
                    "overlay",
                    "overlay",
                    "-o",
                    "lowerdir=/,upperdir=%s,workdir=%s"
                    % (self.layers / "upper", self.layers / "work"),
                    str(self.path),
                ]
            )
            self._mount_here(["-t", "proc", "proc", str(self.path / "proc")])
            self._mount_here(["-t", "sysfs", "sysfs", str(self.path / "sys")])
            dev = self.path / "dev"
            self._mount_here(["-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(dev)])
            for name, major, minor in DEVICES:
                os.mknod(str(dev / name), 0o666 | 0o020000, os.makedev(major, minor))
                os.chmod(str(dev / name), 0o666)
            os.symlink("/proc/self/fd", str(dev / "fd"))
            for name in ("run", "tmp"):
                mode = "1777" if name == "tmp" else "0755"
                self._mount_here(
                    ["-t", "tmpfs", "-o", "mode=" + mode, "tmpfs", str(self.path / name)]
                )
            (self.path / "run" / "lock").mkdir()
        except BaseException:
            self.close()
            raise
        return self

    def _mount_here(self, argv: List[str]) -> None:
        _mount(argv)
        self.mounted.append(Path(argv[-1]))

    def mount(self, argv: List[str]) -> Path:
        """Another mount inside the root (a records file system), undone by close() with the rest."""
        self._mount_here(argv)
        return Path(argv[-1])

    def close(self) -> None:
        """Undo every mount, innermost first; a busy one is detached lazily (it goes once unused)."""
        for target in reversed(self.mounted):
            done = subprocess.run(["umount", str(target)], capture_output=True)
            if done.returncode != 0:
                subprocess.run(["umount", "-l", str(target)], capture_output=True)
        self.mounted = []

    def __truediv__(self, inside: str) -> Path:
        """The host-side path of a path inside the root: root / "/etc/slurm-hooks"."""
        return self.path / inside.lstrip("/")

    def run(
        self,
        argv: Sequence[str],
        env: Optional[Dict[str, str]] = None,
        timeout: float = 600,
    ) -> subprocess.CompletedProcess:
        """ARGV inside the root (chroot), with ENV (default: PATH and a non-interactive debconf)."""
        environment = {"PATH": PATH, "DEBIAN_FRONTEND": "noninteractive", "LANG": "C.UTF-8"}
        if env is not None:
            environment = dict(env)
        return subprocess.run(
            [CHROOT, str(self.path)] + list(argv),
            env=environment,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def wrapper(self, script: str, where: Path) -> Path:
        """A host-side script that runs SCRIPT (a path inside the root) there, with the caller's
        environment (how slurmd, a host process, runs the installed prolog/epilog)."""
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_text("#!/bin/sh\nexec %s '%s' '%s' \"$@\"\n" % (CHROOT, self.path, script))
        where.chmod(0o755)
        return where


def host_packages() -> str:
    """This host's package list (name, version, status), as `dpkg -l` shows it."""
    done = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package} ${Version} ${Status}\\n"],
        capture_output=True,
        text=True,
    )
    return done.stdout
