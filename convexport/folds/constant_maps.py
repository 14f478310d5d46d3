"""Constant maps added to a tensor (border maps, biases of any shape) moved past linear nodes.

A fold that reads a bias through padding leaves `Add(conv(x), B)` with a constant map B; these
primitives keep it from blocking the next fold: a linear node after the Add is applied to B
once, here, and consecutive constant Adds become one.
"""

from __future__ import annotations

import numpy as np

from ..algebra import DEFAULT_BORDER_LIMIT_BYTES, Refusal, apply_conv
from ..ir import constant_value
from .builder import NodeBuilder, output_dtype
from .linear_nodes import linear_spec
from .primitives import Rewrite, accepts, builtin, consumes, reach


def _full_map(value: np.ndarray, shape) -> np.ndarray:
    """The constant as [1, C, *spatial] of `shape` ([N, C, *spatial]); it may not vary over N."""
    if shape is None or any(not isinstance(d, int) for d in shape[1:]):
        raise Refusal("the tensor the constant is added to has no static shape")
    if value.ndim > len(shape) or (value.ndim == len(shape) and value.shape[0] != 1):
        raise Refusal(f"the constant of shape {value.shape} varies over the batch")
    try:
        return np.broadcast_to(value, (1, *shape[1:])).astype(np.float64)
    except ValueError:
        raise Refusal(f"the constant of shape {value.shape} does not broadcast to {tuple(shape)}") from None


@builtin
@reach(0)
@accepts("map_limit_bytes")
@consumes("h", "t", "m", h={"Add"}, root={"Conv"})
def linear_of_constant_map(match, context) -> Rewrite:
    """L(t + m) -> L(t) + L0(m), L0 = L without its bias: a linear node moved before the Add.

    m [1, C, *spatial] (any shape broadcasting to t's, not over the batch) -> L0(m)
    [1, O, *out], computed once in float64.
    """
    add, node = match.nodes["h"], match.root
    t, m = match.values["t"], match.values["m"]
    value = _full_map(constant_value(m).astype(np.float64), t.shape)
    if not np.all(np.isfinite(value)):
        raise Refusal("the map holds inf or NaN, which moving it would not reproduce")
    spec = linear_spec(node, context.opset)
    out_shape = spec.output_shape(value.shape[2:])
    size = 4 * spec.out_channels * int(np.prod(out_shape))
    limit = int(context.params.get("map_limit_bytes", DEFAULT_BORDER_LIMIT_BYTES))
    if size > limit:
        raise Refusal(f"the map after {node.op} would take {size} bytes, over the limit of {limit}")
    moved = apply_conv(spec, value, with_bias=False)
    base = node.outputs[0].name
    build = NodeBuilder(context, output_dtype(node))
    inputs = [t if tensor is add.outputs[0] else tensor for tensor in node.inputs]
    inner = build.node(node.op, inputs, node.attrs, base=base + "_before_map")
    result = build.node("Add", [inner, build.constant(moved, base + "_map")], base=base + "_plus_map")
    # The cost of the move is the Add's: over t before, over the (maybe larger) output after.
    return Rewrite(
        build.nodes,
        [(node.outputs[0], result)],
        f"constant map moved past {node.op} ({size} bytes as float32)",
        float(value.size),
        float(moved.size),
    )


@builtin
@reach(0)
@consumes("h", "t", "m1", "m2", h={"Add"}, root={"Add"})
def merge_constant_adds(match, context) -> Rewrite:
    """(t + m1) + m2 -> t + (m1 + m2), the sum taken once in float64."""
    m1, m2 = (constant_value(match.values[name]).astype(np.float64) for name in ("m1", "m2"))
    total = m1 + m2
    output = match.root.outputs[0]
    build = NodeBuilder(context, output_dtype(match.root), output.name + "_sum")
    result = build.node("Add", [match.values["t"], build.constant(total, output.name + "_summed_map")])
    return Rewrite(build.nodes, [(output, result)], "two constant Adds merged into one")
