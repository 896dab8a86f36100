"""A throw-away single-host Slurm cluster for tests: munged + slurmctld + one slurmd.

Written from ../shared/reference/SLURM-NOTES.md (what was seen working on Debian 12 / Slurm 22.05).
Nothing here assumes a Slurm version; ports are picked free, state lives under ``base_dir``.

    c = SlurmCluster(tmp_path, nodes=("node1", "node2"), prolog="/x/prolog.d/*")
    c.start()                       # < 1 s: node1 IDLE (node2.. are defined but have no slurmd)
    subprocess.run(["sinfo"], env=c.env)
    c.stop()

Only the first node gets a slurmd (``slurmd -N node1``).  Extra nodes are defined with
``NodeAddr=127.0.0.1 Port=<port>`` and ``State=DOWN``; on that port a RefusingListener accepts and
closes every connection, so the controller's pings to them fail at once instead of hanging:
they show ``down*`` (``State=DOWN+NOT_RESPONDING`` after the first ping) with ``Reason=Not responding``
(or the configured reason) and can be drained with ``scontrol update NodeName=node2 State=DRAIN Reason=...``
(they then show ``State=DOWN+DRAIN+NOT_RESPONDING``/``drain*``) -- enough to simulate
"other nodes already drained" for circuit-breaker tests.

Many nodes, none with a slurmd (``with_slurmd=False, extra_node_state="IDLE", slurmd_timeout=0``;
SLURM-NOTES "Many nodes on one host"): every node is defined ``State=IDLE``; with ``SlurmdTimeout=0``
slurmctld never marks a non-responding node DOWN, so after its first failed ping each shows
``IDLE+NOT_RESPONDING`` (``idle*``) and stays so; they take DRAIN/RESUME like real nodes.  This is the
cluster for concurrency tests of the drain library (20+ nodes draining themselves at once).

Needs root (slurmd, mknod) and the Debian packages (``.ci/install-slurm.sh``).  When Slurm is missing
:func:`require_slurm` skips the test, or fails when ``CI=true``.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import pytest

SBIN_DIRS = ("/usr/sbin", "/usr/local/sbin", "/usr/bin", "/usr/local/bin")
DAEMONS = ("slurmctld", "slurmd", "munged")
CLIENTS = ("scontrol", "sinfo", "squeue", "sbatch", "scancel", "munge", "unmunge")
MUNGE_KEY = "/etc/munge/munge.key"
MUNGE_RUN = "/run/munge"
MUNGE_PID_FILE = os.path.join(MUNGE_RUN, "munged.pid")  # munged's default --pid-file
_LIVE: "List[SlurmCluster]" = []  # stopped at interpreter exit if a test run dies half way


class SlurmClusterError(RuntimeError):
    """The cluster could not be started or did not reach the expected state (message carries logs)."""


class SlurmNotInstalled(SlurmClusterError):
    """Slurm/munge binaries are missing or we are not root."""


# ----------------------------------------------------------------------------------------------
# binaries and environment probes


def find_binary(name: str) -> Optional[str]:
    path = shutil.which(name)
    if path:
        return path
    for d in SBIN_DIRS:
        cand = os.path.join(d, name)
        if os.access(cand, os.X_OK):
            return cand
    return None


def missing_requirements() -> List[str]:
    """What prevents a cluster from starting here (empty list: nothing)."""
    missing = [b for b in DAEMONS + CLIENTS if find_binary(b) is None]
    problems = ["missing binaries: " + " ".join(missing)] if missing else []
    if os.geteuid() != 0:
        problems.append("not root (slurmd and mknod need root)")
    return problems


def require_slurm() -> None:
    """Skip (or, with CI=true, fail) when a real cluster cannot run on this machine."""
    problems = missing_requirements()
    if not problems:
        return
    msg = "real Slurm unavailable: " + "; ".join(problems) + " (run .ci/install-slurm.sh)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        raise SlurmNotInstalled(msg + " -- CI=true, so this is an error, not a skip")
    pytest.skip(msg)


DRAIN_BACKEND_ENV = "SLURM_HOOKS_TEST_DRAIN_BACKEND"
DRAIN_BACKENDS = ("auto", "scontrol", "pyslurm")


def drain_backend_under_test() -> Optional[str]:
    """The ``[drain] backend`` the end-to-end rigs configure: $SLURM_HOOKS_TEST_DRAIN_BACKEND (auto,
    scontrol or pyslurm), or None (unset/empty) for the config's default. .ci/slurm-root.sh runs the
    end-to-end modules once per backend on Slurm 25.11, where the real pyslurm is installed."""
    value = os.environ.get(DRAIN_BACKEND_ENV, "").strip()
    if not value:
        return None
    if value not in DRAIN_BACKENDS:
        raise ValueError(
            "%s=%r: expected one of %s" % (DRAIN_BACKEND_ENV, value, ", ".join(DRAIN_BACKENDS))
        )
    return value


def unreachable_slurm_cost(
    timeout: float, attempts: int, backoff: float = 0.5, message_timeout: float = 10.0
) -> Tuple[float, int]:
    """(seconds, requests) a drain spends on a slurmctld that never answers, with the [drain] backend
    under test (auto: pyslurm where one is installed and MessageTimeout fits the budget). scontrol: each call is killed at `timeout`, `attempts` calls with backoff in between.
    pyslurm: a request cannot be cut short before slurm.conf's MessageTimeout, and a retry starts only
    if it can end near the same deadline (timeout x attempts + backoff) -- slurm_hooks.slurm.client._Retry."""
    deadline = timeout * attempts + backoff * (2 ** (attempts - 1) - 1)
    backend = drain_backend_under_test() or "auto"
    if (
        backend == "auto"
    ):  # slurm_hooks.slurm.client.choose_backend; CI installs pyslurm only where it matches Slurm
        from slurm_hooks.slurm.client import pyslurm_version

        backend = (
            "pyslurm"
            if pyslurm_version() is not None and message_timeout <= deadline
            else "scontrol"
        )
    if backend == "scontrol":
        return deadline, attempts
    spent, made = message_timeout, 1
    while made < attempts:
        spent += max(0.0, min(backoff * 2 ** (made - 1), deadline - spent))
        if deadline - spent < 0.9 * message_timeout:
            break
        spent, made = spent + message_timeout, made + 1
    return spent, made


# Seen on the test clusters (AccountingStorageType=accounting_storage/none): RESUME leaves the drain
# Reason on the now-IDLE node on 24.11 and 25.11 (src/interfaces/accounting_storage.c returns before
# clearing it without accounting) until its next job; 22.05 and 26.05 clear it.
RESUME_KEEPS_REASON = {(22, 5): False, (24, 11): True, (25, 11): True, (26, 5): False}


_HW_CACHE: Dict[str, str] = {}


def node_hardware() -> Dict[str, str]:
    """CPUs/Boards/SocketsPerBoard/CoresPerSocket/ThreadsPerCore from ``slurmd -C`` (cached)."""
    if not _HW_CACHE:
        out = subprocess.run(
            [find_binary("slurmd") or "slurmd", "-C"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        first = out.splitlines()[0] if out else ""
        for key in ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore"):
            m = re.search(r"\b%s=(\d+)" % key, first)
            if m:
                _HW_CACHE[key] = m.group(1)
        if "CPUs" not in _HW_CACHE:
            raise SlurmClusterError("cannot parse `slurmd -C`: %r" % out)
    return dict(_HW_CACHE)


def free_ports(n: int) -> List[int]:
    """n distinct TCP ports that were free a moment ago (kept bound together so they differ)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


class RefusingListener:
    """Accepts and immediately closes TCP connections on a port (the slurmd-less nodes' Port=).

    With a plainly closed port, Slurm's connect retries on ECONNREFUSED for ~MessageTimeout, and
    that hung ping delays slurmctld's other pings (a RESUME then shows idle* for ~4 s instead of ~1 s,
    and shutdown waits for "hung communications").  An accept-and-close peer fails the ping at once.
    """

    def __init__(self, port: int) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(16)
        self.thread = threading.Thread(
            target=self._serve, name="slurm-dead-node-%d" % port, daemon=True
        )
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.close()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


# ----------------------------------------------------------------------------------------------
# munge


def munge_ok() -> bool:
    try:
        cred = subprocess.run(
            [find_binary("munge") or "munge", "-n"], capture_output=True, timeout=5
        )
        if cred.returncode != 0:
            return False
        dec = subprocess.run(
            [find_binary("unmunge") or "unmunge"], input=cred.stdout, capture_output=True, timeout=5
        )
        return dec.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def ensure_munge(timeout: float = 10.0) -> bool:
    """Start munged (as the munge user) unless a working one is running. True if we started it; its
    pid then goes to STARTED_MUNGED, for the session to stop it at its end (MungedKeeper).

    The xdist workers' first clusters start at the same moment: each found no munged, and each
    started one with --force, which takes the socket over, so one run left three munged behind,
    two on unlinked sockets. The check and the start are done under a flock on MUNGE_RUN (the
    directory: no lock file left behind), so the workers after the first find its munged."""
    if munge_ok():
        return False
    from slurm_hooks.core.locks import locked

    with locked(MUNGE_RUN, 3 * timeout, create_dir_mode=0o755, directory=True):
        if munge_ok():  # another worker, or another suite, started it while this one waited
            return False
        _start_munged(timeout)
    pid = munged_pid()  # its pid file is written before the daemon's parent returns
    if pid is not None:
        STARTED_MUNGED.append(pid)
    return True


def _start_munged(timeout: float) -> None:
    """Key and run directory as munged wants them, then munged as the munge user, until it answers."""
    import grp
    import pwd

    uid, gid = pwd.getpwnam("munge").pw_uid, grp.getgrnam("munge").gr_gid
    if not os.path.exists(MUNGE_KEY) or os.path.getsize(MUNGE_KEY) == 0:
        os.makedirs(os.path.dirname(MUNGE_KEY), exist_ok=True)
        with open(MUNGE_KEY, "wb") as fh:
            fh.write(os.urandom(1024))
        os.chown(MUNGE_KEY, uid, gid)
        os.chmod(MUNGE_KEY, 0o400)
    os.makedirs(MUNGE_RUN, exist_ok=True)
    os.chown(MUNGE_RUN, uid, gid)
    os.chmod(MUNGE_RUN, 0o755)
    argv = ["runuser", "-u", "munge", "--", find_binary("munged") or "munged"]
    if os.path.exists(os.path.join(MUNGE_RUN, "munge.socket.2")):
        argv.append("--force")  # stale socket from a dead munged
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)  # daemonizes
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if munge_ok():
            return
        time.sleep(0.05)
    raise SlurmClusterError(
        "munged did not come up (rc=%s): %s %s" % (res.returncode, res.stdout, res.stderr)
    )


# The clusters of one session (of all its xdist workers) share one munged: whichever cluster starts
# first starts it, and no cluster stops it, since the others may still need it. The session stops it
# at its end when the suite started it, never a munged that was running before the suite.
STARTED_MUNGED: List[int] = []  # pids of the munged daemons ensure_munge started in this process
MUNGED_STARTED_KEY = "slurm_hooks_munged_started"  # a worker's report in xdist's workeroutput


def munged_pid(pid_file: str = MUNGE_PID_FILE) -> Optional[int]:
    """The pid of the munged that runs now, from its pid file, or None: no file, or the pid is not a
    live munged (a stale file: munged removes it when stopped, not when killed)."""
    try:
        with open(pid_file) as handle:
            pid = int(handle.read().strip())
    except (OSError, ValueError):
        return None
    return pid if pid > 0 and _is_live_munged(pid) else None


def _is_live_munged(pid: int) -> bool:
    """/proc/PID/stat names munged and its state is not Z or X (the host's init may never reap it)."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            stat = handle.read()
    except OSError:
        return False
    head, _, rest = stat.rpartition(")")
    return head.partition("(")[2] == "munged" and rest.split()[:1] not in (["Z"], ["X"])


def munge_to_stop(
    before: Optional[int], started: Iterable[int], now: Optional[int]
) -> Optional[int]:
    """The munged a session stops at its end: the one running now (`now`) when the session's own
    ensure_munge calls started it (`started`, from every worker) and it is not the one that was
    running when the session began (`before`); else None. A munged found running, or one another
    session started meanwhile (a second suite on the same host, which still needs it), is left alone."""
    if now is None or now == before or now not in set(started):
        return None
    return now


def stop_munged(pid: int, timeout: float = 5.0) -> bool:
    """SIGTERM to munged `pid` (it removes its socket and pid file), then wait until it is gone.
    True when it stopped; False when it could not be signalled or is still running at `timeout`."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    deadline = time.monotonic() + timeout
    while _is_live_munged(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class MungedKeeper:
    """pytest plugin (tests/conftest.py registers it) that stops, at the session's end, the munged the
    session's Slurm tests started. Under xdist each worker reports the pids its ensure_munge calls
    started (workeroutput) and the controller, after every worker is done, decides and stops; a
    session without xdist does both itself. What ran before the session is noted when the plugin is
    registered (pytest_configure: before any worker or test exists)."""

    name = "slurm-hooks-munged"

    def __init__(self, config: Any, pid_file: str = MUNGE_PID_FILE) -> None:
        self.pid_file = pid_file
        self.worker = hasattr(config, "workerinput")
        self.before = None if self.worker else munged_pid(pid_file)
        self.reported: List[int] = []

    @pytest.hookimpl(optionalhook=True)  # an xdist hook: the controller hears each worker end
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        self.reported.extend(getattr(node, "workeroutput", {}).get(MUNGED_STARTED_KEY, ()))

    # trylast: after the teardown of the session's last fixtures, whose clusters may still use it
    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: Any) -> None:
        if self.worker:
            session.config.workeroutput[MUNGED_STARTED_KEY] = list(STARTED_MUNGED)
            return
        now = munged_pid(self.pid_file)
        pid = munge_to_stop(self.before, self.reported + STARTED_MUNGED, now)
        if pid is not None and not stop_munged(pid):
            sys.stderr.write(
                "slurm-hooks tests: could not stop munged %d, which they started\n" % pid
            )


# ----------------------------------------------------------------------------------------------
# the cluster


class SlurmCluster:
    """One slurmctld + one slurmd (first node) on localhost, everything under ``base_dir``.

    prolog / epilog: a script path or a glob (``/dir/prolog.d/*``; Slurm runs a glob's scripts in
    reverse alphabetical order).  health_check: HealthCheckProgram path.  extra_conf: appended
    verbatim to slurm.conf (later keys override earlier ones).
    """

    def __init__(
        self,
        base_dir: Union[str, Path],
        nodes: Sequence[str] = ("node1",),
        ngpu: int = 8,
        prolog: Optional[str] = None,
        epilog: Optional[str] = None,
        extra_conf: str = "",
        health_check: Optional[str] = None,
        health_check_interval: int = 0,
        message_timeout: int = 10,
        prolog_epilog_timeout: int = 60,
        extra_node_state: str = "DOWN",
        prolog_flags: str = "Alloc,Contain",
        startup_timeout: float = 15.0,
        with_slurmd: bool = True,
        slurmd_timeout: int = 30,
        return_to_service: int = 2,
    ) -> None:
        if not nodes:
            raise ValueError("need at least one node")
        self.base = Path(base_dir).resolve()
        self.nodes = tuple(nodes)
        self.node = self.nodes[0]
        self.ngpu = ngpu
        self.prolog, self.epilog = prolog, epilog
        self.extra_conf = extra_conf
        self.health_check, self.health_check_interval = health_check, health_check_interval
        self.message_timeout = message_timeout
        self.prolog_epilog_timeout = prolog_epilog_timeout
        self.extra_node_state = extra_node_state
        self.prolog_flags = prolog_flags  # unknown flags are fatal (22.05: Alloc Contain DeferBatch NoHold Serial X11)
        self.startup_timeout = startup_timeout
        self.with_slurmd = with_slurmd
        self.slurmd_timeout = slurmd_timeout  # 0: slurmctld never marks a silent node DOWN
        # 2 (the default here): any DOWN node returns at its next registration, so a restarted
        # slurmd is back at once; 1: only a node DOWN for "Not responding" does (node_mgr.c
        # validate_node_specs), so a DOWN an admin or a reboot's nextstate=DOWN set holds
        self.return_to_service = return_to_service
        self.ctld_port, self.slurmd_port, self.dead_port = free_ports(3)
        self.etc, self.log, self.run_dir = self.base / "etc", self.base / "log", self.base / "run"
        self.state_dir, self.dev, self.out = (
            self.base / "state",
            self.base / "dev",
            self.base / "out",
        )
        self.spool = self._spool_dir()
        self.conf = self.etc / "slurm.conf"
        self.ctld: Optional[subprocess.Popen] = None
        self.slurmd: Optional[subprocess.Popen] = None
        self.ctld_stopped = False  # SIGSTOPped
        self.dead_listener: Optional[RefusingListener] = None
        self.started_munge = False
        self.start_seconds: Optional[float] = None
        self.env: Dict[str, str] = dict(os.environ)
        self.env.update(SLURM_CONF=str(self.conf), SLURM_TIME_FORMAT="standard")
        for k in list(self.env):  # a test run inside a Slurm job must not leak into our cluster
            if k.startswith(
                ("SLURM_JOB", "SLURM_STEP", "SBATCH_", "SQUEUE_", "SINFO_", "SCONTROL_")
            ):
                del self.env[k]

    # -- layout / config -------------------------------------------------------------------

    def _spool_dir(self) -> Path:
        spool = self.base / "spool"
        # slurmstepd puts unix sockets named like node1_123.4294967292 there: sun_path is 108 bytes
        if len(str(spool)) > 70:
            spool = Path(tempfile.mkdtemp(prefix="slurm-spool-"))
        return spool

    def slurm_conf_text(self) -> str:
        hw = node_hardware()
        lines = [
            "ClusterName=hookstest",
            "SlurmctldHost=localhost",
            "SlurmUser=root",
            "SlurmdUser=root",
            "SlurmctldPort=%d" % self.ctld_port,
            "SlurmdPort=%d" % self.slurmd_port,
            "AuthType=auth/munge",
            "CredType=cred/munge",
            "StateSaveLocation=%s" % self.state_dir,
            "SlurmdSpoolDir=%s" % self.spool,
            "SlurmctldPidFile=%s" % (self.run_dir / "slurmctld.pid"),
            "SlurmdPidFile=%s" % (self.run_dir / "slurmd.pid"),
            "SlurmctldLogFile=%s" % (self.log / "slurmctld.log"),
            "SlurmdLogFile=%s" % (self.log / "slurmd.log"),
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "MailProg=/bin/true",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=bf_interval=1",
            "MpiDefault=none",
            "ReturnToService=%d" % self.return_to_service,
            "SlurmctldTimeout=30",
            "SlurmdTimeout=%d" % self.slurmd_timeout,
            "MessageTimeout=%d" % self.message_timeout,
            "InactiveLimit=0",
            "MinJobAge=300",
            "KillWait=5",
            "Waittime=0",
            "PrologFlags=%s" % self.prolog_flags,
            "PrologEpilogTimeout=%d" % self.prolog_epilog_timeout,
        ]
        if self.prolog:
            lines.append("Prolog=%s" % self.prolog)
        if self.epilog:
            lines.append("Epilog=%s" % self.epilog)
        if self.health_check:
            lines += [
                "HealthCheckProgram=%s" % self.health_check,
                "HealthCheckInterval=%d" % self.health_check_interval,
            ]
        gres = ""
        if self.ngpu and self.with_slurmd:
            lines.append("GresTypes=gpu")
            gres = " Gres=gpu:%d" % self.ngpu
        topo = " ".join(
            "%s=%s" % (k, hw[k])
            for k in ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore")
            if k in hw
        )
        if self.with_slurmd:
            lines.append(
                "NodeName=%s NodeAddr=127.0.0.1 NodeHostname=localhost %s RealMemory=1024%s State=UNKNOWN"
                % (self.node, topo, gres)
            )
        for extra in self.nodes[1 if self.with_slurmd else 0 :]:
            lines.append(
                "NodeName=%s NodeAddr=127.0.0.1 NodeHostname=localhost Port=%d CPUs=1 RealMemory=1024 "
                "State=%s" % (extra, self.dead_port, self.extra_node_state)
            )
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        if self.extra_conf:
            lines.append(self.extra_conf.strip())
        return "\n".join(lines) + "\n"

    def _write_config(self) -> None:
        for d in (self.state_dir, self.spool):
            shutil.rmtree(d, ignore_errors=True)  # fresh state: drains survive restarts otherwise
        for d in (self.etc, self.log, self.run_dir, self.state_dir, self.spool, self.dev, self.out):
            d.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(self.slurm_conf_text())
        gres_conf = self.etc / "gres.conf"
        if self.ngpu and self.with_slurmd:
            for i in range(self.ngpu):
                dev = self.dev / ("fakegpu%d" % i)
                if not dev.exists():  # gres File= must be a character device (c 195 N like nvidiaN)
                    os.mknod(str(dev), 0o666 | 0o020000, os.makedev(195, i))
            gres_conf.write_text(
                "NodeName=%s Name=gpu File=%s/fakegpu[0-%d]\n"
                % (self.node, self.dev, self.ngpu - 1)
            )
        elif gres_conf.exists():
            gres_conf.unlink()

    def write_script(self, path: Union[str, Path], body: str, mode: int = 0o755) -> Path:
        """Write an executable script (e.g. into a prolog.d/ directory)."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(body)
        p.chmod(mode)
        return p

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> "SlurmCluster":
        problems = missing_requirements()
        if problems:
            raise SlurmNotInstalled("; ".join(problems))
        t0 = time.monotonic()
        self.started_munge = ensure_munge()
        self._write_config()
        _LIVE.append(self)
        try:
            if len(self.nodes) > 1 or not self.with_slurmd:
                self.dead_listener = RefusingListener(self.dead_port)
            self._start_ctld()
            if self.with_slurmd:
                self.slurmd = self._spawn("slurmd", ["-D", "-N", self.node])
                self.wait_state(self.node, "IDLE", timeout=self.startup_timeout)
            else:
                self.wait_ping(timeout=self.startup_timeout)
        except Exception as exc:
            logs = self.logs()
            self.stop()
            sys.stderr.write(logs)
            raise SlurmClusterError(
                "Slurm test cluster failed to start: %s\n%s" % (exc, logs)
            ) from exc
        self.start_seconds = time.monotonic() - t0
        return self

    def _spawn(self, daemon: str, args: List[str]) -> subprocess.Popen:
        out = open(self.log / ("%s.stdout" % daemon), "ab")
        try:
            return subprocess.Popen(
                [find_binary(daemon) or daemon] + args,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=str(self.base),
            )
        finally:
            out.close()

    def _start_ctld(self) -> None:
        # -D: foreground, so we own the pid; -i: ignore unreadable state files
        self.ctld = self._spawn("slurmctld", ["-D", "-i"])
        self.ctld_stopped = False
        deadline = time.monotonic() + self.startup_timeout
        while not port_open(
            self.ctld_port
        ):  # poll the port, not `scontrol ping` (blocks ~10 s if down)
            if self.ctld.poll() is not None:
                raise SlurmClusterError("slurmctld exited with rc=%s" % self.ctld.returncode)
            if time.monotonic() > deadline:
                raise SlurmClusterError("slurmctld did not listen on port %d" % self.ctld_port)
            time.sleep(0.01)

    def stop(self) -> None:
        """Cancel jobs, then stop slurmd and slurmctld by pid. munged is left running: the session's
        other clusters share it, and the session stops it at its end if it started it (MungedKeeper)."""
        if self.ctld is not None and self.ctld.poll() is None:
            self.sigcont_ctld()
            self._cancel_all_jobs()
        # slurmctld saves its state at once, then may wait up to MessageTimeout for "hung
        # communications": nothing to keep here, so 1 s grace before SIGKILL.
        _terminate(self.ctld, timeout=1.0)
        _terminate(self.slurmd)
        if self.dead_listener is not None:
            self.dead_listener.close()
            self.dead_listener = None
        self.slurmd = self.ctld = None
        if self in _LIVE:
            _LIVE.remove(self)
        if not str(self.spool).startswith(str(self.base)):
            shutil.rmtree(self.spool, ignore_errors=True)

    def _cancel_all_jobs(self, timeout: float = 5.0) -> None:
        try:
            ids = self.run("squeue", "-h", "-o", "%i", timeout=timeout).split()
            if not ids:
                return
            self.run("scancel", *ids, timeout=timeout, check=False)
            deadline = time.monotonic() + timeout
            while (
                time.monotonic() < deadline
                and self.run("squeue", "-h", "-t", "R,CG", "-o", "%i", timeout=timeout).strip()
            ):
                time.sleep(0.1)
        except (SlurmClusterError, subprocess.TimeoutExpired, OSError):
            pass

    def stop_ctld(self) -> None:
        self.sigcont_ctld()
        _terminate(self.ctld)

    def start_ctld(self, timeout: float = 15.0) -> None:
        """Start slurmctld (state is kept) and wait until node1's slurmd has re-registered.

        A restarted slurmctld shows the node as UNKNOWN (+DRAIN if drained) for ~4 s and keeps
        NOT_RESPONDING until its next ping (~15 s with SlurmdTimeout=30); SIGHUP makes slurmd
        re-register at once (~0.1 s).
        """
        if self.ctld is not None and self.ctld.poll() is None:
            return
        self._start_ctld()
        self.wait_ping()
        if self.slurmd is not None and self.slurmd.poll() is None:
            os.kill(self.slurmd.pid, signal.SIGHUP)
            self.wait_state(self.node, node_registered, timeout=timeout)

    def restart_ctld(self) -> None:
        self.stop_ctld()
        self.start_ctld()

    def sigstop_ctld(self) -> None:
        if self.ctld is not None and self.ctld.poll() is None:
            os.kill(self.ctld.pid, signal.SIGSTOP)
            self.ctld_stopped = True

    def sigcont_ctld(self) -> None:
        if self.ctld is not None and self.ctld.poll() is None and self.ctld_stopped:
            os.kill(self.ctld.pid, signal.SIGCONT)
        self.ctld_stopped = False

    def __enter__(self) -> "SlurmCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- commands ------------------------------------------------------------------------------

    def run(self, cmd: str, *args: str, timeout: float = 15.0, check: bool = True) -> str:
        """Run a Slurm client against this cluster; returns stdout, raises SlurmClusterError if check."""
        argv = [find_binary(cmd) or cmd] + [str(a) for a in args]
        res = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise SlurmClusterError(
                "%s -> rc=%d: %s" % (" ".join(argv), res.returncode, res.stderr.strip())
            )
        return res.stdout

    def scontrol(self, *args: str, timeout: float = 15.0, check: bool = True) -> str:
        return self.run("scontrol", *args, timeout=timeout, check=check)

    def wait_ping(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while "UP" not in self.scontrol("ping", check=False, timeout=timeout):
            if time.monotonic() > deadline:
                raise SlurmClusterError("slurmctld not answering ping")
            time.sleep(0.05)

    def slurm_version(self) -> Tuple[int, int]:
        """(major, minor) of the Slurm clients, e.g. (25, 11), from ``sinfo --version``."""
        m = re.search(r"(\d+)\.(\d+)", self.run("sinfo", "--version"))
        if not m:
            raise SlurmClusterError("cannot read the Slurm version")
        return int(m.group(1)), int(m.group(2))

    def reasons_after_resume(self, reason: Optional[str]) -> set:
        """The Reason (without '[user@time]') a drained node may show once resumed, before its next job:
        per RESUME_KEEPS_REASON; either on a version not listed there."""
        keeps = RESUME_KEEPS_REASON.get(self.slurm_version())
        return {reason, None} if keeps is None else ({reason} if keeps else {None})

    def show_node_line(self, node: Optional[str] = None) -> str:
        return self.scontrol("show", "node", "-o", node or self.node).strip()

    def node_state(self, node: Optional[str] = None) -> str:
        """The raw State= value of `scontrol show node -o`, e.g. 'IDLE+DRAIN'."""
        m = re.search(r"\bState=(\S+)", self.show_node_line(node))
        return m.group(1) if m else ""

    def node_reason(self, node: Optional[str] = None) -> Optional[str]:
        """Reason= including Slurm's trailing '[user@time]', or None."""
        m = re.search(r"\bReason=(.*)$", self.show_node_line(node))
        return m.group(1).strip() if m else None

    def sinfo_state(self, node: Optional[str] = None) -> str:
        """sinfo's long state (%T) for one node, e.g. 'idle', 'drained', 'draining', 'down'."""
        out = self.run("sinfo", "-h", "-N", "-n", node or self.node, "-o", "%T")
        return out.split()[0] if out.split() else ""

    def wait_state(
        self,
        node: Optional[str],
        want: Union[str, Callable[[str], bool]],
        timeout: float = 10.0,
        interval: float = 0.02,
    ) -> str:
        """Wait until the node's scontrol State= matches; returns it.

        want: 'IDLE' (exact, so 'IDLE+NOT_RESPONDING' does not match), 'IDLE+DRAIN', or a
        predicate over the State= string (e.g. ``lambda s: "DRAIN" in s.split("+")``).
        """
        pred = want if callable(want) else (lambda s: s.upper() == want.upper())
        deadline = time.monotonic() + timeout
        state = ""
        while True:
            try:
                state = self.node_state(node)
            except SlurmClusterError:
                state = ""
            if pred(state):
                return state
            if time.monotonic() > deadline:
                raise SlurmClusterError(
                    "node %s: state %r did not reach %r within %.1fs"
                    % (node or self.node, state, want, timeout)
                )
            time.sleep(interval)

    def sbatch(
        self, *args: str, wrap: Optional[str] = "true", gpus: int = 0, output: Optional[str] = None
    ) -> int:
        """Submit a batch job; returns the job id. args are extra sbatch options."""
        argv = [
            "--parsable",
            "-N",
            "1",
            "-w",
            self.node,
            "-o",
            output or str(self.out / "job-%j.out"),
        ]
        if gpus:
            argv.append("--gres=gpu:%d" % gpus)
        argv += list(args)
        if wrap is not None:
            argv += ["--wrap", wrap]
        return int(self.run("sbatch", *argv).strip().split(";")[0])

    def job_state(self, jobid: int) -> str:
        """JobState= from `scontrol show job -o` (works after the job ended, MinJobAge=300)."""
        out = self.scontrol("show", "job", "-o", str(jobid))
        m = re.search(r"\bJobState=(\S+)", out)
        return m.group(1) if m else ""

    def job_field(self, jobid: int, key: str) -> str:
        out = self.scontrol("show", "job", "-o", str(jobid))
        m = re.search(r"(?:^|\s)%s=(\S*)" % re.escape(key), out)
        return m.group(1) if m else ""

    def wait_job(
        self,
        jobid: int,
        states: Iterable[str] = ("COMPLETED", "FAILED", "CANCELLED", "PENDING"),
        timeout: float = 20.0,
        settle: Optional[Callable[[int], bool]] = None,
    ) -> str:
        """Wait until the job is in one of states (PENDING counts only after it was not PENDING)."""
        want = {s.upper() for s in states}
        deadline = time.monotonic() + timeout
        seen_other = False
        while True:
            st = self.job_state(jobid)
            if st != "PENDING":
                seen_other = True
            if st in want and (st != "PENDING" or seen_other) and (settle is None or settle(jobid)):
                return st
            if time.monotonic() > deadline:
                raise SlurmClusterError(
                    "job %s: state %r not in %s after %.1fs\n%s"
                    % (jobid, st, sorted(want), timeout, self.logs(15))
                )
            time.sleep(0.05)

    def resume_all(self) -> None:
        """Best effort: RESUME every drained/down node with a slurmd back to service (test cleanup)."""
        self.scontrol("update", "NodeName=%s" % self.node, "State=RESUME", check=False)

    def logs(self, lines: int = 40) -> str:
        out = []
        for name in ("slurmctld.log", "slurmd.log", "slurmctld.stdout", "slurmd.stdout"):
            p = self.log / name
            if p.exists():
                tail = p.read_text(errors="replace").splitlines()[-lines:]
                out.append("==> %s <==\n%s\n" % (p, "\n".join(tail)))
        return "".join(out)


def node_registered(state: str) -> bool:
    """State= predicate: the node's slurmd has registered and answers pings."""
    parts = state.upper().split("+")
    return bool(state) and parts[0] != "UNKNOWN" and "NOT_RESPONDING" not in parts


def _terminate(proc: Optional[subprocess.Popen], timeout: float = 5.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)
    except ProcessLookupError:
        pass


@atexit.register
def _stop_leftovers() -> None:
    for c in list(_LIVE):
        try:
            c.stop()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


# ----------------------------------------------------------------------------------------------
# pytest fixtures (import them into a conftest.py or a test module)

DEFAULT_NODES = ("node1", "node2", "node3")


@pytest.fixture(scope="session")
def slurm_cluster_factory(tmp_path_factory):
    """make(name, **SlurmCluster kwargs) -> a started cluster; all are stopped at session end."""
    require_slurm()
    made: List[SlurmCluster] = []

    def make(name: str = "cluster", **kwargs) -> SlurmCluster:
        base = tmp_path_factory.mktemp("slurm-%s" % re.sub(r"[^A-Za-z0-9_-]", "_", name))
        cluster = SlurmCluster(base, **kwargs)
        made.append(cluster)
        return cluster.start()

    yield make
    for c in reversed(made):
        c.stop()


@pytest.fixture(scope="module")
def slurm_cluster(slurm_cluster_factory, request):
    """One cluster per test module: node1 (real slurmd, 8 fake GPUs) + node2, node3 (no slurmd)."""
    c = slurm_cluster_factory(request.module.__name__.rsplit(".", 1)[-1], nodes=DEFAULT_NODES)
    yield c
    c.stop()
