"""Every check family on every real machine of tests/captures (issue #13 section 1, #18 CPU topology).

For each capture: no check may crash (no traceback), every fact its source states must match what
we read, and a check may be UNKNOWN only where the manifest says the capture truly lacks a file
(and the result names that file, and the file is absent). Check timeouts are lifted: this is
about what the checks conclude, not how fast a loaded test machine runs them (bench/ measures that).
"""

from __future__ import annotations

import os
import re

import pytest

from slurm_hooks.core.config import validate
from slurm_hooks.core.runner import run_checks
from slurm_hooks.core.structs import replace
from slurm_hooks.hw.host import Host, ReadLog, parse_cpulist
from slurm_hooks.registry import Registry, load_builtin_checks
from slurm_hooks.result import Status
from tests import captures

CORPUS = captures.manifest()
NAMES = sorted(CORPUS)


@pytest.fixture
def unpacked(unpacked_captures):
    """{name: root}, each capture unpacked once per process, when a test first needs it (xdist
    hands a module's tests to several workers, and each unpacked all 27 when the module started,
    again whenever its tests came back after another module's)."""
    return unpacked_captures


@pytest.fixture(scope="module", params=NAMES)
def name(request):
    """Each capture's tests run one after the other (a module-scoped parameter: pytest groups the
    tests by it), so xdist hands them to one worker, which unpacks and checks that capture once."""
    return request.param


@pytest.fixture(scope="session")
def untimed():
    registry = load_builtin_checks()
    return Registry(
        checks={name: replace(spec, timeout=120.0) for name, spec in registry.checks.items()},
        gatherers=dict(registry.gatherers),
    )


def run_all(registry, name, root, log=None):
    """Every check on the capture's tree. The checks that keep a history (host.ib_links, host.edac...)
    write it under the tree's state directory: what this run made there is removed again, so the
    tree, shared by every test of this worker that reads it (unpacked_captures), stays the capture
    (red team, stop 35: host-ib.json was left in it)."""
    import shutil

    config = validate(registry, captures.corpus_config(CORPUS[name]))
    state = os.path.join(root, config.settings.paths.state_dir.lstrip("/"))
    before = set(os.listdir(state)) if os.path.isdir(state) else None
    host = Host(root, log=log)
    try:
        report = run_checks(
            registry, config, host, "manual", registry.sorted_checks(), deadline=600.0
        )
    finally:
        if before is None:
            shutil.rmtree(state, ignore_errors=True)
        else:  # a capture may hold the directory (empty): only what the run added goes
            for entry in set(os.listdir(state)) - before:
                path = os.path.join(state, entry)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.unlink(path)
    if log is not None:
        captures.facts(host)  # what test_stated_facts_match reads: recorded too
    return report


@pytest.fixture(scope="session")
def checked(untimed, unpacked_captures):
    """Every check run once per capture, with a recording Host: {name: (report, ReadLog)}, shared by
    the tests that judge the verdicts and the one that judges what was read (a ReadLog only
    records, so the verdicts are those of a plain Host)."""
    cache = {}

    def get(name):
        if name not in cache:
            log = ReadLog()
            cache[name] = (run_all(untimed, name, unpacked_captures[name], log), log)
        return cache[name]

    return get


def test_the_corpus_has_the_machines_issue_13_asks_for():
    assert len(CORPUS) >= 10
    machines = " ".join(
        entry["machine"] + " " + entry["revealed"] for entry in CORPUS.values()
    ).lower()
    for wanted in (
        "multi-die",
        "arm",
        "power",
        "hybrid",
        "more possible than present",
        "really offline",
        "passed into a vm",
        "plx",
        "gpu memory as numa nodes",
        "package id -1",
        "uneven",
    ):
        assert wanted in machines, wanted
    for name, entry in CORPUS.items():
        source = entry["source"]
        if "device" in source:  # a lent machine: its raw outputs, the truth's source, are here
            assert re.match(r"^\d{4}-\d{2}-\d{2}$", source["captured"]), name
            assert os.path.isdir(os.path.join(captures.HERE, source["path"])), name
        else:
            assert (
                re.match(r"^[0-9a-f]{40}$", source["commit"])
                and source["repository"].count("/") == 1
            ), name
        assert source["path"] and source["license"] and source["stated_in"], name
        assert os.path.getsize(captures.archive(name)) < 64 * 1024, name
    total = sum(os.path.getsize(captures.archive(name)) for name in NAMES)
    assert total < 3 * 1024 * 1024, "the corpus should stay a few MB: %d bytes" % total


def test_every_check_on_every_capture(checked, unpacked, name):
    entry, root = CORPUS[name], unpacked[name]
    report, _log = checked(name)
    crashed = [(r.check, r.summary) for r in report.results() if "traceback" in r.details]
    assert not crashed, crashed
    expected_unknown = entry.get("unknown", {})
    for result in report.results():
        if result.status is not Status.UNKNOWN:
            continue
        missing = expected_unknown.get(result.check)
        assert missing, "%s: unexpected UNKNOWN: %s" % (result.check, result.summary)
        assert missing in result.summary, "%s should name %s: %s" % (
            result.check,
            missing,
            result.summary,
        )
        assert not os.path.lexists(os.path.join(root, missing.lstrip("/")))
    unknown_checks = {r.check for r in report.results() if r.status is Status.UNKNOWN}
    assert unknown_checks == set(expected_unknown), (
        "the manifest lists UNKNOWNs that did not happen"
    )
    cpu = next(r for r in report.results() if r.check == "system.cpu")
    truth = entry["truth"]
    if truth.get("offline"):
        assert cpu.status is Status.FAIL and cpu.summary.endswith(": " + truth["offline"]), (
            cpu.summary
        )
    else:
        assert cpu.status is Status.OK, cpu.summary
    gpu_count = next(r for r in report.results() if r.check == "gpu.count")
    assert gpu_count.status is Status.SKIP  # NVML is live-only: never judged from a capture


def test_stated_facts_match(unpacked, name):
    truth, got = CORPUS[name]["truth"], captures.facts(Host(unpacked[name]))
    for key in ("cpus", "sockets", "cores", "offline"):
        if key in truth:
            assert got[key] == truth[key], (key, got[key], truth[key])
    if "online" in truth:
        assert parse_cpulist(got["online"]) == parse_cpulist(truth["online"])
    if "cores_per_socket" in truth:
        stated = truth["cores_per_socket"]
        assert sorted(got["cores_per_socket"]) == (
            sorted(stated) if isinstance(stated, list) else [stated] * len(got["cores_per_socket"])
        )
    if "threads_per_core" in truth:
        stated = truth["threads_per_core"]
        assert got["threads_per_core"] == (sorted(stated) if isinstance(stated, list) else [stated])
    assert sorted(got["models"]) == sorted(truth["models"])
    if "numa_nodes" in truth:
        assert sorted(got["numa_mib"]) == truth["numa_nodes"]
    for node, stated in truth.get("numa_local", {}).items():
        assert _same_size(got["numa_mib"][int(node)], stated), (
            node,
            got["numa_mib"][int(node)],
            stated,
        )
    tree = got["pci"]
    if "pci_devices" in truth:
        assert sorted(tree.nodes) == sorted(truth["pci_devices"])
    if "memory_only_nodes" in truth:
        assert got["memory_only_nodes"] == truth["memory_only_nodes"]
    for bdf, node in truth.get("pci_numa", {}).items():
        assert bdf in tree.nodes, "%s not in the PCI tree" % bdf
        assert tree.nodes[bdf].numa_node == node, (bdf, tree.nodes[bdf].numa_node, node)
    for bdf, chain in truth.get("pci_chain", {}).items():
        assert list(tree.nodes[bdf].chain) == chain
    for a, b, level in truth.get("pci_level", []):
        assert tree.level(a, b).name == level, (a, b)


def _same_size(mib: float, stated: str) -> bool:
    """lstopo prints sizes rounded to its unit: 8190MiB within a MiB, 126GiB within half a GiB."""
    number, unit = re.match(r"^(\d+)(MiB|GiB)$", stated).groups()
    return abs(mib - int(number)) <= 1 if unit == "MiB" else abs(mib / 1024 - int(number)) <= 0.5


def test_the_corpus_holds_every_file_the_checks_read(checked, unpacked, name):
    """A check that starts reading a file the build stripped would quietly see a poorer machine: every
    path missing now must have been missing from the source too. Otherwise rebuild the corpus
    (python -m tests.captures.build, see tests/captures/README.md)."""
    _report, log = checked(name)
    stripped = sorted(log.missing - set(captures.absent(unpacked[name])))
    assert not stripped, "read but not in the capture (rebuild tests/captures): %s" % stripped[:10]


@pytest.mark.parametrize("name", [n for n in NAMES if "nvidia_gpus" in CORPUS[n]["truth"]])
def test_gpus_passed_into_a_vm_are_found_and_not_judged_through_this_machines_nvml(
    untimed, unpacked, checked, name
):
    root = unpacked[name]
    report, _log = checked(name)
    pci = report.results()
    count = next(r for r in pci if r.check == "gpu.count")
    assert count.status is Status.SKIP and "live-only" in count.summary
    config = validate(untimed, captures.corpus_config(CORPUS[name]))
    from slurm_hooks.core.runner import GatherContext, JobContext

    gathered = GatherContext(untimed, Host(root), config, JobContext())
    found = sorted(d.bdf for d in gathered.get("pci.devices") if d.is_nvidia_gpu)
    assert found == CORPUS[name]["truth"]["nvidia_gpus"]


def test_gpu_memory_numa_nodes_are_not_judged_as_host_memory(untimed, unpacked):
    """POWER9 + V100: nodes 250-255 are GPU memory without CPUs; a per-node free-memory floor must only
    judge the nodes that have CPUs, and the summary tells the two kinds apart."""
    name = "nvidiagpunumanodes"
    config = validate(untimed, {"checks": {"system.memory": {"min_free_percent_per_numa": 99.99}}})
    report = run_checks(
        untimed, config, Host(unpacked[name]), "manual", [untimed.checks["system.memory"]]
    )
    components = {r.component for r in report.results()}
    assert components == {"numa:0", "numa:8"}, components
    ok = run_checks(
        untimed,
        validate(untimed, {}),
        Host(unpacked[name]),
        "manual",
        [untimed.checks["system.memory"]],
    ).results()[0]
    assert "2 NUMA node(s) with CPUs, 6 memory-only (GPU or CXL memory: 250-255)" in ok.summary, (
        ok.summary
    )
