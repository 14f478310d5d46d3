"""What the instances `rules test` checked exercised: per op of a rule's pattern, the cases
its semantics turn on (a Pad's fill value with padding that pads, a MatMul of a 1-D input or
stacked weights, a Reshape's 0 and allowzero, a Transpose without perm, a Conv's groups and
dilations). A rule verified only where those cases did not occur has not been verified for
them: a Conv -> Pad fold that ignores the fill value passed 5,000 instances whose pads were
mostly all zero.

Features are read off the instance model (its nodes, constants and inferred shapes), so that
they say what the checked graph held, whatever the sampler meant to draw.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import numpy_helper

from .instances import CLASS_MEMBER_INPUTS

Feature = Callable[[onnx.NodeProto, "_Graph"], set[str]]


class _Graph:
    """The shapes and small constants of an instance model, by tensor name."""

    def __init__(self, model: onnx.ModelProto, feeds: dict[str, np.ndarray]):
        graph = model.graph
        self.shapes = {
            value.name: [dim.dim_value for dim in value.type.tensor_type.shape.dim]
            for value in (*graph.input, *graph.value_info, *graph.output)
            if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape")
        }
        self.constants = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
        for node in graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                self.constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        self.constants.update(feeds)  # a run-time input's value in this instance: its cases too
        for name, value in self.constants.items():
            self.shapes.setdefault(name, list(np.shape(value)))

    def rank(self, name: str) -> int | None:
        shape = self.shapes.get(name)
        return None if shape is None else len(shape)

    def value(self, node: onnx.NodeProto, index: int) -> np.ndarray | None:
        return self.constants.get(node.input[index]) if len(node.input) > index and node.input[index] else None


def _attr(node: onnx.NodeProto, name: str, default=None):
    for attribute in node.attribute:
        if attribute.name == name:
            return onnx.helper.get_attribute_value(attribute)
    return default


def _conv(node, graph) -> set[str]:
    rank = graph.rank(node.input[0])
    kernel = graph.shapes.get(node.input[1], [])[2:]
    groups = _attr(node, "group", 1)
    found = {f"{rank - 2}-D" if rank else "rank unknown"}
    found.add("bias" if len(node.input) > 2 and node.input[2] else "no bias")
    if groups > 1:
        found.add("depthwise" if groups == graph.shapes.get(node.input[0], [0, 0])[1] else "groups")
    if any(d > 1 for d in _attr(node, "dilations", [])):
        found.add("dilation")
    if any(s > 1 for s in _attr(node, "strides", [])):
        found.add("stride")
    if any(_attr(node, "pads", [])) or _attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        found.add("padding")
    found.add("1x1 kernel" if kernel and all(k == 1 for k in kernel) else "larger kernel")
    return found


def _pad(node, graph) -> set[str]:
    mode = _attr(node, "mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    pads = graph.value(node, 1)
    found = {f"mode {mode}"} | ({"axes"} if len(node.input) > 3 and node.input[3] else set())
    if pads is None:
        return found
    if not np.any(pads):
        return found | {"pads nothing"}
    found.add("pads")
    if np.any(pads < 0):
        found.add("crops")
    value = graph.value(node, 2)
    if mode == "constant" and np.any(pads > 0) and value is not None and np.any(value != 0):
        found.add("non-zero value")
    return found


def _gemm(node, graph) -> set[str]:
    found = {"transA"} if _attr(node, "transA", 0) else set()
    found |= {"transB"} if _attr(node, "transB", 0) else set()
    found |= {"alpha != 1"} if _attr(node, "alpha", 1.0) != 1.0 else set()
    found |= {"beta != 1"} if _attr(node, "beta", 1.0) != 1.0 and len(node.input) > 2 and node.input[2] else set()
    return found | ({"C"} if len(node.input) > 2 and node.input[2] else {"no C"})


def _matmul(node, graph) -> set[str]:
    a, b = graph.rank(node.input[0]), graph.rank(node.input[1])
    names = {1: "1-D", 2: "2-D"}
    return {f"{names.get(a, 'N-D')} input", {1: "vector weight", 2: "matrix weight"}.get(b, "stacked weight")}


def _reshape(node, graph) -> set[str]:
    target = graph.value(node, 1)
    found = {"allowzero"} if _attr(node, "allowzero", 0) else set()
    if target is None:
        return found
    found |= {"0 in shape"} if np.any(target == 0) else set()
    found |= {"-1 in shape"} if np.any(target == -1) else set()
    same = graph.shapes.get(node.input[0]) == graph.shapes.get(node.output[0])
    return found | {"same shape" if same else "new shape"}


def _transpose(node, graph) -> set[str]:
    perm = _attr(node, "perm")
    if perm is None:
        return {"no perm"}
    return {"identity perm" if list(perm) == sorted(perm) else "moves axes"}


def _elementwise(neutral: float) -> Feature:
    def features(node, graph) -> set[str]:
        constants = [graph.constants[name] for name in node.input if name in graph.constants]
        if not constants:
            return {"run-time operands"}
        value = constants[0]
        kind = "scalar" if value.size == 1 else "broadcast" if value.ndim and 1 in value.shape else "full"
        return {f"{kind} constant", "neutral constant" if np.all(value == neutral) else "changes values"}

    return features


def _average_pool(node, graph) -> set[str]:
    found = {"padding"} if any(_attr(node, "pads", [])) else set()
    found |= {"count_include_pad"} if _attr(node, "count_include_pad", 0) else set()
    found |= {"stride"} if any(s > 1 for s in _attr(node, "strides", [])) else set()
    return found | ({"ceil_mode"} if _attr(node, "ceil_mode", 0) else set())


def _slice(node, graph) -> set[str]:
    steps = graph.value(node, 4)
    found = {"axes"} if len(node.input) > 3 and node.input[3] else set()
    found |= {"step != 1"} if steps is not None and np.any(steps != 1) else set()
    same = graph.shapes.get(node.input[0]) == graph.shapes.get(node.output[0])
    return found | {"whole input" if same else "part"}


FEATURES: dict[str, Feature] = {
    "Conv": _conv,
    "Pad": _pad,
    "Gemm": _gemm,
    "MatMul": _matmul,
    "Reshape": _reshape,
    "Transpose": _transpose,
    "Add": _elementwise(0.0),
    "Sub": _elementwise(0.0),
    "Mul": _elementwise(1.0),
    "Div": _elementwise(1.0),
    "AveragePool": _average_pool,
    "Slice": _slice,
}

# Every case a feature function can name, per op: what a full run would show.
POSSIBLE: dict[str, tuple[str, ...]] = {
    "Conv": ("1-D", "2-D", "3-D", "bias", "no bias", "groups", "depthwise", "dilation", "stride", "padding",
             "1x1 kernel", "larger kernel"),
    "Pad": ("mode constant", "mode reflect", "mode edge", "pads", "pads nothing", "crops", "non-zero value", "axes"),
    "Gemm": ("transA", "transB", "alpha != 1", "beta != 1", "C", "no C"),
    "MatMul": ("1-D input", "2-D input", "N-D input", "vector weight", "matrix weight", "stacked weight"),
    "Reshape": ("allowzero", "0 in shape", "-1 in shape", "same shape", "new shape"),
    "Transpose": ("no perm", "identity perm", "moves axes"),
    **dict.fromkeys(("Add", "Sub", "Mul", "Div"), ("scalar constant", "broadcast constant", "full constant",
                                                   "neutral constant", "changes values")),
    "AveragePool": ("padding", "count_include_pad", "stride", "ceil_mode"),
    "Slice": ("axes", "step != 1", "whole input", "part"),
}  # fmt: skip

# The case in which a node of the op computes nothing worth checking: a rule verified only
# where every such node was in it has not been verified at all.
DEGENERATE = {
    "Pad": "pads nothing",
    "Transpose": "identity perm",
    "Add": "neutral constant",
    "Sub": "neutral constant",
    "Mul": "neutral constant",
    "Div": "neutral constant",
    "Slice": "whole input",
}


def instance_features(model: onnx.ModelProto, feeds: dict, ops: frozenset[str]) -> dict[str, set[str]]:
    """Per node of one of `ops` in the instance (by name): its features as "Op: case"."""
    graph = _Graph(model, feeds)
    return {
        node.name: {f"{node.op_type}: {case}" for case in FEATURES[node.op_type](node, graph)}
        for node in model.graph.node
        if node.op_type in ops and node.op_type in FEATURES
    }


def possible(rule) -> set[str]:
    """Every case of the ops of the rule's pattern that its lines and conditions leave open: a
    line `Pad[mode=constant]` cannot hold an edge Pad, a Gemm[transA=0] a transposed A, and
    `rank: {x: [3, 4]}` rules out a 3-D Conv of x."""
    cases = set()
    ranks = {name: set(allowed) for key, argument in (*rule.where, *rule.require) if key == "rank"
             for name, allowed in argument.items()}  # fmt: skip
    constants = {name for key, argument in (*rule.where, *rule.require) if key == "constant"
                 for name in (argument if isinstance(argument, list) else [argument])}  # fmt: skip
    for line in rule.pattern:
        fixed = dict(line.attributes)
        for op in line.op_types:
            for case in POSSIBLE.get(op, ()):
                rank = ranks.get(line.inputs[0].name) if line.inputs else None
                inputs = 1 + len(CLASS_MEMBER_INPUTS[line.op_type][op]) if line.is_class else len(line.inputs)
                if op == "Pad" and inputs is not None and inputs > 3:  # run-time axes leave no shape
                    axes = line.inputs[3]
                    inputs = inputs if axes.constant or axes.name in constants else 3
                constant = line.is_class or any(ref.constant or ref.name in constants for ref in line.inputs)
                if op in _ELEMENTWISE and not constant:
                    continue  # an Add of two run-time tensors has no constant to speak of
                if not _excluded(op, case, fixed, rank, inputs):
                    cases.add(f"{op}: {case}")
    return cases


# The input a case needs, by position: a line that does not name it cannot hold the case.
_NEEDS_INPUT = {("Pad", "axes"): 3, ("Pad", "non-zero value"): 2, ("Conv", "bias"): 2, ("Gemm", "C"): 2,
                ("Gemm", "beta != 1"): 2, ("Slice", "axes"): 3, ("Slice", "step != 1"): 4}  # fmt: skip


_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div"})


def _excluded(op: str, case: str, fixed: dict, ranks: set[int] | None, inputs: int | None) -> bool:
    if inputs is not None and (op, case) in _NEEDS_INPUT and inputs <= _NEEDS_INPUT[op, case]:
        return True
    if case.startswith("mode ") and "mode" in fixed:
        return case != f"mode {fixed['mode']}"
    if case in ("transA", "transB") and case in fixed:
        return not fixed[case]
    if op == "Conv" and case.endswith("-D") and ranks:
        return int(case[0]) + 2 not in ranks
    return False


def degenerate(features: dict[str, set[str]], ops: frozenset[str]) -> bool:
    """Whether some node of one of `ops` in the instance is in its op's degenerate case."""
    return any(f"{op}: {case}" in cases for cases in features.values() for op, case in DEGENERATE.items() if op in ops)
