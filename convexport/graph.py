"""Thin helpers over onnx-graphsurgeon: constants, attributes with ONNX defaults, names."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.logger import G_LOGGER

from .gs_import import constant_values, import_model

# onnx-graphsurgeon warns (on stderr, several lines) whenever a bfloat16 constant is read as
# float32, which is exact; convexport keeps stderr for its one-line messages.
G_LOGGER.severity = G_LOGGER.ERROR


def import_graph(model: onnx.ModelProto) -> gs.Graph:
    """gs.Graph with every node named (reports name nodes), subgraphs' nodes included, and
    the model's overridable initializers as the graph inputs they are (see below)."""
    graph = import_model(model)
    _inputs_with_defaults_stay_inputs(graph, model)
    nodes = [node for scope in all_graphs(graph) for node in scope.nodes]
    if all([node.name for node in nodes]):
        return graph
    for node, name in zip(nodes, node_names([(node.op, node.name) for node in nodes])):
        if not node.name:
            node.name = name
    return graph


def node_names(nodes: list[tuple[str, str]]) -> list[str]:
    """Each node's name, given (op, name) in graph order (subgraphs' nodes included): its own,
    or for a nameless one f"{op}_{n}", n counting up over the nameless ones, skipping any name
    already taken."""
    taken = {name for _, name in nodes if name}
    counter = itertools.count()
    names = []
    for op, name in nodes:
        if not name:
            while (name := f"{op}_{next(counter)}") in taken:
                pass
            taken.add(name)
        names.append(name)
    return names


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
    put a Variable of its type back in its place among the inputs and in its readers (the
    export gives it its initializer back, reexport.py)."""
    defaults = {init.name for init in overridable_initializers(model)}
    if not defaults:
        return
    tensors = tensor_map(graph)
    stand_ins = {}
    for name in defaults:
        constant = tensors[name]
        stand_ins[name] = gs.Variable(name, constant.dtype, list(constant.shape))
        for reader in list(constant.outputs):
            for index, tensor in enumerate(reader.inputs):
                if tensor is constant:
                    reader.inputs[index] = stand_ins[name]
    imported = {t.name: t for t in graph.inputs}
    graph.inputs = [stand_ins.get(value.name) or imported[value.name] for value in model.graph.input]


def node_subgraphs(node: gs.Node) -> list[gs.Graph]:
    """The graphs a node holds in its attributes (If branches, a Loop or Scan body)."""
    if node.op not in OPS_WITH_GRAPHS and node.domain in ONNX_DOMAINS:     # can hold no graph
        return []
    return [sub for value in node.attrs.values() for sub in (value if isinstance(value, list) else [value])
            if isinstance(sub, gs.Graph)]


def proto_subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """node_subgraphs for a NodeProto."""
    if node.op_type not in OPS_WITH_GRAPHS and node.domain in ONNX_DOMAINS:     # can hold no graph
        return []
    return [sub for attr in node.attribute if attr.type in _GRAPH_ATTRIBUTES
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs)]


# Checked before reading attr.graphs, which builds an empty list for every other attribute
# (a third of the cost of walking a graph's scopes).
_GRAPH_ATTRIBUTES = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
# The ONNX-domain ops whose schemas have graph attributes (tests/test_robustness.py checks the
# list against onnx.defs): any other ONNX op has none, so its attributes need not be read
# (half the cost of walking a 4,678-node graph's scopes). Ops of other domains are always
# read (com.microsoft's BeamSearch has graph attributes).
OPS_WITH_GRAPHS = frozenset({"If", "Loop", "Scan", "SequenceMap"})
# The ONNX domain as gs (None, "", "ai.onnx") and protos ("", "ai.onnx") write it. A node can
# hold graphs when `op in OPS_WITH_GRAPHS or domain not in ONNX_DOMAINS`: the walks over every
# node test that inline (a call per node was two thirds of all_graphs' walk: 0.28 against
# 0.09 ms on 1,115 nodes).
ONNX_DOMAINS = frozenset({None, "", "ai.onnx"})


def all_graphs(graph: gs.Graph) -> list[gs.Graph]:
    """The graph and every subgraph (If branches, Loop and Scan bodies), outermost first."""
    found = [graph]
    for node in graph.nodes:
        if node.op in OPS_WITH_GRAPHS or node.domain not in ONNX_DOMAINS:     # can hold graphs
            for sub in node_subgraphs(node):
                found.extend(all_graphs(sub))
    return found


def toposort(graph: gs.Graph) -> None:
    """Order graph.nodes so that each node follows the producers of what it reads (what its
    subgraphs read from this scope included), keeping the present order wherever it is one.
    A depth-first walk over producers: linear in the graph, where gs's own sort is not."""
    here = {id(node) for node in graph.nodes}
    placed: set[int] = set()
    opened: set[int] = set()
    order = []
    for start in graph.nodes:
        if id(start) in placed:
            continue
        if all(id(producer) in placed or id(producer) not in here
               for tensor in _reads(start) for producer in tensor.inputs):
            placed.add(id(start))       # its producers are placed: where the walk would put it, without it
            order.append(start)
            continue
        stack = [(start, False)]
        while stack:
            node, ready = stack.pop()
            if id(node) in placed:
                continue
            if ready:
                placed.add(id(node))
                order.append(node)
                continue
            if id(node) in opened:
                raise ValueError(f"the graph has a cycle through node {node.name!r}")
            opened.add(id(node))
            stack.append((node, True))
            for tensor in reversed(_reads(node)):
                stack.extend((producer, False) for producer in tensor.inputs
                             if id(producer) in here and id(producer) not in placed)
    graph.nodes = order


def cleaned_up(graph: gs.Graph) -> gs.Graph:
    """graph.cleanup() (keeping unused graph inputs), skipped when a walk back from the graph
    outputs reaches every node and there are no subgraphs or functions for it to clean: the
    rewrite engine drops the nodes its rewrites leave dead as it goes, so that is the usual
    case, and the walk costs a tenth of gs's cleanup (3 against 33 ms on 4,678 nodes)."""
    live: set[int] = set()
    stack = list(graph.outputs)
    while stack:
        for producer in stack.pop().inputs:
            if id(producer) not in live:
                live.add(id(producer))
                stack.extend(producer.inputs)
    if (len(live) == len(graph.nodes) and not graph.functions
            and not any(node_subgraphs(node) for node in graph.nodes)):
        return graph
    return graph.cleanup(remove_unused_graph_inputs=False)


def tensor_map(graph: gs.Graph) -> dict[str, gs.Tensor]:
    """graph.tensors(): every named tensor of the scope by name, in the same order (inputs,
    each node's inputs then outputs, outputs; a later tensor of a name wins), without gs's
    call per tensor (1.5 against 6 ms on 6,761 tensors)."""
    found: dict[str, gs.Tensor] = {}
    for tensors in (graph.inputs, *(t for node in graph.nodes for t in (node.inputs, node.outputs)), graph.outputs):
        for tensor in tensors:
            if tensor.name:
                found[tensor.name] = tensor
    return found


def is_static(shape) -> bool:
    """A shape whose every size is known (no symbolic or unknown dim); False for no shape."""
    return shape is not None and all(isinstance(dim, int) and dim >= 0 for dim in shape)


def fully_shaped(graph: gs.Graph) -> bool:
    """Every tensor a node writes, here and in subgraphs, has a dtype and a static shape: ONNX
    shape inference would add nothing to the graph's export."""
    return all(isinstance(tensor, gs.Constant) or not tensor.name
               or (tensor.dtype is not None and is_static(tensor.shape))
               for scope in all_graphs(graph) for node in scope.nodes for tensor in node.outputs)


def _reads(node: gs.Node) -> list:
    """The tensors a node reads, those its subgraphs read included (for a node that can hold
    no subgraph, its own inputs list: only to be read)."""
    if node.op not in OPS_WITH_GRAPHS and node.domain in ONNX_DOMAINS:     # can hold no graph
        return node.inputs
    tensors = list(node.inputs)
    for sub in node_subgraphs(node):
        tensors.extend(t for inner in sub.nodes for t in _reads(inner))
    return tensors


def proto_scopes(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    """A GraphProto and its subgraphs, recursively, outermost first."""
    found = [graph]
    for node in graph.node:
        for sub in proto_subgraphs(node):
            found.extend(proto_scopes(sub))
    return found


def tensor_dtype(tensor) -> np.dtype:
    """The numpy dtype of a gs tensor, float32 when unknown (numpy_dtype)."""
    return numpy_dtype(tensor.dtype)


def numpy_dtype(dtype) -> np.dtype:
    """The numpy dtype of a gs tensor's dtype, float32 for None (onnx-graphsurgeon keeps types
    numpy lacks, such as bfloat16, as ONNX type numbers: ml_dtypes supplies those)."""
    if dtype is None:
        return np.dtype(np.float32)
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(dtype) if isinstance(dtype, int) else dtype)


def is_absent(tensor) -> bool:
    """An omitted optional input: missing or the empty name."""
    return tensor is None or (isinstance(tensor, gs.Variable) and not tensor.name)


def is_constant(tensor) -> bool:
    """Whether constant_value(tensor) is not None, without loading or viewing the value."""
    if isinstance(tensor, gs.Constant):
        return True
    if isinstance(tensor, gs.Variable) and len(tensor.inputs) == 1:
        producer = tensor.inputs[0]
        return producer.op == "Constant" and producer.attrs.get("value") is not None
    return False


def constant_value(tensor) -> np.ndarray | None:
    """The value of an initializer or a Constant node's output, read-only (a constant may be
    shared by other nodes: a fold computes new arrays, it never edits one in place); None for
    run-time tensors."""
    value = None
    if isinstance(tensor, gs.Constant):
        value = constant_values(tensor)
    elif isinstance(tensor, gs.Variable) and len(tensor.inputs) == 1:
        producer = tensor.inputs[0]
        if producer.op == "Constant" and "value" in producer.attrs:
            held = producer.attrs["value"]
            value = held.values if isinstance(held, gs.Constant) else held
    if value is None:
        return None
    view = np.asarray(value).view()
    view.flags.writeable = False
    return view


NOT_IN_SCHEMA = object()   # the op has no such attribute at this opset


def attribute(node: gs.Node, name: str, opset: int):
    """The node's attribute, or the ONNX schema default when it is not set (None if the
    schema has no default, NOT_IN_SCHEMA if the op has no such attribute at this opset)."""
    if name in node.attrs:
        value = node.attrs[name]
        return tuple(value) if isinstance(value, list) else value
    return _schema_default(node.op, opset, node.domain or "", name)


@functools.lru_cache(maxsize=4096)
def _schema_default(op: str, opset: int, domain: str, name: str):
    """attribute()'s answer for an attribute the node does not set (cached: a schema lookup
    costs more than matching the node)."""
    try:
        schema = onnx.defs.get_schema(op, opset, domain)
    except onnx.defs.SchemaError:
        return None
    proto = schema.attributes.get(name)
    if proto is None:
        return NOT_IN_SCHEMA
    if not proto.default_value.name:
        return None
    value = onnx.helper.get_attribute_value(proto.default_value)
    if isinstance(value, bytes):
        return value.decode()
    return tuple(value) if isinstance(value, list) else value


def attribute_or(node: gs.Node, name: str, opset: int, default):
    """The attribute's value, its schema default, or `default` when it has neither."""
    value = attribute(node, name, opset)
    return default if value is None or value is NOT_IN_SCHEMA else value


def default_opset(model: onnx.ModelProto) -> int:
    return next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 18)


class NameGenerator:
    """Fresh tensor and node names that collide with nothing in the graph or its subgraphs."""

    def __init__(self, graph: gs.Graph):
        scopes = all_graphs(graph)
        self._taken = {name for scope in scopes for name in tensor_map(scope)} | {
            node.name for scope in scopes for node in scope.nodes}
        self._counter = itertools.count()

    @classmethod
    def avoiding(cls, names: set[str]) -> "NameGenerator":
        """The generator of a graph whose tensor and node names are `names`."""
        generator = cls.__new__(cls)
        generator._taken, generator._counter = set(names), itertools.count()
        return generator

    MARK = "__cx"       # in every name it makes: a name without it never collides with one

    def __call__(self, base: str) -> str:
        while (name := f"{base}{self.MARK}{next(self._counter)}") in self._taken:
            pass
        self._taken.add(name)
        return name
