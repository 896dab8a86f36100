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
- slurm_hooks_config_error: 1 while the hooks fail open because the configuration is refused (every
  job then runs unchecked: alert on `== 1`), 0 once a hook ran with a valid one.
- slurm_hooks_steps_abandoned_total{step}: steps after the checks (record, snapshot, dcgm-mapping,
  state) given up because they did not finish within [deadline] files (a hung file system).

The values survive between runs in <[paths] state_dir>/metrics-state.json, updated under a lock
(jobs sharing a node run hooks concurrently) that is waited for at most LOCK_TIMEOUT_S. The .prom
file is written through atomicio (temp file + fsync + rename); temp files of writers killed
mid-write (ours, and prometheus_client's from older releases) are removed after an hour. Errors
are logged and never stop a hook.
"""

from __future__ import annotations

import os
import re
import time

from ..core import atomicio, locks, logs
from ..core.atomicio import read_json, write_json_atomic
from ..core.lazyre import lazy_compile
from ..result import ExitCode, Status
from ..slurm.policy import NEW_DRAINS, Outcome

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    import logging
    from typing import Any, Dict, Mapping, Optional, Sequence

TEXTFILE_NAME = "slurm_hooks.prom"
STATE_NAME = "metrics-state.json"
LOCK_TIMEOUT_S = 2.0
STALE_TEMP_S = 3600
# ours (atomicio) and prometheus_client.write_to_textfile's "<path>.<pid>.<thread id>" of older releases
_TEMP_NAMES = lazy_compile(
    r"^(\.%s\.[0-9]+\.[0-9]+\.tmp|%s\.[0-9]+\.[0-9]+)$"
    % (re.escape(TEXTFILE_NAME), re.escape(TEXTFILE_NAME))
)


def write_textfile(
    config,
    context: str,
    report=None,
    decision=None,
    enacted=None,
    now: Optional[float] = None,
    log: Optional[logging.Logger] = None,
) -> Optional[str]:
    """Merge this run into the metrics state and rewrite the .prom file; its path, or None (off or failed)."""
    directory = config.get("metrics", "textfile_dir")
    if not directory:
        return None
    log = log or logs.decision_logger()
    when = time.time() if now is None else now
    return _write(
        config.settings, lambda state: update_state(state, context, report, enacted, when), log
    )


def write_config_error(
    settings: Mapping[str, Mapping[str, Any]],
    context: str,
    error: str,
    log: Optional[logging.Logger] = None,
    now: Optional[float] = None,
) -> Optional[str]:
    """A hook failed open on a refused configuration: slurm_hooks_config_error 1 (settings: what could be
    salvaged from the broken files, config.salvage_settings)."""
    if not settings["metrics"]["textfile_dir"]:
        return None
    when = time.time() if now is None else now

    def fold(state: Dict[str, Any]) -> Dict[str, Any]:
        state["config_error"] = {
            "value": 1,
            "time": round(when, 3),
            "context": context,
            "error": error[:300],
        }
        return state

    return _write(settings, fold, log or logs.decision_logger())


def count_abandoned(
    settings: Mapping[str, Mapping[str, Any]],
    names: Sequence[str],
    log: Optional[logging.Logger] = None,
) -> Optional[str]:
    """Steps given up after [deadline] files: slurm_hooks_steps_abandoned_total{step}."""
    if not settings["metrics"]["textfile_dir"] or not names:
        return None

    def fold(state: Dict[str, Any]) -> Dict[str, Any]:
        counts = state.setdefault("abandoned", {})
        for name in names:
            counts[name] = int(counts.get(name, 0)) + 1
        return state

    return _write(settings, fold, log or logs.decision_logger())


def _write(settings: Mapping[str, Mapping[str, Any]], fold, log: logging.Logger) -> Optional[str]:
    directory = settings["metrics"]["textfile_dir"]
    path = os.path.join(directory, TEXTFILE_NAME)
    try:
        from prometheus_client import generate_latest

        state_dir = settings["paths"]["state_dir"]
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        with locks.locked(os.path.join(state_dir, STATE_NAME + ".lock"), LOCK_TIMEOUT_S):
            state_path = os.path.join(state_dir, STATE_NAME)
            try:
                state = read_json(state_path, default={})
            except ValueError as exc:  # corrupt: start again rather than stop exporting
                log.warning(logs.kv(event="metrics-state-reset", error=exc))
                state = {}
            state = fold(state if isinstance(state, dict) else {})
            write_json_atomic(state_path, state)
        if not os.path.isdir(directory):  # node_exporter reads only its own directory: a typo?
            log.warning(
                logs.kv(
                    event="metrics-dir-created",
                    path=directory,
                    detail="[metrics] textfile_dir did not exist; node_exporter reads only its "
                    "--collector.textfile.directory (slurm-hooks config check warns too)",
                )
            )
        dir_fd = atomicio.open_dir(directory, create_mode=0o755)
        try:
            atomicio.write_atomic_at(
                dir_fd,
                TEXTFILE_NAME,
                generate_latest(build_registry(state)),
                0o644,
                where=directory,
            )
            atomicio.remove_stale_temps(dir_fd, os.geteuid(), STALE_TEMP_S, names=_TEMP_NAMES)
        finally:
            os.close(dir_fd)
        return path
    except ImportError as exc:
        log.error(
            logs.kv(
                event="metrics-not-written", error="prometheus_client is not installed: %s" % exc
            )
        )
    except OSError as exc:
        log.error(logs.kv(event="metrics-not-written", path=path, error=exc))
    except Exception as exc:  # our bug: metrics are never worth failing a hook
        log.exception(logs.kv(event="metrics-bug", error=repr(exc)))
    return None


def update_state(
    state: Dict[str, Any], context: str, report, enacted, now: float
) -> Dict[str, Any]:
    """Pure: fold one run into the persisted values. A check that ran replaces all its components."""
    state.setdefault("last_run", {})[context] = round(now, 3)
    checks = state.setdefault("checks", {})
    if report is not None:
        state.setdefault("run_duration", {})[context] = round(report.duration, 4)
        for run in report.runs:
            worst: Dict[str, Status] = {}
            for result in run.results:
                key = result.component or ""
                if key not in worst or result.status.severity > worst[key].severity:
                    worst[key] = result.status
            checks[run.name] = {
                "duration": round(run.duration, 4),
                "components": {key: status.value for key, status in worst.items()},
            }
    state.setdefault("drains_total", 0)
    if isinstance(state.get("config_error"), dict):
        state["config_error"]["value"] = 0  # a hook ran with a valid configuration
    if enacted is not None:
        if enacted.outcome in NEW_DRAINS:
            state["drains_total"] += 1
        breaker = enacted.breaker
        if breaker is not None or enacted.outcome is Outcome.BREAKER:
            state["breaker"] = {
                "tripped": bool(breaker.tripped) if breaker else True,
                "drained_by_us": breaker.drained_by_us if breaker else None,
                "limit": breaker.limit if breaker else None,
            }
    return state


def status_metric(value: Any) -> int:
    """slurm_hooks_check_status of a Status value kept in the state file: its exit code (0 OK, 1 WARN,
    2 FAIL, 3 UNKNOWN), -1 for SKIP; anything else (a state file from elsewhere) reads as UNKNOWN."""
    try:
        status = Status(value)
    except ValueError:
        return int(ExitCode.UNKNOWN)
    return -1 if status is Status.SKIP else int(status.exit_code)


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
        status = GaugeMetricFamily(
            "slurm_hooks_check_status",
            "latest status of a check: 0 OK, 1 WARN, 2 FAIL, 3 UNKNOWN, -1 SKIP",
            labels=["check", "component"],
        )
        duration = GaugeMetricFamily(
            "slurm_hooks_check_duration_seconds",
            "duration of the check's last run",
            labels=["check"],
        )
        for name, entry in sorted(s.get("checks", {}).items()):
            for component, value in sorted(entry.get("components", {}).items()):
                status.add_metric([name, component], status_metric(value))
            duration.add_metric([name], entry.get("duration", 0.0))
        yield status
        yield duration
        last = GaugeMetricFamily(
            "slurm_hooks_last_run_timestamp_seconds",
            "end of the last run of this mode (Unix time)",
            labels=["mode"],
        )
        for mode, value in sorted(s.get("last_run", {}).items()):
            last.add_metric([mode], value)
        yield last
        run = GaugeMetricFamily(
            "slurm_hooks_run_duration_seconds",
            "duration of the last run of this mode's checks",
            labels=["mode"],
        )
        for mode, value in sorted(s.get("run_duration", {}).items()):
            run.add_metric([mode], value)
        yield run
        yield CounterMetricFamily(
            "slurm_hooks_drains", "drains this node set on itself", value=s.get("drains_total", 0)
        )
        config_error = s.get("config_error")
        if isinstance(config_error, dict):
            yield GaugeMetricFamily(
                "slurm_hooks_config_error",
                "1 while hooks fail open on a refused configuration (jobs run unchecked)",
                value=config_error.get("value", 0),
            )
        abandoned = s.get("abandoned")
        if isinstance(abandoned, dict) and abandoned:
            steps = CounterMetricFamily(
                "slurm_hooks_steps_abandoned",
                "steps after the checks given up after [deadline] files (hung file system)",
                labels=["step"],
            )
            for name, value in sorted(abandoned.items()):
                steps.add_metric([str(name)], value)
            yield steps
        breaker = s.get("breaker")
        if breaker:
            yield GaugeMetricFamily(
                "slurm_hooks_breaker_tripped",
                "1 when the circuit breaker refused the last drain",
                value=1 if breaker.get("tripped") else 0,
            )
            for key, name, text in (
                ("drained_by_us", "drained_nodes", "other nodes drained by slurm-hooks"),
                ("limit", "limit_nodes", "drained nodes at which the breaker trips"),
            ):
                if breaker.get(key) is not None:
                    yield GaugeMetricFamily(
                        "slurm_hooks_breaker_" + name,
                        text + " (at the last drain)",
                        value=breaker[key],
                    )
