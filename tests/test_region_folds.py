"""Linear regions as real families write them (issue 22): the `Linear(x)` op class in branch
sums, differences and concats; a per-channel map after a Concat of Convs; ConvTranspose with
the map or pointwise Conv after it; SqueezeNet's Fire; sibling Convs of different widths.
Positive cases over parameter grids are checked against ONNX Runtime; the cases where a fold
would be wrong (or does not pay) are left alone, with the reason in the report."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
import torch

import convexport
from onnx import helper

from convexport.folds import builtin_primitives
from convexport.rewrite.rulefile import RuleFileError, load_rules
from convexport.ir import fold_constants, fold_to_fixed_point, infer_shapes
import graphs
from graphs import RULES, GraphBuilder, rewrite
from helpers import op_counts, run

torch.manual_seed(0)
RTOL = 1e-5  # fp32: every output within 1e-5 relative (and 1e-5 of its largest magnitude)


def fold(*args, **kwargs):
    return graphs.fold(*args, rtol=RTOL, **kwargs)


def assert_same_outputs(original, rewritten, input_shape):
    graphs.assert_same_outputs(original, rewritten, input_shape, rtol=RTOL)


def only(*names):
    return [rule for rule in RULES if rule.name in names]


# --- the Linear(x) op class ---------------------------------------------------------------


def linear_node(builder, x, kind, nd):
    channels = [builder.shapes[x][1]] + [1] * nd
    if kind == "conv":
        return builder.conv(x, builder.shapes[x][1], 3, pads=1, group=2)
    if kind == "bn":
        return builder.batchnorm(x)
    if kind == "mul":
        return builder.node("Mul", [builder.const(builder.rng.uniform(-2, 2, channels)), x])
    if kind == "div":
        return builder.node("Div", [x, builder.const(builder.rng.uniform(0.5, 2, channels))])
    if kind == "sub":
        return builder.node("Sub", [x, builder.const(builder.rng.standard_normal(channels))])
    return builder.node("AveragePool", [x], kernel_shape=[3] * nd, pads=[1] * (2 * nd), count_include_pad=1)


KINDS = ["conv", "bn", "mul", "div", "sub", "avgpool"]


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("op", ["Add", "Sub"])
@pytest.mark.parametrize("first,second", list(itertools.combinations(KINDS, 2)))
def test_two_linear_branches_of_one_tensor_are_one_conv(first, second, op, nd):
    builder = GraphBuilder([1, 4, *[6] * nd])
    y = builder.node(op, [linear_node(builder, "x", first, nd), linear_node(builder, "x", second, nd)])
    outcome, counts = fold(builder, [builder.node("Relu", [y])])
    assert counts == {"Conv": 1, "Relu": 1}, (counts, outcome.skipped)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("op,order", [("Add", "branch-first"), ("Sub", "branch-first"), ("Sub", "x-first")])
def test_a_linear_branch_and_its_input_are_one_conv(kind, op, order):
    builder = GraphBuilder([1, 4, 7, 7])
    a = linear_node(builder, "x", kind, 2)
    y = builder.node(op, [a, "x"] if order == "branch-first" else ["x", a])
    _, counts = fold(builder, [builder.node("Relu", [y])])
    assert counts == {"Conv": 1, "Relu": 1}


def test_fastvit_repmixer_is_one_depthwise_conv():
    """x + gamma * (mixer(x) - norm(x)): mixer a depthwise conv (its BN folded), norm a BN."""
    builder = GraphBuilder([1, 8, 9, 9])
    mixer = builder.batchnorm(builder.conv("x", 8, 3, pads=1, group=8, bias=False))
    gamma = builder.const(builder.rng.uniform(0.1, 1, [8, 1, 1]))
    y = builder.node("Add", ["x", builder.node("Mul", [gamma, builder.node("Sub", [mixer, builder.batchnorm("x")])])])
    _, counts = fold(builder, [builder.node("Relu", [y])], strategy="cost")
    assert counts == {"Conv": 1, "Relu": 1}


def test_linear_branches_left_alone_where_folding_would_be_wrong():
    """A Mul by a constant that is not per channel, a shared branch, branches of different
    strides, a BatchNormalization in training mode: no fold, and the output is unchanged."""
    builder = GraphBuilder([1, 4, 6, 6])
    full = builder.node("Mul", ["x", builder.const(builder.rng.standard_normal([1, 4, 6, 6]))])
    y1 = builder.node("Add", [full, builder.batchnorm("x")])
    shared = builder.batchnorm("x")
    y2 = builder.node("Sub", [shared, builder.conv("x", 4, 3, pads=1)])
    y3 = builder.node("Add", [builder.conv("x", 4, 1, stride=2), builder.conv("x", 4, 4, stride=1)])
    outcome, counts = fold(builder, [y1, y2, y3, builder.node("Neg", [shared])])
    assert counts.get("Add") == 2 and counts.get("Sub") == 1 and counts.get("Mul") == 1
    reasons = " ".join(entry["reason"] for entry in outcome.skipped)
    assert "also read by" in reasons and "strides" in reasons


@pytest.mark.parametrize("text,problem", [
    ("- a = Linear(x, k)\n      - y = Add(a, x)", "exactly one run-time input"),
    ("- a = Linear[axis=1](x)\n      - y = Add(a, x)", "exactly one run-time input"),
])
def test_an_op_class_line_is_checked_when_the_rule_file_loads(tmp_path, text, problem):
    path = tmp_path / "class.yaml"
    path.write_text(f"rules:\n  - name: r\n    doc: d\n    match:\n      {text}\n    apply: sum_branches\n")
    with pytest.raises(RuleFileError, match=problem):
        load_rules([path], set(builtin_primitives()))


# --- a per-channel map after a Concat of Convs --------------------------------------------


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("after", ["bn", "mul", "add"])
@pytest.mark.parametrize("parts", [2, 3])
def test_a_map_after_a_concat_of_convs_folds_into_each_conv(nd, after, parts):
    builder = GraphBuilder([1, 4, *[7] * nd])
    sources = ["x", builder.node("Relu", ["x"]), builder.node("Sigmoid", ["x"])]
    convs = [builder.conv(sources[i], [2, 4, 3][i], 1 + 2 * i, pads=i, group=[1, 2, 1][i]) for i in range(parts)]
    c = builder.node("Concat", convs, axis=1)
    width = [builder.shapes[c][1]] + [1] * nd
    if after == "bn":
        y = builder.batchnorm(c)
    elif after == "mul":
        y = builder.node("Mul", [c, builder.const(builder.rng.uniform(-2, 2, width))])
    else:
        y = builder.node("Add", [c, builder.const(builder.rng.standard_normal(width))])
    _, counts = fold(builder, [builder.node("Relu", [y])], rules=only("concat-affine"))
    assert counts == {"Conv": parts, "Concat": 1, "Relu": 2, **({"Sigmoid": 1} if parts > 2 else {})}


def test_a_map_after_a_concat_stays_where_a_part_is_read_elsewhere():
    """GhostNet's Concat(a, cheap(a)): a also feeds the cheap conv, so its slice of the map
    cannot fold into a's Conv."""
    builder = GraphBuilder([1, 4, 6, 6])
    a = builder.conv("x", 4, 1)
    y = builder.batchnorm(builder.node("Concat", [a, builder.conv(a, 4, 3, pads=1, group=4)], axis=1))
    outcome, counts = fold(builder, [y], rules=only("concat-affine"))
    assert counts["BatchNormalization"] == 1
    assert any("also read by" in entry["reason"] for entry in outcome.skipped)


# --- ConvTranspose and the map or pointwise Conv after it ---------------------------------


def conv_transpose(builder, x, out, kernel, stride, group, dilation, output_padding, bias):
    nd = len(builder.shapes[x]) - 2
    weight = builder.rng.standard_normal([builder.shapes[x][1], out // group, *[kernel] * nd])
    inputs = [x, builder.const(weight, "wt")] + ([builder.const(builder.rng.standard_normal(out))] if bias else [])
    return builder.node("ConvTranspose", inputs, strides=[stride] * nd, group=group, dilations=[dilation] * nd,
                        output_padding=[output_padding] * nd, pads=[1] * nd + [0] * nd)


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("stride,group,dilation,output_padding", [(1, 1, 1, 0), (2, 1, 1, 1), (2, 2, 1, 0),
                                                                  (3, 4, 2, 2), (2, 2, 2, 1)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("after", ["bn", "mul", "add", "pointwise"])
def test_conv_transpose_and_the_map_after_it_are_one_conv_transpose(nd, stride, group, dilation, output_padding,
                                                                    bias, after):
    builder = GraphBuilder([1, 4, *[4] * nd])
    h = conv_transpose(builder, "x", 8, 3, stride, group, dilation, output_padding, bias)
    width = [8] + [1] * nd
    if after == "bn":
        y = builder.batchnorm(h)
    elif after == "mul":
        y = builder.node("Mul", [h, builder.const(builder.rng.uniform(-2, 2, width))])
    elif after == "add":
        y = builder.node("Add", [builder.const(builder.rng.standard_normal(width)), h])
    else:
        y = builder.conv(h, 3, 1, bias=bias)
    _, counts = fold(builder, [builder.node("Relu", [y])])
    assert counts == {"ConvTranspose": 1, "Relu": 1}


@pytest.mark.parametrize("second", ["strided", "padded", "grouped", "3x3", "shared"])
def test_conv_transpose_keeps_a_conv_that_is_not_pointwise(second):
    builder = GraphBuilder([1, 4, 5, 5])
    h = conv_transpose(builder, "x", 4, 3, 2, 1, 1, 1, True)
    y = {"strided": lambda: builder.conv(h, 4, 1, stride=2), "padded": lambda: builder.conv(h, 4, 1, pads=1),
         "grouped": lambda: builder.conv(h, 4, 1, group=2), "3x3": lambda: builder.conv(h, 4, 3, pads=1),
         "shared": lambda: builder.conv(h, 4, 1)}[second]()
    outputs = [y, builder.node("Neg", [h])] if second == "shared" else [y]
    _, counts = fold(builder, outputs, rules=only("convtranspose-linear"))
    assert counts["ConvTranspose"] == 1 and counts["Conv"] == 1


# --- parallel branches of different widths and kernels ------------------------------------


class Fire(torch.nn.Module):
    def __init__(self, channels, squeeze, expand):
        super().__init__()
        self.squeeze = torch.nn.Conv2d(channels, squeeze, 1)
        self.expand1 = torch.nn.Conv2d(squeeze, expand, 1)
        self.expand3 = torch.nn.Conv2d(squeeze, expand, 3, padding=1)

    def forward(self, x):
        s = torch.relu(self.squeeze(x))
        return torch.cat([torch.relu(self.expand1(s)), torch.relu(self.expand3(s))], 1)


def export(module, shape, path, route):
    module.eval()
    x = torch.randn(*shape)
    if route == "torchscript":
        torch.onnx.export(module, (x,), str(path), dynamo=False, do_constant_folding=False, input_names=["x"])
    else:
        torch.onnx.export(module, (x,), str(path), dynamo=True, optimize=route == "dynamo")
    return onnx.shape_inference.infer_shapes(onnx.load(str(path)))  # as the pipeline's export stage does


def folded(model):
    """Constants and shape arithmetic folded to a fixed point, as the pipeline does before the rules."""
    return fold_to_fixed_point(model, "model")


@pytest.mark.parametrize("route", ["dynamo", "dynamo-unoptimized", "torchscript"])
def test_squeezenet_fire_is_one_conv_and_one_relu_under_exact_and_kept_by_the_cpu_cost_model(tmp_path, route):
    model = folded(export(Fire(16, 8, 32), (1, 16, 12, 12), tmp_path / "fire.onnx", route))
    exact = rewrite(model, "all")
    assert_same_outputs(model, exact.model, [1, 16, 12, 12])
    assert op_counts(exact.model) == {"Conv": 2, "Relu": 2}
    cost = rewrite(model, "cost")
    assert op_counts(cost.model).get("Concat") == 1
    refused = [entry for entry in cost.skipped if entry["rule"] == "concat-relu-linear-branches"]
    assert refused and "estimated" in refused[0]["reason"]


@pytest.mark.parametrize("widths,kernel", [((64, 96, 16), 1), ((3, 5), 3), ((4, 4, 2), 1)])
@pytest.mark.parametrize("bias", ["all", "some", "none"])
def test_sibling_convs_of_different_widths_are_one_conv_and_a_split(widths, kernel, bias):
    builder = GraphBuilder([1, 8, 7, 7])
    heads = [builder.conv("x", w, kernel, pads=kernel // 2, bias=bias == "all" or (bias == "some" and i == 0))
             for i, w in enumerate(widths)]
    outputs = [builder.node("Relu", [h]) for h in heads]
    _, counts = fold(builder, outputs, rules=only("sibling-convs"))
    assert counts["Conv"] == 1 and counts["Split"] == 1


def test_sibling_convs_of_other_geometries_or_summed_are_left_alone():
    builder = GraphBuilder([1, 8, 7, 7])
    a, b = builder.conv("x", 4, 1), builder.conv("x", 6, 3, pads=1)       # different kernels
    c, d = builder.conv("x", 4, 1, stride=2), builder.conv("x", 2, 1, stride=1, pads=[0, 0, 1, 1])
    summed = builder.node("Add", [builder.conv("x", 4, 1), builder.conv("x", 4, 1)])
    _, counts = fold(builder, [a, b, c, d, summed], rules=only("sibling-convs"))
    assert counts["Conv"] == 6 and "Split" not in counts


def test_googlenet_reductions_are_kept_by_the_cpu_cost_model_with_the_reason():
    builder = GraphBuilder([1, 32, 14, 14])
    outputs = [builder.node("Relu", [builder.conv("x", w, 1)]) for w in (64, 96, 16)]
    outcome = rewrite(builder.model(outputs), "cost", only("sibling-convs"))
    assert "Split" not in op_counts(outcome.model)
    assert [entry["rule"] for entry in outcome.skipped] == ["sibling-convs"]
    assert "estimated" in outcome.skipped[0]["reason"]


# --- what exporters leave around linear regions ------------------------------------------


class RepMixer(torch.nn.Module):
    """FastViT's x + layer_scale * (mixer(x) - norm(x)), the branches summed from 0 as
    MobileOne writes them: mixer a depthwise conv-BN plus an identity BN, norm a BN alone."""

    def __init__(self, channels):
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False)
        self.conv_bn, self.skip, self.norm = (torch.nn.BatchNorm2d(channels) for _ in range(3))
        for bn in (self.conv_bn, self.skip, self.norm):
            bn.running_mean.uniform_(-1, 1), bn.running_var.uniform_(0.5, 2), bn.weight.data.uniform_(0.5, 1.5)
        self.layer_scale = torch.nn.Parameter(torch.rand(channels, 1, 1))

    def forward(self, x):
        mixer = 0 + self.conv_bn(self.conv(x)) + self.skip(x)
        norm = 0 + self.norm(x)
        return torch.relu(x + self.layer_scale * (mixer - norm))


@pytest.mark.parametrize("route", ["dynamo", "dynamo-unoptimized", "torchscript"])
def test_a_repmixer_folds_to_one_conv_from_every_export_route(tmp_path, route):
    model = folded(export(RepMixer(8), (1, 8, 10, 10), tmp_path / "mixer.onnx", route))
    outcome = rewrite(model, "cost")
    assert_same_outputs(model, outcome.model, [1, 8, 10, 10])
    assert op_counts(outcome.model) == {"Conv": 1, "Relu": 1}


class LinearBN(torch.nn.Module):
    """LeViT's Linear_BN: BatchNorm1d over every token, on the output flattened to [B*N, D]."""

    def __init__(self, cin, cout):
        super().__init__()
        self.linear, self.bn = torch.nn.Linear(cin, cout, bias=False), torch.nn.BatchNorm1d(cout)
        self.bn.running_mean.uniform_(-1, 1), self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        y = self.linear(x)
        return torch.nn.functional.hardswish(self.bn(y.flatten(0, 1)).reshape_as(y))


@pytest.mark.parametrize("route", ["dynamo", "dynamo-unoptimized", "torchscript"])
def test_levit_linear_bn_through_its_reshapes_is_one_matmul_and_its_bias(tmp_path, route):
    model = folded(export(LinearBN(12, 16), (2, 5, 12), tmp_path / "linear_bn.onnx", route))
    outcome = rewrite(model, "cost")
    assert_same_outputs(model, outcome.model, [2, 5, 12])
    assert op_counts(outcome.model) == {"MatMul": 1, "Add": 1, "HardSwish": 1}


def reshaped_linear_bn(builder, dense, bias, affine, final, allowzero=None):
    """x [2, 3, 4] -> dense to 6 -> Reshape [-1, 6] -> a per-feature map -> Reshape `final`."""
    if dense == "Gemm":  # a Gemm takes 2-D data: the chain starts from x flattened
        x = builder.node("Reshape", ["x", builder.const(np.array([6, 4]), dtype=np.int64)])
        h = builder.node("Gemm", [x, builder.const(builder.rng.standard_normal([4, 6]))]
                         + ([builder.const(builder.rng.standard_normal(6))] if bias else []))
    else:
        h = builder.node("MatMul", ["x", builder.const(builder.rng.standard_normal([4, 6]))])
        if bias:
            h = builder.node("Add", [h, builder.const(builder.rng.standard_normal(6))])
    flat = builder.node("Reshape", [h, builder.const(np.array([-1, 6]), dtype=np.int64)])
    mapped = builder.batchnorm(flat) if affine == "BatchNormalization" else builder.node(
        affine, [flat, builder.const(builder.rng.uniform(0.5, 2, 6))])
    attrs = {} if allowzero is None else {"allowzero": allowzero}
    y = builder.node("Reshape", [mapped, builder.const(np.array(final), dtype=np.int64)], **attrs)
    return builder.node("Relu", [y])


@pytest.mark.parametrize("dense, bias", [("MatMul", False), ("Gemm", False), ("Gemm", True)])
@pytest.mark.parametrize("affine", ["BatchNormalization", "Mul", "Add"])
@pytest.mark.parametrize("final", [
    [2, 3, 6],      # the MatMul's output shape again
    [6, 6],         # the Gemm's
    [2, 3, 2, 3],   # LeViT's head split
    [3, 2, 6],      # another order of the same rows
    [2, -1, 2, 3],  # -1 resolves alike from either shape
    [0, 2, 3],      # 0 copies the flattened input's 6: the static shape serves
    [36],           # all in one row
])
def test_a_dense_chain_through_reshapes_is_one_dense_and_one_reshape(dense, bias, affine, final):
    builder = GraphBuilder([2, 3, 4])
    y = reshaped_linear_bn(builder, dense, bias, affine, final)
    outcome, counts = fold(builder, [y], rules=only("dense-reshaped-affine"))
    dense_shape = [2, 3, 6] if dense == "MatMul" else [6, 6]
    expected = {dense: 1, "Relu": 1, "Reshape": (final != dense_shape) + (dense == "Gemm")}
    if dense == "MatMul" and affine != "Mul":  # the shift: MatMul's bias
        expected["Add"] = 1
    assert counts == {op: n for op, n in expected.items() if n}, outcome.skipped
    assert [entry["rule"] for entry in outcome.applied] == ["dense-reshaped-affine"]


def test_a_reshape_that_copies_a_dim_of_an_unknown_shape_is_reported():
    builder = GraphBuilder([2, 3, 4])
    y = reshaped_linear_bn(builder, "MatMul", False, "BatchNormalization", [0, 2, 3])
    outcome, counts = fold(builder, [y], dynamic_batch=True, rules=only("dense-reshaped-affine"))
    assert counts["BatchNormalization"] == 1
    (skipped,) = outcome.skipped
    assert "copies a dim (0) of its input" in skipped["reason"]


def test_a_zero_with_allowzero_is_a_zero_dim_and_folds_as_given():
    builder = GraphBuilder([0, 3, 4])  # an empty batch: allowzero keeps its 0
    y = reshaped_linear_bn(builder, "MatMul", False, "Mul", [0, 3, 2, 3], allowzero=1)
    model = builder.model([y])
    outcome = rewrite(model, "all", only("dense-reshaped-affine"))
    assert op_counts(outcome.model) == {"MatMul": 1, "Reshape": 1, "Relu": 1}
    feeds = {"x": np.zeros([0, 3, 4], np.float32)}
    assert run(outcome.model, feeds)[0].shape == run(model, feeds)[0].shape == (0, 3, 2, 3)


def test_a_first_reshape_that_moves_the_features_keeps_the_map_and_says_why():
    builder = GraphBuilder([2, 3, 4])
    h = builder.node("MatMul", ["x", builder.const(builder.rng.standard_normal([4, 6]))])
    flat = builder.node("Reshape", [h, builder.const(np.array([4, 9]), dtype=np.int64)])  # rows of 9 mix features
    y = builder.node("Reshape", [builder.batchnorm(flat), builder.const(np.array([2, 3, 6]), dtype=np.int64)])
    outcome, counts = fold(builder, [builder.node("Relu", [y])], rules=only("dense-reshaped-affine"))
    assert counts["BatchNormalization"] == 1
    (skipped,) = outcome.skipped
    assert "does not keep the last axis" in skipped["reason"]


class LeViTQKV(torch.nn.Module):
    """LeViT's qkv: Linear_BN, then a view straight to heads (dynamo's optimizer merges the
    reshape back and the view into one Reshape that splits the features)."""

    def __init__(self, dim=16, heads=4, per_head=8):
        super().__init__()
        self.linear_bn, self.heads = LinearBN(dim, heads * per_head), heads

    def forward(self, x):
        batch, tokens, _ = x.shape
        y = self.linear_bn.linear(x)
        y = self.linear_bn.bn(y.flatten(0, 1)).reshape_as(y)
        return torch.relu(y.view(batch, tokens, self.heads, -1).permute(0, 2, 1, 3))


@pytest.mark.parametrize("route", ["dynamo", "dynamo-unoptimized", "torchscript"])
def test_levit_qkv_split_into_heads_keeps_no_batchnorm(tmp_path, route):
    model = folded(export(LeViTQKV(), (2, 5, 16), tmp_path / "qkv.onnx", route))
    outcome = rewrite(model, "cost")
    assert_same_outputs(model, outcome.model, [2, 5, 16])
    counts = op_counts(outcome.model)
    assert "BatchNormalization" not in counts and counts["MatMul"] == 1, counts


@pytest.mark.parametrize("module", [LinearBN(16, 32), LeViTQKV()], ids=["linear_bn", "qkv"])
def test_levit_blocks_with_a_dynamic_batch_keep_no_batchnorm_and_any_batch(tmp_path, module):
    """The TorchScript export with a dynamic batch: the flatten to [B*N, D] has a size shape
    inference cannot give, reshape_as reads Shape(y) and the view to heads B = x.shape[0]; the
    targets become constants (0 or -1), the chain folds under the default cost strategy (which
    counts the flattened tensor's elements, not 1 for its unknown dim), and the batch stays dynamic."""
    path = tmp_path / "levit.onnx"
    torch.onnx.export(module.eval(), (torch.randn(2, 5, 16),), str(path), dynamo=False, do_constant_folding=False,
                      input_names=["x"], dynamic_axes={"x": {0: "batch"}})
    result = convexport.optimize(str(path), write=False, profile=False)
    counts = result.report["after"]["ops"]
    assert "BatchNormalization" not in counts and counts["MatMul"] == 1 and "Shape" not in counts, counts
    assert counts.get("Reshape", 0) == (1 if isinstance(module, LeViTQKV) else 0), counts  # to heads, or none
    for batch in (1, 3):
        feeds = {"x": np.random.default_rng(batch).standard_normal([batch, 5, 16]).astype(np.float32)}
        np.testing.assert_allclose(run(result.model, feeds)[0], run(result.original, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op,constant,first,dropped", [
    ("Add", 0.0, False, True), ("Add", 0.0, True, True), ("Sub", 0.0, False, True), ("Mul", 1.0, True, True),
    ("Div", 1.0, False, True), ("Sub", 0.0, True, False), ("Div", 1.0, True, False), ("Add", 1e-30, False, False),
    ("Mul", -1.0, False, False),
])
def test_a_neutral_constant_is_dropped_and_only_that(op, constant, first, dropped):
    builder = GraphBuilder([1, 3, 4, 4])
    k = builder.const(np.full([3, 1, 1], constant))
    y = builder.node(op, [k, "x"] if first else ["x", k])
    _, counts = fold(builder, [builder.node("Relu", [y])], rules=only("drop-neutral-constant"))
    assert (op not in counts) is dropped


def test_a_neutral_constant_that_broadcasts_the_input_stays():
    builder = GraphBuilder([1, 3, 1, 4])
    y = builder.node("Add", ["x", builder.const(np.zeros([1, 3, 5, 4]))])
    _, counts = fold(builder, [builder.node("Relu", [y])], rules=only("drop-neutral-constant"))
    assert counts["Add"] == 1


@pytest.mark.parametrize("starts,ends,axes,steps,dropped", [
    ([0], [4], [1], None, True), ([0, -6], [2**63 - 1, 6], [1, 3], None, True), ([0], [9], [-3], [1], True),
    ([1], [4], [1], None, False), ([0], [3], [1], None, False), ([0], [6], [3], [2], False),
    ([3], [-5], [1], [-1], False),
])
def test_a_slice_that_keeps_its_whole_input_is_dropped_and_only_that(starts, ends, axes, steps, dropped):
    """GhostNet's Concat(...)[:, :c] on a tensor of c channels, as the TorchScript exporter writes it."""
    builder = GraphBuilder([1, 4, 5, 6])
    inputs = ["x", *(builder.const(np.array(v), dtype=np.int64) for v in (starts, ends, axes))]
    if steps is not None:
        inputs.append(builder.const(np.array(steps), dtype=np.int64))
    _, counts = fold(builder, [builder.node("Relu", [builder.node("Slice", inputs)])], rules=only("drop-whole-slice"))
    assert ("Slice" not in counts) is dropped


@pytest.mark.parametrize("pads,mode,dropped", [
    ([0] * 8, "constant", True), ([0] * 8, "reflect", True), ([0, 0, 0, 1, 0, 0, 0, 0], "constant", False),
    ([0, 0, -1, 0, 0, 0, 0, 0], "edge", False),
])
def test_a_pad_of_nothing_is_dropped_and_only_that(pads, mode, dropped):
    builder = GraphBuilder([1, 3, 5, 5])
    y = builder.node("Pad", ["x", builder.const(np.array(pads), dtype=np.int64)], mode=mode)
    _, counts = fold(builder, [builder.node("Relu", [y])], rules=only("drop-empty-pad"))
    assert ("Pad" not in counts) is dropped
