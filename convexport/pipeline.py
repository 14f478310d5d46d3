"""The optimize pipeline: the API (optimize, export_only) and the orchestrator that runs the
stages of convexport/stages/ in order: load -> rewrite -> validate -> half -> profile ->
report. Each stage hands back what it found; the orchestrator alone places it in the report,
and turns a stage's refusal into a ValidationError carrying the report as far as it went."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import onnx

from . import ir
from .errors import ConvexportError, InternalError, ValidationError, first_line
from .ir.saving import save_atomically
from .load.export import export_model
from .load.inputs import InputSpec, input_specs
from .options import OPTION_NAMES, OptimizeOptions
from .profile.profiler import timing_threads
from .report.types import InvalidModel, OnDevice, OptimizeReport, Validation
from .report.words import plural
from .runtime import custom_op_libraries
from .stages import half, load, rewrite
from .stages import profile as profile_stage
from .stages import report as report_stage
from .stages import validate as validate_stage
from .stages.inputs import RunInputs, reported_inputs, run_inputs
from .stages.refusal import Refused
from .stages.request import as_list, example_tensors, read_request
from .util.api_words import in_callers_words
from .util.files import check_paths


@dataclass
class OptimizeResult:
    report: OptimizeReport  # the JSON report (report/types.py), a dict
    model: onnx.ModelProto  # the optimized graph
    original: onnx.ModelProto  # the exported graph it was checked against
    output: Path | None  # where it was written (None when not written)
    output_weights: Path | None = None  # the weights file beside it, for a model of 1 GiB of weights or more

    def __repr__(self) -> str:
        """One line (a notebook shows it for a cell's last value): the model, the node counts,
        the rewrites, the validation and the speed; `.report` has the rest."""
        report = self.report
        parts = [
            f"{report['before']['nodes']} -> {report['after']['nodes']} nodes",
            plural(len(report["rewrites"]), "rewrite"),
        ]
        validation = report.get("validation")
        if validation and "outputs" in validation:  # (else refused: a ValidationError, not a result)
            outputs = cast(Validation, validation)["outputs"]
            worst = max((error["max_abs"] or 0.0 for error in outputs.values()), default=0.0)
            parts.append(f"validation {'passed' if validation['passed'] else 'FAILED'} (max abs error {worst:.3g})")
        profile = report.get("profile")
        if profile and profile.get("speedup"):
            parts.append(f"{profile['speedup']:.2f}x on {profile['provider']} ({profile['verdict']})")
        written = f" -> {self.output}" if self.output else " (not written)"
        return f"<OptimizeResult {report['model']}{written}: {', '.join(parts)}>"


def optimize(
    model,
    inputs=None,
    output: str | Path | None = None,
    rules: Sequence[str | Path] = (),
    strategy: str = "cost",
    device: str = "auto",
    validate: bool = True,
    profile: bool = True,
    *,
    options: OptimizeOptions | None = None,
    **keywords,
) -> OptimizeResult:
    """Optimize MODEL (a path or MODEL string, an onnx.ModelProto, or an nn.Module).

    The options are OptimizeOptions' fields (convexport/options.py says what each does), given
    as these arguments and keywords (`optimize(m, inputs=["x:1x3x224x224"], write=False)`), or
    as one `options` object and nothing else. `inputs`, `rules`, `disable_rules`, `explain` and
    `custom_ops_libraries` take one value or a sequence of them.

    Raises ConvexportError for user errors, ValidationError (nothing written) when the
    optimized graph does not match the original, InternalError for a bug in convexport; never
    anything else.
    """
    given = dict(zip(_POSITIONAL, (inputs, output, rules, strategy, device, validate, profile)))
    if options is None:
        unknown = sorted(set(keywords) - OPTION_NAMES)
        if unknown:
            raise TypeError(f"optimize() got unexpected keyword argument(s): {', '.join(unknown)}")
        options = OptimizeOptions(**given, **keywords)
    elif keywords or any(not _is_default(name, value) for name, value in given.items()):
        raise TypeError("optimize(): give an OptimizeOptions or the options as arguments, not both")
    with (
        in_callers_words(),
        _only_convexport_errors(),
        custom_op_libraries(as_list(options.custom_ops_libraries)),
        timing_threads(options.threads),
    ):
        return _optimize(model, options)


_POSITIONAL = ("inputs", "output", "rules", "strategy", "device", "validate", "profile")
_DEFAULTS = OptimizeOptions()


def _is_default(name: str, value) -> bool:
    default = getattr(_DEFAULTS, name)
    return value is default or (isinstance(value, str | bool | tuple) and value == default)


@contextlib.contextmanager
def _only_convexport_errors():
    """Any exception but convexport's own (and KeyboardInterrupt, SystemExit, a signal) as an InternalError."""
    try:
        yield
    except ConvexportError:
        raise
    except Exception as exc:
        raise InternalError(f"internal error: {type(exc).__name__}: {first_line(exc)} (please report it)") from exc


def _optimize(model, options: OptimizeOptions) -> OptimizeResult:
    with contextlib.ExitStack() as cleanup:  # a large optimized model's weights folder, until written
        return _optimized(model, options, cleanup)


def _optimized(model, options: OptimizeOptions, cleanup: contextlib.ExitStack) -> OptimizeResult:
    """The stages in order (stages/__init__.py), each once; the report filled as they go."""
    request = read_request(options)
    say = request.steps.start
    say("loading")
    loaded = load.loaded_model(model, options.trust_pickle, request.examples)
    cleanup.callback(loaded.restore)  # the API's module, exported in eval mode, given back as it came
    asked = rewrite.rules_asked(request)
    destination = load.destination(loaded, options.output, options.other_outputs) if options.write else None
    if destination is None:
        check_paths(loaded.files, list(options.other_outputs))
    report_stage.scratch_on_output_disk(destination, cleanup)
    say("exporting")
    exported = load.exported(loaded, request)
    graph = exported.graph
    say("rewriting")
    rewritten = rewrite.rewritten(graph, loaded.source, asked, request)
    report = report_stage.base_report(loaded, graph, rewritten)
    outcome = rewritten.outcome
    report_stage.spill_before_validation(outcome, graph.reference, destination, cleanup, say)
    with _refusal_reported(report):
        validate_stage.refuse_if_invalid(graph, rewritten, options.validate, say)
        runs = run_inputs(graph, request)
        report["inputs"] = reported_inputs(graph, request)
        if runs.note:
            report["made_up_inputs"] = runs.note
        checked = _validated(exported, rewritten, runs, request, report) if options.validate else None
        if request.dtype != "float32":
            validated = checked.result if checked else None
            outcome.model, report["precision"] = half.in_half(graph, rewritten, runs, validated, request, cleanup)
            _restate(report, outcome.model, graph.declared)
    exported.torch_source = None  # the torch model's float64 copy (twice its weights), before the profile's sessions
    ir.as_declared(outcome.model, graph.declared)  # annotated as given, as it is timed and written
    tf32_sample = checked.tf32_sample if checked else None
    if options.profile:
        read_tf32 = None
        if tf32_sample:

            def read_tf32(session) -> None:
                _on_device(report).update(validate_stage.tf32_effect_fields(outcome.model, tf32_sample, session))

        _place_profile(report, profile_stage.profiled(graph, outcome.model, runs, request, read_tf32))
        _faster_one_instead(exported, rewritten, runs, request, report)
    if tf32_sample and not validate_stage.tf32_effect_recorded(_on_device(report)):  # not profiled, or skipped
        say("validating on cuda", "TF32's effect")
        _on_device(report).update(validate_stage.tf32_effect_fields(outcome.model, tf32_sample))
    weights = report_stage.written(outcome.model, destination, loaded.files, say) if destination is not None else None
    if destination is not None:
        report["output"], report["output_weights"] = str(destination), str(weights) if weights is not None else None
    report["timings_s"] = request.steps.finish()
    if graph.exporter == "onnx":  # a large model's weights in files: named as a model read from its folder names them
        ir.relative_to(graph.reference, Path(loaded.source).parent)
        if destination is None:
            ir.relative_to(outcome.model, Path(loaded.source).parent)
    return OptimizeResult(report, outcome.model, graph.reference, destination, weights)


@contextlib.contextmanager
def _refusal_reported(report: OptimizeReport):
    """A stage's refusal as the ValidationError the API raises, carrying the report with the
    refusal's sections in it."""
    try:
        yield
    except Refused as refused:
        if refused.validation is not None:
            _place_validation(report, refused.validation, refused.made_up_inputs)
        if refused.precision is not None:
            report["precision"] = refused.precision
        raise ValidationError(str(refused), report) from None


def _on_device(report: OptimizeReport) -> OnDevice:
    """The report's device check (validation["on_device"]), as it stands now: a rewrite chosen
    for speed is validated again, its section replacing the first."""
    validation = report["validation"]
    assert validation is not None and "on_device" in validation, "a TF32 sample comes of a device check"
    return cast(Validation, validation)["on_device"]


def _validated(
    exported: load.Exported, rewritten: rewrite.Rewritten, runs: RunInputs, request, report: OptimizeReport
) -> validate_stage.Checked:
    """The validate stage's check, its sections placed in the report."""
    checked = validate_stage.checked(exported.graph, rewritten, runs, request, exported.torch_source)
    _place_validation(report, checked.validation, checked.made_up_inputs)
    return checked


def _place_validation(report: OptimizeReport, validation: Validation | InvalidModel, made_up_inputs: str | None):
    """The validate stage's section, and why made-up inputs were not used where they were not."""
    if made_up_inputs is not None:
        report["made_up_inputs"] = made_up_inputs
    report["validation"] = validation


def _restate(report: OptimizeReport, model: onnx.ModelProto, declared) -> None:
    """The report's `after` for the model written, where it is not the one the rewrite gave."""
    report["after"], report["size_regression"], report["growth"] = report_stage.restated(
        report["before"], model, declared
    )


def _place_profile(report: OptimizeReport, profiled: profile_stage.Profiled) -> None:
    if profiled.skipped is not None:
        report["profile_skipped"] = profiled.skipped
    else:
        report["profile"] = profiled.profile


def _faster_one_instead(
    exported: load.Exported, rewritten: rewrite.Rewritten, runs: RunInputs, request, report: OptimizeReport
) -> None:
    """Where the whole rewrite is slower on the device, the fastest graph instead (stages/profile.py):
    rewritten.outcome.model becomes it, restated, validated, annotated as given and profiled."""
    graph, outcome = exported.graph, rewritten.outcome
    search = profile_stage.faster_candidate(graph, rewritten, runs, request, report["profile"], report["rewrites"])
    if search is None:
        return
    if search.not_made is not None:
        report["speed_choice_skipped"] = search.not_made
    if search.model is None or search.choice is None:
        return
    report["speed_choice"], report["dropped_for_speed"] = search.choice, search.dropped
    report["rewrites"], report["skipped"] = search.applied, search.skipped
    outcome.model = search.model
    _restate(report, search.model, graph.declared)
    if request.options.validate:
        with _refusal_reported(report):
            _validated(exported, rewritten, runs, request, report)
    report["profile"] = None
    if search.choice["written_as_given"]:
        outcome.model = graph.as_given()
        report["profile_skipped"] = "every candidate was slower than the model as given, which is written"
    else:
        as_written = ir.as_declared(search.model, graph.declared)
        _place_profile(report, profile_stage.profiled(graph, as_written, runs, request))


def export_only(
    model,
    output: str | Path,
    inputs: Sequence[str | InputSpec] | None = None,
    opset: int | None = None,
    dynamic_batch: bool = False,
    trust_pickle: bool = False,
    *,
    warn: Callable[[str], None] | None = None,
) -> Path:
    """Export MODEL to `output` and return where it went; `warn` gets each of the TorchScript
    tracer's warnings (see the report's export_warnings). Raises as optimize does."""
    with in_callers_words(), _only_convexport_errors():
        return _export_only(model, output, inputs, opset, dynamic_batch, trust_pickle, warn)


def _export_only(model, output, inputs, opset, dynamic_batch, trust_pickle, warn) -> Path:
    examples = example_tensors(inputs)
    specs = input_specs([] if examples is not None else as_list(inputs))
    loaded = load.loaded_model(model, trust_pickle, examples)
    try:
        destination = load.destination(loaded, output)
        exported = export_model(loaded, specs, opset, dynamic_batch)
    finally:
        loaded.restore()
    if warn is not None:
        for warning in exported.warnings:
            warn(warning)
    save_atomically(exported.model, destination, loaded.files)
    return destination
