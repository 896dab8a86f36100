"""The one registry of checks and gatherers.

A check's name (``family.what``) is its CLI name, config table key, kill-switch key, log field
and metric label; it is declared once, here, by the ``@check`` marker.

Gather, then judge: a *gatherer* (``@gatherer("system.cpu")``) is the only code that touches the
OS; it takes a GatherContext and returns an immutable snapshot. A *check* is a pure function of
the snapshots it ``needs`` plus its ``params``; it returns a Result or a list of Results.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from .core.structs import Struct, field

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Tuple

CONTEXTS = (
    "prolog",
    "epilog",
    "health",
    "manual",
)  # the one spelling of the contexts, in display order
HOOK_CONTEXTS = CONTEXTS[:3]  # what slurmd runs: prolog, epilog, HealthCheckProgram
JOB_CONTEXTS = CONTEXTS[:2]  # the hooks that run for a job (SLURM_JOB_ID set): prolog, epilog
DEFAULT_CONTEXTS = frozenset(CONTEXTS) - {
    "epilog"
}  # a check that does not say: every context but the epilog

# Modules that hold built-in checks; importing one registers its checks.
BUILTIN_CHECK_MODULES = (
    "slurm_hooks.checks.system",
    "slurm_hooks.checks.pci",
    "slurm_hooks.checks.gpu.inventory",
    "slurm_hooks.checks.gpu.memory",
    "slurm_hooks.checks.gpu.state",
    "slurm_hooks.checks.gpu.links",
    "slurm_hooks.checks.gpu.procs",
    "slurm_hooks.checks.xid",
    "slurm_hooks.checks.topology",
    "slurm_hooks.checks.gpudirect",
    "slurm_hooks.checks.numa",
    "slurm_hooks.checks.host.memory",
    "slurm_hooks.checks.host.links",
    "slurm_hooks.checks.host.nvme",
    "slurm_hooks.checks.host.bmc",
    "slurm_hooks.checks.host.mce",
)


class RegistryError(Exception):
    """A programming or configuration error in what was registered (duplicate name, bad marker)."""


class Param(Struct):
    """One typed, documented parameter of a check: `[checks."<name>"] <param> = value`.

    Numbers may declare `minimum`/`maximum` (inclusive) and `above` (exclusive); nan and inf are
    always refused. For a list of numbers the bounds hold for each item. Every number of a built-in
    check declares both a lower and an upper bound (tests/test_check_params.py), so a value that
    cannot be right (`[checks."gpu.count"] expected = -3`) stops `config check` and the hooks at load
    instead of driving drains; the registry refuses a default outside its own bounds or choices. `convert(raw TOML value) -> value` replaces the type check for structured
    parameters (tables): it raises ValueError naming what is wrong, and may return Deprecated(value,
    how to write it now) for an old form it still accepts. `validate(value)` checks the form of a
    string or list (raises ValueError). All of it runs when the config is loaded.
    """

    name: str
    type: type  # bool, int, float, str, list or dict (a TOML table)
    default: Any
    help: str
    item_type: Optional[type] = None  # for lists: type of each element
    choices: Optional[Tuple[Any, ...]] = None
    minimum: Optional[float] = None
    maximum: Optional[float] = None
    above: Optional[float] = None
    convert: Optional[Callable[[Any], Any]] = None
    # validate(value) after the type, bounds and choices: raises ValueError saying what is wrong with
    # a value of the right type (a cpulist, 'MODEL=COUNT', an absolute path); runs at load
    validate: Optional[Callable[[Any], Any]] = None

    def describe_type(self) -> str:
        if self.type is list:
            item = self.item_type.__name__ if self.item_type else "values"
            if self.choices:
                return "list of %s" % ", ".join(repr(c) for c in self.choices)
            limits = self._limits()
            return "list of %s" % item + (" (each %s)" % ", ".join(limits) if limits else "")
        if self.type is dict:
            return "table"
        if self.choices:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        limits = self._limits()
        return self.type.__name__ + (" (%s)" % ", ".join(limits) if limits else "")

    def _limits(self) -> List[str]:
        return (
            (["> %g" % self.above] if self.above is not None else [])
            + (["\u2265 %g" % self.minimum] if self.minimum is not None else [])
            + (["\u2264 %g" % self.maximum] if self.maximum is not None else [])
        )

    def out_of_bounds(self, value: Any) -> bool:
        """A number (or, for a list, any item) outside minimum/maximum/above."""
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, bool) or not isinstance(item, (int, float)):
                continue
            if (
                (self.minimum is not None and item < self.minimum)
                or (self.maximum is not None and item > self.maximum)
                or (self.above is not None and item <= self.above)
            ):
                return True
        return False


def absolute_path(value: Any) -> None:
    """A Param validate= for a path (or a list of paths): absolute, since a hook's working directory
    is slurmd's, not the admin's (a relative path would read some other file)."""
    for path in value if isinstance(value, list) else [value]:
        if path and not path.startswith("/"):
            raise ValueError("%r is not an absolute path" % path)


class Deprecated(Struct):
    """What a Param's converter returns for an old spelling it still accepts: the value, and how to write it now."""

    value: Any
    message: str


class Params(Mapping):
    """Read-only parameter values of one check; attribute or item access."""

    def __init__(self, values: Mapping[str, Any]):
        object.__setattr__(self, "_values", dict(values))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Params are read-only")

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return "Params(%r)" % (self._values,)


class CheckSpec(Struct):
    name: str
    func: Callable[..., Any]
    contexts: FrozenSet[str]
    timeout: float
    needs: Tuple[str, ...]
    params: Tuple[Param, ...]
    enabled_by_default: bool = True

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def description(self) -> str:
        doc = self.doc
        return doc.splitlines()[0] if doc else ""

    @property
    def doc(self) -> str:
        import inspect  # only for help and docs: inspect costs ~4 ms of start-up (the prolog never needs it)

        return inspect.getdoc(self.func) or ""

    def default_params(self) -> Dict[str, Any]:
        return {p.name: p.default for p in self.params}

    def param(self, name: str) -> Optional[Param]:
        return next((p for p in self.params if p.name == name), None)


class GathererSpec(Struct):
    name: str
    func: Callable[..., Any]


class Registry(Struct, frozen=False):
    checks: Dict[str, CheckSpec] = field(default_factory=dict)
    gatherers: Dict[str, GathererSpec] = field(default_factory=dict)

    def check(
        self,
        name: str,
        contexts: Iterable[str] = DEFAULT_CONTEXTS,
        timeout: float = 1.0,
        needs: Iterable[str] = (),
        params: Iterable[Param] = (),
        enabled_by_default: bool = True,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register a check: ``@check(name="gpu.ecc", contexts={"prolog"}, timeout=1, needs=(...))``."""

        def mark(func: Callable[..., Any]) -> Callable[..., Any]:
            spec = CheckSpec(
                name=name,
                func=func,
                contexts=frozenset(contexts),
                timeout=float(timeout),
                needs=tuple(needs),
                params=tuple(params),
                enabled_by_default=enabled_by_default,
            )
            self.add_check(spec)
            return func

        return mark

    def add_check(self, spec: CheckSpec) -> None:
        _validate_name(spec.name, "check", spec.func)
        if spec.name in self.checks:
            first = self.checks[spec.name].func
            raise RegistryError(
                "duplicate check name %r: defined by %s and %s; every check needs its own name"
                % (spec.name, _where(first), _where(spec.func))
            )
        unknown = spec.contexts.difference(CONTEXTS)
        if unknown or not spec.contexts:
            raise RegistryError(
                "check %r (%s): contexts %s; expected a non-empty subset of %s"
                % (spec.name, _where(spec.func), sorted(unknown) or "empty", ", ".join(CONTEXTS))
            )
        if spec.timeout <= 0:
            raise RegistryError("check %r: timeout must be > 0, got %r" % (spec.name, spec.timeout))
        names = [p.name for p in spec.params]
        if len(set(names)) != len(names) or "enabled" in names:
            raise RegistryError(
                "check %r: parameter names must be unique and not 'enabled'" % spec.name
            )
        for param in spec.params:
            items = param.default if isinstance(param.default, list) else [param.default]
            if param.out_of_bounds(param.default) or (
                param.choices and any(item not in param.choices for item in items)
            ):
                raise RegistryError(
                    "check %r: parameter %r: default %r is outside its own %s"
                    % (spec.name, param.name, param.default, param.describe_type())
                )
        self.checks[spec.name] = spec

    def gatherer(self, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register a gatherer: ``@gatherer("system.cpu") def read_cpu(ctx) -> Snapshot``."""

        def mark(func: Callable[..., Any]) -> Callable[..., Any]:
            _validate_name(name, "gatherer", func)
            if name in self.gatherers:
                raise RegistryError(
                    "duplicate gatherer %r: %s and %s"
                    % (name, _where(self.gatherers[name].func), _where(func))
                )
            self.gatherers[name] = GathererSpec(name, func)
            return func

        return mark

    def for_context(self, context: str) -> List[CheckSpec]:
        return [spec for name, spec in sorted(self.checks.items()) if context in spec.contexts]

    def sorted_checks(self) -> List[CheckSpec]:
        return [self.checks[name] for name in sorted(self.checks)]


def _validate_name(name: str, kind: str, func: Callable[..., Any]) -> None:
    parts = name.split(".")
    if len(parts) < 2 or not all(
        p and p.replace("-", "").replace("_", "").isalnum() for p in parts
    ):
        raise RegistryError(
            "%s name %r (%s) must look like 'family.what'" % (kind, name, _where(func))
        )
    if name != name.lower():
        raise RegistryError("%s name %r (%s) must be lower case" % (kind, name, _where(func)))


def _where(func: Callable[..., Any]) -> str:
    code = getattr(func, "__code__", None)
    if code is None:
        return repr(func)
    return "%s:%d" % (code.co_filename, code.co_firstlineno)


REGISTRY = Registry()
check = REGISTRY.check
gatherer = REGISTRY.gatherer
_loaded = False  # every built-in module imported
_site_loaded = False


def load_builtin_checks(names: Optional[Iterable[str]] = None) -> Registry:
    """Import every built-in check module once (registration happens on import), and the site checks.

    names (check names or families, as `slurm-hooks check NAME...` takes them): import only the
    modules holding those checks (check_index.py), for a verb that runs a few: `check system` then
    skips NVML's bindings, the Xid catalog and the Slurm parsers. The configuration's [checks.*]
    tables and the gatherers a check asks for load their modules when met (load_checks_for,
    load_gatherer), so nothing is judged or validated with less than a full load would give."""
    global _loaded, _site_loaded
    if names is not None and not _loaded:
        load_checks_for(REGISTRY, names, families=True)
    elif not _loaded:
        for module in BUILTIN_CHECK_MODULES:
            importlib.import_module(module)
        _loaded = True
    if not _site_loaded:
        importlib.import_module(
            "slurm_hooks.core.plugins"
        ).load_site_checks()  # /etc/slurm-hooks/checks.d/*.py
        _site_loaded = True
    return REGISTRY


def load_checks_for(registry: Registry, names: Iterable[str], families: bool = False) -> None:
    """Import the built-in modules registering these checks (or, with families, these families)
    into `registry` when it is the built-in one; names no built-in module holds are left alone
    (a site check, or a typo the caller reports)."""
    if registry is not REGISTRY or _loaded:
        return
    from .check_index import CHECK_MODULES

    wanted = set(names)
    for check, module in CHECK_MODULES.items():
        if check in wanted or (families and check.split(".", 1)[0] in wanted):
            importlib.import_module(module)


def load_gatherer(registry: Registry, name: str) -> Optional[GathererSpec]:
    """The gatherer `name`, importing its built-in module first if a partial load left it out."""
    spec = registry.gatherers.get(name)
    if spec is None and registry is REGISTRY and not _loaded:
        from .check_index import GATHERER_MODULES

        module = GATHERER_MODULES.get(name)
        if module is not None:
            importlib.import_module(module)
            spec = registry.gatherers.get(name)
    return spec
