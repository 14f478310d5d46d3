"""What the exporter wrote about each node, kept through the rewrite, and the PyTorch modules a
rewrite folded.

onnx-graphsurgeon keeps neither a node's `metadata_props` and `doc_string`, nor a value's or
an initializer's, nor a graph's `metadata_props`, and import_graph names nameless nodes (reports
name nodes). `Provenance.record` notes all of it when the model is imported (a node by the name
the graph gives it, paired with its proto by position: both walk the scopes in the same order);
`restore` puts it back on the exported model: every node, value and graph no rewrite replaced
gets its own back exactly, its name included ('' for a nameless one). A node a rewrite made
carries the provenance of the original nodes it replaces, through any chain of rewrites
(`derive`): per metadata key the distinct values of those nodes (one value as it is, several as
the list of them, as `repr` writes lists: torch writes `pkg.torch.onnx.name_scopes` that way),
and `pkg.convexport.rules` (the rules that made it, in order) and `pkg.convexport.replaced` (the
original nodes' names).

`modules(names)` says which PyTorch modules nodes come from: the innermost module of the
dynamo exporter's name scopes and class hierarchy (`block.expand (Conv2d)`),
else the module path in the TorchScript exporter's node names (`/block/expand/Conv`: `block.expand`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

import onnx
import onnx_graphsurgeon as gs

from .scopes import all_graphs, proto_scopes

NAME_SCOPES = "pkg.torch.onnx.name_scopes"
CLASS_HIERARCHY = "pkg.torch.onnx.class_hierarchy"
RULES = "pkg.convexport.rules"
REPLACED = "pkg.convexport.replaced"


@dataclass
class Origin:
    """A node, value or graph as the model held it."""

    name: str
    metadata: list[tuple[str, str]]
    doc_string: str = ""


@dataclass
class Derived:
    """A node a rewrite made: the original nodes it stands for and the rules that made it."""

    sources: list[str]  # names (as the graph gave them) of original nodes
    rules: list[str]


@dataclass
class Provenance:
    nodes: dict[str, Origin] = field(default_factory=dict)  # by the name the graph gives the node
    values: dict[str, Origin] = field(default_factory=dict)  # inputs, outputs, value_info, initializers
    graphs: dict[str, Origin] = field(default_factory=dict)  # scopes by graph name
    derived: dict[str, Derived] = field(default_factory=dict)

    @classmethod
    def record(cls, model: onnx.ModelProto, graph: gs.Graph, given_names: list[list[str]]) -> Provenance:
        """What `model` says of its nodes, values and scopes; `graph` is its import with every
        node named, `given_names` the names its nodes had before that, scope by scope."""
        kept = cls()
        for proto_scope, scope, names in zip(proto_scopes(model.graph), all_graphs(graph), given_names):
            kept.graphs[scope.name] = Origin(scope.name, _pairs(proto_scope.metadata_props), proto_scope.doc_string)
            for proto, node, given in zip(proto_scope.node, scope.nodes, names):
                kept.nodes[node.name] = Origin(given, _pairs(proto.metadata_props), proto.doc_string)
            for value in (*proto_scope.input, *proto_scope.output, *proto_scope.value_info, *proto_scope.initializer):
                if value.metadata_props or value.doc_string:
                    kept.values[value.name] = Origin(value.name, _pairs(value.metadata_props), value.doc_string)
        return kept

    def derive(self, made: list[gs.Node], replaced: list[gs.Node], rule: str) -> None:
        """`made` stand for the original nodes behind `replaced` (themselves original or made)."""
        sources, rules = [], []
        for node in replaced:
            before = self.derived.get(node.name)
            for source in before.sources if before else [node.name] if node.name in self.nodes else []:
                if source not in sources:
                    sources.append(source)
            rules += [name for name in (before.rules if before else []) if name not in rules]
        rules.append(rule)
        for node in made:
            self.derived[node.name] = Derived(list(sources), list(rules))

    def modules(self, names: list[str]) -> list[str]:
        """The PyTorch modules the named nodes (original or made) come from, in order, once each."""
        found: list[str] = []
        for name in names:
            derived = self.derived.get(name)
            for source in derived.sources if derived else [name]:
                module = _module(self.nodes.get(source), source)
                if module and module not in found:
                    found.append(module)
        return found

    def enclosing_module(self, names: list[str]) -> str | None:
        """The innermost PyTorch module that holds every named node (`stages.2.blocks.0
        (MobileOneBlock)`: the block a rewrite folded inside), or None where they have no
        module path in common or none is known."""
        chains = []
        for name in names:
            derived = self.derived.get(name)
            chains += [
                _module_chain(self.nodes.get(source), source) for source in (derived.sources if derived else [name])
            ]
        known = [chain for chain in chains if chain is not None]
        if not known:
            return None
        common = known[0]
        for chain in known[1:]:
            shared = 0
            while shared < min(len(common), len(chain)) and common[shared] == chain[shared]:
                shared += 1
            common = common[:shared]
        if not common:
            return None
        path, kind = common[-1]
        return f"{path} ({kind})" if kind else path

    def within(self, name: str, module: str) -> bool:
        """Whether the named node (original or made) comes from `module` (a dotted path) or a
        module inside it; a made node, where all the nodes it replaces do."""
        derived = self.derived.get(name)
        chains = [_module_chain(self.nodes.get(source), source) for source in (derived.sources if derived else [name])]
        return all(chain is not None and any(path == module for path, _ in chain) for chain in chains)

    def module_paths(self) -> set[str]:
        """Every module path the original nodes name."""
        return {path for name, origin in self.nodes.items() for path, _ in (_module_chain(origin, name) or [])}

    def restore(self, model: onnx.ModelProto) -> None:
        """Put what was recorded back on the exported `model` (see the module doc)."""
        for scope in proto_scopes(model.graph):
            origin = self.graphs.get(scope.name)
            if origin is not None:
                _set(scope, origin)
            for node in scope.node:
                if node.name in self.nodes:
                    _set(node, self.nodes[node.name])
                elif node.name in self.derived:
                    _set(node, Origin(node.name, self._merged(self.derived[node.name])))
            for value in (*scope.input, *scope.output, *scope.value_info, *scope.initializer):
                if value.name in self.values:
                    _set(value, self.values[value.name])

    def _merged(self, derived: Derived) -> list[tuple[str, str]]:
        values: dict[str, list[str]] = {}
        for source in derived.sources:
            for key, value in self.nodes[source].metadata:
                if value not in values.setdefault(key, []):
                    values[key].append(value)
        merged = [(key, found[0] if len(found) == 1 else _as_list(key, found)) for key, found in values.items()]
        names = [self.nodes[source].name or source for source in derived.sources]
        return [*merged, (RULES, ", ".join(derived.rules)), (REPLACED, ", ".join(names))]


def _pairs(entries) -> list[tuple[str, str]]:
    return [(entry.key, entry.value) for entry in entries]


def _set(proto, origin: Origin) -> None:
    """A node's, value's or graph's name (nodes only), metadata and doc string as `origin` has them."""
    if isinstance(proto, onnx.NodeProto):
        if origin.name:
            proto.name = origin.name
        else:
            proto.ClearField("name")  # as a nameless node was: no name written, not an empty one
    del proto.metadata_props[:]
    for key, value in origin.metadata:
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    if origin.doc_string or proto.doc_string:
        proto.doc_string = origin.doc_string


def _as_list(key: str, values: list[str]) -> str:
    """Several values of one key: the list of them, each a list where it reads as one."""
    if key in (NAME_SCOPES, CLASS_HIERARCHY):
        return repr([_literal(value) for value in values])
    return "\n".join(values)


def _literal(value: str):
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


def _module_chain(origin: Origin | None, name: str) -> list[tuple[str, str | None]] | None:
    """The modules enclosing a node, outermost first, as (path, class or None), the model
    itself left out (a node of the model's own forward: []), from the dynamo exporter's
    scopes or a TorchScript node name's path; None where neither says."""
    metadata = dict(origin.metadata) if origin else {}
    scopes, classes = _literal(metadata.get(NAME_SCOPES, "")), _literal(metadata.get(CLASS_HIERARCHY, ""))
    if isinstance(scopes, list) and len(scopes) >= 2:
        kinds = classes if isinstance(classes, list) and len(classes) == len(scopes) else [None] * len(scopes)
        return [(path, kind.rsplit(".", 1)[-1] if kind else None) for path, kind in zip(scopes[1:-1], kinds[1:-1])]
    given = origin.name if origin else name
    if given.startswith("/"):
        return [(path, None) for path in _torchscript_paths(given)]
    return None


def _torchscript_paths(name: str) -> list[str]:
    """The module paths, outermost first, in a TorchScript-exported node's name. Each segment
    names a module relative to the innermost module whose forward ran: a container's children
    (Sequential, ModuleList) join its name with a dot, so /blocks/blocks.0/conv3/conv3.1/Conv
    is blocks, blocks.0, blocks.0.conv3, blocks.0.conv3.1 (a segment that extends the one before
    is relative to the same module; any other to the module the one before named)."""
    paths: list[str] = []
    base, previous = "", None
    for segment in name.strip("/").split("/")[:-1]:
        if previous is None or not segment.startswith(previous + "."):
            base = paths[-1] if paths else ""
        paths.append(f"{base}.{segment}" if base else segment)
        previous = segment
    return paths


def _module(origin: Origin | None, name: str) -> str | None:
    """`path (class)` from the dynamo exporter's metadata, or the path in a TorchScript node
    name (/block/expand/Conv), or None."""
    metadata = dict(origin.metadata) if origin else {}
    scopes, classes = _literal(metadata.get(NAME_SCOPES, "")), _literal(metadata.get(CLASS_HIERARCHY, ""))
    if isinstance(scopes, list) and len(scopes) >= 2:
        path = scopes[-2] or "(the model)"
        kind = classes[-2] if isinstance(classes, list) and len(classes) == len(scopes) else None
        return f"{path} ({kind.rsplit('.', 1)[-1]})" if kind else path
    given = origin.name if origin else name
    if given.startswith("/"):
        paths = _torchscript_paths(given)
        return paths[-1] if paths else "(the model)"
    return None
