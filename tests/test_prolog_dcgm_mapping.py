"""The prolog's dcgm-exporter mapping (records/dcgm.py) names the job's GPUs by NVML index, taken from
the counter snapshot; the check child stores that snapshot and sends the parent only the indices
(hooks/bounded.py), so this runs the real prolog.d script end to end (tests/prolog_rig.py)."""

from __future__ import annotations

import json
import os

from tests.prolog_rig import Prolog


def test_the_prolog_maps_every_gpu_of_the_job_for_dcgm_exporter(fake_node, tmp_path):
    prolog = Prolog(fake_node("dgx-h100"), tmp_path)
    dcgm_dir = tmp_path / "dcgm"
    dcgm_dir.mkdir()
    prolog.place(dcgm_dir=dcgm_dir)
    rc, _seconds, stderr = prolog.run()
    assert rc == 0, stderr
    with open(os.path.join(str(prolog.state_dir), "snapshots", "4242.json")) as handle:
        stored = json.load(handle)
    indices = sorted(str(gpu["index"]) for gpu in stored["gpus"])
    assert len(indices) == 8 and stored["gpus"][0]["counters"]  # the file has the counters
    assert sorted(os.listdir(str(dcgm_dir))) == indices
    assert {(dcgm_dir / name).read_text() for name in indices} == {"4242\n"}
