"""Equal initializers as one: exporters and folds leave copies of a weight (a constant shared
by several nodes written once per use, the TorchScript exporter's copies of a tied weight), and
each copy is as large in the written file as the first. Two initializers are equal when their
type, dims and bytes are; readers of a copy read the first instead. An initializer that is also
a graph input (a default the caller may override) stays as it is.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import onnx

from .convert import overridable_initializers
from .scopes import proto_scopes


@dataclass(frozen=True)
class Deduplicated:
    model: onnx.ModelProto  # `model` itself where there was no copy
    merged: int  # initializers dropped as copies of another
    bytes_saved: int


def deduplicate_initializers(model: onnx.ModelProto) -> Deduplicated:
    graph = model.graph
    overridable = {init.name for init in overridable_initializers(model)}
    first: dict[tuple, onnx.TensorProto] = {}
    renamed: dict[str, str] = {}
    saved = 0
    for initializer in graph.initializer:
        if initializer.name in overridable or initializer.data_location == onnx.TensorProto.EXTERNAL:
            continue
        content = _content(initializer)
        key = (initializer.data_type, tuple(initializer.dims), hashlib.sha256(content).digest())
        kept = first.setdefault(key, initializer)
        if kept is not initializer and _content(kept) == content:
            renamed[initializer.name] = kept.name
            saved += len(content)
    if not renamed:
        return Deduplicated(model, 0, 0)
    result = onnx.ModelProto()
    result.CopyFrom(model)
    _drop_named(result.graph.initializer, renamed)
    _drop_named(result.graph.value_info, renamed)
    outputs = {value.name for value in result.graph.output}
    for scope in proto_scopes(result.graph):
        defined_here = _defines(scope, renamed) if scope is not result.graph else set()
        for node in scope.node:
            for index, name in enumerate(node.input):
                if name in renamed and name not in defined_here:
                    node.input[index] = renamed[name]
    _keep_graph_outputs(result.graph, renamed, outputs)
    return Deduplicated(result, len(renamed), saved)


def _drop_named(entries, names) -> None:
    """Delete the entries of a repeated field whose name is in `names`, in place (the others,
    weights of any size, are not copied)."""
    for index in reversed(range(len(entries))):
        if entries[index].name in names:
            del entries[index]


def _content(tensor: onnx.TensorProto) -> bytes:
    """The tensor's values as bytes, its name left out."""
    if tensor.HasField("raw_data"):
        return tensor.raw_data
    unnamed = onnx.TensorProto()
    unnamed.CopyFrom(tensor)
    unnamed.name = ""
    return unnamed.SerializeToString()


def _defines(scope: onnx.GraphProto, names) -> set[str]:
    """The names a subgraph defines itself (shadowing the outer scope's)."""
    own = {value.name for value in scope.input} | {init.name for init in scope.initializer}
    own |= {output for node in scope.node for output in node.output}
    return own & set(names)


def _keep_graph_outputs(graph: onnx.GraphProto, renamed: dict[str, str], outputs: set[str]) -> None:
    """A copy that is itself a graph output keeps its name: an Identity of the first gives it."""
    for name in sorted(set(renamed) & outputs):
        graph.node.append(onnx.helper.make_node("Identity", [renamed[name]], [name], name=f"{name}_copy"))
