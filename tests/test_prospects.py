"""Prospects (primitives.Rewrite.complete): a conv-conv composite is judged on its outline
before its kernel is built, and built and judged again only when the outline passes."""

from __future__ import annotations

import numpy as np
import pytest

import convexport.folds.conv_chain as conv_chain
from convexport.ir import NameGenerator, import_graph
from convexport.rewrite import decisions, engine
from convexport.algebra import Refusal
from convexport.rewrite.engine import RewriteContext, RewriteSettings, rewrite_model
from convexport.rewrite.matcher import PatternMatcher
from convexport.folds import builtin_primitives
from graphs import RULES, GraphBuilder, fold

CONV_CONV = next(rule for rule in RULES if rule.name == "conv-conv")


def depthwise_then_pointwise(channels=32, out_channels=64, size=16):
    """An Xception pair: composed, a dense 3x3 conv with nine times the pointwise FLOPs."""
    builder = GraphBuilder([1, channels, size, size])
    y = builder.conv(builder.conv("x", channels, 3, pads=1, group=channels, bias=False), out_channels, 1)
    return builder, y


def never_built(monkeypatch):
    def build(*args, **kwargs):
        raise AssertionError("the composite was built")
    monkeypatch.setattr(conv_chain, "compose", build)


def test_a_prospect_the_estimate_refuses_is_never_built(monkeypatch):
    builder, y = depthwise_then_pointwise()
    never_built(monkeypatch)
    outcome, counts = fold(builder, [y], strategy="cost")
    assert counts == {"Conv": 2}
    (skip,) = outcome.skipped
    assert skip["rule"] == "conv-conv" and skip["reason"].startswith("estimated")
    numbers = skip["decision"]
    assert numbers["flops_after"] > 5 * numbers["flops_before"] and numbers["nodes_after"] == 1


def test_exact_and_measure_build_the_composite_itself():
    builder, y = depthwise_then_pointwise(channels=4, out_channels=6, size=8)
    outcome, counts = fold(builder, [y], strategy="all")
    assert counts == {"Conv": 1} and [entry["rule"] for entry in outcome.applied] == ["conv-conv"]


@pytest.mark.parametrize("out_channels, applied", [(3, True), (4, False)])
def test_a_prospect_that_passes_is_built_and_judged_with_its_border_map(out_channels, applied):
    """1x1 then a padded 3x3: the outline is one Conv and passes; the built rewrite adds the
    border map's Add, which the estimate judges too: with 4 outputs that tips it."""
    builder = GraphBuilder([1, 3, 12, 12])
    y = builder.conv(builder.conv("x", 5, 1), out_channels, 3, pads=1)
    outcome, counts = fold(builder, [y], strategy="cost")
    (entry,) = outcome.applied if applied else outcome.skipped
    assert entry["rule"] == "conv-conv" and entry["decision"]["nodes_after"] == 2
    assert counts == ({"Conv": 1, "Add": 1} if applied else {"Conv": 2})


def test_a_replay_reuses_the_decision_of_the_built_rewrite(monkeypatch):
    builder = GraphBuilder([1, 3, 12, 12])
    y = builder.conv(builder.conv("x", 5, 1), 4, 3, pads=1)
    model, decided = builder.model([y]), {}
    first = rewrite_model(model, RULES, builtin_primitives(), RewriteSettings("cost"), decided=decided)
    monkeypatch.setattr(engine, "by_estimate", lambda *args: pytest.fail("a replay judged again"))
    again = rewrite_model(model, RULES, builtin_primitives(), RewriteSettings("cost"), decided=decided)
    assert again.applied == first.applied and again.model.graph.node == first.model.graph.node


def _decide_at_the_pointwise_conv(builder, y, strategy):
    graph = import_graph(builder.model([y]))
    root = next(node for node in graph.nodes if node.outputs[0].name == y)
    members = set(map(id, graph.nodes))
    matcher = PatternMatcher(CONV_CONV, 18, set(map(id, graph.outputs)), members)
    context = RewriteContext(graph, 18, NameGenerator(graph), CONV_CONV.params, strategy)
    verdict = engine._decide(matcher.match(root), builtin_primitives()["compose_linear"], context, members)
    x = next(tensor for tensor in graph.inputs if tensor.name == "x")
    return verdict, [node.name for node in x.outputs]


@pytest.mark.parametrize("strategy", ["cost", "all"])
def test_nodes_built_for_a_decision_do_not_stay_readers_of_the_graph(strategy):
    """gs adds a new node to its inputs' readers: a stand-in, or a rewrite refused, would count
    as a second reader of x (and `private: [x]` would fail) if it were not unhooked."""
    builder, y = depthwise_then_pointwise()
    verdict, readers = _decide_at_the_pointwise_conv(builder, y, strategy)
    depthwise = builder.nodes[0].name
    if strategy == "cost":
        assert isinstance(verdict, Refusal) and readers == [depthwise]
    else:     # only the built rewrite's Conv, not the prospect's stand-in, joins the readers
        assert readers == [depthwise, verdict.nodes[0].name]


def test_the_refused_decision_is_what_the_built_composite_would_get():
    """The outline's estimate equals the estimate of the composite built in full."""
    builder, y = depthwise_then_pointwise(channels=8, out_channels=16, size=8)
    graph = import_graph(builder.model([y]))
    root = next(node for node in graph.nodes if node.outputs[0].name == y)
    matcher = PatternMatcher(CONV_CONV, 18, set(map(id, graph.outputs)), set(map(id, graph.nodes)))
    context = RewriteContext(graph, 18, NameGenerator(graph), CONV_CONV.params, "cost")
    prospect = builtin_primitives()["compose_linear"](matcher.match(root), context)
    built = prospect.complete()
    outputs = set(map(id, graph.outputs))
    judged = [decisions.by_estimate(r, 18, "cpu", outputs).numbers for r in (prospect, built)]
    assert judged[0] == judged[1]
    assert np.prod(built.nodes[0].inputs[1].shape) == np.prod(prospect.nodes[0].inputs[1].shape)


@pytest.mark.parametrize("name", ["all", "exact"])  # exact: the strategy's old name, still accepted
def test_strategy_all_applies_the_costly_fold_and_says_what_grew(name, tmp_path):
    import onnx

    import convexport
    from helpers import invoke

    builder, y = depthwise_then_pointwise()
    model = builder.model([y])
    result = convexport.optimize(model, strategy=name, write=False, profile=False)
    assert result.report["strategy"] == "all" and result.report["after"]["ops"] == {"Conv": 1}
    assert result.report["growth"]["flops"] > 5  # nine times the pointwise FLOPs, plus the depthwise's
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    said = invoke("optimize", path, "--strategy", name, "--no-profile", "-o", tmp_path / "o.onnx")
    assert said.exit_code == 0, said.output
    assert "grew: FLOPs " in said.stdout and "under --strategy all" in said.stdout
    default = invoke("optimize", path, "--no-profile", "-o", tmp_path / "d.onnx")
    assert "grew:" not in default.stdout
