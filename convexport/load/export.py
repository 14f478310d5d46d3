"""A loaded model -> the ONNX graph the rewrite starts from, with its input specs. Each route
(convexport/load/routes/) exports with one of these:
  export_onnx       an ONNX model, made ready (load/onnx_route.py), not exported
  export_module     an nn.Module: torch.export + the dynamo ONNX exporter, falling back to the
                    TorchScript exporter when torch.export cannot trace the module
  export_script     a ScriptModule: the TorchScript ONNX exporter (the only one that takes one)
  torch_graph       what they share, and the exported-program route uses: an exporter run
                    at the opset asked (the installed torch's default where none is)
"""

from __future__ import annotations

import inspect
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import onnx

from .. import ir
from ..errors import ConvexportError, first_line
from ..util.quiet import quiet_libraries
from .inputs import InputSpec
from .model import LoadedModel
from .onnx_route import BATCH_DIM, MIN_OPSET, graph_input_specs, prepare_onnx


@dataclass
class ExportResult:
    """`model` is what the rewrite starts from; `reference` what it is validated against and
    measured beside: the same model, except for an ONNX model that had to be converted
    (load/onnx_route.py, listed in `conversions`)."""

    model: onnx.ModelProto
    inputs: list[InputSpec]  # one per graph input, in order; dynamic dims by name
    exporter: str  # onnx (no export) | dynamo | torchscript
    warnings: list[str] = field(default_factory=list)  # the TorchScript tracer's, when it traced
    reference: onnx.ModelProto = field(kw_only=True)  # the model itself, for a torch export
    conversions: list[str] = field(default_factory=list)
    input_changes: list[str] = field(default_factory=list)  # fixed dims of an ONNX model --input changed
    argument_names: list[str] = field(default_factory=list)  # a torch source's, in the order it was called with
    # the reference's main-graph value_info as given, before shape inference added to it: what
    # the model written is annotated with (ir.as_declared)
    declared: tuple[onnx.ValueInfoProto, ...] = field(kw_only=True)

    _as_given: onnx.ModelProto | None = field(default=None, init=False, repr=False)

    def as_given(self) -> onnx.ModelProto:
        """The reference annotated as declared (ir.as_declared): the model a user runs without
        convexport, which the optimized one is timed against. The reference itself where
        inference added nothing to it, else a copy made once."""
        if self._as_given is None:
            entries = ir.declared_entries(self.reference, self.declared)
            if _same_entries(entries, self.reference.graph.value_info):
                self._as_given = self.reference
            else:
                self._as_given = onnx.ModelProto()
                self._as_given.CopyFrom(self.reference)
                ir.as_declared(self._as_given, self.declared)
        return self._as_given


def _same_entries(one, other) -> bool:
    return len(one) == len(other) and all(a.SerializeToString() == b.SerializeToString() for a, b in zip(one, other))


@dataclass(frozen=True)
class ExportAsk:
    """What the export is asked: --input's specs, --opset, --dynamic-batch and
    --freeze-input-defaults (an ONNX model's initializers that are also listed as inputs, old
    exports with keep_initializers_as_inputs, leave the inputs and become the constants they
    were meant to be: graph.overridable_initializers)."""

    specs: list[InputSpec]
    opset: int | None = None
    dynamic_batch: bool = False
    freeze_input_defaults: bool = False


def export_model(
    loaded: LoadedModel,
    input_specs: Sequence[InputSpec] | None = None,
    opset: int | None = None,
    dynamic_batch: bool = False,
    freeze_input_defaults: bool = False,
) -> ExportResult:
    """Export (or, for ONNX, take) the model by its route and return it shape-inferred with its
    inputs. An ONNX model given as it is and already fully shaped is returned itself, not a
    copy: nothing after this writes to it (the rewrite, validation and profiling only read it)."""
    if opset is not None and not MIN_OPSET <= opset <= onnx.defs.onnx_opset_version():
        raise ConvexportError(
            f"--opset {opset}: convexport exports at opsets {MIN_OPSET} to {onnx.defs.onnx_opset_version()} "
            f"(the newest the installed onnx {onnx.__version__} knows)"
        )
    return loaded.route.export(loaded, ExportAsk(list(input_specs or []), opset, dynamic_batch, freeze_input_defaults))


def export_onnx(loaded: LoadedModel, ask: ExportAsk) -> ExportResult:
    prepared = prepare_onnx(loaded.onnx_model, loaded.source, ask.specs, ask.dynamic_batch, ask.freeze_input_defaults)
    model = prepared.model
    return ExportResult(
        model, graph_input_specs(model), "onnx", reference=prepared.reference, conversions=prepared.conversions,
        input_changes=prepared.input_changes, declared=prepared.declared,
    )  # fmt: skip


def export_module(loaded: LoadedModel, ask: ExportAsk) -> ExportResult:
    return _exported_on_examples(loaded, ask, _forward_argument_names(loaded.program), ("dynamo", "torchscript"))


def export_script(loaded: LoadedModel, ask: ExportAsk) -> ExportResult:
    return _exported_on_examples(loaded, ask, [], ("torchscript",), "TorchScript archives carry no input shapes")


def _exported_on_examples(
    loaded: LoadedModel, ask: ExportAsk, signature_names: list[str], exporters: tuple[str, ...], hint: str = ""
) -> ExportResult:
    """A torch module exported on example tensors (--input's, else the model's own), run once
    on them first; the dims --input names and --dynamic-batch's left dynamic."""
    args, names = example_arguments(loaded, ask.specs, signature_names, hint)
    dynamic = _dynamic_axes(args, ask.specs, ask.dynamic_batch)
    if dynamic:
        args = tuple(_at_least_two_along(t, axes) for t, axes in zip(args, dynamic))
    _check_runs_on(loaded, args, given=bool(ask.specs))
    model, exporter, tracer_warnings = torch_graph(loaded, args, names, ask.opset, dynamic, exporters)
    inferred = ir.infer_shapes(model, loaded.source)
    return ExportResult(
        inferred, graph_input_specs(model), exporter, tracer_warnings, reference=inferred,
        argument_names=list(names), declared=ir.declared_value_info(model),
    )  # fmt: skip


def torch_graph(loaded: LoadedModel, args: tuple, names: list[str], opset: int | None, dynamic, exporters):
    """(model, the exporter that wrote it, the tracer's warnings): the first of `exporters`
    (dynamo, torchscript) that exports the model, at `opset` (the default where None), which
    the model is checked to have."""
    opset = opset or exporter_default_opset()
    model, exporter, tracer_warnings = _run_exporter(loaded, args, names, opset, dynamic, exporters)
    written = ir.onnx_opset(model)
    if written != opset:
        raise ConvexportError(
            f"{loaded.source}: the {exporter} exporter wrote opset {written}, not the {opset} asked for; "
            f"give --opset {written} (or another it writes as asked)"
        )
    return model, exporter, tracer_warnings


def exporter_default_opset() -> int:
    """The opset the installed torch's ONNX exporters write when not told (20 on torch 2.13:
    Gelu is one op there, five below 20), within what the installed onnx knows; torch names it
    only in a private module, so an older or newer torch without it gets ir.DEFAULT_OPSET."""
    import torch.onnx._constants as torch_onnx_constants

    default = getattr(torch_onnx_constants, "ONNX_DEFAULT_OPSET", ir.DEFAULT_OPSET)
    return min(int(default), onnx.defs.onnx_opset_version())


def example_arguments(
    loaded: LoadedModel, specs: list[InputSpec], signature_names: list[str], hint: str = ""
) -> tuple[tuple, list[str]]:
    """Positional example tensors and their names, from --input or the model's own examples
    (named as the model's forward() names its arguments, where `signature_names` says)."""
    import torch

    if specs:
        generator = torch.Generator().manual_seed(0)
        args = tuple(
            torch.randn(spec.concrete_shape(), generator=generator).to(_torch_dtype(spec))
            if spec.numpy_dtype.kind == "f"
            else torch.zeros(spec.concrete_shape(), dtype=_torch_dtype(spec))
            for spec in specs
        )
        return args, [spec.name for spec in specs]
    if loaded.example_inputs is None:
        factory = ", or have the factory return (module, example_inputs)" if loaded.route.entries == "callable" else ""
        raise ConvexportError(
            f"{loaded.source}: {hint or 'no example inputs'}; pass --input NAME:DIMS (e.g. --input "
            f"x:1x3x224x224){factory}"
        )
    args = loaded.example_inputs
    names = loaded.input_names or signature_names
    if len(names) < len(args):
        names = [f"input_{i}" for i in range(len(args))]
    return args, list(names[: len(args)])


def _forward_argument_names(module) -> list[str]:
    try:
        parameters = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _torch_dtype(spec: InputSpec):
    import torch

    return getattr(torch, spec.dtype)


def _dynamic_axes(args: tuple, specs: list[InputSpec], dynamic_batch: bool) -> list[dict[int, str]] | None:
    """{axis: dim name} of each example argument that the export leaves dynamic: every dim
    --input names (`batch`, `seq`: one name is one size, across inputs), and with
    --dynamic-batch each first dim not named otherwise; None where there is none."""
    axes: list[dict[int, str]] = []
    for index, tensor in enumerate(args):
        spec = specs[index] if index < len(specs) else None
        named = {axis: dim for axis, dim in enumerate(spec.dims) if isinstance(dim, str)} if spec else {}
        if dynamic_batch and tensor.dim():
            named.setdefault(0, BATCH_DIM)
        axes.append(named)
    return axes if any(axes) else None


def _at_least_two_along(tensor, axes: dict[int, str]):
    """torch.export specialises a size-1 dim to a constant; trace each dynamic dim at 2 or more."""
    import torch

    for axis in axes:
        if axis < tensor.dim() and tensor.shape[axis] == 1:
            tensor = torch.cat([tensor, tensor], dim=axis)
    return tensor


def _check_runs_on(loaded: LoadedModel, args: tuple, given: bool) -> None:
    """Run the module once on the example inputs (`given` by --input, else the model's own):
    inputs of the wrong count, rank or dtype fail here with the model's own reason, where an
    exporter would fail deep in its passes (the TorchScript one with an internal error). (An
    exported program checks its inputs itself and is not run.)"""
    import torch

    try:
        with torch.no_grad(), quiet_libraries():
            loaded.program(*args)
    except Exception as exc:
        shapes = ", ".join(
            f"{'x'.join(map(str, tensor.shape)) or 'scalar'}:{str(tensor.dtype).removeprefix('torch.')}"
            for tensor in args
        )
        check = "--input's" if given else "the example inputs'"
        raise ConvexportError(
            f"{loaded.source}: the model does not run on the example inputs ({shapes}): {_run_failure(exc)}; "
            f"check {check} count, dims and dtypes against the model's forward()"
        ) from exc


def _run_failure(exc: BaseException) -> str:
    """The reason a module failed: a TorchScript interpreter's error ends with it, after the
    code it ran ("The following operation failed in the TorchScript interpreter. ...")."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if len(lines) > 1 and "TorchScript interpreter" in lines[0]:
        return first_line(Exception(lines[-1]))
    return f"{type(exc).__name__}: {first_line(exc)}"


def _run_exporter(loaded: LoadedModel, args: tuple, names: list[str], opset: int, dynamic, exporters):
    if exporters == ("torchscript",):
        try:
            model, tracer_warnings = _export_torchscript(loaded, args, names, opset, dynamic)
        except Exception as script_error:
            raise ConvexportError(
                f"{loaded.source}: ONNX export failed: {first_line(script_error)}{_returns_dict_advice(loaded)}"
            ) from script_error
        return model, "torchscript", tracer_warnings
    try:
        return _export_dynamo(loaded, args, names, opset, dynamic), "dynamo", []
    except ConvexportError:
        raise
    except Exception as dynamo_error:
        custom = _CUSTOM_OPERATOR.search(str(dynamo_error))
        if custom:  # the TorchScript exporter has no translation for it either
            raise ConvexportError(f"{loaded.source}: {_custom_operator_advice(custom[1])}") from dynamo_error
        if "torchscript" not in exporters:
            raise ConvexportError(
                f"{loaded.source}: ONNX export failed: {exporter_reason(dynamo_error)}"
            ) from dynamo_error
        try:
            model, tracer_warnings = _export_torchscript(loaded, args, names, opset, dynamic)
            return model, "torchscript", tracer_warnings
        except Exception as script_error:
            raise ConvexportError(
                f"{loaded.source}: ONNX export failed (torch.export: {exporter_reason(dynamo_error)}; "
                f"TorchScript: {first_line(script_error)})"
            ) from script_error


def _returns_dict_advice(loaded: LoadedModel) -> str:
    """What to do where a TorchScript archive fails to export. The TorchScript exporter has no
    translation for a dict of outputs (prim::DictConstruct), which a module traced with
    strict=False returns where its forward returned one (a transformers model's ModelOutput);
    and for any other failure an archive can only be exported as it was traced, where the
    module itself goes through torch.export."""
    returns = getattr(getattr(loaded.program, "forward", None), "schema", None)
    if returns is not None and any("Dict" in str(value.type) for value in returns.returns):
        return (
            "; the archive's forward returns a dict, which the TorchScript exporter cannot write: save one that "
            "returns a tuple (transformers: trace with torchscript=True), or give the module as file.py:factory"
        )
    if loaded.route.kind != "torchscript":
        return ""
    return (
        "; a TorchScript archive is exported as it was traced: save the module with torch.export instead "
        "(torch.export.save(torch.export.export(module, inputs), 'model.pt2')) or give it as file.py:factory"
    )


# the dynamo exporter's words for an operator it has no ONNX function for
# (an aten operator the dynamo exporter lacks, the TorchScript exporter may have: not custom)
_CUSTOM_OPERATOR = re.compile(r"No ONNX function found for <OpOverload\(op='((?!aten\.|prims\.)[\w.]+)'")


def _custom_operator_advice(operator: str) -> str:
    return (
        f"the model calls the custom operator {operator}, which torch's ONNX exporter has no translation for; "
        f"export it with torch.onnx.export(..., custom_translation_table={{torch.ops.{operator}.default: "
        "an onnxscript function}) and optimize that .onnx (with --custom-ops-library if the function calls an "
        "operator of ONNX Runtime's custom-op library)"
    )


def exporter_reason(exc: BaseException) -> str:
    """What went wrong, in one line: the dynamo exporter's first line is the same advice for
    every failure (step 3/3 ...), its reason stands under "## Exception summary"."""
    text = str(exc)
    if "## Exception summary" in text:
        summary = [line.strip() for line in text.split("## Exception summary", 1)[1].splitlines() if line.strip()]
        if summary:
            return first_line(Exception(re.sub(r"^<class '[\w.]+'>: ", "", summary[0])))
    return first_line(exc)


def _export_dynamo(loaded: LoadedModel, args: tuple, names: list[str], opset: int, dynamic) -> onnx.ModelProto:
    """`dynamic`: _dynamic_axes's, a torch.export.Dim per dim name (shared by the inputs that
    name it), or None."""
    import torch

    dynamic_shapes = None
    if dynamic:
        dims = {name: torch.export.Dim(name) for axes in dynamic for name in axes.values()}
        dynamic_shapes = tuple({axis: dims[name] for axis, name in axes.items()} or None for axes in dynamic)
    with quiet_libraries():
        program = torch.onnx.export(
            loaded.program,
            args,
            dynamo=True,
            opset_version=opset,
            input_names=names,
            dynamic_shapes=dynamic_shapes,
            verbose=False,
            optimize=True,
        )
    assert program is not None, "torch.onnx.export(dynamo=True) returns its ONNXProgram"
    return program.model_proto


def _export_torchscript(
    loaded: LoadedModel, args: tuple, names: list[str], opset: int, dynamic
) -> tuple[onnx.ModelProto, list[str]]:
    """The model and the tracer's warnings (each once): a module that is traced, not scripted,
    runs once on `args`, and where its Python code branched on a tensor's value the graph holds
    only the branch taken, which the tracer warns about and nothing else would notice."""
    import torch

    buffer = io.BytesIO()
    dynamic_axes = {name: axes for name, axes in zip(names, dynamic) if axes} if dynamic else None
    with quiet_libraries() as caught:
        torch.onnx.export(
            loaded.program,
            args,
            buffer,  # type: ignore[arg-type]  # the TorchScript exporter writes to a file object too
            dynamo=False,
            opset_version=opset,
            input_names=names,
            dynamic_axes=dynamic_axes,
            do_constant_folding=True,
        )
    tracer = [first_line(w.message) for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
    return onnx.load_from_string(buffer.getvalue()), list(dict.fromkeys(tracer))
