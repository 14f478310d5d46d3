"""Nodes that only move elements: a Reshape to the shape its input has, a Reshape of a Reshape,
a Transpose of a Transpose, Slices that are a Split. Exporters leave them where Python code
reshapes to a shape the tensor already has (EfficientViT-M's `feature.view(B, -1, H, W)` after
a conv), reshapes in steps or chunks; every value is kept, and only the nodes go.

Reshape(Reshape(x, s1), s2) is Reshape(x, s2): both keep the row-major order of the elements,
so the second sees the elements of x in x's order, and -1 resolves to the same size from either
shape (the element count is the same). Only a 0 in s2 (copy that dim of the input, unless
allowzero) reads the first Reshape's output shape: there that dim is written instead, as its
static size, as 0 where x has the same named dim at that place, or as the one -1.
Transpose(Transpose(x, p), q) is Transpose(x, r) with r[i] = p[q[i]] (output axis i of the
second is its input axis q[i], which is x's axis p[q[i]]); the identity permutation is no node
at all.
"""

from __future__ import annotations

import numpy as np

from .. import ir
from ..algebra import Refusal
from ..ir import attribute_or, constant_value
from .builder import NodeBuilder
from .cleanup import forwarded, slice_parameters
from .primitives import Rewrite, builtin, consumes, reach


def _known(shape) -> bool:
    """Every dim static or named (a symbolic dim shape inference carried through: the same
    name is the same size, as ONNX defines dim_param)."""
    return shape is not None and all(isinstance(dim, int) or (isinstance(dim, str) and dim) for dim in shape)


@builtin
@reach(0)
@consumes(root={"Reshape"})
def drop_same_shape_reshape(match, context) -> Rewrite:
    """A Reshape whose output has its input's shape (static dims, or the same named dims)
    forwards its input."""
    root = match.root
    before, after = root.inputs[0].shape, root.outputs[0].shape
    same = _known(before) and _known(after) and list(before) == list(after)
    if not same and not _keeps_every_dim(root, before, context):
        raise Refusal("it changes the shape, or a shape is not known", reported=False)
    return forwarded(root, root.inputs[0], "Reshape to its input's own shape forwards its input")


def _keeps_every_dim(root, before, context) -> bool:
    """Whether the Reshape's constant target names each dim of its input in place: a 0 that
    copies it, its static size, or one -1 (which then resolves to the one dim left): [0, -1,
    4, 4] of an [N, 48, 4, 4] tensor, whatever N is."""
    target = constant_value(root.inputs[1])
    if target is None or before is None or len(before) != np.asarray(target).size:
        return False
    copies = not attribute_or(root, "allowzero", context.opset, 0)
    entries = [int(entry) for entry in np.asarray(target).reshape(-1)]
    kept = [(copies and entry == 0) or entry == dim for entry, dim in zip(entries, before)]
    return entries.count(-1) <= 1 and all(keep or entry == -1 for keep, entry in zip(kept, entries))


@builtin
@reach(0)
@consumes("h", "x", h={"Reshape"}, root={"Reshape"})
def merge_reshapes(match, context) -> Rewrite:
    """y = Reshape(Reshape(x, s1), s2) -> Reshape(x, s2'), where s2' is s2 with each 0 (a copy
    of the first Reshape's output dim h[i], without allowzero) written as that dim: its static
    size; 0 again where x has the same named dim there; or, for one dynamic dim, -1, which
    resolves to it where every other entry is a positive size."""
    root = match.root
    target = constant_value(root.inputs[1])
    if target is None:
        raise Refusal(f"{root.name}: its shape is computed at run time", reported=False)
    x, h, output = match.values["x"], match.values["h"], root.outputs[0]
    allowzero = int(attribute_or(root, "allowzero", context.opset, 0))
    entries = [int(entry) for entry in np.asarray(target).reshape(-1)]
    shape_input = root.inputs[1]
    build = NodeBuilder(context, output.dtype, output.name)
    if not allowzero and 0 in entries:
        written = _copies_written(entries, h.shape, x.shape, output.shape)
        if written is None:
            raise Refusal(f"{root.name}: its shape copies a dim (0) of its input that x does not have there")
        shape_input = build.constant(np.array(written, np.int64), output.name + "_shape")
    attributes = {"allowzero": allowzero} if allowzero else {}  # a 0 in s2 stays an empty dim
    result = build.node("Reshape", [x, shape_input], attributes, shape=output.shape)
    return Rewrite(build.nodes, [(output, result)], "Reshape of a Reshape is one Reshape")


def _copies_written(entries: list[int], copied, data, result) -> list[int] | None:
    """A second Reshape's target whose 0s copy dims of `copied` (the first Reshape's output),
    rewritten for reading `data` (the first's input) instead, with the static dims of its
    `result` where shape inference knows them; None where it cannot be."""
    written: list[int | None] = []
    for axis, entry in enumerate(entries):
        dim = copied[axis] if copied is not None and axis < len(copied) else None
        known = result[axis] if result is not None and axis < len(result) else None
        if isinstance(known, int) and entry != 0 or isinstance(known, int) and known > 0:
            written.append(known)
        elif entry != 0:
            written.append(entry)
        elif isinstance(dim, int):
            written.append(dim)
        elif isinstance(dim, str) and dim and data is not None and axis < len(data) and data[axis] == dim:
            written.append(0)  # the same named dim of x at the same place: 0 still copies it
        else:
            written.append(None)
    if written.count(None) == 0:
        return written
    others = [entry for entry in written if entry is not None]
    if written.count(None) > 1 or not all(entry > 0 for entry in others):
        return None  # -1 could not stand for two dims, nor resolve beside a dim that may be 0
    return [-1 if entry is None else entry for entry in written]


@builtin
@reach(0)
@consumes("h", "x", h={"Transpose"}, root={"Transpose"})
def merge_transposes(match, context) -> Rewrite:
    """y = Transpose(Transpose(x, p), q) -> Transpose(x, r), r[i] = p[q[i]]; x itself where r is
    the identity."""
    root, first = match.root, match.nodes["h"]
    rank = len(root.outputs[0].shape) if root.outputs[0].shape is not None else None
    inner, outer = attribute_or(first, "perm", context.opset, None), attribute_or(root, "perm", context.opset, None)
    if inner is None or outer is None:  # no perm: the axes reversed, which needs the rank
        if rank is None:
            raise Refusal("a Transpose without perm on a tensor of unknown rank", reported=False)
        inner = list(range(rank))[::-1] if inner is None else inner
        outer = list(range(rank))[::-1] if outer is None else outer
    composed = [int(inner[axis]) for axis in outer]
    x, output = match.values["x"], root.outputs[0]
    if composed == sorted(composed):
        return forwarded(root, x, "Transpose of a Transpose that puts the axes back forwards its input")
    build = NodeBuilder(context, output.dtype, output.name)
    result = build.node("Transpose", [x], {"perm": composed}, shape=output.shape)
    return Rewrite(build.nodes, [(output, result)], "Transpose of a Transpose is one Transpose")


@builtin
@reach(0)
@consumes(root={"Transpose"})
def drop_identity_transpose(match, context) -> Rewrite:
    """A Transpose whose perm keeps every axis in place forwards its input."""
    root = match.root
    perm = attribute_or(root, "perm", context.opset, None)
    if perm is None or list(perm) != sorted(perm):
        raise Refusal("it moves axes", reported=False)
    return forwarded(root, root.inputs[0], "Transpose that keeps every axis forwards its input")


@builtin
@reach(0)
@consumes("parts", "x", parts={"Slice"})
def slices_as_split(match, context) -> Rewrite:
    """parts[] = Slice(x, ...) that cut one axis of x into consecutive parts covering all of it
    (the TorchScript exporter's `chunk`; dynamo writes a Split) -> one Split of x. Each Slice
    must take one axis with step 1 and constant bounds; the parts are the slices of the axis
    most of them take, in the order of their starts."""
    x = match.values["x"]
    shape = x.shape
    by_axis: dict[int, list[tuple[int, int, ir.Node]]] = {}
    for part in match.nodes["parts"]:
        bounds = _one_axis_bounds(part, shape)
        if bounds is not None:
            axis, start, end = bounds
            by_axis.setdefault(axis, []).append((start, end, part))
    if not by_axis:
        raise Refusal("no Slice takes one axis of a static size with step 1", reported=False)
    axis, cuts = max(by_axis.items(), key=lambda item: len(item[1]))
    cuts.sort(key=lambda cut: cut[:2])
    edges = [0] + [end for _, end, _ in cuts]
    if len(cuts) < 2 or [start for start, _, _ in cuts] != edges[:-1] or edges[-1] != shape[axis]:
        raise Refusal(f"the Slices of {x.name} do not cut axis {axis} into consecutive parts", reported=False)
    if any(end <= start for start, end, _ in cuts):
        raise Refusal(f"a Slice of {x.name} is empty", reported=False)
    build = NodeBuilder(context, base=x.name)
    sizes = build.constant(np.array([e - s for s, e, _ in cuts], np.int64), x.name + "_split_sizes")
    outputs = [part.outputs[0] for _, _, part in cuts]
    parts = build.node("Split", [x, sizes], {"axis": axis}, outputs=outputs)
    return Rewrite(build.nodes, list(zip(outputs, parts)), f"{len(cuts)} Slices of one axis as one Split")


def _one_axis_bounds(node: ir.Node, shape) -> tuple[int, int, int] | None:
    """(axis, start, end) of a Slice of one axis of static size, step 1, constant bounds,
    clamped to the axis as ONNX clamps them; None otherwise."""
    starts, ends, axes, steps = slice_parameters(node)
    if shape is None or starts is None or ends is None or np.asarray(starts).size != 1:
        return None
    axis = int(np.asarray(axes).reshape(-1)[0]) if axes is not None else 0
    if not -len(shape) <= axis < len(shape) or (steps is not None and int(np.asarray(steps).reshape(-1)[0]) != 1):
        return None
    axis %= len(shape)
    size = shape[axis]
    if not isinstance(size, int):
        return None

    def clamp(bound: int) -> int:
        return min(max(bound + size if bound < 0 else bound, 0), size)

    return axis, clamp(int(np.asarray(starts).reshape(-1)[0])), clamp(int(np.asarray(ends).reshape(-1)[0]))
