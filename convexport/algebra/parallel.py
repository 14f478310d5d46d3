"""Parallel convs reading the same x, summed or concatenated over channels, as one conv.

Per axis, branch i reads x[s*j - a_i + d_i*t]. In a common window with begin pad A = max a_i
that is the offset (A - a_i) + d_i*t; the window's dilation D is the gcd of every step d_i
(k_i > 1) and every shift A - a_i, and its span R the largest (A - a_i) + d_i*(k_i - 1) + 1.
Every branch and the merged conv read zeros outside x, so merging is exact whenever all
branches have the same stride and output length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import numpy as np

from .spec import AxisGeometry, ConvSpec, Refusal, known, spatial_lengths


def _check_branches(specs: Sequence[ConvSpec]) -> None:
    """ValueError for branches that cannot read one x; a Refusal when their strides differ."""
    if not specs:
        raise ValueError("no branches to merge")
    if len({(s.nd, s.in_channels) for s in specs}) > 1:
        raise ValueError(
            f"branches reading one x differ in rank or input channels: {[(s.nd, s.in_channels) for s in specs]}"
        )
    if len({s.strides for s in specs}) > 1:
        raise Refusal(f"the branches use different strides {[s.strides for s in specs]}")


def _end_pad(axes: Sequence[AxisGeometry], begin: int, span: int, length: int | None, index: int) -> int:
    """The window's end pad E: the merged output floor((L + A + E - R)/s) + 1 must equal every
    branch's floor((L + c_i)/s) + 1. Equal c_i: E = c + R - A (>= 0, it is the widest branch's
    e_i) serves every L. Else only a static L whose output lengths n agree: the smallest
    E >= 0 reaching s*(n-1) + R - L - A."""
    offsets = {axis.length_offset for axis in axes}
    if len(offsets) == 1:
        return offsets.pop() + span - begin
    if length is None:
        raise Refusal(
            f"the branches' output lengths on spatial axis {index} agree only for some input lengths "
            "(it needs a static spatial shape)"
        )
    outputs = [axis.output_length(length) for axis in axes]
    if len(set(outputs)) > 1:
        raise Refusal(
            f"the branches' output lengths on spatial axis {index} differ ({outputs}): "
            "the result would broadcast, not add"
        )
    return max(0, axes[0].stride * (outputs[0] - 1) + span - length - begin)


def _common_axis(axes: Sequence[AxisGeometry], length: int | None, index: int) -> AxisGeometry:
    """The window on one axis: stride s, begin pad A = max a_i, dilation D, K = (R-1)/D + 1."""
    begin = max(axis.pad_begin for axis in axes)
    steps = [axis.dilation for axis in axes if axis.kernel > 1] + [begin - axis.pad_begin for axis in axes]
    dilation = math.gcd(*steps) or 1
    span = max(begin - axis.pad_begin + axis.span for axis in axes)
    end = _end_pad(axes, begin, span, length, index)
    return AxisGeometry((span - 1) // dilation + 1, axes[0].stride, dilation, begin, end)


def _common_window(specs: Sequence[ConvSpec], input_spatial) -> list[AxisGeometry]:
    _check_branches(specs)
    lengths = spatial_lengths(input_spatial, specs[0].nd)
    static = known(lengths)
    if static is not None:
        for spec in specs:
            spec.output_shape(static)  # raises for an empty output
    window = []
    for index, length in enumerate(lengths):
        axis = _common_axis([spec.axis(index) for spec in specs], length, index)
        window.append(axis)
    return window


def _place(spec: ConvSpec, window: Sequence[AxisGeometry]) -> np.ndarray:
    """W [O, I, *k] -> [O, I, *K] with tap t at index ((A - a) + d*t) / D of each axis."""
    placed = np.zeros((*spec.weight.shape[:2], *(axis.kernel for axis in window)))
    index = []
    for own, axis in zip(spec.axes(), window):
        start, step = (axis.pad_begin - own.pad_begin) // axis.dilation, max(1, own.dilation // axis.dilation)
        index.append(slice(start, start + step * (own.kernel - 1) + 1, step))
    placed[(slice(None), slice(None), *index)] = spec.weight
    return placed


def _merged(window: Sequence[AxisGeometry], weight: np.ndarray, bias: np.ndarray, has_bias: bool) -> ConvSpec:
    return ConvSpec(
        weight,
        bias,
        has_bias,
        strides=tuple(a.stride for a in window),
        dilations=tuple(a.dilation for a in window),
        pads_begin=tuple(a.pad_begin for a in window),
        pads_end=tuple(a.pad_end for a in window),
    )


def combine_parallel(
    specs: Sequence[ConvSpec], signs: Sequence[float], input_spatial: Sequence[int | None] | None
) -> ConvSpec:
    """sum_i signs[i] * conv_i(x) as one conv: W = sum_i signs[i] * W_i placed in the common
    window ([O, I, *K]), b = sum_i signs[i] * b_i ([O])."""
    if len(signs) != len(specs):
        raise ValueError(f"{len(specs)} branches but {len(signs)} signs")
    window = _common_window(specs, input_spatial)
    if len({spec.out_channels for spec in specs}) > 1:
        raise Refusal(
            f"the branches have different output channel counts {[s.out_channels for s in specs]}: "
            "the result would broadcast, not add"
        )
    weight = cast(np.ndarray, sum(float(sign) * _place(spec, window) for spec, sign in zip(specs, signs)))
    bias = cast(np.ndarray, sum(float(sign) * spec.bias for spec, sign in zip(specs, signs)))
    return _merged(window, weight, bias, any(spec.has_bias for spec in specs))


def concat_parallel(specs: Sequence[ConvSpec], input_spatial: Sequence[int | None] | None) -> ConvSpec:
    """Concat(conv_1(x), ..., conv_n(x), axis=1) as one conv: the placed kernels stacked over
    output channels ([sum O_i, I, *K]) and the biases concatenated."""
    window = _common_window(specs, input_spatial)
    weight = np.concatenate([_place(spec, window) for spec in specs], axis=0)
    bias = np.concatenate([spec.bias for spec in specs])
    return _merged(window, weight, bias, any(spec.has_bias for spec in specs))
