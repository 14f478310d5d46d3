"""The pattern language of rule files: one line per operator node.

    OUT = OpType(IN, IN?, ...)                 a node; its first output is OUT
    OUT = OpType[attr=value, ...](IN, ...)     with attribute conditions (absent = ONNX default)
    OUT, OUT2 = OpType(...)                    several outputs
    *parts = Split(x)                          `parts` binds the list of all outputs
    y = Concat[axis=1](*parts)                 variadic: `parts` binds the whole input list
    parts[] = Conv(x, w[], b[]?)               each element of `parts` is a Conv; names ending
                                               in [] are per element, plain names are shared
    y = Add(a, b)                              Add, Mul and Sum also match with inputs swapped
    _                                          an input that may be anything, left unbound
    a = Linear(x)                              an op class: any node that is linear in x with
                                               constant parameters (Affine, Linear, Dense: OP_CLASSES)

A trailing `?` marks an optional input (a bias): it matches a present or an absent input.
`name:const` only matches a constant (an initializer or a Constant's output): the rule is
about constants, so a run-time tensor there is no match rather than a refusal (use
`require: constant:` for a condition whose failure the report should list).
Names are bound to tensors: a name that is the output of one line and an input of another
connects the two nodes, and a name used twice must be the same tensor both times. The last
line is the root: matching starts from it and walks to producers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import yaml

from ..folds.primitives import OP_CLASSES

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_LINE = re.compile(
    rf"^\s*(?P<outputs>\*?{_NAME}(?:\[\])?(?:\s*,\s*{_NAME}(?:\[\])?)*)\s*=\s*(?P<op>{_NAME})\s*(?P<rest>.*)$"
)
_INPUT = re.compile(rf"^(?P<star>\*)?(?P<name>{_NAME})(?P<elem>\[\])?(?P<const>:const)?(?P<optional>\?)?$")

COMMUTATIVE = frozenset({"Add", "Mul", "Sum", "Max", "Min"})


class PatternSyntaxError(ValueError):
    """A malformed pattern line; `column` is 1-based within the line."""

    def __init__(self, message: str, column: int = 1):
        super().__init__(message)
        self.column = column


@dataclass(frozen=True)
class ValueRef:
    """A name in a pattern: a tensor variable, per element of a variadic list or shared."""

    name: str
    per_element: bool = False  # written `name[]`
    optional: bool = False  # written `name?`
    variadic: bool = False  # written `*name`
    constant: bool = False  # written `name:const`
    wildcard: bool = field(init=False, repr=False, compare=False)  # written `_`

    def __post_init__(self):
        object.__setattr__(self, "wildcard", self.name == "_")


@dataclass(frozen=True)
class PatternNode:
    op_type: str
    outputs: tuple[ValueRef, ...]
    inputs: tuple[ValueRef, ...]
    attributes: tuple[tuple[str, object], ...]
    line: int = 0  # line in the rule file, for messages
    text: str = ""
    # derived from the above, once (the matcher reads them at every node it tries)
    is_element: bool = field(init=False, repr=False, compare=False)  # `parts[] = ...`: once per element
    variadic_input: ValueRef | None = field(init=False, repr=False, compare=False)
    fixed_inputs: tuple[ValueRef, ...] = field(init=False, repr=False, compare=False)  # the others, in order
    output_names: tuple[str, ...] = field(init=False, repr=False, compare=False)
    op_types: frozenset[str] = field(init=False, repr=False, compare=False)  # the ops it matches
    is_class: bool = field(init=False, repr=False, compare=False)  # an op class (OP_CLASSES)

    def __post_init__(self):
        derived = {
            "op_types": OP_CLASSES.get(self.op_type, frozenset({self.op_type})),
            "is_class": self.op_type in OP_CLASSES,
            "is_element": self.outputs[0].per_element,
            "variadic_input": next((ref for ref in self.inputs if ref.variadic), None),
            "fixed_inputs": tuple(ref for ref in self.inputs if not ref.variadic),
            "output_names": tuple(ref.name for ref in self.outputs),
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)


def parse_pattern_line(text: str, line: int = 0) -> PatternNode:
    match = _LINE.match(text)
    if not match:
        raise PatternSyntaxError("expected 'OUT = OpType(IN, ...)' or 'OUT = OpType[attr=value](IN, ...)'")
    outputs = tuple(_parse_ref(part.strip(), text) for part in match.group("outputs").split(","))
    rest = match.group("rest").strip()
    rest_column = match.start("rest") + 1
    attributes: tuple[tuple[str, object], ...] = ()
    if rest.startswith("["):
        close = _matching_bracket(rest, 0, rest_column)
        attributes = _parse_attributes(rest[1:close], rest_column + 1)
        rest = rest[close + 1 :].strip()
    if not (rest.startswith("(") and rest.endswith(")")):
        raise PatternSyntaxError("expected the inputs in parentheses after the op type", rest_column)
    inputs_text = rest[1:-1].strip()
    inputs = tuple(_parse_ref(part.strip(), text) for part in inputs_text.split(",")) if inputs_text else ()
    if sum(ref.variadic for ref in inputs) > 1:
        raise PatternSyntaxError("at most one variadic *input per node")
    for ref in outputs:
        if ref.optional or ref.wildcard or ref.constant or (ref.variadic and len(outputs) > 1):
            raise PatternSyntaxError(
                f"output {ref.name!r} cannot be optional, constant or '_', and *{ref.name} (all outputs) stands alone"
            )
    return PatternNode(match.group("op"), outputs, inputs, attributes, line, text.strip())


def _parse_ref(token: str, text: str) -> ValueRef:
    found = _INPUT.match(token)
    if not found:
        raise PatternSyntaxError(
            f"bad name {token!r}: a name, name?, name[], name:const, name[]:const? or *name", text.find(token) + 1
        )
    return ValueRef(
        found.group("name"),
        bool(found.group("elem")),
        bool(found.group("optional")),
        bool(found.group("star")),
        bool(found.group("const")),
    )


def _matching_bracket(text: str, start: int, column: int) -> int:
    depth = 0
    for index in range(start, len(text)):
        depth += {"[": 1, "]": -1}.get(text[index], 0)
        if depth == 0:
            return index
    raise PatternSyntaxError("unclosed '[' in the attribute list", column + start)


def _parse_attributes(text: str, column: int) -> tuple[tuple[str, object], ...]:
    attributes = []
    for item in _split_top_level(text):
        key, sep, value_text = item.partition("=")
        key = key.strip()
        if not sep or not re.fullmatch(_NAME, key):
            raise PatternSyntaxError(f"bad attribute condition {item.strip()!r}: expected name=value", column)
        try:
            value = yaml.safe_load(value_text)
        except yaml.YAMLError:
            raise PatternSyntaxError(f"bad value for attribute {key!r}: {value_text.strip()!r}", column) from None
        attributes.append((key, tuple(value) if isinstance(value, list) else value))
    return tuple(attributes)


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, current = [], 0, []
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if "".join(current).strip():
        parts.append("".join(current))
    return parts
