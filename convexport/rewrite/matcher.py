"""Match a rule's pattern on a graph, anchored at a root node, walking to producers.

Every tensor has one producer, so a pattern (a tree of producer edges from the root) matches
at most one way, except for the input order of commutative ops, which is backtracked.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .. import ir
from ..ir import NOT_IN_SCHEMA, attribute, is_absent, is_constant
from .pattern import COMMUTATIVE, PatternNode, ValueRef
from .rulefile import Rule


@dataclass
class Match:
    """What a pattern bound: tensors and nodes by name; per-element names hold lists."""

    rule: Rule
    values: dict  # name -> tensor, None (absent optional) or list of those
    nodes: dict  # a line's first output name -> ir.Node or list of ir.Node
    root: ir.Node

    def node_list(self) -> list[ir.Node]:
        found: list[ir.Node] = []
        for line in self.rule.pattern:
            bound = self.nodes.get(line.outputs[0].name)
            for node in bound if isinstance(bound, list) else [bound]:
                if node is not None and all(node is not seen for seen in found):
                    found.append(node)
        return found

    def node_names(self) -> list[str]:
        return [node.name for node in self.node_list()]


def _made_by(found: int, count: int, ops, made_by: list[str]) -> str:
    """Why the root's inputs fail the pattern's: how many are made by the ops it needs, and by what."""
    makers = " or ".join(sorted(ops))
    if not found:
        return f"no input of it is made by a {makers} node (they are made by {', '.join(made_by) or 'no node'})"
    return f"{found} of its inputs is made by a {makers} node, the pattern needs {count} (made by {', '.join(made_by)})"


class _State:
    def __init__(self):
        self.values: dict = {}
        self.nodes: dict = {}

    def copy(self) -> _State:
        other = _State()
        other.values, other.nodes = dict(self.values), dict(self.nodes)
        return other


class PatternMatcher:
    def __init__(self, rule: Rule, opset: int, graph_outputs: set[int], members: set[int]):
        self.rule = rule
        self.opset = opset
        self.graph_outputs = graph_outputs
        self.members = members  # ids of the nodes of the graph being matched (one scope)
        self.why = ""  # after a failed match: what failed last, for --explain
        self.producers = {ref.name: line for line in rule.pattern for ref in line.outputs}
        # What the root's inputs must be, a cheap test before a full match: the ops that must
        # produce them, as many times as the pattern names a distinct input of that op, and how
        # many must be constants (names written once among the root's inputs: a name written
        # twice is checked against its first binding only)
        names = [ref.name for ref in rule.root.inputs]
        required = [
            ref
            for ref in rule.root.inputs
            if not (ref.variadic or ref.optional or ref.wildcard) and names.count(ref.name) == 1
        ]
        self.root_feeders = tuple(
            Counter(self.producers[ref.name].op_types for ref in required if ref.name in self.producers).items()
        )
        self.root_constants = sum(ref.constant for ref in required)
        # without per-element names the bindings need no regrouping into lists
        self.per_element = any(ref.per_element for line in rule.pattern for ref in (*line.inputs, *line.outputs))

    def match(self, root: ir.Node) -> Match | None:
        if self.root_feeders:
            made_by = [t.inputs[0].op for t in root.inputs if isinstance(t, ir.Variable) and len(t.inputs) == 1]
            for ops, count in self.root_feeders:
                found = sum(op in ops for op in made_by)
                if found < count:
                    return self._no(f"{self.rule.root.text}: {_made_by(found, count, ops, made_by)}")
        if self.root_constants and sum(map(is_constant, root.inputs)) < self.root_constants:
            return self._no(f"{self.rule.root.text}: fewer of its inputs are constants than the pattern's :const names")
        state = _State()
        if not self._node(self.rule.root, root, state, None):
            return None
        if not self.per_element:
            return Match(self.rule, state.values, state.nodes, root)
        return Match(self.rule, _collect(state.values), _collect(state.nodes), root)

    def match_group(self, anchor) -> Match | None:
        """Every node that matches the group's element pattern reading `anchor` as the shared
        tensor, in breadth-first order from it; a Match when there are two or more."""
        root = self.rule.root
        candidates = [node for node in _downstream(anchor, len(self.rule.pattern)) if node.op == root.op_type]
        if len(candidates) < 2:  # most tensors: one reader, no group to match
            return self._no(f"fewer than two {root.op_type} nodes read it")
        state = _State()
        state.values[self.rule.anchor] = anchor
        members = 0
        for node in candidates:
            trial = state.copy()
            if self._node(root, node, trial, members):
                state, members = trial, members + 1
        if members < 2:
            return self._no(f"fewer than two of its readers match {root.text}")
        values, nodes = _collect(state.values), _collect(state.nodes)
        return Match(self.rule, values, nodes, nodes[root.outputs[0].name][0])

    def _no(self, why: str):
        """Record why the match failed (the last reason wins) and fail: False, or None from match()."""
        self.why = why
        return None

    def _node(self, line: PatternNode, node: ir.Node, state: _State, element: int | None) -> bool:
        if node.op not in line.op_types or (node.domain or "") not in ("", "ai.onnx") or id(node) not in self.members:
            return bool(self._no(f"{line.text}: {node.name} is a {node.op}"))
        first = line.outputs[0]
        key = _key(first, element)
        if key in state.nodes:
            return state.nodes[key] is node or bool(self._no(f"{line.text}: {first.name} is bound to another node"))
        for name, wanted in line.attributes:
            actual = attribute(node, name, self.opset)
            if actual is not NOT_IN_SCHEMA and actual != wanted:
                return bool(self._no(f"{line.text}: {node.name} has {name}={actual!r}, not {wanted!r}"))
        if first.variadic:
            state.nodes[key] = node
            state.values[first.name] = list(node.outputs)
            return self._inputs(line, list(node.inputs), state, element)
        if len(node.outputs) < len(line.outputs) or any(self._used(out) for out in node.outputs[len(line.outputs) :]):
            return bool(self._no(f"{line.text}: {node.name} has other outputs in use"))
        state.nodes[key] = node
        for ref, tensor in zip(line.outputs, node.outputs):
            out_key = _key(ref, element)
            if out_key in state.values and state.values[out_key] is not tensor:
                return bool(self._no(f"{line.text}: {ref.name} is bound to another tensor"))
            state.values[out_key] = tensor
        if line.is_class:
            data = run_time_input(node)
            if data is None:
                return bool(self._no(f"{line.text}: {node.name} has more than one run-time input"))
            return self._value(line.inputs[0], data, state, element)
        return self._inputs(line, list(node.inputs), state, element)

    def _inputs(self, line: PatternNode, tensors: list, state: _State, element: int | None) -> bool:
        variadic = line.variadic_input
        fixed = line.fixed_inputs
        if variadic is None:
            if line.op_type not in COMMUTATIVE or len(tensors) != 2:
                # one order: a failure fails the whole match, whose state is dropped, so no copy
                return self._fixed(fixed, tensors, state, element, exact=True)
            for order in (tensors, tensors[::-1]):
                trial = state.copy()
                if self._fixed(fixed, order, trial, element, exact=True):
                    state.values, state.nodes = trial.values, trial.nodes
                    return True
            return False
        position = line.inputs.index(variadic)
        if not self._fixed(fixed[:position], tensors[:position], state, element, exact=False):
            return False
        return self._list(variadic, tensors[position:], state)

    def _fixed(self, refs: list[ValueRef], tensors: list, state: _State, element: int | None, exact: bool) -> bool:
        if exact and len(tensors) > len(refs) and any(not is_absent(t) for t in tensors[len(refs) :]):
            return bool(self._no(f"the node has {len(tensors)} inputs, the pattern names {len(refs)}"))
        for index, ref in enumerate(refs):
            tensor = tensors[index] if index < len(tensors) else None
            if is_absent(tensor):
                if not ref.optional:
                    return bool(self._no(f"input {ref.name} is absent and not optional (name it {ref.name}?)"))
                state.values.setdefault(_key(ref, element), None)
                continue
            if not self._value(ref, tensor, state, element):
                return False
        return True

    def _list(self, ref: ValueRef, tensors: list, state: _State) -> bool:
        state.values[ref.name] = list(tensors)
        element_line = self.producers.get(ref.name)
        if element_line is None:
            return True
        for index, tensor in enumerate(tensors):
            if not self._value(ValueRef(ref.name, per_element=True), tensor, state, index):
                return False
        return True

    def _value(self, ref: ValueRef, tensor, state: _State, element: int | None) -> bool:
        if ref.wildcard:
            return True
        key = _key(ref, element)
        if key in state.values:
            return state.values[key] is tensor or bool(self._no(f"{ref.name} is bound to another tensor"))
        if ref.constant and not is_constant(tensor):
            return bool(self._no(f"{ref.name} ({tensor.name}) is not a constant"))
        state.values[key] = tensor
        line = self.producers.get(ref.name)
        if line is None:
            return True
        if not isinstance(tensor, ir.Variable) or len(tensor.inputs) != 1:
            return bool(self._no(f"{line.text}: {ref.name} ({tensor.name}) is made by no node"))
        producer = tensor.inputs[0]
        if producer.outputs.index(tensor) != line.output_names.index(ref.name):
            return bool(self._no(f"{line.text}: {ref.name} is another output of {producer.name}"))
        return self._node(line, producer, state, element if line.is_element else None)

    def _used(self, tensor) -> bool:
        return bool(tensor.outputs) or id(tensor) in self.graph_outputs


def run_time_input(node: ir.Node):
    """The one input of `node` that is not a constant (nor an omitted optional one), None where
    there are several or none; for Div, only the dividend may be it (k / x is not linear)."""
    computed = [i for i, t in enumerate(node.inputs) if not is_absent(t) and not is_constant(t)]
    if len(computed) != 1 or (node.op == "Div" and computed[0] != 0):
        return None
    return node.inputs[computed[0]]


def _downstream(tensor, depth: int) -> list[ir.Node]:
    """Nodes within `depth` consumer steps of `tensor`, breadth first, each once."""
    found: list[ir.Node] = []
    seen: set[int] = set()
    frontier = [tensor]
    for _ in range(depth):
        next_frontier = []
        for value in frontier:
            for node in value.outputs:
                if id(node) not in seen:
                    seen.add(id(node))
                    found.append(node)
                    next_frontier.extend(node.outputs)
        frontier = next_frontier
    return found


def _key(ref: ValueRef, element: int | None):
    return (ref.name, element) if ref.per_element else ref.name


def _collect(bound: dict) -> dict:
    """Turn per-element (name, index) keys into lists ordered by index."""
    result: dict = {}
    elements: dict[str, dict[int, object]] = {}
    for key, value in bound.items():
        if isinstance(key, tuple):
            elements.setdefault(key[0], {})[key[1]] = value
        else:
            result[key] = value
    for name, by_index in elements.items():
        size = max(by_index) + 1
        result[name] = [by_index.get(index) for index in range(size)]
    return result
