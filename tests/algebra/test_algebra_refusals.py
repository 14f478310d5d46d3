"""Every refusal path returns a Refusal with a meaningful reason; for the inexact ones, the
naive fold is shown to be numerically wrong."""

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F
from algebra_reference import verdict, OnnxConv, assert_exact, differs, ort_chain, ort_folded, run_spec, torch_conv

from convexport.algebra import (Composition, ConvSpec, Refusal, avgpool_as_conv, combine_parallel, compose,
                                concat_parallel, conv_from_onnx, merge_zero_pad, scale_shift_before)
from convexport.algebra.compose import composite_conv

RNG = np.random.default_rng(0)


def _conv(shape, bias=True, **attrs) -> OnnxConv:
    return OnnxConv(RNG.standard_normal(shape), RNG.standard_normal(shape[0]) if bias else None, attrs)


def _x(channels, *spatial):
    return torch.tensor(RNG.standard_normal((1, channels, *spatial)))


def test_same_3x3_after_same_3x3_is_refused():
    first, second = _conv((4, 3, 3, 3), bias=False, pads=[1, 1, 1, 1]), _conv((2, 4, 3, 3), pads=[1, 1, 1, 1])
    spatial = (7, 8)
    result = verdict(compose, first.spec(spatial), second.spec(spatial), spatial)
    assert isinstance(result, Refusal)
    assert "zero padding" in result.reason and "real input" in result.reason
    x = _x(3, *spatial)
    naive = run_spec(x, composite_conv(first.spec(spatial), second.spec(spatial)))
    assert differs(naive, torch_conv(torch_conv(x, first), second))


def test_leak_on_one_axis_of_two_names_that_axis():
    """3x1 'same' after 1x3 'same': only axis 0 of the second reads padding, and only axis 1 of
    the first reads around: the first's window at a padded row still reads real x."""
    first = _conv((2, 2, 1, 3), bias=False, pads=[0, 1, 0, 1])
    second = _conv((2, 2, 3, 1), bias=False, pads=[1, 0, 1, 0])
    result = verdict(compose, first.spec((5, 5)), second.spec((5, 5)), (5, 5))
    assert isinstance(result, Composition)   # x[-1, :] is padding on axis 0 too: exact
    first = _conv((2, 2, 3, 3), bias=False, pads=[0, 1, 0, 1])
    result = verdict(compose, first.spec((6, 6)), second.spec((6, 6)), (6, 6))
    assert isinstance(result, Refusal) and "spatial axis 0" in result.reason
    x = _x(2, 6, 6)
    naive = run_spec(x, composite_conv(first.spec((6, 6)), second.spec((6, 6))))
    assert differs(naive, torch_conv(torch_conv(x, first), second))


def test_bias_through_padding_over_the_border_limit_is_refused():
    first, second = _conv((4, 3, 1, 1)), _conv((8, 4, 3, 3), pads=[1, 1, 1, 1])
    spatial = (16, 16)
    result = verdict(compose, first.spec(spatial), second.spec(spatial), spatial, border_limit_bytes=4096)
    assert isinstance(result, Refusal)
    assert "bias" in result.reason and str(4 * 8 * 16 * 16) in result.reason and "4096" in result.reason
    allowed = verdict(compose, first.spec(spatial), second.spec(spatial), spatial)
    assert isinstance(allowed, Composition) and allowed.border.shape == (8, 16, 16)
    x = _x(3, *spatial)
    assert differs(run_spec(x, allowed.spec), torch_conv(torch_conv(x, first), second))


def test_bias_through_padding_with_unknown_shape_is_refused():
    first, second = _conv((4, 3, 1)), _conv((2, 4, 3), pads=[1, 1])
    result = verdict(compose, first.spec(None), second.spec(None), [None])
    assert isinstance(result, Refusal) and "static spatial shape" in result.reason
    x = _x(3, 9)
    assert differs(run_spec(x, composite_conv(first.spec(None), second.spec(None))),
                   torch_conv(torch_conv(x, first), second))


def test_same_auto_pad_with_stride_and_unknown_shape_is_refused():
    conv = _conv((2, 2, 3), auto_pad="SAME_UPPER", strides=[2])
    result = verdict(conv_from_onnx, conv.weight, conv.bias, conv.attrs, [None])
    assert isinstance(result, Refusal) and "SAME_UPPER" in result.reason and "static" in result.reason
    # Any fixed pads are wrong for some length: the pads for L=10 used at L=11.
    fixed = verdict(conv_from_onnx, conv.weight, conv.bias, conv.attrs, [10])
    x = _x(2, 11).numpy()
    assert differs(torch.tensor(ort_folded(x, fixed)), torch.tensor(ort_chain(x, [conv])))
    assert isinstance(verdict(conv_from_onnx, conv.weight, conv.bias, {"auto_pad": "SAME_MIDDLE"}, None), Refusal)


def test_parallel_output_lengths_agreeing_only_for_some_lengths_need_a_static_shape():
    """Stride 2: a 'same' 3-tap and an unpadded 2-tap conv agree in length on even L only."""
    a = _conv((2, 2, 3), strides=[2], pads=[1, 1])     # floor((L - 1) / 2) + 1
    b = _conv((2, 2, 2), strides=[2], pads=[0, 0])     # floor((L - 2) / 2) + 1
    specs = [a.spec(None), b.spec(None)]
    result = verdict(combine_parallel, specs, [1, 1], None)
    assert isinstance(result, Refusal) and "static spatial shape" in result.reason
    even = verdict(combine_parallel, specs, [1, 1], (10,))
    x = _x(2, 10)
    assert_exact(run_spec(x, even), torch_conv(x, a) + torch_conv(x, b))
    x = _x(2, 9)
    assert torch_conv(x, a).shape != torch_conv(x, b).shape   # no fold serves L=9
    assert isinstance(verdict(concat_parallel, specs, None), Refusal)


def test_parallel_output_length_mismatch_is_refused():
    a, b = _conv((2, 2, 3), pads=[1, 1]), _conv((2, 2, 3))
    result = verdict(combine_parallel, [a.spec((8,)), b.spec((8,))], [1, -1], (8,))
    assert isinstance(result, Refusal) and "differ" in result.reason and "[8, 6]" in result.reason
    x = _x(2, 8)
    assert torch_conv(x, a).shape != torch_conv(x, b).shape


def test_avgpool_excluding_pads_is_refused():
    result = verdict(avgpool_as_conv, 2, [3, 3], [1, 1], [1, 1], [1, 1], False, False, (6, 6))
    assert isinstance(result, Refusal) and "count_include_pad=0" in result.reason
    naive = verdict(avgpool_as_conv, 2, [3, 3], [1, 1], [1, 1], [1, 1], True, False, (6, 6))
    x = _x(2, 6, 6)
    assert differs(run_spec(x, naive), F.avg_pool2d(x, 3, 1, 1, count_include_pad=False))


def test_avgpool_ceil_mode_adding_a_window_is_refused():
    result = verdict(avgpool_as_conv, 1, [2], [2], [0], [0], True, True, (7,))
    assert isinstance(result, Refusal) and "ceil_mode" in result.reason
    assert isinstance(verdict(avgpool_as_conv, 1, [2], [2], [0], [0], True, True, [None]), Refusal)
    naive = verdict(avgpool_as_conv, 1, [2], [2], [0], [0], True, False, (7,))
    x = _x(1, 7)
    assert differs(run_spec(x, naive), F.avg_pool1d(x, 2, 2, ceil_mode=True))


def test_shift_before_a_padded_conv_is_refused():
    conv = _conv((2, 2, 3), pads=[1, 1])
    result = verdict(scale_shift_before, conv.spec(None), 1.0, np.array([0.5, -1.0]))
    assert isinstance(result, Refusal) and "padding" in result.reason
    unpadded = dataclasses.replace(conv.spec(None), pads_begin=(0,), pads_end=(0,))
    shifted_weights = verdict(scale_shift_before, unpadded, 1.0, np.array([0.5, -1.0]))
    naive = dataclasses.replace(shifted_weights, pads_begin=(1,), pads_end=(1,))
    x = _x(2, 7)
    shifted = x + torch.tensor([0.5, -1.0]).view(1, 2, 1)
    assert differs(run_spec(x, naive), torch_conv(shifted, conv))


def test_negative_pad_is_refused():
    conv = _conv((2, 2, 3), pads=[2, 2])
    result = verdict(merge_zero_pad, conv.spec(None), [-1], [0])
    assert isinstance(result, Refusal) and "negative" in result.reason
    naive = dataclasses.replace(conv.spec(None), pads_begin=(1,))
    x = _x(2, 8)
    assert differs(run_spec(x, naive), torch_conv(x[..., 1:], conv))


def test_refusals_are_values_not_exceptions():
    assert isinstance(Refusal("why"), Refusal) and not isinstance(Refusal("why"), ConvSpec)
