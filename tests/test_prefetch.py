"""The check process's sysfs helper (core/prefetch.py): values read in a second process, never a
different result, never a longer wait than STALL_S when the helper is stuck, no pipe of the hook
kept open by it, and no NVML in it."""

from __future__ import annotations

import os
import time

import pytest

from slurm_hooks.core import prefetch
from slurm_hooks.core.config import validate
from slurm_hooks.core.isolation import run_isolated
from slurm_hooks.core.runner import GatherContext, JobContext
from slurm_hooks.core.structs import replace
from slurm_hooks.hw import nvml
from slurm_hooks.hw.host import Host
from slurm_hooks.registry import GathererSpec
from tests.helpers import fake_node_config


@pytest.fixture
def on_node(fake_node, registry):
    """GatherContext(...) factory for the example node (no NVML: the helper never asks it)."""
    node = fake_node("dgx-h100")
    config = validate(registry, fake_node_config({"general": {"root": str(node.root)}}))

    def make():
        return GatherContext(registry, Host(str(node.root)), config, JobContext())

    return make


def _reap(helper):
    helper.stop()
    end = time.monotonic() + 5
    while time.monotonic() < end:
        try:
            done, _ = os.waitpid(helper.pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        time.sleep(0.01)


def test_the_helper_hands_back_what_the_check_process_would_have_read(on_node):
    """Every PREFETCHED gatherer arrives from the helper, equal to the value read here."""
    names = list(prefetch.PREFETCHED)
    gather = on_node()
    helper = prefetch.Prefetch.start(gather, names)
    try:
        fetched = {name: helper.take(name) for name in names}
    finally:
        _reap(helper)
    local = on_node()
    for name in names:
        assert fetched[name] is not None, name  # read by the helper, not left to this process
        assert _timeless(fetched[name][0]) == _timeless(local.get(name)), name


def _timeless(value):
    """A value without the clock reading and counter history of the counter-window gatherers
    (host.edac, host.ib_links: each read adds a point at its own time)."""
    if hasattr(value, "now") and hasattr(value, "history"):
        return replace(value, now=0.0, history=None)
    return value


def test_wanted_follows_what_the_gatherers_ask_for():
    assert prefetch.wanted(["topology.pcie"]) == ["pci.devices", "topology.pcie_sysfs"]
    # round 8: the helper sends system.cpu parsed, not the ~210 kB of /proc/cpuinfo it comes from
    assert prefetch.wanted(["system.load"]) == ["system.cpu_places", "system.cpu"]
    assert prefetch.wanted(["gpu.state", "system.memory"]) == []


def test_a_stuck_helper_costs_at_most_the_stall_and_the_value_is_read_here(
    on_node, registry, monkeypatch
):
    """A sysfs read that never returns in the helper: the check process waits STALL_S after the
    helper's last value, then reads everything left itself (the same value)."""
    here = os.getpid()
    real = registry.gatherers["host.edac"].func

    def hangs_in_the_helper(ctx):
        if os.getpid() != here:
            time.sleep(60)
        return real(ctx)

    monkeypatch.setitem(
        registry.gatherers, "host.edac", GathererSpec("host.edac", hangs_in_the_helper)
    )
    gather = on_node()
    helper = prefetch.Prefetch.start(gather, ["pci.devices", "host.edac", "system.cpuinfo"])
    gather.prefetch = helper
    try:
        assert gather.get("pci.devices") is not None  # the helper's value, before it hangs
        started = time.monotonic()
        edac = gather.get("host.edac")
        waited = time.monotonic() - started
        cpuinfo = gather.get("system.cpuinfo")  # behind the stuck one: read here at once
    finally:
        _reap(helper)
    assert waited < prefetch.STALL_S + 1.0
    assert helper.given_up
    assert _timeless(edac) == _timeless(on_node().get("host.edac"))
    assert cpuinfo == on_node().get("system.cpuinfo")


def test_a_stuck_helper_does_not_keep_the_check_process_result_from_the_hook(
    on_node, registry, monkeypatch
):
    """The helper closes every descriptor it inherited but its own pipe: were it to keep the check
    process's result pipe open while stuck (a read in the kernel that SIGKILL cannot end), the hook
    would wait for that pipe's end until its deadline and lose every result."""
    here = os.getpid()
    real = registry.gatherers["pci.devices"].func

    def hangs_in_the_helper(ctx):
        if os.getpid() != here:
            time.sleep(60)
        return real(ctx)

    monkeypatch.setitem(
        registry.gatherers, "pci.devices", GathererSpec("pci.devices", hangs_in_the_helper)
    )

    def work():
        gather = on_node()
        helper = prefetch.Prefetch.start(gather, ["pci.devices"])
        time.sleep(0.2)  # the helper is in its read; no stop(): as if SIGKILL could not end it
        return {"helper": helper.pid}

    started = time.monotonic()
    data, why = run_isolated(work, 20.0)
    elapsed = time.monotonic() - started
    try:
        assert why == "" and data["helper"] > 0
        assert elapsed < 5.0, elapsed
    finally:
        if data:
            os.kill(data["helper"], 9)


def test_the_helper_never_asks_nvml(on_node, registry, monkeypatch, tmp_path):
    """A gatherer the helper reads that asks for a gpu.* one is refused there: from then on the helper
    hands back nothing, and the check process reads those gatherers itself, NVML included."""
    asked = tmp_path / "asked"
    real = registry.gatherers["host.edac"].func

    def asks_nvml(ctx):
        outcome = []
        try:
            ctx.get("gpu.selection")
            outcome.append("ran")
        except LookupError:
            outcome.append("refused")
        try:
            nvml.session(ctx.config.get("nvml", "library"))
            outcome.append("opened")
        except LookupError:
            outcome.append("refused")
        outcome = ",".join(outcome)
        with open(str(asked), "a") as handle:
            handle.write("%d %s\n" % (os.getpid(), outcome))
        return real(ctx)

    monkeypatch.setitem(registry.gatherers, "host.edac", GathererSpec("host.edac", asks_nvml))
    gather = on_node()
    helper = prefetch.Prefetch.start(gather, ["host.edac", "system.cpuinfo"])
    try:
        assert helper.take("host.edac") is None
        assert helper.take("system.cpuinfo") is None  # nothing after a refusal
    finally:
        _reap(helper)
    lines = asked.read_text().split()
    assert lines == [lines[0], "refused,refused"] and int(lines[0]) != os.getpid()


def test_the_helper_reads_every_value_without_waiting_for_the_check_process(on_node):
    """The example node's values (~350 kB, more than a default 64 kB pipe) all fit in the helper's
    pipe: the helper finishes its list and exits while no check has asked for anything yet, so the
    values the last checks ask for are ready when they do."""
    names = list(prefetch.PREFETCHED)
    helper = prefetch.Prefetch.start(on_node(), names)
    try:
        end = time.monotonic() + 10
        finished = False
        while time.monotonic() < end and not finished:
            finished = os.waitpid(helper.pid, os.WNOHANG)[0] != 0
            time.sleep(0.01)
        assert finished, "the helper is still writing: its pipe is full"
        fetched = {name: helper.take(name) for name in names}
        assert all(value is not None for value in fetched.values())
    finally:
        helper.stop()
