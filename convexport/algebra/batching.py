"""Weight packing for batched branches: N per-branch layers as one conv or one contraction.

All functions are exact rearrangements (no arithmetic besides transposes), float64 out.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def stack_conv_heads(
    weights: Sequence[np.ndarray], biases: Sequence[np.ndarray | None]
) -> tuple[np.ndarray, np.ndarray | None]:
    """N convs reading the same x: W_i [O_i, I/g, *k] -> W [sum O_i, I/g, *k], b_i [O_i] -> b [sum O_i].

    Output channels O_1 + ... + O_(n-1) + o of the stacked conv are channel o of branch n (same
    group count). The bias is None only when no branch has one (a missing bias is zeros).
    """
    weight = np.concatenate([np.asarray(w, np.float64) for w in weights], axis=0)
    if all(b is None for b in biases):
        return weight, None
    bias = np.concatenate(
        [np.zeros(len(w)) if b is None else np.asarray(b, np.float64).reshape(len(w)) for w, b in zip(weights, biases)]
    )
    return weight, bias


def grouped_from_branches(
    weights: Sequence[np.ndarray], biases: Sequence[np.ndarray | None], group: int
) -> tuple[np.ndarray, np.ndarray | None, int]:
    """N convs each on its own C channels (group g, W_i [O, C/g, *k]) -> one conv on the N*C
    stacked channels with group N*g: W [N*O, C/g, *k]; group n*g + j is branch n's group j."""
    weight, bias = stack_conv_heads(weights, biases)
    return weight, bias, len(weights) * group


def pack_linear_heads(
    weights: Sequence[np.ndarray],
    biases: Sequence[np.ndarray | None],
    transposed: bool,
    alpha: float = 1.0,
    beta: float = 1.0,
) -> tuple[np.ndarray, np.ndarray | None]:
    """N Gemm(x_n, W_n, b_n) = alpha * x_n @ op(W_n) + beta * b_n -> W [N, I, O], b [N, O].

    op(W_n) is W_n^T when transB (W_n [O, I]) else W_n ([I, O]); then for x [B, N, I]
    einsum("bni,nio->bno", x, W) + b[None] gives branch n's output at [:, n, :]. alpha and beta
    are folded into W and b.
    """
    packed = np.stack([np.asarray(w, np.float64).T if transposed else np.asarray(w, np.float64) for w in weights])
    packed = packed * alpha
    if all(b is None for b in biases):
        return packed, None
    out = packed.shape[2]
    bias = (
        np.stack(
            [
                np.zeros(out) if b is None else np.broadcast_to(np.asarray(b, np.float64).reshape(-1), (out,))
                for b in biases
            ]
        )
        * beta
    )
    return packed, bias
