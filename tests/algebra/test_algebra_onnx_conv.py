"""ONNX Conv <-> ConvSpec: groups, pads, auto_pad, and the round trip through conv_to_onnx."""

import random

import numpy as np
import pytest
import torch
from algebra_reference import (verdict, OnnxConv, assert_close_float32, assert_exact, ort_chain, ort_folded, random_input,
                               run_spec, same_pads, torch_conv)

from convexport.algebra import ConvSpec, Refusal, conv_from_onnx, conv_to_onnx

CHANNELS = 4
GROUPS = {"dense": 1, "grouped": 2, "depthwise": CHANNELS}


def _pads(mode: str, kernel: int, dilation: int) -> tuple[int, int]:
    span = dilation * (kernel - 1)
    return {"zero": (0, 0), "same": (span // 2, span - span // 2), "full": (span, span), "asym": (span, 1)}[mode]


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("kernel", [1, 2, 3, 5])
@pytest.mark.parametrize("stride", [1, 2, 3])
@pytest.mark.parametrize("dilation", [1, 2])
@pytest.mark.parametrize("groups", list(GROUPS))
@pytest.mark.parametrize("pads", ["zero", "same", "full", "asym"])
@pytest.mark.parametrize("bias", [False, True])
def test_round_trip_reproduces_the_conv(nd, kernel, stride, dilation, groups, pads, bias):
    rng = random.Random(f"{nd}{kernel}{stride}{dilation}{groups}{pads}{bias}")
    group, seed = GROUPS[groups], np.random.default_rng(rng.getrandbits(32))
    begin, end = _pads(pads, kernel, dilation)
    attrs = {"group": group, "kernel_shape": [kernel] * nd, "strides": [stride] * nd, "dilations": [dilation] * nd,
             "pads": [begin] * nd + [end] * nd}
    conv = OnnxConv(seed.standard_normal((CHANNELS, CHANNELS // group, *[kernel] * nd)),
                    seed.standard_normal(CHANNELS) if bias else None, attrs)
    spatial = (dilation * (kernel - 1) + 3,) * nd
    spec = verdict(conv_from_onnx, conv.weight, conv.bias, attrs, spatial)

    weight, out_bias, out_attrs = conv_to_onnx(spec)
    expected_attrs = dict(attrs, dilations=[dilation if kernel > 1 else 1] * nd)
    assert out_attrs == expected_attrs
    np.testing.assert_array_equal(weight, conv.weight)
    assert (out_bias is None) == (not bias)
    x = random_input(rng, CHANNELS, spatial)
    assert_exact(run_spec(x, spec), torch_conv(x, conv))
    assert spec.output_shape(spatial) == tuple(torch_conv(x, conv).shape[2:])


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("kernel", [1, 2, 3, 4])
@pytest.mark.parametrize("stride", [1, 2, 3])
@pytest.mark.parametrize("auto_pad", ["VALID", "SAME_UPPER", "SAME_LOWER"])
def test_auto_pad_matches_onnxruntime(nd, kernel, stride, auto_pad):
    rng = random.Random(f"{nd}{kernel}{stride}{auto_pad}")
    seed = np.random.default_rng(rng.getrandbits(32))
    spatial = tuple(rng.randint(kernel + 1, kernel + 6) for _ in range(nd))
    conv = OnnxConv(seed.standard_normal((3, 2, *[kernel] * nd)), seed.standard_normal(3),
                    {"auto_pad": auto_pad, "strides": [stride] * nd})
    spec = verdict(conv_from_onnx, conv.weight, conv.bias, conv.attrs, spatial)

    x = random_input(rng, 2, spatial)
    assert_exact(run_spec(x, spec), torch_conv(x, conv))
    assert_close_float32(ort_folded(x.numpy(), spec), ort_chain(x.numpy(), [conv]))


def test_same_with_stride_one_needs_no_static_shape():
    conv = OnnxConv(np.ones((1, 1, 4, 3)), None, {"auto_pad": "SAME_LOWER", "dilations": [1, 2]})
    spec = verdict(conv_from_onnx, conv.weight, None, conv.attrs, None)
    assert (spec.pads_begin, spec.pads_end) == ((2, 2), (1, 2))
    for spatial in [(5, 6), (8, 7)]:
        x = torch.randn(1, 1, *spatial, dtype=torch.float64)
        assert_exact(run_spec(x, spec), torch_conv(x, conv))


def test_same_with_stride_needs_the_input_length():
    refusal = verdict(conv_from_onnx, np.ones((1, 1, 3)), None, {"auto_pad": "SAME_UPPER", "strides": [2]}, [None])
    assert isinstance(refusal, Refusal)
    assert "static spatial shape" in refusal.reason
    # Why: the pads depend on the input length, so no fixed pads serve every length.
    assert same_pads("SAME_UPPER", 3, 2, 1, 10) != same_pads("SAME_UPPER", 3, 2, 1, 11)


def test_groups_expand_to_a_block_diagonal_kernel():
    weight = np.arange(1, 1 + 6 * 2 * 3, dtype=float).reshape(6, 2, 3)
    spec = verdict(conv_from_onnx, weight, None, {"group": 3}, None)
    assert spec.weight.shape == (6, 6, 3)
    for g in range(3):
        block = spec.weight[2 * g:2 * g + 2]
        np.testing.assert_array_equal(block[:, 2 * g:2 * g + 2], weight[2 * g:2 * g + 2])
        assert not np.any(np.delete(block, [2 * g, 2 * g + 1], axis=1))


def test_an_all_zero_bias_is_kept_only_when_the_conv_had_one():
    weight = np.ones((2, 2, 1))
    with_bias = verdict(conv_from_onnx, weight, np.zeros(2), {}, None)
    without = verdict(conv_from_onnx, weight, None, {}, None)
    assert conv_to_onnx(with_bias)[1] is not None
    assert conv_to_onnx(without)[1] is None


def test_bad_shapes_raise():
    with pytest.raises(ValueError):
        conv_from_onnx(np.ones((3, 2, 3)), None, {"group": 2}, None)
    with pytest.raises(ValueError):
        conv_from_onnx(np.ones((2, 2, 3)), None, {"kernel_shape": [5]}, None)
    with pytest.raises(ValueError):
        ConvSpec(np.ones((2, 2, 3)), np.zeros(3), True, (1,), (1,), (0,), (0,))
    with pytest.raises(ValueError):
        ConvSpec(np.ones((2, 2, 3)), np.zeros(2), True, (1,), (1,), (-1,), (0,))
