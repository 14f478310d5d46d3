"""What a rule's `apply:` names: a primitive that turns a match into a Rewrite or a Refusal.

A primitive is `f(match, context) -> Rewrite | Refusal`. It builds the replacement nodes
from the match's tensors (the weight algebra lives in convexport.algebra) and says which
tensors of the old graph they replace. It never edits the graph itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import onnx_graphsurgeon as gs


@dataclass
class Rewrite:
    nodes: list[gs.Node]
    replace: list            # (old gs.Variable, new tensor made by `nodes` or existing) pairs
    note: str                # what was done, for the report
    flops_before: float | None = None
    flops_after: float | None = None
    extra: dict = field(default_factory=dict)   # more report fields (e.g. a border map size)


Primitive = Callable[..., object]


def builtin_primitives() -> dict[str, Primitive]:
    from ..folds import REGISTRY

    return dict(REGISTRY)
