"""Property tests: random chains of 2-3 convs and random parallel sums (1-3-D, random geometry,
static or unknown spatial shape). Every result must be exact; a refusal at a static shape must
be necessary (the naive fold is wrong). Counts keep the test from passing vacuously."""

from collections import Counter

import numpy as np
import torch
from algebra_reference import verdict, OnnxConv, assert_exact, differs, run_spec, torch_conv
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from convexport.algebra import Composition, ConvSpec, Refusal, combine_parallel, compose, identity_conv
from convexport.algebra.compose import composite_conv

# Geometry per rank, kept small enough that the shortest valid input stays cheap in 3-D.
LIMITS = {1: dict(kernel=5, stride=3, dilation=2, length=12),
          2: dict(kernel=4, stride=3, dilation=2, length=9),
          3: dict(kernel=3, stride=2, dilation=1, length=5)}
SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def onnx_convs(draw, nd, in_channels, out_channels, stride=None, zero_taps=True):
    """A random ONNX Conv: per-axis kernel/stride/dilation/pads, random group, some zero taps."""
    limit = LIMITS[nd]
    kernel = draw(st.lists(st.integers(1, limit["kernel"]), min_size=nd, max_size=nd))
    strides = stride or draw(st.lists(st.integers(1, limit["stride"]), min_size=nd, max_size=nd))
    dilations = draw(st.lists(st.integers(1, limit["dilation"]), min_size=nd, max_size=nd))
    spans = [d * (k - 1) for k, d in zip(kernel, dilations)]
    style = draw(st.sampled_from(["random", "random", "zero", "full", "same"]))
    if style == "random":
        begin = [draw(st.integers(0, span + 1)) for span in spans]
        end = [draw(st.integers(0, span + 1)) for span in spans]
    else:
        begin = [{"zero": 0, "full": span, "same": span // 2}[style] for span in spans]
        end = [{"zero": 0, "full": span, "same": span - span // 2}[style] for span in spans]
    common = np.gcd(in_channels, out_channels)
    group = draw(st.sampled_from([g for g in range(1, common + 1) if common % g == 0]))
    seed = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    weight = seed.standard_normal((out_channels, in_channels // group, *kernel))
    if zero_taps and draw(st.booleans()):
        weight *= seed.random((1, 1, *kernel)) < 0.6
    bias = seed.standard_normal(out_channels) if draw(st.booleans()) else None
    return OnnxConv(weight, bias, {"group": group, "strides": strides, "dilations": dilations, "pads": begin + end})


def _axis_conv(conv: OnnxConv, axis: int) -> OnnxConv:
    """The 1-D conv of one axis of `conv`."""
    nd, attrs = conv.nd, conv.attrs
    return OnnxConv(np.ones((1, 1, conv.weight.shape[2 + axis])), None,
                    {"strides": [attrs["strides"][axis]], "dilations": [attrs["dilations"][axis]],
                     "pads": [attrs["pads"][axis], attrs["pads"][nd + axis]]})


def _valid(convs, axis: int, length: int) -> bool:
    """Whether every conv of the chain has a non-empty output on `axis` for input length L."""
    for conv in convs:
        length = _axis_conv(conv, axis).spec(None).axis(0).output_length(length)
        if length < 1:
            return False
    return True


def _shapes(draw, convs, nd, chained):
    """The actual input spatial shape (drawn, raised to the smallest valid length per axis) and
    what the fold is told (None where unknown)."""
    spatial = []
    for axis in range(nd):
        length = draw(st.integers(1, LIMITS[nd]["length"]))
        while not all(_valid(convs if chained else [conv], axis, length) for conv in convs):
            length += 1
        spatial.append(length)
    known = draw(st.sampled_from(["static", "static", "unknown", "partial"]))
    known = [known == "static" or (known == "partial" and draw(st.booleans())) for _ in range(nd)]
    return spatial, tuple(n if k else None for n, k in zip(spatial, known))


def _lengths_to_run(spatial, told):
    """The actual shape, and for unknown axes two longer lengths too (still valid)."""
    yield spatial
    if None in told:
        for extra in (1, 2):
            yield [n if t is not None else n + extra for n, t in zip(spatial, told)]


def _random_x(channels, spatial, seed=0) -> torch.Tensor:
    return torch.tensor(np.random.default_rng(seed).standard_normal((1, channels, *spatial)))


def _through(x, convs):
    for conv in convs:
        x = torch_conv(x, conv)
    return x


@st.composite
def chains(draw):
    nd = draw(st.integers(1, 3))
    count = draw(st.integers(2, 3 if nd < 3 else 2))
    channels = draw(st.lists(st.integers(1, 4), min_size=count + 1, max_size=count + 1))
    convs = [draw(onnx_convs(nd, channels[i], channels[i + 1])) for i in range(count)]
    spatial, told = _shapes(draw, convs, nd, chained=True)
    return convs, spatial, told


def _check_chain(convs, spatial, told) -> str:
    """Fold the chain left to right; check each fold against the chain's prefix."""
    current = convs[0].spec(told)
    for index, conv in enumerate(convs[1:], start=2):
        result = verdict(compose, current, conv.spec(told), told)
        if isinstance(result, Refusal):
            if None not in told and "zero padding on spatial axis" in result.reason:
                x = _random_x(current.in_channels, spatial)
                naive = run_spec(x, composite_conv(current, conv.spec(told)))
                assert differs(naive, _through(x, convs[:index])), result.reason
            return "refused"
        assert isinstance(result, Composition)
        assert result.border is None or None not in told
        for lengths in _lengths_to_run(spatial, told):
            x = _random_x(current.in_channels, lengths)
            assert_exact(run_spec(x, result.spec, result.border), _through(x, convs[:index]))
        if result.border is not None:
            return "exact with border"
        current = result.spec
    return "exact"


def test_random_chains_fold_exactly_or_refuse():
    outcomes = Counter()

    @SETTINGS
    @given(chains())
    def check(chain):
        outcomes[_check_chain(*chain)] += 1

    check()
    assert outcomes["exact"] >= 30 and outcomes["exact with border"] >= 5 and outcomes["refused"] >= 10, outcomes


def _with_length_offsets(conv: OnnxConv, offsets) -> OnnxConv:
    """The conv with its end pads (and begin pads, if needed) set so a + e - span == offset."""
    nd, pads = conv.nd, list(conv.attrs["pads"])
    for axis, offset in enumerate(offsets):
        total = max(0, conv.attrs["dilations"][axis] * (conv.weight.shape[2 + axis] - 1) + 1 + offset)
        pads[axis] = min(pads[axis], total)
        pads[nd + axis] = total - pads[axis]
    return OnnxConv(conv.weight, conv.bias, dict(conv.attrs, pads=pads))


@st.composite
def parallel_sums(draw):
    nd = draw(st.integers(1, 3))
    channels, out_channels = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    strides = draw(st.lists(st.integers(1, LIMITS[nd]["stride"]), min_size=nd, max_size=nd))
    count = draw(st.integers(2, 3))
    convs = [draw(onnx_convs(nd, channels, out_channels, stride=strides)) for _ in range(count)]
    if draw(st.booleans()):   # the same a + e - span on every branch: equal lengths for every L
        offsets = [draw(st.integers(-1, 1)) for _ in range(nd)]
        convs = [_with_length_offsets(conv, offsets) for conv in convs]
    with_identity = channels == out_channels and set(strides) == {1} and draw(st.booleans())
    signs = [draw(st.sampled_from([1.0, -1.0, 0.5])) for _ in range(count + with_identity)]
    spatial, told = _shapes(draw, convs, nd, chained=False)
    return convs, with_identity, signs, spatial, told


def _check_sum(convs, with_identity, signs, spatial, told) -> str:
    specs = [conv.spec(told) for conv in convs]
    if with_identity:
        specs.append(identity_conv(specs[0].in_channels, specs[0].nd))
    result = verdict(combine_parallel, specs, signs, told)
    if isinstance(result, Refusal):
        if None not in told:   # necessary: the branches' outputs differ in shape
            x = _random_x(specs[0].in_channels, spatial)
            shapes = {tuple(torch_conv(x, conv).shape[2:]) for conv in convs}
            shapes |= {tuple(spatial)} if with_identity else set()
            assert len(shapes) > 1, result.reason
        return "refused"
    assert isinstance(result, ConvSpec)
    for lengths in _lengths_to_run(spatial, told):
        x = _random_x(specs[0].in_channels, lengths)
        branches = [torch_conv(x, conv) for conv in convs] + ([x] if with_identity else [])
        assert_exact(run_spec(x, result), sum(sign * y for sign, y in zip(signs, branches)))
    return "exact"


def test_random_parallel_sums_merge_exactly_or_refuse():
    outcomes = Counter()

    @SETTINGS
    @given(parallel_sums())
    def check(case):
        outcomes[_check_sum(*case)] += 1

    check()
    assert outcomes["exact"] >= 30 and outcomes["refused"] >= 10, outcomes
