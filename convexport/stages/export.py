"""Stage 2: the loaded model as the ONNX graph the rewrite starts from, and the torch model's
own float64 run, where it is to be the exact result validation judges by."""

from __future__ import annotations

from dataclasses import dataclass

from ..exact_check import FLOAT64_WEIGHT_BYTES
from ..export import ExportResult, export_model
from ..loading import LoadedModel
from ..torch_reference import torch_float64
from .request import Request


@dataclass
class Exported:
    graph: ExportResult
    torch_source: object | None  # the torch model's float64 copy (None: not validated, or no torch model)


def exported(loaded: LoadedModel, request: Request) -> Exported:
    options = request.options
    graph = export_model(loaded, request.specs, options.opset, options.dynamic_batch, options.freeze_input_defaults)
    # a torch model's own float64 run, the exact result where the export computes the same: its
    # float64 copy made now, before the module goes
    torch_source = None
    if options.validate:
        torch_source = torch_float64(loaded, graph.argument_names, graph.reference, FLOAT64_WEIGHT_BYTES)
    # the loaded model's weights live on in the exported models; its own copy is not needed any
    # more (where shape inference gave a new model, a large one's weights were held twice)
    loaded.onnx_model = loaded.program = None
    return Exported(graph, torch_source)
