"""The criteria validation judges an output by, each on arrays: the scale-aware tolerance
check (compare_arrays), the float64 criterion (compare_exactly: no further from the exact
result than the original), and the noise floor measured where the float64 reference ran
(NoiseFloor, from the reference summed in another order; compare_by_noise_floor). Each is a
Judge (AgainstFloat64, ByNoiseFloor, ByTolerances); judge_of_set picks one per input set.

The check is per element and scale-aware:

    |cand - ref| <= atol + rtol * max(|ref|, rms(ref))

where rms(ref) is the root mean square of that output in that run. A folded graph changes the
order of fp32 sums, whose error is proportional to the size of the terms, i.e. to the output's
scale, not to each element's own value: an element that is near zero only by cancellation
gets the tolerance of its neighbours. With the defaults (rtol 1e-4, atol 1e-5) fp32
reassociation noise (~1e-6 of the scale) passes and a 1% change of one weight tensor of a
ResNet-sized model fails (tests/test_validation.py shows both). NaN must meet NaN and an
infinity the same infinity, else the element fails.

Per output: max and mean absolute error, max and mean relative error (|cand - ref| /
max(|ref|, rms(ref))), cosine similarity (the lowest over the runs), failing elements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .exact_check import ExactReference, judge, noise_floor_bound
from .float64.precision import dtype_name, rms
from .results import OutputError, Tolerances
from .rounded_run import largest_apart
from .runs import reordered_reference


def compare_arrays(ref: np.ndarray, cand: np.ndarray, rtol: float, atol: float) -> OutputError:
    """Error statistics of one output (see the module doc for the check); an output that is
    not numbers (strings) must be equal element for element."""
    if ref.size == 0:
        return OutputError(rtol=rtol, atol=atol)
    if ref.dtype.kind in "USO":
        unequal = int(np.count_nonzero(ref != cand))
        return OutputError(
            cosine=1.0 if not unequal else 0.0, mismatches=unequal, elements=int(ref.size), rtol=rtol, atol=atol
        )
    ref64, cand64 = ref.astype(np.float64), cand.astype(np.float64)
    finite = np.isfinite(ref64) & np.isfinite(cand64)
    same_special = (np.isnan(ref64) & np.isnan(cand64)) | (np.isinf(ref64) & (ref64 == cand64))
    diff = np.abs(np.subtract(ref64, cand64, where=finite, out=np.zeros_like(ref64)))
    scale = float(np.sqrt(np.mean(np.square(ref64[finite])))) if finite.any() else 0.0
    reference = np.maximum(np.abs(np.where(finite, ref64, 0.0)), scale)
    close = finite & (diff <= atol + rtol * reference)
    # against a reference of zero (all of it zero: no scale either) a relative error has no
    # meaning: infinite where the candidate differs, 0 where it does not
    rel = np.divide(diff, reference, out=np.where(diff > 0, np.inf, 0.0), where=reference > 0)
    cosine = _cosine(ref64[finite], cand64[finite])
    return OutputError(
        max_abs=float(diff.max()),
        mean_abs=float(diff[finite].mean()) if finite.any() else 0.0,
        max_rel=float(rel.max()),
        mean_rel=float(rel[finite].mean()) if finite.any() else 0.0,
        cosine=cosine,
        mismatches=int(np.count_nonzero(~(close | same_special))),
        elements=int(ref.size),
        rtol=rtol,
        atol=atol,
        nonfinite=int(np.count_nonzero(~np.isfinite(ref64))),
    )


def compare_exactly(
    ref: np.ndarray,
    cand: np.ndarray,
    exact: np.ndarray,
    cand64: np.ndarray | None,
    tolerances: Tolerances,
    name: str,
    strict: bool = False,
    precision: str | None = None,
    rounded: np.ndarray | None = None,
) -> OutputError:
    """One output judged against the exact result (exact_check.judge) at the roundoff of
    `precision` (default: the output's type), counting `rounded`'s error (the reference with
    every value rounded to `precision`) as its own where given; the statistics of the candidate
    against the reference's own run as compare_arrays gives them; explicit tolerances, where
    given (or the dtype's, when `strict`: the reference is suspect), as a bound on that
    difference besides."""
    dtype = precision or dtype_name(ref)
    if ref.dtype.kind in "USO" or ref.size == 0:  # strings: equal or not; nothing to compare
        return compare_arrays(ref, cand, *tolerances.for_output(name, dtype))
    explicit = tolerances.explicit_for(name) or strict
    rtol, atol = tolerances.for_output(name, dtype) if explicit else (None, None)
    error = compare_arrays(ref, cand, rtol or 0.0, atol or 0.0)
    verdict = judge(ref, cand, exact, cand64, dtype, rounded)
    error.rtol, error.atol = rtol, atol
    error.exact_error_rounded = verdict.error_rounded
    error.mismatches = verdict.beyond + (error.mismatches if explicit else 0)
    error.exact_error_original, error.exact_error = verdict.error_original, verdict.error
    error.exact_error_float64, error.exact_bound = verdict.error_float64, verdict.bound
    return error


@dataclass
class NoiseFloor:
    """The reference's own float32 error on an input set without a float64 result, the sets
    after those its float64 reference fitted the time budget on. A model that amplifies
    rounding has its own error vary tenfold from one input set to the next (LeViT-128S with
    random weights: 2e-6, 8e-6, 6e-5 on three sets), and the error measured on the float64 sets
    alone refused a correct rewrite where the reference fitted on fewer sets
    (bench/RESULTS.md). On such a set it is the largest of: the measured error, grown as this
    set's output is larger than the measured sets'; the reference's distance from its own run
    summed in another order (`reordered`); and, for a half-precision candidate, the distance of
    the reference rounded to half from it."""

    scales: dict[str, float]  # each float output's largest rms over the sets with a float64 result
    reordered: dict[int, list[np.ndarray]]  # by set: the reference's outputs in another summation order

    @classmethod
    def measured(cls, reference, names, feeds, expected_runs, exact, device) -> NoiseFloor | None:
        """None where every set has a float64 result, or none has (nothing measured to go by)."""
        sets = [i for i in range(len(feeds)) if exact and exact.available(0) and not exact.available(i)]
        if not sets:
            return None
        scales: dict[str, float] = {}
        for index, outputs in enumerate(expected_runs):
            if exact.available(index):
                for name, values in zip(names, outputs):
                    if values.dtype.kind == "f" and values.size:
                        scales[name] = max(scales.get(name, 0.0), _rms(values))
        return cls(scales, reordered_reference(reference, names, feeds, sets, device))

    def on_set(self, index: int, position: int, name: str, ref: np.ndarray, measured: OutputError, rounded) -> float:
        """The reference's own error on set `index` for output `name` (at `position`; its run
        there `ref`; `measured`, its judgement on the float64 sets; `rounded`, the reference's
        run rounded to half on this set, or None)."""

        own = measured.exact_error_original or 0.0
        if self.scales.get(name):
            own *= max(1.0, _rms(ref) / self.scales[name])
        if index in self.reordered:
            own = max(own, largest_apart(self.reordered[index][position], ref))
        if rounded is not None:
            own = max(own, largest_apart(rounded, ref), measured.exact_error_rounded or 0.0)
        return own


def _rms(values: np.ndarray) -> float:
    values = values.astype(np.float64)
    return rms(values[np.isfinite(values)])


def compare_by_noise_floor(
    ref: np.ndarray, cand: np.ndarray, own: float | None, tolerances: Tolerances, name: str, precision=None
) -> OutputError:
    """One output on an input set without a float64 reference, judged by the noise floor
    measured on the sets with one (exact_check.noise_floor_bound; `own`, the original's largest
    own error there) at the roundoff of `precision` (default: the output's type); explicit
    tolerances, where given, as a bound besides."""
    dtype = precision or dtype_name(ref)
    if own is None or ref.dtype.kind in "USO" or ref.size == 0:
        return compare_arrays(ref, cand, *tolerances.for_output(name, dtype))
    bound = noise_floor_bound(ref, own, dtype)
    error = compare_arrays(ref, cand, 0.0, bound)  # |cand - orig| <= bound, element by element
    error.rtol = error.atol = None
    if tolerances.explicit_for(name):
        error.rtol, error.atol = tolerances.for_output(name, dtype)
        error.mismatches += compare_arrays(ref, cand, error.rtol, error.atol).mismatches
    return error


class Judge(Protocol):
    """How the outputs of one input set are judged, chosen once for the set (judge_of_set):
    output `name` (at `position` among the outputs) from the reference's run `ref`, the
    candidate's `cand` and, for a half-precision candidate, the reference's run with every value
    rounded to half (`rounded`, else None)."""

    def __call__(
        self, position: int, name: str, ref: np.ndarray, cand: np.ndarray, rounded: np.ndarray | None
    ) -> OutputError: ...


@dataclass
class ByTolerances:
    """No float64 result on this set nor any earlier: the tolerances (compare_arrays)."""

    tolerances: Tolerances
    precision: str | None

    def __call__(self, position, name, ref, cand, rounded) -> OutputError:
        return compare_arrays(ref, cand, *self.tolerances.for_output(name, self.precision or dtype_name(ref)))


@dataclass
class AgainstFloat64:
    """A set with a float64 result: the float64 criterion (compare_exactly), the candidate's
    own float64 run (by position) where it was made; `strict` where the reference is suspect."""

    tolerances: Tolerances
    precision: str | None
    exact: dict[str, np.ndarray]  # the reference's float64 outputs by name
    candidate_float64: list[np.ndarray] | None
    strict: bool

    def __call__(self, position, name, ref, cand, rounded) -> OutputError:
        cand64 = self.candidate_float64[position] if self.candidate_float64 is not None else None
        return compare_exactly(
            ref, cand, self.exact[name], cand64, self.tolerances, name, self.strict, self.precision, rounded
        )


@dataclass
class ByNoiseFloor(ByTolerances):
    """A set after those the float64 reference fitted on: each output by the noise floor
    measured there (NoiseFloor.on_set, from its judgement so far, `judged`), an output not
    judged before by the tolerances."""

    floor: NoiseFloor
    index: int
    judged: dict[str, OutputError]

    def __call__(self, position, name, ref, cand, rounded) -> OutputError:
        if name not in self.judged:
            return super().__call__(position, name, ref, cand, rounded)
        own = self.floor.on_set(self.index, position, name, ref, self.judged[name], rounded)
        return compare_by_noise_floor(ref, cand, own, self.tolerances, name, self.precision)


def judge_of_set(
    index: int,
    names: list[str],
    exact: ExactReference | None,
    floor: NoiseFloor | None,
    judged: dict[str, OutputError],
    candidate_float64: list[np.ndarray] | None,
    tolerances: Tolerances,
    precision: str | None,
) -> Judge:
    """The criterion of input set `index`: against its float64 result where it has one, else by
    the noise floor measured on the sets that have one, else by the tolerances."""
    if exact is not None and exact.available(index):
        outputs = dict(zip(names, exact.outputs[index] or []))
        return AgainstFloat64(tolerances, precision, outputs, candidate_float64, exact.suspect is not None)
    if floor is not None:
        return ByNoiseFloor(tolerances, precision, floor, index, judged)
    return ByTolerances(tolerances, precision)


def reference_note(exact: ExactReference) -> str | None:
    """What the report says of the float64 reference: on which input sets it was computed, and
    whether it is suspect (the node that disagreed with ONNX Runtime)."""
    suspect = exact.suspect
    if suspect is None:
        return exact.note
    doubt = (
        f"the float64 reference is suspect: {suspect.describe()}; judged by the float32 tolerance against the "
        "original as well"
    )
    return doubt if exact.note is None else f"{exact.note}; {doubt}"


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    if norms == 0.0:
        return 1.0 if not a.any() and not b.any() else 0.0
    return float(np.dot(a.reshape(-1), b.reshape(-1)) / norms)
