"""Dense folds (rules/25_dense.yaml): Gemm / MatMul chains with per-feature affine maps, low-rank
pairs and sums of the same x, on hand-built ONNX graphs through the engine and ONNX Runtime
(float32, rel 1e-5 of the output's scale), and refused where the result would differ or cost more.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import torch
from graphs import GraphBuilder, assert_same_outputs, rewrite
from helpers import verdict, make_model, op_counts, run, tensor
from onnx import TensorProto, helper

import convexport
from convexport.algebra import Refusal
from convexport.algebra.dense import (
    Dense,
    FeatureAffine,
    fold_chain,
    gemm_dense,
    last_axis_vector,
    check_low_rank,
    sum_dense,
)
from convexport.folds import builtin_primitives
from convexport.rewrite.rulefile import parse_rule_file

RTOL = 1e-5


def folded(builder, outputs):
    """Rewrite with every built-in rule (strategy exact), check it against ORT and that it has
    fewer nodes; (outcome, op counts)."""
    model = builder.model(outputs)
    outcome = rewrite(model)
    assert_same_outputs(model, outcome.model, builder.input_shape, rtol=RTOL, atol=RTOL)
    assert len(outcome.model.graph.node) < len(model.graph.node), outcome.skipped
    return outcome, op_counts(outcome.model)


def weight(builder, rows, cols):
    return builder.const(builder.rng.standard_normal([rows, cols]) / np.sqrt(rows), "w")


def vector(builder, shape, low=0.5, high=2.0):
    """Values of either sign away from zero (safe divisors)."""
    return builder.const(builder.rng.uniform(low, high, shape) * builder.rng.choice([-1, 1], shape), "k")


def gemm(builder, x, out_features, trans_b=0, alpha=1.0, beta=1.0, bias=True, trans_a=0):
    in_features = builder.shapes[x][0 if trans_a else 1]
    shape = [out_features, in_features] if trans_b else [in_features, out_features]
    inputs = [x, builder.const(builder.rng.standard_normal(shape) / np.sqrt(in_features), "w")]
    if bias:
        inputs.append(builder.const(builder.rng.standard_normal(out_features), "b"))
    return builder.node("Gemm", inputs, transA=trans_a, transB=trans_b, alpha=alpha, beta=beta)


def matmul(builder, x, out_features, bias=False):
    y = builder.node("MatMul", [x, weight(builder, builder.shapes[x][-1], out_features)])
    return builder.node("Add", [y, builder.const(builder.rng.standard_normal(out_features), "b")]) if bias else y


def affine(builder, x, op, shape, reverse=False):
    """x op k (k op x with reverse) for a constant of `shape` ("features": the last dim's)."""
    shape = [builder.shapes[x][-1]] if shape == "features" else shape
    k = vector(builder, shape)
    return builder.node(op, [k, x] if reverse else [x, k])


# --- the algebra ------------------------------------------------------------------------------


def test_fold_chain_is_the_composite_map():
    rng = np.random.default_rng(0)
    x = rng.standard_normal([3, 4])
    s0, t0 = rng.standard_normal(4), rng.standard_normal(4)
    w1, b1, w2 = rng.standard_normal([4, 6]), rng.standard_normal(6), rng.standard_normal([6, 5])
    s2, t2 = rng.standard_normal(5), rng.standard_normal(5)
    maps = [FeatureAffine(s0, t0), Dense(w1, b1), Dense(w2, None), FeatureAffine(s2, t2)]
    dense = verdict(fold_chain, maps)
    expected = (((x * s0 + t0) @ w1 + b1) @ w2) * s2 + t2
    np.testing.assert_allclose(x @ dense.weight + dense.bias, expected, rtol=1e-12)


def test_per_feature_maps_in_a_row_fold_into_the_dense_map_after_them():
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal([3, 4]), rng.standard_normal([4, 2])
    (s1, t1), (s2, t2) = (rng.standard_normal([2, 4]) for _ in range(2))
    dense = verdict(fold_chain, [FeatureAffine(s1, t1), FeatureAffine(s2, t2), Dense(w, None)])
    np.testing.assert_allclose(x @ dense.weight + dense.bias, ((x * s1 + t1) * s2 + t2) @ w, rtol=1e-12)
    assert isinstance(verdict(fold_chain, [FeatureAffine(s1, t1), FeatureAffine(s2, t2)]), Refusal)


def test_no_bias_arises_where_none_was_and_no_shift_is_added():
    dense = verdict(fold_chain, [FeatureAffine(np.full(3, 2.0), np.zeros(3)), Dense(np.ones([3, 2]), None)])
    assert dense.bias is None and np.all(dense.weight == 2.0)


def test_low_rank_pair_is_kept_where_composing_costs_more():
    assert check_low_rank(Dense(np.ones([4, 4]), None), Dense(np.ones([4, 4]), None)) is None
    refusal = verdict(check_low_rank, Dense(np.ones([16, 2]), None), Dense(np.ones([2, 16]), None))
    assert "C*D = 256" in refusal.reason and "r*(C+D) = 64" in refusal.reason
    assert isinstance(verdict(fold_chain, [Dense(np.ones([16, 2]), None), Dense(np.ones([2, 16]), None)]), Refusal)
    composed = verdict(fold_chain, [Dense(np.ones([16, 2]), None), Dense(np.ones([2, 16]), None)], keep_low_rank=False)
    assert composed.weight.shape == (16, 16)


@pytest.mark.parametrize(
    "value, ok",
    [
        (2.0, True),
        ([1.0] * 5, True),
        ([[1.0] * 5], True),
        ([1.0], True),
        ([[[1.0] * 5]], False),
        ([[1.0]] * 3, False),
        ([1.0] * 3, False),
    ],
)
def test_last_axis_vector(value, ok):
    result = verdict(last_axis_vector, np.asarray(value), 5, 2)
    assert isinstance(result, Refusal) != ok
    if ok:
        assert result.shape == (5,)


def test_gemm_dense_takes_alpha_beta_and_transb_and_refuses_a_bias_per_row():
    b, c = np.arange(6.0).reshape(3, 2), np.array([1.0, 2.0, 3.0])
    dense = verdict(gemm_dense, b, c, True, 2.0, 0.5)
    np.testing.assert_array_equal(dense.weight, 2.0 * b.T)
    np.testing.assert_array_equal(dense.bias, 0.5 * c)
    assert isinstance(verdict(gemm_dense, b, np.ones([4, 3]), True, 1.0, 1.0), Refusal)


def test_sum_dense_refuses_terms_that_broadcast():
    assert isinstance(verdict(sum_dense, [Dense(np.ones([3, 1]), None), Dense(np.ones([3, 4]), None)], [1, 1]), Refusal)


# --- a per-feature map after a Gemm or a MatMul -----------------------------------------------

AFTER = [("BatchNormalization", None), ("Mul", "features"), ("Div", []), ("Add", [1, 6]), ("Sub", "features")]


@pytest.mark.parametrize("op, shape", AFTER)
@pytest.mark.parametrize("trans_b, alpha, beta", [(0, 1.0, 1.0), (1, 1.0, 1.0), (1, 0.5, 2.0)])
@pytest.mark.parametrize("bias", [True, False])
def test_map_after_gemm_is_one_gemm(op, shape, trans_b, alpha, beta, bias):
    builder = GraphBuilder([3, 5])
    h = gemm(builder, "x", 6, trans_b, alpha, beta, bias)
    y = builder.batchnorm(h) if op == "BatchNormalization" else affine(builder, h, op, shape)
    outcome, counts = folded(builder, [y])
    assert counts == {"Gemm": 1}, outcome.skipped


CONSTANT_MINUS_GEMM = """rules:
  - name: constant-minus-gemm
    doc: k - Gemm(x) for a per-feature constant k is one Gemm (weight negated, bias k - b).
    match:
      - h = Gemm(x, w:const, b:const?)
      - y = Sub(k:const, h)
    require:
      private: [h]
    apply: fold_dense_chain
"""


def test_a_user_rule_folds_a_constant_minus_a_gemm(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(CONSTANT_MINUS_GEMM)
    builder = GraphBuilder([3, 5])
    y = affine(builder, gemm(builder, "x", 6, trans_b=1), "Sub", "features", reverse=True)
    model = builder.model([y])
    outcome = rewrite(model, rules=parse_rule_file(path, set(builtin_primitives())))
    assert_same_outputs(model, outcome.model, builder.input_shape, rtol=RTOL, atol=RTOL)
    assert op_counts(outcome.model) == {"Gemm": 1}


def test_map_after_a_transposed_gemm_keeps_transa():
    builder = GraphBuilder([5, 3])
    y = affine(builder, gemm(builder, "x", 6, trans_a=1), "Mul", "features")
    outcome, counts = folded(builder, [y])
    assert counts == {"Gemm": 1}
    (node,) = outcome.model.graph.node
    assert helper.get_node_attr_value(node, "transA") == 1


MATMUL_AFTER = [
    (op, shape, rank, bias)
    for op, shape in [
        ("BatchNormalization", None),
        ("Mul", "features"),
        ("Div", [1, 6]),
        ("Sub", "features"),
        ("Mul", []),
    ]
    for rank in (2, 3)
    for bias in (True, False)
    # BatchNormalization on [N, C, L] is no per-feature map (a negative case below); MatMul then
    # Sub is already one MatMul and one elementwise node
    if not (op == "BatchNormalization" and rank == 3) and not (op == "Sub" and not bias)
]


@pytest.mark.parametrize("op, shape, rank, bias", MATMUL_AFTER)
def test_map_after_matmul(op, shape, rank, bias):
    builder = GraphBuilder([3, 5] if rank == 2 else [2, 3, 5])
    h = matmul(builder, "x", 6, bias)
    y = builder.batchnorm(h) if op == "BatchNormalization" else affine(builder, h, op, shape)
    outcome, counts = folded(builder, [y])
    with_bias = bias or op in ("BatchNormalization", "Sub")
    expected = {"Gemm": 1} if rank == 2 and with_bias else {"MatMul": 1, "Add": 1} if with_bias else {"MatMul": 1}
    assert counts == expected, outcome.skipped


# --- a per-feature map before a Gemm or a MatMul ----------------------------------------------


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("op", ["BatchNormalization", "Mul", "Add"])
def test_map_before_gemm_is_one_gemm(trans_b, bias, op):
    builder = GraphBuilder([3, 5])
    h = builder.batchnorm("x") if op == "BatchNormalization" else affine(builder, "x", op, "features")
    y = gemm(builder, h, 6, trans_b, 0.5, 2.0, bias)
    outcome, counts = folded(builder, [y])
    assert counts == {"Gemm": 1}, outcome.skipped


MATMUL_BEFORE = [
    (op, shape, rank, bias)
    for op, shape in [("BatchNormalization", None), ("Mul", "features"), ("Mul", [1, 1, 5]), ("Add", "features")]
    for rank in (2, 3)
    for bias in (True, False)
    # BatchNormalization on [N, C, L] is no per-feature map, a [1, 1, C] constant makes [N, C] 3-D,
    # and x + k before a bias-free MatMul on 3-D would only move the Add (a negative case below)
    if not (op == "BatchNormalization" and rank == 3)
    and not (shape == [1, 1, 5] and rank == 2)
    and not (op == "Add" and rank == 3 and not bias)
]


@pytest.mark.parametrize("op, shape, rank, bias", MATMUL_BEFORE)
def test_map_before_matmul(op, shape, rank, bias):
    builder = GraphBuilder([3, 5] if rank == 2 else [2, 3, 5])
    h = builder.batchnorm("x") if op == "BatchNormalization" else affine(builder, "x", op, shape)
    y = matmul(builder, h, 6, bias)
    outcome, counts = folded(builder, [y])
    if op == "Mul" and not bias:  # a scale alone moves into the weight
        expected = {"MatMul": 1}
    else:  # the map's shift (or the bias) stays as a bias: one Gemm on [N, C], an Add on 3-D
        expected = {"Gemm": 1} if rank == 2 else {"MatMul": 1, "Add": 1}
    assert counts == expected, outcome.skipped


# --- two dense nodes in a row, and sums of them -----------------------------------------------


@pytest.mark.parametrize("trans_b", [(0, 0), (1, 0), (1, 1)])
@pytest.mark.parametrize("bias", [(True, True), (False, True), (True, False), (False, False)])
def test_gemm_gemm_is_one_gemm_where_it_costs_no_more(trans_b, bias):
    builder = GraphBuilder([3, 4])
    h = gemm(builder, "x", 8, trans_b[0], 0.5, 2.0, bias[0])
    y = gemm(builder, h, 4, trans_b[1], 1.0, 0.5, bias[1])
    outcome, counts = folded(builder, [y])
    assert counts == {"Gemm": 1}, outcome.skipped


@pytest.mark.parametrize("rank", [2, 3])
@pytest.mark.parametrize("first_bias", [True, False])
def test_matmul_matmul_is_one_matmul(rank, first_bias):
    builder = GraphBuilder([3, 6] if rank == 2 else [2, 3, 6])
    y = matmul(builder, matmul(builder, "x", 6, first_bias), 5)
    outcome, counts = folded(builder, [y])
    expected = {"MatMul": 1} if not first_bias else {"Gemm": 1} if rank == 2 else {"MatMul": 1, "Add": 1}
    assert counts == expected, outcome.skipped


@pytest.mark.parametrize("op", ["Add", "Sub"])
@pytest.mark.parametrize("rank", [2, 3])
def test_sum_of_matmuls_of_one_tensor_is_one_matmul(op, rank):
    builder = GraphBuilder([3, 5] if rank == 2 else [2, 3, 5])
    y = builder.node(op, [matmul(builder, "x", 6), matmul(builder, "x", 6)])
    outcome, counts = folded(builder, [y])
    assert counts == {"MatMul": 1}, outcome.skipped


@pytest.mark.parametrize("op", ["Add", "Sub"])
@pytest.mark.parametrize("trans_b", [(0, 1), (1, 1)])
@pytest.mark.parametrize("bias", [(True, False), (True, True), (False, False)])
def test_sum_of_gemms_of_one_tensor_is_one_gemm(op, trans_b, bias):
    builder = GraphBuilder([3, 5])
    a = gemm(builder, "x", 6, trans_b[0], 2.0, 0.5, bias[0])
    c = gemm(builder, "x", 6, trans_b[1], 1.0, 1.0, bias[1])
    outcome, counts = folded(builder, [builder.node(op, [a, c])])
    assert counts == {"Gemm": 1}, outcome.skipped


@pytest.mark.parametrize("bias", [True, False])
def test_lora_is_one_matmul(bias):
    """x W (+ b) + (x A) B, rank 2 on 32 features: the pair alone is kept (cheaper), the sum folds."""
    builder = GraphBuilder([2, 3, 32])
    down = matmul(builder, "x", 2)
    up = builder.node("Mul", [matmul(builder, down, 32), builder.const(0.5, "scaling")])
    y = builder.node("Add", [matmul(builder, "x", 32, bias), up])
    outcome, counts = folded(builder, [y])
    assert counts == ({"MatMul": 1, "Add": 1} if bias else {"MatMul": 1}), outcome.skipped


@pytest.mark.parametrize("bias", [True, False])
def test_lora_on_gemms_is_one_gemm(bias):
    """LoRA on a Linear as exported for 2-D input: Gemm(x) + Gemm(Gemm(x, A), B) * scaling, transB=1."""
    builder = GraphBuilder([4, 32])
    down = gemm(builder, "x", 2, trans_b=1, bias=False)
    up = builder.node("Mul", [gemm(builder, down, 32, trans_b=1, bias=False), builder.const(0.5, "scaling")])
    y = builder.node("Add", [gemm(builder, "x", 32, trans_b=1, bias=bias), up])
    outcome, counts = folded(builder, [y])
    assert counts == {"Gemm": 1}, outcome.skipped


# --- left alone -------------------------------------------------------------------------------


def left_alone(builder, outputs, reason=None):
    """The graph comes back as it was, with a reported refusal holding `reason`, or (None) with
    none: a match that is no case for the fold (another shape of graph) is not reported."""
    model = builder.model(outputs)
    outcome = rewrite(model)
    assert op_counts(outcome.model) == op_counts(model)
    if reason is None:
        assert outcome.skipped == []
    else:
        assert any(reason in skip["reason"] for skip in outcome.skipped), outcome.skipped
    return outcome


def test_an_activation_between_is_left_alone():
    builder = GraphBuilder([3, 5])
    left_alone(builder, [gemm(builder, builder.node("Relu", [gemm(builder, "x", 6)]), 4)])


@pytest.mark.parametrize("shape", [[3, 1], [2, 1, 1], [2, 3, 6]])
def test_a_constant_over_another_axis_is_left_alone(shape):
    builder = GraphBuilder([2, 3, 5])
    left_alone(builder, [affine(builder, matmul(builder, "x", 6), "Mul", shape)])


def test_a_constant_before_that_would_broadcast_the_input_is_left_alone():
    builder = GraphBuilder([3, 1])
    h = affine(builder, "x", "Mul", [5])  # [3, 1] * [5] -> [3, 5]
    left_alone(builder, [matmul(builder, h, 4)])


def test_an_add_before_a_bias_free_matmul_on_3d_is_left_alone():
    """x + k before MatMul(., W) is MatMul(x, W) + k W: the Add would only move."""
    builder = GraphBuilder([2, 3, 5])
    left_alone(builder, [matmul(builder, affine(builder, "x", "Add", "features"), 6)])


def test_a_shared_intermediate_is_left_alone():
    builder = GraphBuilder([3, 5])
    h = gemm(builder, "x", 6)
    left_alone(builder, [builder.batchnorm(h), builder.node("Relu", [h])], "also read by 1 other node")


def test_a_low_rank_pair_that_would_cost_more_is_reported():
    builder = GraphBuilder([2, 3, 16])
    outcome = left_alone(
        builder,
        [matmul(builder, matmul(builder, "x", 2), 16)],
        "low-rank factorisation 16 -> 2 -> 16 is cheaper kept: composed it costs C*D = 256",
    )
    (skip,) = outcome.skipped
    assert skip["rule"] == "dense-dense" and skip["decision"]["kept_macs_per_row"] == 64


def test_batchnorm_on_a_3d_tensor_is_left_alone():
    builder = GraphBuilder([2, 3, 5])
    left_alone(builder, [builder.batchnorm(matmul(builder, "x", 6, bias=True))])


def test_a_transposed_gemm_after_a_map_is_reported():
    builder = GraphBuilder([5, 3])
    y = gemm(builder, builder.batchnorm("x"), 6, trans_a=1)
    left_alone(builder, [y], "transA=1 inside the chain")


def test_a_gemm_bias_per_row_is_reported():
    builder = GraphBuilder([3, 5])
    h = builder.node("Gemm", ["x", weight(builder, 5, 6), builder.const(np.ones([3, 6]), "c")])
    left_alone(builder, [affine(builder, h, "Mul", "features")], "is not one row of 6 outputs")


@pytest.mark.parametrize("value", [np.inf, np.nan, 0.0])
def test_non_finite_constants_are_reported(value):
    builder = GraphBuilder([3, 5])
    k = np.ones(6)
    k[2] = value
    y = builder.node("Div", [gemm(builder, "x", 6), builder.const(k, "k")])
    left_alone(builder, [y], "inf or NaN")


def test_a_constant_divided_by_the_output_is_left_alone():
    builder = GraphBuilder([3, 5])
    left_alone(builder, [affine(builder, gemm(builder, "x", 6), "Div", "features", reverse=True)])


def test_a_matmul_of_a_vector_is_reported():
    builder = GraphBuilder([5])
    left_alone(builder, [affine(builder, matmul(builder, "x", 6), "Mul", "features")], "is a vector")


def test_integer_dtypes_are_reported():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Mul", ["h", "k"], ["y"])]
    initializers = {"w": np.arange(12, dtype=np.int32).reshape(4, 3), "k": np.array([2, 3, 4], np.int32)}
    model = make_model(
        nodes, [tensor("x", [2, 4], TensorProto.INT32)], [tensor("y", None, TensorProto.INT32)], initializers
    )
    outcome = rewrite(model)
    assert op_counts(outcome.model) == {"MatMul": 1, "Mul": 1}
    assert any("exact only in floating point" in skip["reason"] for skip in outcome.skipped)
    feeds = {"x": np.arange(8, dtype=np.int32).reshape(2, 4)}
    np.testing.assert_array_equal(run(outcome.model, feeds)[0], run(model, feeds)[0])


# --- torch ------------------------------------------------------------------------------------


def _randomized(module: torch.nn.Module) -> torch.nn.Module:
    """Eval mode, non-trivial BatchNorm statistics and affine parameters."""
    torch.manual_seed(0)
    with torch.no_grad():
        for layer in module.modules():
            if isinstance(layer, torch.nn.BatchNorm1d):
                layer.running_mean.uniform_(-1.0, 1.0)
                layer.running_var.uniform_(0.5, 2.0)
                layer.weight.uniform_(0.5, 1.5)
                layer.bias.uniform_(-1.0, 1.0)
    return module.eval()


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.nn.Sequential(torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 10)),
        lambda: torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32)),
    ],
    ids=["affine-dense", "dense-affine"],
)
@pytest.mark.parametrize("optimize", [True, False], ids=["dynamo", "dynamo-unoptimized"])
def test_torch_classifier_heads_fold_to_one_gemm(make, optimize):
    module = _randomized(make())
    args = (torch.randn(4, 16),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = torch.onnx.export(module, args, dynamo=True, optimize=optimize, verbose=False).model_proto
    assert "BatchNormalization" in op_counts(model) or optimize  # the exporter may fold Linear -> BN itself
    result = convexport.optimize(model, strategy="all", write=False, profile=False)
    assert result.report["validation"]["passed"]
    assert op_counts(result.model) == {"Gemm": 1}, result.report["skipped"]
    with torch.no_grad():
        expected = module(*args).numpy()
    np.testing.assert_allclose(
        run(result.model, {result.model.graph.input[0].name: args[0].numpy()})[0],
        expected,
        rtol=RTOL,
        atol=RTOL * max(1.0, float(np.abs(expected).max())),
    )
    assert onnx.checker.check_model(result.model) is None


class LoRALinear(torch.nn.Module):
    """peft's form: base(x) + up(down(x)) * scaling, rank 2 on 32 features."""

    def __init__(self):
        super().__init__()
        self.base, self.down = torch.nn.Linear(32, 32), torch.nn.Linear(32, 2, bias=False)
        self.up = torch.nn.Linear(2, 32, bias=False)

    def forward(self, x):
        return self.base(x) + self.up(self.down(x)) * 0.5


@pytest.mark.parametrize("shape, expected", [((4, 32), {"Gemm": 1}), ((2, 4, 32), {"MatMul": 1, "Add": 1})])
def test_torch_lora_folds_into_its_base_linear(shape, expected):
    torch.manual_seed(0)
    result = convexport.optimize(
        LoRALinear().eval(), inputs=["x:" + "x".join(map(str, shape))], write=False, profile=False
    )
    assert result.report["validation"]["passed"]
    assert op_counts(result.model) == expected, result.report["skipped"]


class DistilledHead(torch.nn.Module):
    """LeViT's classifier: (BN1d -> Linear) and a distillation (BN1d -> Linear) on the pooled
    features, averaged at inference."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Sequential(torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 10))
        self.dist = torch.nn.Sequential(torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 10))

    def forward(self, x):
        return (self.head(x) + self.dist(x)) / 2


def test_torch_distilled_head_folds_to_one_gemm():
    result = convexport.optimize(_randomized(DistilledHead()), inputs=["x:4x16"], write=False, profile=False)
    assert result.report["validation"]["passed"]
    assert op_counts(result.model) == {"Gemm": 1}, result.report["skipped"]
