"""Rule files and the pattern language: what parses, and errors as file:line:col."""

from __future__ import annotations

import textwrap

import pytest

from convexport.errors import ConvexportError
from convexport.rewrite.pattern import PatternSyntaxError, parse_pattern_line
from convexport.folds import builtin_primitives
from convexport.rewrite.rulefile import builtin_rule_files, load_rules, parse_rule_file

PRIMITIVES = set(builtin_primitives())


def write(tmp_path, text):
    path = tmp_path / "rules.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_pattern_line_parts():
    line = parse_pattern_line("y = Concat[axis=1, pads=[0, 1]](*parts)")
    assert line.op_type == "Concat" and dict(line.attributes) == {"axis": 1, "pads": (0, 1)}
    assert line.variadic_input.name == "parts"
    element = parse_pattern_line("parts[] = Conv(x, w[], b[]?)")
    assert element.is_element and element.inputs[1].per_element and element.inputs[2].optional
    assert not element.inputs[0].per_element


@pytest.mark.parametrize("text", ["Conv(x)", "y = Conv x", "y = Conv[axis](x)", "y? = Conv(x)",
                                  "y = Conv(*a, *b)", "y = Conv[axis=1(x)", "y = Conv(x-1)"])
def test_pattern_syntax_errors(text):
    with pytest.raises(PatternSyntaxError):
        parse_pattern_line(text)


def test_builtin_rules_load():
    rules = load_rules(builtin_rule_files(), PRIMITIVES)
    names = {rule.name for rule in rules}
    assert {"conv-batchnorm", "drop-identity", "drop-dropout"} <= names
    assert all(rule.doc and rule.file.endswith(".yaml") and rule.line > 0 for rule in rules)


def test_valid_user_rule(tmp_path):
    path = write(tmp_path, """
        rules:
          - name: my-bn
            doc: mine
            match:
              - h = Conv(x, w, b?)
              - y = BatchNormalization(h, s, t, m, v)
            require:
              constant: [w, b, s, t, m, v]
            apply: compose_linear
    """)
    (rule,) = parse_rule_file(path, PRIMITIVES)
    assert rule.root.op_type == "BatchNormalization" and rule.line == 3


@pytest.mark.parametrize("body, line, fragment", [
    ("rules:\n  - name: a\n    doc: d\n    match: [y = Nope(x)]\n    apply: forward_input\n", 4, "unknown ONNX op 'Nope'"),
    ("rules:\n  - name: a\n    doc: d\n    match: [y = Identity(x)]\n    apply: no_such\n", 5, "unknown primitive"),
    ("rules:\n  - name: a\n    doc: d\n    match: [y = Identity(x)]\n    require: {constant: [q]}\n    apply: forward_input\n", 5, "does not bind"),
    ("rules:\n  - name: a\n    doc: d\n    match: [y = Identity(x)]\n    require: {shiny: [x]}\n    apply: forward_input\n", 5, "unknown condition"),
    ("rules:\n  - name: a\n    doc: d\n    match:\n      - h = Relu(x)\n      - y = Identity(x)\n    apply: forward_input\n", 5, "not read by any later line"),
    ("rules:\n  - name: a\n    match: [y = Identity(x)]\n    apply: forward_input\n", 2, "lacks 'doc'"),
    ("rules:\n  - name: a\n    doc: d\n    colour: red\n    match: [y = Identity(x)]\n    apply: forward_input\n", 4, "unknown key 'colour'"),
    # the bracket left open on line 4 (the parser notices on line 5, and says so)
    ("rules:\n  - name: a\n    doc: d\n    match: [y = Identity(x)\n    apply: forward_input\n", 4, "not valid YAML"),
    ("rules:\n  - name: a\n    doc: d\n    match: [y = Identity(x)]\n    apply: forward_input\n"
     "    with: {k: !!python/object:os.system {}}\n", 6, "not valid YAML"),
    ("rules:\n  - name: a\n    doc: d\n    match: [y = Identity(x)]\n    require: {constant: !!binary x}\n"
     "    apply: forward_input\n", 5, "not valid YAML"),
    ("rules:\n  - name: a\n    doc: d\n    match: [y = Identity(x]\n    apply: forward_input\n", 4, "inputs in parentheses"),
    ("rules:\n  - name: a\n    doc: d\n    match:\n      - y = Identity x\n    apply: forward_input\n", 5, "expected"),
    ("rules:\n  - name: a\n    doc: d\n    match:\n      - y = Conv[colour=1](x, w)\n    apply: forward_input\n", 5,
     "Conv has no attribute 'colour'"),
    ("rules:\n  - name: a\n    doc: d\n    match:\n      - y = Conv[group=one](x, w)\n    apply: forward_input\n", 5,
     "'group' is an integer, not 'one'"),
    ("rules:\n  - name: a\n    doc: d\n    match:\n      - y = Conv[pads=1](x, w)\n    apply: forward_input\n", 5,
     "'pads' is a list of integers"),
    ("rules:\n  - name: a\n    doc: d\n    match:\n      - y = If[then_branch=1](c)\n    apply: forward_input\n", 5,
     "a pattern cannot compare"),
    ("rules:\n  - name: a\n    doc: d\n    match:\n      - h = Relu(y)\n      - y = Relu(h)\n    apply: forward_input\n", 5,
     "form a cycle"),
])
def test_rule_errors_name_file_and_line(tmp_path, body, line, fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    with pytest.raises(ConvexportError) as caught:
        parse_rule_file(path, PRIMITIVES)
    message = str(caught.value)
    assert message.startswith(f"{path}:{line}:"), message
    assert fragment in message


def test_duplicate_rule_names(tmp_path):
    text = "rules:\n  - name: a\n    doc: d\n    match: [y = Identity(x)]\n    apply: forward_input\n"
    first, second = tmp_path / "one.yaml", tmp_path / "two.yaml"
    first.write_text(text)
    second.write_text(text)
    with pytest.raises(ConvexportError, match="already defined"):
        load_rules([first, second], PRIMITIVES)


def test_builtin_rule_files_are_parsed_once_and_users_files_every_time(tmp_path):
    names = set(builtin_primitives())
    first, again = ([parse_rule_file(path, names) for path in builtin_rule_files()] for _ in range(2))
    assert all(a is b for rules, others in zip(first, again) for a, b in zip(rules, others))
    path = tmp_path / "mine.yaml"
    path.write_text("rules:\n  - name: a\n    doc: d\n    match: [y = Identity(x)]\n    apply: forward_input\n")
    assert [rule.name for rule in parse_rule_file(path, names)] == ["a"]
    path.write_text("rules:\n  - name: b\n    doc: d\n    match: [y = Identity(x)]\n    apply: forward_input\n")
    assert [rule.name for rule in parse_rule_file(path, names)] == ["b"]
