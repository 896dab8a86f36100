"""Struct: the small value classes of slurm-hooks, declared like dataclasses but without their start-up cost.

Why not @dataclass: every dataclass compiles its generated __init__/__eq__/__repr__ with exec() when
its module is imported, and `dataclasses` itself pulls in inspect, ast and dis. With ~50 of them
that was ~20 ms of every prolog on a 2-core node (144 -> 121 ms, docs/performance.md), the
largest single import cost. A Struct reads its fields from the class annotations once, at class
creation, and shares one generic __init__/__eq__/__repr__, so defining a class costs microseconds.

    class Point(Struct):                  # frozen (immutable, hashable) unless frozen=False
        x: int
        y: int = 0
        tags: list = field(default_factory=list)
        raw: str = field(default="", compare=False, repr=False)

Semantics follow dataclasses where slurm-hooks relies on them: positional or keyword arguments in
field order, defaults and default factories, equality by field values between instances of the same
class, frozen instances raise FrozenError (an AttributeError) on assignment and hash by value,
mutable ones are unhashable, `replace(obj, **changes)`. Not supported (not used here):
__post_init__, InitVar, ClassVar fields, ordering, keyword-only fields.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: no prolog process imports typing (test_startup_imports)
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Optional, Tuple
_MISSING = object()


class FrozenError(AttributeError):
    """Assignment to a field of a frozen Struct."""


class Field:
    __slots__ = ("default", "default_factory", "compare", "repr")

    def __init__(
        self,
        default: Any = _MISSING,
        default_factory: Optional[Callable[[], Any]] = None,
        compare: bool = True,
        repr: bool = True,
    ):  # noqa: A002 - the dataclasses spelling
        self.default, self.default_factory, self.compare, self.repr = (
            default,
            default_factory,
            compare,
            repr,
        )


def field(
    default: Any = _MISSING,
    default_factory: Optional[Callable[[], Any]] = None,
    compare: bool = True,
    repr: bool = True,
) -> Any:  # noqa: A002
    """A field with a default factory, or one left out of equality/repr (like dataclasses.field)."""
    return Field(default, default_factory, compare, repr)


class Struct:
    """Base class: fields are the annotated names of the class body (and of Struct bases), in order."""

    __slots__ = ()
    _fields: Tuple[str, ...] = ()
    _defaults: Dict[str, Any] = {}
    _factories: Dict[str, Callable[[], Any]] = {}
    _compared: Tuple[str, ...] = ()
    _shown: Tuple[str, ...] = ()
    _frozen = True

    def __init_subclass__(cls, frozen: bool = True, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        fields, defaults, factories = list(cls._fields), dict(cls._defaults), dict(cls._factories)
        compared, shown = list(cls._compared), list(cls._shown)
        for name in cls.__dict__.get("__annotations__", {}):
            if name.startswith("_") or name in fields:
                continue
            value = cls.__dict__.get(name, _MISSING)
            spec = value if isinstance(value, Field) else Field(default=value)
            if spec.default_factory is not None:
                factories[name] = spec.default_factory
            elif spec.default is not _MISSING:
                defaults[name] = spec.default
            elif defaults or factories:
                raise TypeError(
                    "%s: field %r without a default follows one with a default"
                    % (cls.__name__, name)
                )
            if isinstance(
                value, Field
            ):  # the marker must not shadow instance values as a class attribute
                delattr(cls, name)
            fields.append(name)
            if spec.compare:
                compared.append(name)
            if spec.repr:
                shown.append(name)
        cls._fields, cls._defaults, cls._factories = tuple(fields), defaults, factories
        cls._compared, cls._shown, cls._frozen = tuple(compared), tuple(shown), frozen
        if not frozen and "__hash__" not in cls.__dict__:
            cls.__hash__ = None  # type: ignore[assignment]  # mutable and compared by value: unhashable

    def __init__(self, *args: Any, **kwargs: Any):
        fields = self._fields
        if len(args) > len(fields):
            raise TypeError(
                "%s takes at most %d arguments (%d given)"
                % (type(self).__name__, len(fields), len(args))
            )
        values = dict(zip(fields, args))
        for name, value in kwargs.items():
            if name not in fields:
                raise TypeError("%s got an unexpected argument %r" % (type(self).__name__, name))
            if name in values:
                raise TypeError(
                    "%s got multiple values for argument %r" % (type(self).__name__, name)
                )
            values[name] = value
        setter = object.__setattr__
        for name in fields:
            if name in values:
                setter(self, name, values[name])
            elif name in self._defaults:
                setter(self, name, self._defaults[name])
            elif name in self._factories:
                setter(self, name, self._factories[name]())
            else:
                raise TypeError("%s missing required argument %r" % (type(self).__name__, name))

    def __setattr__(self, name: str, value: Any) -> None:
        if self._frozen:
            raise FrozenError(
                "cannot assign to field %r of frozen %s" % (name, type(self).__name__)
            )
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        if self._frozen:
            raise FrozenError("cannot delete field %r of frozen %s" % (name, type(self).__name__))
        object.__delattr__(self, name)

    def _key(self) -> Tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._compared)

    def __eq__(self, other: Any) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return "%s(%s)" % (
            type(self).__qualname__,
            ", ".join("%s=%r" % (name, getattr(self, name)) for name in self._shown),
        )


def replace(obj: Struct, **changes: Any) -> Any:
    """A copy of `obj` with some fields changed (like dataclasses.replace)."""
    values = {name: getattr(obj, name) for name in obj._fields}
    values.update(changes)
    return type(obj)(**values)


class TupleRecord(tuple):
    """A tuple with named fields, declared like typing.NamedTuple, for values that must stay tuples
    (compared with and unpacked as plain tuples, e.g. FsUsage and the /proc parsers' rows).

        class LoadAvg(TupleRecord):
            one: float
            running: int

    Why not typing.NamedTuple: with `from __future__ import annotations` it turns every field's
    annotation into a ForwardRef and compiles it, and collections.namedtuple eval()s a __new__;
    host.py's one NamedTuple cost ~2 ms of every prolog's start-up. Here the annotations are only
    read for their names. No defaults (none is used).
    """

    __slots__ = ()
    _fields: Tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        cls._fields = tuple(cls.__dict__.get("__annotations__", {}))
        for index, name in enumerate(cls._fields):
            setattr(cls, name, property(_item_getter(index), doc="field %d" % index))

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        fields = cls._fields
        if kwargs:
            if len(args) > len(fields):
                raise TypeError("%s takes %d arguments" % (cls.__name__, len(fields)))
            values = dict(zip(fields, args))
            for name, value in kwargs.items():
                if name not in fields or name in values:
                    raise TypeError("%s: unexpected or repeated argument %r" % (cls.__name__, name))
                values[name] = value
            args = tuple(values.get(name, _MISSING) for name in fields)
        if len(args) != len(fields) or _MISSING in args:
            raise TypeError(
                "%s takes %d arguments (%s)" % (cls.__name__, len(fields), ", ".join(fields))
            )
        return tuple.__new__(cls, args)

    def __getnewargs__(self) -> Tuple[Any, ...]:
        return tuple(self)

    def __repr__(self) -> str:
        return "%s(%s)" % (
            type(self).__name__,
            ", ".join("%s=%r" % pair for pair in zip(self._fields, self)),
        )

    def _asdict(self) -> Dict[str, Any]:
        return dict(zip(self._fields, self))

    def _replace(self, **changes: Any) -> Any:
        return type(self)(**dict(self._asdict(), **changes))


def _item_getter(index: int) -> Callable[[Any], Any]:
    return lambda self: tuple.__getitem__(self, index)
