"""How far half precision puts each node, and each output, from the exact result.

A node's own error is measured with its inputs exact: every candidate node is copied into one
"exploded" model where it reads graph inputs fed with the exact values of its inputs (the
float64 run's, rounded into the type it reads them in) and writes graph outputs, so no node's
error reaches another. The exploded model runs on ONNX Runtime, on the device the model is
for: once with the half type in the node's data operands (its weights rounded once), once in
float32, and for the nodes over their bound once more in float32 on their inputs rounded to
half (whether rounding its inputs is what puts a node off, rather than its own arithmetic).
Each output is judged as validation judges a model (exact_check.judge): the half run may be off
the exact result by FACTOR times the float32 run's own error plus FLOOR_ULPS units of the half
type's roundoff of the output's scale. What a kernel does in half (ONNX Runtime's CPU provider
computes a float16 Conv in float32 between Casts, CUDA's in float16 with float32 accumulation,
an ARM CPU's MLAS in float16) is what is measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto

from ..ir.slots import NUMPY_TYPES, TYPE_TAGS, DataSlots
from ..runtime import checked_run, create_session
from ..validate.exact_check import judge
from .convert import retype_attributes
from .rounding import WeightRounding

FLOAT = TensorProto.FLOAT
# types ONNX Runtime's Python API cannot feed nor return: fed as float32 (the values exact in
# it) and cast inside the exploded model, its outputs cast back to float32 (exactly) there
CAST_AT_EDGES = {TensorProto.BFLOAT16}
# the exact values an exploded model is fed at once: more nodes are measured in more sessions
EXPLODED_BYTES = 256 << 20


@dataclass
class NodeError:
    """A node's largest error in half against the exact result, with its inputs exact, the bound
    it had to meet and its float32 error on the same inputs."""

    error: float
    bound: float
    error_float32: float
    # its exact output is beyond the half type's range, or half gives an infinity or NaN where
    # the exact result is finite: what that does is for the outputs to say (choose.py)
    out_of_range: bool = False
    # in float32 on its inputs rounded to half it is still over the bound: the rounding of its
    # inputs is what puts it there (a Softmax of large logits), not its own arithmetic
    from_inputs: bool = False

    @property
    def ratio(self) -> float:
        """How many times its bound the error is."""
        return self.error / self.bound if self.bound > 0 else (0.0 if self.error == 0 else float("inf"))


def node_errors(
    model: onnx.ModelProto,
    candidates: dict[int, DataSlots],
    values: dict[str, np.ndarray],
    rounding: WeightRounding,
    device: str,
) -> dict[int, NodeError]:
    """Each candidate node's NodeError (module doc), measured on `values`, the exact value of
    every tensor the graph computes and of its inputs, by name (the weights are the model's,
    rounded into the half type by `rounding` as the attempts round them); a node whose inputs
    have no exact value is left out."""
    weights = {tensor.name: tensor for tensor in model.graph.initializer}
    known = values.keys() | weights.keys()
    measurable = {i: s for i, s in candidates.items() if all(not n or n in known for n in model.graph.node[i].input)}
    errors: dict[int, NodeError] = {}
    half = rounding.half
    dtype = onnx.helper.tensor_dtype_to_np_dtype(half).name
    for chunk in _chunks(model, measurable, values, weights):
        float_runs = _run_exploded(model, chunk, values, device)
        half_runs = _run_exploded(model, chunk, values, device, rounding)
        worst = _worst_outputs(model, chunk, values, half_runs, float_runs, half)
        # whether rounding its inputs is what puts a node over its bound is asked of those over
        # it alone: a third session of the chunk's weights, for most models none
        over = {i: chunk[i] for i, (error, _) in worst.items() if error.ratio > 1 and not error.out_of_range}
        if over:
            rounded_in = _run_exploded(model, over, values, device, inputs_in=half)
            for index in over:
                error, position = worst[index]
                exact = values[model.graph.node[index].output[position]]
                ours, theirs = rounded_in[(index, position)], float_runs[(index, position)]
                error.from_inputs = judge(theirs, ours, exact, None, dtype).beyond > 0
        errors.update({index: error for index, (error, _) in worst.items()})
    return errors


def _worst_outputs(model, chunk, values, half_runs, float_runs, half: int) -> dict[int, tuple[NodeError, int]]:
    """Each node's output furthest over its bound (NodeError, output position), its inputs exact."""
    dtype = onnx.helper.tensor_dtype_to_np_dtype(half).name
    largest = float(ml_dtypes.finfo(NUMPY_TYPES[half]).max) if half in NUMPY_TYPES else float("inf")
    worst = {}
    for index, slots in chunk.items():
        node = model.graph.node[index]
        verdicts = []
        for position in slots.outputs:
            exact = values.get(node.output[position])
            if exact is None or (index, position) not in half_runs:
                continue
            ours, theirs = half_runs[(index, position)], float_runs[(index, position)]
            verdict = judge(theirs, ours, exact, None, dtype)
            finite = np.isfinite(exact)
            beyond = np.abs(np.where(finite, exact, 0.0)) > largest
            overflow = bool(np.any(beyond | (~np.isfinite(ours.astype(np.float64)) & finite)))
            verdicts.append((NodeError(verdict.error, verdict.bound, verdict.error_original, overflow), position))
        if verdicts:
            worst[index] = max(verdicts, key=lambda verdict: verdict[0].ratio)
    return worst


def _chunks(model, candidates: dict[int, DataSlots], values, weights) -> list[dict[int, DataSlots]]:
    """The candidates in groups whose inputs, fed and weights, are EXPLODED_BYTES or less in
    float32 (a node over it alone is a group of its own)."""
    chunks: list[dict[int, DataSlots]] = []
    current: dict[int, DataSlots] = {}
    size = 0
    for index, slots in candidates.items():
        node = model.graph.node[index]
        need = sum(_float32_bytes(name, values, weights) for name in node.input if name)
        if current and size + need > EXPLODED_BYTES:
            chunks.append(current)
            current, size = {}, 0
        current[index] = slots
        size += need
    if current:
        chunks.append(current)
    return chunks


def _float32_bytes(name: str, values, weights) -> int:
    if name in weights:
        return math.prod(weights[name].dims) * 4
    return values[name].size * 4 if name in values else 0


def _run_exploded(
    model,
    chunk: dict[int, DataSlots],
    values,
    device: str,
    rounding: WeightRounding | None = None,
    inputs_in: int | None = None,
) -> dict[tuple, np.ndarray]:
    """The chunk's nodes run apart (module doc), their data operands in float32 or, given
    `rounding`, in its half type (the weights rounded by it), the values fed rounded to
    `inputs_in` first, where given: (node index, output position) -> the output."""
    elem = FLOAT if rounding is None else rounding.half
    graph = model.graph
    stored = {tensor.name: tensor for tensor in graph.initializer}
    initializers, inputs, feeds, nodes, outputs = {}, {}, {}, [], {}
    for index, slots in chunk.items():
        node = onnx.NodeProto()
        node.CopyFrom(graph.node[index])
        node.name = f"measured_{index}"
        if elem != FLOAT:
            retype_attributes(node, elem)
        for position, name in enumerate(node.input):
            if not name:
                continue
            in_data = position in slots.inputs
            if name in stored:
                if in_data and rounding is not None:  # (elem: its half type)
                    renamed = f"{name}@rounded"
                    if renamed not in initializers:
                        initializers[renamed] = _rounded_initializer(stored[name], renamed, rounding)
                    node.input[position] = renamed
                else:
                    initializers.setdefault(name, stored[name])
                continue
            value = values[name]
            is_float = value.dtype == np.float64
            elem_type = elem if in_data else (FLOAT if is_float else None)
            tag = TYPE_TAGS.get(elem_type, "as_is") if elem_type is not None else "as_is"
            fed = f"{name}@{tag}"
            # each input declared with the shape it is fed: ONNX Runtime's inference reads a
            # Resize's `sizes` of unknown shape beside a constant X as empty, and refuses the model
            if fed not in inputs:  # (keyed by the name the node reads)
                with np.errstate(over="ignore"):  # beyond half's range: an infinity, as the model would make
                    rounded = value.astype(NUMPY_TYPES[inputs_in]) if in_data and inputs_in is not None else value
                    array = rounded.astype(NUMPY_TYPES[elem_type]) if is_float and elem_type is not None else value
                if elem_type in CAST_AT_EDGES:
                    nodes.append(onnx.helper.make_node("Cast", [f"{fed}@f32"], [fed], to=elem_type))
                    feeds[f"{fed}@f32"] = array.astype(np.float32)
                    inputs[fed] = onnx.helper.make_tensor_value_info(f"{fed}@f32", FLOAT, array.shape)
                else:
                    feeds[fed] = array
                    inputs[fed] = onnx.helper.make_tensor_value_info(fed, _elem_of(array), array.shape)
            node.input[position] = fed
        for position, name in enumerate(node.output):
            if name:
                node.output[position] = f"{name}@out{index}"
                if position in slots.outputs:
                    outputs[(index, position)] = node.output[position]
        nodes.append(node)
    if elem in CAST_AT_EDGES:
        for key, name in outputs.items():
            nodes.append(onnx.helper.make_node("Cast", [name], [f"{name}@f32"], to=FLOAT))
            outputs[key] = f"{name}@f32"
    made = FLOAT if elem in CAST_AT_EDGES else elem
    exploded = onnx.helper.make_graph(
        nodes, "exploded", list(inputs.values()),
        [onnx.helper.make_tensor_value_info(name, made, None) for name in outputs.values()],
        list(initializers.values()),
    )  # fmt: skip
    measured = onnx.helper.make_model(exploded, opset_imports=model.opset_import, ir_version=model.ir_version)
    measured.functions.extend(model.functions)
    session = create_session(measured, device, what="the nodes measured in half precision", prepack=False)
    names = list(outputs.values())
    results = checked_run(lambda: session.run(names, feeds), feeds, "the nodes measured in half precision")
    return {key: np.asarray(result) for key, result in zip(outputs, results)}


def _rounded_initializer(tensor: onnx.TensorProto, name: str, rounding: WeightRounding) -> onnx.TensorProto:
    tensor = rounding.rounded(tensor)
    tensor.name = name
    return tensor


def _elem_of(array: np.ndarray) -> int:
    return onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
