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

# each module registers its primitives where it defines them (@builtin, primitives.py)
from . import (  # noqa: F401
    batch_branches,
    cleanup,
    concat_affine,
    concat_ops,
    constant_maps,
    conv_branches,
    conv_chain,
    conv_transpose,
    dense_chain,
    fft_conv,
    layout,
    linear_region,
    separable,
    sibling_convs,
)
from .primitives import BUILTIN


def builtin_primitives() -> dict:
    """The built-in primitives by the name rule files give them (a copy: a caller may add its own)."""
    return dict(BUILTIN)
