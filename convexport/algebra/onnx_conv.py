"""ONNX Conv (grouped weight, attributes, auto_pad) <-> ConvSpec."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .groups import expand_groups, grouped_weight, largest_group_count
from .spec import AxisGeometry, ConvSpec, Refusal, int_tuple, spatial_lengths
from .taps import normalize_taps


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _same_pads(mode: str, kernel: int, stride: int, dilation: int, length: int | None) -> tuple[int, int] | None:
    """ONNX SAME_UPPER / SAME_LOWER pads for one axis: the output is ceil(L / s) long and the
    total pad max(0, (out-1)*s + d*(k-1) + 1 - L) is split with the odd one at the end (UPPER)
    or the beginning (LOWER). None when L is unknown and matters (s > 1)."""
    if stride == 1:
        total = dilation * (kernel - 1)
    elif length is None:
        return None
    else:
        total = max(0, (-(-length // stride) - 1) * stride + dilation * (kernel - 1) + 1 - length)
    small, large = total // 2, total - total // 2
    return (small, large) if mode == "SAME_UPPER" else (large, small)


def _explicit_pads(attrs: dict, kernel, strides, dilations, lengths) -> tuple[tuple, tuple]:
    """(pads_begin, pads_end) from `pads` or `auto_pad`."""
    nd = len(kernel)
    mode = _text(attrs.get("auto_pad", "NOTSET"))
    if mode == "NOTSET":
        pads = [int(p) for p in attrs.get("pads") or [0] * (2 * nd)]
        if len(pads) != 2 * nd:
            raise ValueError(f"pads {pads} do not have 2*{nd} entries")
        return tuple(pads[:nd]), tuple(pads[nd:])
    if mode == "VALID":
        return (0,) * nd, (0,) * nd
    if mode not in ("SAME_UPPER", "SAME_LOWER"):
        raise Refusal(f"Conv auto_pad {mode!r} is not an ONNX padding mode")
    found = [_same_pads(mode, *args) for args in zip(kernel, strides, dilations, lengths)]
    pairs = [pair for pair in found if pair is not None]
    if len(pairs) != len(found):
        raise Refusal(
            f"Conv auto_pad={mode} with stride > 1 needs the input's static spatial shape, which is {tuple(lengths)}"
        )
    return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)


def conv_from_onnx(weight, bias, attrs: dict, input_spatial: Sequence[int | None] | None) -> ConvSpec:
    """The ConvSpec of an ONNX Conv: weight [O, I/g, *k], bias [O] or None, its attributes
    (group, strides, dilations, pads [b1..bn, e1..en], auto_pad, kernel_shape) and the input's
    spatial shape (None, or None entries, where unknown: SAME_* with stride > 1 needs it)."""
    weight = np.asarray(weight, dtype=np.float64)
    geometry = conv_geometry(weight.shape, attrs, input_spatial)
    dense = expand_groups(weight, int(attrs.get("group", 1)))
    has_bias = bias is not None
    bias = np.zeros(weight.shape[0]) if bias is None else np.asarray(bias, dtype=np.float64).reshape(-1)
    return ConvSpec(
        dense,
        bias,
        has_bias,
        tuple(a.stride for a in geometry),
        tuple(a.dilation for a in geometry),
        tuple(a.pad_begin for a in geometry),
        tuple(a.pad_end for a in geometry),
    )


def conv_geometry(
    weight_shape: Sequence[int], attrs: dict, input_spatial: Sequence[int | None] | None
) -> tuple[AxisGeometry, ...]:
    """The per-axis geometry of an ONNX Conv with weight shape [O, I/g, *k] and these
    attributes (pads resolved from `pads` or `auto_pad`, as conv_from_onnx), weights unread."""
    nd = len(weight_shape) - 2
    kernel = tuple(int(k) for k in weight_shape[2:])
    if nd < 1:
        raise ValueError(f"a Conv weight is [O, I/g, *k], got shape {tuple(weight_shape)}")
    if attrs.get("kernel_shape") is not None and tuple(int(k) for k in attrs["kernel_shape"]) != kernel:
        raise ValueError(f"kernel_shape {attrs['kernel_shape']} does not match weight shape {tuple(weight_shape)}")
    strides = int_tuple("strides", attrs.get("strides") or [1] * nd, nd, 1)
    dilations = int_tuple("dilations", attrs.get("dilations") or [1] * nd, nd, 1)
    pads = _explicit_pads(attrs, kernel, strides, dilations, spatial_lengths(input_spatial, nd))
    begin, end = (int_tuple(name, values, nd, 0) for name, values in zip(("pads_begin", "pads_end"), pads))
    return tuple(AxisGeometry(*axis) for axis in zip(kernel, strides, dilations, begin, end))


def conv_to_onnx(spec: ConvSpec) -> tuple[np.ndarray, np.ndarray | None, dict]:
    """The ONNX Conv computing `spec`: (weight [O, I/g, *k], bias [O] or None, attributes).

    The kernel is first reduced to its fewest taps (taps.normalize_taps), then split into the
    largest exact group count; the bias is left out when the spec had none and it is all zero.
    Attributes are explicit: pads, strides, dilations, group, kernel_shape.
    """
    spec = normalize_taps(spec)
    group = largest_group_count(spec.weight)
    bias = None if not spec.has_bias and not np.any(spec.bias) else spec.bias.copy()
    attrs = {
        "group": group,
        "kernel_shape": list(spec.kernel_shape),
        "strides": list(spec.strides),
        "dilations": list(spec.dilations),
        "pads": [*spec.pads_begin, *spec.pads_end],
    }
    return grouped_weight(spec.weight, group), bias, attrs
