"""Per-check settings are validated at load like the core settings (tracker 23), and a drain budget
that cannot fit in the time Slurm gives a hook is reported by `config check` (tracker 24)."""

import pytest

from slurm_hooks.core.config import ConfigError, load_config
from slurm_hooks.registry import Param, Registry, RegistryError, load_builtin_checks

NUMBER_TYPES = (int, float)


def _numeric(param: Param) -> bool:
    return (
        param.convert is None
        and not param.choices
        and (param.type in NUMBER_TYPES or (param.type is list and param.item_type in NUMBER_TYPES))
    )


def test_every_number_of_a_builtin_check_declares_both_bounds():
    """The generic rule: a number a check compares against needs a lower and an upper bound, so
    no value that cannot be right gets past load. Before: 23 parameters had none."""
    registry = load_builtin_checks()
    unbounded = [
        "%s.%s" % (spec.name, param.name)
        for spec in registry.sorted_checks()
        for param in spec.params
        if _numeric(param)
        and not spec.name.startswith("site.")
        and (param.maximum is None or (param.minimum is None and param.above is None))
    ]
    assert unbounded == []


@pytest.mark.parametrize(
    "text, key",
    [
        ('[checks."gpu.count"]\nexpected = -3\n', "expected: -3 is out of range"),
        ('[checks."gpu.remap"]\nmax_retired_pages = 0\n', "max_retired_pages: 0 is out of range"),
        ('[checks."gpu.pcie"]\nexpected_gen = 9\n', "expected_gen: 9 is out of range"),
        (
            '[checks."system.filesystems"]\nmin_free_percent = 150\n',
            "min_free_percent: 150.0 is out of range",
        ),
        ('[checks."numa.sysctl"]\nnuma_balancing = 7\n', "numa_balancing: 7 is out of range"),
        ('[checks."system.load"]\nmax_load_per_cpu = 0\n', "max_load_per_cpu: 0.0 is out of range"),
        ('[checks."xid.events"]\nignore = [79, -1]\n', "ignore[1]: -1 is out of range"),
        # the form of a string, checked by the parameter's validate= at load (before: UNKNOWN at run)
        ('[checks."gpu.nvlink"]\nexpected_links = ["NVIDIA H100"]\n', "MODEL PATTERN=COUNT"),
        ('[checks."numa.housekeeping"]\nhousekeeping_cpus = "0-1,x"\n', "is not a CPU list"),
        ('[checks."numa.sysctl"]\nhugepages = ["1G=8"]\n', "is not SIZE=COUNT"),
        ('[checks."numa.gres-affinity"]\ngres_conf = "gres.conf"\n', "not an absolute path"),
        ('[checks."system.filesystems"]\nmounted = ["scratch"]\n', "not an absolute path"),
        ('[checks."topology.acs"]\nfail_bits = ["ReqRedirect"]\n', "is not one of 'SrcValid'"),
    ],
)
def test_a_check_setting_that_cannot_be_right_is_refused_naming_file_and_key(
    tmp_path, monkeypatch, text, key
):
    monkeypatch.setenv("SLURM_HOOKS_ALLOW_INSECURE_CONFIG", "1")
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(load_builtin_checks(), str(path))
    assert str(path) in str(err.value) and key in str(err.value)


def test_values_at_the_bounds_still_load(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_HOOKS_ALLOW_INSECURE_CONFIG", "1")
    path = tmp_path / "config.toml"
    path.write_text(
        '[checks."gpu.count"]\nexpected = 8\n[checks."gpu.ecc"]\nmax_aggregate_uncorrected_sram = -1\n'
        '[checks."numa.sysctl"]\nnuma_balancing = -1\n[checks."xid.sxid"]\nignore = [12028]\n'
    )
    config = load_config(load_builtin_checks(), str(path))
    assert config.check("gpu.count").params.expected == 8


def test_the_registry_refuses_a_default_outside_its_own_bounds():
    registry = Registry()
    with pytest.raises(RegistryError, match="default -1 is outside"):
        registry.check(
            name="demo.bounds", params=(Param("limit", int, -1, "x", minimum=0, maximum=9),)
        )(lambda params: None)
    with pytest.raises(RegistryError, match="outside"):
        registry.check(
            name="demo.items",
            params=(Param("ids", list, [0], "x", item_type=int, minimum=1, maximum=9),),
        )(lambda params: None)


# -- [drain] timeout x attempts against the time Slurm gives each hook ----------------------------


def _warnings(tmp_path, monkeypatch, text):
    monkeypatch.setenv("SLURM_HOOKS_ALLOW_INSECURE_CONFIG", "1")
    path = tmp_path / "config.toml"
    path.write_text(text)
    return load_config(load_builtin_checks(), str(path)).warnings, str(path)


def test_a_drain_budget_longer_than_the_health_hook_may_run_is_a_warning(tmp_path, monkeypatch):
    """30 s x 2 attempts after the 45 s health deadline: slurmd kills HealthCheckProgram at 60 s,
    mid-drain. Before: config check said nothing."""
    warnings, path = _warnings(tmp_path, monkeypatch, "[drain]\ntimeout = 30\nattempts = 2\n")
    (health,) = [w for w in warnings if "[deadline] health" in w]
    assert path in health
    assert "[drain] timeout = 30 s x attempts = 2" in health and "60 s" in health
    # the prolog (5 s deadline) goes past the advised 60 s PrologEpilogTimeout too: 5 + 1 + 61.6
    assert any("[deadline] prolog" in w for w in warnings)


def test_the_default_drain_budget_fits_every_hook(tmp_path, monkeypatch):
    warnings, _ = _warnings(tmp_path, monkeypatch, "[drain]\ntimeout = 5\n")
    assert [w for w in warnings if "[drain] timeout" in w] == []


def test_a_shorter_health_deadline_makes_room(tmp_path, monkeypatch):
    text = "[drain]\ntimeout = 10\nattempts = 3\n[deadline]\nhealth = 20\nepilog = 10\n"
    warnings, _ = _warnings(tmp_path, monkeypatch, text)
    assert [w for w in warnings if "[drain] timeout" in w] == []
    warnings, _ = _warnings(tmp_path, monkeypatch, text.replace("health = 20", "health = 40"))
    assert len([w for w in warnings if "[deadline] health" in w]) == 1
