"""The console script's prolog/epilog/health entry (main_hook) and what it does on our own problems.

A configuration we refuse (core/config.py, /etc/slurm-hooks/config.toml) or a bug of ours never
drains a node: fail_open logs one CRITICAL line and exits 0, and the job runs unchecked.
"""

from __future__ import annotations

import sys

from ..core import logs
from ..core.config import ConfigError
from ..registry import JOB_CONTEXTS
from ..result import ExitCode
from .flow import run_hook

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import List, Mapping, Optional


def fail_open(
    context: str,
    error: Exception,
    config_path: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    event: str = "config-error",
) -> int:
    """A problem of ours (a refused config, a bug): let the job run, and say so where the admin looks.

    One CRITICAL decision line (syslog/journald and the log file, with the [paths] that could be
    salvaged from the broken files: config.salvage_settings) and, for a refused configuration,
    slurm_hooks_config_error 1 in the metrics: every job on this node now runs unchecked.
    """
    from ..core.config import salvage_settings

    env = env or {}
    text = "%s: %s" % (type(error).__name__, error)
    try:
        settings = salvage_settings(config_path)
        log = logs.setup(
            settings, create_dirs=False
        )  # an installed node has its log directory (the package's)
        log.critical(
            logs.kv(
                context=context,
                job=env.get("SLURM_JOB_ID"),
                node=env.get("SLURMD_NODENAME"),
                event=event,
                decision="fail-open",
                error=text,
                detail="failing open (exit 0): jobs run unchecked until this is fixed (slurm-hooks config check)",
            )
        )
        if event == "config-error" and settings.metrics.textfile_dir:
            from ..core.isolation import Step, run_steps
            from ..records import metrics

            run_steps(
                [
                    Step(
                        "metrics",
                        settings.metrics.textfile_dir,
                        lambda: metrics.write_config_error(settings, context, text, log),
                    )
                ],
                settings.deadline.files,
            )
    except Exception:  # noqa: BLE001  (logging itself broke: the plain fallback below)
        message = "slurm-hooks %s: %s -- failing open (exit 0)" % (context, text)
        print(message, file=sys.stderr)
        try:
            import syslog

            syslog.openlog("slurm-hooks")
            syslog.syslog(syslog.LOG_CRIT, message.replace("\x00", "\\x00"))
        except Exception:  # noqa: BLE001  (syslog is best effort here)
            pass
    return ExitCode.OK


def main_hook(
    context: str,
    config_path: Optional[str],
    env: Mapping[str, str],
    node: Optional[str] = None,
    root: Optional[str] = None,
) -> int:
    from ..core.config import load_registry_and_config

    try:
        registry, config = load_registry_and_config(config_path, root, names=_own_checks(context))
    except ConfigError as exc:
        return fail_open(context, exc, config_path, env)
    except (
        Exception
    ) as exc:  # our bug (a site check that breaks the registry...) must never drain the node
        import traceback

        traceback.print_exc()
        return fail_open(context, exc, config_path, env, event="internal-error")
    try:
        return run_hook(context, registry, config, env, node).exit_code
    except Exception as exc:  # our bug must never drain the node
        import traceback

        traceback.print_exc()
        return fail_open(context, exc, config_path, env, event="internal-error")


def _own_checks(context: str) -> Optional[List[str]]:
    """The built-in checks a prolog or epilog runs (check_index.CHECK_CONTEXTS): only their modules
    are imported (the health-only BMC, MCE and NVMe checks: ~2 ms of every job's start), plus those
    the configuration names and the site checks, as for `check NAME`. None (every module) for the
    health mode: it also re-runs the checks of a drain it remembers, whatever their context."""
    if context not in JOB_CONTEXTS:
        return None
    from ..check_index import CHECK_CONTEXTS

    return [name for name, contexts in CHECK_CONTEXTS.items() if context in contexts.split(",")]
