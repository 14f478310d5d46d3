"""Which inputs and outputs of a node carry its floating-point data, read from the op's schema.

A node computes in half precision by rebinding the type parameters of its schema that are float
here (Conv's `T`, Resize's `T1`) to float16 or bfloat16. Its other float operands keep their
type: Resize's `scales` is `tensor(float)` in every opset, its `roi` a parameter of its own
(`T2`). A parameter bound to float whose allowed types lack the half type (Conv in bfloat16
before opset 22) makes the node stay float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto

from .. import ir

HALF_TYPES = {"float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}
# each float type's tag in the names of the tensors the stage makes (NAME__as_f16, NAME@f32)
TYPE_TAGS: dict[int, str] = {
    TensorProto.FLOAT: "f32",
    TensorProto.DOUBLE: "f64",
    TensorProto.FLOAT16: "f16",
    TensorProto.BFLOAT16: "bf16",
}
# each float type's numpy dtype (ml_dtypes' for bfloat16)
NUMPY_TYPES: dict[int, np.dtype] = {
    TensorProto.FLOAT: np.dtype(np.float32), TensorProto.FLOAT16: np.dtype(np.float16),
    TensorProto.BFLOAT16: np.dtype(ml_dtypes.bfloat16),
}  # fmt: skip
# attributes that name the type an op makes, for a node whose output parameter is rebound
TYPE_ATTRIBUTES = {
    "Cast": "to", "EyeLike": "dtype", "RandomNormal": "dtype", "RandomUniform": "dtype",
    "RandomNormalLike": "dtype", "RandomUniformLike": "dtype", "Bernoulli": "dtype",
}  # fmt: skip
SUBGRAPH_OPS = {"If", "Loop", "Scan", "SequenceMap"}


@dataclass(frozen=True)
class DataSlots:
    """The positions of a node's float data: these become the half type when it runs in half."""

    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


class NoHalfForm(Exception):
    """The node cannot compute in the half type (the reason in the message)."""


def data_slots(node: onnx.NodeProto, opset: int, types: dict[str, int], half: int) -> DataSlots:
    """The inputs and outputs of `node` that follow its float data type (module doc), given the
    element `types` of tensors by name; NoHalfForm where it cannot run in `half`."""
    if node.domain not in ("", "ai.onnx"):
        raise NoHalfForm(f"an op of domain {node.domain}, left as it is")
    if node.op_type in SUBGRAPH_OPS:
        raise NoHalfForm("it holds a subgraph")
    schema = _schema(node.op_type, opset)
    if schema is None:
        raise NoHalfForm(f"no ONNX schema for {node.op_type} at opset {opset}")
    constraints = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    inputs = _formal_types(schema.inputs, len(node.input))
    outputs = _formal_types(schema.outputs, len(node.output))
    bound = {
        formal
        for names, formals in ((node.input, inputs), (node.output, outputs))
        for name, formal in zip(names, formals)
        if name and formal in constraints and types.get(name) == TensorProto.FLOAT
    }
    if node.op_type in TYPE_ATTRIBUTES or node.op_type == "ConstantOfShape":
        made = _made_type(node)
        if made == TensorProto.FLOAT:
            bound |= set(outputs)
    if not bound:
        raise NoHalfForm("no float data")
    wanted = "tensor(float16)" if half == TensorProto.FLOAT16 else "tensor(bfloat16)"
    lacking = sorted(formal for formal in bound if formal in constraints and wanted not in constraints[formal])
    if lacking:
        raise NoHalfForm(f"{node.op_type}-{schema.since_version} has no {wanted} form")
    return DataSlots(
        tuple(i for i, (name, formal) in enumerate(zip(node.input, inputs)) if name and formal in bound),
        tuple(i for i, (name, formal) in enumerate(zip(node.output, outputs)) if name and formal in bound),
    )


def _made_type(node: onnx.NodeProto) -> int | None:
    """The element type a type-making node writes (Cast's `to`, ConstantOfShape's value)."""
    for attribute in node.attribute:
        if node.op_type == "ConstantOfShape" and attribute.name == "value":
            return attribute.t.data_type
        if attribute.name == TYPE_ATTRIBUTES.get(node.op_type):
            return attribute.i
    return TensorProto.FLOAT if node.op_type == "ConstantOfShape" else None  # its default value is float 0


@cache
def _schema(op_type: str, opset: int):
    try:
        return onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return None


def _formal_types(formals, count: int) -> list[str]:
    """The type string of each of `count` actual operands (a variadic last formal repeats)."""
    if not formals:
        return [""] * count
    types = [formal.type_str for formal in formals[:count]]
    return types + [formals[-1].type_str] * (count - len(types))


def element_types(model: onnx.ModelProto, inferred: onnx.ModelProto | None = None) -> dict[str, int]:
    """The element type of every tensor of the main graph whose type ONNX can infer (from
    `inferred`, the model with its shapes inferred, where given)."""
    graph = (inferred or ir.infer_shapes(model, "the model")).graph
    types = {value.name: value.type.tensor_type.elem_type for value in (*graph.value_info, *graph.input, *graph.output)}
    types.update({tensor.name: tensor.data_type for tensor in model.graph.initializer})
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value":
                    types[node.output[0]] = attribute.t.data_type
                elif attribute.name in ("value_float", "value_floats"):
                    types[node.output[0]] = TensorProto.FLOAT
    return {name: elem for name, elem in types.items() if elem}
