"""TypeReader: each distinct TypeProto read once, and every type read as its own."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from convexport.graph import import_graph
from convexport.type_reader import TypeReader
from helpers import make_model, tensor


def tensor_type(*dims, elem_type=TensorProto.FLOAT) -> onnx.TypeProto:
    """dims: an int (dim_value), a str (dim_param) or None (neither)."""
    return helper.make_tensor_type_proto(elem_type, list(dims))


def test_each_distinct_type_is_read_once_and_each_read_as_its_own():
    calls = []

    def read(proto):
        calls.append(1)
        if not proto.tensor_type.HasField("shape"):
            return proto.tensor_type.elem_type, None
        return proto.tensor_type.elem_type, tuple(
            d.dim_param if d.HasField("dim_param") else d.dim_value if d.HasField("dim_value") else None
            for d in proto.tensor_type.shape.dim)

    reader = TypeReader(read)
    types = [tensor_type(1, 8), tensor_type(1, 8), tensor_type("N", 8), tensor_type(0, 8), tensor_type(None, 8),
             tensor_type(1, 8, 1), tensor_type(), tensor_type(1, 8, elem_type=TensorProto.INT64),
             helper.make_tensor_type_proto(TensorProto.FLOAT, None)]
    assert [reader(t) for t in types] == [(1, (1, 8)), (1, (1, 8)), (1, ("N", 8)), (1, (0, 8)), (1, (None, 8)),
                                          (1, (1, 8, 1)), (1, ()), (7, (1, 8)), (1, None)]
    assert len(calls) == 8
    denoted = tensor_type(1, 8)
    denoted.tensor_type.shape.dim[0].denotation = "DATA_BATCH"
    assert reader(denoted) == (1, (1, 8)) and len(calls) == 9
    sequence = helper.make_sequence_type_proto(tensor_type(1, 8))
    assert reader(sequence) == (0, None) and len(calls) == 10


def test_imported_tensors_of_one_shape_get_lists_of_their_own():
    model = make_model([helper.make_node("Relu", ["x"], ["a"], name="r1"), helper.make_node("Relu", ["a"], ["y"], name="r2")],
                       [tensor("x", [2, 3])], [tensor("y", [2, 3])])
    graph = import_graph(model)
    x, a, y = graph.nodes[0].inputs[0], graph.nodes[0].outputs[0], graph.nodes[1].outputs[0]
    assert x.shape == a.shape == y.shape == [2, 3]
    assert len({id(x.shape), id(a.shape), id(y.shape)}) == 3
