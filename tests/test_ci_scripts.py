"""The CI scripts that run the Slurm tests on other Slurm versions (.ci/slurm-versions.sh, .ci/slurm-root.sh):
what can be checked without building a root -- they parse, and the Slurm 25.11 source is found beside the
checkout (never in it), checked against its SHA256SUMS, or refused with a message that says where it looked."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = (".ci/run", ".ci/slurm-versions.sh", ".ci/slurm-root.sh")
TARBALL = "slurm-25.11.7.tar.bz2"


@pytest.mark.parametrize("script", SCRIPTS)
def test_ci_scripts_parse_and_are_executable(script):
    done = subprocess.run(
        ["bash", "-n", os.path.join(REPO, script)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert os.access(os.path.join(REPO, script), os.X_OK), "%s is not executable" % script


def test_ci_runs_the_slurm_versions_stage_after_the_readme_test_command():
    with open(os.path.join(REPO, ".ci", "run")) as fh:
        ci = fh.read()
    assert ci.index("test-command") < ci.index("bash .ci/slurm-versions.sh")


def lone_checkout(tmp_path):
    """A git checkout holding only the script, with no shared/ anywhere near it and no origin."""
    repo = tmp_path / "checkout"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy2(os.path.join(REPO, ".ci", "slurm-root.sh"), repo / ".ci" / "slurm-root.sh")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    return repo


def run_source(repo, **env):
    full = {k: v for k, v in os.environ.items() if k != "SLURM_HOOKS_SHARED"}
    full.update(env)
    return subprocess.run(
        ["bash", str(repo / ".ci" / "slurm-root.sh"), "source", "slurm25"],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )


def fake_shared(path, content=b"not really slurm", listed=None):
    (path / "vendor").mkdir(parents=True)
    (path / "vendor" / TARBALL).write_bytes(content)
    digest = listed or hashlib.sha256(content).hexdigest()
    (path / "vendor" / "SHA256SUMS").write_text("%s  %s\n" % (digest, TARBALL))
    return path


def test_slurm_source_missing_is_a_clear_error(tmp_path):
    done = run_source(lone_checkout(tmp_path))
    assert done.returncode == 2 and done.stdout == ""
    assert "%s) is not in any shared/vendor/" % TARBALL in done.stderr, done.stderr
    assert (
        str(tmp_path / "checkout") + "/../shared" in done.stderr
        and "SLURM_HOOKS_SHARED" in done.stderr
    )


def test_slurm_source_beside_the_checkout_or_its_origin(tmp_path):
    repo = lone_checkout(tmp_path)
    beside = fake_shared(tmp_path / "shared")
    done = run_source(repo)
    assert (done.returncode, done.stdout.strip()) == (0, str(beside / "vendor" / TARBALL)), (
        done.stderr
    )
    # a CI clone somewhere else finds it through the repository it was cloned from
    clone = tmp_path / "elsewhere" / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True, capture_output=True)
    (clone / ".ci").mkdir(exist_ok=True)
    shutil.copy2(repo / ".ci" / "slurm-root.sh", clone / ".ci" / "slurm-root.sh")
    done = run_source(clone)
    assert (done.returncode, done.stdout.strip()) == (0, str(beside / "vendor" / TARBALL)), (
        done.stderr
    )


def test_slurm_source_from_a_clone_of_a_worktree(tmp_path):
    """main checkout and shared/ side by side, a helper's worktree elsewhere, CI's clone of that worktree."""
    main = lone_checkout(tmp_path)
    shared = fake_shared(tmp_path / "shared")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["-C", str(main), "add", "-A"], check=True)
    subprocess.run(git + ["-C", str(main), "commit", "-q", "-m", "x"], check=True)
    worktree = tmp_path / "wt" / "helper"
    subprocess.run(
        git + ["-C", str(main), "worktree", "add", "-q", str(worktree)],
        check=True,
        capture_output=True,
    )
    clone = tmp_path / "ci" / "clone"
    subprocess.run(
        ["git", "clone", "-q", str(worktree), str(clone)], check=True, capture_output=True
    )
    for checkout in (worktree, clone):
        done = run_source(checkout)
        assert (done.returncode, done.stdout.strip()) == (0, str(shared / "vendor" / TARBALL)), (
            done.stderr
        )


def test_slurm_source_with_a_wrong_checksum_is_refused(tmp_path):
    shared = fake_shared(tmp_path / "mine", listed="0" * 64)
    done = run_source(lone_checkout(tmp_path), SLURM_HOOKS_SHARED=str(shared))
    assert done.returncode == 2 and "does not match its SHA256SUMS entry" in done.stderr, (
        done.stderr
    )


def test_the_real_slurm_source_is_not_in_the_repository():
    tracked = subprocess.run(
        ["git", "-C", REPO, "ls-files"], capture_output=True, text=True
    ).stdout.split()
    assert not [f for f in tracked if f.endswith((".tar.bz2", ".tar.gz", ".whl"))]
