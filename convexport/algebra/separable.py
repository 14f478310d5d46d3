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
and the split is refused unless the product reproduces W to fp32 rounding. A QR screen finds
most full-rank kernels (trained weights nearly always are) before the SVD.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .spec import ConvSpec, Refusal

RANK_TOLERANCE = 1e-7        # relative to the largest singular value: below fp32's resolution
RECONSTRUCTION_TOLERANCE = 1e-6
SCREEN_TOLERANCE = 1e-4      # QR diagonal entries above this fraction of the largest: full rank


@dataclass(frozen=True)
class SeparableConv:
    tall: ConvSpec           # [R, I, Kh, 1], the rows' geometry, no bias
    wide: ConvSpec           # [O, R, 1, Kw], the columns' geometry, the bias
    rank: int


@dataclass(frozen=True)
class NoSplit(Refusal):
    """No tall/wide split exists (not 2-D, a single row or column, a zero or full-rank
    kernel): the kernel is simply not a case for it, unlike a split that would be inexact."""


def split_separable(spec: ConvSpec) -> SeparableConv | Refusal:
    """The tall/wide pair of the module docstring; NoSplit where there is none, a Refusal
    where the low-rank product would not reproduce the kernel."""
    if spec.nd != 2:
        return NoSplit(f"a {spec.nd}-D kernel has no row/column split")
    out_channels, in_channels, rows, cols = spec.weight.shape
    if rows == 1 or cols == 1:
        return NoSplit("the kernel is already a single row or column")
    matrix = _matricise(spec.weight)
    if _plainly_full_rank(matrix):
        return NoSplit(f"the kernel has full rank as a [{in_channels}x{rows}, {out_channels}x{cols}] matrix")
    u, singular, vt = np.linalg.svd(matrix, full_matrices=False)
    if not singular.size or singular[0] == 0:
        return NoSplit("the kernel is zero")
    rank = int(np.count_nonzero(singular > RANK_TOLERANCE * singular[0]))
    if rank >= min(matrix.shape):
        return NoSplit(f"the kernel has full rank {rank} as a [{in_channels}x{rows}, {out_channels}x{cols}] matrix")
    root = np.sqrt(singular[:rank])
    tall = (u[:, :rank] * root).T.reshape(rank, in_channels, rows, 1)
    wide = (vt[:rank].T * root).reshape(out_channels, cols, rank).transpose(0, 2, 1)[:, :, None, :]
    rebuilt = np.einsum("rikz,orzl->oikl", tall, wide)
    if np.max(np.abs(rebuilt - spec.weight)) > RECONSTRUCTION_TOLERANCE * np.max(np.abs(spec.weight)):
        return Refusal("the low-rank product does not reproduce the kernel to fp32 rounding")
    (stride_h, stride_w), (dilation_h, dilation_w) = spec.strides, spec.dilations
    (top, left), (bottom, right) = spec.pads_begin, spec.pads_end
    return SeparableConv(
        ConvSpec(tall, np.zeros(rank), False, (stride_h, 1), (dilation_h, 1), (top, 0), (bottom, 0)),
        ConvSpec(wide, spec.bias, spec.has_bias, (1, stride_w), (1, dilation_w), (0, left), (0, right)),
        rank)


def _plainly_full_rank(matrix: np.ndarray) -> bool:
    """A QR screen before the SVD, which costs ten times more (1.2 s for a 512 -> 512 3x3
    kernel's 1536 x 1536 matrix; QR 0.14 s). If the columns are dependent, the first column in
    the span of those before it has a zero diagonal entry in R, to rounding: an exactly low
    rank (a product of a tall and a wide kernel, a separable filter) shows up as a diagonal
    entry near 1e-16 of the largest. Entries all above SCREEN_TOLERANCE of the largest are taken
    as full rank; a near-deficiency QR misses only loses a split (the split itself is checked)."""
    tall = matrix if matrix.shape[0] >= matrix.shape[1] else matrix.T
    diagonal = np.abs(np.diag(np.linalg.qr(tall, mode="r")))
    return diagonal.size > 0 and diagonal.min() > SCREEN_TOLERANCE * diagonal.max()


def _matricise(weight: np.ndarray) -> np.ndarray:
    out_channels, in_channels, rows, cols = weight.shape
    return np.asarray(weight, np.float64).transpose(1, 2, 0, 3).reshape(in_channels * rows, out_channels * cols)
