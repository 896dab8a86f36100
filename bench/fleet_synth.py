"""A synthetic GPU fleet for `slurm-hooks report --stragglers`: jobs, noise and planted slow nodes.

    .venv/bin/python -m bench.fleet_synth                        # 256 nodes x 5,000 jobs: detection table
    .venv/bin/python -m bench.fleet_synth --nodes 64 --jobs 800  # smaller, faster
    .venv/bin/python -m bench.fleet_synth --speed 100000         # report speed over 100,000 records

Records are written in the real format (slurm_hooks.records.encode_record: header line first, with
`summary.perf` as the FLEET contract defines it), one file per job x node under DIR/<node>/<job>.json,
with the file's mtime at the job's end as the epilog leaves it.

The model (each choice is a guess about a real training fleet, stated so it can be argued with):
- job sizes: 45 % 4-8 nodes, 30 % 9-16, 15 % 17-32, 7 % 33-64, 3 % 65-256 (whole-fleet jobs);
  nodes drawn at random; 8 GPUs per node; durations log-normal around 2 h (10 min .. 2 days).
- every job has its own level of each figure (power from 200 to 650 W per GPU, its own fabric
  congestion and traffic, power-capped or not); nodes scatter around it: GPU power +-2.5 %, the
  weakest GPU 1-6 % under the mean, IB wait log-normal (sigma 0.35: switches differ), bytes +-5 %,
  foreign CPU 0.1-0.3 %. Heavy tails: healthy node-jobs get rare one-off glitches (0.2-0.5 %:
  a short thermal or HW-slowdown episode, replays, a backup process, a congested port).
- slow nodes, planted (3 persistent and 1 intermittent per kind, the intermittent one showing in
  half of its jobs): hw_slowdown (one GPU 8-35 % of the job in HW slowdown, that GPU's power down
  with it), ib_stall (port_xmit_wait 8-40 x its peers), noisy_cpu (3-15 % of the job's CPU time
  taken by a foreign process), low_power (a GPU power limit set 25-40 % low: all GPUs draw less,
  power-cap throttle up). A job with a slow node runs at its speed: its other nodes draw 10 % less.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

KINDS = ("hw_slowdown", "ib_stall", "noisy_cpu", "low_power")
SIZES = ((0.45, 4, 8), (0.30, 9, 16), (0.15, 17, 32), (0.07, 33, 64), (0.03, 65, 256))
USERS = 40
GPUS = 8


class Plan:
    """Which nodes are slow, how, and how often (1.0 persistent, 0.5 intermittent)."""

    def __init__(self, nodes: List[str], planted: Dict[str, Tuple[str, float]]) -> None:
        self.nodes = nodes
        self.planted = planted  # node -> (kind, probability the fault shows in one of its jobs)


def make_plan(node_count: int, persistent: int = 3, intermittent: int = 1, seed: int = 17) -> Plan:
    rng = random.Random(seed)
    nodes = ["gpu%04d" % i for i in range(node_count)]
    chosen = (
        rng.sample(nodes, (persistent + intermittent) * len(KINDS))
        if persistent + intermittent
        else []
    )
    planted = {}
    for i, kind in enumerate(KINDS):
        group = chosen[i * (persistent + intermittent) : (i + 1) * (persistent + intermittent)]
        for j, node in enumerate(group):
            planted[node] = (kind, 1.0 if j < persistent else 0.5)
    return Plan(nodes, planted)


def _size(rng: random.Random, node_count: int) -> int:
    roll, acc = rng.random(), 0.0
    for share, low, high in SIZES:
        acc += share
        if roll <= acc:
            return min(rng.randint(low, high), node_count)
    return min(SIZES[-1][2], node_count)


def _sig(value: float) -> float:
    return float("%.6g" % value)


def job_figures(
    rng: random.Random, nodes: List[str], plan: Plan, duration: float, severity: float = 1.0
) -> Dict[str, Dict[str, float]]:
    """{node: summary.perf} for one job; `severity` scales how far a planted fault moves its figures."""
    level = {
        "power": rng.uniform(200, 650),
        "capped": rng.random() < 0.3,
        "cap": rng.uniform(0.05, 0.6),
        "wait": math.exp(rng.gauss(math.log(2e5), 1.0)),
        "uses_ib": rng.random() < 0.9,
        "bytes": math.exp(rng.gauss(math.log(5e9), 1.0)),
    }
    faults = {
        n: plan.planted[n][0]
        for n in nodes
        if n in plan.planted and rng.random() < plan.planted[n][1]
    }
    slowed = any(kind in ("hw_slowdown", "low_power") for kind in faults.values())
    out = {}
    for node in nodes:
        out[node] = _node_figures(rng, level, faults.get(node), slowed, severity)
    return out


def _node_figures(
    rng: random.Random,
    level: Dict[str, Any],
    fault: Optional[str],
    slowed: bool,
    severity: float = 1.0,
) -> Dict[str, float]:
    power = level["power"] * rng.gauss(1.0, 0.025) * (0.9 if slowed else 1.0)
    weakest = power * (1 - abs(rng.gauss(0.03, 0.015)))
    cap = (
        min(1.0, max(0.0, level["cap"] + rng.gauss(0, 0.03)))
        if level["capped"]
        else rng.expovariate(500)
    )
    perf = {
        "throttle_frac.hw_slowdown": 0.0,
        "throttle_frac.thermal": rng.expovariate(1000),
        "throttle_frac.power": cap,
        "throttle_frac.power_brake": 0.0,
        "throttle_frac.sync_boost": 0.0,
        "pcie_replays_per_h": 0.0,
        "nvlink_errors_per_h": 0.0,
        "ib_xmit_wait_per_s": level["wait"] * math.exp(rng.gauss(0, 0.35)),
        "foreign_cpu_frac": 0.001 + rng.expovariate(1000),
        "cpu_steal_frac": 0.0,
    }
    if level["uses_ib"]:
        perf["ib_xmit_bytes_per_s"] = level["bytes"] * rng.gauss(1.0, 0.05)
        perf["ib_rcv_bytes_per_s"] = level["bytes"] * rng.gauss(1.0, 0.05)
    else:
        perf["ib_xmit_bytes_per_s"] = perf["ib_rcv_bytes_per_s"] = rng.uniform(0, 2e5)
    _glitch(rng, perf)
    if fault == "hw_slowdown":
        frac = rng.uniform(0.08, 0.35) * severity
        perf["throttle_frac.hw_slowdown"] = frac
        weakest *= 1 - 0.6 * frac
        power -= (power - weakest) / GPUS
    elif fault == "low_power":
        factor = 1 - rng.uniform(0.25, 0.4) * severity
        power, weakest = power * factor, weakest * factor
        perf["throttle_frac.power"] = min(
            1.0, perf["throttle_frac.power"] + rng.uniform(0.2, 0.5) * severity
        )
    elif fault == "ib_stall":
        perf["ib_xmit_wait_per_s"] *= 1 + rng.uniform(7, 39) * severity
    elif fault == "noisy_cpu":
        perf["foreign_cpu_frac"] += rng.uniform(0.03, 0.15) * severity
    perf["gpu_power_w.mean"], perf["gpu_power_w.min"] = power, weakest
    if rng.random() < 0.02:  # a counter reset or an unreadable counter: the figure is absent
        perf.pop(rng.choice(sorted(perf)))
    return {k: _sig(v) for k, v in perf.items()}


def _glitch(rng: random.Random, perf: Dict[str, float]) -> None:
    """One-off events on healthy nodes: what a single job's evidence must not be enough for."""
    roll = rng.random()
    if roll < 0.002:
        perf["throttle_frac.hw_slowdown"] = rng.uniform(0.005, 0.05)
    elif roll < 0.007:
        perf["throttle_frac.thermal"] += rng.uniform(0.0, 0.05)
    elif roll < 0.012:
        perf["pcie_replays_per_h"] = rng.uniform(1, 200)
    elif roll < 0.015:
        perf["nvlink_errors_per_h"] = rng.uniform(1, 200)
    elif roll < 0.020:
        perf["foreign_cpu_frac"] += rng.uniform(0.02, 0.1)
    elif roll < 0.025:
        perf["ib_xmit_wait_per_s"] *= rng.uniform(3, 8)


def header_record(
    job_id: str,
    user: str,
    node: str,
    start: float,
    end: float,
    perf: Dict[str, float],
    body_gpus: int = 0,
    boot_id: str = "4f0c1a52-9d1e-4c3b-8a57-2e6b0d9c7f31",
    hw_class: str = "NVIDIA H100 80GB HBM3 x8",
) -> Dict[str, Any]:
    """A job record as records/build.py lays it out: the header fields, summary (with perf) and a
    body. boot_id: the node's (one boot for the whole synthetic fleet unless a test reboots one);
    hw_class: summary.hw_class (one kind of node unless a test mixes them)."""
    summary = {
        "deltas": True,
        "ecc_corrected": 0,
        "ecc_uncorrected": 0,
        "remapped_rows": 0,
        "retired_pages": 0,
        "nvlink_errors": 0,
        "pcie_replays": 0,
        "ib_errors": 0,
        "throttle_s": 0.0,
        "energy_j": 0.0,
        "xids": 0,
        "sxids": 0,
        "leftover_processes": 0,
        "leftover_memory_bytes": 0,
        "pending_repair": False,
        "status": "OK",
        "drained": False,
        "abnormal": [],
        "perf": perf,
        "hw_class": hw_class,
    }
    gpus = [
        {
            "index": i,
            "minor": i,
            "uuid": "GPU-%08x-0000-0000-0000-%012d"
            % (int(node[3:]) if node[3:].isdigit() else 0, i),
            "serial": "1652%09d" % i,
            "bus_id": "0000:%02x:00.0" % (0x18 + i),
            "name": "NVIDIA H100 80GB HBM3",
            "end": {"ecc.volatile.corrected": 0, "energy_mj": 123456789, "pcie.replay": 0},
            "delta": {
                "ecc.volatile.corrected": 0,
                "energy_mj": 1234567,
                "pcie.replay": 0,
                "violation_ns.power": 0,
                "violation_ns.thermal": 0,
            },
            "counter_resets": [],
            "nvlink_delta": {},
            "flags": {},
            "unavailable": {},
            "processes": [],
            "memory_used_bytes": 0,
        }
        for i in range(body_gpus)
    ]
    return {
        "schema": "slurm-hooks.job-record/1",
        "version": "0.1.0",
        "job": {"id": job_id, "user": user, "gpus": list(range(GPUS))},
        "node": node,
        "start": round(start, 3),
        "end": round(end, 3),
        "boot_id": boot_id,
        "prolog_snapshot": "ok",
        "summary": summary,
        "end_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end)),
        "duration_s": round(end - start, 3),
        "epilog_snapshot": "ok",
        "rebooted_during_job": False,
        "notes": [],
        "gpus": gpus,
        "ib": [],
        "events_scope": "job",
        "xid_count": 0,
        "sxid_count": 0,
        "xids": [],
        "sxids": [],
        "checks": None,
        "decision": None,
        "timings": {},
    }


def write_fleet(
    directory: str,
    plan: Plan,
    jobs: int,
    seed: int = 5,
    now: Optional[float] = None,
    body_gpus: int = 0,
    span_days: float = 10.0,
    single_node_share: float = 0.0,
    severity: float = 1.0,
    first_job: int = 1000000,
    key: Optional[bytes] = None,
) -> Dict[str, int]:
    """Write `jobs` multi-node jobs (plus single-node ones, `single_node_share` of all) ending over the
    last `span_days`; returns counts. key: sign the records with it, as the epilog does with
    [records] key_file (records/signing.py)."""
    from slurm_hooks.records.store import encode_record

    rng = random.Random(seed)
    now = time.time() if now is None else now
    made = set()
    counts = {"jobs": 0, "records": 0, "bytes": 0, "node_jobs_planted": 0}
    first = now - span_days * 86400
    for i in range(jobs):
        single = rng.random() < single_node_share
        nodes = rng.sample(plan.nodes, 1 if single else _size(rng, len(plan.nodes)))
        duration = min(max(math.exp(rng.gauss(math.log(7200), 1.0)), 600), 172800)
        end = first + (i + 1) * (span_days * 86400 / jobs)
        start = end - duration
        figures = job_figures(rng, nodes, plan, duration, severity)
        user = "user%02d" % rng.randrange(USERS)
        job_id = str(first_job + i)
        for node in nodes:
            if node not in made:
                os.makedirs(os.path.join(directory, node), exist_ok=True)
                made.add(node)
            path = os.path.join(directory, node, job_id + ".json")
            data = encode_record(
                header_record(job_id, user, node, start, end, figures[node], body_gpus),
                key,
                node,
                job_id + ".json",
            )
            with open(path, "wb") as handle:
                handle.write(data)
            stamp = end + rng.uniform(0, 30)  # each node's epilog ends a little apart
            os.utime(path, (stamp, stamp))
            counts["records"] += 1
            counts["bytes"] += len(data)
            counts["node_jobs_planted"] += node in plan.planted
        counts["jobs"] += 1
    return counts


# -- evaluation ----------------------------------------------------------------------------------

# what a suspect's figure says about the kind of node it found (the figure it is flagged on most, worst z first)
METRIC_KIND = {
    "throttle_frac.hw_slowdown": "hw_slowdown",
    "ib_xmit_wait_per_s": "ib_stall",
    "foreign_cpu_frac": "noisy_cpu",
    "gpu_power_w.mean": "low_power",
    "gpu_power_w.min": "low_power",
    "throttle_frac.power": "low_power",
}


def evaluate(plan: Plan, suspects, node_jobs: int) -> Dict[str, Any]:
    """Precision and recall per kind, counting nodes (not node x figure pairs). A suspect node is
    called the kind of its leading figure (suspects come sorted: most flagged jobs, then worst z):
    recall of a kind = its planted nodes called that kind / planted; precision = called that kind
    and planted that kind / called that kind. False: a suspect node nothing was planted on."""
    lead: Dict[str, str] = {}
    for s in suspects:
        lead.setdefault(s.node, METRIC_KIND.get(s.metric, "other"))
    rows = {}
    for kind in KINDS:
        planted = {n for n, (k, _) in plan.planted.items() if k == kind}
        persistent = {n for n in planted if plan.planted[n][1] >= 1.0}
        called = {n for n, k in lead.items() if k == kind}
        hits = called & planted
        rows[kind] = {
            "planted": len(planted),
            "found": len(hits),
            "recall": _ratio(len(hits), len(planted)),
            "recall_persistent": _ratio(len(hits & persistent), len(persistent)),
            "recall_intermittent": _ratio(
                len(hits & (planted - persistent)), len(planted - persistent)
            ),
            "called": len(called),
            "precision": _ratio(len(hits), len(called)),
        }
    wrong = sorted(n for n in lead if n not in plan.planted)
    return {
        "kinds": rows,
        "suspect_nodes": len(lead),
        "false_nodes": wrong,
        "precision": _ratio(len(lead) - len(wrong), len(lead)),
        "recall": _ratio(len(set(lead) & set(plan.planted)), len(plan.planted)),
        "false_per_10k_node_jobs": round(len(wrong) / node_jobs * 1e4, 3) if node_jobs else None,
    }


def _ratio(a: int, b: int) -> Optional[float]:
    return round(a / b, 3) if b else None


def run_detection(
    directory: str, fleet: Optional[Dict[str, Any]] = None, now: Optional[float] = None
):
    from slurm_hooks.core.config import SECTIONS
    from slurm_hooks.records import straggler_scan as fleet_scan

    settings = {k: s.default for k, s in SECTIONS["fleet"].items()}
    settings.update(fleet or {})
    return fleet_scan.scan([directory], settings, now=now)


def detection_table(
    nodes: int,
    jobs: int,
    seed: int,
    fleet: Optional[Dict[str, Any]] = None,
    severities: Tuple[float, ...] = (1.0,),
    healthy_seeds: int = 1,
) -> Dict[str, Any]:
    """The planted fleet at each severity (1.0: the faults as the module doc describes them; 0.5: half
    as far from healthy), and healthy fleets (nothing planted, `healthy_seeds` of them)."""
    now = time.time()
    out: Dict[str, Any] = {"nodes": nodes, "jobs": jobs, "planted": {}, "healthy": []}
    runs = [("planted", s, seed) for s in severities] + [
        ("healthy", 1.0, seed + 100 * i) for i in range(healthy_seeds)
    ]
    for label, severity, run_seed in runs:
        plan = (
            make_plan(nodes, seed=run_seed)
            if label == "planted"
            else make_plan(nodes, 0, 0, seed=run_seed)
        )
        with tempfile.TemporaryDirectory(prefix="fleet-%s-" % label) as directory:
            counts = write_fleet(
                directory, plan, jobs, seed=run_seed + 1, now=now, severity=severity
            )
            result = run_detection(directory, fleet, now=now)
            scores = evaluate(plan, result.suspects(), result.node_jobs)
            row = dict(
                scores,
                records=counts["records"],
                node_jobs=result.node_jobs,
                jobs_scored=result.jobs_scored,
                seconds=round(result.seconds, 2),
                severity=severity,
            )
            if label == "planted":
                out["planted"][severity] = row
            else:
                out["healthy"].append(row)
    return out


def print_table(table: Dict[str, Any]) -> None:
    for severity, planted in sorted(table["planted"].items(), reverse=True):
        print(
            "fleet: %d nodes, %d multi-node jobs, %d records (%d node-jobs scored in %.1fs), faults at severity %g"
            % (
                table["nodes"],
                table["jobs"],
                planted["records"],
                planted["node_jobs"],
                planted["seconds"],
                severity,
            )
        )
        print(
            "| kind | planted (3 persistent + 1 intermittent) | found | recall (persistent / intermittent) | "
            "precision |"
        )
        print("|---|---:|---:|---:|---:|")
        for kind, row in planted["kinds"].items():
            print(
                "| %s | %d | %d | %s (%s / %s) | %s |"
                % (
                    kind,
                    row["planted"],
                    row["found"],
                    row["recall"],
                    row["recall_persistent"],
                    row["recall_intermittent"],
                    row["precision"],
                )
            )
        print(
            "| all | %d | %d | %s | %s |"
            % (
                sum(r["planted"] for r in planted["kinds"].values()),
                sum(r["found"] for r in planted["kinds"].values()),
                planted["recall"],
                planted["precision"],
            )
        )
        print("healthy nodes called suspect: %s" % (", ".join(planted["false_nodes"]) or "none"))
    for healthy in table["healthy"]:
        print(
            "healthy fleet (nothing planted): %d suspect nodes over %d node-jobs = %s per 10,000 node-jobs"
            % (healthy["suspect_nodes"], healthy["node_jobs"], healthy["false_per_10k_node_jobs"])
        )


def speed(records: int, runs: int, seed: int = 3, signed: bool = False) -> Dict[str, Any]:
    """`slurm-hooks report --stragglers DIR` as a subprocess over `records` 8-GPU-sized records.
    signed: the records signed and the report given the key ([records] key_file), so that every
    record is verified (an HMAC-SHA256 of its header line) before it is scored."""
    import subprocess

    nodes = 256
    jobs, plan = 0, make_plan(nodes, seed=seed)
    key = os.urandom(32) if signed else None
    with tempfile.TemporaryDirectory(prefix="fleet-speed-") as directory:
        rng = random.Random(seed)
        counts = {"records": 0, "bytes": 0}
        while counts["records"] < records:  # whole jobs until the record count is reached
            batch = write_fleet(
                directory,
                plan,
                200,
                seed=rng.randrange(1 << 30),
                body_gpus=GPUS,
                span_days=10.0,
                now=time.time(),
                first_job=1000000 + jobs,
                key=key,
            )
            counts["records"] += batch["records"]
            counts["bytes"] += batch["bytes"]
            jobs += batch["jobs"]
        config = os.devnull
        if key is not None:  # outside the records directory, which the report walks
            config = directory + ".toml"
            with open(directory + ".key", "wb") as handle:
                handle.write(key)
            os.chmod(directory + ".key", 0o600)
            with open(config, "w") as handle:
                handle.write('[records]\nkey_file = "%s"\n' % (directory + ".key"))
        env = dict(os.environ, SLURM_HOOKS_ALLOW_INSECURE_CONFIG="1", SLURM_HOOKS_CONFIG=config)
        walls = []
        for _ in range(runs):
            began = time.monotonic()
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "slurm_hooks",
                    "report",
                    "--stragglers",
                    "--json",
                    directory,
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
                cwd=REPO,
            )
            walls.append(time.monotonic() - began)
            if done.returncode not in (0, 1):  # 1 (FOUND): the planted nodes are suspects
                raise SystemExit("report failed (%d): %s" % (done.returncode, done.stderr[-2000:]))
            answer = json.loads(done.stdout)
            read = answer["records"]
            if answer["verified"] != signed or answer["unverified"]:
                raise SystemExit("records verified: %s, expected %s" % (answer["verified"], signed))
            if read != counts["records"]:
                raise SystemExit("the report read %d records of %d" % (read, counts["records"]))
        import resource

        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        peak = children.ru_maxrss  # KiB on Linux: the largest child
        with open("/proc/loadavg") as handle:
            load = handle.read().split()[:3]
        for leftover in (directory + ".key", directory + ".toml"):
            if os.path.exists(leftover):
                os.unlink(leftover)
        return {
            "cpu_s_per_run": round((children.ru_utime + children.ru_stime) / runs, 2),
            "loadavg": load,
            "records": counts["records"],
            "megabytes": round(counts["bytes"] / 1e6, 1),
            "jobs": jobs,
            "wall_s_median": round(statistics.median(walls), 2),
            "wall_s": [round(w, 2) for w in walls],
            "peak_rss_mib": round(peak / 1024.0, 1),
            "cpus": os.cpu_count(),
            "signed": signed,
        }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument(
        "--speed", type=int, metavar="RECORDS", help="measure the report over this many records"
    )
    parser.add_argument(
        "--signed",
        action="store_true",
        help="with --speed: sign the records and verify them (records/signing.py)",
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--severity",
        type=float,
        nargs="+",
        default=[1.0],
        help="how far planted faults move their figures (1.0: as described; 0.5: half as far)",
    )
    parser.add_argument(
        "--healthy-seeds", type=int, default=1, help="healthy fleets to measure false suspects on"
    )
    args = parser.parse_args(argv)
    if args.speed:
        print(speed(args.speed, args.runs, signed=args.signed))
        return 0
    print_table(
        detection_table(
            args.nodes,
            args.jobs,
            args.seed,
            severities=tuple(args.severity),
            healthy_seeds=args.healthy_seeds,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
