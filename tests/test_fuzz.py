"""Bad input, generated (hypothesis): configuration files, sysfs/procfs contents, kernel log lines, the
job environment and scontrol's node lines. What must hold for all of it:

- no uncaught exception: a parser raises only its declared error (ConfigError, HostError/ParseError,
  JobEnvError, SlurmParseError), and a check never ends in the runner's "internal error" (our bug);
- errors are clear: they name the file / key / variable / path, and are bounded in length;
- nothing reaches a shell: every subprocess gets an argv list, never shell=True (recorded below for the
  whole module), and hostile text arrives at scontrol byte for byte as one argument.

Example counts are modest so the file runs in well under a minute on a 2-core machine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from slurm_hooks.core.config import SECTIONS, ConfigError, load_config, validate
from slurm_hooks.core.runner import JobContext, run_checks, select_checks
from slurm_hooks.hw import nvml
from slurm_hooks.hw import procfs as parsers
from slurm_hooks.hw.host import Host, HostError
from slurm_hooks.registry import load_builtin_checks
from slurm_hooks.result import Blame, Result, Status
from slurm_hooks.slurm import drainer, policy
from slurm_hooks.slurm.client import ScontrolBackend, SlurmClient
from slurm_hooks.slurm.errors import SlurmParseError
from slurm_hooks.slurm.gres import parse_gres_conf
from slurm_hooks.slurm.jobenv import JobEnvError, job_from_env, parse_gpu_indices
from slurm_hooks.slurm.node_state import NodeInfo, parse_node_line, parse_nodes
from slurm_hooks.xid import catalog as xid
from slurm_hooks.xid import kmsg
from tests.helpers import default_settings

pytestmark = pytest.mark.soak  # hypothesis: hundreds of random inputs per test

REGISTRY = load_builtin_checks()
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SHELL_META = list(";|&$`'\"\\<>(){}*?~!#\n\r\t ") + [
    "$(reboot)",
    "`id`",
    "&& rm -rf /",
    "\x00",
    "\u202e",
    "%n",
]
hostile_text = st.one_of(
    st.text(max_size=200),
    st.lists(st.sampled_from(SHELL_META + list("0123456789,-")), max_size=30).map("".join),
)


# ------------------------------------------------------------------------------------------------
# nothing reaches a shell: every Popen of this module is recorded and checked

POPEN_CALLS = []


@pytest.fixture(autouse=True, scope="module")
def record_popen():
    original = subprocess.Popen.__init__

    def recording(self, args, *rest, **kwargs):
        POPEN_CALLS.append((args, kwargs.get("shell", False)))
        return original(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = recording
    yield
    subprocess.Popen.__init__ = original
    bad = [
        (args, shell) for args, shell in POPEN_CALLS if shell or not isinstance(args, (list, tuple))
    ]
    assert bad == [], bad


def test_no_shell_anywhere_in_the_package():
    """The static half of 'nothing reaches a shell': no shell=True, os.system or os.popen in slurm_hooks/."""
    package = Path(__file__).resolve().parent.parent / "slurm_hooks"
    offenders = []
    for path in package.rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"shell\s*=\s*True|os\.system\(|os\.popen\(|commands\.getoutput", code):
                offenders.append("%s:%d: %s" % (path.name, number, line.strip()))
    assert offenders == []


# ------------------------------------------------------------------------------------------------
# configuration files

_KEYS = sorted(
    {k for schema in SECTIONS.values() for k in schema} | {"enabled", "expected", "deny", "bogus"}
)
_toml_scalar = st.one_of(
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.text(max_size=20).map(json.dumps),
    st.lists(st.integers(0, 9), max_size=3).map(json.dumps),
)


@st.composite
def toml_documents(draw):
    """Plausible TOML: known and unknown sections/check tables, known and unknown keys, any value type."""
    lines = []
    for _ in range(draw(st.integers(0, 4))):
        section = draw(
            st.sampled_from(
                sorted(SECTIONS)
                + ['checks."%s"' % n for n in sorted(REGISTRY.checks)]
                + ["nope", 'checks."gpu.nope"']
            )
        )
        lines.append("[%s]" % section)
        for _ in range(draw(st.integers(0, 3))):
            value = draw(_toml_scalar)
            lines.append(
                "%s = %s"
                % (
                    draw(st.sampled_from(_KEYS)),
                    str(value).lower() if isinstance(value, bool) else value,
                )
            )
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzzconf") / "config.toml"


def _load_text(path: Path, text):
    os.environ["SLURM_HOOKS_ALLOW_INSECURE_CONFIG"] = "1"
    try:
        path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
        return load_config(REGISTRY, str(path))
    finally:
        del os.environ["SLURM_HOOKS_ALLOW_INSECURE_CONFIG"]


@FAST
@given(text=st.one_of(toml_documents(), st.text(max_size=300), st.binary(max_size=200)))
@example(text=b"\xff\xfe[general]\n")
@example(text="[general]\nmode = 3\n")
@example(text='[deadline]\nprolog = "5"\n')
@example(text='[checks."gpu.ecc"]\nenabled = "yes"\n')
def test_any_config_text_is_valid_or_a_clear_config_error(config_file, text):
    try:
        config = _load_text(config_file, text)
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith(str(config_file) + ": "), message  # names the file
        assert len(message) < 2000
    else:
        assert config.sources == (str(config_file),)


def _wrong_value(kind: type):
    return {str: 5, int: "5", float: "fast", bool: "yes", list: "a,b", dict: "79=FAIL"}[kind]


WRONG_TYPED = [
    (section, key, setting.type)
    for section, schema in sorted(SECTIONS.items())
    for key, setting in sorted(schema.items())
]
WRONG_TYPED += [
    ('checks."%s"' % spec.name, param.name, param.type)
    for spec in REGISTRY.sorted_checks()
    for param in spec.params
]


def _toml_value(value):
    return json.dumps(value)


def test_every_setting_and_parameter_rejects_a_wrong_type_naming_file_and_key(config_file):
    """Every key of every section and every check parameter, one wrong-typed value each."""
    assert len(WRONG_TYPED) > 100
    for section, key, kind in WRONG_TYPED:
        text = "[%s]\n%s = %s\n" % (section, key, _toml_value(_wrong_value(kind)))
        with pytest.raises(ConfigError) as err:
            _load_text(config_file, text)
        message = str(err.value)
        assert message.startswith("%s: [%s] %s: expected " % (config_file, section, key)), message


@FAST
@given(
    section=st.sampled_from(
        sorted(SECTIONS) + ['checks."%s"' % n for n in sorted(REGISTRY.checks)]
    ),
    key=st.from_regex(r"[a-z_]{1,20}", fullmatch=True),
)
def test_unknown_keys_are_named(config_file, section, key):
    known = (
        set(SECTIONS.get(section, {}))
        if not section.startswith("checks")
        else {"enabled"} | {p.name for p in REGISTRY.checks[section[8:-1]].params}
    )
    assume(key not in known)
    with pytest.raises(ConfigError) as err:
        _load_text(config_file, "[%s]\n%s = 1\n" % (section, key))
    message = str(err.value)
    assert message.startswith("%s: [%s] " % (config_file, section)) and key in message, message
    assert "unknown" in message


# ------------------------------------------------------------------------------------------------
# sysfs / procfs contents through the real gatherers and checks (fake DGX node, real pynvml)

SYSFS_TARGETS = [
    "/proc/loadavg",
    "/proc/meminfo",
    "/proc/swaps",
    "/proc/mounts",
    "/proc/cpuinfo",
    "/proc/modules",
    "/proc/cmdline",
    "/proc/interrupts",
    "/proc/sys/kernel/osrelease",
    "/proc/sys/kernel/numa_balancing",
    "/proc/sys/vm/zone_reclaim_mode",
    "/proc/driver/nvidia/version",
    "/sys/devices/system/cpu/online",
    "/sys/devices/system/node/node0/meminfo",
    "/sys/devices/system/node/node1/cpulist",
    "/sys/devices/system/cpu/cpu3/topology/core_id",
    "/sys/bus/pci/devices/0000:18:00.0/numa_node",
    "/sys/bus/pci/devices/0000:18:00.0/local_cpulist",
    "/sys/bus/pci/devices/0000:17:00.0/config",
    "/sys/bus/pci/devices/0000:44:00.0/class",
    "/sys/class/infiniband/mlx5_0/ports/1/state",
    "/sys/class/infiniband/mlx5_0/ports/1/rate",
    "/sys/class/infiniband/mlx5_0/ports/1/link_layer",
    "/sys/kernel/mm/memory_peers/nv_mem/version",
    "/sys/kernel/iommu_groups/0/type",
    "/proc/sys/kernel/random/boot_id",
]


def _huge(seed: bytes) -> bytes:
    return (seed or b"0") * (
        3_000_000 // max(len(seed), 1) + 1
    )  # 3 MB: beyond Host's 1 MiB read bound


contents = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.lists(
        st.sampled_from(
            [
                "0",
                "1",
                "-",
                ",",
                " ",
                "\n",
                "x",
                "ff",
                "0x",
                ":",
                "kB",
                "-1",
                "999999999999999999999",
            ]
        ),
        max_size=30,
    ).map(lambda parts: "".join(parts).encode()),
    st.binary(min_size=1, max_size=8).map(_huge),
    st.just(None),  # the file is missing
)


@pytest.fixture(scope="module")
def gpu_node():
    from tests.fakenode import FakeNode, fakenvml

    node = FakeNode.build_temp("dgx-h100", {"slurm": {"gres_conf": "auto"}})
    fakenvml.unload_from_pynvml()
    nvml.reset_sessions()
    node.load_into_pynvml()
    yield node
    fakenvml.unload_from_pynvml()
    nvml.reset_sessions()
    node.cleanup()


PROLOG_CHECKS = select_checks(REGISTRY, "prolog")
JOB = JobContext(job_id="4242", user="alice", node_name="dgx-h100-01", gpus=(0, 1))
CONFIG = validate(
    REGISTRY, {"general": {"root_live_sources": ["nvml"]}}
)  # the fake node's NVML (--live nvml)


def _judge(results):
    """No internal error (our bug), UNKNOWN never blames the node, every error names what it read."""
    internal = [(r.check, r.summary) for r in results if r.summary.startswith("internal error")]
    assert internal == [], [
        (c, s, r.details.get("traceback")) for r in results for c, s in internal if r.check == c
    ][:1]
    for r in results:
        assert isinstance(r, Result) and isinstance(r.status, Status)
        if r.status is Status.UNKNOWN:
            assert r.effective_blame is Blame.CHECK, r
        if r.summary.startswith("could not read the host"):
            assert "/" in r.summary, r.summary  # names the path


@SLOW
@given(target=st.sampled_from(SYSFS_TARGETS), content=contents)
def test_any_sysfs_content_gives_a_result_never_a_crash(gpu_node, target, content):
    real = gpu_node.path(target).resolve()
    saved = (
        real.read_bytes() if real.exists() else None
    )  # the fake tree has no boot_id: created, then removed
    try:
        if content is None:
            if saved is not None:
                real.unlink()
        else:
            real.parent.mkdir(parents=True, exist_ok=True)
            real.write_bytes(content)
        report = run_checks(
            REGISTRY, CONFIG, Host(str(gpu_node.root)), "prolog", PROLOG_CHECKS, job=JOB
        )
    finally:
        if saved is None:
            if real.exists():
                real.unlink()
        else:
            real.write_bytes(saved)
    _judge(report.results())
    decision = policy.decide(report.results(), CONFIG.settings)
    assert (
        all(r.status is Status.FAIL for r in decision.findings)
        or decision.verdict is not policy.Verdict.DRAIN
    )


# ------------------------------------------------------------------------------------------------
# kernel log lines

REAL_LINES = [
    "NVRM: Xid (PCI:0000:42:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:18:00): 48, pid=77, name=train, An uncorrectable double bit error (DBE)",
    "NVRM: Xid (PCI:0000:9a:00): 74, pid=5, name=x, NVLink: fatal error detected on link 3(0x0, 0x0, 0x10)",
    "NVRM: Xid (PCI:0000:c4:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
    "nvidia-nvswitch2: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 14 LTSSM Fault Up",
    "nvidia-nvswitch2: SXid (PCI:0000:05:00.0): 20034, Severity 1 Engine instance 14 Sub-engine instance 00",
    "nvidia-nvswitch2: SXid (PCI:0000:05:00.0): 20034, Data {0x50610002, 0x10100030, 0x00000000}",
    "python3[4242]: segfault at 0 ip 00007f8d2c41a2b0 sp 00007ffd6f0e1c28 error 4 in NVRM: Xid (PCI:0000:"
    "42:00): 79, x[7f8d2c400000+1b000]",
]
kmsg_lines = st.one_of(
    st.text(max_size=200),
    st.binary(max_size=200).map(lambda b: b.decode("utf-8", "replace")),
    st.tuples(st.sampled_from(REAL_LINES), st.integers(0, 120)).map(
        lambda t: t[0][: t[1]]
    ),  # truncated
    st.tuples(st.sampled_from(REAL_LINES), st.text(max_size=40)).map(lambda t: t[0] + t[1]),
)


@FAST
@given(
    lines=st.lists(kmsg_lines, max_size=8),
    header=st.sampled_from(["3,%d,%d,-;", "", "[%d.%06d] ", "12,%d,%d,-;", "<4>[%d.%06d] "]),
)
def test_kernel_log_lines_parse_and_classify_without_crash(lines, header):
    records = [
        (header % (100 + i, 5000 + i) if "%" in header else header) + line
        for i, line in enumerate(lines)
    ]
    for event in kmsg.scan(records):
        classification = xid.classify(event)
        assert classification.status in ("OK", "WARN", "FAIL", "UNKNOWN")
    for event in kmsg.scan_sxid(records):
        xid.classify_sxid(event)


@SLOW
@given(lines=st.lists(kmsg_lines, min_size=1, max_size=6))
def test_kernel_log_lines_through_the_xid_checks(gpu_node, lines):
    kmsg_path = gpu_node.path("/dev/kmsg")
    saved = kmsg_path.read_bytes()
    try:
        with kmsg_path.open("a", encoding="utf-8", errors="surrogateescape") as handle:
            for i, line in enumerate(lines):
                handle.write("3,%d,%d,-;%s\n" % (90000 + i, 9000000 + i, line.replace("\n", " ")))
        report = run_checks(
            REGISTRY,
            CONFIG,
            Host(str(gpu_node.root)),
            "prolog",
            select_checks(REGISTRY, "prolog", ["xid"]),
            job=JOB,
        )
    finally:
        kmsg_path.write_bytes(saved)
    _judge(report.results())


# ------------------------------------------------------------------------------------------------
# the job environment (untrusted: users control parts of it)

long_values = st.integers(200, 20000).map(lambda n: "1" * n)
env_values = st.one_of(
    hostile_text,
    long_values,
    st.sampled_from(
        ["0-1023", "0-1024", "7-3", "00", "1,1,1", "NoDevFiles", "0,,1", "-1", "0x1", "\uff11"]
    ),
)


@FAST
@given(value=env_values)
@example(value="0;reboot")
@example(value="$(touch /tmp/pwned)")
def test_hostile_slurm_job_gpus(value):
    try:
        gpus = parse_gpu_indices(value)
    except JobEnvError as exc:
        assert str(exc).startswith("SLURM_JOB_GPUS=") and len(str(exc)) < 200, str(exc)
    else:
        assert all(isinstance(g, int) and 0 <= g < 1024 for g in gpus) and list(gpus) == sorted(
            set(gpus)
        )


@FAST
@given(job_id=env_values, user=env_values, node=env_values)
@example(job_id="42; reboot", user="alice", node="node1")
@example(job_id="42", user="$(id)", node="node1")
@example(job_id="42", user="alice", node="n[1-100]")
def test_hostile_job_identity_fails_open_before_anything_runs(tmp_path_factory, job_id, user, node):
    env = {"SLURM_JOB_ID": job_id, "SLURM_JOB_USER": user, "SLURMD_NODENAME": node}
    try:
        job = job_from_env(env)
    except JobEnvError as exc:
        message = str(exc)
        assert message.split("=", 1)[0].split(" ", 1)[0] in env and len(message) < 200, message
        from slurm_hooks.hooks import run_hook

        outcome = run_hook(
            "prolog", REGISTRY, _hook_config(tmp_path_factory), env, client=_never_called()
        )
        assert outcome.exit_code == 0 and outcome.report is None  # logged, failed open, nothing ran
    else:
        assert re.fullmatch(r"[1-9][0-9]{0,9}", job.job_id) and " " not in (job.node_name or "")
        assert (
            job.user is None or len(job.user) <= 300
        )  # a user name is data (kept, bounded), never refused


_HOOK_CONFIG = []


def _hook_config(factory):
    if not _HOOK_CONFIG:
        base = factory.mktemp("hookcfg")
        _HOOK_CONFIG.append(
            validate(
                REGISTRY,
                {
                    "paths": {
                        "state_dir": str(base / "state"),
                        "syslog": False,
                        "log_file": str(base / "log" / "hooks.log"),
                    },
                    "records": {"enabled": False},
                },
            )
        )
    return _HOOK_CONFIG[0]


def _never_called():
    class NoSlurm:
        calls = 0

        def __getattr__(self, name):
            raise AssertionError("a hostile job environment must not reach Slurm (%s)" % name)

    return NoSlurm()


# ------------------------------------------------------------------------------------------------
# node lines from scontrol


@FAST
@given(
    text=st.one_of(
        st.text(max_size=300),
        st.lists(
            st.sampled_from(
                [
                    "NodeName=",
                    "node1",
                    " ",
                    "State=",
                    "IDLE",
                    "+",
                    "DRAIN",
                    "Reason=",
                    "[root@2026-01-01T00:00:00]",
                    "\n",
                    "=",
                    "Partitions=",
                    "debug",
                    "*",
                ]
            ),
            max_size=25,
        ).map("".join),
    )
)
@example(text="NodeName=" + "0" * 161)  # found by hypothesis: the name made the message 300 long
def test_scontrol_output_parses_or_raises_parse_error(text):
    for parse in (parse_node_line, parse_nodes):
        try:
            parse(text)
        except SlurmParseError as exc:
            assert len(str(exc)) < 300
    backend = ScontrolBackend(runner=lambda argv, timeout, env: (0, text, ""))
    enacted = drainer.drain(SlurmClient(backend), "node1", "slurm-hooks: x.y: z", _drain_settings())
    assert isinstance(
        enacted.outcome, drainer.Outcome
    )  # an outcome (most often slurm-error), never a crash


def _drain_settings():
    return default_settings()


@FAST
@given(
    summary=hostile_text, trailer=st.sampled_from(["", " Comment=(null)", " ResumeAfterTime=None"])
)
def test_our_reasons_read_back_exactly_from_scontrol(summary, trailer):
    """Whatever a check says, the reason we set is read back verbatim, so we recognise our own drains."""
    reason = policy.format_reason(
        Result("gpu.ecc", Status.FAIL, summary or "x"), "slurm-hooks:", 200
    )
    line = (
        "NodeName=node1 Arch=x86_64 CoresPerSocket=56 State=IDLE+DRAIN ThreadsPerCore=2 Partitions=debug "
        "Reason=%s [root@2026-12-02T10:00:00]%s" % (reason, trailer)
    )
    node = parse_node_line(line)
    assert node.reason == reason and node.is_drained and policy.is_ours(node.reason, "slurm-hooks:")
    assert (node.reason_user, node.reason_time) == ("root", "2026-12-02T10:00:00")


FAKE_SCONTROL = r"""#!{python}
import json, sys
with open({calls!r}, "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\n")
with open({calls!r}) as fh:  # a node drained by an earlier call reads back drained, with its reason
    drained = {a[1][9:]: a[3][7:] for a in map(json.loads, fh) if a[:1] == ["update"] and a[2] == "State=DRAIN"}
if sys.argv[1:3] == ["--all", "--oneliner"]:
    names = sys.argv[5:] or ["node1", "node2", "node3", "node4"]
    print("\n".join("NodeName=%s State=IDLE%s Partitions=debug%s" % (
        n, "+DRAIN" if n in drained else "", " Reason=%s [root@2026-12-02T10:00:00]" % drained[n] if n in drained
        else "") for n in names))
"""


@pytest.fixture(scope="module")
def fake_scontrol(tmp_path_factory):
    base = tmp_path_factory.mktemp("scontrol")
    calls = base / "calls.jsonl"
    script = base / "scontrol"
    script.write_text(
        FAKE_SCONTROL.replace("{python}", sys.executable).replace("{calls!r}", repr(str(calls)))
    )
    script.chmod(0o755)
    return script, calls


@SLOW
@given(summary=hostile_text)
@example(summary="$(reboot) `id` ; rm -rf / && echo 'x' \"y\" \\ | cat")
def test_hostile_text_reaches_scontrol_as_one_argument(fake_scontrol, summary):
    """A process name or kernel message (user-controlled text) inside a drain reason: one argv element,
    sanitized, identical on arrival; no shell ever parses it."""
    script, calls = fake_scontrol
    if calls.exists():
        calls.unlink()
    reason = policy.format_reason(
        Result("gpu.leftovers", Status.FAIL, summary or "x"), "slurm-hooks:", 200
    )
    before = len(POPEN_CALLS)
    backend = ScontrolBackend(scontrol=str(script), timeout=10.0, attempts=1)
    settle, drainer.SETTLE_S = drainer.SETTLE_S, 0.0  # the fake has no clock to wait for
    try:
        enacted = drainer.drain(SlurmClient(backend), "node1", reason, _drain_settings())
    finally:
        drainer.SETTLE_S = settle
    assert enacted.outcome is drainer.Outcome.DRAINED, enacted.message
    received = [json.loads(line) for line in calls.read_text().splitlines()]
    new = POPEN_CALLS[before:]
    assert received[-2] == [
        "update",
        "NodeName=node1",
        "State=DRAIN",
        "Reason=" + reason,
    ]  # then the re-count
    assert len(new) == 4 and all(isinstance(args, list) and not shell for args, shell in new)


def test_node_info_of_unknown_states_is_kept_not_guessed():
    node = parse_node_line(
        "NodeName=node1 State=IDLE+DRAIN+SOMETHING_NEW Reason=x [root@2026-01-01T00:00:00]"
    )
    assert node.flags == frozenset({"DRAIN", "SOMETHING_NEW"}) and not node.known_state
    assert isinstance(node, NodeInfo)


# ------------------------------------------------------------------------------------------------
# the pure parsers behind the gatherers: only their declared error, naming the source

PARSERS = [
    (parsers.parse_meminfo, "/proc/meminfo"),
    (parsers.parse_loadavg, "/proc/loadavg"),
    (parsers.parse_mounts, "/proc/mounts"),
    (parsers.parse_swaps, "/proc/swaps"),
    (parse_gres_conf, "/etc/slurm/gres.conf"),
]


@FAST
@given(
    which=st.integers(0, len(PARSERS) - 1),
    text=st.one_of(
        st.text(max_size=300),
        st.lists(
            st.sampled_from(
                [
                    "MemTotal:",
                    " 12 kB",
                    "\n",
                    "0.1 0.2 0.3 1/2 3",
                    "/dev/sda1 / ext4 rw 0 0",
                    "Name=gpu",
                    " File=/dev/nvidia0",
                    " Cores=0-3",
                    "NodeName=n[1-",
                    "x",
                ]
            ),
            max_size=20,
        ).map("".join),
    ),
)
def test_parsers_raise_only_parse_errors_naming_the_source(which, text):
    parse, source = PARSERS[which]
    try:
        parse(text, source)
    except HostError as exc:
        assert str(exc).startswith(source), str(exc)


@settings(max_examples=400, deadline=None)
@given(
    st.text(
        st.characters(codec="utf-8")
        | st.sampled_from("\\\x00\x1f\x7f\x85\u00ad\u200e\u2028\ufeff\U000e0001\ud800")
    )
)
@example("plain ascii, printable")
@example("back\\slash")
@example("tab\there")
def test_the_decision_lines_ascii_fast_path_escapes_what_the_pattern_escapes(text):
    """Round 8: logs.escape_unsafe returns printable ASCII without a backslash untouched, without
    compiling _UNSAFE: for every text it must give what the pattern gives."""
    from slurm_hooks.core import logs

    assert logs.escape_unsafe(text) == logs._UNSAFE.sub(logs._escape, text)
