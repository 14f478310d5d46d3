"""The float64 reference checked against ONNX Runtime, node by node, on the model it judges.

A float64 kernel that computes something else than ONNX Runtime's (ONNX's BatchNormalization
below opset 14 normalised with the batch's own statistics) makes the original's float32 run look
far from the "exact" result; the bound the optimized graph must meet grows with it, and a wrong
model could pass. Whatever the kernel, this shows it: ONNX Runtime runs the model in float32 with
every intermediate value kept; then each node of the float64 graph runs on ONNX Runtime's own
float32 inputs to it, widened. The two results then differ only by one op's float32 rounding:

    |y_ort - y_64| <= NODE_ULPS[dtype] * u[dtype] * max(|y_64|, rms(y_64))

per element, u the unit roundoff of the type ONNX Runtime computed in (integer and boolean
outputs equal; NaN where NaN, the same infinity). The first node beyond that is where the
reference is suspect; validation then judges by the stricter of the two checks (validate/compare.py).
For float32, 256 units (1.5e-5): a float32 Conv, MatMul or reduction over a few thousand terms is
within 30 of them, and the smallest kernel fault seen (BatchNormalization, 0.128) is 8,000 times
over. Half types get 16 of theirs (float16: 7.8e-3): their kernels accumulate in float32 and
round once.

Nodes with subgraphs (If, Loop, Scan) or linked attributes are not run alone: their own
nodes are not exposed by ONNX Runtime either. Ops whose result is drawn at random are skipped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import onnx

from ...report import types as report_types
from . import Float64Evaluator, widen_array
from .precision import UNIT_ROUNDOFF, dtype_name, rms

NODE_ULPS = {"float32": 256, "float16": 16, "bfloat16": 16, "float64": 256}
NODE_RTOL = NODE_ULPS["float32"] * 2.0**-24  # the float32 tolerance, for the tests' tables
_RANDOM_OPS = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial",
               "Dropout"}  # fmt: skip


@dataclass(frozen=True)
class NodeDisagreement:
    """A node whose float64 kernel and ONNX Runtime's float32 one disagree beyond rounding on
    the same inputs."""

    node: str
    op: str
    output: str
    difference: float  # max |y_ort - y_64| / max(|y_64|, rms(y_64)); inf for unequal integers or shapes

    def describe(self) -> str:
        size = "unequal" if self.difference == np.inf else f"{self.difference:.3g} apart (relative)"
        return f"node {self.node!r} ({self.op}) and ONNX Runtime's are {size} on the same inputs"

    def to_report(self) -> report_types.NodeDisagreement:
        return {"node": self.node, "op": self.op, "output": self.output, "difference": self.difference}


@dataclass
class NodeCheck:
    """What the node-by-node check found: how many nodes it ran, and the first that disagreed."""

    nodes_checked: int
    disagreement: NodeDisagreement | None
    stopped_at: int | None = None  # where the check stopped at its deadline: of how many nodes


def tolerance(value: np.ndarray) -> float:
    """How far (relative to the scale) an ONNX Runtime value of this type may be from the float64
    kernel's (module doc)."""
    name = dtype_name(value)
    return NODE_ULPS.get(name, NODE_ULPS["float32"]) * UNIT_ROUNDOFF.get(name, UNIT_ROUNDOFF["float32"])


def disagreement(float32: np.ndarray, float64: np.ndarray, within: float = 0.0) -> float:
    """How far an ONNX Runtime value is from the float64 kernel's, relative to the value's scale
    (module doc); inf for unequal shapes or integers, a mismatched special value. Where the
    largest difference over the rms is already `within` (a bound on every element's measure,
    whose divisor is never below the rms), that bound is returned without the element-by-element
    measure: a yolov9t's node check spent 40% of its time on it."""
    float32, float64 = np.asarray(float32), np.asarray(float64)
    if float32.shape != float64.shape:
        return np.inf
    if float32.dtype.kind not in "fc" and float32.dtype.name != "bfloat16":
        return 0.0 if np.array_equal(float32, float64) else np.inf
    ours = widen_array(float32)
    exact = float64.astype(np.float64, copy=False)
    if within and exact.size:
        with np.errstate(invalid="ignore", over="ignore"):  # an infinity in both: NaN, measured below
            largest = float(np.max(np.abs(ours - exact)))
        flat = exact.reshape(-1)
        scale = float(np.sqrt(np.dot(flat, flat) / flat.size))  # inf or NaN where the exact slow path is needed
        if np.isfinite(largest) and np.isfinite(scale) and largest <= within * scale:
            return largest / scale if scale > 0 else 0.0
    finite = np.isfinite(exact) & np.isfinite(ours)
    special = ~finite & ~((np.isnan(exact) & np.isnan(ours)) | (exact == ours))
    if special.any():
        return np.inf
    if not finite.any():
        return 0.0
    scale = max(rms(exact[finite]), np.finfo(np.float64).tiny)
    ours, exact = ours[finite], exact[finite]
    return float((np.abs(ours - exact) / np.maximum(np.abs(exact), scale)).max())


def check_nodes(
    model: onnx.ModelProto, feeds: dict, evaluator: Float64Evaluator | None = None, deadline: float | None = None
) -> NodeCheck:
    """Each node of `model`'s float64 graph run on ONNX Runtime's float32 inputs to it, against
    ONNX Runtime's output (module doc), in graph order up to the first disagreement, or up to
    `deadline` (time.perf_counter()'s: `stopped_at` then says of how many nodes)."""
    values = _runtime_values(model, feeds)
    evaluator = evaluator or Float64Evaluator(model)
    constants = evaluator.evaluator.rt_inits_
    checked = 0
    nodes = evaluator.evaluator.rt_nodes_
    for node in nodes:
        if deadline is not None and time.perf_counter() > deadline:
            return NodeCheck(checked, None, stopped_at=len(nodes))
        outputs = [name for name in node.output if name]
        if node.op_type in _RANDOM_OPS or node.need_context() or node.has_linked_attribute:
            continue
        if not outputs or not all(name in values for name in outputs):
            continue
        try:
            inputs = [_input(name, values, constants) for name in node.input]
        except KeyError:  # an input ONNX Runtime does not expose (a subgraph's outer value)
            continue
        try:
            with np.errstate(all="ignore"):
                results = node.run(*inputs)
        except Exception:  # a kernel that refuses ONNX Runtime's values (the float64 run had its own)
            continue
        checked += 1
        for name, result in zip(node.output, results):
            if not name or not isinstance(result, np.ndarray):
                continue
            allowed = tolerance(np.asarray(values[name]))
            difference = disagreement(values[name], result, allowed)
            if difference > allowed:
                return NodeCheck(checked, NodeDisagreement(node.onnx_node.name or name, node.op_type, name, difference))
    return NodeCheck(checked, None)


def _input(name: str, values: dict, constants: dict):
    if not name:
        return None
    if name in values:
        return widen_array(values[name])
    return constants[name]


def _runtime_values(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    """Every value of the main graph as ONNX Runtime computes it in the model's own precision
    (graph optimisations off, as validation runs it): the feeds, then each node's outputs."""
    from ...runtime import create_session

    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    known = {output.name for output in exposed.graph.output}
    for node in exposed.graph.node:
        for name in node.output:
            if name and name not in known:
                exposed.graph.output.append(onnx.ValueInfoProto(name=name))
                known.add(name)
    session = create_session(
        exposed, "cpu", optimize=False, what="the original model's values", tf32=False, prepack=False
    )
    names = [output.name for output in session.get_outputs() if output.type.startswith("tensor(")]
    found = dict(zip(names, session.run(names, feeds)))
    return {**feeds, **found}
