"""Batching parallel structure: per-class linears, parallel convs, identical branches, repeats."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphs import GraphBuilder, fold


def gathered_linears(builder, x, groups_of_classes, out_features, bias=True, transposed=True):
    """Per class c of group g: Gemm(Gather(x, axis=1, g)); stacked [B, classes, O]."""
    in_features = builder.shapes[x][2]
    pieces = []
    for group, classes in enumerate(groups_of_classes):
        row = builder.node("Gather", [x, builder.const(np.array(group, np.int64), "i", np.int64)], axis=1)
        for _ in range(classes):
            weight = builder.rng.standard_normal([out_features, in_features] if transposed else [in_features, out_features])
            inputs = [row, builder.const(weight, "fc_w")]
            if bias:
                inputs.append(builder.const(builder.rng.standard_normal(out_features), "fc_b"))
            gemm = builder.node("Gemm", inputs, transB=int(transposed))
            pieces.append(builder.node("Unsqueeze", [gemm, builder.const(np.array([1], np.int64), "ax", np.int64)]))
    return builder.node("Concat", pieces, axis=1)


@pytest.mark.parametrize("classes", [[1, 1], [1, 2, 1], [1, 2, 1, 3, 1, 1, 2, 1, 1, 2, 1, 1]])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("transposed", [True, False])
@pytest.mark.parametrize("form", ["matmul", "einsum"])
def test_per_class_linears_become_one_contraction(classes, bias, transposed, form):
    builder = GraphBuilder([2, len(classes), 8])
    hidden = gathered_linears(builder, "x", classes, 5, bias, transposed)
    # the second per-class layer: Linear(5, 1) on hidden[:, i, :], concatenated to [B, classes]
    outputs = [builder.node("Gemm", [builder.node("Gather", [hidden, builder.const(np.array(i, np.int64), "j", np.int64)],
                                                  axis=1), builder.const(builder.rng.standard_normal([1, 5]), "w2"),
                                     builder.const(builder.rng.standard_normal(1), "b2")], transB=1)
               for i in range(sum(classes))]
    y = builder.node("Concat", outputs, axis=1)
    # exact: at two classes of 8 features the cost model keeps the two Gemms (5 nodes would replace 2)
    outcome, counts = fold(builder, [y], strategy="all" if len(classes) == 2 else "cost", rules=with_form(form))
    assert counts.get("Einsum" if form == "einsum" else "MatMul") == 2 and "Gemm" not in counts, counts
    assert counts.get("Gather", 0) <= 1


def with_form(form):
    from dataclasses import replace

    from graphs import RULES
    return [replace(r, params={**r.params, "form": form}) if r.name == "gathered-linear-branches" else r
            for r in RULES]


def test_parallel_convs_become_one_conv_and_a_split_carrying_relu():
    builder = GraphBuilder([1, 4, 9, 9])
    ends = [builder.node("Relu", [builder.conv("x", 6, 3, pads=1)]) for _ in range(3)]
    outcome, counts = fold(builder, ends)
    assert counts == {"Conv": 1, "Relu": 1, "Split": 1}


def test_parallel_convs_of_different_geometry_group_separately():
    builder = GraphBuilder([1, 4, 9, 9])
    same = [builder.conv("x", 6, 3, pads=1) for _ in range(3)]
    strided = builder.conv("x", 6, 3, pads=1, stride=2)
    outcome, counts = fold(builder, [*same, strided])
    assert counts == {"Conv": 2, "Split": 1}


def attention_branches(builder, x, count, residual=True):
    """Seed 002's bottleneck branch, `count` times on x, concatenated along channels."""
    channels = builder.shapes[x][1]
    ends = []
    for _ in range(count):
        h = builder.node("Relu", [builder.conv(x, channels // 2, 1)])
        h = builder.node("Relu", [builder.conv(h, channels // 2, 3, pads=1)])
        h = builder.conv(h, channels, 1)
        ends.append(builder.node("Relu", [builder.node("Add", [h, x]) if residual else h]))
    return builder.node("Concat", ends, axis=1)


@pytest.mark.parametrize("count", [2, 3, 12])
@pytest.mark.parametrize("residual", [True, False])
def test_identical_branches_become_grouped_convs(count, residual):
    builder = GraphBuilder([2, 8, 6, 6])
    y = attention_branches(builder, "x", count, residual)
    outcome, counts = fold(builder, [y])
    assert counts["Conv"] == 3 and counts["Relu"] == 3 and "Concat" not in counts
    assert counts.get("Tile", 0) == (1 if residual else 0)
    groups = sorted(next(a.i for a in n.attribute if a.name == "group") for n in outcome.model.graph.node
                    if n.op_type == "Conv")
    assert groups == [1, count, count]


def test_branch_output_used_elsewhere_stops_the_walk_and_stays_exact():
    builder = GraphBuilder([1, 8, 6, 6])
    ends = [builder.node("Relu", [builder.conv("x", 4, 1)]) for _ in range(3)]
    extra = builder.node("Sigmoid", [ends[1]])
    y = builder.node("Concat", ends, axis=1)
    outcome, counts = fold(builder, [y, extra])
    assert counts["Conv"] == 1 and counts["Relu"] == 1 and "Split" in counts


def test_branches_that_diverge_are_batched_up_to_the_difference():
    builder = GraphBuilder([1, 8, 6, 6])
    a = builder.node("Relu", [builder.conv("x", 4, 1)])
    b = builder.node("Sigmoid", [builder.conv("x", 4, 1)])
    outcome, counts = fold(builder, [a, b])
    assert counts == {"Conv": 1, "Split": 1, "Relu": 1, "Sigmoid": 1}


def test_run_time_weights_are_not_batched():
    builder = GraphBuilder([1, 4, 6, 6])
    weight = builder.node("Relu", [builder.const(np.ones([4, 4, 1, 1]), "w")])
    a = builder.node("Conv", ["x", weight])
    b = builder.node("Conv", ["x", builder.const(np.ones([4, 4, 1, 1]), "w")])
    outcome, counts = fold(builder, [a, b])
    assert counts["Conv"] == 2


@pytest.mark.parametrize("count", [2, 3, 12])
def test_repeated_concat_becomes_tile_in_both_export_forms(count):
    one = GraphBuilder([2, 3, 4, 4])
    relu = one.node("Relu", ["x"])
    y = one.node("Concat", [relu] * count, axis=1)
    outcome, counts = fold(one, [y])
    assert counts == {"Relu": 1, "Tile": 1}
    chain = GraphBuilder([2, 3, 4, 4])
    relu = chain.node("Relu", ["x"])
    y = relu
    for _ in range(count - 1):
        y = chain.node("Concat", [y, relu], axis=1)
    outcome, counts = fold(chain, [y])
    assert counts == {"Relu": 1, "Tile": 1}


def test_concat_of_different_tensors_is_not_a_tile():
    builder = GraphBuilder([2, 3, 4, 4])
    y = builder.node("Concat", [builder.node("Relu", ["x"]), builder.node("Sigmoid", ["x"])], axis=1)
    outcome, counts = fold(builder, [y])
    assert counts == {"Relu": 1, "Sigmoid": 1, "Concat": 1}


def test_split_branches_batched_through_pooling_and_reshape():
    builder = GraphBuilder([2, 12, 5, 5])
    parts = [f"part{i}" for i in range(4)]
    from onnx import helper
    builder.nodes.append(helper.make_node("Split", ["x", builder.const(np.array([3] * 4, np.int64), "s", np.int64)],
                                          parts, axis=1, name="split"))
    for part in parts:
        builder.shapes[part] = [2, 3, 5, 5]
    pooled = [builder.node("ReduceMax", [p, builder.const(np.array([2, 3], np.int64), "axes", np.int64)], keepdims=1)
              for p in parts]
    flat = [builder.node("Reshape", [p, builder.const(np.array([2, 3], np.int64), "shape", np.int64)]) for p in pooled]
    stacked = [builder.node("Unsqueeze", [f, builder.const(np.array([1], np.int64), "ax", np.int64)]) for f in flat]
    y = builder.node("Concat", stacked, axis=1)
    outcome, counts = fold(builder, [y])
    assert counts == {"ReduceMax": 1, "Reshape": 1}


@settings(max_examples=25, deadline=None)
@given(count=st.integers(2, 6), channels=st.sampled_from([2, 4, 6]), kernel=st.sampled_from([1, 3]),
       residual=st.booleans(), seed=st.integers(0, 10_000))
def test_random_identical_branches_stay_exact(count, channels, kernel, residual, seed):
    builder = GraphBuilder([1, channels, 5, 5], seed=seed)
    ends = []
    for _ in range(count):
        h = builder.node("Relu", [builder.conv("x", channels, kernel, pads=kernel // 2)])
        h = builder.conv(h, channels, kernel, pads=kernel // 2, group=channels)
        ends.append(builder.node("Add", [h, "x"]) if residual else h)
    y = builder.node("Concat", ends, axis=1)
    outcome, counts = fold(builder, [y])
    assert counts["Conv"] == 2


def test_a_gemm_bias_per_row_is_not_taken_for_one_per_output():
    """Found by `rules test`: C of shape [M, 1] has O elements when M == O, but it varies over
    the rows; packing it as a per-output bias was wrong."""
    builder = GraphBuilder([2, 2, 3])
    heads = [builder.node("Gemm", [builder.node("Gather", ["x", builder.const(np.array(i, np.int64), "i", np.int64)],
                                                axis=1),
                                   builder.const(builder.rng.standard_normal([3, 2]), "w"),
                                   builder.const(builder.rng.standard_normal([2, 1]), "b")])
             for i in range(2)]
    outcome, counts = fold(builder, heads, strategy="all")
    assert counts.get("Gemm") == 2
    assert any("varies over the batch" in entry["reason"] for entry in outcome.skipped)
