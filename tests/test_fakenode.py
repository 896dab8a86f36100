"""Tests of the fake GPU node (tests/fakenode): the sysfs/procfs tree, and the fake libnvidia-ml.so.1 driven
through the REAL pynvml, both built from one spec."""

from __future__ import annotations

import inspect
import json
import os
import re
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

try:
    from tests.fakenode import FakeNode, FakeNvmlBuildError, SpecError, load_spec, parse_cpulist
except ImportError:  # plain `pytest` without the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.fakenode import FakeNode, FakeNvmlBuildError, SpecError, load_spec, parse_cpulist
from tests.fakenode import fakenvml, pci

OVERRIDES = {
    "gpu": {
        1: {"processes": [{"pid": 4242, "used_memory": 2 << 30, "name": "train.py"}]},
        2: {"nvlink": {"links": {5: {"state": False, "errors": {"crc_flit": 7}}}}},
        3: {
            "ecc": {
                "volatile": {"uncorrected": {"dram": 2}},
                "aggregate": {"corrected": {"sram": 5}},
            },
            "remapped_rows": {"uncorrected": 1, "pending": True},
        },
    },
    "kmsg": [
        "NVRM: Xid (PCI:0000:44:00): 63, pid=4242, Row Remapping: New row marked for remapping"
    ],
}


# Trees go to tmpfs when available (FakeNode.build_temp): ~4000 small files are slow on a busy disk.
@pytest.fixture(scope="module")
def dgx():
    node = FakeNode.build_temp("dgx-h100", overrides=OVERRIDES)
    yield node
    node.cleanup()


@pytest.fixture(scope="module")
def cpu_node():
    node = FakeNode.build_temp("cpu-only")
    yield node
    node.cleanup()


def run_py(node, code, timeout=20):
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=node.subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def read(node, path):
    return node.path(path).read_text().strip()


# ------------------------------------------------------------------------------------------------ spec


def test_spec_shape():
    s = load_spec("dgx-h100")
    assert s["cpu"]["count"] == 224
    assert s["numa"][0]["cpulist"] == "0-55,112-167" and s["numa"][1]["cpulist"] == "56-111,168-223"
    assert len(s["gpu"]) == 8 and len(s["switch"]) == 4
    assert sum(n["link_layer"] == "InfiniBand" for n in s["nic"].values()) == 8
    for g in s["gpu"].values():
        assert g["numa_node"] == s["switch"][g["switch"]]["numa_node"]
        assert g["name"] == "NVIDIA H100 80GB HBM3" and g["nvlink"]["count"] == 18
    assert {"nvidia", "nvidia_peermem", "mlx5_core"} <= set(s["modules"])
    cpu = load_spec("cpu-only")
    assert (
        not cpu["gpu"]
        and not cpu["nvml"]["library"]
        and not any(m.startswith("nvidia") for m in cpu["modules"])
    )


@pytest.mark.parametrize(
    "toml, message",
    [
        ('[gpu.0]\npci = "0000:18:00.0"\nnmae = "x"\n', "gpu.0.nmae: unknown key"),
        ('[cpu]\nsockets = "two"\n', "cpu.sockets: expected int"),
        ('[gpu.0]\npci = "18:00"\n', "gpu.0.pci: bad PCI address"),
        ('[gpu.0]\npci = "0000:18:00.0"\nswitch = "nope"\n', "gpu.0.switch: unknown switch"),
        (
            '[numa.0]\ncpulist = "0-9"\n[numa.1]\ncpulist = "8-15"\n',
            "numa.1.cpulist: CPU 8 also in NUMA node 0",
        ),
        ('[iommu]\nmode = "strict"\n', "iommu.mode"),
        ("[bogus]\n", "bogus: unknown top-level key"),
    ],
)
def test_spec_errors_name_file_and_key(tmp_path, toml, message):
    f = tmp_path / "bad.toml"
    f.write_text(toml)
    with pytest.raises(SpecError) as exc:
        load_spec(f)
    assert str(f) in str(exc.value) and message in str(exc.value)


def test_overlay_reaches_state_file(dgx):
    state = dgx.state()
    assert state["gpu.3.remapped_rows.pending"] == "1"
    assert state["gpu.3.ecc.volatile.uncorrected.dram"] == "2"
    assert state["gpu.2.nvlink.links.5.state"] == "0" and state["gpu.2.nvlink.links.4.state"] == "1"
    assert "sentinel" not in state and "fake" in state["nvml_version"]


# ------------------------------------------------------------------------------------------------ sysfs tree


def test_pci_symlink_resolves_inside_root_to_nested_path(dgx):
    link = dgx.path("/sys/bus/pci/devices/0000:18:00.0")
    assert link.is_symlink() and not os.readlink(str(link)).startswith("/")
    real = link.resolve()
    assert str(real).startswith(str(dgx.root.resolve()))
    rel = real.relative_to(dgx.root.resolve()).as_posix()
    assert rel == "sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0"
    assert read(dgx, rel + "/vendor") == "0x10de" and read(dgx, rel + "/class") == "0x030200"
    assert (
        read(dgx, rel + "/current_link_speed") == "32.0 GT/s PCIe"
        and read(dgx, rel + "/max_link_width") == "16"
    )
    assert os.readlink(str(real / "driver")).endswith("bus/pci/drivers/nvidia")
    assert read(dgx, "/sys/devices/pci0000:15/0000:15:01.0/class") == "0x060400"


def test_numa_and_cpulists_agree_with_spec(dgx):
    for kind in ("gpu", "nic", "nvme"):
        for d in dgx.spec[kind].values():
            base = "/sys/bus/pci/devices/%s" % d["pci"]
            numa = int(read(dgx, base + "/numa_node"))
            assert numa == d["numa_node"]
            cpus = parse_cpulist(read(dgx, base + "/local_cpulist"))
            assert cpus == dgx.spec["numa"][numa]["cpus"]
            mask = int(read(dgx, base + "/local_cpus").replace(",", ""), 16)
            assert mask == sum(1 << c for c in cpus)
    assert read(dgx, "/sys/devices/system/node/node1/cpulist") == "56-111,168-223"
    assert "Node 1 MemTotal:" in read(dgx, "/sys/devices/system/node/node1/meminfo")
    assert read(dgx, "/sys/devices/system/cpu/cpu112/topology/thread_siblings_list") == "0,112"
    assert read(dgx, "/sys/devices/system/cpu/cpu60/topology/physical_package_id") == "1"


def _caps(cfg):
    """Walk the standard capability list and the extended list: {id: offset}, {ext id: offset}."""
    caps, off = {}, cfg[0x34]
    while off:
        caps[cfg[off]] = off
        off = cfg[off + 1]
    ext, off = {}, 0x100
    while off:
        hdr = struct.unpack_from("<I", cfg, off)[0]
        ext[hdr & 0xFFFF] = off
        off = hdr >> 20
    return caps, ext


def test_config_space_capability_chain_reaches_acs(dgx):
    gpu = dgx.path("/sys/bus/pci/devices/0000:18:00.0").resolve()
    port = gpu.parent  # the switch downstream port
    cfg = (port / "config").read_bytes()
    assert (
        len(cfg) == 4096 and cfg[0x0E] & 0x7F == 1 and cfg[0x19] == 0x18
    )  # type 1, secondary bus 0x18
    caps, ext = _caps(cfg)
    assert (cfg[caps[0x10] + 2] >> 4) & 0xF == pci.PORT_DOWNSTREAM
    acs_ctrl = struct.unpack_from("<H", cfg, ext[0x000D] + 6)[0]
    assert acs_ctrl & (pci.ACS_RR | pci.ACS_CR) == 0  # DGX spec: ACS redirect off
    gcfg = (gpu / "config").read_bytes()
    assert struct.unpack_from("<HH", gcfg, 0) == (0x10DE, 0x2330)
    gcaps, gext = _caps(gcfg)
    lnksta = struct.unpack_from("<H", gcfg, gcaps[0x10] + 0x12)[0]
    assert (lnksta & 0xF, (lnksta >> 4) & 0x3F) == (5, 16) and 0x000D not in gext
    on = FakeNode.build_temp("dgx-h100", overrides={"switch": {"sw0": {"acs_redirect": True}}})
    on_root = on.root
    cfg2 = (
        on.path("/sys/bus/pci/devices/0000:18:00.0")
        .resolve()
        .parent.joinpath("config")
        .read_bytes()
    )
    ctrl2 = struct.unpack_from("<H", cfg2, _caps(cfg2)[1][0x000D] + 6)[0]
    assert ctrl2 & (pci.ACS_RR | pci.ACS_CR | pci.ACS_SV) == pci.ACS_RR | pci.ACS_CR | pci.ACS_SV

    # with ACS off the GPU and the HCA behind sw0 share an IOMMU group; with it on they do not
    def group(n, bdf):
        return os.path.basename(
            os.readlink(str(n.path("/sys/bus/pci/devices/%s/iommu_group" % bdf)))
        )

    assert group(dgx, "0000:18:00.0") == group(dgx, "0000:19:00.0")
    assert group(on, "0000:18:00.0") != group(on, "0000:19:00.0")
    assert read(dgx, "/sys/kernel/iommu_groups/%s/type" % group(dgx, "0000:18:00.0")) == "identity"
    on.cleanup()
    assert not on_root.exists()


def test_infiniband_net_nvme_classes(dgx):
    ib = dgx.path("/sys/class/infiniband/mlx5_0")
    assert (
        ib.joinpath("device").resolve() == dgx.path("/sys/bus/pci/devices/0000:19:00.0").resolve()
    )
    port = ib / "ports" / "1"
    assert (port / "state").read_text().strip() == "4: ACTIVE"
    assert (port / "phys_state").read_text().strip() == "5: LinkUp"
    assert (port / "rate").read_text().strip() == "400 Gb/sec (4X NDR)"
    assert (port / "link_layer").read_text().strip() == "InfiniBand"
    assert (port / "counters" / "symbol_error").read_text().strip() == "0"
    assert read(dgx, "/sys/bus/pci/devices/0000:19:00.0/class") == "0x020700"
    assert read(dgx, "/sys/class/infiniband/mlx5_8/ports/1/link_layer") == "Ethernet"
    assert read(dgx, "/sys/bus/pci/devices/0000:aa:00.0/class") == "0x020000"
    assert dgx.path("/sys/class/net/ibp25s0/device").resolve() == ib.joinpath("device").resolve()
    assert dgx.path("/sys/class/nvme/nvme0/device").resolve().name == "0000:01:00.0"
    assert read(dgx, "/sys/bus/pci/devices/0000:01:00.0/class") == "0x010802"


def test_procfs_modules_kmsg(dgx, cpu_node):
    cpuinfo = read(dgx, "/proc/cpuinfo")
    blocks = cpuinfo.split("\n\n")
    assert len(blocks) == 224
    b = dict(re.findall(r"^(.+?)\s*: ?(.*)$", blocks[170], re.M))
    assert (b["processor"], b["physical id"], b["core id"], b["siblings"], b["cpu cores"]) == (
        "170",
        "1",
        "2",
        "112",
        "56",
    )
    assert "hypervisor" not in b["flags"]
    mods = {line.split()[0]: line for line in read(dgx, "/proc/modules").splitlines()}
    assert {"nvidia", "nvidia_peermem", "mlx5_core", "ib_core"} <= set(mods)
    assert "nvidia_peermem" in mods["nvidia"].split()[3]
    assert read(dgx, "/sys/module/nvidia/version") == "550.54.15"
    assert read(dgx, "/sys/kernel/mm/memory_peers/nv_mem/version") == "550.54.15"
    assert "iommu=pt" in read(dgx, "/proc/cmdline")
    kmsg = read(dgx, "/dev/kmsg").splitlines()
    assert all(re.match(r"^\d+,\d+,\d+,-;", line) for line in kmsg)
    assert re.match(r"^6,\d+,\d+,-;NVRM: Xid \(PCI:0000:44:00\): 63, pid=4242", kmsg[-1])
    rec = dgx.add_kmsg("NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.")
    assert read(dgx, "/dev/kmsg").splitlines()[-1] == rec and rec.startswith("3,%d," % len(kmsg))
    assert dgx.path("/dev/nvidia7").exists() and dgx.path("/proc/driver/nvidia/version").exists()
    # CPU-only: no NVIDIA anything, no library
    assert cpu_node.lib_path is None and not cpu_node.path("/proc/driver/nvidia").exists()
    assert "nvidia" not in read(cpu_node, "/proc/modules")
    assert not list(cpu_node.path("/sys/kernel/iommu_groups").iterdir())
    assert len(read(cpu_node, "/proc/cpuinfo").split("\n\n")) == 128
    from tests.fakenode import procfs

    assert " hypervisor" in procfs.cpuinfo(
        load_spec("cpu-only", {"node": {"virtualization": "kvm"}})
    )


# ------------------------------------------------------------------------------------------------ fake NVML via pynvml

PROBE = """
    import json, pynvml as N
    N.nvmlInit()
    out = {"nvml": N.nvmlSystemGetNVMLVersion(), "driver": N.nvmlSystemGetDriverVersion(), "gpus": []}
    for i in range(N.nvmlDeviceGetCount()):
        h = N.nvmlDeviceGetHandleByIndex(i)
        p = N.nvmlDeviceGetPciInfo(h)
        out["gpus"].append({
            "name": N.nvmlDeviceGetName(h), "uuid": N.nvmlDeviceGetUUID(h), "bus": p.busId,
            "legacy": p.busIdLegacy, "devid": p.pciDeviceId, "subsys": p.pciSubSystemId, "domain": p.domain,
            "busno": p.bus, "serial": N.nvmlDeviceGetSerial(h), "minor": N.nvmlDeviceGetMinorNumber(h),
            "ecc": N.nvmlDeviceGetEccMode(h),
            "unc_vol": N.nvmlDeviceGetTotalEccErrors(h, N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, N.NVML_VOLATILE_ECC),
            "dram_unc": N.nvmlDeviceGetMemoryErrorCounter(h, 1, 0, N.NVML_MEMORY_LOCATION_DRAM),
            "sram_agg_corr": N.nvmlDeviceGetMemoryErrorCounter(h, 0, 1, N.NVML_MEMORY_LOCATION_SRAM),
            "remap": list(N.nvmlDeviceGetRemappedRows(h)),
            "links": [N.nvmlDeviceGetNvLinkState(h, l) for l in range(18)],
            "crc5": N.nvmlDeviceGetNvLinkErrorCounter(h, 5, N.NVML_NVLINK_ERROR_DL_CRC_FLIT),
            "procs": [[p.pid, p.usedGpuMemory] for p in N.nvmlDeviceGetComputeRunningProcesses(h)],
            "mem_used": N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2).used,
            "affinity": [int(x) for x in N.nvmlDeviceGetCpuAffinity(h, 4)],
            "topo0": N.nvmlDeviceGetTopologyCommonAncestor(N.nvmlDeviceGetHandleByIndex(0), h),
            "reasons": N.nvmlDeviceGetCurrentClocksEventReasons(h),
            "power": [N.nvmlDeviceGetPowerManagementLimit(h), N.nvmlDeviceGetPowerManagementDefaultLimit(h)],
            "app_clock": N.nvmlDeviceGetApplicationsClock(h, N.NVML_CLOCK_GRAPHICS),
            "temp": [N.nvmlDeviceGetTemperature(h, 0),
                     N.nvmlDeviceGetTemperatureThreshold(h, N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)],
            "recovery": N.nvmlDeviceGetFieldValues(h, [N.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])[0].value.uiVal,
            "by_bus": N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByPciBusId(p.busId)),
        })
    out["pname"] = N.nvmlSystemGetProcessName(4242)
    N.nvmlShutdown()
    print(json.dumps(out))
"""


def test_pynvml_subprocess_sees_spec_values(dgx):
    out = json.loads(run_py(dgx, PROBE))
    assert "fake" in out["nvml"] and out["driver"] == "550.54.15"
    gpus = out["gpus"]
    assert len(gpus) == 8
    for i, g in enumerate(gpus):
        spec = dgx.spec["gpu"][i]
        assert isinstance(g["name"], str) and g["name"] == "NVIDIA H100 80GB HBM3"
        assert g["uuid"] == spec["uuid"] and g["serial"] == spec["serial"] and g["minor"] == i
        dom, bus, devfn = spec["pci"].split(":")
        assert g["bus"] == ("0000" + spec["pci"]).upper() and g["legacy"] == spec["pci"].upper()
        assert (g["domain"], g["busno"]) == (int(dom, 16), int(bus, 16)) and g["by_bus"] == i
        assert g["devid"] == 0x233010DE and g["subsys"] == 0x16C110DE
        # NVML and sysfs agree: the bus id exists in the tree with the same CPU affinity
        sysdev = "/sys/bus/pci/devices/" + g["legacy"].lower()
        cpus = parse_cpulist(read(dgx, sysdev + "/local_cpulist"))
        assert sum(1 << c for c in cpus) == sum(w << (64 * k) for k, w in enumerate(g["affinity"]))
        assert g["ecc"] == [1, 1] and g["reasons"] == 1 and g["power"] == [700000, 700000]
        assert g["app_clock"] == 1980 and g["temp"] == [33, 89] and g["recovery"] == 0
    assert [g["unc_vol"] for g in gpus] == [0, 0, 0, 2, 0, 0, 0, 0]
    assert gpus[3]["dram_unc"] == 2 and gpus[3]["sram_agg_corr"] == 5
    assert gpus[3]["remap"] == [0, 1, 1, 0] and gpus[0]["remap"] == [0, 0, 0, 0]
    assert gpus[2]["links"] == [1] * 5 + [0] + [1] * 12 and gpus[2]["crc5"] == 7
    assert (
        gpus[1]["procs"] == [[4242, 2 << 30]]
        and gpus[1]["mem_used"] == 2 << 30
        and out["pname"] == "train.py"
    )
    assert [g["topo0"] for g in gpus] == [0, 10, 40, 40, 50, 50, 50, 50]


@pytest.fixture
def inproc(dgx):
    import pynvml

    pynvml_mod = dgx.load_into_pynvml()
    assert pynvml_mod is pynvml
    yield dgx, pynvml
    dgx.clear_faults()
    try:
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        pass
    fakenvml.unload_from_pynvml()


def test_injected_errors_raise_the_right_pynvml_exception(inproc):
    node, N = inproc
    N.nvmlInit()
    assert "fakenvml" in N.nvmlSystemGetNVMLVersion()
    h2, h3 = N.nvmlDeviceGetHandleByIndex(2), N.nvmlDeviceGetHandleByIndex(3)
    node.inject_fault("nvmlDeviceGetEccMode", 3, 15)  # the library re-reads the edited state
    with pytest.raises(N.NVMLError_GpuIsLost):
        N.nvmlDeviceGetEccMode(h3)
    assert N.nvmlDeviceGetEccMode(h2) == [1, 1]
    node.inject_fault("nvmlDeviceGetRemappedRows", "*", N.NVML_ERROR_NOT_SUPPORTED)
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetRemappedRows(h2)
    node.set_state("fault.nvmlDeviceGetRemappedRows.2", 0)  # more specific key wins
    assert N.nvmlDeviceGetRemappedRows(h2) == (0, 0, 0, 0)
    node.inject_fault("nvmlDeviceGetCount", "*", N.NVML_ERROR_UNKNOWN)  # base name covers _v2
    with pytest.raises(N.NVMLError_Unknown):
        N.nvmlDeviceGetCount()
    node.clear_faults()
    assert N.nvmlDeviceGetCount() == 8
    N.nvmlShutdown()
    node.inject_fault("nvmlInit", "*", N.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(N.NVMLError_DriverNotLoaded):
        N.nvmlInit()


HANG = """
    import sys, pynvml as N
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(5)
    print("ready", flush=True)
    N.nvmlDeviceGetTemperature(h, 0)
    print("returned", flush=True)
"""


def test_hang_blocks_and_crash_aborts(dgx):
    dgx.inject_hang("nvmlDeviceGetTemperature", 5)
    dgx.inject_crash("nvmlDeviceGetPowerUsage", "*")
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(HANG)],
            env=dgx.subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout.readline().strip() == "ready"
            with pytest.raises(subprocess.TimeoutExpired):
                proc.wait(timeout=0.3)
        finally:
            proc.kill()
            proc.wait()
        crash = subprocess.run(
            [
                sys.executable,
                "-c",
                "import pynvml as N; N.nvmlInit(); "
                "N.nvmlDeviceGetPowerUsage(N.nvmlDeviceGetHandleByIndex(0))",
            ],
            env=dgx.subprocess_env(),
            capture_output=True,
            timeout=20,
        )
        assert crash.returncode == -signal.SIGABRT
    finally:
        dgx.clear_faults()


# pynvml wrappers the fake must serve; the test derives the C symbol names from pynvml's own source
PYNVML_WRAPPERS = [
    "nvmlInitWithFlags",
    "nvmlInit",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlSystemGetProcessName",
    "nvmlSystemGetTopologyGpuSet",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByPciBusId",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetHandleBySerial",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetPciInfoExt",
    "nvmlDeviceGetVbiosVersion",
    "nvmlDeviceGetBoardPartNumber",
    "nvmlDeviceGetInforomImageVersion",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetComputeMode",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetEccMode",
    "nvmlDeviceGetDefaultEccMode",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetMemoryErrorCounter",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetRemappedRows_v2",
    "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPages_v2",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetSupportedClocksEventReasons",
    "nvmlDeviceGetSupportedClocksThrottleReasons",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPowerManagementLimitConstraints",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetApplicationsClock",
    "nvmlDeviceGetDefaultApplicationsClock",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetClock",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetTemperatureThreshold",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetGpuMaxPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetPcieLinkMaxSpeed",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkVersion",
    "nvmlDeviceGetNvLinkErrorCounter",
    "nvmlDeviceGetNvLinkRemotePciInfo",
    "nvmlDeviceGetNvLinkCapability",
    "nvmlDeviceGetNvLinkRemoteDeviceType",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetBAR1MemoryInfo",
    "nvmlDeviceGetCpuAffinity",
    "nvmlDeviceGetCpuAffinityWithinScope",
    "nvmlDeviceGetMemoryAffinity",
    "nvmlDeviceGetNumaNodeId",
    "nvmlDeviceGetTopologyCommonAncestor",
    "nvmlDeviceGetTopologyNearestGpus",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetGpuFabricInfo",
    "nvmlDeviceGetGpuFabricInfoV",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetViolationStatus",
    "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetBrand",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetDisplayMode",
    "nvmlDeviceGetDisplayActive",
    "nvmlDeviceGetFanSpeed",
]


def test_exports_every_symbol_pynvml_looks_up(dgx):
    import ctypes

    import pynvml

    lib = ctypes.CDLL(str(dgx.lib_path))
    needed = set()
    for name in PYNVML_WRAPPERS:
        needed |= set(
            re.findall(
                r'_nvmlGetFunctionPointer\("(\w+)"\)', inspect.getsource(getattr(pynvml, name))
            )
        )
    assert len(needed) >= len(PYNVML_WRAPPERS) - 5
    missing = sorted(n for n in needed if not hasattr(lib, n))
    assert not missing
    assert {
        "nvmlInitWithFlags",
        "nvmlInit_v2",
        "nvmlDeviceGetCount_v2",
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetPciInfo_v3",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetNvLinkRemotePciInfo_v2",
    } <= needed | set(fakenvml.exported_symbols(dgx.lib_path))


def test_build_errors_are_clear(monkeypatch, tmp_path):
    monkeypatch.setenv("FAKENVML_INCLUDE", str(tmp_path))
    with pytest.raises(FakeNvmlBuildError, match="nvml.h"):
        fakenvml.build_library()
    monkeypatch.delenv("FAKENVML_INCLUDE")
    monkeypatch.setenv("CC", "no-such-cc-fakenode")
    with pytest.raises(FakeNvmlBuildError, match="compiler"):
        fakenvml.build_library()


def test_cli_run_substitutes_root_and_sets_env():
    repo = Path(__file__).resolve().parents[1]
    code = (
        "import os, sys, pynvml as N; N.nvmlInit(); "
        "print(os.path.isdir(sys.argv[1] + '/sys/class/infiniband'), N.nvmlDeviceGetCount(), "
        "N.nvmlDeviceGetEccMode(N.nvmlDeviceGetHandleByIndex(1)))"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.fakenode",
            "run",
            "dgx-h100",
            "--state",
            "gpu.1.ecc.mode=0",
            "--",
            sys.executable,
            "-c",
            code,
            "{root}",
        ],
        cwd=str(repo),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "8", "[0,", "1]"]


# ------------------------------------------------------------------------------------------------ PCIe trees (issue 18)


def _config_port_type(node, bdf):
    cfg = node.path("/sys/bus/pci/devices/%s/config" % bdf).read_bytes()
    offset = cfg[0x34]
    while cfg[offset] != 0x10:
        offset = cfg[offset + 1]
    return (struct.unpack_from("<H", cfg, offset + 2)[0] >> 4) & 0xF


def _bus_range(node, bdf):
    return tuple(
        int(read(node, "/sys/bus/pci/devices/%s/%s" % (bdf, f)))
        for f in ("secondary_bus_number", "subordinate_bus_number")
    )


def test_dgx_a100_nests_three_switch_levels_with_consistent_bus_numbers():
    spec = load_spec("dgx-a100")
    assert spec["cpu"]["count"] == 256 and len(spec["numa"]) == 8
    assert spec["numa"][3]["cpulist"] == "48-63,176-191"  # GPU0's CPU affinity on NVIDIA/nccl#1505
    assert (
        spec["switch"]["q3_gpu0"]["root_port"] == "0000:00:01.1"
        and spec["switch"]["q3_gpu0"]["numa_node"] == 3
    )
    node = FakeNode.build_temp("dgx-a100")
    try:
        gpu0 = (
            node.path("/sys/bus/pci/devices/0000:07:00.0")
            .resolve()
            .relative_to(node.root.resolve())
            .as_posix()
        )
        assert gpu0 == (
            "sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:00.0/0000:03:00.0/0000:04:00.0/"
            "0000:05:00.0/0000:06:00.0/0000:07:00.0"
        )
        types = [_config_port_type(node, b) for b in gpu0.split("/")[3:]]
        assert types == [pci.PORT_ROOT, pci.PORT_UPSTREAM, pci.PORT_DOWNSTREAM] * 1 + [
            pci.PORT_UPSTREAM,
            pci.PORT_DOWNSTREAM,
        ] * 2 + [pci.PORT_ENDPOINT]
        assert _bus_range(node, "0000:00:01.1") == (0x01, 0x12)  # everything of the quadrant
        assert _bus_range(node, "0000:02:00.0") == (
            0x03,
            0x08,
        )  # GPU-side level-2 switch and its NVMe
        assert _bus_range(node, "0000:02:01.0") == (
            0x0A,
            0x12,
        )  # NIC-side level-2 switch, GPU1 below it
        assert _bus_range(node, "0000:0b:01.0") == (0x0D, 0x0F)
        assert (
            read(node, "/sys/bus/pci/devices/0000:05:00.0/vendor") == "0x1000"
        )  # PEX880xx (switch_defaults)
        assert read(node, "/sys/bus/pci/devices/0000:07:00.0/numa_node") == "3"
        assert read(node, "/sys/bus/pci/devices/0000:07:00.0/local_cpulist") == "48-63,176-191"
        cfg = node.path("/sys/bus/pci/devices/0000:02:01.0/config").read_bytes()
        assert (cfg[0x18], cfg[0x19], cfg[0x1A]) == (
            0x02,
            0x0A,
            0x12,
        )  # primary/secondary/subordinate registers
        state = node.state()
        assert (
            state["gpu.0.topology.1"] == "20" and state["gpu.0.topology.2"] == "50"
        )  # PXB; SYS across nodes
    finally:
        node.cleanup()


def test_a_bridge_below_a_root_port_without_a_switch():
    """A PCIe-to-PCI bridge (port type 7) on a root port, two NIC functions on its secondary bus."""
    spec = load_spec(
        "dgx-h100",
        {
            "switch": {
                "br0": {
                    "kind": "bridge",
                    "root_port": "0000:d0:01.0",
                    "upstream": "0000:d1:00.0",
                    "numa_node": 1,
                }
            },
            "nic": {
                "mlx5_8": {"pci": "0000:d2:00.0", "switch": "br0", "root_port": ""},
                "mlx5_9": {"pci": "0000:d2:00.1", "switch": "br0", "root_port": ""},
            },
        },
    )
    devs = pci.topology(spec)
    assert (
        devs["0000:d1:00.0"]["port_type"] == pci.PORT_PCI_BRIDGE
        and devs["0000:d1:00.0"]["parent"] == "0000:d0:01.0"
    )
    assert (devs["0000:d1:00.0"]["secondary"], devs["0000:d1:00.0"]["subordinate"]) == (0xD2, 0xD2)
    assert devs["0000:d2:00.1"]["parent"] == "0000:d1:00.0"
    assert (
        pci.nvml_level(devs, "0000:d2:00.0", "0000:d2:00.1") == pci.NVML_SINGLE
    )  # one bridge: PIX
    assert (
        pci.nvml_level(devs, "0000:d2:00.0", "0000:9a:00.0") == pci.NVML_NODE
    )  # another host bridge, NUMA 1


@pytest.mark.parametrize(
    "overlay, message",
    [
        (
            {
                "switch": {
                    "x": {"root_port": "0000:15:02.0", "parent": "sw0", "upstream": "0000:30:00.0"}
                }
            },
            "switch.x: give either root_port",
        ),
        ({"switch": {"x": {"upstream": "0000:30:00.0"}}}, "switch.x: give either root_port"),
        (
            {"switch": {"x": {"parent": "nope", "upstream": "0000:30:00.0"}}},
            "switch.x.parent: unknown switch 'nope'",
        ),
        (
            {
                "switch": {
                    "x": {"parent": "y", "upstream": "0000:30:00.0"},
                    "y": {"parent": "x", "upstream": "0000:31:00.0"},
                }
            },
            "form a loop",
        ),
        (
            {
                "switch": {
                    "x": {"kind": "hub", "root_port": "0000:d0:01.0", "upstream": "0000:d1:00.0"}
                }
            },
            "switch.x.kind",
        ),
        # below sw0 (upstream 16, downstream ports on 17), a switch whose upstream port is on bus 17 itself
        ({"switch": {"x": {"parent": "sw0", "upstream": "0000:17:00.0"}}}, "pci: "),
        # a GPU below sw1 numbered below sw1's own upstream bus
        ({"gpu": {2: {"pci": "0000:1c:00.0"}}}, "must be above its own bus"),
        # sw0's range grows to 16-2f; another root port of the same host bridge claims bus 20 inside it
        (
            {
                "nic": {
                    "mlx5_1": {"pci": "0000:2f:00.0"},
                    "mlx5_8": {"pci": "0000:20:00.0", "root_port": "0000:15:02.0"},
                }
            },
            "overlapping bus ranges",
        ),
        # two endpoints on different buses directly below one root port
        ({"nvme": {"nvme1": {"root_port": "0000:00:1d.0"}}}, "secondary bus is 0000:01"),
    ],
)
def test_bus_numbering_that_no_machine_has_is_a_spec_error(overlay, message):
    with pytest.raises(SpecError) as exc:
        load_spec("dgx-h100", overlay)
    assert message in str(exc.value)


def test_pci_domains_wider_than_16_bits():
    """VMD (and Hyper-V) domains: 10000:xx. sysfs names, the host bridge directory and NVML's busId keep every digit."""
    node = FakeNode.build_temp(
        "dgx-h100",
        {
            "gpu": {
                7: {
                    "pci": "10000:01:00.0",
                    "switch": "",
                    "root_port": "10000:00:02.0",
                    "numa_node": 1,
                }
            }
        },
    )
    try:
        link = (
            node.path("/sys/bus/pci/devices/10000:01:00.0")
            .resolve()
            .relative_to(node.root.resolve())
        )
        assert link.as_posix() == "sys/devices/pci10000:00/10000:00:02.0/10000:01:00.0"
        out = run_py(
            node,
            """
            import pynvml
            pynvml.nvmlInit()
            print(pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(7)).busId)
            print(pynvml.nvmlDeviceGetHandleByPciBusId("00010000:01:00.0") is not None)
        """,
        )
        assert out.split() == [
            "00010000:01:00.0",
            "True",
        ]  # NVML_DEVICE_PCI_BUS_ID_FMT "%08X:%02X:%02X.0"
    finally:
        node.cleanup()


def test_cleanup_removes_the_tree_and_nothing_a_symlink_in_it_points_at(tmp_path):
    """cleanup() walks the tree itself (fsutil.remove_tree): a symlink to outside is removed, not
    followed, and a directory a test left read-only or a fifo still goes."""
    from tests.fakenode import FakeNode

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("kept")
    node = FakeNode.build_temp("cpu-only")
    os.symlink(str(outside), str(node.path("/sys/escape")))
    os.mkfifo(str(node.path("/dev/fifo")))
    locked = node.path("/sys/locked")
    (locked / "inner").mkdir(parents=True)
    locked.chmod(0o500)
    node.cleanup()
    assert not node.root.exists()
    assert (outside / "keep").read_text() == "kept"


def test_a_resolved_spec_is_remembered_as_a_copy_and_by_its_text(tmp_path):
    """load_spec keeps what it resolved from a file (tests/fakenode/spec.py): each call gets a spec
    of its own, equal to a fresh resolution, and an edited file is resolved again."""
    from tests.fakenode import spec as spec_module

    overrides = {"gpu": {3: {"remapped_rows": {"pending": True}}}}
    first = load_spec("dgx-h100", overrides)
    first["gpu"][3]["name"] = "changed by a test"
    again = load_spec("dgx-h100", overrides)
    assert again["gpu"][3]["name"] != "changed by a test"
    path = spec_module.find_spec("dgx-h100")
    uncached = spec_module._load(spec_module._toml_loads(path.read_text()), str(path), overrides)
    assert again == uncached and repr(again) == repr(uncached)
    edited = tmp_path / "edited.toml"
    edited.write_text(path.read_text())
    assert load_spec(str(edited))["node"]["hostname"] == load_spec("dgx-h100")["node"]["hostname"]
    edited.write_text(path.read_text().replace('hostname = "', 'hostname = "x', 1))
    assert load_spec(str(edited))["node"]["hostname"].startswith("x")
