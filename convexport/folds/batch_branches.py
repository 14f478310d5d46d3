"""N identical branches computed once on stacked data (the idea of TVM's combine_parallel,
on ONNX graphs): finding is separate from rewriting.

Finding: from N heads (sibling Convs reading one tensor, Gemms reading Gathers of one tensor,
or the outputs of one Split), follow the branches in lockstep while each branch's only reader
is the same op with the same attributes, one each, and stop at the first difference. A final
Concat of all branch ends, in order, is the join.

Rewriting: the heads become one op (stacked conv weights, or one Gather + Einsum with packed
[N, I, O] weights); each step becomes one op on the stacked tensor (a Conv becomes a grouped
conv with N times the groups; a shared residual is tiled N times); the join becomes the
stacked tensor itself (a Reshape at most), or, without a join, a Split hands each branch its
slice. Every step is an exact rearrangement of the same arithmetic.

The stacked tensor's memory is [prefix][branch n][branch block]: branch n's tensor of shape S
is the n-th block after the prefix dims S[:a]. Any shape with that memory is a view of it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .. import ir
from ..algebra import Refusal
from ..algebra.batching import grouped_from_branches, pack_linear_heads, stack_conv_heads
from ..ir import attribute_or, constant_value, is_absent
from ..rewrite.primitives import Rewrite
from .conv_chain import output_dtype

UNARY = {
    "Relu",
    "LeakyRelu",
    "Sigmoid",
    "Tanh",
    "Elu",
    "Selu",
    "Gelu",
    "HardSigmoid",
    "HardSwish",
    "Softplus",
    "Softsign",
    "Erf",
    "Neg",
    "Abs",
    "Exp",
    "Sqrt",
    "Reciprocal",
    "Clip",
    "Mish",
    "Identity",
    "Cast",
}
BINARY = {"Add", "Sub", "Mul", "Div"}
REDUCE = {
    "ReduceMax",
    "ReduceMin",
    "ReduceMean",
    "ReduceSum",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSumExp",
    "ReduceSumSquare",
}
CHANNEL_POOLS = {"GlobalMaxPool", "GlobalAveragePool", "MaxPool", "AveragePool", "LpPool", "GlobalLpPool"}
RESHAPES = {"Reshape", "Unsqueeze", "Squeeze", "Flatten"}


@dataclass
class Stacked:
    """N branch tensors of shape `shape` held as one tensor `value` (see the module doc)."""

    value: ir.Variable
    shape: tuple
    prefix: tuple  # the branch dims before the block, unit dims dropped
    count: int

    def axes(self) -> list[int]:
        """Axes a of the branch shape at which the block starts (shape[:a] is the prefix)."""
        return [a for a in range(len(self.shape) + 1) if _drop_units(self.shape[:a]) == self.prefix]

    def view_shape(self, axis: int) -> tuple:
        return _view_of(self.shape, axis, self.count)


def _drop_units(dims) -> tuple:
    return tuple(d for d in dims if d != 1)


def _times(dim, count):
    return dim * count if isinstance(dim, int) else f"{dim}*{count}"


def _static(shape) -> bool:
    return shape is not None and all(isinstance(d, int) for d in shape)


class _Builder:
    """New nodes with fresh names, in order."""

    def __init__(self, context, dtype):
        self.context, self.dtype, self.nodes = context, dtype, []

    def node(self, op, inputs, attrs=None, shape=None, dtype=None, base="batched"):
        output = ir.Variable(self.context.fresh(base), dtype=dtype or self.dtype, shape=list(shape) if shape else None)
        self.nodes.append(
            ir.Node(op, self.context.fresh(base + "_" + op.lower()), dict(attrs or {}), list(inputs), [output])
        )
        return output

    def const(self, value, base="batched_const", dtype=None):
        return ir.Constant(self.context.fresh(base), np.asarray(value, dtype or self.dtype))

    def view(self, stacked: Stacked, axis: int) -> ir.Variable:
        """The stacked tensor shaped as the branch shape with dim `axis` times N."""
        target = stacked.view_shape(axis)
        if tuple(stacked.value.shape or ()) == tuple(target):
            return stacked.value
        dims = [d if isinstance(d, int) else 0 for d in target]  # 0 copies a symbolic leading dim
        if any(not isinstance(d, int) for d in target[len(_leading_symbolic(target)) :]):
            return None
        shape = self.const(np.array(dims, np.int64), "batched_shape", np.int64)
        return self.node("Reshape", [stacked.value, shape], shape=target, base="batched_view")


def _leading_symbolic(shape) -> tuple:
    prefix = []
    for d in shape:
        if isinstance(d, int):
            break
        prefix.append(d)
    return tuple(prefix)


# --- heads -------------------------------------------------------------------------------------


def batch_conv_heads(match, context) -> Rewrite | Refusal | None:
    """heads[] = Conv(x, w[], b[]?) with the same attributes and weight shapes -> one Conv whose
    output channels are the heads' stacked, followed by the branches batched."""
    heads = _largest_compatible([h for h in match.nodes["heads"] if h.attrs.get("group", 1) == 1], _conv_key)
    if len(heads) < 2:  # grouped heads would need their output channels interleaved by group
        return None
    shape = tuple(heads[0].outputs[0].shape) if heads[0].outputs[0].shape else None
    if shape is None or len(shape) < 3:
        return Refusal("the heads' output shape is unknown")
    weights = [constant_value(h.inputs[1]) for h in heads]
    biases = [None if len(h.inputs) < 3 or is_absent(h.inputs[2]) else constant_value(h.inputs[2]) for h in heads]
    weight, bias = stack_conv_heads(weights, biases)
    build = _Builder(context, output_dtype(heads[0]))
    inputs = [match.values["x"], build.const(weight, "stacked_weight")]
    if bias is not None:
        inputs.append(build.const(bias, "stacked_bias"))
    value = build.node("Conv", inputs, heads[0].attrs, _view_of(shape, 1, len(heads)), base="stacked_conv")
    return _finish(
        build,
        Stacked(value, shape, _drop_units(shape[:1]), len(heads)),
        [h.outputs[0] for h in heads],
        f"{len(heads)} parallel Convs stacked into one",
    )


def _conv_key(conv):
    return sorted((k, str(v)) for k, v in conv.attrs.items()), constant_value(conv.inputs[1]).shape


def batch_gathered_linears(match, context) -> Rewrite | Refusal | None:
    """heads[] = Gemm(Gather[axis=1](x, i[]), w[], b[]?) -> Gather(x, [i...]) and one batched
    contraction "bni,nio->bno" (W [N, I, O] packed) + b [N, O]; x [B, K, I]. `with: {form:
    matmul | einsum}` picks how the contraction is written (see _contract)."""
    gemms = _largest_compatible(match.nodes["heads"], _gemm_key)
    if len(gemms) < 2:
        return None
    x = match.values["x"]
    if x.shape is None or len(x.shape) != 3 or not _static(x.shape[1:]):
        return Refusal("the gathered tensor needs a [B, K, I] shape with static K and I")
    indices = [int(constant_value(g.inputs[0].inputs[0].inputs[1])) % x.shape[1] for g in gemms]
    transposed = bool(gemms[0].attrs.get("transB", 0))
    biases = [None if len(g.inputs) < 3 or is_absent(g.inputs[2]) else constant_value(g.inputs[2]) for g in gemms]
    out_features = constant_value(gemms[0].inputs[1]).shape[0 if transposed else 1]
    if any(b is not None and not _per_column(np.asarray(b), out_features) for b in biases):
        return Refusal("a Gemm bias varies over the batch")
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
            [x, build.const(np.array(indices, np.int64), "indices", np.int64)],
            {"axis": 1},
            (batch, n, x.shape[2]),
            base="gathered",
        )
    value = _contract(
        build,
        gathered,
        build.const(weight, "packed_weight"),
        (batch, n, weight.shape[2]),
        context.params.get("form", "matmul"),
    )
    if bias is not None:
        value = build.node(
            "Add", [value, build.const(bias, "packed_bias")], shape=(batch, n, weight.shape[2]), base="packed_bias_add"
        )
    shape = (batch, weight.shape[2])
    return _finish(
        build,
        Stacked(value, shape, _drop_units(shape[:1]), n),
        [g.outputs[0] for g in gemms],
        f"{n} Gemms on gathered rows as one batched {context.params.get('form', 'matmul')}",
    )


def _contract(build, rows, weight, shape, form: str):
    """[B, N, I] x [N, I, O] -> [B, N, O], as `einsum` ("bni,nio->bno") or as `matmul`
    (Transpose to [N, B, I], a batched MatMul, Transpose back). The default is matmul: ONNX
    Runtime's CPU Einsum is a generic contraction, slower than its batched GEMM at every size
    measured (bench/RESULTS.md, "Measurements behind the code")."""
    if form == "einsum":
        return build.node("Einsum", [rows, weight], {"equation": "bni,nio->bno"}, shape, base="einsum")
    if form != "matmul":
        raise ValueError(f"form must be matmul or einsum, not {form!r}")
    batch, n, _ = shape
    by_class = build.node("Transpose", [rows], {"perm": [1, 0, 2]}, base="by_class")
    product = build.node("MatMul", [by_class, weight], shape=(n, batch, shape[2]), base="batched_matmul")
    return build.node("Transpose", [product], {"perm": [1, 0, 2]}, shape, base="by_row")


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


def batch_split_branches(match, context) -> Rewrite | Refusal | None:
    """*parts = Split(x): when every part goes through the same ops, do them once on x."""
    split = match.root
    parts = list(split.outputs)
    shapes = {tuple(p.shape) if p.shape else None for p in parts}
    axis = attribute_or(split, "axis", context.opset, 0)
    if len(shapes) != 1 or None in shapes:
        return None
    shape = next(iter(shapes))
    axis = axis % len(shape)
    build = _Builder(context, output_dtype(split))
    stacked = Stacked(match.values["x"], shape, _drop_units(shape[:axis]), len(parts))
    return _finish(build, stacked, parts, "Split branches batched", require_step=True)


def _largest_compatible(nodes, key):
    """The heads sharing the most common key, in the match's order."""
    groups: dict = {}
    for node in nodes:
        groups.setdefault(repr(key(node)), []).append(node)
    return max(groups.values(), key=len) if groups else []


# --- the walk -----------------------------------------------------------------------------------


def _finish(build, stacked: Stacked, ends, note, require_step=False) -> Rewrite | Refusal | None:
    steps = 0
    while True:
        readers = _single_readers(ends, build.context.graph)
        if readers is None:
            break
        joined = _join(build, stacked, ends, readers)
        if joined is not None:
            output, value = joined
            return Rewrite(
                build.nodes,
                [(output, value)],
                f"{note}; {steps} step(s) batched, joined by a Concat",
                extra={"branches": stacked.count, "batched_steps": steps},
            )
        advanced = _step(build, stacked, ends, readers)
        if advanced is None:
            break
        stacked, ends = advanced
        steps += 1
    if require_step and steps == 0:
        return None
    return _split_back(build, stacked, ends, note, steps)


def _single_readers(ends, graph):
    """Each end's only reader (one node per branch, distinct), or None."""
    outputs = {id(t) for t in graph.outputs}
    readers = []
    for end in ends:
        if id(end) in outputs or len(end.outputs) != 1:
            return None
        readers.append(end.outputs[0])
    return readers


def _join(build, stacked: Stacked, ends, readers):
    """A Concat whose inputs are exactly the ends, in order, along an axis where they stack."""
    concat = readers[0]
    if (
        concat.op != "Concat"
        or any(r is not concat for r in readers)
        or len(concat.inputs) != len(ends)
        or any(a is not b for a, b in zip(concat.inputs, ends))
    ):
        return None
    axis = concat.attrs["axis"] % len(stacked.shape)
    if axis not in stacked.axes():
        return None
    view = build.view(stacked, axis)
    return (concat.outputs[0], view) if view is not None else None


def _split_back(build, stacked: Stacked, ends, note, steps) -> Rewrite | Refusal:
    """No join: one Split of the stacked tensor hands each branch end its slice."""
    axes = [a for a in stacked.axes() if a < len(stacked.shape)]
    if not axes:
        return Refusal("the batched branches cannot be split back")
    axis = axes[-1]
    view = build.view(stacked, axis)
    if view is None:
        return Refusal("the batched branches cannot be split back (symbolic dims)")
    sizes = build.const(np.full(stacked.count, stacked.shape[axis], np.int64), "split_sizes", np.int64)
    outputs = [ir.Variable(build.context.fresh("branch"), dtype=build.dtype, shape=list(stacked.shape)) for _ in ends]
    build.nodes.append(ir.Node("Split", build.context.fresh("batched_split"), {"axis": axis}, [view, sizes], outputs))
    return Rewrite(
        build.nodes,
        list(zip(ends, outputs)),
        f"{note}; {steps} step(s) batched, then split",
        extra={"branches": stacked.count, "batched_steps": steps},
    )


def _same_attrs(nodes) -> bool:
    first = nodes[0]
    return all(n.op == first.op and n.attrs == first.attrs and len(n.inputs) == len(first.inputs) for n in nodes)


def _step(build, stacked: Stacked, ends, readers):
    """Batch one op applied by every branch to its end; None when they differ or it cannot be."""
    if not _same_attrs(readers) or any(len(r.outputs) != 1 for r in readers):
        return None
    op = readers[0].op
    out_shape = readers[0].outputs[0].shape
    out_shape = tuple(out_shape) if out_shape else None
    if out_shape is None or any(tuple(r.outputs[0].shape or ()) != out_shape for r in readers):
        return None
    new_ends = [r.outputs[0] for r in readers]
    if op in UNARY and all(r.inputs[0] is e for r, e in zip(readers, ends)) and _shared_rest(readers, 1):
        value = build.node(
            op,
            [stacked.value, *readers[0].inputs[1:]],
            readers[0].attrs,
            stacked.value.shape,
            dtype=readers[0].outputs[0].dtype,
        )
        return replace(stacked, value=value), new_ends
    if op in BINARY:
        return _binary_step(build, stacked, ends, readers, out_shape)
    if op == "Conv":
        return _conv_step(build, stacked, ends, readers, out_shape)
    if op in REDUCE or op in CHANNEL_POOLS:
        return _reduce_step(build, stacked, ends, readers, out_shape)
    if op in RESHAPES and all(r.inputs[0] is e for r, e in zip(readers, ends)) and _shared_rest(readers, 1):
        return _reshape_step(build, stacked, readers, out_shape)
    return None


def _shared_rest(readers, start) -> bool:
    """Inputs from `start` on are the same tensor (or equal constants) in every branch."""
    return all(_same_value([reader.inputs[i] for reader in readers]) for i in range(start, len(readers[0].inputs)))


def _same_value(tensors) -> bool:
    """One tensor, or constants of equal value."""
    first = tensors[0]
    for other in tensors[1:]:
        if other is first:
            continue
        va, vb = constant_value(first), constant_value(other)
        if va is None or vb is None or va.shape != vb.shape or not np.array_equal(va, vb):
            return False
    return True


def _binary_step(build, stacked, ends, readers, out_shape):
    """end (op) r with the same r in every branch; r tiled N times along the block axis when
    it has the branch's extent there, used as it is when it broadcasts over the block."""
    position = [0 if r.inputs[0] is e else 1 if r.inputs[1] is e else None for r, e in zip(readers, ends)]
    if None in position or len(set(position)) != 1 or out_shape != stacked.shape:
        return None
    other = [r.inputs[1 - position[0]] for r in readers]
    if not _same_value(other):
        return None
    operand = other[0]
    op_shape = tuple(operand.shape) if operand.shape is not None else None
    if op_shape is None:
        return None
    rank = len(stacked.shape)
    aligned = (1,) * (rank - len(op_shape)) + op_shape
    if len(aligned) != rank:
        return None
    for axis in reversed(stacked.axes()):
        if axis >= rank:
            continue
        view = build.view(stacked, axis)
        if view is None:
            continue
        if aligned[axis] == 1:
            tiled = operand
        elif aligned[axis] == stacked.shape[axis] and all(a in (1, s) for a, s in zip(aligned, stacked.shape)):
            repeats = build.const(
                np.array([stacked.count if i == axis else 1 for i in range(rank)], np.int64), "repeats", np.int64
            )
            source = operand
            if len(op_shape) != rank:
                source = build.node(
                    "Reshape",
                    [operand, build.const(np.array(aligned, np.int64), "shape", np.int64)],
                    shape=aligned,
                    base="aligned",
                )
            tiled = build.node("Tile", [source, repeats], shape=_view_of(aligned, axis, stacked.count), base="tiled")
        else:
            continue
        inputs = [view, tiled] if position[0] == 0 else [tiled, view]
        value = build.node(readers[0].op, inputs, readers[0].attrs, stacked.view_shape(axis))
        return replace(stacked, value=value), [r.outputs[0] for r in readers]
    return None


def _conv_step(build, stacked, ends, readers, out_shape):
    """Conv_n on branch n's C channels -> one Conv with N times the groups over N*C channels."""
    if 1 not in stacked.axes() or any(r.inputs[0] is not e for r, e in zip(readers, ends)):
        return None
    weights = [constant_value(r.inputs[1]) for r in readers]
    has_bias = [len(r.inputs) > 2 and not is_absent(r.inputs[2]) for r in readers]
    biases = [constant_value(r.inputs[2]) if b else None for r, b in zip(readers, has_bias)]
    if any(w is None for w in weights) or any(b and v is None for b, v in zip(has_bias, biases)):
        return None
    if len({w.shape for w in weights}) != 1:
        return None
    view = build.view(stacked, 1)
    if view is None:
        return None
    weight, bias, group = grouped_from_branches(weights, biases, int(readers[0].attrs.get("group", 1)))
    inputs = [view, build.const(weight, "grouped_weight")]
    if bias is not None:
        inputs.append(build.const(bias, "grouped_bias"))
    attrs = {**readers[0].attrs, "group": group}
    value = build.node(
        "Conv", inputs, attrs, (out_shape[0], out_shape[1] * stacked.count, *out_shape[2:]), base="grouped_conv"
    )
    return Stacked(value, out_shape, _drop_units(out_shape[:1]), stacked.count), [r.outputs[0] for r in readers]


def _reduce_step(build, stacked, ends, readers, out_shape):
    """A reduction or pooling that stays inside each branch's block."""
    reader = readers[0]
    if not _shared_rest(readers, 1) or any(r.inputs[0] is not e for r, e in zip(readers, ends)):
        return None
    rank = len(stacked.shape)
    if reader.op in CHANNEL_POOLS:
        reduced, axis = set(range(2, rank)), 1
        if axis not in stacked.axes():
            return None
    else:
        axes_input = (
            constant_value(reader.inputs[1])
            if len(reader.inputs) > 1 and not is_absent(reader.inputs[1])
            else reader.attrs.get("axes")
        )
        if axes_input is None:
            return None
        reduced = {int(a) % rank for a in np.asarray(axes_input).reshape(-1)}
        candidates = [a for a in stacked.axes() if a < rank and all(r > a for r in reduced)]
        if not candidates:
            return None
        axis = candidates[-1]
    view = build.view(stacked, axis)
    if view is None:
        return None
    keep = reader.op in CHANNEL_POOLS or bool(reader.attrs.get("keepdims", 1))
    value = build.node(
        reader.op, [view, *reader.inputs[1:]], reader.attrs, _view_of(out_shape, axis, stacked.count) if keep else None
    )
    return Stacked(value, out_shape, stacked.prefix, stacked.count), [r.outputs[0] for r in readers]


def _view_of(shape, axis, count):
    return (*shape[:axis], _times(shape[axis], count), *shape[axis + 1 :])


def _reshape_step(build, stacked, readers, out_shape):
    """Reshape, Unsqueeze, Squeeze or Flatten of each branch: the same memory, as long as the
    branch's prefix survives (the new shape starts the block at some axis)."""
    moved = Stacked(stacked.value, out_shape, stacked.prefix, stacked.count)
    if not moved.axes():
        return None
    return moved, [r.outputs[0] for r in readers]
