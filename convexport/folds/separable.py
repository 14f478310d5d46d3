"""A Conv whose 2-D kernel has low rank as a tall conv then a wide conv: algebra/separable.py."""

from __future__ import annotations

from ..algebra import Refusal
from ..algebra.separable import NoSplit, split_separable
from ..rewrite.primitives import Rewrite, reach
from .conv_chain import output_dtype
from .convnodes import conv_flops, conv_spec, make_conv, spatial_shape


@reach(0)
def conv_as_separable(match, context) -> Rewrite | Refusal | None:
    """Conv(x) -> Conv_tall(x) [R, I, Kh, 1] -> Conv_wide [O, R, 1, Kw], when the kernel's rank
    R is low enough that the pair costs fewer FLOPs. None for 1-D/3-D convs, single rows or
    columns, and kernels of full rank."""
    conv = match.root
    weight_shape = conv.inputs[1].shape      # checked before conv_spec, which costs far more
    if conv.attrs.get("group", 1) != 1 or (weight_shape is not None and (len(weight_shape) != 4
                                                                        or 1 in weight_shape[2:])):
        return None
    spec = conv_spec(conv)
    if isinstance(spec, Refusal) or spec.nd != 2 or 1 in spec.kernel_shape:
        return None if not isinstance(spec, Refusal) else spec
    split = split_separable(spec)
    if isinstance(split, NoSplit):       # mostly full rank: most kernels are, no news for the report
        return None
    if isinstance(split, Refusal):       # a split that would not be exact: reported
        return split
    x, output = conv.inputs[0], conv.outputs[0]
    spatial = spatial_shape(x)
    if output.shape is None or spatial is None or None in spatial:
        return Refusal("the input's spatial shape is unknown")
    rows = output.shape[2]
    dtype = output_dtype(conv)
    tall, between = make_conv(context, x, split.tall, dtype, output.name + "_tall")
    wide, result = make_conv(context, between, split.wide, dtype, output.name + "_wide", output.shape)
    before = conv_flops(spec, output.shape)
    after = conv_flops(split.tall, [*output.shape[:2], rows, spatial[1]]) + conv_flops(split.wide, output.shape)
    if after >= before:
        return Refusal(f"rank {split.rank}: the tall and wide convs would cost {after:.3g} FLOPs against {before:.3g}")
    return Rewrite([tall, wide], [(output, result)],
                   f"{'x'.join(map(str, spec.kernel_shape))} kernel of rank {split.rank} split into "
                   f"{spec.kernel_shape[0]}x1 and 1x{spec.kernel_shape[1]} convs", before, after,
                   {"rank": split.rank})
