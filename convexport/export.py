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
from dataclasses import dataclass, field

import numpy as np
import onnx

from . import ir
from .errors import ConvexportError, first_line
from .inputs import DTYPES, InputSpec
from .loading import LoadedModel
from .quiet import quiet_libraries

MIN_OPSET = 13
_BATCH_DIM = "batch"


@dataclass
class ExportResult:
    model: onnx.ModelProto
    inputs: list[InputSpec]  # one per graph input, in order; dynamic dims by name
    exporter: str  # onnx (no export) | dynamo | torchscript
    warnings: list[str] = field(default_factory=list)  # the TorchScript tracer's, when it traced


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
        model_opset = ir.onnx_opset(loaded.onnx_model) or 0
        if model_opset < MIN_OPSET:
            raise ConvexportError(
                f"{loaded.source}: opset {model_opset} is below the supported {MIN_OPSET}; "
                "convert it first (onnx.version_converter.convert_version(model, 18))"
            )
        as_given = not (input_specs or dynamic_batch or freeze_input_defaults)
        if as_given and ir.fully_shaped(loaded.onnx_model):  # nothing to edit, nothing to infer: the
            return ExportResult(loaded.onnx_model, graph_input_specs(loaded.onnx_model), "onnx")  # model itself
        model = onnx.ModelProto()
        model.CopyFrom(loaded.onnx_model)
        if freeze_input_defaults:
            defaults = {init.name for init in model.graph.initializer}
            kept = [value for value in model.graph.input if value.name not in defaults]
            del model.graph.input[:]
            model.graph.input.extend(kept)
        _apply_input_specs(model, input_specs, dynamic_batch, loaded.source)
        if input_specs or dynamic_batch:  # the shapes the model declares were those of the old inputs
            _forget_inferred_shapes(model)
        return ExportResult(ir.infer_shapes(model, loaded.source), graph_input_specs(model), "onnx")
    if loaded.kind == "exported_program" and (dynamic_batch or any(spec.is_dynamic for spec in input_specs)):
        raise ConvexportError(
            f"{loaded.source}: a torch.export program's dims are fixed when it is exported; --dynamic-batch and "
            "dynamic --input dims cannot change them (export it with dynamic_shapes, or give the module's factory)"
        )
    args, names = _example_arguments(loaded, input_specs)
    dynamic = dynamic_batch or any(spec.is_dynamic for spec in input_specs)
    if dynamic:
        args = tuple(_at_least_two_in_batch(t) for t in args)
    opset = opset or ir.DEFAULT_OPSET
    model, exporter, tracer_warnings = _run_exporter(loaded, args, names, opset, dynamic)
    written = ir.onnx_opset(model)
    if written != opset:
        raise ConvexportError(
            f"{loaded.source}: the {exporter} exporter wrote opset {written}, not the {opset} asked for; "
            f"give --opset {written} (or another it writes as asked)"
        )
    return ExportResult(ir.infer_shapes(model, loaded.source), graph_input_specs(model), exporter, tracer_warnings)


def graph_input_specs(model: onnx.ModelProto) -> list[InputSpec]:
    """The graph's real inputs (not initializers) as InputSpecs."""
    initializers = {init.name for init in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        dims = tuple(
            d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or f"{value.name}_{i}")
            for i, d in enumerate(tensor_type.shape.dim)
        )
        specs.append(InputSpec(value.name, dims, _dtype_name(value.type)))
    return specs


def _dtype_name(value_type: onnx.TypeProto) -> str:
    """The numpy name of a tensor's element type where convexport makes data of it (float32,
    int64, ...), else the ONNX name (string, float8e4m3fn; sequence_type for a non-tensor)."""
    if value_type.WhichOneof("value") != "tensor_type":
        return value_type.WhichOneof("value") or "undefined"
    element = value_type.tensor_type.elem_type
    name = onnx.TensorProto.DataType.Name(element).lower()
    if element == onnx.TensorProto.STRING:
        return name
    numpy_name = str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(element)))
    return numpy_name if numpy_name in DTYPES else name


def _forget_inferred_shapes(model: onnx.ModelProto) -> None:
    """Drop the main graph's value_info and its outputs' shapes (their element types stay), so
    that shape inference derives them from the inputs as they now are; a subgraph's are its own."""
    del model.graph.value_info[:]
    for value in model.graph.output:
        if value.type.HasField("tensor_type"):
            value.type.tensor_type.ClearField("shape")


def _apply_input_specs(model: onnx.ModelProto, specs: list[InputSpec], dynamic_batch: bool, source: str) -> None:
    """--input on an ONNX model fixes (or names) the dims of its inputs."""
    by_name = {value.name: value for value in model.graph.input}
    for spec in specs:
        if spec.name not in by_name:
            raise ConvexportError(
                f"--input {spec.name}: {source} has no input {spec.name!r} (inputs: {', '.join(by_name)})"
            )
        declared = _dtype_name(by_name[spec.name].type)
        if spec.dtype_given and declared != spec.dtype:
            raise ConvexportError(
                f"--input {spec}: {source} input {spec.name!r} is {declared}; an ONNX model's input type is "
                "its own (leave the type out, or give that one)"
            )
        shape = by_name[spec.name].type.tensor_type.shape
        if len(shape.dim) != len(spec.dims):
            raise ConvexportError(
                f"--input {spec}: {source} input {spec.name!r} has rank {len(shape.dim)}, not {len(spec.dims)}"
            )
        for dim, value in zip(shape.dim, spec.dims):
            if isinstance(value, int):
                dim.dim_value = value
            else:
                dim.dim_param = value
    if dynamic_batch:
        defaults = {init.name for init in model.graph.initializer}  # an input with a default is a weight
        for value in model.graph.input:
            if value.name in defaults:
                continue
            dims = value.type.tensor_type.shape.dim
            if dims:
                dims[0].dim_param = _BATCH_DIM


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


def _at_least_two_in_batch(tensor):
    """torch.export specialises a size-1 dim to a constant; trace dynamic batches at 2."""
    import torch

    if tensor.dim() and tensor.shape[0] == 1:
        return torch.cat([tensor, tensor])
    return tensor


def _run_exporter(loaded: LoadedModel, args: tuple, names: list[str], opset: int, dynamic: bool):
    import torch

    if loaded.kind == "torchscript":
        model, tracer_warnings = _export_torchscript(loaded, args, names, opset, dynamic)
        return model, "torchscript", tracer_warnings
    try:
        return _export_dynamo(loaded, args, names, opset, dynamic), "dynamo", []
    except ConvexportError:
        raise
    except Exception as dynamo_error:
        if loaded.kind != "module" or isinstance(loaded.program, torch.export.ExportedProgram):
            raise ConvexportError(f"{loaded.source}: ONNX export failed: {first_line(dynamo_error)}") from dynamo_error
        try:
            model, tracer_warnings = _export_torchscript(loaded, args, names, opset, dynamic)
            return model, "torchscript", tracer_warnings
        except Exception as script_error:
            raise ConvexportError(
                f"{loaded.source}: ONNX export failed (torch.export: {first_line(dynamo_error)}; "
                f"TorchScript: {first_line(script_error)})"
            ) from script_error


def _export_dynamo(loaded: LoadedModel, args: tuple, names: list[str], opset: int, dynamic: bool) -> onnx.ModelProto:
    import torch

    dynamic_shapes = None
    if dynamic:
        batch = torch.export.Dim(_BATCH_DIM)
        dynamic_shapes = tuple({0: batch} if t.dim() else None for t in args)
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
    loaded: LoadedModel, args: tuple, names: list[str], opset: int, dynamic: bool
) -> tuple[onnx.ModelProto, list[str]]:
    """The model and the tracer's warnings (each once): a module that is traced, not scripted,
    runs once on `args`, and where its Python code branched on a tensor's value the graph holds
    only the branch taken, which the tracer warns about and nothing else would notice."""
    import torch

    buffer = io.BytesIO()
    dynamic_axes = {name: {0: _BATCH_DIM} for name, t in zip(names, args) if t.dim()} if dynamic else None
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
