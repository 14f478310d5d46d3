"""The same graph computing in float64.

`as_float64(model)`: every float, float16 and bfloat16 tensor (initializers, Constant nodes and
ConstantOfShape values, the graph's inputs, outputs and value_info, in every subgraph) becomes
float64, and every op that makes a float type by name (Cast, RandomNormal and the like, EyeLike)
makes float64 instead. Integer and boolean tensors stay as they are. The weights are the
model's own values, widened exactly; only the arithmetic changes.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from ...ir import is_file_backed, proto_scopes, proto_subgraphs, tensor_array

FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
DOUBLE = onnx.TensorProto.DOUBLE
# attributes that name the type an op makes
_TYPE_ATTRIBUTES = {
    "Cast": "to",
    "RandomNormal": "dtype",
    "RandomUniform": "dtype",
    "RandomNormalLike": "dtype",
    "RandomUniformLike": "dtype",
    "EyeLike": "dtype",
    "Bernoulli": "dtype",
    "Multinomial": "dtype",
}


def as_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` computing in float64 (see the module doc)."""
    wide = onnx.ModelProto()
    wide.CopyFrom(model)
    for graph in proto_scopes(wide.graph):
        _widen_graph(graph)
    for function in wide.functions:  # model-local functions: their constants and Casts too
        for node in function.node:
            _widen_node(node)
            for subgraph in proto_subgraphs(node):
                for graph in proto_scopes(subgraph):
                    _widen_graph(graph)
    return wide


def _widen_graph(graph: onnx.GraphProto) -> None:
    for index, tensor in enumerate(graph.initializer):
        if tensor.data_type in FLOAT_TYPES:
            graph.initializer[index].CopyFrom(widened(tensor))
        elif is_file_backed(tensor):  # the reference evaluator reads no file-backed tensor
            graph.initializer[index].CopyFrom(numpy_helper.from_array(tensor_array(tensor), tensor.name))
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.type.tensor_type.elem_type in FLOAT_TYPES:
            value.type.tensor_type.elem_type = DOUBLE
    for node in graph.node:
        _widen_node(node)


def widened(tensor: onnx.TensorProto) -> onnx.TensorProto:
    return numpy_helper.from_array(tensor_array(tensor).astype(np.float64), tensor.name)


def _widen_node(node: onnx.NodeProto) -> None:
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.TENSOR and attribute.t.data_type in FLOAT_TYPES:
            attribute.t.CopyFrom(widened(attribute.t))
        elif node.op_type == "Constant" and attribute.name in ("value_float", "value_floats"):
            values = np.array(attribute.f if attribute.name == "value_float" else list(attribute.floats), np.float64)
            attribute.CopyFrom(onnx.helper.make_attribute("value", numpy_helper.from_array(values)))
        elif _TYPE_ATTRIBUTES.get(node.op_type) == attribute.name and attribute.i in FLOAT_TYPES:
            attribute.i = DOUBLE
