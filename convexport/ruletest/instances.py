"""Random instances of a rule's pattern: small ONNX models in which the pattern occurs, with
random shapes, attributes and weights (samplers.py), for `convexport rules test`.

A pattern name is a constant (an initializer) when the pattern writes `name:const` or a
`constant:` condition names it, and a graph input otherwise. Around the pattern an instance
may add what a rule's primitive looks at beyond its match: a reader of the root's output (a
rewrite may not rename a graph output), a producer of the same op feeding the first input (a
Concat of a Concat), identical op chains after the outputs of a group or a
Split (what branch batching follows) joined by a Concat, an intermediate that is also a graph
output (what `private` guards), optional inputs present or absent, commutative inputs
swapped, and a constant shared by every element of a group.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import cast

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from ..rewrite.pattern import COMMUTATIVE, PatternNode, ValueRef
from ..rewrite.rulefile import Rule
from .draws import Draws
from .regions import add_branches, wants_branches
from .samplers import PARTITIONS, SAMPLERS, Draft, Reject, Slot

IR_VERSION = 10  # ONNX Runtime 1.31 reads IR <= 10
OPSETS = (18, 21)  # both sides of opset 20 (DFT-17 vs DFT-20, AveragePool-19)
ABSENT = ""
CHAIN_OPS = ("Relu", "Conv", "Mul", "Add")


@dataclass
class Instance:
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]


def samplers_of(rule: Rule) -> dict:
    """The samplers for a rule's instances: the built-in ones and those its `samplers:` names
    (which take precedence for their op)."""
    return {**SAMPLERS, **rule.samplers}


def unsupported_ops(rule: Rule) -> list[str]:
    known = samplers_of(rule)
    ops = {op for line in rule.pattern for op in (CLASS_MEMBER_INPUTS.get(line.op_type) or [line.op_type])}
    return sorted(ops - known.keys())


def instances(rule: Rule) -> st.SearchStrategy:
    """Valid instances of `rule` (hypothesis redraws where the choices make no valid model)."""

    @st.composite
    def build(draw):
        try:
            return _InstanceBuilder(Draws(draw), rule).build()
        except Reject:
            return None

    return build().filter(lambda instance: instance is not None)


# The constant inputs each member of an op class is drawn with (`?`: optional), after its
# run-time input.
_AFFINE_INPUTS = {
    "BatchNormalization": ("scale", "shift", "mean", "var"),
    "Mul": ("k",),
    "Div": ("k",),
    "Add": ("k",),
    "Sub": ("k",),
}
CLASS_MEMBER_INPUTS = {
    "Affine": _AFFINE_INPUTS,
    "Linear": {**_AFFINE_INPUTS, "Conv": ("w", "b?"), "AveragePool": (), "Pad": ("pads",)},
    "Dense": {"Gemm": ("w", "b?"), "MatMul": ("w",)},
}


class _InstanceBuilder:
    def __init__(self, draws: Draws, rule: Rule):
        self.draws, self.rule = draws, rule
        self.samplers = samplers_of(rule)
        self.opset = draws.choice(OPSETS)
        self.constants = _constant_names(rule)
        self.minimums = _count_minimums(rule)
        lowest = max([2, *self.minimums.values()])
        # a group line's elements (0: the rule has none)
        self.count = draws.integer(lowest, max(lowest, 4)) if any(line.is_element for line in rule.pattern) else 0
        self.sharing = draws.choice(["same-geometry", "independent", "same-constants"])
        partitionable = any(line.is_element and line.op_type in PARTITIONS for line in rule.pattern)
        self.partition = partitionable and draws.flag()  # a group's parts cut their shared input
        self.partitions: dict[int, list[Draft]] = {}  # line index -> one draft per element
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: dict[str, np.ndarray] = {}
        self.feeds: dict[str, np.ndarray] = {}
        self.types: dict[str, onnx.TypeProto] = {}
        self.readers: dict[str, int] = {}
        self.env: dict[tuple, str] = {}  # (pattern name, element or None) -> tensor name
        self.lists: dict[str, list[str]] = {}  # variadic name -> its tensors
        self.templates: dict[int, tuple[Draft, list[str]]] = {}
        self.class_members: dict[int, str] = {}  # line index -> the member op drawn for an op class
        self.numbers = itertools.count()

    def build(self) -> Instance:
        if wants_branches(self):
            add_branches(self)
        for index in _topological_order(self.rule.pattern):
            line = self.rule.pattern[index]
            for element in range(self.count) if line.is_element else [None]:
                self._add_line(index, line, element)
        self._add_lockstep_chains()
        self._add_reader()
        return Instance(self._model(), dict(self.feeds))

    # --- one pattern line -------------------------------------------------------------
    def _add_line(self, index: int, line: PatternNode, element: int | None) -> None:
        if line.is_class:
            line = self._class_member(index, line, element)
        refs, names = self._input_names(line, element)
        fixed = dict(line.attributes)
        template = self.templates.get(index)
        slots = [Slot(self._shape(name) if name is not None else None, name != ABSENT) for name in names]
        partitioned = self.partition and line.is_element and line.op_type in PARTITIONS
        reused = (
            template
            if not partitioned and template is not None and self.sharing != "independent"
            and _same_layout(template[0], slots)
            else None
        )  # fmt: skip
        if partitioned:
            assert element is not None, "a group line's elements are numbered"
            if element == 0:
                self.partitions[index] = PARTITIONS[line.op_type](self.draws, slots, fixed, self.count)
            draft = self.partitions[index][element]
        elif reused is not None:
            draft = self._reshuffled(reused[0])
        else:
            output_count = None if line.outputs[0].variadic else len(line.outputs)
            draft = self.samplers[line.op_type](self.draws, slots, fixed, output_count)
        inputs = []
        for position, (ref, name) in enumerate(zip(refs, names)):
            if name is None:
                shared = reused[1][position] if reused is not None and self.sharing == "same-constants" else None
                name = (
                    shared if shared and ref.name in self.constants else self._materialize(ref, draft.values[position])
                )
                if not ref.wildcard:
                    self.env[self._key(ref, element)] = name
            inputs.append(name)
        if element is None or element == 0:
            self.templates[index] = (draft, list(inputs))
        if line.op_type in COMMUTATIVE and len(inputs) == 2 and self.draws.flag():
            inputs.reverse()
        outputs = self._add_node(
            line.op_type, inputs, {**draft.attrs, **_as_lists(fixed)}, draft.outputs, line.outputs[0].name
        )
        if line.outputs[0].variadic:
            self.lists[line.outputs[0].name] = outputs
        else:
            for ref, name in zip(line.outputs, outputs):
                self.env[self._key(ref, element)] = name
                if ref.per_element:
                    self.lists.setdefault(ref.name, []).append(name)

    def _class_member(self, index: int, line: PatternNode, element: int | None) -> PatternNode:
        """A line of an op class (`a = Linear(x)`) as a line of one member op: x its run-time
        input, constants for the rest. The member is drawn once per line, and again per
        element when the instance draws its elements independently."""
        op = self.class_members.get(index) if self.sharing != "independent" or not element else None
        if op is None:
            op = self.draws.choice(sorted(CLASS_MEMBER_INPUTS[line.op_type]))
            self.class_members[index] = op
        base = line.outputs[0].name
        constants = tuple(
            ValueRef(f"{base}_{name.rstrip('?')}", line.is_element, name.endswith("?"), constant=True)
            for name in CLASS_MEMBER_INPUTS[line.op_type][op]
        )
        return PatternNode(op, line.outputs, (line.inputs[0], *constants), (), line.line, line.text)

    def _input_names(self, line: PatternNode, element: int | None) -> tuple[list, list]:
        """Per input slot: its pattern ref and its tensor (None: open, ABSENT: left out)."""
        refs, names = [], []
        for position, ref in enumerate(line.inputs):
            if ref.variadic:
                for part in self._variadic(line, ref):
                    refs.append(ValueRef(ref.name, constant=ref.constant))
                    names.append(part)
                continue
            key = self._key(ref, element)
            if not ref.wildcard and key in self.env:
                names.append(self.env[key])
            elif ref.optional and not self._present(ref, element):
                names.append(ABSENT)
                self.env[key] = ABSENT
            elif (
                position == 0 and not ref.wildcard and ref.name not in self.constants and self.draws.integer(0, 4) == 4
            ):
                names.append(self._nested_producer(line))
                self.env[key] = names[-1]
            else:
                names.append(None)
            refs.append(ref)
        return refs, names

    def _variadic(self, line: PatternNode, ref: ValueRef) -> list:
        if ref.name in self.lists:
            return list(self.lists[ref.name])
        count = self.draws.integer(max(1, self.minimums.get(ref.name, 1)), 4)
        parts: list = []
        for _ in range(count):
            if parts and self.draws.integer(0, 2) == 2:
                parts.append(parts[self.draws.integer(0, len(parts) - 1)])
            elif ref.name not in self.constants and self.draws.integer(0, 3) == 3:
                parts.append(self._nested_producer(line))
            else:
                parts.append(self._free_tensor(line, ref, parts))
        self.lists[ref.name] = parts
        return parts

    def _free_tensor(self, line: PatternNode, ref: ValueRef, parts: list) -> str:
        """One open part of a free variadic list, shaped by the line's sampler."""
        slots = [Slot(self._shape(p)) for p in parts] + [Slot(None)]
        draft = self.samplers[line.op_type](self.draws, slots, dict(line.attributes), 1)
        return self._materialize(ref, draft.values[-1])

    def _nested_producer(self, line: PatternNode) -> str:
        """A node of the line's own op (fresh inputs, the line's attributes) whose output feeds
        the line: the input another rewrite could have left there."""
        variadic = next((ref for ref in line.inputs if ref.variadic), None)
        refs = [variadic] * self.draws.integer(1, 3) if variadic else list(line.inputs)
        slots = [Slot(None, not ref.optional or self.draws.flag()) for ref in refs]
        draft = self.samplers[line.op_type](self.draws, slots, dict(line.attributes), 1)
        inputs = [
            self._materialize(ref, value) if slot.present else ABSENT
            for ref, slot, value in zip(refs, slots, draft.values)
        ]
        return self._add_node(line.op_type, inputs, {**draft.attrs, **_as_lists(dict(line.attributes))}, 1, "nested")[0]

    def _present(self, ref: ValueRef, element: int | None) -> bool:
        if element and (self.sharing != "independent" or self.partition):
            return self.env.get((ref.name, 0)) != ABSENT
        return self.draws.flag()

    # --- around the pattern -----------------------------------------------------------
    def _add_lockstep_chains(self) -> None:
        """The same ops after every output of a group or a Split, maybe joined by a Concat."""
        root = self.rule.root
        tails = list(self.lists.get(root.outputs[0].name, [])) if root.is_element or root.outputs[0].variadic else []
        if len(tails) < 2 or not self.draws.flag():
            return
        for _ in range(self.draws.integer(1, 2)):
            op = self.draws.choice(CHAIN_OPS)
            shape = self._shape(tails[0])
            if op == "Conv" and (shape is None or len(shape) < 3):
                op = "Relu"
            template = None
            for position, tail in enumerate(tails):
                slots = [Slot(self._shape(tail))] + [Slot(None) for _ in range({"Relu": 0, "Conv": 2}.get(op, 1))]
                if template is None or not _same_layout(template[0], slots):
                    draft = self.samplers[op](self.draws, slots, {}, 1)
                    constants = [self._materialize(ValueRef("chain", constant=True), v) for v in draft.values[1:]]
                    template = (draft, constants)
                elif self.sharing == "same-constants":  # one shared operand (a residual, a scale)
                    draft, constants = template
                else:
                    draft = self._reshuffled(template[0])
                    constants = [self._materialize(ValueRef("chain", constant=True), v) for v in draft.values[1:]]
                inputs = [tail, *constants]
                tails[position] = self._add_node(op, inputs, draft.attrs, 1, op.lower())[0]
        if self.draws.flag():
            split_axis = self.templates[len(self.rule.pattern) - 1][0].attrs.get("axis", 0)
            self._add_node("Concat", tails, {"axis": split_axis if root.op_type == "Split" else 1}, 1, "join")

    def _add_reader(self) -> None:
        """A Neg reading the root's output, so that it is not a graph output (a rewrite may
        not rename one, so without a reader many rules would never apply)."""
        root = self.rule.root
        if root.is_element or root.outputs[0].variadic or not self.draws.flag():
            return
        name = self.env[(root.outputs[0].name, None)]
        if not self.readers.get(name):
            self._add_node("Neg", [name], {}, 1, "reader")

    # --- tensors and nodes ------------------------------------------------------------
    def _key(self, ref: ValueRef, element: int | None) -> tuple:
        return (ref.name, element if ref.per_element else None)

    def _fresh(self, base: str) -> str:
        return f"{base}_{next(self.numbers)}"

    def _shape(self, name: str) -> tuple[int, ...] | None:
        if name in (None, ABSENT):
            return None
        return tuple(d.dim_value for d in self.types[name].tensor_type.shape.dim)

    def _reshuffled(self, draft: Draft) -> Draft:
        """The draft's attributes with each value's entries shuffled: the same shapes and the
        same sets of entries, so still valid (positive variances stay positive, indices in
        range, sizes summing to the same)."""
        return Draft(
            draft.attrs, [None if value is None else self._shuffled(value) for value in draft.values], draft.outputs
        )

    def _shuffled(self, value) -> np.ndarray:
        flat = np.asarray(value).reshape(-1).copy()
        self.draws.rng.shuffle(flat)
        return flat.reshape(np.shape(value))

    def _materialize(self, ref: ValueRef, value) -> str:
        if value is None:
            raise Reject
        value = np.asarray(value)
        name = self._fresh("x" if ref.wildcard else ref.name)
        if ref.constant or ref.name in self.constants:
            self.initializers[name] = value
        else:
            self.feeds[name] = value
        self.types[name] = helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
        return name

    def _add_node(self, op: str, inputs: list[str], attrs: dict, outputs: int, base: str) -> list[str]:
        while inputs and inputs[-1] == ABSENT:
            inputs = inputs[:-1]
        names = [self._fresh(base) for _ in range(outputs)]
        node = helper.make_node(op, inputs, names, name=self._fresh(op.lower()), **attrs)
        data = {
            name: numpy_helper.from_array(value, name) for name, value in self.initializers.items() if name in inputs
        }
        try:
            inferred = onnx.shape_inference.infer_node_outputs(
                onnx.defs.get_schema(op, self.opset),
                node,
                {name: self.types[name] for name in inputs if name},
                data,
                opset_imports=[helper.make_opsetid("", self.opset)],
                ir_version=IR_VERSION,
            )
        except Exception:
            raise Reject from None
        for name in names:
            tensor_type = inferred[name].tensor_type if name in inferred else None
            if (
                tensor_type is None
                or not tensor_type.HasField("shape")
                or any(not d.HasField("dim_value") or d.dim_value <= 0 for d in tensor_type.shape.dim)
            ):
                raise Reject
            self.types[name] = inferred[name]
        for name in inputs:
            if name:
                self.readers[name] = self.readers.get(name, 0) + 1
        self.nodes.append(node)
        return names

    def _model(self) -> onnx.ModelProto:
        produced = [name for node in self.nodes for name in node.output]
        outputs = [name for name in produced if not self.readers.get(name)]
        outputs += [name for name in produced if self.readers.get(name) and self.draws.integer(0, 7) == 7]
        value_info = lambda name: helper.make_value_info(name, self.types[name])  # noqa: E731
        # some constants as Constant nodes, as the TorchScript exporter writes them: a primitive
        # must read both (convexport.primitive.constant_value does)
        as_nodes = {name for name in self.initializers if self.draws.integer(0, 3) == 3}
        constant_nodes = [
            helper.make_node("Constant", [], [name], name=self._fresh("constant"), value=numpy_helper.from_array(v))
            for name, v in self.initializers.items()
            if name in as_nodes
        ]
        graph = helper.make_graph(
            constant_nodes + self.nodes,
            f"instance of {self.rule.name}",
            [value_info(n) for n in self.feeds],
            [value_info(n) for n in outputs],
            [numpy_helper.from_array(v, n) for n, v in self.initializers.items() if n not in as_nodes],
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", self.opset)],
            ir_version=IR_VERSION,
            producer_name="convexport rules test",
        )
        try:
            onnx.checker.check_model(model)
            return onnx.shape_inference.infer_shapes(model, strict_mode=True)  # as the pipeline sees models
        except Exception:
            raise Reject from None


def _same_layout(template: Draft, slots: list[Slot]) -> bool:
    return len(template.values) == len(slots) and all(
        (value is not None) == (slot.present and slot.shape is None) for value, slot in zip(template.values, slots)
    )


def _as_lists(attrs: dict) -> dict:
    return {key: list(value) if isinstance(value, tuple) else value for key, value in attrs.items()}


def _constant_names(rule: Rule) -> set[str]:
    names = {ref.name for line in rule.pattern for ref in line.inputs if ref.constant}
    for key, argument in (*rule.where, *rule.require):
        if key == "constant":
            names |= set(cast(list[str], argument) if isinstance(argument, list) else [cast(str, argument)])
    return names


def _count_minimums(rule: Rule) -> dict[str, int]:
    return {
        name: int(minimum)
        for key, argument in (*rule.where, *rule.require)
        if key == "count"
        for name, minimum in cast(dict[str, int], argument).items()
    }


def _topological_order(pattern: tuple[PatternNode, ...]) -> list[int]:
    """Producers before readers, file order among the rest (rulefile.py has already refused
    patterns whose lines form a cycle)."""
    producer = {ref.name: index for index, line in enumerate(pattern) for ref in line.outputs}
    needs = {
        index: {producer[ref.name] for ref in line.inputs if ref.name in producer} for index, line in enumerate(pattern)
    }
    order: list[int] = []
    while len(order) < len(pattern):
        order.append(next(index for index in range(len(pattern)) if index not in order and needs[index] <= set(order)))
    return order
