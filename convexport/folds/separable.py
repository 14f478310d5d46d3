"""A Conv whose 2-D kernel has low rank as a tall conv then a wide conv: algebra/separable.py."""

from __future__ import annotations

import math

from .. import flops
from ..algebra import Refusal, conv_to_onnx
from ..algebra.separable import rank_at_least, split_separable
from ..ir import constant_value
from .builder import NodeBuilder, output_dtype
from .convnodes import conv_flops, conv_spec, node_flops, spatial_shape
from .primitives import Rewrite, builtin, consumes, reach


@builtin
@reach(0)
@consumes(root={"Conv"})
def conv_as_separable(match, context) -> Rewrite:
    """Conv(x) -> Conv_tall(x) [R, I, Kh, 1] -> Conv_wide [O, R, 1, Kw], when the kernel's rank
    R is low enough that the pair costs a quarter fewer FLOPs or more (highest_paying_rank). An unreported
    Refusal for grouped and 1-D/3-D convs, single rows or columns, and kernels of full rank or
    of a rank too high to pay: most kernels are such, no news for the report."""
    conv = match.root
    weight_shape = conv.inputs[1].shape  # checked before conv_spec, which costs far more
    if conv.attrs.get("group", 1) != 1 or (
        weight_shape is not None and (len(weight_shape) != 4 or 1 in weight_shape[2:])
    ):
        raise Refusal("not an ungrouped conv with a 2-D kernel of two rows and columns or more", reported=False)
    x, output = conv.inputs[0], conv.outputs[0]
    spatial = spatial_shape(x)
    before = None if spatial is None or None in spatial else node_flops(conv)  # the node as it stands
    weight = constant_value(conv.inputs[1])  # group 1: the spec's own kernel
    max_rank = (
        None
        if before is None or weight is None or weight.ndim != 4
        else highest_paying_rank(weight.shape, output.shape, spatial, before)
    )
    # split_separable's screen on the raw weight, before conv_spec's float64 copy: most kernels stop here
    if max_rank is not None and rank_at_least(weight, max_rank + 1):
        raise Refusal(f"the kernel has rank {max_rank + 1} or more; a split pays below it", reported=False)
    spec = conv_spec(conv)
    split = split_separable(spec, max_rank)
    if before is None:
        raise Refusal("the input's spatial shape is unknown")
    dtype = output_dtype(conv)
    build = NodeBuilder(context, dtype)
    between = build.conv(x, *conv_to_onnx(split.tall), base=output.name + "_tall")
    result = build.conv(between, *conv_to_onnx(split.wide), base=output.name + "_wide", shape=output.shape)
    after = conv_flops(split.tall, [*output.shape[:3], spatial[1]]) + conv_flops(split.wide, output.shape)
    return Rewrite(
        build.nodes,
        [(output, result)],
        f"{'x'.join(map(str, spec.kernel_shape))} kernel of rank {split.rank} split into "
        f"{spec.kernel_shape[0]}x1 and 1x{spec.kernel_shape[1]} convs",
        before,
        after,
        {"rank": split.rank},
    )


# A split must save at least this fraction of the conv's FLOPs: one more node and an
# intermediate tensor are not free, and a kernel whose rank only just pays (a 1x1 reduction
# composed with a 3x3 under --strategy all: rank 3M of a [3I, 3O] matrix) would be factored
# for nothing (bench/RESULTS.md, "Measurements behind the code").
SPLIT_SAVING = 0.25


def highest_paying_rank(weight_shape, output_shape, input_spatial, before: float) -> int:
    """The highest rank R at which the pair costs at most (1 - SPLIT_SAVING) of the conv's
    FLOPs (`before`, flops.py's count), for a kernel [O, I, Kh, Kw]: per unit of R and per
    sample of the batch B, the tall conv costs 2 * rows * W_in * I * Kh (its output keeps the
    input's width) and the wide one 2 * O * rows * W_out * Kw, so R * per_rank <
    (1 - SPLIT_SAVING) * before. Those are upper bounds (conv_to_onnx may still trim a
    factor's taps or split it into groups), so a split at this rank or lower always saves that much."""
    (rows, out_width), (out_channels, in_channels, kernel_rows, kernel_cols) = output_shape[2:], weight_shape
    batch = flops.counted(output_shape)[0]
    per_sample = 2.0 * rows * (input_spatial[1] * in_channels * kernel_rows + out_width * out_channels * kernel_cols)
    per_rank = batch * per_sample
    return math.ceil((1.0 - SPLIT_SAVING) * before / per_rank) - 1 if per_rank > 0 else 0
