"""Records for the straggler tests, in the epilog's layout (records.store.encode_record: the header line
first, signed with KEY) under DIR/<node>/<job>.json with the file's mtime at the job's end; figures from
bench/fleet_synth.py's noise model, or set by hand where a test needs one exact value."""

from __future__ import annotations

import os
import random
import time

from bench import fleet_synth
from slurm_hooks.core.config import SECTIONS
from slurm_hooks.records.names import record_name
from slurm_hooks.records.store import encode_record

NOW = time.time()
# the records key of the test fleet: every record here is signed with it, as the epilog signs with
# [records] key_file (records/signing.py); a test that verifies gives the scan this key
KEY = bytes(range(7, 39))
HW = "throttle_frac.hw_slowdown"


def settings(**changes):
    values = {k: s.default for k, s in SECTIONS["fleet"].items()}
    values.update(changes)
    return values


def healthy(rng):
    return {
        HW: 0.0,
        "gpu_power_w.mean": round(rng.gauss(500, 8), 1),
        "ib_xmit_wait_per_s": rng.uniform(9e4, 1.1e5),
        "foreign_cpu_frac": 0.001,
    }


def write(
    directory,
    node,
    job_id,
    perf,
    end,
    start=None,
    user="alice",
    mtime=None,
    record_node=None,
    boot="4f0c1a52-9d1e-4c3b-8a57-2e6b0d9c7f31",
    hw="NVIDIA H100 80GB HBM3 x8",
    restart=0,
):
    record = fleet_synth.header_record(
        str(job_id),
        user,
        record_node or node,
        start or end - 3600,
        end,
        perf,
        boot_id=boot,
        hw_class=hw,
    )
    if boot is None:  # a record of a version before boot_id
        del record["boot_id"]
    if restart:  # a requeued job's rerun (records/names.py)
        record["job"]["restart_count"] = restart
    path = os.path.join(directory, node, record_name(str(job_id), restart))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(encode_record(record, KEY, node, os.path.basename(path)))
    stamp = end if mtime is None else mtime
    os.utime(path, (stamp, stamp))
    return path


def write_jobs(
    directory,
    jobs=12,
    nodes=6,
    slow="n03",
    slow_every=1,
    seed=1,
    first_job=100,
    names=None,
    boot_of=lambda node, j: "4f0c1a52-9d1e-4c3b-8a57-2e6b0d9c7f31",
    slow_in=lambda j: True,
    slow_figure=HW,
    slow_value=0.2,
    perf_of=None,
):
    """`jobs` jobs on all `nodes` nodes an hour apart; `slow` spends 20 % in HW slowdown (or has
    slow_figure at slow_value) in every `slow_every`-th job for which slow_in(j). Users alternate.
    Records of a job are written in a shuffled node order with mtimes up to a minute apart;
    boot_of(node, j) is the record's boot id; perf_of(rng) the healthy figures (healthy())."""
    rng = random.Random(seed)
    names = list(names or ["n%02d" % i for i in range(nodes)])
    for j in range(jobs):
        end = NOW - (jobs - j) * 3600
        order = names[:]
        rng.shuffle(order)
        for node in order:
            perf = (perf_of or healthy)(rng)
            if node == slow and j % slow_every == 0 and slow_in(j):
                perf[slow_figure] = slow_value
            write(
                directory,
                node,
                first_job + j,
                perf,
                end,
                user="user%d" % (j % 3),
                mtime=end + rng.uniform(0, 60),
                boot=boot_of(node, j),
            )
    return names


def write_key(path, key=KEY):
    """The records key file (mode 0600, like /etc/slurm-hooks/records.key); its path."""
    with open(str(path), "wb") as handle:
        handle.write(key)
    os.chmod(str(path), 0o600)
    return str(path)


def write_untrusted(directory, node, job, perf_figures, untrusted=None):
    """An unsigned record of `job` on `node` whose summary says which figures could not be trusted
    (summary.perf_untrusted: a saturated or cleared IB counter), ending 400 s + job before NOW."""
    record = fleet_synth.header_record(
        str(job), "alice", node, NOW - 4000 - job, NOW - 400 - job, perf_figures
    )
    if untrusted:
        record["summary"]["perf_untrusted"] = untrusted
    path = os.path.join(directory, node, "%d.json" % job)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(encode_record(record))
    os.utime(path, (NOW - 400 - job, NOW - 400 - job))
