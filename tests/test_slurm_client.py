"""slurm_hooks.slurm.client: parser table tests, backend unit tests, and ONE contract suite that runs against
(a) ScontrolBackend on the real slurmctld, (b) PyslurmBackend over tests/doubles/pyslurm.py (also the
real slurmctld underneath), (c) PyslurmBackend over real pyslurm when a matching one is importable."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_hooks.core.structs import FrozenError
from slurm_hooks.slurm import client as slurm
from slurm_hooks.slurm import errors as slurm_errors
from slurm_hooks.slurm.client import PyslurmBackend, ScontrolBackend, SlurmClient, choose_backend
from slurm_hooks.slurm.errors import (
    NodeNotFound,
    SlurmCommandError,
    SlurmError,
    SlurmParseError,
    SlurmUnavailable,
)
from slurm_hooks.slurm.node_state import NodeInfo, parse_node_line, parse_nodes, parse_state
from tests.doubles.pyslurm import PyslurmDouble
from tests.slurmcluster import slurm_cluster_factory  # noqa: F401 - fixture (until conftest imports it)

# ---------------------------------------------------------------------------------------------
# parser tables

# verbatim from Slurm 22.05.8 (Debian 12) on the test cluster
L2205_IDLE = (
    "NodeName=node1 Arch=x86_64 CoresPerSocket=2  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.17 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:8 NodeAddr=127.0.0.1 NodeHostName=localhost "
    "Version=22.05.8 OS=Linux 6.18.44-fc-v1045 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1024 AllocMem=0 "
    "FreeMem=23879 Sockets=1 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A "
    "MCS_label=N/A Partitions=debug  BootTime=2026-12-02T14:41:06 SlurmdStartTime=2026-12-02T14:46:34 "
    "LastBusyTime=2026-12-02T14:46:34 CfgTRES=cpu=2,mem=1G,billing=2 AllocTRES= CapWatts=n/a "
    "CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s"
)
L2205_DOWN_DRAIN = (
    "NodeName=node2 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=1 CPUTot=1 CPULoad=N/A AvailableFeatures=(null) "
    "ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 NodeHostName=localhost Port=35365  RealMemory=1024 "
    "AllocMem=0 FreeMem=N/A Sockets=1 Boards=1 State=DOWN+DRAIN+NOT_RESPONDING ThreadsPerCore=1 TmpDisk=0 "
    "Weight=1 Owner=N/A MCS_label=N/A Partitions=debug  BootTime=None SlurmdStartTime=None "
    "LastBusyTime=Unknown CfgTRES=cpu=1,mem=1G,billing=1 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 "
    "ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s "
    "Reason=slurm-hooks: gpu.ecc: GPU 3 (0000:3b:00.0) DBE=2 volatile [root@2026-12-02T10:00:00]"
)
# 24.11-style record (ResumeAfterTime, gres/gpu in CfgTRES, Comment after Reason)
L2411_CLOUD = (
    "NodeName=gpu-a17 Arch=x86_64 CoresPerSocket=56 CPUAlloc=0 CPUEfctv=224 CPUTot=224 CPULoad=0.01 "
    "AvailableFeatures=h100,ib ActiveFeatures=h100,ib Gres=gpu:h100:8(S:0-1) NodeAddr=gpu-a17 "
    "NodeHostName=gpu-a17 Version=24.11.5 OS=Linux 6.12.38+deb13-amd64 #1 SMP PREEMPT_DYNAMIC Debian "
    "6.12.38-1 (2025-07-16) RealMemory=2000000 AllocMem=0 FreeMem=N/A Sockets=2 Boards=1 "
    "State=IDLE+CLOUD+POWERED_DOWN ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
    "Partitions=gpu,gpu-long BootTime=None SlurmdStartTime=None LastBusyTime=2025-11-02T08:00:00 "
    "ResumeAfterTime=None CfgTRES=cpu=224,mem=2000000M,billing=224,gres/gpu=8 AllocTRES= CurrentWatts=0 "
    "AveWatts=0 Reason=power save [slurm@2025-11-02T08:10:00] Comment=rack 7"
)

CASES = [
    # (line, name, state, flags, reason, reason_user, reason_time, partitions)
    (L2205_IDLE, "node1", "IDLE", set(), None, None, None, ("debug",)),
    (
        L2205_DOWN_DRAIN,
        "node2",
        "DOWN",
        {"DRAIN", "NOT_RESPONDING"},
        "slurm-hooks: gpu.ecc: GPU 3 (0000:3b:00.0) DBE=2 volatile",
        "root",
        "2026-12-02T10:00:00",
        ("debug",),
    ),
    (
        L2411_CLOUD,
        "gpu-a17",
        "IDLE",
        {"CLOUD", "POWERED_DOWN"},
        "power save",
        "slurm",
        "2025-11-02T08:10:00",
        ("gpu", "gpu-long"),
    ),
    (
        "NodeName=n1 State=IDLE+DRAIN Partitions=p Reason=Prolog error [root@2024-01-01T00:00:00]",
        "n1",
        "IDLE",
        {"DRAIN"},
        "Prolog error",
        "root",
        "2024-01-01T00:00:00",
        ("p",),
    ),
    ("NodeName=n1 State=MIXED Partitions=a,b", "n1", "MIXED", set(), None, None, None, ("a", "b")),
    (
        "NodeName=n1 State=MIXED+DRAIN Reason=x [u1@2024-01-01T00:00:00]",
        "n1",
        "MIXED",
        {"DRAIN"},
        "x",
        "u1",
        "2024-01-01T00:00:00",
        (),
    ),
    (
        "NodeName=n1 State=ALLOCATED+COMPLETING Partitions=(null)",
        "n1",
        "ALLOCATED",
        {"COMPLETING"},
        None,
        None,
        None,
        (),
    ),
    (
        "NodeName=n1 State=IDLE+NOT_RESPONDING",
        "n1",
        "IDLE",
        {"NOT_RESPONDING"},
        None,
        None,
        None,
        (),
    ),
    (
        "NodeName=n1 State=DOWN+NOT_RESPONDING Reason=Not responding [slurm@2024-05-05T05:05:05]",
        "n1",
        "DOWN",
        {"NOT_RESPONDING"},
        "Not responding",
        "slurm",
        "2024-05-05T05:05:05",
        (),
    ),
    (
        "NodeName=n1 State=IDLE+DRAIN+REBOOT_REQUESTED Reason=reboot requested [root@2024-01-01T00:00:00]",
        "n1",
        "IDLE",
        {"DRAIN", "REBOOT_REQUESTED"},
        "reboot requested",
        "root",
        "2024-01-01T00:00:00",
        (),
    ),
    (
        "NodeName=n1 State=IDLE+MAINTENANCE+RESERVED",
        "n1",
        "IDLE",
        {"MAINTENANCE", "RESERVED"},
        None,
        None,
        None,
        (),
    ),
    (
        "NodeName=n1 State=UNKNOWN+DRAIN Reason=kept [root@2024-01-01T00:00:00]",
        "n1",
        "UNKNOWN",
        {"DRAIN"},
        "kept",
        "root",
        "2024-01-01T00:00:00",
        (),
    ),
    (
        "NodeName=n1 State=IDLE+DRAIN+DYNAMIC_NORM Reason=a=b c=d State=x [root@2024-01-01T00:00:00]",
        "n1",
        "IDLE",
        {"DRAIN", "DYNAMIC_NORM"},
        "a=b c=d State=x",
        "root",
        "2024-01-01T00:00:00",
        (),
    ),
    # our own structured reason with brackets inside; only the final [user@time] is Slurm's
    (
        "NodeName=n1 State=IDLE+DRAIN Reason=slurm-hooks: gpu.xid: [xid 79] fell off the bus [root@2026-12-02T10:00:00]",
        "n1",
        "IDLE",
        {"DRAIN"},
        "slurm-hooks: gpu.xid: [xid 79] fell off the bus",
        "root",
        "2026-12-02T10:00:00",
        (),
    ),
    # reason without Slurm's stamp (older/odd output) runs to the end of the line
    (
        "NodeName=n1 State=DOWN Reason=set in slurm.conf",
        "n1",
        "DOWN",
        set(),
        "set in slurm.conf",
        None,
        None,
        (),
    ),
    ("NodeName=n1 State=DRAINED", "n1", "IDLE", {"DRAIN"}, None, None, None, ()),
    ("NodeName=n1 State=FUTURE", "n1", "FUTURE", set(), None, None, None, ()),
    ("NodeName=n1 State=FROBNICATED+WOBBLY", "n1", "FROBNICATED", {"WOBBLY"}, None, None, None, ()),
]


@pytest.mark.parametrize("line,name,state,flags,reason,user,when,parts", CASES)
def test_parse_node_line(line, name, state, flags, reason, user, when, parts):
    n = parse_node_line(line)
    assert (
        n.name,
        n.state,
        set(n.flags),
        n.reason,
        n.reason_user,
        n.reason_time,
        n.partitions,
    ) == (name, state, flags, reason, user, when, parts)
    assert n.raw == line.strip()
    assert n.is_drained == ("DRAIN" in flags)


def test_nodeinfo_helpers():
    n = parse_node_line(L2205_DOWN_DRAIN)
    assert (
        n.is_drained and n.is_down and n.is_not_responding and not n.is_draining and n.known_state
    )
    assert n.state_string == "DOWN+DRAIN+NOT_RESPONDING"
    assert parse_node_line("NodeName=a State=MIXED+DRAIN").is_draining
    assert parse_node_line(L2411_CLOUD).is_power_saving
    assert parse_node_line("NodeName=a State=IDLE+REBOOT_ISSUED").is_rebooting
    assert not parse_node_line("NodeName=n1 State=FROBNICATED").known_state
    with pytest.raises(FrozenError):
        n.state = "IDLE"


@pytest.mark.parametrize(
    "text,base,flags",
    [
        ("IDLE", "IDLE", set()),
        ("idle*", "IDLE", {"NOT_RESPONDING"}),
        ("drained", "IDLE", {"DRAIN"}),
        ("draining", "ALLOCATED", {"DRAIN"}),
        ("drng", "ALLOCATED", {"DRAIN"}),
        ("drain*", "IDLE", {"DRAIN", "NOT_RESPONDING"}),
        ("mixed*", "MIXED", {"NOT_RESPONDING"}),
        ("down", "DOWN", set()),
        ("idle~", "IDLE", {"POWERED_DOWN"}),
        ("alloc", "ALLOCATED", set()),
        ("maint", "IDLE", {"MAINTENANCE"}),
        ("IDLE+MAINT", "IDLE", {"MAINTENANCE"}),
        ("down$", "DOWN", {"MAINTENANCE"}),
        ("idle@", "IDLE", {"REBOOT_REQUESTED"}),
        ("unk*", "UNKNOWN", {"NOT_RESPONDING"}),
        ("IDLE+CLOUD+POWERED_DOWN", "IDLE", {"CLOUD", "POWERED_DOWN"}),
        ("completing", "ALLOCATED", {"COMPLETING"}),
    ],
)
def test_parse_state(text, base, flags):
    assert parse_state(text) == (base, frozenset(flags))


GARBAGE = [
    "",
    "   ",
    "garbage",
    "NodeName=",
    "NodeName= State=IDLE",
    "State=IDLE NodeName=n1",
    "NodeName=n1",
    "NodeName=n1 Arch=x86_64",
    "NodeName=n1 State=",
    "NodeName=n1 State=IDLE++DRAIN",
    "NodeName=n1 State=+",
    "NodeName=n1 State=IDLE;rm",
    "NodeName=n1 State=IDLE\x00",
    "slurm_load_node error: Unable to contact",
    "Node node9 not found",
    None,
    b"NodeName=n1 State=IDLE",
    42,
]


@pytest.mark.parametrize("line", GARBAGE)
def test_parse_garbage_raises_parse_error(line):
    with pytest.raises(SlurmParseError):
        parse_node_line(line)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_parser_never_crashes(text):
    for candidate in (text, "NodeName=n1 " + text, "NodeName=n1 State=IDLE Reason=" + text):
        try:
            node = parse_node_line(candidate)
        except SlurmParseError:
            continue
        assert isinstance(node, NodeInfo)


def test_parse_nodes_multi_and_multiline():
    nodes = parse_nodes("\n".join([L2205_IDLE, L2205_DOWN_DRAIN, L2411_CLOUD]) + "\n")
    assert [n.name for n in nodes] == ["node1", "node2", "gpu-a17"]
    multi = (
        "NodeName=a Arch=x86_64\n   State=IDLE+DRAIN ThreadsPerCore=1\n   Reason=r [root@2024-01-01T00:00:00]\n\n"
        "NodeName=b\n   State=IDLE\n"
    )
    got = parse_nodes(multi)
    assert [(n.name, n.state_string, n.reason) for n in got] == [
        ("a", "IDLE+DRAIN", "r"),
        ("b", "IDLE", None),
    ]
    assert parse_nodes("") == [] and parse_nodes("No nodes in the system\n") == []
    with pytest.raises(SlurmParseError):
        parse_nodes("error: something\nNodeName=a State=IDLE")


@pytest.mark.parametrize(
    "reason", ["", "  ", "a\nb", '"quoted"', 'x"', " lead", "trail ", "t\tab", "x" * 600]
)
def test_bad_reasons_rejected(reason):
    with pytest.raises(ValueError):
        SlurmClient(backend=_NoBackend()).drain("node1", reason)


@pytest.mark.parametrize("name", ["", "node[1-4]", "a,b", "a b", "-x", "n;rm", "ALL x"])
def test_bad_names_rejected(name):
    client = SlurmClient(backend=_NoBackend())
    for call in (
        lambda: client.drain(name, "r"),
        lambda: client.resume(name),
        lambda: client.show_node(name),
    ):
        with pytest.raises(ValueError):
            call()
    assert client.calls == 0


class _NoBackend(slurm.Backend):
    def show_node(self, name):
        raise AssertionError("no call expected")

    list_nodes = drain = resume = show_node


# ---------------------------------------------------------------------------------------------
# ScontrolBackend with a scripted runner (no Slurm needed)


class Script:
    """Runner double: replies in order; each reply is (rc, stdout, stderr) or an exception."""

    def __init__(self, *replies):
        self.replies, self.argvs, self.timeouts = list(replies), [], []

    def __call__(self, argv, timeout, env):
        self.argvs.append(argv)
        self.timeouts.append(timeout)
        assert isinstance(argv, list) and all(isinstance(a, str) for a in argv)
        assert env["SLURM_TIME_FORMAT"] == "standard"
        reply = self.replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply


def test_scontrol_argv_and_parse():
    run = Script(
        (0, L2205_IDLE + "\n", ""),
        (0, "", ""),
        (0, "", ""),
        (0, L2205_IDLE + "\n" + L2205_DOWN_DRAIN, ""),
    )
    b = ScontrolBackend(runner=run)
    client = SlurmClient(backend=b)
    assert client.calls == 0
    assert client.show_node("node1").state == "IDLE"
    client.drain("node1", "slurm-hooks: gpu.ecc: GPU 3 DBE=2 [x]; $(rm -rf /) `id`")
    client.resume("node1")
    assert [n.name for n in client.list_nodes()] == ["node1", "node2"]
    assert run.argvs == [
        ["scontrol", "--all", "--oneliner", "show", "node", "node1"],
        [
            "scontrol",
            "update",
            "NodeName=node1",
            "State=DRAIN",
            "Reason=slurm-hooks: gpu.ecc: GPU 3 DBE=2 [x]; $(rm -rf /) `id`",
        ],
        ["scontrol", "update", "NodeName=node1", "State=RESUME"],
        ["scontrol", "--all", "--oneliner", "show", "node"],
    ]
    assert client.calls == 4 and [op[0] for op in client.ops] == [
        "show_node",
        "drain",
        "resume",
        "list_nodes",
    ]


def test_scontrol_retries_transient_then_succeeds():
    run = Script(
        (1, "", "slurm_load_node error: Unable to contact slurm controller (connect failure)\n"),
        (0, L2205_IDLE, ""),
    )
    b = ScontrolBackend(runner=run, backoff=0.01)
    assert b.show_node("node1").name == "node1" and b.calls == 2


@pytest.mark.parametrize(
    "first",
    [
        subprocess.TimeoutExpired(["scontrol"], 5),
        (1, "", "slurm_load_node error: Socket timed out on send/recv operation\n"),
        (1, "", "slurm_update error: Zero Bytes were transmitted or received\n"),
    ],
)
def test_scontrol_transient_exhausts_to_unavailable(first):
    run = Script(first, first)
    b = ScontrolBackend(runner=run, timeout=1.0, attempts=2, backoff=0.01)
    with pytest.raises(SlurmUnavailable):
        b.drain("node1", "r")
    assert b.calls == 2 and run.timeouts[0] == 1.0


@pytest.mark.parametrize(
    "reply,exc",
    [
        ((1, "", "Node node9 not found\n"), NodeNotFound),
        ((1, "", " slurm_update error: Invalid node name specified\n"), NodeNotFound),
        ((1, "", " slurm_update error: Invalid node state specified\n"), SlurmCommandError),
        ((1, "", "slurm_update error: Access/permission denied\n"), SlurmCommandError),
        (
            (1, "", "auth/munge: _encode: Munge encode failed: Failed to access socket\n"),
            SlurmUnavailable,
        ),
        (FileNotFoundError(2, "No such file", "scontrol"), SlurmUnavailable),
    ],
)
def test_scontrol_permanent_errors_not_retried(reply, exc):
    run = Script(reply, (0, "", ""))
    b = ScontrolBackend(runner=run, backoff=0.01)
    with pytest.raises(exc):
        b.resume("node9")
    assert b.calls == 1


def test_scontrol_deadline_bounds_total_time():
    def slow(argv, timeout, env):
        time.sleep(timeout)
        raise subprocess.TimeoutExpired(argv, timeout)

    b = ScontrolBackend(runner=slow, timeout=0.3, attempts=5, backoff=0.05, deadline=0.5)
    t0 = time.monotonic()
    with pytest.raises(SlurmUnavailable):
        b.show_node("node1")
    assert time.monotonic() - t0 < 0.7 and b.calls == 2


def test_scontrol_garbage_output_is_parse_error():
    with pytest.raises(SlurmParseError):
        ScontrolBackend(runner=Script((0, "what is this\n", ""))).show_node("node1")
    with pytest.raises(NodeNotFound):
        ScontrolBackend(runner=Script((0, "", ""))).show_node("node1")


# ---------------------------------------------------------------------------------------------
# choose_backend


class FakeModule:
    def __init__(self, version):
        self.__version__ = version

    def version(self):
        return self.__version__


def test_choose_backend(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    env = {"SLURM_CONF": str(conf), "PATH": os.environ.get("PATH", "")}
    v2205 = Script((0, "slurm-wlm 22.05.8\n", ""))
    b, why = choose_backend(env=env, pyslurm_module=FakeModule("22.5.3"), runner=v2205)
    assert isinstance(b, PyslurmBackend) and "22.5.3" in why and b.probe_calls == 1
    b, why = choose_backend(
        env=env, pyslurm_module=FakeModule("25.11.0"), runner=Script((0, "slurm 22.05.8\n", ""))
    )
    assert isinstance(b, ScontrolBackend) and "does not match Slurm 22.05.8" in why
    b, why = choose_backend(
        env={"SLURM_CONF": str(tmp_path / "missing")}, pyslurm_module=FakeModule("22.5.3")
    )
    assert isinstance(b, ScontrolBackend) and "slurm.conf" in why and b.probe_calls == 0
    b, why = choose_backend(
        env=env, pyslurm_module=FakeModule("22.5.3"), runner=Script((1, "", "fatal"))
    )
    assert isinstance(b, ScontrolBackend) and "version" in why
    with pytest.raises(SlurmError, match="requested but unusable") as err:
        choose_backend(
            "pyslurm",
            env=env,
            pyslurm_module=FakeModule("25.11.0"),
            runner=Script((0, "slurm 22.05.8\n", "")),
        )
    assert isinstance(
        err.value, slurm_errors.SlurmClientMissing
    )  # the admin reads "Slurm client unusable", not "refused"
    b, why = choose_backend("scontrol", pyslurm_module=FakeModule("22.5.3"))
    assert isinstance(b, ScontrolBackend) and b.probe_calls == 0
    with pytest.raises(ValueError):
        choose_backend("rest")


def test_pyslurm_gets_the_drain_budget_and_auto_avoids_it_when_messagetimeout_exceeds_it(tmp_path):
    """A pyslurm request blocks for up to MessageTimeout and cannot be cut short: both backends get the
    [drain] budget (timeout x attempts + backoff: 10.5 s by default, it was 20.5 s for pyslurm), and
    'auto' keeps scontrol where MessageTimeout alone is longer than the budget."""
    conf = tmp_path / "slurm.conf"
    env = {"SLURM_CONF": str(conf), "PATH": os.environ.get("PATH", "")}
    for text, per_request in (
        ("ClusterName=x\n", 10.0),
        ("ClusterName=x\nmessagetimeout=3 # short\n", 3.0),
    ):
        conf.write_text(text)
        b, why = choose_backend(
            env=env, pyslurm_module=FakeModule("25.11.2"), runner=Script((0, "slurm 25.11.7\n", ""))
        )
        assert isinstance(b, PyslurmBackend), why
        assert (b.retry.deadline, b.message_timeout, b.auth_type) == (
            10.5,
            per_request,
            "auth/munge",
        )
    conf.write_text("ClusterName=x\nMessageTimeout=10\nAuthType=auth/slurm\nMessageTimeout=30\n")
    b, why = choose_backend(
        env=env, pyslurm_module=FakeModule("25.11.2"), runner=Script((0, "slurm 25.11.7\n", ""))
    )
    assert isinstance(b, ScontrolBackend) and "MessageTimeout=30s" in why and "10.5" in why, why
    b, why = choose_backend(
        "pyslurm",
        env=env,
        pyslurm_module=FakeModule("25.11.2"),
        timeout=2.0,
        runner=Script((0, "slurm 25.11.7\n", "")),
    )
    assert isinstance(b, PyslurmBackend) and (b.retry.deadline, b.message_timeout) == (4.5, 30.0)
    assert b.auth_type == "auth/slurm"


def test_slurm_conf_settings(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "# MessageTimeout=99\nmessagetimeout = 20\nAuthType=auth/munge  # comment\nInclude x.conf\n"
    )
    assert slurm.slurm_conf_settings(str(conf)) == {
        "MessageTimeout": "20",
        "AuthType": "auth/munge",
    }
    assert (
        slurm.slurm_conf_settings(str(tmp_path / "missing")) == {}
        and slurm.slurm_conf_settings(None) == {}
    )
    assert slurm.message_timeout({"MessageTimeout": "20"}) == 20.0
    assert slurm.message_timeout({"MessageTimeout": "x"}) == slurm.message_timeout({}) == 10.0


def test_pyslurm_retry_starts_no_attempt_that_cannot_end_in_time():
    """Each stub RPC blocks 0.3 s (its 'MessageTimeout') and fails as a stopped slurmctld does: with a
    0.5 s deadline a second attempt would end at ~0.6 s, so it is not started."""

    def behaviour(*args):
        time.sleep(0.3)
        raise StubRPCError(1800, "Unable to contact slurm controller (connect failure)")

    b = PyslurmBackend(
        stub_module(behaviour), attempts=3, backoff=0.01, deadline=0.5, message_timeout=0.3
    )
    t0 = time.monotonic()
    with pytest.raises(SlurmUnavailable):
        b.show_node("node1")
    assert b.calls == 1 and time.monotonic() - t0 < 0.45


def test_pyslurm_request_late_in_the_hook_budget_still_runs():
    """slurmctld frozen for 3 s held the hook's first request; the breaker count that follows has less
    than MessageTimeout of the budget left and must still be asked (seen on 25.11: 'cannot-count')."""

    class N:
        name, state, reason, reason_user, reason_time, partitions = (
            "node1",
            "IDLE",
            None,
            "root",
            None,
            [],
        )

    b = PyslurmBackend(
        stub_module(lambda *args: [N()] if args[0] == "nodes" else N()),
        attempts=2,
        backoff=0.5,
        deadline=10.5,
        message_timeout=10.0,
    )
    b.until = time.monotonic() + 1.0
    assert [n.name for n in b.list_nodes()] == ["node1"] and b.calls == 1


def test_client_calls_count_requests_to_slurmctld_not_the_version_probe(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    env = {"SLURM_CONF": str(conf), "PATH": os.environ.get("PATH", "")}
    b, _ = choose_backend(
        env=env, pyslurm_module=FakeModule("25.11.2"), runner=Script((0, "slurm 25.11.7\n", ""))
    )
    client = SlurmClient(backend=b)
    assert (client.calls, client.probe_calls) == (0, 1)  # the same slurm_calls= for both backends


def test_client_lazy_backend_makes_no_calls(monkeypatch):
    monkeypatch.setattr(slurm, "pyslurm_version", lambda module=None: None)
    client = SlurmClient(env={"SLURM_CONF": "/nonexistent"})
    assert client.calls == 0 and client._backend is None
    assert isinstance(client.backend, ScontrolBackend) and "not installed" in client.backend_reason
    assert client.calls == 0


def test_pyslurm_not_imported_without_conf(monkeypatch):
    monkeypatch.setenv("SLURM_CONF", "/nonexistent/slurm.conf")
    with pytest.raises(SlurmUnavailable, match="refusing to import"):
        PyslurmBackend().show_node("node1")
    assert "pyslurm" not in sys.modules or sys.modules["pyslurm"] is not None


def test_pyslurm_is_imported_with_the_slurm_conf_that_was_found(monkeypatch, tmp_path):
    """Without $SLURM_CONF, libslurm's own fallback differs from ours (on a configless node it tries a
    DNS SRV lookup and ends the process when that fails): pyslurm must read the file we found."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setattr(slurm, "CONF_CANDIDATES", (str(tmp_path / "missing.conf"), str(conf)))
    seen = []

    class Spy:  # stands in for the module: records the environment at import time
        def __getattr__(self, name):
            raise AttributeError(name)

    def fake_import(name, *args, **kwargs):
        if name == "pyslurm":
            seen.append(os.environ.get("SLURM_CONF"))
            return Spy()
        return real_import(name, *args, **kwargs)

    import builtins

    real_import = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", fake_import)
    assert isinstance(PyslurmBackend().pyslurm, Spy) and seen == [str(conf)]
    explicit = tmp_path / "site.conf"
    explicit.write_text("ClusterName=y\n")
    monkeypatch.setenv("SLURM_CONF", str(explicit))  # an explicit one is kept
    seen.clear()
    assert isinstance(PyslurmBackend().pyslurm, Spy) and seen == [str(explicit)]


# ---------------------------------------------------------------------------------------------
# PyslurmBackend error mapping with an in-memory stub (shape from pyslurm/core/node.pyx)


class StubRPCError(Exception):
    def __init__(self, errno=-1, msg=None):
        self.errno, self.msg = errno, msg
        super().__init__(msg)


def stub_module(behaviour):
    class Node:
        def __init__(self, name=None, **kw):
            self.name, self.kw = name, kw

        @staticmethod
        def load(name):
            return behaviour("load", name)

        def modify(self, changes):
            return behaviour("modify", self.name, changes.kw)

    class Nodes(list):
        @staticmethod
        def load():
            return behaviour("nodes")

    mod = type("pyslurm", (), {})()
    mod.Node, mod.Nodes, mod.RPCError = Node, Nodes, StubRPCError
    return mod


@pytest.mark.parametrize(
    "err,exc,calls",
    [
        (StubRPCError(msg="Node 'node9' does not exist"), NodeNotFound, 1),
        (StubRPCError(2018, "Invalid node name specified"), NodeNotFound, 1),
        (
            StubRPCError(1001, "Unable to contact slurm controller (connect failure)"),
            SlurmUnavailable,
            2,
        ),
        # what the real pyslurm 25.11.2 raised on Slurm 25.11.7 (slurmctld stopped / SIGSTOPped / RESUME of
        # an idle node); slurm_errno.h: SLURMCTLD_COMMUNICATIONS_* are 1800-1805
        (
            StubRPCError(1800, "Unable to contact slurm controller (connect failure)"),
            SlurmUnavailable,
            2,
        ),
        (StubRPCError(5004, "Socket timed out on send/recv operation"), SlurmUnavailable, 2),
        (StubRPCError(2180, "Invalid node state transition"), SlurmCommandError, 1),
        (
            StubRPCError(1007, "Protocol authentication error"),
            SlurmUnavailable,
            1,
        ),  # munged stopped (25.11)
        (StubRPCError(2002, "Access/permission denied"), SlurmCommandError, 1),
    ],
)
def test_pyslurm_error_mapping(err, exc, calls):
    def behaviour(*args):
        raise err

    b = PyslurmBackend(stub_module(behaviour), attempts=2, backoff=0.01)
    with pytest.raises(exc) as raised:
        b.show_node("node9")
    assert b.calls == calls
    if err.errno == 1007:  # the operator needs to know which authentication failed
        assert "AuthType=auth/munge" in str(raised.value)


@pytest.mark.parametrize("errno", [1800, 1801, 1802, 1803, 1804, 1805, 1001, 5004, 5005])
def test_pyslurm_controller_errnos_are_transient_whatever_the_text(errno):
    """The errno decides when the text is not one we know (a translated or reworded strerror)."""

    def behaviour(*args):
        raise StubRPCError(errno, "Kommunikationsfehler")

    b = PyslurmBackend(stub_module(behaviour), attempts=2, backoff=0.01)
    with pytest.raises(SlurmUnavailable):
        b.show_node("node1")
    assert b.calls == 2


def test_pyslurm_modify_arguments_and_node_mapping():
    seen = []

    class N:
        name, state, reason, reason_user, reason_time, partitions = (
            "node1",
            "IDLE+DRAIN",
            "r x",
            "root",
            0,
            ["p"],
        )

    def behaviour(*args):
        seen.append(args)
        return N() if args[0] == "load" else ([N()] if args[0] == "nodes" else None)

    b = PyslurmBackend(stub_module(behaviour))
    b.drain("node1", "slurm-hooks: x")
    b.resume("node1")
    node = b.show_node("node1")
    assert seen[:2] == [
        ("modify", "node1", {"state": "DRAIN", "reason": "slurm-hooks: x"}),
        ("modify", "node1", {"state": "RESUME"}),
    ]
    assert (node.state, node.flags, node.reason, node.reason_user, node.partitions) == (
        "IDLE",
        frozenset({"DRAIN"}),
        "r x",
        "root",
        ("p",),
    )
    assert [n.name for n in b.list_nodes()] == ["node1"]


def test_pyslurm_node_without_reason_has_no_reason_user():
    """The real pyslurm (25.11) reports reason_user 'root' (uid 0) and reason_time None for a node that
    never had a reason; NodeInfo must not claim root set a reason."""

    class Idle:
        name, state, reason, reason_user, reason_time, partitions = (
            "node1",
            "IDLE",
            None,
            "root",
            None,
            ["debug"],
        )

    node = slurm.node_from_pyslurm(Idle())
    assert (node.reason, node.reason_user, node.reason_time) == (None, None, None)


# ---------------------------------------------------------------------------------------------
# the contract suite on the real daemons

OUR = "slurm-hooks: gpu.ecc: GPU 3 (0000:3b:00.0) DBE=2 [volatile] x=1 'q' (test)"
BACKEND_KINDS = ("scontrol", "pyslurm-double", "pyslurm-real")


@pytest.fixture(scope="module")
def cluster(slurm_cluster_factory):  # noqa: F811
    # MessageTimeout=2: a client facing a dead slurmctld gives up in ~1 s instead of ~9 s
    return slurm_cluster_factory("client", nodes=("node1", "node2", "node3"), message_timeout=2)


REQUIRE_REAL_PYSLURM = (
    "SLURM_HOOKS_TEST_REQUIRE_PYSLURM"  # .ci/slurm-root.sh sets it in the Slurm 25.11 root
)


def skip_without_real_pyslurm(why):
    """Skip, saying why; a failure where the real pyslurm is promised ($SLURM_HOOKS_TEST_REQUIRE_PYSLURM=1)."""
    message = "real pyslurm backend not tested: %s" % why
    if os.environ.get(REQUIRE_REAL_PYSLURM) == "1":
        pytest.fail(message + " -- but %s=1" % REQUIRE_REAL_PYSLURM)
    pytest.skip(message)


@pytest.fixture(scope="module")
def real_pyslurm(cluster):
    """The real pyslurm, imported against this module's cluster; only when installed AND matching the
    running Slurm. `import pyslurm` runs slurm_init(), which reads $SLURM_CONF once for the process, so
    SLURM_CONF is set for the import and restored afterwards (the module stays bound to this cluster)."""
    conf = cluster.env["SLURM_CONF"]
    if slurm.pyslurm_version() is None:
        skip_without_real_pyslurm("pyslurm is not installed")
    if (
        "pyslurm" in sys.modules
        and getattr(sys.modules["pyslurm"], "_slurm_hooks_test_conf", None) != conf
    ):
        skip_without_real_pyslurm("pyslurm already imported against another slurm.conf")
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    try:
        why = slurm.pyslurm_unusable(env=cluster.env)
        if why:
            skip_without_real_pyslurm(why)
        import pyslurm

        pyslurm._slurm_hooks_test_conf = conf
        yield pyslurm
    finally:
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved


def make_backend(kind, cluster, request, **kw):
    if kind == "scontrol":
        return ScontrolBackend(env=cluster.env, **kw)
    kw.pop("timeout", None)
    module = (
        PyslurmDouble(cluster.env)
        if kind == "pyslurm-double"
        else request.getfixturevalue("real_pyslurm")
    )
    return PyslurmBackend(module, message_timeout=cluster.message_timeout, **kw)


@pytest.fixture(params=BACKEND_KINDS)
def client(request, cluster):
    c = SlurmClient(
        backend=make_backend(request.param, cluster, request, timeout=5.0, attempts=2, backoff=0.2)
    )
    c.kind = request.param
    yield c
    cluster.start_ctld()  # no-op unless a test stopped it
    if "DRAIN" in cluster.node_state("node1").split("+"):
        cluster.scontrol("update", "NodeName=node1", "State=RESUME")
    cluster.wait_state("node1", "IDLE", timeout=15)


def _settled(client, name, pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        node = client.show_node(name)
        if pred(node) or time.monotonic() > deadline:
            return node
        time.sleep(0.05)


# What the Slurm versions we run against do with a RESUME of a node that is not drained: "Invalid node
# state specified" (ESLURM_INVALID_NODE_STATE, 2028) up to 24.11, "Invalid node state transition"
# (ESLURM_INVALID_NODE_STATE_TRANSITION, 2180) from 25.11 on. What they do with the Reason of a resumed
# node: slurmcluster.RESUME_KEEPS_REASON.
RESUME_OF_IDLE_ERROR = {
    (22, 5): (2028, "Invalid node state specified"),
    (24, 11): (2028, "Invalid node state specified"),
    (25, 11): (2180, "Invalid node state transition"),
    (26, 5): (2180, "Invalid node state transition"),
}


def scontrol_reason(cluster, node="node1"):
    """Reason= as scontrol prints it, without Slurm's ' [user@time]' (independent of slurm_hooks.slurm.client)."""
    raw = cluster.node_reason(node)
    return re.sub(r"\s*\[[^\]@]*@[^\]]*\]$", "", raw) if raw else None


@pytest.mark.slurm
def test_contract_show_idle_node(client, cluster):
    node = client.show_node("node1")
    assert (node.name, node.state, node.flags) == ("node1", "IDLE", frozenset())
    # None, unless an earlier test's drain left its reason behind (slurmcluster.RESUME_KEEPS_REASON)
    assert node.reason == scontrol_reason(cluster)
    assert node.partitions == ("debug",) and not node.is_drained and node.known_state
    if client.kind == "pyslurm-double":
        assert client.backend.pyslurm.rpcs >= 1  # really went through the double


@pytest.mark.slurm
def test_contract_drain_then_resume_round_trip(client, cluster, record_property):
    t0 = time.monotonic()
    client.drain("node1", OUR)
    node = client.show_node("node1")
    drain_rt = time.monotonic() - t0
    assert node.is_drained and node.state == "IDLE" and node.reason == OUR, node
    assert node.reason_user == "root" and node.reason_time and len(node.reason_time) == 19
    t0 = time.monotonic()
    client.resume("node1")
    node = client.show_node("node1")
    assert not node.is_drained, node  # right after RESUME: IDLE+NOT_RESPONDING ('idle*') for ~1 s
    assert node.state == "IDLE" and node.flags <= {"NOT_RESPONDING"}
    node = _settled(client, "node1", lambda n: not n.flags)
    resume_settle = time.monotonic() - t0
    assert node.state_string == "IDLE", node
    assert node.reason in cluster.reasons_after_resume(OUR), node
    record_property("timings", "drain+show %.3fs, resume->IDLE %.2fs" % (drain_rt, resume_settle))
    print("[%s] drain+show %.3fs, resume->IDLE %.2fs" % (client.kind, drain_rt, resume_settle))


@pytest.mark.slurm
def test_contract_unknown_node(client):
    for call in (
        lambda: client.show_node("node99"),
        lambda: client.drain("node99", "r"),
        lambda: client.resume("node99"),
    ):
        with pytest.raises(NodeNotFound):
            call()
    assert client.calls == 3  # not retried


@pytest.mark.slurm
def test_contract_resume_of_undrained_node_is_a_command_error(client, cluster):
    with pytest.raises(SlurmCommandError, match="Invalid node state") as err:
        client.resume("node1")
    expected = RESUME_OF_IDLE_ERROR.get(cluster.slurm_version())
    if expected:
        assert expected[1] in str(err.value)


@pytest.mark.slurm
def test_contract_list_nodes_with_reasons(client, cluster):
    client.drain("node2", "slurm-hooks: gpu.count: other node")
    client.drain("node1", OUR)
    nodes = {n.name: n for n in client.list_nodes()}
    assert set(nodes) == {"node1", "node2", "node3"}
    assert nodes["node1"].reason == OUR and nodes["node1"].is_drained
    assert (
        nodes["node2"].reason == "slurm-hooks: gpu.count: other node" and nodes["node2"].is_drained
    )
    assert nodes["node2"].state == "DOWN" and nodes["node3"].state == "DOWN"
    assert client.calls == 3


@pytest.mark.slurm
def test_contract_controller_down_is_unavailable_in_bounded_time(client, cluster):
    cluster.stop_ctld()
    t0 = time.monotonic()
    with pytest.raises(SlurmUnavailable):
        client.show_node("node1")
    took = time.monotonic() - t0
    # scontrol: min(timeout, ~MessageTimeout-1) per attempt; pyslurm: ~MessageTimeout-1 per attempt
    bound = 2 * min(5.0, cluster.message_timeout) + 0.2 + 1.5
    print("[%s] SlurmUnavailable after %.2fs (bound %.1fs)" % (client.kind, took, bound))
    assert took < bound and client.calls == 2


@pytest.mark.slurm
def test_hung_controller_times_out_by_our_timeout(cluster):
    """SIGSTOPped slurmctld: connect succeeds, no answer; our per-call timeout ends it."""
    client = SlurmClient(
        backend=ScontrolBackend(env=cluster.env, timeout=1.0, attempts=2, backoff=0.1)
    )
    cluster.sigstop_ctld()
    try:
        t0 = time.monotonic()
        with pytest.raises(SlurmUnavailable, match="timed out"):
            client.drain("node1", OUR)
        took = time.monotonic() - t0
    finally:
        cluster.sigcont_ctld()
    print("SIGSTOPped ctld: SlurmUnavailable after %.2fs" % took)
    assert took < 2.0 + 0.1 + 0.5 and client.calls == 2
    # the drain may still land once slurmctld continues; clean up
    time.sleep(0.2)
    if "DRAIN" in cluster.node_state("node1").split("+"):
        cluster.scontrol("update", "NodeName=node1", "State=RESUME")
    cluster.wait_state("node1", "IDLE", timeout=15)


# ---------------------------------------------------------------------------------------------
# pyslurm's own API: the double (tests/doubles/pyslurm.py) and the real pyslurm, same tests, same
# slurmctld. What PyslurmBackend relies on, and what the real one showed on Slurm 25.11.


@pytest.fixture(params=("pyslurm-double", "pyslurm-real"))
def pyslurm_api(request, cluster):
    mod = (
        PyslurmDouble(cluster.env)
        if request.param == "pyslurm-double"
        else request.getfixturevalue("real_pyslurm")
    )
    yield mod
    cluster.sigcont_ctld()
    cluster.start_ctld()  # no-op unless a test stopped it
    for name in ("node1", "node2"):
        if "DRAIN" in cluster.node_state(name).split("+"):
            cluster.scontrol(
                "update",
                "NodeName=%s" % name,
                "State=%s" % ("RESUME" if name == "node1" else "UNDRAIN"),
            )
    cluster.wait_state("node1", "IDLE", timeout=15)


@pytest.mark.slurm
def test_pyslurm_api_version_matches_the_running_slurm(pyslurm_api, cluster):
    running = cluster.slurm_version()
    assert slurm.parse_version(pyslurm_api.__version__)[:2] == running, pyslurm_api.__version__
    assert tuple(pyslurm_api.slurm_api_version())[:2] == running
    assert not callable(
        getattr(pyslurm_api, "version", None)
    )  # 25.11: a submodule, not pyslurm.version()
    assert slurm.pyslurm_version(pyslurm_api) == pyslurm_api.__version__


@pytest.mark.slurm
def test_pyslurm_api_node_load(pyslurm_api, cluster):
    n = pyslurm_api.Node.load("node1")
    assert (n.name, n.state, n.partitions) == ("node1", "IDLE", ["debug"])
    assert n.reason == scontrol_reason(
        cluster
    )  # None unless an earlier drain left it (slurmcluster.RESUME_KEEPS_REASON)
    other = pyslurm_api.Node.load(
        "node3"
    )  # defined, no slurmd: DOWN (+NOT_RESPONDING after the first ping)
    assert other.state in ("DOWN", "DOWN+NOT_RESPONDING") and isinstance(other.state, str)


@pytest.mark.slurm
def test_pyslurm_api_drain_reads_back_exactly_and_resume(pyslurm_api, cluster):
    before = int(time.time())
    pyslurm_api.Node("node1").modify(pyslurm_api.Node(state="DRAIN", reason=OUR))
    n = pyslurm_api.Node.load("node1")
    assert (n.state, n.reason, n.reason_user) == ("IDLE+DRAIN", OUR, "root")
    assert isinstance(n.reason_time, int) and before - 1 <= n.reason_time <= time.time() + 1, (
        n.reason_time
    )
    nodes = pyslurm_api.Nodes.load()
    assert nodes["node1"].reason == OUR and nodes["node1"].state == "IDLE+DRAIN"
    t0 = time.monotonic()
    pyslurm_api.Node("node1").modify(pyslurm_api.Node(state="RESUME"))
    states = [pyslurm_api.Node.load("node1").state]
    # 25.11 (and 22.05 through 26.05): IDLE+NOT_RESPONDING until slurmd answers the registration
    # ping (0.3-1.5 s on an idle machine, up to ~3 s on a loaded one), then IDLE
    while states[-1] != "IDLE" and time.monotonic() - t0 < 15:
        time.sleep(0.05)
        states.append(pyslurm_api.Node.load("node1").state)
    seen = list(dict.fromkeys(states))
    assert seen in (["IDLE+NOT_RESPONDING", "IDLE"], ["IDLE"]), seen
    assert pyslurm_api.Node.load("node1").reason in cluster.reasons_after_resume(OUR)
    print(
        "[%s] RESUME -> %s in %.2fs"
        % (type(pyslurm_api).__name__, " -> ".join(seen), time.monotonic() - t0)
    )


@pytest.mark.slurm
def test_pyslurm_api_errors_are_rpc_errors(pyslurm_api, cluster):
    with pytest.raises(pyslurm_api.RPCError) as err:
        pyslurm_api.Node.load("node99")
    assert (err.value.errno, err.value.msg, str(err.value)) == (
        -1,
        "Node 'node99' does not exist",
        "Node 'node99' does not exist",
    )
    assert isinstance(err.value, pyslurm_api.PyslurmError)
    for state, reason in (("DRAIN", "r"), ("RESUME", None)):
        with pytest.raises(pyslurm_api.RPCError) as err:
            pyslurm_api.Node("node99").modify(pyslurm_api.Node(state=state, reason=reason))
        assert (err.value.errno, err.value.msg) == (2018, "Invalid node name specified")
    with pytest.raises(pyslurm_api.RPCError) as err:
        pyslurm_api.Node("node1").modify(pyslurm_api.Node(state="RESUME"))
    assert err.value.msg.startswith("Invalid node state")
    expected = RESUME_OF_IDLE_ERROR.get(cluster.slurm_version())
    if expected:
        assert (err.value.errno, err.value.msg) == expected


@pytest.mark.slurm
def test_pyslurm_api_rejects_bad_changes_before_any_rpc(pyslurm_api):
    rpcs = getattr(pyslurm_api, "rpcs", None)
    with pytest.raises(ValueError, match="^Invalid Node state: BOGUS$"):
        pyslurm_api.Node(state="BOGUS")
    with pytest.raises(
        AttributeError,
        match="attribute 'partitions' of 'pyslurm.core.node.Node' objects is not writable",
    ):
        pyslurm_api.Node(partitions=["debug"])
    with pytest.raises(KeyError):
        pyslurm_api.Node(frobnicate=1)
    with pytest.raises(TypeError, match="^Argument 'changes' has incorrect type"):
        pyslurm_api.Node("node1").modify({"state": "DRAIN", "reason": "r"})
    assert getattr(pyslurm_api, "rpcs", None) == rpcs


@pytest.mark.slurm
def test_pyslurm_api_nodes_is_a_mapping_by_name(pyslurm_api):
    nodes = pyslurm_api.Nodes.load()
    assert sorted(nodes) == ["node1", "node2", "node3"] and len(nodes) == 3
    assert "node1" in nodes and "node99" not in nodes
    assert sorted(n.name for n in nodes.values()) == ["node1", "node2", "node3"]
    assert nodes["node2"].state.startswith("DOWN")


@pytest.mark.slurm
def test_pyslurm_api_controller_stopped_or_hung(pyslurm_api, cluster):
    """Both within about MessageTimeout (2 s here) per RPC."""
    cluster.stop_ctld()
    t0 = time.monotonic()
    with pytest.raises(pyslurm_api.RPCError) as err:
        pyslurm_api.Node.load("node1")
    stopped = time.monotonic() - t0
    assert (err.value.errno, err.value.msg) == (
        1800,
        "Unable to contact slurm controller (connect failure)",
    )
    cluster.start_ctld()
    cluster.sigstop_ctld()
    try:
        t0 = time.monotonic()
        with pytest.raises(pyslurm_api.RPCError) as err:
            pyslurm_api.Node.load("node1")
        hung = time.monotonic() - t0
    finally:
        cluster.sigcont_ctld()
    assert (err.value.errno, err.value.msg) == (5004, "Socket timed out on send/recv operation")
    print(
        "[%s] stopped: RPCError after %.2fs, hung: after %.2fs"
        % (type(pyslurm_api).__name__, stopped, hung)
    )
    assert stopped < 4 * cluster.message_timeout and hung < 4 * cluster.message_timeout


def _python(code, env, timeout):
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slurm
def test_real_pyslurm_import_needs_a_readable_slurm_conf(tmp_path):
    """`import pyslurm` runs slurm_init(): with SLURM_CONF naming a missing file it retries for 60 s and
    then ends the process (PYSLURM_DISABLE_AUTO_INIT=1 imports without a config). So PyslurmBackend
    looks for a readable slurm.conf before importing, in a fresh interpreter as in a hook."""
    if slurm.pyslurm_version() is None:
        skip_without_real_pyslurm("pyslurm is not installed")
    missing = str(tmp_path / "missing" / "slurm.conf")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PYSLURM_"))}
    res = _python(
        "import pyslurm; print(pyslurm.__version__)",
        dict(env, SLURM_CONF=missing, PYSLURM_DISABLE_AUTO_INIT="1"),
        timeout=60,
    )
    assert res.returncode == 0 and res.stdout.strip() == slurm.pyslurm_version(), res.stderr
    try:
        res = _python("import pyslurm; print('imported')", dict(env, SLURM_CONF=missing), timeout=4)
        assert res.returncode != 0 and "imported" not in res.stdout, (res.stdout, res.stderr)
    except subprocess.TimeoutExpired as exc:  # still retrying: that is the 60 s wait
        assert b"cannot stat file" in (exc.stderr or b""), exc.stderr
    probe = (
        "import sys, time\n"
        "from slurm_hooks.slurm.client import PyslurmBackend, choose_backend\n"
        "from slurm_hooks.slurm.errors import SlurmUnavailable\n"
        "backend, why = choose_backend('auto')\n"
        "t0 = time.monotonic()\n"
        "try:\n"
        "    PyslurmBackend().show_node('node1')\n"
        "except SlurmUnavailable as exc:\n"
        "    print(backend.name, '|', why, '|', exc, '|', 'pyslurm' in sys.modules, '|', time.monotonic() - t0)\n"
    )
    res = _python(probe, dict(env, SLURM_CONF=missing), timeout=60)
    assert res.returncode == 0, res.stderr
    name, why, error, imported, took = (x.strip() for x in res.stdout.split("|"))
    assert (name, imported) == ("scontrol", "False") and "no readable slurm.conf" in why, res.stdout
    assert "refusing to import pyslurm" in error and float(took) < 1.0, res.stdout


# ---------------------------------------------------------------------------------------------
# Slurm keeps our drain reason when the prolog then fails


@pytest.fixture(scope="module")
def prolog_cluster(slurm_cluster_factory, tmp_path_factory):  # noqa: F811
    d = tmp_path_factory.mktemp("prolog-drain")
    prolog = d / "prolog.sh"
    c = slurm_cluster_factory(
        "prolog-drain",
        nodes=("node1",),
        prolog=str(prolog),
        extra_conf="SchedulerParameters=bf_interval=1,nohold_on_prolog_fail",
    )
    flag = d / "DRAIN_FIRST"
    prolog.write_text(
        "#!/bin/sh\n"
        "if [ -e %(flag)s ]; then\n"
        "  SLURM_CONF=%(conf)s scontrol update NodeName=$SLURMD_NODENAME State=DRAIN "
        'Reason="slurm-hooks: gpu.ecc: drained by prolog job $SLURM_JOB_ID" || exit 3\n'
        "fi\n"
        "exit 1\n" % {"flag": flag, "conf": c.conf}
    )
    prolog.chmod(0o755)
    c.drain_flag = flag
    return c


def _fail_prolog_once(cluster):
    job = cluster.sbatch()
    cluster.wait_state("node1", lambda s: "DRAIN" in s.split("+"), timeout=20)
    time.sleep(0.5)  # let slurmctld finish its own prolog-failure handling
    reason = cluster.node_reason("node1")
    cluster.run("scancel", str(job), check=False)
    return job, reason


@pytest.mark.slurm
def test_failed_prolog_without_drain_gives_generic_reason(prolog_cluster):
    c = prolog_cluster
    job, reason = _fail_prolog_once(c)
    assert reason.startswith("Prolog error ["), reason
    c.scontrol("update", "NodeName=node1", "State=RESUME")
    c.wait_state("node1", "IDLE", timeout=15)


@pytest.mark.slurm
def test_drain_before_failing_prolog_keeps_our_reason(prolog_cluster):
    """DESIGN.md principle 8, verified: slurmctld's own "Prolog error" drain does not replace a DRAIN
    that is already set (node_mgr.c _drain_node returns early), so drain first, then exit 1."""
    c = prolog_cluster
    c.drain_flag.write_text("1")
    job, reason = _fail_prolog_once(c)
    assert reason.startswith("slurm-hooks: gpu.ecc: drained by prolog job %d [root@" % job), reason
    log = (c.log / "slurmctld.log").read_text()
    assert "prolog" in log.lower()
    node = SlurmClient(backend=ScontrolBackend(env=c.env)).show_node("node1")
    assert node.is_drained and node.reason == "slurm-hooks: gpu.ecc: drained by prolog job %d" % job
    c.drain_flag.unlink()
    c.scontrol("update", "NodeName=node1", "State=RESUME")
    c.wait_state("node1", "IDLE", timeout=15)


# ---------------------------------------------------------------------------------------------
# real output of every Slurm we support (tests/captures/slurm/<version>/, taken by
# tests/test_slurm_versions.py from the real daemons: 22.05 on the host, 24.11 and 26.05 in Debian roots)

from pathlib import Path  # noqa: E402

CAPTURES = Path(__file__).resolve().parent / "captures" / "slurm"
VERSIONS = sorted(p.name for p in CAPTURES.iterdir() if p.is_dir()) if CAPTURES.is_dir() else []
FORGED = "maint window\nNodeName=node9 State=IDLE Partitions=debug"
OURS_CAPTURED = "slurm-hooks: gpu.count: gpu:0 GPU 0 fell off the bus -> reboot"


def captured(version, name):
    path = CAPTURES / version / name
    if not path.exists():
        pytest.skip("%s has no %s" % (version, name))
    return path.read_text()


def test_captures_cover_the_supported_versions():
    assert {v.split(".")[0] + "." + v.split(".")[1] for v in VERSIONS} >= {
        "22.05",
        "24.11",
        "26.05",
    }, VERSIONS


@pytest.mark.parametrize("version", VERSIONS)
def test_captured_node_records_parse(version):
    for path in sorted((CAPTURES / version).glob("show-node*.txt")):
        for node in parse_nodes(path.read_text()):
            assert node.known_state, (path, node.state_string)
            assert node.name in ("node1", "node2", "node3", "ext1"), (path, node.name)
    node = parse_node_line(captured(version, "show-node-drained-ours.txt"))
    assert (node.state, node.flags, node.reason, node.reason_user) == (
        "IDLE",
        {"DRAIN"},
        OURS_CAPTURED,
        "root",
    )
    assert node.reason_epoch is not None
    node = parse_node_line(captured(version, "show-node-fail.txt"))
    assert node.is_failed and node.reason == "admin: DIMM errors"
    node = parse_node_line(captured(version, "show-node-maint.txt"))
    assert {"MAINTENANCE", "RESERVED"} <= node.flags and not node.is_drained
    node = parse_node_line(captured(version, "show-node-draining.txt"))
    assert node.is_draining and node.reason == OURS_CAPTURED


@pytest.mark.parametrize("version", VERSIONS)
def test_captured_reason_with_a_newline_does_not_forge_a_node(version):
    """Before: '... Reason=maint window [root@T]        NodeName=node9 State=IDLE' read as node9, idle."""
    node = parse_node_line(captured(version, "show-node-reason-newline.txt"))
    assert (node.name, node.state, node.is_drained, node.reason) == (
        "node2",
        "DOWN",
        True,
        FORGED,
    ), node
    names = [n.name for n in parse_nodes(captured(version, "show-nodes-reason-newline.txt"))]
    assert {"node1", "node2", "node3"} <= set(names) and "node9" not in names  # (26.05: and ext1)


@pytest.mark.parametrize("version", VERSIONS)
def test_captured_error_texts_are_classified(version):
    assert slurm.classify(captured(version, "resume-not-drained.stderr")) == "invalid_state"
    assert slurm.classify(captured(version, "update-unknown-node.stderr")) == "not_found"
    assert slurm.classify(captured(version, "show-unknown-node.txt")) == "not_found"
    run = Script((1, "", captured(version, "resume-not-drained.stderr")))
    with pytest.raises(slurm_errors.InvalidNodeState):
        ScontrolBackend(runner=run).resume("node1")


@pytest.mark.parametrize("version", VERSIONS)
def test_captured_hostnames_and_version(version):
    names = captured(version, "show-hostnames.txt").split()
    run = Script((0, captured(version, "show-hostnames.txt"), ""))
    assert (
        slurm.expand_hostlist("gpu[01-03,07],login1", runner=run)
        == names
        == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    )
    assert run.argvs == [["scontrol", "show", "hostnames", "gpu[01-03,07],login1"]]
    assert (
        "%d.%02d" % slurm.parse_version(captured(version, "sinfo-version.txt"))[:2]
        == version.rsplit(".", 1)[0]
    )


def test_captured_external_node_of_2605():
    found = [v for v in VERSIONS if (CAPTURES / v / "show-node-external.txt").exists()]
    assert found, "no 26.05 capture with an EXTERNAL node"
    for version in found:
        node = parse_node_line(captured(version, "show-node-external.txt"))
        assert "EXTERNAL" in node.flags and node.known_state, node


def test_what_slurm_keeps_after_resume_by_version():
    """22.05 and 26.05 clear the reason at RESUME; 24.11 (accounting_storage/none) keeps it, and then
    shows it, old time and user included, on slurmctld's own later drain."""
    for version in VERSIONS:
        kept = parse_node_line(captured(version, "show-node-resumed-while-running.txt"))
        again = parse_node_line(captured(version, "show-node-ctld-drain-after-resume.txt"))
        drained = parse_node_line(captured(version, "show-node-draining.txt"))
        if version.startswith(("24.11", "25.11")):
            assert kept.reason == OURS_CAPTURED and not kept.is_drained
            assert (again.reason, again.reason_time) == (
                OURS_CAPTURED,
                drained.reason_time,
            ) and again.is_drained
        else:
            assert kept.reason is None and again.reason == "Epilog error", (version, again)


# ---------------------------------------------------------------------------------------------
# the parser against hand-written edge cases the captures do not show


@pytest.mark.parametrize(
    "line,reason,user,when",
    [
        # a stamp-like text inside the reason's first line: Slurm's is the one followed by the end
        (
            "NodeName=n1 State=IDLE+DRAIN Reason=x [bob@2024-01-01T00:00:00] y [root@2026-12-02T10:00:00]",
            "x [bob@2024-01-01T00:00:00] y",
            "root",
            "2026-12-02T10:00:00",
        ),
        # further reason lines after eight spaces, then a trailing field
        (
            "NodeName=n1 State=IDLE+DRAIN Reason=a [root@2026-12-02T10:00:00]        b State=IDLE        c Comment=z",
            "a\nb State=IDLE\nc",
            "root",
            "2026-12-02T10:00:00",
        ),
        # a field a later release might print after the reason
        (
            "NodeName=n1 State=IDLE+DRAIN Reason=a b [root@2026-12-02T10:00:00] NewField=1",
            "a b",
            "root",
            "2026-12-02T10:00:00",
        ),
    ],
)
def test_reason_edges(line, reason, user, when):
    node = parse_node_line(line)
    assert (node.name, node.state_string, node.reason, node.reason_user, node.reason_time) == (
        "n1",
        "IDLE+DRAIN",
        reason,
        user,
        when,
    )


def test_fields_after_the_reason_never_rename_or_restate_a_node():
    node = parse_node_line(
        "NodeName=n1 State=IDLE+DRAIN Partitions=p Reason=x [root@2026-12-02T10:00:00]        "
        "NodeName=n9 State=IDLE Partitions=q"
    )
    assert (node.name, node.state_string, node.partitions) == ("n1", "IDLE+DRAIN", ("p",))


def test_a_node_listed_twice_is_an_error_not_a_guess():
    text = "NodeName=n1 State=IDLE+DRAIN Reason=x [root@2026-12-02T10:00:00] Comment=a\nNodeName=n1 State=IDLE\n"
    with pytest.raises(SlurmParseError, match="listed twice"):
        parse_nodes(text)


def test_client_times_are_utc_whatever_the_environment():
    env = slurm.client_env({"TZ": "America/New_York", "SLURM_TIME_FORMAT": "relative"})
    assert (env["TZ"], env["SLURM_TIME_FORMAT"]) == ("UTC0", "standard")
    node = NodeInfo("n1", "IDLE", frozenset({"DRAIN"}), "x", "root", "2026-12-02T10:00:00")
    assert node.reason_epoch == 1796205600


def test_missing_scontrol_is_not_an_unreachable_controller():
    run = Script(FileNotFoundError(2, "No such file or directory", "scontrol"))
    with pytest.raises(slurm_errors.SlurmClientMissing, match="cannot run scontrol"):
        ScontrolBackend(runner=run).show_node("node1")
    with pytest.raises(slurm_errors.SlurmClientMissing):
        slurm.expand_hostlist(
            "gpu[1-2]", runner=Script(FileNotFoundError(2, "No such file", "scontrol"))
        )


@pytest.mark.parametrize("text", ["", "a b", "gpu[1-2];reboot", "$(id)", "-x"])
def test_hostlist_refuses_non_hostlists_before_running_anything(text):
    with pytest.raises(ValueError):
        slurm.expand_hostlist(text, runner=Script())


def test_resume_with_a_reason_is_one_request():
    run = Script((0, "", ""))
    SlurmClient(backend=ScontrolBackend(runner=run)).resume(
        "node1", "resumed by slurm-hooks: gpu.ecc passed"
    )
    assert run.argvs == [
        [
            "scontrol",
            "update",
            "NodeName=node1",
            "State=RESUME",
            "Reason=resumed by slurm-hooks: gpu.ecc passed",
        ]
    ]


def test_client_budget_bounds_every_request():
    def slow(argv, timeout, env):
        time.sleep(timeout)
        raise subprocess.TimeoutExpired(argv, timeout)

    client = SlurmClient(backend=ScontrolBackend(runner=slow, timeout=5.0, attempts=3, backoff=0.0))
    client.set_budget(0.4)
    t0 = time.monotonic()
    with pytest.raises(SlurmUnavailable):
        client.show_node("node1")
    with pytest.raises(SlurmUnavailable, match="no time left"):
        client.list_nodes()
    assert time.monotonic() - t0 < 1.5
