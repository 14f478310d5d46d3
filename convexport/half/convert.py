"""A float32 model rewritten to compute chosen nodes in half precision.

Every float tensor gets one home type: its producer's (float32, or the half type for the data
outputs of a node chosen to run in half), the interface's for a graph input, and for a stored
constant (an initializer or a Constant node's value) the half type when every node reading it
reads it in half: the float32 weight rounded once into the half type (rounding.py). A reader
that needs the other type reads a Cast of it, one Cast per tensor and type, placed before its
first reader (a single-valued constant, a copy of it in half instead: _half_copies); a Cast
reads its input in whatever type it is made; a Cast the model wrote from float32 into float32
(a no-op) is read past where its input is made in the type the reader wants, and goes where
nothing then reads it (_no_op_casts); where its input is made in half and it stays float32,
it is the Cast into float32 that later readers of its input read (_kept_upcasts); a graph
output whose home differs from the interface's type is cast back under its own name. A node
holding subgraphs (an If, a Loop) stays float32 whole, and what they read of this scope is
read in float32: a Cast of a tensor made in half (a half interface's input), which the
subgraphs are renamed to read. So Casts sit only at the edges between the two precisions
and at the interface; a Cast into float32 that the model casts on into float64 is one Cast
(cast_chains.py).
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from ..ir import proto_constants, proto_outer_reads, proto_subgraphs, read_outer_as
from ..ir.slots import TYPE_ATTRIBUTES, TYPE_TAGS, DataSlots
from .cast_chains import cast_to, drop_value_info, merge_widening_casts
from .rounding import WeightRounding, rounded

FLOAT = TensorProto.FLOAT
# The largest stored constant a node reading it in half gets a copy of (_half_copies) where
# others read it in float32: a fusion pattern's constants (a Gelu's 0.5 and 1, a norm's
# epsilon) are single values, where a copy of a weight would cost its bytes again
COPIED_CONSTANT_ELEMENTS = 1


@dataclass
class PrecisionPlan:
    """Which nodes (by position in the graph) run in `half`, with the operands that follow
    their data type, and the interface's float type."""

    half: int
    io_type: int
    nodes: dict[int, DataSlots] = field(default_factory=dict)


@dataclass
class Converted:
    model: onnx.ModelProto
    casts: int  # Cast nodes added, less the model's own that merged into them (cast_chains.py)
    half_nodes: int  # nodes computing in half
    # stored constants in half, by how they were rounded (rounding.WeightRounding.way)
    weights_rounded: dict[str, int] = field(default_factory=dict)
    files: contextlib.ExitStack | None = None  # the folder of a large model's weights (on_disk.py)
    removal: weakref.finalize | None = None  # removes it when the attempt is dropped


def with_precision(
    model: onnx.ModelProto, plan: PrecisionPlan, types: dict[str, int], rounding: WeightRounding
) -> Converted:
    """`model` (float32) with the nodes of `plan` in half precision (module doc); `types`
    gives the element type of each tensor by name, `rounding` rounds its stored constants."""
    converted = onnx.ModelProto()
    converted.CopyFrom(model)
    graph = converted.graph
    nodes = list(graph.node)
    plan = _readers_follow_their_inputs(graph, nodes, plan)
    wanted = _wanted_types(nodes, plan, types)
    outer = _outer_float_reads(nodes, types)
    home = _home_types(graph, nodes, plan, types, wanted, outer)
    passed_through = _no_op_casts(nodes, types)  # (before the Casts in half are retyped)
    upcasts = _kept_upcasts(nodes, passed_through, home)
    for index in plan.nodes:
        retype_attributes(nodes[index], plan.half)
    stored = _retype_constants(graph, nodes, home, rounding)
    copies = _half_copies(graph, nodes, home, wanted, plan.half)
    outputs = {value.name: value for value in graph.output}
    renamed = _renamed_outputs(nodes, home, outputs, plan.io_type, stored)
    casts: dict[tuple[str, int], onnx.NodeProto] = {}
    ordered: list[onnx.NodeProto] = []

    def read_as(name: str, want: int | None, reader: int) -> str:
        """The name the node at `reader` reads for `name` wanting it in `want`: the input of a
        Cast that changed nothing in float32 where that is made in `want`; the tensor where it
        is; the model's own Cast of it into float32 where that comes before the reader; else a
        single-valued constant's copy in `want`, or a Cast of it (made before its first
        reader)."""
        source = renamed.get(name, name)
        if want is None:
            return source
        if name in passed_through and home.get(passed_through[name]) == want:
            return read_as(passed_through[name], want, reader)
        if home.get(name, want) == want:
            return source
        if want == FLOAT and upcasts.get(name, (reader, ""))[0] < reader:
            return renamed.get(upcasts[name][1], upcasts[name][1])
        if (name, want) in copies:
            return copies[(name, want)]
        if (name, want) not in casts:
            cast = onnx.helper.make_node("Cast", [source], [f"{name}__as_{TYPE_TAGS[want]}"], to=want)
            cast.name = f"{cast.output[0]}__cast"
            casts[(name, want)] = cast
            ordered.append(cast)
        return casts[(name, want)].output[0]

    for index, node in enumerate(nodes):
        for position, name in enumerate(node.input):
            node.input[position] = read_as(name, wanted.get((index, position)), index)
        inside = {name: read for name in outer.get(index, ()) if (read := read_as(name, FLOAT, index)) != name}
        for sub in proto_subgraphs(node) if inside else ():
            read_outer_as(sub, inside)
        ordered.append(node)
    for name, inner in renamed.items():
        cast = onnx.helper.make_node("Cast", [inner], [name], to=plan.io_type, name=f"{name}__cast")
        ordered.append(cast)
    unread = _unread(ordered, passed_through, graph)
    del graph.node[:]
    graph.node.extend(node for node in ordered if node.op_type != "Cast" or node.output[0] not in unread)
    drop_value_info(graph, unread)
    _retype_interface(graph, plan.io_type)
    _retype_value_info(graph, home, renamed)
    _shape_casts(graph, casts)
    now = {**types, **home, **{cast.output[0]: want for (_, want), cast in casts.items()}}
    now.update({inner: home[name] for name, inner in renamed.items()})
    merged = merge_widening_casts(graph, now)
    ways = Counter(rounding.way(name) for name in stored)
    dropped = sum(nodes[index].op_type == "Cast" and nodes[index].output[0] in unread for index in plan.nodes)
    return Converted(converted, len(casts) + len(renamed) - merged, len(plan.nodes) - dropped, dict(ways))


def _readers_follow_their_inputs(graph, nodes, plan: PrecisionPlan) -> PrecisionPlan:
    """The plan with each node that makes no float output (Shape, a comparison, ArgMax) in half
    only where one of its float inputs is made in half: it rounds nothing of its own, and a Cast
    of a whole tensor for a Shape to read would be the only work it adds."""
    made_in_half = {
        node.output[position]
        for index, node in enumerate(nodes)
        for position in plan.nodes.get(index, DataSlots((), ())).outputs
    }
    if plan.io_type == plan.half:
        made_in_half |= {value.name for value in graph.input}
    follow = {
        index: slots
        for index, slots in plan.nodes.items()
        if slots.outputs or any(nodes[index].input[p] in made_in_half for p in slots.inputs)
    }
    return PrecisionPlan(plan.half, plan.io_type, follow)


def _wanted_types(nodes, plan: PrecisionPlan, types: dict[str, int]) -> dict[tuple[int, int], int]:
    """The type each float operand is read in: (node index, input position) -> element type;
    none for a Cast's input, which it reads in whatever type it is made (a Cast into half of a
    float32 value is the conversion itself, not a Cast of a Cast)."""
    wanted = {}
    for index, node in enumerate(nodes):
        slots = plan.nodes.get(index)
        for position, name in enumerate(node.input):
            if not name or node.op_type == "Cast":
                continue
            if slots is not None and position in slots.inputs:
                wanted[(index, position)] = plan.half
            elif types.get(name) == FLOAT:
                wanted[(index, position)] = FLOAT
    return wanted


def _outer_float_reads(nodes, types: dict[str, int]) -> dict[int, list[str]]:
    """The float tensors of this scope each node's subgraphs read (an If's branches, a Loop's
    body): node index -> names. Such a node stays float32 whole (choose.py), and its subgraphs
    read them in float32: a Cast of each one made in half, which they are renamed to read."""
    reads = {}
    for index, node in enumerate(nodes):
        names = {name for sub in proto_subgraphs(node) for name in proto_outer_reads(sub) if types.get(name) == FLOAT}
        if names:
            reads[index] = sorted(names)
    return reads


def _home_types(graph, nodes, plan: PrecisionPlan, types, wanted, outer: dict[int, list[str]]) -> dict[str, int]:
    """The type each float tensor is made in (module doc); what subgraphs read (`outer`) is
    read in float32."""
    home = {value.name: plan.io_type for value in graph.input if types.get(value.name) == FLOAT}
    for index, node in enumerate(nodes):
        slots = plan.nodes.get(index)
        for position, name in enumerate(node.output):
            if slots is not None and position in slots.outputs:
                home[name] = plan.half
            elif types.get(name) == FLOAT:
                home[name] = FLOAT
    readers: dict[str, set[int]] = {}
    for (index, position), want in wanted.items():
        readers.setdefault(nodes[index].input[position], set()).add(want)
    for names in outer.values():
        for name in names:
            readers.setdefault(name, set()).add(FLOAT)
    constants = [t.name for t in graph.initializer if t.data_type == FLOAT]
    constants += [node.output[0] for node in nodes if node.op_type == "Constant" and types.get(node.output[0]) == FLOAT]
    # a graph output, or an initializer that is also a graph input (a default the caller may
    # override), keeps the type the interface declares
    interface = {value.name for value in (*graph.output, *graph.input)}
    for name in constants:
        home[name] = plan.half if readers.get(name) == {plan.half} and name not in interface else FLOAT
    return home


def retype_attributes(node: onnx.NodeProto, half: int) -> None:
    """A half node's attributes that name the float type it makes."""
    for attribute in node.attribute:
        if attribute.name == TYPE_ATTRIBUTES.get(node.op_type) and attribute.i == FLOAT:
            attribute.i = half
        elif node.op_type == "ConstantOfShape" and attribute.name == "value" and attribute.t.data_type == FLOAT:
            attribute.t.CopyFrom(rounded(attribute.t, half))
    if node.op_type == "ConstantOfShape" and not any(a.name == "value" for a in node.attribute):
        zero = numpy_helper.from_array(np.zeros(1, np.float32))
        node.attribute.append(onnx.helper.make_attribute("value", rounded(zero, half)))


def _retype_constants(graph, nodes, home: dict[str, int], rounding: WeightRounding) -> set[str]:
    """Stored constants whose home is `rounding`'s half type, rounded once into it (rounding.py);
    their names."""
    half = rounding.half
    stored = set()
    for index, tensor in enumerate(graph.initializer):
        if home.get(tensor.name) == half and tensor.data_type == FLOAT:
            graph.initializer[index].CopyFrom(rounding.rounded(tensor))
            stored.add(tensor.name)
    for node in nodes:
        if node.op_type == "Constant" and home.get(node.output[0]) == half:
            for attribute in node.attribute:
                if attribute.name == "value":
                    attribute.t.CopyFrom(rounding.rounded(attribute.t, node.output[0]))
                elif attribute.name in ("value_float", "value_floats"):
                    values = np.array(attribute.f if attribute.name == "value_float" else list(attribute.floats))
                    attribute.CopyFrom(onnx.helper.make_attribute("value", rounded(numpy_helper.from_array(
                        values.astype(np.float32)), half)))  # fmt: skip
            stored.add(node.output[0])
    return stored


def _half_copies(graph, nodes, home, wanted, half: int) -> dict[tuple[str, int], str]:
    """A copy in `half`, rounded to nearest, of each stored float32 constant of at most
    COPIED_CONSTANT_ELEMENTS elements that a node reads in half while others read it in
    float32: (name, half) -> the copy's name. A Cast of a constant stands where a fusion's
    pattern has the constant (FastGelu's `1 + tanh`, its 1 shared with a rotary embedding's
    float32 arithmetic) and stops the fusion; ONNX Runtime would fold it into such a copy when
    it loads the model anyway."""
    read_in_half = {nodes[index].input[position] for (index, position), want in wanted.items() if want == half}
    values = proto_constants(graph)
    copies = {}
    for name in sorted(read_in_half):
        tensor = values.get(name)
        if tensor is None or home.get(name) != FLOAT or tensor.data_type != FLOAT or tensor.external_data:
            continue
        if math.prod(tensor.dims) > COPIED_CONSTANT_ELEMENTS:
            continue
        copy = rounded(tensor, half)
        copy.name = f"{name}__as_{TYPE_TAGS[half]}"
        graph.initializer.append(copy)
        copies[(name, half)] = copy.name
    return copies


def _no_op_casts(nodes, types: dict[str, int]) -> dict[str, str]:
    """The Casts into float32 of float32 values (a no-op the model's code wrote: Llama's
    `hidden_states.to(torch.float32)` exported in float32): output -> input. A reader wanting
    the type the input is made in reads the input: the same value, where a Cast of the Cast
    would be one more node, and one between two float32 nodes a node in the middle of a
    pattern ONNX Runtime fuses (it drops such Casts itself when it loads the model)."""
    return {
        node.output[0]: node.input[0]
        for node in nodes
        if node.op_type == "Cast" and types.get(node.input[0]) == FLOAT and cast_to(node) == FLOAT
    }


def _kept_upcasts(nodes, passed_through: dict[str, str], home: dict[str, int]) -> dict[str, tuple[int, str]]:
    """The model's no-op Casts into float32 (_no_op_casts) that stay float32 where what they
    cast is made in half, by the name they cast: -> (node index, output). Another node reading
    that name in float32 reads the Cast's output, where it comes after it: one Cast of the value
    into float32, not the model's and one more (a residual Add summed in float32 beside the
    norm whose Cast into float32 reads the same stream: islands.py)."""
    upcasts: dict[str, tuple[int, str]] = {}
    for index, node in enumerate(nodes):
        name = node.output[0] if node.op_type == "Cast" else None
        if name in passed_through and home.get(name) == FLOAT and home.get(passed_through[name]) != FLOAT:
            upcasts.setdefault(passed_through[name], (index, name))
    return upcasts


def _unread(ordered: list[onnx.NodeProto], passed_through: dict[str, str], graph) -> set[str]:
    """The outputs of the no-op Casts every reader now reads past (_no_op_casts)."""
    read = {name for node in ordered for name in node.input}
    read |= {name for node in ordered for sub in proto_subgraphs(node) for name in proto_outer_reads(sub)}
    read |= {value.name for value in graph.output}
    return {name for name in passed_through if name not in read}


def _renamed_outputs(nodes, home, outputs: dict, io_type: int, stored: set[str]) -> dict[str, str]:
    """Graph outputs made in another type than the interface's: output name -> the inner
    name their producer now writes (a Cast back writes the output's own name)."""
    renamed = {}
    for node in nodes:
        for position, name in enumerate(node.output):
            if name in outputs and home.get(name, io_type) != io_type and name not in stored:
                inner = f"{name}__{TYPE_TAGS[home[name]]}"
                node.output[position] = inner
                renamed[name] = inner
    return renamed


def _retype_interface(graph: onnx.GraphProto, io_type: int) -> None:
    for value in (*graph.input, *graph.output):
        if value.type.tensor_type.elem_type == FLOAT:
            value.type.tensor_type.elem_type = io_type


def _shape_casts(graph: onnx.GraphProto, casts: dict[tuple[str, int], onnx.NodeProto]) -> None:
    """A value_info for each added Cast's output: the shape of the tensor it casts, in the type
    it makes. Shape inference is not run again on the converted model, and what reads shapes
    from value_info (the report's FLOPs, later tools) would find the nodes after an input's
    Cast unshaped."""
    known = {value.name: value for value in (*graph.input, *graph.value_info, *graph.output)}
    for (name, want), cast in casts.items():
        source = known.get(name)
        if source is None or not source.type.tensor_type.HasField("shape"):
            continue
        value = graph.value_info.add()
        value.CopyFrom(source)
        value.name = cast.output[0]
        value.type.tensor_type.elem_type = want


def _retype_value_info(graph: onnx.GraphProto, home: dict[str, int], renamed: dict[str, str]) -> None:
    """value_info in the types the tensors now have; a renamed output's inner tensor keeps its
    shape under its new name."""
    for value in graph.value_info:
        if value.name in home and value.type.tensor_type.elem_type == FLOAT:
            value.type.tensor_type.elem_type = home[value.name]
    for value in graph.output:
        if value.name in renamed:
            inner = graph.value_info.add()
            inner.CopyFrom(value)
            inner.name = renamed[value.name]
            inner.type.tensor_type.elem_type = home[value.name]
