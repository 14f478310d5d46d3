"""The smallest kernel computing the same conv: all-zero border taps trimmed, dilation made
as coarse as the nonzero taps allow."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .spec import ConvSpec


def _nonzero_taps(weight: np.ndarray, axis: int) -> np.ndarray:
    """Per tap index along spatial `axis`: whether its weight slice has a nonzero entry. The
    channels are reduced first, as one leading axis: one pass over the weight, where reducing
    all the other axes at once makes numpy walk it with strides."""
    taps = np.any(weight.reshape(-1, *weight.shape[2:]) != 0, axis=0)  # [*k]
    return np.any(taps, axis=tuple(i for i in range(taps.ndim) if i != axis))


def trim_zero_taps(spec: ConvSpec) -> ConvSpec:
    """The same conv without all-zero border taps, where the pads allow.

    Removing a leading tap (index 0) turns a into a - d, keeping the reads x[s*i - a + d*t]
    of the other taps; removing a trailing one turns e into e - d. Both keep
    `a + e - d*(k-1)`, hence the output length. A tap is removed only while its pad stays
    >= 0 and at least one tap remains.
    """
    weight, begin, end = spec.weight, list(spec.pads_begin), list(spec.pads_end)
    for axis in range(spec.nd):
        nonzero, dilation = _nonzero_taps(weight, axis), spec.dilations[axis]
        first, last = 0, len(nonzero) - 1
        while first < last and not nonzero[first] and begin[axis] >= dilation:
            first, begin[axis] = first + 1, begin[axis] - dilation
        while last > first and not nonzero[last] and end[axis] >= dilation:
            last, end[axis] = last - 1, end[axis] - dilation
        if (first, last) != (0, len(nonzero) - 1):
            weight = np.take(weight, np.arange(first, last + 1), axis=axis + 2)
    if weight is spec.weight:
        return spec
    return dataclasses.replace(spec, weight=weight, pads_begin=tuple(begin), pads_end=tuple(end))


def coarsen_dilation(spec: ConvSpec) -> ConvSpec:
    """The same conv with dilation d*g and every g-th tap, g the gcd of the nonzero tap indices
    and of k-1 along each axis (the skipped taps are all zero; the span d*(k-1) is unchanged).
    An axis with a single tap gets dilation 1."""
    weight, dilations = spec.weight, list(spec.dilations)
    for axis in range(spec.nd):
        kernel = weight.shape[axis + 2]
        if kernel == 1:
            dilations[axis] = 1
            continue
        step = math.gcd(kernel - 1, *np.flatnonzero(_nonzero_taps(weight, axis)).tolist())
        if step > 1:
            weight = np.take(weight, np.arange(0, kernel, step), axis=axis + 2)
            dilations[axis] *= step
    if weight is spec.weight and tuple(dilations) == spec.dilations:
        return spec
    return dataclasses.replace(spec, weight=weight, dilations=tuple(dilations))


def normalize_taps(spec: ConvSpec) -> ConvSpec:
    """trim_zero_taps, then coarsen_dilation: the fewest taps that compute `spec` exactly."""
    return coarsen_dilation(trim_zero_taps(spec))
