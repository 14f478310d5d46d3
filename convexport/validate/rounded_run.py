"""The model with every value rounded to the half type: what half precision costs it by itself.

Every float32 tensor of the main graph (its inputs, each weight, each node's outputs) goes
through a Cast to the half type and back before anything reads it, and the rest is computed in
float32 on ONNX Runtime's CPU provider with its graph optimisations off (they would take the
Cast pairs out). A half model whose kernels round each output once and accumulate in float32
(CUDA's) computes about this, its weights rounded to nearest. On a model that amplifies
rounding through its depth (a deep plain chain of convolutions) this run is far from the exact
result however the half model is made, and a bound that only counts the float32 original's
error would keep most of it float32 (choose.py, step 4).

A subgraph's reads of outer values see them unrounded, and its own values are not rounded.

A model that computes in float16 already (a float16 checkpoint) is run as its float32 twin
(load/float32_twin.py: the same values, its interface kept): run as it is, ONNX Runtime's CPU
provider computes most of its nodes in float32 between Casts of its own, and its optimisations
take the Cast pairs out, so its float16 values would never be rounded.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from ..ir.slots import TYPE_TAGS, element_types
from ..load.float32_twin import float32_twin, holds_float16_weights, why_not_twinned
from ..runtime import checked_run, create_session

WHAT = "the model with every value rounded to half precision"
# how far this run may put an output, as a share of its largest value, for its error to count
# as the model's own noise in half precision: further, half precision loses the output (a
# difference of large terms: 110%; PP-OCRv4's detector on made-up inputs, whose probabilities
# half's range flushes to zero: 100%), where random-weight MobileOne-S0 is at 6% and trained
# OCR and YOLOv8 models at 0.1-2% (bench/RESULTS.md)
LOST_SHARE = 1 / 8


def rounded_runs(
    model: onnx.ModelProto,
    types: dict[str, int],
    half: int,
    feeds: list[dict[str, np.ndarray]],
    only: set[str] | None = None,
) -> list[dict[str, np.ndarray]]:
    """The outputs of `model` (`types` its tensors' element types by name) on each of `feeds`,
    every float32 value rounded to `half` (module doc; a float16 model's twin's), or only the
    tensors named in `only`, by output name."""
    if holds_float16_weights(model) and why_not_twinned(model) is None:
        model = float32_twin(model)
        types = element_types(model)
    rounded = _every_value_rounded(model, types, half, only)
    session = create_session(rounded, "cpu", optimize=False, what=WHAT, prepack=False)
    names = [output.name for output in model.graph.output]
    made = [output.name for output in rounded.graph.output]
    return [
        dict(zip(names, checked_run(lambda fed=fed: session.run(made, fed), fed, WHAT), strict=True)) for fed in feeds
    ]


def loses(rounded: np.ndarray, wanted: np.ndarray) -> bool:
    """Whether the rounded run's output is further than LOST_SHARE of its largest value from
    `wanted` (the exact result, or the float32 run), where both are finite."""
    rounded, wanted = np.asarray(rounded, np.float64), np.asarray(wanted, np.float64)
    both = np.isfinite(rounded) & np.isfinite(wanted)
    largest = float(np.abs(np.where(both, wanted, 0.0)).max(initial=0.0))
    return largest_apart(rounded, wanted) > LOST_SHARE * largest


def lost_outputs(rounded: list[dict], wanted: list[dict], names) -> set[str]:
    """Those of `names` that the rounded runs lose (loses) on some input set, each set's run
    against that set's `wanted` outputs (the exact result where there is one, else the float32
    run)."""
    return {name for run, want in zip(rounded, wanted) for name in names if loses(run[name], want[name])}


def largest_apart(rounded: np.ndarray, reference: np.ndarray) -> float:
    """max |rounded - reference| where both are finite: the rounded run's distance from a float32
    run of the model on an input set without an exact result (its noise there)."""
    rounded, reference = np.asarray(rounded, np.float64), np.asarray(reference, np.float64)
    both = np.isfinite(rounded) & np.isfinite(reference)
    return float(np.abs(np.where(both, rounded - reference, 0.0)).max(initial=0.0))


def _every_value_rounded(
    model: onnx.ModelProto, types: dict[str, int], half: int, only: set[str] | None = None
) -> onnx.ModelProto:
    """`model` with a Cast to `half` and back after each float32 tensor of its main graph (each
    of `only`, where given), read by every node in its place and given as the graph's output."""
    graph = model.graph
    tag = TYPE_TAGS[half]
    renamed: dict[str, str] = {}
    nodes: list[onnx.NodeProto] = []

    def round_trip(name: str) -> None:
        if types.get(name) == TensorProto.FLOAT and name not in renamed and (only is None or name in only):
            renamed[name] = f"{name}@rounded_{tag}"
            nodes.append(onnx.helper.make_node("Cast", [name], [f"{name}@{tag}"], to=half))
            nodes.append(onnx.helper.make_node("Cast", [f"{name}@{tag}"], [renamed[name]], to=TensorProto.FLOAT))

    for value in graph.input:
        round_trip(value.name)
    for tensor in graph.initializer:
        round_trip(tensor.name)
    for original in graph.node:
        node = onnx.NodeProto()
        node.CopyFrom(original)
        for position, name in enumerate(node.input):
            node.input[position] = renamed.get(name, name)
        nodes.append(node)
        for name in node.output:
            round_trip(name)
    outputs = [onnx.ValueInfoProto(name=renamed.get(value.name, value.name)) for value in graph.output]
    rounded = onnx.helper.make_graph(
        nodes, f"{graph.name}_rounded", list(graph.input), outputs, list(graph.initializer)
    )
    made = onnx.helper.make_model(rounded, opset_imports=model.opset_import, ir_version=model.ir_version)
    made.functions.extend(model.functions)
    return made
