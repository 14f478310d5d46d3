"""Does the candidate graph compute what the reference computes? ONNX Runtime decides.

Both models run on the CPU provider with graph optimisations off (so ORT's own fusions cannot
hide or cause a difference) on seeded random inputs; dynamic dims take the sizes 1, 2, 3, ...
in successive runs. An element passes when
`|cand - ref| <= atol + rtol * |ref|` (numpy.isclose); NaN must meet NaN and an infinity the
same infinity. Per output we report max and mean absolute error, max relative error
(`|cand - ref| / max(|ref|, atol)`) and the number of failing elements.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from .errors import ConvexportError
from .inputs import InputSpec, random_inputs
from .runtime import create_session

DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-5
DEFAULT_RUNS = 3


@dataclass
class OutputError:
    max_abs: float = 0.0
    mean_abs: float = 0.0
    max_rel: float = 0.0
    mismatches: int = 0
    elements: int = 0

    def merge(self, other: "OutputError") -> "OutputError":
        elements = self.elements + other.elements
        mean = (self.mean_abs * self.elements + other.mean_abs * other.elements) / max(elements, 1)
        return OutputError(max(self.max_abs, other.max_abs), mean, max(self.max_rel, other.max_rel),
                           self.mismatches + other.mismatches, elements)


@dataclass
class ValidationResult:
    passed: bool
    runs: int
    rtol: float
    atol: float
    outputs: dict[str, OutputError] = field(default_factory=dict)
    problem: str | None = None      # a structural mismatch (missing output, shape) if any

    def to_report(self) -> dict:
        report = {
            "passed": self.passed, "runs": self.runs, "rtol": self.rtol, "atol": self.atol,
            "outputs": {name: vars(error) for name, error in self.outputs.items()},
        }
        if self.problem:
            report["problem"] = self.problem
        return report

    def summary(self) -> str:
        if self.problem:
            return self.problem
        worst = max(self.outputs.items(), key=lambda item: item[1].max_abs, default=None)
        if worst is None:
            return "no outputs compared"
        name, error = worst
        return (f"output {name!r}: max abs error {error.max_abs:.3g}, max rel error {error.max_rel:.3g}, "
                f"{error.mismatches} of {error.elements} elements outside rtol={self.rtol:g} atol={self.atol:g}")


def compare_models(reference: onnx.ModelProto, candidate: onnx.ModelProto, inputs: list[InputSpec],
                   runs: int = DEFAULT_RUNS, rtol: float = DEFAULT_RTOL, atol: float = DEFAULT_ATOL,
                   seed: int = 0, extra_feeds: list[dict] = ()) -> ValidationResult:
    """Run both models on `runs` seeded input sets (and `extra_feeds`), compare every output."""
    ref_session = create_session(reference, optimize=False)
    cand_session = create_session(candidate, optimize=False)
    names = [out.name for out in ref_session.get_outputs()]
    result = ValidationResult(True, runs + len(extra_feeds), rtol, atol)
    missing = [name for name in names if name not in {o.name for o in cand_session.get_outputs()}]
    if missing:
        result.passed, result.problem = False, f"candidate lacks output(s) {', '.join(missing)}"
        return result
    # run r gives dynamic dims the size r + 1, so a graph that only works at one size fails
    all_feeds = [random_inputs(inputs, seed + run, dynamic_size=run + 1) for run in range(runs)] + list(extra_feeds)
    for feeds in all_feeds:
        expected = ref_session.run(names, feeds)
        actual = cand_session.run(names, feeds)
        for name, ref, cand in zip(names, expected, actual):
            if ref.shape != cand.shape:
                result.passed = False
                result.problem = f"output {name!r}: shape {cand.shape} instead of {ref.shape}"
                return result
            error = compare_arrays(ref, cand, rtol, atol)
            result.outputs[name] = result.outputs[name].merge(error) if name in result.outputs else error
    result.passed = all(error.mismatches == 0 for error in result.outputs.values())
    return result


def compare_arrays(ref: np.ndarray, cand: np.ndarray, rtol: float, atol: float) -> OutputError:
    """Error statistics of one output; non-finite values must match exactly."""
    if ref.dtype.kind not in "fc":
        mismatches = int(np.count_nonzero(ref != cand))
        diff = np.abs(ref.astype(np.float64) - cand.astype(np.float64))
        return OutputError(float(diff.max(initial=0)), float(diff.mean()) if diff.size else 0.0,
                           0.0, mismatches, int(ref.size))
    ref64, cand64 = ref.astype(np.float64), cand.astype(np.float64)
    finite = np.isfinite(ref64) & np.isfinite(cand64)
    same_special = (np.isnan(ref64) & np.isnan(cand64)) | (np.isinf(ref64) & (ref64 == cand64))
    diff = np.abs(ref64 - cand64, where=finite, out=np.zeros_like(ref64))
    close = np.isclose(cand64, ref64, rtol=rtol, atol=atol) & finite
    mismatches = int(np.count_nonzero(~(close | same_special)))
    rel = diff / np.maximum(np.abs(ref64), atol) if atol > 0 else diff / np.maximum(np.abs(ref64), 1e-30)
    return OutputError(
        max_abs=float(diff.max(initial=0.0)),
        mean_abs=float(diff[finite].mean()) if finite.any() else 0.0,
        max_rel=float(rel.max(initial=0.0)),
        mismatches=mismatches,
        elements=int(ref.size),
    )


def validate_files(reference: Path, candidate: Path, inputs_npz: Path | None, runs: int,
                   rtol: float, atol: float) -> ValidationResult:
    """`convexport validate`: seeded random inputs, plus the arrays of DATA.npz if given."""
    from .export import graph_input_specs
    from .loading import load_model

    if runs < 0:
        raise ConvexportError("--runs must be >= 0")
    for path in (reference, candidate):
        if path.suffix.lower() != ".onnx":
            raise ConvexportError(f"{path}: validate compares ONNX models")
    models = [load_model(str(path)).onnx_model for path in (reference, candidate)]
    feeds = [] if inputs_npz is None else [_load_npz(inputs_npz, graph_input_specs(models[0]))]
    if runs == 0 and not feeds:
        raise ConvexportError("--runs 0 without --inputs compares nothing")
    return compare_models(models[0], models[1], graph_input_specs(models[0]), runs, rtol, atol, extra_feeds=feeds)


def _load_npz(path: Path, inputs: list[InputSpec]) -> dict[str, np.ndarray]:
    try:
        with np.load(path) as data:
            arrays = {name: data[name] for name in data.files}
    except (OSError, ValueError) as exc:
        raise ConvexportError(f"{path}: not a readable .npz file ({exc})") from exc
    missing = [spec.name for spec in inputs if spec.name not in arrays]
    if missing:
        raise ConvexportError(f"{path}: lacks arrays for input(s) {', '.join(missing)} (has {', '.join(arrays)})")
    return {spec.name: arrays[spec.name].astype(spec.numpy_dtype) for spec in inputs}
