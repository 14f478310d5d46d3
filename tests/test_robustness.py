"""Graphs a deployment pipeline may feed in: subgraphs (If, Loop, Scan), initializers shared by
several nodes, bfloat16 weights."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import convexport
from convexport.errors import ConvexportError
from convexport.rewrite.engine import RewriteSettings, rewrite_model
from convexport.folds import builtin_primitives
from convexport.rewrite.rulefile import parse_rule_file
from convexport.validate.results import Tolerances
from convexport.validate.judges import compare_arrays
from graphs import RULES
from helpers import make_model, run, tensor

PRIMITIVES = builtin_primitives()
rng = np.random.default_rng(0)


def weights(*shape):
    return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


def convs(*nodes):
    return [node for node in nodes if node.op_type == "Conv"]


def body_convs(model, op):
    node = next(n for n in model.graph.node if n.op_type == op)
    return {attr.name: convs(*attr.g.node) for attr in node.attribute if attr.type == onnx.AttributeProto.GRAPH}


def if_model():
    """h = Conv(x); y = Conv(h); z = If(c, then: Conv(h) with pads, else: Conv(Conv(h)))."""
    then_branch = helper.make_graph([helper.make_node("Conv", ["h", "w3"], ["t"], pads=[1, 1, 1, 1])], "then", [],
                                    [tensor("t", [1, 4, 8, 8])])
    else_branch = helper.make_graph([helper.make_node("Conv", ["h", "w2"], ["e1"]),
                                     helper.make_node("Conv", ["e1", "w2"], ["e"])], "else", [], [tensor("e", [1, 4, 8, 8])])
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h"], pads=[1, 1, 1, 1]), helper.make_node("Conv", ["h", "w2"], ["y"]),
             helper.make_node("If", ["c"], ["z"], then_branch=then_branch, else_branch=else_branch)]
    return make_model(nodes, [tensor("x", [1, 3, 8, 8]), tensor("c", [], TensorProto.BOOL)],
                      [tensor("y", [1, 4, 8, 8]), tensor("z", [1, 4, 8, 8])],
                      {"w1": weights(4, 3, 3, 3), "w2": weights(4, 4, 1, 1), "w3": weights(4, 4, 3, 3)})


def test_if_branches_are_rewritten_inside_and_outer_reads_count():
    model = if_model()
    before = model.SerializeToString()
    result = convexport.optimize(model, profile=False)
    optimized = result.model
    onnx.checker.check_model(optimized, full_check=True)
    assert model.SerializeToString() == before
    # the outer h is also read inside both branches: the outer Conv pair stays two Convs
    assert len(convs(*optimized.graph.node)) == 2
    skipped = result.report["skipped"]
    assert any(entry["rule"] == "conv-conv" and "also read by 2 other node(s)" in entry["reason"] for entry in skipped)
    # the else branch's own chain is folded there, nothing moved out of it
    assert {name: len(found) for name, found in body_convs(optimized, "If").items()} == {"then_branch": 1, "else_branch": 1}
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    for condition in (True, False):
        feeds = {"x": x, "c": np.array(condition)}
        for expected, actual in zip(run(model, feeds), run(optimized, feeds)):
            np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def test_a_subgraph_attribute_prints_nothing_on_export(capfd):
    """gs.Graph answers an unknown attribute by logging an error ("Function: '_values' was not
    registered"): the exporter's look at each attribute's tensor must not ask a subgraph."""
    convexport.optimize(if_model(), profile=False)
    captured = capfd.readouterr()
    assert "not registered" not in captured.out + captured.err


def test_a_large_weight_both_branches_read_is_written_once_in_the_main_graph(tmp_path):
    """An optimum merged decoder's weights live in the main graph and only its If's branches
    read them. gs's exporter writes such a weight into each branch that reads it: twice the
    file, and a weight large enough to be written after export (convert.HELD_BACK_BYTES) was
    written into the first branch's copy only, the other left empty (an invalid model; T5 at
    d_model 512 was refused). A fold in one branch makes the export happen."""
    shared = weights(256, 256, 3, 3)  # 2.4 MB
    scale = np.full((256, 1, 1), 0.5, np.float32)
    then_branch = helper.make_graph([helper.make_node("Conv", ["x", "v"], ["t0"], pads=[1, 1, 1, 1]),
                                     helper.make_node("Relu", ["t0"], ["t1"]), helper.make_node("Conv", ["t1", "u"], ["t2"]),
                                     helper.make_node("Mul", ["t2", "s"], ["t"])],
                                    "then", [], [tensor("t", [1, 256, 4, 4])])
    else_branch = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]),
                                     helper.make_node("Conv", ["r", "v"], ["e"], pads=[1, 1, 1, 1])],
                                    "else", [], [tensor("e", [1, 256, 4, 4])])
    model = make_model([helper.make_node("If", ["c"], ["z"], then_branch=then_branch, else_branch=else_branch)],
                       [tensor("x", [1, 256, 4, 4]), tensor("c", [], TensorProto.BOOL)], [tensor("z", [1, 256, 4, 4])],
                       {"v": shared, "u": weights(256, 256, 1, 1), "s": scale})
    path = tmp_path / "merged.onnx"
    onnx.save(model, path)
    convexport.optimize(str(path), output=str(tmp_path / "out.onnx"), profile=False)
    optimized = onnx.load(tmp_path / "out.onnx")
    onnx.checker.check_model(optimized, full_check=True)
    assert "v" in {init.name for init in optimized.graph.initializer}
    branch_weights = [init.name for attr in optimized.graph.node[0].attribute for init in attr.g.initializer]
    assert "v" not in branch_weights and len(branch_weights) == 1  # the then branch's folded 1x1 kernel
    x = rng.standard_normal((1, 256, 4, 4)).astype(np.float32)
    for condition in (True, False):
        feeds = {"x": x, "c": np.array(condition)}
        np.testing.assert_allclose(run(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-4, atol=1e-4)


def loop_model():
    """A Loop whose body runs s <- Conv(Conv(s)) twice over a carried state, weights from outside."""
    body = helper.make_graph(
        [helper.make_node("Conv", ["s_in", "wa"], ["a"], pads=[1, 1, 1, 1]), helper.make_node("Conv", ["a", "wb"], ["s_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [tensor("i", [], TensorProto.INT64), tensor("cond_in", [], TensorProto.BOOL), tensor("s_in", [1, 4, 6, 6])],
        [tensor("cond_out", [], TensorProto.BOOL), tensor("s_out", [1, 4, 6, 6])])
    nodes = [helper.make_node("Loop", ["trips", "", "x"], ["y"], body=body)]
    return make_model(nodes, [tensor("x", [1, 4, 6, 6])], [tensor("y", [1, 4, 6, 6])],
                      {"trips": np.array(2, np.int64), "wa": weights(4, 4, 3, 3), "wb": weights(4, 4, 1, 1)})


def scan_model():
    """A Scan over the first axis of [T, 1, 4, 6, 6]: each step Conv(Conv(x_t))."""
    body = helper.make_graph(
        [helper.make_node("Conv", ["x_t", "wa"], ["a"], pads=[1, 1, 1, 1]), helper.make_node("Conv", ["a", "wb"], ["y_t"])],
        "body", [tensor("x_t", [1, 4, 6, 6])], [tensor("y_t", [1, 4, 6, 6])])
    nodes = [helper.make_node("Scan", ["x"], ["y"], body=body, num_scan_inputs=1)]
    return make_model(nodes, [tensor("x", [3, 1, 4, 6, 6])], [tensor("y", [3, 1, 4, 6, 6])],
                      {"wa": weights(4, 4, 3, 3), "wb": weights(4, 4, 1, 1)})


@pytest.mark.parametrize("build, op, shape", [(loop_model, "Loop", (1, 4, 6, 6)), (scan_model, "Scan", (3, 1, 4, 6, 6))])
def test_loop_and_scan_bodies_are_rewritten_inside(build, op, shape):
    model = build()
    outcome = rewrite_model(model, RULES, PRIMITIVES, RewriteSettings("all"))
    onnx.checker.check_model(outcome.model, full_check=True)
    assert [entry["rule"] for entry in outcome.applied] == ["conv-conv"]
    assert len(body_convs(outcome.model, op)["body"]) == 1
    x = rng.standard_normal(shape).astype(np.float32)
    np.testing.assert_allclose(run(outcome.model, {"x": x})[0], run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_a_custom_op_with_a_graph_attribute_has_its_subgraph_walked():
    from convexport.ir import proto_scopes

    body = helper.make_graph([helper.make_node("Relu", ["a"], ["b"])], "body", [tensor("a", [1])], [tensor("b", [1])])
    graph = helper.make_graph([helper.make_node("Loopish", ["x"], ["y"], domain="my.domain", body=body)], "g",
                              [tensor("x", [1])], [tensor("y", [1])])
    assert [scope.name for scope in proto_scopes(graph)] == ["g", "body"]


def test_a_shared_initializer_keeps_its_value_for_its_other_readers():
    """Two Convs read one weight; folding a Mul into the first must not touch the second."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["h"], pads=[1, 1, 1, 1]), helper.make_node("Mul", ["h", "k"], ["y1"]),
             helper.make_node("Conv", ["x", "w"], ["y2"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["y2"], ["r"])]
    w = weights(4, 3, 3, 3)
    model = make_model(nodes, [tensor("x", [1, 3, 5, 5])], [tensor("y1", [1, 4, 5, 5]), tensor("r", [1, 4, 5, 5])],
                       {"w": w, "k": np.arange(1, 5, dtype=np.float32).reshape(4, 1, 1)})
    before = model.SerializeToString()
    outcome = rewrite_model(model, RULES, PRIMITIVES, RewriteSettings("all"))
    assert "conv-mul" in [entry["rule"] for entry in outcome.applied]
    assert model.SerializeToString() == before
    kept = {init.name: numpy_helper.to_array(init) for init in outcome.model.graph.initializer}
    if "w" in kept:
        np.testing.assert_array_equal(kept["w"], w)
    x = rng.standard_normal((1, 3, 5, 5)).astype(np.float32)
    for expected, actual in zip(run(model, {"x": x}), run(outcome.model, {"x": x})):
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def test_a_primitive_cannot_edit_a_constant_in_place(tmp_path):
    (tmp_path / "editor.py").write_text(
        "from convexport.ir import constant_value\n\n"
        "def double_in_place(match, context):\n"
        "    constant_value(match.values['k'])[...] *= 2\n")
    path = tmp_path / "rules.yaml"
    path.write_text("rules:\n  - name: edit-k\n    doc: d\n    match:\n      - y = Mul(x, k:const)\n"
                    "    apply: editor.py:double_in_place\n")
    rules = parse_rule_file(path, set(PRIMITIVES))
    model = make_model([helper.make_node("Mul", ["x", "k"], ["y"])], [tensor("x", [2])], [tensor("y", [2])],
                       {"k": np.ones(2, np.float32)})
    with pytest.raises(ConvexportError, match="rule 'edit-k'.*read-only"):
        rewrite_model(model, rules, PRIMITIVES, RewriteSettings("all"))


def test_bfloat16_heads_fold_in_float64_and_stay_bfloat16():
    """Gathered Gemm heads in bfloat16 (ONNX Runtime's CPU provider has no bfloat16 Gemm, so
    the ONNX reference evaluator checks the numbers, at the bfloat16 tolerance)."""
    heads, features, outputs = 3, 8, 5
    nodes, inits = [], {}
    for head in range(heads):
        inits[f"i{head}"] = np.array(head, np.int64)
        inits[f"w{head}"] = weights(features, outputs).astype(ml_dtypes.bfloat16)
        inits[f"b{head}"] = weights(outputs).astype(ml_dtypes.bfloat16)
        nodes += [helper.make_node("Gather", ["x", f"i{head}"], [f"g{head}"], axis=1),
                  helper.make_node("Gemm", [f"g{head}", f"w{head}", f"b{head}"], [f"y{head}"])]
    nodes.append(helper.make_node("Concat", [f"y{h}" for h in range(heads)], ["y"], axis=1))
    model = make_model(nodes, [tensor("x", [2, heads, features], TensorProto.BFLOAT16)],
                       [tensor("y", [2, heads * outputs], TensorProto.BFLOAT16)], inits)
    outcome = rewrite_model(model, RULES, PRIMITIVES, RewriteSettings("all"))
    assert "gathered-linear-branches" in [entry["rule"] for entry in outcome.applied]
    onnx.checker.check_model(outcome.model, full_check=True)
    float_inits = [init for init in outcome.model.graph.initializer if init.data_type != TensorProto.INT64]
    assert float_inits and all(init.data_type == TensorProto.BFLOAT16 for init in float_inits)
    x = rng.standard_normal((2, heads, features)).astype(ml_dtypes.bfloat16)
    (expected,) = ReferenceEvaluator(model).run(None, {"x": x})
    (actual,) = ReferenceEvaluator(outcome.model).run(None, {"x": x})
    assert actual.dtype == ml_dtypes.bfloat16
    error = compare_arrays(expected, actual, *Tolerances().for_output("y", "bfloat16"))
    assert error.mismatches == 0, error


def test_a_bfloat16_model_is_validated_without_cpu_kernels(tmp_path):
    """ONNX Runtime's CPU provider cannot run bfloat16 Gemm: validation falls back to the ONNX
    reference evaluator, profiling is skipped with the reason, the run succeeds."""
    from typer.testing import CliRunner

    from convexport.cli import app

    heads, features = 2, 4
    nodes, inits = [], {}
    for head in range(heads):
        inits[f"i{head}"] = np.array(head, np.int64)
        inits[f"w{head}"] = weights(features, 3).astype(ml_dtypes.bfloat16)
        nodes += [helper.make_node("Gather", ["x", f"i{head}"], [f"g{head}"], axis=1),
                  helper.make_node("Gemm", [f"g{head}", f"w{head}"], [f"y{head}"])]
    nodes.append(helper.make_node("Concat", ["y0", "y1"], ["y"], axis=1))
    path = tmp_path / "bf16.onnx"
    onnx.save(make_model(nodes, [tensor("x", [2, heads, features], TensorProto.BFLOAT16)],
                         [tensor("y", [2, 6], TensorProto.BFLOAT16)], inits), path)
    report = tmp_path / "r.json"
    result = CliRunner().invoke(app, ["optimize", str(path), "--report", str(report)])
    assert result.exit_code == 0, result.output
    assert "profile: skipped: ONNX Runtime's CPUExecutionProvider has no kernel" in result.stdout
    import json
    written = json.loads(report.read_text())
    validation = written["validation"]
    assert validation["passed"] and validation["reference"] == "float64"  # judged in bfloat16's own roundoff
    assert validation["outputs"]["y"]["exact_error"] <= validation["outputs"]["y"]["exact_bound"]
    assert written["profile"] is None and "Gemm" in written["profile_skipped"]


def test_an_initializer_listed_as_an_input_is_an_input_not_a_constant():
    """From IR 4 on, an initializer that is also a graph input is a default the caller may
    override (ONNX Runtime does not fold it either): the conv it feeds is not folded, and the
    output keeps it as an input with its initializer; the other weights still fold."""
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h"], pads=[1, 1, 1, 1]), helper.make_node("Conv", ["h", "w2"], ["y"]),
             helper.make_node("Conv", ["y", "w3"], ["z"])]
    model = make_model(nodes, [tensor("x", [1, 3, 8, 8]), tensor("w1", [4, 3, 3, 3])], [tensor("z", [1, 2, 8, 8])],
                       {"w1": weights(4, 3, 3, 3), "w2": weights(4, 4, 1, 1), "w3": weights(2, 4, 1, 1)})
    result = convexport.optimize(model, write=False, profile=False)
    (refused,) = [entry for entry in result.report["skipped"] if "w1" in entry["reason"]]
    assert "is computed at run time, not a constant: a graph input" in refused["reason"]
    assert [entry["nodes"] for entry in result.report["rewrites"]] == [["Conv_1", "Conv_2"]]    # w2 and w3 fold
    assert [value.name for value in result.model.graph.input] == ["x", "w1"]
    assert "w1" in {init.name for init in result.model.graph.initializer}
    feeds = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32), "w1": weights(4, 3, 3, 3)}
    np.testing.assert_allclose(run(result.model, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run(result.model, {"x": feeds["x"]})[0], run(model, {"x": feeds["x"]})[0],
                               rtol=1e-5, atol=1e-5)
    assert "--freeze-input-defaults" in refused["reason"]

    frozen = convexport.optimize(model, write=False, profile=False, freeze_input_defaults=True)
    assert [value.name for value in frozen.model.graph.input] == ["x"] and not frozen.report["skipped"]
    assert len(convs(*frozen.model.graph.node)) == 1
    np.testing.assert_allclose(run(frozen.model, {"x": feeds["x"]})[0], run(model, {"x": feeds["x"]})[0],
                               rtol=1e-4, atol=1e-5)

    batched = convexport.optimize(model, write=False, profile=False, dynamic_batch=True).model
    dims = {value.name: [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
            for value in batched.graph.input}
    assert dims == {"x": ["batch", 3, 8, 8], "w1": [4, 3, 3, 3]}        # a weight has no batch


def test_an_in_memory_model_is_only_read():
    """A fully shaped ModelProto given as it is goes through without a copy (export_model): the
    rewrite (nameless nodes, Identity-read BN parameters), validation and profiling leave it
    byte for byte as it was."""
    from test_identity_and_batchnorm import conv_bn_through_identities

    model = conv_bn_through_identities(named=False)
    before = model.SerializeToString()
    result = convexport.optimize(model, write=False)
    assert result.original is model and result.report["validation"]["passed"]
    assert [entry["rule"] for entry in result.report["rewrites"]][-1] == "conv-batchnorm"
    assert model.SerializeToString() == before


def test_a_chain_whose_output_is_empty_is_left_alone():
    """A window longer than its input (AveragePool of 2 over a length of 1) is valid ONNX with
    an empty output: nothing to fold, and no error (found by `rules test`, once the engine
    stopped taking the algebra's ValueError for a refusal)."""
    import onnx.parser

    model = onnx.parser.parse_model("""
        <ir_version: 10, opset_import: ["" : 18]>
        empty (float[1, 2, 1] x) => (float[1, 3, 0] y) {
            h = AveragePool <kernel_shape = [2], strides = [2]> (x)
            y = Conv <kernel_shape = [1]> (h, w)
        }""")
    model.graph.initializer.append(numpy_helper.from_array(np.ones((3, 2, 1), np.float32), "w"))
    outcome = rewrite_model(model, RULES, builtin_primitives(), RewriteSettings("all"))
    assert [node.op_type for node in outcome.model.graph.node] == ["AveragePool", "Conv"]
