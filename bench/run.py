#!/usr/bin/env python3
"""slurm-hooks benchmarks: prolog latency, where the time goes, cost growth, records, Slurm calls.

    .venv/bin/python bench/run.py            # full run (~10 min on 2 cores): prints a table, writes bench/results.md
    .venv/bin/python bench/run.py --quick    # fewer iterations (~2 min), also writes bench/results.md
    .venv/bin/python bench/run.py --smoke    # a few iterations, writes nothing (tests/test_bench_smoke.py)

Everything runs against fake nodes (tests/fakenode: sysfs/procfs tree + fake libnvidia-ml.so.1), built
in a temp dir (tmpfs when available), with the default configuration except: observe mode, state/log/
records paths in the temp dir, syslog off. The hooks run as slurmd runs them: a console script
`#!python -s` over a regular (non-editable) install of this checkout made in a temp venv, the layout
the RPM installs (bench/install.py: not the dev venv's editable install of the whole checkout),
no arguments, slurmd's job variables, no PATH.
Needs gcc and the `[test]` extra (nvidia-nvml-dev), like the tests; the drain-path Slurm figures use
a real slurmctld (tests/slurmcluster.py) when Slurm is installed and we are root, else the in-memory
backend. NVML figures are the fake library's: a real driver's nvmlInit and calls cost more.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench import breakdown, records_bench, slurm_bench, specs  # noqa: E402
from bench.install import make_install  # noqa: E402
from bench.measure import interleaved, least_squares, run_once, stats_of  # noqa: E402
from bench.nodeenv import BenchNode, log_fields, slurm_calls  # noqa: E402
from bench.render import Section, markdown, mib, ms, text, verdict  # noqa: E402

RESULTS = os.path.join(REPO, "bench", "results.md")
TARGET_P50_MS, TARGET_P99_MS, TARGET_REPORT_S, TARGET_RSS_MB = 100.0, 200.0, 5.0, 60.0

MODES: Dict[str, Dict[str, Any]] = {
    "full": dict(
        latency=200,
        warmup=3,
        importtime=5,
        probe=3,
        repeat=3,
        check_json=5,
        growth=8,
        growth_warmup=1,
        gpus=[1, 8, 16, 72],
        pcie=[0, 100, 200, 400],
        epilog=20,
        reports=[1000, 10000],
        report_runs=3,
        health=5,
        real_slurm=True,
    ),
    "quick": dict(
        latency=30,
        warmup=2,
        importtime=2,
        probe=1,
        repeat=3,
        check_json=2,
        growth=3,
        growth_warmup=1,
        gpus=[1, 8, 72],
        pcie=[0, 400],
        epilog=4,
        reports=[1000, 10000],
        report_runs=1,
        health=2,
        real_slurm=True,
    ),
    "smoke": dict(
        latency=3,
        warmup=1,
        importtime=1,
        probe=1,
        repeat=1,
        check_json=1,
        growth=1,
        growth_warmup=0,
        gpus=[1, 8],
        pcie=[0, 20],
        epilog=2,
        reports=[50, 200],
        report_runs=1,
        health=1,
        real_slurm=False,
    ),
}


class Bench:
    def __init__(self, mode: str):
        self.mode, self.cfg = mode, MODES[mode]
        self.install_dir = tempfile.mkdtemp(prefix="slurm-hooks-bench-install-")
        self.python, self.hook = make_install(self.install_dir)  # what nodes run: a regular install
        self.job_id = 1000
        self.sections: List[Section] = []
        self.failures: List[str] = []
        self.facts: Dict[str, Any] = {}

    def next_job(self) -> int:
        self.job_id += 1
        return self.job_id

    def log(self, message: str) -> None:
        print("[%s] %s" % (time.strftime("%H:%M:%S"), message), file=sys.stderr, flush=True)

    # ---------------------------------------------------------------- (1) latency
    def latency(self, node: BenchNode) -> None:
        cfg = self.cfg
        self.log(
            "latency: %d interleaved runs each of python -c pass, prolog, check" % cfg["latency"]
        )
        commands = {
            "python -c pass": ([self.python, "-s", "-c", "pass"], {"LANG": "C.UTF-8"}),
            "/bin/sh -c :": (["/bin/sh", "-c", ":"], {}),
            "slurm-hooks prolog": (self.hook + ["prolog"], node.hook_env("prolog", 1)),
            "slurm-hooks check --all-contexts --json": (
                self.hook + ["check", "--all-contexts", "--json"],
                node.base_env(),
            ),
        }

        def job_env(name: str, _i: int) -> Dict[str, str]:
            return {"SLURM_JOB_ID": str(self.next_job())} if name == "slurm-hooks prolog" else {}

        samples = interleaved(
            commands,
            cfg["latency"],
            cfg["warmup"],
            job_env,
            lambda name, s: self.failures.append("%s exited %d" % (name, s.returncode)),
        )
        base = stats_of(samples["python -c pass"]).median
        sec = Section(
            "1. Whole-process latency: dgx-h100 example node (8 GPUs), default config",
            [
                "command",
                "runs",
                "median ms",
                "p90 ms",
                "p99 ms",
                "max ms",
                "peak RSS MiB",
                "median / python -c pass",
            ],
        )
        for name, runs in samples.items():
            st = stats_of(runs).ms()
            sec.rows.append(
                [
                    name,
                    st["n"],
                    ms(st["median"]),
                    ms(st["p90"]),
                    ms(st["p99"]),
                    ms(st["max"]),
                    mib(max(s.max_rss_kb for s in runs)),
                    "%.1fx" % (st["median"] / (base * 1e3)),
                ]
            )
        prolog = stats_of(samples["slurm-hooks prolog"]).ms()
        rss_mb = max(s.max_rss_kb for s in samples["slurm-hooks prolog"]) / 1024.0
        self.facts.update(
            prolog=prolog,
            python_ms=base * 1e3,
            prolog_rss_mb=rss_mb,
            check=stats_of(samples["slurm-hooks check --all-contexts --json"]).ms(),
        )
        lines = [line for line in node.decision_lines() if "context=prolog" in line]
        bad = [
            line
            for line in lines
            if log_fields(line).get("status") != "OK" or slurm_calls(line) != 0
        ]
        self.facts["prolog_calls"] = (
            len(lines),
            max((slurm_calls(x) or 0 for x in lines), default=None),
        )
        sec.notes += [
            "target prolog p50 <= %.0f ms: %s (%.1f ms); p99 <= %.0f ms: %s (%.1f ms)"
            % (
                TARGET_P50_MS,
                verdict(prolog["median"] <= TARGET_P50_MS),
                prolog["median"],
                TARGET_P99_MS,
                verdict(prolog["p99"] <= TARGET_P99_MS),
                prolog["p99"],
            ),
            "peak RSS of the prolog (largest of it and its forked children) %.1f MiB: target <= %.0f MB %s"
            % (rss_mb, TARGET_RSS_MB, verdict(rss_mb * 1.048576 <= TARGET_RSS_MB)),
            "prolog decision lines: %d, with status != OK or slurm_calls != 0: %d"
            % (len(lines), len(bad)),
            "runs are interleaved (python, prolog, check, python, ...) after %d warm-up rounds; each prolog "
            "gets a new SLURM_JOB_ID, as slurmd would" % cfg["warmup"],
        ]
        self.sections.append(sec)

    # ---------------------------------------------------------------- (2) breakdown
    def breakdown(self, node: BenchNode) -> None:
        cfg = self.cfg
        self.log("breakdown: -X importtime, in-process probe, check --json")
        imports = breakdown.importtime(
            [self.python, "-s"],
            self.hook + ["prolog"],
            node.hook_env("prolog", self.next_job()),
            cfg["importtime"],
        )
        probe = breakdown.probe(self.python, node, cfg["probe"], cfg["repeat"])
        checks = breakdown.check_durations(
            self.hook + ["check", "--all-contexts", "--json"], node.base_env(), cfg["check_json"]
        )
        p = probe.get
        whole = self.facts["prolog"]["median"]

        def v(key: str) -> Optional[float]:
            value = p(key)
            return value * 1e3 if isinstance(value, (int, float)) else None

        threads = None
        if None not in (v("checks_threaded"), v("gather"), v("judge")):
            threads = v("checks_threaded") - v("gather") - v("judge")
        known = [self.facts["python_ms"], v("imports"), v("config"), v("checks_isolated")]
        rest = whole - sum(x for x in known if x is not None)
        sec = Section("2. Where a prolog's time goes (8 GPUs; medians)", ["phase", "ms", "what"])
        sec.rows += [
            ["whole prolog process", ms(whole), "section 1 median"],
            [
                "interpreter start",
                ms(self.facts["python_ms"]),
                "python -s -c pass (the console script's interpreter)",
            ],
            [
                "imports (prolog process)",
                ms(v("imports")),
                "CLI hook path, hooks, check modules (probe)",
            ],
            [
                "  (all processes)",
                ms(imports["total_s"] * 1e3),
                "python -X importtime: %d imports incl. the forked children's" % imports["modules"],
            ],
            [
                "config load + validation",
                ms(v("config")),
                "TOML, registry defaults, ownership checks",
            ],
            [
                "checks in the forked child",
                ms(v("checks_isolated")),
                "hooks.run_isolated_checks: %s prolog checks "
                "and the counter snapshot" % p("checks", "?"),
            ],
            [
                "  fork isolation (empty child)",
                ms(v("fork_empty")),
                "isolation.run_isolated(no-op)",
            ],
            ["  pynvml import", ms(v("pynvml_import")), "paid in each forked child that uses NVML"],
            ["  NVML init", ms(v("nvml_init")), "nvmlInit (fake library)"],
            [
                "  NVML calls",
                ms(v("nvml_calls")),
                "%s calls (fake library), sequential" % _n(p("nvml_call_count")),
            ],
            [
                "  sysfs/procfs reads",
                ms(v("host_reads")),
                "%s Host reads, sequential" % _n(p("host_read_calls")),
            ],
            ["  gatherers' own Python", ms(v("gather_other")), "parsing, topology"],
            ["  judging (pure checks)", ms(v("judge")), "check functions on the snapshots"],
            [
                "  threads (runner) overhead",
                ms(threads),
                "run_checks (threaded, NVML warm) - gather - judge",
            ],
            ["  counter snapshot", ms(v("snapshot_take")), "snapshot.take, NVML warm"],
            [
                "rest",
                ms(rest),
                "whole - the unindented rows: decision, log, snapshot file, exit (< 0: noise)",
            ],
        ]
        sec.notes.append(
            "indented rows are parts of the row above; phases come from separate processes "
            "(bench/probe.py), so they add up to the whole only roughly on a loaded machine"
        )
        sec.notes.append(
            "NVML figures are the fake library's (tests/fakenode): a real driver's nvmlInit and calls "
            "cost more, especially without persistence mode"
        )
        if probe.get("errors"):
            sec.notes.append("probe phases that failed (API changed?): %s" % probe["errors"])
        self.sections.append(sec)
        imp = Section(
            "2b. Imports of one prolog, top 15 by cumulative time (python -X importtime, median of %d)"
            % imports["runs"],
            ["module", "cumulative ms", "self ms"],
        )
        imp.rows += [
            [t["module"], ms(t["cumulative_s"] * 1e3), ms(t["self_s"] * 1e3)]
            for t in imports["top"]
        ]
        self.sections.append(imp)
        slow = Section(
            "2c. Slowest checks and gatherers", ["check / gatherer", "ms", "measured as"]
        )
        slow.rows += [
            [name, ms(sec_ * 1e3), "gatherer self time, sequential pass"]
            for name, sec_ in sorted((p("gatherers") or {}).items(), key=lambda kv: -kv[1])[:10]
        ]
        slow.rows += [
            [name, ms(sec_ * 1e3), "check --json duration_s (in its thread, gathers included)"]
            for name, sec_ in sorted(checks["checks"].items(), key=lambda kv: -kv[1])[:5]
        ]
        slow.notes.append(
            "check --all-contexts --json: run_checks took %s ms (median of %d)"
            % (ms((checks["run_checks_s"] or 0) * 1e3), checks["runs"])
        )
        self.sections.append(slow)

    # ---------------------------------------------------------------- (3) growth
    def growth(self) -> None:
        cfg = self.cfg
        rows_gpu, rows_pci = [], []
        for gpus in cfg["gpus"]:
            self.log("growth: %d GPUs" % gpus)
            rows_gpu.append(
                self._point(specs.gpu_node_spec(gpus), None, gpus, gpus == cfg["gpus"][-1])
            )
        for extra in cfg["pcie"]:
            self.log("growth: dgx-h100 + %d NVMe" % extra)
            rows_pci.append(
                self._point(
                    "dgx-h100", specs.pcie_node_spec(extra), extra, extra == cfg["pcie"][-1]
                )
            )
        sec = Section(
            "3. Cost growth (medians of %d runs per point)" % cfg["growth"],
            ["node", "GPUs", "PCI functions", "prolog ms", "prolog p90 ms", "check ms"],
        )
        for label, rows in (
            ("%d-GPU (4 per switch/NUMA)", rows_gpu),
            ("dgx-h100 + %d NVMe", rows_pci),
        ):
            for r in rows:
                sec.rows.append(
                    [
                        label % r["x"],
                        r["gpus"],
                        r["pci"],
                        ms(r["prolog"]),
                        ms(r["prolog_p90"]),
                        ms(r["check"]),
                    ]
                )
        for what, rows, xkey, scale, unit in (
            ("GPU", rows_gpu, "gpus", 1, "ms per GPU"),
            ("PCIe", rows_pci, "pci", 100, "ms per 100 PCI functions"),
        ):
            for cmd in ("prolog", "check"):
                slope, icpt, r2 = least_squares([(r[xkey] / scale, r[cmd]) for r in rows])
                sec.notes.append(
                    "%s vs %s: %s %s (intercept %s ms, r^2 %.3f)"
                    % (cmd, what, ms(slope, 2), unit, ms(icpt), r2)
                )
        for label, rows in (("%d GPUs", rows_gpu), ("dgx-h100 + %d NVMe", rows_pci)):
            top = rows[-1].get("gatherers") or []
            if top:
                listed = ", ".join("%s %s ms" % (name, ms(value * 1e3)) for name, value in top)
                sec.notes.append(
                    "largest gatherers on %s (self time, sequential): %s"
                    % (label % rows[-1]["x"], listed)
                )
        sec.notes.append(
            "GPU nodes: one switch and one NUMA node per 4 GPUs, one 400G HCA per GPU, 288 CPUs "
            "throughout (bench/specs.py); PCIe: extra NVMe drives on host bridges"
        )
        self.sections.append(sec)

    def _point(
        self, spec: Any, overrides: Optional[Dict[str, Any]], x: int, probe: bool = False
    ) -> Dict[str, Any]:
        node = BenchNode.create(spec, overrides)
        try:
            commands = {
                "prolog": (self.hook + ["prolog"], node.hook_env("prolog", 1)),
                "check": (self.hook + ["check", "--all-contexts", "--json"], node.base_env()),
            }
            samples = interleaved(
                commands,
                self.cfg["growth"],
                self.cfg["growth_warmup"],
                lambda name, _i: {"SLURM_JOB_ID": str(self.next_job())} if name == "prolog" else {},
                lambda name, s: self.failures.append(
                    "growth %s %s exited %d" % (x, name, s.returncode)
                ),
            )
            prolog = stats_of(samples["prolog"]).ms()
            gatherers = (
                breakdown.probe(self.python, node, 1, 1).get("gatherers") or {} if probe else {}
            )
            return {
                "x": x,
                "gpus": node.gpu_count,
                "pci": specs.pci_function_count(node.node.spec),
                "prolog": prolog["median"],
                "prolog_p90": prolog["p90"],
                "check": stats_of(samples["check"]).ms()["median"],
                "gatherers": sorted(gatherers.items(), key=lambda kv: -kv[1])[:3],
            }
        finally:
            node.cleanup()

    # ---------------------------------------------------------------- (4) records
    def records(self, node: BenchNode) -> None:
        cfg = self.cfg
        self.log(
            "records: %d prolog/epilog pairs, report over %s records"
            % (cfg["epilog"], cfg["reports"])
        )
        epi = records_bench.epilog_runs(node, self.hook, cfg["epilog"], self.next_job() + 100000)
        self.job_id += cfg["epilog"] + 100000
        lines = [line for line in node.decision_lines() if "context=epilog" in line]
        self.facts["epilog_calls"] = (
            len(lines),
            max((slurm_calls(x) or 0 for x in lines), default=None),
        )
        if epi["failures"]:
            self.failures.append("epilog: %d runs failed or wrote no record" % epi["failures"])
        sec = Section(
            "4. Epilog record and `slurm-hooks report`",
            ["what", "runs", "median ms", "p90 ms", "peak RSS MiB", "size / notes"],
        )
        w = epi["wall"]
        sec.rows.append(
            [
                "epilog (8 GPUs, record written)",
                w["n"],
                ms(w["median"]),
                ms(w["p90"]),
                mib(epi["max_rss_kb"]),
                "record %s bytes; build %s ms, epilog snapshot %s ms"
                % (
                    _n(epi["size_bytes"]),
                    ms(epi["record_build_ms"], 2),
                    ms(epi["epilog_snapshot_ms"]),
                ),
            ]
        )
        if not epi["template"]:
            sec.notes.append("no epilog record was written: report benchmark skipped")
            self.sections.append(sec)
            return
        reports = records_bench.report_benchmark(
            self.hook, node.base_env(), epi["template"], cfg["reports"], cfg["report_runs"]
        )
        for count, r in reports.items():
            rw = r["wall"]
            rss_mb = r["max_rss_kb"] / 1024.0
            sec.rows.append(
                [
                    "report over %d records" % count,
                    rw["n"],
                    ms(rw["median"]),
                    ms(rw["p90"]),
                    mib(r["max_rss_kb"]),
                    "%.1f MB of records; report's own time %s s"
                    % (r["bytes"] / 1e6, "-" if r["report_s"] is None else "%.2f" % r["report_s"]),
                ]
            )
            if count >= 10000:
                sec.notes.append(
                    "target report over 10,000 records <= %.0f s: %s (%.2f s); peak RSS <= %.0f MB: "
                    "%s (%.1f MiB)"
                    % (
                        TARGET_REPORT_S,
                        verdict(rw["median"] / 1e3 <= TARGET_REPORT_S),
                        rw["median"] / 1e3,
                        TARGET_RSS_MB,
                        verdict(rss_mb * 1.048576 <= TARGET_RSS_MB),
                        rss_mb,
                    )
                )
            if r["failures"]:
                self.failures.append("report over %d records failed" % count)
        sec.notes.append(
            "records: clones of a real epilog record, 50 per node, ~10%% with ECC deltas, 2%% Xids, "
            "1%% leftovers; summaries recomputed by recordbuild.summarize; files in %s (page cache "
            "warm after the first run)" % _fs_of("/tmp")
        )
        self.sections.append(sec)

    # ---------------------------------------------------------------- (5) Slurm calls
    def slurm(self, node: BenchNode) -> None:
        cfg = self.cfg
        self.log("slurm calls: %d health runs, drain path" % cfg["health"])
        before = len(node.decision_lines())
        for _ in range(cfg["health"]):
            run_once(self.hook + ["health"], node.health_env())
        lines = [x for x in node.decision_lines()[before:] if "context=health" in x]
        health = (len(lines), max((slurm_calls(x) or 0 for x in lines), default=None))
        sec = Section(
            "5. Slurm calls per hook run (slurm_calls=N of the decision log line)",
            ["run", "runs / exit", "slurm calls (max)", "outcome", "wall ms"],
        )
        for label, (n, top) in (
            ("prolog, healthy", self.facts.get("prolog_calls", (0, None))),
            ("epilog, healthy", self.facts.get("epilog_calls", (0, None))),
            ("health, healthy", health),
        ):
            sec.rows.append([label, n, "-" if top is None else top, "pass", ""])
            if top:
                self.failures.append("%s made %d Slurm calls (must be 0)" % (label, top))
        drain = slurm_bench.drain_path(self.hook, cfg["real_slurm"], self.next_job() + 200000)
        for step in drain.get("steps", []):
            sec.rows.append(
                [
                    step["step"],
                    "exit %s" % step["exit"],
                    step["slurm_calls"],
                    step["outcome"],
                    ms(step["wall_ms"]),
                ]
            )
        worst = max((s["slurm_calls"] or 0 for s in drain.get("steps", [])), default=None)
        sec.notes.append(
            "drain path backend: %s%s"
            % (drain.get("backend"), "; " + drain["note"] if "note" in drain else "")
        )
        sec.notes.append(
            "most calls in one run: %s (bound: show node + list nodes + drain + re-count = 4; 5 when "
            "the breaker undoes the drain)" % worst
        )
        sec.notes.append(
            "exit 10 = the node must not run jobs; prolog.d/epilog.d turn it into 1 for slurmd"
        )
        if "error" in drain:
            self.failures.append("drain path: %s" % drain["error"])
        self.sections.append(sec)

    def run(self) -> None:
        node = BenchNode.create("dgx-h100")
        try:
            self.latency(node)
            self.breakdown(node)
            self.records(node)
            self.slurm(node)
            self.growth()
        finally:
            node.cleanup()
            shutil.rmtree(self.install_dir, ignore_errors=True)
        self.sections.sort(
            key=lambda sec: sec.title.split(" ", 1)[0]
        )  # growth runs last, shows third


def _n(value: Any) -> str:
    return "-" if value is None else "%d" % value


def _fs_of(path: str) -> str:
    best: Tuple[int, str] = (-1, "?")
    try:
        with open("/proc/mounts") as handle:
            for line in handle:
                parts = line.split()
                if (
                    len(parts) > 2
                    and (path + "/").startswith(parts[1].rstrip("/") + "/")
                    and len(parts[1]) > best[0]
                ):
                    best = (len(parts[1]), parts[2])
    except OSError:
        pass
    return "%s (%s)" % (path, best[1])


def machine(load_start: Sequence[float], load_end: Sequence[float], started: float) -> List[str]:
    model = "?"
    try:
        with open("/proc/cpuinfo") as handle:
            model = next(
                (line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")),
                "?",
            )
    except OSError:
        pass
    commit = _git("rev-parse", "--short=12", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no", "--", "slurm_hooks")
    return [
        "- machine: %s, %d CPUs (os.cpu_count), %s, kernel %s"
        % (model, os.cpu_count() or 0, platform.machine(), platform.release()),
        "- python: %s (%s)" % (platform.python_version(), sys.executable),
        "- date: %s, run took %.0f s"
        % (time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started)), time.time() - started),
        "- git commit: %s%s" % (commit, " + uncommitted changes in slurm_hooks/" if dirty else ""),
        "- load average (1/5/15 min) at start: %s; at end: %s (the machine is shared: other work adds noise)"
        % (" ".join("%.2f" % x for x in load_start), " ".join("%.2f" % x for x in load_end)),
    ]


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git"] + list(args), cwd=REPO, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="fewer iterations (~2 min)")
    group.add_argument(
        "--smoke", action="store_true", help="a few iterations, no results file (CI)"
    )
    parser.add_argument("--output", default=RESULTS, help="results file (default bench/results.md)")
    args = parser.parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    started, load_start = time.time(), os.getloadavg()
    bench = Bench(mode)
    bench.run()
    header = machine(load_start, os.getloadavg(), started) + [
        "- mode: %s (`bench/run.py%s`)" % (mode, "" if mode == "full" else " --" + mode)
    ]
    if bench.failures:
        header.append("- problems: " + "; ".join(bench.failures[:10]))
    print(text(bench.sections, header))
    if mode != "smoke":
        with open(args.output, "w") as handle:
            handle.write(markdown(bench.sections, header, "slurm-hooks benchmark results") + "\n")
        print("wrote %s" % os.path.relpath(args.output, REPO))
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
