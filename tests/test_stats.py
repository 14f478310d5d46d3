"""FLOPs in the report: DFTs by the FFT count, Scan bodies once per iteration, nested bodies shaped."""

from __future__ import annotations

import math

from onnx import TensorProto, helper

from convexport.ir import infer_shapes
from convexport.stats import graph_stats
from graphs import GraphBuilder
from helpers import make_model, tensor
from test_fft_conv import fft_outcome


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
    import numpy as np
    from onnx import numpy_helper

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
