"""ONNX shape inference for whole models, and whether a model needs it."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import onnx

from ..errors import ConvexportError
from .large import skeleton, with_weights_of
from .scopes import proto_scopes, proto_subgraphs


def infer_shapes(model: onnx.ModelProto, source: str, forget_unknown_dims: bool = False) -> onnx.ModelProto:
    """The model with every shape ONNX can infer in its value_info (a new model; subgraphs
    included). It runs on the model's skeleton (large.py), so weights of any size never go
    through protobuf serialisation; ConvexportError naming `source` when inference fails.

    ONNX never replaces a dim it finds in value_info: `forget_unknown_dims` drops the entries
    with a dim of no value first (the exporter's made-up symbols), for a model whose shapes
    may now be known (after constant folding, a Reshape reads a constant where it read a
    Shape(...) chain); the model's own inputs and outputs stay as they are."""
    light, stripped = skeleton(model)
    if forget_unknown_dims:
        for scope in proto_scopes(light.graph):
            known = [value for value in scope.value_info if _typed_and_static(value.type)]
            del scope.value_info[:]
            scope.value_info.extend(known)
    try:
        inferred = _infer(light)
    except Exception as exc:
        raise ConvexportError(f"{source}: ONNX shape inference failed: {str(exc).splitlines()[0]}") from exc
    with_weights_of(inferred, stripped)
    return inferred


def _infer(model: onnx.ModelProto) -> onnx.ModelProto:
    # ONNX's data propagation keys the values it propagates by tensor name across scopes: in a
    # merged decoder (optimum's If over the with-past and without-past graphs, which share
    # names) one branch's shape reaches the other's tensor, and ONNX Runtime then refuses the
    # model ("Incompatible dimensions"); such a model is inferred without it
    propagate = not _scopes_share_names(model.graph)
    inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=propagate)
    # A body nested in a body (a Scan in a Scan) gets its shapes only once the outer body's
    # are in the outer value_info, and ONNX never fills a value_info it left unshaped: one
    # more round per level of nesting, without the unshaped entries
    for _ in range(_depth(inferred.graph) - 1):
        retry = onnx.ModelProto()
        retry.CopyFrom(inferred)
        _drop_unshaped_value_info(retry.graph)
        again = onnx.shape_inference.infer_shapes(retry, check_type=False, strict_mode=False, data_prop=propagate)
        if _shaped_values(again.graph) <= _shaped_values(inferred.graph):
            break
        inferred = again
    return inferred


def _scopes_share_names(graph: onnx.GraphProto) -> bool:
    """Whether a tensor name is made in two scopes (the graph and its subgraphs)."""
    seen: set[str] = set()
    for scope in proto_scopes(graph):
        made = {name for node in scope.node for name in node.output}
        if made & seen:
            return True
        seen |= made
    return False


def fully_shaped(model: onnx.ModelProto) -> bool:
    """Every node output has a value_info (or graph output) entry with an element type and a
    static shape, and no node holds a subgraph: shape inference would give the model back as
    it is (it fills in value_info, never replaces a static shape)."""
    graph = model.graph
    shaped = {""}  # an omitted optional output
    for value in (*graph.value_info, *graph.output):
        if not _typed_and_static(value.type):
            return False
        shaped.add(value.name)
    return shaped.issuperset(itertools.chain.from_iterable(node.output for node in graph.node)) and not any(
        proto_subgraphs(node) for node in graph.node
    )


def _typed_and_static(type_proto: onnx.TypeProto) -> bool:
    """A tensor type with an element type and a shape whose every dim has a value > 0."""
    tensor_type = type_proto.tensor_type  # empty for any other type
    return (
        bool(tensor_type.elem_type)
        and tensor_type.HasField("shape")
        and all(dim.dim_value > 0 for dim in tensor_type.shape.dim)
    )


def _depth(graph: onnx.GraphProto) -> int:
    """How many levels of subgraphs lie below `graph` (0: none)."""
    return max((1 + _depth(sub) for node in graph.node for sub in proto_subgraphs(node)), default=0)


def _drop_unshaped_value_info(graph: onnx.GraphProto) -> None:
    """Drop value_info entries without a shape, in the graph and its subgraphs, except for the
    outputs of ops outside the ONNX domain (whose types inference cannot redo). An unshaped
    entry in a body for a tensor of the enclosing graph hides that tensor's shape there."""
    for scope in proto_scopes(graph):
        custom = {name for node in scope.node if node.domain not in ("", "ai.onnx") for name in node.output}
        kept = [value for value in scope.value_info if value.type.tensor_type.HasField("shape") or value.name in custom]
        del scope.value_info[:]
        scope.value_info.extend(kept)


def _shaped_values(graph: onnx.GraphProto) -> int:
    """value_info entries with a shape, in the graph and its subgraphs."""
    return sum(value.type.tensor_type.HasField("shape") for scope in proto_scopes(graph) for value in scope.value_info)


def declared_value_info(model: onnx.ModelProto) -> tuple[onnx.ValueInfoProto, ...]:
    """A copy of the main graph's value_info, as the model declares it (before any inference)."""
    return tuple(_copied(value) for value in model.graph.value_info)


def declared_entries(model: onnx.ModelProto, declared: Sequence[onnx.ValueInfoProto]) -> list[onnx.ValueInfoProto]:
    """The main graph's value_info of `model` as the model it stands in for declared them: an
    entry for each tensor `declared` describes that `model` still computes, the declared dims in
    the element type `model` gives the tensor (a float16 model's tensor that stays float32, a
    --dtype fp16 model's float16 one), and none for the others.

    Shape annotations are not computation, but ONNX Runtime reads them: where they let it prove
    two shapes equal it fuses kernels it does not fuse on the model as given (an Add and a
    LayerNormalization into a SkipLayerNormalization, whose CPU kernel can be the slower one:
    bench/RESULTS.md). The annotations shape inference gave the rewrite are its own; the model
    written (and timed) is annotated as the model given was, so that ONNX Runtime sees in the
    tensors they share what it saw in the given one. A tensor `model` has no entry for is left
    without one (its type is not known here). Subgraphs keep their own."""
    own = {value.name: value for value in model.graph.value_info}
    entries = []
    for entry in declared:
        mine = own.get(entry.name)
        if mine is None or not _same_rank(mine.type, entry.type):
            continue
        value = _copied(entry)
        value.type.tensor_type.elem_type = mine.type.tensor_type.elem_type
        entries.append(value)
    return entries


def as_declared(model: onnx.ModelProto, declared: Sequence[onnx.ValueInfoProto]) -> onnx.ModelProto:
    """`model` (changed in place, and returned) with the value_info declared_entries gives it."""
    entries = declared_entries(model, declared)
    del model.graph.value_info[:]
    model.graph.value_info.extend(entries)
    return model


def _same_rank(one: onnx.TypeProto, other: onnx.TypeProto) -> bool:
    """Both tensor types with a shape of the same rank."""
    if one.WhichOneof("value") != "tensor_type" or other.WhichOneof("value") != "tensor_type":
        return False
    first, second = one.tensor_type, other.tensor_type
    return first.HasField("shape") and second.HasField("shape") and len(first.shape.dim) == len(second.shape.dim)


def _copied(value: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    copy = onnx.ValueInfoProto()
    copy.CopyFrom(value)
    return copy


def carry_dim_names(model: onnx.ModelProto, original: onnx.ModelProto, same_outputs: bool = False) -> onnx.ModelProto:
    """`model` (changed in place, and returned) with the dims `original` knew of its main
    graph's tensors where `model` has lost them: a tensor of the same name, element type and
    rank takes the original's dim wherever its own has no value and no name, or only a name ONNX
    made up (`unk__3`); with `same_outputs` (`original` is the model `model` must stand in
    for), a graph output takes every dim the original gives it (a dim torch's exporter named
    stays named where inference now knows its size). Shape inference after constant folding
    starts again from the inputs and cannot follow every dim the exporter knew (GPT-2's `past_sequence_length +
    sequence_length`, torch's `seq` through a sliced position table); serving code binds the
    outputs' dims by name, and ONNX Runtime's transformer optimizer compares the shapes of the
    two inputs of an Add before it fuses a SkipLayerNormalization."""
    known = {
        value.name: value.type
        for value in [*original.graph.input, *original.graph.value_info, *original.graph.output]
        if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape")
    }
    graph = model.graph
    described = {value.name for value in [*graph.input, *graph.value_info, *graph.output]}
    produced = {name for node in graph.node for name in node.output}
    for value in graph.value_info:
        _take_dims(value.type, known.get(value.name))
    for value in graph.output:  # the interface: as the original writes it, names and all
        _take_dims(value.type, known.get(value.name), every_dim=same_outputs)
    missing = [name for name in produced if name not in described and name in known]
    graph.value_info.extend(onnx.helper.make_value_info(name, known[name]) for name in sorted(missing))
    return model


def _take_dims(value_type: onnx.TypeProto, original: onnx.TypeProto | None, every_dim: bool = False) -> None:
    if original is None or not value_type.HasField("tensor_type"):
        return
    tensor, before = value_type.tensor_type, original.tensor_type
    if tensor.elem_type != before.elem_type or not tensor.HasField("shape"):
        return
    if len(tensor.shape.dim) != len(before.shape.dim):
        return
    for dim, old in zip(tensor.shape.dim, before.shape.dim):
        lost = not dim.HasField("dim_value") and (not dim.dim_param or dim.dim_param.startswith("unk__"))
        # a negative size is no size (old exporters wrote -1 for "any": onnx_route forgets them)
        known = (old.HasField("dim_value") and old.dim_value >= 0) or old.dim_param
        if (lost or every_dim) and known:
            dim.CopyFrom(old)
