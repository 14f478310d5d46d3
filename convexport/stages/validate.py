"""The validate stage: the optimized graph checked against the original: a valid model first (onnx's
checker, ONNX Runtime's loading), then the same outputs within the float64 bound (on the CPU,
and on CUDA where it is deployed there); where it fails, the first rewrite that breaks it,
found by bisection, and a refusal (stages/refusal.py) carrying the validation section: nothing
is written. Each function hands back what it found; pipeline.py places it in the report."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import NoReturn, cast

import onnx

from .. import ir
from ..errors import ConvexportError, first_line
from ..load.export import ExportResult
from ..load.float32_twin import weights_half_type
from ..load.inputs import InputSets
from ..report.types import Culprit, InvalidModel, OnDevice, Rewrite, TF32Effect, Validation
from ..runtime import CUDA, Unloadable, create_session, provider_options
from ..validate.compare import compare_models, tf32_effect
from ..validate.exact_check import ExactRequest, reference_seconds
from ..validate.results import ValidationResult
from ..validate.runs import NoMadeUpInputs
from .inputs import RunInputs
from .refusal import Refused
from .request import Request
from .rewrite import Rewritten

# The float64 reference's time budget: what every input set of a model of FULL_REFERENCE_FLOPS
# a run (resnet50-size) is estimated to take, so that a model of that cost or less (however its
# time is made up: many small nodes, depthwise convolutions) is judged against float64 on every
# one; or this share of what optimize spent before validating (what the user waits anyway)
# where more; and at least this many seconds.
FULL_REFERENCE_FLOPS = 1e10
FLOAT64_SHARE = 0.4
FLOAT64_MIN_S = 0.5


def refuse_if_invalid(exported: ExportResult, rewritten: Rewritten, validating: bool, say) -> None:
    """A refusal where the optimized graph is not a valid model, whether or not it is validated
    by running it (validation loads it anyway)."""
    model = rewritten.outcome.model
    invalid = rewritten.outcome.invalid or checker_problem(exported.reference, model)
    if invalid is None and not validating and model is not exported.reference:
        invalid = _load_problem(model)
    if invalid is not None:
        _refuse_invalid(invalid, exported, rewritten, say)


@dataclass
class Checked:
    result: ValidationResult  # the last check made: the CPU's, or the device's where there was one
    tf32_sample: tuple | None  # the device check's first input set, for TF32's effect on the device
    validation: Validation  # the report's section
    made_up_inputs: str | None  # why made-up inputs were not used, where they were not


def checked(
    exported: ExportResult,
    rewritten: Rewritten,
    inputs: RunInputs,
    request: Request,
    torch_source,
) -> Checked:
    """The validation and its report section; a refusal where it fails. `inputs.sets` loses its
    made-up sets where made-up inputs cannot run the model and the caller's arrays are used alone
    (Checked.made_up_inputs says why)."""
    say = request.steps.start
    say("validating")
    labels = (f"{rewritten.source} (as exported)", "the optimized graph")
    budget = max(
        FLOAT64_MIN_S,
        FLOAT64_SHARE * request.steps.elapsed(),
        reference_seconds(FULL_REFERENCE_FLOPS, len(inputs.sets)),
    )

    # a model of half weights computes in half: its rewrite's folds, rounded into it, are judged so
    precision = weights_half_type(exported.reference)

    def compare(sets: InputSets) -> ValidationResult:
        result = compare_models(
            exported.reference, rewritten.outcome.model, sets, request.tolerances, labels=labels,
            exact=ExactRequest(budget, torch_source), precision=precision,
        )  # fmt: skip
        result.precision = precision
        return result

    made_up_inputs = None
    try:
        result = compare(inputs.sets)
    except Unloadable as unloadable:  # valid to onnx's checker, not to ONNX Runtime
        if _load_problem(exported.reference) is not None:
            raise  # the model as given: its own problem, said as such
        _refuse_invalid(first_line(unloadable), exported, rewritten, say)
    except NoMadeUpInputs as unsuitable:
        if not inputs.sets.given:
            raise ConvexportError(f"{unsuitable}; or give real inputs with --inputs DATA.npz") from None
        inputs.sets = replace(inputs.sets, made_up=0)  # the caller's arrays alone, said in the report
        result = compare(inputs.sets)
        made_up_inputs = f"not used: {unsuitable}"
    validation: Validation = {**result.to_report()}
    tf32_sample, failed_on = None, "cpu"
    if result.passed and request.device == "cuda":
        say("validating on cuda")
        failed_on = "cuda"  # if it fails now
        result = _validated_on_device(exported, rewritten, inputs, request, labels, validation, result.exact)
        tf32_sample = result.sample if result.passed else None
    if not result.passed:
        validation["culprit"] = _culprit(result, exported, rewritten, inputs, request, failed_on)
        raise Refused(
            f"{rewritten.source}: the optimized graph does not match the original ({result.summary()})"
            f"{_blame(validation['culprit'], exported.conversions)}; nothing was written",
            validation=validation,
            made_up_inputs=made_up_inputs,
        )
    return Checked(result, tf32_sample, validation, made_up_inputs)


def _culprit(
    result: ValidationResult, exported, rewritten: Rewritten, inputs: RunInputs, request: Request, failed_on: str
) -> Culprit | None:
    """The first rewrite after which the outputs are wrong (find_bad_rewrite)."""
    request.steps.start("finding the rewrite that broke it")
    exact = result.exact  # the float64 reference, computed once, for every step of the bisection

    def passes(candidate: onnx.ModelProto) -> bool:
        return compare_models(
            exported.reference, candidate, inputs.sets, request.tolerances, device=failed_on, exact=exact,
            precision=weights_half_type(exported.reference),
        ).passed  # fmt: skip

    return find_bad_rewrite(rewritten.outcome.applied, passes, rewritten.first)


def _validated_on_device(
    exported, rewritten: Rewritten, inputs: RunInputs, request, labels, validation: Validation, exact
):
    """The check on the CUDA provider the model is deployed on, beside the CPU reference check:
    original and optimized on CUDA with TF32 off, so that only the rewrite can differ; its
    result goes to validation["on_device"] (TF32's own effect is added by tf32_effect_fields).
    The device check's result is returned: a graph that fails it fails validation."""
    on_device = compare_models(
        exported.reference, rewritten.outcome.model, inputs.sets, request.tolerances, labels=labels,
        device="cuda", exact=exact, precision=weights_half_type(exported.reference),
    )  # fmt: skip
    validation["on_device"] = {
        **on_device.to_report(),
        "provider": CUDA,
        "provider_options": provider_options("cuda", tf32=False, search=False),
        "tf32": False,
    }
    if not on_device.passed:
        validation["passed"] = False  # the CPU check's numbers stay beside it
        on_device.problem = f"on {CUDA} (TF32 off): {on_device.summary()}"
    return on_device


def tf32_effect_fields(model: onnx.ModelProto, sample, session=None) -> TF32Effect:
    """The fields of validation["on_device"] that say, per output, how far the optimized graph
    as deployed (ORT's default CUDA options, TF32 on) lands from the device check's TF32-off
    outputs (validate.tf32_effect), measured on `session` where the profile hands its own over."""
    effect = tf32_effect(model, sample, session)
    if effect is None:
        return {"tf32_effect_note": f"not measured: {CUDA} has no kernel for the graph with its default options"}
    return {
        "tf32_effect": {name: {"max_abs": e.max_abs, "max_rel": e.max_rel} for name, e in effect.items()},
        "tf32_effect_options": provider_options("cuda"),
    }


def tf32_effect_recorded(on_device: OnDevice) -> bool:
    return bool({"tf32_effect", "tf32_effect_note"} & on_device.keys())


def _refuse_invalid(problem: str, exported: ExportResult, rewritten: Rewritten, say) -> NoReturn:
    """The refusal of an optimized graph that is not a valid model (`problem`), naming the
    first rewrite after which it is not (the same bisection as for wrong values): a rule whose
    rewrite breaks the graph's shapes is the rule's fault, told as such (exit 3), not convexport's."""
    say("finding the rewrite that broke it")
    applied = rewritten.outcome.applied
    culprit = find_bad_rewrite(applied, lambda candidate: _is_valid(exported.reference, candidate), rewritten.first)
    invalid: InvalidModel = {"passed": False, "invalid_model": problem, "culprit": culprit}
    blame = _blame(culprit, exported.conversions)
    raise Refused(
        f"{rewritten.source}: the optimized graph is not a valid ONNX model ({problem}){blame}; nothing was written",
        validation=invalid,
    )


# what onnx.checker's full check raises: its own verdict, or shape inference's
_CHECKER_ERRORS = (onnx.checker.ValidationError, onnx.shape_inference.InferenceError)


def checker_problem(original: onnx.ModelProto, rewritten: onnx.ModelProto) -> str | None:
    """Why onnx.checker's full check (types and shapes included) refuses the rewritten model
    where it accepts the original, or None: no rewrite may turn a valid model invalid, whether
    or not it is validated by running it. A model kept from serialisation (ir.large: over 2 GiB
    protobuf cannot hand it to the checker whole; from 256 MiB the checker's copy costs
    seconds) is checked by ONNX Runtime's loading instead, when validated or not (_load_problem)."""
    if rewritten is original or ir.kept_from_serialisation(rewritten):
        return None
    try:
        onnx.checker.check_model(rewritten, full_check=True)
    except _CHECKER_ERRORS as problem:
        try:
            onnx.checker.check_model(original, full_check=True)
        except _CHECKER_ERRORS:
            return None  # invalid as exported: the rewrite is not what broke it
        return first_line(problem)
    return None


def _is_valid(original: onnx.ModelProto, candidate: onnx.ModelProto) -> bool:
    return checker_problem(original, candidate) is None and _load_problem(candidate) is None


def _load_problem(candidate: onnx.ModelProto) -> str | None:
    """Why ONNX Runtime refuses to load the model, or None (a kernel it lacks for a custom op
    or a dtype is another matter, which validation and profiling say)."""
    try:
        create_session(candidate, "cpu", optimize=False, what="the optimized graph", prepack=False)
    except Unloadable as problem:
        return first_line(problem)
    except ConvexportError:
        pass
    return None


def _blame(culprit: Culprit | None, conversions: list[str]) -> str:
    """What the validation failure message says broke the graph."""
    if culprit is None:
        return ""
    if culprit["index"] == 0:
        before = f"the conversion ({'; '.join(conversions)})" if conversions else "constant folding"
        return f"; it fails before any rewrite, after {before}"
    module = culprit.get("module") or " + ".join(culprit.get("modules", []))
    where = f" (in {module})" if module else ""
    return (
        f"; rewrite #{culprit['index']} {culprit['rule']!r} ({culprit['file']}) at "
        f"{', '.join(culprit['nodes'])}{where} is the first that breaks it"
    )


def find_bad_rewrite(
    applied: Sequence[Rewrite],
    passes: Callable[[onnx.ModelProto], bool],
    rewrite_first: Callable[[int], onnx.ModelProto],
) -> Culprit | None:
    """The first rewrite after which the model no longer `passes` validation, by bisection over
    how many of the (always identically ordered) rewrites are applied (the caller saw all of
    them fail); index 0 when the graph fails before any (a conversion or constant folding
    broke it)."""
    if not passes(rewrite_first(0)):  # what came before the rules: a conversion, constant folding
        return {"index": 0, "rule": None, "file": None, "nodes": [], "reason": "it fails before any rewrite"}
    if not applied:
        return None
    low, high = 0, len(applied)  # invariant: `low` rewrites pass, `high` fail
    while high - low > 1:
        middle = (low + high) // 2
        if passes(rewrite_first(middle)):
            low = middle
        else:
            high = middle
    kept = ("rule", "file", "nodes", "reason", "modules", "module")
    blamed = {"index": high, **{key: value for key, value in applied[high - 1].items() if key in kept}}
    return cast(Culprit, blamed)  # a Rewrite's fields that a Culprit names
