"""Size and cost of an ONNX graph: node and op counts, parameters, FLOPs from shapes.

FLOPs count multiply-adds as two operations for the ops whose cost depends on a weight
(Conv, ConvTranspose, Gemm, MatMul, Einsum with two operands), 5 N log2 N per complex
transform of N points for DFT (the radix-2 FFT count), and one operation per output element
for every other op. Symbolic dims count as 1 (a dynamic batch is reported per sample).
Node and op counts are the main graph's; FLOPs and parameters include subgraphs: both
branches of an If, a Scan body as many times as the Scan iterates, a Loop body once.
"""

from __future__ import annotations

import math
from collections import Counter

import onnx

from .ir import proto_scopes, proto_subgraphs


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
                found[init.name] = onnx.numpy_helper.to_array(init).reshape(-1).tolist()
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
    out = shapes.get(node.output[0]) if node.output else None
    if out is None:
        return 0.0
    out_elements = float(math.prod(out)) if out else 1.0
    if op == "DFT":
        return _dft_flops(node, shapes, integers, out)
    if op in ("Conv", "ConvTranspose"):
        weight = shapes.get(node.input[1])
        if weight is None:
            return 0.0
        # Conv: each output element sums (I/g)*prod(k) products; weight is [O, I/g, *k].
        # ConvTranspose: each input element scatters O/g*prod(k); weight is [I, O/g, *k].
        if op == "Conv":
            return 2.0 * out_elements * float(math.prod(weight[1:]))
        source = shapes.get(node.input[0])
        return 2.0 * float(math.prod(source or (1,))) * float(math.prod(weight[1:]))
    if op in ("Gemm", "MatMul"):
        a = shapes.get(node.input[0])
        if not a:
            return 0.0
        transposed = op == "Gemm" and any(at.name == "transA" and at.i for at in node.attribute)
        inner = a[0] if transposed and len(a) == 2 else a[-1]
        return 2.0 * out_elements * inner
    if op == "Einsum" and len(node.input) == 2:
        return 2.0 * _einsum_products(node, shapes)
    return out_elements


def _dft_flops(node: onnx.NodeProto, shapes, integers, out) -> float:
    """5 N log2 N per complex transform of N points (N the longer of the input's and the
    output's length on the axis: a one-sided transform has N/2 + 1 outputs), one transform per
    complex output point divided by N'; out's last axis holds (real, imaginary)."""
    source = shapes.get(node.input[0])
    axis_input = integers.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    axis = axis_input[0] if axis_input else next((a.i for a in node.attribute if a.name == "axis"), 1)
    if not source or len(source) != len(out):
        return 0.0
    axis %= len(out)
    points = max(source[axis], out[axis])
    transforms = math.prod(out[:-1]) / out[axis]
    return 5.0 * transforms * points * math.log2(max(points, 2))


def _einsum_products(node: onnx.NodeProto, shapes) -> float:
    """Number of scalar products of a two-operand einsum: the product of all index sizes."""
    equation = next(at.s.decode() for at in node.attribute if at.name == "equation")
    operands = equation.replace(" ", "").split("->")[0].split(",")
    sizes: dict[str, int] = {}
    for letters, name in zip(operands, node.input):
        shape = shapes.get(name)
        if shape is None or "." in letters or len(shape) != len(letters):
            return 0.0
        sizes.update(zip(letters, shape))
    return float(math.prod(list(sizes.values())))


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
