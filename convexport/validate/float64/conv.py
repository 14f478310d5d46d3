"""Conv and ConvTranspose in float64 for ONNX's reference evaluator.

Conv, on the input padded as ONNX says (begin and end pads may differ), is im2col and a double
matrix product per group (numpy's BLAS); a kernel of FFT_TAPS taps or more goes through float64
FFTs instead (sample_models/seed003_large_kernel.py's 135x135 kernel). Both sum the same
products; their errors are about 1e-16 of the terms' size. torch's float64 convolution was
tried and is slower than either (it has no optimised double path on the CPU; bench/RESULTS.md,
"Measurements behind the code").

ConvTranspose is ONNX's reference one, run one group at a time with the bias added after: its own
grouped path gives every group the first group's bias and keeps one output channel per group
(onnx 1.23).
"""

from __future__ import annotations

import numpy as np
import onnx
from numpy.lib.stride_tricks import sliding_window_view
from onnx.reference.op_run import OpRun

from ... import flops
from .geometry import explicit_pads

WINDOW_ELEMENTS = 1 << 24  # 128 MiB of float64 columns copied at a time
FFT_TAPS = 121  # a kernel of this many taps (11x11) or more is done through the FFT


class Conv(OpRun):
    """y[b, g*O + o, *i] = bias[g*O + o] + sum_{c, *t} x_pad[b, g*C + c, *(s*i + d*t)] w[g*O + o, c, *t]
    for x [B, G*C, *L], w [G*O, C, *k], x_pad x padded as `pads`/`auto_pad` say."""

    op_domain = ""

    def _run(self, x, w, b=None, auto_pad=None, dilations=None, group=None, kernel_shape=None, pads=None, strides=None):
        nd = x.ndim - 2
        kernel = w.shape[2:]
        dilations = list(dilations or [1] * nd)
        strides = list(strides or [1] * nd)
        extent = [d * (k - 1) + 1 for d, k in zip(dilations, kernel)]
        begin, end = explicit_pads(auto_pad, pads, x.shape[2:], extent, strides)
        padded = np.pad(x, [(0, 0), (0, 0), *zip(begin, end)]) if any(begin) or any(end) else x
        groups = group or 1
        if np.prod(kernel) >= FFT_TAPS:
            y = _conv_by_fft(padded, w, groups, extent, dilations, strides)
        else:
            y = _conv_by_columns(padded, w, groups, extent, dilations, strides)
        if b is not None:
            y += b.reshape(1, -1, *[1] * nd)
        return (y.astype(x.dtype, copy=False),)


def _conv_by_columns(padded: np.ndarray, w: np.ndarray, groups: int, extent, dilations, strides) -> np.ndarray:
    """im2col and one matrix product per group: the windows of x_pad as columns
    cols [B, G, C*K, P] (K taps, P output positions), y [B, G, O, P] = w [G, O, C*K] @ cols. A
    1x1 kernel's columns are x itself (no copy); otherwise the copy is made a block of output
    rows at a time, at most WINDOW_ELEMENTS, in the order that reads x's rows contiguously (2.5x
    faster than numpy's einsum over the same windows on yolov9t's convolutions)."""
    nd = padded.ndim - 2
    batch, channels = padded.shape[:2]
    per_group, outputs = channels // groups, w.shape[0] // groups
    kernel = w.shape[2:]
    taps = int(np.prod(kernel))
    weights = np.ascontiguousarray(w.reshape(groups, outputs, per_group * taps))
    if taps == 1:
        sampled = padded[(slice(None), slice(None), *(slice(None, None, s) for s in strides))]
        y = np.matmul(weights, sampled.reshape(batch, groups, per_group, -1))
        return y.reshape(batch, w.shape[0], *sampled.shape[2:])
    windows = sliding_window_view(padded, extent, axis=tuple(range(2, 2 + nd)))  # [B, C, *full, *extent]
    steps = (*(slice(None, None, s) for s in strides), *(slice(None, None, d) for d in dilations))
    windows = windows[(slice(None), slice(None), *steps)]  # [B, C, *out, *k]
    out_shape = windows.shape[2 : 2 + nd]
    # [B, G, C/G, *out, *k] -> [B, G, C/G, *k, *out]
    order = (0, 1, 2, *range(3 + nd, 3 + 2 * nd), *range(3, 3 + nd))
    rows = max(1, WINDOW_ELEMENTS // max(windows[:, :, :1].size, 1))
    parts = []
    for start in range(0, out_shape[0], rows):
        block = windows[:, :, start : start + rows]
        block = block.reshape(batch, groups, per_group, *block.shape[2:]).transpose(order)
        columns = block.reshape(batch, groups, per_group * taps, -1)
        parts.append(np.matmul(weights, columns).reshape(batch, w.shape[0], *block.shape[3 + nd :]))
    return np.concatenate(parts, axis=2)


def _conv_by_fft(padded, w, groups: int, extent, dilations, strides) -> np.ndarray:
    """The correlation of `padded` [B, C, *L] with w [O, C/g, *k] through float64 FFTs of
    N >= L points per axis: y = irfft(rfft(x) * conj(rfft(w dilated))) at the outputs that do
    not wrap, every stride-th."""
    nd = padded.ndim - 2
    lengths = padded.shape[2:]
    sizes = [1 << (n - 1).bit_length() for n in lengths]
    axes = tuple(range(2, 2 + nd))
    dilated = np.zeros((*w.shape[:2], *[d * (k - 1) + 1 for d, k in zip(dilations, w.shape[2:])]))
    dilated[(slice(None), slice(None), *(slice(None, None, d) for d in dilations))] = w
    out_channels, per_group = w.shape[0] // groups, padded.shape[1] // groups
    parts = []
    for g in range(groups):
        signal = np.fft.rfftn(padded[:, g * per_group : (g + 1) * per_group], s=sizes, axes=axes)
        kernel = np.conj(np.fft.rfftn(dilated[g * out_channels : (g + 1) * out_channels], s=sizes, axes=axes))
        product = np.einsum("bc...,oc...->bo...", signal, kernel)
        parts.append(np.fft.irfftn(product, s=sizes, axes=axes))
    full = np.concatenate(parts, axis=1)
    valid = [n - e + 1 for n, e in zip(lengths, extent)]
    return full[(slice(None), slice(None), *(slice(0, v, s) for v, s in zip(valid, strides)))]


def conv_work(node: onnx.NodeProto, op: str, shapes: dict) -> float | None:
    """A Conv node's FLOPs as the float64 Conv above does it (through the FFT for a large
    kernel), for estimating the float64 run (stats.node_flops' `count`); None for any other op."""
    weight, source = (shapes.get(node.input[1]), shapes.get(node.input[0])) if op == "Conv" else (None, None)
    if weight is None or source is None or np.prod(weight[2:]) < FFT_TAPS:
        return None
    group = next((a.i for a in node.attribute if a.name == "group"), 1)
    sizes = [1 << (int(n) + int(k) - 1).bit_length() for n, k in zip(source[2:], weight[2:])]
    return flops.fft_convolution(sizes, sizes[-1] // 2 + 1, source[1] // group, weight[0] // group, source[0]) * group


class ConvTranspose(OpRun):
    """ONNX's reference ConvTranspose one group at a time, the bias added after (module doc)."""

    op_domain = ""

    def _run(self, x, w, b=None, group=None, **attributes):
        from onnx.reference.ops.op_conv_transpose import ConvTranspose as Reference

        group = group or 1
        inputs, outputs = x.shape[1] // group, w.shape[0] // group
        parts = [
            Reference._run(self, x[:, g * inputs : (g + 1) * inputs], w[g * outputs : (g + 1) * outputs], None,
                           group=1, **attributes)[0]
            for g in range(group)
        ]  # fmt: skip
        y = np.concatenate(parts, axis=1)
        if b is not None:
            y = y + b.reshape(1, -1, *([1] * (y.ndim - 2)))
        return (y.astype(x.dtype),)
