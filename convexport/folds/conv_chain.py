"""A chain of two linear nodes (Conv, BN, per-channel affine, AveragePool, zero Pad) -> one Conv."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..algebra import Composition, Refusal, compose, scale_shift_after
from ..graph import tensor_dtype
from ..rewrite.primitives import Rewrite, reach
from .convnodes import make_conv, node_flops, spatial_shape
from .linear_nodes import channel_affine, data_input, linear_spec

# A bias of the first node read through the second's zero padding is exact only with a
# constant correction map added to the output ([O, *out], float32); it is used when at most
# this many bytes (a 64x128x128 map), so the fold never trades compute for a large tensor.
BORDER_LIMIT_BYTES = 4 << 20


def output_dtype(node: gs.Node) -> np.dtype:
    return tensor_dtype(node.outputs[0])


@reach(0)
def compose_linear(match, context) -> Rewrite | Refusal:
    """second(first(x)) -> Conv'(x) [+ border map]; the algebra is convexport.algebra.compose."""
    first, second = match.nodes["h"], match.root
    x = data_input(first)
    composition = _composition(first, second, spatial_shape(x), context)
    if isinstance(composition, Refusal):
        return composition
    output = second.outputs[0]
    node, folded = make_conv(context, x, composition.spec, output_dtype(second), output.name, output.shape)
    nodes, note = [node], f"{first.op} -> {second.op} composed into one Conv"
    extra = {}
    if composition.border is not None:
        border = gs.Constant(context.fresh(output.name + "_border"), composition.border[None].astype(output_dtype(second)))
        corrected = gs.Variable(context.fresh(output.name + "_corrected"), dtype=output_dtype(second),
                                shape=output.shape)
        nodes.append(gs.Node("Add", context.fresh(output.name + "_border_add"), inputs=[folded, border], outputs=[corrected]))
        extra["border_map_bytes"] = int(composition.border.size * output_dtype(second).itemsize)
        folded, note = corrected, note + f" plus a constant border map of {extra['border_map_bytes']} bytes"
    parts = [node_flops(first), node_flops(second)]
    before = None if None in parts else sum(parts)
    after = node_flops(node, output.shape)
    return Rewrite(nodes, [(output, folded)], note, before, after, extra)


def _composition(first: gs.Node, second: gs.Node, input_spatial, context) -> Composition | Refusal:
    """second(first(x)) as one conv (compose), or, when second is a per-channel affine map
    (BatchNormalization, Mul / Add by a per-channel constant), first's conv rescaled and
    shifted: never built as a dense [C, C] kernel, which is O(C^2) memory for an O(C) map."""
    first_spec = linear_spec(first, context.opset)
    if isinstance(first_spec, Refusal):
        return first_spec
    affine = channel_affine(second, context.opset)
    if isinstance(affine, Refusal):
        return affine
    if affine is not None:
        return Composition(scale_shift_after(first_spec, *affine), None)
    second_spec = linear_spec(second, context.opset)
    if isinstance(second_spec, Refusal):
        return second_spec
    if _is_separable_pair(first_spec, second_spec):
        return Refusal("a tall conv then a wide conv stays split: composed, it is the low-rank kernel "
                       "that low-rank-kernel splits (and costs Kh*Kw instead of Kh + Kw taps)")
    limit = int(context.params.get("border_limit_bytes", BORDER_LIMIT_BYTES))
    return compose(first_spec, second_spec, input_spatial, limit)


def _is_separable_pair(first, second) -> bool:
    """Kh x 1 (no bias) then 1 x Kw, Kh and Kw > 1: the pair algebra/separable.py makes."""
    return (first.nd == second.nd == 2 and first.kernel_shape[1] == 1 < first.kernel_shape[0]
            and second.kernel_shape[0] == 1 < second.kernel_shape[1] and not first.has_bias)
