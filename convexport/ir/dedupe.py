"""Equal initializers as one: exporters and folds leave copies of a weight (a constant shared
by several nodes written once per use, the TorchScript exporter's copies of a tied weight, the
same fold made in both branches of an optimum merged decoder's If), and each copy is as large in
the written file as the first. Two initializers are equal when their type, dims and bytes are;
readers of a copy read the first instead. Copies in different scopes (an If's branches, a Loop's
body) are written once in the main graph, which every scope sees. An initializer that is also a
graph input (a default the caller may override) stays as it is.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass

import onnx

from .convert import overridable_initializers
from .scopes import proto_own_names, proto_scopes, proto_subgraphs, read_outer_as


@dataclass(frozen=True)
class Deduplicated:
    model: onnx.ModelProto  # `model` itself where there was no copy
    merged: int  # initializers dropped as copies of another
    bytes_saved: int


@dataclass(frozen=True)
class _Placed:
    """An initializer by where it is: its scope's index in proto_scopes order, and its name."""

    scope: int
    name: str


def deduplicate_initializers(model: onnx.ModelProto) -> Deduplicated:
    copies, saved = _copies(model)
    if not copies:
        return Deduplicated(model, 0, 0)
    result = onnx.ModelProto()
    result.CopyFrom(model)
    scopes = proto_scopes(result.graph)
    taken = _defined_names(scopes)
    kept_as: dict[_Placed, str] = {}  # a kept initializer -> its name where it is now
    renamed: dict[int, dict[str, str]] = {}  # scope -> its reads to rename
    copies_in: dict[_Placed, set[int]] = {}  # a kept initializer -> the scopes of its copies
    for copy, kept in copies.items():
        copies_in.setdefault(kept, set()).add(copy.scope)
    for copy, kept in copies.items():
        if kept not in kept_as:
            kept_as[kept] = kept.name
            if kept.scope != 0 and copies_in[kept] != {kept.scope}:  # a copy another scope may not see
                kept_as[kept] = _hoisted(scopes, kept, taken)
                if kept_as[kept] != kept.name:
                    renamed.setdefault(kept.scope, {})[kept.name] = kept_as[kept]
        _drop(scopes[copy.scope], copy.name)
        renamed.setdefault(copy.scope, {})[copy.name] = kept_as[kept]
    for index, names in renamed.items():
        _redirect(scopes[index], names)
    return Deduplicated(result, len(copies), saved)


def _copies(model: onnx.ModelProto) -> tuple[dict[_Placed, _Placed], int]:
    """Each initializer that equals one before it (the main graph's first, then each scope's,
    outermost first) -> that one; and the copies' bytes."""
    overridable = {init.name for init in overridable_initializers(model)}
    first: dict[tuple, tuple[_Placed, onnx.TensorProto]] = {}
    copies: dict[_Placed, _Placed] = {}
    saved = 0
    for index, scope in enumerate(proto_scopes(model.graph)):
        inputs = overridable if index == 0 else {value.name for value in scope.input}
        for initializer in scope.initializer:
            if initializer.name in inputs or initializer.data_location == onnx.TensorProto.EXTERNAL:
                continue
            content = _content(initializer)
            key = (initializer.data_type, tuple(initializer.dims), hashlib.sha256(content).digest())
            placed = _Placed(index, initializer.name)
            kept, kept_proto = first.setdefault(key, (placed, initializer))
            if kept != placed and _content(kept_proto) == content:
                copies[placed] = kept
                saved += len(content)
    return copies, saved


def _hoisted(scopes: list[onnx.GraphProto], kept: _Placed, taken: set[str]) -> str:
    """`kept` moved from its subgraph into the main graph: its name there, a new one where
    another scope defines its own (a name may not stand for two values where both are seen)."""
    scope = scopes[kept.scope]
    moved = onnx.TensorProto()
    moved.CopyFrom(next(init for init in scope.initializer if init.name == kept.name))
    _drop(scope, kept.name)
    if any(kept.name in proto_own_names(other) for other in scopes):
        moved.name = next(name for n in itertools.count() if (name := f"{kept.name}__shared{n}") not in taken)
        taken.add(moved.name)
    scopes[0].initializer.append(moved)
    return moved.name


def _drop(scope: onnx.GraphProto, name: str) -> None:
    """The initializer `name` of `scope`, and its value_info, deleted in place (the other
    entries, weights of any size, are not copied)."""
    for entries in (scope.initializer, scope.value_info):
        for index in reversed(range(len(entries))):
            if entries[index].name == name:
                del entries[index]


def _redirect(scope: onnx.GraphProto, names: dict[str, str]) -> None:
    """Reads of each old name of `names` in `scope`, and in the subgraphs under it that do not
    define their own, read its new name; where an old name is an output of `scope`, an Identity
    of the new gives it (an output keeps its name)."""
    _rename_reads(scope, names)
    for name in (value.name for value in scope.output if value.name in names):
        scope.node.append(onnx.helper.make_node("Identity", [names[name]], [name], name=f"{name}_copy"))


def _rename_reads(scope: onnx.GraphProto, names: dict[str, str]) -> None:
    for node in scope.node:
        for index, name in enumerate(node.input):
            if name in names:
                node.input[index] = names[name]
        for sub in proto_subgraphs(node):
            read_outer_as(sub, names)


def _defined_names(scopes: list[onnx.GraphProto]) -> set[str]:
    return set().union(*(proto_own_names(scope) for scope in scopes))


def _content(tensor: onnx.TensorProto) -> bytes:
    """The tensor's values as bytes, its name left out."""
    if tensor.HasField("raw_data"):
        return tensor.raw_data
    unnamed = onnx.TensorProto()
    unnamed.CopyFrom(tensor)
    unnamed.name = ""
    return unnamed.SerializeToString()
