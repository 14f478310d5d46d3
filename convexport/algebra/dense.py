"""Dense linear maps on the last axis (Gemm, MatMul, per-feature affine maps): composed and summed.

A dense map is y = x W + b on the last axis of x [..., C]: W [C, D], b [D] or no bias. A
per-feature affine map is y = x * s + t with s, t [C] (BatchNormalization on [N, C], Mul /
Div / Add / Sub by a constant that broadcasts along the last axis only). All in float64:

    after:   (x W + b) * s + t          = x (W diag(s)) + (b s + t);   s, t [D]
    before:  (x * s + t) W + b          = x (diag(s) W) + (t W + b);   s, t [C]
    chain:   (x W1 + b1) W2 + b2        = x (W1 W2) + (b1 W2 + b2);    W1 [C, r], W2 [r, D]
    sum:     sum_i sign_i (x W_i + b_i) = x (sum_i sign_i W_i) + sum_i sign_i b_i
    maps:    (x * s1 + t1) * s2 + t2    = x * (s1 s2) + (t1 s2 + t2)
    mixed:   (x W + b) + (x * s + t)    = x (W + diag(s)) + (b + t);   W [C, C]

A chain through a narrow r (a low-rank factorisation) costs r (C + D) multiply-adds per row
kept and C D composed: it is composed only where C D <= r (C + D).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from .spec import Refusal


@dataclass(frozen=True)
class Dense:
    """y = x W + b: weight [C, D], bias [D] or None (the node had none), float64."""

    weight: np.ndarray
    bias: np.ndarray | None

    @property
    def in_features(self) -> int:
        return self.weight.shape[0]

    @property
    def out_features(self) -> int:
        return self.weight.shape[1]


@dataclass(frozen=True)
class FeatureAffine:
    """y = x * scale + shift per feature of the last axis: scale, shift [C] float64."""

    scale: np.ndarray
    shift: np.ndarray


LinearMap = Dense | FeatureAffine


def gemm_dense(b, c, trans_b: bool, alpha: float, beta: float) -> Dense:
    """Gemm(x, B, C) = alpha * x op(B) + beta * C as a Dense: W = alpha op(B) [C, D], op(B) = B^T
    for transB (B [D, C]) else B ([C, D]); bias = beta C as [D]. C must be one row for every row
    of x: [], [1], [D], [1, 1] or [1, D] ([M, D] and [M, 1] differ between rows)."""
    weight = np.asarray(b, np.float64)
    weight = alpha * (weight.T if trans_b else weight)
    if c is None:
        return Dense(weight, None)
    c = np.asarray(c, np.float64)
    out_features = weight.shape[1]
    if c.ndim > 2 or (c.ndim == 2 and c.shape[0] != 1) or (c.ndim >= 1 and c.shape[-1] not in (1, out_features)):
        raise Refusal(f"the Gemm's C of shape {c.shape} is not one row of {out_features} outputs")
    return Dense(weight, beta * np.broadcast_to(c.reshape(-1), (out_features,)))


def last_axis_vector(value, features: int, rank: int) -> np.ndarray:
    """A constant broadcast against a tensor [..., features] of `rank` dims, as [features]: a
    scalar, [features] or [1, .., 1, features] (or a last dim of 1). Refused (not reported:
    no per-feature map) where it varies along another axis or would change the tensor's shape."""
    value = np.asarray(value, np.float64)
    if value.ndim > rank or any(d != 1 for d in value.shape[:-1]):
        raise Refusal(
            f"the constant of shape {value.shape} does not broadcast along the last axis only", reported=False
        )
    if value.ndim and value.shape[-1] not in (1, features):
        raise Refusal(f"the constant of shape {value.shape} is not one value per feature of {features}", reported=False)
    return np.broadcast_to(value.reshape(-1), (features,)).astype(np.float64)


def elementwise_affine(op: str, k: np.ndarray, data_first: bool) -> FeatureAffine:
    """x*k, k*x, x/k, x+k, k+x, x-k, k-x for k [C] as y = x * s + t; k / x is not linear."""
    zero, one = np.zeros_like(k), np.ones_like(k)
    if op == "Mul":
        return FeatureAffine(k, zero)
    if op == "Div":
        if not data_first:
            raise Refusal("k / x is not linear in x", reported=False)
        with np.errstate(divide="ignore"):  # x / 0: an inf scale, refused by the caller
            return FeatureAffine(1.0 / k, zero)
    if op == "Add":
        return FeatureAffine(one, k)
    if op == "Sub":
        return FeatureAffine(one, -k) if data_first else FeatureAffine(-one, k)
    raise ValueError(f"{op} is not an elementwise affine op")


def rescale_outputs(dense: Dense, affine: FeatureAffine) -> Dense:
    """(x W + b) * s + t = x (W diag(s)) + (b s + t): W [C, D] * s[None, :], s, t [D]; no
    bias where there was none and t = 0."""
    weight = dense.weight * affine.scale[None, :]
    if dense.bias is None and not np.any(affine.shift):
        return Dense(weight, None)
    bias = np.zeros(dense.out_features) if dense.bias is None else dense.bias
    return Dense(weight, bias * affine.scale + affine.shift)


def rescale_inputs(affine: FeatureAffine, dense: Dense) -> Dense:
    """(x * s + t) W + b = x (diag(s) W) + (t W + b): s[:, None] * W [C, D], s, t [C]; no bias
    where there was none and t = 0."""
    weight = affine.scale[:, None] * dense.weight
    if dense.bias is None and not np.any(affine.shift):
        return Dense(weight, None)
    bias = np.zeros(dense.out_features) if dense.bias is None else dense.bias
    return Dense(weight, affine.shift @ dense.weight + bias)


def compose_dense(first: Dense, second: Dense) -> Dense:
    """(x W1 + b1) W2 + b2 = x (W1 W2) + (b1 W2 + b2); W1 [C, r], W2 [r, D] -> [C, D]."""
    weight = first.weight @ second.weight
    if first.bias is None and second.bias is None:
        return Dense(weight, None)
    bias = np.zeros(second.out_features) if second.bias is None else second.bias
    return Dense(weight, bias if first.bias is None else first.bias @ second.weight + bias)


def check_low_rank(first: Dense, second: Dense) -> None:
    """Refused where x [., C] -> r -> D is cheaper kept: C D multiply-adds per row composed
    against r (C + D) kept (the numbers also as the refusal's decision, for the report)."""
    c, r, d = first.in_features, first.out_features, second.out_features
    composed, kept = c * d, r * (c + d)
    if composed <= kept:
        return
    numbers = f"C*D = {composed} multiply-adds per row instead of r*(C+D) = {kept}"
    raise Refusal(
        f"a low-rank factorisation {c} -> {r} -> {d} is cheaper kept: composed it costs {numbers}",
        {
            "method": "rank",
            "in_features": c,
            "rank": r,
            "out_features": d,
            "composed_macs_per_row": composed,
            "kept_macs_per_row": kept,
            "note": numbers,
        },
    )


def fold_chain(maps: Sequence[LinearMap], keep_low_rank: bool = True) -> Dense:
    """maps[-1](...maps[0](x)) as one Dense; with keep_low_rank, a chain of two dense maps
    through a narrow r is refused (check_low_rank). Needs a Dense among the maps."""
    result = maps[0]
    for step in maps[1:]:
        if isinstance(result, Dense) and isinstance(step, Dense) and keep_low_rank:
            check_low_rank(result, step)
        result = compose_maps(result, step)
    if not isinstance(result, Dense):
        raise Refusal("a per-feature map alone is no dense map", reported=False)
    return result


def compose_maps(first: LinearMap, second: LinearMap) -> LinearMap:
    """second(first(x)): a Dense where either is one, else (x s1 + t1) s2 + t2 = x (s1 s2) + (t1 s2 + t2)."""
    if isinstance(first, Dense):
        return compose_dense(first, second) if isinstance(second, Dense) else rescale_outputs(first, second)
    if isinstance(second, Dense):
        return rescale_inputs(first, second)
    return FeatureAffine(first.scale * second.scale, first.shift * second.scale + second.shift)


def add_maps(first: LinearMap, second: LinearMap, sign: float) -> LinearMap:
    """first(x) + sign * second(x), both of x [..., C] with D outputs: two per-feature maps
    stay one (s1 + sign s2, t1 + sign t2); with a Dense, a per-feature map is the Dense
    diag(s) [C, C] with bias t. Refused (not reported) where the widths differ."""
    if isinstance(first, FeatureAffine) and isinstance(second, FeatureAffine):
        if first.scale.shape != second.scale.shape:
            raise Refusal("the terms differ in width: their sum broadcasts", reported=False)
        return FeatureAffine(first.scale + sign * second.scale, first.shift + sign * second.shift)
    return sum_dense([_as_dense(first), _as_dense(second)], [1.0, sign])


def _as_dense(linear: LinearMap) -> Dense:
    """A per-feature map as the Dense diag(s) [C, C], bias t (none where t = 0)."""
    if isinstance(linear, Dense):
        return linear
    return Dense(np.diag(linear.scale), linear.shift if np.any(linear.shift) else None)


def _signed_sum(arrays: Sequence[np.ndarray], signs: Sequence[float]) -> np.ndarray:
    """sum_i sign_i a_i in one new array (signs of +-1 add or subtract in place, with no scaled
    copy of each term: bench/RESULTS.md, "Measurements behind the code")."""
    total = np.multiply(arrays[0], signs[0], dtype=np.float64)
    for sign, array in zip(signs[1:], arrays[1:]):
        if sign == 1:
            total += array
        elif sign == -1:
            total -= array
        else:
            total += sign * array
    return total


def sum_dense(terms: Sequence[Dense], signs: Sequence[float]) -> Dense:
    """sum_i sign_i (x W_i + b_i) = x (sum_i sign_i W_i) + sum_i sign_i b_i, all W_i [C, D];
    refused where the shapes differ (the sum would broadcast)."""
    shapes = {term.weight.shape for term in terms}
    if len(shapes) != 1:
        raise Refusal(f"the terms' weights differ in shape ({sorted(shapes)}): their sum broadcasts", reported=False)
    weight = _signed_sum([term.weight for term in terms], signs)
    biases = [(sign, term.bias) for sign, term in zip(signs, terms) if term.bias is not None]
    bias = cast(np.ndarray, sum(sign * b for sign, b in biases)) if biases else None
    return Dense(weight, bias)
