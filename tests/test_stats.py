"""FLOPs in the report: DFTs by the FFT count, Scan bodies once per iteration, nested bodies shaped."""

from __future__ import annotations

import math

import numpy as np
import onnx
from graphs import GraphBuilder
from helpers import make_model, tensor
from onnx import TensorProto, helper, numpy_helper
from test_fft_conv import fft_outcome

import convexport
from convexport.ir import infer_shapes
from convexport.ir.stats import graph_stats


def test_a_scan_body_counts_once_per_iteration():
    body = helper.make_graph([helper.make_node("Relu", ["row"], ["out"])], "body",
                             [tensor("row", [3])], [tensor("out", [3])])
    scan = helper.make_node("Scan", ["x"], ["y"], body=body, num_scan_inputs=1)
    model = make_model([scan], [tensor("x", [4, 3])], [tensor("y", [4, 3])])
    assert graph_stats(model)["flops"] == 12 + 4 * 3        # the Scan's 12 outputs, 4 Relus of 3


def test_a_dft_costs_five_n_log_n_per_transform():
    axis = helper.make_tensor("axis", TensorProto.INT64, [], [1])
    dft = helper.make_node("DFT", ["x", "", "axis"], ["y"])
    model = make_model([dft], [tensor("x", [2, 8, 5, 2])], [tensor("y", None)], opset=20)
    model.graph.initializer.append(axis)
    model = infer_shapes(model, "test")
    assert graph_stats(model)["flops"] == 2 * 5 * 5 * 8 * math.log2(8)   # 2x5 transforms of 8 points


def test_the_fft_convolution_is_counted_inside_its_nested_scans():
    """The FFT conv runs in a Scan over images holding a Scan over channels: the inner body has
    shapes (ONNX infers it only once the outer body's are known) and counts B * O times."""
    builder = GraphBuilder([2, 1, 64, 64])
    y = builder.conv("x", 3, 25, bias=False)
    model, outcome = fft_outcome(builder, y)
    (entry,) = outcome.applied
    counted = graph_stats(outcome.model)["flops"]
    assert 0.5 < counted / (2 * entry["flops_after"]) < 2.0, (counted, entry["flops_after"])
    assert counted < graph_stats(model)["flops"] / 5


def test_params_count_float_initializers_and_constant_nodes_here_and_in_subgraphs():
    """Float initializers and float Constant nodes count, in the main graph and in a branch;
    integer ones (shapes, axes) do not."""
    def constant(name, values):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(values, name + "_value"))

    branch = helper.make_graph([constant("k", np.ones((2, 3), np.float32)), helper.make_node("Add", ["x", "k"], ["t"])],
                               "then", [], [tensor("t", [2, 3])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [], [tensor("e", [2, 3])])
    nodes = [constant("c", np.ones(5, np.float32)), constant("shape", np.array([2, 3], np.int64)),
             helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=other)]
    model = make_model(nodes, [tensor("x", [2, 3]), tensor("cond", [], TensorProto.BOOL)], [tensor("y", [2, 3])])
    model.graph.initializer.extend([numpy_helper.from_array(np.ones((4, 4), np.float32), "w"),
                                    numpy_helper.from_array(np.ones(7, np.int64), "axes")])
    assert graph_stats(model)["params"] == 16 + 5 + 6
    without_constants = make_model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [2, 3])], [tensor("y", [2, 3])])
    without_constants.graph.initializer.append(numpy_helper.from_array(np.ones((4, 4), np.float16), "w"))
    assert graph_stats(without_constants)["params"] == 16


def test_a_merged_decoders_flops_before_count_what_its_shape_chains_compute(tmp_path):
    """An If whose branches share tensor names (optimum's merged decoder) is inferred without
    ONNX's data propagation, so a Reshape whose target a Shape chain computes leaves the MatMul
    after it unshaped: counted as one row. The report's `before` counts the folded model the
    rules ran on (the same computation, its targets constant): no FLOPs growth where nothing
    grew (it read 64x)."""
    def branch(name):
        axis = numpy_helper.from_array(np.array(0, np.int64), "axis")
        width = numpy_helper.from_array(np.array([16], np.int64), "width")
        nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "axis"], ["rows"]),
                 helper.make_node("Unsqueeze", ["rows", "zero"], ["u"]),
                 helper.make_node("Concat", ["u", "width"], ["target"], axis=0),
                 helper.make_node("Reshape", ["x", "target"], ["r"]), helper.make_node("MatMul", ["r", "w"], ["out"])]
        return helper.make_graph(nodes, name, [], [tensor("out", [64, 32])], [axis, width])

    nodes = [helper.make_node("If", ["cond"], ["y"], then_branch=branch("then"), else_branch=branch("else"))]
    weights = {"w": np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32), "zero": np.array([0])}
    model = make_model(nodes, [tensor("x", [64, 16]), tensor("cond", [], TensorProto.BOOL)], [tensor("y", [64, 32])],
                       weights)  # fmt: skip
    assert graph_stats(infer_shapes(model, "test"))["flops"] < 64 * 32 * 16  # the MatMul unshaped: one row
    onnx.save(model, tmp_path / "merged.onnx")
    report = convexport.optimize(str(tmp_path / "merged.onnx"), output=str(tmp_path / "out.onnx"), profile=False).report
    assert report["before"]["flops"] >= 2 * 64 * 32 * 16 * 2, report["before"]  # both branches' MatMuls, whole
    assert report["growth"]["flops"] <= 1.0, report["growth"]
