"""Where the graph changed since a rule last looked, so that a later pass matches only there.

A rule's verdict on a match (no match, refused, applied) depends on the match's nodes, the
tensors they read and write (shapes, constants, readers: `private`), and what its primitive
reads around them. If none of those changed since the rule last looked, looking again gives
the same verdict. Rewrites record every tensor whose producer or readers they change; a
rule's next look covers the nodes within a few steps (either direction) of those tensors:

    2 * pattern lines   (a match spans that many steps, a group twice: up to its anchor and down)
    + the primitive's reach beyond its match (primitives.reach)
    + 1                 (the readers of a bound tensor, for `private`)

A primitive without a declared reach (the batching ones follow branches as far as they go; a
user's primitive may read anything) has its rule look everywhere again after any change.
"""

from __future__ import annotations

from collections.abc import Iterable

from .. import ir


class ChangeLog:
    def __init__(self):
        self._touched: list[ir.Variable] = []  # in the order touched (kept alive: ids stay unique)
        self._looked: dict[tuple[int, str], int] = {}  # (scope, rule) -> len(_touched) when it last looked
        self._dead: dict[int, ir.Node] = {}

    def touch(self, tensors: Iterable) -> None:
        """Tensors whose producer or readers changed (constants aside: who reads a weight
        never decides a match)."""
        self._touched.extend(t for t in tensors if isinstance(t, ir.Variable) and t.name)

    def bury(self, node: ir.Node) -> None:
        """A node a rewrite left dead: its inputs lose a reader."""
        self._dead[id(node)] = node
        self.touch(node.inputs)

    def is_dead(self, node: ir.Node) -> bool:
        return id(node) in self._dead

    def start_looking(self, scope: ir.Graph, rule) -> None:
        self._looked[(id(scope), rule.name)] = len(self._touched)

    def region(self, scope: ir.Graph, rule, candidates: list[ir.Node], reach: int | None) -> set[int] | None:
        """Where `rule` must look in `scope` among the `candidates` (live nodes of its root op,
        or every live node for a group): None for everywhere (it has not looked yet, or its
        primitive has no declared reach and something changed), else the ids of the nodes near
        a change since it last looked (empty: nothing to look at)."""
        since = self._looked.get((id(scope), rule.name))
        if since is None:
            return None
        recent = self._touched[since:]
        if not recent or not candidates:
            return set()
        if reach is None:
            return None
        return _near(recent, 2 * len(rule.pattern) + reach + 1)


def _near(tensors: list[ir.Variable], depth: int) -> set[int]:
    """Ids of the nodes within `depth` steps of `tensors` through producers and readers
    (constants are not followed: a shared weight links nodes that have nothing else in common)."""
    seen_tensors = {id(t) for t in tensors}
    nodes: set[int] = set()
    frontier = list({id(t): t for t in tensors}.values())
    for _ in range(depth):
        following = []
        for tensor in frontier:
            for node in (*tensor.inputs, *tensor.outputs):
                if id(node) in nodes:
                    continue
                nodes.add(id(node))
                for other in (*node.inputs, *node.outputs):
                    if isinstance(other, ir.Variable) and id(other) not in seen_tensors:
                        seen_tensors.add(id(other))
                        following.append(other)
        frontier = following
    return nodes
