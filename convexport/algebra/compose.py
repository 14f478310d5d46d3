"""second(first(x)) as one conv: the composite kernel, its geometry, and when it is exact.

Per axis, first reads x[s1*i - a1 + d1*t] and second reads h[s2*j - a2 + d2*u], so the
composite reads x[s1*s2*j - (s1*a2 + a1) + s1*d2*u + d1*t]: stride S = s1*s2, begin pad
A = s1*a2 + a1, and tap offsets r = s1*d2*u + d1*t on a grid of dilation D, the gcd of the
steps that occur (s1*d2 when k2 > 1, d1 when k1 > 1). The end pad E = s1*e2 + e1 reproduces
second's output length for EVERY input length: with c = a + e - d*(k-1) - 1 per conv,
floor((floor((L + c1)/s1) + 1 + c2)/s2) = floor((L + c1 + s1*(1 + c2))/(s1*s2)) and
c1 + s1*(1 + c2) = A + E - (D*(K-1) + 1). So the composite never depends on the input shape;
only its exactness at the border does (padding_reads.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import padding_reads
from .spec import AxisGeometry, ConvSpec, Refusal, known, spatial_lengths

# A bias of the first conv read through the second's zero padding is exact only with a
# constant correction map added to the output ([O, *out], float32); it is used when at most
# this many bytes (a 64x128x128 map), so a fold never trades compute for a large tensor.
DEFAULT_BORDER_LIMIT_BYTES = 4 << 20


@dataclass(frozen=True, eq=False, repr=False)
class Composition:
    """second(first(x)) == spec(x) + border, border [O, *out] (float64) or None."""

    spec: ConvSpec
    border: np.ndarray | None

    def __repr__(self) -> str:
        border = None if self.border is None else list(self.border.shape)
        return f"Composition({self.spec!r}, border={border})"


@dataclass(frozen=True)
class ComposedAxis:
    geometry: AxisGeometry
    step_first: int  # index step in the composite kernel between taps t of first: d1 / D
    step_second: int  # index step between taps u of second: s1*d2 / D


def compose_axis(first: AxisGeometry, second: AxisGeometry) -> ComposedAxis:
    """Stride s1*s2, pads (s1*a2 + a1, s1*e2 + e1), dilation D, K = (s1*d2*(k2-1) + d1*(k1-1))/D + 1."""
    step_second = first.stride * second.dilation if second.kernel > 1 else 0
    step_first = first.dilation if first.kernel > 1 else 0
    dilation = math.gcd(step_second, step_first) or 1
    kernel = (step_second * (second.kernel - 1) + step_first * (first.kernel - 1)) // dilation + 1
    geometry = AxisGeometry(
        kernel,
        first.stride * second.stride,
        dilation,
        first.stride * second.pad_begin + first.pad_begin,
        first.stride * second.pad_end + first.pad_end,
    )
    return ComposedAxis(geometry, max(1, step_first // dilation), max(1, step_second // dilation))


def _compose_kernel(first: ConvSpec, second: ConvSpec, axes: Sequence[ComposedAxis]) -> np.ndarray:
    """K[o, c, r] = sum over (u, t) with r = u*step_second + t*step_first of
    W2[o, :, u] @ W1[:, c, t]; W1 [M, I, *k1], W2 [O, M, *k2] -> K [O, I, *K]."""
    kernel = np.zeros((second.out_channels, first.in_channels, *(axis.geometry.kernel for axis in axes)))
    first_diagonal, second_diagonal = _channel_diagonal(first.weight), _channel_diagonal(second.weight)
    for u in np.ndindex(*second.kernel_shape):
        taps = second.weight[(slice(None), slice(None), *u)]  # [O, M]
        if second_diagonal is not None:  # a per-channel scale: O(C) per tap, not O(C^3)
            block = second_diagonal[(slice(None), *u)].reshape(-1, *[1] * (first.weight.ndim - 1)) * first.weight
        elif first_diagonal is not None:
            block = taps.reshape(*taps.shape, *[1] * first.nd) * first_diagonal[None]
        else:
            block = np.tensordot(taps, first.weight, axes=(1, 0))
        window = tuple(
            slice(tap * axis.step_second, tap * axis.step_second + (k1 - 1) * axis.step_first + 1, axis.step_first)
            for tap, axis, k1 in zip(u, axes, first.kernel_shape)
        )
        kernel[(slice(None), slice(None), *window)] += block
    return kernel


def _channel_diagonal(weight: np.ndarray) -> np.ndarray | None:
    """W [C, C, *k] that is zero off the channel diagonal (a depthwise kernel, a per-channel
    scale in dense form) -> its diagonal [C, *k]; None for any other W."""
    if weight.shape[0] != weight.shape[1]:
        return None
    index = np.arange(weight.shape[0])
    diagonal = weight[index, index]
    return diagonal if np.count_nonzero(weight) == np.count_nonzero(diagonal) else None


def active_pairs(first_weight: np.ndarray, second_weight: np.ndarray, second_group: int = 1) -> np.ndarray:
    """[*k2, *k1] bool: whether W2[:, :, u] @ W1[:, :, t] can be nonzero (a middle channel m
    with W2[:, m, u] and W1[m, :, t] both nonzero). W1 [M, I/g1, *k1] (any group: its rows are
    the middle channels), W2 [O, M/g2, *k2] with group g2 (1 for a ConvSpec's dense kernel)."""
    first_taps = np.any(first_weight != 0, axis=1)  # [M, *k1]
    out_channels, per_group = second_weight.shape[:2]
    kernel = second_weight.shape[2:]
    by_group = second_weight.reshape(second_group, out_channels // second_group, per_group, *kernel)
    second_taps = np.any(by_group != 0, axis=1).reshape(second_group * per_group, *kernel)  # [M, *k2]
    return np.tensordot(second_taps.astype(np.float64), first_taps.astype(np.float64), axes=(0, 0)) > 0


def composite_conv(first: ConvSpec, second: ConvSpec) -> ConvSpec:
    """The composite conv of the module docstring, with no check: exact only where compose
    accepts it. W1 [M, I, *k1], W2 [O, M, *k2] -> K [O, I, *K]; bias b2 + sum_u W2[:, :, u] @ b1."""
    axes = [compose_axis(f, s) for f, s in zip(first.axes(), second.axes())]
    return ConvSpec(
        weight=_compose_kernel(first, second, axes),
        bias=second.bias + second.weight.sum(axis=tuple(range(2, second.weight.ndim))) @ first.bias,
        has_bias=first.has_bias or second.has_bias,
        strides=tuple(a.geometry.stride for a in axes),
        dilations=tuple(a.geometry.dilation for a in axes),
        pads_begin=tuple(a.geometry.pad_begin for a in axes),
        pads_end=tuple(a.geometry.pad_end for a in axes),
    )


def compose(
    first: ConvSpec,
    second: ConvSpec,
    input_spatial: Sequence[int | None] | None,
    border_limit_bytes: int = DEFAULT_BORDER_LIMIT_BYTES,
) -> Composition:
    """second(first(x)) as one conv on x, composite_conv(first, second), exact or refused.

    Refused where second reads h's padding while first, evaluated there, would read real x.
    Where it reads padding through a tap with W2[u] @ b1 != 0, the result carries a constant
    border map [O, *out] (static input shape only, at most border_limit_bytes as float32).
    """
    if first.nd != second.nd or first.out_channels != second.in_channels:
        raise ValueError(
            f"cannot chain a {first.nd}-D conv with {first.out_channels} outputs into a "
            f"{second.nd}-D conv with {second.in_channels} inputs"
        )
    lengths = spatial_lengths(input_spatial, first.nd)
    static = known(lengths)
    if static is not None:
        second.output_shape(first.output_shape(static))  # raises for an empty output
    reads = [padding_reads.axis_reads(f, s, length) for f, s, length in zip(first.axes(), second.axes(), lengths)]
    leak = padding_reads.window_leak(reads, active_pairs(first.weight, second.weight))
    if leak is not None:
        axis, u, t = leak
        raise Refusal(
            f"the second conv reads the intermediate's zero padding on spatial axis {axis} where the "
            f"first conv, evaluated there, would read real input (tap {u} of the second, tap {t} of "
            f"the first): not exact"
        )
    bias_taps = np.tensordot(second.weight, first.bias, axes=(1, 0))  # [O, *k2]: W2[:, :, u] @ b1
    border = None
    if padding_reads.bias_through_padding(reads, bias_taps):
        if static is None:
            raise Refusal(
                "the first conv's bias is read through the second conv's zero padding; the correction "
                f"map needs a static spatial shape, and the input's is {lengths}"
            )
        output_shape = second.output_shape(first.output_shape(static))
        size = padding_reads.border_bytes(second.out_channels, output_shape)
        if size > border_limit_bytes:
            raise Refusal(
                f"the first conv's bias is read through the second conv's zero padding; the correction "
                f"map [{second.out_channels}, {', '.join(map(str, output_shape))}] would take {size} "
                f"bytes, over the limit of {border_limit_bytes}"
            )
        border = padding_reads.border_map(first.axes(), second.axes(), static, bias_taps)
        border = border if np.any(border) else None
    spec = composite_conv(first, second)
    return Composition(spec, border)
