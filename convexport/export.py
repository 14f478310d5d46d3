"""torch program -> onnx.ModelProto, and the input specs of the exported graph.

Exporter per kind:
  nn.Module         torch.export + the dynamo ONNX exporter (falls back to the TorchScript
                    exporter when torch.export cannot trace the module)
  ExportedProgram   the dynamo ONNX exporter
  ScriptModule      the TorchScript ONNX exporter (the only one that takes a ScriptModule)
The default opset is 18: the lowest the dynamo exporter emits natively, supported by every
ONNX Runtime >= 1.14, and the one the built-in rules are tested at.
"""

from __future__ import annotations

import inspect
import io
import re
from dataclasses import dataclass, field

import onnx

from . import ir
from .errors import ConvexportError, first_line
from .inputs import InputSpec
from .loading import LoadedModel, ProgramInput
from .onnx_route import BATCH_DIM, MIN_OPSET, graph_input_specs, prepare_onnx
from .quiet import quiet_libraries


@dataclass
class ExportResult:
    """`model` is what the rewrite starts from; `reference` what it is validated against and
    measured beside: the same model, except for an ONNX model that had to be converted
    (onnx_route.py, listed in `conversions`)."""

    model: onnx.ModelProto
    inputs: list[InputSpec]  # one per graph input, in order; dynamic dims by name
    exporter: str  # onnx (no export) | dynamo | torchscript
    warnings: list[str] = field(default_factory=list)  # the TorchScript tracer's, when it traced
    reference: onnx.ModelProto | None = None  # None: the model itself
    conversions: list[str] = field(default_factory=list)
    input_changes: list[str] = field(default_factory=list)  # fixed dims of an ONNX model --input changed
    argument_names: list[str] = field(default_factory=list)  # a torch source's, in the order it was called with

    def __post_init__(self):
        if self.reference is None:
            self.reference = self.model


def export_model(
    loaded: LoadedModel,
    input_specs: list[InputSpec] | None = None,
    opset: int | None = None,
    dynamic_batch: bool = False,
    freeze_input_defaults: bool = False,
) -> ExportResult:
    """Export (or, for ONNX, take) the model and return it shape-inferred with its inputs. An
    ONNX model given as it is and already fully shaped is returned itself, not a copy: nothing
    after this writes to it (the rewrite, validation and profiling only read it).
    `freeze_input_defaults`: an ONNX model's initializers that are also listed as inputs (old
    exports with keep_initializers_as_inputs) leave the inputs and become the constants they
    were meant to be (graph.overridable_initializers)."""
    input_specs = list(input_specs or [])
    if opset is not None and not MIN_OPSET <= opset <= onnx.defs.onnx_opset_version():
        raise ConvexportError(
            f"--opset {opset}: convexport exports at opsets {MIN_OPSET} to {onnx.defs.onnx_opset_version()} "
            f"(the newest the installed onnx {onnx.__version__} knows)"
        )
    if loaded.kind == "onnx":
        reference, model, conversions, changed = prepare_onnx(
            loaded.onnx_model, loaded.source, input_specs, dynamic_batch, freeze_input_defaults
        )
        return ExportResult(
            model, graph_input_specs(model), "onnx", reference=reference, conversions=conversions, input_changes=changed
        )
    if loaded.kind == "exported_program":
        args, names, input_specs = _program_arguments(loaded, input_specs, dynamic_batch)
        dynamic = False  # the program's dims are its own: torch.onnx.export takes no dynamic_shapes for it
    else:
        args, names = _example_arguments(loaded, input_specs)
        dynamic = _dynamic_axes(args, input_specs, dynamic_batch)
    if dynamic:
        args = tuple(_at_least_two_along(t, axes) for t, axes in zip(args, dynamic))
    opset = opset or exporter_default_opset()
    model, exporter, tracer_warnings = _run_exporter(loaded, args, names, opset, dynamic)
    written = ir.onnx_opset(model)
    if written != opset:
        raise ConvexportError(
            f"{loaded.source}: the {exporter} exporter wrote opset {written}, not the {opset} asked for; "
            f"give --opset {written} (or another it writes as asked)"
        )
    if loaded.kind == "exported_program":
        _name_torch_symbols(model, input_specs)
    return ExportResult(
        ir.infer_shapes(model, loaded.source), graph_input_specs(model), exporter, tracer_warnings,
        argument_names=list(names),
    )  # fmt: skip


def exporter_default_opset() -> int:
    """The opset the installed torch's ONNX exporters write when not told (20 on torch 2.13:
    Gelu is one op there, five below 20), within what the installed onnx knows; torch names it
    only in a private module, so an older or newer torch without it gets ir.DEFAULT_OPSET."""
    import torch.onnx._constants as torch_onnx_constants

    default = getattr(torch_onnx_constants, "ONNX_DEFAULT_OPSET", ir.DEFAULT_OPSET)
    return min(int(default), onnx.defs.onnx_opset_version())


def _program_arguments(
    loaded: LoadedModel, specs: list[InputSpec], dynamic_batch: bool
) -> tuple[tuple, list[str], list[InputSpec]]:
    """An exported program's example tensors, its inputs' names (--input's where given) and
    --input's specs in the order of its inputs, checked against them. torch.onnx.export does not
    trace a program again: the examples only have to exist, and --input or --dynamic-batch can
    only describe the dims the program has, or name those it leaves dynamic."""
    if loaded.example_inputs is None:  # inputs without the fake tensors that give their shapes
        args, names = _example_arguments(loaded, specs)
        return args, names, specs
    paired = _paired_with_program(loaded, specs)
    _check_program_dynamic_batch(loaded, dynamic_batch)
    return loaded.example_inputs, [spec.name for spec in paired] or list(loaded.input_names), paired


def _paired_with_program(loaded: LoadedModel, specs: list[InputSpec]) -> list[InputSpec]:
    """--input's specs, one per program input in its order, each checked against that input:
    by name where every spec names one (an input left out stands as its name with no dims),
    else by position, where the spec's name renames the ONNX input as it does for a module.
    [] when no --input was given."""
    if not specs:
        return []
    declared = loaded.program_inputs
    if all(spec.name in {value.name for value in declared} for spec in specs):
        given = {spec.name: spec for spec in specs}
        paired = [given.get(value.name) for value in declared]
    elif len(specs) == len(declared):
        paired = list(specs)
    else:
        raise ConvexportError(
            f"--input: {loaded.source} takes {len(declared)} tensor input(s) "
            f"({', '.join(value.name for value in declared) or 'none'}), not {len(specs)}"
        )
    for spec, value in zip(paired, declared):
        if spec is not None:
            _check_against_program(loaded.source, spec, value)
    return [spec or InputSpec(value.name, ()) for spec, value in zip(paired, declared)]


def _check_against_program(source: str, spec: InputSpec, value: ProgramInput) -> None:
    """A ConvexportError unless `spec` fits the program input `value`: its dtype, its rank, its
    static dims as they are, a concrete size for a dynamic dim within the dim's range."""
    if spec.dtype_given and spec.dtype != value.dtype:
        raise ConvexportError(
            f"--input {spec}: {source} input {value.name!r} is {value.dtype}; a torch.export program's input "
            "types are fixed when it is exported (leave the type out, or give that one)"
        )
    if len(spec.dims) != len(value.dims):
        raise ConvexportError(
            f"--input {spec}: {source} input {value.name!r} has rank {len(value.dims)}, not {len(spec.dims)}"
        )
    for axis, (given, declared) in enumerate(zip(spec.dims, value.dims)):
        if isinstance(declared, int) and given != declared:
            raise ConvexportError(
                f"--input {spec}: {source} input {value.name!r} has dim {axis} of {declared}; a torch.export "
                "program's dims are fixed when it is exported (export it with dynamic_shapes, or give the "
                "module's factory)"
            )
        if isinstance(given, int) and not isinstance(declared, int) and not declared.admits(given):
            raise ConvexportError(
                f"--input {spec}: {source} input {value.name!r} allows dim {axis} only in "
                f"[{declared.lower}, {'inf' if declared.upper is None else declared.upper}]"
            )


def _check_program_dynamic_batch(loaded: LoadedModel, dynamic_batch: bool) -> None:
    """--dynamic-batch on an exported program is met where every input's first dim is already
    dynamic, and refused where one is static: the program cannot be changed."""
    if not dynamic_batch:
        return
    for value in loaded.program_inputs:
        if value.dims and isinstance(value.dims[0], int):
            raise ConvexportError(
                f"{loaded.source}: input {value.name!r} has a static batch of {value.dims[0]}; a torch.export "
                "program's dims are fixed when it is exported, so --dynamic-batch cannot change them (export it "
                "with dynamic_shapes={...: {0: torch.export.Dim('batch')}}, or give the module's factory)"
            )


# torch's names for the sizes an exported program leaves dynamic (s0, s77): an artefact of the
# trace, different from one torch version or model to the next.
_TORCH_SYMBOL = re.compile(r"^s\d+$")
_DIM_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _name_torch_symbols(model: onnx.ModelProto, specs: list[InputSpec]) -> None:
    """Give the dynamic dims torch named by symbol stable, readable names, the same one
    wherever a symbol appears (inputs, outputs, value_info, in expressions such as 2*s77)."""
    names = _symbol_names(model, specs)
    if not names:
        return
    for graph in ir.proto_scopes(model.graph):
        for value in [*graph.input, *graph.output, *graph.value_info]:
            _rename_dims(value.type, names)


def _symbol_names(model: onnx.ModelProto, specs: list[InputSpec]) -> dict[str, str]:
    """{torch symbol: name} for the symbols that are whole dims of the graph's inputs: the
    name --input gave that dim, else "batch" for a first dim, else INPUT_dimAXIS; a name
    already used (by another symbol, or a dim that is no symbol) gets the INPUT_dimAXIS form,
    then a number: two symbols are two sizes torch found independent."""
    given = {spec.name: spec.dims for spec in specs}
    initializers = {init.name for init in model.graph.initializer}
    inputs = [value for value in model.graph.input if value.name not in initializers]
    taken = {
        dim.dim_param
        for graph in ir.proto_scopes(model.graph)
        for value in [*graph.input, *graph.output, *graph.value_info]
        for dim in value.type.tensor_type.shape.dim
        if dim.dim_param and not _TORCH_SYMBOL.match(dim.dim_param)
    }
    names: dict[str, str] = {}
    for value in inputs:
        dims_given = given.get(value.name, ())
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            symbol = dim.dim_param
            if not _TORCH_SYMBOL.match(symbol) or symbol in names:
                continue
            named = dims_given[axis] if axis < len(dims_given) and isinstance(dims_given[axis], str) else None
            fallback = f"{value.name}_dim{axis}"
            names[symbol] = _unused_name([named or (BATCH_DIM if axis == 0 else fallback), fallback], taken)
            taken.add(names[symbol])
    return names


def _unused_name(wanted: list[str], taken: set[str]) -> str:
    """The first of `wanted` not taken, else the last with the first free number after it."""
    for name in wanted:
        if name not in taken:
            return name
    number = 2
    while f"{wanted[-1]}_{number}" in taken:
        number += 1
    return f"{wanted[-1]}_{number}"


def _rename_dims(value_type: onnx.TypeProto, names: dict[str, str]) -> None:
    """Rename the symbols in every dim_param of a type (a tensor's, or the element type of a
    sequence, an optional or a map's values), inside expressions too."""
    kind = value_type.WhichOneof("value")
    if kind == "tensor_type":
        for dim in value_type.tensor_type.shape.dim:
            if dim.dim_param:
                dim.dim_param = _DIM_TOKEN.sub(lambda token: names.get(token[0], token[0]), dim.dim_param)
    elif kind in ("sequence_type", "optional_type"):
        _rename_dims(getattr(value_type, kind).elem_type, names)
    elif kind == "map_type":
        _rename_dims(value_type.map_type.value_type, names)


def _example_arguments(loaded: LoadedModel, specs: list[InputSpec]) -> tuple[tuple, list[str]]:
    """Positional example tensors and their names, from --input or the model's own examples."""
    import torch

    signature_names = _forward_argument_names(loaded)
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
        hint = "TorchScript archives carry no input shapes" if loaded.kind == "torchscript" else "no example inputs"
        raise ConvexportError(
            f"{loaded.source}: {hint}; pass --input NAME:DIMS (e.g. --input x:1x3x224x224), or have "
            "the factory return (module, example_inputs)"
        )
    args = loaded.example_inputs
    names = loaded.input_names or signature_names
    if len(names) < len(args):
        names = [f"input_{i}" for i in range(len(args))]
    return args, list(names[: len(args)])


def _forward_argument_names(loaded: LoadedModel) -> list[str]:
    if loaded.kind != "module":
        return []
    try:
        parameters = inspect.signature(loaded.program.forward).parameters.values()
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


def _check_runs_on(loaded: LoadedModel, args: tuple) -> None:
    """Run the module once on the example inputs: inputs of the wrong count, rank or dtype
    fail here with the model's own reason, where an exporter would fail deep in its passes
    (the TorchScript one with an internal error). An exported program checks its inputs
    itself and is not run."""
    import torch

    if loaded.kind not in ("module", "torchscript"):
        return
    try:
        with torch.no_grad(), quiet_libraries():
            loaded.program(*args)
    except Exception as exc:
        shapes = ", ".join(
            f"{'x'.join(map(str, tensor.shape)) or 'scalar'}:{str(tensor.dtype).removeprefix('torch.')}"
            for tensor in args
        )
        raise ConvexportError(
            f"{loaded.source}: the model does not run on the example inputs ({shapes}): {_run_failure(exc)}; "
            "check --input's count, dims and dtypes against the model's forward()"
        ) from exc


def _run_failure(exc: BaseException) -> str:
    """The reason a module failed: a TorchScript interpreter's error ends with it, after the
    code it ran ("The following operation failed in the TorchScript interpreter. ...")."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if len(lines) > 1 and "TorchScript interpreter" in lines[0]:
        return first_line(Exception(lines[-1]))
    return f"{type(exc).__name__}: {first_line(exc)}"


def _run_exporter(loaded: LoadedModel, args: tuple, names: list[str], opset: int, dynamic):
    import torch

    _check_runs_on(loaded, args)
    if loaded.kind == "torchscript":
        model, tracer_warnings = _export_torchscript(loaded, args, names, opset, dynamic)
        return model, "torchscript", tracer_warnings
    try:
        return _export_dynamo(loaded, args, names, opset, dynamic), "dynamo", []
    except ConvexportError:
        raise
    except Exception as dynamo_error:
        custom = _CUSTOM_OPERATOR.search(str(dynamo_error))
        if custom:  # the TorchScript exporter has no translation for it either
            raise ConvexportError(f"{loaded.source}: {_custom_operator_advice(custom[1])}") from dynamo_error
        if loaded.kind != "module" or isinstance(loaded.program, torch.export.ExportedProgram):
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
            buffer,
            dynamo=False,
            opset_version=opset,
            input_names=names,
            dynamic_axes=dynamic_axes,
            do_constant_folding=True,
        )
    tracer = [first_line(w.message) for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
    return onnx.load_from_string(buffer.getvalue()), list(dict.fromkeys(tracer))
