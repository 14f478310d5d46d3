"""The matcher's cheap test on the root's inputs (which ops make them, how many are constants)
only ever turns away what the full match would turn away."""

from __future__ import annotations

import pytest

from convexport.ir import import_graph
from convexport.rewrite.matcher import PatternMatcher
from convexport.rewrite.rulefile import load_rules
from graphs import RULES, GraphBuilder
from test_random_graphs import random_graph


def _bindings(match):
    return None if match is None else sorted((name, getattr(value, "name", None)) for name, value in match.values.items()
                                            if not isinstance(value, list))


def _matchers(rule, graph):
    quick = PatternMatcher(rule, 18, set(map(id, graph.outputs)), set(map(id, graph.nodes)))
    full = PatternMatcher(rule, 18, set(map(id, graph.outputs)), set(map(id, graph.nodes)))
    full.root_feeders, full.root_constants = (), 0
    return quick, full


def _assert_same_verdicts(model) -> int:
    """Every non-group rule at every node of its root op: the same match with and without the
    cheap test; returns how many nodes the cheap test turned away."""
    graph = import_graph(model)
    turned_away = 0
    for rule in RULES:
        if rule.is_group:
            continue
        quick, full = _matchers(rule, graph)
        for node in graph.nodes:
            if node.op == rule.root.op_type:
                expected = _bindings(full.match(node))
                assert _bindings(quick.match(node)) == expected, (rule.name, node.name)
                turned_away += expected is None and not _passes_cheap_test(quick, node)
    return turned_away


def _passes_cheap_test(matcher, node) -> bool:
    """Whether the match went past the cheap test (it reached the full match)."""
    reached = []
    original = matcher._node
    matcher._node = lambda *args: reached.append(True) or original(*args)
    matcher.match(node)
    matcher._node = original
    return bool(reached)


@pytest.mark.parametrize("seed", range(40))
def test_random_graphs_match_alike_with_and_without_the_cheap_test(seed):
    builder, y = random_graph(seed)
    _assert_same_verdicts(builder.model([y]))


def test_residual_blocks_are_turned_away_by_the_cheap_test_and_matched_alike():
    """x + Conv(Relu(BN(Conv(x)))): an Add with one linear input is no add-linear-branches, and one
    without a constant input no conv-add, before any pattern line is tried."""
    builder = GraphBuilder([1, 4, 6, 6])
    x = "x"
    for _ in range(3):
        inner = builder.node("Relu", [builder.batchnorm(builder.conv(x, 4, 3, pads=1))])
        x = builder.node("Add", [x, builder.conv(inner, 4, 1)])
    assert _assert_same_verdicts(builder.model([x])) > 0
    graph = import_graph(builder.model([x]))
    add = next(node for node in graph.nodes if node.op == "Add")
    for name in ("add-linear-branches", "conv-add", "add-add-constants"):
        quick, _ = _matchers(next(rule for rule in RULES if rule.name == name), graph)
        assert not _passes_cheap_test(quick, add), name


def test_a_name_written_twice_at_the_root_is_not_counted(tmp_path):
    """y = Add(k, k:const): the second k is checked against the first binding only, so the
    cheap test must not demand a constant input (the full match binds k to a run-time tensor)."""
    rules_file = tmp_path / "twice.yaml"
    rules_file.write_text("rules:\n  - name: twice\n    doc: d\n    match:\n      - y = Add(k, k:const)\n"
                          "    apply: forward_input\n")
    rule = load_rules([rules_file], {"forward_input"})[0]
    builder = GraphBuilder([1, 2, 3, 3])
    y = builder.node("Add", ["x", "x"])
    graph = import_graph(builder.model([y]))
    quick, full = _matchers(rule, graph)
    assert quick.root_constants == 0
    assert _bindings(quick.match(graph.nodes[0])) == _bindings(full.match(graph.nodes[0])) is not None


def test_an_input_read_twice_counts_for_two_feeders():
    """Add(a, a) with a = Conv: two inputs made by a linear node, as add-linear-branches' cheap test asks."""
    builder = GraphBuilder([1, 2, 5, 5])
    a = builder.conv("x", 2, 3, pads=1)
    y = builder.node("Add", [a, a])
    graph = import_graph(builder.model([y]))
    add = next(node for node in graph.nodes if node.op == "Add")
    quick, _ = _matchers(next(rule for rule in RULES if rule.name == "add-linear-branches"), graph)
    assert _passes_cheap_test(quick, add)
    _assert_same_verdicts(builder.model([y]))
