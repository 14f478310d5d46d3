"""A fold of parallel branches weighed against rounding into the half type (issue 52,
convexport/folds/half_rounding.py): exact in real arithmetic, a fold that puts an exact
identity into rounded taps is further from the exact result in float16 than the graph it
replaces, and `--dtype fp16` leaves it unfolded; a float32 output folds it as before, and
branches of independent weights fold in float16 too."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import convexport
from convexport.algebra import Refusal, combine_parallel, identity_conv
from convexport.algebra.spec import ConvSpec
from convexport.validate.float64 import Float64Evaluator
from convexport.folds import half_rounding
from convexport.folds.half_rounding import keep_if_rounding_allows, refuse_if_rounding_undoes
from helpers import make_model, op_counts, tensor


def conv_spec(weight: np.ndarray) -> ConvSpec:
    pads = tuple(size // 2 for size in weight.shape[2:])
    ones = (1,) * (weight.ndim - 2)
    return ConvSpec(weight, np.zeros(weight.shape[0]), False, ones, ones, pads, pads)


def depthwise_dense(rng, channels: int, scale: float, spatial: int = 2) -> np.ndarray:
    """A depthwise 3x3 (or 3x3x3) kernel in ConvSpec's dense form (block diagonal)."""
    taps = (3,) * spatial
    weight = np.zeros((channels, channels, *taps))
    for channel in range(channels):
        weight[channel, channel] = rng.uniform(-scale, scale, taps)
    return weight


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
@pytest.mark.parametrize("spatial", [1, 2, 3])
def test_an_exact_identity_folded_into_small_taps_is_refused(half, spatial):
    """Taps of a tenth beside the identity's 1 (at a third, the 3x3x3 kernel's 26 other taps
    weigh as much as the centre, and the fold is 1.1-1.6x as far: within FOLD_SLACK or not by
    draw)."""
    rng = np.random.default_rng(spatial)
    specs = [conv_spec(depthwise_dense(rng, 8, 0.1, spatial)), identity_conv(8, spatial)]
    merged = combine_parallel(specs, [1.0, -1.0], None)
    with pytest.raises(Refusal, match=f"rounded to {half}") as refused:
        keep_if_rounding_allows(specs, [1.0, -1.0], [False, True], merged, None, half)
    numbers = refused.value.decision
    assert numbers["folded_error"] > half_rounding.FOLD_SLACK * numbers["branches_error"] > 0
    keep_if_rounding_allows(specs, [1.0, -1.0], [False, True], merged, None, None)  # float32: nothing to weigh


def repvgg_branches(rng) -> list[ConvSpec]:
    """RepVGG's 3x3 + 1x1 + BatchNorm scale of x, each of its own random weights."""
    three = rng.normal(0, 0.1, (16, 16, 3, 3))
    one = np.zeros_like(three)
    one[:, :, 1, 1] = rng.normal(0, 0.2, (16, 16))
    scale = np.zeros_like(three)
    scale[np.arange(16), np.arange(16), 1, 1] = rng.uniform(0.5, 1.5, 16)
    return [conv_spec(three), conv_spec(one), conv_spec(scale)]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_branches_of_independent_weights_fold_in_half_precision(seed, half):
    """The folded kernel rounds as the branches do: within FOLD_SLACK when compared (the
    comparison itself, which keep_if_rounding_allows makes only where a branch is x itself)."""
    specs = repvgg_branches(np.random.default_rng(seed))
    merged = combine_parallel(specs, [1.0] * 3, None)
    kind = half_rounding.HALF_TYPES[half]
    rounded = [replace(spec, weight=spec.weight.astype(kind).astype(np.float64)) for spec in specs]
    refuse_if_rounding_undoes(merged.weight, combine_parallel(rounded, [1.0] * 3, None).weight, half)
    keep_if_rounding_allows(specs, [1.0] * 3, [False] * 3, merged, None, half)


def test_branches_already_in_float16_fold_where_none_is_x_itself():
    """Weights that were float16 before (a float16 checkpoint) are exact in float16 one by one,
    and their sum is not; but unfolded on a device that computes in float16 each branch's
    output is rounded instead, so the fold is kept (module doc). Beside x itself it is weighed
    against the other branches' fold rounded, which is not exact either."""
    specs = repvgg_branches(np.random.default_rng(0))
    specs = [replace(spec, weight=spec.weight.astype(np.float16).astype(np.float64)) for spec in specs]
    merged = combine_parallel(specs, [1.0] * 3, None)
    keep_if_rounding_allows(specs, [1.0] * 3, [False] * 3, merged, None, "float16")
    with_x = [*specs, identity_conv(16, 2)]
    keep_if_rounding_allows(with_x, [1.0] * 4, [False] * 3 + [True], combine_parallel(with_x, [1.0] * 4, None),
                            None, "float16")  # fmt: skip


def subtracted_conv(seed: int = 0) -> onnx.ModelProto:
    """Seed 000's block: p = 1x1(x); cat(depthwise(p) - p, dense(p))."""
    rng = np.random.default_rng(seed)
    weights = {
        "pw": rng.uniform(-0.25, 0.25, (16, 16, 1, 1)).astype(np.float32),
        "dw": rng.uniform(-1 / 3, 1 / 3, (16, 1, 3, 3)).astype(np.float32),
        "lp": rng.uniform(-1 / 12, 1 / 12, (16, 16, 3, 3)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "pw"], ["p"]),
        helper.make_node("Conv", ["p", "dw"], ["d"], group=16, pads=[1, 1, 1, 1]),
        helper.make_node("Sub", ["d", "p"], ["s"]),
        helper.make_node("Conv", ["p", "lp"], ["l"], pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["s", "l"], ["y"], axis=1),
    ]
    return make_model(nodes, [tensor("x", [1, 16, 20, 20])], [tensor("y", [1, 32, 20, 20])], weights)


def scaled_residual(gamma: float = 1e-4) -> onnx.ModelProto:
    """FastViT's residual with its layer scale taken into the conv: y = x + conv(x) * gamma."""
    rng = np.random.default_rng(1)
    weights = {"w": (rng.normal(0, 0.2, (8, 8, 3, 3)) * gamma).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Add", ["c", "x"], ["y"])]
    return make_model(nodes, [tensor("x", [1, 8, 12, 12])], [tensor("y", [1, 8, 12, 12])], weights)


def dense_residual(gamma: float = 1e-4) -> onnx.ModelProto:
    """A linear adapter on the last axis with its residual: y = x + (x W) * gamma, folded as a
    linear region into x (I + gamma W)."""
    rng = np.random.default_rng(2)
    weights = {"w": (rng.normal(0, 0.2, (32, 32)) * gamma).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "x"], ["y"])]
    return make_model(nodes, [tensor("x", [4, 6, 32])], [tensor("y", [4, 6, 32])], weights)


def half_error(original: onnx.ModelProto, path) -> float:
    """The float16 file's rms error against the original's float64 result over three fresh
    input sets: a fold's rounding moves every element of its output, which the rms measures
    steadily (the largest error is one element's draw, and the input's own rounding to float16
    is most of it: seed 000's block, 0.92x as far unfolded by the largest error, 0.83x by rms)."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    evaluator, squares, count = Float64Evaluator(original), 0.0, 0
    shape = [d.dim_value for d in original.graph.input[0].type.tensor_type.shape.dim]
    for seed in range(3):
        feeds = {"x": np.random.default_rng(50 + seed).standard_normal(shape).astype(np.float32)}
        (got,), (want,) = session.run(None, feeds), evaluator.run(feeds)
        squares, count = squares + float(np.sum((got.astype(np.float64) - want) ** 2)), count + want.size
    return (squares / count) ** 0.5


@pytest.mark.parametrize(
    ("build", "rule", "left"),
    [
        (subtracted_conv, "sub-linear-identity", "Sub"),
        (scaled_residual, "add-linear-identity", "Add"),
        (dense_residual, "linear-region", "Add"),
    ],
)
def test_a_fold_that_rounding_would_undo_is_left_out_of_a_float16_model(tmp_path, monkeypatch, build, rule, left):
    """Left unfolded in float16 (reported, with the two errors), folded in float32, and nearer
    the exact result than the same model in float16 with the fold forced."""
    model = build()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)

    def optimized(name: str, **options):
        out = tmp_path / name
        return convexport.optimize(str(path), output=out, profile=False, **options).report, out

    report, kept = optimized("half.onnx", dtype="fp16")
    refused = [entry for entry in report["skipped"] if entry["rule"] == rule]
    assert refused and "rounded to float16" in refused[0]["reason"], report["skipped"]
    assert refused[0]["decision"]["method"] == "half-precision rounding"
    assert op_counts(onnx.load(str(kept))).get(left) == 1
    float32, folded32 = optimized("float.onnx")
    assert any(entry["rule"] == rule for entry in float32["rewrites"])
    assert left not in op_counts(onnx.load(str(folded32)))
    monkeypatch.setattr(half_rounding, "FOLD_SLACK", float("inf"))
    _, forced = optimized("forced.onnx", dtype="fp16")
    assert left not in op_counts(onnx.load(str(forced)))
    assert half_error(model, kept) < 0.9 * half_error(model, forced)
