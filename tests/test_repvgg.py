"""A RepVGG-style network folds automatically to what hand re-parameterisation gives."""

from __future__ import annotations

import numpy as np
import onnx
import torch

import convexport
from conftest import FIXTURES
from helpers import op_counts, run
from repvgg import build, build_deploy


def test_training_form_folds_to_the_deploy_form(tmp_path):
    trained = convexport.optimize(f"{FIXTURES}/repvgg.py:build", output=tmp_path / "auto.onnx", profile=False)
    deploy = convexport.optimize(f"{FIXTURES}/repvgg.py:build_deploy", output=tmp_path / "hand.onnx",
                                 profile=False, builtin_rules=False)
    auto, hand = onnx.load(str(trained.output)), onnx.load(str(deploy.output))
    assert trained.report["before"]["ops"]["Conv"] == 14
    assert op_counts(auto)["Conv"] == op_counts(hand)["Conv"] == 7
    assert "Add" not in op_counts(auto) and "BatchNormalization" not in op_counts(auto)
    x = build()[1][0]
    with torch.no_grad():
        expected = build()[0](x).numpy()
        np.testing.assert_allclose(build_deploy()[0](x).numpy(), expected, rtol=1e-4, atol=1e-5)
    (actual,) = run(auto, {auto.graph.input[0].name: x.numpy()})
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)
