"""compose: second(first(x)) as one conv, over a grid of geometries, exact or refused."""

import random

import numpy as np
import pytest
from algebra_reference import (verdict, PAD_MODES, OnnxConv, assert_close_float32, assert_exact, differs, emitted,
                               ort_chain, ort_folded, random_conv, random_input, run_spec, torch_conv)

from convexport.algebra import AxisGeometry, Composition, Refusal, compose, identity_conv, largest_group_count
from convexport.algebra import padding_reads
from convexport.algebra.compose import composite_conv

# (input channels, middle channels, output channels, group of the first, group of the second)
CHANNELS = {"dense": (3, 4, 5, 1, 1), "grouped": (4, 6, 4, 2, 2), "depthwise": (4, 4, 4, 4, 4)}


def _min_length(first: OnnxConv, second: OnnxConv, axis: int) -> int:
    """The smallest input length on `axis` for which both convs have an output."""
    a, b = first.spec(None).axis(axis), second.spec(None).axis(axis)
    length = 1
    while a.output_length(length) < 1 or b.output_length(a.output_length(length)) < 1:
        length += 1
    return length


def _chain(rng, nd, pads1, pads2, bias, channels):
    cin, mid, cout, g1, g2 = CHANNELS[channels]
    first = random_conv(rng, nd, cin, mid, g1, pads1, bias)
    second = random_conv(rng, nd, mid, cout, g2, pads2, bias and rng.random() < 0.5)
    spatial = tuple(max(_min_length(first, second, axis), rng.randint(5, 9 if nd == 3 else 12)) for axis in range(nd))
    return first, second, spatial


def _cases():
    rng = random.Random(7)
    for nd in (1, 2, 3):
        for pads1 in PAD_MODES:
            for pads2 in PAD_MODES:
                for bias in (False, True):
                    channels = rng.choice(list(CHANNELS))
                    yield pytest.param(nd, pads1, pads2, bias, channels, rng.getrandbits(32),
                                       id=f"{nd}d-{pads1}-{pads2}-{'bias' if bias else 'nobias'}-{channels}")


@pytest.mark.parametrize("nd, pads1, pads2, bias, channels, seed", list(_cases()))
def test_compose_is_exact_or_refused_with_reason(nd, pads1, pads2, bias, channels, seed):
    rng = random.Random(seed)
    first, second, spatial = _chain(rng, nd, pads1, pads2, bias, channels)
    x = random_input(rng, first.weight.shape[1] * first.attrs["group"], spatial)
    expected = torch_conv(torch_conv(x, first), second)
    result = verdict(compose, first.spec(spatial), second.spec(spatial), spatial)

    if pads2 == "zero" or pads1 == "full":   # h's padding is never read, or reads only x's padding
        assert isinstance(result, Composition), result
    if isinstance(result, Refusal):
        assert "zero padding" in result.reason
        assert differs(run_spec(x, composite_conv(first.spec(spatial), second.spec(spatial))), expected)
        return
    assert result.border is None or bias
    assert_exact(run_spec(x, result.spec, result.border), expected)
    if bias:
        assert_close_float32(ort_folded(x.numpy(), result.spec, result.border), ort_chain(x.numpy(), [first, second]))


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("stride1", [1, 2, 3])
@pytest.mark.parametrize("pads2", ["same", "full"])
def test_bias_read_through_padding_becomes_a_border_map(nd, stride1, pads2):
    rng = random.Random(f"{nd}{stride1}{pads2}")
    first = random_conv(rng, nd, 3, 4, 1, "zero", True, kernels=(1,), strides=(stride1,))
    second = random_conv(rng, nd, 4, 2, 1, pads2, True, kernels=(3, 5))
    spatial = tuple(max(_min_length(first, second, axis), rng.randint(9, 12)) for axis in range(nd))
    result = verdict(compose, first.spec(spatial), second.spec(spatial), spatial)

    assert isinstance(result, Composition) and result.border is not None, result
    x = random_input(rng, 3, spatial)
    expected = torch_conv(torch_conv(x, first), second)
    assert result.border.shape == expected.shape[1:]
    assert_exact(run_spec(x, result.spec, result.border), expected)
    assert differs(run_spec(x, result.spec), expected)   # the map is needed
    assert_close_float32(ort_folded(x.numpy(), result.spec, result.border), ort_chain(x.numpy(), [first, second]))


def test_border_map_is_not_separable_in_2d():
    """A corner output reads padding on both axes: the map there is not the sum of the rows' and
    columns' corrections."""
    first = OnnxConv(np.ones((1, 1, 1, 1)), np.array([1.0]))
    second = OnnxConv(np.ones((1, 1, 3, 3)), None, {"pads": [1, 1, 1, 1]})
    result = verdict(compose, first.spec((4, 4)), second.spec((4, 4)), (4, 4))
    border = result.border[0]
    assert border[0, 0] == -5 and border[0, 1] == -3 and border[1, 0] == -3 and border[1, 1] == 0


@pytest.mark.parametrize("nd", [1, 2])
def test_unknown_shape_result_is_exact_for_every_length(nd):
    rng = random.Random(nd)
    first = random_conv(rng, nd, 2, 3, 1, "full", False, strides=(2,))
    second = random_conv(rng, nd, 3, 2, 1, "same", True, strides=(3,))
    result = verdict(compose, first.spec(None), second.spec(None), None)
    assert isinstance(result, Composition) and result.border is None
    lengths = [max(_min_length(first, second, axis) for axis in range(nd)) + extra for extra in range(8)]
    for length in lengths:
        x = random_input(rng, 2, (length,) * nd)
        assert_exact(run_spec(x, result.spec), torch_conv(torch_conv(x, first), second))


def test_end_pad_is_shape_independent():
    """E = s1*e2 + e1 reproduces second's output length for every input length (nested floors)."""
    for s1 in (1, 2, 3):
        for s2 in (1, 2, 3):
            first = OnnxConv(np.ones((1, 1, 3)), None, {"strides": [s1], "pads": [1, 2]})
            second = OnnxConv(np.ones((1, 1, 2)), None, {"strides": [s2], "dilations": [2], "pads": [0, 3]})
            spec = composite_conv(first.spec(None), second.spec(None))
            assert spec.pads_end == (s1 * 3 + 2,)
            for length in range(1, 40):
                inner = first.spec(None).axis(0).output_length(length)
                assert spec.axis(0).output_length(length) == second.spec(None).axis(0).output_length(inner)


def test_strided_first_conv_spreads_the_second_kernel():
    """A 2-tap second conv after a stride-3 first conv reads x taps 3 apart: dilation 3."""
    first = OnnxConv(np.array([[[2.0]]]), None, {"strides": [3]})
    second = OnnxConv(np.array([[[1.0, -1.0]]]), None)
    spec = verdict(compose, first.spec(None), second.spec(None), None).spec
    assert spec.strides == (3,) and spec.dilations == (3,)
    np.testing.assert_array_equal(spec.weight[0, 0], [2.0, -2.0])


def test_depthwise_after_depthwise_stays_depthwise():
    rng = random.Random(3)
    first = random_conv(rng, 2, 6, 6, 6, "zero", True, kernels=(3,), strides=(1,))
    second = random_conv(rng, 2, 6, 6, 6, "zero", True, kernels=(3,), strides=(1,))
    result = verdict(compose, first.spec((8, 8)), second.spec((8, 8)), (8, 8))
    assert largest_group_count(result.spec.weight) == 6
    assert emitted(result.spec).weight.shape[:2] == (6, 1)


def test_grouped_after_grouped_keeps_the_groups():
    rng = random.Random(4)
    first = random_conv(rng, 1, 8, 8, 4, "zero", False, kernels=(3,))
    second = random_conv(rng, 1, 8, 4, 4, "zero", False, kernels=(3,))
    result = verdict(compose, first.spec((20,)), second.spec((20,)), (20,))
    assert largest_group_count(result.spec.weight) == 4


def test_identity_is_neutral():
    rng = random.Random(5)
    conv = random_conv(rng, 2, 3, 3, 1, "same", True)
    spatial = (10, 9)
    x = random_input(rng, 3, spatial)
    for first, second in [(identity_conv(3, 2), conv.spec(spatial)), (conv.spec(spatial), identity_conv(3, 2))]:
        result = verdict(compose, first, second, spatial)
        assert isinstance(result, Composition) and result.border is None
        assert_exact(run_spec(x, result.spec), torch_conv(x, conv))


def test_mismatched_channels_raise():
    with pytest.raises(ValueError):
        compose(identity_conv(3, 2), identity_conv(4, 2), None)
    with pytest.raises(ValueError):
        compose(identity_conv(3, 2), identity_conv(3, 1), None)


def test_checked_lengths_represent_every_length():
    """For an unknown length, axis_reads looks at a finite range of lengths; what it finds must
    be what every length up to a much larger one shows (begin side stable, end side periodic)."""
    rng = random.Random(0)
    for _ in range(100):
        first, second = (AxisGeometry(rng.randint(1, 4), rng.randint(1, 3), rng.randint(1, 2),
                                      rng.randint(0, 5), rng.randint(0, 5)) for _ in range(2))
        checked = padding_reads.lengths_to_check(first, second, None)
        reads = padding_reads.axis_reads(first, second, None)
        for length in range(checked[0], checked[-1] + 60):
            single = padding_reads.axis_reads(first, second, length)
            assert not np.any(single.leaks & ~reads.leaks), (first, second, length)
            assert not np.any(single.reaches & ~reads.reaches), (first, second, length)
            assert not np.any(single.pads_read & ~reads.pads_read), (first, second, length)


def test_tap_pairs_meeting_on_no_middle_channel_do_not_block_the_fold():
    """Middle channel 0 is made by a centre tap and read by second's 3-tap; channel 1 by a
    3-tap and read by second's centre tap only. second's padded reads meet only channel 0,
    whose first-conv window at a padded position is padding too: exact."""
    w1 = np.zeros((2, 1, 3))
    w1[0, 0, 1] = 1.5
    w1[1, 0] = [1.0, -2.0, 0.5]
    w2 = np.zeros((1, 2, 3))
    w2[0, 0] = [0.3, 1.0, -0.7]
    w2[0, 1, 1] = 2.0
    first, second = OnnxConv(w1, None, {"pads": [1, 1]}), OnnxConv(w2, None, {"pads": [1, 1]})
    result = verdict(compose, first.spec((8,)), second.spec((8,)), (8,))
    assert isinstance(result, Composition), result
    x = random_input(random.Random(0), 1, (8,))
    assert_exact(run_spec(x, result.spec), torch_conv(torch_conv(x, first), second))


def test_a_pair_reading_only_padding_on_another_axis_is_harmless():
    """On axis 1 (length 1) first's taps 0 and 2 read only padding, so second's padded rows,
    where first's axis-0 window reaches real x, still see zeros."""
    w1 = np.zeros((1, 1, 3, 3))
    w1[0, 0, :, [0, 2]] = [[1.0, 2.0, 3.0], [-1.0, 0.5, 4.0]]
    first = OnnxConv(w1, None, {"pads": [1, 1, 1, 1]})
    second = OnnxConv(np.ones((1, 1, 3, 1)), None, {"pads": [1, 0, 1, 0]})
    result = verdict(compose, first.spec((5, 1)), second.spec((5, 1)), (5, 1))
    assert isinstance(result, Composition), result
    x = random_input(random.Random(1), 1, (5, 1))
    assert_exact(run_spec(x, result.spec), torch_conv(torch_conv(x, first), second))
