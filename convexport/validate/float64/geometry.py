"""Where a sliding window reads, as ONNX defines it for Conv and the pooling ops: begin and end
pads per spatial axis (from `pads` or `auto_pad`) and the pooling output's length (ceil_mode
included), shared by the float64 kernels."""

from __future__ import annotations

import math


def attribute_text(value) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "NOTSET")


def explicit_pads(auto_pad, pads, lengths, extent, strides) -> tuple[list[int], list[int]]:
    """Begin and end pads per spatial axis, from `pads` or `auto_pad` (SAME_*: the output is
    ceil(length / stride) long, the odd pad at the end for SAME_UPPER, at the begin for
    SAME_LOWER; VALID: none). `extent` is each axis's dilated window, d * (k - 1) + 1."""
    nd = len(lengths)
    mode = attribute_text(auto_pad)
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        totals = [max((-(-n // s) - 1) * s + e - n, 0) for n, e, s in zip(lengths, extent, strides)]
        small = [t // 2 for t in totals]
        large = [t - t // 2 for t in totals]
        return (small, large) if mode == "SAME_UPPER" else (large, small)
    if mode == "VALID" or pads is None or len(pads) == 0:
        return [0] * nd, [0] * nd
    return [int(p) for p in pads[:nd]], [int(p) for p in pads[nd:]]


def pooled_length(length: int, begin: int, end: int, extent: int, stride: int, ceil_mode: bool) -> int:
    """A pooling output's length along one axis: floor (or ceil) of
    (length + begin + end - extent) / stride, plus one; with ceil_mode a last window that would
    start in the end padding is dropped (ONNX's note since opset 19, ONNX Runtime's and torch's
    rule)."""
    span = length + begin + end - extent
    if not ceil_mode:
        return span // stride + 1
    count = math.ceil(span / stride) + 1
    if (count - 1) * stride >= length + begin:
        count -= 1
    return count
