"""N identical branches computed once on stacked data: the rewriting half of TVM's
combine_parallel, on ONNX graphs (branch_groups.py finds the branches).

The heads become one op (stacked conv weights, or one Gather + a batched contraction with
packed [N, I, O] weights; for a Split, its input as it is); each step of the BranchGroup
becomes one op on the stacked tensor (a Conv becomes a grouped conv with N times the groups; a
shared operand is tiled N times); the join becomes the stacked tensor itself (a Reshape at
most), or, without a join, a Split hands each branch its slice. Every step is an exact
rearrangement of the same arithmetic.
"""

from __future__ import annotations

import numpy as np

from .. import ir
from ..algebra import Refusal
from ..algebra.batching import grouped_from_branches, pack_linear_heads, stack_conv_heads
from ..ir import attribute_or, constant_value, is_absent
from .branch_groups import BranchGroup, Layout, Step, drop_units, find_branch_group, largest_compatible, view_of
from .builder import NodeBuilder, output_dtype
from .primitives import Rewrite, accepts, builtin, consumes


class _Builder(NodeBuilder):
    """The batching folds' nodes, named `batched...` unless said, with the stacked view."""

    def __init__(self, context, dtype):
        super().__init__(context, dtype, "batched")

    def view(self, value, layout: Layout, axis: int):
        """The stacked tensor `value` (laid out as `layout`) shaped as layout.view_shape(axis),
        which the finder checked it can be."""
        target = layout.view_shape(axis)
        if tuple(layout.held or ()) == tuple(target):
            return value
        dims = [d if isinstance(d, int) else 0 for d in target]  # 0 copies a symbolic leading dim
        shape = self.constant(np.array(dims, np.int64), "batched_shape", np.int64)
        return self.node("Reshape", [value, shape], shape=target, base="batched_view")


# --- heads -------------------------------------------------------------------------------------


@builtin
@consumes("heads", "x", heads={"Conv"})
def batch_conv_heads(match, context) -> Rewrite:
    """heads[] = Conv(x, w[], b[]?) with the same attributes and weight shapes -> one Conv whose
    output channels are the heads' stacked, followed by the branches batched."""
    heads = largest_compatible([h for h in match.nodes["heads"] if h.attrs.get("group", 1) == 1], _conv_key)
    if len(heads) < 2:  # grouped heads would need their output channels interleaved by group
        raise Refusal("fewer than two ungrouped heads of the same attributes and weight shape", reported=False)
    shape = tuple(heads[0].outputs[0].shape) if heads[0].outputs[0].shape else None
    if shape is None or len(shape) < 3:
        raise Refusal("the heads' output shape is unknown")
    weights = [constant_value(h.inputs[1]) for h in heads]
    biases = [None if len(h.inputs) < 3 or is_absent(h.inputs[2]) else constant_value(h.inputs[2]) for h in heads]
    weight, bias = stack_conv_heads(weights, biases)
    build = _Builder(context, output_dtype(heads[0]))
    inputs = [match.values["x"], build.constant(weight, "stacked_weight")]
    if bias is not None:
        inputs.append(build.constant(bias, "stacked_bias"))
    held = view_of(shape, 1, len(heads))
    value = build.node("Conv", inputs, heads[0].attrs, shape=held, base="stacked_conv")
    return _batched(
        build,
        value,
        Layout(shape, drop_units(shape[:1]), len(heads), held),
        [h.outputs[0] for h in heads],
        f"{len(heads)} parallel Convs stacked into one",
    )


def _conv_key(conv):
    return sorted((k, str(v)) for k, v in conv.attrs.items()), constant_value(conv.inputs[1]).shape


@builtin
@accepts("form")
@consumes("g", "heads", "x", g={"Gather"}, heads={"Gemm"})
def batch_gathered_linears(match, context) -> Rewrite:
    """heads[] = Gemm(Gather[axis=1](x, i[]), w[], b[]?) -> Gather(x, [i...]) and one batched
    contraction "bni,nio->bno" (W [N, I, O] packed) + b [N, O]; x [B, K, I]. `with: {form:
    matmul | einsum}` picks how the contraction is written (see _contract)."""
    gemms = largest_compatible(match.nodes["heads"], _gemm_key)
    if len(gemms) < 2:
        raise Refusal("fewer than two Gemms of the same attributes and weight shape", reported=False)
    x = match.values["x"]
    if x.shape is None or len(x.shape) != 3 or not ir.is_static(x.shape[1:]):
        raise Refusal("the gathered tensor needs a [B, K, I] shape with static K and I")
    indices = [int(constant_value(g.inputs[0].inputs[0].inputs[1])) % x.shape[1] for g in gemms]
    transposed = bool(gemms[0].attrs.get("transB", 0))
    biases = [None if len(g.inputs) < 3 or is_absent(g.inputs[2]) else constant_value(g.inputs[2]) for g in gemms]
    out_features = constant_value(gemms[0].inputs[1]).shape[0 if transposed else 1]
    if any(b is not None and not _per_column(np.asarray(b), out_features) for b in biases):
        raise Refusal("a Gemm bias varies over the batch")
    weight, bias = pack_linear_heads(
        [constant_value(g.inputs[1]) for g in gemms],
        biases,
        transposed,
        float(gemms[0].attrs.get("alpha", 1.0)),
        float(gemms[0].attrs.get("beta", 1.0)),
    )
    dtype = output_dtype(gemms[0])
    build = _Builder(context, dtype)
    batch, n = x.shape[0], len(gemms)
    gathered = x
    if indices != list(range(x.shape[1])):
        gathered = build.node(
            "Gather",
            [x, build.constant(np.array(indices, np.int64), "indices", np.int64)],
            {"axis": 1},
            shape=(batch, n, x.shape[2]),
            base="gathered",
        )
    value = _contract(
        build,
        gathered,
        build.constant(weight, "packed_weight"),
        (batch, n, weight.shape[2]),
        context.params.get("form", "matmul"),
    )
    if bias is not None:
        value = build.node(
            "Add",
            [value, build.constant(bias, "packed_bias")],
            shape=(batch, n, weight.shape[2]),
            base="packed_bias_add",
        )
    shape = (batch, weight.shape[2])
    return _batched(
        build,
        value,
        Layout(shape, drop_units(shape[:1]), n, (batch, n, weight.shape[2])),
        [g.outputs[0] for g in gemms],
        f"{n} Gemms on gathered rows as one batched {context.params.get('form', 'matmul')}",
    )


def _contract(build, rows, weight, shape, form: str):
    """[B, N, I] x [N, I, O] -> [B, N, O], as `einsum` ("bni,nio->bno") or as `matmul`
    (Transpose to [N, B, I], a batched MatMul, Transpose back). The default is matmul: ONNX
    Runtime's CPU Einsum is a generic contraction, slower than its batched GEMM at every size
    measured (bench/RESULTS.md, "Measurements behind the code")."""
    if form == "einsum":
        return build.node("Einsum", [rows, weight], {"equation": "bni,nio->bno"}, shape=shape, base="einsum")
    if form != "matmul":
        raise ValueError(f"form must be matmul or einsum, not {form!r}")
    batch, n, _ = shape
    by_class = build.node("Transpose", [rows], {"perm": [1, 0, 2]}, base="by_class")
    product = build.node("MatMul", [by_class, weight], shape=(n, batch, shape[2]), base="batched_matmul")
    return build.node("Transpose", [product], {"perm": [1, 0, 2]}, shape=shape, base="by_row")


def _per_column(bias: np.ndarray, out_features: int) -> bool:
    """A Gemm C that is the same for every row: [], [1], [O], [1, 1] or [1, O] (not [M, 1]
    or [M, O], which differ between rows even when their size equals O)."""
    return bias.size in (1, out_features) and (bias.ndim < 2 or bias.shape[0] == 1)


def _gemm_key(gemm):
    return (
        gemm.attrs.get("transA", 0),
        gemm.attrs.get("transB", 0),
        float(gemm.attrs.get("alpha", 1.0)),
        float(gemm.attrs.get("beta", 1.0)),
        constant_value(gemm.inputs[1]).shape,
    )


@builtin
@consumes("x", root={"Split"})
def batch_split_branches(match, context) -> Rewrite:
    """*parts = Split(x): when every part goes through the same ops, do them once on x."""
    split, x = match.root, match.values["x"]
    parts = list(split.outputs)
    shapes = {tuple(p.shape) if p.shape else None for p in parts}
    if len(shapes) != 1 or None in shapes:
        raise Refusal("the parts are not all of one known shape", reported=False)
    shape = next(iter(shapes))
    axis = attribute_or(split, "axis", context.opset, 0) % len(shape)
    start = Layout(shape, drop_units(shape[:axis]), len(parts), tuple(x.shape) if x.shape else None)
    build = _Builder(context, output_dtype(split))
    return _batched(build, x, start, parts, "Split branches batched", require_step=True)


# --- the branches ------------------------------------------------------------------------------


def _batched(build, value, start: Layout, ends, note, require_step=False) -> Rewrite:
    """The branches from `ends` (their stacked form `value`, laid out as `start`) found and built."""
    group = find_branch_group(start, ends, build.context.graph, require_step)
    for step in group.steps:
        value = _built_step(build, value, step)
    view = build.view(value, group.last, group.axis)
    numbers = {"branches": start.count, "batched_steps": len(group.steps)}
    if group.join is not None:
        return Rewrite(
            build.nodes,
            [(group.join.outputs[0], view)],
            f"{note}; {len(group.steps)} step(s) batched, joined by a Concat",
            extra=numbers,
        )
    return _split_back(build, view, group, note, numbers)


def _split_back(build, view, group: BranchGroup, note: str, numbers: dict) -> Rewrite:
    """No join: one Split of the stacked tensor hands each branch end its slice."""
    layout = group.last
    sizes = build.constant(np.full(layout.count, layout.shape[group.axis], np.int64), "split_sizes", np.int64)
    outputs = build.node(
        "Split", [view, sizes], {"axis": group.axis}, shape=layout.shape, outputs=len(group.ends), base="branch"
    )
    return Rewrite(
        build.nodes,
        list(zip(group.ends, outputs)),
        f"{note}; {len(group.steps)} step(s) batched, then split",
        extra=numbers,
    )


def _built_step(build, value, step: Step):
    """The node(s) doing `step` once on the stacked tensor `value`; the new stacked tensor."""
    first = step.readers[0]
    if step.kind == "unary":
        return build.node(
            first.op, [value, *first.inputs[1:]], first.attrs, shape=step.before.held, dtype=first.outputs[0].dtype
        )
    if step.kind == "reshape":
        return value
    view = build.view(value, step.before, step.axis)
    if step.kind == "binary":
        operand = _tiled(build, step) if step.tile else step.operand
        inputs = [operand, view] if step.operand_first else [view, operand]
        return build.node(first.op, inputs, first.attrs, shape=step.after.held)
    if step.kind == "conv":
        weights = [constant_value(r.inputs[1]) for r in step.readers]
        biases = [
            constant_value(r.inputs[2]) if len(r.inputs) > 2 and not is_absent(r.inputs[2]) else None
            for r in step.readers
        ]
        weight, bias, group = grouped_from_branches(weights, biases, int(first.attrs.get("group", 1)))
        inputs = [view, build.constant(weight, "grouped_weight")]
        if bias is not None:
            inputs.append(build.constant(bias, "grouped_bias"))
        return build.node("Conv", inputs, {**first.attrs, "group": group}, shape=step.after.held, base="grouped_conv")
    return build.node(first.op, [view, *first.inputs[1:]], first.attrs, shape=step.after.held)  # reduce


def _tiled(build, step: Step):
    """The shared operand repeated N times along the step's axis (reshaped to the branch's rank first)."""
    layout, axis, operand = step.before, step.axis, step.operand
    rank, op_shape = len(layout.shape), tuple(operand.shape)
    aligned = (1,) * (rank - len(op_shape)) + op_shape
    repeats = build.constant(
        np.array([layout.count if i == axis else 1 for i in range(rank)], np.int64), "repeats", np.int64
    )
    if len(op_shape) != rank:
        shape = build.constant(np.array(aligned, np.int64), "shape", np.int64)
        operand = build.node("Reshape", [operand, shape], shape=aligned, base="aligned")
    return build.node("Tile", [operand, repeats], shape=view_of(aligned, axis, layout.count), base="tiled")
