"""Typed settings: each [section] of the configuration as an object with one attribute per key.

Where the keys come from: core/config.py SECTIONS, the one schema (type, default, help and limits of
every key, what `slurm-hooks config` and README's reference show). The section classes are generated
from it when first needed, so a key added to SECTIONS is an attribute here with nothing else to
edit; tests/test_settings_sections.py holds the two together (every key an attribute, with the
schema's type and default). The values are those core/config.py validate() accepted from
/etc/slurm-hooks/config.toml and its drop-ins (or the defaults).

    config.settings.breaker.max_nodes        # a typo raises AttributeError naming [breaker] and the key
    config.settings["breaker"]["max_nodes"]  # the string lookups of before work as they did
    config.get("breaker", "max_nodes")
    help(type(config.settings.breaker))      # what [breaker] holds: key, type, default, what it means

A section object (and the settings object holding them) is a read-only dict: json, dict(...),
`**`, .items() and comparisons with plain dicts work as before, assignment raises TypeError. A
configuration is validated once, as a whole; changing a value means a new Config (structs.replace,
as hw/capture.py does). Lists and tables inside are copies the Config owns (still mutable: a
change stays in that Config, never in the schema's defaults or another Config).

Dict subclasses, not Structs: every caller that takes `settings` as a mapping (and the tests that
build one by hand) keeps working unchanged. Nothing here imports core/config.py (it imports us).
"""

from __future__ import annotations

from collections.abc import Mapping

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Dict, Tuple
# The names a setting can never have: a key spelled like a dict method would read as the method.
# tests/test_settings_sections.py fails when SECTIONS declares one.
RESERVED = frozenset(dir(dict)) | {"defaults"}


class ReadOnlyDict(dict):
    """A dict that refuses changes (shallow: lists and tables inside are the values themselves)."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            "%s is read-only: the configuration is validated once, as a whole (core/config.py "
            "validate); make a new Config instead (structs.replace)" % self._label()
        )

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse
    __ior__ = _refuse

    def _label(self) -> str:
        return "the settings"

    def __reduce__(self) -> Tuple[Any, ...]:  # copy and pickle rebuild it whole, never item by item
        return (type(self), (dict(self),))


class Section(ReadOnlyDict):
    """One [section]: its keys as attributes. Subclasses are generated per section (section_class)."""

    __slots__ = ()
    _section = ""  # the [section] this class holds
    _schema: Mapping[str, Any] = {}  # key -> core/config.py Setting

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            if key.startswith("__"):  # copy, pickle and friends probing for protocol methods
                raise AttributeError(key) from None
            from difflib import get_close_matches  # only on this error path

            close = get_close_matches(key, list(self), 1)
            raise AttributeError(
                "[%s] has no setting %r%s (core/config.py SECTIONS; it has: %s)"
                % (
                    self._section,
                    key,
                    " (did you mean %r?)" % close[0] if close else "",
                    ", ".join(sorted(self)) or "none",
                )
            ) from None

    def _label(self) -> str:
        return "[%s]" % self._section

    def __reduce__(self) -> Tuple[Any, ...]:  # pickle finds a generated class through the schema
        return (_section_again, (self._section, tuple(self._schema), dict(self)))

    @classmethod
    def defaults(cls) -> Section:
        """The section with every key at the schema's default."""
        return cls({key: setting.default for key, setting in cls._schema.items()})


class Settings(ReadOnlyDict):
    """Every section: settings.drain is the [drain] Section, settings["drain"] the same object."""

    __slots__ = ()

    def __getattr__(self, section: str) -> Section:
        try:
            return self[section]
        except KeyError:
            if section.startswith("__"):
                raise AttributeError(section) from None
            raise AttributeError(
                "no settings section [%s] (core/config.py SECTIONS; there are: %s)"
                % (section, ", ".join(sorted(self)))
            ) from None


_CLASSES: Dict[Tuple[str, Tuple[str, ...]], type] = {}


def _section_again(name: str, keys: Tuple[str, ...], values: Dict[str, Any]) -> Section:
    """A pickled [name] section rebuilt: its class is generated, not a name pickle can look up.
    The class generated for the same schema when this process has it (a forked worker always
    does), else a bare Section of that name (attributes and lookups alike, without the help)."""
    cls = _CLASSES.get((name, keys))
    if cls is None:
        cls = type(
            "%sSection" % "".join(part.title() for part in name.split("_")),
            (Section,),
            {"__slots__": (), "__module__": __name__, "_section": name},
        )
    return cls(values)


def section_class(name: str, schema: Mapping[str, Any]) -> type:
    """The Section subclass for [name], generated from its schema (key -> Setting) on first use:
    annotations are the keys' types, the docstring lists key, type, default and help."""
    cache_key = (name, tuple(schema))
    cls = _CLASSES.get(cache_key)
    if cls is None:
        lines = ["[%s] settings (core/config.py SECTIONS):" % name, ""]
        for key, setting in schema.items():
            lines.append(
                "%s: %s = %r -- %s" % (key, setting.type.__name__, setting.default, setting.help)
            )
        cls = type(
            "%sSection" % "".join(part.title() for part in name.split("_")),
            (Section,),
            {
                "__slots__": (),
                "__doc__": "\n".join(lines),
                "__annotations__": {key: setting.type for key, setting in schema.items()},
                "__module__": __name__,
                "_section": name,
                "_schema": schema,
            },
        )
        _CLASSES[cache_key] = cls
    return cls


def _own(value: Any) -> Any:
    """A copy of the lists and tables in `value` (not copy.deepcopy: one import less per hook)."""
    if isinstance(value, list):
        return [_own(item) for item in value]
    if isinstance(value, dict):
        return {key: _own(item) for key, item in value.items()}
    return value


def typed_settings(
    values: Mapping[str, Mapping[str, Any]], schema: Mapping[str, Mapping[str, Any]]
) -> Settings:
    """`values` (section -> key -> value, validated or hand-made) as a Settings of Section objects.
    Sections the schema does not know (none after validate) are kept as they are."""
    if type(values) is Settings:
        return values
    sections = {}
    for name, table in values.items():
        if name in schema and isinstance(table, Mapping):
            cls = section_class(name, schema[name])
            # each Config owns its lists and tables: they are often the schema's default objects,
            # and one caller's change would leak into every Config built after it
            sections[name] = (
                table if type(table) is cls else cls({k: _own(v) for k, v in table.items()})
            )
        else:
            sections[name] = table
    return Settings(sections)
