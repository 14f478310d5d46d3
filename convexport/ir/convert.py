"""onnx.ModelProto <-> gs.Graph, and a few of a graph's nodes as a model of their own."""

from __future__ import annotations

import contextlib

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.logger import G_LOGGER

from .naming import name_nodes
from .provenance import Provenance
from .scopes import all_graphs, proto_scopes
from .weight_files import is_file_backed, tensor_array

# onnx-graphsurgeon warns (on stderr, several lines) whenever a bfloat16 constant is read as
# float32, which is exact; convexport keeps stderr for its one-line messages.
G_LOGGER.severity = G_LOGGER.ERROR

IR_VERSION = 10  # of the models convexport builds itself: ONNX Runtime 1.14 and later read it


def import_graph(model: onnx.ModelProto) -> gs.Graph:
    """The model's graph, every node named (reports name nodes), its overridable initializers
    kept as the graph inputs they are (see below), and, as `graph.provenance`, what the model
    says of its nodes, values and scopes that gs does not keep (provenance.py: export_graph
    puts it back). The graph's initializers read the model's own protos until a rewrite needs
    their values (no copy of the weights: bench/RESULTS.md, "Measurements behind the code"); export_graph
    gives a renamed one a proto of its own first (see _owned_if_renamed)."""
    graph = gs.import_onnx(model)
    _file_backed_read_from_files(graph)
    _inputs_with_defaults_stay_inputs(graph, model)
    given = [[node.name for node in scope.nodes] for scope in all_graphs(graph)]
    name_nodes(graph)
    graph.provenance = Provenance.record(model, graph, given)
    return graph


class FileValues(gs.ir.tensor.LazyValues):
    """A file-backed initializer's values (weight_files), read from its file when a rule asks
    for them: gs's own would read them into the proto, and keep them there."""

    def load(self) -> np.ndarray:
        values = tensor_array(self.tensor)
        return values if values.flags.writeable else values.copy()


def _file_backed_read_from_files(graph: gs.Graph) -> None:
    for tensor in graph.tensors().values():
        values = getattr(tensor, "_values", None)
        if isinstance(values, gs.ir.tensor.LazyValues) and is_file_backed(values.tensor):
            tensor._values = FileValues(values.tensor)


def overridable_initializers(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """Initializers that are also main-graph inputs: from IR version 4 on, a default value the
    caller may feed something else in place of (ONNX Runtime does not fold them either), so
    not a constant; under IR 3 every initializer had to be listed as an input, and is one."""
    if model.ir_version < 4:
        return []
    inputs = {value.name for value in model.graph.input}
    return [init for init in model.graph.initializer if init.name in inputs]


def _inputs_with_defaults_stay_inputs(graph: gs.Graph, model: onnx.ModelProto) -> None:
    """gs imports an initializer listed as an input as a Constant and drops it from the inputs:
    put a Variable of its type back in its place among the inputs and in its readers
    (export_graph gives it its initializer back)."""
    defaults = {init.name for init in overridable_initializers(model)}
    if not defaults:
        return
    tensors = graph.tensors()
    protos = {init.name: init for init in model.graph.initializer}
    stand_ins = {}
    for name in defaults:
        proto = protos[name]  # gs leaves out an input that no node reads: its type is the proto's
        stand_ins[name] = gs.Variable(name, onnx.helper.tensor_dtype_to_np_dtype(proto.data_type), list(proto.dims))
        constant = tensors.get(name)
        for reader in list(constant.outputs) if constant is not None else []:
            for index, tensor in enumerate(reader.inputs):
                if tensor is constant:
                    reader.inputs[index] = stand_ins[name]
    imported = {t.name: t for t in graph.inputs}
    graph.inputs = [stand_ins.get(value.name) or imported[value.name] for value in model.graph.input]


def export_graph(graph: gs.Graph, template: onnx.ModelProto) -> onnx.ModelProto:
    """gs.Graph -> ModelProto with the template's IR version, opsets, producer, doc and
    metadata, the template's initializers for the inputs that have one, and the provenance
    import_graph recorded put back on its nodes, values and scopes."""
    scopes = all_graphs(graph)
    tensor_maps = [scope.tensors() for scope in scopes]
    for scope, tensors in zip(scopes, tensor_maps):
        for tensor in tensors.values():
            _owned_if_renamed(tensor)
        for node in scope.nodes:  # a Constant node's value, an attribute holding a tensor
            for value in node.attrs.values():
                _owned_if_renamed(value)
    shared = _constants_read_in_several_scopes(tensor_maps)
    with _weights_held_back(graph) as held_back:
        model = gs.export_onnx(graph, do_type_check=False, opset_imports=_opset_imports(graph, template))
        _written_once(model.graph, shared)
        _write_held_back(model, held_back)
    input_names = {t.name for t in graph.inputs}
    model.graph.initializer.extend(init for init in overridable_initializers(template) if init.name in input_names)
    model.ir_version = template.ir_version
    model.producer_name = template.producer_name or "convexport"
    model.producer_version = template.producer_version
    model.doc_string = template.doc_string
    del model.metadata_props[:]
    model.metadata_props.extend(template.metadata_props)
    provenance = getattr(graph, "provenance", None)
    if provenance is not None:
        provenance.restore(model)
    return model


def _constants_read_in_several_scopes(tensor_maps: list[dict[str, gs.Tensor]]) -> set[str]:
    """The names of the constants that nodes of more than one scope (`tensor_maps`: each
    scope's tensors, gs.Graph.tensors) read (an optimum merged
    decoder's weights, read by both of its If's branches; a weight read by a main-graph node
    and inside a Loop body), each the name of one constant only. gs's exporter writes a
    constant as an initializer of every scope whose nodes read it, and of no other: the main
    graph drops a weight only its subgraphs read, and each branch gets a copy of its own."""
    scopes: dict[int, int] = {}
    owners: dict[str, set[int]] = {}
    for tensors in tensor_maps:
        for tensor in tensors.values():
            if isinstance(tensor, gs.Constant):
                scopes[id(tensor)] = scopes.get(id(tensor), 0) + 1
                owners.setdefault(tensor.name, set()).add(id(tensor))
    return {name for name, ids in owners.items() if len(ids) == 1 and scopes[next(iter(ids))] > 1}


def _written_once(graph: onnx.GraphProto, shared: set[str]) -> None:
    """Each of the `shared` constants (_constants_read_in_several_scopes) as one initializer of
    the main graph, where every scope sees it, instead of one per scope that reads it."""
    main = {init.name for init in graph.initializer}
    for scope in proto_scopes(graph)[1:]:
        for index in reversed(range(len(scope.initializer))):
            initializer = scope.initializer[index]
            if initializer.name in shared:
                if initializer.name not in main:
                    graph.initializer.add().CopyFrom(initializer)
                    main.add(initializer.name)
                del scope.initializer[index]


# An array this large is written into the exported model's proto directly (_weights_held_back)
HELD_BACK_BYTES = 1 << 20


@contextlib.contextmanager
def _weights_held_back(graph: gs.Graph):
    """Large array-valued constants exported with an empty placeholder, their arrays kept by
    name for _write_held_back, and the graph's constants reading the exported protos after:
    gs's exporter makes every initializer a proto of its own and the model then copies them
    all in (two copies of the new weights at once: 2 GiB at the peak of a 1 GiB model's
    rewrite); written into the model's protos one by one, each array freed as it is written,
    a weight is held once, beside one tensor's bytes."""
    held: dict[str, np.ndarray | onnx.TensorProto] = {}
    tensors = [t for scope in all_graphs(graph) for t in scope.tensors().values() if isinstance(t, gs.Constant)]
    for tensor in tensors:
        values = tensor._values  # (an unread initializer's LazyValues: exported from its proto, no copy)
        if isinstance(values, np.ndarray) and values.nbytes >= HELD_BACK_BYTES and tensor.export_dtype == values.dtype:
            held[tensor.name] = values
            tensor.values = np.empty(0, values.dtype)
    try:
        yield held
    finally:
        for tensor in tensors:
            kept = held.get(tensor.name)
            if isinstance(kept, onnx.TensorProto):
                tensor._values = gs.ir.tensor.LazyValues(kept)
            elif kept is not None:
                tensor.values = kept


def _write_held_back(model: onnx.ModelProto, held: dict) -> None:
    """Each held array into its initializer's proto, the array replaced in `held` by the proto."""
    for scope in proto_scopes(model.graph):
        for initializer in scope.initializer:
            values = held.get(initializer.name)
            if isinstance(values, np.ndarray):
                del initializer.dims[:]
                initializer.dims.extend(values.shape)
                initializer.raw_data = np.ascontiguousarray(values).tobytes()
                held[initializer.name] = initializer
                del values


def _owned_if_renamed(tensor) -> None:
    """gs's exporter gives a constant whose values were never read the imported proto itself,
    its name set in place to the tensor's: a renamed one, or an attribute's unnamed tensor
    (setting "" marks the field set), gets a copy of its proto first, so that the model
    import_graph read never changes."""
    if not isinstance(tensor, gs.Constant):  # an attribute's subgraph: gs.Graph logs an error for getattr
        return
    values = getattr(tensor, "_values", None)  # gs keeps unread values as LazyValues over the proto
    if not isinstance(values, gs.ir.tensor.LazyValues) or not isinstance(values.tensor, onnx.TensorProto):
        return
    if values.tensor.name != tensor.name or not values.tensor.HasField("name"):
        own = onnx.TensorProto()
        own.CopyFrom(values.tensor)
        tensor._values = type(values)(own)


def _opset_imports(graph: gs.Graph, template: onnx.ModelProto) -> list[onnx.OperatorSetIdProto]:
    """The template's opset imports, and version 1 of any domain a rewrite brought in (the
    com.microsoft FFT ops): ONNX Runtime refuses a node of a domain the model does not import."""
    imports = list(template.opset_import)
    known = {entry.domain or "" for entry in imports} | {"ai.onnx"}
    used = {node.domain or "" for scope in all_graphs(graph) for node in scope.nodes}
    return imports + [onnx.helper.make_opsetid(domain, 1) for domain in sorted(used - known)]


def nodes_as_model(
    nodes: list[gs.Node],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    constants: list[gs.Constant],
    opset: int,
    name: str,
) -> onnx.ModelProto:
    """Some of a graph's nodes as a model of their own (for shape inference or timing on their
    own); `constants` become initializers. The graph's objects are only read: a gs.Graph built
    over them would relink their tensors."""
    exporter = gs.exporters.onnx_exporter.OnnxExporter
    graph = onnx.helper.make_graph(
        [exporter.export_node(node) for node in nodes], name, inputs, outputs, [_constant_proto(t) for t in constants]
    )
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)], ir_version=IR_VERSION)


def _constant_proto(constant: gs.Constant) -> onnx.TensorProto:
    """The constant as a TensorProto of its own (never the imported proto it may hold)."""
    return onnx.numpy_helper.from_array(constant.values, constant.name)
