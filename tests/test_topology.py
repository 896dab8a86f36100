"""Family `topology` on fake nodes: GPU-NIC/NVMe locality, ACS, IOMMU (in-process, real pynvml, fake library)."""

from __future__ import annotations

from slurm_hooks.result import Action, Status
from tests.helpers import run_on_node as run

# GPUs 6 and 7 (switch sw3, NUMA 1) lose every NIC on their socket: sw2 moves to NUMA 0 and takes
# mlx5_6/mlx5_7 along; the storage NICs move to NUMA 0 as well.
SYS_GPUS = {
    "switch": {"sw2": {"numa_node": 0}},
    "nic": {
        "mlx5_6": {"pci": "0000:9e:00.0", "switch": "sw2"},
        "mlx5_7": {"pci": "0000:9f:00.0", "switch": "sw2"},
        "mlx5_8": {"numa_node": 0},
        "mlx5_9": {"numa_node": 0},
    },
}


def by_check(results, name):
    return [r for r in results if r.check == name]


def test_healthy_dgx_passes_and_explains_the_topology(registry, nvml_node):
    results = run(registry, nvml_node(), ["topology"])
    assert {r.check: r.status for r in results} == {
        "topology.gpu-nic": Status.OK,
        "topology.acs": Status.OK,
        "topology.iommu": Status.OK,
        "topology.gpu-nvme": Status.SKIP,
    }
    (nic,) = by_check(results, "topology.gpu-nic")
    assert nic.summary == "8 GPUs, each with an RDMA NIC at PXB or better"
    assert (
        nic.details["nvml_cross_check"] == "agrees"
    )  # NVML's GPU-pair levels match the sysfs tree
    table = nic.details["topology"].splitlines()
    assert table[0].split() == ["GPU", "PCI", "NUMA", "NIC", "NVMe"]
    assert table[1].split() == [
        "GPU0",
        "0000:18:00.0",
        "0",
        "mlx5_0,mlx5_1",
        "PIX",
        "nvme0,nvme1",
        "NODE",
    ]
    assert table[8].split() == [
        "GPU7",
        "0000:c6:00.0",
        "1",
        "mlx5_6,mlx5_7",
        "PIX",
        "nvme2,nvme3",
        "NODE",
    ]
    assert (
        by_check(results, "topology.iommu")[0].summary == "IOMMU in passthrough for GPUs and NICs"
    )


def test_gpus_across_the_socket_from_every_nic(registry, nvml_node):
    node = nvml_node(overrides=SYS_GPUS)
    results = by_check(run(registry, node, ["topology.gpu-nic"]), "topology.gpu-nic")
    assert [(r.status, r.component) for r in results] == [
        (Status.FAIL, "gpu:6 0000:c4:00.0"),
        (Status.FAIL, "gpu:7 0000:c6:00.0"),
    ]
    assert results[0].summary == (
        "GPU6 (0000:c4:00.0, NUMA 1): nearest RDMA NIC is mlx5_0 at SYS, worse than PXB"
    )
    assert results[0].action is Action.DRAIN and "move the RDMA NIC" in results[0].details["fix"]
    assert "GPU6  0000:c4:00.0  1     mlx5_0,mlx5_1+8 SYS" in results[0].details["topology"]
    relaxed = run(
        registry,
        node,
        ["topology.gpu-nic"],
        {"checks": {"topology.gpu-nic": {"on_violation": "warn"}}},
    )
    assert {r.status for r in relaxed} == {Status.WARN}
    accepting = run(
        registry, node, ["topology.gpu-nic"], {"checks": {"topology.gpu-nic": {"max_level": "SYS"}}}
    )
    assert [r.status for r in accepting] == [Status.OK]


def test_acs_redirect_on_one_switch(registry, nvml_node):
    results = run(
        registry, nvml_node(overrides={"switch": {"sw1": {"acs_redirect": True}}}), ["topology.acs"]
    )
    assert [(r.status, r.component) for r in results] == [
        (Status.FAIL, "pci:0000:41:00.0"),
        (Status.FAIL, "pci:0000:41:01.0"),
        (Status.FAIL, "pci:0000:41:02.0"),
        (Status.FAIL, "pci:0000:41:03.0"),
    ]
    first = results[0]
    assert first.summary.startswith(
        "bridge 0000:41:00.0 has ACS ReqRedir+CmpltRedir enabled on the path GPU2-"
    )
    assert first.details["ACSCtl"].startswith("SrcValid+ TransBlk- ReqRedir+ CmpltRedir+")
    assert "setpci -s 0000:41:00.0 ECAP_ACS+6.w=0000" in first.details["fix"]


def test_acs_needs_root_to_read_extended_config_space(registry, nvml_node):
    node = nvml_node()
    for bridge in ("0000:17:00.0", "0000:17:01.0"):
        real = node.path("/sys/bus/pci/devices/%s" % bridge).resolve() / "config"
        real.write_bytes(real.read_bytes()[:64])  # what an unprivileged read returns
    results = run(registry, node, ["topology.acs"])
    assert [r.status for r in results] == [Status.UNKNOWN]
    assert results[0].summary == (
        "cannot read the ACS capability of 2 bridges (0000:17:00.0, 0000:17:01.0): only 64 "
        "bytes of config space readable: extended capabilities need root; run as root"
    )
    assert results[0].action is Action.NONE and results[0].effective_blame.value == "check"


def test_acs_is_skipped_inside_a_vm(registry, nvml_node):
    results = run(
        registry,
        nvml_node(
            overrides={"node": {"virtualization": "kvm"}, "switch": {"sw1": {"acs_redirect": True}}}
        ),
        ["topology.acs"],
    )
    assert [r.status for r in results] == [Status.SKIP]
    assert "virtual machine (CPU flag 'hypervisor')" in results[0].summary


def test_iommu_in_translation_mode(registry, nvml_node):
    node = nvml_node(overrides={"iommu": {"mode": "translated"}})
    (result,) = run(registry, node, ["topology.iommu"])
    assert (
        result.status is Status.WARN and "IOMMU translates DMA for 18 GPUs/NICs" in result.summary
    )
    assert "boot with iommu=pt" in result.summary
    (strict,) = run(
        registry, node, ["topology.iommu"], {"checks": {"topology.iommu": {"translated": "fail"}}}
    )
    assert strict.status is Status.FAIL and strict.action is Action.DRAIN


def test_iommu_off_is_fine(registry, nvml_node):
    (result,) = run(registry, nvml_node(overrides={"iommu": {"mode": "off"}}), ["topology.iommu"])
    assert (result.status, result.summary) == (Status.OK, "IOMMU off")


def test_gpu_nvme_locality_for_gpudirect_storage(registry, nvml_node):
    required = {"checks": {"topology.gpu-nvme": {"required": True}}}
    results = run(registry, nvml_node(), ["topology.gpu-nvme"], required)
    assert len(results) == 8 and {r.status for r in results} == {Status.FAIL}
    assert (
        results[0].summary
        == "GPU0 (0000:18:00.0, NUMA 0): nearest NVMe drive is nvme0 at NODE, worse than PXB"
    )
    # nvidia_fs loaded and a data drive on every GPU switch: GDS-ready without any configuration
    local = {
        "modules": {"nvidia_fs": "2.20.5"},
        "nvme": {
            "nvme%d" % i: {
                "pci": "0000:%02x:00.0" % bus,
                "switch": sw,
                "root_port": "",
                "numa_node": None,
            }
            for i, (bus, sw) in enumerate(
                [(0x1C, "sw0"), (0x46, "sw1"), (0x9E, "sw2"), (0xC8, "sw3")]
            )
        },
    }
    node = nvml_node(overrides=local)
    results = run(registry, node, ["topology.gpu-nvme", "gpudirect.storage"])
    assert [(r.check, r.status) for r in results] == [
        ("topology.gpu-nvme", Status.OK),
        ("gpudirect.storage", Status.OK),
    ]
    assert results[1].summary == "nvidia_fs 2.20.5 loaded; 4 NVMe drives at PXB or better to a GPU"


def test_cpu_node_skips(registry, fake_node):
    results = run(registry, fake_node("cpu-only"), ["topology"])
    assert {r.status for r in results} == {Status.SKIP}


def test_pci_tree_reads_numa_locality_only_for_the_endpoints_asked(fake_node):
    from slurm_hooks.hw import pcie
    from slurm_hooks.hw.host import Host

    class CountingHost(Host):
        reads = 0

        def read_bytes(self, host_path, *args, **kwargs):
            if host_path.endswith(("/numa_node", "/local_cpulist")):
                CountingHost.reads += 1
            return super().read_bytes(host_path, *args, **kwargs)

    node = fake_node("dgx-h100")
    full = pcie.read_pci_tree(Host(str(node.root)))
    gpu = next(
        bdf
        for bdf, n in full.nodes.items()
        if n.numa_node >= 0
        and n.local_cpus
        and bdf not in {b for m in full.nodes.values() for b in m.chain[:-1]}
    )
    bridge = full.nodes[gpu].chain[0]
    assert full.nodes[bridge].numa_node >= 0  # every device by default

    host = CountingHost(str(node.root))
    some = pcie.read_pci_tree(host, locality_for=[gpu.upper()])
    assert CountingHost.reads == 2
    assert (some.nodes[gpu].numa_node, some.nodes[gpu].local_cpus) == (
        full.nodes[gpu].numa_node,
        full.nodes[gpu].local_cpus,
    )
    assert (some.nodes[bridge].numa_node, some.nodes[bridge].local_cpus) == (-1, frozenset())
    assert some.nodes.keys() == full.nodes.keys() and some.nodes[gpu].chain == full.nodes[gpu].chain


# -- a DGX-A100-like node: GPUs three switches deep, NICs two deep, NPS4 (issue 18) ----------------------------

A100_GPU = {
    0: "0000:07:00.0",
    1: "0000:0f:00.0",
    2: "0000:47:00.0",
    3: "0000:4e:00.0",
    4: "0000:87:00.0",
    5: "0000:90:00.0",
    6: "0000:b7:00.0",
    7: "0000:bd:00.0",
}


def test_dgx_a100_gpu_nic_is_pxb_end_to_end(registry, nvml_node):
    """Every GPU meets its two NICs at PXB, as `nvidia-smi topo -m` shows on a DGX A100 (NVIDIA/nccl#1505):
    the default max_level PXB passes, PIX fails every GPU; NVML's answers (the fake library, deciding by NUMA
    node like the driver) agree with the sysfs tree on all 28 GPU pairs, though 4 NUMA nodes share a socket."""
    node = nvml_node("dgx-a100")
    (nic,) = by_check(run(registry, node, ["topology.gpu-nic"]), "topology.gpu-nic")
    assert (nic.status, nic.summary) == (
        Status.OK,
        "8 GPUs, each with an RDMA NIC at PXB or better",
    )
    assert nic.details["nvml_cross_check"] == "agrees"
    rows = {line.split()[0]: line.split() for line in nic.details["topology"].splitlines()[1:]}
    assert rows["GPU0"] == ["GPU0", A100_GPU[0], "3", "mlx5_0,mlx5_1", "PXB", "nvme2", "PXB"]
    assert rows["GPU3"] == ["GPU3", A100_GPU[3], "1", "mlx5_2,mlx5_3", "PXB", "nvme3", "PXB"]
    assert rows["GPU7"] == ["GPU7", A100_GPU[7], "5", "mlx5_8,mlx5_9", "PXB", "nvme5", "PXB"]
    strict = run(
        registry, node, ["topology.gpu-nic"], {"checks": {"topology.gpu-nic": {"max_level": "PIX"}}}
    )
    assert [(r.status, r.component) for r in strict] == [
        (Status.FAIL, "gpu:%d %s" % (i, A100_GPU[i])) for i in range(8)
    ]
    assert (
        strict[0].summary
        == "GPU0 (0000:07:00.0, NUMA 3): nearest RDMA NIC is mlx5_0 at PXB, worse than PIX"
    )


def test_nvml_levels_follow_the_driver_by_numa_node(registry, nvml_node):
    """NPS4: GPU0 (node 3) and GPU2 (node 1) are on one socket but different NUMA nodes: SYS for the driver
    and for sysfs. A fake deciding by socket would answer NODE; the cross-check must catch such a disagreement."""
    import pynvml as P

    node = nvml_node("dgx-a100")  # the real pynvml, pointed at this node's fake library
    P.nvmlInit()
    try:
        assert "fakenvml" in P.nvmlSystemGetNVMLVersion()
        h0, h1, h2 = (P.nvmlDeviceGetHandleByIndex(i) for i in (0, 1, 2))
        assert P.nvmlDeviceGetTopologyCommonAncestor(h0, h1) == P.NVML_TOPOLOGY_MULTIPLE
        assert P.nvmlDeviceGetTopologyCommonAncestor(h0, h2) == P.NVML_TOPOLOGY_SYSTEM
        assert (
            len(P.nvmlDeviceGetTopologyNearestGpus(h0, P.NVML_TOPOLOGY_MULTIPLE)) == 1
        )  # GPU1 only
    finally:
        P.nvmlShutdown()
    node.set_state("gpu.0.topology.2", 40)  # what deciding by socket would say: NODE
    results = by_check(run(registry, node, ["topology.gpu-nic"]), "topology.gpu-nic")
    assert [(r.status, r.summary.split(";")[0]) for r in results] == [
        (Status.WARN, "GPU0-GPU2: sysfs says SYS, NVML says NODE")
    ]


def _level(node, a, b):
    from slurm_hooks.hw import pcie
    from slurm_hooks.hw.host import Host

    return pcie.read_pci_tree(Host(str(node.root))).level(a, b).name


def test_numa_node_minus_one(fake_node):
    """numa_node -1 ("no affinity"): a device takes its nearest bridge's node; with none anywhere it is NODE
    only against another device without one (the same CPU affinity: every CPU), SYS against a real node."""
    node = fake_node(
        "dgx-h100", {"gpu": {7: {"numa_node": -1}}}
    )  # GPU7 says -1, its switch (sw3) NUMA 1
    gpu7 = "0000:c6:00.0"
    assert node.path("/sys/bus/pci/devices/%s/numa_node" % gpu7).read_text().strip() == "-1"
    assert node.path("/sys/bus/pci/devices/%s/local_cpulist" % gpu7).read_text().strip() == "0-223"
    assert _level(node, gpu7, "0000:9a:00.0") == "NODE"  # GPU4: NUMA 1 on another host bridge
    assert _level(node, gpu7, "0000:18:00.0") == "SYS"  # GPU0: NUMA 0
    # nothing on the path says (a host bridge without _PXM): unknown next to known is SYS, next to another
    # unknown NODE - no longer "the same node as anything", which turned SYS into NODE
    unknown = {
        "nic": {
            "mlx5_8": {"numa_node": -1},
            "mlx5_9": {"numa_node": -1, "root_port": "0000:b0:01.0", "pci": "0000:b1:00.0"},
        }
    }
    node = fake_node("dgx-h100", unknown)
    assert node.path("/sys/bus/pci/devices/0000:a9:01.0/numa_node").read_text().strip() == "-1"
    assert _level(node, "0000:aa:00.0", "0000:9a:00.0") == "SYS"
    assert _level(node, "0000:aa:00.0", "0000:18:00.0") == "SYS"
    assert _level(node, "0000:aa:00.0", "0000:b1:00.0") == "NODE"


def test_numa_minus_one_in_the_fake_driver_too(fake_node):
    from tests.fakenode import load_spec, pci

    spec = load_spec(
        "dgx-h100", {"gpu": {7: {"numa_node": -1}}, "switch": {"sw3": {"numa_node": -1}}}
    )
    levels = pci.nvml_levels(spec)
    assert levels[(7, 6)] == pci.NVML_SINGLE  # same switch: unaffected
    assert (
        levels[(7, 4)] == pci.NVML_SYSTEM and levels[(7, 0)] == pci.NVML_SYSTEM
    )  # unknown vs NUMA 1 / NUMA 0


def test_a_trees_levels_are_remembered_and_stay_what_path_level_says(fake_node):
    """Round 8: PciTree.level remembers each pair's answer (the topology checks ask for ~660 paths
    per prolog); every pair's level is path_level's, asked once or again, and the remembered
    answers are no field: a tree still equals a fresh read of the same node and pickles as before."""
    import pickle

    from slurm_hooks.hw import pcie
    from slurm_hooks.hw.host import Host

    node = fake_node("dgx-h100")
    tree = pcie.read_pci_tree(Host(str(node.root)))
    fresh = pcie.read_pci_tree(Host(str(node.root)))
    ends = sorted(tree.nodes)[:40]
    for _ in range(2):
        for a in ends:
            for b in ends:
                expected = pcie.path_level(tree.nodes[a], tree.nodes[b], tree.port_type)
                assert tree.level(a, b) is expected, (a, b)
    assert tree == fresh and tree.__dict__["_levels"] and "_levels" not in fresh.__dict__
    again = pickle.loads(pickle.dumps(fresh))
    assert again == tree and again.level(ends[0], ends[-1]) is tree.level(ends[0], ends[-1])
