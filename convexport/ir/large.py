"""Models with 1 GiB of weights or more, and the weightless skeleton shape inference runs on.

Protobuf cannot serialise a message of 2 GiB, so such a model never goes through
SerializeToString: it is saved with its large tensors in one external data file (for ONNX
Runtime, and for the output). Shape inference, which serialises the model into C++ and back,
runs on a skeleton whose large tensors keep their type and dims but no data. Nothing here
modifies the model it is given (onnx.save(save_as_external_data=True) would: it moves the
data out of it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

from .weight_files import external_entries, is_file_backed, write_weights

EXTERNAL_DATA_THRESHOLD = 1 << 30  # weights from here on are saved as external data
EXTERNAL_TENSOR_MIN_BYTES = 1024  # smaller tensors stay inside the model file


def external_data_files(model: onnx.ModelProto) -> list[str]:
    """The external data files (locations relative to the model's folder) that the model's
    tensors name, in every scope."""
    from .scopes import proto_scopes

    tensors = [t for scope in proto_scopes(model.graph) for t in scope.initializer]
    tensors += [
        a.t for scope in proto_scopes(model.graph) for node in scope.node for a in node.attribute if a.HasField("t")
    ]
    return sorted(
        {
            entry.value
            for tensor in tensors
            if tensor.data_location == onnx.TensorProto.EXTERNAL
            for entry in tensor.external_data
            if entry.key == "location"
        }
    )


def serialized_bytes(model: onnx.ModelProto, value_info: Sequence[onnx.ValueInfoProto] | None = None) -> int:
    """The bytes of the model as written (its external data included), summed over its parts
    (each with its field's tag and length): protobuf refuses to measure or serialise a message
    of 2 GiB or more as a whole. Only the graph's and the model's own names and numbers are
    left out, a few dozen bytes. `value_info`: the main graph's, where it is written with
    these instead of its own (shapes.as_declared)."""
    graph = model.graph
    annotations = graph.value_info if value_info is None else value_info
    parts = (*graph.node, *graph.initializer, *graph.sparse_initializer, *graph.input, *graph.output, *annotations)
    extras = (*model.opset_import, *model.metadata_props, *model.functions, *model.training_info)
    framed = sum(_framed(part.ByteSize()) for part in (*parts, *extras))
    return framed + sum(_external_bytes(tensor) for tensor in graph.initializer)


def _framed(size: int) -> int:
    """A message field of `size` bytes as protobuf writes it: a tag, the length, the bytes."""
    return 1 + max(1, (size.bit_length() + 6) // 7) + size


def _external_bytes(tensor: onnx.TensorProto) -> int:
    """The length of a tensor's data in an external file (0 for a tensor held in the model, and
    for a skeleton's stripped one, which names no file)."""
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return 0
    entries = external_entries(tensor)
    if "location" not in entries:
        return 0
    if "length" in entries:
        length = entries["length"]
        if not (length.isascii() and length.isdigit()):
            raise ValueError(f"tensor {tensor.name!r}: external data length {length!r} is not a byte count")
        return int(length)
    return int(np.prod(tensor.dims)) * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


def weight_bytes(model: onnx.ModelProto) -> int:
    """The bytes of the main graph's initializers, held in the model or in external files."""
    return sum(_data_bytes(tensor) + _external_bytes(tensor) for tensor in model.graph.initializer)


def needs_external_data(model: onnx.ModelProto) -> bool:
    """Whether the model is saved with its large tensors in a data file: from
    EXTERNAL_DATA_THRESHOLD of weights on, and always where they are in files already
    (weight_files: a location no model on disk may hold)."""
    initializers = model.graph.initializer
    return weight_bytes(model) >= EXTERNAL_DATA_THRESHOLD or any(map(is_file_backed, initializers))


# Weights from this size on never go through protobuf serialisation whole, though they fit:
# ONNX Runtime gets such a model as files (serialised bytes, ORT's parse of them and its
# tensors are three copies at once) and ORT's loading stands in for onnx's checker (which
# serialises it too; bench/RESULTS.md, "Measurements behind the code").
SERIALISED_MAX_BYTES = 256 << 20


def kept_from_serialisation(model: onnx.ModelProto) -> bool:
    """Whether the model is too large to be serialised whole: over protobuf's limit
    (needs_external_data), or of SERIALISED_MAX_BYTES of weights or more."""
    threshold = min(SERIALISED_MAX_BYTES, EXTERNAL_DATA_THRESHOLD)
    return weight_bytes(model) >= threshold or any(map(is_file_backed, model.graph.initializer))


def skeleton(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[tuple[onnx.TensorProto, onnx.TensorProto]]]:
    """A copy of the model whose large initializers (file-backed ones among them) have no data
    (marked external, with no location yet), and the (original, stripped) pairs of those
    initializers. The large data is never copied (a whole-model copy, cleared afterwards, would
    copy every weight once)."""
    light = onnx.ModelProto()
    _copy_fields(model, light, skip="graph")
    _copy_fields(model.graph, light.graph, skip="initializer")
    stripped = []
    for tensor in model.graph.initializer:
        copy = light.graph.initializer.add()
        if _data_bytes(tensor) < EXTERNAL_TENSOR_MIN_BYTES and not is_file_backed(tensor):
            copy.CopyFrom(tensor)
            continue
        copy.name, copy.data_type = tensor.name, tensor.data_type
        copy.dims.extend(tensor.dims)
        copy.data_location = onnx.TensorProto.EXTERNAL
        stripped.append((tensor, copy))
    return light, stripped


def _copy_fields(source, target, skip: str) -> None:
    """Every field set in the message `source` into `target`, but the one named `skip`."""
    for field, value in source.ListFields():
        if field.name == skip:
            continue
        if hasattr(value, "extend"):  # a repeated field (protobuf 7 has no FieldDescriptor.label)
            getattr(target, field.name).extend(value)
        elif hasattr(value, "CopyFrom"):  # a message
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


def save_with_external_data(model: onnx.ModelProto, path: str | Path, location: str, data_path=None) -> None:
    """MODEL at `path`, its large tensors one after another in the file `location` names
    (beside it); written to `data_path` instead when given (a temporary file that becomes
    `location`)."""
    light, stripped = skeleton(model)
    with open(data_path or Path(path).parent / location, "wb") as data:
        write_weights(stripped, data, location)
    onnx.save(light, str(path))


def with_weights_of(inferred: onnx.ModelProto, stripped: list[tuple[onnx.TensorProto, onnx.TensorProto]]) -> None:
    """Put the stripped initializers' data back into a model made from the skeleton."""
    originals = {copy.name: original for original, copy in stripped}
    for tensor in inferred.graph.initializer:
        if tensor.name in originals:
            tensor.CopyFrom(originals[tensor.name])


# element types of half a byte: two to a byte in raw_data
_HALF_BYTE_TYPES = {
    getattr(onnx.TensorProto, name) for name in ("INT4", "UINT4", "FLOAT4E2M1") if hasattr(onnx.TensorProto, name)
}


def _data_bytes(tensor: onnx.TensorProto) -> int:
    """The bytes of a tensor's data held in the model (0 for external data), from its dims and
    type: reading raw_data copies it out (1.3 s a GiB), and protobuf's ByteSize takes as long."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return 0
    if tensor.HasField("raw_data"):
        elements = math.prod(tensor.dims)
        if tensor.data_type in _HALF_BYTE_TYPES:
            return (elements + 1) // 2
        return elements * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return 4 * (len(tensor.float_data) + len(tensor.int32_data)) + 8 * (
        len(tensor.int64_data) + len(tensor.double_data) + len(tensor.uint64_data)
    )
