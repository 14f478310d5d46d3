"""optimize --dtype fp16 (issue 52): the rewritten model in float16 where the error measured
against the float64 result allows, float32 where not, its outputs judged against the exact
result with float16's roundoff, and every judgement checked here on its own: the model ONNX
Runtime runs, the float64 reference computed again, the bound the report gives."""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import convexport
from convexport.half.input_moments import flips_by_moments
from convexport.half.row_sums import Rows, rounded_keeping_sums
from convexport.validate.float64 import Float64Evaluator
from convexport.half.rounding import rounded
from convexport.report.words import precision_lines
from convexport.report.sections import render
from helpers import assert_user_error, invoke, make_model, run, tensor

FLOAT16, FLOAT = TensorProto.FLOAT16, TensorProto.FLOAT


def conv_net(seed=0):
    """Conv -> Relu -> Conv -> GlobalAveragePool -> Flatten -> Gemm, weights of a trained scale."""
    rng = np.random.default_rng(seed)
    weights = {
        "w1": rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "b1": rng.normal(0, 0.1, 8).astype(np.float32),
        "w2": rng.normal(0, 0.2, (8, 8, 3, 3)).astype(np.float32), "b2": rng.normal(0, 0.1, 8).astype(np.float32),
        "fc": rng.normal(0, 0.3, (4, 8)).astype(np.float32), "fb": rng.normal(0, 0.1, 4).astype(np.float32),
    }  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["c2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fb"], ["y"], transB=1),
    ]
    return make_model(nodes, [tensor("x", [1, 3, 16, 16])], [tensor("y", [1, 4])], weights)


def optimized_in_half(model, tmp_path, **options):
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    result = convexport.optimize(str(path), output=str(tmp_path / "m.fp16.onnx"), profile=False, dtype="fp16",
                                 **options)  # fmt: skip
    return result, onnx.load(str(tmp_path / "m.fp16.onnx"))


def judged_again(original: onnx.ModelProto, half: onnx.ModelProto, report: dict, seeds=range(3)) -> None:
    """The half model, run by ONNX Runtime on fresh inputs, is as near the original's float64
    result as float16 allows: within the bound the report gave for each output (the bound is
    set on made-up inputs of the same distribution)."""
    evaluator = Float64Evaluator(original)
    session = ort.InferenceSession(half.SerializeToString(), providers=["CPUExecutionProvider"])
    declared = {value.name: value.type for value in session.get_inputs()}
    outputs = report["precision"]["validation"]["outputs"]
    for seed in seeds:
        rng = np.random.default_rng(100 + seed)
        feeds = {}
        for value in original.graph.input:
            shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
            feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
        exact = evaluator.run(feeds)
        fed = {k: v.astype(np.float16) if declared[k] == "tensor(float16)" else v for k, v in feeds.items()}
        for value, got, want in zip(original.graph.output, session.run(None, fed), exact):
            error = np.abs(np.asarray(got, np.float64) - want).max()
            assert error <= 2 * outputs[value.name]["bound"], (value.name, error, outputs[value.name])


def test_a_conv_net_in_float16_keeps_a_float32_interface_and_casts_only_there(tmp_path):
    model = conv_net()
    result, half = optimized_in_half(model, tmp_path)
    precision = result.report["precision"]
    assert precision["validation"]["passed"] and precision["validation"]["against"] == "float64"
    assert [v.type.tensor_type.elem_type for v in (*half.graph.input, *half.graph.output)] == [FLOAT, FLOAT]
    casts = [node for node in half.graph.node if node.op_type == "Cast"]
    assert len(casts) == precision["casts"] == 2  # the interface's: a float32 tail moves the last one, adds none
    assert half.graph.node[0].op_type == "Cast"
    # the nodes after the second Cast are the float32 tail (half/tails.py, choose.py step 5), each listed with its reason
    tail = half.graph.node[[n.op_type for n in half.graph.node].index("Cast", 1) + 1 :]
    assert [kept["node"] for kept in precision["kept_float32"]] == [node.output[0] for node in tail]
    assert all("float32 tail" in kept["reason"] for kept in precision["kept_float32"])
    assert precision["nodes_half"] == len(half.graph.node) - 2 - len(tail)
    in_tail = {name for node in tail for name in node.input}
    for weight in half.graph.initializer:  # rounded into float16 where a half node reads it, float32 in the tail
        assert weight.data_type == (FLOAT if weight.name in in_tail else FLOAT16), weight.name
    in_half = {weight.name for weight in half.graph.initializer if weight.data_type == FLOAT16}
    kernels, biases = len(in_half & {"w1", "w2", "fc"}), len(in_half & {"b1", "b2", "fb"})
    ways = ({"keeping_row_sums": kernels, "by_input_moments": 0, "to_nearest": biases},
            {"keeping_row_sums": 0, "by_input_moments": kernels, "to_nearest": biases},
            {"keeping_row_sums": 0, "by_input_moments": 0, "to_nearest": kernels + biases})
    assert precision["weights_rounded"] in ways  # the kernels rounded one of three ways, the biases to nearest (step 4)
    judged_again(model, half, result.report)
    # the report's 'after' is the model written
    assert result.report["after"]["ops"]["Cast"] == 2


def test_a_float16_interface_has_no_casts(tmp_path):
    result, half = optimized_in_half(conv_net(), tmp_path, io_dtype="fp16")
    assert [v.type.tensor_type.elem_type for v in (*half.graph.input, *half.graph.output)] == [FLOAT16, FLOAT16]
    assert "Cast" not in Counter(node.op_type for node in half.graph.node)
    assert result.report["precision"]["io_dtype"] == "float16" and result.report["precision"]["validation"]["passed"]


def test_weights_are_rounded_once_from_the_fold(tmp_path):
    """Two convs folded into one in float64, the composite rounded into float16 once: its
    weights are the float32 fold's rounded into float16 one of step 4's three ways (choose.py:
    each output channel's sum kept, by the input's second moments, or to nearest), whichever
    the report says, to the bit."""
    rng = np.random.default_rng(1)
    w1, w2 = rng.normal(0, 0.5, (8, 3, 1, 1)).astype(np.float32), rng.normal(0, 0.5, (4, 8, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h"]), helper.make_node("Conv", ["h", "w2"], ["y"])]
    model = make_model(nodes, [tensor("x", [1, 3, 8, 8])], [tensor("y", [1, 4, 8, 8])], {"w1": w1, "w2": w2})
    result, half = optimized_in_half(model, tmp_path)
    assert Counter(node.op_type for node in half.graph.node) == {"Conv": 1, "Cast": 2}
    (weight,) = [numpy_helper.to_array(t) for t in half.graph.initializer if t.dims[0] == 4]
    fold = np.einsum("oh,hi->oi", w2[:, :, 0, 0].astype(np.float64), w1[:, :, 0, 0].astype(np.float64))
    assert weight.dtype == np.float16
    folded = fold.astype(np.float32)[:, :, None, None]
    one_conv = make_model([helper.make_node("Conv", ["x", "w"], ["y"])], [tensor("x", [1, 3, 8, 8])],
                          [tensor("y", [1, 4, 8, 8])], {"w": folded})  # fmt: skip
    (way,) = [way for way, count in result.report["precision"]["weights_rounded"].items() if count]
    np.testing.assert_array_equal(weight, _each_way(one_conv, "w")[way])


def _pooled_after_relu(seed=0):
    """Relu -> Conv 3x3 (144-wide rows) -> GlobalAveragePool: the conv's input has a mean (a
    Relu's output), and the pool averages each output's noise away but keeps the mean times its
    row's sum of rounding errors."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Conv", ["r", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c"], ["y"])]  # fmt: skip
    weights = {"w": rng.normal(0, 0.1, (32, 16, 3, 3)).astype(np.float32)}
    return make_model(nodes, [tensor("x", [1, 16, 12, 12])], [tensor("y", [1, 32, 1, 1])], weights)


def _depthwise_on_zero_mean(seed=0):
    """A depthwise 3x3 on the N(0, 1) input, every output position its own: the input has no
    mean for a row's sum of errors to meet, and keeping the 9-tap rows' sums moves about one
    tap in six to its farther neighbour."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], group=16)]
    weights = {"w": rng.normal(0, 0.3, (16, 1, 3, 3)).astype(np.float32)}
    return make_model(nodes, [tensor("x", [1, 16, 24, 24])], [tensor("y", [1, 16, 24, 24])], weights)


def _conv_after_relu(seed=0):
    """Relu -> Conv 3x3, every output position its own: the row sums' gain (the input's mean
    times each row's sum of errors) is some 8% of the rms error, and the largest error, one
    element's, comes out the other way on some seeds (11 and 19, which the choice by the largest
    error got wrong)."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Conv", ["r", "w"], ["y"], pads=[1, 1, 1, 1])]
    weights = {"w": rng.normal(0, 0.1, (32, 16, 3, 3)).astype(np.float32)}
    return make_model(nodes, [tensor("x", [1, 16, 12, 12])], [tensor("y", [1, 32, 12, 12])], weights)


def _each_way(model: onnx.ModelProto, name: str) -> dict[str, np.ndarray]:
    """The weight `name` of `model` rounded into float16 each of the three ways step 4 tries
    (row_sums.py, input_moments.py on convexport's first made-up input set, to nearest)."""
    from convexport.half.input_moments import input_moments
    from convexport.half.rounding import weight_rows, weight_shapes
    from convexport.half.row_sums import with_flips
    from convexport.load.inputs import random_inputs
    from convexport.load.onnx_route import graph_input_specs

    w = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == name))
    rows = weight_rows(model.graph)
    values = Float64Evaluator(model).run(random_inputs(graph_input_specs(model), 0), intermediate=True)
    moments = input_moments(model.graph, rows, weight_shapes(model.graph), values)[name]
    half = np.dtype(np.float16)
    return {
        "keeping_row_sums": rounded_keeping_sums(w, half, rows[name]),
        "by_input_moments": with_flips(w, half, flips_by_moments(w, half, rows[name], moments)),
        "to_nearest": w.astype(np.float16),
    }


def _squared_error(model: onnx.ModelProto, original: onnx.ModelProto, seeds=range(50, 53)) -> float:
    """`model`'s squared error against `original`'s float64 result on fresh N(0, 1) inputs."""
    evaluator = Float64Evaluator(original)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    shape = [d.dim_value for d in original.graph.input[0].type.tensor_type.shape.dim]
    squared = 0.0
    for seed in seeds:
        x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        squared += float(np.sum((session.run(None, {"x": x})[0] - evaluator.run({"x": x})[0]) ** 2))
    return squared


@pytest.mark.parametrize(
    "build, seed",
    [(_pooled_after_relu, 0), (_pooled_after_relu, 1), (_depthwise_on_zero_mean, 0), (_depthwise_on_zero_mean, 1),
     (_conv_after_relu, 11), (_conv_after_relu, 19)],
)  # fmt: skip
def test_the_rounding_whose_outputs_are_nearer_is_kept(tmp_path, build, seed):
    """Step 4 converts the model with its weight keeping its rows' sums, by its input's second
    moments and to nearest, and keeps the nearest by rms error: the written model's weight is
    the kept way's to the bit, and on fresh inputs the model is nearer the exact result than
    the same model with its weight rounded either other way. (Relu -> Conv: the input has a
    mean, which the sums and the moments serve; a depthwise conv on N(0, 1): no mean, no
    correlation between taps, and the moments' way is rounding to nearest.)"""
    model = build(seed)
    result, half = optimized_in_half(model, tmp_path)
    ways = _each_way(model, "w")
    chosen = [way for way, count in result.report["precision"]["weights_rounded"].items() if count]
    assert len(chosen) == 1, chosen
    (stored,) = [t for t in half.graph.initializer if t.data_type == FLOAT16]
    np.testing.assert_array_equal(numpy_helper.to_array(stored), ways[chosen[0]])
    errors = {}
    for way, weight in ways.items():
        otherwise = onnx.ModelProto()
        otherwise.CopyFrom(half)
        (other,) = [t for t in otherwise.graph.initializer if t.data_type == FLOAT16]
        other.CopyFrom(numpy_helper.from_array(weight, other.name))
        errors[way] = _squared_error(otherwise, model)
    # within 2% of the nearest: two ways that close are a tie on three input sets (on the
    # depthwise conv, H estimated on one set is the identity but for its noise)
    assert errors[chosen[0]] <= 1.02 * min(errors.values()), (chosen, errors)


def test_rounding_by_input_moments_keeps_each_element_at_a_neighbour_and_meets_the_input_least():
    """input_moments.py on a correlated input (a smooth signal: neighbouring taps move
    together) with a mean: every element is one of its two float16 neighbours, and the rows'
    error energy d H d^T is below both rounding to nearest's and the row sums'; with H the
    identity it is rounding to nearest."""
    from convexport.half.input_moments import _greedy_flips

    rng = np.random.default_rng(4)
    w = rng.normal(0, 0.2, (64, 48)).astype(np.float32)
    smooth = np.cumsum(rng.standard_normal((48, 4000)), axis=0) / 6 + 0.5  # a random walk along K, mean 0.5
    second = smooth @ smooth.T / smooth.shape[1]
    half = np.dtype(np.float16)
    rows = Rows((0, 1), 1)
    by_moments = with_flips_of(w, _greedy_flips(w, half, second))
    nearest, sums = w.astype(half), rounded_keeping_sums(w, half, rows)
    exact = w.astype(np.float64)
    below = np.where(nearest.astype(np.float64) > exact, np.nextafter(nearest, np.float16(-np.inf)), nearest)
    above = np.where(nearest.astype(np.float64) > exact, nearest, np.nextafter(nearest, np.float16(np.inf)))
    assert np.all((by_moments == below) | (by_moments == above))

    def energy(rounded):
        error = rounded.astype(np.float64) - w.astype(np.float64)
        return float(np.einsum("rk,kl,rl->", error, second, error))

    assert energy(by_moments) < 0.8 * min(energy(nearest), energy(sums)), (energy(by_moments), energy(nearest), energy(sums))
    np.testing.assert_array_equal(with_flips_of(w, _greedy_flips(w, half, np.eye(48))), nearest)


def with_flips_of(w: np.ndarray, flipped: np.ndarray) -> np.ndarray:
    """`w` rounded to nearest float16, the elements where `flipped` is True to their other neighbour."""
    from convexport.half.row_sums import with_flips

    return with_flips(w, np.dtype(np.float16), np.flatnonzero(flipped))


def _difference_of_large_terms():
    """relu(conv_a(x) * 300 + 5000) - relu(conv_b(x) * 300 + 5000) with two convs of nearly
    the same weights: each term in float16 is 5000 to within 4, their difference about 0.3."""
    rng = np.random.default_rng(2)
    wa = rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)
    wb = wa + rng.normal(0, 1e-3, wa.shape).astype(np.float32)
    weights = {"wa": wa, "wb": wb, "s": np.float32(300.0), "t": np.float32(5000.0)}
    nodes = [
        helper.make_node("Conv", ["x", "wa"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "wb"], ["b"], pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["a", "s"], ["as"]), helper.make_node("Add", ["as", "t"], ["at"]),
        helper.make_node("Mul", ["b", "s"], ["bs"]), helper.make_node("Add", ["bs", "t"], ["bt"]),
        helper.make_node("Relu", ["at"], ["ra"]), helper.make_node("Relu", ["bt"], ["rb"]),
        helper.make_node("Sub", ["ra", "rb"], ["y"]),
    ]  # fmt: skip
    return make_model(nodes, [tensor("x", [1, 3, 8, 8])], [tensor("y", [1, 4, 8, 8])], weights)


def test_a_difference_of_large_terms_grows_a_float32_region_back_from_the_output(tmp_path):
    """_difference_of_large_terms: each node but the Sub is within its own bound, the output is
    not, and the float32 region that fixes it is the Sub and what feeds it."""
    model = _difference_of_large_terms()
    result, half = optimized_in_half(model, tmp_path)
    precision = result.report["precision"]
    kept = {entry["op"] for entry in precision["kept_float32"]}
    assert "Sub" in kept and precision["validation"]["passed"]
    assert any("outputs meet the bound" in entry["reason"] or "puts" in entry["reason"] for entry in
               precision["kept_float32"])  # fmt: skip
    judged_again(model, half, result.report)
    # all of it in float16 is what the bound refuses: the same model with nothing kept is far off
    error = precision["validation"]["outputs"]["y"]["error"]
    assert error <= precision["validation"]["outputs"]["y"]["bound"]


def _ill_conditioned_pairs(pairs=12, condition=60.0, width=16, seed=0):
    """Tanh(x B) then Tanh(h B^-1), `pairs` times: each B of the given condition number, each
    Tanh near its linear range. Each node's own float16 error is within its bound; B^-1
    amplifies the rounding of what B made, pair after pair, so that the outputs' error is
    spread through the whole chain (as a deep network's through its layers)."""
    rng = np.random.default_rng(seed)
    weights, nodes, x = {}, [], "x"
    for i in range(pairs):
        q1, _ = np.linalg.qr(rng.standard_normal((width, width)))
        q2, _ = np.linalg.qr(rng.standard_normal((width, width)))
        b = q1 @ np.diag(np.geomspace(1, 1 / condition, width)) @ q2
        for j, w in enumerate((b, np.linalg.inv(b))):
            weights[f"w{i}_{j}"] = w.astype(np.float32)
            nodes += [helper.make_node("MatMul", [x, f"w{i}_{j}"], [f"m{i}_{j}"]),
                      helper.make_node("Tanh", [f"m{i}_{j}"], [f"t{i}_{j}"])]  # fmt: skip
            x = f"t{i}_{j}"
    nodes[-1].output[0] = "y"
    return make_model(nodes, [tensor("x", [4, width])], [tensor("y", [4, width])], weights)


def _rounded_to_half_in_float64(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """_ill_conditioned_pairs' outputs with every value rounded to float16 (the input, each
    weight, each MatMul's and Tanh's output), computed in float64 by numpy."""

    def half(values):
        return np.asarray(values, np.float64).astype(np.float16).astype(np.float64)

    weights = {t.name: half(numpy_helper.to_array(t)) for t in model.graph.initializer}
    value = half(x)
    for node in model.graph.node:
        value = half(value @ weights[node.input[1]]) if node.op_type == "MatMul" else half(np.tanh(value))
    return value


def test_an_error_spread_through_the_chain_is_judged_by_the_model_rounded_to_half(tmp_path):
    """_ill_conditioned_pairs: the float16 model misses the bound of the float32 original's own
    error, and only keeping most of the chain float32 would meet it (before: 14 of 48 nodes in
    float16). That is what float16 costs this model by itself: with every value rounded to
    float16 (numpy, in float64 here) it is as far. So every node runs in float16, judged against
    that run as well, and the report says so."""
    model = _ill_conditioned_pairs()
    result, half = optimized_in_half(model, tmp_path)
    precision = result.report["precision"]
    judged = precision["validation"]
    assert precision["nodes_half"] == 48 and precision["nodes_float32"] == 0 and precision["casts"] == 2
    assert judged["passed"] and judged["bound_by"] == "rounded"
    output = judged["outputs"]["y"]
    assert output["bound"] >= 4 * output["error_rounded"] > 400 * output["error_original"]
    # the rounded run convexport made is the one numpy makes, and the written model is judged by it
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    exact = Float64Evaluator(model).run({"x": x})[0]
    by_numpy = np.abs(_rounded_to_half_in_float64(model, x) - exact).max()
    (ours,) = ort.InferenceSession(half.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.abs(ours - exact).max() <= 4 * by_numpy + 32 * 2.0**-11 * np.sqrt(np.mean(exact**2))
    assert 0.5 * by_numpy <= output["error_rounded"] <= 2 * by_numpy
    judged_again(model, half, result.report)
    lines = "\n".join(precision_lines(precision, "the report"))
    assert "the model's with every value rounded to float16" in lines and "spread through the model" in lines
    assert "<th>every value rounded to float16</th>" in render(result.report)
    # `convexport validate` counts the original rounded to float16 too: the file passes, a wrong
    # weight does not (one layer 20% off: float16's own noise here is a few percent of the outputs)
    done = invoke("validate", tmp_path / "m.onnx", tmp_path / "m.fp16.onnx")
    assert done.exit_code == 0 and "the original with every value rounded to float16 counted" in done.output, done.output
    tampered = onnx.load(str(tmp_path / "m.fp16.onnx"))
    weight = tampered.graph.initializer[3]
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * np.float16(1.2), weight.name))
    onnx.save(tampered, tmp_path / "tampered.onnx")
    assert invoke("validate", tmp_path / "m.onnx", tmp_path / "tampered.onnx").exit_code == 3


@pytest.mark.parametrize("half", [FLOAT16, TensorProto.BFLOAT16])
def test_the_rounded_run_rounds_every_float_value_and_nothing_else(half):
    """rounded_run: the input, each weight and each node's float output go through the half
    type; the int64 shape does not. Mul and Add in float32 are correctly rounded, so numpy's
    same sequence is the same to the bit."""
    from convexport.ir.slots import element_types
    from convexport.validate.rounded_run import rounded_runs
    from convexport.ir.slots import NUMPY_TYPES

    rng = np.random.default_rng(5)
    weights = {"shape": np.array([4, 6], np.int64), "w": rng.standard_normal(6).astype(np.float32),
               "b": rng.standard_normal(6).astype(np.float32)}  # fmt: skip
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Mul", ["r", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["y"])]  # fmt: skip
    model = make_model(nodes, [tensor("x", [2, 12])], [tensor("y", [4, 6])], weights)
    x = (rng.standard_normal((2, 12)) * 3).astype(np.float32)
    (ours,) = rounded_runs(model, element_types(model), half, [{"x": x}])

    def rounded(values):
        return np.asarray(values, np.float32).astype(NUMPY_TYPES[half]).astype(np.float32)

    by_numpy = rounded(rounded(rounded(x).reshape(4, 6) * rounded(weights["w"])) + rounded(weights["b"]))
    np.testing.assert_array_equal(ours["y"], by_numpy)
    assert not np.array_equal(by_numpy, (x.reshape(4, 6) * weights["w"] + weights["b"]))


@pytest.mark.parametrize("off, lost", [(0.12, False), (0.13, True), (np.inf, False)])
def test_an_output_is_lost_to_rounding_past_an_eighth_of_its_largest_value(off, lost):
    """rounded_run.loses: off by more than 1/8 of the largest exact value (an infinity where
    the exact result is finite is left to the bound's own rule)."""
    from convexport.validate.rounded_run import loses

    wanted = np.array([[-2.0, 0.5], [1.0, 0.0]])
    rounded = wanted + np.array([[0.0, 0.0], [off * 2.0, 0.0]])
    assert loses(rounded, wanted) is lost


def test_a_model_half_precision_loses_stays_float32_as_far_as_the_bound_asks(tmp_path):
    """_difference_of_large_terms also needs most of its FLOPs float32, but with every value
    rounded to float16 its output is lost (off by more than its largest value): the rounded run
    is no measure of what float16 may cost, and the float32 original's bound stands."""
    result, _ = optimized_in_half(_difference_of_large_terms(), tmp_path)
    judged = result.report["precision"]["validation"]
    assert judged["passed"] and judged["bound_by"] == "float32" and "error_rounded" not in judged["outputs"]["y"]


def test_a_softmax_of_large_logits_keeps_the_node_that_makes_them(tmp_path):
    """Softmax(MatMul(x, W) + 1000): float16 holds a logit near 1000 to within 0.25, which
    moves exp by up to 28%: the Softmax is over its bound even computed in float32 on those
    inputs, so what makes them stays float32 too."""
    rng = np.random.default_rng(3)
    weights = {"w": rng.normal(0, 0.3, (16, 32)).astype(np.float32), "k": np.float32(1000.0)}
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "k"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["y"], axis=-1),
    ]
    model = make_model(nodes, [tensor("x", [2, 16])], [tensor("y", [2, 32])], weights)
    result, half = optimized_in_half(model, tmp_path)
    precision = result.report["precision"]
    kept = {entry["op"]: entry["reason"] for entry in precision["kept_float32"]}
    assert "Softmax" in kept and precision["validation"]["passed"], kept
    assert any("puts" in reason and "Softmax" in reason for reason in kept.values()), kept
    judged_again(model, half, result.report)


def test_operands_that_are_not_data_keep_their_type(tmp_path):
    """Resize's scales are float in every opset and stay so; a Cast to float in a float16
    region makes float16; a ConstantOfShape's value follows its node; integer tensors (a
    Shape's) are left alone."""
    nodes = [
        helper.make_node("Resize", ["x", "", "scales"], ["r"], mode="nearest"),
        helper.make_node("Shape", ["r"], ["shape"]),
        helper.make_node("ConstantOfShape", ["shape"], ["ones"], value=numpy_helper.from_array(np.ones(1, np.float32))),
        helper.make_node("Add", ["r", "ones"], ["a"]),
        helper.make_node("Cast", ["shape"], ["shape_f"], to=FLOAT),
        helper.make_node("ReduceSum", ["shape_f"], ["n"], keepdims=0),
        helper.make_node("Mul", ["a", "n"], ["y"]),
    ]
    scales = {"scales": np.array([1, 1, 2, 2], np.float32)}
    model = make_model(nodes, [tensor("x", [1, 2, 4, 4])], [tensor("y", [1, 2, 8, 8])], scales)
    result, half = optimized_in_half(model, tmp_path)
    assert result.report["precision"]["validation"]["passed"]
    onnx.checker.check_model(half, full_check=True)
    kinds = {t.name: t.data_type for t in half.graph.initializer}
    assert all(kind != FLOAT16 for name, kind in kinds.items() if "scales" in name)
    for node in half.graph.node:
        if node.op_type == "Cast" and node.input[0].startswith("shape"):
            assert node.attribute[0].i == FLOAT16
    judged_again(model, half, result.report)


def test_a_constant_resized_to_sizes_read_from_the_input_is_measured(tmp_path):
    """BEiT's relative position bias: a constant table Resized to sizes computed from the
    input's shape. ONNX Runtime read such a `sizes`, fed to the measured node without a
    declared shape, as empty and refused the model ("Number of elements of input 'sizes' (0)")."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], start=2),
        helper.make_node("Concat", ["lead", "shape"], ["sizes"], axis=0),
        helper.make_node("Resize", ["table", "", "", "sizes"], ["bias"], mode="linear"),
        helper.make_node("Add", ["x", "bias"], ["y"]),
    ]
    weights = {"table": rng.normal(0, 1, (1, 4, 7, 7)).astype(np.float32), "lead": np.array([1, 4], np.int64)}
    model = make_model(nodes, [tensor("x", [1, 4, "h", "w"])], [tensor("y", [1, 4, "h", "w"])], weights)
    result, half = optimized_in_half(model, tmp_path)
    assert result.report["precision"]["validation"]["passed"]
    assert result.report["precision"]["nodes_half"] > 0
    x = rng.normal(0, 1, (1, 4, 13, 13)).astype(np.float32)
    session = ort.InferenceSession(half.SerializeToString(), providers=["CPUExecutionProvider"])
    exact = Float64Evaluator(model).run({"x": x})[0]
    bound = result.report["precision"]["validation"]["outputs"]["y"]["bound"]
    assert np.abs(session.run(None, {"x": x})[0] - exact).max() <= 2 * bound


def test_a_value_beyond_float16s_range_stands_for_an_infinity():
    """finfo(float32).min becomes half float16's largest value, not -inf: times a mask's zero
    it stays zero, and a score added to it stays finite."""
    tensor_ = numpy_helper.from_array(np.array([np.finfo(np.float32).min, 1e5, 1.0, np.inf], np.float32), "c")
    values = numpy_helper.to_array(rounded(tensor_, FLOAT16))
    assert values.tolist() == [-32752.0, 32752.0, 1.0, float("inf")]


@pytest.mark.parametrize("tail", ["measured", "any"])
def test_an_encoders_fusions_survive_float16(tmp_path, monkeypatch, tail):
    """ONNX Runtime's transformer optimizer fuses the float16 model (for the GPU, where float16
    runs) as it fuses the float32 one: Attention, SkipLayerNormalization, BiasGelu. Also where
    any float32 tail is taken, however little it gains and whatever its FLOPs: the residual
    stream's cheap path to the output (Adds, LayerNormalizations) is no tail, its Casts would
    stop the fusions (optimum's BERT with LoRA lost both Attentions so)."""
    from onnxruntime.transformers.optimizer import optimize_model

    from convexport.half import tails
    from test_transformer_pipeline import FUSED, export_encoder

    if tail == "any":
        monkeypatch.setattr(tails, "TAIL_GAIN", float("inf"))
        monkeypatch.setattr(tails, "TAIL_FLOPS_SHARE", 0.5)
        monkeypatch.setattr(tails, "TAIL_CASTS_PER_OUTPUT", 1000)
    path = export_encoder(tmp_path)
    convexport.optimize(path, output=str(tmp_path / "o32.onnx"), profile=False)
    result = convexport.optimize(path, output=str(tmp_path / "o16.onnx"), profile=False, dtype="fp16")
    assert result.report["precision"]["validation"]["passed"]
    assert result.report["precision"]["nodes_half"] > 100

    def fused(file, gpu):
        optimized = optimize_model(str(file), model_type="bert", use_gpu=gpu, opt_level=0)
        return Counter(node.op_type for node in optimized.model.graph.node if node.op_type in FUSED)

    in_float32 = fused(tmp_path / "o32.onnx", False)
    assert in_float32["Attention"] == 2 and fused(tmp_path / "o16.onnx", True) == in_float32


def test_the_terminal_and_the_report_say_what_runs_in_which_type(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(conv_net(), path)
    report = tmp_path / "r.json"
    done = invoke("optimize", path, "--dtype", "fp16", "--no-profile", "--report", report)
    assert done.exit_code == 0, done.output
    assert "float16: passed against the float64 result: error" in done.output
    written = json.loads(report.read_text())["precision"]
    assert f"{written['nodes_half']} of 6 nodes in float16, 2 Casts" in done.output
    assert written["dtype"] == "float16" and written["io_dtype"] == "float32"


@pytest.mark.parametrize("flags, fragment", [
    (["--dtype", "fp8"], "--dtype fp8: expected fp32, fp16 or bf16"),
    (["--io-dtype", "fp16"], "--io-dtype fp16 with --dtype fp32"),
])  # fmt: skip
def test_a_dtype_it_cannot_write_is_one_line(tmp_path, flags, fragment):
    path = tmp_path / "m.onnx"
    onnx.save(conv_net(), path)
    assert_user_error(invoke("optimize", path, "--no-profile", *flags), fragment)
    assert not (tmp_path / "m.opt.onnx").exists()


def test_the_api_takes_the_keywords_and_says_them_in_its_errors(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(conv_net(), path)
    with pytest.raises(convexport.ConvexportError, match="dtype='fp8': expected fp32, fp16 or bf16"):
        convexport.optimize(str(path), dtype="fp8", write=False, profile=False)


OPS = ["Relu", "Sigmoid", "Tanh", "Exp", "Softmax", "Scale", "Shift", "Conv"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=6), scale=st.sampled_from([0.1, 1.0, 30.0, 3000.0]),
       seed=st.integers(0, 10))  # fmt: skip
def test_random_chains_in_float16_meet_the_bound_they_report(tmp_path, ops, scale, seed):
    """Chains of convs and pointwise ops at scales from small to past float16's comfort: the
    model written runs, meets the bound its report gives, and on fresh inputs too."""
    rng = np.random.default_rng(seed)
    nodes, weights, current = [], {}, "x"
    for index, op in enumerate(ops):
        out = f"t{index}"
        if op == "Conv":
            weights[f"w{index}"] = rng.normal(0, 0.4, (4, 4, 3, 3)).astype(np.float32)
            nodes.append(helper.make_node("Conv", [current, f"w{index}"], [out], pads=[1, 1, 1, 1]))
        elif op in ("Scale", "Shift"):
            weights[f"c{index}"] = np.float32(scale if op == "Scale" else scale * rng.normal())
            nodes.append(helper.make_node("Mul" if op == "Scale" else "Add", [current, f"c{index}"], [out]))
        elif op == "Softmax":
            nodes.append(helper.make_node("Softmax", [current], [out], axis=1))
        else:
            nodes.append(helper.make_node(op, [current], [out]))
        current = out
    nodes.append(helper.make_node("Identity", [current], ["y"]))
    model = make_model(nodes, [tensor("x", [1, 4, 6, 6])], [tensor("y", [1, 4, 6, 6])], weights)
    exact = Float64Evaluator(model).run({"x": np.random.default_rng(100).standard_normal((1, 4, 6, 6))})[0]
    assume(np.all(np.abs(exact) < 1e4))  # beyond float32's comfort (e^e^x) is no case for float16
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    result, half = optimized_in_half(model, folder)
    assert result.report["precision"]["validation"]["passed"]
    onnx.checker.check_model(half)
    judged_again(model, half, result.report, seeds=range(1))


def test_a_float16_interface_that_alone_misses_the_bound_writes_nothing(tmp_path):
    """sin(1000 x): float16 inputs are x to within 2^-11 of itself, a phase error of up to a
    radian at |x| ~ 2; no node kept float32 undoes that, and nothing is written (exit 3); with
    a float32 interface the nodes that need it stay float32 and it passes."""
    nodes = [helper.make_node("Mul", ["x", "k"], ["p"]), helper.make_node("Sin", ["p"], ["y"])]
    model = make_model(nodes, [tensor("x", [4, 16])], [tensor("y", [4, 16])], {"k": np.float32(1000.0)})
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    report = tmp_path / "r.json"
    done = invoke("optimize", path, "--dtype", "fp16", "--io-dtype", "fp16", "--no-profile", "--report", report)
    assert_user_error(done, "the float16 model misses the bound", "with a float32 interface (--io-dtype fp32)",
                      "nothing was written", code=3)  # fmt: skip
    assert not (tmp_path / "m.opt.onnx").exists()
    assert json.loads(report.read_text())["precision"]["validation"]["passed"] is False
    result, half = optimized_in_half(model, tmp_path)
    assert result.report["precision"]["validation"]["passed"]
    assert {entry["op"] for entry in result.report["precision"]["kept_float32"]} >= {"Mul", "Sin"}


def test_an_initializer_that_is_also_an_input_keeps_its_declared_type(tmp_path):
    """MatMul(x, W) with W both a graph input and an eye(4) default: the float16 model stored
    W in float16 under its float32 input, which ONNX Runtime refuses to load (exit 1, blamed on
    the user). W stays float32, read through a Cast, and an override of it still works."""
    import onnxruntime as ort

    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"])]
    model = make_model(nodes, [tensor("x", [1, 4]), tensor("W", [4, 4])], [tensor("y", [1, 4])],
                       {"W": np.eye(4, dtype=np.float32)})  # fmt: skip
    path, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(model, path)
    done = invoke("optimize", path, "--dtype", "fp16", "--no-profile", "-o", out)
    assert done.exit_code == 0, done.output
    written = onnx.load(out)
    assert {v.name: v.type.tensor_type.elem_type for v in written.graph.input}["W"] == TensorProto.FLOAT
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    x, w = np.ones((1, 4), np.float32), 2 * np.eye(4, dtype=np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x, "W": w})[0], x @ w)


def test_an_integer_interface_is_not_called_float16(tmp_path):
    """--io-dtype fp16 on a model whose inputs and outputs are int64: nothing of the interface is
    float16, and neither the report nor the summary says it is."""
    nodes = [
        helper.make_node("Cast", ["ids"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["f", "two"], ["g"]),
        helper.make_node("Cast", ["g"], ["y"], to=TensorProto.INT64),
    ]
    model = make_model(nodes, [tensor("ids", [2, 3], TensorProto.INT64)], [tensor("y", [2, 3], TensorProto.INT64)],
                       {"two": np.float32(2.0)})  # fmt: skip
    path, report = tmp_path / "m.onnx", tmp_path / "r.json"
    onnx.save(model, path)
    done = invoke("optimize", path, "--dtype", "fp16", "--io-dtype", "fp16", "--no-profile", "--report", report,
                  "-o", tmp_path / "o.onnx")  # fmt: skip
    assert done.exit_code == 0, done.output
    assert json.loads(report.read_text())["precision"]["io_dtype"] == "float32"
    assert "inputs and outputs" not in " ".join(done.stdout.split())


@pytest.mark.parametrize("interface", ["fp32", "fp16"])
def test_validate_judges_a_float16_file_at_float16s_roundoff_and_still_finds_a_wrong_one(tmp_path, interface):
    """`convexport validate original.onnx model.fp16.onnx`: the candidate computes in float16,
    so float16's roundoff sets the bound (a float16 interface is fed float16); a weight off
    by 5% in it still fails (exit 3)."""
    original = tmp_path / "m.onnx"
    onnx.save(conv_net(), original)
    half = tmp_path / "m.fp16.onnx"
    convexport.optimize(str(original), output=str(half), profile=False, dtype="fp16", io_dtype=interface)
    done = invoke("validate", original, half)
    assert done.exit_code == 0, done.output
    assert "the candidate computes in float16: judged at its roundoff" in done.output
    tampered = onnx.load(str(half))
    weight = next(t for t in tampered.graph.initializer if t.dims[0] == 4 and len(t.dims) == 2)
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * np.float16(1.05), weight.name))
    onnx.save(tampered, tmp_path / "tampered.onnx")
    assert invoke("validate", original, tmp_path / "tampered.onnx").exit_code == 3


def test_the_original_runs_once_for_validation_and_half_precision_alike(tmp_path, monkeypatch):
    """The half-precision judge takes validation's runs of the original on the same input sets
    rather than a session and runs of its own (a 256 MiB model's session costs seconds); without
    validation it makes them itself."""
    from convexport.validate import compare, runs

    real, calls = runs.reference_runs, []

    def counted(*args, **kwargs):
        calls.append(args[-1])  # the device
        return real(*args, **kwargs)

    monkeypatch.setattr(compare, "reference_runs", counted)  # validation's
    monkeypatch.setattr(runs, "reference_runs", counted)  # the half-precision judge's own
    result, half = optimized_in_half(conv_net(), tmp_path)
    assert calls == ["cpu"] and result.report["precision"]["validation"]["passed"]
    judged_again(conv_net(), half, result.report)
    calls.clear()
    unvalidated = convexport.optimize(conv_net(), output=tmp_path / "u.onnx", dtype="fp16", profile=False, validate=False)
    assert calls == ["cpu"] and unvalidated.report["precision"]["validation"]["passed"]


def test_the_half_stage_holds_no_more_than_validation_did(tmp_path):
    """Issue 52's memory bound: the conversion may add half the weights' bytes (the float16
    model), not copies of them. Measured as the largest traced allocation (numpy's arrays, not
    ONNX Runtime's) in each step, on 64 MiB of weights, enough for the heap to be released after
    a stage (heap.LARGE_BYTES): the conversion stays within what validation took. Before, every
    weight was held in float64 through the stage, beside the float64 evaluator's own copy (373
    MiB against validation's 244)."""
    import tracemalloc

    rng = np.random.default_rng(0)
    size, nodes, weights, previous = 2048, [], {}, "x"
    for index in range(4):
        weights[f"w{index}"] = (rng.standard_normal((size, size)) / np.sqrt(size)).astype(np.float32)
        made = f"h{index}" if index < 3 else "y"
        nodes.append(helper.make_node("MatMul", [previous, f"w{index}"], [made]))
        if index < 3:
            nodes.append(helper.make_node("Relu", [made], [f"{made}r"]))
            previous = f"{made}r"
    model = make_model(nodes, [tensor("x", [8, size])], [tensor("y", [8, size])], weights)
    peaks, current = {}, [None]

    def progress(text: str) -> None:
        step = text.split()[0]
        if step != current[0]:
            if current[0] is not None:
                peaks[current[0]] = max(peaks.get(current[0], 0), tracemalloc.get_traced_memory()[1])
            tracemalloc.reset_peak()
            current[0] = step

    tracemalloc.start()
    try:
        result = convexport.optimize(model, dtype="fp16", profile=False, write=False, progress=progress)
        peaks[current[0]] = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.report["precision"]["validation"]["passed"]
    assert peaks["converting"] <= peaks["validating"], {step: f"{peak / 2**20:.0f} MiB" for step, peak in peaks.items()}


def test_a_large_models_attempts_are_on_the_outputs_disk_and_only_the_chosen_one_stays(tmp_path, monkeypatch):
    """A large model's attempts (half/on_disk.py) are written beside the output as they are made
    rather than held: here every model counts as large (ir.large's SERIALISED_MAX_BYTES at 256
    bytes, a tensor of 16 bytes goes to the file) and the model needs several attempts (the
    float32 region grown back by bisection). Each attempt's folder is removed when the attempt is
    dropped, the chosen one's once the model is written; the output names its own weights file
    and is the same model as one made in memory."""
    from convexport import ir
    from convexport.half import choose, on_disk
    from convexport.ir import large

    in_memory = tmp_path / "in_memory"
    in_memory.mkdir()
    expected, _ = optimized_in_half(_difference_of_large_terms(), in_memory)
    monkeypatch.setattr(large, "SERIALISED_MAX_BYTES", 256)
    monkeypatch.setattr(large, "EXTERNAL_TENSOR_MIN_BYTES", 16)
    folders_alive = []

    def watched(converted):
        spilled = on_disk.on_disk(converted)
        assert spilled.files is not None and ir.is_file_backed(spilled.model.graph.initializer[0])
        folders_alive.append(sum(1 for path in tmp_path.iterdir() if path.is_dir() and path.name != "in_memory"))
        return spilled

    monkeypatch.setattr(choose, "on_disk", watched)
    result, half = optimized_in_half(_difference_of_large_terms(), tmp_path)
    assert result.report["precision"]["attempts"] >= 3 and len(folders_alive) == result.report["precision"]["attempts"]
    # the validation's weights folder, and at most two attempts: the best so far and the one being judged
    assert max(folders_alive) <= 3, folders_alive
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        ["in_memory", "m.onnx", "m.fp16.onnx", Path(result.output_weights).name]
    )
    assert result.report["precision"] == expected.report["precision"]
    session = ort.InferenceSession(str(tmp_path / "m.fp16.onnx"), providers=["CPUExecutionProvider"])
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    reference = ort.InferenceSession(str(in_memory / "m.fp16.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, feeds)[0], reference.run(None, feeds)[0])


class _Branches(torch.nn.Module):
    """A 3x3 conv-BN and a 1x1 conv summed, Relu, pooled, a linear head: what every route folds."""

    def __init__(self):
        super().__init__()
        self.dense = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.point = torch.nn.Conv2d(3, 8, 1)
        self.norm = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.head(torch.relu(self.norm(self.dense(x)) + self.point(x)).mean((2, 3)))


@pytest.mark.parametrize("route", ["torchscript", "exported_program", "module_object"])
def test_every_torch_route_gives_a_float16_model_near_the_torch_models_float64_result(tmp_path, route):
    """--dtype fp16 after each torch route (a TorchScript file, a torch.export program, the
    module itself): the folds made, the weights float16, the outputs within the bound the
    report gives of the torch model's own float64 result on fresh inputs."""
    torch.manual_seed(0)
    module = _Branches().eval()
    module.norm.running_mean.uniform_(-0.5, 0.5)
    module.norm.running_var.uniform_(0.5, 2.0)
    example = torch.randn(1, 3, 16, 16)
    source = {"module_object": module}
    if route == "torchscript":
        source[route] = str(tmp_path / "m.pt")
        torch.jit.save(torch.jit.trace(module, example), source[route])
    elif route == "exported_program":
        source[route] = str(tmp_path / "m.pt2")
        torch.export.save(torch.export.export(module, (example,)), source[route])
    out = tmp_path / "m.fp16.onnx"
    result = convexport.optimize(source[route], inputs=["x:1x3x16x16"], output=out, dtype="fp16", profile=False)
    precision = result.report["precision"]
    assert precision["validation"]["passed"] and precision["casts"] == 2
    half = onnx.load(str(out))
    assert Counter(node.op_type for node in half.graph.node)["Conv"] == 1
    assert {t.data_type for t in half.graph.initializer if t.dims and t.dims[0] == 8} == {FLOAT16}
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    double = module.double()
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((1, 3, 16, 16))
        got = session.run(None, {session.get_inputs()[0].name: x.astype(np.float32)})[0]
        with torch.no_grad():
            exact = double(torch.from_numpy(x)).numpy()
        (judged,) = precision["validation"]["outputs"].values()
        assert np.abs(got - exact).max() <= 2 * judged["bound"], (seed, np.abs(got - exact).max(), judged["bound"])


def test_a_large_model_that_misses_the_bound_leaves_no_weights_behind(tmp_path, monkeypatch):
    """The sin(1000 x) model of the test above with a float16 interface, every model counted as
    large: its attempts were on disk beside the output (half/on_disk.py), and when no attempt
    meets the bound nothing is written and none of their folders is left."""
    from convexport.half import choose, on_disk
    from convexport.ir import large

    monkeypatch.setattr(large, "SERIALISED_MAX_BYTES", 1)
    monkeypatch.setattr(large, "EXTERNAL_TENSOR_MIN_BYTES", 1)
    spilled = []
    monkeypatch.setattr(choose, "on_disk", lambda converted: spilled.append(on_disk.on_disk(converted)) or spilled[-1])
    nodes = [helper.make_node("Mul", ["x", "k"], ["p"]), helper.make_node("Sin", ["p"], ["y"])]
    model = make_model(nodes, [tensor("x", [4, 16])], [tensor("y", [4, 16])], {"k": np.full(16, 1000, np.float32)})
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(convexport.ValidationError, match="the float16 model misses the bound"):
        convexport.optimize(str(tmp_path / "m.onnx"), output=str(tmp_path / "out.onnx"), dtype="fp16", io_dtype="fp16",
                            profile=False)  # fmt: skip
    assert spilled and all(attempt.files is not None for attempt in spilled)
    del spilled[:]
    assert [path.name for path in tmp_path.iterdir()] == ["m.onnx"]


def _detector_errors(path: Path, original: onnx.ModelProto, seeds=range(3)) -> tuple[float, float]:
    """The largest and the rms error of the model at `path` against the original's float64
    result, on fresh images in [0, 1] (its outputs: boxes in pixels beside scores)."""
    evaluator = Float64Evaluator(original)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    largest, squares, count = 0.0, 0.0, 0
    for seed in seeds:
        image = np.random.default_rng(200 + seed).random((1, 3, 64, 64), dtype=np.float32)
        (got,), (exact,) = session.run(None, {"x": image}), evaluator.run({"x": image})
        error = np.asarray(got, np.float64) - exact
        largest, squares, count = max(largest, float(np.abs(error).max())), squares + float((error**2).sum()), count + error.size
    return largest, (squares / count) ** 0.5


def test_a_detectors_box_distances_stay_float32_where_that_brings_its_boxes_nearer(tmp_path, monkeypatch):
    """The YOLO-like detector's DFL distances (0-15 bins, scaled by the stride to pixels)
    rounded to float16 are half its boxes' error on image-like inputs: the cheapest float32
    tail at the outputs keeps them float32, and gives back the class scores' part, which cost
    two Casts and brought nothing. The tail's Cast to float32 takes the model's own Cast to
    float64 after it (cast_chains.py), so it costs no Cast: the file has as many as the
    conversion with no tail. Checked against that conversion on fresh images."""
    import detectors
    from convexport.half import tails

    path = tmp_path / "detector.onnx"
    torch.onnx.export(detectors.tiny_yolo(), (torch.rand(1, 3, 64, 64),), str(path), input_names=["x"], dynamo=False,
                      opset_version=17)  # fmt: skip
    original = onnx.load(str(path))

    def written(name: str) -> tuple[dict, Path]:
        out = tmp_path / name
        result = convexport.optimize(str(path), inputs=["x:1x3x64x64:0..1"], output=out, dtype="fp16", profile=False)
        return result.report["precision"], out

    with_tail, tailed = written("tail.onnx")
    monkeypatch.setattr(tails, "TAIL_FLOPS_SHARE", 0.0)
    without, plain = written("plain.onnx")
    assert with_tail["validation"]["passed"] and without["kept_float32"] == []
    kept = with_tail["kept_float32"]
    assert kept and all("float32 tail" in entry["reason"] for entry in kept), kept
    assert {entry["op"] for entry in kept} <= {"Reshape", "Conv", "Softmax", "Transpose", "Concat"}, kept
    assert with_tail["casts"] == without["casts"] == 1
    casts = [Counter(node.op_type for node in onnx.load(str(path)).graph.node)["Cast"] for path in (tailed, plain)]
    assert casts[0] == casts[1], casts
    ours, theirs = _detector_errors(tailed, original), _detector_errors(plain, original)
    assert ours[0] < 0.8 * theirs[0] and ours[1] < 0.7 * theirs[1], (ours, theirs)


def _four_branches():
    """Four 1x1 convs, each of its own input, concatenated: a float32 Concat (no FLOPs) would
    keep their outputs from being rounded to float16 at the output, at a Cast on each branch."""
    rng = np.random.default_rng(3)
    # 64 channels: the Concat's element count is within TAIL_FLOPS_SHARE of the convs' FLOPs
    weights = {f"w{i}": rng.normal(0, 0.15, (64, 64, 1, 1)).astype(np.float32) for i in range(4)}
    nodes = [helper.make_node("Conv", [f"x{i}", f"w{i}"], [f"c{i}"]) for i in range(4)]
    nodes.append(helper.make_node("Concat", [f"c{i}" for i in range(4)], ["y"], axis=1))
    inputs = [tensor(f"x{i}", [1, 64, 8, 8]) for i in range(4)]
    return make_model(nodes, inputs, [tensor("y", [1, 256, 8, 8])], weights)


@pytest.mark.parametrize("casts_per_output", [None, 1000])
def test_a_float32_tail_that_costs_a_cast_per_branch_is_left_out(tmp_path, monkeypatch, casts_per_output):
    """The Concat in float32 brings the output nearer (taken where Casts are not counted), but
    costs four Casts where the output's one was: three over TAIL_CASTS_PER_OUTPUT, so the model
    stays float16 up to its output Cast."""
    from convexport.half import tails

    if casts_per_output is not None:
        monkeypatch.setattr(tails, "TAIL_CASTS_PER_OUTPUT", casts_per_output)
    result, half = optimized_in_half(_four_branches(), tmp_path)
    precision = result.report["precision"]
    casts = Counter(node.op_type for node in half.graph.node)["Cast"]
    if casts_per_output is None:
        assert precision["kept_float32"] == [] and casts == precision["casts"] == 5
    else:
        assert [entry["op"] for entry in precision["kept_float32"]] == ["Concat"] and casts == 8


def test_the_half_model_is_annotated_as_given_and_its_flops_stay_counted(tmp_path):
    """The written model's value_info is the given model's, each entry in the type the half model
    computes that tensor in (ir.as_declared: the Casts the conversion adds are not annotated,
    as the given model annotated nothing of them); the report's FLOPs are counted on the model
    as the rewrite shaped it: a Cast's output left unshaped counted the MatMul after it as
    nothing once ('after' fell below 'before')."""
    weights = {"w": np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    model = make_model(nodes, [tensor("x", [8, 64])], [tensor("y", [8, 256])], weights)
    assert [value.name for value in model.graph.value_info] == ["h"]
    result, half = optimized_in_half(model, tmp_path)
    assert [node.op_type for node in half.graph.node].count("Cast") == 2
    types = {node.output[0]: node.attribute[0].i for node in half.graph.node if node.op_type == "Cast"}
    assert [value.name for value in half.graph.value_info] == ["h"]
    (declared,) = half.graph.value_info
    computed_in = types[next(node.output[0] for node in half.graph.node if node.op_type == "Cast" and node.input[0] == "x")]
    assert computed_in == FLOAT16 and declared.type.tensor_type.elem_type == FLOAT16
    assert [d.dim_value for d in declared.type.tensor_type.shape.dim] == [8, 256]
    assert result.report["after"]["flops"] >= 2 * 8 * 64 * 256
    assert result.report["after"]["flops"] >= 0.99 * result.report["before"]["flops"]
    onnx.checker.check_model(half, full_check=True)


def test_a_node_whose_result_overflows_half_stays_float32(tmp_path):
    """A float16 MatMul must hold 4 x 3e4 = 120000, past float16's 65504: a float16 device (and
    ONNX's reference evaluator) gives an infinity, but ONNX Runtime's CPU provider computes it in
    float32 and keeps 120000, and the model was written with the MatMul in float16, "passed,
    error 0"."""
    weights = {"w": np.full((4, 4), 3e4, np.float32)}
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [tensor("x", [1, 4])], [tensor("y", [1, 4])],
                       weights)  # fmt: skip
    data = tmp_path / "ones.npz"
    np.savez(data, x=np.ones((1, 4), np.float32))
    result, half = optimized_in_half(model, tmp_path, input_data=str(data), made_up_inputs=False)
    (kept,) = result.report["precision"]["kept_float32"]
    assert kept["op"] == "MatMul" and "beyond the half type's range" in kept["reason"]
    assert not any(node.op_type == "MatMul" and node.input[0].endswith("f16") for node in half.graph.node)
    got = run(half, {"x": np.ones((1, 4), np.float32)})[0]
    assert np.array_equal(got, np.full((1, 4), 120000, np.float32))


def test_a_miss_at_special_values_is_said_as_one():
    """Where the exact result is infinite and the half model gives NaN there (an inf weight tap
    read against padding), the output misses its bound at those elements only: the message said
    "output 'y' is 1.73e-06 off (bound 0.117, 45 of 1536 elements beyond)", contradicting itself."""
    from convexport.validate.exact_check import judge
    from convexport.half.outputs import OutputJudgement

    exact = np.array([np.inf, 1.0, 2.0, np.nan])
    verdict = judge(exact.copy(), np.array([np.nan, 1.0, 2.0, np.nan]), exact, None, "float16")
    assert verdict.beyond == verdict.special == 1 and verdict.error == 0.0
    judged = OutputJudgement()
    judged.add(1.73e-06, 1e-7, 0.117, 45, 1536, special=45)
    said = judged.missed("y")
    assert said.startswith("output 'y' differs from the exact result's NaN or infinity at 45 of 1536 elements")
    judged.add(0.5, 1e-7, 0.117, 3, 1536)
    assert judged.missed("y") == "output 'y' is 0.5 off (bound 0.117, 48 of 3072 elements beyond)"
