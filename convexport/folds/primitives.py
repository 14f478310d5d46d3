"""What a rule's `apply:` names: a primitive that turns a match into a Rewrite or a Refusal.

A primitive is `f(match, context) -> Rewrite`. It builds the replacement nodes from the
match's tensors (the weight algebra lives in convexport.algebra) and says which tensors of
the old graph they replace, or raises a Refusal saying why not (not `reported` where the
match is simply not a case for it), the one way it and the helpers under it say no. It never
edits the graph itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .. import ir

# Op classes, the pattern language's (here, in the primitives' interface, because primitives
# name them too): a pattern line `OUT = Class(x)` matches a node of any of these ops whose one
# run-time input is x, every other input a constant (or absent), so that one line names every
# linear node a primitive can fold:
#   Affine(x)   BatchNormalization, Mul / Div / Add / Sub by a constant (Div only as x / k)
#   Linear(x)   an Affine, or a Conv, AveragePool or Pad of x
#   Dense(x)    a Gemm or MatMul of x by a constant weight
# Whether the constants fit (a per-channel or per-feature scale, zero padding) is the
# primitive's to check, and to say.
AFFINE = frozenset({"BatchNormalization", "Mul", "Div", "Add", "Sub"})
LINEAR = AFFINE | {"Conv", "AveragePool", "Pad"}
DENSE = frozenset({"Gemm", "MatMul"})
OP_CLASSES = {"Affine": AFFINE, "Linear": LINEAR, "Dense": DENSE}


@dataclass
class Rewrite:
    """New nodes and the old tensors they replace.

    A rewrite with `complete` is a prospect: its nodes stand in for the real ones with their
    ops and shapes (constants of the right shape and dtype, values not meaningful), and
    complete() builds the real rewrite, or raises the Refusal that its exactness checks give. Under
    --strategy cost the engine judges the prospect first and builds only what would pass, then
    judges the real rewrite too (which may add nodes, such as a border map). The prospect must
    cost what its completion's own nodes cost: a primitive offers one only where the shapes
    are known without the weights."""

    nodes: list[ir.Node]
    replace: list  # (old ir.Variable, new tensor made by `nodes` or existing) pairs
    note: str  # what was done, for the report
    flops_before: float | None = None
    flops_after: float | None = None
    extra: dict = field(default_factory=dict)  # more report fields (e.g. a border map size)
    complete: Callable[[], object] | None = None  # -> Rewrite (or raises Refusal), for a prospect


Primitive = Callable[..., object]


def reach(steps: int) -> Callable[[Primitive], Primitive]:
    """Declare that a primitive reads the graph no further than `steps` nodes beyond its match
    (the producers of what it reads, the readers of what it writes). The engine then looks at a
    rule again after a change only near the change (rewrite/changes.py). A primitive without it
    may read anywhere (the batching ones follow branches as far as they go)."""
    return _declaring("reach", steps)


def accepts(*names: str) -> Callable[[Primitive], Primitive]:
    """Declare the `with:` parameters a primitive reads: a rule giving it any other is an error
    in its rule file (a primitive without the declaration takes any)."""
    return _declaring("accepts", frozenset(names))


@dataclass(frozen=True)
class Contract:
    """What a primitive reads of its match, declared with @consumes and checked against a
    rule's pattern when the rule file is read (rewrite/contracts.py)."""

    names: tuple[str, ...]  # pattern names read besides the root line; "name?" where optional
    every_line: bool  # it walks the whole match (a chain, the branches of its root)
    ops: dict  # line name ("root" for the last line) -> the op types it handles there


def consumes(*names: str, every_line: bool = False, **ops) -> Callable[[Primitive], Primitive]:
    """Declare what a primitive reads: the pattern names (`"h"`, `"x"`; `"a?"` where it reads
    one only if the pattern has it) beside the root line, or `every_line=True` where it reads
    the whole match; and per line (by its output name, `root` for the last line) the op types
    it handles, as keywords (`h={"Conv", "BatchNormalization"}`). A rule whose pattern has a
    line the primitive does not read (what it computes would be dropped), lacks a name it
    reads, or puts an op it does not handle on a line, is an error in its rule file."""
    return _declaring("contract", Contract(names, every_line, {line: frozenset(types) for line, types in ops.items()}))


def contract_of(primitive: Primitive) -> Contract | None:
    return getattr(primitive, "contract", None)


def accepted_params(primitive: Primitive) -> frozenset[str] | None:
    return getattr(primitive, "accepts", None)


def reach_of(primitive: Primitive) -> int | None:
    return getattr(primitive, "reach", None)


def _declaring(attribute: str, value) -> Callable[[Primitive], Primitive]:
    """A decorator that sets `attribute` on the primitive it decorates (read back with getattr)."""

    def declare(primitive: Primitive) -> Primitive:
        setattr(primitive, attribute, value)
        return primitive

    return declare


BUILTIN: dict[str, Primitive] = {}  # the built-in primitives by the name rule files give them


def builtin(primitive: Primitive) -> Primitive:
    """Registers a built-in primitive under its function's name, the name a rule file's `apply:`
    gives it (folds/__init__.py's builtin_primitives() returns them)."""
    BUILTIN[primitive.__name__] = primitive
    return primitive
