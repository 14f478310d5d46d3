"""Between ONNX Conv nodes in a ir.Graph and the algebra's ConvSpec."""

from __future__ import annotations

import numpy as np

from .. import flops, ir
from ..algebra import ConvSpec, Refusal, conv_from_onnx, conv_to_onnx
from ..ir import constant_value, is_absent


def spatial_shape(tensor) -> tuple[int | None, ...] | None:
    """The spatial dims of an NC... tensor (None for an unknown dim), or None without a rank."""
    shape = getattr(tensor, "shape", None)
    if shape is None or len(shape) < 3:
        return None
    return tuple(d if isinstance(d, int) and d >= 0 else None for d in shape[2:])


def conv_weights(node: ir.Node) -> tuple[np.ndarray, np.ndarray | None]:
    """A Conv node's constant weight [O, I/g, *k] and bias [O] (None when it has none)."""
    weight = constant_value(node.inputs[1])
    bias_input = node.inputs[2] if len(node.inputs) > 2 else None
    bias = None if is_absent(bias_input) else constant_value(bias_input)
    if weight is None or (not is_absent(bias_input) and bias is None):
        raise Refusal(f"{node.name}: weight or bias is not a constant")
    if not all_finite(weight, bias):
        raise Refusal(f"{node.name}: its weights hold inf or NaN, which a fold would not reproduce")
    return weight, bias


def all_finite(*arrays) -> bool:
    """No inf or NaN in any of the (float) arrays given; None counts as finite."""
    return all(a is None or np.asarray(a).dtype.kind not in "fc" or np.all(np.isfinite(a)) for a in arrays)


def conv_attributes(node: ir.Node) -> dict:
    return {key: (list(value) if isinstance(value, (list, tuple)) else value) for key, value in node.attrs.items()}


def conv_spec(node: ir.Node) -> ConvSpec:
    """The ConvSpec of a Conv node whose weight (and bias) are constants."""
    weights = conv_weights(node)
    return conv_from_onnx(*weights, conv_attributes(node), spatial_shape(node.inputs[0]))


def node_flops(node: ir.Node, output_shape=None) -> float | None:
    """The node's count (flops.py: whole tensors, a symbolic batch as 1) from its output's
    shape, or `output_shape` for a new node that has none yet; None where a dim past the
    batch is unknown."""
    shape = node.outputs[0].shape if output_shape is None else output_shape
    if not _known_past_batch(shape):
        return None
    return flops.node_flops(node.op, shape, [t.shape for t in node.inputs], node.attrs.get)


def output_elements(shape) -> float | None:
    """One operation per element of an output of `shape` (an activation's count), as node_flops."""
    return flops.elements(shape) if _known_past_batch(shape) else None


def conv_flops(spec: ConvSpec, output_shape) -> float | None:
    """The count of the Conv emitted for `spec` whose output has the batch and spatial dims of
    `output_shape` ([B, *, *out]; its channels are the spec's)."""
    if output_shape is None or len(output_shape) < 3 or any(not isinstance(d, int) for d in output_shape[2:]):
        return None
    weight_shape = conv_to_onnx(spec)[0].shape
    return flops.conv([output_shape[0], weight_shape[0], *output_shape[2:]], weight_shape)


def _known_past_batch(shape) -> bool:
    return shape is not None and len(shape) >= 2 and all(isinstance(d, int) for d in shape[1:])
