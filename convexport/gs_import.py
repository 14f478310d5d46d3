"""onnx.ModelProto -> gs.Graph: the graph gs.import_onnx builds, built at about half its cost;
and a constant's values, loaded at a third of the cost of gs's loader.

gs.import_onnx creates every node and tensor through constructors whose attribute writes go
through gs's __setattr__ hooks and whose lists synchronise element by element; on a 4,678-node
graph it took 160 ms, a fifth of `convexport optimize`. This importer fills the same objects'
fields directly (88 ms there): the same classes, the same field values, each node in its input
tensors' `outputs` and its output tensors' `inputs`, in the same order.

It relies on the fields gs's constructors set, so it checks them first: built by gs's own
constructors, a Node, a Variable, a Constant, its LazyValues and a SynchronizedList must carry
exactly the fields it fills, or (another onnx-graphsurgeon version) gs.import_onnx does the
work, as it does for models with model-local functions or sparse initializers. Node attributes
other than numbers and strings (tensors, subgraphs, references to a function's attributes) go
through gs's own attribute importer, which also imports subgraphs. constant_values leaves to gs
any weight that is not plain numeric raw data.
"""

from __future__ import annotations

import functools
import math
import sys
from collections import OrderedDict

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.importers.onnx_importer import OnnxImporter, get_itemsize, get_numpy_type
from onnx_graphsurgeon.ir.tensor import LazyValues
from onnx_graphsurgeon.util.misc import SynchronizedList

from .type_reader import TypeReader

_NODE_FIELDS = {"op", "name", "attrs", "inputs", "outputs", "domain"}
_VARIABLE_FIELDS = {"name", "inputs", "outputs", "dtype", "shape", "type"}
_CONSTANT_FIELDS = {"name", "inputs", "outputs", "_values", "data_location", "_export_dtype"}
_LAZY_FIELDS = {"tensor", "shape", "dtype", "nbytes"}
_LIST_FIELDS = {"parent_obj", "field_name"}

_ATTRIBUTE = onnx.AttributeProto
# attribute type -> its value as gs imports it; any other type goes through gs's importer
_SIMPLE_ATTRIBUTES = {
    _ATTRIBUTE.INT: lambda a: a.i,
    _ATTRIBUTE.FLOAT: lambda a: a.f,
    _ATTRIBUTE.INTS: lambda a: list(a.ints),
    _ATTRIBUTE.FLOATS: lambda a: list(a.floats),
    _ATTRIBUTE.STRING: lambda a: a.s.decode(),
    _ATTRIBUTE.STRINGS: lambda a: [s.decode() for s in a.strings],
}


def import_model(model: onnx.ModelProto) -> gs.Graph:
    """gs.import_onnx(model), field for field."""
    if model.functions or model.graph.sparse_initializer or not layout_is_known():
        return gs.import_onnx(model)
    return _Importer(model).graph()


@functools.cache
def layout_is_known() -> bool:
    """gs's constructors set exactly the fields this module fills."""
    weight = onnx.numpy_helper.from_array(np.zeros(1, np.float32), "w")
    variable = gs.Variable("x", np.float32, [1])
    constant = gs.Constant("w", LazyValues(weight))
    node = gs.Node("Relu", "n", {}, [variable], [gs.Variable("y")])
    return (set(vars(node)) == _NODE_FIELDS and set(vars(variable)) == _VARIABLE_FIELDS
            and set(vars(constant)) == _CONSTANT_FIELDS and set(vars(constant._values)) == _LAZY_FIELDS
            and set(vars(node.inputs)) == _LIST_FIELDS and isinstance(variable.inputs, SynchronizedList))


class _Importer:
    """One main graph's import; the tensors by name, as gs.OnnxImporter.import_graph keeps them."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.opset = OnnxImporter.get_opset(model)
        self.types = TypeReader(tensor_type_of)
        self.domains = OnnxImporter.get_import_domains(model)
        self.tensors: OrderedDict[str, gs.Tensor] = OrderedDict()
        self.may_hold_graphs = False        # some node's attributes went through gs's importer

    def graph(self) -> gs.Graph:
        onnx_graph, tensors = self.model.graph, self.tensors
        for initializer in onnx_graph.initializer:
            tensors.setdefault(initializer.name, _constant(initializer))
        for value in onnx_graph.value_info:     # a repeated entry fills in what the first lacked
            known = tensors.get(value.name)
            if known is None:
                tensors[value.name] = self._variable_from(value)
            elif isinstance(known, gs.Variable):
                extra = self._variable_from(value)
                known.dtype = known.dtype or extra.dtype
                known.shape = known.shape or extra.shape
        initializers = {initializer.name for initializer in onnx_graph.initializer}
        inputs = [self._described(value) for value in onnx_graph.input if value.name not in initializers]
        outputs = [self._described(value) for value in onnx_graph.output]
        nodes = [self._node(node) for node in onnx_graph.node]
        # gs.Graph walks its nodes' attributes for subgraphs, to share the model's function list
        # with them (3.5 ms on a 1,115-node graph): with neither, it is given the nodes after
        graph = gs.Graph(nodes=nodes if self.may_hold_graphs else [], inputs=inputs, outputs=outputs,
                         name=onnx_graph.name, doc_string=onnx_graph.doc_string,
                         producer_name=self.model.producer_name, producer_version=self.model.producer_version,
                         opset=self.opset, import_domains=self.domains, functions=[],
                         ir_version=self.model.ir_version)
        graph.nodes = nodes
        return graph

    def _variable_from(self, value: onnx.ValueInfoProto) -> gs.Variable:
        """OnnxImporter.import_tensor for a ValueInfoProto; a tensor type's fields read
        directly, each distinct type once (the shape a list of its own for each tensor, as gs
        gives it)."""
        read = self.types(value.type)
        if read is None:
            return OnnxImporter.import_tensor(value)
        dtype, dims = read
        return _variable(value.name, dtype, None if dims is None else list(dims))

    def _described(self, value: onnx.ValueInfoProto) -> gs.Tensor:
        known = self.tensors.get(value.name)
        if known is None:
            known = self.tensors[value.name] = self._variable_from(value)
        return known

    def _named(self, name: str) -> gs.Tensor:
        """A node's input or output: the tensor of that name, a new nameless Variable (untracked)
        for an omitted optional input or output, a new Variable for a name seen first here."""
        known = self.tensors.get(name)
        if known is None:
            if not name:
                return _variable("")
            known = self.tensors[name] = _variable(name)
        return known

    def _node(self, proto: onnx.NodeProto) -> gs.Node:
        attributes = self._attributes(proto)    # first, as in gs: a subgraph sees the outer tensors as they are
        return _linked_node(proto.op_type, proto.name, attributes, [self._named(name) for name in proto.input],
                            [self._named(name) for name in proto.output],
                            proto.domain if proto.HasField("domain") else None)

    def _attributes(self, proto: onnx.NodeProto) -> OrderedDict:
        attributes = simple_attributes(proto)
        if attributes is None:
            self.may_hold_graphs = True
            return OnnxImporter.import_attributes(proto.attribute, OrderedDict(), self.tensors, self.opset,
                                                  self.domains)
        return attributes


def simple_attributes(proto: onnx.NodeProto) -> OrderedDict | None:
    """A node's attributes as gs imports them, where every one is a number, a string or a list
    of those; None where one is anything else (a tensor, a graph, a reference)."""
    attributes = OrderedDict()
    for attribute in proto.attribute:
        convert = _SIMPLE_ATTRIBUTES.get(attribute.type)
        if convert is None or attribute.ref_attr_name:
            return None
        attributes[attribute.name] = convert(attribute)
    return attributes


_RAW_DATA_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BOOL,
                   onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32, onnx.TensorProto.INT64,
                   onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32, onnx.TensorProto.UINT64}


def constant_values(constant: gs.Constant) -> np.ndarray:
    """constant.values. An initializer not loaded yet whose numeric values are stored as raw
    little-endian bytes (what exporters write) is read straight from them, on a little-endian
    machine: 2.5 against 8 us per weight for gs's loader (numpy_helper.to_array, then a copy),
    and a fold reads several weights. The array is kept as the constant's values, as gs keeps
    the one it loads, and is as writable."""
    lazy = vars(constant).get("_values")
    if type(lazy) is LazyValues and layout_is_known():
        values = raw_values(lazy.tensor)
        if values is not None:
            vars(constant)["_values"] = values      # gs's setter, as it sets it
            return values
    return constant.values


def raw_values(proto: onnx.TensorProto, writable: bool = True) -> np.ndarray | None:
    """An initializer's values (a copy when `writable`, else a read-only view of its bytes),
    read from its raw little-endian bytes on a little-endian machine; None where they are
    stored otherwise (gs's loader reads those)."""
    if (sys.byteorder != "little" or proto.data_type not in _RAW_DATA_TYPES or not proto.HasField("raw_data")
            or proto.data_location == onnx.TensorProto.EXTERNAL):
        return None
    values = np.frombuffer(proto.raw_data, _numpy_dtype(proto.data_type)).reshape(tuple(proto.dims))
    return values.copy() if writable else values


@functools.cache
def _numpy_dtype(data_type: int) -> np.dtype:
    return onnx.helper.tensor_dtype_to_np_dtype(data_type)


# New objects, field for field as gs's constructors make them, without their __setattr__ hooks
# (4 against 24 us for a Conv with its weight, bias and output): every fold builds its Conv
# through folds/convnodes.conv_node.

def new_variable(name: str, dtype=None, shape=None) -> gs.Variable:
    """gs.Variable(name, dtype, shape)."""
    return _variable(name, dtype, shape) if layout_is_known() else gs.Variable(name, dtype, shape)


def new_constant(name: str, values: np.ndarray) -> gs.Constant:
    """gs.Constant(name, values) for a NumPy array."""
    if not layout_is_known():
        return gs.Constant(name, values)
    constant = gs.Constant.__new__(gs.Constant)
    vars(constant).update(name=name, inputs=_synchronized(constant, "outputs"), outputs=_synchronized(constant, "inputs"),
                          _values=values, data_location=None, _export_dtype=None)
    return constant


def new_node(op: str, name: str, attrs: dict, inputs: list, outputs: list) -> gs.Node:
    """gs.Node(op, name, attrs, inputs, outputs): the node joins its inputs' readers and its
    outputs' producers."""
    if not layout_is_known():
        return gs.Node(op, name, attrs, inputs, outputs)
    return _linked_node(op, name, attrs, inputs, outputs, None)


def _linked_node(op: str, name: str, attrs: dict, inputs: list, outputs: list, domain: str | None) -> gs.Node:
    """A gs.Node field for field, appended to its inputs' readers and its outputs' producers."""
    node = gs.Node.__new__(gs.Node)
    node_inputs, node_outputs = _synchronized(node, "outputs"), _synchronized(node, "inputs")
    for tensor in inputs:
        list.append(node_inputs, tensor)
        list.append(tensor.outputs, node)
    for tensor in outputs:
        list.append(node_outputs, tensor)
        list.append(tensor.inputs, node)
    vars(node).update(op=op, name=name, attrs=attrs, inputs=node_inputs, outputs=node_outputs, domain=domain)
    return node


def _synchronized(owner, field_name: str) -> SynchronizedList:
    """An empty SynchronizedList(owner, field_name, [])."""
    synchronized = SynchronizedList.__new__(SynchronizedList)
    synchronized.parent_obj = owner
    synchronized.field_name = field_name
    return synchronized


def _variable(name: str, dtype=None, shape=None, kind: str = "tensor_type") -> gs.Variable:
    variable = gs.Variable.__new__(gs.Variable)
    vars(variable).update(name=name, inputs=_synchronized(variable, "outputs"),
                          outputs=_synchronized(variable, "inputs"), dtype=dtype, shape=shape, type=kind)
    return variable


def tensor_type_of(type_proto: onnx.TypeProto) -> tuple | None:
    """(dtype, dims or None without a shape) of a tensor type as gs imports it; None for any
    other type."""
    if type_proto.WhichOneof("value") != "tensor_type":
        return None
    tensor_type = type_proto.tensor_type
    return _dtype(tensor_type.elem_type), (_dims(tensor_type.shape) if tensor_type.HasField("shape") else None)


def _dims(shape: onnx.TensorShapeProto) -> tuple[int | str | None, ...]:
    return tuple([_dim(d) for d in shape.dim])


def _dim(dim: onnx.TensorShapeProto.Dimension) -> int | str | None:
    which = dim.WhichOneof("value")
    return dim.dim_value if which == "dim_value" else dim.dim_param if which == "dim_param" else None


@functools.cache
def _dtype(elem_type: int):
    """get_onnx_tensor_dtype: the NumPy type, or the ONNX enum where NumPy has none."""
    dtype = get_numpy_type(elem_type)
    return elem_type if dtype is None else dtype


def _constant(proto: onnx.TensorProto) -> gs.Constant:
    lazy = LazyValues.__new__(LazyValues)
    dtype = _dtype(proto.data_type)
    vars(lazy).update(tensor=proto, shape=proto.dims, dtype=dtype, nbytes=math.prod(proto.dims) * _itemsize(dtype))
    constant = gs.Constant.__new__(gs.Constant)
    vars(constant).update(name=proto.name, inputs=_synchronized(constant, "outputs"),
                          outputs=_synchronized(constant, "inputs"), _values=lazy,
                          data_location=int(proto.data_location) if proto.HasField("data_location") else None,
                          _export_dtype=None)
    return constant


@functools.cache
def _itemsize(dtype) -> int | None:
    return get_itemsize(dtype)
