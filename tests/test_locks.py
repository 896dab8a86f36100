"""core/locks.py: the one flock helper (metrics state, dcgm mapping, the per-node drain lock, xid ack)."""

from __future__ import annotations

import fcntl
import os
import time

import pytest

from slurm_hooks.core.locks import LockTimeout, flock_within, locked

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_held_lock_times_out_naming_the_path(tmp_path):
    path = str(tmp_path / "state.lock")
    holder = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another open file description: flock excludes it
    try:
        start = time.monotonic()
        with pytest.raises(LockTimeout) as caught:
            with locked(path, 0.2):
                pass
        assert time.monotonic() - start >= 0.2
        assert caught.value.filename == path
    finally:
        os.close(holder)
    with locked(path, 0.2) as lock:  # released: taken at once
        assert lock.fd >= 0
    assert lock.fd == -1


def test_a_directory_lock_without_limit_waits_for_a_free_lock(tmp_path):
    with locked(str(tmp_path / "acks"), None, create_dir_mode=0o755, directory=True) as lock:
        assert os.path.isdir(str(tmp_path / "acks"))
        other = os.open(str(tmp_path / "acks"), os.O_RDONLY)
        try:
            assert flock_within(other, 0.05) is False  # held by `lock`
        finally:
            os.close(other)
    assert lock.fd == -1


def test_flock_lives_in_one_module():
    """No module of the package calls flock itself: three copies of the wait loop were one too many."""
    found = []
    for directory, subdirs, files in os.walk(os.path.join(REPO, "slurm_hooks")):
        subdirs[:] = [d for d in subdirs if d != "__pycache__"]
        for name in files:
            path = os.path.join(directory, name)
            if name.endswith(".py") and not path.endswith(os.path.join("core", "locks.py")):
                with open(path, encoding="utf-8") as handle:
                    if "flock(" in handle.read().replace("flock(2)", ""):
                        found.append(os.path.relpath(path, REPO))
    assert not found
