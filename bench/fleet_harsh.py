"""A harsher synthetic fleet than fleet_synth.py, seeded, run through the real `report --stragglers`.

    .venv/bin/python -m bench.fleet_harsh                    # detection table (192 nodes x 3,000 jobs)
    .venv/bin/python -m bench.fleet_harsh --speed 100000     # the report's time on 100,000 records

What is harsher (each a guess about a real fleet, stated so it can be argued with):
- heavy tails: node scatter is Student-t with 3 degrees of freedom (power 2.5 %, IB wait 0.35 in
  log), not Gaussian, on top of fleet_synth's one-off glitches;
- job-level shifts: in 20 % of jobs a random third of the nodes runs a different role (power 6 %
  lower, IB wait 2x): pipeline stages, an uneven data split;
- mixed classes: a third of the nodes are "NVIDIA A100-SXM4-80GB x8" (power ~0.6x), and 20 % of
  jobs span both classes (hw_class keeps them apart);
- leaf switches of 16 nodes in a topology.conf (SwitchName=leafNN Nodes=..., a spine above);
  two leaves are degraded: every node under them stalls 5-20x on the fabric in every job;
- real counter arithmetic for IB stalls: four ports per node, each a 32-bit port_xmit_wait that
  saturates (healthy ports: median 5e4 ticks/s, log-sd 1 across jobs), cleared by a subnet
  manager at a random moment of a job with probability
  `clear_share` (0.5); the record's figures come from the real records.build/perf code
  (whichever version is installed), so a saturated counter does to the figure what it does on a node;
- planted slow nodes, 2 persistent + 2 intermittent (slow in 20-30 % of their jobs) per kind:
  hw_slowdown (one GPU 8-35 % in HW slowdown), ib_stall (one port 8-40x), noisy_cpu (3-15 % foreign
  CPU), low_power (a power limit 5-15 % low: the cost the issue found missed);
- honest-but-odd nodes (4): one GPU power-capped ~20-60 % of the job while the node runs at full
  speed and full power (a leaky GPU); reboots: 1 % of node-jobs start a new boot.
Counted: a node suspect that is not planted is false (a node under a degraded leaf, an odd node);
a degraded leaf found = a switch suspect row on it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench import fleet_synth  # noqa: E402

KINDS = fleet_synth.KINDS
LEAF = 16
MAX32 = (1 << 32) - 1
PORTS = 4
CLASSES = (("NVIDIA H100 80GB HBM3 x8", 1.0), ("NVIDIA A100-SXM4-80GB x8", 0.6))


def student_t(rng: random.Random, df: int = 3) -> float:
    """A Student-t draw scaled to unit spread near the middle (heavy tails)."""
    chi = sum(rng.gauss(0, 1) ** 2 for _ in range(df))
    return rng.gauss(0, 1) / math.sqrt(chi / df) / math.sqrt(df / (df - 2.0))


class HarshPlan:
    def __init__(self, nodes: int, seed: int, planted: bool = True) -> None:
        rng = random.Random(seed)
        self.nodes = ["gpu%04d" % i for i in range(nodes)]
        self.hw = {n: CLASSES[1] if rng.random() < 1 / 3 else CLASSES[0] for n in self.nodes}
        self.leaves = {n: "leaf%02d" % (i // LEAF) for i, n in enumerate(self.nodes)}
        leaves = sorted(set(self.leaves.values()))
        self.bad_leaves = set(rng.sample(leaves, 2)) if planted else set()
        free = [n for n in self.nodes if self.leaves[n] not in self.bad_leaves]
        chosen = rng.sample(free, 4 * len(KINDS) + 4) if planted else []
        self.planted: Dict[str, Tuple[str, float]] = {}
        for i, kind in enumerate(KINDS):
            group = chosen[i * 4 : i * 4 + 4]
            for j, node in enumerate(group):
                self.planted[node] = (kind, 1.0 if j < 2 else rng.uniform(0.2, 0.3))
        self.odd = set(chosen[4 * len(KINDS) :])

    def topology_conf(self) -> str:
        lines = []
        for i in range(0, len(self.nodes), LEAF):
            lines.append(
                "SwitchName=%s Nodes=gpu[%04d-%04d]"
                % (self.leaves[self.nodes[i]], i, min(i + LEAF, len(self.nodes)) - 1)
            )
        lines.append("SwitchName=spine Switches=%s" % ",".join(sorted(set(self.leaves.values()))))
        return "\n".join(lines) + "\n"


class Ports:
    """Each node's port_xmit_wait counters (32-bit, saturating) across its jobs."""

    def __init__(self) -> None:
        self.value: Dict[str, List[int]] = {}

    def job(
        self, rng: random.Random, node: str, rates: List[float], duration: float, clear: float
    ) -> Dict[str, Any]:
        """One job: before/after snapshots' ib_perf of the node's ports, rates in ticks/s."""
        now = self.value.setdefault(node, [rng.randrange(0, 1 << 31) for _ in range(PORTS)])
        before, after = {}, {}
        for p, rate in enumerate(rates):
            start = now[p]
            if rng.random() < clear:  # the SM cleared it at some moment of the job
                end = min(MAX32, int(rate * duration * rng.random()))
            else:
                end = min(MAX32, start + int(rate * duration))
            now[p] = end
            words = int(5e9 * duration / 4)
            port = "mlx5_%d:1" % p
            before[port] = {"port_xmit_wait": start, "port_xmit_data": 0, "port_rcv_data": 0}
            after[port] = {"port_xmit_wait": end, "port_xmit_data": words, "port_rcv_data": words}
        return {"ib_perf": before, "ib": {k: {} for k in before}}, {
            "ib_perf": after,
            "ib": {k: {} for k in after},
        }


def ib_figures(before, after, duration: float) -> Tuple[Dict[str, float], Dict[str, str]]:
    """The IB figures as the installed records code makes them from two snapshots."""
    from slurm_hooks.records import build, perf

    record = {"duration_s": duration, "gpus": [], "cpu": None}
    record["ib"] = build._ib_entries(before, after, True)
    figures, _missing = perf.perf_block(record)
    untrusted: Dict[str, str] = {}
    try:
        from slurm_hooks.records import ib_counter_trust
    except ImportError:  # the code before issue 30
        pass
    else:
        untrusted = ib_counter_trust.untrusted_figures(record["ib"])
    return {k: v for k, v in figures.items() if k.startswith("ib_")}, untrusted


def write_fleet(
    directory: str,
    plan: HarshPlan,
    jobs: int,
    seed: int,
    now: float,
    clear: float = 0.5,
    body_gpus: int = 0,
    wait: float = 5e4,
    first_job: int = 2000000,
) -> Dict[str, int]:
    from slurm_hooks.records.store import encode_record

    rng = random.Random(seed)
    ports = Ports()
    boots = {n: 0 for n in plan.nodes}
    counts = {"records": 0, "jobs": 0, "bytes": 0}
    span = 10 * 86400.0
    first = now - span
    by_class: Dict[str, List[str]] = {}
    for n in plan.nodes:
        by_class.setdefault(plan.hw[n][0], []).append(n)
    for i in range(jobs):
        size = fleet_synth._size(rng, len(plan.nodes))
        if rng.random() < 0.2:
            nodes = rng.sample(plan.nodes, size)
        else:
            pool = by_class[rng.choice(sorted(by_class))]
            nodes = rng.sample(pool, min(size, len(pool)))
        duration = min(max(math.exp(rng.gauss(math.log(7200), 1.0)), 600), 172800)
        end = first + (i + 1) * span / jobs
        figures = fleet_synth.job_figures(rng, nodes, fleet_synth.Plan(plan.nodes, {}), duration)
        faults = {
            n: plan.planted[n][0]
            for n in nodes
            if n in plan.planted and rng.random() < plan.planted[n][1]
        }
        slowed = any(k in ("hw_slowdown", "low_power") for k in faults.values())
        role = set(rng.sample(nodes, len(nodes) // 3)) if rng.random() < 0.2 else set()
        wait_level = math.exp(rng.gauss(math.log(wait), 1.0))
        user = "user%02d" % rng.randrange(fleet_synth.USERS)
        job_id = str(first_job + i)
        for node in nodes:
            perf = figures[node]
            scale = plan.hw[node][1]
            for key in ("gpu_power_w.mean", "gpu_power_w.min"):
                if key in perf:
                    perf[key] *= (
                        scale * (1 + 0.025 * student_t(rng)) * (0.94 if node in role else 1.0)
                    )
                    perf[key] *= 0.92 if slowed else 1.0
            fault = faults.get(node)
            _apply_fault(rng, perf, fault)
            if node in plan.odd:  # a leaky GPU capped, the node at full speed and power
                perf["throttle_frac.power"] = rng.uniform(0.2, 0.6)
            rate = wait_level * math.exp(0.35 * student_t(rng)) * (2.0 if node in role else 1.0)
            if plan.leaves[node] in plan.bad_leaves:
                rate *= rng.uniform(5, 20)
            rates = [rate * math.exp(rng.gauss(0, 0.1)) for _ in range(PORTS)]
            if fault == "ib_stall":
                rates[0] *= 1 + rng.uniform(7, 39)
            before, after = ports.job(rng, node, rates, duration, clear)
            ib, untrusted = ib_figures(before, after, duration)
            for key in ("ib_xmit_wait_per_s", "ib_xmit_bytes_per_s", "ib_rcv_bytes_per_s"):
                perf.pop(key, None)
            perf.update(ib)
            perf = {k: float("%.6g" % v) for k, v in perf.items()}
            if rng.random() < 0.01:
                boots[node] += 1
            record = fleet_synth.header_record(
                job_id,
                user,
                node,
                end - duration,
                end,
                perf,
                body_gpus,
                boot_id="b00710%02d-0000-4000-8000-%012d" % (boots[node] % 100, int(node[3:])),
                hw_class=plan.hw[node][0],
            )
            if untrusted:
                record["summary"]["perf_untrusted"] = untrusted
            path = os.path.join(directory, node, job_id + ".json")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            data = encode_record(record)
            with open(path, "wb") as handle:
                handle.write(data)
            stamp = end + rng.uniform(0, 30)
            os.utime(path, (stamp, stamp))
            counts["records"] += 1
            counts["bytes"] += len(data)
        counts["jobs"] += 1
    return counts


def _apply_fault(rng: random.Random, perf: Dict[str, float], fault: Optional[str]) -> None:
    if fault == "hw_slowdown":
        frac = rng.uniform(0.08, 0.35)
        perf["throttle_frac.hw_slowdown"] = frac
        perf["gpu_power_w.min"] = perf.get("gpu_power_w.min", 0.0) * (1 - 0.6 * frac)
    elif fault == "low_power":
        factor = 1 - rng.uniform(0.05, 0.15)
        for key in ("gpu_power_w.mean", "gpu_power_w.min"):
            if key in perf:
                perf[key] *= factor
        perf["throttle_frac.power"] = min(
            1.0, perf.get("throttle_frac.power", 0.0) + rng.uniform(0.1, 0.3)
        )
    elif fault == "noisy_cpu":
        perf["foreign_cpu_frac"] = perf.get("foreign_cpu_frac", 0.0) + rng.uniform(0.03, 0.15)


def report(directory: str, topology: Optional[str]) -> Dict[str, Any]:
    """The real `slurm-hooks report --stragglers --json` (a subprocess, like an admin's run)."""
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as conf:
        if topology:
            conf.write('[fleet]\ntopology_conf = "%s"\n' % topology)
    env = dict(os.environ, SLURM_HOOKS_ALLOW_INSECURE_CONFIG="1", SLURM_HOOKS_CONFIG=conf.name)
    try:
        began = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "slurm_hooks", "report", "--stragglers", "--json", directory],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            cwd=REPO,
        )
        wall = time.monotonic() - began
    finally:
        os.unlink(conf.name)
    if done.returncode not in (0, 1):
        raise SystemExit("report failed: %s" % done.stderr[-2000:])
    data = json.loads(done.stdout)
    data["wall_s"] = round(wall, 2)
    return data


def evaluate(plan: HarshPlan, data: Dict[str, Any]) -> Dict[str, Any]:
    lead: Dict[str, str] = {}
    kinds_of: Dict[str, set] = {}
    for s in data["suspects"]:
        lead.setdefault(s["node"], fleet_synth.METRIC_KIND.get(s["metric"], "other"))
        kinds_of.setdefault(s["node"], set()).add(fleet_synth.METRIC_KIND.get(s["metric"]))
    rows = {}
    for kind in KINDS:
        planted = {n for n, (k, _) in plan.planted.items() if k == kind}
        persistent = {n for n in planted if plan.planted[n][1] >= 1.0}
        hits = {n for n in planted if kind in kinds_of.get(n, ())}  # a row of its kind
        rows[kind] = (
            len(hits & persistent),
            len(persistent),
            len(hits - persistent),
            len(planted - persistent),
        )
    wrong = sorted(n for n in lead if n not in plan.planted)
    rated = {s["node"] for s in data.get("rate_suspects", [])} - set(lead)
    saturating = {r["node"] for r in data.get("saturating", [])}
    stalls = {n for n, (k, _) in plan.planted.items() if k == "ib_stall"}
    switches = {r["switch"] for r in data.get("switch_suspects", [])}
    node_jobs = data["node_jobs"]
    return {
        "kinds": rows,
        "suspect_nodes": len(lead),
        "recall": round(len(set(lead) & set(plan.planted)) / max(1, len(plan.planted)), 3),
        "precision": round((len(lead) - len(wrong)) / len(lead), 3) if lead else None,
        "false_nodes": len(wrong),
        "false_under_bad_leaf": sum(1 for n in wrong if plan.leaves[n] in plan.bad_leaves),
        "false_odd": sum(1 for n in wrong if n in plan.odd),
        "false_per_10k": round(len(wrong) / node_jobs * 1e4, 2) if node_jobs else None,
        "rate_only_found": len(rated & set(plan.planted)),
        "rate_only_false": len(rated - set(plan.planted)),
        "ib_stall_in_saturating": "%d/%d" % (len(saturating & stalls), len(stalls)),
        "saturating_not_planted": len(saturating - set(plan.planted)),
        "saturating_under_bad_leaf": sum(
            1 for n in saturating if plan.leaves[n] in plan.bad_leaves
        ),
        "bad_leaves_found": "%d/%d" % (len(switches & plan.bad_leaves), len(plan.bad_leaves)),
        "wrong_switches": len(switches - plan.bad_leaves),
        "not_judged_saturated": sum(
            1 for r in data.get("not_judged", []) if r["why"] == "saturated"
        ),
        "node_jobs": node_jobs,
        "wall_s": data["wall_s"],
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=192)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=30)
    parser.add_argument("--clear-share", type=float, default=0.5)
    parser.add_argument("--wait", type=float, default=5e4, help="median healthy xmit-wait ticks/s")
    parser.add_argument("--healthy", action="store_true", help="nothing planted, no bad leaves")
    parser.add_argument("--speed", type=int, metavar="RECORDS")
    args = parser.parse_args(argv)
    now = time.time()
    plan = HarshPlan(args.nodes, args.seed, planted=not args.healthy)
    with tempfile.TemporaryDirectory(prefix="fleet-harsh-") as directory:
        records = os.path.join(directory, "jobs")
        topology = os.path.join(directory, "topology.conf")
        with open(topology, "w") as handle:
            handle.write(plan.topology_conf())
        if args.speed:
            made, batch = 0, 0
            while made < args.speed:
                counts = write_fleet(
                    records,
                    plan,
                    300,
                    args.seed + batch,
                    now,
                    args.clear_share,
                    body_gpus=fleet_synth.GPUS,
                    first_job=2000000 + batch * 300,
                )
                made += counts["records"]
                batch += 1
            data = report(records, topology)
            print(json.dumps({"records": data["records"], "wall_s": data["wall_s"]}))
            return 0
        counts = write_fleet(
            records, plan, args.jobs, args.seed + 1, now, args.clear_share, wait=args.wait
        )
        out = {"records": counts["records"]}
        out["without topology"] = evaluate(plan, report(records, None))
        try:
            out["with topology.conf"] = evaluate(plan, report(records, topology))
        except SystemExit as exc:  # the code before issue 30 has no [fleet] topology_conf
            out["with topology.conf"] = str(exc)[:200]
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
