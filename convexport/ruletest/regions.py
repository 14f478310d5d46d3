"""Linear branches of one tensor before a sum: what a linear region follows (folds/linear_region.py).

A rule whose root is `y = Add(a, b)` or `Sub(a, b)` with both operands open (no other line
makes them) gets, in most instances, a and b drawn as branches of one input x [.., C]: a few
steps each of a MatMul by a constant, a per-feature Mul or Add, or a Reshape pair around a
MatMul (x flattened to [-1, C] and restored, as GPT-2's Conv1D), the second branch starting at
x or at a value of the first (an intermediate read twice, as DoRA's W x), both ending at one
width D. Drawn otherwise (independent inputs), such a root is not a case for the region.
"""

from __future__ import annotations

import numpy as np

from ..rewrite.pattern import ValueRef

STEPS = ("matmul", "scale", "shift", "reshaped matmul")


def wants_branches(builder) -> bool:
    """Whether the rule's root is a sum of two open operands, and this instance draws branches."""
    root = builder.rule.root
    if root.op_type not in ("Add", "Sub") or len(root.inputs) != 2:
        return False
    made = {ref.name for line in builder.rule.pattern for ref in line.outputs}
    open_operands = all(not ref.constant and ref.name not in made and not ref.wildcard for ref in root.inputs)
    return open_operands and root.inputs[0].name != root.inputs[1].name and builder.draws.integer(0, 3) > 0


def add_branches(builder) -> None:
    """Draw the two branches and bind the root's operands to their ends."""
    draws = builder.draws
    lead = [draws.integer(1, 3) for _ in range(draws.integer(1, 2))]
    width, out = draws.integer(1, 6), draws.integer(1, 6)
    x = builder._materialize(ValueRef("x"), draws.normal([*lead, width]))
    first = _branch(builder, lead, x, width, out)
    start: tuple[str, int] = draws.choice(first[:-1]) if len(first) > 1 and draws.flag() else (x, width)
    second = _branch(builder, lead, *start, out)
    for ref, branch in zip(builder.rule.root.inputs, (first, second)):
        builder.env[(ref.name, None)] = branch[-1][0]


def _branch(builder, lead: list[int], value: str, width: int, out: int) -> list[tuple[str, int]]:
    """(value, width) after each step from `value`, the last at width `out`."""
    draws, steps = builder.draws, []
    for _ in range(draws.integer(0, 2)):
        value, width = _step(builder, lead, value, width, draws.choice(STEPS), draws.integer(1, 6))
        steps.append((value, width))
    if width != out or not steps:
        value, width = _step(builder, lead, value, width, draws.choice(("matmul", "reshaped matmul")), out)
        steps.append((value, width))
    return steps


def _step(builder, lead: list[int], value: str, width: int, kind: str, out: int) -> tuple[str, int]:
    draws = builder.draws
    if kind == "scale":
        return builder._add_node("Mul", [value, _constant(builder, draws.away_from_zero([width]))], {}, 1, "scale")[
            0
        ], width
    if kind == "shift":
        return builder._add_node("Add", [value, _constant(builder, draws.normal([width]))], {}, 1, "shift")[0], width
    weight = _constant(builder, draws.normal([width, out]))
    if kind == "matmul":
        return builder._add_node("MatMul", [value, weight], {}, 1, "dense")[0], out
    flat = builder._add_node("Reshape", [value, _constant(builder, np.array([-1, width]))], {}, 1, "flat")[0]
    dense = builder._add_node("MatMul", [flat, weight], {}, 1, "dense")[0]
    shape = _constant(builder, np.array([*lead, out]))
    return builder._add_node("Reshape", [dense, shape], {}, 1, "unflat")[0], out


def _constant(builder, value: np.ndarray) -> str:
    return builder._materialize(ValueRef("k", constant=True), value)
