"""Finding N identical branches (the finding half of TVM's combine_parallel, on ONNX graphs).

From N branch starts laid out as one stacked tensor (sibling Convs' outputs, gathered rows, the
outputs of one Split), follow the branches in lockstep while each branch's only reader is the
same op with the same attributes, one each, and stop at the first difference. A final Concat
of all branch ends, in order, is the join; without one, the branches are split back where they
stop. The result is a BranchGroup: what each step is and how the stacked tensor is laid out
before and after it. batch_branches.py builds the nodes from it; nothing here builds any.

The stacked tensor's memory is [prefix][branch n][branch block]: branch n's tensor of shape S
is the n-th block after the prefix dims S[:a]. Any shape with that memory is a view of it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .. import ir
from ..algebra import Refusal
from ..ir import constant_value, is_absent

UNARY = {
    "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Elu", "Selu", "Gelu", "HardSigmoid", "HardSwish", "Softplus",
    "Softsign", "Erf", "Neg", "Abs", "Exp", "Sqrt", "Reciprocal", "Clip", "Mish", "Identity", "Cast",
}  # fmt: skip
BINARY = {"Add", "Sub", "Mul", "Div"}
REDUCE = {
    "ReduceMax", "ReduceMin", "ReduceMean", "ReduceSum", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSumExp",
    "ReduceSumSquare",
}  # fmt: skip
CHANNEL_POOLS = {"GlobalMaxPool", "GlobalAveragePool", "MaxPool", "AveragePool", "LpPool", "GlobalLpPool"}
RESHAPES = {"Reshape", "Unsqueeze", "Squeeze", "Flatten"}


@dataclass(frozen=True)
class Layout:
    """N branch tensors of shape `shape` held as one stacked tensor of shape `held` (None where
    unknown): see the module doc."""

    shape: tuple
    prefix: tuple  # the branch dims before the block, unit dims dropped
    count: int
    held: tuple | None

    def axes(self) -> list[int]:
        """Axes a of the branch shape at which the block starts (shape[:a] is the prefix)."""
        return [a for a in range(len(self.shape) + 1) if drop_units(self.shape[:a]) == self.prefix]

    def view_shape(self, axis: int) -> tuple:
        """The stacked tensor as the branch shape with dim `axis` times N."""
        return view_of(self.shape, axis, self.count)

    def viewable(self, axis: int) -> bool:
        """Whether the stacked tensor can be shaped as view_shape(axis): it already is, or a
        Reshape can say so (symbolic dims only at the front, where a 0 copies them)."""
        target = self.view_shape(axis)
        if tuple(self.held or ()) == tuple(target):
            return True
        leading = len(_leading_symbolic(target))
        return all(isinstance(d, int) for d in target[leading:])


@dataclass(frozen=True)
class Step:
    """One op every branch applies to its end, done once on the stacked tensor.

    kind: "unary" (the op on the stacked tensor as it is), "binary" (the op with the branches'
    shared `operand`, tiled N times along `axis` when `tile`), "conv" (the branches' Convs as
    one Conv with N times the groups), "reduce" (a reduction or pooling inside each block) or
    "reshape" (no node: the same memory seen with the new branch shape)."""

    kind: str
    readers: tuple  # each branch's node, in branch order
    before: Layout
    after: Layout
    axis: int | None = None  # the view of the stacked tensor the op reads
    operand: object = None  # binary: the shared other input
    operand_first: bool = False  # binary: the operand is the op's first input
    tile: bool = False  # binary: the operand is tiled N times along `axis`


@dataclass(frozen=True)
class BranchGroup:
    """Branches found from `start`: the steps batched, then a join (the Concat of all ends, read
    as the stacked tensor's view at `axis`) or a split back along `axis` into `ends`."""

    start: Layout
    steps: tuple[Step, ...]
    ends: tuple  # the branch ends after the last step
    axis: int
    join: ir.Node | None

    @property
    def last(self) -> Layout:
        return self.steps[-1].after if self.steps else self.start


def find_branch_group(start: Layout, ends: list, graph: ir.Graph, require_step: bool = False) -> BranchGroup:
    """The branches from `ends` (branch n's start, laid out as `start`), as far as they go in
    lockstep; a Refusal where they cannot be split back (not reported when `require_step` and
    not even one step is shared)."""
    layout, steps = start, []
    while (readers := _single_readers(ends, graph)) is not None:
        axis = _join_axis(layout, ends, readers)
        if axis is not None:
            return BranchGroup(start, tuple(steps), tuple(ends), axis, readers[0])
        step = _step(layout, ends, readers)
        if step is None:
            break
        steps.append(step)
        layout, ends = step.after, [r.outputs[0] for r in readers]
    if require_step and not steps:
        raise Refusal("the branches share no op to batch", reported=False)
    axes = [a for a in layout.axes() if a < len(layout.shape)]
    if not axes:
        raise Refusal("the batched branches cannot be split back")
    if not layout.viewable(axes[-1]):
        raise Refusal("the batched branches cannot be split back (symbolic dims)")
    return BranchGroup(start, tuple(steps), tuple(ends), axes[-1], None)


def largest_compatible(nodes, key):
    """The heads sharing the most common key, in the match's order."""
    groups: dict = {}
    for node in nodes:
        groups.setdefault(repr(key(node)), []).append(node)
    return max(groups.values(), key=len) if groups else []


def drop_units(dims) -> tuple:
    return tuple(d for d in dims if d != 1)


def view_of(shape, axis, count) -> tuple:
    """`shape` with dim `axis` times `count` (a symbolic dim as "dim*count")."""
    dim = shape[axis]
    return (*shape[:axis], dim * count if isinstance(dim, int) else f"{dim}*{count}", *shape[axis + 1 :])


def _leading_symbolic(shape) -> tuple:
    prefix = []
    for d in shape:
        if isinstance(d, int):
            break
        prefix.append(d)
    return tuple(prefix)


def _single_readers(ends, graph):
    """Each end's only reader (one node per branch), or None."""
    outputs = {id(t) for t in graph.outputs}
    readers = []
    for end in ends:
        if id(end) in outputs or len(end.outputs) != 1:
            return None
        readers.append(end.outputs[0])
    return readers


def _join_axis(layout: Layout, ends, readers) -> int | None:
    """The axis of a Concat whose inputs are exactly the ends, in order, along an axis where
    they stack and the stacked tensor can be viewed; None for anything else."""
    concat = readers[0]
    if (
        concat.op != "Concat"
        or any(r is not concat for r in readers)
        or len(concat.inputs) != len(ends)
        or any(a is not b for a, b in zip(concat.inputs, ends))
    ):
        return None
    axis = concat.attrs["axis"] % len(layout.shape)
    return axis if axis in layout.axes() and layout.viewable(axis) else None


def _step(layout: Layout, ends, readers) -> Step | None:
    """The op every branch applies to its end as one Step; None when they differ or it cannot be batched."""
    first = readers[0]
    if any(r.op != first.op or r.attrs != first.attrs or len(r.inputs) != len(first.inputs) for r in readers):
        return None
    if any(len(r.outputs) != 1 for r in readers):
        return None
    out_shape = tuple(first.outputs[0].shape) if first.outputs[0].shape else None
    if out_shape is None or any(tuple(r.outputs[0].shape or ()) != out_shape for r in readers):
        return None
    reads_ends = all(r.inputs[0] is e for r, e in zip(readers, ends))
    readers = tuple(readers)
    if first.op in UNARY and reads_ends and _shared_rest(readers, 1):
        return Step("unary", readers, layout, layout)
    if first.op in BINARY:
        return _binary_step(layout, ends, readers, out_shape)
    if first.op == "Conv" and reads_ends:
        return _conv_step(layout, readers, out_shape)
    if (first.op in REDUCE or first.op in CHANNEL_POOLS) and reads_ends and _shared_rest(readers, 1):
        return _reduce_step(layout, readers, out_shape)
    if first.op in RESHAPES and reads_ends and _shared_rest(readers, 1):
        moved = replace(layout, shape=out_shape)
        return Step("reshape", readers, layout, moved) if moved.axes() else None
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


def _binary_step(layout: Layout, ends, readers, out_shape) -> Step | None:
    """end (op) r with the same r in every branch; r tiled N times along the block axis when
    it has the branch's extent there, used as it is when it broadcasts over the block."""
    position = [0 if r.inputs[0] is e else 1 if r.inputs[1] is e else None for r, e in zip(readers, ends)]
    if None in position or len(set(position)) != 1 or out_shape != layout.shape:
        return None
    other = [r.inputs[1 - position[0]] for r in readers]
    if not _same_value(other) or other[0].shape is None:
        return None
    rank, op_shape = len(layout.shape), tuple(other[0].shape)
    aligned = (1,) * (rank - len(op_shape)) + op_shape
    if len(aligned) != rank:
        return None
    for axis in reversed(layout.axes()):
        if axis >= rank or not layout.viewable(axis):
            continue
        fits = aligned[axis] == layout.shape[axis] and all(a in (1, s) for a, s in zip(aligned, layout.shape))
        if aligned[axis] == 1 or fits:
            after = replace(layout, held=layout.view_shape(axis))
            return Step("binary", readers, layout, after, axis, other[0], position[0] == 1, aligned[axis] != 1)
    return None


def _conv_step(layout: Layout, readers, out_shape) -> Step | None:
    """Conv_n on branch n's C channels -> one Conv with N times the groups over N*C channels."""
    if 1 not in layout.axes() or not layout.viewable(1):
        return None
    weights = [constant_value(r.inputs[1]) for r in readers]
    has_bias = [len(r.inputs) > 2 and not is_absent(r.inputs[2]) for r in readers]
    biases_missing = any(b and constant_value(r.inputs[2]) is None for r, b in zip(readers, has_bias))
    if any(w is None for w in weights) or biases_missing:
        return None
    if len({w.shape for w in weights}) != 1:
        return None
    held = (out_shape[0], out_shape[1] * layout.count, *out_shape[2:])
    return Step("conv", readers, layout, Layout(out_shape, drop_units(out_shape[:1]), layout.count, held), 1)


def _reduce_step(layout: Layout, readers, out_shape) -> Step | None:
    """A reduction or pooling that stays inside each branch's block."""
    reader, rank = readers[0], len(layout.shape)
    if reader.op in CHANNEL_POOLS:
        axis = 1
        if axis not in layout.axes():
            return None
    else:
        given = reader.inputs[1] if len(reader.inputs) > 1 and not is_absent(reader.inputs[1]) else None
        axes_input = constant_value(given) if given is not None else reader.attrs.get("axes")
        if axes_input is None:
            return None
        reduced = {int(a) % rank for a in np.asarray(axes_input).reshape(-1)}
        candidates = [a for a in layout.axes() if a < rank and all(r > a for r in reduced)]
        if not candidates:
            return None
        axis = candidates[-1]
    if not layout.viewable(axis):
        return None
    keep = reader.op in CHANNEL_POOLS or bool(reader.attrs.get("keepdims", 1))
    held = view_of(out_shape, axis, layout.count) if keep else None
    return Step("reduce", readers, layout, Layout(out_shape, layout.prefix, layout.count, held), axis)
