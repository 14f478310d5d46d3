"""A ConvTranspose followed by a map that acts on each output position alone, as one ConvTranspose.

ONNX ConvTranspose with weight W [Cin, Cout/G, *k], G groups and bias b [Cout] writes output
channel o = g*(Cout/G) + j from the input channels of group g (ci // (Cin/G) == g) only:

    z[o] = sum_{ci in g} sum_t W[ci, j, t] * x[ci] placed at stride * position + dilation * t,  + b[o]

A map applied to z at every output position on its own commutes with that placement, so it
moves into W and b:

- a per-channel affine map y[o] = s[o] * z[o] + h[o] (BatchNormalization, Mul / Add by a
  per-channel constant):  W'[ci, j] = W[ci, j] * s[g(ci)*(Cout/G) + j],  b' = s * b + h;
  same shape and groups.
- a pointwise Conv y[d] = sum_o V[d, o] z[o] + c[d] (V [D, Cout, 1, ...], one group, stride 1,
  no pads): W'[ci, d, t] = sum_j V[d, g(ci)*(Cout/G) + j] * W[ci, j, t],  b' = V b + c;
  W' is [Cin, D, *k] with one group (the pointwise conv mixes every group's channels).

Positions of z that no input reaches (output_padding, a stride larger than the kernel) hold
b alone, and become s*b + h or V b + c: what the map makes of them too, so both are exact.
"""

from __future__ import annotations

import numpy as np


def scale_shift_transposed(
    weight: np.ndarray, bias: np.ndarray | None, groups: int, scale: np.ndarray, shift: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(W', b') of the module doc's affine case, in float64; weight [Cin, Cout/G, *k], scale and shift [Cout]."""
    cin, per_group = weight.shape[:2]
    out_channel = _output_channel(cin, per_group, groups)  # [Cin, Cout/G]
    factor = scale[out_channel].reshape(cin, per_group, *([1] * (weight.ndim - 2)))
    base = np.zeros(scale.shape) if bias is None else np.asarray(bias, np.float64)
    return np.asarray(weight, np.float64) * factor, scale * base + shift


def pointwise_after_transposed(
    weight: np.ndarray, bias: np.ndarray | None, groups: int, pointwise: np.ndarray, pointwise_bias: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """(W', b') of the module doc's pointwise case, in float64; pointwise is V [D, Cout] (the
    1x1 kernel's spatial dims dropped). b' is None when neither has a bias."""
    cin, per_group = weight.shape[:2]
    out_channel = _output_channel(cin, per_group, groups)  # [Cin, Cout/G]
    pointwise = np.asarray(pointwise, np.float64)
    mixing = pointwise[:, out_channel]  # [D, Cin, Cout/G]
    composed = np.einsum("dcj,cj...->cd...", mixing, np.asarray(weight, np.float64))
    if bias is None and pointwise_bias is None:
        return composed, None
    mixing_bias = np.zeros(pointwise.shape[0]) if bias is None else pointwise @ np.asarray(bias, np.float64)
    return composed, mixing_bias + (0.0 if pointwise_bias is None else np.asarray(pointwise_bias, np.float64))


def _output_channel(cin: int, per_group: int, groups: int) -> np.ndarray:
    """o[ci, j] = g(ci) * (Cout/G) + j: the output channel that weight W[ci, j] writes."""
    group_of_input = np.arange(cin) // (cin // groups)
    return group_of_input[:, None] * per_group + np.arange(per_group)[None, :]
