"""Pure-numpy weight algebra of linear convolution structure, exact or refused.

Every fold works on ConvSpec (one Conv: dense float64 kernel, explicit pads) and returns an
exact result or raises a Refusal saying why not; callers cast weights back to the model's dtype.

    spec.py           ConvSpec, Refusal, AxisGeometry (the per-axis read formula)
    onnx_conv.py      ONNX Conv <-> ConvSpec (groups, auto_pad, minimal kernel on the way out)
    groups.py         grouped <-> block-diagonal dense kernels, largest exact group count
    taps.py           trimming all-zero border taps, coarsening the dilation
    compose.py        second(first(x)) as one conv
    outline.py        the shape of that conv from the grouped weights, before it is built
    padding_reads.py  when a composition reads padding: exactness and the border map
    parallel.py       sums and channel concats of convs reading one x
    linear_ops.py     identity, AveragePool, zero Pad, per-channel scale/shift, BatchNorm
    evaluate.py       a ConvSpec applied to a constant array (maps pushed through a conv)
    fft_conv.py       large-kernel convs through the FFT: the plan and its cost
    batching.py       weight packing for batched branches
    transposed.py     a ConvTranspose and a per-channel or pointwise map after it, as one
"""

from .compose import DEFAULT_BORDER_LIMIT_BYTES, Composition, compose
from .evaluate import apply_conv
from .groups import largest_group_count
from .linear_ops import (
    avgpool_as_conv,
    batchnorm_scale_shift,
    identity_conv,
    merge_zero_pad,
    scale_shift_after,
    scale_shift_before,
    scale_shift_onnx_weight,
)
from .onnx_conv import conv_from_onnx, conv_to_onnx
from .parallel import combine_parallel, concat_parallel
from .spec import AxisGeometry, ConvSpec, Refusal
from .transposed import pointwise_after_transposed, scale_shift_transposed

__all__ = [
    "AxisGeometry",
    "Composition",
    "apply_conv",
    "ConvSpec",
    "DEFAULT_BORDER_LIMIT_BYTES",
    "Refusal",
    "avgpool_as_conv",
    "batchnorm_scale_shift",
    "combine_parallel",
    "compose",
    "concat_parallel",
    "conv_from_onnx",
    "conv_to_onnx",
    "identity_conv",
    "largest_group_count",
    "merge_zero_pad",
    "pointwise_after_transposed",
    "scale_shift_after",
    "scale_shift_before",
    "scale_shift_onnx_weight",
    "scale_shift_transposed",
]
