"""conv-batchnorm's first look at the main graph, made on the proto (rewrite/proto_look.py).

A torch export of a network in eval mode keeps every BatchNormalization after its Conv: on the
bench's 2,005-node graph 223 of them. Folded by the engine, each costs the import of two nodes
and their tensors, a match, gs objects for the new Conv, a rewire and the new Conv's export;
made here, it is the same arithmetic on the initializers and one new NodeProto.

The rewrites are compose_linear's for the rule

    h = Conv(x, w, b?)
    y = BatchNormalization[training_mode=0](h, scale:const, shift:const, mean:const, var:const)
    require: constant [w, b], private [h]

The algebra is compose_linear's for a Conv then a per-channel affine map: with scale =
gamma / sqrt(var + eps) and shift = beta - mean * scale (batchnorm_scale_shift, all [O]), the
Conv's weight W [O, I/g, *k] becomes W'[o] = scale[o] * W[o] and its bias b [O] (zero when it
has none) b' = scale * b + shift (scale_shift_onnx_weight, in float64, then in y's type); the
group, strides, dilations and pads stay.

They are made as the engine makes them: each BN in graph order; the new Conv, named from the
engine's name generator in the order conv_node draws names, reads x and the folded weight (and
bias), takes over y, and goes after every other node; the report entry and the cost decision
carry the same numbers (the estimate counted from the same shapes). This form makes only the
folds whose every condition it can see holds, and stops (False) at the first BN that is
anything else, so the engine's own look carries on from there: a Conv or a BN of another kind
(a condition that fails, an input without a known shape, a type it does not read, a weight
in a Constant node, training mode), a BN whose input a fold made (the engine would fold the
new Conv again), or one whose input a BN later in the list makes (a fold there could make its
input a Conv). A BN whose input no Conv makes, and never will in this look, does not match:
it is passed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx

from ..algebra import batchnorm_scale_shift, scale_shift_onnx_weight
from ..graph import NOT_IN_SCHEMA, attribute, attribute_or, numpy_dtype
from ..gs_import import raw_values, simple_attributes, tensor_type_of
from ..reexport import RAW_TYPES, array_proto, plain_node_proto
from ..rewrite.cost import DEVICES, conv_flops, counted_shape, estimate_work, named_node_work, tensor_bytes
from ..rewrite.decisions import estimated_decision
from ..rewrite.primitives import Rewrite
from ..type_reader import TypeReader
from .convnodes import flops_per_sample
from .linear_nodes import composed_note

ONNX_DOMAIN = ("", "ai.onnx")
NOTE = composed_note("Conv", "BatchNormalization")


def fold_batchnorms_on_proto(look, rule) -> bool:
    """compose_linear's first look for the conv-batchnorm rule, made on the proto (see the
    module doc); False at once for any other rule, under --strategy measure (its timings are
    the engine's to take), and for a graph with subgraphs."""
    if not _is_conv_batchnorm_rule(rule) or look.strategy == "measure" or look.has_subgraphs():
        return False
    graph = _GraphView(look)
    for index in [i for i, op in enumerate(look.ops) if op == "BatchNormalization" and i not in look.removed]:
        producer = graph.producers.get(look.inputs_of(index)[0] if look.nodes[index].input else "")
        if producer is None or (producer >= 0 and look.ops[producer] not in ("Conv", "BatchNormalization")):
            continue                    # no Conv makes its input, nor will one: no match
        if producer >= 0 and look.ops[producer] == "BatchNormalization" and producer < index:
            continue                    # a BN this look passed: it stays one
        if producer < 0 or look.ops[producer] != "Conv" or not look.has_room():
            return False                # made by a fold, by a BN later in the list, or out of room
        fold = graph.fold(producer, index)
        if fold is None or not look.judged(rule, fold.node_names, fold.rewrite, fold.estimate):
            return False
        graph.apply(fold)
        look.record(rule, fold.node_names, fold.rewrite)
    return True


def _is_conv_batchnorm_rule(rule) -> bool:
    """The built-in conv-batchnorm rule as written (any change to it leaves it to the engine)."""
    if rule.apply != "compose_linear" or rule.where or rule.params or rule.plugin is not None or len(rule.pattern) != 2:
        return False
    conv, batchnorm = rule.pattern
    refs = [(ref.name, ref.constant, ref.optional, ref.variadic, ref.per_element, ref.wildcard)
            for line in rule.pattern for ref in (*line.outputs, *line.inputs)]
    return (conv.op_type == "Conv" and not conv.attributes and batchnorm.op_type == "BatchNormalization"
            and list(batchnorm.attributes) == [("training_mode", 0)]
            and refs == [("h", False, False, False, False, False), ("x", False, False, False, False, False),
                         ("w", False, False, False, False, False), ("b", False, True, False, False, False),
                         ("y", False, False, False, False, False), ("h", False, False, False, False, False),
                         *[(name, True, False, False, False, False) for name in ("scale", "shift", "mean", "var")]]
            and [(name, list(argument)) for name, argument in rule.require] == [("constant", ["w", "b"]),
                                                                                ("private", ["h"])])


class _NodeView:
    """What graph.attribute reads of a node: its op, domain and attributes."""

    def __init__(self, proto: onnx.NodeProto, attrs: dict):
        self.op, self.domain, self.attrs = proto.op_type, proto.domain, attrs


@dataclass
class _Fold:
    """One fold, checked and computed; names are drawn only when it is applied (a fold the
    decision refuses is the engine's to refuse, drawing the same names)."""

    conv: int                       # source node indices
    batchnorm: int
    node_names: list[str]
    rewrite: Rewrite
    node: onnx.NodeProto            # the new Conv's attributes: name, inputs and output come at apply
    x: str                          # the Conv's data input
    hidden: str                     # h
    output: str                     # y
    weight: np.ndarray              # folded, in y's type
    bias: np.ndarray | None
    estimate: Callable[[], object]  # -> decisions.Decision


class _GraphView:
    """The main graph as the engine's import would see it after the looks before this one:
    who makes each tensor (a source node's index, or -1 for a Conv this look made), who reads
    it, its type as gs reads it, and the constants (initializers that are no graph input)."""

    def __init__(self, look):
        self.look = look
        graph = look.source.graph
        self.graph_inputs = {value.name for value in graph.input}
        self.graph_outputs = {value.name for value in graph.output}
        self.constants = {init.name: init for init in graph.initializer if init.name not in self.graph_inputs}
        self.producers: dict[str, int] = {}
        self.readers: dict[str, int] = {}       # the index of the one node that reads it, -2 for several
        twice, removed, forwarded, readers, producers = set(), look.removed, look.forwarded, self.readers, self.producers
        for index, node in enumerate(look.nodes):
            if index in removed:
                continue
            for name in node.input:
                name = forwarded.get(name, name)
                if readers.setdefault(name, index) != index:
                    readers[name] = -2
            for name in node.output:
                if name in producers:
                    twice.add(name)
                producers[name] = index
        for name in twice | self.graph_inputs | set(self.constants):      # no one node makes these
            producers.pop(name, None)
        self.read_type = TypeReader(tensor_type_of)
        self.conv_templates: dict[tuple, onnx.NodeProto | None] = {}
        self.epsilons: dict[tuple, float | None] = {}
        self.described: dict[str, onnx.ValueInfoProto | None] = {}       # None: described twice (gs merges them)
        for value in graph.value_info:
            self.described[value.name] = None if value.name in self.described else value
        for value in (*graph.input, *graph.output):
            self.described.setdefault(value.name, value)

    def typed(self, name: str) -> tuple | None:
        """(gs dtype, shape as a list) of a tensor described with a NumPy type and a shape, else None."""
        value = self.described.get(name)
        read = None if value is None else self.read_type(value.type)
        if read is None or read[1] is None or isinstance(read[0], int):     # an int: a type NumPy lacks
            return None
        return read[0], list(read[1])

    def new_conv(self, conv: onnx.NodeProto) -> onnx.NodeProto | None:
        """A NodeProto of the new Conv, with conv's attributes as the engine's export writes
        them, its name, inputs and output to come; None where an attribute is not plain. Built
        once per distinct attribute list (a Conv's five: 13 us)."""
        key = tuple([attribute.SerializeToString() for attribute in conv.attribute])
        if key not in self.conv_templates:
            attrs = simple_attributes(conv)
            self.conv_templates[key] = None if attrs is None else plain_node_proto("Conv", "", None, [], [], attrs)
        template = self.conv_templates[key]
        if template is None:
            return None
        node = onnx.NodeProto()
        node.CopyFrom(template)
        return node

    def epsilon(self, batchnorm: onnx.NodeProto) -> float | None:
        """The BN's epsilon (as channel_affine reads it) where it matches training_mode=0 and
        its attributes are plain, else None; once per distinct attribute list and domain."""
        key = (batchnorm.domain, *[attribute.SerializeToString() for attribute in batchnorm.attribute])
        if key not in self.epsilons:
            attrs, epsilon = simple_attributes(batchnorm), None
            if attrs is not None:
                view = _NodeView(batchnorm, attrs)
                training = attribute(view, "training_mode", self.look.opset)
                if training is NOT_IN_SCHEMA or training == 0:
                    epsilon = float(attribute_or(view, "epsilon", self.look.opset, 1e-5))
            self.epsilons[key] = epsilon
        return self.epsilons[key]

    def fold(self, conv_index: int, batchnorm_index: int) -> _Fold | None:
        """The fold of the Conv into the BN after it, or None where anything differs from the
        plain case (the engine decides those)."""
        look = self.look
        conv, batchnorm = look.nodes[conv_index], look.nodes[batchnorm_index]
        conv_inputs, bn_inputs = look.inputs_of(conv_index), look.inputs_of(batchnorm_index)
        h, y = conv.output[0], batchnorm.output[0]
        if (len(conv.output) != 1 or len(batchnorm.output) != 1 or len(bn_inputs) != 5
                or len(conv_inputs) not in (2, 3) or conv.domain not in ONNX_DOMAIN
                or batchnorm.domain not in ONNX_DOMAIN or self.producers.get(y) != batchnorm_index
                or h in self.graph_outputs or self.readers.get(h) != batchnorm_index):
            return None
        x = conv_inputs[0]
        if not x or x in self.constants:
            return None
        node, epsilon = self.new_conv(conv), self.epsilon(batchnorm)
        if node is None or epsilon is None:
            return None
        typed = [self.typed(name) for name in (x, h, y)]
        if None in typed:
            return None
        (x_type, x_shape), (h_type, h_shape), (y_type, y_shape) = typed
        dtype = numpy_dtype(y_type)
        if len(h_shape) < 3 or not isinstance(h_shape[1], int) or dtype not in RAW_TYPES:
            return None                 # channel_affine refuses the first; the rest, left to gs
        bias_name = conv_inputs[2] if len(conv_inputs) == 3 and conv_inputs[2] else None
        constant_names = [conv_inputs[1], *([bias_name] if bias_name else []), *bn_inputs[1:]]
        protos = [self.constants.get(name) for name in constant_names]
        arrays = [None if proto is None else raw_values(proto, writable=False) for proto in protos]
        if None in protos or any(a is None for a in arrays):
            return None
        weight, bias, (gamma, beta, mean, var) = arrays[0], arrays[1] if bias_name else None, arrays[-4:]
        channels = (weight.shape[0],)
        if weight.ndim < 3 or any(a.shape != channels for a in arrays[1:]):
            return None
        scale, shift = batchnorm_scale_shift(*(np.asarray(v, np.float64) for v in (gamma, beta, mean, var)), epsilon)
        folded_weight, folded_bias = scale_shift_onnx_weight(weight, bias, scale, shift)
        new_weight = folded_weight.astype(dtype)
        new_bias = None if folded_bias is None else folded_bias.astype(dtype)
        parts = [flops_per_sample(h_shape, weight.shape), flops_per_sample(y_shape)]
        rewrite = Rewrite([], [], NOTE, None if None in parts else sum(parts),
                          flops_per_sample(y_shape, new_weight.shape))

        def estimate():
            """decisions.by_estimate of compose_linear's rewrite: the BN then the Conv (in the
            order replaced_nodes finds them) against the new Conv, tensors counted as
            cost.estimate counts them (cost.named_node_work)."""
            device, seen = DEVICES[look.device], set()
            sizes = dict(zip(constant_names, [float(a.nbytes) for a in arrays]))
            x_bytes, y_bytes, y_counted = tensor_bytes(x_shape, x_type), tensor_bytes(y_shape, y_type), counted_shape(y_shape)
            before = estimate_work([
                named_node_work("BatchNormalization", float(math.prod(y_counted)), device, seen,
                                [(h, tensor_bytes(h_shape, h_type)), *[(n, sizes[n]) for n in bn_inputs[1:]],
                                 (y, y_bytes)]),
                named_node_work("Conv", conv_flops(counted_shape(h_shape), weight.shape), device, seen,
                                [(x, x_bytes), *[(n, sizes.get(n, 0.0)) for n in conv_inputs[1:]]]),
            ], device, rewrite.flops_before)
            added = [(x, x_bytes), ("", float(new_weight.nbytes))]     # new tensors: each its own
            added += [] if new_bias is None else [("", float(new_bias.nbytes))]
            after = estimate_work([named_node_work("Conv", conv_flops(y_counted, new_weight.shape), device, set(),
                                                   [*added, ("", y_bytes)])], device, rewrite.flops_after)
            return estimated_decision(before, after, look.device)

        names = look.names()
        return _Fold(conv_index, batchnorm_index, [names[conv_index], names[batchnorm_index]], rewrite, node, x, h, y,
                     new_weight, new_bias, estimate)

    def apply(self, fold: _Fold) -> None:
        """The new Conv after every node, reading x and the folded weights and writing y; the
        old Conv and BN gone (and h with them). Names drawn as conv_node and engine._apply draw
        them: weight, bias, the new output (y takes it over), the node, the old BN's placeholder."""
        look, y, node = self.look, fold.output, fold.node
        fresh = look.fresh
        weight_name = fresh(y + "_weight")
        bias_name = None if fold.bias is None else fresh(y + "_bias")
        fresh(y)
        node.name = fresh(y + "_conv")
        fresh(y + "_dead")
        node.input.extend([fold.x, weight_name] + ([bias_name] if bias_name else []))
        node.output.append(y)
        initializers = [array_proto(weight_name, fold.weight)]
        if bias_name:
            initializers.append(array_proto(bias_name, fold.bias))
        look.remove(fold.conv, (fold.hidden,))
        look.remove(fold.batchnorm)
        look.add(node, initializers)
        self.producers[y] = -1
        self.producers.pop(fold.hidden, None)

