"""Prometheus metrics for node_exporter's textfile collector: <[metrics] textfile_dir>/slurm_hooks.prom.

node_exporter (`--collector.textfile.directory DIR`) exports every *.prom file in DIR with each
scrape. After each prolog/epilog/health run we rewrite ours from scratch with prometheus_client's
exposition code (`write_to_textfile`: temp file + rename, so a scrape never sees half a file).
prometheus_client is imported only here, and only when textfile_dir is set: the happy path of a
hook without metrics never pays for it.

Metrics (the check name is the registry name, the component is the Result's, "" for the whole node):

- slurm_hooks_check_status{check,component}: latest status of each check, from whichever mode ran it
  last: 0 OK, 1 WARN, 2 FAIL, 3 UNKNOWN, -1 SKIP. Alert on `== 2` (broken) and `== 3` (cannot tell).
- slurm_hooks_check_duration_seconds{check}: how long the check took on its last run.
- slurm_hooks_last_run_timestamp_seconds{mode}: end of the last prolog/epilog/health run (stale =
  the hooks stopped running, e.g. a broken install: alert on `time() - x > 3600` for health).
- slurm_hooks_run_duration_seconds{mode}: the whole run's duration (compare with PrologEpilogTimeout).
- slurm_hooks_drains_total: drains this node set on itself (DRAINED or REFINED outcomes).
- slurm_hooks_breaker_tripped, slurm_hooks_breaker_drained_nodes, slurm_hooks_breaker_limit_nodes:
  the circuit breaker as last evaluated (only drains evaluate it; absent until the first one).

The values survive between runs in <[paths] state_dir>/metrics-state.json, updated under a lock
(jobs sharing a node run hooks concurrently). Errors are logged and never stop a hook.
"""
from __future__ import annotations

import fcntl
import logging
import os
import time
from typing import Any, Dict, Optional

from . import logs
from .atomicio import read_json, write_json_atomic

TEXTFILE_NAME = "slurm_hooks.prom"
STATE_NAME = "metrics-state.json"
STATUS_VALUES = {"OK": 0, "WARN": 1, "FAIL": 2, "UNKNOWN": 3, "SKIP": -1}
_SEVERITY = {"SKIP": 0, "OK": 1, "WARN": 2, "UNKNOWN": 3, "FAIL": 4}
DRAIN_OUTCOMES = ("drained", "refined")


def write_textfile(config, context: str, report=None, decision=None, enacted=None, now: Optional[float] = None,
                   log: Optional[logging.Logger] = None) -> Optional[str]:
    """Merge this run into the metrics state and rewrite the .prom file; its path, or None (off or failed)."""
    directory = config.get("metrics", "textfile_dir")
    if not directory:
        return None
    log = log or logging.getLogger(logs.LOGGER_NAME)
    path = os.path.join(directory, TEXTFILE_NAME)
    try:
        from prometheus_client import write_to_textfile

        state_dir = config.get("paths", "state_dir")
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        with _Lock(os.path.join(state_dir, STATE_NAME + ".lock")):
            state_path = os.path.join(state_dir, STATE_NAME)
            try:
                state = read_json(state_path, default={})
            except ValueError as exc:  # corrupt: start again rather than stop exporting
                log.warning(logs.kv(event="metrics-state-reset", error=exc))
                state = {}
            state = update_state(state if isinstance(state, dict) else {}, context, report, enacted,
                                 time.time() if now is None else now)
            write_json_atomic(state_path, state)
        os.makedirs(directory, mode=0o755, exist_ok=True)
        write_to_textfile(path, build_registry(state))
        return path
    except ImportError as exc:
        log.error(logs.kv(event="metrics-not-written", error="prometheus_client is not installed: %s" % exc))
    except OSError as exc:
        log.error(logs.kv(event="metrics-not-written", path=path, error=exc))
    except Exception as exc:  # our bug: metrics are never worth failing a hook
        log.exception(logs.kv(event="metrics-bug", error=repr(exc)))
    return None


def update_state(state: Dict[str, Any], context: str, report, enacted, now: float) -> Dict[str, Any]:
    """Pure: fold one run into the persisted values. A check that ran replaces all its components."""
    state.setdefault("last_run", {})[context] = round(now, 3)
    checks = state.setdefault("checks", {})
    if report is not None:
        state.setdefault("run_duration", {})[context] = round(report.duration, 4)
        for run in report.runs:
            components: Dict[str, str] = {}
            for result in run.results:
                key = result.component or ""
                old = components.get(key)
                if old is None or _SEVERITY[result.status.value] > _SEVERITY[old]:
                    components[key] = result.status.value
            checks[run.name] = {"duration": round(run.duration, 4), "components": components}
    state.setdefault("drains_total", 0)
    if enacted is not None:
        if enacted.outcome.value in DRAIN_OUTCOMES:
            state["drains_total"] += 1
        breaker = enacted.breaker
        if breaker is not None or enacted.outcome.value == "breaker-tripped":
            state["breaker"] = {"tripped": bool(breaker.tripped) if breaker else True,
                                "drained_by_us": breaker.drained_by_us if breaker else None,
                                "limit": breaker.limit if breaker else None}
    return state


def build_registry(state: Dict[str, Any]):
    """A fresh CollectorRegistry holding the state's metrics (no process/platform defaults)."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StateCollector(state))
    return registry


class _StateCollector:
    def __init__(self, state: Dict[str, Any]):
        self.state = state

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self.state
        status = GaugeMetricFamily("slurm_hooks_check_status", "latest status of a check: 0 OK, 1 WARN, 2 FAIL, "
                                   "3 UNKNOWN, -1 SKIP", labels=["check", "component"])
        duration = GaugeMetricFamily("slurm_hooks_check_duration_seconds", "duration of the check's last run",
                                     labels=["check"])
        for name, entry in sorted(s.get("checks", {}).items()):
            for component, value in sorted(entry.get("components", {}).items()):
                status.add_metric([name, component], STATUS_VALUES.get(value, 3))
            duration.add_metric([name], entry.get("duration", 0.0))
        yield status
        yield duration
        last = GaugeMetricFamily("slurm_hooks_last_run_timestamp_seconds", "end of the last run of this mode "
                                 "(Unix time)", labels=["mode"])
        for mode, value in sorted(s.get("last_run", {}).items()):
            last.add_metric([mode], value)
        yield last
        run = GaugeMetricFamily("slurm_hooks_run_duration_seconds", "duration of the last run of this mode's checks",
                                labels=["mode"])
        for mode, value in sorted(s.get("run_duration", {}).items()):
            run.add_metric([mode], value)
        yield run
        yield CounterMetricFamily("slurm_hooks_drains", "drains this node set on itself", value=s.get("drains_total", 0))
        breaker = s.get("breaker")
        if breaker:
            yield GaugeMetricFamily("slurm_hooks_breaker_tripped", "1 when the circuit breaker refused the last "
                                    "drain", value=1 if breaker.get("tripped") else 0)
            for key, name, text in (("drained_by_us", "drained_nodes", "other nodes drained by slurm-hooks"),
                                    ("limit", "limit_nodes", "drained nodes at which the breaker trips")):
                if breaker.get(key) is not None:
                    yield GaugeMetricFamily("slurm_hooks_breaker_" + name, text + " (at the last drain)",
                                            value=breaker[key])


class _Lock:
    def __init__(self, path: str):
        self.path = path
        self.fd = -1

    def __enter__(self) -> "_Lock":
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)
