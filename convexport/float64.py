"""The exact result of a model: the model evaluated in float64.

`as_float64(model)` is the same graph computing in double: every float, float16 and bfloat16
tensor (initializers, Constant nodes and ConstantOfShape values, the graph's inputs, outputs
and value_info, in every subgraph) becomes float64, and every op that makes a float type by
name (Cast, RandomNormal and the like, EyeLike) makes float64 instead. Integer and boolean
tensors stay as they are. The weights are the model's own values, widened exactly; only the
arithmetic changes, so the float64 run is the model's intended function to about 1e-16, the
yardstick both the original's and the optimized graph's float32 runs are measured with
(validate.py).

ONNX Runtime's CPU provider has no double kernel for Conv, ConvTranspose, AveragePool or Erf,
so the float64 graph runs in ONNX's reference evaluator, with Conv replaced by a
numpy implementation (one einsum over sliding windows, every group at once; 4x faster than the
evaluator's own on a 64-channel 3x3 conv), and with the com.microsoft FFT ops convexport writes
(reference_ops.py). What the evaluator cannot run makes the float64 reference unavailable
(Float64Unavailable, with the reason), and validation falls back to comparing float32 runs.
"""

from __future__ import annotations

import string

import numpy as np
import onnx
from numpy.lib.stride_tricks import sliding_window_view
from onnx import numpy_helper
from onnx.reference.op_run import OpRun

from . import flops
from .ir import is_file_backed, proto_scopes, tensor_array

FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
DOUBLE = onnx.TensorProto.DOUBLE
# attributes that name the type an op makes
_TYPE_ATTRIBUTES = {
    "Cast": "to",
    "RandomNormal": "dtype",
    "RandomUniform": "dtype",
    "RandomNormalLike": "dtype",
    "RandomUniformLike": "dtype",
    "EyeLike": "dtype",
    "Bernoulli": "dtype",
    "Multinomial": "dtype",
}


WINDOW_ELEMENTS = 1 << 24  # 128 MiB of float64 windows copied at a time
FFT_TAPS = 121  # a kernel of this many taps (11x11) or more is done through the FFT


class Float64Unavailable(Exception):
    """The model cannot be evaluated in float64 here (the reason in the message)."""


def as_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` computing in float64 (see the module doc)."""
    wide = onnx.ModelProto()
    wide.CopyFrom(model)
    for graph in proto_scopes(wide.graph):
        for index, tensor in enumerate(graph.initializer):
            if tensor.data_type in FLOAT_TYPES:
                graph.initializer[index].CopyFrom(_widened(tensor))
            elif is_file_backed(tensor):  # the reference evaluator reads no file-backed tensor
                graph.initializer[index].CopyFrom(numpy_helper.from_array(tensor_array(tensor), tensor.name))
        for value in (*graph.input, *graph.output, *graph.value_info):
            if value.type.tensor_type.elem_type in FLOAT_TYPES:
                value.type.tensor_type.elem_type = DOUBLE
        for node in graph.node:
            _widen_node(node)
    return wide


def _widened(tensor: onnx.TensorProto) -> onnx.TensorProto:
    return numpy_helper.from_array(tensor_array(tensor).astype(np.float64), tensor.name)


def _widen_node(node: onnx.NodeProto) -> None:
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.TENSOR and attribute.t.data_type in FLOAT_TYPES:
            attribute.t.CopyFrom(_widened(attribute.t))
        elif node.op_type == "Constant" and attribute.name in ("value_float", "value_floats"):
            values = np.array(attribute.f if attribute.name == "value_float" else list(attribute.floats), np.float64)
            attribute.CopyFrom(onnx.helper.make_attribute("value", numpy_helper.from_array(values)))
        elif _TYPE_ATTRIBUTES.get(node.op_type) == attribute.name and attribute.i in FLOAT_TYPES:
            attribute.i = DOUBLE


class Float64Evaluator:
    """The float64 graph of a model in ONNX's reference evaluator: run(feeds) takes the
    model's own feeds (floats widened here) and gives its outputs in float64."""

    def __init__(self, model: onnx.ModelProto):
        from onnx.reference import ReferenceEvaluator

        from .reference_ops import REFERENCE_OPS

        try:
            self._evaluator = ReferenceEvaluator(as_float64(model), new_ops=[Conv, ConvTranspose, *REFERENCE_OPS])
        except Exception as exc:  # an op the evaluator lacks, a type it refuses
            raise Float64Unavailable(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from None

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        wide = {name: value.astype(np.float64) if _is_float(value) else value for name, value in feeds.items()}
        try:
            with np.errstate(all="ignore"):
                return [np.asarray(value) for value in self._evaluator.run(None, wide)]
        except Exception as exc:
            raise Float64Unavailable(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from None


def _is_float(value: np.ndarray) -> bool:
    return value.dtype.kind == "f" or value.dtype.name == "bfloat16"


class ConvTranspose(OpRun):
    """ONNX's reference ConvTranspose run one group at a time, the bias added after: its own
    grouped path gives every group the first group's bias and keeps one output channel per
    group (onnx 1.23: a depthwise ConvTranspose with a bias came out wrong, and validation
    blamed the rewrite that kept it)."""

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


class Conv(OpRun):
    """ONNX Conv (any rank, groups, strides, dilations, pads or auto_pad) as one einsum over the
    input's sliding windows: y[b, g, o, *i] = sum_{c, *t} x_pad[b, g, c, *(s*i + d*t)] w[g, o, c, *t]."""

    op_domain = ""

    def _run(self, x, w, b=None, auto_pad=None, dilations=None, group=None, kernel_shape=None, pads=None, strides=None):
        nd = x.ndim - 2
        kernel = w.shape[2:]
        dilations = list(dilations or [1] * nd)
        strides = list(strides or [1] * nd)
        extent = [d * (k - 1) + 1 for d, k in zip(dilations, kernel)]
        begin, end = _pads(auto_pad, pads, x.shape[2:], extent, strides)
        padded = np.pad(x, [(0, 0), (0, 0), *zip(begin, end)])
        groups = group or 1
        if np.prod(kernel) >= FFT_TAPS:
            y = _conv_by_fft(padded, w, groups, extent, dilations, strides)
            return ((y if b is None else y + b.reshape(1, -1, *[1] * nd)).astype(x.dtype),)
        windows = sliding_window_view(padded, extent, axis=tuple(range(2, 2 + nd)))  # [B, C, *full, *extent]
        windows = windows[
            (
                slice(None),
                slice(None),
                *(slice(None, None, s) for s in strides),
                *(slice(None, None, d) for d in dilations),
            )
        ]  # [B, C, *out, *k]
        batch, channels = x.shape[:2]
        out_shape = windows.shape[2 : 2 + nd]
        weights = w.reshape(groups, w.shape[0] // groups, *w.shape[1:])
        letters = string.ascii_letters[: 2 * nd]
        spatial, taps = letters[:nd], letters[nd:]
        equation = f"BGC{spatial}{taps},GOC{taps}->BGO{spatial}"
        # the windows are a view; the einsum copies them: a block of output rows at a time, so
        # that a copy holds at most WINDOW_ELEMENTS (seed 003's 135x135 taps would take 19 GB)
        row = windows[:, :, :1].size
        rows = max(1, WINDOW_ELEMENTS // max(row, 1))
        parts = []
        for start in range(0, out_shape[0], rows):
            block = windows[:, :, start : start + rows]
            block = block.reshape(batch, groups, channels // groups, *block.shape[2:])
            parts.append(np.einsum(equation, block, weights, optimize=True))
        y = np.concatenate(parts, axis=3).reshape(batch, w.shape[0], *out_shape)
        if b is not None:
            y = y + b.reshape(1, -1, *[1] * nd)
        return (y.astype(x.dtype),)


def conv_work(node: onnx.NodeProto, op: str, shapes: dict) -> float | None:
    """A Conv node's FLOPs as the float64 Conv above does it (through the FFT for a large
    kernel), for estimating the float64 run (stats.node_flops' `count`); None for any other op."""
    weight, source = (shapes.get(node.input[1]), shapes.get(node.input[0])) if op == "Conv" else (None, None)
    if weight is None or source is None or np.prod(weight[2:]) < FFT_TAPS:
        return None
    group = next((a.i for a in node.attribute if a.name == "group"), 1)
    sizes = [1 << (int(n) + int(k) - 1).bit_length() for n, k in zip(source[2:], weight[2:])]
    return flops.fft_convolution(sizes, sizes[-1] // 2 + 1, source[1] // group, weight[0] // group, source[0]) * group


def _conv_by_fft(padded, w, groups: int, extent, dilations, strides) -> np.ndarray:
    """The correlation of `padded` [B, C, *L] with w [O, C/g, *k] through float64 FFTs of
    N >= L points per axis: y = irfft(rfft(x) * conj(rfft(w dilated))) at the outputs that do
    not wrap, every stride-th; its error is about 1e-16 of the terms' size, like the direct
    sum's (seed 003's 135x135 conv: a second a run instead of ten)."""
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


def _pads(auto_pad, pads, lengths, extent, strides) -> tuple[list[int], list[int]]:
    """Begin and end pads per spatial axis, from `pads` or `auto_pad` as ONNX defines them."""
    nd = len(lengths)
    mode = auto_pad.decode() if isinstance(auto_pad, bytes) else (auto_pad or "NOTSET")
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        totals = [max((-(-n // s) - 1) * s + e - n, 0) for n, e, s in zip(lengths, extent, strides)]
        small = [t // 2 for t in totals]
        large = [t - t // 2 for t in totals]
        return (small, large) if mode == "SAME_UPPER" else (large, small)
    if mode == "VALID" or pads is None:
        return [0] * nd, [0] * nd
    return list(pads[:nd]), list(pads[nd:])
