"""The load stage: the MODEL argument (a path or MODEL string, an onnx.ModelProto, an nn.Module)
loaded by its route (convexport/load/routes/), where its output goes, checked against every
file it was read from; then the loaded model as the ONNX graph the rewrite starts from, and the
torch model's own float64 run, where it is to be the exact result validation judges by."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path

from onnx import TensorProto

from ..errors import ConvexportError
from ..ir.saving import is_weights_file_of
from ..load.export import ExportResult, export_model
from ..load.float32_twin import float32_twin, holds_float16_weights, why_not_twinned
from ..load.model import LoadedModel
from ..load.routes import load_model, model_suffixes
from ..util.files import check_paths
from ..validate.exact_check import FLOAT64_WEIGHT_BYTES
from ..validate.torch_reference import torch_float64
from .request import TYPE_FLAGS, Request, check_interface


def loaded_model(model, trust_pickle: bool, examples: tuple | None = None) -> LoadedModel:
    """MODEL loaded by its route (convexport/load/routes/); `examples`, example tensors given instead
    of --input, are what a torch model is exported on."""
    loaded = load_model(model, trust_pickle)
    if examples is not None:
        if not loaded.route.takes_examples:
            raise ConvexportError(
                f"{loaded.source}: example tensors are for a torch module; give a "
                f"{loaded.route.kind.replace('_', ' ')} input specs (NAME:DIMS) instead, and real data as "
                "input_data=DATA.npz"
            )
        loaded.example_inputs = examples
    return loaded


def destination(loaded: LoadedModel, output: str | Path | None, others=()) -> Path:
    """Where the model goes: checked, with its weights file and the `others` outputs, against
    every file the model was read from and against each other, before any work."""
    written = Path(output) if output is not None else loaded.default_output
    check_paths(loaded.files, [("-o", written), *others])
    if output is None:
        loaded.notes.extend(_shared_default_output(loaded, written))
    real = Path(os.path.realpath(written))
    for option, path in others:  # a report named as OUT's weights file would be taken for one and removed
        if path is None or str(path) == "-":
            continue
        other = Path(os.path.realpath(path))
        if other.parent == real.parent and is_weights_file_of(other.name, real.name):
            raise ConvexportError(
                f"{option} {path}: is where {written}'s weights go when they need a file of their own; "
                "give each output its own file"
            )
    return written


def _shared_default_output(loaded: LoadedModel, written: Path) -> list[str]:
    """A note where the default output, already there, is also another model's of this folder
    (net.pt and net.pt2 both write net.opt.onnx): the run replaces what that one wrote."""
    if not written.exists() or not loaded.files:
        return []
    given = loaded.files[0]
    stem = written.name.removesuffix(".opt.onnx")
    others = sorted(
        path.name
        for path in written.parent.glob(f"{glob.escape(stem)}.*")
        if path.stem == stem and path.suffix in model_suffixes() and path.resolve() != given.resolve()
    )
    if not others:
        return []
    return [f"{written} was replaced; {', '.join(others)} in the same folder writes it too (give -o to keep both)"]


@dataclass
class Exported:
    graph: ExportResult
    torch_source: object | None  # the torch model's float64 copy (None: not validated, or no torch model)


def exported(loaded: LoadedModel, request: Request) -> Exported:
    options = request.options
    graph = export_model(loaded, request.specs, options.opset, options.dynamic_batch, options.freeze_input_defaults)
    in_its_precision(graph, request)
    # a torch model's own float64 run, the exact result where the export computes the same: its
    # float64 copy made now, before the module goes
    torch_source = None
    if options.validate:
        torch_source = torch_float64(loaded, graph.argument_names, graph.reference, FLOAT64_WEIGHT_BYTES)
    # the loaded model's weights live on in the exported models; its own copy is not needed any
    # more (where shape inference gave a new model, a large one's weights were held twice)
    loaded.onnx_model = loaded.program = None
    return Exported(graph, torch_source)


def in_its_precision(graph: ExportResult, request: Request) -> None:
    """request.dtype and io_dtype where not given: the model's own. A model of float16 weights
    is rewritten as its float32 twin (load/float32_twin.py) and written in float16 again, or in the
    type asked; where it cannot be twinned, its folds are rounded into float16 by the rewrite."""
    if not holds_float16_weights(graph.model):
        request.dtype = request.dtype or "float32"
        request.io_dtype = request.io_dtype or "float32"
        check_interface(request.dtype, request.io_dtype)
        return
    interface = "float16" if _float16_interface(graph.model) else "float32"
    if request.io_dtype not in (None, "float16") and interface == "float16":
        raise ConvexportError(
            f"--io-dtype {TYPE_FLAGS[request.io_dtype]}: the model's inputs and outputs are float16, and convexport "
            "keeps a model's interface"
        )
    reason = why_not_twinned(graph.model)
    if reason is not None:
        if request.dtype not in (None, "float16"):
            raise ConvexportError(
                f"--dtype {TYPE_FLAGS[request.dtype]}: the model's weights are float16 and are not read in float32 "
                f"here ({reason})"
            )
        # no conversion after the rewrite: its folds are stored in float16 as they are made
        request.dtype, request.io_dtype = "float32", request.io_dtype or interface
        graph.conversions.append(f"float16 weights folded in float64, rounded into float16 by the rewrite ({reason})")
        return
    request.dtype = request.dtype or "float16"
    if request.io_dtype is None and request.dtype == "bfloat16" and interface == "float16":
        raise ConvexportError(
            f"--dtype {TYPE_FLAGS[request.dtype]}: the model's inputs and outputs are float16, which a "
            f"{TYPE_FLAGS[request.dtype]} model keeps only as fp32; give --io-dtype fp32 as well to change them"
        )
    request.io_dtype = request.io_dtype or interface
    if request.dtype != "float32":
        check_interface(request.dtype, request.io_dtype)
    graph.model = float32_twin(graph.model)
    graph.conversions.append(
        f"float16 weights read in float32 (the same values), rewritten so and written in {request.dtype} again"
        if request.dtype != "float32"
        else "float16 weights read in float32 (the same values) and written so (--dtype fp32)"
    )


def _float16_interface(model) -> bool:
    """Whether each float input and output of the model is float16 (and it has one)."""
    floats = [
        value.type.tensor_type.elem_type
        for value in (*model.graph.input, *model.graph.output)
        if value.type.tensor_type.elem_type in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE)
    ]
    return bool(floats) and all(kind == TensorProto.FLOAT16 for kind in floats)
