"""The built-in primitives that rule files name in `apply:`.

    forward_input      the root's output is its first input
    drop_whole_slice   y = Slice(x, ...) that keeps all of x -> x
    drop_neutral_constant   y = x + 0, x - 0, x * 1, x / 1 -> x
    drop_empty_pad     y = Pad(x, zeros) -> x
    drop_same_shape_reshape  y = Reshape(x) of x's own shape -> x
    merge_reshapes     y = Reshape(Reshape(x, s1), s2) -> Reshape(x, s2)
    merge_transposes   y = Transpose(Transpose(x)) -> one Transpose, or x
    drop_identity_transpose  y = Transpose(x) keeping every axis -> x
    slices_as_split    parts[] = Slice(x) cutting one axis into consecutive parts -> one Split
    compose_linear     h = first(x); y = second(h)  ->  one Conv of x (names: h, root)
    compose_conv_transpose   h = ConvTranspose(x); y = affine or pointwise Conv(h) -> one ConvTranspose
    affine_into_concat_parts y = affine(Concat(*parts)) -> Concat of the parts' Convs with it folded in
    sum_branches       y = Add/Sub(branch(x), branch(x)) -> one Conv (names: x; with: signs)
    concat_branches    y = Concat(*parts), parts[] = branch(x) -> one Conv (names: x, parts)
    linear_of_constant_map   h = Add(t, m:const); y = linear(h) -> linear(t) + linear0(m)
    merge_constant_adds      h = Add(t, m1:const); y = Add(h, m2:const) -> t + (m1 + m2)
    flatten_concats          Concat of Concats on one axis -> one Concat
    repeat_as_tile           Concat(x, x, ..., x) -> Tile
    batch_conv_heads         heads[] = Conv(x, ...): identical branches from sibling convs, batched
    batch_gathered_linears   heads[] = Gemm(Gather(x, i[]), ...): per-row linears as one Einsum
    merge_sibling_convs      heads[] = Conv(x, ...) of one geometry, different widths: one Conv and a Split
    batch_split_branches     *parts = Split(x): identical branches after a Split, batched
    conv_as_fft              a large-kernel Conv as an FFT convolution (DFT nodes), cost-gated
    conv_as_separable        a Conv with a low-rank 2-D kernel as a tall conv then a wide conv
    fold_dense_chain         Gemm / MatMul and per-feature affine maps in a row -> one Gemm or MatMul
    sum_dense_branches       y = Add/Sub(dense chain(x), dense chain(x)) -> one (names: x; with: signs)
    fold_linear_region       y = Add/Sub of a region linear in one x (shared intermediates, reshapes) -> one
A branch is x itself or a linear node reading x (Conv, BatchNormalization, per-channel
Mul/Div/Add/Sub, AveragePool, zero Pad): see linear_nodes.py.
"""

from .batch_branches import batch_conv_heads, batch_gathered_linears, batch_split_branches
from .cleanup import drop_empty_pad, drop_neutral_constant, drop_whole_slice, forward_input
from .concat_affine import affine_into_concat_parts
from .concat_ops import flatten_concats, repeat_as_tile
from .constant_maps import linear_of_constant_map, merge_constant_adds
from .conv_branches import concat_branches, sum_branches
from .conv_chain import compose_linear
from .conv_transpose import compose_conv_transpose
from .dense_chain import fold_dense_chain, sum_dense_branches
from .fft_conv import conv_as_fft
from .layout import (
    drop_identity_transpose,
    drop_same_shape_reshape,
    merge_reshapes,
    merge_transposes,
    slices_as_split,
)
from .linear_region import fold_linear_region
from .separable import conv_as_separable
from .sibling_convs import merge_sibling_convs

REGISTRY = {
    "forward_input": forward_input,
    "drop_whole_slice": drop_whole_slice,
    "drop_neutral_constant": drop_neutral_constant,
    "drop_empty_pad": drop_empty_pad,
    "drop_same_shape_reshape": drop_same_shape_reshape,
    "merge_reshapes": merge_reshapes,
    "merge_transposes": merge_transposes,
    "drop_identity_transpose": drop_identity_transpose,
    "slices_as_split": slices_as_split,
    "compose_linear": compose_linear,
    "compose_conv_transpose": compose_conv_transpose,
    "sum_branches": sum_branches,
    "concat_branches": concat_branches,
    "affine_into_concat_parts": affine_into_concat_parts,
    "linear_of_constant_map": linear_of_constant_map,
    "merge_constant_adds": merge_constant_adds,
    "flatten_concats": flatten_concats,
    "repeat_as_tile": repeat_as_tile,
    "batch_conv_heads": batch_conv_heads,
    "batch_gathered_linears": batch_gathered_linears,
    "batch_split_branches": batch_split_branches,
    "merge_sibling_convs": merge_sibling_convs,
    "conv_as_fft": conv_as_fft,
    "conv_as_separable": conv_as_separable,
    "fold_dense_chain": fold_dense_chain,
    "sum_dense_branches": sum_dense_branches,
    "fold_linear_region": fold_linear_region,
}


def builtin_primitives() -> dict:
    """The built-in primitives by the name rule files give them (a copy: a caller may add its own)."""
    return dict(REGISTRY)
