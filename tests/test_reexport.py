"""Export reusing the imported protos: what no rewrite changed comes out byte for byte as it
went in, and every kind of change (in place included) is exported as the change."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import helper

from convexport.graph import import_graph
from convexport.reexport import Originals, export_graph
from helpers import make_model, tensor


def chain_model():
    """x -> Conv(pads) -> Relu -> y, every node with a doc_string (gs's own export drops it:
    a node that comes out with its doc_string was copied, not rebuilt)."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1], doc_string="conv doc"),
             helper.make_node("Relu", ["c"], ["r"], doc_string="relu doc"),
             helper.make_node("Identity", ["r"], ["y"], name="out", doc_string="identity doc")]
    weights = {"w": np.ones([4, 3, 3, 3], np.float32)}
    model = make_model(nodes, [tensor("x", [1, 3, 8, 8])], [tensor("y", None)], weights)
    model.graph.value_info[0].doc_string = "value doc"
    return model


def export(mutate=lambda graph: None):
    model = chain_model()
    graph = import_graph(model)
    originals = Originals(graph, model)
    mutate(graph)
    return model, export_graph(graph, model, originals)


def by_name(model, name):
    return next(node for node in model.graph.node if node.name == name)


def test_an_untouched_graph_comes_out_as_it_went_in():
    model, exported = export()
    assert [n.doc_string for n in exported.graph.node] == ["conv doc", "relu doc", "identity doc"]
    assert exported.graph.node[1].name == "Relu_0"      # the name import_graph gave it
    exported.graph.node[1].ClearField("name")
    assert list(exported.graph.node) == list(model.graph.node)
    assert list(exported.graph.value_info) == list(model.graph.value_info)
    assert exported.ir_version == model.ir_version and list(exported.opset_import) == list(model.opset_import)


def test_without_originals_everything_is_rebuilt():
    model = chain_model()
    exported = export_graph(import_graph(model), model)
    assert [n.doc_string for n in exported.graph.node] == ["", "", ""]
    assert [n.op_type for n in exported.graph.node] == ["Conv", "Relu", "Identity"]


def _edit_list_in_place(graph):
    graph.nodes[0].attrs["pads"][0] = 0


def _set_attribute(graph):
    graph.nodes[0].attrs["strides"] = [2, 2]


def _rewire_input(graph):
    graph.nodes[2].inputs[0] = graph.nodes[0].outputs[0]


def _rename_output(graph):
    graph.nodes[1].outputs[0].name = "renamed"


def _rename_node(graph):
    graph.nodes[0].name = "new_name"


def _change_op(graph):
    graph.nodes[1].op = "Sigmoid"


def _change_domain(graph):
    graph.nodes[1].domain = "com.example"


@pytest.mark.parametrize("mutate, changed", [
    (_edit_list_in_place, "conv"), (_set_attribute, "conv"), (_rewire_input, "out"),
    (_rename_output, "Relu_0"), (_rename_node, "new_name"), (_change_op, "Relu_0"), (_change_domain, "Relu_0"),
])
def test_a_node_changed_in_any_way_is_rebuilt_the_others_are_copied(mutate, changed):
    _, exported = export(mutate)
    rebuilt = {node.name for node in exported.graph.node if not node.doc_string}
    assert changed in rebuilt
    # a renamed tensor changes its reader too
    assert rebuilt == {changed} | ({"out"} if mutate is _rename_output else set())
    if mutate is _edit_list_in_place:
        assert list(by_name(exported, "conv").attribute[0].ints) == [0, 1, 1, 1]
    if mutate is _change_op:
        assert by_name(exported, "Relu_0").op_type == "Sigmoid"
    if mutate is _change_domain:
        assert by_name(exported, "Relu_0").domain == "com.example"


def test_a_node_with_a_tensor_attribute_is_always_rebuilt():
    value = helper.make_tensor("k", onnx.TensorProto.FLOAT, [1], [2.0])
    nodes = [helper.make_node("Constant", [], ["k"], value=value, doc_string="constant doc"),
             helper.make_node("Mul", ["x", "k"], ["y"], doc_string="mul doc")]
    model = make_model(nodes, [tensor("x", [1])], [tensor("y", [1])])
    graph = import_graph(model)
    graph.nodes[0].attrs["value"].values[0] = 3.0     # in place: invisible in the node's fields
    exported = export_graph(graph, model, Originals(graph, model))
    assert [n.doc_string for n in exported.graph.node] == ["", "mul doc"]
    assert onnx.numpy_helper.to_array(exported.graph.node[0].attribute[0].t).tolist() == [3.0]


def test_a_value_whose_shape_or_type_changed_is_rebuilt():
    def reshape(graph):
        graph.nodes[0].outputs[0].shape = [1, 4, 9, 9]
    _, exported = export(reshape)
    info = {value.name: value for value in exported.graph.value_info}
    assert [d.dim_value for d in info["c"].type.tensor_type.shape.dim] == [1, 4, 9, 9]
    assert info["c"].doc_string == "" and info["r"].doc_string == ""     # r's entry had none to begin with


def test_an_unchanged_value_keeps_its_entry():
    _, exported = export()
    assert next(v for v in exported.graph.value_info if v.name == "c").doc_string == "value doc"


def test_a_shape_list_edited_in_place_is_seen():
    def edit(graph):
        graph.nodes[0].outputs[0].shape[2] = 99
    _, exported = export(edit)
    info = next(v for v in exported.graph.value_info if v.name == "c")
    assert info.doc_string == "" and info.type.tensor_type.shape.dim[2].dim_value == 99


def test_new_nodes_and_constants_are_exported():
    def append(graph):
        extra = gs.Constant("two", np.array([2.0], np.float32))
        out = graph.outputs[0]
        middle = gs.Variable("middle", np.float32)
        graph.nodes[2].outputs[0] = middle
        graph.nodes.append(gs.Node("Mul", "scale", inputs=[middle, extra], outputs=[out]))
    _, exported = export(append)
    assert [n.op_type for n in exported.graph.node] == ["Conv", "Relu", "Identity", "Mul"]
    assert {init.name for init in exported.graph.initializer} == {"w", "two"}
    onnx.checker.check_model(exported)


@pytest.mark.parametrize("attrs", [
    {}, {"group": 1, "pads": [1, 1, 1, 1], "kernel_shape": [3, 3]}, {"alpha": 0.5, "scales": [1.0, 2.5]},
    {"mode": "nearest", "names": ["a", "b"]}, {"flag": True, "flags": [True, False]}, {"n": np.int64(3)},
    {"empty": []}, {"mixed": [1, 2.5]}, {"value": gs.Constant("v", np.ones(2, np.float32))},
    {"ints": [np.int64(1), np.int64(2)]}, {"nested": [[1], [2]]}, {"text": "naïve"},
])
@pytest.mark.parametrize("name, domain", [("n", None), ("", ""), ("n", "com.example")])
def test_nodes_are_exported_as_onnx_graphsurgeon_exports_them(attrs, name, domain):
    from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter

    from convexport.reexport import exported_node

    node = gs.Node("Op", name, dict(attrs), [gs.Variable("x"), gs.Variable("")], [gs.Variable("y")], domain=domain)
    try:
        expected = OnnxExporter.export_node(node).SerializeToString()
    except (ValueError, TypeError) as exc:       # what gs cannot export, neither can we
        with pytest.raises(type(exc)):
            exported_node(node)
        return
    assert exported_node(node).SerializeToString() == expected


def test_equal_attribute_values_of_other_types_export_as_their_own_types():
    """The built attributes are kept by name, type and value: 1 == 1.0 == True, [1, 2] == [1.0, 2.0]."""
    from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter

    from convexport.reexport import exported_node

    for value in ([1, 2], [1.0, 2.0], [1, 2], 1, 1.0, True, 1, "1", ["1"], [1.0, 2.0]):
        node = gs.Node("Op", "n", {"v": value}, [gs.Variable("x")], [gs.Variable("y")])
        again = exported_node(node)
        assert again.SerializeToString() == OnnxExporter.export_node(node).SerializeToString(), value
        again.attribute[0].name = "changed"         # a caller's edit does not reach the next node's proto
        assert exported_node(node).attribute[0].name == "v"


@pytest.mark.parametrize("values", [
    np.arange(6, dtype=np.float32).reshape(2, 3), np.float64(2.5) * np.ones([2]), np.ones([0, 3], np.float16),
    np.array(3, np.int64), np.array([True, False]), np.arange(4, dtype=np.uint8), np.arange(8, dtype=np.int32)[::2],
    np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)), np.array([1 + 2j], np.complex64),
])
@pytest.mark.parametrize("placed", [False, True])
def test_constants_are_exported_as_onnx_graphsurgeon_exports_them(values, placed):
    from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter

    from convexport.reexport import exported_constant

    constant = gs.Constant("c", values, data_location=onnx.TensorProto.DEFAULT if placed else None)
    assert exported_constant(constant).SerializeToString() == OnnxExporter.export_tensor_proto(constant).SerializeToString()


@pytest.mark.parametrize("renamed", [False, True])
def test_an_imported_constant_is_exported_as_onnx_graphsurgeon_exports_it(renamed):
    from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter
    from onnx_graphsurgeon.ir.tensor import LazyValues

    from convexport.reexport import exported_constant

    def imported():
        constant = gs.Constant("w", LazyValues(onnx.numpy_helper.from_array(np.arange(6, dtype=np.float32), "w")))
        if renamed:
            constant.name = "w2"
        return constant

    ours, theirs = imported(), imported()
    proto = exported_constant(ours)
    assert proto.SerializeToString() == OnnxExporter.export_tensor_proto(theirs).SerializeToString()
    if renamed:     # a copy: the imported proto belongs to the model the graph came from
        assert proto is not ours._values.tensor and ours._values.tensor.name == "w"
    else:           # the imported proto itself
        assert proto is ours._values.tensor


def test_nodes_cut_out_as_a_model_leave_a_renamed_imported_weight_as_it_was():
    """nodes_as_model (local shapes, --strategy measure) exports through exported_constant:
    the cut-out reads the weight by its new name, the imported proto keeps its own."""
    from onnx_graphsurgeon.ir.tensor import LazyValues

    from convexport.reexport import nodes_as_model

    source = onnx.numpy_helper.from_array(np.ones([3], np.float32), "k")
    weight = gs.Constant("k", LazyValues(source))
    weight.name = "k2"
    x, y = gs.Variable("x", np.float32, [3]), gs.Variable("y", np.float32, [3])
    node = gs.Node("Mul", "mul", {}, [x, weight], [y])
    model = nodes_as_model([node], [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3])],
                           [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3])], [weight], 18, "cut")
    onnx.checker.check_model(model)
    assert [init.name for init in model.graph.initializer] == ["k2"] and source.name == "k"


def test_a_constant_with_an_export_type_goes_through_onnx_graphsurgeon(monkeypatch):
    from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter

    from convexport.reexport import exported_constant

    constant = gs.Constant("c", np.ones([2], np.float32), export_dtype=onnx.TensorProto.FLOAT)
    expected = OnnxExporter.export_tensor_proto(constant).SerializeToString()
    calls = []
    real = OnnxExporter.export_tensor_proto
    monkeypatch.setattr(OnnxExporter, "export_tensor_proto", lambda tensor: calls.append(tensor) or real(tensor))
    assert exported_constant(constant).SerializeToString() == expected and calls == [constant]
