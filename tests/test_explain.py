"""optimize --explain RULE (why a rule did or did not fire at each node) and --disable-rule NAME."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from typer.testing import CliRunner

import convexport
from convexport.cli import app
from helpers import make_model, op_counts, tensor

RNG = np.random.default_rng(5)


def two_branches() -> onnx.ModelProto:
    """c1 = Conv(x) read twice (no conv-conv fold: h is shared); c2 = Conv(x) then BN (folds);
    c3 = Conv(x) then Relu (no second linear node)."""
    w = {f"w{i}": RNG.standard_normal([4, 3, 1, 1]).astype(np.float32) for i in range(3)}
    w["w4"] = RNG.standard_normal([4, 4, 1, 1]).astype(np.float32)
    bn = {k: RNG.uniform(0.5, 2, 4).astype(np.float32) for k in ("s", "t", "m", "v")}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c1"], name="shared"),
             helper.make_node("Conv", ["c1", "w4"], ["d"], name="after_shared"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["x", "w1"], ["c2"], name="conv_bn"),
             helper.make_node("BatchNormalization", ["c2", "s", "t", "m", "v"], ["b2"], name="bn"),
             helper.make_node("Conv", ["x", "w2"], ["c3"], name="lonely"),
             helper.make_node("Sum", ["d", "r1", "b2", "c3"], ["y"], name="sum")]
    return make_model(nodes, [tensor("x", [1, 3, 6, 6])], [tensor("y", [1, 4, 6, 6])], {**w, **bn})


def test_explain_says_for_each_node_what_happened():
    result = convexport.optimize(two_branches(), write=False, profile=False, explain=["conv-conv", "conv-batchnorm"],
                                 disable_rules=["parallel-conv-branches"])  # else the three Convs on x are stacked
    conv_conv = result.report["explain"]["conv-conv"]
    assert conv_conv["after_shared"].startswith("refused: h (c1) is also read by 1 other node")
    assert conv_conv["lonely"].startswith("no match: y = Conv(h, w2, b2?): no input of it is made by a Conv")
    assert result.report["explain"]["conv-batchnorm"]["bn"].startswith("rewritten: ")


def test_explain_prints_after_the_summary_and_names_unknown_rules(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(two_branches(), path)
    result = CliRunner().invoke(app, ["optimize", str(path), "--no-profile", "--explain", "conv-conv",
                                      "--disable-rule", "parallel-conv-branches"])
    assert result.exit_code == 0, result.output
    assert "explain conv-conv: 4 node(s) looked at" in result.stdout  # the BN fold made a fourth Conv
    assert "after_shared: refused: h (c1) is also read by 1 other node(s)" in result.stdout
    wrong = CliRunner().invoke(app, ["optimize", str(path), "--explain", "conv-cnov"])
    assert wrong.exit_code == 1 and "did you mean conv-conv" in wrong.stderr


def test_disable_rule_leaves_its_rewrites_undone():
    model = two_branches()
    result = convexport.optimize(model, write=False, profile=False, disable_rules="conv-batchnorm")
    assert "conv-batchnorm" not in {entry["rule"] for entry in result.report["rewrites"]}
    assert op_counts(result.model)["BatchNormalization"] == 1
    with pytest.raises(convexport.ConvexportError, match=r"disable_rules=\['nothing-like-it'\]: no rule of that name"):
        convexport.optimize(model, write=False, disable_rules=["nothing-like-it"])
