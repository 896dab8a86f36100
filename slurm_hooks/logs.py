"""Decision logging: one key=value line per decision to syslog/journald (/dev/log) and a local file.

slurmd discards a prolog's stdout; operators find our decisions with `journalctl -t slurm-hooks`
or in /var/log/slurm-hooks/slurm-hooks.log. Logging problems (no /dev/log, read-only /var/log) are
reported on stderr once and never stop a hook.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Any, Mapping

LOGGER_NAME = "slurm_hooks.decisions"


def setup(settings: Mapping[str, Mapping[str, Any]], stderr: bool = True) -> logging.Logger:
    logger = logging.getLogger(LOGGER_NAME)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    logger.setLevel(settings["general"]["log_level"].upper())
    logger.propagate = False
    paths = settings["paths"]
    if paths["syslog"] and os.path.exists("/dev/log"):
        handler = SyslogHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        logger.addHandler(handler)
    if paths["log_file"]:
        try:
            os.makedirs(os.path.dirname(paths["log_file"]), mode=0o750, exist_ok=True)
            handler = logging.FileHandler(paths["log_file"])
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            logger.addHandler(handler)
        except OSError as exc:
            print("slurm-hooks: cannot write %s: %s" % (paths["log_file"], exc), file=sys.stderr)
    if stderr:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("slurm-hooks: %(levelname)s %(message)s"))
        logger.addHandler(handler)
    return logger


class SyslogHandler(logging.Handler):
    """Records to syslog/journald through the C library's syslog(3) (`journalctl -t slurm-hooks`).

    Not logging.handlers.SysLogHandler: that one pulls in the socket machinery, which the prolog
    would import before every job, and syslog(3) already knows /dev/log and reconnects on its own.
    """

    _PRIORITIES = {"CRITICAL": 2, "ERROR": 3, "WARNING": 4, "INFO": 6, "DEBUG": 7}  # LOG_CRIT .. LOG_DEBUG

    def __init__(self) -> None:
        super().__init__()
        import syslog

        self._syslog = syslog
        syslog.openlog("slurm-hooks", syslog.LOG_PID, syslog.LOG_DAEMON)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._syslog.syslog(self._PRIORITIES.get(record.levelname, 6), self.format(record))
        except Exception:  # logging must never break a hook
            self.handleError(record)


def kv(**fields: Any) -> str:
    """key=value pairs; values with spaces are quoted, newlines flattened (one line per decision)."""
    parts = []
    for key, value in fields.items():
        if value is None or value == "":
            continue
        text = " ".join(str(value).split())
        if " " in text or "=" in text or '"' in text:
            text = '"%s"' % text.replace('"', "'")
        parts.append("%s=%s" % (key, text))
    return " ".join(parts)
