"""Every linear node convexport folds, seen as a ConvSpec acting on its data input.

Conv is itself; BatchNormalization, and Mul / Div / Add / Sub by a per-channel or scalar
constant, are 1x1 depthwise convs with a bias; AveragePool is a depthwise conv of 1/k^n; a
zero Pad is an identity kernel with pads. Composing and summing them is then one algebra.
"""

from __future__ import annotations

import numpy as np

from .. import ir
from ..algebra import (
    ConvSpec,
    Refusal,
    avgpool_as_conv,
    batchnorm_scale_shift,
    identity_conv,
    merge_zero_pad,
    scale_shift_after,
)
from ..ir import attribute, attribute_or, constant_value, is_absent
from .convnodes import all_finite, conv_spec, spatial_shape

ELEMENTWISE = ("Mul", "Div", "Add", "Sub")


def composed_note(first_op: str, second_op: str) -> str:
    """The report's note for two linear nodes composed into one Conv."""
    return f"{first_op} -> {second_op} composed into one Conv"


def data_input(node: ir.Node):
    """The run-time operand of a linear node (for elementwise ops, the non-constant one)."""
    if node.op in ELEMENTWISE:
        return node.inputs[1] if constant_value(node.inputs[0]) is not None else node.inputs[0]
    return node.inputs[0]


def linear_spec(node: ir.Node, opset: int) -> ConvSpec:
    """The ConvSpec that computes `node` from data_input(node)."""
    if node.op == "Conv":
        return conv_spec(node)
    geometry = _channels_and_rank(node)
    channels, nd = geometry
    affine = channel_affine(node, opset)
    if affine is not None:
        return scale_shift_after(identity_conv(channels, nd), *affine)
    if node.op == "AveragePool":
        return _avgpool_spec(node, channels, nd, spatial_shape(node.inputs[0]), opset)
    if node.op == "Pad":
        return _pad_spec(node, channels, nd, opset)
    raise Refusal(f"{node.name}: {node.op} is not a linear op convexport folds")


def channel_affine(node: ir.Node, opset: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale, shift), each [C], with node(x) = scale * x + shift per channel: BatchNormalization,
    and x*k, x/k, x+k, x-k, k*x, k+x, k-x for a constant k of shape [C,1..] or a scalar. None for
    any other op (it is no per-channel affine map)."""
    if node.op != "BatchNormalization" and node.op not in ELEMENTWISE:
        return None
    geometry = _channels_and_rank(node)
    channels, nd = geometry
    affine = _affine_of(node, channels, nd, opset)
    if not all_finite(*affine):
        raise Refusal(f"{node.name}: its scale or shift holds inf or NaN, which a fold would not reproduce")
    return affine


def _affine_of(node: ir.Node, channels: int, nd: int, opset: int) -> tuple[np.ndarray, np.ndarray]:
    """channel_affine's (scale, shift) for a BatchNormalization or an elementwise op, in float64."""
    if node.op == "BatchNormalization":
        if attribute_or(node, "training_mode", opset, 0):
            raise Refusal(f"{node.name}: a BatchNormalization in training mode normalises by batch statistics")
        gamma, beta, mean, var = (constant_value(t) for t in node.inputs[1:5])
        return batchnorm_scale_shift(
            *(np.asarray(v, np.float64) for v in (gamma, beta, mean, var)),
            float(attribute_or(node, "epsilon", opset, 1e-5)),
        )
    data_first = constant_value(node.inputs[0]) is None
    constant = constant_value(node.inputs[1] if data_first else node.inputs[0])
    try:
        k = _per_channel(np.asarray(constant, np.float64), channels, nd)
    except Refusal as refusal:  # a constant of another shape makes it no channel map at all: not a case
        raise Refusal(f"{node.name}: {refusal.reason}", reported=False) from None
    zero, one = np.zeros(channels), np.ones(channels)
    if node.op == "Mul":
        return k, zero
    if node.op == "Div":
        with np.errstate(divide="ignore"):  # x / 0: an inf scale, refused by the caller
            inverse = 1.0 / k
        if not data_first:
            raise Refusal(f"{node.name}: k / x is not linear in x")
        return inverse, zero
    if node.op == "Add":
        return one, k
    return (one, -k) if data_first else (-one, k)


def _channels_and_rank(node: ir.Node) -> tuple[int, int]:
    """The channel count and spatial rank of the node's data input [N, C, *spatial]."""
    shape = getattr(data_input(node), "shape", None)
    if shape is not None and len(shape) < 3:  # no [N, C, *spatial] tensor: not a case for a conv fold
        raise Refusal(f"{node.name}: its input has rank {len(shape)}, not [N, C, *spatial]", reported=False)
    if shape is None or not isinstance(shape[1], int):
        raise Refusal(f"{node.name}: the rank and channel count of its input are unknown")
    return shape[1], len(shape) - 2


def _per_channel(value: np.ndarray, channels: int, nd: int) -> np.ndarray:
    """A constant that broadcasts over [N, C, *spatial] one value per channel, as [C]."""
    if value.ndim > nd + 2:
        raise Refusal(f"the constant of shape {value.shape} would broadcast the output to a higher rank")
    full = value.reshape((1,) * (nd + 2 - value.ndim) + value.shape)
    if full.shape[0] != 1 or any(d != 1 for d in full.shape[2:]) or full.shape[1] not in (1, channels):
        raise Refusal(f"the constant of shape {value.shape} is not per-channel over {channels} channels")
    return np.broadcast_to(full.reshape(-1), (channels,)).astype(np.float64)


def _avgpool_spec(node: ir.Node, channels: int, nd: int, spatial, opset: int) -> ConvSpec:
    kernel = tuple(attribute(node, "kernel_shape", opset))
    strides = tuple(attribute_or(node, "strides", opset, (1,) * nd))
    pads = tuple(attribute_or(node, "pads", opset, (0,) * (2 * nd)))
    auto_pad = attribute_or(node, "auto_pad", opset, "NOTSET")
    if auto_pad not in ("NOTSET", "VALID"):
        raise Refusal(f"{node.name}: AveragePool with auto_pad {auto_pad} is not folded")
    if any(d != 1 for d in attribute_or(node, "dilations", opset, ())):
        raise Refusal(f"{node.name}: dilated AveragePool is not folded")
    return avgpool_as_conv(
        channels,
        kernel,
        strides,
        pads[:nd],
        pads[nd:],
        bool(attribute_or(node, "count_include_pad", opset, 0)),
        bool(attribute_or(node, "ceil_mode", opset, 0)),
        spatial,
    )


def _pad_spec(node: ir.Node, channels: int, nd: int, opset: int) -> ConvSpec:
    mode = attribute_or(node, "mode", opset, "constant")
    if mode != "constant":
        raise Refusal(f"{node.name}: Pad mode {mode!r} is not zero padding")
    pads = constant_value(node.inputs[1])
    value = None if len(node.inputs) < 3 or is_absent(node.inputs[2]) else constant_value(node.inputs[2])
    axes_given = len(node.inputs) > 3 and not is_absent(node.inputs[3])
    if pads is None or axes_given:
        raise Refusal(f"{node.name}: Pad amounts are not constant (or use axes)")
    if value is not None and np.any(np.asarray(value) != 0):
        raise Refusal(f"{node.name}: pads with {np.asarray(value).item()}, not zero")
    pads = [int(p) for p in np.asarray(pads).reshape(-1)]
    rank = nd + 2
    begin, end = pads[:rank], pads[rank:]
    if any(begin[:2]) or any(end[:2]):
        raise Refusal(f"{node.name}: pads the batch or channel axis")
    return merge_zero_pad(identity_conv(channels, nd), begin[2:], end[2:])
