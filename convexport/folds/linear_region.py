"""A linear region of the last axis: everything between one tensor x and an Add or Sub that is
a dense or per-feature map of x -> one dense node of x.

The region's nodes are dense nodes (Gemm, MatMul by a constant [C, D]), per-feature maps
(BatchNormalization on [N, C], Mul / Div / Add / Sub by a constant along the last axis),
Reshapes and Flattens that keep the last axis, and Adds and Subs of two region values; every
value inside is read only inside (so the fold removes work), and the one tensor they all start
from is x. Each value v is then a map of x's rows, v = x M_v + c_v (M_v [C, D_v], float64):

    dense     v W + b   ->  (M W, c W + b)
    feature   v * s + t ->  (M diag(s), c s + t)
    sum       u +- v    ->  (M_u +- M_v, c_u +- c_v)   u, v of one shape (no broadcast)
    reshape   keeps the last axis and the order of rows -> (M, c)

and the root is x M + c: one Gemm where x is 2-D, else one MatMul and an Add of the bias
(dense_chain.dense_layout). Rows keep their order through every node, so where the root has
x's leading dims the fold is exact; elsewhere it is refused.

This is what a tree of chains (sum_dense_branches) cannot see: DoRA, W x + (c - 1)(W x) +
c B A x, reads W x twice; GPT-2's Conv1D is Reshape -> Gemm -> Reshape around the base weight
while its LoRA pair reads x unflattened.
"""

from __future__ import annotations

import numpy as np

from .. import ir
from ..algebra import Refusal
from ..algebra.dense import Dense, FeatureAffine, LinearMap, add_maps, compose_maps
from ..ir import attribute_or, constant_value
from .builder import output_dtype
from .dense_chain import DENSE_OPS, dense_layout, emitted_dense, keeps_last_axis, node_map
from .half_rounding import refuse_if_rounding_undoes, rounded_map, stored_half
from .linear_nodes import data_input
from .primitives import AFFINE, Rewrite, builtin, consumes, reach

MAX_DEPTH = 24  # nodes in a region: DoRA's has 9, GPT-2's LoRA on Conv1D 6; a bound on the walk per sum
SUMS = ("Add", "Sub")


@builtin
@reach(MAX_DEPTH)
@consumes(every_line=True, root={"Add", "Sub"})
def fold_linear_region(match, context) -> Rewrite:
    """y = Add/Sub(u, v) where u and v are linear in one tensor x through a region of dense,
    per-feature, reshape and sum nodes read only inside it -> one dense node of x."""
    root = match.root
    if not _is_sum(root):
        raise Refusal(f"{root.name}: an {root.op} of a constant is no sum of two branches", reported=False)
    x, nodes = _region(root, context.graph.outputs)
    if not any(node.op in DENSE_OPS for node in nodes):
        raise Refusal("no Gemm or MatMul in the region", reported=False)
    _check_rows(x, root, nodes)
    readers = [node for node in nodes if any(value is x for value in node.inputs)]
    layout = dense_layout(x, readers, nodes, len(nodes), context.opset)
    dense, sums_x = _region_map(x, nodes, context.opset)
    _check_cost(nodes, dense)
    half = context.half or stored_half(output_dtype(root))
    if half is not None and sums_x:
        from_rounded, _ = _region_map(x, nodes, context.opset, rounded_to=half)
        refuse_if_rounding_undoes(dense.weight, from_rounded.weight, half)
    sums = sum(map(_is_sum, nodes))
    note = f"a linear region of {len(nodes)} nodes ({sums} sums) folded into one"
    return emitted_dense(context, x, dense, layout, root, note)


def _region(root: ir.Node, graph_outputs) -> tuple[object, list[ir.Node]]:
    """(x, the region's nodes in graph order): grown back from the root one value at a time,
    a value whose maker is a region op and whose every reader has joined; x is the value where
    the walk narrows to one (the widest region that does). A value still read by a node that
    has not joined waits: the walk cannot pass x before every path from the root reaches it."""
    outputs = set(map(id, graph_outputs))
    region: list[ir.Node] = [root]
    members = {id(root)}
    frontier = {id(value): value for value in _operands(root)}
    best = None
    while len(region) <= MAX_DEPTH:
        if len(frontier) == 1:
            best = (next(iter(frontier.values())), list(region))
        value = next((value for value in frontier.values() if _joins(value, members, outputs)), None)
        if value is None:
            break
        del frontier[id(value)]
        maker = value.inputs[0]
        region.append(maker)
        members.add(id(maker))
        for operand in _operands(maker):
            frontier[id(operand)] = operand
    if best is None or len(best[1]) < 2:
        raise Refusal("its operands are not linear in one tensor", reported=False)
    x, nodes = best
    return x, nodes[::-1]


def _joins(value, members: set[int], outputs: set[int]) -> bool:
    """Whether the value's maker may join the region: a region op, the value read only by members."""
    maker = value.inputs[0] if isinstance(value, ir.Variable) and value.inputs else None
    return (
        maker is not None
        and id(value) not in outputs
        and _is_region_op(maker)
        and all(id(reader) in members for reader in value.outputs)
    )


def _operands(node: ir.Node) -> list:
    """The run-time inputs a region node computes from (a sum's two, another's data input)."""
    if _is_sum(node):
        return list(node.inputs[:2])
    return [data_input(node)]


def _is_sum(node: ir.Node) -> bool:
    return node.op in SUMS and all(constant_value(value) is None for value in node.inputs[:2])


def _is_region_op(node: ir.Node) -> bool:
    if node.op in DENSE_OPS:
        return constant_value(node.inputs[1]) is not None and constant_value(node.inputs[0]) is None
    if node.op in ("Reshape", "Flatten"):
        return keeps_last_axis(node)
    if _is_sum(node):
        return True
    return node.op in AFFINE and any(constant_value(value) is not None for value in node.inputs)


def _check_rows(x, root: ir.Node, nodes: list[ir.Node]) -> None:
    """Refused unless rows map to rows: the root has x's leading dims, and each sum's operands
    one shape (a broadcast would mix rows); shapes compared as known, symbolic dims by name."""
    x_shape, out_shape = getattr(x, "shape", None), root.outputs[0].shape
    if x_shape is None or out_shape is None or not _known(x_shape) or not _known(out_shape):
        raise Refusal(f"{root.name}: the shapes of {x.name} and of its output are not known")
    if list(out_shape[:-1]) != list(x_shape[:-1]):
        raise Refusal(f"{root.name}: its output {list(out_shape)} does not keep the leading dims of {list(x_shape)}")
    for node in nodes:
        if _is_sum(node):
            first, second = (getattr(value, "shape", None) for value in node.inputs[:2])
            if first is None or second is None or not _known(first) or list(first) != list(second):
                raise Refusal(f"{node.name}: its operands' shapes {first} and {second} are not one known shape")


def _known(shape) -> bool:
    return all(isinstance(dim, int) or dim for dim in shape)


def _features(x, nodes: list[ir.Node], opset: int) -> int:
    """x's last dim: from its shape, or, where a reshape to `[*dims, -1]` left it unknown (a
    dynamic batch and sequence), from the rows of a dense node's weight that reads x (a valid
    MatMul of x by a [C, D] constant has C there)."""
    if isinstance(x.shape[-1], int):
        return x.shape[-1]
    for node in nodes:
        gemm = node.op == "Gemm"
        if node.op in DENSE_OPS and node.inputs[0] is x and not (gemm and attribute_or(node, "transA", opset, 0)):
            weight = constant_value(node.inputs[1])
            if weight.ndim == 2:
                return weight.shape[1] if gemm and attribute_or(node, "transB", opset, 0) else weight.shape[0]
    raise Refusal(f"{x.name}: its last dim {x.shape[-1]} is not known")


def _region_map(x, nodes: list[ir.Node], opset: int, rounded_to: str | None = None) -> tuple[Dense, bool]:
    """x M + c of the root, each node's map composed in graph order from x's identity, and
    whether a sum adds x through per-feature maps alone (x + x W: an exact branch for
    half_rounding.py); with `rounded_to`, each node's constants rounded into that half type first."""
    features = _features(x, nodes, opset)
    maps: dict[int, LinearMap] = {id(x): FeatureAffine(np.ones(features), np.zeros(features))}
    sums_x = False
    for node in nodes:
        try:
            if _is_sum(node):
                sign = -1.0 if node.op == "Sub" else 1.0
                operands = [maps[id(value)] for value in node.inputs[:2]]
                sums_x |= any(isinstance(operand, FeatureAffine) for operand in operands)
                found = add_maps(*operands, sign)
            else:
                step = node_map(node, opset, reads_x=data_input(node) is x)
                if rounded_to is not None:
                    step = rounded_map(step, rounded_to)
                found = compose_maps(maps[id(data_input(node))], step)
        except Refusal as refusal:
            raise Refusal(f"{node.name}: {refusal.reason}", reported=refusal.reported) from None
        maps[id(node.outputs[0])] = found
    result = maps[id(nodes[-1].outputs[0])]
    if not isinstance(result, Dense):
        raise Refusal("the region is a per-feature map alone", reported=False)
    return result, sums_x


def _check_cost(nodes: list[ir.Node], dense: Dense) -> None:
    """Refused where the one [C, D] product costs more multiply-adds per row than the region's
    dense nodes together (a low-rank pair with no full-width layer beside it)."""
    kept = sum(int(np.prod(constant_value(node.inputs[1]).shape)) for node in nodes if node.op in DENSE_OPS)
    composed = dense.in_features * dense.out_features
    if composed > kept:
        raise Refusal(
            f"one {dense.in_features} x {dense.out_features} product ({composed} multiply-adds per row) costs "
            f"more than the region's dense nodes ({kept})"
        )
