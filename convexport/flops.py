"""The one FLOP count: the report's before/after FLOPs (ir/stats.py), the cost model's per-node
counts (rewrite/cost.py) and the counts the folds give for their rewrites all come from here,
in one unit: operations of the whole tensors, the batch included, a dim that is symbolic,
unknown or negative counted as 1 (a dynamic batch is counted as 1, the same on both sides).

A multiply-add is two operations: Conv, ConvTranspose, Gemm, MatMul and two-operand Einsum
count their products twice; a DFT of N points costs 5 N log2 N (the radix-2 FFT count; a
one-sided transform of real input half of it); every other op one per output element.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

Shape = Sequence[int]


def counted(shape: Sequence) -> tuple[int, ...]:
    """A shape as counted here: a dim that is not a known size >= 0 as 1."""
    return tuple([d if type(d) is int and d >= 0 else 1 for d in shape])


def elements(shape) -> float:
    """One operation per element of a tensor of `shape` (a scalar is one element)."""
    return float(math.prod(counted(shape)))


def conv(output_shape, weight_shape) -> float:
    """A Conv: each output element sums (I/g) * prod(k) products; the weight is [O, I/g, *k]."""
    return 2.0 * elements(output_shape) * float(math.prod(counted(weight_shape)[1:]))


def conv_transpose(input_shape, weight_shape) -> float:
    """A ConvTranspose: each input element scatters (O/g) * prod(k) products; the weight is
    [I, O/g, *k]."""
    return 2.0 * elements(input_shape) * float(math.prod(counted(weight_shape)[1:]))


def matmul(a_shape, output_shape, transposed: bool = False) -> float:
    """A Gemm or MatMul: each output element sums the inner dim's products (A's last dim, its
    first where a Gemm transposes a 2-D A)."""
    a = counted(a_shape)
    inner = a[0] if transposed and len(a) == 2 else a[-1] if a else 1
    return 2.0 * elements(output_shape) * inner


def einsum(equation: str, operand_shapes: Sequence[Shape | None]) -> float:
    """A two-operand Einsum: two operations per product, one product per combination of its
    indices' values; 0 where a shape is unknown or the equation has an ellipsis."""
    operands = equation.replace(" ", "").split("->")[0].split(",")
    sizes: dict[str, int] = {}
    for letters, shape in zip(operands, operand_shapes):
        if shape is None or "." in letters or len(shape) != len(letters):
            return 0.0
        sizes.update(zip(letters, counted(shape)))
    return 2.0 * float(math.prod(sizes.values()))


def dft(points: int, transforms: float, onesided: bool = False) -> float:
    """`transforms` transforms of `points` points: 5 N log2 N each, half for real input."""
    return (2.5 if onesided else 5.0) * transforms * points * math.log2(max(points, 2))


def dft_node(input_shape, output_shape, axis: int) -> float:
    """A DFT node: transforms along `axis` of N points (the longer of the input's and the
    output's length there: a one-sided transform has N/2 + 1 outputs), one per complex output
    point divided by N'; the output's last axis holds (real, imaginary)."""
    if input_shape is None:
        return 0.0
    source, out = counted(input_shape), counted(output_shape)
    if not source or len(source) != len(out):
        return 0.0
    axis %= len(out)
    points = max(source[axis], out[axis])
    return dft(points, math.prod(out[:-1]) / out[axis])


def fft_convolution(sizes: Sequence[int], half: int, in_channels: int, out_channels: int, batch: int) -> float:
    """A convolution done in the frequency domain on transforms of `sizes` points (the last
    axis one-sided: `half` of its points kept): per image, I forward and O inverse real
    transforms of prod(sizes) points, and 8 operations per complex product over I * O * the
    one-sided spectrum's points."""
    points = int(math.prod(sizes))
    transforms = dft(points, in_channels + out_channels, onesided=True)
    products = 8.0 * in_channels * out_channels * points / sizes[-1] * half
    return batch * (transforms + products)


def low_rank_factoring(shape: Shape, width: int) -> float:
    """About what a randomized low-rank SVD of an [m, n] matrix at `width` costs
    (algebra/separable.py's _low_rank_svd): two [m, n] x [n, k] products and a QR and an SVD of
    k-wide matrices, k = min(width, m, n) (the whole SVD's m*n*min(m, n) at full width)."""
    m, n = shape
    k = min(width, m, n)
    return 4.0 * m * n * k + 2.0 * (m + n) * k * k


def node_flops(
    op: str, output_shape, input_shapes: Sequence[Shape | None], attribute: Callable[[str, Any], Any]
) -> float:
    """The count of one node of `op`, from its first output's and its inputs' shapes (None:
    unknown) and its attributes (`attribute(name, default)`; a DFT's axis, whether it is an
    attribute or an input, is "axis"). 0 where a shape it needs is unknown."""
    if output_shape is None:
        return 0.0
    weight = input_shapes[1] if len(input_shapes) > 1 else None
    if op == "Conv":
        return conv(output_shape, weight) if weight is not None else 0.0
    if op == "ConvTranspose":
        source = input_shapes[0] if input_shapes else None
        return conv_transpose(source, weight) if weight is not None and source is not None else 0.0
    if op in ("Gemm", "MatMul"):
        a = input_shapes[0] if input_shapes else None
        if not a:
            return 0.0
        return matmul(a, output_shape, transposed=op == "Gemm" and bool(attribute("transA", 0)))
    if op == "Einsum" and len(input_shapes) == 2:
        return einsum(str(attribute("equation", "")), input_shapes)
    if op == "DFT":
        return dft_node(input_shapes[0] if input_shapes else None, output_shape, int(attribute("axis", 1)))
    return elements(output_shape)
