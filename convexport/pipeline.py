"""The optimize pipeline: load -> export -> rewrite -> validate -> profile -> write -> report."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx

from . import __version__, ir
from .errors import ConvexportError, ValidationError, first_line
from .export import ExportResult, export_model
from .files import (
    check_not_an_input,
    check_paths,
    give_default_permissions,
    rename_all,
    temporary_beside,
    write_atomically,
)
from .inputs import InputSpec, input_specs
from .ir import needs_external_data, save_with_external_data
from .loading import LoadedModel, load_model
from .profile import profile_models
from .rewrite.engine import STRATEGIES, rewrite_model
from .rewrite.primitives import builtin_primitives
from .rewrite.rulefile import builtin_rule_files, load_rules, rule_files
from .runtime import MissingKernel, resolve_device
from .stats import graph_stats
from .validate import DEFAULT_RUNS, Tolerances, compare_models

Progress = Callable[[str], None]


@dataclass
class OptimizeResult:
    report: dict
    model: onnx.ModelProto  # the optimized graph
    original: onnx.ModelProto  # the exported graph it was checked against
    output: Path | None  # where it was written (None when not written)


def optimize(
    model,
    inputs: Sequence[str | InputSpec] | None = None,
    output: str | Path | None = None,
    rules: Sequence[str | Path] = (),
    strategy: str = "cost",
    device: str = "auto",
    validate: bool = True,
    profile: bool = True,
    *,
    builtin_rules: bool = True,
    rtol: float | list[str] | None = None,
    atol: float | list[str] | None = None,
    opset: int | None = None,
    dynamic_batch: bool = False,
    freeze_input_defaults: bool = False,
    trust_pickle: bool = False,
    write: bool = True,
    progress: Progress | None = None,
    other_outputs: Sequence[tuple[str, str | Path]] = (),
) -> OptimizeResult:
    """Optimize MODEL (a path or MODEL string, an onnx.ModelProto, or an nn.Module).
    `other_outputs`: (option, path) of the files the caller will write (reports), checked with
    OUT against every file the model is read from before any work.

    Raises ConvexportError for user errors and ValidationError (nothing written) when the
    optimized graph does not match the original.
    """
    say = progress or (lambda message: None)
    tolerances = Tolerances.parse(rtol, atol)
    if strategy not in STRATEGIES:
        raise ConvexportError(f"--strategy {strategy!r}: expected one of {', '.join(STRATEGIES)}")
    device = resolve_device(device)  # where the model will run: what cost and measure decide for
    specs = input_specs(inputs)
    loaded = _load(model, trust_pickle)
    rule_list = _rules(rules, builtin_rules)
    destination = _destination(loaded, output, other_outputs) if write else None
    if not write:
        check_paths(loaded.files, list(other_outputs))

    say("exporting")
    exported = export_model(loaded, specs, opset, dynamic_batch, freeze_input_defaults)
    say("rewriting")
    primitives = builtin_primitives()
    decided: dict = {}  # cost/measure decisions, replayed by the bisection below
    outcome = rewrite_model(
        exported.model, rule_list, primitives, strategy, loaded.source, device=device, decided=decided
    )
    report = _report(loaded, destination, exported, outcome)
    if outcome.model is not exported.model:
        _check_well_formed(exported.model, outcome.model, loaded.source, report)

    inputs_for_check = _validation_inputs(exported, specs)
    if validate:
        say("validating")
        result = compare_models(
            exported.model,
            outcome.model,
            inputs_for_check,
            DEFAULT_RUNS,
            tolerances,
            labels=(f"{loaded.source} (as exported)", "the optimized graph"),
        )
        report["validation"] = result.to_report()
        if not result.passed:
            say("finding the rewrite that broke it")
            culprit = find_bad_rewrite(
                exported.model,
                outcome.applied,
                inputs_for_check,
                tolerances,
                lambda limit: (
                    rewrite_model(
                        exported.model, rule_list, primitives, strategy, loaded.source, limit, device, decided
                    ).model
                ),
            )
            report["validation"]["culprit"] = culprit
            blame = (
                ""
                if culprit is None
                else (
                    f"; rewrite #{culprit['index']} {culprit['rule']!r} ({culprit['file']}) at "
                    f"{', '.join(culprit['nodes'])} is the first that breaks it"
                )
            )
            raise ValidationError(
                f"{loaded.source}: the optimized graph does not match the original ({result.summary()}){blame}; "
                "nothing was written",
                report,
            )
    measured = None
    if profile:
        say(f"profiling on {device}")
        try:
            measured = profile_models({"before": exported.model, "after": outcome.model}, inputs_for_check, device)
        except MissingKernel as exc:
            report["profile_skipped"] = str(exc)
    if measured:
        before, after = measured["before"]["latency_ms"]["median"], measured["after"]["latency_ms"]["median"]
        report["profile"] = {**measured, "speedup": before / after if after > 0 else None}
        peak_before, peak_after = (
            measured["before"].get("peak_memory_bytes"),
            measured["after"].get("peak_memory_bytes"),
        )
        if peak_before and peak_after:
            report["profile"]["memory_ratio"] = peak_after / peak_before
    if destination is not None:
        say("writing")
        save_atomically(outcome.model, destination)
    return OptimizeResult(report, outcome.model, exported.model, destination)


def _check_well_formed(original: onnx.ModelProto, rewritten: onnx.ModelProto, source: str, report: dict) -> None:
    """ValidationError unless the rewritten model passes onnx.checker's full check (types and
    shapes included) wherever the original does: no rewrite may turn a valid model invalid,
    whether or not it is validated by running it. (A model over 2 GiB is checked by ONNX
    Runtime when validated; protobuf cannot hand it to the checker whole.)"""
    if needs_external_data(rewritten):
        return
    try:
        onnx.checker.check_model(rewritten, full_check=True)
    except onnx.checker.ValidationError as problem:
        try:
            onnx.checker.check_model(original, full_check=True)
        except onnx.checker.ValidationError:
            return  # invalid as exported: the rewrite is not what broke it
        raise ValidationError(
            f"{source}: the optimized graph is not a valid ONNX model ({first_line(problem)}); nothing was written "
            "(please report it)",
            report,
        ) from None


def find_bad_rewrite(
    reference: onnx.ModelProto,
    applied: list[dict],
    inputs: list[InputSpec],
    tolerances: Tolerances,
    rewrite_first: Callable[[int], onnx.ModelProto],
) -> dict | None:
    """The first rewrite after which validation fails, by bisection over how many of the (always
    identically ordered) rewrites are applied. The caller saw all of them fail; None when there
    were none (the failure is not a rewrite's)."""

    def fails(count: int) -> bool:
        return not compare_models(reference, rewrite_first(count), inputs, DEFAULT_RUNS, tolerances).passed

    low, high = 0, len(applied)  # invariant: `low` rewrites pass, `high` fail
    if not applied:
        return None
    while high - low > 1:
        middle = (low + high) // 2
        if fails(middle):
            high = middle
        else:
            low = middle
    return {"index": high, **{key: applied[high - 1][key] for key in ("rule", "file", "nodes", "reason")}}


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
    tracer's warnings (see the report's export_warnings)."""
    specs = input_specs(inputs)
    loaded = _load(model, trust_pickle)
    destination = _destination(loaded, output)
    exported = export_model(loaded, specs, opset, dynamic_batch)
    if warn is not None:
        for warning in exported.warnings:
            warn(warning)
    save_atomically(exported.model, destination)
    return destination


def _load(model, trust_pickle: bool) -> LoadedModel:
    if isinstance(model, onnx.ModelProto):
        return LoadedModel("<onnx.ModelProto>", "onnx", Path.cwd() / "model.opt.onnx", onnx_model=model)
    if isinstance(model, (str, Path)):
        return load_model(str(model), trust_pickle)
    import torch

    if isinstance(model, torch.nn.Module):
        return LoadedModel(f"<{type(model).__name__}>", "module", Path.cwd() / "model.opt.onnx", program=model.eval())
    raise ConvexportError(f"cannot optimize a {type(model).__name__}: give a path, an onnx.ModelProto or an nn.Module")


def _rules(paths: Sequence[str | Path], builtin: bool):
    primitives = builtin_primitives()
    files = (builtin_rule_files() if builtin else []) + rule_files(list(paths))
    return load_rules(files, set(primitives))


def _destination(loaded: LoadedModel, output: str | Path | None, others=()) -> Path:
    """Where the model goes: checked, with its weights file and the `others` outputs, against
    every file the model was read from and against each other, before any work."""
    destination = Path(output) if output is not None else loaded.default_output
    check_paths(loaded.files, [("-o", destination), *others])
    check_not_an_input("-o's weights file", weights_file(destination), loaded.files)
    return destination


def _validation_inputs(exported: ExportResult, specs: list[InputSpec]) -> list[InputSpec]:
    """The graph's inputs, with any dims --input names concretely."""
    given = {spec.name: spec for spec in specs}
    resolved = []
    for spec in exported.inputs:
        override = given.get(spec.name)
        if override is not None and len(override.dims) == len(spec.dims):
            dims = tuple(o if isinstance(o, int) else s for o, s in zip(override.dims, spec.dims))
            spec = InputSpec(spec.name, dims, spec.dtype)
        resolved.append(spec)
    return resolved


def _report(loaded: LoadedModel, destination: Path | None, exported: ExportResult, outcome) -> dict:
    before = graph_stats(exported.model)
    return {
        "convexport_version": __version__,
        "model": loaded.source,
        "output": str(destination) if destination else None,
        "exporter": exported.exporter,
        "export_warnings": exported.warnings,
        "opset": ir.onnx_opset(exported.model),
        "inputs": [str(spec) for spec in exported.inputs],
        "before": before,
        "after": before if outcome.model is exported.model else graph_stats(outcome.model),  # unchanged: the same
        "rewrites": outcome.applied,
        "skipped": outcome.skipped,
        "validation": None,
        "profile": None,
    }


def weights_file(destination: Path) -> Path:
    """<OUT>.data beside OUT: where weights of 1 GiB or more go."""
    return destination.with_name(destination.name + ".data")


def save_atomically(model: onnx.ModelProto, destination: Path) -> None:
    """OUT, written atomically (files.py). Weights of 1 GiB or more go to <OUT>.data beside it:
    both are written to temporary files first and renamed into place together."""
    if not needs_external_data(model):
        write_atomically(destination, lambda path: onnx.save(model, path))
        return
    data = weights_file(destination)
    with (
        temporary_beside(destination) as (model_temporary, model_final),
        temporary_beside(data) as (
            data_temporary,
            data_final,
        ),
    ):
        if model_temporary is None or data_temporary is None:
            raise ConvexportError(f"{destination}: a model with external weights cannot be written to a stream")
        save_with_external_data(model, model_temporary, data.name, Path(data_temporary))
        give_default_permissions(model_temporary)
        give_default_permissions(data_temporary)
        rename_all([(data_temporary, data_final), (model_temporary, model_final)])
