"""Half precision (`optimize --dtype fp16`): the rewritten float32 model, whose folded weights
were computed in float64 and stored once in float32, rounded once more into float16, node by
node where the measured error allows (choose.py), and judged against the exact result.

The stage's inputs are validation's: the original's float32 runs and its float64 reference on
the same input sets; the float64 run of the optimized graph on the first set gives the exact
value of every tensor the nodes are measured on. A model that is one If over two branches
(optimum's merged decoder) is converted branch by branch (branches.py).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx

from ..ir import heap
from ..ir.slots import element_types
from ..load.inputs import InputSets
from ..runtime import checked_run, create_session
from ..validate.exact_check import ExactReference, exact_reference
from ..validate.float64 import Float64Evaluator, Float64Unavailable
from .branches import in_half_by_branch
from .choose import HalfPrecision, HalfTarget, to_half_precision
from .kept import KeptFloat32
from .outputs import HalfRuns

DTYPES = {
    "fp16": "float16", "float16": "float16", "bf16": "bfloat16", "bfloat16": "bfloat16", "fp32": "float32",
    "float32": "float32",
}  # fmt: skip

__all__ = ["DTYPES", "HalfPrecision", "HalfTarget", "KeptFloat32", "in_half_precision"]


def in_half_precision(
    original: onnx.ModelProto,
    optimized: onnx.ModelProto,
    inputs: InputSets,
    exact: ExactReference | None,
    target: HalfTarget,
    original_runs=None,
    given: dict[str, tuple[onnx.TensorProto, str]] | None = None,
) -> HalfPrecision:
    """`optimized` converted for `target` (package doc), judged on the input sets validation
    used against `exact` (validation's float64 reference of `original`; computed here where
    validation did not run). `original_runs` are validation's runs of `original` on those sets
    (validate.ReferenceRuns): used where they were made on the target's device, rather than
    running the original again. The weights of `given` are rounded as given (an If's other
    branch rounded them: branches.py)."""
    from ..validate.runs import reference_runs

    def branch_in_half(branch: onnx.ModelProto, sets: InputSets, rounded) -> HalfPrecision:
        names = {node.name for node in branch.graph.node}
        own_fused = [(kernel, members) for kernel, members in target.fused if members <= names]
        return in_half_precision(branch, branch, sets, None, replace(target, fused=own_fused), given=rounded)

    by_branch = in_half_by_branch(optimized, inputs, branch_in_half)
    if by_branch is not None:
        return by_branch
    if original_runs is not None and original_runs.device == target.device:
        names, feeds, float32 = original_runs.names, original_runs.feeds, original_runs.outputs
    else:
        names, feeds, float32 = reference_runs(original, inputs, "the model as given", target.device)
    if exact is None:
        exact = exact_reference(original, feeds)
    exact_outputs = [
        dict(zip(names, exact.outputs[i] or [])) if exact.available(i) else None for i in range(len(feeds))
    ]
    judged_on = HalfRuns(feeds, [dict(zip(names, run)) for run in float32], exact_outputs)
    heap.release_after(optimized)  # validation's float64 evaluators, in cycles: before this stage's own
    values = _exact_values(optimized, feeds[0], exact.available(0))
    return to_half_precision(optimized, target, judged_on, values, given)


def _exact_values(model: onnx.ModelProto, feeds: dict, float64: bool) -> dict[str, np.ndarray]:
    """Every value the graph computes on `feeds`, and the feeds: the float64 run's, or where
    the float64 reference was left out (a model too large for its budget) the float32 run's, as
    float64. The weights are not among them: the nodes are measured on the model's own (a
    float64 copy of every weight held through the stage was twice the weights' bytes: 2 GiB
    more at the peak on a 1 GiB model)."""
    if float64:
        try:
            values = _float64_values(model, feeds)
        except Float64Unavailable:
            values = None
        heap.release_after(model)  # the evaluator's float64 weights, in a cycle with its ops
        if values is not None:
            return values
    return _float32_values(model, feeds)


def _float64_values(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    values = Float64Evaluator(model).run(feeds, intermediate=True)
    weights = {tensor.name for tensor in model.graph.initializer}
    return {name: value for name, value in values.items() if name not in weights}


def _float32_values(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    types = element_types(model)
    listed = onnx.ModelProto()
    listed.CopyFrom(model)
    present = {value.name for value in listed.graph.output}
    for node in listed.graph.node:
        for name in node.output:
            if name and name not in present and name in types:
                listed.graph.output.append(onnx.helper.make_tensor_value_info(name, types[name], None))
    session = create_session(listed, "cpu", optimize=False, what="the model", prepack=False)
    names = [value.name for value in session.get_outputs()]
    values = dict(zip(names, checked_run(lambda: session.run(names, feeds), feeds, "the model")))
    values.update(feeds)
    return {name: v.astype(np.float64) if v.dtype.kind == "f" else v for name, v in values.items()}
