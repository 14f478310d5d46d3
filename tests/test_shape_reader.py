"""ShapeReader: each distinct TensorShapeProto read once, and every shape read as its own."""

from __future__ import annotations

import onnx
from onnx import helper

from convexport.graph import import_graph
from convexport.shape_reader import ShapeReader
from helpers import make_model, tensor


def shape(*dims) -> onnx.TensorShapeProto:
    """dims: an int (dim_value), a str (dim_param) or None (neither)."""
    proto = onnx.TensorShapeProto()
    for value in dims:
        dim = proto.dim.add()
        if isinstance(value, int):
            dim.dim_value = value
        elif isinstance(value, str):
            dim.dim_param = value
    return proto


def test_each_distinct_shape_is_read_once_and_each_read_as_its_own():
    calls = []

    def read(proto):
        calls.append(1)
        return tuple(d.dim_param if d.HasField("dim_param") else d.dim_value if d.HasField("dim_value") else None
                     for d in proto.dim)

    reader = ShapeReader(read)
    shapes = [shape(1, 8), shape(1, 8), shape("N", 8), shape(0, 8), shape(None, 8), shape(1, 8, 1), shape()]
    assert [reader(s) for s in shapes] == [(1, 8), (1, 8), ("N", 8), (0, 8), (None, 8), (1, 8, 1), ()]
    assert len(calls) == 6
    denoted = shape(1, 8)
    denoted.dim[0].denotation = "DATA_BATCH"
    assert reader(denoted) == (1, 8) and len(calls) == 7


def test_imported_tensors_of_one_shape_get_lists_of_their_own():
    model = make_model([helper.make_node("Relu", ["x"], ["a"], name="r1"), helper.make_node("Relu", ["a"], ["y"], name="r2")],
                       [tensor("x", [2, 3])], [tensor("y", [2, 3])])
    graph = import_graph(model)
    x, a, y = graph.nodes[0].inputs[0], graph.nodes[0].outputs[0], graph.nodes[1].outputs[0]
    assert x.shape == a.shape == y.shape == [2, 3]
    assert len({id(x.shape), id(a.shape), id(y.shape)}) == 3
