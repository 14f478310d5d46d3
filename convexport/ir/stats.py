"""Size and cost of an ONNX graph: node and op counts, parameters, FLOPs from shapes.

FLOPs are flops.py's count (whole tensors; a symbolic dim, a dynamic batch say, counts as 1).
Node and op counts are the main graph's; FLOPs and parameters include subgraphs: both
branches of an If, a Scan body as many times as the Scan iterates, a Loop body once.
"""

from __future__ import annotations

import math
from collections import Counter

import onnx

from .. import flops
from . import proto_scopes, proto_subgraphs, tensor_array


def graph_stats(model: onnx.ModelProto) -> dict:
    """The report contract's `before` / `after` block."""
    graph = model.graph
    scopes = proto_scopes(graph)
    shapes = _known_shapes(scopes)
    ops = Counter([node.op_type for node in graph.node])
    return {
        "nodes": len(graph.node),
        "ops": dict(sorted(ops.items(), key=lambda item: (-item[1], item[0]))),
        "flops": float(_graph_flops(graph, shapes, _small_integers(scopes), len(scopes) > 1)),
        "params": int(sum([_parameter_count(scope, scope is not graph or "Constant" in ops) for scope in scopes])),
    }


def node_flops(model: onnx.ModelProto, count=None) -> float:
    """The FLOPs of the model's main-graph nodes as `count(node, op, shapes, integers)` counts
    them (flops.py's count where it returns None), for an estimate of other work than ORT's
    (the float64 reference's, validate/exact_check.py)."""
    scopes = proto_scopes(model.graph)
    shapes, integers = _known_shapes(scopes), _small_integers(scopes)
    total = 0.0
    for node in model.graph.node:
        own = count(node, node.op_type, shapes) if count is not None else None
        total += own if own is not None else _node_flops(node, node.op_type, shapes, integers)
    return total


def flops_by_node(model: onnx.ModelProto) -> list[float]:
    """The FLOPs of each main-graph node, in order (from the shapes its value_info holds)."""
    scopes = proto_scopes(model.graph)
    shapes, integers = _known_shapes(scopes), _small_integers(scopes)
    return [_node_flops(node, node.op_type, shapes, integers) for node in model.graph.node]


def _graph_flops(graph: onnx.GraphProto, shapes, integers, nested: bool) -> float:
    """The FLOPs of graph's nodes, and (when `nested`: the model has subgraphs) of their subgraphs."""
    total = 0.0
    for node in graph.node:
        op = node.op_type  # read once: each read of a proto field makes a new str
        total += _node_flops(node, op, shapes, integers)
        for sub in proto_subgraphs(node) if nested else ():
            total += _graph_flops(sub, shapes, integers, nested) * _iterations(node, shapes)
    return total


def _iterations(node: onnx.NodeProto, shapes) -> int:
    """How many times a node runs its body: a Scan's length along its first scan input's axis
    (when known), else once."""
    if node.op_type != "Scan":
        return 1
    count = next(a.i for a in node.attribute if a.name == "num_scan_inputs")
    first = node.input[len(node.input) - count]
    axes = next((list(a.ints) for a in node.attribute if a.name == "scan_input_axes"), [0])
    shape = shapes.get(first)
    return shape[axes[0] % len(shape)] if shape else 1


def _small_integers(scopes: list[onnx.GraphProto]) -> dict[str, list[int]]:
    """The values of small integer initializers (a DFT's axis input, say)."""
    found = {}
    for graph in scopes:
        for init in graph.initializer:
            if init.data_type == onnx.TensorProto.INT64 and math.prod(init.dims) <= 8:
                found[init.name] = tensor_array(init).reshape(-1).tolist()
    return found


def _known_shapes(scopes: list[onnx.GraphProto]) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for graph in scopes:
        for value in [*graph.value_info, *graph.input, *graph.output]:
            dims = _counted_dims(value.type)
            if dims is not None:
                shapes[value.name] = dims
        for init in graph.initializer:
            shapes[init.name] = tuple(init.dims)
    return shapes


def _counted_dims(type_proto: onnx.TypeProto) -> tuple[int, ...] | None:
    """A tensor type's dims, a dim_param (or no value) counted as 1 (HasField only where the
    value reads 0); None without a shape, or for any other type (its tensor_type is empty)."""
    tensor_type = type_proto.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    return tuple([d.dim_value or (0 if d.HasField("dim_value") else 1) for d in tensor_type.shape.dim])


def _node_flops(
    node: onnx.NodeProto, op: str, shapes: dict[str, tuple[int, ...]], integers: dict[str, list[int]]
) -> float:
    """flops.node_flops with the node's shapes and attributes as the protos hold them."""
    attributes = {attribute.name: onnx.helper.get_attribute_value(attribute) for attribute in node.attribute}
    if op == "DFT" and len(node.input) > 2 and node.input[2] in integers:  # DFT-20 takes the axis as an input
        attributes["axis"] = integers[node.input[2]][0]
    if isinstance(attributes.get("equation"), bytes):
        attributes["equation"] = attributes["equation"].decode()
    return flops.node_flops(
        op,
        shapes.get(node.output[0]) if node.output else None,
        [shapes.get(name) if name else None for name in node.input],
        attributes.get,
    )


def _parameter_count(graph: onnx.GraphProto, has_constant_nodes: bool) -> int:
    """The float values of the graph's initializers, and of its Constant nodes where it has any."""
    total = sum([int(math.prod(init.dims)) for init in graph.initializer if init.data_type in _FLOAT_TYPES])
    for node in graph.node if has_constant_nodes else ():
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value" and attribute.t.data_type in _FLOAT_TYPES:
                    total += int(math.prod(attribute.t.dims))
    return total


_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}
