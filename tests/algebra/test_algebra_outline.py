"""composite_outline: the shape and group count of the composite conv, read off the two
convs' grouped weights, against the composite that compose.py builds and conv_to_onnx emits."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from convexport.algebra import conv_from_onnx, conv_to_onnx
from convexport.algebra.compose import composite_conv
from convexport.algebra.onnx_conv import conv_geometry
from convexport.algebra.outline import composite_outline


def _divisors(*numbers):
    return [d for d in range(1, min(numbers) + 1) if all(n % d == 0 for n in numbers)]


@st.composite
def conv_pairs(draw):
    nd = draw(st.integers(1, 3))
    channels = [draw(st.sampled_from([1, 2, 4, 6])) for _ in range(3)]     # C, M, O
    groups = [draw(st.sampled_from(_divisors(channels[0], channels[1]))),
              draw(st.sampled_from(_divisors(channels[1], channels[2])))]
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    pair = []
    for (inputs, outputs), group in zip([(channels[0], channels[1]), (channels[1], channels[2])], groups):
        kernel = [draw(st.integers(1, 3)) for _ in range(nd)]
        weight = rng.standard_normal([outputs, inputs // group, *kernel])
        weight *= rng.random(weight.shape) < draw(st.sampled_from([0.15, 0.5, 1.0]))   # zero taps and links
        attrs = {"group": group, "strides": [draw(st.integers(1, 2)) for _ in range(nd)],
                 "dilations": [draw(st.integers(1, 2)) for _ in range(nd)],
                 "pads": [draw(st.integers(0, 2)) for _ in range(2 * nd)]}
        pair.append((weight, attrs))
    return pair


def _outline(pair):
    (w1, a1), (w2, a2) = pair
    return composite_outline(w1, a1.get("group", 1), conv_geometry(w1.shape, a1, None),
                             w2, a2.get("group", 1), conv_geometry(w2.shape, a2, None))


def _emitted(pair):
    (w1, a1), (w2, a2) = pair
    weight, _, attrs = conv_to_onnx(composite_conv(conv_from_onnx(w1, None, a1, None), conv_from_onnx(w2, None, a2, None)))
    return weight.shape, attrs["group"]


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(conv_pairs())
def test_outline_is_the_emitted_composite(pair):
    """Random weights never cancel to 0.0: the outline is exactly what conv_to_onnx emits,
    with groups, zero taps trimmed and dilations coarsened."""
    outline = _outline(pair)
    assert (outline.weight_shape, outline.group) == _emitted(pair)


def test_depthwise_then_pointwise_is_dense_and_a_depthwise_pair_stays_depthwise():
    rng = np.random.default_rng(0)
    depthwise = (rng.standard_normal([8, 1, 3, 3]), {"group": 8, "pads": [1] * 4})
    pointwise = (rng.standard_normal([16, 8, 1, 1]), {})
    outline = _outline([depthwise, pointwise])
    assert outline.weight_shape == (16, 8, 3, 3) and outline.group == 1
    outline = _outline([depthwise, (rng.standard_normal([8, 1, 5, 5]), {"group": 8})])
    assert outline.weight_shape == (8, 1, 7, 7) and outline.group == 8


def test_products_that_cancel_make_the_emitted_conv_smaller_never_larger():
    """Two middle channels computing the same map, added with +1 and -1: the composite is zero,
    and conv_to_onnx drops every other tap of it, where the outline (structural nonzeros) keeps
    the whole kernel: the outline can overstate the composite's cost, never understate it."""
    row = np.random.default_rng(1).standard_normal([1, 2, 3])
    pair = [(np.concatenate([row, row]), {}), (np.array([[[1.0], [-1.0]]]), {})]
    outline, (emitted_shape, _) = _outline(pair), _emitted(pair)
    assert outline.weight_shape == (1, 2, 3) and emitted_shape == (1, 2, 2)
