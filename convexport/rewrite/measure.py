"""`--strategy measure`: a candidate rewrite's old nodes and its new nodes, each cut out as a
small ONNX model (the tensors they read from the rest of the graph become inputs, static
shapes with symbolic dims as 1), timed against each other in pairs on the target device with
ONNX Runtime, as the profile times whole graphs (profile/paired_timer.py), for at most about
MEASURE_BUDGET_S."""

from __future__ import annotations

import onnx

from .. import ir
from ..errors import ConvexportError
from ..ir import tensor_dtype
from ..load.inputs import InputSpec, random_inputs
from ..profile.profiler import time_models

MEASURE_BUDGET_S = 0.25


class Unmeasurable(Exception):
    """The nodes cannot be cut out and run on their own (an input of unknown shape, a
    symbolic dim whose stand-in 1 is too small for them)."""


def measure(
    old_nodes: list[ir.Node], old_outputs: list, new_nodes: list[ir.Node], new_outputs: list, opset: int, device: str
) -> dict:
    """{"before_ms", "after_ms", "runs", "pairs", "speedup", "low", "high"}: the two cut-out models'
    medians, and the paired speedup of the new nodes over the old with its 95% interval."""
    old_inputs = _outside_inputs(old_nodes)
    inputs = old_inputs + [t for t in _outside_inputs(new_nodes) if all(t is not seen for seen in old_inputs)]
    specs = [InputSpec(t.name, _static(t), str(tensor_dtype(t))) for t in inputs]
    models = {
        "before": _cut(old_nodes, inputs, old_outputs, opset),
        "after": _cut(new_nodes, inputs, new_outputs, opset),
    }
    try:
        timed = time_models(models, random_inputs(specs, seed=0), device, MEASURE_BUDGET_S)
    except ConvexportError as exc:  # no session, or no run: a 3x3 conv without padding at size 1, say
        raise Unmeasurable(str(exc)) from exc
    return {
        "before_ms": timed["before"],
        "after_ms": timed["after"],
        **{key: timed[key] for key in ("runs", "pairs", "speedup", "low", "high")},
    }


def _outside_inputs(nodes: list[ir.Node]) -> list[ir.Variable]:
    produced = {id(t) for node in nodes for t in node.outputs}
    found: list[ir.Variable] = []
    for node in nodes:
        for tensor in node.inputs:
            if (
                isinstance(tensor, ir.Variable)
                and tensor.name
                and id(tensor) not in produced
                and all(tensor is not seen for seen in found)
            ):
                found.append(tensor)
    return found


def _static(tensor: ir.Variable) -> tuple[int, ...]:
    if tensor.shape is None or tensor.dtype is None:
        raise Unmeasurable(f"{tensor.name} has no known shape")
    return tuple(d if isinstance(d, int) and d > 0 else 1 for d in tensor.shape)


def _cut(nodes: list[ir.Node], inputs: list[ir.Variable], outputs: list, opset: int) -> onnx.ModelProto:
    """The nodes as a model of their own (graph.nodes_as_model), inputs at static shapes."""
    if not nodes:
        raise Unmeasurable("no nodes to time")
    constants = {id(t): t for node in nodes for t in node.inputs if isinstance(t, ir.Constant)}
    return ir.nodes_as_model(
        nodes,
        [onnx.helper.make_tensor_value_info(t.name, _onnx_dtype(t), _static(t)) for t in inputs],
        [onnx.helper.make_tensor_value_info(t.name, _onnx_dtype(t), None) for t in outputs],
        list(constants.values()),
        opset,
        "cut",
    )


def _onnx_dtype(tensor) -> int:
    return onnx.helper.np_dtype_to_tensor_dtype(tensor_dtype(tensor))
