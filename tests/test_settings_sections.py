"""The typed settings (core/sections.py) against the one schema (core/config.py SECTIONS): every key
of every section is an attribute of its section object, with the schema's type and default, and the
string lookups of before still answer the same."""

from __future__ import annotations

import copy
import json

import pytest

from slurm_hooks.core.config import SECTIONS, Config, ConfigError, salvage_settings, validate
from slurm_hooks.core.sections import RESERVED, Section, Settings, section_class
from slurm_hooks.core.structs import replace
from slurm_hooks.registry import Registry


@pytest.fixture(scope="module")
def defaults():
    """A configuration with nothing set: every key at its default, through validate()."""
    return validate(Registry(), {})


def test_every_schema_key_is_an_attribute_of_its_section_with_its_type_and_default(defaults):
    assert set(defaults.settings) == set(SECTIONS)
    for section, schema in SECTIONS.items():
        typed = getattr(defaults.settings, section)
        cls = type(typed)
        assert isinstance(typed, Section) and cls is section_class(section, schema), section
        assert cls.__annotations__ == {key: setting.type for key, setting in schema.items()}
        assert set(typed) == set(schema), section  # nothing missing, nothing extra
        for key, setting in schema.items():
            value = getattr(typed, key)
            assert value == setting.default, (section, key)
            # a float setting's default may be written as an int (5 for 5.0); a bool is no int here
            allowed = (int, float) if setting.type is float else setting.type
            assert isinstance(value, allowed) and not (
                setting.type is int and isinstance(value, bool)
            ), (section, key, value)
            assert value is typed[key] and value == defaults.get(section, key), (section, key)
            assert "%s: %s = " % (key, setting.type.__name__) in cls.__doc__, (section, key)
        assert cls.defaults() == typed


def test_a_key_added_to_the_schema_is_an_attribute_with_nothing_else_to_edit(monkeypatch):
    """What another change does when it adds a setting: one Setting in SECTIONS, nothing else."""
    from slurm_hooks.core import config as config_module

    drain = dict(SECTIONS["drain"])
    drain["new_knob"] = config_module.Setting(int, 7, "a setting added by a later change")
    monkeypatch.setitem(SECTIONS, "drain", drain)
    config = validate(Registry(), {"drain": {"new_knob": 9}})
    assert config.settings.drain.new_knob == 9 == config.get("drain", "new_knob")
    assert type(config.settings.drain).__annotations__["new_knob"] is int
    assert validate(Registry(), {}).settings.drain.new_knob == 7


def test_no_setting_is_named_like_a_dict_method():
    """settings.drain.items would read the dict method, not a setting called items."""
    clashes = [
        "[%s] %s" % (section, key)
        for section, schema in SECTIONS.items()
        for key in schema
        if key in RESERVED or key.startswith("_")
    ]
    assert not clashes, "rename these settings: " + ", ".join(clashes)
    clashing_sections = [s for s in SECTIONS if s in RESERVED or s.startswith("_")]
    assert not clashing_sections


def test_a_validated_value_reads_the_same_every_way():
    config = validate(
        Registry(),
        {"drain": {"timeout": 12.5, "reason_prefix": "hc:"}, "general": {"mode": "enforce"}},
    )
    assert config.settings.drain.timeout == 12.5 == config.settings["drain"]["timeout"]
    assert config.get("drain", "timeout") == 12.5
    assert (
        config.settings.drain.reason_prefix == "hc:" and config.settings.general.mode == "enforce"
    )
    # what callers of the mapping did before still works: dict(), json, **, comparisons with dicts
    plain = json.loads(json.dumps(config.settings))
    assert plain == config.settings and plain["drain"] == dict(config.settings.drain)
    assert {**config.settings.drain}["timeout"] == 12.5


def test_a_typo_names_the_section_and_the_key():
    config = validate(Registry(), {})
    with pytest.raises(AttributeError, match=r"\[drain\] has no setting 'timout'.*'timeout'"):
        config.settings.drain.timout  # noqa: B018
    with pytest.raises(AttributeError, match=r"no settings section \[drian\]"):
        config.settings.drian  # noqa: B018


def test_settings_are_read_only_and_a_changed_config_is_a_new_one():
    config = validate(Registry(), {})
    with pytest.raises(TypeError, match=r"\[drain\] is read-only"):
        config.settings.drain["timeout"] = 1.0
    with pytest.raises(TypeError, match="read-only"):
        config.settings["drain"] = {}
    with pytest.raises(TypeError):
        config.settings.drain.update(timeout=1.0)
    with pytest.raises(AttributeError):
        config.settings.drain.timeout = 1.0
    # what hw/capture.py does: a new Config from plain dicts is typed again
    general = dict(config.settings.general, root="/elsewhere")
    changed = replace(config, settings=dict(config.settings, general=general))
    assert changed.settings.general.root == "/elsewhere" and config.settings.general.root == "/"
    assert isinstance(changed.settings, Settings) and isinstance(changed.settings.general, Section)
    assert copy.deepcopy(changed.settings) == changed.settings
    assert type(copy.copy(changed.settings.drain)) is type(changed.settings.drain)


def test_a_config_built_from_plain_dicts_is_typed():
    settings = {s: {k: v.default for k, v in schema.items()} for s, schema in SECTIONS.items()}
    config = Config(settings=settings, checks={})
    assert config.settings.deadline.files == SECTIONS["deadline"]["files"].default


def test_the_salvaged_settings_of_a_refused_config_are_typed(tmp_path, monkeypatch):
    """fail_open reads them by attribute: a broken file must still give typed [metrics] and [deadline]."""
    monkeypatch.setenv("SLURM_HOOKS_ALLOW_INSECURE_CONFIG", "1")
    path = tmp_path / "config.toml"
    path.write_text('[metrics]\ntextfile_dir = "/run/prom"\n[drain]\ntimeout = "soon"\n')
    with pytest.raises(ConfigError):
        validate(Registry(), {"drain": {"timeout": "soon"}})
    salvaged = salvage_settings(str(path))
    assert salvaged.metrics.textfile_dir == "/run/prom"
    assert salvaged.deadline.files == SECTIONS["deadline"]["files"].default
    broken = tmp_path / "missing" / "config.toml"
    assert salvage_settings(str(broken)).paths.state_dir == SECTIONS["paths"]["state_dir"].default


def test_settings_pickle_and_come_back_typed(defaults):
    """sections.py says copy and pickle rebuild a section whole; pickle could not find a generated
    class by name (PicklingError), so a Config could never be sent to a worker process."""
    import pickle

    back = pickle.loads(pickle.dumps(defaults.settings))
    assert back == defaults.settings and type(back.drain) is type(defaults.settings.drain)
    assert back.drain.timeout == defaults.settings.drain.timeout


def test_a_list_changed_through_one_config_does_not_leak_into_the_next():
    """A list value of a config built from the defaults was the schema's default object itself:
    one caller's append changed [drain] skip_states of every Config built after it in the process
    (and the default README's reference shows)."""
    first = validate(Registry(), {})
    default = SECTIONS["drain"]["skip_states"].default
    before = list(default)
    try:
        first.settings.drain.skip_states.append("IDLE")
        assert validate(Registry(), {}).settings.drain.skip_states == before
        assert salvage_settings("/nonexistent/config.toml").drain.skip_states == before
    finally:
        default[:] = before
