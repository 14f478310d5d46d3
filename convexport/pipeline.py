"""The optimize pipeline: load -> export -> rewrite -> validate -> profile -> write -> report."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import glob
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from . import __version__, heap, input_domains, ir, transformer_fusions
from .api_words import in_callers_words
from .errors import ConvexportError, InternalError, ValidationError, first_line
from .exact_check import FLOAT64_WEIGHT_BYTES
from .explain import ExplainRequest, explanations
from .export import ExportResult, export_model
from .files import check_paths, is_stream, temporary_folder_beside
from .folds import builtin_primitives
from .half import DTYPES as HALF_DTYPES
from .half import in_half_precision
from .input_data import check_data_file, load_npz
from .inputs import InputSpec, input_specs
from .loading import MODEL_SUFFIXES, LoadedModel, load_model, train_mode_note
from .low_rank import low_rank_branches_left
from .onnx_route import overridable_input_count
from .options import OPTION_NAMES, OptimizeOptions, Progress
from .profile import profile_models
from .report import plural
from .rewrite.engine import STRATEGIES, STRATEGY_ALIASES, rewrite_model
from .rewrite.rulefile import builtin_rule_files, load_rules, rule_files
from .rewrite.runtime_fusions import fusion_entries
from .runtime import (
    CUDA,
    MissingKernel,
    Unloadable,
    create_session,
    custom_op_libraries,
    provider_options,
    resolve_device,
)
from .saving import is_weights_file_of, save_atomically
from .stats import graph_stats
from .torch_reference import torch_float64
from .validate import DEFAULT_RUNS, NoMadeUpInputs, Tolerances, compare_models, tf32_effect


@dataclass
class OptimizeResult:
    report: dict
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
        if validation:
            worst = max((error["max_abs"] for error in validation["outputs"].values()), default=0.0)
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
    with in_callers_words(), _only_convexport_errors(), custom_op_libraries(_as_list(options.custom_ops_libraries)):
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


def _example_tensors(inputs) -> tuple | None:
    """`inputs` as example tensors, the way torch.onnx.export takes them (one tensor or array,
    or a tuple or list of them), or None when they are --input specs (texts, InputSpecs)."""
    given = inputs if isinstance(inputs, (tuple, list)) else [inputs]
    if not given or not all(hasattr(value, "shape") and hasattr(value, "dtype") for value in given):
        return None
    import torch

    return tuple(value if isinstance(value, torch.Tensor) else torch.from_numpy(np.asarray(value)) for value in given)


def _use_examples(loaded: LoadedModel, examples: tuple) -> None:
    """Example tensors given to optimize(): a torch model is exported on them."""
    if loaded.kind not in ("module", "torchscript"):
        raise ConvexportError(
            f"{loaded.source}: example tensors are for a torch module; give a {loaded.kind.replace('_', ' ')} "
            "input specs (NAME:DIMS) instead, and real data as input_data=DATA.npz"
        )
    loaded.example_inputs = examples


def _notebook_progress() -> Progress | None:
    """In a Jupyter or IPython kernel, each step of optimize() as one line on stderr (a script
    run from a terminal is left quiet: the command line has its own display)."""
    shell = sys.modules.get("IPython")
    if shell is None or getattr(shell, "get_ipython", lambda: None)() is None:
        return None
    shown: list[str] = []

    def show(message: str) -> None:
        step = message.split(" (")[0]
        if not shown or shown[-1] != step:
            shown.append(step)
            print(f"convexport: {step}", file=sys.stderr, flush=True)

    return show


def _as_list(given) -> list:
    """One value (a str or Path) or a sequence of them, as a list: never a string's characters."""
    if given is None:
        return []
    return [given] if isinstance(given, (str, Path, InputSpec)) else list(given)


def _optimize(model, options: OptimizeOptions) -> OptimizeResult:
    with contextlib.ExitStack() as cleanup:  # a large optimized model's weights folder, until written
        return _optimized(model, options, cleanup)


def _optimized(model, options: OptimizeOptions, cleanup: contextlib.ExitStack) -> OptimizeResult:
    if not options.made_up_inputs and options.input_data is None:
        raise ConvexportError("made_up_inputs=False needs input_data: the .npz of arrays to validate on instead")
    if options.input_data is not None:
        check_data_file(Path(options.input_data))
    examples = _example_tensors(options.inputs)
    inputs = [] if examples is not None else options.inputs
    listed = (inputs, options.rules, options.disable_rules, options.explain)
    inputs, rules, disable_rules, explain = map(_as_list, listed)
    stages = Stages(options.progress if options.progress is not None else _notebook_progress())
    say = stages.start
    tolerances = Tolerances.parse(options.rtol, options.atol)
    strategy = STRATEGY_ALIASES.get(options.strategy, options.strategy)
    if strategy not in STRATEGIES:
        raise ConvexportError(f"--strategy {strategy!r}: expected one of {', '.join(STRATEGIES)}")
    dtype, io_dtype = _precisions(options.dtype, options.io_dtype)
    device = resolve_device(options.device)  # where the model will run: what cost and measure decide for
    specs = input_specs(inputs)
    say("loading")
    loaded = _load(model, options.trust_pickle)
    if examples is not None:
        _use_examples(loaded, examples)
    explain = [ExplainRequest.parse(given) for given in explain]
    rule_list = _rules(rules, options.builtin_rules, disable_rules, [request.rule for request in explain])
    destination = _destination(loaded, options.output, options.other_outputs) if options.write else None
    if not options.write:
        check_paths(loaded.files, list(options.other_outputs))
    elif not is_stream(destination):  # a large model's sessions make their folders on the output's disk
        cleanup.enter_context(ir.scratch_beside(Path(os.path.realpath(destination)).parent))

    say("exporting")
    exported = export_model(loaded, specs, options.opset, options.dynamic_batch, options.freeze_input_defaults)
    # a torch model's own float64 run, the exact result where the export computes the same: its
    # float64 copy made now, before the module goes
    torch_source = None
    if options.validate:
        torch_source = torch_float64(loaded, exported.argument_names, exported.reference, FLOAT64_WEIGHT_BYTES)
    # the loaded model's weights live on in the exported models; its own copy is not needed any
    # more (where shape inference gave a new model, a large one's weights were held twice)
    loaded.onnx_model = loaded.program = None
    say("rewriting")
    primitives = builtin_primitives()
    explained = frozenset(request.rule for request in explain)

    def rewrite(folded: onnx.ModelProto, kept: list, decided: dict):
        return rewrite_model(
            folded, rule_list, primitives, strategy, loaded.source, device=device, decided=decided,
            explain=explained, kept_kernels=kept,
        )  # fmt: skip

    with ir.counting_bytes(BytesShown(say, "rewriting", "of weights read", ir.weight_bytes(exported.model))):
        # the decisions of cost/measure are replayed by the bisection below
        stage = transformer_fusions.rewrite_keeping_fusions(
            exported.model, exported.reference, loaded.source, strategy, rewrite
        )
    folded, outcome, kept, decided = stage.folded, stage.outcome, stage.kept, stage.decided
    deduplicated = ir.deduplicate_initializers(outcome.model)  # copies of a weight, written once
    outcome.model = deduplicated.model
    report = _report(loaded, destination, exported, outcome, device, strategy)
    if deduplicated.merged:
        report["deduplicated_initializers"] = {"merged": deduplicated.merged, "bytes_saved": deduplicated.bytes_saved}
    report["low_rank_branches_left"] = low_rank_branches_left(outcome.model, outcome.provenance)
    report["runtime_fusions"] = fusion_entries(outcome.applied, outcome.skipped)
    if stage.before.counts:
        report["transformer_fusions"] = transformer_fusions.report_entry(stage)
    if explain:
        report["explain"], report["explain_modules"] = explanations(explain, outcome.explained, outcome.provenance)
    report["constant_folding"] = {
        "nodes_before": len(exported.model.graph.node),
        "nodes_after": len(folded.graph.node),
        "between_rules": outcome.folded,
    }

    def rewritten_with(limit: int) -> onnx.ModelProto:  # the first `limit` rewrites only, for a bisection
        return rewrite_model(
            folded, rule_list, primitives, strategy, loaded.source, limit, device, decided, kept_kernels=kept
        ).model

    if destination is not None and _spilled_before_validation(outcome.model, exported.reference, destination):
        # its weights written beside the output now (read back by ONNX Runtime's sessions, not
        # held: the 1 GiB the rewrite made), renamed into place once it is validated
        say("writing weights")
        folder = cleanup.enter_context(temporary_folder_beside(destination, ir.SPILL_KIND))
        try:
            with ir.counting_bytes(BytesShown(say, "writing weights", "written", ir.weight_bytes(outcome.model))):
                outcome.model = ir.spill(outcome.model, folder)
        except OSError as exc:  # a full disk
            raise ConvexportError(f"{destination}: cannot write ({exc.strerror or exc})") from exc
        del deduplicated
        heap.release()
    invalid = outcome.invalid or _checker_problem(exported.reference, outcome.model)
    if invalid is None and not options.validate and outcome.model is not exported.reference:
        invalid = _load_problem(outcome.model)  # (validation loads it anyway)
    if invalid is not None:
        _refuse_invalid(invalid, exported, outcome.applied, rewritten_with, loaded.source, report, say)

    inputs_for_check = _validation_inputs(exported, specs)
    ranges = {spec.name: spec.value_range for spec in specs if spec.value_range}
    report["inputs"] = [str(dataclasses.replace(spec, value_range=ranges.get(spec.name))) for spec in exported.inputs]
    input_data = options.input_data
    real_data = [load_npz(Path(input_data), inputs_for_check)] if input_data is not None else []
    made_up_runs = DEFAULT_RUNS if options.made_up_inputs else 0
    if made_up_runs and (options.validate or options.profile):
        inputs_for_check = input_domains.sized_by_running(exported.reference, inputs_for_check)
    if not options.made_up_inputs:
        report["made_up_inputs"] = "not used: --input-data replaces them"
    tf32_sample = None  # the device check's first input set, for TF32's effect on the device
    if options.validate:
        say("validating")
        labels = (f"{loaded.source} (as exported)", "the optimized graph")
        # the float64 reference may add 40% to what the work took so far (exact_check.py)
        float64_budget = max(FLOAT64_MIN_S, FLOAT64_SHARE * stages.elapsed())
        try:
            result = compare_models(
                exported.reference,
                outcome.model,
                inputs_for_check,
                made_up_runs,
                tolerances,
                extra_feeds=real_data,
                labels=labels,
                exact_budget_s=float64_budget,
                torch_source=torch_source,
            )
        except Unloadable as unloadable:  # valid to onnx's checker, not to ONNX Runtime
            if _load_problem(exported.reference) is not None:
                raise  # the model as given: its own problem, said as such
            _refuse_invalid(
                first_line(unloadable), exported, outcome.applied, rewritten_with, loaded.source, report, say
            )
        except NoMadeUpInputs as unsuitable:
            if not real_data:
                raise ConvexportError(f"{unsuitable}; or give real inputs with --inputs DATA.npz") from None
            made_up_runs = 0  # the caller's arrays alone, said in the report
            result = compare_models(
                exported.reference,
                outcome.model,
                inputs_for_check,
                0,
                tolerances,
                extra_feeds=real_data,
                labels=labels,
                exact_budget_s=float64_budget,
                torch_source=torch_source,
            )
            report["made_up_inputs"] = f"not used: {unsuitable}"
        report["validation"] = result.to_report()
        failed_on = "cpu"
        if result.passed and device == "cuda":
            say("validating on cuda")
            failed_on = "cuda"  # if it fails now
            result = _validated_on_device(
                exported.reference,
                outcome.model,
                inputs_for_check,
                made_up_runs,
                tolerances,
                real_data,
                labels,
                report["validation"],
                result.exact,
            )
            tf32_sample = result.sample if result.passed else None
        if not result.passed:
            say("finding the rewrite that broke it")
            exact = result.exact  # the float64 reference, computed once, for every step of the bisection
            culprit = find_bad_rewrite(
                outcome.applied,
                lambda candidate: (
                    compare_models(
                        exported.reference,
                        candidate,
                        inputs_for_check,
                        made_up_runs,
                        tolerances,
                        extra_feeds=real_data,
                        device=failed_on,
                        exact=exact or False,
                    ).passed
                ),
                rewritten_with,
            )
            report["validation"]["culprit"] = culprit
            blame = _blame(culprit, exported.conversions)
            raise ValidationError(
                f"{loaded.source}: the optimized graph does not match the original ({result.summary()}){blame}; "
                "nothing was written",
                report,
            )
    if dtype != "float32":
        say(f"converting to {dtype}")
        half = in_half_precision(
            exported.reference, outcome.model, inputs_for_check, made_up_runs, real_data,
            result.exact if options.validate else None, dtype, io_dtype, kept, device,
        )  # fmt: skip
        report["precision"] = half.to_report()
        if not half.passed:
            raise ValidationError(f"{loaded.source}: {half.failure()}; nothing was written", report)
        outcome.model = half.model
        _restate_after(report, outcome.model)
    del torch_source  # the torch model's float64 copy (twice its weights), before the profile's sessions
    measured = None
    if options.profile:
        say(f"profiling on {device}")
        # TF32's effect is read on the profile's session of the optimized graph, which has the
        # deployment's options, rather than on one more session and its seconds-long first run
        read_tf32 = (
            {"after": lambda session: _record_tf32_effect(report["validation"], outcome.model, tf32_sample, session)}
            if tf32_sample
            else None
        )
        try:
            measured = profile_models(
                {"before": exported.reference, "after": outcome.model},
                inputs_for_check,
                device,
                feeds=real_data[0] if made_up_runs == 0 else None,
                per_op=options.per_op,
                progress=lambda done, total: say(f"profiling on {device}", f"{done}/{total} runs"),
                after_timing=read_tf32,
            )
        except MissingKernel as exc:
            report["profile_skipped"] = str(exc)
    if tf32_sample and not {"tf32_effect", "tf32_effect_note"} & report["validation"]["on_device"].keys():
        # not profiled, or the profile was skipped
        say("validating on cuda", "TF32's effect")
        _record_tf32_effect(report["validation"], outcome.model, tf32_sample)
    if measured:
        report["profile"] = _judged_profile(measured, unchanged=outcome.model is exported.reference)
    weights = None
    if destination is not None:
        say("writing")
        with ir.counting_bytes(BytesShown(say, "writing", "written", ir.weight_bytes(outcome.model))):
            weights = save_atomically(outcome.model, destination, loaded.files)
        report["output_weights"] = str(weights) if weights is not None else None
    report["timings_s"] = stages.finish()
    if loaded.kind == "onnx":  # a large model's weights in files: named as a model read from its folder names them
        ir.relative_to(exported.reference, Path(loaded.source).parent)
        if destination is None:
            ir.relative_to(outcome.model, Path(loaded.source).parent)
    return OptimizeResult(report, outcome.model, exported.reference, destination, weights)


def _spilled_before_validation(model: onnx.ModelProto, reference: onnx.ModelProto, destination: Path) -> bool:
    """Whether the optimized model's weights go to their output folder before validation:
    a large model (ir.kept_from_serialisation) written to a file, not a stream."""
    return model is not reference and ir.kept_from_serialisation(model) and not is_stream(destination)


# The float64 reference's time budget: this share of what optimize spent before validating, and
# at least this many seconds (a small model's whole run takes a few).
FLOAT64_SHARE = 0.4
FLOAT64_MIN_S = 0.5

# Peak memory or file size this much above the original's is flagged as a regression.
REGRESSION_RATIO = 1.05


def _judged_profile(measured: dict, unchanged: bool) -> dict:
    """The profile with its speedup, the noise of that ratio and a verdict a person can read.
    `noise` is the half-width of a 95% interval of the ratio of the two medians: each median's
    relative standard error is 1.253 * sigma / sqrt(runs) / median, sigma read from the
    interquartile range (IQR / 1.349, robust to the odd slow run). A speedup within it is "no
    measurable change" (never shown as a slowdown), as is an unchanged graph."""
    before, after = measured["before"]["latency_ms"], measured["after"]["latency_ms"]
    speedup = before["median"] / after["median"] if after["median"] > 0 else None
    runs = max(int(measured.get("runs") or 1), 1)

    def relative_error(latency: dict) -> float:
        spread = latency.get("p75", latency["p90"]) - latency.get("p25", latency["p10"])
        return 1.253 * spread / 1.349 / math.sqrt(runs) / latency["median"] if latency["median"] > 0 else 0.0

    noise = 1.96 * math.hypot(relative_error(before), relative_error(after))
    if unchanged:
        verdict = "unchanged graph"
    elif speedup is None or abs(speedup - 1) <= noise:
        verdict = "no measurable change"
    else:
        verdict = "faster" if speedup > 1 else "slower"
    profile = {**measured, "speedup": speedup, "noise": noise, "verdict": verdict}
    peak_before, peak_after = measured["before"].get("peak_memory_bytes"), measured["after"].get("peak_memory_bytes")
    if peak_before and peak_after:
        profile["memory_ratio"] = peak_after / peak_before
        profile["memory_regression"] = peak_after > REGRESSION_RATIO * peak_before
    return profile


def _environment(device: str) -> dict:
    """What the numbers were measured with: versions, the provider, threads, the processor."""
    import platform

    from .runtime import CPU, CUDA, ort

    return {
        "onnxruntime": ort.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": device,
        "provider": CUDA if device == "cuda" else CPU,
        "cpu": _cpu_name(),
        "cpu_threads": os.cpu_count(),
        "gpu": _gpu_name() if device == "cuda" else None,
    }


def _cpu_name() -> str:
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu_name() -> str | None:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        )
        return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


class BytesShown:
    """A large model's step told in bytes as its weights are read or written (ir.counting_bytes):
    "rewriting (0.41 of 1.01 GiB of weights read)", each time the figure shown changes."""

    def __init__(self, say: Callable[[str, str], None], step: str, what: str, total: int):
        self.say, self.step, self.what, self.total = say, step, what, total
        self.done, self.shown = 0, ""

    def __call__(self, length: int) -> None:
        self.done += length
        text = f"{self.done / 2**30:.2f} of {self.total / 2**30:.2f} GiB {self.what}"
        if text != self.shown:
            self.shown = text
            self.say(self.step, text)


class Stages:
    """The optimize steps as they go: each one announced to `progress` (a callable taking the
    step's name, or the name and a note such as "12/40 runs"), and the seconds each took."""

    def __init__(self, progress: Progress | None):
        self.progress = progress
        self.seconds: dict[str, float] = {}
        self.began = self.current_start = time.perf_counter()
        self.current: str | None = None

    def start(self, step: str, note: str | None = None) -> None:
        if step != self.current:
            self._close()
            self.current, self.current_start = step, time.perf_counter()
        if self.progress is not None:
            self.progress(step if note is None else f"{step} ({note})")

    def elapsed(self) -> float:
        """Seconds since the first step began."""
        return time.perf_counter() - self.began

    def finish(self) -> dict[str, float]:
        """{step: seconds, ..., "total": seconds} (a step's key is its name's first word)."""
        self._close()
        return {**self.seconds, "total": round(time.perf_counter() - self.began, 3)}

    def _close(self) -> None:
        if self.current is not None:
            key = self.current.split()[0]
            self.seconds[key] = round(self.seconds.get(key, 0.0) + time.perf_counter() - self.current_start, 3)


# what onnx.checker's full check raises: its own verdict, or shape inference's
_CHECKER_ERRORS = (onnx.checker.ValidationError, onnx.shape_inference.InferenceError)


def _checker_problem(original: onnx.ModelProto, rewritten: onnx.ModelProto) -> str | None:
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


def _refuse_invalid(problem: str, exported, applied: list[dict], rewritten_with, source: str, report: dict, say):
    """ValidationError for an optimized graph that is not a valid model (`problem`), naming the
    first rewrite after which it is not (the same bisection as for wrong values): a rule whose
    rewrite breaks the graph's shapes is the rule's fault, told as such (exit 3), not convexport's."""
    say("finding the rewrite that broke it")
    culprit = find_bad_rewrite(applied, lambda candidate: _is_valid(exported.reference, candidate), rewritten_with)
    report["validation"] = {"passed": False, "invalid_model": problem, "culprit": culprit}
    blame = _blame(culprit, exported.conversions)
    raise ValidationError(
        f"{source}: the optimized graph is not a valid ONNX model ({problem}){blame}; nothing was written", report
    )


def _is_valid(original: onnx.ModelProto, candidate: onnx.ModelProto) -> bool:
    return _checker_problem(original, candidate) is None and _load_problem(candidate) is None


def _load_problem(candidate: onnx.ModelProto) -> str | None:
    """Why ONNX Runtime refuses to load the model, or None (a kernel it lacks for a custom op
    or a dtype is another matter, which validation and profiling say)."""
    try:
        create_session(candidate, "cpu", optimize=False, what="the optimized graph")
    except Unloadable as problem:
        return first_line(problem)
    except ConvexportError:
        pass
    return None


def _validated_on_device(reference, optimized, inputs, runs, tolerances, real_data, labels, validation: dict, exact):
    """The check on the CUDA provider the model is deployed on, beside the CPU reference check:
    original and optimized on CUDA with TF32 off, so that only the rewrite can differ; its
    result goes to validation["on_device"] (TF32's own effect is added by _record_tf32_effect).
    The device check's result is returned: a graph that fails it fails validation."""
    on_device = compare_models(
        reference,
        optimized,
        inputs,
        runs,
        tolerances,
        extra_feeds=real_data,
        labels=labels,
        device="cuda",
        exact=exact or False,
    )
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


def _record_tf32_effect(validation: dict, model: onnx.ModelProto, sample, session=None) -> None:
    """validation["on_device"]["tf32_effect"]: per output, how far the optimized graph as
    deployed (ORT's default CUDA options, TF32 on) lands from the device check's TF32-off
    outputs (validate.tf32_effect), on `session` where the profile hands its own over."""
    effect = tf32_effect(model, sample, session)
    on_device = validation["on_device"]
    if effect is None:
        on_device["tf32_effect_note"] = f"not measured: {CUDA} has no kernel for the graph with its default options"
        return
    on_device["tf32_effect"] = {name: {"max_abs": e.max_abs, "max_rel": e.max_rel} for name, e in effect.items()}
    on_device["tf32_effect_options"] = provider_options("cuda")


def _blame(culprit: dict | None, conversions: list[str]) -> str:
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
    applied: list[dict],
    passes: Callable[[onnx.ModelProto], bool],
    rewrite_first: Callable[[int], onnx.ModelProto],
) -> dict | None:
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
    return {"index": high, **{key: value for key, value in applied[high - 1].items() if key in kept}}


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
    examples = _example_tensors(inputs)
    specs = input_specs([] if examples is not None else _as_list(inputs))
    loaded = _load(model, trust_pickle)
    if examples is not None:
        _use_examples(loaded, examples)
    destination = _destination(loaded, output)
    exported = export_model(loaded, specs, opset, dynamic_batch)
    if warn is not None:
        for warning in exported.warnings:
            warn(warning)
    save_atomically(exported.model, destination, loaded.files)
    return destination


def _load(model, trust_pickle: bool) -> LoadedModel:
    if isinstance(model, onnx.ModelProto):
        return LoadedModel("<onnx.ModelProto>", "onnx", Path.cwd() / "model.opt.onnx", onnx_model=model)
    if isinstance(model, (str, Path)):
        return load_model(str(model), trust_pickle)
    import torch

    if isinstance(model, torch.nn.Module):
        source = f"<{type(model).__name__}>"
        in_train_mode = model.training
        loaded = LoadedModel(source, "module", Path.cwd() / "model.opt.onnx", program=model.eval())
        if in_train_mode:
            loaded.notes.append(train_mode_note(source))
        return loaded
    if isinstance(model, Mapping) and model and all(isinstance(value, torch.Tensor) for value in model.values()):
        raise ConvexportError(
            f"a {type(model).__name__} of {len(model)} tensors is a state_dict: weights without the module that uses "
            "them; build the module, load_state_dict() it, and pass the module"
        )
    raise ConvexportError(f"cannot optimize a {type(model).__name__}: give a path, an onnx.ModelProto or an nn.Module")


def _rules(paths: Sequence[str | Path], builtin: bool, disabled: Sequence[str] = (), explained: Sequence[str] = ()):
    """The rules to run: the built-in ones (unless not `builtin`) and the files in `paths`,
    without those `disabled`; a name in `disabled` or `explained` that no rule has is an error."""
    primitives = builtin_primitives()
    files = (builtin_rule_files() if builtin else []) + rule_files(list(paths))
    rules = load_rules(files, set(primitives))
    names = [rule.name for rule in rules]
    for option, given in (("--disable-rule", disabled), ("--explain", explained)):
        for name in given:
            if name not in names:
                close = difflib.get_close_matches(name, names, n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else "; `convexport rules list` names them"
                raise ConvexportError(f"{option} {name}: no rule of that name{hint}")
    return [rule for rule in rules if rule.name not in set(disabled)]


def _destination(loaded: LoadedModel, output: str | Path | None, others=()) -> Path:
    """Where the model goes: checked, with its weights file and the `others` outputs, against
    every file the model was read from and against each other, before any work."""
    destination = Path(output) if output is not None else loaded.default_output
    check_paths(loaded.files, [("-o", destination), *others])
    if output is None:
        loaded.notes.extend(_shared_default_output(loaded, destination))
    real = Path(os.path.realpath(destination))
    for option, path in others:  # a report named as OUT's weights file would be taken for one and removed
        if path is None or str(path) == "-":
            continue
        other = Path(os.path.realpath(path))
        if other.parent == real.parent and is_weights_file_of(other.name, real.name):
            raise ConvexportError(
                f"{option} {path}: is where {destination}'s weights go when they need a file of their own; "
                "give each output its own file"
            )
    return destination


def _shared_default_output(loaded: LoadedModel, destination: Path) -> list[str]:
    """A note where the default output, already there, is also another model's of this folder
    (net.pt and net.pt2 both write net.opt.onnx): the run replaces what that one wrote."""
    if not destination.exists() or not loaded.files:
        return []
    given = loaded.files[0]
    stem = destination.name.removesuffix(".opt.onnx")
    others = sorted(
        path.name
        for path in destination.parent.glob(f"{glob.escape(stem)}.*")
        if path.stem == stem and path.suffix in (*MODEL_SUFFIXES, ".py") and path.resolve() != given.resolve()
    )
    if not others:
        return []
    return [f"{destination} was replaced; {', '.join(others)} in the same folder writes it too (give -o to keep both)"]


def _validation_inputs(exported: ExportResult, specs: list[InputSpec]) -> list[InputSpec]:
    """The graph's inputs, with any dims --input names concretely and the range it gives."""
    given = {spec.name: spec for spec in specs}
    resolved = []
    for spec in exported.inputs:
        override = given.get(spec.name)
        if override is not None:
            same_rank = len(override.dims) == len(spec.dims)
            dims = tuple(o if isinstance(o, int) else s for o, s in zip(override.dims, spec.dims))
            value_range = override.value_range or spec.value_range  # --input's range, else the graph's
            spec = InputSpec(spec.name, dims if same_rank else spec.dims, spec.dtype, value_range=value_range)
        resolved.append(spec)
    return resolved


def _precisions(dtype: str, io_dtype: str | None) -> tuple[str, str]:
    """--dtype and --io-dtype as the types' names: the model's, and its interface's."""
    for flag, given in (("--dtype", dtype), ("--io-dtype", io_dtype or "fp32")):
        if given not in HALF_DTYPES:
            raise ConvexportError(f"{flag} {given}: expected fp32 or fp16")
    model, interface = HALF_DTYPES[dtype], HALF_DTYPES[io_dtype or "fp32"]
    if interface not in ("float32", model):
        raise ConvexportError(f"--io-dtype {io_dtype} with --dtype {dtype}: the interface is fp32 or the model's own")
    return model, interface


def _restate_after(report: dict, after: onnx.ModelProto) -> None:
    """The report's `after` (and what it gives) for the model written, when it is not the one
    the rewrite gave."""
    stats = {**graph_stats(after), "model_bytes": ir.serialized_bytes(after)}
    report["after"] = stats
    report["size_regression"] = stats["model_bytes"] > REGRESSION_RATIO * report["before"]["model_bytes"]
    report["growth"] = {
        key: stats[key] / report["before"][key] if report["before"][key] else None for key in ("flops", "params")
    }


def _report(
    loaded: LoadedModel, destination: Path | None, exported: ExportResult, outcome, device: str, strategy: str
) -> dict:
    before = {**graph_stats(exported.reference), "model_bytes": ir.serialized_bytes(exported.reference)}
    after = (
        before
        if outcome.model is exported.reference
        else {**graph_stats(outcome.model), "model_bytes": ir.serialized_bytes(outcome.model)}
    )
    return {
        "convexport_version": __version__,
        "model": loaded.source,
        "output": str(destination) if destination else None,
        "exporter": exported.exporter,
        "export_warnings": exported.warnings,
        "opset": ir.onnx_opset(exported.model),
        "conversions": exported.conversions,
        "input_changes": exported.input_changes,
        "notes": loaded.notes,
        "overridable_inputs": overridable_input_count(exported.model),
        "inputs": [str(spec) for spec in exported.inputs],
        "before": before,
        "after": after,
        "size_regression": after["model_bytes"] > REGRESSION_RATIO * before["model_bytes"],
        "strategy": strategy,
        "growth": {key: after[key] / before[key] if before[key] else None for key in ("flops", "params")},
        "outputs": [_output_spec(value) for value in exported.reference.graph.output],
        "environment": _environment(device),
        "rewrites": outcome.applied,
        "skipped": outcome.skipped,
        "validation": None,
        "profile": None,
    }


def _output_spec(value: onnx.ValueInfoProto) -> str:
    """An output as NAME:DIMS:DTYPE, as the report's inputs are written."""
    tensor_type = value.type.tensor_type
    dims = "x".join(
        str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor_type.shape.dim
    )
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type).name if tensor_type.elem_type else "?"
    return f"{value.name}:{dims}:{dtype}"
