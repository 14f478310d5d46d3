"""An If that is the whole model, converted branch by branch: optimum's merged decoder
(`decoder_model_merged.onnx`: one If on `use_cache_branch` over the decoder without past and
the decoder with it, both reading the weights of the main graph).

choose.py converts the main graph's nodes; a node holding a subgraph stays float32 whole. Where
the main graph is one If whose branches read nothing but the model's inputs and weights, each
branch is a model of its own (those inputs, those weights, the branch's nodes and outputs),
converted and judged as any model is, with the interface asked for (float32, or the half type
with --io-dtype), on input sets made up as the model's are; the converted graphs go back into
the If, and the model's inputs and outputs take the types the branches read and make. The
main graph's weights the first branch rounds are given to the second rounded so
(WeightRounding.given: its own rounding by its inputs' moments would round them otherwise), so
that both read one weight, written once in the main graph; where the second then misses its
bound, it is converted again rounding its own, and those weights are one per branch. Every
weight a branch rounded goes to the main graph under a name of its own (the float32 one is
dropped once no branch reads it), as does a branch's own weight in a file: a large model's
attempts keep their weights on disk (on_disk.py), and the writer and ONNX Runtime's sessions
find file-backed weights in the main graph only. Where either branch misses its bound, the
model goes through choose.py as it is (its If float32).
"""

from __future__ import annotations

import contextlib
import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

import onnx

from .. import ir
from ..ir import heap, proto_subgraphs
from ..ir.slots import HALF_TYPES
from ..load.inputs import InputSets
from .choose import HalfPrecision

# a branch's model, its input specs, its real input sets and the weights rounded already
# (WeightRounding.given) -> that model in half precision
BranchConverter = Callable[[onnx.ModelProto, InputSets, dict | None], HalfPrecision]


def merged_branches(model: onnx.ModelProto) -> list[str] | None:
    """The attribute names of the branches of the model's one If (module doc); None where the
    model is not one If whose branches read only the model's inputs and initializers."""
    graph = model.graph
    if len(graph.node) != 1 or graph.node[0].op_type != "If" or graph.sparse_initializer:
        return None
    known = {value.name for value in graph.input} | {tensor.name for tensor in graph.initializer}
    # a default the caller may override is an input, not a weight to round into the branch
    overridable = {tensor.name for tensor in ir.overridable_initializers(model)}
    names = []
    for attribute in graph.node[0].attribute:
        if attribute.type != onnx.AttributeProto.GRAPH:
            continue
        reads = ir.proto_outer_reads(attribute.g)
        if not reads <= known or reads & overridable or any(proto_subgraphs(node) for node in attribute.g.node):
            return None
        names.append(attribute.name)
    return names if len(names) == 2 else None


def branch_model(model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """The branch `name` of the model's If (merged_branches) as a model: the main graph's
    inputs and weights it reads, its nodes, weights and outputs."""
    graph = model.graph
    branch = next(attribute.g for attribute in graph.node[0].attribute if attribute.name == name)
    outer = ir.proto_outer_reads(branch)
    weights = [tensor for tensor in graph.initializer if tensor.name in outer]
    inputs = [value for value in graph.input if value.name in outer and value.name not in {t.name for t in weights}]
    own = onnx.helper.make_graph(
        list(branch.node), f"{graph.name}_{name}", inputs, list(branch.output), weights + list(branch.initializer),
        value_info=list(branch.value_info),
    )  # fmt: skip
    made = onnx.helper.make_model(own, opset_imports=list(model.opset_import))
    made.ir_version = model.ir_version
    return made


def in_half_by_branch(model: onnx.ModelProto, inputs: InputSets, convert: BranchConverter) -> HalfPrecision | None:
    """`model` (an If over two branches: merged_branches) with each branch converted by
    `convert`; the main graph's weights the first branch rounded given to the second, rounded
    so (converted again without them where the second then misses its bound); None where it
    is not such a model or where a branch misses its bound. A large model's branches keep their
    weights in folders of their own (on_disk.py): the result's `files`, the caller's to close
    once it is written."""
    branches = merged_branches(model)
    if branches is None:
        return None
    files = contextlib.ExitStack()
    try:
        converted = _by_branch(model, branches, inputs, convert, files)
    except BaseException:
        files.close()
        raise
    if converted is None:
        files.close()
    return converted


def _by_branch(
    model: onnx.ModelProto,
    branches: list[str],
    inputs: InputSets,
    convert: BranchConverter,
    files: contextlib.ExitStack,
) -> HalfPrecision | None:
    """in_half_by_branch's conversions, the folders of their weights entered into `files`."""
    main_weights = {tensor.name for tensor in model.graph.initializer}
    converted: list[tuple[str, HalfPrecision]] = []
    given: dict[str, tuple[onnx.TensorProto, str]] = {}
    in_files = False
    for name in branches:
        branch = branch_model(model, name)
        reads = {value.name for value in branch.graph.input}
        sets = replace(
            inputs,
            specs=[spec for spec in inputs.specs if spec.name in reads],
            given=[{k: v for k, v in feeds.items() if k in reads} for feeds in inputs.given],
        )
        half = convert(branch, sets, given or None)
        if given and not half.passed:
            _close(half)
            given = {}
            half = convert(branch, sets, None)
        del branch  # its float32 weights: one branch's at a time
        heap.release_after(model)  # the first branch's sessions and evaluators, before the second's
        if half.files is not None:
            files.enter_context(half.files)
            in_files = True
        if not half.passed:
            return None
        if not converted:
            given = _rounded_weights(half, main_weights)
        converted.append((name, replace(half, rounding=None, files=None)))  # its rounding holds the branch's graph
    second = converted[1][1].model.graph
    shared = {name: way for name, (tensor, way) in given.items() if _holds(second, tensor)}
    return replace(_assembled(model, converted, shared), files=files if in_files else None)


def _close(half: HalfPrecision) -> None:
    if half.files is not None:
        half.files.close()


def _rounded_weights(half: HalfPrecision, names: set[str]) -> dict[str, tuple[onnx.TensorProto, str]]:
    """The weights of `names` that `half` holds rounded: name -> (the tensor, its way)."""
    return {
        tensor.name: (tensor, half.rounding.way(tensor.name))
        for tensor in half.model.graph.initializer
        if tensor.name in names and tensor.data_type in HALF_TYPES.values() and half.rounding is not None
    }


def _assembled(
    model: onnx.ModelProto, converted: list[tuple[str, HalfPrecision]], shared: dict[str, str]
) -> HalfPrecision:
    """`model` with each branch's graph the converted one's, and what was chosen in both. The
    weights of `shared` (name -> its way of rounding) both branches read as the first rounded
    them: written once, counted once."""
    result = onnx.ModelProto()
    result.CopyFrom(model)
    node = result.graph.node[0]
    weights = _MainWeights(result.graph, shared)
    for attribute in node.attribute:
        for name, half in converted:
            if attribute.name == name:
                _replace_branch(attribute.g, half.model.graph, weights, name)
    _drop_unread(result.graph)
    _interface_as_branches(result.graph, [half.model.graph for _, half in converted])
    result = ir.deduplicate_initializers(result).model
    first, second = (half for _, half in converted)
    judged = {}  # each If output: the worse of the branch outputs at its position
    for position, output in enumerate(node.output):
        pair = [half.outputs[half.model.graph.output[position].name] for half in (first, second)]
        judged[output] = max(pair, key=lambda judgement: judgement.ratio)
    kept = [replace(entry, node=f"{node.name or node.output[0]}/{name}/{entry.node}")
            for name, half in converted for entry in half.kept]  # fmt: skip
    rounded = Counter(first.weights_rounded) + Counter(second.weights_rounded) - Counter(shared.values())
    return HalfPrecision(
        result, first.dtype, first.io_dtype, first.nodes_half + second.nodes_half, first.casts + second.casts,
        kept, judged, first.against if first.against == second.against else "float32",
        first.attempts + second.attempts, first.measured + second.measured, dict(rounded),
        bound_by="rounded" if "rounded" in (first.bound_by, second.bound_by) else "float32",
    )  # fmt: skip


class _MainWeights:
    """The main graph's weights as the converted branches go back: the ones a branch rounded,
    and a branch's own that are in a file (on_disk.py: the writer and ONNX Runtime's sessions
    find file-backed weights in the main graph only), added there under names of their own."""

    def __init__(self, graph: onnx.GraphProto, shared: dict[str, str]):
        self.graph = graph
        self.types = {tensor.name: tensor.data_type for tensor in graph.initializer}  # as the model has them
        self.shared = shared
        self._placed: dict[str, str] = {}  # a shared weight -> its name, once the first branch placed it
        self._taken = set().union(*map(ir.proto_own_names, ir.proto_scopes(graph)))

    def as_is(self, tensor: onnx.TensorProto) -> bool:
        """Whether `tensor` is the main graph's own, as the model has it."""
        return self.types.get(tensor.name) == tensor.data_type

    def placed(self, tensor: onnx.TensorProto, tag: str) -> str | None:
        """The name the main graph reads `tensor` (of the branch `tag`) by; None for a weight
        that stays in the branch (one of its own, held in memory)."""
        if tensor.name in self._placed:
            return self._placed[tensor.name]
        if tensor.name not in self.types and not ir.is_file_backed(tensor):
            return None
        # the model's float32 weight may still be read by the other branch: a name of its own
        base = f"{tensor.name}__{'half' if tensor.name in self.shared else tag}"
        name = next(name for n in itertools.count() if (name := base if n == 0 else f"{base}{n}") not in self._taken)
        self._taken.add(name)
        copy = self.graph.initializer.add()
        copy.CopyFrom(tensor)
        copy.name = name
        if tensor.name in self.shared:
            self._placed[tensor.name] = name
        return name


def _replace_branch(branch: onnx.GraphProto, converted: onnx.GraphProto, weights: _MainWeights, tag: str):
    """`branch`'s nodes, weights and value infos the `converted` graph's (whose inputs are the
    outer scope's). A weight of the main graph the conversion left as it was is read there; one
    it rounded goes to the main graph (_MainWeights), as do the branch's own in files."""
    renamed = {}
    del branch.initializer[:]
    for tensor in converted.initializer:
        if weights.as_is(tensor):
            continue
        name = weights.placed(tensor, tag)
        if name is None:
            branch.initializer.add().CopyFrom(tensor)
        else:
            renamed[tensor.name] = name
    del branch.node[:]
    branch.node.extend(converted.node)
    ir.read_outer_as(branch, renamed)
    del branch.output[:]
    branch.output.extend(converted.output)
    del branch.value_info[:]
    weight_names = set(weights.types) | set(renamed)
    branch.value_info.extend(value for value in converted.value_info if value.name not in weight_names)


def _interface_as_branches(graph: onnx.GraphProto, branches: list[onnx.GraphProto]) -> None:
    """The main graph's inputs and outputs in the types the converted branches read and make
    them: a half interface's (--io-dtype fp16), float32's as before."""
    read = {value.name: value.type.tensor_type.elem_type for branch in branches for value in branch.input}
    made = {
        produced: value.type.tensor_type.elem_type for produced, value in zip(graph.node[0].output, branches[0].output)
    }
    for value in (*graph.input, *graph.output, *graph.value_info):
        kind = read.get(value.name, made.get(value.name))
        if kind is not None and value.type.HasField("tensor_type"):
            value.type.tensor_type.elem_type = kind


def _holds(graph: onnx.GraphProto, tensor: onnx.TensorProto) -> bool:
    """Whether `graph` holds `tensor` (by name, in its type): the second branch rounded it as given."""
    return any(own.name == tensor.name and own.data_type == tensor.data_type for own in graph.initializer)


def _drop_unread(graph: onnx.GraphProto) -> None:
    """The main graph's weights that no scope reads any more (those each branch rounded)."""
    read = {name for scope in ir.proto_scopes(graph) for node in scope.node for name in node.input}
    for index in reversed(range(len(graph.initializer))):
        if graph.initializer[index].name not in read:
            del graph.initializer[index]
