"""The subgraphs ONNX Runtime fuses into one kernel, found before the rules run, so that a
rewrite does not take a node out of one.

A rule may fold a node that belongs to such a subgraph into a neighbour: `affine-dense-bias`
folds GELU's trailing `* 0.5` into the next Linear, `affine-dense` a decomposed LayerNorm's
gamma. The fold is exact and removes a node, but ONNX Runtime then no longer recognises the
pattern, and the separate Erf, Div, Add and Mul nodes it leaves run slower than the one Gelu
kernel would (bench/RESULTS.md, "Adapters and detectors against their hand forms"). So under
--strategy cost and measure such a rewrite is refused and the report says which fusion it
kept; under --strategy all it is made and the report says which fusion it broke.

The patterns are ONNX Runtime's graph transformers' (onnxruntime/core/optimizer), which run on
the CPU and CUDA providers alike (the devices convexport targets):

    Gelu                         x * 0.5 * (1 + erf(x / sqrt 2)), in the orders exporters write
                                 (gelu_fusion.cc); not x * (1 / sqrt 2), which ONNX Runtime 1.31
                                 leaves unfused
    FastGelu                     x * 0.5 * (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
                                 (fast_gelu_fusion.cc): the nodes from the Tanh to its end
    LayerNormalization           (x - mean) / sqrt(var + eps) * gamma + beta
                                 (layer_norm_fusion.cc), var as mean((x - mean)^2)
    SimplifiedLayerNormalization x / sqrt(mean(x^2) + eps) * gamma, RMSNorm (the same file),
                                 also x * (1 / sqrt(.)) as torch's rsqrt exports; a gamma of
                                 ones too (a fresh model's): the fusion needs its Mul

A pattern is kept whole: all of its nodes, the constant scale and shift at its end included.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .. import ir
from ..ir import constant_value
from ..report import types as report_types


@dataclass(frozen=True)
class Fusion:
    """One subgraph the runtime fuses: its kind (the fused op) and its nodes; `by_optimizer`
    where ONNX Runtime's transformer optimizer fuses it (a pass users run after convexport),
    not the runtime's own graph transformers."""

    kind: str
    nodes: tuple[ir.Node, ...]
    by_optimizer: bool = False

    @property
    def names(self) -> list[str]:
        return [node.name for node in self.nodes]


class RuntimeFusions:
    """The fusions of a graph, by node; those a rewrite broke (under --strategy all) are gone.
    `measured`: (kind, node names) of the kernels ONNX Runtime's transformer optimizer made of
    the graph (rewrite/transformer_fusions.py), kept whole besides those found by pattern here."""

    def __init__(self, graph: ir.Graph, measured=()):
        self.fusions = _named_fusions(graph, measured) + find_fusions(graph)
        self._by_node = {id(node): fusion for fusion in self.fusions for node in fusion.nodes}

    def touched(self, nodes) -> Fusion | None:
        """The first intact fusion that holds one of `nodes`."""
        return next((self._by_node[id(node)] for node in nodes if id(node) in self._by_node), None)

    def broken(self, fusion: Fusion) -> None:
        for node in fusion.nodes:
            self._by_node.pop(id(node), None)


def _named_fusions(graph: ir.Graph, measured) -> list[Fusion]:
    """A Fusion of each measured kernel, of its nodes still in the graph (in graph order)."""
    if not measured:
        return []
    nodes = [node for scope in ir.all_graphs(graph) for node in scope.nodes]
    fusions = []
    for kind, names in measured:
        members = tuple(node for node in nodes if node.name in names)
        if members:
            fusions.append(Fusion(kind, members, by_optimizer=True))
    return fusions


def find_fusions(graph: ir.Graph) -> list[Fusion]:
    """Every fusable subgraph of the graph (and its subgraphs), each node in at most one."""
    found, taken = [], set()
    for scope in ir.all_graphs(graph):
        for node in scope.nodes:
            finder = _FINDERS.get(node.op)
            fusion = finder(node) if finder else None
            if fusion is not None and not any(id(member) in taken for member in fusion.nodes):
                found.append(fusion)
                taken.update(id(member) for member in fusion.nodes)
    return found


# --- the patterns, each found from one anchor node -------------------------------------


def _gelu(erf: ir.Node) -> Fusion | None:
    """From the Erf: Div(x, sqrt 2) before it; Add 1, then either Mul(x, .) and Mul(., 0.5),
    or Mul(Mul(x, 0.5), .), after it."""
    scaled = _maker(erf.inputs[0])
    if scaled is None or scaled.op != "Div" or constant_value(scaled.inputs[0]) is not None:
        return None
    x, k = _data_and_constant(scaled)
    if x is None or not _close(k, math.sqrt(2.0)):
        return None
    tail = _one_plus_times(erf)
    if tail is None:
        return None
    plus_one, product = tail
    other = _other_input(product, plus_one.outputs[0])
    if other is x:  # x * (1 + erf) then * 0.5
        half = _only_reader(product.outputs[0], "Mul")
        if half is None or not _close(_data_and_constant(half)[1], 0.5):
            return None
        return Fusion("Gelu", (scaled, erf, plus_one, product, half))
    half = _maker(other)  # (x * 0.5) * (1 + erf)
    if half is None or half.op != "Mul":
        return None
    data, k = _data_and_constant(half)
    if data is not x or not _close(k, 0.5):
        return None
    return Fusion("Gelu", (scaled, erf, plus_one, half, product))


def _fast_gelu(tanh: ir.Node) -> Fusion | None:
    """From the Tanh: its Add 1 and the Mul (or two) after it, and the scale by sqrt(2 / pi)
    before it (the cubic term is read from x, which other nodes read too)."""
    scale = _maker(tanh.inputs[0])
    if scale is None or scale.op != "Mul" or not _close(_data_and_constant(scale)[1], math.sqrt(2 / math.pi)):
        return None
    tail = _one_plus_times(tanh)
    if tail is None:
        return None
    nodes = [scale, tanh, *tail]
    product = tail[1]
    half = _only_reader(product.outputs[0], "Mul")
    if half is not None and _close(_data_and_constant(half)[1], 0.5):
        nodes.append(half)
    return Fusion("FastGelu", tuple(nodes))


def _layer_norm(sqrt: ir.Node) -> Fusion | None:
    """From the Sqrt of mean(d^2) + eps: the Div of d = x - mean(x) (LayerNormalization) or
    of x itself (SimplifiedLayerNormalization), and the scale and shift after it."""
    plus_eps = _maker(sqrt.inputs[0])
    if plus_eps is None or plus_eps.op != "Add" or _data_and_constant(plus_eps)[1] is None:
        return None
    variance = _maker(_data_and_constant(plus_eps)[0])
    if variance is None or variance.op != "ReduceMean":
        return None
    square = _maker(variance.inputs[0])
    if square is None or not _is_square(square):
        return None
    d = square.inputs[0]
    normalizing = _normalizing(sqrt, d)
    if normalizing is None:
        return None
    nodes = [square, variance, plus_eps, sqrt, *normalizing]
    centred = _maker(d)
    kind = "SimplifiedLayerNormalization"
    if centred is not None and centred.op == "Sub":
        mean = _maker(centred.inputs[1])
        if mean is not None and mean.op == "ReduceMean" and mean.inputs[0] is centred.inputs[0]:
            nodes[:0] = [mean, centred]
            kind = "LayerNormalization"
    tail = normalizing[-1]
    for op in ("Mul", "Add"):  # gamma, then beta
        after = _only_reader(tail.outputs[0], op)
        if after is None or _data_and_constant(after)[1] is None:
            break
        nodes.append(after)
        tail = after
    return Fusion(kind, tuple(nodes))


def _normalizing(sqrt: ir.Node, d) -> list[ir.Node] | None:
    """The nodes that divide d by the Sqrt: Div(d, s), or d times Div(1, s) (torch's rsqrt as
    the TorchScript exporter writes it; a Reciprocal there ONNX Runtime 1.31 does not fuse)."""
    divide = _only_reader(sqrt.outputs[0], "Div")
    if divide is not None and divide.inputs[0] is d:
        return [divide]
    inverse = divide if divide is not None and _close(constant_value(divide.inputs[0]), 1.0) else None
    product = None if inverse is None else _only_reader(inverse.outputs[0], "Mul")
    if product is None or _other_input(product, inverse.outputs[0]) is not d:
        return None
    return [inverse, product]


_FINDERS = {"Erf": _gelu, "Tanh": _fast_gelu, "Sqrt": _layer_norm}


# --- small helpers --------------------------------------------------------------------


def _one_plus_times(node: ir.Node) -> tuple[ir.Node, ir.Node] | None:
    """(Add, Mul) of (1 + node's output) * something, each the only reader of what it reads."""
    plus_one = _only_reader(node.outputs[0], "Add")
    if plus_one is None or not _close(_data_and_constant(plus_one)[1], 1.0):
        return None
    product = _only_reader(plus_one.outputs[0], "Mul")
    return None if product is None else (plus_one, product)


def _maker(tensor) -> ir.Node | None:
    return tensor.inputs[0] if isinstance(tensor, ir.Variable) and tensor.inputs else None


def _only_reader(tensor, op: str) -> ir.Node | None:
    readers = list(tensor.outputs)
    return readers[0] if len(readers) == 1 and readers[0].op == op else None


def _data_and_constant(node: ir.Node):
    """(the run-time operand, the constant's value) of a binary node by a constant, else (None, None)."""
    if len(node.inputs) != 2:
        return None, None
    first, second = (constant_value(value) for value in node.inputs)
    if second is not None and first is None:
        return node.inputs[0], second
    if first is not None and second is None:
        return node.inputs[1], first
    return None, None


def _other_input(node: ir.Node, tensor):
    return node.inputs[1] if node.inputs[0] is tensor else node.inputs[0]


def _close(value, wanted: float) -> bool:
    """A scalar constant (any shape of one element) within ONNX Runtime's tolerance of `wanted`."""
    if value is None or np.size(value) != 1:
        return False
    return abs(float(np.asarray(value).reshape(-1)[0]) - wanted) <= 1e-4 * max(1.0, abs(wanted))


def _is_square(node: ir.Node) -> bool:
    if node.op == "Mul":
        return node.inputs[0] is node.inputs[1]
    return node.op == "Pow" and _close(constant_value(node.inputs[1]), 2.0)


def fusion_entries(
    applied: Sequence[report_types.Rewrite], skipped: Sequence[report_types.Skipped]
) -> list[report_types.RuntimeFusion]:
    """The report's `runtime_fusions`: each fusion a rewrite would have broken, once, with
    whether it was kept (the rewrite refused) and the rules that wanted it."""
    entries: dict[tuple, dict] = {}
    for entry, kept in [*((e, True) for e in skipped), *((e, False) for e in applied)]:
        fusion = (entry.get("decision") or {}) if kept else (entry.get("breaks_runtime_fusion") or {})
        if fusion.get("method") != "runtime fusion":
            continue
        key = (fusion["fusion"], tuple(fusion["nodes"]))
        found = entries.setdefault(
            key,
            {
                "fusion": fusion["fusion"],
                "nodes": fusion["nodes"],
                "module": entry.get("module"),
                "kept": kept,
                "rules": [],
            },
        )
        found["kept"] = found["kept"] and kept
        if entry["rule"] not in found["rules"]:
            found["rules"].append(entry["rule"])
    return list(entries.values())
