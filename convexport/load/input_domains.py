"""The values a made-up input may take, read from the graph that reads it.

Made-up data (validation, profiling) is drawn where the model is defined, not where any
number fits: a token id past the embedding table is an error in ONNX Runtime's Gather, and an
attention mask of 2 or 3 turns transformers' `(1 - mask) * min_float` into an overflow that
gives NaN. Two rules, each a fact of the graph or of the naming every exporter of transformers
(torch's, optimum's) uses:

    index into a table  an integer input that reaches a Gather's indices through ops that only
                        move or convert values (Cast, Reshape, Unsqueeze, ...) takes values in
                        [0, rows - 1] of the smallest such table (a constant's axis length)
    mask                an integer input named like a mask (`attention_mask`,
                        `decoder_attention_mask`, `pixel_mask`), or read as one whatever its
                        name (an export from a factory names it `input_1`): through ops that
                        only move or convert values it reaches `1 - mask` (a Sub from a
                        constant 1, transformers' extended attention mask) or a Cast to bool
                        (a Where's condition); it takes the values 0 and 1, each row with a 1
                        at its first position (inputs.random_inputs)

The ranges only narrow made-up data; a range given with --input wins.

The sizes of an image's dynamic dims are read the same way (sized_for_data): a float input a
Conv reads takes the Conv's input channels (weight in-channels x groups), and dynamic spatial
dims, where the model does not run at the made-up size of 1, the smallest multiple of the
Conv's stride at which it runs (a ViT's position table fixes the number of patches: optimum's
ViT export names all four dims of `pixel_values`). A waveform is read the same way: Wav2Vec2's
and HuBERT's `input_values` (batch x samples) reach their first Conv through an Unsqueeze that
adds the channel, and their stack of strided convs runs on no fewer than 400 samples, so past
MAX_PATCHES_PER_SIDE multiples the multiples grow by a quarter at a time. Those sizes are for
made-up data only; the model written keeps its dims as they are.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

import onnx
from onnx import numpy_helper

from ..ir import proto_constants
from .inputs import MASK_NAME, InputSpec, random_inputs

# Ops whose output holds the same values as their first input, moved or converted: an index
# read through them is still an index.
_VALUE_PRESERVING = {
    "Cast",
    "Identity",
    "Reshape",
    "Unsqueeze",
    "Squeeze",
    "Flatten",
    "Expand",
    "Transpose",
    "Slice",
    "Tile",
}


def integer_ranges(model: onnx.ModelProto) -> dict[str, tuple[int, int]]:
    """{integer input name: (low, high), inclusive} for the inputs the rules of the
    module doc bound; the others are left out."""
    return integer_domains(model)[0]


def masks(model: onnx.ModelProto) -> set[str]:
    """The integer inputs the graph reads as a mask (module doc), by name."""
    return integer_domains(model)[1]


def integer_domains(model: onnx.ModelProto) -> tuple[dict[str, tuple[int, int]], set[str]]:
    """integer_ranges' ranges and the inputs the graph reads as a mask, from one reading of
    the graph."""
    graph = model.graph
    values, readers = proto_constants(graph), _readers(graph)
    initializers = {init.name for init in graph.initializer}
    ranges, read_as_masks = {}, set()
    for value in graph.input:
        element = value.type.tensor_type.elem_type
        if value.name in initializers or not _is_integer(element):
            continue
        if _read_as_mask(value.name, readers, values):
            read_as_masks.add(value.name)
        rows = _table_rows(value.name, readers, values)
        if rows:
            ranges[value.name] = (0, rows - 1)
        elif MASK_NAME.search(value.name) or value.name in read_as_masks:
            ranges[value.name] = (0, 1)
    return ranges, read_as_masks


def _reached(name: str, readers) -> Iterator[tuple[str, onnx.NodeProto]]:
    """(tensor, node) for each node that reads the values of `name`, or those values moved or
    converted (through the first input of _VALUE_PRESERVING ops)."""
    seen, pending = set(), [name]
    while pending:
        tensor = pending.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        for node in readers.get(tensor, ()):
            yield tensor, node
            if node.op_type in _VALUE_PRESERVING and node.input[0] == tensor:
                pending.extend(node.output)


def _read_as_mask(name: str, readers, values: dict[str, onnx.TensorProto]) -> bool:
    """Whether the values of `name`, moved or converted, reach `1 - them` or a Cast to bool."""
    return any(
        (node.op_type == "Sub" and node.input[1] == tensor and _is_one(values.get(node.input[0])))
        or (node.op_type == "Cast" and any(a.name == "to" and a.i == onnx.TensorProto.BOOL for a in node.attribute))
        for tensor, node in _reached(name, readers)
    )


def _is_one(tensor: onnx.TensorProto | None) -> bool:
    if tensor is None or math.prod(tensor.dims) != 1:
        return False
    return float(numpy_helper.to_array(tensor).reshape(-1)[0]) == 1.0


def _table_rows(name: str, readers, values: dict[str, onnx.TensorProto]) -> int | None:
    """The fewest rows of a constant table the values of `name` index (Gather's indices)."""
    rows = [
        _rows(node, values.get(node.input[0]))
        for tensor, node in _reached(name, readers)
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] == tensor
    ]
    return min((count for count in rows if count), default=None)


def _rows(gather: onnx.NodeProto, table: onnx.TensorProto | None) -> int | None:
    """The length of a constant table along the Gather's axis (None for no constant, or none)."""
    shape = tuple(table.dims) if table is not None else ()
    axis = next((a.i for a in gather.attribute if a.name == "axis"), 0)
    return shape[axis] if shape and -len(shape) <= axis < len(shape) and shape[axis] > 0 else None


def _readers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    """The nodes that read each tensor, by name."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return readers


_INTEGER_TYPES = {
    getattr(onnx.TensorProto, name)
    for name in ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64")
}


def _is_integer(element: int) -> bool:
    return element in _INTEGER_TYPES


# Multiples of the Conv's stride tried one by one for an image's dynamic spatial dims (ViT-L/14
# at 518 is 37); past them, for a signal of one spatial dim alone, a quarter more each time up
# to MAX_SIGNAL_MULTIPLE (a waveform's 400 samples at Wav2Vec2's first stride of 5 are 80; an
# image that large would be gigabytes of made-up data).
MAX_PATCHES_PER_SIDE = 64
MAX_SIGNAL_MULTIPLE = 4096


def _multiples(spatial_dims: int) -> list[int]:
    tried = list(range(1, MAX_PATCHES_PER_SIDE + 1))
    while spatial_dims == 1 and tried[-1] < MAX_SIGNAL_MULTIPLE:
        tried.append(min(MAX_SIGNAL_MULTIPLE, tried[-1] + tried[-1] // 4))
    return tried


@dataclass(frozen=True)
class ConvRead:
    """What the first Conv reading an image input fixes of it."""

    channels: int
    strides: tuple[int, ...]
    extents: tuple[int, ...]  # the dilated kernel's size along each spatial axis


def conv_reads(model: onnx.ModelProto) -> dict[str, ConvRead]:
    """{input name: ConvRead} for each float input a Conv reads as its data (directly or
    through a Cast, an Identity or an Unsqueeze that adds leading dims: a waveform's channel),
    with a constant weight. The input's last dims are the Conv's spatial dims either way."""
    graph = model.graph
    constants, readers = proto_constants(graph), _readers(graph)
    weights = {name: tuple(tensor.dims) for name, tensor in constants.items()}
    found = {}
    for value in graph.input:
        pending, seen = [value.name], set()
        while pending and value.name not in found:
            tensor = pending.pop()
            seen.add(tensor)
            for node in readers.get(tensor, ()):
                if node.op_type == "Conv" and node.input[0] == tensor and len(weights.get(node.input[1], ())) >= 3:
                    found[value.name] = _conv_read(node, weights[node.input[1]])
                    break
                moves = node.op_type in ("Cast", "Identity") or _adds_leading_dims(node, constants)
                if moves and node.input[0] == tensor and node.output[0] not in seen:
                    pending.append(node.output[0])
    return found


def _adds_leading_dims(node: onnx.NodeProto, constants: dict[str, onnx.TensorProto]) -> bool:
    """Whether `node` is an Unsqueeze whose new dims are among the first two of its output
    (batch and channel), so that the dims after them are its input's last dims."""
    if node.op_type != "Unsqueeze":
        return False
    if len(node.input) > 1:
        given_axes = constants.get(node.input[1])
        if given_axes is None:
            return False
        axes = onnx.numpy_helper.to_array(given_axes).reshape(-1).tolist()
    else:  # before opset 13 the axes are an attribute
        axes = next((list(a.ints) for a in node.attribute if a.name == "axes"), [])
    return bool(axes) and all(0 <= axis < 2 for axis in axes)


def _conv_read(conv: onnx.NodeProto, weight: tuple[int, ...]) -> ConvRead:
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in conv.attribute}
    spatial = len(weight) - 2
    strides = tuple(attributes.get("strides") or (1,) * spatial)
    dilations = tuple(attributes.get("dilations") or (1,) * spatial)
    extents = tuple(d * (k - 1) + 1 for d, k in zip(dilations, weight[2:]))
    return ConvRead(weight[1] * int(attributes.get("group", 1)), strides, extents)


def sized_for_data(model: onnx.ModelProto, specs: list[InputSpec], run) -> list[InputSpec]:
    """`specs` with the dynamic dims of image inputs sized as the module doc says; `run(feeds)`
    runs the model (an exception where it cannot), and is called only where an image input
    has dynamic spatial dims."""
    reads = conv_reads(model)
    sized = [_with_channels(spec, reads.get(spec.name)) for spec in specs]
    images = [i for i, spec in enumerate(sized) if spec.name in reads and _spatial_dynamic(spec, reads[spec.name])]
    if not images or _runs(run, sized):
        return sized
    for multiple in _multiples(max(len(reads[sized[index].name].strides) for index in images)):
        tried = list(sized)
        for index in images:
            tried[index] = _spatial_sized(sized[index], reads[sized[index].name], multiple)
        if _runs(run, tried):
            return tried
    return sized


def _with_channels(spec: InputSpec, read: ConvRead | None) -> InputSpec:
    if read is None or len(spec.dims) != len(read.strides) + 2 or not isinstance(spec.dims[1], str):
        return spec
    return replace(spec, dims=(spec.dims[0], read.channels, *spec.dims[2:]))


def _spatial_dynamic(spec: InputSpec, read: ConvRead) -> bool:
    spatial = len(read.strides)
    return len(spec.dims) >= spatial and any(isinstance(dim, str) for dim in spec.dims[-spatial:])


def _spatial_sized(spec: InputSpec, read: ConvRead, multiple: int) -> InputSpec:
    """`spec` with its dynamic spatial dims (its last, one per Conv stride) set from `multiple`."""
    lead = len(spec.dims) - len(read.strides)
    spatial = [
        dim if isinstance(dim, int) else max(extent, stride * multiple)
        for dim, stride, extent in zip(spec.dims[lead:], read.strides, read.extents)
    ]
    return replace(spec, dims=(*spec.dims[:lead], *spatial))


def _runs(run, specs: list[InputSpec]) -> bool:
    try:
        run(random_inputs(specs, seed=0))
    except Exception:  # the model refuses these sizes: the next are tried
        return False
    return True


def sized_by_running(model: onnx.ModelProto, specs: list[InputSpec], device: str = "cpu") -> list[InputSpec]:
    """sized_for_data with ONNX Runtime running the model: a session is opened only where a
    size has to be tried, once (a model it cannot load keeps the specs as they are: the run
    that follows says why)."""
    from ..errors import ConvexportError
    from ..runtime import create_session

    opened: list = []

    def run(feeds: dict) -> None:
        if not opened:
            try:
                opened.append(create_session(model, device, what="the model", prepack=False))
            except ConvexportError:
                opened.append(None)
        if opened[0] is None:
            raise RuntimeError("ONNX Runtime cannot load the model")
        opened[0].run(None, feeds)

    return sized_for_data(model, specs, run)
