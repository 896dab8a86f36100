"""Rebuild tests/captures/<name>.tar.xz from the public sources named in manifest.toml.

    python -m tests.captures.build REPO=GIT_DIR ... [NAME ...]
    e.g. python -m tests.captures.build open-mpi/hwloc=/src/hwloc util-linux/util-linux=/src/util-linux \
             jaypipes/ghw=/src/ghw
    python -m tests.captures.build --live h200-vm OUT.tar.xz   # on a machine a session was lent

Each source archive is taken at the manifest's commit (`git show COMMIT:PATH`), unpacked, and
every check plus the corpus fact readers run on it with a recording Host: the capture keeps
exactly what they read (slurm_hooks.capture, as `slurm-hooks capture` does), so what the checks
never read is stripped. The build then checks its own work: the verdicts on the stripped tree
equal those on the full source tree, and every file the manifest says a check lacks is absent
from the source too (the capture truly lacks it; we did not strip it).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import tempfile
from typing import Dict, List, Tuple

from slurm_hooks.core.config import validate
from slurm_hooks.core.runner import run_checks
from slurm_hooks.hw import capture
from slurm_hooks.hw.host import Host, ReadLog
from slurm_hooks.registry import load_builtin_checks

from . import ABSENT, archive, corpus_config, extract, facts, manifest, unpack

MTIME = 1767225600  # 2026-01-01: archives are reproducible byte for byte


def source_tree(entry: Dict, repos: Dict[str, str], workdir: str) -> str:
    source = entry["source"]
    git_dir = repos[source["repository"]]
    data = subprocess.run(
        ["git", "-C", git_dir, "show", "%s:%s" % (source["commit"], source["path"])],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        extract(tar, workdir, [m for m in tar.getmembers() if not m.isdev()])
    return os.path.join(workdir, source["root"]) if source.get("root") else workdir


def verdicts(root: str, config, log=None) -> List[Tuple[str, str, str]]:
    registry = load_builtin_checks()
    host = Host(root, log=log)
    report = run_checks(registry, config, host, "manual", registry.sorted_checks(), deadline=60.0)
    if log is not None:
        facts(host)  # the corpus test reads these too: keep them
    return [(r.check, r.status.value, r.summary) for r in report.results()]


def build(name: str, entry: Dict, repos: Dict[str, str]) -> str:
    config = validate(load_builtin_checks(), corpus_config(entry))
    with tempfile.TemporaryDirectory() as work:
        full = source_tree(entry, repos, os.path.join(work, "full"))
        log = ReadLog()
        before = verdicts(full, config, log)
        entries, _redactions = capture.plan(full, log)
        absent = "".join(path + "\n" for path in sorted(log.missing)).encode()
        capture.write_archive(archive(name), name, entries, {ABSENT: absent}, mtime=MTIME)
        for check, path in entry.get("unknown", {}).items():
            if os.path.lexists(os.path.join(full, path.lstrip("/"))):
                raise SystemExit(
                    "%s: manifest says %s lacks %s, but the source has it" % (name, check, path)
                )
        after = verdicts(unpack(name, os.path.join(work, "stripped")), config)
    if before != after:
        changed = [(a, b) for a, b in zip(before, after) if a != b]
        raise SystemExit("%s: stripping changed verdicts: %s" % (name, changed[:5]))
    return "%s: %d entries, %d bytes" % (name, len(entries), os.path.getsize(archive(name)))


def build_live(name: str, out: str, root: str = "/") -> str:
    """On the machine itself (a device run, tools/device_smoke.py's neighbour): what every check
    and facts() read under the corpus configuration of manifest entry `name`, archived as the
    other <name>.tar.xz are. Its absent list is what this machine really lacks, which a
    `slurm-hooks capture` (default configuration, no fact readers) cannot say. The stripping check
    of build() has nothing to compare with here: the machine is the full tree."""
    config = validate(load_builtin_checks(), corpus_config(manifest()[name]))
    log = ReadLog()
    found = verdicts(root, config, log)
    entries, redactions = capture.plan(root, log)
    absent = "".join(path + "\n" for path in sorted(log.missing)).encode()
    capture.write_archive(out, name, entries, {ABSENT: absent}, mtime=MTIME)
    not_ok = [v for v in found if v[1] not in ("OK", "SKIP")]
    return "%s: %d entries, %d absent, redactions %s, not OK/SKIP: %s" % (
        out,
        len(entries),
        len(log.missing),
        redactions,
        not_ok,
    )


def main(argv: List[str]) -> int:
    if argv[:1] == ["--live"]:  # python -m tests.captures.build --live NAME OUT.tar.xz
        print(build_live(argv[1], argv[2]))
        return 0
    repos = dict(arg.split("=", 1) for arg in argv if "=" in arg)
    names = [arg for arg in argv if "=" not in arg]
    corpus = manifest()
    for name in names or sorted(corpus):
        source = corpus[name]["source"]
        if "device" in source:  # its source was the machine: only --live on it rebuilds it
            print("%s: skipped (built on the machine itself with --live)" % name)
            continue
        if source["repository"] not in repos:
            print("%s: skipped (no git dir for %s)" % (name, source["repository"]))
            continue
        print(build(name, corpus[name], repos))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
