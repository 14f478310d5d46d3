"""The leading rules' first looks at the main graph, made on the ModelProto before the import.

A rule whose primitive has a proto form (primitives.on_proto) may make its first look at the
main graph on the proto: the rewrites the engine would make, in the engine's order, without
importing the nodes they remove or building the gs objects of the nodes they add. The looks go
rule by rule from the first; each must be the whole look (every rewrite it would make) for the
next rule's form to start from the state the engine's next look would see. A rule with no form
and none of its ops in the graph looks at nothing (the engine skips it) and is passed over.

`ProtoLook` keeps the rewrites as edits of the source model (nodes removed, tensors forwarded,
nodes and initializers added) and builds the edited model once, copying only what stays. The
engine imports that model, records the rewrites as its own, and carries on with the name
generator the forms drew from.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx

from ..graph import NameGenerator, node_names, proto_subgraphs
from .primitives import Rewrite


class ProtoLook:
    """The edits the proto forms made to `source`, and what the engine needs to go on."""

    def __init__(self, source: onnx.ModelProto, opset: int, strategy: str, device: str, decided: dict,
                 limit: int | None):
        self.source = source
        self.opset, self.strategy, self.device, self.decided, self.limit = opset, strategy, device, decided, limit
        self.nodes = source.graph.node
        self.ops = [node.op_type for node in self.nodes]
        self.applied: list[tuple[object, list[str], Rewrite]] = []     # (rule, node names, rewrite) in order
        self.removed: set[int] = set()              # indices of source nodes gone
        self.forwarded: dict[str, str] = {}         # a removed node's output -> what its readers read now
        self.added_nodes: list[onnx.NodeProto] = []
        self.added_initializers: list[onnx.TensorProto] = []
        self.dropped_values: set[str] = set()       # tensors gone: their value_info goes too
        self._names: list[str] | None = None
        self._fresh: NameGenerator | None = None
        self._live_ops: set[str] | None = None

    # what the forms read

    def names(self) -> list[str]:
        """Each source node's name, given or as import_graph names it."""
        if self._names is None:
            given = [node.name for node in self.nodes]
            self._names = given if all(given) else node_names(list(zip(self.ops, given)))
        return self._names

    def inputs_of(self, index: int) -> list[str]:
        """A source node's input names, forwarded where a removed node's output stood."""
        forwarded = self.forwarded
        names = list(self.nodes[index].input)
        return [forwarded.get(name, name) for name in names] if forwarded else names

    def live_ops(self) -> set[str]:
        """The ops of the main graph's nodes as it now stands."""
        if self._live_ops is None:
            removed = self.removed
            self._live_ops = {op for index, op in enumerate(self.ops) if index not in removed} | {
                node.op_type for node in self.added_nodes}
        return self._live_ops

    def has_subgraphs(self) -> bool:
        return any(proto_subgraphs(node) for node in self.nodes)

    def has_room(self) -> bool:
        """The rewrite limit (the bisection's) allows one more."""
        return self.limit is None or len(self.applied) < self.limit

    @property
    def fresh(self) -> NameGenerator:
        """The engine's name generator, as NameGenerator(graph) builds it on the source model's
        import (avoiding every tensor a node, a graph input or a graph output names, and every
        node's name), so that a name drawn here is the one the engine would have drawn. Only a
        name holding the generator's mark can collide with one it makes, so only those are
        kept, and only the nodes whose bytes hold the mark are read name by name (2 against
        5 ms on the bench's 2,005-node graph)."""
        if self._fresh is None:
            mark = NameGenerator.MARK
            graph, encoded = self.source.graph, mark.encode()
            taken = {value.name for value in (*graph.input, *graph.output)}
            taken.update(self.names())
            for node in self.nodes:
                if encoded in node.SerializeToString():
                    taken.update((*node.input, *node.output))
            self._fresh = NameGenerator.avoiding({name for name in taken if mark in name})
        return self._fresh

    # what the forms do

    def remove(self, index: int, gone: tuple[str, ...] = ()) -> None:
        """Remove a source node; the tensors `gone` (outputs of it no node reads now) lose their value_info."""
        self.removed.add(index)
        self.dropped_values.update(gone)
        self._live_ops = None

    def forward(self, index: int, output: str, source: str) -> None:
        """Remove a source node whose output's readers read `source` instead."""
        self.forwarded[output] = source
        self.remove(index, (output,))

    def add(self, node: onnx.NodeProto, initializers: list[onnx.TensorProto]) -> None:
        """A new node, placed after every source node (the engine appends the nodes it makes)."""
        self.added_nodes.append(node)
        self.added_initializers.extend(initializers)
        self._live_ops = None

    def judged(self, rule, node_names: list[str], rewrite: Rewrite, estimate: Callable[[], object]) -> bool:
        """engine._judged for a rewrite made here: under --strategy cost or measure, the
        decision the `decided` dict replays or `estimate()` gives (a decisions.Decision), kept
        in that dict and in the rewrite's report fields when it applies; False when it does
        not (the form stops there and the engine's look refuses it)."""
        if self.strategy == "exact":
            return True
        key = (rule.name, tuple(node_names))
        decision = self.decided.get(key) or estimate()
        if not decision.apply:
            return False
        self.decided[key] = decision
        rewrite.extra["decision"] = decision.numbers
        return True

    def record(self, rule, node_names: list[str], rewrite: Rewrite) -> None:
        self.applied.append((rule, node_names, rewrite))

    # what the engine takes

    def model(self) -> onnx.ModelProto:
        """The source model with the edits made: a new model (the source as it was when nothing
        was done). Nodes keep their order, the nameless ones named, the added ones last; the
        initializers no node reads any more, and the dropped tensors' value_info, are left out."""
        if not self.applied:
            return self.source
        source, removed = self.source.graph, self.removed
        built = onnx.ModelProto()
        _copy_fields(self.source, built, skip={"graph"})
        graph = built.graph
        _copy_fields(source, graph, skip={"node", "initializer", "value_info"})
        kept = [index for index in range(len(self.nodes)) if index not in removed]
        graph.node.extend([self.nodes[index] for index in kept])
        names, forwarded = self.names(), self.forwarded
        for node, index in zip(graph.node, kept):
            if not node.name and names[index]:
                node.name = names[index]
            if forwarded:
                inputs = node.input
                for position, name in enumerate(inputs):
                    if name in forwarded:
                        inputs[position] = forwarded[name]
        graph.node.extend(self.added_nodes)
        read = {name for node in graph.node for name in node.input}
        read.update(value.name for value in (*source.input, *source.output))
        graph.initializer.extend([init for init in source.initializer if init.name in read])
        graph.initializer.extend(self.added_initializers)
        dropped = self.dropped_values
        graph.value_info.extend([value for value in source.value_info if value.name not in dropped])
        return built


def _copy_fields(source, target, skip: set[str]) -> None:
    """Copy every field that `source` sets into `target`, but those named in `skip`."""
    for field, value in source.ListFields():
        if field.name in skip:
            continue
        repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED
        if repeated:            # (protobuf 6 has is_repeated, older ones the label)
            getattr(target, field.name).extend(value)
        elif field.type == field.TYPE_MESSAGE:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)
