"""A node's expected values as config (what `slurm-hooks baseline` prints), as NHC's `nhc-genconf` does.

The values come from the checks' own gatherers, run once through the runner (so a hung NVML call
or blocked read is bounded as in every run): gpu.inventory (nvmlDeviceGetCount/Name, driver),
gpu.links (PCIe link generation, NVLink states), gpu.state (compute and MIG modes), pci.devices
(NVIDIA GPUs on the PCI bus, for a capture read without NVML), gpudirect.state
(/sys/class/infiniband), system.cpu and system.memory (/sys/devices/system/{cpu,node},
/proc/meminfo), numa.sysctl (/proc/sys, hugepages per NUMA node). Every key written is a declared
check parameter, so `slurm-hooks --config FILE config check` loads the output unchanged; a value this
node does not show (no GPUs, no HCAs, NVML not read under --root) is left out with a comment.

Snapshots are read by attribute, not imported by type: the library's core does not depend on the
check modules it runs.
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
from typing import Any, Dict, List, Optional, Tuple

from ..result import Status
from .config import Config, validate
from .config_files import toml_loads
from .report_format import finding
from .runner import GatherContext, JobContext, RunReport, run_checks

GIB_KB = 1024 * 1024
# MemTotal moves a little between kernels and firmware (reserved and crash-kernel memory); one lost DIMM
# of 32 is 3 % of it. 1 % below today's value catches the DIMM and survives a kernel update.
MEMORY_MARGIN = 0.99
_COMPUTE_MODES = {0: "default", 2: "prohibited", 3: "exclusive_process"}


class Baseline:
    """TOML sections in the order they are written, plus what the admin should look at."""

    def __init__(self) -> None:
        self.sections: List[Tuple[str, List[str]]] = []
        self.notes: List[str] = []  # comments at the top: where values came from, what was left out

    def section(self, header: str) -> List[str]:
        lines: List[str] = []
        self.sections.append((header, lines))
        return lines

    def body(self) -> str:
        out = []
        for header, lines in self.sections:
            if lines:
                out.extend(["", header] + lines)
        return "\n".join(out) + "\n"

    def render(self, node: Optional[str], report: RunReport) -> str:
        """The body under a header: where it came from, and what this node fails even under it."""
        out = [
            "# slurm-hooks baseline of %s: the expected values of this node, as config."
            % (node or "?"),
            "# Review, then install as /etc/slurm-hooks/conf.d/50-baseline.toml on nodes of this kind.",
        ]
        bad = [
            run for run in report.runs if run.status in (Status.FAIL, Status.UNKNOWN, Status.WARN)
        ]
        if bad:
            out.append("# WARNING: this node does not pass every check under this baseline:")
            out.extend(
                "#   %s %s: %s" % (run.status.value, run.name, _one_line(finding(run.headline())))
                for run in bad
            )
        out.extend("# " + note for note in self.notes)
        return "\n".join(out) + "\n" + self.body()


def _one_line(text: str) -> str:
    """Text from the node (a CPU model, an error) as one comment line: no line breaks, no control
    characters (a crafted capture must not write TOML, or terminal escapes, through a comment)."""
    return " ".join("".join(c for c in str(text) if c >= " " and c != "\x7f").split())[:200]


def _toml_value(value: Any) -> str:
    """TOML for the values a baseline writes. Strings as JSON strings: every JSON escape is a TOML
    basic-string escape, and a name read from the node (an HCA directory, a kernel release) with a
    quote or a line break in it stays one string."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    return "[" + ", ".join(_toml_value(v) for v in value) + "]"


def _failed(value: Any) -> bool:
    return isinstance(value, BaseException)


def take_baseline(registry, config: Config, host, node: Optional[str]) -> Tuple[str, RunReport]:
    """Run every check once (manual context, no job), turn what the gatherers read into config TOML,
    and judge the node again under it (the report returned): the readings are the cached ones, so
    what a baseline cannot express (a x8 link, a GPU that fell off) shows, and nothing is read twice."""
    gather = GatherContext(registry, host, config, JobContext())
    run_checks(registry, config, host, "manual", registry.sorted_checks(), gather=gather)
    base = Baseline()
    _gpus(base, gather)
    _hcas(base, gather.peek("gpudirect.state"))
    _cpu(base, gather.peek("system.cpu"))
    _memory(base, gather.peek("system.memory"))
    _numa(base, gather.peek("numa.sysctl"))
    _kernel(base, gather.peek("system.kernel"))
    judged = _under_baseline(registry, config, host, gather, base.body())
    return base.render(node, judged), judged


def _under_baseline(registry, config: Config, host, gather: GatherContext, body: str) -> RunReport:
    """The checks again, with the baseline over the defaults (and this run's root, NVML library, paths
    and deadlines). Validating it here also proves the output loads: a ValueError/ConfigError here is
    our bug, not the admin's."""
    data = toml_loads(body)
    for section in ("nvml", "paths", "deadline"):
        data[section] = dict(config.settings[section])
    data["general"] = dict(
        data.get("general", {}),
        root=config.get("general", "root"),
        root_live_sources=list(config.get("general", "root_live_sources")),
    )
    baseline = validate(registry, data)
    gather.config = baseline  # the cached readings stay; "settings" and any new gatherer see it
    return run_checks(registry, baseline, host, "manual", registry.sorted_checks(), gather=gather)


def _gpus(base: Baseline, gather: GatherContext) -> None:
    inventory = gather.peek("gpu.inventory")
    pci = gather.peek("pci.devices") or ()
    on_bus = sum(1 for d in pci if d.is_nvidia_gpu)
    if inventory is None or inventory.error is not None:
        why = inventory.error if inventory is not None else "not read"
        if on_bus:
            base.notes.append(
                "NVML not read (%s): GPU count from the PCI bus only; no driver, model, "
                "NVLink or PCIe generation values" % _one_line(why)
            )
            base.section("[general]").append("expect_gpus = true")
            base.section('[checks."gpu.count"]').append("expected = %d" % on_bus)
        else:
            base.notes.append("no NVIDIA GPUs: no GPU values")
        return
    if not inventory.devices:
        base.notes.append("NVML sees no GPUs: no GPU values")
        return
    if on_bus and on_bus != inventory.count:
        base.notes.append(
            "NVML counts %d GPUs but %d are on the PCI bus: expected is NVML's count"
            % (inventory.count, on_bus)
        )
    base.section("[general]").append("expect_gpus = true")
    models: Dict[str, int] = {}
    for device in inventory.devices:
        models[device.name] = models.get(device.name, 0) + 1
    count = base.section('[checks."gpu.count"]')
    count.append("# %s" % ", ".join("%d x %s" % (n, name) for name, n in sorted(models.items())))
    count.append("expected = %d" % inventory.count)
    driver = base.section('[checks."gpu.driver"]')
    driver.append("allow = %s" % _toml_value([inventory.driver_version]))
    _modes(driver, gather.peek("gpu.state"))
    _links(base, gather.peek("gpu.links"))


def _modes(lines: List[str], state: Any) -> None:
    """compute_mode and mig as every GPU has them now (left at the defaults when the GPUs differ)."""
    if state is None or state.error is not None:
        return
    compute = {v.get("compute_mode") for _d, v in state.gpus if not _failed(v.get("compute_mode"))}
    if len(compute) == 1:
        mode = _COMPUTE_MODES.get(compute.pop())
        if mode is not None and mode != "default":
            lines.append("compute_mode = %s" % _toml_value(mode))
    mig = {bool(v["mig_mode"][0]) for _d, v in state.gpus if not _failed(v.get("mig_mode"))}
    if mig == {True}:
        lines.append('mig = "enabled"')


def _links(base: Baseline, links: Any) -> None:
    if links is None or links.error is not None:
        return
    gens = [v["max_gen"] for _d, v in links.gpus if not _failed(v.get("max_gen"))]
    if gens:
        pcie = base.section('[checks."gpu.pcie"]')
        widths = sorted({v["max_width"] for _d, v in links.gpus if not _failed(v.get("max_width"))})
        pcie.append(
            "# link maximum: Gen%s x%s (a narrower link than its maximum FAILs whatever the config)"
            % ("/".join(str(g) for g in sorted(set(gens))), "/".join(str(w) for w in widths))
        )
        pcie.append("expected_gen = %d" % min(gens))
    active: Dict[str, int] = {}
    for device, values in links.gpus:
        states = values.get("nvlinks")
        if states is None or _failed(states):
            continue
        up = sum(1 for s in states if s)
        active[device.name] = min(up, active.get(device.name, up))
    if active:
        entries = ["%s=%d" % (_literal_pattern(name), n) for name, n in sorted(active.items())]
        base.section('[checks."gpu.nvlink"]').append("expected_links = %s" % _toml_value(entries))


def _literal_pattern(name: str) -> str:
    """A shell pattern matching exactly `name` (gpu.nvlink matches models with fnmatch)."""
    out = re.sub(r"([*?\[])", r"[\1]", name)
    assert fnmatch.fnmatchcase(name, out)
    return out


def _hcas(base: Baseline, state: Any) -> None:
    if state is None or not state.ports:
        base.notes.append("no RDMA devices in /sys/class/infiniband: no HCA values")
        return
    up = [p for p in state.ports if p.state == "ACTIVE" and p.phys_state == "LinkUp"]
    down = [p for p in state.ports if p not in up]
    hcas = sorted({p.hca for p in up})
    lines = base.section('[checks."gpudirect.hca"]')
    lines.append("expected = %s" % _toml_value(hcas))
    if down:
        lines.append("# not ACTIVE/LinkUp when the baseline was taken (an unused port?): ignored")
        lines.append("ignore = %s" % _toml_value(sorted(p.name for p in down)))
    layers = {p.link_layer for p in up}
    if len(layers) == 1 and layers <= {"InfiniBand", "Ethernet"}:
        lines.append("link_layer = %s" % _toml_value(layers.pop()))
    _rates(lines, up)


def _rates(lines: List[str], up: List[Any]) -> None:
    """min_rate_gbps: the one rate when every port runs at it (FAIL below it). With several rates the
    check's own comparison (WARN below the fastest port of the same link layer) works where each
    layer runs at one rate; where one layer mixes rates (EDR storage beside HDR compute) that
    comparison would WARN on this very node, so the floor is the slowest rate seen instead."""
    by_layer: Dict[str, set] = {}
    for port in up:
        if port.rate_gbps is not None:
            by_layer.setdefault(port.link_layer, set()).add(port.rate_gbps)
    rates = sorted({r for layer in by_layer.values() for r in layer})
    if not rates:
        return
    if len(rates) == 1 or any(len(layer) > 1 for layer in by_layer.values()):
        if len(rates) > 1:
            lines.append(
                "# ports of one link layer run at different rates (%s Gb/s): the floor is the "
                "slowest; a port down-trained to it is not caught" % _rate_list(rates)
            )
        lines.append("min_rate_gbps = %s" % _toml_value(float(rates[0])))
    else:
        lines.append(
            "# each link layer runs at one rate (%s Gb/s): min_rate_gbps left at 0, so a port "
            "slower than the fastest of its link layer is a WARN" % _rate_list(rates)
        )


def _rate_list(rates: List[float]) -> str:
    return ", ".join("%g" % r for r in rates)


def _cpu(base: Baseline, cpu: Any) -> None:
    if cpu is None or not cpu.layout.sockets:
        return
    sockets = cpu.layout.sockets
    lines = base.section('[checks."system.cpu"]')
    if cpu.models:
        lines.append("# %s" % _one_line(cpu.models[0]))
    lines.append("sockets = %d" % len(sockets))
    cores = {len(s.cores) for s in sockets}
    if len(cores) == 1:
        lines.append("cores_per_socket = %d" % cores.pop())
    threads = {max(s.thread_counts, default=0) for s in sockets}
    if len(threads) == 1 and 0 not in threads:
        lines.append("threads_per_core = %d" % threads.pop())


def _memory(base: Baseline, mem: Any) -> None:
    if mem is None or not mem.total_kb:
        return
    total = mem.total_kb / GIB_KB
    lines = base.section('[checks."system.memory"]')
    lines.append(
        "# %.1f GiB now; NUMA nodes: %s"
        % (
            total,
            ", ".join(
                "%d (%.0f GiB%s)" % (n.node, n.total_kb / GIB_KB, "" if n.has_cpus else ", no CPUs")
                for n in mem.numa
            )
            or "none listed",
        )
    )
    lines.append("min_total_gib = %s" % _toml_value(math.floor(total * MEMORY_MARGIN * 10) / 10))


def _numa(base: Baseline, state: Any) -> None:
    if state is None:
        return
    lines = base.section('[checks."numa.sysctl"]')
    if state.numa_balancing is not None:
        lines.append("numa_balancing = %d" % state.numa_balancing)
    if state.zone_reclaim_mode is not None:
        lines.append("zone_reclaim_mode = %d" % state.zone_reclaim_mode)
    sizes = sorted({size for pools in state.hugepages.values() for size in pools})
    pools = []
    for size in sizes:
        counts = {pools_.get(size, (0, 0))[0] for pools_ in state.hugepages.values()}
        if len(counts) == 1 and counts != {0}:
            pools.append("%s=%d" % (size, counts.pop()))
        elif len(counts) > 1:
            lines.append("# hugepages-%s differ between NUMA nodes: not baselined" % size)
    if pools:
        lines.append("hugepages = %s" % _toml_value(pools))


def _kernel(base: Baseline, release: Any) -> None:
    if release:
        base.section('[checks."system.kernel"]').append(
            "# kernels change with updates; uncomment to pin this one\n# allow = %s"
            % _toml_value([release])
        )
