"""Where second(first(x)) reads the intermediate h's zero padding, and what that costs.

The composite conv of compose.py evaluates first's formula at every position p of h that
second reads, also outside [0, L1) where h is really zero. With first's taps t reading
q = s1*p - a1 + d1*t, that is exact for the pair (tap u of second, tap t of first) when every
such padded p has q outside [0, L) too (x is zero there). A position of the N-D grid is in
the padding when ANY axis is out of range, and x is read there only when EVERY axis of q is in
range, so the check is done per axis and combined over the N-D pairs of taps.

First's bias b1 is added at every p, so where second reads padding through a tap u with
W2[u] @ b1 != 0 the composite is off by a constant map over the output grid: border_map.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .spec import AxisGeometry


@dataclass(frozen=True)
class AxisReads:
    """One axis of second(first(x)), over every input length considered."""

    leaks: np.ndarray  # [k2, k1] bool: an output reads padded p via u while q (tap t) is inside x
    reaches: np.ndarray  # [k2, k1] bool: an output's path through (u, t) lands inside x
    pads_read: np.ndarray  # [k2] bool: an output reads h's padding through tap u


def _paths(first: AxisGeometry, second: AxisGeometry, length: int) -> tuple[np.ndarray, np.ndarray]:
    """For outputs j of second, taps u of second and t of first, at input length L:
    (p = s2*j - a2 + d2*u inside [0, L1) as [N2, k2], q = s1*p - a1 + d1*t inside [0, L) as
    [N2, k2, k1])."""
    inner = first.output_length(length)
    j = np.arange(second.output_length(inner))[:, None]
    p = second.stride * j - second.pad_begin + second.dilation * np.arange(second.kernel)[None, :]
    q = first.stride * p[..., None] - first.pad_begin + first.dilation * np.arange(first.kernel)
    return (p >= 0) & (p < inner), (q >= 0) & (q < length)


def lengths_to_check(first: AxisGeometry, second: AxisGeometry, length: int | None) -> Sequence[int]:
    """The input lengths whose reads represent every input length: L itself when known; else
    every valid L from the smallest up to where the begin side no longer changes (L past both
    spans) and the end side repeats with period s1*s2, plus one more period."""
    if length is not None:
        return (length,)
    start = first.min_input_length()
    while second.output_length(first.output_length(start)) < 1:
        start += 1
    period = first.stride * second.stride
    extent = (
        first.stride * (second.span + second.pad_begin + second.pad_end) + first.span + first.pad_begin + first.pad_end
    )
    return range(start, start + extent + period * (second.pad_begin + second.pad_end + 4))


def axis_reads(first: AxisGeometry, second: AxisGeometry, length: int | None) -> AxisReads:
    """Which tap pairs of this axis read h's padding where x is real, over lengths_to_check."""
    leaks = np.zeros((second.kernel, first.kernel), dtype=bool)
    reaches = np.zeros_like(leaks)
    pads_read = np.zeros(second.kernel, dtype=bool)
    for value in lengths_to_check(first, second, length):
        inside_h, inside_x = _paths(first, second, value)
        leaks |= np.any(~inside_h[..., None] & inside_x, axis=0)
        reaches |= np.any(inside_x, axis=0)
        pads_read |= np.any(~inside_h, axis=0)
    return AxisReads(leaks, reaches, pads_read)


def _along(vector: np.ndarray, axis: int, nd: int) -> np.ndarray:
    """A 1-D array reshaped to lie along `axis` of an nd-D broadcast."""
    return vector.reshape([-1 if i == axis else 1 for i in range(nd)])


def _on_axis(values: np.ndarray, axis: int, nd: int) -> np.ndarray:
    """[k2_axis, k1_axis] reshaped to broadcast over the N-D pairs [*k2, *k1]."""
    shape = [1] * (2 * nd)
    shape[axis], shape[nd + axis] = values.shape
    return values.reshape(shape)


def window_leak(reads: Sequence[AxisReads], active: np.ndarray) -> tuple[int, tuple, tuple] | None:
    """The first (axis, u, t) where an active N-D tap pair reads h's padding on `axis` while
    first's tap t reads real x on every axis; None when the composite is exact there.
    active [*k2, *k1] marks the pairs whose product W2[:, :, u] @ W1[:, :, t] can be nonzero."""
    nd = len(reads)
    reaches = [_on_axis(r.reaches, axis, nd) for axis, r in enumerate(reads)]
    for axis, r in enumerate(reads):
        leak = active & _on_axis(r.leaks, axis, nd)
        for other in range(nd):
            if other != axis:
                leak = leak & reaches[other]
        if np.any(leak):
            pair = tuple(int(i) for i in np.argwhere(leak)[0])
            return axis, pair[:nd], pair[nd:]
    return None


def bias_through_padding(reads: Sequence[AxisReads], bias_taps: np.ndarray) -> bool:
    """Whether second reads h's padding on some axis through a tap u whose W2[:, :, u] @ b1,
    given as bias_taps [O, *k2], is nonzero."""
    nd = len(reads)
    read = np.zeros(bias_taps.shape[1:], dtype=bool)
    for axis, r in enumerate(reads):
        read = read | _along(r.pads_read, axis, nd)
    return bool(np.any(read & np.any(bias_taps != 0, axis=0)))


def border_bytes(out_channels: int, output_shape: Sequence[int]) -> int:
    """Bytes of a float32 border map [O, *out]."""
    return 4 * out_channels * int(np.prod(output_shape))


def border_map(
    first: Sequence[AxisGeometry], second: Sequence[AxisGeometry], lengths: Sequence[int], bias_taps: np.ndarray
) -> np.ndarray:
    """B[o, j] = -sum over taps u of second with p(j, u) outside [0, L1)^n of bias_taps[o, u].

    bias_taps [O, *k2] is W2[:, :, u] @ b1. The composite conv adds first's bias b1 at every
    position second reads; the original adds nothing where h is padding, so B (shape
    [O, *out]) added to the composite's output makes it exact.
    """
    nd = len(lengths)
    inside = [_paths(f, s, length)[0] for f, s, length in zip(first, second, lengths)]
    border = np.zeros((bias_taps.shape[0], *(mask.shape[0] for mask in inside)))
    for u in zip(*np.nonzero(np.any(bias_taps != 0, axis=0))):
        inside_u = np.ones(border.shape[1:], dtype=bool)
        for axis, (mask, tap) in enumerate(zip(inside, u)):
            inside_u = inside_u & _along(mask[:, tap], axis, nd)
        border -= bias_taps[(slice(None), *u)].reshape(-1, *[1] * nd) * ~inside_u
    return border
