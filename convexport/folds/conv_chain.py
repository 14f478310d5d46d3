"""A chain of two linear nodes (Conv, BN, per-channel affine, AveragePool, zero Pad) -> one Conv."""

from __future__ import annotations

import numpy as np

from .. import ir
from ..algebra import (
    DEFAULT_BORDER_LIMIT_BYTES,
    Composition,
    Refusal,
    compose,
    conv_to_onnx,
    scale_shift_after,
    scale_shift_onnx_weight,
)
from ..algebra.onnx_conv import conv_geometry
from ..algebra.outline import composite_outline
from .builder import NodeBuilder, output_dtype
from .convnodes import conv_attributes, conv_weights, node_flops, spatial_shape
from .linear_nodes import channel_affine, composed_note, data_input, linear_spec
from .primitives import LINEAR, Rewrite, accepts, builtin, consumes, reach


@builtin
@reach(0)
@accepts("border_limit_bytes")
@consumes("h", h=LINEAR, root=LINEAR)
def compose_linear(match, context) -> Rewrite:
    """second(first(x)) -> Conv'(x) [+ border map]; the algebra is convexport.algebra.compose,
    or, for a Conv then a per-channel affine map, scale_shift_onnx_weight on the Conv's own
    weight (the classic BatchNormalization fold: same group and geometry, O(weight) work).
    Two Convs come as a prospect (primitives.Rewrite): the composite's outline is judged
    before its kernel is built."""
    first, second = match.nodes["h"], match.root
    x = data_input(first)
    output = second.outputs[0]
    note = composed_note(first.op, second.op)
    rescaled = _rescaled_conv(first, second, context.opset)
    if rescaled is not None:
        build = NodeBuilder(context, output_dtype(second))
        build.conv(x, *rescaled, base=output.name, shape=output.shape)
        return _rewrite(first, second, build.nodes, note)
    prospect = _prospect(first, second, x, note, context) if first.op == second.op == "Conv" else None
    return prospect if prospect is not None else _composed(first, second, x, note, context)


def _composed(first: ir.Node, second: ir.Node, x, note: str, context) -> Rewrite:
    """The composite conv itself, and a border map where first's bias reads through second's padding."""
    output = second.outputs[0]
    composition = _composition(first, second, spatial_shape(x), context)
    build = NodeBuilder(context, output_dtype(second))
    folded = build.conv(x, *conv_to_onnx(composition.spec), base=output.name, shape=output.shape)
    extra = {}
    if composition.border is not None:
        border = build.constant(composition.border[None], output.name + "_border")
        build.node("Add", [folded, border], base=output.name + "_border", shape=output.shape)
        extra["border_map_bytes"] = int(composition.border.size * output_dtype(second).itemsize)
        note += f" plus a constant border map of {extra['border_map_bytes']} bytes"
    return _rewrite(first, second, build.nodes, note, extra)


def _prospect(first: ir.Node, second: ir.Node, x, note: str, context) -> Rewrite | None:
    """The composite of two Convs as a prospect: a stand-in Conv with the outline's weight
    shape (algebra/outline.py; zeros broadcast, no memory), completed by _composed. None
    where the outline needs what only the composition checks (an auto_pad resolved from an
    unknown input shape)."""
    weights = [conv_weights(node) for node in (first, second)]
    attrs = [conv_attributes(node) for node in (first, second)]
    try:
        geometry = [
            conv_geometry(w.shape, a, spatial_shape(t)) for (w, _), a, t in zip(weights, attrs, (x, first.outputs[0]))
        ]
    except Refusal:  # the composition says why, with what only it checks
        return None
    if _is_separable_pair(weights[0][0].shape[2:], weights[1][0].shape[2:], weights[0][1] is not None):
        raise Refusal(SEPARABLE_PAIR)
    outline = composite_outline(
        weights[0][0],
        int(attrs[0].get("group", 1)),
        geometry[0],
        weights[1][0],
        int(attrs[1].get("group", 1)),
        geometry[1],
    )
    dtype, output = output_dtype(second), second.outputs[0]
    zero = np.zeros((), dtype)  # broadcast: a stand-in weight of any size takes no memory
    build = NodeBuilder(context, dtype, output.name + "_prospect")
    inputs = [x, build.constant(np.broadcast_to(zero, outline.weight_shape), output.name + "_prospect_weight")]
    if weights[0][1] is not None or weights[1][1] is not None:
        inputs.append(build.constant(np.broadcast_to(zero, outline.out_channels), output.name + "_prospect_bias"))
    build.node("Conv", inputs, {"group": outline.group}, shape=output.shape)
    prospect = _rewrite(first, second, build.nodes, note)
    prospect.complete = lambda: _composed(first, second, x, note, context)
    return prospect


def _rewrite(first: ir.Node, second: ir.Node, nodes: list[ir.Node], note: str, extra: dict | None = None) -> Rewrite:
    """second's output from the last of `nodes`; FLOPs of the two old nodes against the new Conv's."""
    output = second.outputs[0]
    parts = [node_flops(first), node_flops(second)]
    before = None if None in parts else sum(parts)
    after = node_flops(nodes[0], output.shape)
    return Rewrite(nodes, [(output, nodes[-1].outputs[0])], note, before, after, extra or {})


def _rescaled_conv(first: ir.Node, second: ir.Node, opset: int) -> tuple | None:
    """(weight, bias, attributes) of first, a Conv, with second's per-channel affine map folded
    into its own weight; None when first is no Conv or second no such map."""
    if first.op != "Conv":
        return None
    affine = channel_affine(second, opset)
    if affine is None:
        return None
    weights = conv_weights(first)
    return (*scale_shift_onnx_weight(*weights, *affine), conv_attributes(first))


def _composition(first: ir.Node, second: ir.Node, input_spatial, context) -> Composition:
    """second(first(x)) as one conv (compose), or, when second is a per-channel affine map
    (BatchNormalization, Mul / Add by a per-channel constant), first's conv rescaled and
    shifted: never built as a dense [C, C] kernel, which is O(C^2) memory for an O(C) map."""
    first_spec = linear_spec(first, context.opset)
    affine = channel_affine(second, context.opset)
    if affine is not None:
        return Composition(scale_shift_after(first_spec, *affine), None)
    second_spec = linear_spec(second, context.opset)
    if _is_separable_pair(first_spec.kernel_shape, second_spec.kernel_shape, first_spec.has_bias):
        raise Refusal(SEPARABLE_PAIR)
    limit = int(context.params.get("border_limit_bytes", DEFAULT_BORDER_LIMIT_BYTES))
    return compose(first_spec, second_spec, input_spatial, limit)


SEPARABLE_PAIR = (
    "a tall conv then a wide conv stays split: composed, it is the low-rank kernel that "
    "low-rank-kernel splits (and costs Kh*Kw instead of Kh + Kw taps)"
)


def _is_separable_pair(first_kernel, second_kernel, first_has_bias: bool) -> bool:
    """Kh x 1 (no bias) then 1 x Kw, Kh and Kw > 1: the pair algebra/separable.py makes."""
    return (
        len(first_kernel) == len(second_kernel) == 2
        and first_kernel[1] == 1 < first_kernel[0]
        and second_kernel[0] == 1 < second_kernel[1]
        and not first_has_bias
    )
