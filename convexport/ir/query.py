"""Reading a gs graph: constant values, attributes with their ONNX schema defaults, dtypes,
absent optional inputs, and the model's ONNX opset."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnx_graphsurgeon as gs

DEFAULT_OPSET = 18  # what an older ONNX model is converted to, and assumed of one that declares none
# ops whose outputs carry none of their inputs' values, only their shape
SHAPE_ONLY_OPS = frozenset({"Shape", "Size"})


def onnx_opset(model: onnx.ModelProto) -> int | None:
    """The version of the default (ai.onnx) domain the model imports, None if it imports none."""
    return next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), None)


def is_static(shape) -> bool:
    """A shape whose every size is known (no symbolic or unknown dim); False for no shape."""
    return shape is not None and all(isinstance(dim, int) and dim >= 0 for dim in shape)


def tensor_dtype(tensor) -> np.dtype:
    """The numpy dtype of a gs tensor, float32 when unknown (numpy_dtype)."""
    return numpy_dtype(tensor.dtype)


def numpy_dtype(dtype) -> np.dtype:
    """The numpy dtype of a gs tensor's dtype, float32 for None (onnx-graphsurgeon keeps types
    numpy lacks, such as bfloat16, as ONNX type numbers: ml_dtypes supplies those)."""
    if dtype is None:
        return np.dtype(np.float32)
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(dtype) if isinstance(dtype, int) else dtype)


def is_absent(tensor) -> bool:
    """An omitted optional input: missing or the empty name."""
    return tensor is None or (isinstance(tensor, gs.Variable) and not tensor.name)


def is_constant(tensor) -> bool:
    """Whether constant_value(tensor) is not None, without loading the value."""
    if isinstance(tensor, gs.Constant):
        return True
    if isinstance(tensor, gs.Variable) and len(tensor.inputs) == 1:
        producer = tensor.inputs[0]
        return producer.op == "Constant" and producer.attrs.get("value") is not None
    return False


def constant_value(tensor) -> np.ndarray | None:
    """The value of an initializer or of a Constant node's output, read-only (a constant may be
    shared by other nodes: a fold computes new arrays, it never edits one in place); None for
    run-time tensors."""
    value = None
    if isinstance(tensor, gs.Constant):
        value = tensor.values
    elif is_constant(tensor):
        held = tensor.inputs[0].attrs["value"]
        value = held.values if isinstance(held, gs.Constant) else held
    if value is None:
        return None
    view = np.asarray(value).view()
    view.flags.writeable = False
    return view


NOT_IN_SCHEMA = object()  # the op has no such attribute at this opset


def attribute(node: gs.Node, name: str, opset: int):
    """The node's attribute, or the ONNX schema default when it is not set (None if the
    schema has no default, NOT_IN_SCHEMA if the op has no such attribute at this opset)."""
    if name in node.attrs:
        value = node.attrs[name]
        return tuple(value) if isinstance(value, list) else value
    return _schema_default(node.op, opset, node.domain or "", name)


@functools.lru_cache(maxsize=4096)
def _schema_default(op: str, opset: int, domain: str, name: str):
    try:
        schema = onnx.defs.get_schema(op, opset, domain)
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
