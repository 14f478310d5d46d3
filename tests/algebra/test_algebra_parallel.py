"""combine_parallel / concat_parallel: convs reading one x, summed or concatenated."""

import random

import numpy as np
import pytest
import torch
from algebra_reference import (verdict, GraphBuilder, OnnxConv, assert_close_float32, assert_exact, emitted, ort_folded,
                               random_input, run_spec, torch_conv)
from onnx import helper

from convexport.algebra import ConvSpec, Refusal, combine_parallel, concat_parallel, identity_conv, largest_group_count


def _branch(rng, nd, channels, out_channels, stride, offset, group=1):
    """A branch with random kernel and dilation whose pads give a + e - span == offset."""
    kernel = [rng.choice((1, 2, 3, 5)) for _ in range(nd)]
    dilation = [rng.choice((1, 2)) for _ in range(nd)]
    pads = []
    for k, d in zip(kernel, dilation):
        total = d * (k - 1) + 1 + offset
        begin = rng.randint(0, total)
        pads.append((begin, total - begin))
    seed = np.random.default_rng(rng.getrandbits(32))
    weight = seed.standard_normal((out_channels, channels // group, *kernel)) / np.sqrt(np.prod(kernel))
    bias = seed.standard_normal(out_channels) if rng.random() < 0.5 else None
    return OnnxConv(weight, bias, {"group": group, "kernel_shape": kernel, "strides": [stride] * nd,
                                   "dilations": dilation, "pads": [p[0] for p in pads] + [p[1] for p in pads]})


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("stride", [1, 2, 3])
@pytest.mark.parametrize("mode", ["sum", "sub", "concat"])
@pytest.mark.parametrize("branches", [2, 3])
@pytest.mark.parametrize("static", [True, False])
def test_parallel_convs_merge_exactly(nd, stride, mode, branches, static):
    rng = random.Random(f"{nd}{stride}{mode}{branches}{static}")
    offset = rng.choice((-1, 0, 1))
    convs = [_branch(rng, nd, 4, 3 if mode != "concat" else rng.randint(1, 3), stride, offset) for _ in range(branches)]
    signs = [1.0] + [-1.0 if mode == "sub" else 1.0] * (branches - 1)
    spatial = tuple(rng.randint(7, 11) for _ in range(nd))
    shape = spatial if static else None
    specs = [conv.spec(shape) for conv in convs]
    merged = verdict(concat_parallel, specs, shape) if mode == "concat" else combine_parallel(specs, signs, shape)
    assert isinstance(merged, ConvSpec), merged

    for length_shift in (0,) if static else (0, 1, 2):
        x = random_input(rng, 4, tuple(n + length_shift for n in spatial))
        outputs = [sign * torch_conv(x, conv) for conv, sign in zip(convs, signs)]
        expected = torch.cat(outputs, dim=1) if mode == "concat" else sum(outputs)
        assert_exact(run_spec(x, merged), expected)


def test_branch_with_identity_and_ort():
    """y = conv3x3_same(x) + x - avg-like 1x1(x), checked in ONNX Runtime float32 too."""
    rng = random.Random(11)
    spatial = (9, 10)
    conv = _branch(rng, 2, 3, 3, 1, -1)
    one = OnnxConv(np.random.default_rng(1).standard_normal((3, 3, 1, 1)), np.ones(3))
    merged = verdict(combine_parallel, [conv.spec(spatial), identity_conv(3, 2), one.spec(spatial)], [1.0, 1.0, -1.0], spatial)
    x = random_input(rng, 3, spatial)
    expected = torch_conv(x, conv) + x - torch_conv(x, one)
    assert_exact(run_spec(x, merged), expected)
    graph = GraphBuilder(x.shape)
    a, b = graph.conv("x", conv), graph.conv("x", one)
    graph.nodes += [helper.make_node("Add", [a, "x"], ["s"]), helper.make_node("Sub", ["s", b], ["y"])]
    assert_close_float32(ort_folded(x.numpy(), merged), graph.run("y", x.numpy()))


def test_depthwise_minus_identity_keeps_kernel_3_and_depthwise():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((6, 1, 3, 3))
    depthwise = OnnxConv(weight, None, {"group": 6, "pads": [1, 1, 1, 1]})
    merged = verdict(combine_parallel, [depthwise.spec(None), identity_conv(6, 2)], [1.0, -1.0], None)
    out = emitted(merged)
    assert out.attrs["group"] == 6 and out.attrs["kernel_shape"] == [3, 3] and out.attrs["pads"] == [1, 1, 1, 1]
    np.testing.assert_array_equal(out.weight[:, 0, 1, 1], weight[:, 0, 1, 1] - 1)
    assert largest_group_count(merged.weight) == 6


def test_cancelling_branches_trim_to_a_smaller_kernel():
    """conv3x3 - (its border taps as a second conv) leaves only the centre tap: a 1x1 conv."""
    weight = np.random.default_rng(2).standard_normal((2, 2, 3, 3))
    border = weight.copy()
    border[:, :, 1, 1] = 0
    specs = [OnnxConv(w, None, {"pads": [1, 1, 1, 1]}).spec(None) for w in (weight, border)]
    out = emitted(combine_parallel(specs, [1.0, -1.0], None))
    assert out.attrs["kernel_shape"] == [1, 1] and out.attrs["pads"] == [0, 0, 0, 0]
    np.testing.assert_allclose(out.weight[:, :, 0, 0], weight[:, :, 1, 1])


def test_shifted_branches_share_a_dilated_window():
    """Two 1-tap branches at offsets 0 and 2 of the window: dilation 2, not 3 taps of dilation 1."""
    specs = [OnnxConv(np.ones((1, 1, 1)), None, {"pads": [pad, 2 - pad]}).spec(None) for pad in (0, 2)]
    merged = verdict(combine_parallel, specs, [1.0, 1.0], None)
    assert merged.dilations == (2,) and merged.kernel_shape == (2,) and merged.pads_begin == (2,)


def test_concat_of_grouped_branches_stacks_channels():
    rng = random.Random(9)
    convs = [_branch(rng, 2, 4, 4, 2, 0, group=2), _branch(rng, 2, 4, 2, 2, 0)]
    spatial = (9, 8)
    merged = verdict(concat_parallel, [c.spec(spatial) for c in convs], spatial)
    x = random_input(rng, 4, spatial)
    assert_exact(run_spec(x, merged), torch.cat([torch_conv(x, c) for c in convs], dim=1))


def test_parallel_refusals():
    x_spec = identity_conv(2, 1)
    strided = OnnxConv(np.ones((2, 2, 1)), None, {"strides": [2]}).spec(None)
    assert "strides" in verdict(combine_parallel, [x_spec, strided], [1, 1], None).reason
    wider = OnnxConv(np.ones((3, 2, 1)), None).spec(None)
    assert "output channel" in verdict(combine_parallel, [x_spec, wider], [1, 1], (5,)).reason
    with pytest.raises(ValueError):
        combine_parallel([x_spec, identity_conv(3, 1)], [1, 1], None)
    with pytest.raises(ValueError):
        combine_parallel([x_spec], [1, 1], None)
    assert isinstance(verdict(concat_parallel, [x_spec, wider], None), ConvSpec)
    assert isinstance(verdict(combine_parallel, [x_spec], [1.0], None), ConvSpec)
    assert not isinstance(verdict(combine_parallel, [x_spec, x_spec], [1, -1], None), Refusal)
