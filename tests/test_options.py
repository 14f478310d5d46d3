"""optimize's options are one frozen object (convexport/options.py): the CLI builds it, the API
takes it or the same names as keywords (issue 38, item 5)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

import convexport
from convexport.options import OPTION_NAMES, OptimizeOptions
from convexport.pipeline import optimize


def test_the_api_takes_an_options_object(small_net_path):
    options = OptimizeOptions(inputs=["x:1x3x16x16"], write=False, profile=False, strategy="all")
    report = convexport.optimize(f"{small_net_path}:build", options=options).report
    assert report["strategy"] == "all" and report["validation"]["passed"]


def test_keywords_are_the_options_fields(small_net_path):
    report = convexport.optimize(f"{small_net_path}:build", write=False, profile=False, validate=False).report
    assert report["validation"] is None and report["profile"] is None


def test_options_and_arguments_together_are_refused():
    with pytest.raises(TypeError, match="not both"):
        optimize("m.onnx", strategy="all", options=OptimizeOptions())
    with pytest.raises(TypeError, match="not both"):
        optimize("m.onnx", options=OptimizeOptions(), write=False)


def test_an_unknown_keyword_is_named():
    with pytest.raises(TypeError, match="no_such_option"):
        optimize("m.onnx", no_such_option=1)


def test_options_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        OptimizeOptions().strategy = "all"


def test_the_contract_signature_is_kept():
    """DESIGN.md's `optimize(model, inputs=None, output=None, rules=(), strategy="cost",
    device="auto", validate=True, profile=True)`, each also an option of the one object."""
    parameters = list(inspect.signature(optimize).parameters.values())
    positional = [(p.name, p.default) for p in parameters[1:8]]
    assert positional == [("inputs", None), ("output", None), ("rules", ()), ("strategy", "cost"),
                          ("device", "auto"), ("validate", True), ("profile", True)]
    assert {name for name, _ in positional} <= OPTION_NAMES
    assert all(getattr(OptimizeOptions(), name) == default for name, default in positional)
