"""largest_group_count, and the minimal kernel conv_to_onnx emits (trimmed taps, coarse dilation)."""

import numpy as np
import torch
from algebra_reference import assert_exact, run_spec

from convexport.algebra import ConvSpec, conv_from_onnx, conv_to_onnx, largest_group_count
from convexport.algebra.taps import coarsen_dilation, trim_zero_taps


def _spec(weight, pads_begin, pads_end, dilation=1):
    nd = weight.ndim - 2
    return ConvSpec(weight, np.zeros(weight.shape[0]), False, (1,) * nd, (dilation,) * nd, pads_begin, pads_end)


def test_largest_group_count():
    rng = np.random.default_rng(0)
    assert largest_group_count(rng.standard_normal((4, 6, 3))) == 1
    for group in (2, 3, 6):
        dense = conv_from_onnx(rng.standard_normal((12, 6 // group, 3)), None, {"group": group}, None).weight
        assert largest_group_count(dense) == group
    assert largest_group_count(np.zeros((4, 6, 1))) == 2    # all-zero: every block structure fits
    depthwise_multiplier = conv_from_onnx(rng.standard_normal((8, 1, 3)), None, {"group": 4}, None).weight
    assert largest_group_count(depthwise_multiplier) == 4


def test_groups_are_contiguous_blocks_only():
    """A channel permutation of a grouped kernel is not grouped in ONNX's sense."""
    dense = conv_from_onnx(np.ones((4, 1, 1)), None, {"group": 4}, None).weight
    assert largest_group_count(dense[[2, 0, 3, 1]]) == 1


def test_zero_border_taps_are_trimmed_while_pads_allow():
    weight = np.zeros((1, 1, 5))
    weight[0, 0, 2] = 1.0
    trimmed = trim_zero_taps(_spec(weight, (2,), (1,)))
    assert trimmed.kernel_shape == (2,) and trimmed.pads_begin == (0,) and trimmed.pads_end == (0,)
    # The begin pad stops the leading trim; the end pad allows only one trailing tap.
    x = torch.randn(1, 1, 9, dtype=torch.float64)
    assert_exact(run_spec(x, trimmed), run_spec(x, _spec(weight, (2,), (1,))))


def test_trimming_respects_dilation():
    weight = np.zeros((1, 1, 3))
    weight[0, 0, 1] = 1.0
    spec = _spec(weight, (3,), (2,), dilation=2)
    trimmed = trim_zero_taps(spec)
    assert trimmed.kernel_shape == (1,) and trimmed.pads_begin == (1,) and trimmed.pads_end == (0,)
    x = torch.randn(1, 1, 8, dtype=torch.float64)
    assert_exact(run_spec(x, trimmed), run_spec(x, spec))


def test_interior_zero_taps_coarsen_the_dilation():
    weight = np.zeros((2, 2, 7, 1))
    weight[:, :, [0, 3, 6], 0] = 1.0
    spec = coarsen_dilation(_spec(weight, (1, 0), (1, 0)))
    assert spec.kernel_shape == (3, 1) and spec.dilations == (3, 1)
    _, _, attrs = conv_to_onnx(_spec(weight, (1, 0), (1, 0)))
    assert attrs["kernel_shape"] == [3, 1] and attrs["dilations"] == [3, 1] and attrs["pads"] == [1, 0, 1, 0]


def test_n_d_trimming_is_per_axis():
    weight = np.zeros((1, 1, 3, 3, 3))
    weight[0, 0, 1, 1, 1] = 2.0
    weight[0, 0, 1, 2, 1] = 1.0
    spec = _spec(weight, (1, 1, 1), (1, 1, 1))
    _, _, attrs = conv_to_onnx(spec)
    assert attrs["kernel_shape"] == [1, 2, 1] and attrs["pads"] == [0, 0, 0, 0, 1, 0]
    x = torch.randn(1, 1, 4, 5, 6, dtype=torch.float64)
    assert_exact(run_spec(x, spec), torch.nn.functional.conv3d(torch.nn.functional.pad(x, [1] * 6),
                                                               torch.tensor(weight)))
