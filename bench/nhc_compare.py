#!/usr/bin/env python3
"""`slurm-hooks check system` against LBNL NHC running the same checks, side by side (issue #26).

    .venv/bin/python bench/nhc_compare.py --nhc /path/to/nhc-checkout           # this node's CPUs
    .venv/bin/python bench/nhc_compare.py --nhc DIR --cpus 256 --runs 40        # a 256-CPU node
    .venv/bin/python bench/nhc_compare.py --fetch                               # git clone mej/nhc
    .venv/bin/python bench/nhc_compare.py --nhc DIR --source /tmp/old-tree      # an older slurm-hooks
    .venv/bin/python bench/nhc_compare.py --nhc DIR --before /tmp/old-tree      # both, interleaved

NHC is not part of this repository: give a checkout of https://github.com/mej/nhc (the `nhc` script
and its scripts/*.nhc) with --nhc or $NHC_SOURCE, or an installed NHC (/usr/sbin/nhc with
/etc/nhc/scripts) is used, or --fetch clones it into a temp dir. Its configuration is
bench/nhc/system.conf, the slurm-hooks one bench/nhc/system.toml, both filled in from this node's
facts so every check passes on both sides (a failing NHC stops at its first failure and would
measure less work). NHC runs as installed sites run it from cron or slurmd's HealthCheckProgram:
every scripts/*.nhc loaded, its watchdog on, MARK_OFFLINE=0 so neither side talks to Slurm.
slurm-hooks runs from a regular install (bench/install.py) with its console script.

--cpus N (needs root and `unshare -m`): a /proc/cpuinfo of N CPUs (this node's first processor
entry repeated with the ids of 2 sockets x N/4 cores x 2 threads, numbered as Linux numbers x86
SMT siblings) and a /sys/devices/system/cpu tree to match are bind-mounted in a private mount
namespace, so both tools see an N-CPU node and nothing outside the namespace changes.

Runs are interleaved one by one, the order rotating each round, and the medians compared: on a
shared VM the absolute figures move with the load, the ratio much less. CPU time is the children's
user+system time (os.wait4), so NHC's forks (ps, df, its watchdog's sleep) count.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench.install import make_install  # noqa: E402

HERE = os.path.join(REPO, "bench", "nhc")
NHC_GIT = "https://github.com/mej/nhc"
INSIDE = "SLURM_HOOKS_NHC_BENCH_INSIDE"  # set in the re-run inside the private mount namespace


def locate_nhc(given: Optional[str], fetch: bool, scratch: str) -> Tuple[str, str]:
    """(the nhc script, its scripts directory) from --nhc, $NHC_SOURCE, an install, or a clone."""
    for base in (given, os.environ.get("NHC_SOURCE")):
        if base:
            script, scripts = os.path.join(base, "nhc"), os.path.join(base, "scripts")
            if os.path.isfile(script) and os.path.isdir(scripts):
                return script, scripts
            raise SystemExit("%s: no nhc script and scripts/ directory (a mej/nhc checkout)" % base)
    if os.path.isfile("/usr/sbin/nhc") and os.path.isdir("/etc/nhc/scripts"):
        return "/usr/sbin/nhc", "/etc/nhc/scripts"
    if not fetch:
        raise SystemExit(
            "NHC not found: pass --nhc DIR (a checkout of %s), set NHC_SOURCE, or --fetch" % NHC_GIT
        )
    target = os.path.join(scratch, "nhc-src")
    subprocess.run(["git", "clone", "--depth", "1", NHC_GIT, target], check=True, timeout=300)
    return os.path.join(target, "nhc"), os.path.join(target, "scripts")


# -- this node's facts -------------------------------------------------------------------------


def node_facts() -> Dict[str, str]:
    """What both configurations expect, read from the node as NHC and slurm-hooks see it."""
    with open("/proc/cpuinfo") as handle:
        cpuinfo = handle.read()
    sockets = len(set(re.findall(r"^physical id\s*:\s*(\d+)", cpuinfo, re.M))) or 1
    processors = len(re.findall(r"^processor\s*:", cpuinfo, re.M))
    cores = re.search(r"^cpu cores\s*:\s*(\d+)", cpuinfo, re.M)
    siblings = re.search(r"^siblings\s*:\s*(\d+)", cpuinfo, re.M)
    per_socket = int(cores.group(1)) if cores else processors // sockets
    threads = int(siblings.group(1)) * sockets if siblings else processors
    with open("/proc/meminfo") as handle:
        total_kb = int(re.search(r"^MemTotal:\s*(\d+)", handle.read(), re.M).group(1))
    with open("/proc/sys/kernel/osrelease") as handle:
        kernel = handle.read().strip()
    with open("/proc/1/comm") as handle:
        process = handle.read().strip()
    return {
        "SOCKETS": str(sockets),
        "CORES": str(sockets * per_socket),
        "THREADS": str(threads),
        "CORES_PER_SOCKET": str(per_socket),
        "THREADS_PER_CORE": str(max(1, threads // (sockets * per_socket))),
        "MEM_MIN_KB": str(total_kb * 95 // 100),
        "MEM_MAX_KB": str(total_kb * 105 // 100),
        "MEM_MIN_GIB": "%.3f" % (total_kb * 0.95 / (1 << 20)),
        "KERNEL": kernel,
        "PROCESS": process,
    }


def fill(template: str, facts: Dict[str, str]) -> str:
    with open(os.path.join(HERE, template)) as handle:
        text = handle.read()
    for key, value in facts.items():
        text = text.replace("{%s}" % key, value)
    text = "\n".join(line for line in text.splitlines() if not line.startswith("#")) + "\n"
    if re.search(r"\{[A-Z_]+\}", text):
        raise SystemExit("%s: unfilled field %s" % (template, re.search(r"\{[A-Z_]+\}", text)[0]))
    return text


# -- a generated N-CPU node --------------------------------------------------------------------


def fake_cpus(cpus: int, target: str) -> Tuple[str, str]:
    """(a cpuinfo file, a /sys/devices/system/cpu tree) for 2 sockets x cpus/4 cores x 2 threads."""
    if cpus % 4:
        raise SystemExit("--cpus must be a multiple of 4 (2 sockets, 2 threads per core)")
    with open("/proc/cpuinfo") as handle:
        first = handle.read().split("\n\n")[0]  # this node's real entry: flags, model, caches
    cores_per_socket, half = cpus // 4, cpus // 2
    entries = []
    for cpu in range(cpus):
        core = cpu % half
        socket, core_id = divmod(core, cores_per_socket)
        fields = {
            "processor": str(cpu),
            "physical id": str(socket),
            "siblings": str(2 * cores_per_socket),
            "core id": str(core_id),
            "cpu cores": str(cores_per_socket),
            "apicid": str(2 * core + cpu // half),
            "initial apicid": str(2 * core + cpu // half),
        }
        lines = []
        for line in first.splitlines():
            key = line.split(":", 1)[0].strip()
            lines.append(
                "%s\t: %s" % (line.split(":", 1)[0], fields[key]) if key in fields else line
            )
        for key in ("physical id", "siblings", "core id", "cpu cores"):
            if not any(line.split(":", 1)[0].strip() == key for line in lines):
                lines.append("%s\t: %s" % (key, fields[key]))
        entries.append("\n".join(lines))
    os.makedirs(target, exist_ok=True)
    info = os.path.join(target, "cpuinfo")
    with open(info, "w") as handle:
        handle.write("\n\n".join(entries) + "\n\n")
    tree = os.path.join(target, "cpu")
    _write(os.path.join(tree, "online"), "0-%d" % (cpus - 1))
    _write(os.path.join(tree, "present"), "0-%d" % (cpus - 1))
    _write(os.path.join(tree, "possible"), "0-%d" % (cpus - 1))
    for cpu in range(cpus):
        core = cpu % half
        socket = core // cores_per_socket
        low = socket * cores_per_socket
        package = "%d-%d,%d-%d" % (
            low,
            low + cores_per_socket - 1,
            low + half,
            low + half + cores_per_socket - 1,
        )
        topology = os.path.join(tree, "cpu%d" % cpu, "topology")
        for name, value in (
            ("thread_siblings_list", "%d,%d" % (core, core + half)),
            ("core_cpus_list", "%d,%d" % (core, core + half)),
            ("core_siblings_list", package),
            ("package_cpus_list", package),
            ("die_cpus_list", package),
            ("physical_package_id", str(socket)),
            ("core_id", str(core % cores_per_socket)),
        ):
            _write(os.path.join(topology, name), value)
        if cpu:
            _write(os.path.join(tree, "cpu%d" % cpu, "online"), "1")
    return info, tree


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text + "\n")


def enter_fake_node(info: str, tree: str) -> None:
    """Inside `unshare -m`: keep our mounts private, then lay the generated files over the real ones."""
    for argv in (
        ["mount", "--make-rprivate", "/"],
        ["mount", "--bind", info, "/proc/cpuinfo"],
        ["mount", "--bind", tree, "/sys/devices/system/cpu"],
    ):
        subprocess.run(argv, check=True, timeout=30)


# -- timing --------------------------------------------------------------------------------------


def timed(argv: List[str], env: Dict[str, str]) -> Tuple[float, float, int, str]:
    """(wall seconds, children's CPU seconds, exit status, output) of one run."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = proc.stdout.read() if proc.stdout else b""
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, proc.returncode, out.decode(errors="replace")


def compare(args: argparse.Namespace, scratch: str) -> int:
    nhc, scripts = locate_nhc(args.nhc, args.fetch, scratch)
    if args.cpus and not os.environ.get(INSIDE):
        info, tree = fake_cpus(args.cpus, os.path.join(scratch, "fake"))
        env = dict(os.environ, **{INSIDE: "%s:%s" % (info, tree)})
        argv = [sys.executable, os.path.abspath(__file__)] + sys.argv[1:]
        if args.nhc is None:
            argv += ["--nhc", os.path.dirname(nhc)]
        return subprocess.run(["unshare", "-m"] + argv, env=env).returncode
    if os.environ.get(INSIDE):
        enter_fake_node(*os.environ[INSIDE].split(":"))
    facts = node_facts()

    confdir = os.path.join(scratch, "nhc-etc")
    shutil.copytree(scripts, os.path.join(confdir, "scripts"))
    nhc_conf = os.path.join(confdir, "nhc.conf")
    with open(nhc_conf, "w") as handle:
        handle.write(fill("system.conf", facts))
    etc = os.path.join(scratch, "etc")
    os.makedirs(etc, mode=0o755)
    os.chmod(scratch, 0o755)
    config = os.path.join(etc, "config.toml")
    state = os.path.join(scratch, "var")
    with open(config, "w") as handle:
        handle.write(
            '[general]\nmode = "observe"\n\n[paths]\nstate_dir = "%s"\nlog_file = "%s/log"\n'
            "syslog = false\n\n" % (state, state) + fill("system.toml", facts)
        )
    os.chmod(config, 0o644)
    _python, hook = make_install(os.path.join(scratch, "install"), args.source)
    before = make_install(os.path.join(scratch, "before"), args.before)[1] if args.before else None
    path = "/usr/sbin:/usr/bin:/sbin:/bin"
    commands = {
        "nhc": (
            ["bash", nhc, "-D", confdir, "-c", nhc_conf, "-l", "-", "-t", "30", "MARK_OFFLINE=0"],
            {"PATH": path, "LANG": "C"},
        ),
        "slurm-hooks": (
            hook + ["check", "system"],
            {"PATH": path, "LANG": "C.UTF-8", "SLURM_HOOKS_CONFIG": config},
        ),
    }
    if before:
        commands["before"] = (before + ["check", "system"], commands["slurm-hooks"][1])
    wall: Dict[str, List[float]] = {name: [] for name in commands}
    cpu: Dict[str, List[float]] = {name: [] for name in commands}
    order = list(commands)
    for i in range(-args.warmup, args.runs):
        for name in order[i % len(order) :] + order[: i % len(order)]:
            argv, env = commands[name]
            seconds, cpu_seconds, code, out = timed(argv, env)
            if code != 0:
                print(
                    "%s exited %d (every check must pass on both sides):\n%s"
                    % (name, code, out[-3000:])
                )
                return 1
            if i >= 0:
                wall[name].append(seconds)
                cpu[name].append(cpu_seconds)
    cpus = facts["THREADS"]
    print(
        "node: %s CPUs (%s sockets x %s cores), %s"
        % (
            cpus,
            facts["SOCKETS"],
            facts["CORES_PER_SOCKET"],
            "generated" if os.environ.get(INSIDE) else "this machine's",
        )
    )
    medians = {name: statistics.median(values) for name, values in wall.items()}
    cpu_medians = {name: statistics.median(values) for name, values in cpu.items()}
    for name in commands:
        print(
            "%-12s wall median %7.1f ms  (min %6.1f, max %6.1f)  CPU median %6.1f ms  (%d runs)"
            % (
                name,
                medians[name] * 1e3,
                min(wall[name]) * 1e3,
                max(wall[name]) * 1e3,
                cpu_medians[name] * 1e3,
                len(wall[name]),
            )
        )
    print(
        "ratio slurm-hooks / NHC: wall %.2f, CPU %.2f (medians)"
        % (medians["slurm-hooks"] / medians["nhc"], cpu_medians["slurm-hooks"] / cpu_medians["nhc"])
    )
    if before:
        print(
            "ratio before / NHC: wall %.2f, CPU %.2f; after / before: wall %.2f (medians)"
            % (
                medians["before"] / medians["nhc"],
                cpu_medians["before"] / cpu_medians["nhc"],
                medians["slurm-hooks"] / medians["before"],
            )
        )
    print("load average now: %s" % " ".join("%.2f" % x for x in os.getloadavg()))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nhc", metavar="DIR", help="a checkout of mej/nhc (nhc and scripts/)")
    parser.add_argument(
        "--fetch", action="store_true", help="git clone %s when none is found" % NHC_GIT
    )
    parser.add_argument(
        "--cpus", type=int, metavar="N", help="a generated N-CPU node (root, unshare -m)"
    )
    parser.add_argument(
        "--source",
        default=REPO,
        metavar="DIR",
        help="the slurm-hooks tree to install (default this checkout; e.g. a `git worktree add` of "
        "an older commit, for a before/after)",
    )
    parser.add_argument(
        "--before",
        metavar="DIR",
        help="also run this slurm-hooks tree's `check system` in the same rounds (a before/after)",
    )
    parser.add_argument("--runs", type=int, default=30, help="timed runs of each side")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first")
    args = parser.parse_args(argv)
    scratch = tempfile.mkdtemp(prefix="slurm-hooks-nhc-")
    try:
        return compare(args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
