"""A ConvTranspose and the per-channel affine map or pointwise Conv after it -> one ConvTranspose
(the algebra: convexport/algebra/transposed.py)."""

from __future__ import annotations

from .. import flops, ir
from ..algebra import Refusal, pointwise_after_transposed, scale_shift_transposed
from ..ir import attribute_or, tensor_dtype
from .builder import NodeBuilder
from .convnodes import all_finite, conv_attributes, conv_weights
from .linear_nodes import channel_affine, composed_note
from .primitives import LINEAR, Rewrite, builtin, consumes, reach


@builtin
@reach(0)
@consumes("h", h={"ConvTranspose"}, root=LINEAR)
def compose_conv_transpose(match, context) -> Rewrite:
    """second(ConvTranspose(x)) -> ConvTranspose'(x) for second a per-channel affine map
    (BatchNormalization, Mul / Div / Add / Sub by a per-channel constant) or a Conv with a
    1x1 kernel, one group, stride 1 and no pads."""
    first, second = match.nodes["h"], match.root
    weights = conv_weights(first)  # the same inputs as a Conv's: (x, W [Cin, Cout/G, *k], b?)
    weight, bias = weights
    groups = int(attribute_or(first, "group", context.opset, 1))
    if second.op == "Conv":
        folded = _with_pointwise(second, weight, bias, groups, context.opset)
    else:
        affine = channel_affine(second, context.opset)
        if affine is None:
            raise Refusal(f"{second.name}: {second.op} is no per-channel map", reported=False)
        folded = (*scale_shift_transposed(weight, bias, groups, *affine), groups)
    return _rewrite(first, second, *folded, context)


def _with_pointwise(conv: ir.Node, weight, bias, groups: int, opset: int) -> tuple:
    """(W', b', 1) for a pointwise Conv after the ConvTranspose, or why it is not one."""
    pointwise = conv_weights(conv)
    kernel, pointwise_bias = pointwise
    nd = kernel.ndim - 2
    geometry_is_pointwise = (
        all(k == 1 for k in kernel.shape[2:])
        and int(attribute_or(conv, "group", opset, 1)) == 1
        and all(s == 1 for s in attribute_or(conv, "strides", opset, (1,) * nd))
        and not any(attribute_or(conv, "pads", opset, (0,) * 2 * nd))
    )
    if not geometry_is_pointwise:
        raise Refusal(f"{conv.name}: not a pointwise Conv (1x1 kernel, one group, stride 1, no pads)", reported=False)
    return (*pointwise_after_transposed(weight, bias, groups, kernel.reshape(kernel.shape[:2]), pointwise_bias), 1)


def _rewrite(first: ir.Node, second: ir.Node, weight, bias, groups: int, context) -> Rewrite:
    output = second.outputs[0]
    dtype = tensor_dtype(output)
    if not all_finite(weight, bias):
        raise Refusal(f"{second.name}: the folded weights overflow to inf or NaN")
    attrs = {**conv_attributes(first), "group": groups}
    build = NodeBuilder(context, dtype)
    folded = build.conv(first.inputs[0], weight, bias, attrs, base=output.name, shape=output.shape, op=first.op)
    (node,) = build.nodes
    before = _flops(first, first.inputs[1].shape, second)
    after = _flops(node, weight.shape)
    note = composed_note(first.op, second.op).replace("one Conv", "one ConvTranspose")
    return Rewrite([node], [(output, folded)], note, before, after)


def _flops(node: ir.Node, weight_shape, after: ir.Node | None = None) -> float | None:
    """The ConvTranspose's count (flops.py) and, with `after`, that of the node after it (a
    pointwise Conv or an affine map), as flops.py counts each node. None where a shape is
    unknown."""
    source = getattr(node.inputs[0], "shape", None)
    if source is None or weight_shape is None or not all(isinstance(d, int) for d in source[1:]):
        return None
    count = flops.conv_transpose(source, weight_shape)
    if after is None:
        return count
    out = after.outputs[0].shape
    if out is None or not all(isinstance(d, int) for d in out[1:]):
        return None
    return count + flops.node_flops(after.op, out, [t.shape for t in after.inputs], after.attrs.get)
