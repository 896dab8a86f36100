"""The snapshot's NVLink error counters: one nvmlDeviceGetFieldValues call per GPU gives what the per-link
nvmlDeviceGetNvLinkErrorCounter calls give, and the per-link calls stand in wherever the batch cannot."""

from __future__ import annotations

import collections
import re

import pytest

from slurm_hooks.hw import nvml
from slurm_hooks.hw.host import Host
from slurm_hooks.records import counters, nvlink_errors
from tests.fakenode.fakenvml import find_nvml_header

# Values on links in both of nvml.h's id runs (0-5, 6-11) and past them (12-17, per-link calls only);
# link 9 inactive: neither read nor summed.
LINK_VALUES = {
    "gpu.1.nvlink.links.0.errors.replay": 3,
    "gpu.1.nvlink.links.5.errors.crc_flit": 11,
    "gpu.1.nvlink.links.6.errors.recovery": 2,
    "gpu.1.nvlink.links.9.errors.crc_data": 500,
    "gpu.1.nvlink.links.9.state": 0,
    "gpu.1.nvlink.links.11.errors.ecc_data": 7,
    "gpu.1.nvlink.links.11.errors.crc_data": 4,
    "gpu.1.nvlink.links.12.errors.replay": 5,
    "gpu.1.nvlink.links.17.errors.ecc_data": 1 << 40,
    "gpu.0.nvlink.links.3.errors.crc_data": 8,
}


def counted_take(monkeypatch, node):
    """counters.take of GPUs 0 and 1 -> (snapshot, {NVML function: calls})."""
    calls = collections.Counter()
    real_call = nvml.NvmlSession.call

    def call(self, function, *args, **kwargs):
        calls[function] += 1
        return real_call(self, function, *args, **kwargs)

    monkeypatch.setattr(nvml.NvmlSession, "call", call)
    snap = counters.take(Host(str(node.root)), "", gpus=[0, 1])
    monkeypatch.setattr(nvml.NvmlSession, "call", real_call)
    return snap, calls


def nvlink_part(snap):
    return [
        (
            gpu.get("nvlink"),
            {k: v for k, v in gpu["counters"].items() if k.startswith("nvlink.")},
            gpu["unavailable"].get("nvlink"),
        )
        for gpu in snap["gpus"]
    ]


def test_the_field_ids_are_nvml_hs():
    """Every NVML_FI_DEV_NVLINK_<counter>_ERROR_COUNT_L<n> nvml.h defines, and no other id."""
    header = find_nvml_header().read_text(errors="replace")
    defined = {
        (name.lower(), int(link)): int(value)
        for name, link, value in re.findall(
            r"#define\s+NVML_FI_DEV_NVLINK_(REPLAY|RECOVERY|CRC_FLIT|CRC_DATA|ECC_DATA)"
            r"_ERROR_COUNT_L(\d+)\s+(\d+)",
            header,
        )
    }
    ours = {
        (name, link): nvlink_errors.error_field_id(name, link)
        for name in nvlink_errors.NVLINK_COUNTERS
        for link in range(nvlink_errors.MAX_NVLINKS)
        if nvlink_errors.error_field_id(name, link) is not None
    }
    assert len(defined) == 60 and ours == defined


def test_the_fake_answers_each_field_as_its_per_link_call(gpu_node):
    """Faithful fake: the field of (link, counter) equals nvmlDeviceGetNvLinkErrorCounter(link, counter);
    an id it does not know is NOT_SUPPORTED in its own entry, the others still answer."""
    gpu_node.set_states(LINK_VALUES)
    pynvml = nvml.session().pynvml
    handle = pynvml.nvmlDeviceGetHandleByIndex(1)
    asked = [
        (nvlink_errors.error_field_id(name, link), link)
        for link in range(12)
        for name in nvlink_errors.NVLINK_COUNTERS
    ]
    entries = pynvml.nvmlDeviceGetFieldValues(handle, asked + [(9999, 0)])
    for (field_id, link), entry in zip(asked, entries):
        code = nvlink_errors.NVLINK_COUNTERS.index(
            next(
                n
                for n in nvlink_errors.NVLINK_COUNTERS
                if nvlink_errors.error_field_id(n, link) == field_id
            )
        )
        assert entry.fieldId == field_id and entry.nvmlReturn == 0
        assert entry.value.ullVal == pynvml.nvmlDeviceGetNvLinkErrorCounter(handle, link, code)
    assert entries[-1].nvmlReturn == nvml.NOT_SUPPORTED
    assert entries[5 * 5 + 2].value.ullVal == 11  # link 5, crc_flit: a value set above, not a zero


def test_batched_read_equals_the_per_link_read_with_fewer_calls(gpu_node, monkeypatch):
    gpu_node.set_states(LINK_VALUES)
    batched, calls = counted_take(monkeypatch, gpu_node)
    gpu_node.set_states(
        {"gpu.0.nvlink.error_fields.supported": 0, "gpu.1.nvlink.error_fields.supported": 0}
    )
    per_link, per_link_calls = counted_take(monkeypatch, gpu_node)
    assert nvlink_part(batched) == nvlink_part(per_link)
    gpu1 = batched["gpus"][1]
    assert gpu1["nvlink"]["17"]["ecc_data"] == 1 << 40 and "9" not in gpu1["nvlink"]
    assert gpu1["counters"]["nvlink.crc_data"] == 4 and gpu1["counters"]["nvlink.replay"] == 8
    # 18 links a GPU, 17 active on GPU 1: only links 12-17 go through the per-link call
    assert calls["nvmlDeviceGetNvLinkErrorCounter"] == 2 * 6 * 5
    assert per_link_calls["nvmlDeviceGetNvLinkErrorCounter"] == (18 + 17) * 5


@pytest.mark.parametrize(
    "fault",
    [
        {
            "fault.nvmlDeviceGetFieldValues.1": 13
        },  # FUNCTION_NOT_FOUND: a driver before field values
        {"gpu.1.nvlink.error_fields.supported": 0},  # every entry NOT_SUPPORTED
    ],
)
def test_without_the_batch_the_per_link_calls_give_the_same_record(gpu_node, monkeypatch, fault):
    gpu_node.set_states(LINK_VALUES)
    expected, _ = counted_take(monkeypatch, gpu_node)
    gpu_node.set_states(fault)
    got, calls = counted_take(monkeypatch, gpu_node)
    assert nvlink_part(got) == nvlink_part(expected)
    assert (
        calls["nvmlDeviceGetNvLinkErrorCounter"] == (6 + 17) * 5
    )  # GPU 0's links 12-17, all of GPU 1's
    assert "nvlink" not in got["gpus"][1]["unavailable"]


def test_a_pynvml_that_cannot_pass_a_scope_falls_back(gpu_node, monkeypatch):
    """nvidia-ml-py before scopeId support assigns each item to fieldId: a tuple is a TypeError."""
    gpu_node.set_states(LINK_VALUES)
    expected, _ = counted_take(monkeypatch, gpu_node)
    pynvml = nvml.session().pynvml
    real = pynvml.nvmlDeviceGetFieldValues

    def old_binding(handle, field_ids):
        if any(isinstance(f, tuple) for f in field_ids):
            raise TypeError("an integer is required")
        return real(handle, field_ids)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetFieldValues", old_binding)
    got, calls = counted_take(monkeypatch, gpu_node)
    assert nvlink_part(got) == nvlink_part(expected)
    assert calls["nvmlDeviceGetNvLinkErrorCounter"] == (18 + 17) * 5


def test_a_per_link_failure_still_makes_the_group_unavailable(gpu_node):
    """A link past 11 whose per-link read fails: the group is unavailable and has no totals, as before."""
    gpu_node.set_states(LINK_VALUES)
    gpu_node.inject_fault("nvmlDeviceGetNvLinkErrorCounter", 1, 15)
    gpu1 = counters.take(Host(str(gpu_node.root)), "", gpus=[1])["gpus"][0]
    assert gpu1["unavailable"]["nvlink"] == "GPU_IS_LOST"
    assert not any(k.startswith("nvlink.") for k in gpu1["counters"])


def test_a_failing_link_probe_records_the_links_before_it(gpu_node):
    """nvmlDeviceGetNvLinkState failing on GPU 1 (every link): nothing recorded, the group unavailable."""
    gpu_node.inject_fault("nvmlDeviceGetNvLinkState", 1, 15)
    gpu1 = counters.take(Host(str(gpu_node.root)), "", gpus=[1])["gpus"][0]
    assert gpu1["unavailable"]["nvlink"] == "GPU_IS_LOST" and "nvlink" not in gpu1
    assert not any(k.startswith("nvlink.") for k in gpu1["counters"])


def test_an_entry_that_echoes_another_field_is_not_taken(gpu_node, monkeypatch):
    """nvmlFieldValue_t carries its fieldId back (nvml.h): an entry answered SUCCESS for a field we
    did not ask in that place (a driver that reorders or rewrites entries) must not be booked under
    the link and counter asked there; the per-link call answers for it instead."""
    import ctypes

    gpu_node.set_states(LINK_VALUES)
    expected, _ = counted_take(monkeypatch, gpu_node)
    pynvml = nvml.session().pynvml
    real = pynvml.nvmlDeviceGetFieldValues

    def reordering_driver(handle, field_ids):
        entries = real(handle, field_ids)
        if len(entries) > 1:  # link 0's replay and recovery entries trade places, ids included
            first, second = bytes(entries[0]), bytes(entries[1])
            ctypes.memmove(ctypes.addressof(entries[0]), second, len(second))
            ctypes.memmove(ctypes.addressof(entries[1]), first, len(first))
        return entries

    monkeypatch.setattr(pynvml, "nvmlDeviceGetFieldValues", reordering_driver)
    got, calls = counted_take(monkeypatch, gpu_node)
    assert nvlink_part(got) == nvlink_part(expected)
    assert got["gpus"][1]["nvlink"]["0"]["replay"] == 3
    # GPU 0's and 1's links 12-17, and the two traded entries of each GPU
    assert calls["nvmlDeviceGetNvLinkErrorCounter"] == 2 * 6 * 5 + 2 * 2
