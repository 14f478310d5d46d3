"""A 2-D conv whose kernel has low rank, split exactly into a tall conv and a wide conv.

Matricise the kernel W [O, I, Kh, Kw] as A [(i, kh), (o, kw)] = W[o, i, kh, kw]. When A has rank
R (A = U S V^T with R nonzero singular values), then with

    T[r, i, kh, 0]  = U[(i, kh), r] * sqrt(S[r])          tall:  [R, I, Kh, 1]
    H[o, r, 0, kw]  = sqrt(S[r]) * V[(o, kw), r]           wide:  [O, R, 1, Kw]

sum_r H[o, r, 0, kw] T[r, i, kh, 0] = W[o, i, kh, kw], so conv_W(x) = conv_H(conv_T(x)) exactly:
T takes the rows' stride, dilation and pads (top, bottom), H the columns' (left, right) and the
bias. T has no bias, so padding its output with zero columns is the same as running it on x
padded with zero columns: the split is exact for any stride, dilation and zero padding.
The rank is numerical: singular values below RANK_TOLERANCE times the largest count as zero,
and the split is refused unless the product reproduces W to fp32 rounding. A rank screen (R's
diagonal of a QR, read from a Cholesky factor) finds most full-rank kernels (trained weights
nearly always are) before the SVD; given the highest rank at which the split still pays, it
only has to show that the rank exceeds that, which a nonsingular square submatrix of that size
proves at a fraction of the cost. A kernel the screen lets through is factored only up to that
rank (a sketch of its column space, _low_rank_svd) and only within FACTOR_BUDGET_FLOPS.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import flops
from .spec import ConvSpec, Refusal

RANK_TOLERANCE = 1e-7  # relative to the largest singular value: below fp32's resolution
RECONSTRUCTION_TOLERANCE = 1e-6
SCREEN_TOLERANCE = 1e-4  # R's diagonal entries above this fraction of the largest: full rank
SUBMATRIX_SEED = 0  # the screen's draw of rows and columns: the same decision every run
SUBMATRIX_FROM = 64  # below this many columns, screening the whole matrix costs less than the draw
FIRST_SKETCH = 8  # the low-rank factoring's first sketch width, doubled while the rank fills it
# The most work a kernel's factoring may cost (bench/RESULTS.md, "Measurements behind the
# code"): beyond it a split, however low the rank, is not looked for.
FACTOR_BUDGET_FLOPS = 2e10


@dataclass(frozen=True)
class SeparableConv:
    tall: ConvSpec  # [R, I, Kh, 1], the rows' geometry, no bias
    wide: ConvSpec  # [O, R, 1, Kw], the columns' geometry, the bias
    rank: int


def _no_split(reason: str) -> Refusal:
    """No tall/wide split exists or pays (not 2-D, a single row or column, a zero kernel, full
    rank or a rank too high to pay): the kernel is simply not a case for it, unlike a split
    that would be inexact, and the report does not list it."""
    return Refusal(reason, reported=False)


def split_separable(spec: ConvSpec, max_rank: int | None = None) -> SeparableConv:
    """The tall/wide pair of the module docstring; an unreported Refusal where there is none or, given
    `max_rank` (the highest rank at which the caller would use a split), where the rank is
    higher; a Refusal where the low-rank product would not reproduce the kernel."""
    if spec.nd != 2:
        raise _no_split(f"a {spec.nd}-D kernel has no row/column split")
    if not np.all(np.isfinite(spec.weight)):
        raise Refusal("the kernel holds inf or NaN: it is never factored")
    out_channels, in_channels, rows, cols = spec.weight.shape
    if rows == 1 or cols == 1:
        raise _no_split("the kernel is already a single row or column")
    if max_rank is not None and max_rank < 1:
        raise _no_split("a split would cost more than the conv at any rank")
    full = min(in_channels * rows, out_channels * cols)
    too_high = full if max_rank is None else min(max_rank + 1, full)  # the lowest rank of no use
    described = f"as a [{in_channels}x{rows}, {out_channels}x{cols}] matrix" + (
        "" if too_high == full else f"; a split pays below rank {too_high}"
    )
    if _plainly_of_rank(spec.weight, too_high):
        raise _no_split(f"the kernel has rank {too_high} or more {described}")
    matrix_shape = (in_channels * rows, out_channels * cols)
    if flops.low_rank_factoring(matrix_shape, too_high) > FACTOR_BUDGET_FLOPS:
        raise _no_split(f"factoring the kernel {described} would take more than the split's budget")
    u, singular, vt = _low_rank_svd(_matricise(spec.weight), too_high)
    if not singular.size or singular[0] == 0:
        raise _no_split("the kernel is zero")
    rank = int(np.count_nonzero(singular > RANK_TOLERANCE * singular[0]))
    if rank >= too_high:
        raise _no_split(f"the kernel has rank {rank} {described}")
    root = np.sqrt(singular[:rank])
    tall = (u[:, :rank] * root).T.reshape(rank, in_channels, rows, 1)
    wide = (vt[:rank].T * root).reshape(out_channels, cols, rank).transpose(0, 2, 1)[:, :, None, :]
    rebuilt = np.einsum("rikz,orzl->oikl", tall, wide)
    if np.max(np.abs(rebuilt - spec.weight)) > RECONSTRUCTION_TOLERANCE * np.max(np.abs(spec.weight)):
        raise Refusal("the low-rank product does not reproduce the kernel to fp32 rounding")
    (stride_h, stride_w), (dilation_h, dilation_w) = spec.strides, spec.dilations
    (top, left), (bottom, right) = spec.pads_begin, spec.pads_end
    return SeparableConv(
        ConvSpec(tall, np.zeros(rank), False, (stride_h, 1), (dilation_h, 1), (top, 0), (bottom, 0)),
        ConvSpec(wide, spec.bias, spec.has_bias, (1, stride_w), (1, dilation_w), (0, left), (0, right)),
        rank,
    )


def _low_rank_svd(matrix: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """U, S, V^T of `matrix` [m, n] when its rank is below `width`: its column space is that of
    matrix @ G for a [n, k] Gaussian G (with probability one, for any k above the rank), so with
    Q an orthonormal basis of it, matrix = Q (Q^T matrix) and the SVD of the small [k, n]
    Q^T matrix gives the whole one's nonzero part, at O(m n k) instead of O(m n min(m, n)).
    The sketch starts FIRST_SKETCH columns wide and doubles, up to `width`, until it holds the
    rank with room to spare and its factors reproduce the matrix (RECONSTRUCTION_TOLERANCE): a
    rank-1 kernel (a constant one) is factored at k = 8, not at the width where a split would
    stop paying; a rank near `width` costs at most twice the one sketch at `width`. A rank of
    `width` or more shows as `width` singular values above the tolerance, which the caller
    refuses; the caller's reconstruction check catches the rest. At full width, the plain SVD."""
    m, n = matrix.shape
    if width >= min(m, n):
        return np.linalg.svd(matrix, full_matrices=False)
    gaussian = np.random.default_rng(SUBMATRIX_SEED).standard_normal((n, width))
    scale = np.max(np.abs(matrix))
    k = min(FIRST_SKETCH, width)
    while True:
        basis, _ = np.linalg.qr(matrix @ gaussian[:, :k])
        u_small, singular, vt = np.linalg.svd(basis.T @ matrix, full_matrices=False)
        u = basis @ u_small
        if k >= width or not singular.size or singular[0] == 0:
            return u, singular, vt
        rank = int(np.count_nonzero(singular > RANK_TOLERANCE * singular[0]))
        if rank < k:
            rebuilt = (u[:, :rank] * singular[:rank]) @ vt[:rank]
            if np.max(np.abs(rebuilt - matrix)) <= RECONSTRUCTION_TOLERANCE * scale:
                return u, singular, vt
        k = min(2 * k, width)


def rank_at_least(weight: np.ndarray, rank: int) -> bool:
    """Whether the screen split_separable runs first (_plainly_of_rank) shows that the kernel
    [O, I, Kh, Kw], as the [I*Kh, O*Kw] matrix, has rank `rank` or more (at most its full rank).
    A kernel holding inf or NaN has no rank to speak of: True, so that it is never factored
    (LAPACK's iterations need not end on one)."""
    out_channels, in_channels, rows, cols = weight.shape
    return (
        rank <= 0
        or not np.all(np.isfinite(weight))
        or _plainly_of_rank(weight, min(rank, in_channels * rows, out_channels * cols))
    )


def _plainly_of_rank(weight: np.ndarray, rank: int) -> bool:
    """Whether a screen (_independent_columns) shows that the kernel's matrix (_matricise) has
    rank `rank` or more; False sends the kernel to the SVD, which costs an order of magnitude
    more than the screen.

    Below full rank, a nonsingular rank x rank submatrix (rows and columns drawn with a fixed
    seed) is proof: its columns are independent, so are the matrix's columns they come from.
    For 512 -> 512 3x3, where a split pays only below rank 768, that is a 768 x 768 screen
    instead of the 1536 x 1536 matrix. A submatrix that misses the proof (a structured kernel)
    leaves it to split_separable's factoring, which is bounded by the rank of interest; a small
    matrix (up to SUBMATRIX_FROM columns, where the draw costs as much as the screen) is
    screened whole.

    At full rank, R of the whole (tall) matrix's QR: if its columns are dependent, the first column
    in the span of those before it has a zero diagonal entry in R, to rounding: an exactly low
    rank (a product of a tall and a wide kernel, a separable filter) shows up as a diagonal entry
    near 1e-16 of the largest (1e-8 through the Gram matrix, or no Cholesky factor). Entries all
    above SCREEN_TOLERANCE of the largest are taken as independent; a near-deficiency the screen
    misses only loses a split (the split itself is checked)."""
    out_channels, in_channels, kernel_rows, kernel_cols = weight.shape
    shape = (in_channels * kernel_rows, out_channels * kernel_cols)
    full = min(shape)
    if rank < full and full > SUBMATRIX_FROM:
        draw = np.random.default_rng(SUBMATRIX_SEED)
        rows, cols = (np.sort(draw.permutation(size)[:rank]) for size in shape)
        # a draw that misses the proof leaves it to the factoring, which is bounded by the
        # rank of interest: screening the whole matrix would cost as much as factoring it whole
        return _independent_columns(_submatrix(weight, rows, cols))
    matrix = _matricise(weight)
    return _independent_columns(matrix if matrix.shape[0] >= matrix.shape[1] else matrix.T)


def _independent_columns(tall: np.ndarray) -> bool:
    """Every diagonal entry of R (tall = QR, rows >= columns) above SCREEN_TOLERANCE of the largest.

    R's diagonal is read from the Cholesky factor L of the Gram matrix G = tall^T tall [C, C]:
    G = R^T R, so L = R^T up to signs and |R_kk| = L_kk, with fewer flops than a QR at any size.
    Squaring the matrix squares its condition number, but an entry at the tolerance (1e-4 of
    the largest) is 1e-8 of it in G, far above float64's rounding; dependent columns leave G
    singular, where Cholesky fails or gives a diagonal entry near 1e-8 of the largest: not
    independent either way."""
    try:
        diagonal = np.diagonal(np.linalg.cholesky(tall.T @ tall))
    except np.linalg.LinAlgError:
        return False
    return diagonal.size > 0 and diagonal.min() > SCREEN_TOLERANCE * diagonal.max()


def _submatrix(weight: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """_matricise(weight)[np.ix_(rows, cols)], read from the kernel without building the whole
    float64 matrix (for a 512 -> 512 3x3 kernel, 19 MB to copy for a 768 x 768 draw): row
    i*Kh + kh and column o*Kw + kw of the matrix are W[o, i, kh, kw]."""
    in_channel, kernel_row = np.divmod(rows, weight.shape[2])
    out_channel, kernel_col = np.divmod(cols, weight.shape[3])
    return np.asarray(
        weight[out_channel[None, :], in_channel[:, None], kernel_row[:, None], kernel_col[None, :]], np.float64
    )


def _matricise(weight: np.ndarray) -> np.ndarray:
    """W [O, I, Kh, Kw] -> [I*Kh, O*Kw], float64: row i*Kh + kh, column o*Kw + kw."""
    out_channels, in_channels, rows, cols = weight.shape
    return np.asarray(weight, np.float64).transpose(1, 2, 0, 3).reshape(in_channels * rows, out_channels * cols)
