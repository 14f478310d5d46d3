"""low-rank-kernel: a Conv whose 2-D kernel has low rank becomes a tall conv then a wide conv."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from convexport.algebra import ConvSpec, Refusal
from convexport.algebra.separable import split_separable
from graphs import GraphBuilder, rewrite
from helpers import verdict, op_counts, run

rng = np.random.default_rng(0)


def low_rank(out_channels, in_channels, rows, cols, rank):
    factors = [rng.standard_normal((size, rank)) for size in (out_channels, in_channels, rows, cols)]
    return np.einsum("or,ir,kr,lr->oikl", *factors)


def separable_model(shape, weight, bias=True, **attrs):
    builder = GraphBuilder(shape)
    inputs = ["x", builder.const(weight, "w")]
    if bias:
        inputs.append(builder.const(rng.standard_normal(weight.shape[0]), "b"))
    y = builder.node("Conv", inputs, kernel_shape=list(weight.shape[2:]), **attrs)
    return builder.model([builder.node("Relu", [y])])


def check_equal(model, rewritten, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    expected, actual = run(model, {"x": x})[0], run(rewritten, {"x": x})[0]
    scale = max(float(np.sqrt(np.mean(expected ** 2))), 1e-6)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5 * scale)


GRID = list(itertools.product([(1, 1), (2, 1), (1, 3)], [(1, 1), (2, 1), (1, 2)],
                              [(0, 0, 0, 0), (3, 3, 3, 3), (1, 2, 0, 4)], [True, False], [1, 2]))


@pytest.mark.parametrize("strides, dilations, pads, bias, rank", GRID)
def test_low_rank_kernel_splits_exactly(strides, dilations, pads, bias, rank):
    shape = [2, 6, 24, 20]
    weight = low_rank(8, 6, 7, 5, rank)
    model = separable_model(shape, weight, bias, strides=list(strides), dilations=list(dilations), pads=list(pads))
    outcome = rewrite(model, "all")
    (applied,) = [entry for entry in outcome.applied if entry["rule"] == "low-rank-kernel"]
    assert applied["rank"] == rank and op_counts(outcome.model)["Conv"] == 2
    assert applied["flops_after"] < applied["flops_before"]
    kernels = sorted(tuple(init.dims[2:]) for init in outcome.model.graph.initializer if len(init.dims) == 4)
    assert kernels == [(1, 5), (7, 1)]
    check_equal(model, outcome.model, shape)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_auto_pad_splits_exactly(auto_pad):
    shape = [1, 4, 17, 16]
    model = separable_model(shape, low_rank(4, 4, 5, 3, 1), auto_pad=auto_pad)
    outcome = rewrite(model, "all")
    assert op_counts(outcome.model)["Conv"] == 2
    check_equal(model, outcome.model, shape)


@pytest.mark.parametrize("weight, attrs, reason", [
    (rng.standard_normal((8, 6, 7, 5)), {}, None),                            # a random kernel: silent
    (low_rank(1, 1, 3, 3, 2), {}, None),          # rank 2 of 3: no saving (a split pays below rank 2)
])
def test_kernels_that_do_not_pay_stay_whole(weight, attrs, reason):
    shape = [1, weight.shape[1], 12, 12]
    outcome = rewrite(separable_model(shape, weight, **attrs), "all")
    assert op_counts(outcome.model)["Conv"] == 1
    reasons = [entry["reason"] for entry in outcome.skipped if entry["rule"] == "low-rank-kernel"]
    assert (reasons == []) if reason is None else any(reason in text for text in reasons)


@pytest.mark.parametrize("shape, weight, attrs", [
    ([1, 4, 30], low_rank(4, 4, 7, 1, 1)[..., 0], {}),                        # 1-D: no rows and columns
    ([1, 4, 10, 10, 10], np.einsum("oikl,m->oiklm", low_rank(4, 4, 3, 3, 1), np.ones(3)), {}),   # 3-D
    ([1, 4, 20, 20], low_rank(4, 1, 7, 7, 1), {"group": 4}),                  # grouped
    ([1, 4, 20, 20], low_rank(4, 4, 7, 1, 1), {}),                            # already a column
])
def test_other_convs_are_not_split(shape, weight, attrs):
    outcome = rewrite(separable_model(shape, weight, **attrs), "all")
    assert "low-rank-kernel" not in [entry["rule"] for entry in outcome.applied]


def test_the_split_is_not_composed_back():
    """conv-conv would fold the tall and wide convs into the kernel low-rank-kernel splits:
    it declines, so `exact` reaches a fixed point instead of alternating."""
    shape = [1, 6, 24, 24]
    model = separable_model(shape, low_rank(8, 6, 9, 9, 1), pads=[4, 4, 4, 4])
    outcome = rewrite(model, "all")
    assert outcome.passes == 2 and op_counts(outcome.model)["Conv"] == 2
    assert any(entry["rule"] == "conv-conv" and "stays split" in entry["reason"] for entry in outcome.skipped)


def test_split_algebra_refuses_what_it_cannot_reproduce():
    spec = ConvSpec(rng.standard_normal((3, 2, 3, 3)), np.zeros(3), False, (1, 1), (1, 1), (0, 0), (0, 0))
    assert isinstance(verdict(split_separable, spec), Refusal)
    one_d = ConvSpec(rng.standard_normal((3, 2, 3)), np.zeros(3), False, (1,), (1,), (0,), (0,))
    assert "1-D" in verdict(split_separable, one_d).reason


def test_a_split_that_would_not_reproduce_the_kernel_is_refused_with_its_reason(monkeypatch):
    """With no rounding allowed, no split reproduces the kernel: the conv stays whole and the
    report says why (rather than saying nothing, as for a full-rank kernel)."""
    monkeypatch.setattr("convexport.algebra.separable.RECONSTRUCTION_TOLERANCE", 0.0)
    shape = [1, 6, 24, 24]
    outcome = rewrite(separable_model(shape, low_rank(8, 6, 9, 9, 1), pads=[4, 4, 4, 4]), "all")
    assert op_counts(outcome.model)["Conv"] == 1
    assert any(entry["rule"] == "low-rank-kernel" and "does not reproduce the kernel" in entry["reason"]
               for entry in outcome.skipped)


def test_full_rank_kernels_are_screened_without_an_svd(monkeypatch):
    """Trained kernels nearly always have full rank: the rank screen says so, ten times cheaper than
    the SVD; an exactly low-rank kernel still reaches the SVD and splits."""
    rng = np.random.default_rng(5)
    full = ConvSpec(rng.standard_normal([32, 32, 3, 3]), np.zeros(32), False, (1, 1), (1, 1), (1, 1), (1, 1))
    low = ConvSpec(np.einsum("rikz,orzl->oikl", rng.standard_normal([2, 32, 3, 1]), rng.standard_normal([32, 2, 1, 3])),
                   np.zeros(32), False, (1, 1), (1, 1), (1, 1), (1, 1))
    svd = np.linalg.svd
    calls = []
    monkeypatch.setattr(np.linalg, "svd", lambda *args, **kwargs: calls.append(1) or svd(*args, **kwargs))
    assert isinstance(verdict(split_separable, full), Refusal) and not calls
    assert split_separable(low).rank == 2 and calls


@pytest.mark.parametrize("rank, splits", [(7, True), (8, False), (10, False)])
def test_a_split_is_made_exactly_up_to_the_rank_where_it_pays(rank, splits):
    """4 -> 4 5x5 on 16x16 (pads 2): the conv costs 2*4*256*4*25 = 204,800 FLOPs, the pair
    20,480 per unit of rank: rank 7 saves 30% and splits; rank 8 saves 20%, under the
    quarter a split must save (SPLIT_SAVING), and rank 10 costs as much as the conv."""
    shape = [1, 4, 16, 16]
    outcome = rewrite(separable_model(shape, low_rank(4, 4, 5, 5, rank), pads=[2, 2, 2, 2]), "all")
    assert (op_counts(outcome.model)["Conv"] == 2) is splits
    assert not [entry for entry in outcome.skipped if entry["rule"] == "low-rank-kernel"]


def screened_sizes(monkeypatch):
    """The shapes of the matrices the rank screen is given and the SVD runs on, in order."""
    from convexport.algebra import separable

    screen, svd, sizes = separable._independent_columns, np.linalg.svd, []
    monkeypatch.setattr(separable, "_independent_columns", lambda a: sizes.append(a.shape) or screen(a))
    monkeypatch.setattr(np.linalg, "svd", lambda a, *args, **kwargs: sizes.append(("svd", *a.shape)) or svd(a, *args, **kwargs))
    return sizes


def spec_of(weight):
    out_channels = weight.shape[0]
    return ConvSpec(weight, np.zeros(out_channels), False, (1, 1), (1, 1), (1, 1), (1, 1))


def test_a_rank_too_high_to_pay_is_shown_on_a_submatrix(monkeypatch):
    """With the highest paying rank given, the screen proves rank >= max_rank + 1 on a square
    submatrix of that size: for a random 64 -> 64 3x3 kernel, a 96 x 96 screen instead of 192 x 192."""
    sizes = screened_sizes(monkeypatch)
    weight = np.random.default_rng(2).standard_normal([64, 64, 3, 3])
    result = verdict(split_separable, spec_of(weight), max_rank=95)
    assert isinstance(result, Refusal) and "pays below rank 96" in result.reason
    assert sizes == [(96, 96)]


def test_a_low_rank_below_the_paying_rank_still_splits_and_one_above_does_not(monkeypatch):
    weight = low_rank(24, 24, 3, 3, 5)       # a [72, 72] matrix of rank 5
    assert split_separable(spec_of(weight), max_rank=5).rank == 5
    sizes = screened_sizes(monkeypatch)
    assert isinstance(verdict(split_separable, spec_of(weight), max_rank=4), Refusal)
    assert sizes == [(5, 5)]                 # a 5 x 5 minor of a rank-5 matrix: no SVD
    sizes.clear()
    small = low_rank(8, 6, 7, 5, 5)          # [42, 40]: whole-matrix screen, then a 5-wide sketch's SVD finds rank 5
    assert isinstance(verdict(split_separable, spec_of(small), max_rank=4), Refusal)
    assert sizes == [(42, 40), ("svd", 5, 40)]


def test_a_submatrix_that_misses_the_proof_leaves_it_to_a_factoring_bounded_by_the_rank(monkeypatch):
    """A kernel whose matrix is diagonal (full rank 96) has singular 6 x 6 submatrices almost
    everywhere: the whole matrix is not screened (that costs what factoring it whole does); the
    SVD runs on a 6-wide sketch of its columns, which shows rank 6 or more."""
    weight = np.zeros([32, 32, 3, 3])
    for channel in range(32):
        for tap in range(3):
            weight[channel, channel, tap, tap] = 1.0 + channel + tap
    sizes = screened_sizes(monkeypatch)
    result = verdict(split_separable, spec_of(weight), max_rank=5)
    assert isinstance(result, Refusal) and not result.reported and sizes == [(6, 6), ("svd", 6, 96)]


def test_a_low_rank_kernel_splits_exactly_from_a_sketch_of_its_columns():
    weight = low_rank(96, 80, 3, 3, 7)       # [240, 288] of rank 7; a split pays below rank 20
    split = verdict(split_separable, spec_of(weight), max_rank=19)
    rebuilt = np.einsum("rikz,orzl->oikl", split.tall.weight, split.wide.weight)
    assert split.rank == 7 and np.max(np.abs(rebuilt - weight)) <= 1e-9 * np.max(np.abs(weight))


def test_factoring_beyond_the_budget_is_not_tried(monkeypatch):
    """A kernel the screen lets through is factored only within FACTOR_BUDGET_FLOPS: past it,
    an unreported refusal and no SVD (--strategy all on composed kernels took minutes)."""
    from convexport.algebra import separable

    monkeypatch.setattr(separable, "FACTOR_BUDGET_FLOPS", 1e3)
    sizes = screened_sizes(monkeypatch)
    result = verdict(split_separable, spec_of(low_rank(24, 24, 3, 3, 5)), max_rank=10)
    assert isinstance(result, Refusal) and not result.reported and "budget" in result.reason
    assert not [size for size in sizes if size[0] == "svd"]


def test_a_full_rank_kernel_is_screened_on_its_raw_weight_before_any_conv_spec(monkeypatch):
    """The primitive runs split_separable's screen on the model's own float32 weight first: a
    kernel whose rank is too high to pay never gets its float64 ConvSpec; a low-rank one does,
    and splits as before."""
    built = []
    from convexport.folds import separable as fold

    original = fold.conv_spec
    monkeypatch.setattr(fold, "conv_spec", lambda node: built.append(node.name) or original(node))
    shape = [1, 8, 16, 16]
    full = np.random.default_rng(3).standard_normal([8, 8, 5, 5]).astype(np.float32)
    outcome = rewrite(separable_model(shape, full, pads=[2, 2, 2, 2]), "all")
    assert op_counts(outcome.model)["Conv"] == 1 and not built
    outcome = rewrite(separable_model(shape, low_rank(8, 8, 5, 5, 2), pads=[2, 2, 2, 2]), "all")
    assert op_counts(outcome.model)["Conv"] == 2 and built


@pytest.mark.parametrize("rank", [1, 3, 6, 12, 18, 30])
@pytest.mark.parametrize("asked", [1, 4, 6, 7, 18, 40])
@pytest.mark.parametrize("channels", [8, 64])
def test_rank_at_least_never_claims_a_rank_the_kernel_lacks(rank, asked, channels):
    """A one-sided screen: "at least" is a proof; a full-rank kernel is always proven (the
    split it saves is never there), a low-rank one may be left to the SVD."""
    from convexport.algebra.separable import rank_at_least

    weight = low_rank(6, channels, 3, 4, rank)          # [3 * channels, 24]
    full = min(3 * channels, 24)
    true_rank = np.linalg.matrix_rank(weight.transpose(1, 2, 0, 3).reshape(3 * channels, 24))
    if rank_at_least(weight, asked):
        assert true_rank >= min(asked, full)
    if true_rank == full:
        assert rank_at_least(weight, asked)


@pytest.mark.parametrize("rows, cols", [(24, 24), (40, 12), (96, 96)])
@pytest.mark.parametrize("smallest", [1.0, 1e-2, 1e-3, 3e-5, 1e-6, 1e-12, 0.0])
def test_the_screen_reads_the_diagonal_of_qrs_r(rows, cols, smallest):
    """_independent_columns decides as |diag(R)| of a QR would: singular values from 1 down to
    `smallest` (0: exactly rank-deficient), the decision compared where R's smallest relative
    entry is not within a factor 2 of the tolerance."""
    from convexport.algebra.separable import SCREEN_TOLERANCE, _independent_columns

    draw = np.random.default_rng(int(smallest * 1e6) + rows)
    left, _ = np.linalg.qr(draw.standard_normal((rows, cols)))
    right, _ = np.linalg.qr(draw.standard_normal((cols, cols)))
    singular = np.geomspace(1.0, smallest, cols) if smallest > 0 else np.r_[np.ones(cols - 2), 0.0, 0.0]
    matrix = left @ np.diag(singular) @ right.T
    diagonal = np.abs(np.diag(np.linalg.qr(matrix, mode="r")))
    ratio = diagonal.min() / diagonal.max()
    if SCREEN_TOLERANCE / 2 < ratio < SCREEN_TOLERANCE * 2:
        pytest.skip("too near the tolerance for two methods to agree")
    assert _independent_columns(matrix) == (ratio > SCREEN_TOLERANCE)


@pytest.mark.parametrize("shape", [(5, 7, 3, 4), (1, 2, 2, 5), (64, 64, 3, 3)])
def test_the_screens_submatrix_is_read_from_the_kernel_as_the_whole_matrix_would_give_it(shape):
    from convexport.algebra.separable import _matricise, _submatrix

    weight = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    matrix = _matricise(weight)
    draw = np.random.default_rng(1)
    rows, cols = (np.sort(draw.permutation(size)[:min(matrix.shape)]) for size in matrix.shape)
    sub = _submatrix(weight, rows, cols)
    assert sub.dtype == np.float64 and np.array_equal(sub, matrix[np.ix_(rows, cols)])


@pytest.mark.parametrize("rank", [1, 7, 8, 9, 16, 17, 40, 90])
def test_a_large_low_rank_kernel_is_factored_at_the_width_its_rank_needs(rank, monkeypatch):
    """The factoring's sketch starts 8 columns wide and doubles while the rank fills it (up to the
    width where a split stops paying): every rank is found, the factors reproduce the kernel, and a
    rank-1 kernel (vgg19's constant one) is never sketched at the full width."""
    import convexport.algebra.separable as separable

    weight = low_rank(64, 64, 3, 3, rank)  # a [192, 192] matrix
    spec = ConvSpec(weight, np.zeros(64), False, (1, 1), (1, 1), (1, 1), (1, 1))
    widths = []
    qr = np.linalg.qr
    monkeypatch.setattr(np.linalg, "qr", lambda matrix, *a, **k: widths.append(matrix.shape[1]) or qr(matrix, *a, **k))
    split = split_separable(spec, max_rank=100)
    assert split.rank == rank
    rebuilt = np.einsum("rikz,orzl->oikl", split.tall.weight, split.wide.weight)
    np.testing.assert_allclose(rebuilt, weight, rtol=0, atol=1e-9 * np.abs(weight).max())
    assert widths[0] == separable.FIRST_SKETCH and widths[-1] > rank and all(w <= 101 for w in widths)
    assert widths == sorted(widths) and (rank >= separable.FIRST_SKETCH or widths == [separable.FIRST_SKETCH])


def test_a_kernel_of_the_rank_where_a_split_stops_paying_is_refused_after_the_widest_sketch():
    weight = low_rank(64, 64, 3, 3, 120)
    spec = ConvSpec(weight, np.zeros(64), False, (1, 1), (1, 1), (1, 1), (1, 1))
    refusal = verdict(split_separable, spec, 100)
    assert isinstance(refusal, Refusal) and not refusal.reported
