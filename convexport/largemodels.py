"""Models with 1 GiB of weights or more, and the weightless skeleton that shape inference runs on.

Protobuf cannot serialise a message of 2 GiB, so such a model never goes through
SerializeToString: it is saved with its large tensors in one external data file (for ONNX
Runtime, and for the output). Shape inference runs on a skeleton whose large tensors keep
their type and dims but no data: ONNX's inference serialises the model into C++ and its
result back, about 3 ms per MiB of weights (ResNet-18's 45 MB: 152 ms against 20 ms on the
skeleton, with the same result, byte for byte), while stripping and restoring costs about
5 us per initializer (a 4,678-node graph of 2,082 small weights: 31 ms on the skeleton, 21 ms
whole), so small weights go whole (worth_a_skeleton). Nothing here modifies the model it is
given (onnx.save(save_as_external_data=True) would: it moves the data out of it).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import onnx
from onnx import numpy_helper

EXTERNAL_DATA_THRESHOLD = 1 << 30     # weights from here on are saved as external data
EXTERNAL_TENSOR_MIN_BYTES = 1024      # smaller tensors stay inside the model file
SKELETON_FROM_MEAN_BYTES = 2048       # mean initializer size from which inference runs on a skeleton


def weight_bytes(model: onnx.ModelProto) -> int:
    return sum(_data_bytes(tensor) for tensor in model.graph.initializer)


def needs_external_data(model: onnx.ModelProto) -> bool:
    return weight_bytes(model) >= EXTERNAL_DATA_THRESHOLD


def skeleton(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[tuple[onnx.TensorProto, onnx.TensorProto]]]:
    """A copy of the model whose large initializers have no data (marked external, with no
    location yet), and the (original, stripped) pairs of those initializers."""
    light = onnx.ModelProto()
    _copy_fields(model, light, skip="graph")
    _copy_fields(model.graph, light.graph, skip="initializer")
    stripped = []
    for tensor in model.graph.initializer:
        copy = light.graph.initializer.add()
        if _data_bytes(tensor) < EXTERNAL_TENSOR_MIN_BYTES:
            copy.CopyFrom(tensor)
            continue
        copy.name, copy.data_type = tensor.name, tensor.data_type
        copy.dims.extend(tensor.dims)
        copy.data_location = onnx.TensorProto.EXTERNAL
        stripped.append((tensor, copy))
    return light, stripped


def save_with_external_data(model: onnx.ModelProto, path: str | Path, location: str) -> None:
    """MODEL at `path`, its large tensors one after another in `location` (beside it)."""
    light, stripped = skeleton(model)
    with open(Path(path).parent / location, "wb") as data:
        for original, copy in stripped:
            offset = data.tell()
            payload = original.raw_data or numpy_helper.to_array(original).tobytes()
            data.write(payload)
            for key, value in (("location", location), ("offset", str(offset)), ("length", str(len(payload)))):
                entry = copy.external_data.add()
                entry.key, entry.value = key, value
    onnx.save(light, str(path))


def worth_a_skeleton(model: onnx.ModelProto) -> bool:
    """Whether `infer` should see the skeleton (module doc): weights too large to serialise, or
    of SKELETON_FROM_MEAN_BYTES per initializer on average."""
    count = len(model.graph.initializer)
    total = weight_bytes(model)
    return total >= EXTERNAL_DATA_THRESHOLD or (count > 0 and total >= SKELETON_FROM_MEAN_BYTES * count)


def infer_on_skeleton(model: onnx.ModelProto, infer) -> onnx.ModelProto:
    """`infer` run on the skeleton; its result with the original tensors put back."""
    light, stripped = skeleton(model)
    inferred = infer(light)
    originals = {copy.name: original for original, copy in stripped}
    for tensor in inferred.graph.initializer:
        if tensor.name in originals:
            tensor.CopyFrom(originals[tensor.name])
    return inferred


def _copy_fields(source, target, skip: str) -> None:
    for field, value in source.ListFields():
        if field.name == skip:
            continue
        if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):     # a repeated field
            getattr(target, field.name).extend(value)
        elif field.type == field.TYPE_MESSAGE:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


def _data_bytes(tensor: onnx.TensorProto) -> int:
    if tensor.raw_data:
        return len(tensor.raw_data)
    return 4 * (len(tensor.float_data) + len(tensor.int32_data)) + 8 * (len(tensor.int64_data) + len(tensor.double_data))
