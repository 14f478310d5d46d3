"""Thin helpers over onnx-graphsurgeon: constants, attributes with ONNX defaults, names."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnx_graphsurgeon as gs


def import_graph(model: onnx.ModelProto) -> gs.Graph:
    """gs.Graph with every node named (reports name nodes) and ONNX's default opset noted."""
    graph = gs.import_onnx(model)
    taken = {node.name for node in graph.nodes if node.name}
    counter = itertools.count()
    for node in graph.nodes:
        if not node.name:
            while (name := f"{node.op}_{next(counter)}") in taken:
                pass
            node.name = name
            taken.add(name)
    return graph


def export_graph(graph: gs.Graph, template: onnx.ModelProto) -> onnx.ModelProto:
    """gs.Graph -> ModelProto keeping the template's IR version, opsets and metadata."""
    model = gs.export_onnx(graph, do_type_check=False)
    model.ir_version = template.ir_version
    del model.opset_import[:]
    model.opset_import.extend(template.opset_import)
    model.producer_name = template.producer_name or "convexport"
    model.producer_version = template.producer_version
    del model.metadata_props[:]
    model.metadata_props.extend(template.metadata_props)
    return model


def is_absent(tensor) -> bool:
    """An omitted optional input: missing or the empty name."""
    return tensor is None or (isinstance(tensor, gs.Variable) and not tensor.name)


def constant_value(tensor) -> np.ndarray | None:
    """The value of an initializer or a Constant node's output; None for run-time tensors."""
    if isinstance(tensor, gs.Constant):
        return np.asarray(tensor.values)
    if isinstance(tensor, gs.Variable) and len(tensor.inputs) == 1:
        producer = tensor.inputs[0]
        if producer.op == "Constant" and "value" in producer.attrs:
            value = producer.attrs["value"]
            return np.asarray(value.values if isinstance(value, gs.Constant) else value)
    return None


NOT_IN_SCHEMA = object()   # the op has no such attribute at this opset


def attribute(node: gs.Node, name: str, opset: int):
    """The node's attribute, or the ONNX schema default when it is not set (None if the
    schema has no default, NOT_IN_SCHEMA if the op has no such attribute at this opset)."""
    if name in node.attrs:
        value = node.attrs[name]
        return tuple(value) if isinstance(value, list) else value
    try:
        schema = onnx.defs.get_schema(node.op, opset, node.domain or "")
    except onnx.defs.SchemaError:
        return None
    proto = schema.attributes.get(name)
    if proto is None:
        return NOT_IN_SCHEMA
    if not proto.default_value.name:
        return None
    value = onnx.helper.get_attribute_value(proto.default_value)
    if isinstance(value, bytes):
        return value.decode()
    return tuple(value) if isinstance(value, list) else value


def attribute_or(node: gs.Node, name: str, opset: int, default):
    """The attribute's value, its schema default, or `default` when it has neither."""
    value = attribute(node, name, opset)
    return default if value is None or value is NOT_IN_SCHEMA else value


def default_opset(model: onnx.ModelProto) -> int:
    return next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 18)


class NameGenerator:
    """Fresh tensor and node names that collide with nothing in the graph."""

    def __init__(self, graph: gs.Graph):
        self._taken = set(graph.tensors().keys()) | {node.name for node in graph.nodes}
        self._counter = itertools.count()

    def __call__(self, base: str) -> str:
        while (name := f"{base}__cx{next(self._counter)}") in self._taken:
            pass
        self._taken.add(name)
        return name
