"""Configuration: /etc/slurm-hooks/config.toml plus conf.d/*.toml drop-ins, validated before anything runs.

Later files override earlier ones key by key. Check tables are keyed by the check's registry name
(``[checks."gpu.ecc"] enabled = false``); their keys are the parameters the check declares. Every
error names the file, the key and what was expected. Files must be owned by root and not
group/world-writable (they decide whether nodes get drained) unless
SLURM_HOOKS_ALLOW_INSECURE_CONFIG=1 is set (tests, development).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping

from ..registry import (
    CONTEXTS,
    CheckSpec,
    Deprecated,
    Param,
    Params,
    Registry,
    load_builtin_checks,
    load_checks_for,
)
from .config_files import (
    INSECURE_OVERRIDE_ENV,
    ConfigError,
    check_secure,
    config_files,
    parse_bytes,
    parse_toml,
    read_bytes,
)
from .lazyre import lazy_compile
from .sections import Settings, typed_settings
from .structs import Struct, field

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple


class Setting(Struct):
    type: type
    default: Any
    help: str
    choices: Optional[Tuple[Any, ...]] = None
    minimum: Optional[float] = None  # inclusive
    maximum: Optional[float] = None  # inclusive
    above: Optional[float] = None  # exclusive lower bound (a time must be > 0)
    check: Optional[Callable[[Any], Optional[str]]] = (
        None  # value -> what is wrong with it, or None
    )


def _seconds(default: float, text: str, most: float) -> Setting:
    return Setting(float, default, text, above=0.0, maximum=most)


def _path(value: str) -> Optional[str]:
    return (
        None
        if os.path.isabs(value)
        else "must be an absolute path (hooks run with slurmd's working directory)"
    )


def _optional_path(value: str) -> Optional[str]:
    return _path(value) if value else None


def _slurm_bin_dir(value: str) -> Optional[str]:
    """[drain] slurm_bin_dir: absolute, a root-owned directory no one else can write, with an executable
    scontrol. Only a non-empty value is looked at (the default costs no file system access)."""
    if not value:
        return None
    if not os.path.isabs(value):
        return _path(value)
    scontrol = os.path.join(value, "scontrol")
    try:
        info = os.stat(value)
    except OSError as exc:
        return "cannot be used: %s" % (exc.strerror or exc)
    if not os.path.isdir(value):
        return "is not a directory"
    if os.environ.get(INSECURE_OVERRIDE_ENV) != "1":
        if info.st_uid != 0:
            return "is owned by uid %d, not root: whoever owns it chooses what runs as root" % (
                info.st_uid
            )
        if info.st_mode & 0o022:
            return "is group- or world-writable (mode %04o): chmod go-w" % (info.st_mode & 0o7777)
    if not (os.path.isfile(scontrol) and os.access(scontrol, os.X_OK)):
        return "holds no executable scontrol (%s)" % scontrol
    return None


def _straggler_figures(values: List[str]) -> Optional[str]:
    # the figures' one list; imported here, so only a config that sets report_only pays for it
    from ..records.stragglers import METRIC_BY_NAME

    bad = [v for v in values if v not in METRIC_BY_NAME]
    return (
        "%r is not a figure of report --stragglers (one of: %s)"
        % (bad[0], ", ".join(sorted(METRIC_BY_NAME)))
        if bad
        else None
    )


_WORD = lazy_compile(r"^[A-Za-z_]{1,40}$")
_COUNTER = lazy_compile(r"^[A-Za-z0-9_]{1,64}$")
_USER = lazy_compile(
    r"^([a-z_][a-z0-9_.-]{0,31}\$?|[0-9]{1,10})$"
)  # useradd's NAME_REGEX, or a uid


def _words(pattern: "re.Pattern[str]", what: str) -> Callable[[Any], Optional[str]]:
    def check(values: List[str]) -> Optional[str]:
        bad = [v for v in values if not pattern.match(v)]
        return "%r %s" % (bad[0], what) if bad else None

    return check


LIVE_SOURCES = (
    "nvml",
    "statvfs",
    "tools",
)  # what a root other than / may still read from the running machine


def _qualify(name: str) -> Callable[[Any], Optional[str]]:
    # the [qualify] validators live with the qualification; imported only by a config that sets them
    def check(value: Any) -> Optional[str]:
        from ..qualify import settings

        return getattr(settings, name)(value)

    return check


# Sections other than [checks.*]: section -> key -> Setting. Later features add their sections here.
# The one schema: core/sections.py generates each section's typed object from it, so a key added
# here is config.settings.<section>.<key> (and settings["<section>"]["<key>"]) with nothing else to edit.
SECTIONS: Dict[str, Dict[str, Setting]] = {
    "general": {
        "mode": Setting(
            str,
            "observe",
            "observe: log what would be drained, drain nothing (a fresh install; `slurm-hooks "
            "report --observed` lists it); enforce: drain on node-broken failures (`slurm-hooks "
            "mode enforce` switches)",
            ("enforce", "observe"),
        ),
        "root": Setting(
            str,
            "/",
            "filesystem root to read /sys, /proc, /dev from (a captured or fake tree)",
            check=_path,
        ),
        "root_live_sources": Setting(
            list,
            [],
            "with a root other than /, live sources still read from the running "
            "machine: 'nvml' (its NVIDIA driver; the fake node's library), 'statvfs' (free "
            "space of the disk holding the tree), 'tools' (nvme-cli, ipmitool: the host "
            "checks); by default none, and the checks needing them SKIP",
            LIVE_SOURCES,
        ),
        "expect_gpus": Setting(
            bool, False, "this node must have NVIDIA GPUs: a missing driver is FAIL, not SKIP"
        ),
        "log_level": Setting(
            str, "info", "logging threshold", ("debug", "info", "warning", "error")
        ),
    },
    "deadline": {
        "prolog": _seconds(
            5.0,
            "seconds for all prolog checks together (keep well under PrologEpilogTimeout)",
            3600,
        ),
        "epilog": _seconds(20.0, "seconds for all epilog checks together", 3600),
        "health": _seconds(
            45.0, "seconds for health checks (Slurm kills HealthCheckProgram at 60 s)", 3600
        ),
        "manual": _seconds(30.0, "seconds for `slurm-hooks check`", 3600),
        "files": _seconds(
            5.0,
            "seconds for our own file work around the checks (state file, counter snapshot "
            "file, record and retention, metrics, dcgm-exporter mapping, their locks); what does not "
            "finish (a hung file system) is abandoned and logged with its path, and the exit code "
            "never waits for it",
            600,
        ),
    },
    "nvml": {
        "library": Setting(
            str,
            "",
            "explicit path of libnvidia-ml.so.1; empty = the dynamic loader's choice",
            check=_optional_path,
        ),
        "identify_timeout": _seconds(
            1.0,
            "seconds the GPUs' identification (handle, PCI info, minor, name, UUID) may take; a GPU "
            "still not answering is left behind as hung (docs/gpu.md) and the others are judged. At "
            "most 1.5: the GPU checks' 3 s timeouts include it",
            1.5,
        ),
    },
    "drain": {
        "reason_prefix": Setting(
            str,
            "sh:",
            "every drain reason we set starts with this (short: `sinfo -R` shows 20 characters); "
            "we only ever resume or re-reason drains that carry it (or the earlier 'slurm-hooks:')",
        ),
        "max_reason_length": Setting(
            int,
            200,
            "drain reasons are cut to this many characters (Slurm refuses "
            "longer than 512; room is needed for the prefix, a check name and the action)",
            minimum=1,
            maximum=512,
        ),
        "on_timeout": Setting(
            str,
            "alert",
            "a check that timed out or crashed the check process (hung or aborting "
            "NVML call, blocked read): alert only, or treat as node-broken and drain",
            ("alert", "drain"),
        ),
        "skip_states": Setting(
            list,
            [
                "DOWN",
                "REBOOT_REQUESTED",
                "REBOOT_ISSUED",
                "POWERED_DOWN",
                "POWERING_DOWN",
                "POWERING_UP",
                "POWER_DOWN",
                "FUTURE",
                "MAINTENANCE",
                "RESERVED",
                "CLOUD",
            ],
            "node states/flags in which we never drain or resume (logged instead)",
            check=_words(_WORD, "is not a Slurm node state word"),
        ),
        "backend": Setting(
            str,
            "auto",
            "how to talk to slurmctld: pyslurm when a matching one is installed, else scontrol",
            ("auto", "scontrol", "pyslurm"),
        ),
        "timeout": _seconds(5.0, "seconds for one Slurm client call", 300),
        "attempts": Setting(
            int,
            2,
            "tries of one Slurm call on transient errors (controller down, timeout)",
            minimum=1,
            maximum=10,
        ),
        "slurm_bin_dir": Setting(
            str,
            "",
            "directory of the Slurm commands we run (scontrol, sinfo), e.g. /opt/slurm/bin; empty = "
            "the PATH (slurmd gives hooks none: then /bin:/usr/bin). Must be root's, not "
            "group/world-writable, and hold an executable scontrol",
            check=_slurm_bin_dir,
        ),
        "allow_job_opt_out": Setting(
            bool,
            False,
            "honour a job's --extra/--comment 'slurm_hooks=skip' "
            "(its prolog checks are then skipped and logged)",
        ),
    },
    "breaker": {
        "max_percent": Setting(
            float,
            10.0,
            "do not drain when this percent of the cluster's nodes are already drained by us",
            minimum=0,
            maximum=100,
        ),
        "min_nodes": Setting(
            int,
            2,
            "... but always allow draining until this many nodes are drained by us",
            minimum=0,
            maximum=1000000,
        ),
        "max_nodes": Setting(
            int,
            50,
            "never more than this many nodes drained by us at once, whatever the share (0: no "
            "absolute cap); binds from 500 nodes up with the default share",
            minimum=0,
            maximum=1000000,
        ),
        "max_window_drains": Setting(
            int,
            10,
            "at most this many automatic drains of ours within window_s, counted from Slurm's "
            "reason times of the drains still in place (0: off)",
            minimum=0,
            maximum=1000000,
        ),
        "window_s": _seconds(3600.0, "the rate limit's window, seconds", 7 * 86400),
        "common_cause_nodes": Setting(
            int,
            3,
            "this many drains of ours led by the same check within common_cause_window_s are "
            "taken as a common cause (roll-out, file system, switch): further drains for that "
            "check are held and alerted (0: off)",
            minimum=0,
            maximum=1000000,
        ),
        "common_cause_window_s": _seconds(
            600.0, "the common-cause limit's window, seconds", 7 * 86400
        ),
    },
    "lemon": {  # slurm/lemon.py, docs/slurm.md "Lemon nodes"
        "enabled": Setting(
            bool,
            True,
            "hold a node that keeps failing for RMA: its drain asks for RMA and is never resumed "
            "automatically",
        ),
        "drains": Setting(
            int,
            3,
            "a node's drains by us within `days` that make it a lemon (this drain included; 0: "
            "this rule off)",
            minimum=0,
            maximum=1000,
        ),
        "days": _seconds(30.0, "the window of the lemon rules, days", 3650),
        "same_fault_after_reboot": Setting(
            bool,
            True,
            "a drain for the same check (and GPU) as an earlier one within `days`, in another boot, "
            "makes the node a lemon: the fault survived a reboot",
        ),
    },
    "repair": {  # slurm/repair.py, docs/slurm.md "The remediation ladder"
        "reboot": Setting(
            bool,
            False,
            "after a drain asking for reboot (or a GPU reset that cannot run), ask Slurm to reboot "
            "the node once its jobs end: scontrol reboot ASAP nextstate=<next_state> reason=<ours>",
        ),
        "reset_gpu": Setting(
            bool,
            False,
            "after a drain asking for reset-gpu: nvidia-smi -r -i N when no job runs on the node and "
            "no process holds a GPU, else the reboot rung",
        ),
        "next_state": Setting(
            str,
            "DOWN",
            "the state Slurm sets after the reboot (22.05 takes DOWN or RESUME; DRAIN needs a later "
            "Slurm)",
            ("DOWN", "RESUME", "DRAIN"),
        ),
        "max_attempts": Setting(
            int, 2, "repairs of one node within window_days at most", minimum=0, maximum=100
        ),
        "window_days": _seconds(7.0, "the window of max_attempts, days", 3650),
    },
    "xid_pattern": {  # xid/pattern.py, docs/slurm.md "Application Xids across jobs"
        "enabled": Setting(
            bool,
            True,
            "drain a node whose GPU shows application-class Xids under several jobs of several users",
        ),
        "jobs": Setting(int, 3, "distinct jobs on one GPU within `days`", minimum=2, maximum=1000),
        "users": Setting(
            int, 2, "... of at least this many distinct users", minimum=1, maximum=1000
        ),
        "days": _seconds(7.0, "the window, days", 365),
    },
    "paths": {
        "state_dir": Setting(
            str,
            "/var/lib/slurm-hooks",
            "local state: our drains, prolog snapshots, drain history; only root may write it and "
            "the directories above it, else nothing in it is believed (config check says why)",
            check=_path,
        ),
        "log_file": Setting(
            str,
            "/var/log/slurm-hooks/slurm-hooks.log",
            "decision log (empty = none)",
            check=_optional_path,
        ),
        "syslog": Setting(bool, True, "also log decisions to syslog/journald through /dev/log"),
    },
    "records": {
        "enabled": Setting(
            bool,
            True,
            "prolog: store a counter snapshot; epilog: write a per-job record (docs/records.md)",
        ),
        "dir": Setting(
            str,
            "/var/log/slurm-hooks/jobs",
            "per-job records go to DIR/<node>/<job id>.json (may be a shared file system)",
            check=_path,
        ),
        "max_records": Setting(
            int,
            10000,
            "keep at most this many records of this node (oldest removed first)",
            minimum=1,
            maximum=10000000,
        ),
        "max_mb": Setting(
            int, 200, "... and at most this many MiB of them", minimum=1, maximum=1000000
        ),
        "snapshot_timeout": _seconds(
            3.0,
            "seconds for one counter snapshot (NVML can hang); add it to "
            "the deadline when sizing PrologEpilogTimeout",
            300,
        ),
        "ib_counters": Setting(
            list,
            [
                "symbol_error",
                "link_downed",
                "port_rcv_errors",
                "link_error_recovery",
                "port_rcv_remote_physical_errors",
                "port_xmit_discards",
                "local_link_integrity_errors",
                "excessive_buffer_overrun_errors",
            ],
            "InfiniBand port counters (/sys/class/infiniband/*/ports/*/counters/) recorded",
            check=_words(_COUNTER, "is not a counter file name"),
        ),
        "leftover_memory_mib": Setting(
            int,
            1024,
            "GPU memory still used after the job above this is abnormal",
            minimum=0,
            maximum=1 << 30,
        ),
        "snapshot_max_age_days": Setting(
            int,
            30,
            "prolog snapshots whose epilog never ran are removed after this",
            minimum=1,
            maximum=3650,
        ),
        "key_file": Setting(
            str,
            "/etc/slurm-hooks/records.key",
            "root-only key the epilog signs records with and report --stragglers --drain verifies "
            "them with (same file on every node; missing = unsigned, report only)",
            check=_optional_path,
        ),
        "xid_clock_tolerance_s": _seconds(
            2.0,
            "report --xids: two nodes' Xids closer in time than this are in no known order "
            "(node clocks and kernel-log times differ by up to seconds): 'ambiguous', none blamed",
            600,
        ),
    },
    "metrics": {
        "textfile_dir": Setting(
            str,
            "",
            "node_exporter textfile collector directory for slurm_hooks.prom (empty = no metrics)",
            check=_optional_path,
        ),
        "dcgm_job_mapping_dir": Setting(
            str,
            "",
            "dcgm-exporter --hpc-job-mapping-dir: one file per GPU index "
            "holding the job ids using it (empty = not written)",
            check=_optional_path,
        ),
    },
    "fleet": {  # `slurm-hooks report --stragglers` on an admin host (records/stragglers.py, docs/records.md)
        "min_job_nodes": Setting(
            int,
            4,
            "jobs on fewer nodes are not scored (each node is compared with the "
            "job's other nodes: at least this many nodes must have the figure)",
            minimum=3,
            maximum=100000,
        ),
        "z_threshold": Setting(
            float,
            6.0,
            "a node is flagged in a job on a figure this many robust sigmas "
            "worse than the median of the job's other nodes",
            minimum=2.0,
            maximum=1000.0,
        ),
        "k": Setting(
            int,
            3,
            "... and is a suspect when flagged on the same figure in k ...",
            minimum=1,
            maximum=1000,
        ),
        "m": Setting(int, 10, "... of its last m scored multi-node jobs", minimum=1, maximum=1000),
        "window_days": Setting(
            float,
            14.0,
            "only jobs that ended in the last this many days count",
            above=0.0,
            maximum=3650.0,
        ),
        "min_job_seconds": Setting(
            float,
            300.0,
            "shorter jobs are not scored (start-up dominates their figures)",
            minimum=1.0,
            maximum=1e7,
        ),
        "drain": Setting(
            bool,
            False,
            "drain suspects (with `report --stragglers --drain`, as the shipped "
            "slurm-hooks-stragglers.service runs it) through the drain library: breaker, observe "
            "mode, reason 'sh:fleet.straggler: ...'; false: report only",
        ),
        "drain_min_users": Setting(
            int,
            2,
            "drain only a suspect whose flagged jobs belong to at least this many "
            "users (one user's jobs can make a node look slow on purpose)",
            minimum=1,
            maximum=1000,
        ),
        "max_drains_per_run": Setting(
            int,
            2,
            "drain at most this many suspects per run (the worst first)",
            minimum=0,
            maximum=10000,
        ),
        "topology_conf": Setting(
            str,
            "",
            "Slurm's topology.conf (topology/tree SwitchName/Nodes/Switches, or topology/block "
            "BlockName/Nodes): suspects on one figure concentrated under one leaf switch or block "
            'become one switch suspect, and none of its nodes is drained for that figure; "": '
            "not read (each node judged alone)",
        ),
        "trusted_writers": Setting(
            list,
            ["65534"],
            "besides root and the records directory's owner, whose node directories and records "
            "report --stragglers reads: the uid NFS root_squash makes of the nodes' root (the "
            "export's anonuid, 65534 unless set, whatever this host's passwd calls it: nobody, "
            "or nfsnobody on EL7); [] where the records directory is not on root_squash NFS. A "
            "uid, or a user name resolved on the host that runs the report",
            check=_words(_USER, "is not a user name or uid"),
        ),
        "report_only": Setting(
            list,
            ["foreign_cpu_frac"],
            "figures a node is reported on but never drained for: foreign_cpu_frac counts any "
            "process outside Slurm's cgroups on the job's CPUs, an ssh login's included; empty it "
            "where every login lands in a job (pam_slurm_adopt)",
            check=_straggler_figures,
        ),
        "max_drained": Setting(
            int,
            1,
            "drain no more suspects while this many nodes carry a fleet.straggler drain of ours "
            "(only an admin clears one): straggler drains count in the same circuit breaker as the "
            "nodes' own, so keep this below the breaker's limit and a node with a real fault can "
            "still be drained",
            minimum=0,
            maximum=10000,
        ),
        "confirm_with": Setting(
            str,
            "qualify",
            'what a suspect --drain would drain gets first: "qualify" queues it for '
            "`slurm-hooks qualify --due` (qualified when idle; drained only on a failed "
            'qualification, with its figure and the straggler\'s: docs/qualify.md); "none" '
            "drains on the statistics alone",
            ("qualify", "none"),
        ),
    },
    "qualify": {
        "level": Setting(
            str,
            "standard",
            "`slurm-hooks qualify` level (docs/qualify.md)",
            ("quick", "standard", "long"),
        ),
        "class": Setting(
            str, "", "this node's hardware class; empty: '<GPU model> x<count>' from the driver"
        ),
        "classes": Setting(
            dict,
            {},
            '[qualify.classes."<GPU model> x<count>"] floors per hardware class: min_busbw_gbs, '
            "min_h2d_gbs, min_d2h_gbs, min_d2d_gbs, min_ib_fraction",
            check=_qualify("check_classes"),
        ),
        "ib_ports": Setting(
            list,
            [],
            "ports ib_write_bw loops back on, 'mlx5_0:1' or 'mlx5_0:1=gpu0' (GPUDirect from GPU 0)",
            check=_qualify("check_ports"),
        ),
        "optional_tools": Setting(
            list,
            [],
            "tools whose absence does not stop a pass (dcgmi, nvbandwidth, all_reduce_perf, "
            "ib_write_bw); any other missing tool leaves the node not qualified",
            check=_qualify("check_tools"),
        ),
        "node_fraction": Setting(
            float,
            0.8,
            "a GPU below this fraction of the median of the node's GPUs fails (nvbandwidth)",
            above=0.0,
            maximum=1.0,
        ),
        "fleet_fraction": Setting(
            float,
            0.85,
            "a figure below this fraction of its class median (other nodes' last passing "
            "qualification) fails",
            above=0.0,
            maximum=1.0,
        ),
        "fleet_min_peers": Setting(
            int,
            3,
            "the class median needs this many other nodes' records",
            minimum=1,
            maximum=10000,
        ),
    },
}


class CheckConfig(Struct):
    enabled: bool
    params: Params


class Config(Struct):
    # typed (core/sections.py): config.settings.drain.timeout, or settings["drain"]["timeout"] as before
    settings: Settings
    checks: Mapping[str, CheckConfig]
    sources: Tuple[str, ...] = field(default_factory=tuple)
    warnings: Tuple[str, ...] = field(
        default_factory=tuple
    )  # accepted, but deprecated: how to write it now

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # whatever mapping it was given (validate's dicts, structs.replace with a plain dict), the
        # settings are the typed, read-only section objects generated from SECTIONS
        object.__setattr__(self, "settings", typed_settings(self.settings, SECTIONS))

    def get(self, section: str, key: str) -> Any:
        return self.settings[section][key]

    def check(self, name: str) -> CheckConfig:
        return self.checks[name]


# -- loading ---------------------------------------------------------------------------------


def load_config(
    registry: Registry, path: Optional[str] = None, extra: Optional[Mapping[str, Any]] = None
) -> Config:
    """Read, merge and validate the configuration. `extra` (already parsed) is applied last (CLI flags)."""
    from . import config_cache

    files, _required = config_files(path)
    merged: Dict[str, Any] = {}
    origin: Dict[Tuple[str, ...], str] = {}
    # root's hooks take each file's table from config_cache when it was parsed from the same bytes
    # (no tomllib import nor parse: ~5 ms of every prolog before its check process starts); every
    # file is parsed, and the cache written, before the first merge, which may change the tables
    cached = config_cache.load() if files else {}
    tables: Dict[bytes, Any] = {}
    parsed = []
    for file in files:
        check_secure(file)
        raw = read_bytes(file)
        if raw in tables:  # two files alike: a table of their own each, as parsed before
            data = parse_bytes(file, raw)
        else:
            data = config_cache.parsed(raw, cached, lambda f=file, r=raw: parse_bytes(f, r))
        tables[raw] = data
        parsed.append((file, data))
    if files and (len(tables) != len(cached) or any(raw not in cached for raw in tables)):
        config_cache.store(tables)
    for file, data in parsed:
        _merge(merged, data, origin, file, ())
    if extra:
        _merge(merged, dict(extra), origin, "<command line>", ())
    if isinstance(merged.get("checks"), Mapping):  # a partial registry (check NAME) learns these
        load_checks_for(registry, merged["checks"])
    return validate(registry, merged, origin, tuple(files))


def load_registry_and_config(
    config_path, root=None, live=(), names=None
) -> Tuple[Registry, Config]:
    """Registry and validated config; `root` (--root) must be an existing directory (else ConfigError: exit 3).
    names: only the checks (or families) a verb will run, and those the configuration names
    (registry.load_builtin_checks); None: every check.

    Nothing inside the root's tree (a capture anyone can craft) may be a configuration file or the
    site-checks directory: data never chooses code (hw/replay.py, DESIGN.md principle 19).
    """
    from ..hw.replay import refuse_code_from_tree
    from .plugins import site_checks_dir

    refuse_code_from_tree(root, config_path, site_checks_dir())
    registry = load_builtin_checks(names)
    extra: Dict[str, Any] = {}
    if root:
        if not os.path.isdir(root):
            raise ConfigError(
                "--root %s: no such directory (unpack a capture first: tar xf FILE -C DIR)" % root
            )
        extra["general"] = {"root": os.path.abspath(root)}
    if live:
        extra.setdefault("general", {})["root_live_sources"] = sorted(set(live))
    config = load_config(registry, config_path, extra)
    if not os.path.isdir(config.get("general", "root")):
        raise ConfigError("[general] root = %r: no such directory" % config.get("general", "root"))
    refuse_code_from_tree(config.get("general", "root"), config_path, site_checks_dir())
    return registry, config


SALVAGED_SECTIONS = ("general", "paths", "metrics", "deadline")


def salvage_settings(path: Optional[str] = None) -> Settings:
    """Settings for a hook that fails open on a refused configuration: the defaults, overridden by
    each value of [general], [paths], [metrics] and [deadline] that is valid on its own, so the
    CRITICAL line and the metric land where the admin looks. Files that fail the ownership rules
    are skipped (their log_file must not steer root's writes). Never raises."""
    settings = {
        section: {key: setting.default for key, setting in schema.items()}
        for section, schema in SECTIONS.items()
    }
    try:
        files, _required = config_files(path)
    except Exception:  # noqa: BLE001  (anything: this is the last resort)
        return typed_settings(settings, SECTIONS)
    for file in files:
        try:
            check_secure(file)
            data = parse_toml(file)
        except Exception:  # noqa: BLE001
            continue
        for section in SALVAGED_SECTIONS:
            table = data.get(section)
            if not isinstance(table, Mapping):
                continue
            for key, value in table.items():
                try:
                    valid = _validate_settings(
                        section, {key: value}, SECTIONS[section], lambda *_k, f=file: f
                    )
                except Exception:  # noqa: BLE001  (an invalid value keeps its default)
                    continue
                settings[section][key] = valid[key]
    return typed_settings(settings, SECTIONS)


def _merge(
    into: Dict[str, Any],
    new: Mapping[str, Any],
    origin: Dict[Tuple[str, ...], str],
    file: str,
    prefix: Tuple[str, ...],
) -> None:
    for key, value in new.items():
        keypath = prefix + (key,)
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value, origin, file, keypath)
            continue
        into[key] = dict(value) if isinstance(value, Mapping) else value
        origin[keypath] = file
        if isinstance(value, Mapping):
            _mark_origin(value, origin, file, keypath)


def _mark_origin(
    table: Mapping[str, Any], origin: Dict[Tuple[str, ...], str], file: str, prefix: Tuple[str, ...]
) -> None:
    for key, value in table.items():
        origin[prefix + (key,)] = file
        if isinstance(value, Mapping):
            _mark_origin(value, origin, file, prefix + (key,))


# -- validation ------------------------------------------------------------------------------


def validate(
    registry: Registry,
    data: Mapping[str, Any],
    origin: Optional[Dict[Tuple[str, ...], str]] = None,
    sources: Tuple[str, ...] = (),
) -> Config:
    """Every value checked before anything runs: type, range, finiteness, structure, and the settings
    that must agree with each other. Errors name the file, section and key (ConfigError)."""
    origin = origin or {}

    def where(*keypath: str) -> str:
        return origin.get(tuple(keypath), origin.get(tuple(keypath[:1]), "<config>"))

    known = list(SECTIONS) + ["checks"]
    for section in data:
        if section not in known:
            raise ConfigError(
                "%s: unknown section [%s]%s" % (where(section), section, _hint(section, known))
            )
    settings = {}
    for section, schema in SECTIONS.items():
        table = data.get(section, {})
        if not isinstance(table, Mapping):
            raise ConfigError("%s: [%s] must be a table" % (where(section), section))
        settings[section] = _validate_settings(section, table, schema, where)
    _validate_drain_reasons(settings["drain"], where)
    if settings["fleet"]["k"] > settings["fleet"]["m"]:
        raise ConfigError(
            "%s: [fleet] k = %d is more than m = %d: no node could ever be a suspect"
            % (where("fleet", "k"), settings["fleet"]["k"], settings["fleet"]["m"])
        )
    if settings["fleet"]["drain"] and settings["fleet"]["drain_min_users"] > settings["fleet"]["m"]:
        raise ConfigError(
            "%s: [fleet] drain_min_users = %d is more than m = %d with drain = true: no suspect "
            "could ever be drained (its evidence is at most m jobs)"
            % (
                where("fleet", "drain_min_users"),
                settings["fleet"]["drain_min_users"],
                settings["fleet"]["m"],
            )
        )
    checks_table = data.get("checks", {})
    if not isinstance(checks_table, Mapping):
        raise ConfigError(
            "%s: 'checks' must be a table of [checks.\"<name>\"] tables" % where("checks")
        )
    for name in checks_table:
        if name not in registry.checks:
            raise ConfigError(
                '%s: [checks."%s"]: no such check%s (see `slurm-hooks list`)'
                % (where("checks", name), name, _hint(name, registry.checks))
            )
    checks = {}
    warnings: List[str] = _fleet_warnings(settings["fleet"], where)
    warnings += _drain_budget_warnings(settings, where)
    for name, spec in registry.checks.items():
        table = checks_table.get(name, {})
        if not isinstance(table, Mapping):
            raise ConfigError('%s: [checks."%s"] must be a table' % (where("checks", name), name))
        checks[name] = _validate_check(
            spec, table, lambda key, n=name: where("checks", n, key), warnings
        )
    return Config(settings=settings, checks=checks, sources=sources, warnings=tuple(warnings))


# What Slurm gives a hook before it kills it: HealthCheckProgram 60 s (fixed in slurmd); the prolog and
# epilog PrologEpilogTimeout, a slurm.conf value we do not read here: 60 s is what docs/slurm.md advises.
HOOK_TIME_LIMIT_S = {"prolog": 60.0, "epilog": 60.0, "health": 60.0}
CHECK_PROCESS_GRACE_S = 1.0  # hooks/bounded.py ISOLATION_GRACE_S: the forked check process's margin


def _drain_budget_warnings(settings: Mapping[str, Any], where) -> List[str]:
    """A hook that drains spends its [deadline] on the checks and then up to the Slurm budget
    ([drain] timeout x attempts, backoff and breaker wait) on slurmctld. When the two together pass
    what Slurm allows the hook, slurmd kills it in the middle of the drain: the broken node stays in
    service (and Slurm may drain it as "Prolog error" instead). A warning, not an error: an error
    makes every hook fail open (no checks at all), and the prolog/epilog limit is slurm.conf's
    PrologEpilogTimeout, which a site may have raised."""
    from ..slurm.budget import slurm_budget  # not drainer: the happy path loads no Slurm client

    budget = slurm_budget(settings)
    out = []
    for context, limit in HOOK_TIME_LIMIT_S.items():
        deadline = settings["deadline"][context]
        if deadline + CHECK_PROCESS_GRACE_S + budget > limit:
            killer = (
                "slurmd kills HealthCheckProgram at %g s" % limit
                if context == "health"
                else "more than the %g s PrologEpilogTimeout docs/slurm.md advises" % limit
            )
            out.append(
                "%s: [drain] timeout = %g s x attempts = %d (a %.1f s Slurm budget with "
                "backoff and breaker wait) after [deadline] %s = %g s (%s): a drain from the %s "
                "can take %.1f s, %s; lower [drain] timeout or attempts, or [deadline] %s"
                % (
                    ", ".join(
                        sorted(
                            {
                                where("drain", "timeout"),
                                where("drain", "attempts"),
                                where("deadline", context),
                            }
                        )
                    ),
                    settings["drain"]["timeout"],
                    settings["drain"]["attempts"],
                    budget,
                    context,
                    deadline,
                    where("deadline", context),
                    context,
                    deadline + CHECK_PROCESS_GRACE_S + budget,
                    killer,
                    context,
                )
            )
    return out


def _fleet_warnings(fleet: Mapping[str, Any], where) -> List[str]:
    """Settings the drain accepts that let too little evidence drain a node ([fleet] drain = true):
    each is legal (a test cluster may want it), none is what a production cluster wants."""
    if not fleet["drain"]:
        return []
    out = []
    if fleet["k"] < 2:
        out.append(
            "%s: [fleet] k = %d with drain = true: one slow job drains a node (a checkpoint on a "
            "slow disk, one user's idle GPUs); 3 is the default" % (where("fleet", "k"), fleet["k"])
        )
    if "foreign_cpu_frac" not in fleet["report_only"]:
        out.append(
            "%s: [fleet] report_only does not name foreign_cpu_frac with drain = true: anyone's "
            "process outside Slurm's cgroups (an ssh login) moves it, so a user could drain a "
            "node with it; keep it in the list unless every login lands in a job (pam_slurm_adopt)"
            % where("fleet", "report_only")
        )
    if fleet["drain_min_users"] < 2:
        out.append(
            "%s: [fleet] drain_min_users = %d with drain = true: one user's jobs can drain a node "
            "on purpose; 2 is the default"
            % (where("fleet", "drain_min_users"), fleet["drain_min_users"])
        )
    return out


def _validate_settings(
    section: str, table: Mapping[str, Any], schema: Mapping[str, Setting], where
) -> Dict[str, Any]:
    values = {key: setting.default for key, setting in schema.items()}
    for key, value in table.items():
        if key not in schema:
            raise ConfigError(
                "%s: [%s] unknown key %r%s"
                % (where(section, key), section, key, _hint(key, schema))
            )
        setting = schema[key]
        label = "%s: [%s] %s" % (where(section, key), section, key)
        value = coerce(
            value, setting.type, str if setting.type is list else None, setting.choices, label
        )
        _check_range(value, setting, label)
        problem = setting.check(value) if setting.check is not None else None
        if problem:
            raise ConfigError(
                "%s: %r %s" % (label, value, problem)
                if not problem.startswith("'")
                else "%s: %s" % (label, problem)
            )
        values[key] = value
    return values


def _check_range(value: Any, limits: Any, label: str) -> None:
    """minimum/maximum (inclusive) and above (exclusive) of a Setting or Param, for numbers."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    lo, hi, above = (
        getattr(limits, "minimum", None),
        getattr(limits, "maximum", None),
        getattr(limits, "above", None),
    )
    bad = (
        (lo is not None and value < lo)
        or (hi is not None and value > hi)
        or (above is not None and value <= above)
    )
    if bad:
        parts = (
            (["> %g" % above] if above is not None else [])
            + (["at least %g" % lo] if lo is not None else [])
            + (["at most %g" % hi] if hi is not None else [])
        )
        raise ConfigError(
            "%s: %r is out of range: must be %s" % (label, value, " and ".join(parts))
        )


def _validate_drain_reasons(drain: Mapping[str, Any], where) -> None:
    """A prefix the reason cleaner would change, or a length that cuts into it, makes our own drains
    unrecognisable (never resumed, not counted by the breaker): refuse them here, not at drain time.
    The defaults pass (tests/test_framework.py checks them with check_drain_reasons): a configuration
    that keeps them is not checked again in every hook (its patterns: ~0.6 ms before the check
    process's fork, round 8)."""
    defaults = SECTIONS["drain"]
    if (
        drain["reason_prefix"] == defaults["reason_prefix"].default
        and drain["max_reason_length"] == defaults["max_reason_length"].default
    ):
        return
    check_drain_reasons(drain, where)


def check_drain_reasons(drain: Mapping[str, Any], where) -> None:
    """_validate_drain_reasons, whatever the values."""
    from ..result import Action, Result, Status
    from ..slurm import reasons as policy  # policy.py re-exports these; reasons.py alone is lighter

    prefix = drain["reason_prefix"]
    label = "%s: [drain] reason_prefix" % where("drain", "reason_prefix")
    if not prefix.strip():
        raise ConfigError("%s: must not be empty (our drains are recognised by it)" % label)
    cleaned = policy.sanitize(prefix)
    if cleaned != prefix.strip():
        raise ConfigError(
            "%s: %r would reach Slurm as %r (drain reasons are cleaned: letters, digits, spaces and "
            ".,:;_=+/@%%()[]<>#|- only, no quotes, single spaces): our drains would not be recognised; "
            "use %r" % (label, prefix, cleaned, cleaned)
        )
    length = drain["max_reason_length"]
    probe = Result(
        "topology.gpu-nvme",
        Status.FAIL,
        "x" * 600,
        component="gpu:7 0000:c6:00.0",
        action=Action.RMA,
    )
    reason = policy.format_reason(probe, prefix, length, more=99)
    if not (policy.is_ours(reason, prefix) and probe.check in reason):
        raise ConfigError(
            "%s: [drain] max_reason_length = %d leaves no room after the prefix %r for a check name "
            "(%r): our drains would not be recognised; use at least %d"
            % (
                where("drain", "max_reason_length"),
                length,
                prefix.strip(),
                reason,
                len(prefix.strip()) + 40,
            )
        )


def _validate_check(
    spec: CheckSpec, table: Mapping[str, Any], where, warnings: Optional[List[str]] = None
) -> CheckConfig:
    enabled = spec.enabled_by_default
    params = spec.default_params()
    for key, value in table.items():
        label = '%s: [checks."%s"] %s' % (where(key), spec.name, key)
        if key == "enabled":
            enabled = coerce(value, bool, None, None, label)
            continue
        param = spec.param(key)
        if param is None:
            valid = ["enabled"] + [p.name for p in spec.params]
            raise ConfigError(
                "%s: unknown parameter%s; valid: %s" % (label, _hint(key, valid), ", ".join(valid))
            )
        value = coerce_param(value, param, label)
        if isinstance(value, Deprecated):
            if warnings is not None:
                warnings.append("%s: %s" % (label, value.message))
            value = value.value
        params[key] = value
    return CheckConfig(enabled=enabled, params=Params(params))


def coerce_param(value: Any, param: Param, label: str) -> Any:
    """A parameter's value checked against its declaration; a Deprecated wrapper when its converter
    accepted an old form (the caller unwraps it and records the message)."""
    if param.convert is not None:
        try:
            return param.convert(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError("%s: %s" % (label, exc)) from None
    value = coerce(value, param.type, param.item_type, param.choices, label)
    for index, item in enumerate(value) if isinstance(value, list) else ():
        _check_range(item, param, "%s[%d]" % (label, index))  # bounds of a number list: each item
    _check_range(value, param, label)
    if param.validate is not None:
        try:
            param.validate(value)
        except ValueError as exc:
            raise ConfigError("%s: %s" % (label, exc)) from None
    return value


def coerce(
    value: Any,
    expected: type,
    item_type: Optional[type],
    choices: Optional[Sequence[Any]],
    label: str,
) -> Any:
    """Check a TOML value against the declared type; ints are accepted where floats are expected.
    Numbers must be finite (nan and inf are refused) and strings free of NUL characters."""
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    ok = isinstance(value, expected) and not (expected is int and isinstance(value, bool))
    if not ok:
        raise ConfigError(
            "%s: expected %s, got %s %r"
            % (label, _type_name(expected, item_type), type(value).__name__, value)
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError("%s: %r is not a finite number" % (label, value))
    if isinstance(value, str) and "\x00" in value:
        raise ConfigError("%s: contains a NUL character" % label)
    if expected is list and item_type is not None:
        value = [
            coerce(item, item_type, None, None, "%s[%d]" % (label, i))
            for i, item in enumerate(value)
        ]
    for item in (value if expected is list else [value]) if choices else ():
        if item not in choices:
            raise ConfigError(
                "%s: %r is not one of %s" % (label, item, ", ".join(repr(c) for c in choices))
            )
    return value


def _type_name(expected: type, item_type: Optional[type]) -> str:
    names = {
        bool: "a boolean (true/false)",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
    }
    name = names.get(expected, expected.__name__)
    if expected is list and item_type is not None:
        name += " of " + names.get(item_type, item_type.__name__).split(" ", 1)[-1] + "s"
    return name


def _hint(word: str, candidates) -> str:
    import difflib  # only to word an error

    close = difflib.get_close_matches(word, list(candidates), n=1)
    return " (did you mean %r?)" % close[0] if close else ""


# -- rendering -------------------------------------------------------------------------------


def render_toml(config: Config) -> str:
    """The effective configuration as TOML (what `slurm-hooks config check` prints)."""
    lines = [
        "# effective configuration; sources: %s"
        % (", ".join(config.sources) or "built-in defaults")
    ]
    for section, values in config.settings.items():
        lines.append("\n[%s]" % section)
        lines.extend("%s = %s" % (key, _toml_value(value)) for key, value in values.items())
    for name in sorted(config.checks):
        check = config.checks[name]
        lines.append('\n[checks."%s"]' % name)
        lines.append("enabled = %s" % _toml_value(check.enabled))
        lines.extend("%s = %s" % (key, _toml_value(value)) for key, value in check.params.items())
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return '"%s"' % escaped
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        if not value:
            return "{}"
        return (
            "{ "
            + ", ".join("%s = %s" % (_toml_key(k), _toml_value(v)) for k, v in value.items())
            + " }"
        )
    raise TypeError("cannot render %r as TOML" % (value,))


def _toml_key(key: Any) -> str:
    text = str(key)
    return text if re.fullmatch(r"[A-Za-z0-9_-]+", text) else _toml_value(text)


def _limits(setting: Setting) -> str:
    parts = (
        (["> %g" % setting.above] if setting.above is not None else [])
        + (["\u2265 %g" % setting.minimum] if setting.minimum is not None else [])
        + (["\u2264 %g" % setting.maximum] if setting.maximum is not None else [])
    )
    return " (%s)" % ", ".join(parts) if parts else ""


def render_reference(registry: Registry) -> str:
    """Markdown reference of every setting and every check parameter (README's config reference)."""
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for section, schema in SECTIONS.items():
        for key, setting in schema.items():
            kind = (
                _type_name(setting.type, None) + _limits(setting)
                if not setting.choices
                else ("a list of " if setting.type is list else "one of ")
                + ", ".join(setting.choices)
            )
            lines.append(
                "| `[%s] %s` | %s | `%s` | %s |"
                % (section, key, kind, _toml_value(setting.default), setting.help)
            )
    for spec in registry.sorted_checks():
        lines.append("")
        lines.append('### `[checks."%s"]`' % spec.name)
        lines.append("")
        lines.append(
            "%s Contexts: %s; timeout %gs."
            % (spec.description, ", ".join(c for c in CONTEXTS if c in spec.contexts), spec.timeout)
        )
        lines.append("")
        lines.append("| key | type | default | meaning |")
        lines.append("|---|---|---|---|")
        lines.append(
            "| `enabled` | a boolean (true/false) | `%s` | run this check |"
            % _toml_value(spec.enabled_by_default)
        )
        for param in spec.params:
            lines.append(
                "| `%s` | %s | `%s` | %s |"
                % (param.name, param.describe_type(), _toml_value(param.default), param.help)
            )
    return "\n".join(lines) + "\n"
