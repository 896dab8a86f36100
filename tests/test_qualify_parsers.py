"""The qualification tools' parsers against real outputs (tests/captures/diag/README.md names each
source). The expected figures are read off the files by eye, never from our own output."""

from __future__ import annotations

import os

import pytest

from slurm_hooks.qualify import ParseError, dcgm, nccl, nvbandwidth, perftest

DIAG = os.path.join(os.path.dirname(__file__), "captures", "diag")


def capture(name: str) -> str:
    with open(os.path.join(DIAG, name), encoding="utf-8") as handle:
        return handle.read()


@pytest.mark.parametrize(
    "name, form, version, tests, failed",
    [
        ("dcgm-2.x-json-pass.json", "json", None, 9, {}),
        ("dcgm-2.x-json-fail.json", "json", None, 9, {"Persistence Mode": {}}),
        (
            "dcgm-3.x-json-per-gpu.json",
            "json",
            "1.7",
            17,
            {"sm_stress": {0: "fail", 2: "fail", 3: "fail"}},
        ),
        ("dcgm-3.0.4-r3-text.txt", "text", None, 9, {}),
        ("dcgm-3.3.1-r2-text-head.txt", "text", "3.3.1", 7, {}),
        ("dcgm-3.3.1-r2-text-fail.txt", "text", None, 1, {"GPU Memory": {0: "fail"}}),
        ("dcgm-3.3.5-r3-text.txt", "text", "3.3.5", 4, {}),
        ("dcgm-3.3.7-r2-text.txt", "text", "3.3.7", 1, {}),
        ("dcgm-4.2.3-text.txt", "text", "4.2.3", 1, {}),
        ("dcgm-4.4.1-r1-text.txt", "text", "4.4.1", 0, {}),
        ("dcgm-4.x-json-composed.json", "json", "4.2.3", 2, {"memory": {0: "fail"}}),
    ],
)
def test_dcgm_outputs_of_every_version_and_form(name, form, version, tests, failed):
    report = dcgm.parse(capture(name))
    assert (report.form, report.version, len(report.tests)) == (form, version, tests)
    got = {t.name: {g: s for g, s in t.gpus.items() if s == "fail"} for t in report.failed()}
    assert got == failed


def test_dcgm_4x_text_rows_name_each_gpu():
    (software,) = dcgm.parse(capture("dcgm-4.2.3-text.txt")).tests
    assert (software.category, software.name, software.status) == ("Deployment", "software", "pass")
    assert software.gpus == {0: "pass", 1: "pass", 2: "pass", 3: "pass"}


def test_dcgm_3x_text_keeps_the_warning_of_the_failed_gpu():
    (memory,) = dcgm.parse(capture("dcgm-3.3.1-r2-text-fail.txt")).tests
    assert memory.gpus == {1: "pass", 0: "fail"}
    assert memory.messages[0].startswith("GPU 0 Error using CUDA API cuCtxCreate")
    assert "busy or unavailable" in memory.messages[0]


def test_dcgm_json_warning_and_skips():
    report = dcgm.parse(capture("dcgm-2.x-json-fail.json"))
    assert {t.name: t.status for t in report.tests if t.status != "pass"} == {
        "Persistence Mode": "fail",
        "Environment Variables": "warn",
    }
    per_gpu = dcgm.parse(capture("dcgm-3.x-json-per-gpu.json"))
    skipped = {t.name for t in per_gpu.tests if t.status == "skip"}
    assert skipped == {"diagnostic", "memory_bandwidth", "targeted_stress", "targeted_power"}
    (stress,) = [t for t in per_gpu.tests if t.name == "sm_stress"]
    assert "Max stress level of 2128.7 did not exceed" in stress.messages[0]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Error: unable to establish a connection to the specified host: localhost\n",
        "Error: Unable to complete diagnostic for group 2. Return: -30 nvvs error\n",
        '{"DCGM Diagnostic": {"test_categories": [{"category": "x", "tests": [{"name": "m", '
        '"results": [{"status": "Maybe"}]}]}]}}',
        '{"DCGM Diagnostic": {"test_categories": ',
        "| memory                    | Purple                                         |\n",
        '{"test_categories": ' + "[" * 200000 + "]" * 200000 + "}",
    ],
)
def test_dcgm_errors_and_garbage_are_parse_errors(text):
    with pytest.raises(ParseError):
        dcgm.parse(text)


def test_nvbandwidth_per_gpu_figures():
    report = nvbandwidth.parse(capture("nvbandwidth-v0.2-rtx4090x8.txt"))
    assert report.version == "v0.2" and report.devices[7] == "NVIDIA GeForce RTX 4090"
    h2d = report.matrices["host_to_device_memcpy_ce"]
    assert h2d.total == 205.04 and h2d.per_gpu()[2] == 23.90 and h2d.per_gpu()[5] == 26.38
    assert report.matrices["device_to_host_memcpy_ce"].per_gpu()[0] == 26.77


def test_nvbandwidth_device_to_device_matrix_skips_na():
    d2d = nvbandwidth.parse(capture("nvbandwidth-v0.8-a6000x6-d2d.txt")).matrices[
        "device_to_device_memcpy_read_ce"
    ]
    assert d2d.total == 715.53 and (0, 0) not in d2d.cells and d2d.cells[(0, 1)] == 26.34
    # GPU 0's pairs, sorted: 21.80 21.82 21.86 21.95 22.64 | 22.64 26.34 26.34 26.34 26.35
    assert d2d.per_gpu()[0] == 22.64


def test_nvbandwidth_matrices_without_sum_lines_and_devices_with_bus_ids():
    report = nvbandwidth.parse(capture("nvbandwidth-h100x8-sm.txt"))
    assert report.matrices["host_to_device_memcpy_sm"].per_gpu()[6] == 35.39
    one = nvbandwidth.parse(capture("nvbandwidth-v0.8-a100-h2d-sm.txt"))
    assert one.devices == {0: "NVIDIA A100-SXM4-40GB"}
    assert one.matrices["host_to_device_memcpy_sm"].total == 25.13


def test_nvbandwidth_failed_copy_is_reported():
    report = nvbandwidth.parse(capture("nvbandwidth-v0.7-a100x8-assert.txt"))
    assert report.matrices == {} and len(report.devices) == 8
    assert any(e.startswith("ASSERT in expression h_errorFlag == 0") for e in report.errors)


def test_nvbandwidth_gh200_waived_and_latency():
    report = nvbandwidth.parse(capture("nvbandwidth-v0.6-gh200-superbench.txt"))
    assert report.matrices["device_to_host_memcpy_ce"].total == 607.26
    assert report.matrices["host_device_latency_sm"].title.startswith("memory latency")


@pytest.mark.parametrize(
    "text",
    ["", "garbage\n" * 10, "memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)\n 0 1\n0 1.0\n"],
)
def test_nvbandwidth_garbage_is_a_parse_error(text):
    with pytest.raises(ParseError):
        nvbandwidth.parse(text)


def test_nccl_old_format_rows_and_summary():
    report = nccl.parse(capture("nccl-allreduce-a100x8-superbench.txt"))
    assert (
        len(report.rows) == 34
        and report.devices[0] == "A100-SXM4-40GB"
        and len(report.devices) == 8
    )
    assert report.out_of_bounds == 0 and report.avg_busbw == 68.4048 and report.wrong() == 0
    assert report.rows[-1] == nccl.NcclRow(8589934592, 235.26, None)
    assert report.large_busbw(8 << 30) == 235.26


def test_nccl_wrong_column_format():
    report = nccl.parse(capture("nccl-allreduce-ring-nccltests252.txt"))
    assert [r.size for r in report.rows][0] == 536870912 and report.rows[0].wrong == 0
    assert report.rows[0].busbw == 97.09 and report.avg_busbw == 95.3009
    one = nccl.parse(capture("nccl-alltoall-1gpu-nccltests287.txt"))
    assert one.rows == [nccl.NcclRow(33554432, 0.0, 0)]


def test_nccl_wrong_counts_warn_lines_and_mpi_prefixes():
    text = (
        "[1,0]<stdout>:     1048576        262144     float     sum      -1    74.78   14.02   24.54"
        "      3    76.17   13.77   24.09      0\n"
        "node1:123:456 [0] NCCL WARN NET/IB : Got completion with error 12, opcode 0\n"
        "# Out of bounds values : 3 FAILED\n"
    )
    report = nccl.parse(text)
    assert report.wrong() == 3 and report.out_of_bounds == 3
    assert report.warnings == ["NET/IB : Got completion with error 12, opcode 0"]


def test_nccl_garbage_is_a_parse_error():
    with pytest.raises(ParseError):
        nccl.parse("Segmentation fault (core dumped)\n")


def test_perftest_mb_and_gbit_tables():
    report = perftest.parse(capture("ib_write_bw-loopback-8M-superbench.txt"))
    assert (report.device, report.link_type) == ("ib0", "IB") and len(report.rows) == 2
    assert report.best_gbits() == pytest.approx(24056.72 * 8 / 1000)
    gbits = perftest.parse(capture("ib_write_bw-gbits-perftest273.txt"))
    assert gbits.rows == [perftest.BwRow(8, 224958464, 0.48)] and gbits.link_type == "Ethernet"


def test_perftest_without_a_result_is_a_parse_error():
    with pytest.raises(ParseError):
        perftest.parse(capture("ib_write_bw-use_cuda-a30-perftest241.txt"))
