"""Host.read_bytes under a root (a fake node or a captured tree): a plain file is opened without a
last-component lstat (hw/host.py _read_in_tree), and links, absolute or climbing, still resolve
inside the root, never on the machine running the tests."""

from __future__ import annotations

import os

import pytest

from slurm_hooks.hw import host as hostmod
from slurm_hooks.hw.host import Host, HostError


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text)


@pytest.fixture
def tree(tmp_path):
    root = str(tmp_path / "root")
    _write(root + "/sys/devices/pci0000:00/0000:00:01.0/vendor", "0x10de\n")
    _write(root + "/sys/devices/pci0000:00/0000:00:01.0/device", "0x2330\n")
    _write(root + "/etc/hostname", "inside-the-root\n")
    os.makedirs(root + "/sys/bus/pci/devices")
    os.symlink(
        "../../../devices/pci0000:00/0000:00:01.0", root + "/sys/bus/pci/devices/0000:00:01.0"
    )
    os.symlink("/etc/hostname", root + "/sys/absolute")  # absolute: the root's /etc, not ours
    os.symlink("../../../../../../../../../etc/hostname", root + "/sys/climbing")
    os.symlink("loop-b", root + "/sys/loop-a")
    os.symlink("loop-a", root + "/sys/loop-b")
    return root


def test_a_plain_file_costs_no_lstat_once_its_directory_is_known(tree, monkeypatch):
    host = Host(tree)
    assert host.read_text("/sys/bus/pci/devices/0000:00:01.0/vendor") == "0x10de"
    looked = []
    real_islink = os.path.islink
    monkeypatch.setattr(hostmod.os.path, "islink", lambda p: looked.append(p) or real_islink(p))
    assert host.read_text("/sys/bus/pci/devices/0000:00:01.0/device") == "0x2330"
    assert looked == []


def test_links_resolve_inside_the_root(tree):
    host = Host(tree)
    assert host.read_text("/sys/absolute") == "inside-the-root"
    assert host.read_text("/sys/climbing") == "inside-the-root"
    with pytest.raises(HostError, match="too many levels"):
        host.read_text("/sys/loop-a")
    assert host.read_text("/sys/missing", default="gone") == "gone"


def test_a_link_to_a_device_or_a_directory_is_not_read(tree):
    os.symlink("/dev/null", tree + "/sys/devnull")  # inside the root: no such file
    host = Host(tree)
    assert host.read_text("/sys/devnull", default="absent") == "absent"
    os.makedirs(tree + "/sys/adir")
    with pytest.raises(HostError, match="directory"):
        host.read_text("/sys/adir")
