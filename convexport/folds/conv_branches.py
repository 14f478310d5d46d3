"""Parallel linear branches reading one tensor, summed or concatenated -> one Conv."""

from __future__ import annotations

from ..algebra import Refusal, combine_parallel, concat_parallel, conv_to_onnx, identity_conv
from .builder import NodeBuilder, output_dtype
from .convnodes import node_flops, output_elements, spatial_shape
from .half_rounding import keep_if_rounding_allows, stored_half
from .linear_nodes import linear_spec
from .primitives import Rewrite, accepts, builtin, consumes, reach


def _branch_spec(tensor, x, context, channels: int | None):
    """x itself (identity) or a linear node reading x."""
    if tensor is x:
        if x.shape is not None and len(x.shape) < 3:
            raise Refusal(f"{x.name}: rank {len(x.shape)}, not [N, C, *spatial]", reported=False)
        if channels is None:
            raise Refusal(f"{x.name}: the channel count of the identity branch is unknown")
        return identity_conv(channels, len(x.shape) - 2)
    return linear_spec(tensor.inputs[0], context.opset)


def _branches(tensors, x, context):
    shape = getattr(x, "shape", None)
    channels = shape[1] if shape is not None and len(shape) >= 3 and isinstance(shape[1], int) else None
    return [_branch_spec(tensor, x, context, channels) for tensor in tensors]


def _flops(tensors, x) -> float | None:
    parts = [0.0 if tensor is x else node_flops(tensor.inputs[0]) for tensor in tensors]
    return None if None in parts else float(sum(parts))


@builtin
@reach(0)
@accepts("signs")
@consumes("x", every_line=True, root={"Add", "Sub"})
def sum_branches(match, context) -> Rewrite:
    """sum_i sign_i * branch_i(x) -> Conv'(x); `with: {signs: [...]}` (default all +1)."""
    root, x = match.root, match.values["x"]
    tensors = list(root.inputs)
    signs = [float(s) for s in context.params.get("signs", [1.0] * len(tensors))]
    specs = _branches(tensors, x, context)
    merged = combine_parallel(specs, signs, spatial_shape(x))
    half = context.half or stored_half(output_dtype(root))
    keep_if_rounding_allows(specs, signs, [tensor is x for tensor in tensors], merged, spatial_shape(x), half)
    return _replace_root(
        match, context, merged, tensors, specs, f"{root.op} of {len(specs)} branches merged into one Conv"
    )


@builtin
@reach(0)
@consumes("x", "parts", "a?", every_line=True, root={"Concat"})
def concat_branches(match, context) -> Rewrite:
    """Concat(branch_1(x), ..., branch_n(x), axis=1) -> Conv'(x) with the kernels stacked.

    Where the pattern binds `a` (parts[] = Act(a[]), a[] = Linear(x)), each part is one
    elementwise activation of a branch, the same op and attributes for all:
    Concat(act(a_1), ..., act(a_n)) = act(Concat(a_1, ..., a_n)) -> act(Conv'(x)) (SqueezeNet's
    Fire: the 1x1 placed at the centre of the 3x3 window; the cost model weighs the wider kernel)."""
    x = match.values["x"]
    activated = "a" in match.values
    tensors = list(match.values["a"] if activated else match.values["parts"])
    activations = [part.inputs[0] for part in match.values["parts"]] if activated else []
    if activations and len({(node.op, repr(sorted(node.attrs.items()))) for node in activations}) > 1:
        raise Refusal("the parts' activations differ in their attributes", reported=False)
    specs = _branches(tensors, x, context)
    merged = concat_parallel(specs, spatial_shape(x))
    note = f"Concat of {len(specs)} branches merged into one Conv"
    return _replace_root(match, context, merged, tensors, specs, note, activations[0] if activations else None)


def _replace_root(match, context, merged, tensors, specs, note, activation=None) -> Rewrite:
    """The root's output from the merged Conv (and, for activated branches, the activation
    once after it); FLOPs of the branches (and their activations) against the new nodes'."""
    output, x = match.root.outputs[0], match.values["x"]
    build = NodeBuilder(context, output_dtype(match.root))
    folded = build.conv(x, *conv_to_onnx(merged), base=output.name, shape=output.shape)
    before, after = _flops(tensors, x), node_flops(build.nodes[0], output.shape)
    if activation is not None:
        folded = build.node(activation.op, [folded], activation.attrs, base=output.name + "_act", shape=output.shape)
        note += f" and one {activation.op}"
        elements = output_elements(output.shape)
        before, after = (None, None) if None in (before, after, elements) else (before + elements, after + elements)
    return Rewrite(build.nodes, [(output, folded)], note, before, after)
