"""Chains and sums of dense nodes on the last axis -> one Gemm, or one MatMul (+ Add of the bias).

A dense node is a Gemm, or a MatMul whose weight is one constant [C, D] matrix; a per-feature
node is a BatchNormalization on [N, C] or a Mul / Div / Add / Sub by a constant that broadcasts
along the last axis only (algebra/dense.py holds the algebra, in float64); a Reshape or Flatten
that keeps the last axis is the identity between them, where the chain ends in the dense
output's shape. The result is one Gemm where x is 2-D and the chain held a Gemm or leaves a
bias, else a MatMul (weights act on the last axis, batch dims broadcast) and an Add of the
bias; a rewrite that would not leave fewer nodes is not made (that also keeps the rules from
undoing each other).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import ir
from ..algebra import Refusal, batchnorm_scale_shift
from ..algebra.dense import (
    Dense,
    FeatureAffine,
    LinearMap,
    elementwise_affine,
    fold_chain,
    gemm_dense,
    last_axis_vector,
    sum_dense,
)
from ..ir import attribute_or, constant_value, is_absent
from .builder import NodeBuilder
from .convnodes import all_finite
from .linear_nodes import ELEMENTWISE, data_input
from .primitives import AFFINE, DENSE, Rewrite, accepts, builtin, consumes, reach

DENSE_OPS = ("Gemm", "MatMul")


@builtin
@reach(0)
@consumes("x", every_line=True, root=DENSE | AFFINE | {"Reshape"})
def fold_dense_chain(match, context) -> Rewrite:
    """root(...first(x)): a chain of dense and per-feature nodes from x -> one dense node of x.
    Two dense nodes through a narrow r stay where composing costs more (C*D > r*(C+D))."""
    x, root = match.values["x"], match.root
    chain = _chain(root.outputs[0], x, match.node_list())
    final_shape = _final_reshape(x, chain, context)
    mapped = chain[:-1] if root.op == "Reshape" else chain  # a last Reshape is applied again after the fold
    layout = dense_layout(x, mapped[:1], mapped, len(chain) - (final_shape is not None), context.opset)
    dense = _branch_map(mapped, context.opset, keep_low_rank=True)
    note = " -> ".join(node.op for node in chain) + " folded into one"
    return emitted_dense(context, x, dense, layout, root, note, final_shape)


def _final_reshape(x, chain: list[ir.Node], context) -> ir.Tensor | None:
    """What the folded dense output is reshaped to: None where the chain ends in the dense
    output's shape (x's leading dims and D), the shape input to give a Reshape where it ends in
    a Reshape to another shape (LeViT's Linear_BN reshaped straight to heads, [B*N, D] ->
    [B, N, H, D/H]). The chain is then Reshape(g(Reshape(dense(x), s1)), s2) with g per
    feature: g commutes with the Reshapes that keep the last axis, and a Reshape of a Reshape
    is the last one's where its shape copies no dim of its input (a 0 without allowzero); else
    the output's static shape serves, or the fold is refused."""
    last, output = chain[-1], chain[-1].outputs[0]
    features = chain[0].outputs[0].shape[-1] if chain[0].outputs[0].shape else None
    x_shape = getattr(x, "shape", None)
    known = x_shape is not None and all(isinstance(dim, int) or dim for dim in (*x_shape, features))
    if known and output.shape is not None and list(output.shape) == [*x_shape[:-1], features]:
        return None  # (a symbolic dim is the same dim where shape inference gives it the same name)
    if not any(node.op in ("Reshape", "Flatten") for node in chain):
        return None
    if last.op != "Reshape":
        raise Refusal(f"{last.name}: the Reshapes do not give back the shape of the dense output")
    target = constant_value(last.inputs[1])
    if target is None:
        raise Refusal(f"{last.name}: its shape is computed at run time")
    if attribute_or(last, "allowzero", context.opset, 0) or not np.any(np.asarray(target) == 0):
        return last.inputs[1]
    if output.shape is None or not all(isinstance(dim, int) for dim in output.shape):
        raise Refusal(f"{last.name}: its shape copies a dim (0) of its input, and its output's shape is not static")
    return ir.Constant(context.fresh(output.name + "_shape"), np.array(output.shape, np.int64))


@builtin
@reach(0)
@accepts("signs")
@consumes("x", every_line=True, root={"Add", "Sub"})
def sum_dense_branches(match, context) -> Rewrite:
    """sum_i sign_i branch_i(x), each branch a chain of dense and per-feature nodes from x (a
    Gemm, a MatMul, LoRA's MatMul(MatMul(x, A), B)) -> one dense node of x with the summed
    weight; `with: {signs: [...]}` (default all +1). Always pays: one [C, D] product instead
    of at least one per branch."""
    x, root = match.values["x"], match.root
    signs = [float(s) for s in context.params.get("signs", [1.0] * len(root.inputs))]
    nodes = match.node_list()
    chains = [_chain(tensor, x, nodes) for tensor in root.inputs]
    layout = dense_layout(
        x, [chain[0] for chain in chains if chain], [n for chain in chains for n in chain], len(nodes), context.opset
    )
    # the sum replaces every branch: composing one through a narrow r never costs more
    terms = [_branch_map(chain, context.opset, keep_low_rank=False) for chain in chains]
    dense = sum_dense(terms, signs)
    return emitted_dense(context, x, dense, layout, root, f"{root.op} of {len(chains)} dense branches merged into one")


def _chain(tensor, x, nodes: list[ir.Node]) -> list[ir.Node]:
    """The matched nodes from x to `tensor`, each reading the last one's output as its data."""
    chain = []
    while tensor is not x:
        producer = tensor.inputs[0] if tensor.inputs else None
        if producer is None or all(producer is not node for node in nodes):
            raise Refusal(f"{tensor.name} is not computed from x by the matched nodes", reported=False)
        chain.append(producer)
        tensor = data_input(producer)
    return chain[::-1]


def _branch_map(chain: list[ir.Node], opset: int, keep_low_rank: bool) -> Dense:
    maps = []
    for index, node in enumerate(chain):
        found_map = node_map(node, opset, reads_x=index == 0)
        maps.append(found_map)
    return fold_chain(maps, keep_low_rank)


def node_map(node: ir.Node, opset: int, reads_x: bool) -> LinearMap:
    """The node as a Dense or a FeatureAffine of its data input (float64, all finite)."""
    if node.op in DENSE_OPS:
        found = _dense_of(node, opset, reads_x)
    elif node.op in ("Reshape", "Flatten"):
        found = _reshape_map(node)
    else:
        found = _affine_of(node, opset)
    arrays = (found.weight, found.bias) if isinstance(found, Dense) else (found.scale, found.shift)
    constants = [constant_value(tensor) for tensor in node.inputs if not is_absent(tensor)]
    if not all_finite(*arrays, *constants):
        raise Refusal(f"{node.name}: its constants hold inf or NaN (or divide by 0), which a fold would not reproduce")
    return found


def _dense_of(node: ir.Node, opset: int, reads_x: bool) -> Dense:
    """A Gemm's alpha op(B) and beta C, or a MatMul's [C, D] weight. Only the node that reads x
    may be a Gemm with transA=1 (it stays one): inside the chain it would contract the data's
    first axis, not its last."""
    weight = constant_value(node.inputs[1])
    bias_input = node.inputs[2] if len(node.inputs) > 2 and not is_absent(node.inputs[2]) else None
    bias = None if bias_input is None else constant_value(bias_input)
    if weight is None or (bias_input is not None and bias is None):
        raise Refusal(f"{node.name}: its weight or bias is computed at run time")
    if node.op == "MatMul":
        if weight.ndim != 2:
            raise Refusal(f"{node.name}: its weight of shape {weight.shape} is not one [C, D] matrix")
        return Dense(np.asarray(weight, np.float64), None)
    if attribute_or(node, "transA", opset, 0) and not reads_x:
        raise Refusal(f"{node.name}: a Gemm with transA=1 inside the chain contracts its data's first axis")
    return gemm_dense(
        weight,
        bias,
        bool(attribute_or(node, "transB", opset, 0)),
        float(attribute_or(node, "alpha", opset, 1.0)),
        float(attribute_or(node, "beta", opset, 1.0)),
    )


def _reshape_map(node: ir.Node) -> FeatureAffine:
    """A Reshape or Flatten that keeps the last axis (LeViT flattens [B, N, D] to [B*N, D] for
    a BatchNorm1d, then reshapes back): every per-feature map commutes with it, so within the
    chain it is the identity; the chain's end must then have the dense output's shape
    (fold_dense_chain checks)."""
    if not keeps_last_axis(node):
        raise Refusal(f"{node.name}: a {node.op} that does not keep the last axis")
    features = node.outputs[0].shape[-1]
    return FeatureAffine(np.ones(features), np.zeros(features))


def keeps_last_axis(node: ir.Node) -> bool:
    """A Reshape or Flatten whose input and output end in one known dim: it moves no feature
    between rows (the last axis stays whole), so every row keeps its features."""
    before, after = getattr(node.inputs[0], "shape", None), node.outputs[0].shape
    return bool(before) and bool(after) and isinstance(before[-1], int) and before[-1] == after[-1]


def _affine_of(node: ir.Node, opset: int) -> FeatureAffine:
    """BatchNormalization on [N, C], or an elementwise op by a constant along the last axis."""
    shape = getattr(data_input(node), "shape", None)
    if shape is None or len(shape) < 2 or not isinstance(shape[-1], int):
        raise Refusal(f"{node.name}: the rank or the last dimension of its input is unknown ({shape})")
    if node.op == "BatchNormalization":
        if attribute_or(node, "training_mode", opset, 0):
            raise Refusal(f"{node.name}: a BatchNormalization in training mode normalises by batch statistics")
        if len(shape) != 2:
            raise Refusal(
                f"{node.name}: on a rank-{len(shape)} tensor it normalizes axis 1, not the last", reported=False
            )
        gamma, beta, mean, var = (constant_value(t) for t in node.inputs[1:5])
        return FeatureAffine(*batchnorm_scale_shift(gamma, beta, mean, var, attribute_or(node, "epsilon", opset, 1e-5)))
    if node.op not in ELEMENTWISE:
        raise Refusal(f"{node.name}: {node.op} is no dense or per-feature map", reported=False)
    data_first = constant_value(node.inputs[0]) is None
    try:
        k = last_axis_vector(constant_value(node.inputs[1 if data_first else 0]), shape[-1], len(shape))
    except Refusal as refusal:
        raise Refusal(f"{node.name}: {refusal.reason}", reported=refusal.reported) from None
    return elementwise_affine(node.op, k, data_first)


@dataclass(frozen=True)
class DenseLayout:
    """How the folded map is written: a Gemm (transA of the node reading x, the Gemms' transB
    layout) or a MatMul; the weights' dtype."""

    as_gemm: bool
    trans_a: bool
    trans_b: bool
    dtype: np.dtype


def dense_layout(x, readers: list[ir.Node], nodes: list[ir.Node], old_count: int, opset: int) -> DenseLayout:
    """The form of the result of folding `nodes` (`readers` among them read x), decided before
    any weight is read: a Gemm where x is 2-D and a Gemm is folded or a bias may be left, else
    a MatMul (+ Add where a bias may be left); refused (not reported) where that is no fewer
    nodes than the `old_count` matched."""
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) < 2:
        rank = "of unknown rank" if shape is None else "a vector"
        raise Refusal(f"{x.name} is {rank}: a MatMul of it is not folded")
    gemms = [node for node in nodes if node.op == "Gemm"]
    transposed = {node.op == "Gemm" and bool(attribute_or(node, "transA", opset, 0)) for node in readers}
    if len(transposed) > 1:
        raise Refusal("the branches read x one transposed (transA=1) and one not", reported=False)
    may_have_bias = any(_may_add_bias(node) for node in nodes)
    as_gemm = len(shape) == 2 and (bool(gemms) or may_have_bias)
    if (2 if may_have_bias and not as_gemm else 1) >= old_count:
        raise Refusal("the fold would leave no fewer nodes", reported=False)
    dense = [node for node in nodes if node.op in DENSE_OPS]
    if not dense:
        raise Refusal("no Gemm or MatMul among the matched nodes", reported=False)
    weight = constant_value(dense[0].inputs[1])
    if weight is None:
        raise Refusal(f"{dense[0].name}: its weight is computed at run time")
    if weight.dtype.kind != "f":
        raise Refusal(f"{weight.dtype} weights: a fold is exact only in floating point")
    trans_b = any(attribute_or(node, "transB", opset, 0) for node in gemms)
    return DenseLayout(as_gemm, transposed.pop(), trans_b, weight.dtype)


def _may_add_bias(node: ir.Node) -> bool:
    """Whether the node may leave the folded map a bias (a Gemm's C, a shift by a constant; a
    sum of two branches adds none of its own)."""
    if node.op == "Gemm":
        return len(node.inputs) > 2 and not is_absent(node.inputs[2])
    if node.op in ("Add", "Sub"):
        return any(constant_value(value) is not None for value in node.inputs)
    return node.op == "BatchNormalization"


def emitted_dense(
    context, x, dense: Dense, layout: DenseLayout, root: ir.Node, note: str, final_shape: ir.Tensor | None = None
) -> Rewrite:
    """The dense node(s) computing root's output from x: a Gemm, or a MatMul and an Add of the
    bias; then a Reshape to `final_shape` where one is given."""
    output, dtype = root.outputs[0], layout.dtype
    if final_shape is not None:  # the dense output: x's leading dims and D
        x_shape = getattr(x, "shape", None)
        dense_shape = None if x_shape is None else [*x_shape[:-1], dense.weight.shape[1]]
        output = ir.Variable(output.name, dtype, dense_shape)
    # each output has the replaced tensor's shape (no constant here broadcasts it); the float64
    # weights are cast back to the model's dtype by the builder
    build = NodeBuilder(context, dtype, output.name)
    weight = np.ascontiguousarray(dense.weight.T if layout.as_gemm and layout.trans_b else dense.weight)
    inputs = [x, build.constant(weight, output.name + "_weight")]
    bias = None if dense.bias is None else build.constant(dense.bias, output.name + "_bias")
    if layout.as_gemm:
        attrs = {key: 1 for key, on in (("transA", layout.trans_a), ("transB", layout.trans_b)) if on}
        result = build.node("Gemm", inputs + ([bias] if bias is not None else []), attrs, shape=output.shape)
    else:
        result = build.node("MatMul", inputs, shape=output.shape)
        if bias is not None:
            result = build.node("Add", [result, bias], shape=output.shape)
    if final_shape is not None:
        output = root.outputs[0]
        result = build.node("Reshape", [result, final_shape], shape=output.shape)
    written = " + ".join(node.op for node in build.nodes)
    return Rewrite(build.nodes, [(output, result)], f"{note} {written}")
