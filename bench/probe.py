"""In-process breakdown of one prolog's work; run by bench/run.py in a subprocess on the fake node.

    SLURM_HOOKS_CONFIG=... LD_LIBRARY_PATH=<fake lib> python bench/probe.py GPUS REPEAT

Prints one JSON object of phase -> seconds (and counts). Phases, in the order the prolog meets them:
imports (what `slurm-hooks prolog` imports in its own process: the CLI's hook path, the hooks, the
check modules; not pynvml, which the forked child imports), config (TOML + validation), fork_empty
(run_isolated of a no-op: fork + pipe + wait), checks_isolated (the prolog's check phase as
hooks.run_isolated_checks runs it: a forked child that opens NVML itself, runs the checks and takes
the counter snapshot), then, with NVML opened in this process:
pynvml_import, nvml_init, and one sequential gather pass with every Host read and NVML call timed
(host_reads, nvml_calls, gather_other = the gatherers' own Python), judge (the pure check functions),
checks_threaded (runner.run_checks as the child runs it, NVML warm) and snapshot_take (snapshot.take,
NVML warm). A phase whose API moved records its error instead of stopping the probe.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict, List

_tls = threading.local()
OUT: Dict[str, Any] = {"errors": {}}


def timed(name: str, func: Callable[[], Any], repeat: int = 1) -> Any:
    values, result = [], None
    try:
        for _ in range(repeat):
            started = time.perf_counter()
            result = func()
            values.append(time.perf_counter() - started)
        OUT[name] = statistics.median(values)
    except Exception as exc:  # the API this phase uses changed: say so, measure the rest
        OUT["errors"][name] = "%s: %s" % (type(exc).__name__, exc)
        traceback.print_exc()
    return result


class Meter:
    """Accumulates time and calls of wrapped functions; nested wrapped calls count once (outermost)."""

    def __init__(self, key: str):
        self.key, self.seconds, self.calls = key, 0.0, 0

    def wrap(self, func: Callable[..., Any]) -> Callable[..., Any]:
        meter = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(_tls, meter.key, 0)
            setattr(_tls, meter.key, depth + 1)
            started = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                setattr(_tls, meter.key, depth)
                if depth == 0:
                    meter.seconds += time.perf_counter() - started
                    meter.calls += 1

        return wrapper


def instrument(cls: type, names: List[str], meter: Meter) -> None:
    for name in names:
        original = getattr(cls, name, None)
        if callable(original):
            setattr(cls, name, meter.wrap(original))


def main(gpus: int, repeat: int) -> None:
    started = time.perf_counter()
    import re  # noqa: F401  (the console script's own import)

    from slurm_hooks.cli.main import parse_hook_args
    from slurm_hooks.core.config import load_registry_and_config

    parse_hook_args(
        ["prolog"]
    )  # what `slurm-hooks prolog` imports, in its order: CLI, hook verbs, hooks
    from slurm_hooks.cli import hook_verbs as hook_commands  # noqa: F401
    from slurm_hooks.registry import load_builtin_checks

    load_builtin_checks()
    from slurm_hooks import hooks  # noqa: F401  (what the prolog loads next)
    from slurm_hooks.core import runner  # noqa: F401  (what the prolog loads next)
    from slurm_hooks.records import store as records  # noqa: F401  (what the prolog loads next)

    OUT["imports"] = time.perf_counter() - started

    registry, config = timed("config", lambda: load_registry_and_config(None), repeat)
    from slurm_hooks.core.isolation import run_isolated
    from slurm_hooks.core.runner import GatherContext, JobContext, run_checks, select_checks

    job = JobContext(job_id="1001", user="alice", node_name="node1", gpus=tuple(range(gpus)))
    timed("fork_empty", lambda: run_isolated(lambda: {}, 10.0), max(repeat, 10))
    timed(
        "checks_isolated",
        lambda: hooks.run_isolated_checks(registry, config, "prolog", job),
        repeat,
    )

    from slurm_hooks.hw import nvml
    from slurm_hooks.hw.host import Host

    library = config.get("nvml", "library")
    timed(
        "pynvml_import",
        lambda: __import__("slurm_hooks.hw.pynvml_import", fromlist=["x"]).import_pynvml(),
    )
    timed("nvml_init", lambda: nvml.session(library).open())

    host_meter, nvml_meter = Meter("host"), Meter("nvml")
    instrument(
        Host,
        [n for n in vars(Host) if not n.startswith("_") and callable(getattr(Host, n))],
        host_meter,
    )
    instrument(
        nvml.NvmlSession, ["call", "call_versioned", "field_value", "fabric_info"], nvml_meter
    )
    specs = select_checks(registry, "prolog")
    root = config.get("general", "root")
    gather_self: Dict[str, float] = {}
    timed_registry = _timed_gatherers(registry, gather_self)
    ctx = GatherContext(timed_registry, Host(root), config, job)

    def gather_pass() -> None:
        for spec in specs:
            for need in spec.needs:
                try:
                    ctx.get(need)
                except Exception:  # a gatherer's error is a snapshot too (the check reports it)
                    pass

    timed("gather", gather_pass)
    OUT["host_reads"], OUT["host_read_calls"] = host_meter.seconds, host_meter.calls
    OUT["nvml_calls"], OUT["nvml_call_count"] = nvml_meter.seconds, nvml_meter.calls
    OUT["gather_other"] = max(OUT.get("gather", 0.0) - host_meter.seconds - nvml_meter.seconds, 0.0)
    OUT["gatherers"] = dict(sorted(gather_self.items(), key=lambda kv: -kv[1]))
    OUT["judge_by_check"] = {}

    def judge() -> None:
        for spec in specs:
            check_config = config.check(spec.name)
            if not check_config.enabled:
                continue
            try:
                snapshots = [ctx.get(n) for n in spec.needs]
            except Exception:
                continue
            begun = time.perf_counter()
            try:
                spec.func(*snapshots, check_config.params)
            except Exception:
                pass
            OUT["judge_by_check"][spec.name] = time.perf_counter() - begun

    timed("judge", judge)
    OUT["checks_threaded"] = None
    timed(
        "checks_threaded",
        lambda: run_checks(registry, config, Host(root), "prolog", specs, job=job),
        repeat,
    )
    from slurm_hooks.records import counters as snapshot

    timed(
        "snapshot_take",
        lambda: snapshot.take(Host(root), library, job.gpus, config.get("records", "ib_counters")),
        repeat,
    )
    OUT["checks"] = len(specs)


def _timed_gatherers(registry: Any, self_times: Dict[str, float]) -> Any:
    """A copy of the registry whose gatherers record their self time (minus nested gatherers)."""
    from slurm_hooks.core.structs import replace
    from slurm_hooks.registry import Registry

    stack: List[float] = []

    def wrap(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
        def run(ctx: Any) -> Any:
            stack.append(0.0)
            begun = time.perf_counter()
            try:
                return func(ctx)
            finally:
                total = time.perf_counter() - begun
                nested = stack.pop()
                self_times[name] = self_times.get(name, 0.0) + total - nested
                if stack:
                    stack[-1] += total

        return run

    gatherers = {
        name: replace(spec, func=wrap(name, spec.func)) for name, spec in registry.gatherers.items()
    }
    return Registry(checks=dict(registry.checks), gatherers=gatherers)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 3)
    sys.stdout.flush()
    sys.stdout.write(json.dumps(OUT) + "\n")
    sys.stdout.flush()
    os._exit(
        0
    )  # skip interpreter teardown: nothing to flush, and abandoned check threads can't stall it
