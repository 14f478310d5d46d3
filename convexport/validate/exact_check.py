"""Validation judged against the exact result: the optimized graph passes when its error
against the model's float64 result is no larger than the original graph's own error against
it, FACTOR times over, plus FLOOR_ULPS units of roundoff of the output's scale.

    |cand - exact| <= FACTOR * max|orig - exact| + FLOOR_ULPS * u * rms(exact)

per element, where orig and cand are the original's and the optimized graph's runs in their
own precision (float32, float16, bfloat16: u is its unit roundoff) and exact the original's
float64 run (float64/, or a torch source's own: validate/torch_reference.py). A model whose float32
result is far from its exact one (a small difference of large terms; a detection head that
amplifies rounding) sets its own noise floor:
a rewrite that is as close to the exact result as the original passes, however far both are
from each other, and one that is more accurate passes too. A well-conditioned model's floor
is its float32 rounding, about 1e-7 of the scale: an algebraic mistake of 1e-4 stands out.

FACTOR is 4: folding reassociates float32 sums, which moves the rounding error by a factor of
at most 2.9 over the 2,000-case random-graph fuzz where the floor did not dominate (median 1.0;
bench/RESULTS.md, "Validation against float64"); 4 leaves room for that without hiding
anything the size of a wrong weight.
FLOOR_ULPS is 32: where the original happens to be exact (an identity, integers in floats)
the optimized graph may still round, a few units of the output's scale.

Where time allows, the optimized graph also runs in float64 and must meet the same bound:
without float32 rounding its error is only its weights' rounding, so a mistake in the algebra
shows at its own size however ill-conditioned the model is. The float64 runs fit in a time
budget (the caller's: optimize gives them what every input set of a model of up to 10 GFLOPs a
run takes, or 40% of what it has spent so far where that is more; stages/validate.py): a larger
model gets its float64 reference on fewer input sets, or none, and the report says which. An
input set without one is judged by the noise floor measured on those with one (validate/compare.py):

    |cand - orig| <= (FACTOR + 1) * max|orig - exact| + FLOOR_ULPS * u * rms(orig)

the criterion above with the original's own error on that set taken as the largest seen, or,
where larger, as the distance there between the original's run and its run summed in another
order (ONNX Runtime's optimisations and packed weights on: judges.NoiseFloor), its
float32 noise on that set; with no float64 reference at all, float32 runs are compared with
rtol/atol.

The reference is checked too: on the first input set every node of the float64 graph runs on
ONNX Runtime's float32 inputs to it (validate/float64/node_check.py). A node that disagrees beyond one
op's rounding makes the reference suspect, and the optimized graph must then also meet the
float32 tolerance against the original's run: the stricter of the two checks, never the looser.

For a torch source the torch model's own float64 run is the exact result, where on the first
input set it is within the bound above of the ONNX graph's (the exporter's float32 constants
explain no more) and on each later one as near the original's run as there; where not, the
exporter changed the model, the report's export_check says so, and the ONNX graph's float64 run
judges the rewrite (agreement_with_export).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import numpy as np
import onnx

from ..errors import first_line
from ..ir import heap
from ..report.types import ReferenceCheck
from .float64 import Float64Evaluator, Float64OutOfTime, Float64Unavailable
from .float64.node_check import NodeCheck, NodeDisagreement, check_nodes
from .float64.precision import UNIT_ROUNDOFF, dtype_name, rms

FACTOR = 4.0
FLOOR_ULPS = 32
# Time the float64 runs may take, when the caller gives none; a run is not started where its
# estimate (its FLOPs at reference_rate()) is over FIRST_RUN_OVER_BUDGET times that, nor for
# weights over FLOAT64_WEIGHT_BYTES: the float64 model and its session hold about five times the
# weights at their peak (0.25 GiB of weights: +1.25 GiB), which on a large model is more than the
# rest of optimize together (issue 34).
FLOAT64_BUDGET_S = 2.0
FIRST_RUN_OVER_BUDGET = 2
FIRST_RUN_LEAST_S = 1.0  # the evaluator's own work on a small model: a budget of milliseconds still gets one set
# The reference's float64 convolutions and matrix products are BLAS products of their own shapes:
# on plain convolutions they run near half of numpy's float64 GEMM rate on the same machine, far
# below it where depthwise convolutions and elementwise work dominate (bench/RESULTS.md, "Real-size
# CNNs"); the estimate takes a quarter.
REFERENCE_SHARE_OF_GEMM = 0.25
FLOAT64_WEIGHT_BYTES = 512 << 20


@dataclass(frozen=True)
class ExactRequest:
    """A float64 reference to compute for a comparison (exact_reference): on as many input
    sets as `budget_s` seconds allow (None: the first only, unless far over), judged against
    the torch model's own float64 run of `torch_source` where there is one
    (torch_reference.torch_float64's)."""

    budget_s: float | None = None
    torch_source: object = None


@dataclass
class ExactReference:
    """The original model's float64 outputs on each input set (None where the budget left it
    out), whether the optimized graph may also run in float64 on them, and what was left out."""

    outputs: list[list[np.ndarray] | None]
    candidate_too: bool = False
    note: str | None = None  # why some or all input sets have no float64 reference
    check: NodeCheck | None = None  # the reference against ONNX Runtime node by node, on the first input set
    check_note: str | None = None  # why it was not checked
    source: str = "onnx"  # whose float64 run the outputs are: the ONNX graph's, or the torch model's own
    export_check: dict | None = None  # torch's float64 run against the ONNX graph's, where it was tried

    def available(self, index: int) -> bool:
        return index < len(self.outputs) and self.outputs[index] is not None

    @property
    def suspect(self) -> NodeDisagreement | None:
        """The first node where the float64 graph disagrees with ONNX Runtime, if any."""
        return self.check.disagreement if self.check is not None else None

    def check_report(self) -> ReferenceCheck:
        """The node check as the report says it."""
        if self.check is None:
            return {"nodes_checked": 0, "note": self.check_note or "not run"}
        suspect = self.suspect
        report: ReferenceCheck = {
            "nodes_checked": self.check.nodes_checked,
            "disagreement": suspect.to_report() if suspect else None,
        }
        if self.check.stopped_at is not None:
            report["note"] = f"stopped at its time budget, {self.check.nodes_checked} of {self.check.stopped_at} nodes"
        return report


def exact_reference(
    model: onnx.ModelProto,
    all_feeds: list[dict],
    candidate_flops: float | None = None,
    budget_s: float | None = None,
    torch_source=None,
    original_runs: list[list[np.ndarray]] | None = None,
) -> ExactReference:
    """The float64 reference of `model` on as many of `all_feeds`, in order, as `budget_s`
    allows (the first always, unless its estimate is far over), and whether the optimized
    graph's float64 runs (of `candidate_flops`) fit in what is left. `torch_source`, a
    torch_reference.TorchFloat64 (or the TorchUnavailable why not), gives the torch model's own
    float64 run, the reference where it agrees with the ONNX graph's (judged against
    `original_runs`, the original's float32 outputs on each set: agreement_with_export)."""
    from ..ir.large import weight_bytes

    budget_s = FLOAT64_BUDGET_S if budget_s is None else budget_s
    none: list[list[np.ndarray] | None] = [None] * len(all_feeds)
    flops = reference_flops(model)
    if weight_bytes(model) > FLOAT64_WEIGHT_BYTES:
        return ExactReference(
            none,
            note=(
                f"skipped: {weight_bytes(model) / 2**30:.2f} GiB of weights, over the "
                f"{FLOAT64_WEIGHT_BYTES / 2**30:.2f} GiB that float64 copies are made of"
            ),
        )
    if flops / reference_rate() > FIRST_RUN_OVER_BUDGET * budget_s:
        return ExactReference(none, note=f"skipped: the model takes {flops:.3g} FLOPs a run, over its time budget")
    began = time.perf_counter()
    # the first run and the node check may go on to what the first run's estimate was allowed
    # (at least FIRST_RUN_LEAST_S); a further run is started within the budget, stopped at its end
    first_deadline = began + max(FIRST_RUN_OVER_BUDGET * budget_s, FIRST_RUN_LEAST_S)
    deadline = began + budget_s
    try:
        evaluator = Float64Evaluator(model)
        onnx_first = evaluator.run(all_feeds[0], deadline=first_deadline) if all_feeds else []
        check, check_note = _checked(model, all_feeds, evaluator, first_deadline)
        torch_outputs, export_check = _torch_reference(
            model, torch_source, all_feeds, onnx_first, original_runs, evaluator, began, budget_s, first_deadline
        )
        if torch_outputs is not None:
            outputs, source = torch_outputs, "torch"
        else:
            outputs, source = [onnx_first, *_float64_runs(evaluator, all_feeds[1:], deadline)], "onnx"
    except Float64OutOfTime:
        took = time.perf_counter() - began
        return ExactReference(
            none, note=f"skipped: its first float64 run did not finish within its time budget ({took:.3g} s)"
        )
    except Float64Unavailable as exc:
        return ExactReference(none, note=f"unavailable: {exc}")
    finally:
        heap.release_after(model)  # the float64 evaluator's ops refer back to it: its weights (2x) in a cycle
    outputs = outputs[: len(all_feeds)]
    ran = sum(value is not None for value in outputs)
    spent = time.perf_counter() - began
    per_run = spent / max(ran, 1)
    # the optimized graph's float64 runs, where they fit in what the reference left of the budget
    candidate_too = candidate_flops is not None and ran * per_run * candidate_flops / flops < budget_s - spent
    note = None
    if ran < len(all_feeds):
        note = (
            f"on {ran} of {len(all_feeds)} input sets ({per_run:.2g} s a run); the others judged by the noise "
            "floor measured there"
        )
    return ExactReference(outputs, candidate_too, note, check, check_note, source, export_check)


def reference_flops(model: onnx.ModelProto) -> float:
    """The float64 reference's FLOPs a run of `model` (its convolutions as it computes them:
    float64.conv_work)."""
    from ..ir.stats import node_flops
    from .float64 import conv_work

    return max(node_flops(model, conv_work), 1.0)


def reference_seconds(flops: float, sets: int) -> float:
    """The float64 reference's estimated time on `sets` input sets of a model of `flops` a run:
    a run per set at reference_rate(), and about a run each for building the evaluator and
    checking it node by node (validate/float64/node_check.py)."""
    return (sets + 2) * flops / reference_rate()


@functools.cache
def reference_rate() -> float:
    """FLOP/s the float64 reference is estimated to run at here: REFERENCE_SHARE_OF_GEMM of
    numpy's float64 matrix product's rate on this machine (384^3 products, measured once a
    process), so that a laptop's estimate is its own."""
    return REFERENCE_SHARE_OF_GEMM * gemm_rate(384)


def gemm_rate(size: int) -> float:
    """numpy's float64 FLOP/s on a size x size matrix product, the best of three."""
    a = np.random.default_rng(0).standard_normal((size, size))
    best = float("inf")
    for _ in range(3):
        began = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - began)
    return 2 * size**3 / max(best, 1e-9)


def _torch_reference(
    model,
    torch_source,
    all_feeds,
    onnx_first,
    original_runs,
    evaluator,
    began: float,
    budget_s: float,
    first_deadline: float,
):
    """The torch model's float64 outputs on the input sets (within the budget, the first unless
    its estimate goes past `first_deadline`, the first run's) where it agrees with the ONNX graph's on the
    first, else None; and what the comparison found (the report's export_check), None for no torch
    source or a first run over its time.

    On a later set torch's run must be as near the original's float32 run as it was on the
    first (_as_near_as_first): a traced export that fixed a data-dependent
    branch agrees on one set and parts on another. Such a set takes the ONNX graph's float64 run
    instead, and the check says where the two parted."""
    from .torch_reference import TorchUnavailable, estimated_flops

    if torch_source is None or not all_feeds or not original_runs:
        return None, None
    if isinstance(torch_source, TorchUnavailable):
        return None, {"note": str(torch_source)}
    if estimated_flops(model) / reference_rate() > first_deadline - time.perf_counter():
        return None, None  # the ONNX graph's float64 run, already made, is the reference
    shapes = [array.shape for array in onnx_first]
    try:
        first = torch_source.run(all_feeds[0], shapes)
    except TorchUnavailable as exc:
        return None, {"note": str(exc)}
    export_check = agreement_with_export(original_runs[0], first, onnx_first)
    if not export_check["agrees"]:
        return None, export_check
    outputs, parted = [first], []
    for index, feeds in enumerate(all_feeds[1:], start=1):
        if time.perf_counter() - began >= budget_s:
            outputs.append(None)
            continue
        try:
            ours = torch_source.run(feeds, shapes)
        except TorchUnavailable as exc:  # an input set it cannot take: the ONNX graph's run there
            ours, export_check["note"] = None, str(exc)
        if ours is not None and not _as_near_as_first(original_runs[index], ours, export_check["bound"]):
            parted.append(index)
            ours = None
        outputs.append(evaluator.run(feeds) if ours is None else ours)
    if parted:
        export_check.update(agrees=False, parted_on_input_sets=parted)
    return outputs, export_check


def agreement_with_export(original: list, torch_outputs: list, onnx_outputs: list) -> dict:
    """Whether the torch model's float64 outputs and the ONNX graph's are the same function: per
    output, |torch - onnx| within the bound judge() sets the optimized graph (FACTOR times the
    original's own error against the ONNX graph's float64 result, plus FLOOR_ULPS): the
    exporter's float32 constants explain no more. The largest difference is reported."""
    worst, agrees = {"output": 0, "max_abs_difference": 0.0, "bound": 0.0}, True
    for index, (orig, ours, theirs) in enumerate(zip(original, torch_outputs, onnx_outputs)):
        if np.asarray(orig).dtype.kind not in "fc":
            agrees &= bool(np.array_equal(np.asarray(ours), np.asarray(theirs)))
            continue
        verdict = judge(orig, ours, theirs, None, dtype_name(orig))
        agrees &= verdict.beyond == 0
        if verdict.error >= worst["max_abs_difference"]:
            worst = {"output": index, "max_abs_difference": verdict.error, "bound": verdict.bound}
    return {"agrees": agrees, **worst}


def _as_near_as_first(original: list, torch_outputs: list, first_bound: float) -> bool:
    """Whether a later input set's torch outputs are as near the original's float32 run as the
    first set's were: |torch - orig| within (FACTOR + 1) times the first set's bound (integer
    outputs equal)."""
    for orig, ours in zip(original, torch_outputs):
        if np.asarray(orig).dtype.kind not in "fc":
            if not np.array_equal(np.asarray(ours), np.asarray(orig)):
                return False
            continue
        far = float(np.nanmax(np.abs(np.asarray(ours) - orig.astype(np.float64)), initial=0.0))
        if far > (FACTOR + 1) * first_bound:
            return False
    return True


def _checked(
    model: onnx.ModelProto, all_feeds: list[dict], evaluator, deadline: float
) -> tuple[NodeCheck | None, str | None]:
    """The node-by-node check of the reference on the first input set (validate/float64/node_check.py),
    up to `deadline`, or why it could not run."""
    if not all_feeds:
        return None, "no input set"
    try:
        return check_nodes(model, all_feeds[0], evaluator, deadline), None
    except Exception as exc:  # ONNX Runtime refuses the model with its values exposed
        return None, f"not run: {type(exc).__name__}: {first_line(exc, 160)}"


def _float64_runs(evaluator, all_feeds: list[dict], deadline: float) -> list:
    """The evaluator's run on the input sets, in order, each started and finished before
    `deadline` (None for a set that was not)."""
    outputs = []
    for feeds in all_feeds:
        try:
            outputs.append(evaluator.run(feeds, deadline=deadline) if time.perf_counter() < deadline else None)
        except Float64OutOfTime:
            outputs.append(None)
    return outputs


@dataclass
class ExactJudgement:
    """One output in one run, against the exact result."""

    error_original: float  # max |orig - exact|: the model's own noise floor
    error: float  # max |cand - exact|
    error_float64: float | None  # max |cand in float64 - exact|, where it ran
    bound: float
    beyond: int  # elements over the bound
    error_rounded: float | None = None  # max |rounded - exact|, where judge was given that run
    special: int = 0  # of those, elements where the exact result or the original is NaN or infinite


def judge(original, candidate, exact, candidate64, dtype: str, rounded=None) -> ExactJudgement:
    """The criterion of the module doc for one output. Where the exact result is NaN or
    infinite the candidate must give the same special value; where the original gives one and
    the exact result does not (made-up data past the model's float32 range: a mask of 3 in a
    `(1 - mask) * min_float`), the original is no measure of its own error there, and the
    candidate must give what the original gives or meet the bound. `rounded`, where given, is
    the model run with every value rounded to the candidate's type (validate/rounded_run.py): its
    error, where finite and larger, takes the place of the original's in the bound."""
    exact = exact.astype(np.float64)
    original = original.astype(np.float64)
    finite = np.isfinite(exact)
    measured = finite & np.isfinite(original)
    floor = _floor(rms(exact[finite]), dtype)
    own = float(_errors(original, exact, measured).max(initial=0.0))
    noise, own_rounded = own, None
    if rounded is not None:
        rounded = rounded.astype(np.float64)
        own_rounded = float(_errors(rounded, exact, finite & np.isfinite(rounded)).max(initial=0.0))
        noise = max(own, own_rounded)
    bound = FACTOR * noise + floor
    over, worst = _beyond(candidate, exact, original, bound)
    worst64 = None
    if candidate64 is not None:
        over64, worst64 = _beyond(candidate64, exact, original, bound)
        over |= over64
    special = int(np.count_nonzero(over & ~measured))
    return ExactJudgement(own, worst, worst64, bound, int(np.count_nonzero(over)), own_rounded, special)


def _errors(values, exact, where) -> np.ndarray:
    return np.abs(np.where(where, values.astype(np.float64) - np.where(where, exact, 0.0), 0.0))


def _beyond(values, exact, original, bound: float) -> tuple[np.ndarray, float]:
    """Which elements of `values` are over `bound` from the exact result (judge's rule where
    the exact result or the original is NaN or infinite), and the largest error at an element
    where both are finite."""
    values = values.astype(np.float64)
    measured = np.isfinite(exact) & np.isfinite(original)
    errors = _errors(values, exact, measured)
    within = _errors(values, exact, np.isfinite(exact) & np.isfinite(values)) <= bound
    same_special = _same_special(values, exact) | _same_special(values, original)
    unmeasured = ~measured & ~(same_special | (np.isfinite(exact) & np.isfinite(values) & within))
    return (measured & ~(errors <= bound)) | unmeasured, float(errors.max(initial=0.0))


def _same_special(values: np.ndarray, special: np.ndarray) -> np.ndarray:
    """Where `special` is NaN or infinite and `values` is the same."""
    return (np.isnan(special) & np.isnan(values)) | (np.isinf(special) & (special == values))


def noise_floor_bound(original: np.ndarray, own: float, dtype: str) -> float:
    """The bound on |cand - orig| for an input set without a float64 reference (module doc):
    (FACTOR + 1) times the original's largest own error seen, plus FLOOR_ULPS units of the
    output's scale."""
    values = original.astype(np.float64)
    return (FACTOR + 1) * own + _floor(rms(values[np.isfinite(values)]), dtype)


def _floor(scale: float, dtype: str) -> float:
    """FLOOR_ULPS units of the type's roundoff of an output's scale (of 1 where it is all zero)."""
    return FLOOR_ULPS * UNIT_ROUNDOFF.get(dtype, UNIT_ROUNDOFF["float32"]) * (scale if scale > 0 else 1.0)
