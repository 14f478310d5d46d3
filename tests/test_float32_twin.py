"""A model of float16 weights (a float16 checkpoint's export, a converter's float16 file):
folded as its float32 twin and written in float16 again, its interface kept (convexport/
load/float32_twin.py); judged against the exact result of the model as given, at float16's roundoff."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import convexport
from convexport import ir
from convexport.load.float32_twin import EDGE_TAG, edges_dropped, float32_twin, twin_types, weights_half_type
from convexport.ir import carry_dim_names
from convexport.validate.float64 import Float64Evaluator
from convexport.validate.rounded_run import rounded_runs
from convexport.ir.slots import element_types
from convexport.stages import load as load_stage
from helpers import assert_user_error, invoke, make_model, op_counts, run, tensor

SHAPE = [1, 8, 12, 12]


def repvgg_block(seed: int = 0, interface: int = TensorProto.FLOAT16, gamma: float | None = None) -> onnx.ModelProto:
    """relu(conv3x3(x) + conv1x1(x) + x * s) in float16 weights, its interface `interface`
    (float32: Casts into float16 and back at the edges, as a converter keeping the interface
    writes); with `gamma`, a residual x + gamma * that before the relu."""
    rng = np.random.default_rng(seed)
    weights = {
        "w3": rng.normal(0, 0.15, (8, 8, 3, 3)), "w1": rng.normal(0, 0.3, (8, 8, 1, 1)),
        "s": rng.uniform(0.5, 1.5, (1, 8, 1, 1)),
    }  # fmt: skip
    source = "x" if interface == TensorProto.FLOAT16 else "x16"
    nodes = [
        helper.make_node("Conv", [source, "w3"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", [source, "w1"], ["b"]),
        helper.make_node("Mul", [source, "s"], ["c"]),
        helper.make_node("Add", ["a", "b"], ["ab"]),
        helper.make_node("Add", ["ab", "c"], ["sum"]),
    ]
    if gamma is not None:
        weights["g"] = np.full((1, 8, 1, 1), gamma)
        nodes += [helper.make_node("Mul", ["sum", "g"], ["scaled"]), helper.make_node("Add", [source, "scaled"], ["r"])]
    last = "r" if gamma is not None else "sum"
    if interface == TensorProto.FLOAT16:
        nodes.append(helper.make_node("Relu", [last], ["y"]))
    else:
        nodes = [helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16), *nodes]
        nodes += [helper.make_node("Relu", [last], ["y16"]), helper.make_node("Cast", ["y16"], ["y"], to=interface)]
    half_weights = {name: value.astype(np.float16) for name, value in weights.items()}
    return make_model(nodes, [tensor("x", SHAPE, interface)], [tensor("y", SHAPE, interface)], half_weights)


def optimized(model: onnx.ModelProto, tmp_path, **options):
    path, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(model, path)
    result = convexport.optimize(str(path), output=str(out), profile=False, **options)
    return result.report, onnx.load(str(out))


def feeds(kind=np.float16, seed: int = 100) -> dict:
    return {"x": np.random.default_rng(seed).standard_normal(SHAPE).astype(kind)}


def device_like_error(model: onnx.ModelProto, exact: np.ndarray, sets: list[dict]) -> float:
    """The rms error over the exact result's rms of `model` with every value rounded to float16
    (as a device computing in float16 rounds them: validate/rounded_run.py), over `sets`."""
    runs = rounded_runs(model, element_types(model), TensorProto.FLOAT16, sets)
    squares = [np.mean((np.asarray(run["y"], np.float64) - want) ** 2) for run, want in zip(runs, exact)]
    return float(np.sqrt(np.mean(squares)) / np.sqrt(np.mean(np.square(exact))))


def test_a_float16_model_is_folded_and_written_in_float16(tmp_path):
    model = repvgg_block()
    report, written = optimized(model, tmp_path)
    assert report["validation"]["passed"] and report["precision"]["validation"]["passed"]
    assert report["precision"]["dtype"] == "float16" and report["precision"]["io_dtype"] == "float16"
    assert any("float16 weights read in float32" in text for text in report["conversions"])
    assert op_counts(written) == {"Conv": 1, "Relu": 1}  # three branches in one kernel, no Cast left at the edges
    assert {tensor.data_type for tensor in written.graph.initializer} == {TensorProto.FLOAT16}
    assert [value.type.tensor_type.elem_type for value in (*written.graph.input, *written.graph.output)] == [10, 10]
    assert report["precision"]["nodes_half"] == 2
    # on a device that rounds every value to float16, the fold is as near the exact result
    sets = [feeds(seed=seed) for seed in range(3)]
    exact = [Float64Evaluator(model).run(fed)[0] for fed in sets]
    assert device_like_error(written, exact, sets) <= 1.1 * device_like_error(model, exact, sets)


def test_a_float16_model_with_a_float32_interface_keeps_it(tmp_path):
    report, written = optimized(repvgg_block(interface=TensorProto.FLOAT), tmp_path)
    assert report["precision"]["io_dtype"] == "float32"
    assert [value.type.tensor_type.elem_type for value in (*written.graph.input, *written.graph.output)] == [1, 1]
    assert op_counts(written) == {"Cast": 2, "Conv": 1, "Relu": 1}


def test_dtype_fp32_writes_a_float16_model_in_float32(tmp_path):
    model = repvgg_block()
    report, written = optimized(model, tmp_path, dtype="fp32")
    assert "precision" not in report
    assert {tensor.data_type for tensor in written.graph.initializer} == {TensorProto.FLOAT}
    assert op_counts(written) == {"Cast": 2, "Conv": 1, "Relu": 1}  # the interface float16, at its edges
    fed = feeds()
    exact = Float64Evaluator(model).run(fed)[0]
    # the float32 model computes the float16 model's function to float32's precision
    np.testing.assert_allclose(run(written, fed)[0].astype(np.float64), exact, atol=2e-3)


def test_an_interface_the_model_does_not_have_is_one_line(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(repvgg_block(), path)
    assert_user_error(invoke("optimize", path, "--io-dtype", "fp32", "--no-profile"), "--io-dtype fp32",
                      "inputs and outputs are float16")  # fmt: skip


def test_dtype_bf16_alone_on_a_float16_interface_names_what_was_given(tmp_path):
    """--dtype bf16 on a model of float16 inputs and outputs: no --io-dtype was given, so the
    message is not "--io-dtype fp16 with --dtype bf16"."""
    path = tmp_path / "m.onnx"
    onnx.save(repvgg_block(), path)
    result = invoke("optimize", path, "--dtype", "bf16", "--no-profile", "-o", tmp_path / "o.onnx")
    assert_user_error(result, "--dtype bf16: the model's inputs and outputs are float16", "--io-dtype fp32")
    assert "--io-dtype fp16" not in result.stderr


def test_x_itself_is_not_folded_into_float16_taps_beside_it(tmp_path):
    """x + gamma * (branches of x): folded, x lands in the centre taps, 1 + O(gamma), which
    float16 rounds to a 2048th of themselves; left unfolded, the branches still fold."""
    report, written = optimized(repvgg_block(gamma=1e-3), tmp_path)
    refused = [entry for entry in report["skipped"] if "x itself" in entry["reason"]]
    assert refused and refused[0]["decision"]["method"] == "half-precision rounding"
    assert op_counts(written) == {"Conv": 1, "Add": 1, "Relu": 1}


def test_a_float16_model_that_is_not_twinned_is_folded_in_float16_and_judged_at_its_roundoff(tmp_path, monkeypatch):
    """Where the model cannot be read in float32 (subgraphs, weights in external files), the
    rewrite rounds each fold into float16, and validation judges the rewrite at float16's
    roundoff (a float32 bound would refuse every fold of float16 weights)."""
    monkeypatch.setattr(load_stage, "why_not_twinned", lambda model: "a reason of the test's")
    report, written = optimized(repvgg_block(interface=TensorProto.FLOAT), tmp_path)
    assert report["validation"]["passed"] and report["validation"]["precision"] == "float16"
    assert any("a reason of the test's" in text for text in report["conversions"])
    assert op_counts(written) == {"Cast": 2, "Conv": 1, "Relu": 1}
    assert "precision" not in report  # nothing converted after the rewrite
    with pytest.raises(convexport.ConvexportError, match="the model's weights are float16 and are not read in float32"):
        optimized(repvgg_block(), tmp_path, dtype="fp32")


def test_a_float16_models_rounded_run_is_its_twins():
    """The run with every value rounded to float16 reads a float16 model in float32 first: the
    same numbers as its float32 twin's, where ONNX Runtime would have kept the values unrounded."""
    model, sets = repvgg_block(), [feeds(seed=seed) for seed in range(2)]
    twin = float32_twin(model)
    ours = rounded_runs(model, element_types(model), TensorProto.FLOAT16, sets)
    twins = rounded_runs(twin, element_types(twin), TensorProto.FLOAT16, sets)
    for mine, its in zip(ours, twins):
        np.testing.assert_array_equal(np.asarray(mine["y"], np.float32), np.asarray(its["y"], np.float32))
    unrounded = [run(model, fed)[0] for fed in sets]
    assert any(not np.array_equal(mine["y"], plain) for mine, plain in zip(ours, unrounded))


@pytest.mark.parametrize("inside", [TensorProto.FLOAT16, TensorProto.FLOAT])
def test_an_edge_is_dropped_only_where_it_casts_nothing(inside):
    """The twin's edge Casts go where the node beside them computes in float16 (their `to` the
    type they read), and stay where it computes in float32."""
    nodes = [
        helper.make_node("Cast", ["x"], [f"x{EDGE_TAG}"], to=inside),
        helper.make_node("Relu", [f"x{EDGE_TAG}"], [f"y{EDGE_TAG}"]),
        helper.make_node("Cast", [f"y{EDGE_TAG}"], ["y"], to=TensorProto.FLOAT16),
    ]
    model = make_model(nodes, [tensor("x", SHAPE, TensorProto.FLOAT16)], [tensor("y", SHAPE, TensorProto.FLOAT16)])
    fed = feeds()
    before = run(model, fed)[0]
    assert edges_dropped(model) == (2 if inside == TensorProto.FLOAT16 else 0)
    onnx.checker.check_model(model, full_check=True)
    assert op_counts(model) == ({"Relu": 1} if inside == TensorProto.FLOAT16 else {"Cast": 2, "Relu": 1})
    np.testing.assert_array_equal(run(model, fed)[0], before)


def test_validate_judges_a_float16_models_fold_at_float16s_roundoff(tmp_path):
    """`convexport validate` of the optimized model against the float16 model as given, whose
    outputs are float32: judged at float16's roundoff, as optimize judged it."""
    original, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(repvgg_block(interface=TensorProto.FLOAT), original)
    convexport.optimize(str(original), output=str(out), profile=False)
    result = invoke("validate", original, out)
    assert result.exit_code == 0, result.output
    assert "the candidate computes in float16: judged at its roundoff" in result.stdout


def test_a_float32_model_with_a_float16_constant_is_a_float32_model(tmp_path):
    """What the weights are in is what most of their elements are in: a float16 constant Cast
    into a float32 model does not make it a float16 model (nor loosen its validation)."""
    rng = np.random.default_rng(3)
    weights = {"w": rng.normal(0, 0.2, (8, 8, 3, 3)).astype(np.float32), "s16": np.full((1, 8, 1, 1), 0.5, np.float16)}
    nodes = [
        helper.make_node("Cast", ["s16"], ["s"], to=TensorProto.FLOAT),
        helper.make_node("Conv", ["x", "w"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["a", "s"], ["y"]),
    ]
    model = make_model(nodes, [tensor("x", SHAPE)], [tensor("y", SHAPE)], weights)
    assert weights_half_type(model) is None and weights_half_type(repvgg_block()) == "float16"
    report, written = optimized(model, tmp_path)
    assert "precision" not in report and "precision" not in report["validation"]
    assert not any("float16 weights" in text for text in report["conversions"])
    assert {tensor.data_type for tensor in written.graph.initializer} == {TensorProto.FLOAT}


def test_the_dims_the_original_declares_reach_its_twin_in_float32(tmp_path, monkeypatch):
    """The rewritten twin takes the dims the model as given declared where it lost them, but
    not their float16 types: a tensor inference cannot follow (ONNX Runtime's transformer
    optimizer's float16 BERT: the output of its last SkipLayerNormalization, a com.microsoft op)
    was declared float16 in the float32 twin, which ONNX Runtime then would not load."""
    declared = []

    def spied(model, original, same_outputs=False):
        declared.extend((value.name, value.type.tensor_type.elem_type) for value in original.graph.value_info)
        return carry_dim_names(model, original, same_outputs)

    monkeypatch.setattr(ir, "carry_dim_names", spied)
    model = repvgg_block()
    assert any(value.type.tensor_type.elem_type == TensorProto.FLOAT16 for value in model.graph.value_info)
    report, _ = optimized(model, tmp_path)
    assert report["precision"]["validation"]["passed"]
    assert declared and all(kind == TensorProto.FLOAT for _, kind in declared), declared
    original = twin_types(model)
    assert [value.type for value in original.graph.output] == [value.type for value in model.graph.output]


def test_the_twins_edges_take_names_nothing_has():
    """A converter's own Cast may be named as an edge would be (onnxconverter-common names its
    output Casts "y_cast"), and a model convexport wrote may hold a twin's names already (an
    edge kept where a float32 node is beside it): the twin of each loads and computes the same."""
    model = repvgg_block()
    model.graph.node[-1].name = f"y{EDGE_TAG}_cast"
    fed = feeds()
    for twin in (float32_twin(model), float32_twin(float32_twin(model))):
        onnx.checker.check_model(twin, full_check=True)
        np.testing.assert_array_equal(run(twin, fed)[0], run(float32_twin(model), fed)[0])


def test_weights_held_by_constant_nodes_are_weights_too(tmp_path):
    """An old exporter's weights are Constant nodes (Paddle2ONNX's PP-OCR models): a float16
    model of them is a float16 model, twinned and folded as one."""
    model = repvgg_block(interface=TensorProto.FLOAT)
    constants = [helper.make_node("Constant", [], [weight.name], value=weight) for weight in model.graph.initializer]
    nodes = [*constants, *model.graph.node]
    del model.graph.node[:], model.graph.initializer[:]
    model.graph.node.extend(nodes)
    assert weights_half_type(model) == "float16"
    report, written = optimized(model, tmp_path)
    assert any("float16 weights read in float32" in text for text in report["conversions"])
    assert op_counts(written) == {"Cast": 2, "Conv": 1, "Relu": 1}
