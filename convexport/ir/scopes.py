"""Walking a graph's scopes: the main graph and the subgraphs its nodes hold (If branches,
Loop and Scan bodies), for gs graphs and for GraphProtos alike; topological order; clean-up."""

from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs

_GRAPH_ATTRIBUTES = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


def node_subgraphs(node: gs.Node) -> list[gs.Graph]:
    """The graphs a node holds in its attributes (If branches, a Loop or Scan body)."""
    return [
        sub
        for value in node.attrs.values()
        for sub in (value if isinstance(value, list) else [value])
        if isinstance(sub, gs.Graph)
    ]


def proto_subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """node_subgraphs for a NodeProto."""
    return [
        sub
        for attr in node.attribute
        if attr.type in _GRAPH_ATTRIBUTES
        for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs)
    ]


def proto_own_names(graph: onnx.GraphProto) -> set[str]:
    """The names `graph` defines itself: its inputs, initializers and nodes' outputs."""
    own = {value.name for value in graph.input} | {tensor.name for tensor in graph.initializer}
    return own | {name for node in graph.node for name in node.output}


def proto_constants(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """`graph`'s stored constants by name: its initializers and its Constant nodes' `value`
    tensors."""
    tensors = {tensor.name: tensor for tensor in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            value = next((a for a in node.attribute if a.name == "value"), None)
            if value is not None and value.type == onnx.AttributeProto.TENSOR:
                tensors[node.output[0]] = value.t
    return tensors


def proto_outer_reads(graph: onnx.GraphProto) -> set[str]:
    """The names `graph`'s nodes (and their subgraphs') read that `graph` does not define:
    what it reads from the scopes around it."""
    defined = proto_own_names(graph)
    read: set[str] = set()
    for node in graph.node:
        read.update(name for name in node.input if name)
        for sub in proto_subgraphs(node):
            read |= proto_outer_reads(sub)
    return read - defined


def read_as(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Every node of `graph`'s own node list that read `old` reads `new`, in place."""
    for node in graph.node:
        for position, name in enumerate(node.input):
            if name == old:
                node.input[position] = new


def read_outer_as(graph: onnx.GraphProto, renamed: dict[str, str]) -> None:
    """`graph`'s reads of the outer scope's tensors (proto_outer_reads) renamed as `renamed`
    says, in place, in its subgraphs too (a name a scope defines itself is its own there)."""
    defined = proto_own_names(graph)
    outer = {old: new for old, new in renamed.items() if old not in defined}
    for node in graph.node if outer else ():
        for position, name in enumerate(node.input):
            if name in outer:
                node.input[position] = outer[name]
        for sub in proto_subgraphs(node):
            read_outer_as(sub, outer)


def all_graphs(graph: gs.Graph) -> list[gs.Graph]:
    """The graph and every subgraph, recursively, outermost first."""
    found = [graph]
    for node in graph.nodes:
        for sub in node_subgraphs(node):
            found.extend(all_graphs(sub))
    return found


def proto_scopes(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    """all_graphs for a GraphProto."""
    found = [graph]
    for node in graph.node:
        for sub in proto_subgraphs(node):
            found.extend(proto_scopes(sub))
    return found


def toposort(graph: gs.Graph) -> None:
    """Order graph.nodes so that each node follows the producers of what it reads (what its
    subgraphs read from this scope included), keeping the present order wherever it is one.
    A depth-first walk over producers: the engine calls it after every pass, and gs's own
    sort reorders nodes that were already in order (which would change the rewrite order)."""
    here = {id(node) for node in graph.nodes}
    placed: set[int] = set()
    opened: set[int] = set()
    order = []
    for start in graph.nodes:
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
                stack.extend(
                    (producer, False)
                    for producer in tensor.inputs
                    if id(producer) in here and id(producer) not in placed
                )
    graph.nodes = order


def _reads(node: gs.Node) -> list:
    """The tensors a node reads, those its subgraphs read included."""
    tensors = list(node.inputs)
    for sub in node_subgraphs(node):
        tensors.extend(t for inner in sub.nodes for t in _reads(inner))
    return tensors


def cleaned_up(graph: gs.Graph) -> gs.Graph:
    """The graph without the nodes and tensors that lead to no output, subgraphs included;
    unused graph inputs stay (they are the model's interface)."""
    return graph.cleanup(remove_unused_graph_inputs=False)


def tensor_map(graph: gs.Graph) -> dict[str, gs.Tensor]:
    """Every named tensor of the scope by name."""
    return {name: tensor for name, tensor in graph.tensors().items() if name}
