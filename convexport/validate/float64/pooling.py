"""MaxPool and AveragePool in float64 for ONNX's reference evaluator, whose own ones loop over
the output in Python (most of a float64 run of a model with a few pools: bench/RESULTS.md,
"Measurements behind the code").

The input is padded as ONNX says: `pads` (begin and end may differ) or `auto_pad`, then to the
length ceil_mode's last window reaches, or cut where floor mode's last window ends. Every
window then lies inside it: each output is the max or sum of the taps read there, taken one
tap at a time over a strided view of the whole output (numpy only: torch's pools would make an
ONNX model's validation import torch, which takes longer than the pools).

    MaxPool:     y[i] = max over the window at i of x_pad, x_pad padded with -inf
    AveragePool: y[i] = sum over the window of x_pad (padded with 0) / count[i]

count[i] is the number of the window's positions inside the input (count_include_pad=0) or
inside the input and its declared pads (count_include_pad=1; the extra end that ceil_mode adds is
never counted), as ONNX Runtime counts.

MaxPool's second output (Indices) is left to ONNX's reference implementation.
"""

from __future__ import annotations

import numpy as np
from onnx.reference.ops.op_average_pool import AveragePool_19 as ReferenceAveragePool
from onnx.reference.ops.op_max_pool import MaxPool as ReferenceMaxPool

from .geometry import explicit_pads, pooled_length


class _Windows:
    """The geometry of one pooling: declared pads, output lengths, and the padded extent every
    window lies in."""

    def __init__(self, lengths, kernel, strides, dilations, auto_pad, pads, ceil_mode):
        nd = len(lengths)
        self.kernel = [int(k) for k in kernel]
        self.strides = [int(s) for s in (strides or [1] * nd)]
        self.dilations = [int(d) for d in (dilations or [1] * nd)]
        self.extent = [d * (k - 1) + 1 for d, k in zip(self.dilations, self.kernel)]
        self.lengths = list(lengths)
        self.begin, self.end = explicit_pads(auto_pad, pads, lengths, self.extent, self.strides)
        self.outputs = [
            pooled_length(n, b, e, x, s, bool(ceil_mode))
            for n, b, e, x, s in zip(lengths, self.begin, self.end, self.extent, self.strides)
        ]
        # the padded length the last window reaches: more than the declared pads in ceil mode,
        # less where floor mode leaves part of them unread
        self.padded = [(o - 1) * s + x for o, s, x in zip(self.outputs, self.strides, self.extent)]

    def pad(self, x: np.ndarray, fill: float) -> np.ndarray:
        """x padded with `fill` to exactly the extent the windows read."""
        tails = [p - n - b for p, n, b in zip(self.padded, self.lengths, self.begin)]
        widths = [(0, 0), (0, 0), *[(b, max(t, 0)) for b, t in zip(self.begin, tails)]]
        padded = np.pad(x, widths, constant_values=fill)
        return padded[(slice(None), slice(None), *(slice(0, p) for p in self.padded))]

    def counted(self, include_pad: bool) -> np.ndarray:
        """1 where a padded position counts toward an average's divisor, else 0: [1, 1, *padded]."""
        axes = []
        for n, b, e, p in zip(self.lengths, self.begin, self.end, self.padded):
            position = np.arange(p) - b
            inside = (position >= -b) & (position < n + e) if include_pad else (position >= 0) & (position < n)
            axes.append(inside.astype(np.float64))
        mask = axes[0]
        for axis in axes[1:]:
            mask = np.multiply.outer(mask, axis)
        return mask.reshape(1, 1, *self.padded)

    def reduce(self, padded: np.ndarray, how: str) -> np.ndarray:
        """max or sum over each window of an already padded array, one window tap at a time
        (a strided view of the whole output per tap: numpy's reduction over a window axis of
        a few taps is 3x slower)."""
        nd = padded.ndim - 2
        combine = np.maximum if how == "max" else np.add
        result = None
        for tap in np.ndindex(*self.kernel):
            view = padded[(slice(None), slice(None), *self._reads(tap))]
            result = view.copy() if result is None else combine(result, view, out=result)
        return result if nd and result is not None else padded

    def _reads(self, tap) -> list[slice]:
        """Where the window's tap `tap` reads, for every output position, per spatial axis."""
        return [
            slice(d * t, d * t + s * (o - 1) + 1, s)
            for d, t, s, o in zip(self.dilations, tap, self.strides, self.outputs)
        ]


class MaxPool(ReferenceMaxPool):
    def _run(self, x, auto_pad=None, ceil_mode=None, dilations=None, kernel_shape=None, pads=None,
             storage_order=None, strides=None):  # fmt: skip
        if len([name for name in self.onnx_node.output if name]) > 1 or x.dtype.kind != "f":
            return super()._run(x, auto_pad, ceil_mode, dilations, kernel_shape, pads, storage_order, strides)
        windows = _Windows(x.shape[2:], kernel_shape, strides, dilations, auto_pad, pads, ceil_mode)
        return (windows.reduce(windows.pad(x, -np.inf), "max").astype(x.dtype),)


class AveragePool(ReferenceAveragePool):
    def _run(self, x, auto_pad=None, ceil_mode=None, count_include_pad=None, dilations=None, kernel_shape=None,
             pads=None, strides=None):  # fmt: skip
        windows = _Windows(x.shape[2:], kernel_shape, strides, dilations, auto_pad, pads, ceil_mode)
        sums = windows.reduce(windows.pad(x, 0.0), "sum")
        counts = windows.reduce(windows.counted(bool(count_include_pad)), "sum")
        with np.errstate(invalid="ignore", divide="ignore"):
            return ((sums / counts).astype(x.dtype),)
