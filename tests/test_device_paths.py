"""The CUDA paths, run here without a GPU by standing the CPU provider in for it: validation on
the target device (original and optimized with TF32 off, TF32's own effect reported), and the
cost model's units (a decision does not change with the batch size alone)."""

from __future__ import annotations

import pytest

import convexport
from convexport import validate
from convexport.runtime import create_session
from test_hostile import conv_bn


class Skewed:
    """A session whose outputs are off by `offset` (a device kernel that is wrong)."""

    def __init__(self, session, offset: float):
        self.session, self.offset = session, offset

    def get_outputs(self):
        return self.session.get_outputs()

    def run(self, names, feeds):
        return [value + self.offset for value in self.session.run(names, feeds)]


@pytest.fixture
def on_fake_cuda(monkeypatch):
    """optimize() believes it runs on CUDA; sessions for "cuda" are CPU sessions, recorded as
    (device, tf32), the optimized graph's skewed by `skew["cuda"]` there."""
    made, skew = [], {"cuda": 0.0}

    def session(model, device="cpu", optimize=True, profile_path=None, what="the model", tf32=True):
        made.append((device, tf32, what))
        real = create_session(model, "cpu", optimize, profile_path, what, tf32)
        optimized = model.graph.node[0].op_type == "Conv" and len(model.graph.node) == 1
        return Skewed(real, skew["cuda"]) if device == "cuda" and optimized else real

    monkeypatch.setattr("convexport.pipeline.resolve_device", lambda device: "cuda")
    monkeypatch.setattr(validate, "create_session", session)
    return made, skew


def test_the_optimized_graph_is_also_validated_on_the_device(on_fake_cuda):
    made, _ = on_fake_cuda
    report = convexport.optimize(conv_bn(), write=False, profile=False).report
    on_device = report["validation"]["on_device"]
    assert on_device["passed"] and on_device["provider"] == "CUDAExecutionProvider" and on_device["tf32"] is False
    assert set(on_device["tf32_effect"]) == {"y"}
    cuda_sessions = [(device, tf32) for device, tf32, _ in made if device == "cuda"]
    assert cuda_sessions.count(("cuda", False)) == 3 and cuda_sessions.count(("cuda", True)) == 1  # TF32 on once
    assert ("cpu", False, "the optimized graph") in made  # the CPU check stays the reference


def test_a_graph_that_differs_on_the_device_only_is_refused_there(on_fake_cuda):
    _, skew = on_fake_cuda
    skew["cuda"] = 1e-2
    with pytest.raises(convexport.ValidationError, match="on CUDAExecutionProvider .TF32 off.") as failed:
        convexport.optimize(conv_bn(), write=False, profile=False)
    validation = failed.value.report["validation"]
    assert not validation["passed"] and not validation["on_device"]["passed"]
    assert all(error["mismatches"] == 0 for error in validation["outputs"].values())  # the CPU check passed
    assert validation["culprit"]["rule"] == "conv-batchnorm"  # found by the device's check
