"""The fault matrix: one row per injected fault, across every check family, asserting what an admin
and Slurm would see — the check, its status, the component, the suggested action — and whether
policy.decide drains the node (the verdict the prolog acts on).

Faults are injected the way the hardware would show them on the fake DGX-H100 node:
- `overrides`: a spec overlay, built as its own node, so that sysfs and NVML agree (PCIe trees, link
  widths, modules, HCA ports, gres.conf, cgroups...);
- `nvml`: NVML-only values and injected NVML error codes, written into the fake library's state file of
  one shared healthy node (ECC counters, remapping, clocks, fabric, processes have no sysfs view);
- `files` / `kmsg`: files of the shared node replaced, or kernel log records appended (Xid, SXid);
- `config`: the fault is a node that differs from what the site configured.
Shared-node edits are undone after each row, so rows are independent and the whole matrix runs in a
few seconds. tests/test_fault_matrix_slurm.py drives a subset through the real prolog and slurmctld.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from slurm_hooks.core.config import validate
from slurm_hooks.core.runner import run_checks, select_checks
from slurm_hooks.hw import nvml
from slurm_hooks.hw.host import Host
from slurm_hooks.result import Action, Blame, Status
from slurm_hooks.slurm import policy
from tests.fault_table import FAULTS, JOB, Edits, Fault
from tests.helpers import fake_node_config


def test_the_matrix_covers_every_family_with_at_least_40_faults():
    families = {f.family for f in FAULTS}
    assert families >= {
        "GPU",
        "XID",
        "NVLink",
        "PCIe",
        "topology",
        "ACS",
        "IOMMU",
        "peermem",
        "HCA",
        "NUMA",
        "gres.conf",
        "housekeeping",
        "system",
    }
    assert len(FAULTS) >= 40 and len({f.id for f in FAULTS}) == len(FAULTS)
    assert sum(f.drains for f in FAULTS) >= 20 and sum(not f.drains for f in FAULTS) >= 15


def test_every_draining_fail_names_its_action():
    """A drain reason ends with what to do ('-> drain', '-> reboot'); a node-broken FAIL with action none left the
    admin guessing (issue #13 section 4: system.* FAILs did)."""
    silent = [
        f.id for f in FAULTS if f.status is Status.FAIL and f.drains and f.action is Action.NONE
    ]
    assert not silent, silent


def matrix_table() -> str:
    """The Markdown table of every row, as docs/reliability.md shows it."""
    rows = [
        "| fault | family | check | status | component | action | drains |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in FAULTS:
        rows.append(
            "| `%s` | %s | `%s` | %s | %s | %s | %s |"
            % (
                f.id,
                f.family,
                f.check,
                f.status.value,
                "`%s`" % f.component if f.component else "node",
                f.action.value,
                "yes" if f.drains else "no",
            )
        )
    return "\n".join(rows) + "\n"


def test_docs_show_the_matrix_as_tested():
    path = os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "reliability.md"
    )
    with open(path) as handle:
        text = handle.read()
    start, end = "<!-- fault-matrix:start -->\n", "<!-- fault-matrix:end -->"
    assert start in text and end in text, "docs/reliability.md lost its fault-matrix markers"
    shown = text[text.index(start) + len(start) : text.index(end)]
    assert shown == matrix_table(), (
        "docs/reliability.md is stale: paste matrix_table() between the markers"
    )


# ------------------------------------------------------------------------------------------------
# nodes: one shared healthy node, plus one per distinct overlay; pynvml is pointed at one at a time


class Nodes:
    """The shared healthy node, and the node of the overlay the current row needs: rows of one
    overlay follow each other, so only the last one is kept; the one before goes back to the pool
    (tests/fakenode/pool.py), which makes the next overlay's node from it (a few files differ)
    instead of writing a whole DGX tree, and removing it at the end."""

    def __init__(self) -> None:
        from tests.fakenode import FakeNode

        self._build = FakeNode.build_temp
        self.healthy = self._build("dgx-h100")
        self._overlay = None  # (key, node)
        self._active = None

    def for_fault(self, fault: Fault):
        if fault.overrides is None:
            return self.healthy
        key = json.dumps(fault.overrides, sort_keys=True, default=str)
        if self._overlay is None or self._overlay[0] != key:
            self._drop_overlay()
            self._overlay = (key, self._build("dgx-h100", fault.overrides))
        return self._overlay[1]

    def _drop_overlay(self) -> None:
        if self._overlay is not None:
            node, self._overlay = self._overlay[1], None
            if self._active is node:
                from tests.fakenode import fakenvml

                fakenvml.unload_from_pynvml()
                self._active = None
            node.cleanup()

    def activate(self, node) -> None:
        """Point the real pynvml at `node`'s fake library with fresh slurm_hooks.hw.nvml sessions."""
        from tests.fakenode import fakenvml

        nvml.reset_sessions()  # every row starts like a new prolog process: nvmlInit sees the injected state
        if self._active is not node:
            fakenvml.unload_from_pynvml()
            node.load_into_pynvml()
            self._active = node

    def close(self) -> None:
        from tests.fakenode import fakenvml

        fakenvml.unload_from_pynvml()
        nvml.reset_sessions()
        self._drop_overlay()
        self.healthy.cleanup()


@pytest.fixture(scope="module")
def nodes():
    built = Nodes()
    yield built
    built.close()


def run_fault(registry, nodes, fault: Fault):
    node = nodes.for_fault(fault)
    edits = Edits(node)
    try:
        if fault.nvml:
            edits.nvml(fault.nvml)
        for path, content in fault.files.items():
            if path == "truncate-config":
                edits.truncate_config_space(content)
            else:
                edits.file(path, content)
        if fault.kmsg:
            edits.kmsg(fault.kmsg)
        nodes.activate(node)
        data = dict(fault.settings)
        if fault.config:
            data["checks"] = {fault.check: fault.config}
        config = validate(registry, fake_node_config(data))
        report = run_checks(
            registry,
            config,
            Host(str(node.root)),
            "prolog",
            select_checks(registry, "prolog", [fault.check]),
            job=JOB,
        )
        return report.results(), policy.decide(report.results(), config.settings)
    finally:
        edits.restore()


def _shown(results):
    return [(r.status.value, r.component, r.action.value, r.summary) for r in results]


@pytest.mark.parametrize("fault", FAULTS, ids=[f.id for f in FAULTS])
def test_fault(registry, nodes, fault):
    results, decision = run_fault(registry, nodes, fault)
    assert {r.check for r in results} == {fault.check}
    found = [r for r in results if r.status is fault.status]
    assert found, _shown(results)
    first = found[0]
    assert (first.component, first.action) == (fault.component, fault.action), _shown(results)
    assert fault.words in first.summary, _shown(results)
    worst = max(r.status.severity for r in results)
    assert worst == fault.status.severity, _shown(results)  # nothing worse than the injected fault
    expected_blame = fault.blame or {Status.FAIL: Blame.NODE, Status.UNKNOWN: Blame.CHECK}.get(
        fault.status
    )
    assert first.effective_blame is expected_blame
    assert (decision.verdict is policy.Verdict.DRAIN) is fault.drains, (
        decision.verdict,
        _shown(results),
    )
    if fault.drains:
        # what `sinfo -R` shows (20 characters) names the check, and the GPU when the fault has one
        shown = decision.reason[:20]
        gpu = policy.gpu_index(fault.component)
        gpu = None if gpu is None else str(gpu)
        lead = "sh:%s%s" % (fault.check, " g%s" % gpu if gpu else "")
        assert shown == (lead + decision.reason[len(lead) :])[:20], decision.reason
        assert policy.read_reason(decision.reason, "sh:").checks[0] == fault.check
        if fault.component:
            assert fault.component in decision.reason
        if fault.action is not Action.NONE:
            assert ("-> " + fault.action.value) in decision.reason
        assert len(decision.reason) <= 200
    elif fault.status is Status.OK:
        assert decision.verdict is policy.Verdict.PASS
    else:
        assert decision.verdict is policy.Verdict.ALERT and decision.reason == ""


def test_shared_node_is_healthy_after_the_matrix(registry, nodes):
    """Every edit was undone: the shared node still passes every prolog check (runs last in this file)."""
    nodes.activate(nodes.healthy)
    config = validate(registry, fake_node_config())
    report = run_checks(
        registry,
        config,
        Host(str(nodes.healthy.root)),
        "prolog",
        select_checks(registry, "prolog"),
        job=JOB,
    )
    assert {r.status for r in report.results()} <= {Status.OK, Status.SKIP}, _shown(
        [r for r in report.results() if r.status not in (Status.OK, Status.SKIP)]
    )
    assert policy.decide(report.results(), config.settings).verdict is policy.Verdict.PASS


# ------------------------------------------------------------------------------------------------
# 1,000 consecutive prologs on the healthy node: no drain, no non-OK result, no Slurm call

SOAK_RUNS = int(
    os.environ.get("SLURM_HOOKS_SOAK_RUNS", "1000")
)  # lower it for a quick local run only
SOAK_GPU_SETS = (
    "0-7",
    "0,1",
    "2,3",
    "4-7",
    "5",
    "",
)  # whole node, pairs, half, one GPU, a CPU-only job


@pytest.mark.soak
def test_consecutive_healthy_prologs_never_drain(registry, nodes, tmp_path, capsys):
    """The prolog path slurmd runs (hooks.run_hook: job environment, forked check process with its
    deadline, policy, decision log), 1,000 times in a row against the in-memory Slurm of
    test_drainer.py. A false positive here (a flaky parse, a check timing out under load) would drain
    healthy nodes cluster-wide. Job records are off: their snapshot fork is tested in test_records.py
    and would only add time here."""
    from slurm_hooks.hooks import run_hook
    from slurm_hooks.slurm.client import SlurmClient
    from tests.doubles.memory_slurm import cluster

    node = nodes.healthy
    nodes.activate(node)
    nvml.reset_sessions()  # each run's forked check process starts NVML itself, as a new prolog would
    log_file = tmp_path / "log" / "slurm-hooks.log"
    config = validate(
        registry,
        {
            "general": {"root": str(node.root), "root_live_sources": ["nvml"]},
            "paths": {
                "state_dir": str(tmp_path / "state"),
                "log_file": str(log_file),
                "syslog": False,
            },
            "records": {"enabled": False},
        },
    )
    backend = cluster()
    statuses, verdicts, codes, durations = {}, {}, {}, []
    started = time.monotonic()
    for run in range(SOAK_RUNS):
        env = {
            "SLURM_JOB_ID": str(100000 + run),
            "SLURM_JOB_USER": "alice",
            "SLURMD_NODENAME": "node1",
            "SLURM_JOB_GPUS": SOAK_GPU_SETS[run % len(SOAK_GPU_SETS)],
            "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
        }
        outcome = run_hook("prolog", registry, config, env, client=SlurmClient(backend))
        codes[outcome.exit_code] = codes.get(outcome.exit_code, 0) + 1
        verdicts[outcome.decision.verdict] = verdicts.get(outcome.decision.verdict, 0) + 1
        for result in outcome.report.results():
            if result.status not in (Status.OK, Status.SKIP) or result.details.get("timed_out"):
                statuses.setdefault(result.check, []).append(
                    (run, result.status.value, result.summary)
                )
        durations.append(outcome.report.duration)
        capsys.readouterr()  # the decision lines also go to stderr: don't hold 1,000 of them
    elapsed = time.monotonic() - started
    assert statuses == {}, {k: v[:3] for k, v in statuses.items()}
    assert codes == {0: SOAK_RUNS} and verdicts == {policy.Verdict.PASS: SOAK_RUNS}
    assert backend.calls == 0 and not any(n.is_drained for n in backend.nodes.values())
    lines = log_file.read_text().splitlines()
    assert len(lines) == SOAK_RUNS and all(
        "decision=pass" in line and "slurm_calls=0" in line for line in lines
    )
    state_dir = tmp_path / "state"
    assert not (state_dir / "node-state.json").exists()  # nothing drained, nothing pending
    durations.sort()
    with capsys.disabled():
        print(
            "\n[reliability] %d consecutive healthy prologs: 0 drains, 0 non-OK results, 0 Slurm calls; "
            "%.1f s in all (%.0f ms per run, fork included); checks p50 %.0f ms, p99 %.0f ms"
            % (
                SOAK_RUNS,
                elapsed,
                1000 * elapsed / SOAK_RUNS,
                1000 * durations[len(durations) // 2],
                1000 * durations[int(len(durations) * 0.99)],
            )
        )
