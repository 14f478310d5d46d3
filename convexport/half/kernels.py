"""Which nodes ONNX Runtime has a bfloat16 kernel for, on the device the model is for.

ONNX Runtime's CPU provider runs a float16 node it has no kernel for between Casts of its own
(and the CUDA provider leaves such a node to the CPU one), so any float16 model loads. It does
no such thing for bfloat16: a session of a model with a bfloat16 MatMul fails on the CPU
provider, which has bfloat16 kernels for a handful of ops (Transpose, Concat,
LayerNormalization, Identity, Cast in ONNX Runtime 1.31). So for bfloat16 each kind of node
(its op, opset and operand types) is asked once: a session of that node alone, its data in
bfloat16; a node whose session fails stays float32, with ONNX Runtime's reason.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto

from ..errors import ConvexportError
from ..ir.slots import DataSlots
from ..runtime import CPU, CUDA, MissingKernel, create_session, ort_reason
from .convert import retype_attributes

PROBED = {TensorProto.BFLOAT16}


def lacking_kernels(
    model: onnx.ModelProto, candidates: dict[int, DataSlots], types: dict[str, int], half: int, device: str
) -> dict[int, str]:
    """The candidates (node index -> data slots) that cannot run in `half` on `device`, with
    why: node index -> reason. Empty for a type every provider falls back for (float16)."""
    if half not in PROBED:
        return {}
    verdicts: dict[tuple, str | None] = {}
    lacking = {}
    for index, slots in candidates.items():
        node = model.graph.node[index]
        alone = _alone(model, node, slots, types, half)
        key = _signature(alone)
        if key not in verdicts:
            verdicts[key] = _refusal(alone, device, half)
        refusal = verdicts[key]
        if refusal is not None:
            lacking[index] = refusal
    return lacking


def _alone(model: onnx.ModelProto, node: onnx.NodeProto, slots: DataSlots, types, half: int) -> onnx.ModelProto:
    """`node` by itself, every operand a graph input or output of its type (its data in `half`)."""
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    retype_attributes(copy, half)
    inputs, outputs = [], []
    for position, name in enumerate(copy.input):
        if name:
            kind = half if position in slots.inputs else types.get(name, TensorProto.UNDEFINED)
            copy.input[position] = f"in{position}"
            inputs.append(onnx.helper.make_tensor_value_info(f"in{position}", kind, None))
    for position, name in enumerate(copy.output):
        if name:
            kind = half if position in slots.outputs else types.get(name, TensorProto.UNDEFINED)
            copy.output[position] = f"out{position}"
            outputs.append(onnx.helper.make_tensor_value_info(f"out{position}", kind, None))
    graph = onnx.helper.make_graph([copy], "alone", inputs, outputs)
    return onnx.helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)


def _signature(alone: onnx.ModelProto) -> tuple:
    """What a kernel is chosen by: the op, its domain, and its operands' types."""
    node, graph = alone.graph.node[0], alone.graph
    return (
        node.op_type,
        node.domain,
        tuple(value.type.tensor_type.elem_type for value in graph.input),
        tuple(value.type.tensor_type.elem_type for value in graph.output),
    )


def _refusal(alone: onnx.ModelProto, device: str, half: int) -> str | None:
    """Why ONNX Runtime cannot make a session of the node alone, or None where it can."""
    kind = onnx.helper.tensor_dtype_to_np_dtype(half).name
    try:
        create_session(alone, device, optimize=False, what=f"it alone in {kind}", prepack=False)
    except MissingKernel:
        provider = CUDA if device == "cuda" else CPU
        return f"ONNX Runtime's {provider} has no {kind} kernel for {alone.graph.node[0].op_type}"
    except ConvexportError as problem:
        return str(problem)
    except Exception as exc:  # a reason ONNX Runtime words its own way
        return f"ONNX Runtime cannot load it alone in {kind}: {ort_reason(exc)}"
    return None
