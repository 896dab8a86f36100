"""slurm_hooks.hw.nvml: the reviewed error table (row by row), init messages, versioned fallbacks.

NVML runs through the real pynvml and the fake libnvidia-ml.so.1 of the fake node."""

from __future__ import annotations

import logging
import re

import pytest

from slurm_hooks.hw import nvml
from slurm_hooks.result import Action, Blame, Status
from tests.helpers import component
from tests.helpers import run_on_node as run

U, F, S = Status.UNKNOWN, Status.FAIL, Status.SKIP
# The review, written out a second time on purpose: changing a row in nvml.py must change it here too.
# code: (status, action, blame)
REVIEWED = {
    1: (U, Action.NONE, Blame.CHECK),  # UNINITIALIZED: our bug
    2: (U, Action.NONE, Blame.CHECK),  # INVALID_ARGUMENT: our bug
    3: (S, Action.NONE, Blame.CHECK),  # NOT_SUPPORTED: each check's not_supported parameter decides
    4: (U, Action.NONE, Blame.CHECK),  # NO_PERMISSION: not running as root
    5: (U, Action.NONE, Blame.CHECK),  # ALREADY_INITIALIZED: obsolete
    6: (U, Action.NONE, Blame.CHECK),  # NOT_FOUND
    7: (U, Action.NONE, Blame.CHECK),  # INSUFFICIENT_SIZE: our bug
    8: (F, Action.DRAIN, Blame.NODE),  # INSUFFICIENT_POWER: power cables
    9: (F, Action.REBOOT, Blame.NODE),  # DRIVER_NOT_LOADED
    10: (U, Action.NONE, Blame.CHECK),  # TIMEOUT
    11: (F, Action.REBOOT, Blame.NODE),  # IRQ_ISSUE
    12: (F, Action.DRAIN, Blame.NODE),  # LIBRARY_NOT_FOUND: a reboot does not install it
    13: (U, Action.NONE, Blame.CHECK),  # FUNCTION_NOT_FOUND: older driver
    14: (F, Action.RMA, Blame.NODE),  # CORRUPTED_INFOROM
    15: (F, Action.REBOOT, Blame.NODE),  # GPU_IS_LOST
    16: (F, Action.RESET_GPU, Blame.NODE),  # RESET_REQUIRED
    17: (U, Action.NONE, Blame.CHECK),  # OPERATING_SYSTEM
    18: (F, Action.REBOOT, Blame.NODE),  # LIB_RM_VERSION_MISMATCH: upgraded without reboot
    19: (U, Action.NONE, Blame.CHECK),  # IN_USE
    20: (U, Action.NONE, Blame.CHECK),  # MEMORY
    21: (U, Action.NONE, Blame.CHECK),  # NO_DATA
    22: (S, Action.NONE, Blame.CHECK),  # VGPU_ECC_NOT_SUPPORTED
    23: (U, Action.NONE, Blame.CHECK),  # INSUFFICIENT_RESOURCES
    24: (S, Action.NONE, Blame.CHECK),  # FREQ_NOT_SUPPORTED
    25: (U, Action.NONE, Blame.CHECK),  # ARGUMENT_VERSION_MISMATCH
    26: (U, Action.NONE, Blame.CHECK),  # DEPRECATED
    27: (U, Action.NONE, Blame.CHECK),  # NOT_READY
    28: (F, Action.REBOOT, Blame.NODE),  # GPU_NOT_FOUND
    29: (U, Action.NONE, Blame.CHECK),  # INVALID_STATE
    30: (U, Action.NONE, Blame.CHECK),  # RESET_TYPE_NOT_SUPPORTED
    999: (U, Action.NONE, Blame.CHECK),  # UNKNOWN
}


@pytest.mark.parametrize("code", sorted(nvml.ERROR_TABLE))
def test_every_error_table_row_is_the_reviewed_one(code):
    row = nvml.ERROR_TABLE[code]
    assert (row.status, row.action, row.blame) == REVIEWED[code]
    assert row.meaning and row.name.isupper()
    if row.status is Status.FAIL:
        assert row.action is not Action.NONE and row.blame is Blame.NODE  # a FAIL says what to do
    else:
        assert row.action is Action.NONE and row.blame is Blame.CHECK  # never drains


def test_table_covers_every_code_of_nvml_h_and_pynvml():
    from tests.fakenode.fakenvml import find_nvml_header

    header = find_nvml_header().read_text()
    codes = {int(v) for v in re.findall(r"NVML_ERROR_\w+\s*=\s*(\d+)", header)}
    assert len(codes) >= 30 and codes == set(nvml.ERROR_TABLE) == set(REVIEWED)
    import pynvml

    names = {
        name[len("NVML_ERROR_") :]: getattr(pynvml, name)
        for name in dir(pynvml)
        if name.startswith("NVML_ERROR_") and isinstance(getattr(pynvml, name), int)
    }
    for code, row in nvml.ERROR_TABLE.items():
        assert names.get(row.name) == code, row.name


@pytest.mark.parametrize("code", [31, 100, 998, -1])
def test_unknown_codes_are_unknown(code):
    out = nvml.outcome(code)
    assert (out.status, out.action, out.blame) == (Status.UNKNOWN, Action.NONE, Blame.CHECK)
    assert out.name == "CODE_%d" % code
    assert nvml.NvmlError(code, "nvmlX").outcome.status is Status.UNKNOWN


# -- init ----------------------------------------------------------------------------------------


def test_library_not_found_names_the_file(tmp_path):
    session = nvml.NvmlSession(str(tmp_path / "libnvidia-ml.so.1"))
    from tests.fakenode import fakenvml

    fakenvml.unload_from_pynvml()
    with pytest.raises(nvml.NvmlUnavailable) as caught:
        session.open()
    assert caught.value.code == nvml.LIBRARY_NOT_FOUND
    assert str(tmp_path) in str(caught.value) and "reinstall the driver package" in str(
        caught.value
    )
    with pytest.raises(nvml.NvmlUnavailable) as again:  # cached: nvmlInit is not retried per call
        session.call("nvmlDeviceGetCount")
    assert again.value is caught.value


@pytest.mark.parametrize(
    "state, fault, code, advice",
    [
        ({"driver_loaded": 0}, None, nvml.DRIVER_NOT_LOADED, "modprobe nvidia"),
        (
            {},
            nvml.LIB_RM_VERSION_MISMATCH,
            nvml.LIB_RM_VERSION_MISMATCH,
            "upgraded without a reboot",
        ),
        ({}, nvml.NO_PERMISSION, nvml.NO_PERMISSION, "run slurm-hooks as root"),
    ],
)
def test_init_failures_say_what_to_do(registry, nvml_node, state, fault, code, advice):
    node = nvml_node()
    node.set_states(state)
    if fault:
        node.inject_fault("nvmlInit", "*", fault)
    with pytest.raises(nvml.NvmlUnavailable) as caught:
        nvml.session().open()
    assert caught.value.code == code and advice in str(caught.value)
    nvml.reset_sessions()
    count = next(r for r in run(registry, node, ["gpu.count"]))
    assert advice in count.summary and advice in count.details["advice"]
    assert count.status is nvml.outcome(code).status
    assert count.details["kernel_module"].startswith(
        "NVRM version: NVIDIA UNIX"
    )  # /proc/driver/nvidia/version


# -- versioned functions -------------------------------------------------------------------------


def _handle(node, index=0):
    session = nvml.session()
    session.open()
    return session, session.call("nvmlDeviceGetHandleByIndex", index)


def test_clock_event_reasons_fall_back_to_throttle_reasons_and_log_once(nvml_node, caplog):
    node = nvml_node("dgx-h100", {"gpu": {0: {"clocks_event_reasons": 0x48}}})
    node.inject_fault("nvmlDeviceGetCurrentClocksEventReasons", 0, nvml.FUNCTION_NOT_FOUND)
    session, handle = _handle(node)
    with caplog.at_level(logging.WARNING, logger="slurm_hooks.hw.nvml"):
        assert session.call_versioned("clock_event_reasons", handle) == 0x48
        assert session.call_versioned("clock_event_reasons", handle) == 0x48
    missing = [
        r for r in caplog.records if "nvmlDeviceGetCurrentClocksEventReasons" in r.getMessage()
    ]
    assert len(missing) == 1


def test_both_variants_missing_is_function_not_found(registry, nvml_node):
    node = nvml_node()
    for function in (
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    ):
        node.inject_fault(function, 1, nvml.FUNCTION_NOT_FOUND)
    session, handle = _handle(node, 1)
    with pytest.raises(nvml.NvmlError) as caught:
        session.call_versioned("clock_event_reasons", handle)
    assert caught.value.code == nvml.FUNCTION_NOT_FOUND
    nvml.reset_sessions()
    results = run(
        registry, node, ["gpu.clocks"]
    )  # UNKNOWN for GPU 1, not a crash; the others still judged
    assert [(r.status, r.component) for r in results] == [(Status.UNKNOWN, component(1))]
    assert results[0].effective_blame is Blame.CHECK


@pytest.mark.parametrize(
    "key, newest, args",
    [
        ("compute_processes", "nvmlDeviceGetComputeRunningProcesses_v3", ()),
        ("retired_pages", "nvmlDeviceGetRetiredPages_v2", (nvml.PAGE_RETIREMENT_DOUBLE_BIT,)),
        ("temperature", "nvmlDeviceGetTemperatureV", (nvml.TEMPERATURE_GPU,)),
    ],
)
def test_older_variant_answers_when_the_newest_is_missing(nvml_node, key, newest, args):
    overlay = {
        "gpu": {
            0: {
                "processes": [{"pid": 99, "used_memory": 1 << 20, "name": "a.out"}],
                "retired_pages": {"supported": True, "double_bit": [0x1000, 0x2000]},
                "temperature": {"gpu": 41},
            }
        }
    }
    node = nvml_node("dgx-h100", overlay)
    session, handle = _handle(node)
    before = session.call_versioned(key, handle, *args)
    node.inject_fault(newest, 0, nvml.FUNCTION_NOT_FOUND)
    with pytest.raises(nvml.NvmlError):
        session.call(newest, handle, *args)
    after = session.call_versioned(key, handle, *args)
    simple = {
        "compute_processes": lambda v: [p.pid for p in v],
        "retired_pages": len,
        "temperature": int,
    }[key]
    assert (
        simple(before)
        == simple(after)
        == {"compute_processes": [99], "retired_pages": 2, "temperature": 41}[key]
    )


def test_memory_info_v2_struct_refused_falls_back_to_v1(nvml_node):
    node = nvml_node()
    session, handle = _handle(node)
    assert hasattr(session.call_versioned("memory_info", handle), "reserved")
    node.inject_fault("nvmlDeviceGetMemoryInfo_v2", 0, nvml.ARGUMENT_VERSION_MISMATCH)
    info = session.call_versioned("memory_info", handle)
    assert not hasattr(info, "reserved") and info.total == 85520809984


def test_fabric_info_falls_back_to_the_original_call(nvml_node):
    node = nvml_node("dgx-h100", {"gpu": {0: {"fabric": {"state": 3, "health_mask": 1}}}})
    session, handle = _handle(node)
    assert session.fabric_info(handle) == (3, 0, 1)
    node.inject_fault("nvmlDeviceGetGpuFabricInfoV", 0, nvml.FUNCTION_NOT_FOUND)
    assert session.fabric_info(handle) == (3, 0, 0)  # the original struct has no health mask


def test_function_pynvml_lacks_is_function_not_found(nvml_node):
    node = nvml_node()
    session, _ = _handle(node)
    with pytest.raises(nvml.NvmlError) as caught:
        session.call("nvmlDeviceGetSomethingFromTheFuture")
    assert (
        caught.value.code == nvml.FUNCTION_NOT_FOUND
        and caught.value.outcome.status is Status.UNKNOWN
    )


def test_field_value_reports_its_own_return_code(nvml_node):
    node = nvml_node("dgx-h100", {"gpu": {0: {"recovery_action": 2}}})
    session, handle = _handle(node)
    assert session.field_value(handle, nvml.FI_DEV_GET_GPU_RECOVERY_ACTION) == 2
    with pytest.raises(nvml.NvmlError) as caught:
        session.field_value(handle, 9999)  # a field this driver does not know
    assert caught.value.code == nvml.NOT_SUPPORTED


def _echoing(monkeypatch, session, rewrite):
    """The fake driver's own nvmlFieldValue_t entries, then `rewrite(entries)` on them in place: a
    driver that echoes another fieldId than the one asked in an entry's place. The fake library
    echoes every asked id in order (as 580.159.04 on an H200 does); its state file has no way to
    make it do otherwise, so the answer is altered between the library and the session."""
    pynvml = session.pynvml
    real = pynvml.nvmlDeviceGetFieldValues

    def driver(handle, field_ids):
        entries = real(handle, field_ids)
        rewrite(entries)
        return entries

    monkeypatch.setattr(pynvml, "nvmlDeviceGetFieldValues", driver)


def _swap_first_two(entries):
    """Entries 0 and 1 trade places, ids included (a driver that reorders its answers)."""
    import ctypes

    first, second = bytes(entries[0]), bytes(entries[1])
    ctypes.memmove(ctypes.addressof(entries[0]), second, len(second))
    ctypes.memmove(ctypes.addressof(entries[1]), first, len(first))


def _echo_mismatch(error, asked, echoed):
    assert isinstance(error, nvml.NvmlError) and error.code == nvml.UNKNOWN_ERROR
    assert error.outcome.status is Status.UNKNOWN  # could not evaluate: never a drain by itself
    assert "nvmlDeviceGetFieldValues(%d)" % asked in str(error)
    assert "fieldId %d" % echoed in str(error)


def test_field_value_never_takes_an_entry_for_another_field(nvml_node, monkeypatch):
    """Asked for the recovery action (230), a driver that answers the NVLink count (91) in its place:
    the count (18) is not returned as a recovery action; the call is an error naming both ids."""
    node = nvml_node("dgx-h100", {"gpu": {0: {"recovery_action": 2}}})
    session, handle = _handle(node)
    link_count = nvml.FI_DEV_NVLINK_LINK_COUNT

    def answer_the_link_count(entries):
        entries[0].fieldId = link_count
        entries[0].valueType, entries[0].value.uiVal = 1, 18

    _echoing(monkeypatch, session, answer_the_link_count)
    with pytest.raises(nvml.NvmlError) as caught:
        session.field_value(handle, nvml.FI_DEV_GET_GPU_RECOVERY_ACTION)
    _echo_mismatch(caught.value, nvml.FI_DEV_GET_GPU_RECOVERY_ACTION, link_count)


def test_field_values_books_a_misplaced_or_foreign_entry_as_an_error_for_the_id_asked(
    nvml_node, monkeypatch
):
    """Each entry is checked against the id asked at its position: two entries that traded places
    and one that echoes an id nobody asked are errors for the ids asked there, never values under
    them; an entry that echoes its own id is still taken."""
    node = nvml_node("dgx-h100", {"gpu": {0: {"recovery_action": 2, "fields": {"74": 7}}}})
    session, handle = _handle(node)
    recovery, links, power = (
        nvml.FI_DEV_GET_GPU_RECOVERY_ACTION,
        nvml.FI_DEV_NVLINK_LINK_COUNT,
        nvml.FI_CLOCKS_EVENT_SW_POWER_CAP,
    )
    asked = [recovery, links, power, nvml.FI_CLOCKS_EVENT_SYNC_BOOST]
    honest = session.field_values(handle, asked)
    assert honest[recovery] == 2 and honest[power] == 7  # the fake echoes every id in its place

    def misbehave(entries):
        _swap_first_two(entries)
        entries[3].fieldId = 9999  # an id nobody asked

    _echoing(monkeypatch, session, misbehave)
    got = session.field_values(handle, asked)
    _echo_mismatch(got[recovery], recovery, links)
    _echo_mismatch(got[links], links, recovery)
    _echo_mismatch(got[nvml.FI_CLOCKS_EVENT_SYNC_BOOST], nvml.FI_CLOCKS_EVENT_SYNC_BOOST, 9999)
    assert got[power] == 7
