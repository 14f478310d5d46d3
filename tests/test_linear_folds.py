"""The built-in linear folds on ONNX graphs: exact where applied, refused (with a reason) where not.

The algebra itself is tested exhaustively in tests/algebra; here every rule goes through the
engine and ONNX Runtime (float32, rtol 1e-4 / atol 1e-5 relative to the output's scale).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from convexport.profile import paired_timer
from convexport.rewrite.engine import RewriteSettings, rewrite_model
from convexport.folds import builtin_primitives
from graphs import RULES, GraphBuilder, assert_same_outputs, fold, rewrite
from helpers import all_op_counts, op_counts

SHAPES = {1: [2, 4, 11], 2: [2, 4, 9, 8], 3: [1, 4, 9, 8, 7]}


# --- Conv -> Conv ----------------------------------------------------------------------------

CHAIN_GRID = [
    # (first conv kwargs, second conv kwargs)
    ({"kernel": 1}, {"kernel": 3, "pads": 1}),                           # 1x1 -> same 3x3 (bottleneck)
    ({"kernel": 1, "stride": 2, "bias": False}, {"kernel": 3, "pads": 1}),  # seed 000's strided 1x1
    ({"kernel": 3, "pads": 2}, {"kernel": 5, "pads": 4}),                # seed 004's full padding
    ({"kernel": 3}, {"kernel": 3, "dilation": 2}),                       # valid, dilated
    ({"kernel": 2, "stride": 2}, {"kernel": 3, "stride": 1}),            # strided, unpadded
    ({"kernel": 3, "pads": 1, "group": 4}, {"kernel": 1}),               # depthwise -> pointwise
    ({"kernel": 3, "group": 2}, {"kernel": 3, "group": 2, "dilation": 2}),
    ({"kernel": 1, "bias": False}, {"kernel": 3, "pads": 1, "stride": 2}),
]


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("first, second", CHAIN_GRID)
def test_conv_conv_chains_fold_to_one_conv(nd, first, second):
    builder = GraphBuilder(SHAPES[nd])
    h = builder.conv("x", 4, **first)
    y = builder.conv(h, 6 if second.get("group", 1) == 1 else 4, **second)
    outcome, counts = fold(builder, [y])
    assert counts.get("Conv") == 1, outcome.skipped
    assert set(counts) <= {"Conv", "Add"}        # Add: a border map for a bias read through padding


def test_depthwise_after_depthwise_stays_depthwise():
    builder = GraphBuilder([1, 4, 10, 10])
    y = builder.conv(builder.conv("x", 4, 3, group=4), 4, 3, group=4)
    outcome, counts = fold(builder, [y])
    node = next(n for n in outcome.model.graph.node if n.op_type == "Conv")
    assert next(a.i for a in node.attribute if a.name == "group") == 4


def test_same_padded_3x3_after_3x3_is_refused_with_reason():
    builder = GraphBuilder([1, 4, 8, 8])
    y = builder.conv(builder.conv("x", 4, 3, pads=1), 4, 3, pads=1)
    outcome, counts = fold(builder, [y])
    assert counts == {"Conv": 2}
    (skip,) = outcome.skipped
    assert skip["rule"] == "conv-conv" and "would read real input" in skip["reason"]


def test_bias_through_padding_gets_a_border_map_reported():
    builder = GraphBuilder([1, 3, 12, 12])
    y = builder.conv(builder.conv("x", 5, 1), 4, 3, pads=1)
    outcome, counts = fold(builder, [y])
    assert counts == {"Conv": 1, "Add": 1}
    assert outcome.applied[0]["border_map_bytes"] == 4 * 12 * 12 * 4


def test_too_large_border_map_is_refused():
    builder = GraphBuilder([1, 3, 12, 12])
    y = builder.conv(builder.conv("x", 5, 1), 4, 3, pads=1)
    model = builder.model([y])
    from dataclasses import replace

    from graphs import RULES
    small_limit = [replace(r, params={**r.params, "border_limit_bytes": 100}) if r.name == "conv-conv" else r
                   for r in RULES]
    outcome = rewrite(model, rules=small_limit)
    assert op_counts(outcome.model) == {"Conv": 2}
    assert "over the limit of 100" in outcome.skipped[0]["reason"]


def test_bias_through_padding_under_a_dynamic_spatial_shape_is_refused():
    builder = GraphBuilder([1, 3, 12, 12])
    y = builder.conv(builder.conv("x", 5, 1), 4, 3, pads=1)
    model = builder.model([y])
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "H", "W"
    import onnx
    for value in list(model.graph.value_info):
        model.graph.value_info.remove(value)
    model = onnx.shape_inference.infer_shapes(model)
    outcome = rewrite(model)
    assert op_counts(outcome.model) == {"Conv": 2}
    assert "static spatial shape" in outcome.skipped[0]["reason"]


def test_no_bias_needs_no_static_shape_and_dynamic_batch_is_fine():
    builder = GraphBuilder([2, 3, 12, 12])
    y = builder.conv(builder.conv("x", 5, 1, bias=False), 4, 3, pads=1)
    outcome, counts = fold(builder, [y], dynamic_batch=True)
    assert counts == {"Conv": 1}


def test_intermediate_graph_output_is_not_folded():
    builder = GraphBuilder([1, 3, 8, 8])
    h = builder.conv("x", 4, 1)
    y = builder.conv(h, 4, 1)
    outcome, counts = fold(builder, [y, h])
    assert counts == {"Conv": 2}
    assert "is a graph output" in outcome.skipped[0]["reason"]


def test_intermediate_with_other_consumers_is_not_folded():
    builder = GraphBuilder([1, 3, 8, 8])
    h = builder.conv("x", 4, 1)
    y = builder.conv(h, 4, 1)
    r = builder.node("Relu", [h])
    outcome, counts = fold(builder, [y, r])
    assert counts == {"Conv": 2, "Relu": 1}
    assert "also read by 1 other node" in outcome.skipped[0]["reason"]


def test_run_time_weight_is_reported():
    builder = GraphBuilder([1, 3, 8, 8])
    h = builder.conv("x", 4, 1)
    w = builder.node("Relu", [builder.const(np.ones([4, 4, 1, 1]), "w")])
    y = builder.node("Conv", [h, w])
    outcome, counts = fold(builder, [y])
    assert counts.get("Conv") == 2
    assert any("computed at run time" in s["reason"] for s in outcome.skipped)


# --- affine maps, pooling and padding around a conv -----------------------------------------

@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("op, shape", [("Mul", "per-channel"), ("Div", "scalar"), ("Add", "per-channel"),
                                       ("Sub", "scalar"), ("Mul", "scalar")])
def test_affine_after_conv(nd, op, shape):
    builder = GraphBuilder(SHAPES[nd])
    c = builder.conv("x", 5, 3, stride=2)
    value = builder.rng.uniform(0.5, 2, [5] + [1] * nd) if shape == "per-channel" else builder.rng.uniform(0.5, 2)
    y = builder.node(op, [c, builder.const(value)])
    outcome, counts = fold(builder, [y])
    assert counts == {"Conv": 1}


@pytest.mark.parametrize("op", ["BatchNormalization", "Mul", "Sub"])
def test_per_channel_map_after_a_conv_is_never_a_dense_kernel(monkeypatch, op):
    """A per-channel map after a conv rescales the conv (O(C)); its dense [C, C] kernel, O(C^2)
    memory, is never built (2 GiB in float64 at 16384 channels)."""
    def no_dense_identity(*args):
        raise AssertionError("a per-channel map was built as a dense kernel")
    monkeypatch.setattr("convexport.folds.linear_nodes.identity_conv", no_dense_identity)
    builder = GraphBuilder([1, 3, 6, 6])
    c = builder.conv("x", 8, 3, pads=1)
    y = builder.batchnorm(c) if op == "BatchNormalization" else builder.node(
        op, [c, builder.const(builder.rng.uniform(0.5, 2, [8, 1, 1]))])
    outcome, counts = fold(builder, [y])
    assert counts == {"Conv": 1}


def no_dense_kernel(*args):
    raise AssertionError("a Conv's grouped weight was expanded to a dense kernel")


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("group, auto_pad, stride, dilation, bias", [
    (1, None, 1, 1, True), (2, "SAME_UPPER", 2, 1, False), (4, "SAME_LOWER", 1, 1, True), (8, "VALID", 2, 2, False),
    (4, None, 2, 2, False)])          # ONNX Runtime runs no dilated SAME_* conv
@pytest.mark.parametrize("op", ["BatchNormalization", "Mul", "Div", "Add", "Sub"])
def test_a_map_after_a_conv_rescales_the_convs_own_weight(monkeypatch, nd, group, auto_pad, stride, dilation, bias, op):
    """Conv then a per-channel affine map: one Conv with the same group and attributes (auto_pad
    included), its weight rows scaled and its bias shifted, exact, and never a dense kernel."""
    monkeypatch.setattr("convexport.algebra.onnx_conv.expand_groups", no_dense_kernel)
    builder = GraphBuilder([2, 8, 9, 8, 7][:nd + 2])
    c = builder.conv("x", 16, 3, stride=stride, dilation=dilation, group=group, bias=bias, auto_pad=auto_pad,
                     pads=None if auto_pad else 1)
    y = builder.batchnorm(c) if op == "BatchNormalization" else builder.node(
        op, [c, builder.const(builder.rng.uniform(0.5, 2, [16] + [1] * nd))])
    affine_rules = [rule for rule in RULES if rule.name in ("conv-batchnorm", "conv-mul", "conv-div", "conv-add", "conv-sub")]
    outcome, counts = fold(builder, [y], rules=affine_rules)     # other rules may read the result as a ConvSpec
    assert counts == {"Conv": 1}
    (conv,) = outcome.model.graph.node
    attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
    assert attrs["group"] == group and attrs.get("auto_pad", b"").decode() == (auto_pad or "")
    assert attrs["strides"] == [stride] * nd and attrs["dilations"] == [dilation] * nd
    assert len(conv.input) == (2 if not bias and op in ("Mul", "Div") else 3)


def test_batchnorm_after_a_strided_same_padded_conv_folds_without_a_static_shape():
    """The Conv keeps its auto_pad, so the fold needs no spatial shape (SAME_UPPER with stride 2
    would, to be written as explicit pads)."""
    builder = GraphBuilder([1, 4, 9, 8])
    y = builder.batchnorm(builder.conv("x", 6, 3, stride=2, auto_pad="SAME_UPPER"))
    model = builder.model([y])
    for dim, name in zip(model.graph.input[0].type.tensor_type.shape.dim[2:], ("H", "W")):
        dim.dim_param = name
    outcome = rewrite(model)
    assert op_counts(outcome.model) == {"Conv": 1}
    assert_same_outputs(model, outcome.model, [1, 4, 9, 8])
    assert_same_outputs(model, outcome.model, [1, 4, 12, 5])


def test_constant_that_is_not_per_channel_is_no_match():
    builder = GraphBuilder([1, 3, 6, 6])
    c = builder.conv("x", 4, 1)
    y = builder.node("Add", [c, builder.const(np.ones([1, 4, 6, 6]))])
    outcome, counts = fold(builder, [y])
    assert counts == {"Conv": 1, "Add": 1} and not outcome.skipped


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_batchnorm_after_and_before_conv(nd):
    builder = GraphBuilder(SHAPES[nd])
    y = builder.batchnorm(builder.conv(builder.batchnorm("x"), 5, 1))
    outcome, counts = fold(builder, [y])
    assert counts == {"Conv": 1}


def test_batchnorm_before_a_padded_conv_folds_only_with_a_border_map():
    builder = GraphBuilder([1, 4, 8, 8])
    y = builder.conv(builder.batchnorm("x"), 5, 3, pads=1)
    outcome, counts = fold(builder, [y])
    assert counts == {"Conv": 1, "Add": 1} and outcome.applied[0]["border_map_bytes"] > 0


@pytest.mark.parametrize("include_pad, pool_pads, conv_pads, refusal", [
    (1, 0, 0, None), (0, 0, 1, None),
    (1, 1, 0, "would read real input"),      # the pool reads h's padding where the conv would read x
    (0, 1, 1, "count_include_pad"),           # the divisor changes at the border: not a conv
])
def test_conv_then_average_pool(include_pad, pool_pads, conv_pads, refusal):
    builder = GraphBuilder([1, 3, 10, 10])
    c = builder.conv("x", 4, 3, pads=conv_pads, bias=False)
    y = builder.node("AveragePool", [c], kernel_shape=[3, 3], strides=[2, 2], pads=[pool_pads] * 4,
                     count_include_pad=include_pad)
    outcome, counts = fold(builder, [y])
    assert ("AveragePool" not in counts) == (refusal is None)
    if refusal:
        assert refusal in outcome.skipped[0]["reason"]


def test_zero_pad_merges_into_conv_pads_and_reflect_pad_does_not():
    builder = GraphBuilder([1, 3, 8, 8])
    zero = builder.node("Pad", ["x", builder.const([0, 0, 1, 2, 0, 0, 2, 1], "p", np.int64)])
    reflect = builder.node("Pad", ["x", builder.const([0, 0, 1, 1, 0, 0, 1, 1], "p", np.int64)], mode="reflect")
    y1, y2 = builder.conv(zero, 4, 3), builder.conv(reflect, 4, 3)
    outcome, counts = fold(builder, [y1, y2])
    assert counts == {"Conv": 2, "Pad": 1}


# --- parallel branches -----------------------------------------------------------------------

@pytest.mark.parametrize("nd", [1, 2, 3])
def test_repvgg_acnet_style_branch_sum_is_one_conv(nd):
    builder = GraphBuilder(SHAPES[nd])
    k3 = builder.batchnorm(builder.conv("x", 4, 3, pads=1))
    k1 = builder.batchnorm(builder.conv("x", 4, 1))
    asym = builder.conv("x", 4, [1] + [3] * (nd - 1), pads=[0] + [1] * (nd - 1) + [0] + [1] * (nd - 1))
    y = builder.node("Add", [builder.node("Add", [builder.node("Add", [k3, k1]), asym]), builder.batchnorm("x")])
    outcome, counts = fold(builder, [y])
    assert counts == {"Conv": 1}


@pytest.mark.parametrize("stride, dilation", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_sub_and_add_of_convs_with_different_kernels(stride, dilation):
    builder = GraphBuilder([1, 4, 13, 12])
    a = builder.conv("x", 6, 5, stride=stride, dilation=dilation, pads=2 * dilation)
    b = builder.conv("x", 6, 3, stride=stride, pads=1)
    c = builder.conv("x", 6, 1, stride=stride)
    y = builder.node("Add", [builder.node("Sub", [a, b]), c])
    outcome, counts = fold(builder, [y])
    assert counts == {"Conv": 1}


def test_identity_branches_add_and_sub_both_orders():
    builder = GraphBuilder([1, 4, 8, 8])
    dw = builder.conv("x", 4, 3, pads=1, group=4, bias=False)
    y1 = builder.node("Sub", [dw, "x"])
    dw2 = builder.conv("x", 4, 3, pads=1, group=4)
    y2 = builder.node("Sub", ["x", dw2])
    dw3 = builder.conv("x", 4, 3, pads=1, group=4)
    y3 = builder.node("Add", ["x", dw3])
    outcome, counts = fold(builder, [y1, y2, y3])
    assert counts == {"Conv": 3}
    for node in outcome.model.graph.node:      # depthwise minus identity stays depthwise
        assert next(a.i for a in node.attribute if a.name == "group") == 4


def test_average_pool_branch():
    builder = GraphBuilder([1, 4, 9, 9])
    pool = builder.node("AveragePool", ["x"], kernel_shape=[3, 3], pads=[1] * 4, count_include_pad=1)
    y = builder.node("Add", [builder.conv("x", 4, 3, pads=1), pool])
    outcome, counts = fold(builder, [y])
    assert counts == {"Conv": 1}


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_concat_of_convs_with_different_geometry(nd):
    builder = GraphBuilder(SHAPES[nd])
    parts = [builder.conv("x", 3, 3, pads=1), builder.conv("x", 2, 1, bias=False),
             builder.conv("x", 4, 5, pads=2, group=4 if nd == 1 else 1), builder.conv("x", 2, 3, dilation=2, pads=2)]
    y = builder.node("Concat", parts, axis=1)
    outcome, counts = fold(builder, [y])
    assert counts == {"Conv": 1}


def test_branches_with_different_output_shapes_are_refused():
    builder = GraphBuilder([1, 4, 8, 8])
    a = builder.conv("x", 4, 3, pads=1)
    b = builder.conv("x", 4, 1, stride=[2, 1])
    y = builder.node("Concat", [a, b], axis=2)        # concat along H: not a channel concat
    outcome, counts = fold(builder, [y])
    assert counts == {"Conv": 2, "Concat": 1}


def test_branch_used_elsewhere_is_not_merged():
    builder = GraphBuilder([1, 4, 8, 8])
    a, b = builder.conv("x", 4, 3, pads=1), builder.conv("x", 4, 1)
    y = builder.node("Add", [a, b])
    outcome, counts = fold(builder, [y, a])
    assert counts == {"Conv": 2, "Add": 1}
    assert "graph output" in outcome.skipped[0]["reason"]


# --- the cost strategy -----------------------------------------------------------------------

def test_cost_strategy_keeps_a_quarter_width_bottleneck():
    builder = GraphBuilder([1, 32, 12, 12])
    y = builder.conv(builder.conv(builder.conv("x", 8, 1, bias=False), 8, 3, pads=1, bias=False), 32, 1)
    model = builder.model([y])
    assert op_counts(rewrite(model, "cost").model)["Conv"] == 3
    costly = rewrite(model, "cost").skipped
    assert costly and all("FLOPs" in s["reason"] and s["decision"]["after_us"] > s["decision"]["before_us"]
                          for s in costly)
    # exact folds it to one dense 3x3 of rank 24 (8 channels x 3 taps), which low-rank-kernel
    # then splits into 3x1 and 1x3 convs through 24 channels
    exact = rewrite(model, "all")
    assert [entry["rule"] for entry in exact.applied] == ["conv-conv", "conv-conv", "low-rank-kernel"]
    assert exact.applied[-1]["rank"] == 24 and op_counts(exact.model)["Conv"] == 2


def test_cost_strategy_folds_what_pays():
    builder = GraphBuilder([1, 32, 56, 56])
    y = builder.conv(builder.conv("x", 32, 3, pads=1, group=32), 32, 1)     # a separable block
    cost = rewrite(builder.model([y]), "cost")
    # depthwise 3x3 + pointwise = 32*9 + 32*32 MACs/pixel; dense 3x3 = 9216: estimated slower, kept
    assert op_counts(cost.model)["Conv"] == 2
    (declined,) = cost.skipped
    numbers = declined["decision"]
    assert numbers["method"] == "estimate" and numbers["device"] == "cpu"
    assert numbers["after_us"] > numbers["before_us"] and numbers["flops_after"] > 5 * numbers["flops_before"]
    assert numbers["nodes_before"] == 2 and numbers["nodes_after"] == 1 and "us on cpu" in declined["reason"]
    chain = GraphBuilder([1, 8, 12, 12])
    y = chain.conv(chain.conv("x", 8, 1), 8, 1)                            # 1x1 -> 1x1 always pays
    folded = rewrite(chain.model([y]), "cost")
    assert op_counts(folded.model)["Conv"] == 1
    decision = folded.applied[0]["decision"]
    assert decision["after_us"] <= decision["before_us"] and decision["bytes_after"] < decision["bytes_before"]


def test_each_device_gets_the_fft_conv_it_runs():
    """ONNX Runtime has no CUDA DFT (it runs on the CPU there) but runs com.microsoft Rfft and
    Irfft on cuFFT: on cuda the FFT conv is those, over the whole batch; on cpu DFTs inside the
    Scans over images and channels. Each decided by the cost model for its device."""
    builder = GraphBuilder([2, 3, 96, 96])
    y = builder.conv("x", 3, 31, pads=15)
    model = builder.model([y])
    on_cpu = rewrite_model(model, RULES, builtin_primitives(), RewriteSettings("cost", "cpu"))
    on_cuda = rewrite_model(model, RULES, builtin_primitives(), RewriteSettings("cost", "cuda"))
    assert "DFT" in all_op_counts(on_cpu.model) and "Rfft" not in all_op_counts(on_cpu.model)
    counts = all_op_counts(on_cuda.model)
    assert counts["Rfft"] == counts["Irfft"] == 1 and "DFT" not in counts and "Scan" not in counts
    (taken,) = [entry for entry in on_cuda.applied if entry["rule"] == "large-kernel-fft"]
    assert taken["decision"]["device"] == "cuda" and taken["decision"]["after_us"] < taken["decision"]["before_us"]


def test_measure_strategy_times_both_sides_and_records_it():
    chain = GraphBuilder([1, 64, 56, 56])
    y = chain.conv(chain.conv("x", 64, 1), 64, 1)         # two 1x1 convs: about 1 ms on the CPU
    measured = rewrite(chain.model([y]), "measure")
    entries = measured.applied or measured.skipped
    decision = entries[0]["decision"]
    assert decision["method"] == "measured" and decision["device"] == "cpu" and decision["runs"] >= 10
    assert decision["before_ms"] > 0.05 and decision["after_ms"] > 0
    assert decision["low"] <= decision["speedup"] <= decision["high"] and decision["pairs"] >= paired_timer.MIN_PAIRS
    assert (decision["speedup"] >= 1) == bool(measured.applied)


def test_measure_strategy_leaves_noise_to_the_estimate():
    chain = GraphBuilder([1, 4, 4, 4])
    y = chain.conv(chain.conv("x", 4, 1), 4, 1)           # microseconds: within scheduling noise
    decision = rewrite(chain.model([y]), "measure").applied[0]["decision"]
    assert decision["method"] == "estimate" and "noise floor" in decision["note"]
    assert decision["before_ms"] < 0.05 and decision["after_us"] <= decision["before_us"]



def test_measure_leaves_to_the_estimate_what_cannot_run_cut_out():
    """Symbolic dims are 1 in a cut-out, too small for a 3x3 conv without padding: the
    estimate decides, and the note says why (not a failed run, not an internal error)."""
    chain = GraphBuilder([1, 3, 9, 9])
    y = chain.conv(chain.conv("x", 4, 3), 2, 1)
    model = chain.model([y])
    for value in (model.graph.input[0], model.graph.output[0]):
        for index, dim in enumerate(value.type.tensor_type.shape.dim[2:]):
            dim.dim_param = f"s{index}"
    del model.graph.value_info[:]
    model = onnx.shape_inference.infer_shapes(model)
    decision = rewrite(model, "measure").applied[0]["decision"]
    assert decision["method"] == "estimate" and decision["note"].startswith("not measurable (ONNX Runtime cannot run")


# --- constant maps left by border corrections --------------------------------------------------

def test_biased_bottleneck_folds_to_one_conv_through_its_border_map():
    builder = GraphBuilder([1, 8, 10, 10])
    y = builder.conv(builder.conv(builder.conv("x", 8, 1), 8, 3, pads=1), 8, 1)
    outcome, counts = fold(builder, [y])
    assert counts == {"Conv": 1, "Add": 1}
    assert [e["rule"] for e in outcome.applied] == ["conv-conv", "conv-after-constant-map", "conv-conv"]


def test_constant_adds_merge_and_large_maps_stay():
    builder = GraphBuilder([1, 3, 6, 6])
    h = builder.node("Add", ["x", builder.const(builder.rng.standard_normal([1, 3, 6, 6]))])
    y = builder.node("Add", [h, builder.const(builder.rng.standard_normal([3, 1, 1]))])
    outcome, counts = fold(builder, [y])
    assert counts == {"Add": 1}
    big = GraphBuilder([1, 3, 64, 64])
    h = big.node("Add", ["x", big.const(big.rng.standard_normal([1, 3, 64, 64]))])
    y = big.conv(h, 300, 1)
    outcome, counts = fold(big, [y])
    assert counts == {"Add": 1, "Conv": 1}
    assert "over the limit" in outcome.skipped[0]["reason"]


def test_map_that_varies_over_the_batch_is_not_moved():
    builder = GraphBuilder([2, 3, 6, 6])
    h = builder.node("Add", ["x", builder.const(builder.rng.standard_normal([2, 3, 6, 6]))])
    outcome, counts = fold(builder, [builder.conv(h, 4, 3, pads=1)])
    assert counts == {"Add": 1, "Conv": 1}
    assert "varies over the batch" in outcome.skipped[0]["reason"]
