"""A half-precision model's outputs judged against the exact result.

Per output and input set, as validation judges a rewrite (exact_check.judge) with the half
type's unit roundoff:

    |half - exact| <= FACTOR * max|orig - exact| + FLOOR_ULPS * u_half * rms(exact)

where orig is the float32 model's run; where the runs hold the model's run with every value
rounded to half (rounded_run.py: choose.py asks for it where the error is spread through the
model), its error takes the place of orig's where larger. An input set without a float64
reference is judged by the noise floor measured on those with one
(exact_check.noise_floor_bound), or the rounded run's distance from orig on the set itself
where larger; with none at all, the float32 run stands for the exact result (its own error
then counts as none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import onnx

from ..report.types import HalfOutput
from ..runtime import checked_run, create_session
from ..validate.exact_check import judge, noise_floor_bound
from ..validate.rounded_run import largest_apart
from ..validate.runs import in_declared_types


@dataclass
class OutputJudgement:
    """One output over every input set: the half model's largest error against the exact
    result, the float32 model's, the bound, and how many elements were beyond it."""

    error: float = 0.0
    error_original: float = 0.0  # the original float32 model's own
    bound: float = 0.0
    beyond: int = 0
    elements: int = 0
    error_rounded: float | None = None  # the model's with every value rounded to half, where it ran
    special: int = 0  # of `beyond`, elements where the exact result (or the original) is NaN or infinite
    # over the input sets: the half model's squared error summed, and the exact (or float32)
    # result's squares (for rms_ratio)
    squared_error: float = 0.0
    squared_exact: float = 0.0

    def add(
        self, error: float, own: float, bound: float, beyond: int, elements: int, rounded=None, special: int = 0
    ) -> None:
        self.error, self.error_original = max(self.error, error), max(self.error_original, own)
        self.bound = max(self.bound, bound)
        self.beyond += beyond
        self.special += special
        self.elements += elements
        if rounded is not None:
            self.error_rounded = max(self.error_rounded or 0.0, rounded)

    def add_squares(self, half: np.ndarray, exact: np.ndarray) -> None:
        """One input set's squared error against the exact result (its finite elements)."""
        finite = np.isfinite(exact) & np.isfinite(half)
        self.squared_error += float(np.sum(np.square(half[finite] - exact[finite])))
        self.squared_exact += float(np.sum(np.square(exact[finite])))

    def missed(self, name: str) -> str:
        """How the output misses its bound, in words that say which way: values off, or special
        values (NaN, infinity) the half model does not give where the exact result has them."""
        if self.special and self.error <= self.bound:
            return (
                f"output {name!r} differs from the exact result's NaN or infinity at {self.special} of "
                f"{self.elements} elements (elsewhere {self.error:.3g} off, bound {self.bound:.3g})"
            )
        beyond = f"{self.beyond} of {self.elements} elements beyond"
        return f"output {name!r} is {self.error:.3g} off (bound {self.bound:.3g}, {beyond})"

    @property
    def ratio(self) -> float:
        """The largest error over the bound (1 where an error meets a bound of 0)."""
        return self.error / self.bound if self.bound > 0 else float(self.error > 0)

    @property
    def rms_ratio(self) -> float:
        """The rms error over the exact result's rms (the float32 original's where there is no
        float64 reference: its own error is orders below half's): a steadier measure of a
        change to every weight than the largest error (choose.py)."""
        if self.squared_exact > 0:
            return (self.squared_error / self.squared_exact) ** 0.5
        return float(self.squared_error > 0)

    def to_report(self) -> HalfOutput:
        reported: HalfOutput = {
            "error": self.error, "error_original": self.error_original, "bound": self.bound, "beyond": self.beyond,
            "elements": self.elements,
        }  # fmt: skip
        if self.error_rounded is not None:
            reported["error_rounded"] = self.error_rounded
        return reported


@dataclass
class HalfRuns:
    """What the half model is judged on: the input sets, the float32 model's outputs on each
    (by name), and the exact outputs where the float64 reference has them (None elsewhere)."""

    feeds: list[dict[str, np.ndarray]]
    float32: list[dict[str, np.ndarray]]
    exact: list[dict[str, np.ndarray] | None]
    # the model's outputs with every value rounded to half (rounded_run.py) on each set, where
    # asked for
    rounded: list[dict[str, np.ndarray]] | None = None

    @property
    def against(self) -> Literal["float64", "float32"]:
        return "float64" if any(exact is not None for exact in self.exact) else "float32"


def judge_outputs(model: onnx.ModelProto, runs: HalfRuns, dtype: str, device: str) -> dict[str, OutputJudgement]:
    """Each output of `model` (the half one) judged on every input set (module doc)."""
    session = create_session(model, device, what=f"the {dtype} model", prepack=False)
    names = list(runs.float32[0])
    outputs = []
    for feeds in runs.feeds:
        fed = in_declared_types(model, feeds)
        got = checked_run(lambda fed=fed: session.run(names, fed), fed, f"the {dtype} model")
        outputs.append(dict(zip(names, got)))
    return judged_outputs(outputs, runs, dtype)


def judged_outputs(outputs: list[dict[str, np.ndarray]], runs: HalfRuns, dtype: str) -> dict[str, OutputJudgement]:
    """Each output judged on every input set (module doc), `outputs` a half model's on each."""
    names = list(runs.float32[0])
    judged = {name: OutputJudgement() for name in names}
    own_seen = dict.fromkeys(names, 0.0)
    rounded_runs: list[dict[str, np.ndarray] | None] = list(runs.rounded) if runs.rounded else [None] * len(runs.feeds)
    for got, expected, exact, rounded in zip(outputs, runs.float32, runs.exact, rounded_runs):
        for name in names:
            half = got[name]
            orig = np.asarray(expected[name])
            if orig.dtype.kind != "f":
                mismatched = int(np.count_nonzero(np.asarray(half) != orig))
                judged[name].add(float(mismatched > 0), 0.0, 0.0, mismatched, orig.size)
                continue
            half = np.asarray(half).astype(np.float64)
            if exact is not None:
                verdict = judge(orig, half, exact[name], None, dtype, None if rounded is None else rounded[name])
                judged[name].add_squares(half, np.asarray(exact[name], dtype=np.float64))
                noise = max(verdict.error_original, verdict.error_rounded or 0.0)
                own_seen[name] = max(own_seen[name], noise)
                judged[name].add(verdict.error, verdict.error_original, verdict.bound, verdict.beyond, orig.size,
                                 verdict.error_rounded, verdict.special)  # fmt: skip
            else:
                # the rounded run's distance from the float32 one on this set: its noise here
                apart = None if rounded is None else largest_apart(rounded[name], orig)
                bound = noise_floor_bound(orig, max(own_seen[name], apart or 0.0), dtype)
                errors = np.abs(half - orig.astype(np.float64))
                judged[name].add_squares(half, orig.astype(np.float64))
                beyond = int(np.count_nonzero(~(errors <= bound)))
                judged[name].add(float(np.nanmax(errors, initial=0.0)), 0.0, bound, beyond, orig.size, apart)
    return judged


def over_bound(judged: dict[str, OutputJudgement]) -> bool:
    """Whether any output has an element beyond its bound."""
    return any(judgement.beyond for judgement in judged.values())


def worst_ratio(judged: dict[str, OutputJudgement]) -> float:
    """The outputs' error, each over its bound: the worst."""
    return max((judgement.ratio for judgement in judged.values()), default=0.0)
