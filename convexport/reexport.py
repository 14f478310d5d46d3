"""Export a rewritten graph reusing the protos of everything no rewrite changed.

onnx-graphsurgeon's exporter rebuilds every NodeProto and ValueInfoProto from its objects
(make_node, make_attribute, make_tensor_value_info for each): on a 4,678-node graph that is
80 of its 118 ms, although a rewrite touches a few nodes and the rest would come out as they
went in. `Originals` remembers, at import, each main-graph node's NodeProto with what it was
built from (op, domain, name, input and output names, attributes) and each tensor's
ValueInfoProto with its dtype and shape; `export_graph` copies a proto whenever its object
still reads the same, and asks onnx-graphsurgeon for the rest (on that graph: 19 ms to
record, 30 ms to export, against 100 ms to rebuild it all). "Reads the same" is checked
against the values, not trusted from the engine's bookkeeping, so a rule or plugin that edits
a node in place (an attribute list included) gets its node re-exported.

Nodes with graph attributes (If, Loop, Scan) and attributes that are not plain ints, floats,
strings or lists of those are always re-exported: their subgraphs and tensors may have changed
without the node's own fields showing it.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter
from onnx_graphsurgeon.ir.tensor import LazyValues, SparseValues

from .graph import overridable_initializers, tensor_map

_PLAIN = (int, float, str)


class Originals:
    """What a model's main graph was imported from, keyed by the id() of the gs objects:
    nodes[id] = (node, proto, _fields(node), attributes copied), values[id] = (tensor,
    proto, name, dtype, shape copied); the object itself is kept so that its id stays its own."""

    def __init__(self, graph: gs.Graph, model: onnx.ModelProto):
        self.nodes: dict[int, tuple] = {}
        self.values: dict[int, tuple] = {}
        value_info: dict[str, onnx.ValueInfoProto | None] = {}
        for proto in model.graph.value_info:     # a name given twice: gs merged them, rebuild it
            value_info[proto.name] = None if proto.name in value_info else proto
        protos = model.graph.node
        if len(protos) != len(graph.nodes):      # gs imports the nodes in the proto's order
            return
        for node, proto in zip(graph.nodes, protos):
            attrs = _plain_attributes(node.attrs)
            if attrs is not None and node.op == proto.op_type:
                self.nodes[id(node)] = (node, proto, _fields(node), attrs)
            for tensor in node.outputs:         # value_info describes node outputs
                info = value_info.get(tensor.name)
                if info is not None:
                    shape = tensor.shape
                    self.values[id(tensor)] = (tensor, info, tensor.name, tensor.dtype,
                                               None if shape is None else list(shape))

    def node_proto(self, node: gs.Node) -> onnx.NodeProto | None:
        """The imported proto when `node` still reads as it was imported, else None."""
        seen = self.nodes.get(id(node))
        if seen is None or seen[0] is not node or _fields(node) != seen[2] or node.attrs != seen[3]:
            return None
        return seen[1]

    def value_info(self, tensor: gs.Variable) -> onnx.ValueInfoProto | None:
        seen = self.values.get(id(tensor))
        if seen is None or seen[0] is not tensor or (tensor.name, tensor.dtype, tensor.shape) != seen[2:]:
            return None
        return seen[1]


def _fields(node: gs.Node) -> tuple:
    return (node.op, node.domain, node.name, [t.name for t in node.inputs], [t.name for t in node.outputs])


def _plain_attributes(attrs: dict) -> dict | None:
    """A copy of attrs whose values are plain (lists copied), None if any is not."""
    copied = dict(attrs)
    for key, value in attrs.items():
        kind = type(value)
        if kind is list:
            for item in value:
                if type(item) not in _PLAIN:
                    return None
            copied[key] = list(value)
        elif kind not in _PLAIN:
            return None
    return copied


def export_graph(graph: gs.Graph, template: onnx.ModelProto, originals: Originals | None = None) -> onnx.ModelProto:
    """gs.Graph -> ModelProto keeping the template's IR version, opsets and metadata; with
    `originals`, the main graph's unchanged nodes and value_info are the imported protos."""
    originals = originals or Originals(gs.Graph(), onnx.ModelProto())
    model = onnx.ModelProto(graph=onnx.GraphProto(name=graph.name, doc_string=graph.doc_string),
                            opset_import=template.opset_import,
                            functions=[OnnxExporter.export_function(f) for f in graph.functions])
    proto = model.graph     # filled in place (onnx.helper.make_model would copy it whole)
    nodes, renamed = [], []         # protos, copied in one extend (a fifth less than one by one)
    for node in graph.nodes:
        imported = originals.node_proto(node)
        if imported is None:
            nodes.append(exported_node(node))
        else:
            if imported.name != node.name:      # import_graph names the nodes that had no name
                renamed.append((len(nodes), node.name))
            nodes.append(imported)
    proto.node.extend(nodes)
    for index, name in renamed:
        proto.node[index].name = name
    proto.input.extend(OnnxExporter.export_value_info_proto(t, False) for t in graph.inputs)
    input_names = {t.name for t in graph.inputs}       # an input with a default keeps its initializer
    proto.initializer.extend(init for init in overridable_initializers(template) if init.name in input_names)
    proto.output.extend(OnnxExporter.export_value_info_proto(t, False) for t in graph.outputs)
    ends = {id(t) for t in (*graph.inputs, *graph.outputs)}
    initializers, sparse, value_info = [], [], []
    for tensor in tensor_map(graph).values():
        if isinstance(tensor, gs.Constant):
            if isinstance(tensor._values, SparseValues):
                sparse.append(OnnxExporter.export_sparse_tensor_proto(tensor))
            else:
                initializers.append(exported_constant(tensor))
        elif id(tensor) not in ends and (tensor.dtype is not None or tensor.shape is not None):
            imported = originals.value_info(tensor)
            value_info.append(imported if imported is not None else OnnxExporter.export_value_info_proto(tensor, False))
    proto.initializer.extend(initializers)
    proto.sparse_initializer.extend(sparse)
    proto.value_info.extend(value_info)
    model.ir_version = template.ir_version
    model.producer_name = template.producer_name or "convexport"
    model.producer_version = template.producer_version
    model.metadata_props.extend(template.metadata_props)
    return model


def nodes_as_model(nodes: list[gs.Node], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
                   constants: list[gs.Constant], opset: int, name: str) -> onnx.ModelProto:
    """Some of a graph's nodes as a model of their own, exported node by node (exported_node,
    exported_constant: the imported protos stay as they are): the graph's tensors are only read
    (a gs.Graph built over them would relink them). `constants` become initializers; the IR
    version is one ONNX Runtime 1.14+ reads."""
    graph = onnx.helper.make_graph([exported_node(node) for node in nodes], name, inputs, outputs,
                                   [exported_constant(t) for t in constants])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)], ir_version=10)


def exported_node(node: gs.Node) -> onnx.NodeProto:
    """OnnxExporter.export_node(node), byte for byte, built directly where every attribute is
    a plain int, float or str or a non-empty list of one of those (a new Conv: 12 us against
    34 us); gs's exporter for anything else (tensors, graphs, references, numpy scalars)."""
    proto = plain_node_proto(node.op, node.name, node.domain, [t.name for t in node.inputs],
                             [t.name for t in node.outputs], node.attrs)
    return OnnxExporter.export_node(node) if proto is None else proto


def plain_node_proto(op: str, name: str, domain: str | None, inputs: list[str], outputs: list[str],
                     attrs: dict) -> onnx.NodeProto | None:
    """The NodeProto gs exports for a node of these fields, None unless every attribute is
    plain (see exported_node)."""
    attributes = []
    for key, value in attrs.items():
        attribute = _plain_attribute(key, value)
        if attribute is None:
            return None
        attributes.append(attribute)
    proto = onnx.NodeProto(op_type=op, input=inputs, output=outputs, attribute=attributes)
    if name:            # as onnx.helper.make_node sets them
        proto.name = name
    if domain is not None:
        proto.domain = domain
    return proto


_SCALAR_FIELDS = {int: ("i", onnx.AttributeProto.INT), float: ("f", onnx.AttributeProto.FLOAT)}
_LIST_FIELDS = {int: ("ints", onnx.AttributeProto.INTS), float: ("floats", onnx.AttributeProto.FLOATS)}


def _plain_attribute(key: str, value) -> onnx.AttributeProto | None:
    """onnx.helper.make_attribute(key, value) for a plain value, else None. Built once per
    name, type and value (a new Conv's five attributes: 10 of its 18 us), keyed by the items'
    types too, since 1 == 1.0 == True: a node's constructor copies the proto it is given."""
    kind = type(value)
    if kind is list:
        items = tuple(value)
        item_types = tuple(map(type, items))
        if len(set(item_types)) != 1 or item_types[0] not in _PLAIN:   # empty (gs cannot type it), mixed
            return None                                                 # (make_attribute's rules) or not plain
        return _attribute_of(key, kind, items, item_types)
    return _attribute_of(key, kind, value, None) if kind in _PLAIN else None


@functools.lru_cache(maxsize=4096)
def _attribute_of(key: str, kind: type, value, item_types: tuple | None) -> onnx.AttributeProto:
    if kind in _SCALAR_FIELDS:
        field, code = _SCALAR_FIELDS[kind]
        return onnx.AttributeProto(name=key, type=code, **{field: value})
    if kind is str:
        return onnx.AttributeProto(name=key, type=onnx.AttributeProto.STRING, s=value.encode())
    item = item_types[0]
    if item in _LIST_FIELDS:
        field, code = _LIST_FIELDS[item]
        return onnx.AttributeProto(name=key, type=code, **{field: value})
    return onnx.AttributeProto(name=key, type=onnx.AttributeProto.STRINGS, strings=[v.encode() for v in value])


def exported_constant(tensor: gs.Constant) -> onnx.TensorProto:
    """OnnxExporter.export_tensor_proto(tensor), byte for byte, built directly for a NumPy
    array of a plain numeric type, exported as its own type and not placed (a folded weight:
    2 against 7.5 us); an imported initializer not loaded is its own proto, or a copy named as
    the tensor is now where it was renamed (gs renames the imported proto itself, which belongs
    to the model the graph was imported from); gs's exporter for the rest."""
    values = tensor._values
    if type(values) is LazyValues:
        if values.tensor.name == tensor.name:
            return values.tensor
        renamed = onnx.TensorProto()
        renamed.CopyFrom(values.tensor)
        renamed.name = tensor.name
        return renamed
    if (type(values) is not np.ndarray or tensor._export_dtype is not None or tensor.data_location is not None
            or values.dtype not in RAW_TYPES):
        return OnnxExporter.export_tensor_proto(tensor)
    return array_proto(tensor.name, values)


def array_proto(name: str, values: np.ndarray) -> onnx.TensorProto:
    """The TensorProto gs exports for a gs.Constant of this name holding `values`, a NumPy
    array of a type in RAW_TYPES."""
    return onnx.TensorProto(name=name, data_type=RAW_TYPES[values.dtype], dims=values.shape,
                            raw_data=values.tobytes())


# NumPy types whose bytes (ndarray.tobytes, as gs writes them) are the raw_data of their ONNX type
RAW_TYPES = {np.dtype(t): onnx.helper.np_dtype_to_tensor_dtype(np.dtype(t)) for t in (
    np.float32, np.float64, np.float16, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
    np.uint64, np.bool_)}
