"""Crafted captures (issue 24): an archive anyone can make must never choose code, open a device
node or crash a check. Each archive here is made with tarfile and unpacked with tar(1), as an admin
replaying a ticket's capture does (docs/admin.md "Captures")."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile

import pytest

from tests.helpers import cli_with_default_config as cli
from tests.helpers import runs_by_name as by_check

REAL = "128arm-2pa2n8cluster4co"  # a real machine's capture (tests/captures/manifest.toml: hwloc)


@pytest.fixture
def crafted(tmp_path, unpacked_captures):
    """crafted(members): a real capture, copied from the one unpacked for the session (a copy costs
    a quarter of unpacking the archive again), then a crafted archive of `members` unpacked over
    it with tar(1), as an admin unpacks a capture. members: (name, kind, payload): kind 'file'
    (bytes), 'link' (target), 'fifo', 'chr' ((major, minor): needs root to create)."""
    import shutil

    def make(members):
        root = str(tmp_path / "n" / REAL)
        shutil.copytree(unpacked_captures[REAL], root, symlinks=True)
        return _craft_over(tmp_path, root, members)

    return make


def _craft_over(tmp_path, root, members):
    archive = str(tmp_path / "crafted.tar")
    with tarfile.open(archive, "w") as tar:
        for name, kind, payload in members:
            info = tarfile.TarInfo(os.path.basename(root) + "/" + name)
            if kind == "file":
                info.size = len(payload)
                tar.addfile(info, __import__("io").BytesIO(payload))
                continue
            if kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, payload
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            else:
                info.type, (info.devmajor, info.devminor) = tarfile.CHRTYPE, payload
            tar.addfile(info)
    subprocess.run(["tar", "xf", archive, "-C", os.path.dirname(root)], check=True, timeout=60)
    return root


def replay(root, *names, child=False):
    proc = cli(["check", "--json", "--all-contexts", "--root", root] + list(names), child=child)
    assert proc.returncode in (0, 1, 2, 3), proc.stderr
    return by_check(json.loads(proc.stdout))


# -- a crafted capture chooses no code (issue 24, "a capture can run code as root") -----------

EVIL_C = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void planted(void) {
    int fd = open(MARKER, O_WRONLY | O_CREAT, 0644);
    if (fd >= 0) { write(fd, "ran\n", 4); close(fd); }
}
"""


def _crafted_capture(tmp_path):
    """A tree whose .slurm-hooks/config.toml asks for NVML read live from a library it ships, and
    whose etc/slurm-hooks/checks.d holds a site check: both write `marker` if they ever run."""
    import shutil

    if not shutil.which("gcc"):
        pytest.skip("gcc is needed to build the planted library")
    tree = tmp_path / "node"
    (tree / ".slurm-hooks").mkdir(parents=True)
    (tree / "proc").mkdir()
    (tree / "proc/loadavg").write_text("0.00 0.00 0.00 1/100 42\n")
    marker = tmp_path / "marker"
    source = tmp_path / "evil.c"
    source.write_text(EVIL_C)
    library = tree / "lib" / "libnvidia-ml.so.1"
    library.parent.mkdir()
    subprocess.run(
        ["gcc", "-shared", "-fPIC", '-DMARKER="%s"' % marker, "-o", str(library), str(source)],
        check=True,
        timeout=120,
    )
    (tree / ".slurm-hooks/config.toml").write_text(
        '[general]\nroot_live_sources = ["nvml", "statvfs"]\nmode = "enforce"\n'
        '[nvml]\nlibrary = "%s"\n[checks."system.load"]\nmax_load_per_cpu = 99.0\n' % library
    )
    plugin_dir = tree / "etc/slurm-hooks/checks.d"
    plugin_dir.mkdir(parents=True)
    (plugin_dir / "planted.py").write_text("open(%r, 'w').write('ran')\n" % str(marker))
    return str(tree), marker


def test_the_old_replay_command_is_refused_and_runs_nothing(tmp_path):
    """The docs said `--config DIR/.slurm-hooks/config.toml check --root DIR`: with a crafted config that
    dlopen'ed a library shipped in the archive (as root, for an admin replaying a ticket). A
    configuration file inside the tree is now refused, and nothing from the tree runs."""
    tree, marker = _crafted_capture(tmp_path)
    proc = cli(
        [
            "--config",
            os.path.join(tree, ".slurm-hooks", "config.toml"),
            "check",
            "gpu",
            "--root",
            tree,
        ]
    )
    assert not marker.exists(), "the capture's library ran"
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "lies inside the --root tree" in proc.stderr and "never applied" in proc.stderr


def test_a_captured_config_is_shown_and_never_applied(tmp_path):
    tree, marker = _crafted_capture(tmp_path)
    with open(os.path.join(tree, ".slurm-hooks/config.toml"), "a") as config:
        config.write('[checks."x\\u001b[2J"]\nenabled = true\n')  # a terminal escape in a key
    proc = cli(["check", "--all-contexts", "--json", "--root", tree])
    assert not marker.exists(), "the capture's library or site check ran"
    assert proc.returncode in (0, 1, 2, 3), proc.stderr
    report = by_check(json.loads(proc.stdout))
    assert {r["status"] for r in report["gpu.count"]["results"]} == {"SKIP"}  # NVML not read live
    assert "live-only" in report["gpu.count"]["results"][0]["summary"]
    assert "differs from this machine's configuration (shown, never applied" in proc.stderr
    assert "nvml.library: captured '%s', here ''" % os.path.join(tree, "lib/libnvidia-ml.so.1") in (
        proc.stderr
    )
    assert "general.root_live_sources: captured ['nvml', 'statvfs'], here []" in proc.stderr
    assert 'checks."system.load".max_load_per_cpu: captured 99.0' in proc.stderr
    assert "\x1b" not in proc.stderr  # the crafted key's escape sequence is shown escaped
    assert "'checks.\"x\\x1b[2J\".enabled': captured True, here (no such key)" in proc.stderr


def test_site_checks_and_config_drop_ins_inside_the_tree_are_refused(tmp_path):
    tree, marker = _crafted_capture(tmp_path)
    env = dict(os.environ, SLURM_HOOKS_CHECKS_DIR=os.path.join(tree, "etc/slurm-hooks/checks.d"))
    proc = cli(["check", "--root", tree], env=env)
    assert not marker.exists(), "a site check was loaded from the capture"
    assert proc.returncode == 3 and "code is never loaded from a captured tree" in proc.stderr
    # a link from outside into the tree is inside too
    os.symlink(os.path.join(tree, ".slurm-hooks"), str(tmp_path / "outside"))
    proc = cli(["--config", str(tmp_path / "outside/config.toml"), "check", "--root", tree])
    assert proc.returncode == 3 and "lies inside the --root tree" in proc.stderr
    assert not marker.exists()


# -- device nodes and FIFOs in a crafted capture are never read --------------------------------


def test_a_fifo_in_a_capture_is_a_bounded_wait(crafted):
    """The one non-regular file read under a root: a FIFO, which is how the fake node stands for a
    sysfs read that hangs in a driver (tests/prolog_rig.py make_fifo). It carries nothing from the
    analysing machine, and the check that waits on it is cut at its timeout, UNKNOWN."""
    root = crafted([("proc/loadavg", "fifo", None)])
    # a child: the check thread stays stuck on the FIFO, as it would in a test process
    (result,) = replay(root, "system.load", child=True)["system.load"]["results"]
    assert result["status"] == "UNKNOWN", result
    assert "did not finish within its" in result["summary"]


@pytest.mark.skipif(os.geteuid() != 0, reason="tar creates device nodes only as root")
def test_a_device_node_in_a_capture_is_never_opened_for_data(crafted):
    """As root, tar makes /dev/kmsg of a crafted capture a real character device: (1, 11) read the
    analysing machine's own kernel log as the node's, (1, 5) /dev/zero filled memory. Here
    (1, 3), /dev/null: before, an empty log said 'no Xid'; a device is not the captured log."""
    root = crafted(
        [("dev/kmsg", "chr", (1, 3)), ("sys/devices/system/cpu/online", "chr", (1, 5))],
    )
    report = replay(root, "xid.events", "system.cpu")
    (xid,) = report["xid.events"]["results"]
    assert xid["status"] == "UNKNOWN" and "/dev/kmsg" in xid["summary"], xid
    assert "not a regular file (a character device)" in xid["summary"]
    cpu = report["system.cpu"]["results"]
    assert {r["status"] for r in cpu} == {"UNKNOWN"}, cpu
    assert "/sys/devices/system/cpu/online" in cpu[0]["summary"]
    assert "a character device" in cpu[0]["summary"]


# -- a malformed capture is UNKNOWN naming the file, never an internal error or a wrong verdict --

MOUNTS_KEY = ".slurm-hooks/statvfs.json"


@pytest.mark.parametrize(
    "statvfs, expected",
    [
        ("[" * 100000 + "]" * 100000, "a JSON object"),  # RecursionError in json
        ('{"/": {"f_blocks": 1e400, "f_bavail": 1, "f_files": 1, "f_favail": 1}}', "f_blocks"),
        (
            '{"/": {"f_blocks": 1000, "f_bavail": -2000, "f_files": 10, "f_favail": 5}}',
            "f_bavail as a whole number >= 0",  # was believed: "-200.0% free space"
        ),
        (
            '{"/": {"f_blocks": 1000, "f_bavail": 5000, "f_files": 10, "f_favail": 5}}',
            "f_bavail <= f_blocks",
        ),
        ('{"/": {"f_blocks": {"a": [1]}, "f_bavail": 1, "f_files": 1, "f_favail": 1}}', "f_blocks"),
        ('{"/": [1, 2, 3, 4]}', "an object"),
    ],
)
def test_a_malformed_statvfs_json_is_unknown_naming_the_file(crafted, statvfs, expected):
    root = crafted([(MOUNTS_KEY, "file", statvfs.encode())])
    results = replay(root, "system.filesystems")["system.filesystems"]["results"]
    slash = next(r for r in results if r["component"] == "fs:/")
    assert slash["status"] == "UNKNOWN", slash
    assert MOUNTS_KEY in slash["summary"] and expected in slash["summary"], slash["summary"]
    assert "internal error" not in slash["summary"]


def test_a_link_with_thousands_of_components_is_followed_not_a_crash(crafted):
    """A symlink target may be 4095 bytes: './' * 2000 made the resolver recurse 2000 deep
    (RecursionError: 'internal error' in every check reading through it)."""
    root = crafted(
        [
            ("sys/bus/cpu", "link", "./" * 2000 + "../devices/system/cpu"),
            ("proc/loop", "link", "loop"),
            # the format of proc(5)'s example: "0.20 0.18 0.12 1/80 11206"
            ("proc/loadavg.real", "file", b"0.20 0.18 0.12 1/80 11206\n"),
            ("proc/loadavg", "link", "./" * 1500 + "loadavg.real"),
        ],
    )
    from slurm_hooks.hw.host import Host, HostError

    host = Host(root)
    assert host.read_text("/sys/bus/cpu/online") == host.read_text("/sys/devices/system/cpu/online")
    with pytest.raises(HostError, match="/proc/loop/x: too many levels of symbolic links"):
        host.read_text("/proc/loop/x")
    report = replay(root)
    (load,) = report["system.load"]["results"]
    assert load["status"] == "OK" and "0.20" in load["summary"], load
    crashed = [
        (name, r["summary"])
        for name, run in report.items()
        for r in run["results"]
        if "internal error" in r["summary"]
    ]
    assert not crashed
