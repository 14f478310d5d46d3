"""Equal initializers written once (issue 39, item 5): copies of a weight go, their readers read
the first; what a caller may override, or what only looks the same, stays."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

import convexport
from convexport.ir import deduplicate_initializers
from helpers import IR_VERSION, run

WEIGHT = np.random.default_rng(0).standard_normal([4, 4, 3, 3]).astype(np.float32)


def two_convs(second=WEIGHT, overridable=False, extra_outputs=()):
    """x -> Conv(w1) -> Relu -> Conv(w2), w2 a copy of w1 unless given."""
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1])]
    inputs = [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 6, 6])]
    if overridable:
        inputs.append(helper.make_tensor_value_info("w2", onnx.TensorProto.FLOAT, list(second.shape)))
    outputs = [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 6, 6])]
    outputs += [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, list(WEIGHT.shape)) for name in extra_outputs]
    graph = helper.make_graph(nodes, "g", inputs, outputs,
                              [numpy_helper.from_array(WEIGHT, "w1"), numpy_helper.from_array(second, "w2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION)


def test_a_copy_of_a_weight_is_written_once_and_the_report_says_so(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(two_convs(), path)
    result = convexport.optimize(str(path), output=str(tmp_path / "o.onnx"), profile=False)
    written = onnx.load(tmp_path / "o.onnx")
    assert [init.name for init in written.graph.initializer] == ["w1"]
    assert result.report["deduplicated_initializers"] == {"merged": 1, "bytes_saved": WEIGHT.nbytes}
    assert result.report["after"]["model_bytes"] < result.report["before"]["model_bytes"] - WEIGHT.nbytes + 200
    feeds = {"x": np.random.default_rng(1).standard_normal([1, 4, 6, 6]).astype(np.float32)}
    np.testing.assert_array_equal(run(written, feeds)[0], run(two_convs(), feeds)[0])


def test_what_a_caller_may_override_or_only_looks_the_same_stays():
    assert deduplicate_initializers(two_convs(overridable=True)).merged == 0  # w2 is also a graph input
    assert deduplicate_initializers(two_convs(WEIGHT.astype(np.float16).astype(np.float32) + 1e-3)).merged == 0
    reshaped = two_convs(WEIGHT)
    reshaped.graph.initializer[1].dims[:] = [4, 4, 9, 1]  # the same bytes, another shape
    assert deduplicate_initializers(reshaped).merged == 0


def test_a_copy_that_is_a_graph_output_keeps_its_name():
    model = two_convs(extra_outputs=["w2"])
    deduplicated = deduplicate_initializers(model)
    assert deduplicated.merged == 1
    onnx.checker.check_model(deduplicated.model, full_check=True)
    feeds = {"x": np.zeros([1, 4, 6, 6], np.float32)}
    np.testing.assert_array_equal(run(deduplicated.model, feeds)[1], WEIGHT)


def test_a_subgraph_reading_the_copy_reads_the_first():
    then_branch = helper.make_graph([helper.make_node("Identity", ["w2"], ["t"])], "then", [],
                                    [helper.make_tensor_value_info("t", onnx.TensorProto.FLOAT, list(WEIGHT.shape))])
    else_branch = helper.make_graph([helper.make_node("Identity", ["w1"], ["e"])], "else", [],
                                    [helper.make_tensor_value_info("e", onnx.TensorProto.FLOAT, list(WEIGHT.shape))])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["z"], then_branch=then_branch, else_branch=else_branch)], "g",
        [helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, list(WEIGHT.shape))],
        [numpy_helper.from_array(WEIGHT, "w1"), numpy_helper.from_array(WEIGHT.copy(), "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION)
    deduplicated = deduplicate_initializers(model)
    assert deduplicated.merged == 1
    np.testing.assert_array_equal(run(deduplicated.model, {"c": np.array(True)})[0], WEIGHT)


def branches_with_own(then_weight, else_weight, then_name="a", else_name="b"):
    """If(c) whose branches each return Identity of an initializer of their own."""
    shape = list(WEIGHT.shape)

    def branch(name, weight, label):
        return helper.make_graph([helper.make_node("Identity", [name], [label])], label, [],
                                 [helper.make_tensor_value_info(label, onnx.TensorProto.FLOAT, shape)],
                                 [numpy_helper.from_array(weight, name)])

    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["z"], then_branch=branch(then_name, then_weight, "t"),
                          else_branch=branch(else_name, else_weight, "e"))], "g",
        [helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION)


def _branch_initializers(model):
    return [[init.name for init in attribute.g.initializer] for attribute in model.graph.node[0].attribute]


def test_equal_weights_of_two_branches_are_written_once_in_the_main_graph():
    """The same fold made in both branches of an optimum merged decoder: neither branch sees
    the other's, so the one kept moves to the main graph."""
    for then_name, else_name in (("a", "b"), ("w", "w")):  # the same name in both: a new one in the main graph
        model = branches_with_own(WEIGHT, WEIGHT.copy(), then_name, else_name)
        deduplicated = deduplicate_initializers(model)
        assert deduplicated.merged == 1 and deduplicated.bytes_saved == WEIGHT.nbytes
        written = deduplicated.model
        onnx.checker.check_model(written, full_check=True)
        assert len(written.graph.initializer) == 1 and _branch_initializers(written) == [[], []]
        for condition in (True, False):
            np.testing.assert_array_equal(run(written, {"c": np.array(condition)})[0], WEIGHT)


def test_branches_weights_of_one_name_but_other_values_stay_in_their_branches():
    model = branches_with_own(WEIGHT, WEIGHT + 1, "w", "w")
    assert deduplicate_initializers(model).merged == 0
