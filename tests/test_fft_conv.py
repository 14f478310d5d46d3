"""Large-kernel convs as FFT convolutions: equal to the direct conv to fp32 accuracy."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import pytest

from convexport.rewrite.engine import RewriteSettings, rewrite_model
from convexport.folds import builtin_primitives
from graphs import RULES, GraphBuilder, rewrite
from helpers import all_op_counts, op_counts, run


def fft_outcome(builder, y, **params):
    rules = [replace(rule, params={**rule.params, **params}) if rule.name == "large-kernel-fft" else rule
             for rule in RULES]
    model = builder.model([y])
    return model, rewrite(model, "all", rules)   # the primitive gates itself by cost


def assert_fp32_close(model, rewritten, shape, seed=0):
    feeds = {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}
    (want,), (got,) = run(model, feeds), run(rewritten, feeds)
    scale = float(np.sqrt(np.mean(want.astype(np.float64) ** 2)))
    assert got.shape == want.shape
    assert np.max(np.abs(got - want)) <= 1e-5 * scale, np.max(np.abs(got - want)) / scale


GRID = [
    pytest.mark.parametrize("nd", [1, 2]),
    pytest.mark.parametrize("stride, dilation", [(1, 1), (2, 1), (1, 2), (3, 2)]),
    pytest.mark.parametrize("channels, pads, bias", [((1, 3), 0, False), ((2, 3), 5, True), ((3, 1), (3, 7), True)]),
]


def on_the_grid(test):
    for mark in GRID:
        test = mark(test)
    return test


def large_kernel_conv(nd, stride, dilation, channels, pads, bias) -> tuple[GraphBuilder, str, list[int]]:
    """A batch of 2 through a 31 (1-D) or 21x17 (2-D) conv of the grid's parameters."""
    cin, cout = channels
    shape = [2, cin] + [70, 53][:nd]
    builder = GraphBuilder(shape)
    kernel = [21, 17][:nd] if nd == 2 else [31]
    pad_list = [pads] * (2 * nd) if isinstance(pads, int) else [pads[0]] * nd + [pads[1]] * nd
    return builder, builder.conv("x", cout, kernel, stride=stride, dilation=dilation, pads=pad_list, bias=bias), shape


@on_the_grid
def test_fft_conv_equals_the_direct_conv(nd, stride, dilation, channels, pads, bias):
    builder, y, shape = large_kernel_conv(nd, stride, dilation, channels, pads, bias)
    model, outcome = fft_outcome(builder, y, min_kernel_area=16, min_advantage=0.0)
    counts, main = all_op_counts(outcome.model), op_counts(outcome.model)
    assert "Conv" not in counts and counts["DFT"] == 2 * nd and counts["Scan"] == 2 and main["Scan"] == 1, counts
    assert_fp32_close(model, outcome.model, shape)


def test_one_image_and_one_output_channel_at_a_time():
    """A Scan over the batch holds the forward DFTs, a Scan inside it over output channels the
    product and the inverse DFTs: no frequency-domain tensor holds more than one image and one
    output channel (peak memory)."""
    builder = GraphBuilder([2, 2, 60, 50])
    y = builder.conv("x", 5, 21, pads=3)
    model, outcome = fft_outcome(builder, y, min_kernel_area=16, min_advantage=0.0)
    images = _body(outcome.model.graph, "Scan")
    channels = _body(images, "Scan")
    assert [node.op_type for node in images.node].count("DFT") == 2
    assert [node.op_type for node in channels.node].count("DFT") == 2
    def dims(value):
        return [d.dim_value for d in value.type.tensor_type.shape.dim]
    assert dims(images.input[0]) == [2, 60, 50]                       # one image: [I, *L]
    assert [dims(value) for value in channels.input] == [[2, 128, 33, 1]] * 2   # one channel's kernel spectrum
    assert_fp32_close(model, outcome.model, [2, 2, 60, 50])


def _body(graph, op):
    return next(attr.g for node in graph.node if node.op_type == op for attr in node.attribute if attr.name == "body")


def test_seed003_sized_bank_is_rewritten_by_default():
    shape = [1, 1, 160, 200]
    builder = GraphBuilder(shape)
    y = builder.conv("x", 3, 135, bias=False)
    model, outcome = fft_outcome(builder, y)
    assert op_counts(outcome.model).get("Conv") is None
    assert outcome.applied[0]["flops_after"] * 2 < outcome.applied[0]["flops_before"]
    assert_fp32_close(model, outcome.model, shape)


def test_small_kernels_are_left_alone():
    builder = GraphBuilder([1, 4, 32, 32])
    y = builder.conv("x", 4, 7, pads=3)
    model, outcome = fft_outcome(builder, y)
    assert op_counts(outcome.model) == {"Conv": 1} and not outcome.skipped


def test_fft_that_would_not_pay_is_refused_with_its_numbers():
    builder = GraphBuilder([1, 1, 200, 200])
    y = builder.conv("x", 1, 11)                          # 121 taps, but one channel each way
    model, outcome = fft_outcome(builder, y, min_advantage=50.0)
    assert op_counts(outcome.model) == {"Conv": 1}
    assert "FLOPs against" in outcome.skipped[0]["reason"]


def test_dynamic_spatial_shape_is_refused():
    builder = GraphBuilder([1, 1, 64, 64])
    y = builder.conv("x", 2, 15)
    model = builder.model([y])
    for dim in model.graph.input[0].type.tensor_type.shape.dim[2:]:
        dim.dim_param = "S"
    outcome = rewrite(model, "cost")
    assert op_counts(outcome.model) == {"Conv": 1}
    assert "static spatial shape" in outcome.skipped[0]["reason"]


def test_a_dynamic_batch_runs_through_the_scan_over_images():
    builder = GraphBuilder([2, 1, 80, 90])
    y = builder.conv("x", 3, 31, pads=2)
    model = builder.model([y], dynamic_batch=True)
    outcome = rewrite(model, "cost")
    assert op_counts(outcome.model) == {"Scan": 1, "Add": 1}
    for batch in (1, 3):
        assert_fp32_close(model, outcome.model, [batch, 1, 80, 90], seed=batch)


def run_reference(model, feeds):
    """The model in ONNX's reference evaluator with convexport's com.microsoft ops (the CPU
    provider has no kernel for Rfft/Irfft)."""
    from onnx.reference import ReferenceEvaluator

    from convexport.validate.float64.fft_ops import REFERENCE_OPS

    return ReferenceEvaluator(model, new_ops=REFERENCE_OPS).run(None, feeds)


@on_the_grid
def test_for_cuda_the_fft_conv_is_rfft_and_irfft_and_equals_the_direct_conv(nd, stride, dilation, channels, pads, bias):
    """On CUDA, ONNX Runtime runs com.microsoft Rfft/Irfft on cuFFT and leaves ONNX's DFT to the
    CPU (seed 003 on an H200: 0.090 ms against the direct conv's 8.05 ms and the DFT graph's 77 ms):
    the fold for --device cuda writes them, over the whole batch."""
    builder, y, shape = large_kernel_conv(nd, stride, dilation, channels, pads, bias)
    model = builder.model([y])
    rules = [replace(rule, params={**rule.params, "min_kernel_area": 16, "min_advantage": 0.0})
             if rule.name == "large-kernel-fft" else rule for rule in RULES]
    outcome = rewrite_model(model, rules, builtin_primitives(), RewriteSettings("all", "cuda"))
    counts = op_counts(outcome.model)
    assert counts["Rfft"] == 1 and counts["Irfft"] == 1 and "Conv" not in counts and "Scan" not in counts, counts
    assert {entry.domain for entry in outcome.model.opset_import} >= {"", "com.microsoft"}
    onnx.checker.check_model(outcome.model, full_check=True)
    feeds = {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    (want,), (got,) = run(model, feeds), run_reference(outcome.model, feeds)
    scale = float(np.sqrt(np.mean(want.astype(np.float64) ** 2)))
    assert got.shape == want.shape and np.max(np.abs(got - want)) <= 1e-5 * scale


def test_a_cuda_fft_conv_is_validated_on_the_cpu_by_the_reference_evaluator(tmp_path, monkeypatch):
    """optimize(device="cuda") (standing in: the CPU runs what CUDA would) writes the Rfft form,
    and its CPU check, where ONNX Runtime's CPU provider has no Rfft kernel, passes in the
    reference evaluator."""
    monkeypatch.setattr("convexport.stages.request.resolve_device", lambda device: "cuda")
    monkeypatch.setattr("convexport.stages.validate._validated_on_device", lambda *args: args[-1] and _passed())
    import convexport

    builder = GraphBuilder([1, 1, 160, 200])
    model = builder.model([builder.conv("x", 3, 135, bias=False)])
    result = convexport.optimize(model, write=False, profile=False)
    assert op_counts(result.model).get("Rfft") == 1 and result.report["validation"]["passed"]


def _passed():
    from convexport.validate.results import Tolerances, ValidationResult

    return ValidationResult(True, 0, Tolerances())
