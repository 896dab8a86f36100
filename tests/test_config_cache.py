"""Root's parsed-configuration cache (core/config_cache.py): tomllib is skipped only for the very
bytes a table was parsed from; anything doubtful (another user, an untrusted directory, a foreign,
linked or truncated file) is parsed as before."""

from __future__ import annotations

import os

import pytest

from slurm_hooks.core import config_cache, config_files
from slurm_hooks.core.config import load_config
from slurm_hooks.registry import Registry

CONFIG = '[general]\nmode = "observe"\n\n[deadline]\nprolog = 20\n'


@pytest.fixture
def cached(tmp_path, monkeypatch):
    """A config file, a trusted cache directory, and a count of tomllib parses."""
    if os.geteuid() != 0:
        pytest.skip("the cache is root's (the hooks run as root)")
    cache = tmp_path / "cache"
    tmp_path.chmod(0o755)
    monkeypatch.setenv(config_cache.CACHE_ENV, str(cache))
    monkeypatch.delenv(config_files.INSECURE_OVERRIDE_ENV, raising=False)
    conf = tmp_path / "etc"
    conf.mkdir(mode=0o755)
    (conf / "config.toml").write_text(CONFIG)
    parses = []
    real = config_files.toml_loads

    def counting(text):
        parses.append(text)
        return real(text)

    monkeypatch.setattr(config_files, "toml_loads", counting)
    return conf / "config.toml", cache, parses


def _load(path):
    return load_config(Registry(), str(path))


def test_a_second_load_of_the_same_bytes_does_not_parse(cached):
    path, cache, parses = cached
    first = _load(path)
    assert len(parses) == 1 and (cache / config_cache.FILE_NAME).exists()
    assert (cache / config_cache.FILE_NAME).stat().st_mode & 0o777 == 0o600
    second = _load(path)
    assert len(parses) == 1
    assert second.settings == first.settings and second.get("deadline", "prolog") == 20


def test_a_change_is_parsed_again_even_with_the_same_size_and_times(cached):
    path, _cache, parses = cached
    _load(path)
    before = os.stat(path)
    path.write_text(CONFIG.replace("20", "30"))  # same size
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert _load(path).get("deadline", "prolog") == 30
    assert len(parses) == 2


@pytest.mark.parametrize(
    "spoil", ["world-writable-dir", "foreign-owner", "link", "garbage", "not-root"]
)
def test_a_doubtful_cache_is_not_used(cached, spoil, monkeypatch, tmp_path):
    path, cache, parses = cached
    _load(path)
    entry = cache / config_cache.FILE_NAME
    if spoil == "world-writable-dir":
        cache.chmod(0o777)
    elif spoil == "foreign-owner":
        os.chown(entry, 1000, 1000)
    elif spoil == "link":
        target = tmp_path / "elsewhere"
        os.replace(entry, target)
        entry.symlink_to(target)
    elif spoil == "garbage":
        entry.write_bytes(b"\x00not marshal")
    else:
        monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert _load(path).get("deadline", "prolog") == 20
    assert len(parses) == 2


def test_a_date_is_never_cached_and_errors_are_raised_as_before(cached):
    path, cache, parses = cached
    path.write_text(CONFIG + "\n[extra]\nwhen = 2026-12-04\n")
    with pytest.raises(config_files.ConfigError):  # an unknown section, as before
        _load(path)
    assert not (cache / config_cache.FILE_NAME).exists()
    path.write_text("[general\n")
    with pytest.raises(config_files.ConfigError, match="invalid TOML"):
        _load(path)
    assert len(parses) == 2


def test_a_bug_in_the_cache_is_never_a_configuration_error(cached, monkeypatch):
    """Anything the cache raises (here: the trust check) parses as before, both ways."""
    path, _cache, parses = cached
    from slurm_hooks.core import dir_trust

    def broken(_path):
        raise RuntimeError("a bug")

    monkeypatch.setattr(dir_trust, "untrusted_because", broken)
    assert _load(path).get("deadline", "prolog") == 20
    assert len(parses) == 1
