"""An ONNX model given as MODEL, made ready for the rewrite, and the model it is validated against.

Two models come out of `prepare_onnx`:
  reference  the model as given, with only what the user asked for applied (--input dims,
             --dynamic-batch, --freeze-input-defaults) and dims ONNX forbids (negative ones,
             as old tools wrote dynamic dims) made unknown: validation, the "before" numbers
             and the profile's baseline are of it;
  model      the reference brought up to what the rules are written for: an opset below
             MIN_OPSET converted by onnx's version converter to DEFAULT_OPSET, and an IR
             version below 4 raised, its initializers taken out of the graph inputs (IR 3
             required every initializer to be listed as an input; that listing is the
             format's rule, not a caller's wish to override the weights).
Each conversion is a line in `conversions`, for the report. Where nothing changes, both are
the model given itself (no copy: nothing after this writes to them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import version_converter

from .. import ir
from ..errors import ConvexportError, first_line
from .input_domains import integer_domains
from .inputs import DTYPES, InputSpec

MIN_OPSET = 13  # the oldest opset the rules are written for; older models are converted
BATCH_DIM = "batch"
# IR version 4 made an initializer listed as a graph input an overridable default
FIRST_IR_WITH_DEFAULTS = 4
# PRelu's slope broadcasts numpy's way from opset 7 on; before, a 1-D slope was per channel
FIRST_PRELU_WITH_NUMPY_BROADCAST = 7


@dataclass
class Prepared:
    reference: onnx.ModelProto
    model: onnx.ModelProto
    conversions: list[str]
    input_changes: list[str]  # the fixed dims --input changed, in words
    declared: tuple[onnx.ValueInfoProto, ...]  # the reference's value_info before shape inference


def prepare_onnx(
    given: onnx.ModelProto, source: str, specs: list[InputSpec], dynamic_batch: bool, freeze_input_defaults: bool
) -> Prepared:
    """The reference and the model of the module doc, and what was done to make them."""
    reference, changed = given, []
    edits = bool(specs or dynamic_batch or freeze_input_defaults) or _has_negative_dims(given)
    if edits:
        reference = _copy(given)
        if freeze_input_defaults:
            _drop_initializers_from_inputs(reference)
        _forget_negative_dims(reference)
        changed = _apply_input_specs(reference, specs, dynamic_batch, source)
        if specs or dynamic_batch:  # the shapes the model declares were those of the old inputs
            _forget_inferred_shapes(reference)
    declared = ir.declared_value_info(reference)
    if edits or not ir.fully_shaped(reference):
        # inference writes a size where the exporter named an output's dim (ViT's sequence,
        # fixed by its position table): the outputs keep the names, but where --input changed
        # the inputs they are computed from
        same_outputs = not (specs or dynamic_batch)
        reference = ir.carry_dim_names(ir.infer_shapes(reference, source), given, same_outputs=same_outputs)
    model, conversions = _brought_up_to_date(reference, source)
    return Prepared(reference, model, conversions, changed, declared)


def _brought_up_to_date(reference: onnx.ModelProto, source: str) -> tuple[onnx.ModelProto, list[str]]:
    opset = ir.onnx_opset(reference) or ir.DEFAULT_OPSET
    old_ir = reference.ir_version < FIRST_IR_WITH_DEFAULTS
    if opset >= MIN_OPSET and not old_ir:
        return reference, []
    model, conversions = reference, []
    if opset < MIN_OPSET:  # first: the converter reads an IR 3 model's weights from its inputs
        try:
            model = version_converter.convert_version(model, ir.DEFAULT_OPSET)
        except Exception as exc:  # the converter raises RuntimeError, ValueError, its own errors
            raise ConvexportError(
                f"{source}: opset {opset} is below {MIN_OPSET} and onnx's version converter cannot bring it to "
                f"{ir.DEFAULT_OPSET} ({first_line(exc)}); convert it with a tool that can"
            ) from None
        conversions.append(f"opset {opset} -> {ir.DEFAULT_OPSET} (onnx's version converter)")
        if opset < FIRST_PRELU_WITH_NUMPY_BROADCAST:
            _per_channel_prelu_slopes(model, reference)
    else:
        model = _copy(reference)
    if old_ir:
        weights = _drop_initializers_from_inputs(model)
        conversions.append(
            f"IR version {reference.ir_version}: its {weights} weights, listed as graph inputs as that version "
            "required, are constants"
        )
    needed = max(FIRST_IR_WITH_DEFAULTS, onnx.helper.find_min_ir_version_for(list(model.opset_import)))
    if model.ir_version < needed:
        conversions.append(f"IR version {model.ir_version} -> {needed}")
        model.ir_version = needed
    return ir.infer_shapes(model, source), conversions


def _per_channel_prelu_slopes(model: onnx.ModelProto, reference: onnx.ModelProto) -> None:
    """A PRelu of opset 6 or older applied a 1-D slope [C] to the channels (axis 1); onnx's
    version converter keeps the slope as it is, which numpy broadcasting from opset 7 on
    applies to the last axis (or refuses). Reshape each such constant slope to [C, 1, ...]
    (a copy of its own where another node reads it too), as the model meant."""
    ranks = {
        value.name: len(value.type.tensor_type.shape.dim)
        for value in (*reference.graph.input, *reference.graph.value_info)
        if value.type.tensor_type.HasField("shape")
    }
    weights = {init.name: init for init in model.graph.initializer}
    readers: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    for node in model.graph.node:
        if node.op_type != "PRelu" or node.input[1] not in weights:
            continue
        slope, rank = weights[node.input[1]], ranks.get(node.input[0], 0)
        if len(slope.dims) != 1 or slope.dims[0] == 1 or rank < 3:
            continue
        values = ir.tensor_array(slope).reshape([slope.dims[0]] + [1] * (rank - 2))
        name = slope.name if readers[slope.name] == 1 else f"{slope.name}_per_channel_{node.output[0]}"
        if name == slope.name:
            slope.CopyFrom(onnx.numpy_helper.from_array(values, name))
        else:
            model.graph.initializer.append(onnx.numpy_helper.from_array(values, name))
            node.input[1] = name


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _drop_initializers_from_inputs(model: onnx.ModelProto) -> int:
    """Take the initializers out of the main graph's inputs (they become constants); how many."""
    defaults = {init.name for init in model.graph.initializer}
    kept = [value for value in model.graph.input if value.name not in defaults]
    dropped = len(model.graph.input) - len(kept)
    del model.graph.input[:]
    model.graph.input.extend(kept)
    return dropped


def overridable_input_count(model: onnx.ModelProto) -> int:
    """How many weights the model lists as graph inputs a caller may override (IR >= 4), which
    are therefore not constants and not folded (--freeze-input-defaults makes them constants)."""
    return len(ir.overridable_initializers(model))


def _declared_values(model: onnx.ModelProto):
    for scope in ir.proto_scopes(model.graph):
        yield from (*scope.input, *scope.output, *scope.value_info)


def _has_negative_dims(model: onnx.ModelProto) -> bool:
    return any(dim.dim_value < 0 for value in _declared_values(model) for dim in value.type.tensor_type.shape.dim)


def _forget_negative_dims(model: onnx.ModelProto) -> None:
    """A dim of negative size (old exporters wrote -1 for "any") is a dim of unknown size."""
    for value in _declared_values(model):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_value < 0:
                dim.ClearField("dim_value")


def graph_input_specs(model: onnx.ModelProto) -> list[InputSpec]:
    """The graph's real inputs (not initializers) as InputSpecs, integer ones with the values
    made-up data of them may take (load/input_domains.py)."""
    initializers = {init.name for init in model.graph.initializer}
    ranges, read_as_masks = integer_domains(model)
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        dims = tuple(
            d.dim_value if d.HasField("dim_value") else (d.dim_param or f"{value.name}_{i}")  # 0: an empty dim
            for i, d in enumerate(tensor_type.shape.dim)
        )
        kind, value_range = _dtype_name(value.type), ranges.get(value.name)
        specs.append(InputSpec(value.name, dims, kind, value_range=value_range, mask=value.name in read_as_masks))
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


def _apply_input_specs(model: onnx.ModelProto, specs: list[InputSpec], dynamic_batch: bool, source: str) -> list[str]:
    """--input on an ONNX model fixes (or names) the dims of its inputs (a dim the model names
    keeps its name); what it changed of the dims the model fixed, in words."""
    by_name = {value.name: value for value in model.graph.input}
    changed: list[str] = []
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
        declared, fixed = _dims_text(shape), [dim.dim_value for dim in shape.dim]
        for dim, value in zip(shape.dim, spec.dims):
            if isinstance(value, int):
                dim.dim_value = value
            elif not dim.dim_param:  # a dim the model names keeps its name: serving code binds by it
                dim.dim_param = value
        if any(d > 0 and d != v for d, v in zip(fixed, spec.dims) if isinstance(v, int)):
            # a new resolution or batch is what the user may want; a model that refuses the inputs
            # it was made for must not come as a surprise (the summary and the report say so)
            changed.append(
                f"input {spec.name!r} was {declared}, fixed by {source}; --input makes it {_dims_text(shape)}, "
                "the only size the written model takes"
            )
    if dynamic_batch:
        defaults = {init.name for init in model.graph.initializer}  # an input with a default is a weight
        for value in model.graph.input:
            if value.name in defaults:
                continue
            dims = value.type.tensor_type.shape.dim
            if dims and not dims[0].dim_param:
                dims[0].dim_param = BATCH_DIM
    return changed


def _dims_text(shape: onnx.TensorShapeProto) -> str:
    return "x".join(str(d.dim_value) if d.dim_value > 0 else d.dim_param or "?" for d in shape.dim)
