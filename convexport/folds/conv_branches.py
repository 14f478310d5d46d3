"""Parallel linear branches reading one tensor, summed or concatenated -> one Conv."""

from __future__ import annotations

from ..algebra import Refusal, combine_parallel, concat_parallel, identity_conv
from ..rewrite.primitives import Rewrite, accepts, reach
from .conv_chain import output_dtype
from .convnodes import make_conv, node_flops, spatial_shape
from .linear_nodes import linear_spec


def _branch_spec(tensor, x, context, channels: int | None):
    """x itself (identity) or a linear node reading x."""
    if tensor is x:
        if channels is None:
            return Refusal(f"{x.name}: the channel count of the identity branch is unknown")
        return identity_conv(channels, len(x.shape) - 2)
    return linear_spec(tensor.inputs[0], context.opset)


def _branches(tensors, x, context):
    channels = x.shape[1] if getattr(x, "shape", None) is not None and isinstance(x.shape[1], int) else None
    specs = [_branch_spec(tensor, x, context, channels) for tensor in tensors]
    refusal = next((spec for spec in specs if isinstance(spec, Refusal)), None)
    return refusal, specs


def _flops(tensors, x) -> float | None:
    parts = [0.0 if tensor is x else node_flops(tensor.inputs[0]) for tensor in tensors]
    return None if None in parts else float(sum(parts))


@reach(0)
@accepts("signs")
def sum_branches(match, context) -> Rewrite | Refusal:
    """sum_i sign_i * branch_i(x) -> Conv'(x); `with: {signs: [...]}` (default all +1)."""
    root, x = match.root, match.values["x"]
    tensors = list(root.inputs)
    signs = [float(s) for s in context.params.get("signs", [1.0] * len(tensors))]
    refusal, specs = _branches(tensors, x, context)
    if refusal:
        return refusal
    merged = combine_parallel(specs, signs, spatial_shape(x))
    if isinstance(merged, Refusal):
        return merged
    return _replace_root(
        match, context, merged, tensors, specs, f"{root.op} of {len(specs)} branches merged into one Conv"
    )


@reach(0)
def concat_branches(match, context) -> Rewrite | Refusal:
    """Concat(branch_1(x), ..., branch_n(x), axis=1) -> Conv'(x) with the kernels stacked."""
    x = match.values["x"]
    tensors = list(match.values["parts"])
    refusal, specs = _branches(tensors, x, context)
    if refusal:
        return refusal
    merged = concat_parallel(specs, spatial_shape(x))
    if isinstance(merged, Refusal):
        return merged
    return _replace_root(
        match, context, merged, tensors, specs, f"Concat of {len(specs)} branches merged into one Conv"
    )


def _replace_root(match, context, merged, tensors, specs, note) -> Rewrite:
    output = match.root.outputs[0]
    node, folded = make_conv(context, match.values["x"], merged, output_dtype(match.root), output.name, output.shape)
    return Rewrite([node], [(output, folded)], note, _flops(tensors, match.values["x"]), node_flops(node, output.shape))
