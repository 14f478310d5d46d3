"""Random linear regions written in PyTorch and exported the way users export them (dynamo
without its optimizer: every Conv bias an Expand of a zero, every sum started from 0;
TorchScript without constant folding): convexport's whole pipeline (constant folding, the
rules, validation against the original with ONNX Runtime) must stay exact, and fold them."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import convexport


def random_branch(rng, channels):
    """A linear module keeping [N, C, H, W]: a Conv (full or depthwise, 1x1 to 5x5), a
    BatchNorm2d with random statistics, a per-channel scale, or an AvgPool 3x3."""
    kind = int(rng.integers(0, 4))
    if kind == 0:
        size = int(rng.choice([1, 3, 5]))
        groups = int(rng.choice([1, channels]))
        return torch.nn.Conv2d(channels, channels, size, padding=size // 2, groups=groups, bias=bool(rng.integers(0, 2)))
    if kind == 1:
        bn = torch.nn.BatchNorm2d(channels)
        bn.running_mean.uniform_(-1, 1), bn.running_var.uniform_(0.5, 2), bn.weight.data.uniform_(-1, 1)
        return bn
    if kind == 2:
        return Scale(channels)
    return torch.nn.AvgPool2d(3, 1, 1)


class Scale(torch.nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.gamma = torch.nn.Parameter(torch.rand(channels, 1, 1) + 0.1)

    def forward(self, x):
        return self.gamma * x


class Region(torch.nn.Module):
    """Branches of one input combined: summed from 0 (as multi-branch blocks write it),
    subtracted, scaled and added back (FastViT's RepMixer), or concatenated then normalised."""

    def __init__(self, rng, channels):
        super().__init__()
        self.branches = torch.nn.ModuleList(random_branch(rng, channels) for _ in range(int(rng.integers(2, 4))))
        self.how = str(rng.choice(["sum", "sub", "mixer", "concat"]))
        self.scale = Scale(channels)
        self.norm = torch.nn.BatchNorm2d(channels * len(self.branches))

    def forward(self, x):
        outs = [branch(x) for branch in self.branches]
        if self.how == "sum":
            return sum(outs)
        if self.how == "sub":
            return outs[0] - sum(outs[1:])
        if self.how == "mixer":
            return x + self.scale(outs[0] - outs[1])
        return self.norm(torch.cat(outs, 1))


def random_network(seed: int) -> torch.nn.Module:
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    channels, layers = 4, []
    for _ in range(int(rng.integers(1, 4))):
        region = Region(rng, channels)
        layers += [region, torch.nn.ReLU()] if rng.random() < 0.5 else [region]
        if region.how == "concat":
            layers.append(torch.nn.Conv2d(channels * len(region.branches), channels, 1))
    return torch.nn.Sequential(*layers).eval()


EXAMPLES = int(os.environ.get("CONVEXPORT_FUZZ_EXPORTS", "8"))


@pytest.mark.parametrize("route", ["dynamo-unoptimized", "torchscript"])
def test_random_exported_regions_stay_exact_and_fold(tmp_path, route):
    folded = []

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.integers(0, 2**31 - 1))
    def check(seed):
        network, x = random_network(seed), torch.randn(1, 4, 9, 9)
        path = tmp_path / f"r{seed}.onnx"
        with torch.no_grad():
            if route == "torchscript":
                torch.onnx.export(network, (x,), str(path), dynamo=False, do_constant_folding=False)
            else:
                torch.onnx.export(network, (x,), str(path), dynamo=True, optimize=False)
        result = convexport.optimize(str(path), write=False, profile=False)   # validates, raises if not exact
        report = result.report
        assert report["validation"]["passed"]
        folded.append(len(report["rewrites"]) > 0)

    check()
    assert sum(folded) >= len(folded) - 1, folded
