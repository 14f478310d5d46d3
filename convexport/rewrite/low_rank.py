"""Low-rank branches left beside the dense layer they are added to, found in the rewritten graph.

A low-rank branch is two dense nodes in a row through a narrow width r, x [.., C] -> r -> D
with r at most a quarter of min(C, D) (LoRA's B A x, scaled or not), whose output an Add or
Sub sums with the output of another dense node of the same x (the layer it adapts, through a
bias, a scale or a Reshape, x itself maybe reshaped). Merged, the pair is W + B A: one
product instead of three. One left means the rules could not prove the merge exact (a shape
they could not see, a value read elsewhere), so the report says where, for a user to ask
`--explain linear-region@MODULE` why.
"""

from __future__ import annotations

import onnx
from onnx import numpy_helper

from ..ir import Provenance

RANK_SHARE = 4  # "far below its width": r <= min(C, D) / RANK_SHARE
_PASS_THROUGH = ("Mul", "Div", "Add", "Sub", "Reshape", "Flatten")  # by a constant: a scale, a bias, a view


def low_rank_branches_left(model: onnx.ModelProto, provenance: Provenance | None = None) -> list[dict]:
    """Each low-rank branch of the main graph added to a dense layer's output: the nodes (the
    pair and the sum), the widths, the layer beside it and the module they come from."""
    graph = _Graph(model.graph)
    found = []
    for node in model.graph.node:
        if node.op_type not in ("Add", "Sub") or len(node.input) != 2 or any(map(graph.is_constant, node.input)):
            continue
        for index in (0, 1):
            pair = graph.low_rank_pair(node.input[index])
            base = graph.dense_behind(node.input[1 - index])
            if pair is None or base is None or graph.source(pair[0][0]) != graph.source(base):
                continue
            (first, second), (c, r, d) = pair
            names = [first.name, second.name, node.name]
            module = provenance.enclosing_module(names) if provenance is not None else None
            found.append(
                {
                    "nodes": names,
                    "beside": base.name,
                    "in_features": c,
                    "rank": r,
                    "out_features": d,
                    "module": module,
                }
            )
            break
    return found


class _Graph:
    """What the scan needs of a graph: makers, constants' shapes, dense nodes' widths."""

    def __init__(self, graph: onnx.GraphProto):
        self.maker = {name: node for node in graph.node for name in node.output}
        self.shapes = {init.name: tuple(init.dims) for init in graph.initializer}
        for node in graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                self.shapes[node.output[0]] = tuple(numpy_helper.to_array(node.attribute[0].t).shape)
        self.inputs = {value.name for value in graph.input}

    def is_constant(self, name: str) -> bool:
        return name in self.shapes and name not in self.inputs

    def widths(self, node: onnx.NodeProto) -> tuple[int, int] | None:
        """(C, D) of a Gemm or a MatMul by a constant [C, D] matrix, else None."""
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2 or not self.is_constant(node.input[1]):
            return None
        shape = self.shapes[node.input[1]]
        if len(shape) != 2:
            return None
        trans_b = any(a.name == "transB" and a.i for a in node.attribute) if node.op_type == "Gemm" else False
        return (shape[1], shape[0]) if trans_b else shape

    def through_constants(self, name: str) -> onnx.NodeProto | None:
        """The first maker behind `name` that is not an op by a constant or a view."""
        node = self.maker.get(name)
        while node is not None and node.op_type in _PASS_THROUGH:
            data = [value for value in node.input if not self.is_constant(value)]
            if len(data) != 1:
                return node
            node = self.maker.get(data[0])
        return node

    def low_rank_pair(self, name: str):
        second = self.through_constants(name)
        outer = None if second is None else self.widths(second)
        if outer is None:
            return None
        first = self.maker.get(second.input[0])
        inner = None if first is None else self.widths(first)
        if inner is None or inner[1] != outer[0]:
            return None
        c, r, d = inner[0], inner[1], outer[1]
        return ((first, second), (c, r, d)) if r * RANK_SHARE <= min(c, d) else None

    def source(self, node: onnx.NodeProto) -> str:
        """The tensor a node's data input is a view of (Reshapes and Flattens undone)."""
        name = node.input[0]
        while (maker := self.maker.get(name)) is not None and maker.op_type in ("Reshape", "Flatten"):
            name = maker.input[0]
        return name

    def dense_behind(self, name: str) -> onnx.NodeProto | None:
        node = self.through_constants(name)
        return node if node is not None and self.widths(node) is not None else None
