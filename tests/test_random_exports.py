"""Random linear regions and shape arithmetic written in PyTorch and exported the way users
export them (dynamo without its optimizer: every Conv bias an Expand of a zero, every sum
started from 0; TorchScript without constant folding: every x.shape a Shape chain):
convexport's whole pipeline (constant folding to a fixed point, the rules, validation against
the original with ONNX Runtime) must stay exact, fold the regions and leave no shape
arithmetic on static dims."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import convexport

from helpers import run


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


class Reshaped(torch.nn.Module):
    """Shape arithmetic from x.shape, as model code writes it (the TorchScript exporter without
    constant folding makes each a Shape / Gather / Concat chain): a channel shuffle, a flatten
    and view back, a chunk and a Concat, tokens transposed there and back, a split of a view
    whose parts are flattened."""

    def __init__(self, rng):
        super().__init__()
        self.kind = str(rng.choice(["shuffle", "round trip", "chunk", "tokens", "split flatten"]))

    def forward(self, x):
        batch, channels, height, width = x.shape
        if self.kind == "shuffle":
            return x.view(batch, 2, channels // 2, height, width).transpose(1, 2).reshape(batch, channels, height, width)
        if self.kind == "round trip":
            return x.flatten(2).view(batch, channels, height, width)
        if self.kind == "chunk":
            first, second = x.chunk(2, dim=1)
            return torch.cat([second, torch.relu(first)], dim=1)
        if self.kind == "split flatten":  # EfficientViT-M's: the parts' shapes are known after a first fold
            first, second = x.view(batch, -1, height, width).split([1, channels - 1], dim=1)
            return torch.cat([first.flatten(2), second.flatten(2)], dim=1).view(batch, channels, height, width)
        tokens = x.flatten(2).transpose(1, 2)
        return tokens.transpose(1, 2).reshape(batch, -1, height, width)


def random_network(seed: int) -> torch.nn.Module:
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    channels, layers = 4, []
    for _ in range(int(rng.integers(1, 4))):
        region = Region(rng, channels)
        layers += [region, torch.nn.ReLU()] if rng.random() < 0.5 else [region]
        if region.how == "concat":
            layers.append(torch.nn.Conv2d(channels * len(region.branches), channels, 1))
        if rng.random() < 0.5:
            layers.append(Reshaped(rng))
    return torch.nn.Sequential(*layers).eval()


EXAMPLES = int(os.environ.get("CONVEXPORT_FUZZ_EXPORTS", "8"))
SHAPE_OPS = ("Shape", "Gather", "Unsqueeze", "Squeeze", "ConstantOfShape", "Range", "Size")


@pytest.mark.parametrize("route", ["dynamo-unoptimized", "torchscript", "torchscript-dynamic-batch"])
def test_random_exported_regions_stay_exact_and_fold(tmp_path, route):
    folded = []

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.integers(0, 2**31 - 1))
    def check(seed):
        network, x = random_network(seed), torch.randn(1, 4, 9, 9)
        path = tmp_path / f"r{seed}.onnx"
        with torch.no_grad():
            if route.startswith("torchscript"):
                dynamic = {"x": {0: "N"}} if route.endswith("dynamic-batch") else None
                torch.onnx.export(network, (x,), str(path), dynamo=False, do_constant_folding=False,
                                  input_names=["x"], dynamic_axes=dynamic)
            else:
                torch.onnx.export(network, (x,), str(path), dynamo=True, optimize=False)
        result = convexport.optimize(str(path), write=False, profile=False)   # validates, raises if not exact
        report = result.report
        assert report["validation"]["passed"]
        left = {op: n for op, n in report["after"]["ops"].items() if op in SHAPE_OPS}
        assert not left, left  # no shape arithmetic is left to run: a dynamic batch is copied (0) or inferred (-1)
        folded.append(len(report["rewrites"]) > 0)
        if route.endswith("dynamic-batch"):  # the batch stays dynamic: the graph runs at another batch, the same
            feeds = {"x": np.random.default_rng(seed).standard_normal([3, 4, 9, 9]).astype(np.float32)}
            want, got = run(result.original, feeds), run(result.model, feeds)
            for expected, actual in zip(want, got):
                np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(expected).max()))

    check()
    assert sum(folded) >= len(folded) - 1, folded
