"""Identity, AveragePool, zero Pad, per-channel scale/shift and BatchNorm as ConvSpecs."""

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from algebra_reference import (assert_close_float32, assert_exact, emitted, ort_folded, random_conv, random_input,
                               run_spec, torch_conv)

from convexport.algebra import (ConvSpec, avgpool_as_conv, batchnorm_scale_shift, identity_conv, merge_zero_pad,
                                scale_shift_after, scale_shift_before)

AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_identity_conv_is_x(nd):
    x = torch.randn(1, 3, *[5] * nd, dtype=torch.float64)
    assert_exact(run_spec(x, identity_conv(3, nd)), x)
    assert emitted(identity_conv(3, nd)).attrs["group"] == 3


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("kernel, stride, pad", [(2, 2, 0), (3, 1, 1), (3, 2, 1), (2, 1, 0), (3, 3, 0)])
@pytest.mark.parametrize("ceil_mode", [False, True])
def test_avgpool_with_counted_pads_is_a_depthwise_conv(nd, kernel, stride, pad, ceil_mode):
    # With ceil_mode, a length where ceil and floor agree (the others are refused).
    length = next(n for n in range(8, 8 + stride) if not ceil_mode or (n + 2 * pad - kernel) % stride == 0)
    spatial = (length,) * nd
    spec = avgpool_as_conv(4, [kernel] * nd, [stride] * nd, [pad] * nd, [pad] * nd, True, ceil_mode, spatial)
    assert isinstance(spec, ConvSpec), spec
    x = torch.randn(1, 4, *spatial, dtype=torch.float64)
    expected = AVG_POOL[nd](x, kernel, stride, pad, ceil_mode=ceil_mode, count_include_pad=True)
    assert_exact(run_spec(x, spec), expected)
    assert emitted(spec).attrs["group"] == 4


def test_avgpool_without_pads_may_exclude_pads_and_skip_the_shape():
    spec = avgpool_as_conv(2, [3, 3], [1, 1], [0, 0], [0, 0], False, True, None)
    x = torch.randn(1, 2, 7, 6, dtype=torch.float64)
    assert_exact(run_spec(x, spec), F.avg_pool2d(x, 3, 1, 0, ceil_mode=True, count_include_pad=False))


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_scale_shift_after_and_batchnorm(nd):
    rng = random.Random(nd)
    conv = random_conv(rng, nd, 3, 4, 1, "same", True)
    spatial = (9,) * nd
    gamma, beta, mean, var = (np.random.default_rng(i).uniform(0.5, 2.0, 4) for i in range(4))
    scale, shift = batchnorm_scale_shift(gamma, beta, mean, var, 1e-5)
    spec = scale_shift_after(conv.spec(spatial), scale, shift)
    x = random_input(rng, 3, spatial)
    expected = F.batch_norm(torch_conv(x, conv), *(torch.tensor(v) for v in (mean, var, gamma, beta)), eps=1e-5)
    assert_exact(run_spec(x, spec), expected)


def test_scalar_scale_and_shift_broadcast():
    spec = scale_shift_after(identity_conv(3, 1), 2.0, -1.0)
    x = torch.randn(1, 3, 5, dtype=torch.float64)
    assert_exact(run_spec(x, spec), 2 * x - 1)
    assert spec.has_bias
    assert not scale_shift_after(identity_conv(3, 1), 2.0, 0.0).has_bias


@pytest.mark.parametrize("nd", [1, 2])
def test_scale_shift_before_an_unpadded_conv(nd):
    rng = random.Random(nd)
    conv = random_conv(rng, nd, 3, 4, 1, "zero", False, strides=(1, 2))
    spatial = (11,) * nd
    scale, shift = np.array([0.5, 2.0, -1.0]), np.array([1.0, 0.0, -3.0])
    spec = scale_shift_before(conv.spec(spatial), scale, shift)
    x = random_input(rng, 3, spatial)
    view = (1, 3) + (1,) * nd
    expected = torch_conv(x * torch.tensor(scale).view(view) + torch.tensor(shift).view(view), conv)
    assert_exact(run_spec(x, spec), expected)


def test_scale_before_a_padded_conv_is_exact():
    conv = random_conv(random.Random(3), 2, 2, 2, 1, "same", True)
    spec = scale_shift_before(conv.spec(None), np.array([3.0, -0.5]), 0.0)
    x = torch.randn(1, 2, 6, 7, dtype=torch.float64)
    assert_exact(run_spec(x, spec), torch_conv(x * torch.tensor([3.0, -0.5]).view(1, 2, 1, 1), conv))


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_zero_pad_merges_into_the_conv_pads(nd):
    rng = random.Random(nd)
    conv = random_conv(rng, nd, 2, 3, 1, "asym", True)
    begin, end = [rng.randint(0, 2) for _ in range(nd)], [rng.randint(0, 3) for _ in range(nd)]
    spec = merge_zero_pad(conv.spec(None), begin, end)
    x = random_input(rng, 2, (10,) * nd)
    padded = F.pad(x, [p for axis in reversed(range(nd)) for p in (begin[axis], end[axis])])
    assert_exact(run_spec(x, spec), torch_conv(padded, conv))


def test_zero_pad_then_identity_in_onnxruntime():
    spec = merge_zero_pad(identity_conv(2, 2), [1, 0], [2, 3])
    x = np.random.default_rng(0).standard_normal((1, 2, 4, 5))
    expected = np.pad(x, [(0, 0), (0, 0), (1, 2), (0, 3)])
    assert_close_float32(ort_folded(x, spec), expected)
    np.testing.assert_array_equal(emitted(spec).weight.reshape(2), [1.0, 1.0])
