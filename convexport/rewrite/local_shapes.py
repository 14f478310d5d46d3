"""Shapes for the tensors a pass created, without exporting the whole graph: the new nodes are
cut out as a small model (what they read from the rest of the graph becomes its inputs, with
the shapes the graph knows) and ONNX shape inference runs on that alone."""

from __future__ import annotations

import onnx

from .. import ir
from ..ir import tensor_dtype

# Constants up to this size go into the cut as values (shape inference reads those of shape-like
# inputs: Reshape's shape, Slice's starts); larger ones as typed inputs, so nothing big is copied.
VALUE_LIMIT_BYTES = 1 << 16


def infer_new_shapes(nodes: list[ir.Node], opset: int) -> list[ir.Variable]:
    """Set the shape (and a missing dtype) of every output of `nodes` that has none, as far as
    ONNX shape inference can tell from the nodes and the shapes of what they read; return the
    tensors that got one."""
    pending = {
        t.name: t for node in nodes for t in node.outputs if isinstance(t, ir.Variable) and t.name and t.shape is None
    }
    if not pending:
        return []
    try:  # a convenience: what stays unshaped is inferred after the export
        inferred = onnx.shape_inference.infer_shapes(
            _cut(nodes, pending, opset), check_type=False, strict_mode=False, data_prop=True
        )
    except Exception:  # (an input type ONNX cannot name, an op outside the ONNX domain)
        return []
    shaped = []
    for value in [*inferred.graph.value_info, *inferred.graph.output]:
        tensor = pending.get(value.name)
        kind = value.type.tensor_type
        if tensor is None or not value.type.HasField("tensor_type") or not kind.HasField("shape"):
            continue
        tensor.shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in kind.shape.dim]
        if tensor.dtype is None and kind.elem_type:
            tensor.dtype = onnx.helper.tensor_dtype_to_np_dtype(kind.elem_type)
        shaped.append(tensor)
    return shaped


def _cut(nodes: list[ir.Node], pending: dict, opset: int) -> onnx.ModelProto:
    """The nodes as a model: what they read from elsewhere as inputs (small constants as values),
    the pending tensors as outputs."""
    cut = _with_constant_producers(nodes)
    produced = {id(t) for node in cut for t in node.outputs}
    inputs, constants, seen = [], [], set()
    for node in cut:
        for tensor in node.inputs:
            if id(tensor) in produced or id(tensor) in seen or not tensor.name:
                continue
            seen.add(id(tensor))
            if isinstance(tensor, ir.Constant) and _small(tensor):
                constants.append(tensor)
            else:
                inputs.append(_value_info(tensor))
    return ir.nodes_as_model(
        cut,
        inputs,
        [onnx.helper.make_tensor_value_info(name, 0, None) for name in pending],
        constants,
        opset,
        "new_nodes",
    )


def _with_constant_producers(nodes: list[ir.Node]) -> list[ir.Node]:
    """The nodes and, first, the Constant nodes outside them whose outputs they read."""
    inside = {id(node) for node in nodes}
    extra: dict[int, ir.Node] = {}
    for node in nodes:
        for tensor in node.inputs:
            for producer in tensor.inputs if isinstance(tensor, ir.Variable) else ():
                if producer.op == "Constant" and id(producer) not in inside:
                    extra[id(producer)] = producer
    return [*extra.values(), *nodes]


def _small(constant: ir.Constant) -> bool:
    return getattr(constant.values, "nbytes", VALUE_LIMIT_BYTES + 1) <= VALUE_LIMIT_BYTES


def _value_info(tensor) -> onnx.ValueInfoProto:
    shape = (
        None
        if tensor.shape is None
        else [d if (isinstance(d, int) and d >= 0) or isinstance(d, str) else None for d in tensor.shape]
    )
    return onnx.helper.make_tensor_value_info(
        tensor.name, onnx.helper.np_dtype_to_tensor_dtype(tensor_dtype(tensor)), shape
    )
