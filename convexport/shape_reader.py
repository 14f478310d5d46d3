"""Reading TensorShapeProtos once per distinct shape.

A graph's tensors share a few shapes (the bench's synthetic graph: 2 among its 4,677
value_info entries), and serialising a shape (about 0.4 us) costs less than reading its dims
one by one through protobuf (about 2 us for four). A ShapeReader reads each distinct shape
once, keyed by its bytes, which encode everything a shape holds: two shapes with the same
bytes read the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

import onnx

Read = TypeVar("Read")


class ShapeReader(Generic[Read]):
    """read(shape) for each shape given, computed once per distinct shape; for one graph or
    model at a time (what it keeps grows with the distinct shapes it has seen)."""

    def __init__(self, read: Callable[[onnx.TensorShapeProto], Read]):
        self._read = read
        self._seen: dict[bytes, Read] = {}

    def __call__(self, shape: onnx.TensorShapeProto) -> Read:
        key = shape.SerializeToString()
        try:
            return self._seen[key]
        except KeyError:
            value = self._seen[key] = self._read(shape)
            return value
