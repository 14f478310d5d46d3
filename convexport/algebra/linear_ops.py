"""Linear ops that are convs, and per-channel affine maps folded into a conv.

Identity, AveragePool and a zero Pad become ConvSpecs of their own; BatchNormalization and
per-channel Mul / Add after a conv rescale and shift it, before a conv only where exact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from .spec import ConvSpec, Refusal, spatial_lengths


def _per_channel(value, channels: int, name: str) -> np.ndarray:
    """A scalar or [C] value as a float64 [C] vector."""
    vector = np.asarray(value, dtype=np.float64)
    if vector.ndim == 0:
        return np.full(channels, float(vector))
    if vector.shape != (channels,):
        raise ValueError(f"{name} must be a scalar or [{channels}], got shape {vector.shape}")
    return vector


def identity_conv(channels: int, nd: int) -> ConvSpec:
    """x itself: a 1x..x1 one-hot kernel W[o, c] = (o == c), stride 1, no pads, no bias."""
    weight = np.eye(channels).reshape(channels, channels, *[1] * nd)
    return ConvSpec(weight, np.zeros(channels), False, (1,) * nd, (1,) * nd, (0,) * nd, (0,) * nd)


def avgpool_as_conv(
    channels: int,
    kernel_shape: Sequence[int],
    strides: Sequence[int],
    pads_begin: Sequence[int],
    pads_end: Sequence[int],
    count_include_pad: bool,
    ceil_mode: bool,
    input_spatial: Sequence[int | None] | None,
) -> ConvSpec:
    """AveragePool as a depthwise conv: W[c, c, *k] = 1/prod(k), zero elsewhere ([C, C, *k]).

    Exact when every window divides by prod(k): refused for count_include_pad=0 with pads
    (border windows divide by fewer), and for ceil_mode=1 where it adds a partial last window
    (the output length differs from the floor formula, or it is unknown and the stride > 1).
    """
    nd = len(kernel_shape)
    if not count_include_pad and (any(pads_begin) or any(pads_end)):
        raise Refusal(
            "AveragePool with count_include_pad=0 and pads divides border windows by fewer than "
            "prod(kernel) elements: not a conv"
        )
    if ceil_mode:
        for axis, (k, s, a, e, length) in enumerate(
            zip(kernel_shape, strides, pads_begin, pads_end, spatial_lengths(input_spatial, nd))
        ):
            if s > 1 and (length is None or (length + a + e - k) % s):
                raise Refusal(
                    f"AveragePool ceil_mode=1 adds a partial window on spatial axis {axis} "
                    f"(input length {length}, kernel {k}, stride {s}, pads {a}+{e})"
                )
    weight = np.zeros((channels, channels, *kernel_shape))
    weight[np.arange(channels), np.arange(channels)] = 1.0 / float(np.prod(kernel_shape))
    return ConvSpec(weight, np.zeros(channels), False, tuple(strides), (1,) * nd, tuple(pads_begin), tuple(pads_end))


def merge_zero_pad(spec: ConvSpec, pad_begin_spatial: Sequence[int], pad_end_spatial: Sequence[int]) -> ConvSpec:
    """conv(ZeroPad(x)) as one conv: pads (a + p_begin, e + p_end). Refused for negative pads,
    which crop x: the conv would then read real values where it read cropped-away zeros."""
    begin, end = tuple(int(p) for p in pad_begin_spatial), tuple(int(p) for p in pad_end_spatial)
    if len(begin) != spec.nd or len(end) != spec.nd:
        raise ValueError(f"{spec.nd}-D conv given pads {begin}, {end}")
    if min(begin + end) < 0:
        raise Refusal(f"the Pad crops (negative pads {begin}, {end}); a conv's pads cannot crop")
    return dataclasses.replace(
        spec,
        pads_begin=tuple(a + p for a, p in zip(spec.pads_begin, begin)),
        pads_end=tuple(e + p for e, p in zip(spec.pads_end, end)),
    )


def scale_shift_after(spec: ConvSpec, scale, shift) -> ConvSpec:
    """scale * conv(x) + shift per output channel: W'[o] = scale[o] * W[o] ([O, I, *k]),
    b' = scale * b + shift ([O]); scale, shift scalars or [O] (scale_shift_onnx_weight on the
    dense kernel, whose bias is always there, zero when the conv had none)."""
    weight, bias = scale_shift_onnx_weight(spec.weight, spec.bias, scale, shift)
    assert bias is not None, "a ConvSpec always holds a bias array"
    return dataclasses.replace(spec, weight=weight, bias=bias, has_bias=spec.has_bias or bool(np.any(shift)))


def scale_shift_onnx_weight(weight, bias, scale, shift) -> tuple[np.ndarray, np.ndarray | None]:
    """scale_shift_after on an ONNX Conv's own weight: W [O, I/g, *k] (any group count g),
    bias [O] or None -> W'[o] = scale[o] * W[o], b' = scale * b + shift (float64; None when
    there was no bias and the shift is zero). Each output channel o is one group's sum over
    its own inputs and taps, so scaling it scales that row alone: the group, strides,
    dilations and pads stay, and nothing is expanded to a dense [O, I, *k] kernel (a 2048-channel
    depthwise 7x7 conv would be 1.6 GB of float64)."""
    weight = np.asarray(weight, dtype=np.float64)
    out_channels = weight.shape[0]
    scale = _per_channel(scale, out_channels, "scale")
    shift = _per_channel(shift, out_channels, "shift")
    scaled = weight * scale.reshape(-1, *[1] * (weight.ndim - 1))
    if bias is None and not np.any(shift):
        return scaled, None
    base = np.zeros(out_channels) if bias is None else np.asarray(bias, dtype=np.float64).reshape(-1)
    return scaled, scale * base + shift


def scale_shift_before(spec: ConvSpec, scale, shift) -> ConvSpec:
    """conv(scale * x + shift) per input channel: W'[:, c] = W[:, c] * scale[c] ([O, I, *k]),
    b' = b + sum_{c, taps} W[o, c, taps] * shift[c] ([O]); scale, shift scalars or [I].

    The shift is exact only where the conv reads no zero padding (it reads 0 there, not
    shift), so a nonzero shift before a conv with pads is refused.
    """
    scale = _per_channel(scale, spec.in_channels, "scale")
    shift = _per_channel(shift, spec.in_channels, "shift")
    if np.any(shift) and (any(spec.pads_begin) or any(spec.pads_end)):
        raise Refusal(
            f"a shift before the conv would be read through its zero padding (pads {spec.pads_begin}, "
            f"{spec.pads_end}), where the shifted input is not zero: not exact"
        )
    weight = spec.weight * scale.reshape(1, -1, *[1] * spec.nd)
    bias = spec.bias + spec.weight.sum(axis=tuple(range(2, spec.weight.ndim))) @ shift
    return dataclasses.replace(spec, weight=weight, bias=bias, has_bias=spec.has_bias or bool(np.any(shift)))


def batchnorm_scale_shift(gamma, beta, mean, var, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """BatchNormalization at inference as y = scale * x + shift:
    scale = gamma / sqrt(var + eps), shift = beta - mean * scale (all [C], float64)."""
    gamma, beta, mean, var = (np.asarray(v, dtype=np.float64) for v in (gamma, beta, mean, var))
    scale = gamma / np.sqrt(var + eps)
    return scale, beta - mean * scale
