"""Node and tensor names: names for nameless nodes, fresh names that collide with nothing."""

from __future__ import annotations

import itertools

import onnx_graphsurgeon as gs

from .scopes import all_graphs, tensor_map


def name_nodes(graph: gs.Graph) -> None:
    """Name every nameless node, subgraphs' nodes included (reports name nodes): f"{op}_{n}",
    n counting up over the nameless ones in graph order, skipping any name already taken."""
    nodes = [node for scope in all_graphs(graph) for node in scope.nodes]
    taken = {node.name for node in nodes if node.name}
    counter = itertools.count()
    for node in nodes:
        if not node.name:
            while (name := f"{node.op}_{next(counter)}") in taken:
                pass
            taken.add(name)
            node.name = name


class NameGenerator:
    """Fresh tensor and node names that collide with nothing in the graph or its subgraphs."""

    def __init__(self, graph: gs.Graph):
        scopes = all_graphs(graph)
        self._taken = {name for scope in scopes for name in tensor_map(scope)} | {
            node.name for scope in scopes for node in scope.nodes
        }
        self._counter = itertools.count()

    def __call__(self, base: str) -> str:
        while (name := f"{base}__cx{next(self._counter)}") in self._taken:
            pass
        self._taken.add(name)
        return name
