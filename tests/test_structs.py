"""structs.Struct: the dataclass semantics slurm-hooks relies on, without dataclasses' start-up cost."""

from __future__ import annotations

import subprocess
import sys
from typing import List

import pytest

from slurm_hooks.core.structs import FrozenError, Struct, TupleRecord, field, replace


class Point(Struct):
    x: int
    y: int = 0
    tags: List[str] = field(default_factory=list)
    raw: str = field(default="", compare=False, repr=False)


class Counter(Struct, frozen=False):
    name: str
    hits: int = 0


class Point3(Point):
    z: int = 0


def test_positional_keyword_and_default_arguments_in_field_order():
    p = Point(1, tags=["a"])
    assert (p.x, p.y, p.tags, p.raw) == (1, 0, ["a"], "")
    assert Point(x=2, y=3).y == 3
    assert Point._fields == ("x", "y", "tags", "raw")


def test_default_factories_give_each_instance_its_own_value():
    a, b = Point(1), Point(2)
    a.tags.append("mine")
    assert b.tags == []


@pytest.mark.parametrize(
    "call",
    [
        lambda: Point(),
        lambda: Point(1, 2, [], "", 5),
        lambda: Point(1, x=1),
        lambda: Point(1, colour="red"),
    ],
)
def test_wrong_arguments_are_type_errors(call):
    with pytest.raises(TypeError):
        call()


def test_equality_by_compared_fields_of_the_same_class_only():
    assert Point(1, 2) == Point(1, 2)
    assert Point(1, 2) != Point(1, 3)
    assert Point(1, raw="a") == Point(1, raw="b")  # compare=False
    assert Point(1) != Point3(1)
    assert Point(1) != (1, 0, [], "")


def test_frozen_instances_refuse_assignment_and_hash_by_value():
    p = Point(1, 2, ("t",))
    with pytest.raises(FrozenError):
        p.x = 5
    with pytest.raises(AttributeError):  # FrozenError is an AttributeError, like dataclasses'
        del p.y
    assert hash(Point(1, 2, ("t",))) == hash(p)
    assert len({Point(1, 2, ("t",)), p}) == 1


def test_mutable_structs_can_change_and_are_unhashable():
    c = Counter("a")
    c.hits += 1
    assert c == Counter("a", 1)
    with pytest.raises(TypeError):
        hash(c)


def test_repr_shows_fields_except_repr_false():
    assert repr(Point(1, raw="secret")) == "Point(x=1, y=0, tags=[])"


def test_replace_copies_with_changes_and_keeps_the_class():
    p = Point3(1, 2, z=3)
    q = replace(p, y=9)
    assert type(q) is Point3 and (q.x, q.y, q.z) == (1, 9, 3) and p.y == 2


def test_a_field_without_default_after_one_with_default_is_refused():
    with pytest.raises(TypeError, match="without a default"):

        class Bad(Struct):  # noqa: F841
            a: int = 0
            b: int


def test_the_hook_path_imports_neither_dataclasses_nor_inspect():
    code = (
        "import sys, slurm_hooks.hooks, slurm_hooks.registry as r; r.load_builtin_checks(); "
        "print(sorted(m for m in ('dataclasses', 'inspect', 'argparse') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_copies_and_pickles_round_trip_frozen_structs():
    import copy
    import pickle

    p = Point(1, 2, ["a"], raw="r")
    for clone in (copy.copy(p), copy.deepcopy(p), pickle.loads(pickle.dumps(p))):
        assert clone == p and clone.raw == "r" and type(clone) is Point
    deep = copy.deepcopy(p)
    deep.tags.append("b")
    assert p.tags == ["a"]


class Usage(TupleRecord):
    blocks: int
    free: int


def test_tuple_records_are_tuples_with_named_fields():
    """hw/host.FsUsage and the /proc rows (procfs.Mount, LoadAvg, SwapArea) are compared with and
    unpacked as plain tuples; TupleRecord keeps that without typing.NamedTuple's start-up cost."""
    import copy
    import pickle

    u = Usage(10, free=4)
    assert u == (10, 4) and isinstance(u, tuple) and (u.blocks, u.free) == (10, 4)
    blocks, free = u
    assert (blocks, free) == (10, 4) and Usage._fields == ("blocks", "free")
    assert u._asdict() == {"blocks": 10, "free": 4} and u._replace(free=5) == (10, 5)
    assert repr(u) == "Usage(blocks=10, free=4)"
    for clone in (copy.copy(u), copy.deepcopy(u), pickle.loads(pickle.dumps(u))):
        assert clone == u and type(clone) is Usage
    assert hash(u) == hash((10, 4))
    for bad in ((), (1,), (1, 2, 3)):
        with pytest.raises(TypeError, match="takes 2 arguments"):
            Usage(*bad)
    with pytest.raises(TypeError, match="unexpected or repeated"):
        Usage(1, blocks=2)


def test_the_proc_rows_and_fs_usage_define_no_named_tuple():
    import slurm_hooks.hw.host as host
    import slurm_hooks.hw.procfs as procfs

    for cls in (host.FsUsage, procfs.Mount, procfs.LoadAvg, procfs.SwapArea):
        assert issubclass(cls, TupleRecord), cls
    assert procfs.parse_loadavg("0.34 0.25 0.11 1/84 4512") == (0.34, 0.25, 0.11, 1, 84)
    assert procfs.parse_loadavg("0.34 0.25 0.11 1/84 4512").total == 84
