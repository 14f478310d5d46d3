"""Random nodes of one op type, for `convexport rules test`.

A sampler gets the node's input slots, some with a shape already fixed by the nodes before
it and some still open, and the attribute values the rule's pattern fixes. It draws the
remaining attributes and a value for every open slot (a weight, a bias, pads, indices, or the
data itself), honouring the pattern's attributes; the instance builder turns each value into
an initializer or a graph input according to the pattern. A sampler raises Reject when the
fixed shapes leave it nothing valid to draw; ONNX shape inference rejects the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .draws import Draws


class Reject(Exception):
    """These choices make no valid instance; hypothesis draws another."""


@dataclass
class Slot:
    shape: tuple[int, ...] | None  # fixed by an earlier node, or None: the sampler draws it
    present: bool = True  # False: an optional input left out


@dataclass
class Draft:
    attrs: dict
    values: list  # per slot: an array for an open, present slot; else None
    outputs: int = 1


Sampler = Callable[[Draws, list[Slot], dict, "int | None"], Draft]


def _pick(fixed: dict, name: str, choose: Callable[[], Any] | None) -> Any:
    """The pattern's value for attribute `name` (a list where the pattern wrote a tuple), or
    choose() (None: the pattern is known to fix it)."""
    if name not in fixed:
        if choose is None:
            raise KeyError(name)
        return choose()
    return list(fixed[name]) if isinstance(fixed[name], tuple) else fixed[name]


def _open(slots: list[Slot], index: int) -> bool:
    return index < len(slots) and slots[index].present and slots[index].shape is None


def _values(slots: list[Slot], produced: dict[int, np.ndarray]) -> list:
    return [produced.get(index) if _open(slots, index) else None for index in range(len(slots))]


def _data(draws: Draws, slots: list[Slot], ranks) -> tuple[tuple[int, ...], dict[int, Any]]:
    """The first input's shape: fixed, or drawn (and its value made)."""
    if slots[0].shape is not None:
        if len(slots[0].shape) not in ranks:
            raise Reject
        return slots[0].shape, {}
    shape = draws.data_shape(ranks)
    return shape, {0: draws.normal(shape)}


def conv(draws: Draws, slots: list[Slot], fixed: dict, outputs) -> Draft:
    """Conv(X [N, C, *S], W [M, C/group, *K], B [M]?) over 1-3 spatial dims. Of the convs that
    draw their input, one in four is large with a large kernel (what the FFT rule wants) and
    one in four is 2-D with a separable kernel of rank 1 or 2 (what the low-rank rule wants)."""
    kind = draws.choice(["plain", "plain", "large", "separable"]) if slots[0].shape is None else "plain"
    large = kind == "large" and "kernel_shape" not in fixed
    separable = kind == "separable" and "group" not in fixed and slots[1].shape is None
    if large:
        spatial = [draws.integer(28, 40)] * 2 if draws.flag() else [draws.integer(300, 400)]
        shape = (draws.integer(1, 2), draws.integer(1, 4), *spatial)
        produced = {0: draws.normal(shape)}
    else:
        shape, produced = _data(draws, slots, (4,) if separable else (3, 4, 5))
    channels, nd = shape[1], len(shape) - 2
    if slots[1].shape is not None:
        out_channels, per_group, *kernel = slots[1].shape
        if len(kernel) != nd or channels % per_group:
            raise Reject
        group = channels // per_group
    else:
        group = (
            1
            if separable
            else _pick(
                fixed,
                "group",
                lambda: draws.choice(sorted({1, channels} | {g for g in range(2, channels) if channels % g == 0})),
            )
        )
        if channels % group:
            raise Reject
        kernel_choices = (
            [13, 15, 17] if large and nd == 2 else [121, 125] if large else [3, 5] if separable else [1, 3, 2, 5]
        )
        kernel = _pick(fixed, "kernel_shape", lambda: [draws.choice(kernel_choices) for _ in range(nd)])
        out_channels = draws.choice(sorted({channels} | {group * m for m in (1, 2, 3)}, key=lambda m: m != channels))
        if out_channels % group:
            raise Reject
        produced[1] = draws.normal(
            (out_channels, channels // group, *kernel), 1 / np.sqrt(channels // group * np.prod(kernel))
        )
        if separable and min(kernel) > 1:
            produced[1] = _low_rank_kernel(draws, produced[1].shape)
    if len(kernel) != nd:
        raise Reject
    attrs: dict[str, Any] = {"group": group} if group != 1 or "group" in fixed or draws.flag() else {}
    if not draws.flag():
        attrs["kernel_shape"] = list(kernel)
    attrs["strides"] = _pick(fixed, "strides", lambda: [1 if large else draws.choice([1, 2, 3]) for _ in range(nd)])
    attrs["dilations"] = _pick(fixed, "dilations", lambda: [1 if large else draws.choice([1, 2]) for _ in range(nd)])
    attrs.update(_padding(draws, fixed, kernel, attrs["dilations"]))
    if _open(slots, 2):
        produced[2] = draws.normal((out_channels,))
    return Draft(attrs, _values(slots, produced))


def conv_transpose(draws: Draws, slots: list[Slot], fixed: dict, outputs) -> Draft:
    """ConvTranspose(X [N, C, *S], W [C, M/group, *K], B [M]?) over 1-3 spatial dims: strides 1-3,
    dilations 1-2, pads within the kernel's reach, output_padding below the stride."""
    shape, produced = _data(draws, slots, (3, 4, 5))
    channels, nd = shape[1], len(shape) - 2
    if slots[1].shape is not None:
        in_channels, per_group, *kernel = slots[1].shape
        if len(kernel) != nd or in_channels != channels:
            raise Reject
        group = _pick(fixed, "group", lambda: 1)
    else:
        group = _pick(fixed, "group", lambda: draws.choice([g for g in (1, 2, channels) if channels % g == 0]))
        if channels % group:
            raise Reject
        kernel = _pick(fixed, "kernel_shape", lambda: [draws.choice([1, 2, 3, 4]) for _ in range(nd)])
        per_group = draws.integer(1, 3)
        produced[1] = draws.normal((channels, per_group, *kernel), 1 / np.sqrt(channels * np.prod(kernel)))
    strides = _pick(fixed, "strides", lambda: [draws.choice([1, 2, 3]) for _ in range(nd)])
    dilations = _pick(fixed, "dilations", lambda: [draws.choice([1, 2]) for _ in range(nd)])
    reach = [(k - 1) * d for k, d in zip(kernel, dilations)]
    pads = _pick(fixed, "pads", lambda: [draws.integer(0, r) for r in reach] + [draws.integer(0, r) for r in reach])
    attrs = {"group": group, "strides": strides, "dilations": dilations, "pads": pads}
    if draws.flag():
        attrs["output_padding"] = [draws.integer(0, max(s, d) - 1) for s, d in zip(strides, dilations)]
    if _open(slots, 2):
        produced[2] = draws.normal((per_group * group,))
    return Draft(attrs, _values(slots, produced))


def _low_rank_kernel(draws: Draws, shape) -> np.ndarray:
    """W [O, I, Kh, Kw] = sum over r < R of p_r[o] q_r[i] b_r[kh] c_r[kw], R = 1 or 2: rank R
    as a [(i, kh), (o, kw)] matrix."""
    rank = draws.integer(1, 2)
    out_channels, in_channels, rows, cols = shape
    factors = [draws.normal((size, rank)) for size in (out_channels, in_channels, rows, cols)]
    return np.einsum("or,ir,kr,lr->oikl", *factors).astype(np.float32)


def _padding(draws: Draws, fixed: dict, kernel, dilations) -> dict:
    """No pads, 'same' pads, any explicit pads within the window, or an auto_pad mode."""
    if "pads" in fixed or "auto_pad" in fixed:
        return {key: _pick(fixed, key, None) for key in ("pads", "auto_pad") if key in fixed}
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    auto = ["SAME_UPPER", "SAME_LOWER"] if all(d == 1 for d in dilations) else []  # ONNX Runtime: no SAME with dilation
    mode = draws.choice(["none", "same", "explicit", *auto, "VALID"])
    if mode == "none":
        return {}
    if mode == "same":
        begins = [(e - 1) // 2 for e in extent]
        return {"pads": begins + [e - 1 - b for e, b in zip(extent, begins)]}
    if mode == "explicit":
        return {"pads": [draws.integer(0, e - 1) for e in extent * 2]}
    return {"auto_pad": mode}


def batch_normalization(draws: Draws, slots: list[Slot], fixed: dict, outputs) -> Draft:
    """BatchNormalization(X [N, C, ...], scale, bias, mean, var [C]) in inference mode."""
    shape, produced = _data(draws, slots, (2, 3, 4, 5))
    channels = (shape[1],)
    makers: list[Callable[[tuple[int, ...]], np.ndarray]] = [draws.positive, draws.normal, draws.normal, draws.positive]
    for index, make in zip(range(1, 5), makers):
        if _open(slots, index):
            produced[index] = make(channels)
    attrs = {"epsilon": _pick(fixed, "epsilon", lambda: draws.choice([1e-5, 1e-3]))}
    return Draft(attrs, _values(slots, produced))


def _broadcast_shape(draws: Draws, like: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts against `like` without changing it."""
    rank = len(like)
    options = ["same", "scalar", "one"]
    if rank >= 2:
        options += ["per-channel", "per-channel-full-rank"]
    if rank >= 1:
        options += ["last", "some-ones"]
    kind = draws.choice(options)
    if kind == "same":
        return like
    if kind == "scalar":
        return ()
    if kind == "one":
        return (1,)
    if kind == "per-channel":
        return (like[1],) + (1,) * (rank - 2)
    if kind == "per-channel-full-rank":
        return (1, like[1]) + (1,) * (rank - 2)
    if kind == "last":
        return (like[-1],)
    return tuple(1 if draws.flag() else dim for dim in like)


def elementwise(
    draws: Draws, slots: list[Slot], fixed: dict, outputs, denominator: int | None = None, neutral: float | None = None
) -> Draft:
    """Add/Sub/Mul/Div/Sum/Max/Min: the first open slot without a fixed partner is the data;
    the others broadcast against it (a scalar, per channel, per last dim, ...), and one time in
    three hold the op's neutral value (0 to add, 1 to multiply), as exporters leave them."""
    known = next((slot.shape for slot in slots if slot.present and slot.shape is not None), None)
    produced = {}
    for index in range(len(slots)):
        if not _open(slots, index):
            continue
        operand = known is not None
        shape = draws.data_shape() if known is None else _broadcast_shape(draws, known)
        known = known or shape
        if operand and neutral is not None and draws.integer(0, 2) == 0:
            produced[index] = np.full(shape, neutral, np.float32)
        else:
            produced[index] = draws.away_from_zero(shape) if index == denominator else draws.normal(shape)
    return Draft({}, _values(slots, produced))


def average_pool(draws: Draws, slots: list[Slot], fixed: dict, outputs) -> Draft:
    shape, produced = _data(draws, slots, (3, 4, 5))
    nd = len(shape) - 2
    kernel = _pick(fixed, "kernel_shape", lambda: [draws.choice([1, 2, 3]) for _ in range(nd)])
    attrs = {
        "kernel_shape": list(kernel),
        "strides": _pick(fixed, "strides", lambda: [draws.choice([1, 2]) for _ in range(nd)]),
    }
    attrs.update(_padding(draws, fixed, kernel, [1] * nd))
    if "pads" in attrs and any(p >= k for p, k in zip(attrs["pads"], list(kernel) * 2)):
        raise Reject  # ONNX Runtime wants each pad smaller than the window
    attrs["ceil_mode"] = _pick(fixed, "ceil_mode", lambda: draws.choice([0, 1]))
    attrs["count_include_pad"] = _pick(fixed, "count_include_pad", lambda: draws.choice([0, 1]))
    return Draft(attrs, _values(slots, produced))


def pad(draws: Draws, slots: list[Slot], fixed: dict, outputs) -> Draft:
    """Pad(X, pads, constant_value?, axes?): pads in [-1, 2] (negative crops), or none at all."""
    shape, produced = _data(draws, slots, (1, 2, 3, 4, 5))
    mode = _pick(fixed, "mode", lambda: draws.choice(["constant", "reflect", "edge"]))
    axes = list(range(len(shape)))
    if _open(slots, 3):
        axes = sorted({draws.choice(range(len(shape))) for _ in range(draws.integer(1, len(shape)))})
        produced[3] = np.array([axis - len(shape) if draws.flag() else axis for axis in axes], np.int64)
    if _open(slots, 1):
        lowest = {"constant": -1, "edge": -1, "reflect": 0}.get(mode, 0)
        spatial_only = len(shape) >= 3 and not draws.flag()  # how convs are padded
        widths = [
            0 if spatial_only and axes[i % len(axes)] in (0, 1) else draws.integer(lowest, 2)
            for i in range(2 * len(axes))
        ]
        if draws.integer(0, 7) == 0:  # no padding at all, as exporters leave where a size came out 0
            widths = [0] * len(widths)
        elif not any(widths):  # padding that pads: what its value and mode are about
            widths[draws.integer(0, len(widths) - 1)] = draws.integer(1, 2)
        if mode == "reflect" and any(w >= shape[axes[i % len(axes)]] for i, w in enumerate(widths)):
            raise Reject
        produced[1] = np.array(widths, np.int64)
    if _open(slots, 2):  # a fill value of 0 a third of the time, as convs are padded; else any
        produced[2] = np.float32(0.0) if draws.integer(0, 2) == 0 else draws.away_from_zero(())
    return Draft({"mode": mode} if mode != "constant" or draws.flag() else {}, _values(slots, produced))


def concat(draws: Draws, slots: list[Slot], fixed: dict, outputs) -> Draft:
    """Concat(*parts): open parts copy the first fixed part's shape but for the axis dim."""
    like = next((slot.shape for slot in slots if slot.shape is not None), None) or draws.data_shape((1, 2, 3, 4))
    axis = _pick(fixed, "axis", lambda: draws.choice([*range(len(like)), *range(-len(like), 0)]))
    if not -len(like) <= axis < len(like):
        raise Reject
    produced = {}
    for index in range(len(slots)):
        if _open(slots, index):
            shape = list(like)
            shape[axis] = draws.integer(1, 4)
            produced[index] = draws.normal(tuple(shape))
    return Draft({"axis": axis}, _values(slots, produced))


def split(draws: Draws, slots: list[Slot], fixed: dict, outputs) -> Draft:
    """Split(X, split?) into `outputs` parts (drawn, 2-4, for `*parts = Split(...)`): equal
    parts from num_outputs, or sizes from the `split` input."""
    count = outputs or draws.integer(2, 4)
    given = slots[0].shape
    drawn = given is None
    shape = list(draws.data_shape((1, 2, 3, 4)) if given is None else given)
    axis = _pick(fixed, "axis", lambda: draws.choice(range(len(shape))))
    if not -len(shape) <= axis < len(shape):
        raise Reject
    produced = {}
    if drawn:  # a length that splits: equal parts, or a remainder for the last
        shape[axis] = count * draws.integer(1, 3) + (draws.integer(1, 2) if draws.flag() else 0)
        produced[0] = draws.normal(tuple(shape))
    size = shape[axis]
    if size < count:
        raise Reject
    attrs = {"axis": axis} if axis != 0 or draws.flag() else {}
    if _open(slots, 1):
        equal = size % count == 0 and not draws.flag()
        if equal:
            sizes = [size // count] * count
        else:
            cuts = np.sort(draws.rng.choice(np.arange(1, size), count - 1, replace=False))
            sizes = np.diff([0, *cuts, size]).tolist()
        produced[1] = np.array(sizes, np.int64)
    elif len(slots) < 2 or not slots[1].present:
        attrs["num_outputs"] = count
    return Draft(attrs, _values(slots, produced), outputs=count)


def gather(draws: Draws, slots: list[Slot], fixed: dict, outputs) -> Draft:
    shape, produced = _data(draws, slots, (1, 2, 3))
    axis = _pick(fixed, "axis", lambda: draws.choice(range(len(shape))))
    if not -len(shape) <= axis < len(shape):
        raise Reject
    size = shape[axis]
    if _open(slots, 1):
        count = () if draws.choice(["scalar", "vector"]) == "scalar" else (draws.integer(1, 3),)
        produced[1] = draws.rng.integers(-size, size, count).astype(np.int64)
    return Draft({"axis": axis} if axis or draws.flag() else {}, _values(slots, produced))


def gemm(draws: Draws, slots: list[Slot], fixed: dict, outputs) -> Draft:
    """Gemm(A [M, K] (or [K, M]), B [K, N] (or [N, K]), C?) * alpha / beta."""
    trans_a = _pick(fixed, "transA", lambda: draws.choice([0, 1]))
    trans_b = _pick(fixed, "transB", lambda: draws.choice([0, 1]))
    produced = {}
    if slots[0].shape is None:
        a = (draws.integer(1, 3), draws.integer(1, 5))
        produced[0] = draws.normal(a)
    elif len(slots[0].shape) == 2:
        a = slots[0].shape
    else:
        raise Reject
    rows, inner = a[::-1] if trans_a else a
    if slots[1].shape is None:
        cols = draws.integer(1, 5)
        produced[1] = draws.normal((cols, inner) if trans_b else (inner, cols), 1 / np.sqrt(inner))
    else:
        b = slots[1].shape
        cols = b[0] if trans_b else b[-1]
    if _open(slots, 2):
        produced[2] = draws.normal(draws.choice([(cols,), (1, cols), (rows, cols), (), (rows, 1)]))
    attrs = {
        "transA": trans_a,
        "transB": trans_b,
        "alpha": _pick(fixed, "alpha", lambda: draws.choice([1.0, 0.5, 2.0])),
        "beta": _pick(fixed, "beta", lambda: draws.choice([1.0, 0.5, 2.0])),
    }
    return Draft(attrs, _values(slots, produced))


def matmul(draws: Draws, slots: list[Slot], fixed: dict, outputs) -> Draft:
    """MatMul(A, B) with numpy's rules: A of rank 1 to 4 (a 1-D A is a row), B a matrix, a
    vector (a 1-D B is a column) or a stack of matrices broadcast against A's leading dims."""
    shape, produced = _data(draws, slots, (1, 2, 3, 4))
    if _open(slots, 1):
        inner, columns = shape[-1], draws.integer(1, 5)
        kind = draws.choice(["matrix", "vector", "stack"])
        weight_shape: tuple[int, ...]
        if kind == "vector":
            weight_shape = (inner,)
        elif kind == "stack":  # leading dims that broadcast against A's: 1 or A's own, or new ones
            leading = [draws.choice([1, dim]) for dim in shape[:-2]] or [draws.integer(1, 3)]
            weight_shape = (*leading, inner, columns)
        else:
            weight_shape = (inner, columns)
        produced[1] = draws.normal(weight_shape, 1 / np.sqrt(inner))
    return Draft({}, _values(slots, produced))


def unary(draws: Draws, slots: list[Slot], fixed: dict, outputs) -> Draft:
    shape, produced = _data(draws, slots, (1, 2, 3, 4, 5))
    return Draft({}, _values(slots, produced))


def dropout(draws: Draws, slots: list[Slot], fixed: dict, outputs) -> Draft:
    """Dropout(X, ratio?, training_mode?) as exported for inference: training_mode false."""
    shape, produced = _data(draws, slots, (1, 2, 3, 4, 5))
    if _open(slots, 1):
        produced[1] = np.float32(draws.choice([0.5, 0.1, 0.0]))
    if _open(slots, 2):
        produced[2] = np.array(False)
    return Draft({}, _values(slots, produced), outputs=outputs or 1)


def transpose(draws: Draws, slots: list[Slot], fixed: dict, outputs) -> Draft:
    """Transpose(X): a perm (shrinking to the identity), or none (the axes reversed)."""
    shape, produced = _data(draws, slots, (1, 2, 3, 4, 5))
    if "perm" not in fixed and draws.integer(0, 3) == 3:
        return Draft({}, _values(slots, produced))
    perm = _pick(fixed, "perm", lambda: draws.permutation(len(shape)))
    return Draft({"perm": perm}, _values(slots, produced))


def reshape(draws: Draws, slots: list[Slot], fixed: dict, outputs) -> Draft:
    """Reshape(X, shape): flatten from an axis, or keep the dims (with 0 = copy, -1 = infer),
    or split a dim in two; allowzero now and then (a 0 then means a 0, so the target is
    written without copies)."""
    shape, produced = _data(draws, slots, (1, 2, 3, 4, 5))
    allowzero = "allowzero" not in fixed and draws.integer(0, 3) == 3
    if _open(slots, 1):
        axis = draws.integer(0, len(shape))
        kind = draws.choice(["flatten", "keep", "split"])
        if kind == "flatten":
            target = [int(np.prod(shape[:axis])), -1]
        elif kind == "split" and any(dim % 2 == 0 for dim in shape):
            at = next(i for i, dim in enumerate(shape) if dim % 2 == 0)
            target = [*shape[:at], 2, shape[at] // 2, *shape[at + 1 :]]
        else:
            target = [0 if draws.flag() and not allowzero else dim for dim in shape]
            target[draws.integer(0, len(shape) - 1)] = -1
        produced[1] = np.array(target, np.int64)
    return Draft({"allowzero": 1} if allowzero else {}, _values(slots, produced))


def flatten(draws: Draws, slots: list[Slot], fixed: dict, outputs) -> Draft:
    shape, produced = _data(draws, slots, (1, 2, 3, 4, 5))
    return Draft({"axis": _pick(fixed, "axis", lambda: draws.integer(0, len(shape)))}, _values(slots, produced))


def slice_(draws: Draws, slots: list[Slot], fixed: dict, outputs) -> Draft:
    """Slice(X, starts, ends, axes?, steps?): on some axes, the whole axis (ends at its size,
    past it, or INT64_MAX; starts 0 or -size) half the time, a part of it otherwise (a start
    within it, a step of 2 or -1)."""
    shape, produced = _data(draws, slots, (1, 2, 3, 4, 5))
    axes = sorted({draws.choice(range(len(shape))) for _ in range(draws.integer(1, len(shape)))})
    whole = draws.flag()
    starts, ends, steps = [], [], []
    for axis in axes:
        size = shape[axis]
        if whole:
            starts.append(draws.choice([0, -size]))
            ends.append(draws.choice([size, size + 3, np.iinfo(np.int64).max]))
            steps.append(1)
        else:
            step = draws.choice([1, 2, -1])
            starts.append(draws.integer(0, size - 1) if step > 0 else size - 1)
            ends.append(size if step > 0 else -size - 1)
            steps.append(step)
    for index, value in ((1, starts), (2, ends), (4, steps)):
        if _open(slots, index):
            produced[index] = np.array(value, np.int64)
    if _open(slots, 3):
        produced[3] = np.array([axis - len(shape) if draws.flag() else axis for axis in axes], np.int64)
    elif (len(slots) <= 3 or not slots[3].present) and axes != list(range(len(axes))):
        raise Reject  # without axes, starts and ends name the first axes in order
    if (len(slots) <= 4 or not slots[4].present) and any(step != 1 for step in steps):
        raise Reject  # without steps, every step is 1
    return Draft({}, _values(slots, produced))


def slice_partition(draws: Draws, slots: list[Slot], fixed: dict, count: int) -> list[Draft]:
    """`count` Slices of one X that cut one axis into consecutive parts covering it (the
    TorchScript exporter's chunk and split), one Draft per group element, the parts in a drawn
    order; bounds written as exporters write them (negative from the end, past the end,
    INT64_MAX). X is drawn with the axis long enough; the first Draft holds X's value."""
    axes_given = len(slots) > 3 and slots[3].present
    if slots[0].shape is None:
        shape = list(draws.data_shape((1, 2, 3, 4)))
        axis = draws.choice(range(len(shape))) if axes_given else 0
        shape[axis] = count + draws.integer(0, 3)
        first = {0: draws.normal(tuple(shape))}
    else:
        shape, first = list(slots[0].shape), {}
        axis = draws.choice(range(len(shape))) if axes_given else 0
    size = shape[axis]
    if size < count:
        raise Reject
    edges = [0, *sorted(draws.rng.choice(np.arange(1, size), count - 1, replace=False).tolist()), size]
    drafts = []
    for element, part in enumerate(draws.rng.permutation(count).tolist()):
        start, end = edges[part], edges[part + 1]
        if end == size:
            end = draws.choice([size, size + 3, int(np.iinfo(np.int64).max)])
        elif draws.flag():
            end -= size
        produced = dict(first) if element == 0 else {}
        produced[1] = np.array([start - size if start and draws.flag() else start], np.int64)
        produced[2] = np.array([end], np.int64)
        if axes_given:
            produced[3] = np.array([axis - len(shape) if draws.flag() else axis], np.int64)
        if len(slots) > 4 and slots[4].present:
            produced[4] = np.array([1], np.int64)
        values = [produced.get(index) if slot.present and (slot.shape is None or index > 0) else None
                  for index, slot in enumerate(slots)]  # fmt: skip
        drafts.append(Draft({}, values))
    return drafts


def _binary(denominator=None, neutral=None) -> Sampler:
    return lambda draws, slots, fixed, outputs: elementwise(draws, slots, fixed, outputs, denominator, neutral)


SAMPLERS: dict[str, Sampler] = {
    "Conv": conv,
    "ConvTranspose": conv_transpose,
    "BatchNormalization": batch_normalization,
    "AveragePool": average_pool,
    "Pad": pad,
    "Add": _binary(neutral=0.0),
    "Sub": _binary(neutral=0.0),
    "Mul": _binary(neutral=1.0),
    "Div": _binary(denominator=1, neutral=1.0),
    "Sum": _binary(),
    "Max": _binary(),
    "Min": _binary(),
    "Concat": concat,
    "Split": split,
    "Gather": gather,
    "Slice": slice_,
    "Gemm": gemm,
    "MatMul": matmul,
    "Dropout": dropout,
    "Transpose": transpose,
    "Reshape": reshape,
    "Flatten": flatten,
    **dict.fromkeys(("Identity", "Relu", "Neg", "Abs", "Sigmoid", "Tanh", "LeakyRelu", "Softplus"), unary),
}
# Group elements of these ops that read one shared input may be drawn together, as parts that
# partition it (what a rule turning them into one node needs to see at least once).
PARTITIONS = {"Slice": slice_partition}
