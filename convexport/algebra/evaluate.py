"""Evaluate a ConvSpec on a float64 array: for constant tensors (border maps) pushed through a conv."""

from __future__ import annotations

import numpy as np

from .spec import ConvSpec


def apply_conv(spec: ConvSpec, x: np.ndarray, with_bias: bool = True) -> np.ndarray:
    """y[n, o, j] = sum_{c, t} W[o, c, t] * x_pad[n, c, s*j - a + d*t] (+ b[o]).

    x [N, I, *L] (zero outside [0, L)), W [O, I, *k] dense -> y [N, O, *out], the ONNX Conv
    formula per spatial axis, computed tap by tap.
    """
    x = np.asarray(x, np.float64)
    if x.ndim != spec.nd + 2 or x.shape[1] != spec.in_channels:
        raise ValueError(f"cannot apply a {spec.nd}-D conv over {spec.in_channels} channels to shape {x.shape}")
    out_shape = spec.output_shape(x.shape[2:])
    padded = np.pad(x, [(0, 0), (0, 0), *zip(spec.pads_begin, spec.pads_end)])
    y = np.zeros((x.shape[0], spec.out_channels, *out_shape))
    for tap in np.ndindex(*spec.kernel_shape):
        window = tuple(
            slice(d * t, d * t + s * (n - 1) + 1, s) for t, s, d, n in zip(tap, spec.strides, spec.dilations, out_shape)
        )
        taps = spec.weight[(slice(None), slice(None), *tap)]  # [O, I]
        y += np.einsum("oi,ni...->no...", taps, padded[(slice(None), slice(None), *window)])
    if with_bias:
        y += spec.bias.reshape(1, -1, *[1] * spec.nd)
    return y
