"""Random graphs of conv chains, branch sums and linear regions (Conv / BatchNormalization /
per-channel Mul and Add / AveragePool branches summed, subtracted, concatenated, scaled and
added back): no rewrite may change any output, and the engine's shortcut in later passes
misses none of them."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import convexport
from convexport.rewrite.changes import ChangeLog
from graphs import GraphBuilder, assert_same_outputs, rewrite

SAMPLES = Path(__file__).resolve().parent.parent / "sample_models"


def random_conv(builder: GraphBuilder, x, rng, stride=None, same=False):
    """A conv on x with random geometry; `same` keeps stride 1 and the spatial size."""
    channels = builder.shapes[x][1]
    same = same or min(builder.shapes[x][2:]) < 7        # keep every output non-empty
    kernel, dilation = int(rng.integers(1, 4)), int(rng.integers(1, 3))
    stride = stride if stride is not None else (1 if same else int(rng.integers(1, 3)))
    nd = len(builder.shapes[x]) - 2
    if same:
        total = dilation * (kernel - 1)
        begin = int(rng.integers(0, total + 1))
        pads = [begin] * nd + [total - begin] * nd
    else:
        pads = [int(rng.integers(0, kernel)) for _ in range(2 * nd)]
    group = int(rng.choice([g for g in (1, 2, channels) if channels % g == 0]))
    out = channels if same or rng.random() < 0.5 else int(rng.choice([2, 4, 6]))
    out = out if out % group == 0 else group
    return builder.conv(x, out, kernel, stride=stride, dilation=dilation, pads=pads, group=group,
                        bias=bool(rng.random() < 0.6))


def random_linear_branch(builder: GraphBuilder, x, rng):
    """A linear node of x keeping its shape: a Conv, a BatchNormalization, a per-channel Mul or
    Add, or a 3-wide AveragePool (padded, counting the padding or not)."""
    nd = len(builder.shapes[x]) - 2
    channels = [builder.shapes[x][1]] + [1] * nd
    choice = int(rng.integers(0, 5))
    if choice == 0:
        return random_conv(builder, x, rng, same=True)
    if choice == 1:
        return builder.batchnorm(x)
    if choice == 2:
        return builder.node("Mul", [x, builder.const(builder.rng.uniform(-2, 2, channels))])
    if choice == 3:
        return builder.node("Add", [builder.const(builder.rng.standard_normal(channels)), x])
    return builder.node("AveragePool", [x], kernel_shape=[3] * nd, pads=[1] * (2 * nd),
                        count_include_pad=int(rng.integers(0, 2)))


def random_region(builder: GraphBuilder, x, rng):
    """A linear region on x: branches summed, subtracted or concatenated, maybe scaled and
    added back (FastViT's x + gamma * (mixer(x) - norm(x))), maybe normalised after a Concat."""
    a, b = random_linear_branch(builder, x, rng), random_linear_branch(builder, x, rng)
    if rng.random() < 0.3:
        y = builder.node("Concat", [a, b], axis=1)
        return builder.batchnorm(y) if rng.random() < 0.5 else y
    y = builder.node(str(rng.choice(["Add", "Sub"])), [a, b])
    if rng.random() < 0.5:
        nd = len(builder.shapes[x]) - 2
        gamma = builder.const(builder.rng.uniform(0.1, 1, [builder.shapes[x][1]] + [1] * nd))
        y = builder.node("Add", [x, builder.node("Mul", [gamma, y])])
    return y


def random_graph(seed: int):
    rng = np.random.default_rng(seed)
    nd = int(rng.integers(1, 4))
    spatial = [int(rng.integers(7, 12)) for _ in range(nd)]
    builder = GraphBuilder([1, 4, *spatial], seed=seed)
    x = "x"
    for _ in range(int(rng.integers(2, 5))):
        choice = rng.random()
        if choice < 0.15:
            x = random_region(builder, x, rng)
        elif choice < 0.2:
            x = builder.node("Relu", [x])
        elif choice < 0.35:
            x = random_conv(builder, x, rng)
        elif choice < 0.6:
            a, b = random_conv(builder, x, rng, same=True), random_conv(builder, x, rng, same=True)
            if builder.shapes[a] == builder.shapes[b]:
                x = builder.node(str(rng.choice(["Add", "Sub"])), [a, b])
            else:
                x = builder.node("Concat", [a, b], axis=1)
        elif choice < 0.75:
            a = random_conv(builder, x, rng, same=True)
            x = builder.node("Add", [a, x]) if builder.shapes[a] == builder.shapes[x] else a
        elif choice < 0.9:
            x = builder.batchnorm(x)
        else:
            scale = builder.rng.uniform(0.5, 2, [builder.shapes[x][1]] + [1] * nd)
            x = builder.node("Mul", [x, builder.const(scale)])
    return builder, x


def check(seed: int) -> int:
    builder, y = random_graph(seed)
    model = builder.model([y])
    outcome = rewrite(model, "all")
    assert_same_outputs(model, outcome.model, builder.input_shape, seed=seed)
    return len(outcome.applied)


# CI runs a fixed budget; `make fuzz` sets CONVEXPORT_FUZZ_EXAMPLES=10000.
FUZZ_EXAMPLES = int(os.environ.get("CONVEXPORT_FUZZ_EXAMPLES", "60"))


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.integers(0, 2**31 - 1))
def test_random_graphs_stay_exact(seed):
    check(seed)


def test_random_graphs_are_mostly_folded():
    """The generator is not vacuous: most graphs get folded somewhere."""
    folded = sum(check(seed) > 0 for seed in range(40))
    assert folded >= 30, folded


def looked_at_everywhere(monkeypatch):
    """Every rule looks at the whole graph in every pass (changes.py's shortcut off)."""
    monkeypatch.setattr(ChangeLog, "region", lambda self, scope, rule, candidates, reach: None)


def applied_and_graph(outcome):
    return ([(entry["rule"], entry["nodes"]) for entry in outcome.applied],
            [(node.op_type, list(node.input), list(node.output)) for node in outcome.model.graph.node])


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture])
@given(st.integers(0, 2**31 - 1))
def test_looking_only_where_the_graph_changed_finds_every_rewrite(monkeypatch, seed):
    """The engine's later passes look only near changes (rewrite/changes.py); looking everywhere
    applies the same rewrites, in the same order, to the same graph."""
    builder, y = random_graph(seed)
    model = builder.model([y])
    near_changes = applied_and_graph(rewrite(model, "all"))
    with monkeypatch.context() as patch:
        looked_at_everywhere(patch)
        everywhere = applied_and_graph(rewrite(model, "all"))
    assert near_changes == everywhere


@pytest.mark.parametrize("sample", ["seed000_subtracted_conv.py", "seed001_bottleneck3d.py",
                                    "seed002_group_attention.py", "seed004_full_padding.py"])
def test_sample_models_get_the_same_rewrites_either_way(monkeypatch, sample):
    exported = convexport.optimize(str(SAMPLES / sample), write=False, validate=False, profile=False).original
    near_changes = applied_and_graph(rewrite(exported, "all"))
    looked_at_everywhere(monkeypatch)
    assert applied_and_graph(rewrite(exported, "all")) == near_changes
