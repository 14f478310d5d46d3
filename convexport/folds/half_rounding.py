"""Whether a sum of branches folded into one kernel survives rounding into a half type
(`optimize --dtype fp16`): a fold is exact in real arithmetic, not in every precision.

The folded kernel W = sum_i s_i W_i ([O, I, *k], each W_i placed in the common window)
rounded into float16 moves each tap by up to half a unit in the last place of the tap's own
magnitude, where the unfolded graph rounds each W_i by itself. A branch that is exact in any
precision (x itself: the identity of a residual, of seed 000's `d -= p`) is never rounded
unfolded, but folded it lands in the centre taps and their rounding scales with it: seed
000's depthwise kernel D - I has centre taps near -1, rounded to a 2048th of themselves where
D's small taps and an exact subtraction were; FastViT's x + gamma * (mixer(x) - norm(x))
folds to centre taps 1 + O(gamma), and float16 keeps 11 bits of them, so a layer scale gamma
below 2^-11 is rounded away. The same holds for a linear region of the last axis that sums x
itself (x + x W folds to I + W: linear_region.py).

The fold is kept where

    ||fl(W) - W|| <= FOLD_SLACK * ||sum_i s_i fl(W_i) - W||

(Frobenius norms over the whole kernel, fl rounding to the half type, computed in float64;
for a region, sum_i s_i fl(W_i) is the region's map composed from its nodes' maps rounded):
the output's error from the weights is a sum of tap errors times inputs, of expected square
proportional to the kernel error's squared norm when the inputs are alike in scale. Branches
of independent random weights come out within a few percent of 1 either way (the folded
kernel's rounding is the branches' summed); the slack keeps those folds, which on a device
that computes in float16 also save the rounding of each branch's output. So the comparison is
made only where a branch is exact in the half type (x itself, or weights that were float16
before: a float16 checkpoint's) or, in a region, x reaches a sum through per-feature maps
alone: elsewhere it would cost a second fold for nothing (for a region, a second [C, D]
product per fold: a LoRA MLP's rewrite would take half as long again).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import ml_dtypes
import numpy as np

from ..algebra import Refusal, combine_parallel
from ..algebra.dense import Dense, FeatureAffine, LinearMap
from ..algebra.spec import ConvSpec

FOLD_SLACK = 1.5
HALF_TYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def keep_if_rounding_allows(
    specs: Sequence[ConvSpec], signs: Sequence[float], merged: ConvSpec, spatial, half: str | None
) -> None:
    """Refusal where `merged` (the fold of `specs` with `signs`) rounded into `half` is over
    FOLD_SLACK times as far from its exact kernel as the branches rounded one by one (module
    doc); nothing for a float32 output (`half` None)."""
    if half is None:
        return
    rounded = [_rounded(spec.weight, HALF_TYPES[half]) for spec in specs]
    if not any(np.array_equal(weight, spec.weight) for weight, spec in zip(rounded, specs)):
        return  # no exact branch: the folded kernel rounds as the branches do (module doc)
    parts = combine_parallel([replace(spec, weight=weight) for spec, weight in zip(specs, rounded)], signs, spatial)
    refuse_if_rounding_undoes(merged.weight, parts.weight, half)


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
    if folded > FOLD_SLACK * unfolded:
        against = (
            "where its branches rounded one by one are exact"
            if unfolded == 0
            else f"{folded / unfolded:.3g}x as far as its branches rounded one by one ({unfolded:.3g})"
        )
        raise Refusal(
            f"rounded to {half}, the folded kernel would be {folded:.3g} from its exact value, {against}: an "
            f"exact branch folded into rounded taps; left unfolded for the {half} model",
            {"method": "half-precision rounding", "folded_error": float(folded), "branches_error": float(unfolded)},
        )


def _rounded(values: np.ndarray, kind) -> np.ndarray:
    return values.astype(kind).astype(np.float64)
