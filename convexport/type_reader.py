"""Reading TypeProtos once per distinct type.

A graph's tensors share a few types (the bench's synthetic graph: 2 among its 4,677
value_info entries), and serialising a value's type (about 0.4 us) costs less than walking
to its shape and reading the dims one by one through protobuf (about 2 us for four; the walk
alone, value.type.tensor_type.HasField("shape") then .shape, about 0.4 us). A TypeReader reads
each distinct type once, keyed by its bytes, which encode everything a type holds (element
type, shape, denotations): two types with the same bytes read the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

import onnx

Read = TypeVar("Read")


class TypeReader(Generic[Read]):
    """read(type_proto) for each TypeProto given, computed once per distinct type; for one
    graph or model at a time (what it keeps grows with the distinct types it has seen)."""

    def __init__(self, read: Callable[[onnx.TypeProto], Read]):
        self._read = read
        self._seen: dict[bytes, Read] = {}

    def __call__(self, type_proto: onnx.TypeProto) -> Read:
        key = type_proto.SerializeToString()
        try:
            return self._seen[key]
        except KeyError:
            value = self._seen[key] = self._read(type_proto)
            return value
