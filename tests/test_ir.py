"""convexport.ir: the import and export of a graph around the rewrite, and what they keep."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from convexport import ir
from helpers import make_model, tensor


def chain_model():
    """x -> Conv(pads) -> Relu (nameless) -> Identity -> y, with metadata."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Identity", ["r"], ["y"], name="out")]
    model = make_model(nodes, [tensor("x", [1, 3, 8, 8])], [tensor("y", None)],
                       {"w": np.arange(108, dtype=np.float32).reshape(4, 3, 3, 3)})
    helper.set_model_props(model, {"author": "someone"})
    model.producer_name = "exporter"
    return model


def test_an_untouched_graph_comes_out_as_it_went_in():
    model = chain_model()
    exported = ir.export_graph(ir.import_graph(model), model)
    assert [node.name for node in exported.graph.node] == ["conv", "", "out"]  # a nameless one stays so
    assert list(exported.graph.node) == list(model.graph.node)
    assert list(exported.graph.initializer) == list(model.graph.initializer)
    assert exported.ir_version == model.ir_version and list(exported.opset_import) == list(model.opset_import)
    assert exported.producer_name == "exporter" and list(exported.metadata_props) == list(model.metadata_props)


def test_renaming_an_imported_weight_never_reaches_the_input_model():
    """gs's exporter renames an imported initializer's proto in place: the graph works on its own copy."""
    model = chain_model()
    before = model.SerializeToString()
    graph = ir.import_graph(model)
    graph.tensors()["w"].name = "w_renamed"
    exported = ir.export_graph(graph, model)
    assert [init.name for init in exported.graph.initializer] == ["w_renamed"]
    assert model.SerializeToString() == before


def test_an_initializer_listed_as_an_input_stays_an_input_with_its_default():
    model = chain_model()
    model.graph.input.append(helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [4, 3, 3, 3]))
    graph = ir.import_graph(model)
    assert [t.name for t in graph.inputs] == ["x", "w"] and isinstance(graph.inputs[1], ir.Variable)
    assert not ir.is_constant(graph.nodes[0].inputs[1])
    exported = ir.export_graph(graph, model)
    assert [v.name for v in exported.graph.input] == ["x", "w"]
    assert [init.name for init in exported.graph.initializer] == ["w"]


def test_nodes_cut_out_as_a_model_read_a_renamed_weight_by_its_new_name():
    graph = ir.import_graph(chain_model())
    weight = graph.tensors()["w"]
    weight.name = "w2"
    conv = graph.nodes[0]
    model = ir.nodes_as_model([conv], [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, [1, 4, 6, 6])], [weight], 18, "cut")
    onnx.checker.check_model(model)
    assert [init.name for init in model.graph.initializer] == ["w2"]


def test_fully_shaped_asks_for_a_static_typed_entry_for_every_node_output():
    model = chain_model()
    del model.graph.value_info[:]
    assert not ir.fully_shaped(model)           # no value_info, y unshaped
    inferred = ir.infer_shapes(model, "test")
    assert ir.fully_shaped(inferred)
    assert ir.infer_shapes(inferred, "test").graph.value_info == inferred.graph.value_info


def test_the_opset_is_read_in_one_place():
    model = chain_model()
    assert ir.onnx_opset(model) == 18
    del model.opset_import[:]
    assert ir.onnx_opset(model) is None


def test_fresh_names_avoid_every_name_of_every_scope():
    graph = ir.import_graph(chain_model())
    fresh = ir.NameGenerator(graph)
    made = {fresh("c") for _ in range(100)}
    assert len(made) == 100 and not made & ({"c", "r", "y", "w", "x"} | {node.name for node in graph.nodes})
