"""Whether a sum of branches folded into one kernel survives rounding into a half type
(`optimize --dtype fp16`, or a model whose weights are float16 already): a fold is exact in
real arithmetic, not in every precision.

The folded kernel W = sum_i s_i W_i ([O, I, *k], each W_i placed in the common window)
rounded into float16 moves each tap by up to half a unit in the last place of the tap's own
magnitude. A branch that is x itself (the identity of a residual, of sample_models/seed000_subtracted_conv.py's
`d -= p`) is
never rounded unfolded: it passes x on exactly. Folded, it lands in the centre taps and their
rounding scales with it: that model's depthwise kernel D - I has centre taps near -1, rounded to
a 2048th of themselves where D's small taps and an exact subtraction were; FastViT's
x + gamma * (mixer(x) - norm(x)) folds to centre taps 1 + O(gamma), and float16 keeps 11 bits
of them, so a layer scale gamma below 2^-11 is rounded away. The same holds for a linear
region of the last axis that sums x itself (x + x W folds to I + W: linear_region.py).

Where x itself is a branch, the fold is kept where

    ||fl(W) - W|| <= FOLD_SLACK * ||fl(W_rest) - W_rest||,   W_rest = sum_{i not x} s_i W_i

(Frobenius norms over the whole kernel, fl rounding to the half type, computed in float64):
the output's error from the weights is a sum of tap errors times inputs, of expected square
proportional to the kernel error's squared norm when the inputs are alike in scale, and the
unfolded graph rounds the other branches (their weights, or on a device that computes in half
their outputs) where it passes x exactly. Every other sum folds: branches of independent
weights round as their fold does, within a few percent either way, and on a device that
computes in half the fold saves the rounding of each branch's output. That holds for weights
that are float16 already (a float16 checkpoint's, whose branches are exact in float16 one by
one: unfolded, each branch's output is rounded instead; with every value rounded as a device
rounds it, RepVGG-A0's folded float16 model is as near the exact result as its unfolded one,
bench/RESULTS.md). For a region, the comparison is that of its map composed from its nodes'
maps rounded, made where x reaches the sum through per-feature maps alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import ml_dtypes
import numpy as np

from ..algebra import Refusal, combine_parallel
from ..algebra.dense import Dense, FeatureAffine, LinearMap
from ..algebra.spec import ConvSpec

FOLD_SLACK = 1.5
HALF_TYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def stored_half(dtype) -> str | None:
    """The half type a node computes in where it is one already (a float16 model that is not
    converted as its float32 twin: its fold is made in float64 and stored in float16 again);
    None for any other type."""
    return next((name for name, kind in HALF_TYPES.items() if np.dtype(dtype) == np.dtype(kind)), None)


def keep_if_rounding_allows(
    specs: Sequence[ConvSpec],
    signs: Sequence[float],
    is_x: Sequence[bool],
    merged: ConvSpec,
    spatial,
    half: str | None,
) -> None:
    """Refusal where `merged` (the fold of `specs` with `signs`; `is_x` marks the branches that
    are x itself) rounded into `half` is over FOLD_SLACK times as far from its exact kernel as
    the fold of the other branches rounded (module doc); nothing for a float32 output (`half`
    None) or a sum without x itself."""
    if half is None or not any(is_x) or all(is_x):
        return
    rest = [(spec, sign) for spec, sign, x in zip(specs, signs, is_x) if not x]
    others = combine_parallel([spec for spec, _ in rest], [sign for _, sign in rest], spatial).weight
    folded = np.linalg.norm(_rounded(merged.weight, HALF_TYPES[half]) - merged.weight)
    apart = np.linalg.norm(_rounded(others, HALF_TYPES[half]) - others)
    _refuse_if_farther(folded, apart, half, "the other branches folded without x itself")


def rounded_map(step: LinearMap, half: str) -> LinearMap:
    """A dense or per-feature map with its constants rounded into `half` (as the unfolded
    node would hold them)."""
    kind = HALF_TYPES[half]
    if isinstance(step, FeatureAffine):
        return FeatureAffine(_rounded(step.scale, kind), _rounded(step.shift, kind))
    return Dense(_rounded(step.weight, kind), None if step.bias is None else _rounded(step.bias, kind))


def refuse_if_rounding_undoes(exact: np.ndarray, from_rounded_parts: np.ndarray, half: str) -> None:
    """Refusal where `exact` (the folded weight) rounded into `half` is over FOLD_SLACK times as
    far from itself as `from_rounded_parts` (the fold of the parts rounded one by one) is."""
    folded = np.linalg.norm(_rounded(exact, HALF_TYPES[half]) - exact)
    unfolded = np.linalg.norm(from_rounded_parts - exact)
    _refuse_if_farther(folded, unfolded, half, "its branches rounded one by one")


def _refuse_if_farther(folded: float, unfolded: float, half: str, parts: str) -> None:
    """Refusal where the folded kernel's rounding error `folded` is over FOLD_SLACK times
    `unfolded` (that of `parts`, the graph it would replace)."""
    if folded > FOLD_SLACK * unfolded:
        against = (
            f"where {parts} are exact"
            if unfolded == 0
            else f"{folded / unfolded:.3g}x as far as {parts} ({unfolded:.3g})"
        )
        raise Refusal(
            f"rounded to {half}, the folded kernel would be {folded:.3g} from its exact value, {against}: an "
            f"exact branch folded into rounded taps; left unfolded for the {half} model",
            {"method": "half-precision rounding", "folded_error": float(folded), "branches_error": float(unfolded)},
        )


def _rounded(values: np.ndarray, kind) -> np.ndarray:
    return values.astype(kind).astype(np.float64)
