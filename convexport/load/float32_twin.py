"""A model whose weights are float16, optimized as its float32 twin.

A float16 checkpoint (an export of `model.half()`, a converter's float16 file) computes in
float16, and a fold of its weights made in float64 has to be rounded into float16 again. Done by
the rewrite alone, each folded kernel is rounded to nearest, node by node, and the outputs
land further from the exact result than where the half stage rounds the same folds
(bench/RESULTS.md, "Float16 models"). So the model is read as the float32
model of the same values, its twin: every float16 weight and constant is the same number in
float32, its Casts into float16 are Casts into float32, and its inputs and outputs keep their
types through a Cast at each edge, so that it is fed and read as the model is. The twin is
rewritten (its folds exact in float32) and validated against the model as given, and the half
stage (convexport/half/) writes it in float16 again, node by node where the measured error
allows, its weights rounded as --dtype fp16 rounds a float32 model's. `edges_dropped` takes the
edge Casts out once the nodes beside them compute in the interface's type.

Only the main graph is read in float32: a model with subgraphs, or with weights in external
files (a large model read in float32 would hold twice its weights), is not twinned; its folds
are rounded into float16 by the rewrite (folds/half_rounding.py weighs them as it does under
--dtype fp16).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from .. import ir

EDGE_TAG = "@float32_twin"
_TYPE_ATTRIBUTES = ("to", "dtype")  # Cast's, and the generators' (EyeLike, RandomNormal...)


_FLOAT_TYPES = {
    TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16", TensorProto.FLOAT: None, TensorProto.DOUBLE: None,
}  # fmt: skip


def weights_half_type(model: onnx.ModelProto) -> str | None:
    """The half type the model's weights are in: the one that holds most of its float weights'
    elements (initializers, and Constant nodes' values: an old exporter's weights), where a few
    stay float32 (a float16 checkpoint's, a converter's float16 file's); None where float32 or
    float64 hold most (a float32 model with a float16 constant or two)."""
    elements = dict.fromkeys(_FLOAT_TYPES, 0)
    held = [*model.graph.initializer]
    held += [attribute.t for node in model.graph.node if node.op_type == "Constant" for attribute in node.attribute
             if attribute.type == onnx.AttributeProto.TENSOR]  # fmt: skip
    for tensor in held:
        if tensor.data_type in elements:
            elements[tensor.data_type] += int(np.prod(tensor.dims, dtype=np.int64))
    kind = max(elements, key=lambda data_type: elements[data_type])
    wide = elements[TensorProto.FLOAT] + elements[TensorProto.DOUBLE]
    return _FLOAT_TYPES[kind] if elements[kind] > wide else None


def holds_float16_weights(model: onnx.ModelProto) -> bool:
    return weights_half_type(model) == "float16"


def why_not_twinned(model: onnx.ModelProto) -> str | None:
    """Why the model cannot be read as its float32 twin (module doc), or None where it can."""
    graph = model.graph
    if weights_half_type(model) == "bfloat16" or any(t.data_type == TensorProto.BFLOAT16 for t in graph.initializer):
        return "it holds bfloat16 weights too"
    if any(ir.proto_subgraphs(node) for node in graph.node):
        return "it has subgraphs"
    if any(tensor.data_location == TensorProto.EXTERNAL for tensor in graph.initializer):
        return "its weights are in external files"
    return None


def float32_twin(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model computing in float32 on the same values, its interface kept (module doc)."""
    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    graph = twin.graph
    for tensor in graph.initializer:
        if tensor.data_type == TensorProto.FLOAT16:
            tensor.CopyFrom(_in_float32(tensor))
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR and attribute.t.data_type == TensorProto.FLOAT16:
                attribute.t.CopyFrom(_in_float32(attribute.t))
            elif attribute.name in _TYPE_ATTRIBUTES and attribute.i == TensorProto.FLOAT16:
                attribute.i = TensorProto.FLOAT
    for value in graph.value_info:
        if _is_float16(value):
            value.type.tensor_type.elem_type = TensorProto.FLOAT
    nodes = _Fresh({node.name for node in graph.node})
    tensors = _Fresh(
        {name for node in graph.node for name in (*node.input, *node.output)}
        | {value.name for value in (*graph.input, *graph.output, *graph.value_info, *graph.initializer)}
    )
    entering = []
    for value in graph.input:
        if _is_float16(value):
            inner = tensors(f"{value.name}{EDGE_TAG}")
            ir.read_as(graph, value.name, inner)
            entering.append(_edge(value.name, inner, TensorProto.FLOAT, nodes(f"{inner}_cast")))
            graph.value_info.append(_in_float32_type(value, inner))
    leaving = []
    for value in graph.output:
        if _is_float16(value):
            inner = tensors(f"{value.name}{EDGE_TAG}")
            ir.read_as(graph, value.name, inner)
            _made_as(graph, value.name, inner)
            leaving.append(_edge(inner, value.name, TensorProto.FLOAT16, nodes(f"{inner}_cast")))
            graph.value_info.append(_in_float32_type(value, inner))
    ordered = [*entering, *graph.node, *leaving]
    del graph.node[:]
    graph.node.extend(ordered)
    return twin


def is_twin_of(model: onnx.ModelProto, original: onnx.ModelProto) -> bool:
    return holds_float16_weights(original) and weights_half_type(model) is None


def twin_types(original: onnx.ModelProto) -> onnx.ModelProto:
    """A weightless model declaring what `original` declares of its tensors, in its twin's
    types (its interface as it is, every other float16 tensor float32): the dims it names,
    carried to its rewritten twin (ir.carry_dim_names) without a float16 type."""
    graph = original.graph
    values = []
    for value in graph.value_info:
        values.append(_in_float32_type(value, value.name) if _is_float16(value) else value)
    declared = onnx.helper.make_graph([], graph.name, list(graph.input), list(graph.output), value_info=values)
    return onnx.helper.make_model(declared, opset_imports=list(original.opset_import))


def edges_dropped(model: onnx.ModelProto) -> int:
    """The twin's edge Casts taken out of `model` (in place) where they cast nothing: the half
    stage made the nodes beside them compute in the interface's float16. How many went."""
    graph = model.graph
    if not any(EDGE_TAG in name for node in graph.node if node.op_type == "Cast" for name in node.output):
        return 0
    types = {value.name: value.type.tensor_type.elem_type for value in (*graph.input, *graph.output)}
    inferred = {
        value.name: value.type.tensor_type.elem_type for value in ir.infer_shapes(model, "the model").graph.value_info
    }
    types = {**inferred, **types}
    inputs, outputs = {value.name for value in graph.input}, {value.name for value in graph.output}
    dropped = []
    for node in graph.node:
        if node.op_type != "Cast" or types.get(node.input[0]) != _cast_to(node):
            continue  # not an edge, or a Cast still: a float32 node beside the edge
        source, target = node.input[0], node.output[0]
        if source in inputs and EDGE_TAG in target:  # an input's
            ir.read_as(graph, target, source)
        elif target in outputs and EDGE_TAG in source:  # an output's
            ir.read_as(graph, source, target)
            _made_as(graph, source, target)
        else:
            continue
        dropped.append(node)
    for node in dropped:
        graph.node.remove(node)
    kept = {name for node in graph.node for name in (*node.input, *node.output)}
    stale = [value for value in graph.value_info if EDGE_TAG in value.name and value.name not in kept]
    for value in stale:
        graph.value_info.remove(value)
    return len(dropped)


def _is_float16(value: onnx.ValueInfoProto) -> bool:
    return value.type.tensor_type.elem_type == TensorProto.FLOAT16


def _in_float32_type(value: onnx.ValueInfoProto, name: str) -> onnx.ValueInfoProto:
    """`value`'s type and dims, in float32, named `name` (an edge's float32 side)."""
    inner = onnx.ValueInfoProto()
    inner.CopyFrom(value)
    inner.name = name
    inner.type.tensor_type.elem_type = TensorProto.FLOAT
    return inner


class _Fresh:
    """Names none of `taken` is (a converter may have named its Cast "y_cast"; a model written
    by convexport may hold a twin's name)."""

    def __init__(self, taken: set[str]):
        self._taken = taken

    def __call__(self, base: str) -> str:
        name, count = base, 0
        while name in self._taken:
            count += 1
            name = f"{base}_{count}"
        self._taken.add(name)
        return name


def _edge(source: str, target: str, to: int, name: str) -> onnx.NodeProto:
    return onnx.helper.make_node("Cast", [source], [target], name=name, to=to)


def _cast_to(node: onnx.NodeProto) -> int:
    return next(attribute.i for attribute in node.attribute if attribute.name == "to")


def _made_as(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        for position, name in enumerate(node.output):
            if name == old:
                node.output[position] = new


def _in_float32(tensor: onnx.TensorProto) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(tensor).astype(np.float32), tensor.name)
