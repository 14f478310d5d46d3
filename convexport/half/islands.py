"""The model's own float32 islands: what its code computes in float32 by casting into it.

Transformers' code upcasts where half precision is known to lose: Llama's RMSNorm (and
Mistral's, Qwen2's, Phi-3's) computes `hidden_states.to(torch.float32)`, its variance
and the normalised value in float32, then `.to(input_dtype)`; a rotary embedding computes its
angles from `position_ids.float()`, casting cos and sin back to the activations' type.
Exported in float32 these are Casts to float32 of float32 values, no-ops, and converted node
by node they go to half with everything else: the variance is summed in half, positions past
2048 are rounded, and ONNX Runtime's level-2 fusion of such a norm into one kernel reads an
epsilon stored in half as its default 1e-5 (it reads the Add's constant only where it is
float32), where the model's is 1e-6: optimum's Llama came out further from the exact result
than ONNX Runtime's own float16 route so, and nearer with its islands float32
(bench/RESULTS.md).

An island starts at the readers of a Cast into float32 (float32 values of a float or an
integer input) and takes in each node whose float inputs are all the island's or constants
and that reads no weight of two dims or more, on through the Casts into float32 that read it
(its casts back, a no-op in float32: Llama's scale then multiplies in float32, and the
norm's pattern has no Cast inside), and on through each residual Add that sums its stream
with a block's output into the next norm's Cast, so that a transformer's residual stream and
its norms are one island; or up to them where going on would split a kernel. Summed in
half, the stream would reach each norm through a Cast into float32 between the Add and the
norm, where ONNX Runtime's transformer optimizer fuses the two into a
SkipSimplifiedLayerNormalization in the float32 model and would fuse only the norm.
Kept float32, its values are cast into half where the rest reads them: where the model has
a cast back, and where a node outside reads one (Gemma's and T5's norms, whose scale's Mul
feeds the projections); what it reads from outside (a block's output) is cast into float32.
An island is taken only where no such Cast falls inside a kernel that ONNX Runtime's
transformer optimizer fuses (BERT's mask arithmetic, added to the scores inside the
Attention it fuses, is left to the other steps): a Cast there would stop the fusion. An
island may make a graph output (an encoder's last norm): with a float32 interface that
output then needs no Cast.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import onnx
from onnx import TensorProto

from ..ir import SHAPE_ONLY_OPS, proto_constants, proto_outer_reads, proto_scopes, proto_subgraphs, scoped_name
from ..ir.slots import DataSlots
from .cast_chains import cast_to

FLOAT = TensorProto.FLOAT
# The FLOPs an island may cost, as a share of the model's: a norm's statistics and a rotary
# embedding's angles are a few elementwise ops per activation, where a Cast into float32 at
# the model's input would make an island of all of it
ISLAND_FLOPS_SHARE = 0.05


def float32_islands(
    model: onnx.ModelProto,
    candidates: dict[int, DataSlots],
    types: dict[str, int],
    flops: list[float],
    kernels: list[set[int]],
) -> list[Island]:
    """The islands (module doc) among `candidates` of ISLAND_FLOPS_SHARE of the model's FLOPs
    or less each, none of whose exits or entries falls inside one of `kernels` (fused kernels'
    node indices): from each start the widest that is (on through residual Adds and casts
    back, through casts back only, up to them). A Cast into float32 that reads an island's
    value is its cast back, never the start of another."""
    nodes = model.graph.node
    # a Constant node's value of another form (value_float, ...) is a single value or a list
    constants = {node.output[0]: 0 for node in nodes if node.op_type == "Constant"}
    constants.update({name: len(tensor.dims) for name, tensor in proto_constants(model.graph).items()})
    readers: dict[str, list[int]] = {}
    for index, node in enumerate(nodes):
        for name in node.input:
            readers.setdefault(name, []).append(index)
    producer = {name: index for index, node in enumerate(nodes) for name in node.output}
    casts_in = {index for index, node in enumerate(nodes) if _casts_to_float(node) and index in candidates}
    upcast = {name for index in casts_in for name in nodes[index].output}
    islands: list = []
    taken: set[int] = set()
    made_by_islands: set[str] = set()
    allowed = ISLAND_FLOPS_SHARE * sum(flops)
    for start in sorted(casts_in):
        if nodes[start].input[0] in made_by_islands:
            continue  # a cast back
        for residual, through in ((True, True), (False, True), (False, False)):
            island = _grown(nodes, start, casts_in, candidates, constants, types, upcast, readers, through, residual)
            if not island or island & taken or sum(flops[index] for index in island) > allowed:
                continue
            made = {name: index for index in island for name in nodes[index].output if types.get(name) == FLOAT}
            if _splits_a_kernel(made, island, readers, casts_in, nodes, kernels):
                continue
            if _entered_inside_a_kernel(island, made, nodes, producer, constants, upcast, types, kernels):
                continue
            islands.append(Island(frozenset(island), _entry_casts(nodes, producer, island, upcast)))
            taken |= island
            made_by_islands |= made.keys()
            break
    return islands


def _splits_a_kernel(made: dict[str, int], island: set[int], readers, casts_in, nodes, kernels) -> bool:
    """Whether a value the island makes (name -> its node) is read outside it, other than by
    its casts back or a Shape or Size (which read no element: they take no Cast), by a node in
    one fused kernel with the node that makes it: in half that reader takes a Cast the kernel's
    pattern has no place for (BERT's mask, added to the scores inside its Attention)."""
    for name, maker in made.items():
        for reader in readers.get(name, ()):
            if reader in island or reader in casts_in or nodes[reader].op_type in SHAPE_ONLY_OPS:
                continue
            if _in_one_kernel(maker, reader, kernels):
                return True
    return False


def _entered_inside_a_kernel(island, made, nodes, producer, constants, upcast, types, kernels) -> bool:
    """Whether a node of the island reads a float value made outside it (not through a Cast
    into float32) from a node in one fused kernel with it: the Cast into float32 there would
    split the kernel (a residual Add read from inside a SkipLayerNormalization's pattern)."""
    for index in island:
        for name in nodes[index].input:
            if name in made or name in constants or name in upcast or types.get(name) != FLOAT:
                continue
            maker = producer.get(name)
            if maker is not None and _in_one_kernel(maker, index, kernels):
                return True
    return False


def _in_one_kernel(one: int, other: int, kernels: list[set[int]]) -> bool:
    return any(one in kernel and other in kernel for kernel in kernels)


@dataclass(frozen=True)
class Island:
    """An island's nodes, and the Casts that bring its inputs into float32 (the model's, and
    the Casts those read: a position's Cast from int64, then to float32), which keep the
    precision the island's readers and the fusions around them give them."""

    nodes: frozenset[int]
    entries: frozenset[int]


def _entry_casts(nodes, producer: dict[str, int], island: set[int], upcast: set[str]) -> frozenset[int]:
    pending = [producer[name] for index in island for name in nodes[index].input if name in upcast]
    entries: set[int] = set()
    while pending:
        index = pending.pop()
        if index not in entries and nodes[index].op_type == "Cast":
            entries.add(index)
            pending += [producer[name] for name in nodes[index].input if name in producer]
    return frozenset(entries)


def _grown(nodes, start, casts_in, candidates, constants, types, upcast, readers, through: bool, residual: bool):
    """The island from the Cast at `start` (node indices): in node order (a node's inputs are
    made before it), each node reading one of its values whose other float inputs are its
    values, constants, or other Casts into float32; no node with a weight of two dims or more
    (a projection after a norm is the model's, not the island's arithmetic). `through`: on
    past its casts back (a no-op in float32), so that what the model then does in half
    before a projection (Llama's scale, `weight * x.to(dtype)`) is the island's too, and the
    pattern ONNX Runtime's optimizer fuses as a norm has no Cast into half inside.
    `residual` (with `through`): on through each residual Add (_residual_add), so that a
    transformer's residual stream between its norms is the island's, summed in float32; the
    norm after it reads it without a Cast between, and ONNX Runtime's optimizer fuses the Add
    with the norm (SkipSimplifiedLayerNormalization) as it does in the float32 model."""
    inside, island = set(nodes[start].output), set()
    # in float32 the start's input is its value (a no-op Cast): a residual Add reads that
    aliases = {nodes[start].input[0]} if types.get(nodes[start].input[0]) == FLOAT else set()
    for index in range(start + 1, len(nodes)):
        if index in casts_in and through and nodes[index].input[0] in inside:
            island.add(index)
            inside.update(nodes[index].output)
            continue
        if index in casts_in or index not in candidates:
            continue
        if any(constants.get(name, 0) >= 2 for name in nodes[index].input):
            continue
        floats = [name for name in nodes[index].input if name and types.get(name) == FLOAT and name not in constants]
        if any(name in inside for name in floats) and all(name in inside or name in upcast for name in floats):
            island.add(index)
            inside |= {*floats, *nodes[index].output}
        elif residual and through and _residual_add(nodes, index, floats, inside | aliases, casts_in, readers):
            island.add(index)
            inside.update(nodes[index].output)
    return island


def _residual_add(nodes, index: int, floats: list[str], inside: set[str], casts_in: set[int], readers) -> bool:
    """Whether the node at `index` is a residual Add between two islands: of a value of the
    island and one made outside it (a block's output, cast into float32 to be added), its sum
    cast into float32 by the model again (the next norm's no-op Cast). Only such an Add joins
    the island with an input from outside: the model sums the stream its norms read in
    float32, and the block's arithmetic stays the half precision's."""
    if nodes[index].op_type != "Add" or len(floats) != 2 or sum(name in inside for name in floats) != 1:
        return False
    return any(reader in casts_in for reader in readers.get(nodes[index].output[0], ()))


def no_op_casts_in_subgraphs(model: onnx.ModelProto) -> frozenset[str]:
    """The Casts into float32 of float32 activations in an If's (a Loop's) subgraphs, by
    ir.scoped_name: the no-ops where the model's code computes in float32 that islands start
    at, which constant folding removes there, where no fused kernel keeps them (optimum's
    merged decoders). In the main graph the transformer optimizer's kernels keep the norms'
    (rewrite/transformer_fusions.py), and keeping the rest cost Casts for no error measured (T5's
    softmax upcast: bench/RESULTS.md). An activation is computed from a float input or a
    weight of two dims or more (an embedding's), other than through a Shape: a Cast in a
    mask's or a shape's arithmetic, which folding should take, is none. A Cast whose input's
    type the model does not record is left out, and one whose scoped name another node bears."""
    found: list[str] = []

    def walk(graph: onnx.GraphProto, outer: dict[str, int], outer_data: set[str], inside: bool) -> None:
        types = dict(outer)
        types.update({v.name: v.type.tensor_type.elem_type for v in (*graph.input, *graph.value_info, *graph.output)})
        types.update({name: tensor.data_type for name, tensor in proto_constants(graph).items()})
        data = set(outer_data) | {value.name for value in graph.input if types.get(value.name) == FLOAT}
        data |= {tensor.name for tensor in graph.initializer if tensor.data_type == FLOAT and len(tensor.dims) >= 2}
        for node in graph.node:  # in graph order: a node's inputs are made before it
            reads = set(node.input) | {name for sub in proto_subgraphs(node) for name in proto_outer_reads(sub)}
            if not reads & data or node.op_type in SHAPE_ONLY_OPS:
                continue
            data.update(node.output)
            if inside and _casts_to_float(node) and types.get(node.input[0]) == FLOAT:
                found.append(scoped_name(graph, node))
            for sub in proto_subgraphs(node):
                walk(sub, types, data, True)

    walk(model.graph, {}, set(), False)
    named = Counter(scoped_name(scope, node) for scope in proto_scopes(model.graph) for node in scope.node)
    return frozenset(key for key in found if named[key] == 1)


def _casts_to_float(node: onnx.NodeProto) -> bool:
    return node.op_type == "Cast" and cast_to(node) == FLOAT
