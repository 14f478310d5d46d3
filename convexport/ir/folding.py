"""Constant folding before and between the rules: every node whose value does not depend on the values of
the model's inputs (their shapes and types may be read) is computed once and becomes a
constant. Exporters leave such subgraphs behind: torch's dynamo exporter without its optimizer
writes each Conv bias as Expand(CastLike(0, x), Shape(W)[0:1]), the TorchScript exporter
without constant folding writes F.pad's pads as a Shape/ConstantOfShape/Concat/Slice chain; a
rule that needs a constant bias or zero pads sees neither until they are folded.

The folding is onnxscript's (the optimizer torch's dynamo exporter runs), not convexport's own:
it evaluates the nodes with the ONNX reference implementation, leaves an initializer that is
also a graph input alone (a default the caller may override), and folds no tensor over
FOLD_LIMIT_ELEMENTS, so that a fold never trades a few nodes for a large new weight.

Between the rules' passes (a rule may leave a node reading only constants: a user's rule that
forwards a constant, a rewrite whose replacement is a constant) the rewrite engine computes
such nodes one at a time on its graph with the ONNX reference evaluator (constant_node_values),
under the same limit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import onnx
import onnx.reference
import onnxscript.optimizer
from onnx_ir.passes.common import LiftConstantsToInitializersPass
from onnxscript import ir as onnx_ir  # onnx-ir, as onnxscript installs and uses it

from ..util.quiet import quiet_libraries
from .scopes import proto_scopes
from .shapes import infer_shapes
from .static_dims import constant_reshape_targets, fold_static_dims

FOLD_LIMIT_ELEMENTS = 1 << 22  # 16 MiB of float32, as inputs or outputs of one folded node


def _small_constant_of_shape(node) -> bool | None:
    """onnxscript keeps every ConstantOfShape (a large one would grow the model); the
    TorchScript exporter builds F.pad's pads with one of a few elements, so one whose result
    is within the limit is folded. None: onnxscript decides the other nodes."""
    if node.op_type != "ConstantOfShape" or node.domain not in ("", "ai.onnx"):
        return None
    shape = node.inputs[0].const_value if node.inputs and node.inputs[0] is not None else None
    if shape is None:
        return False
    return int(np.prod(shape.numpy())) <= FOLD_LIMIT_ELEMENTS


def fold_constants(model: onnx.ModelProto, keep: frozenset[str] = frozenset()) -> onnx.ModelProto:
    """The model with its input-independent subgraphs folded, what they leave unused removed
    and its Constant nodes made initializers (the TorchScript exporter writes every constant
    as a node; as an initializer it is the same value, and no node to count or to run): a new
    model, or `model` itself when there is nothing to do. The nodes named in `keep` are not
    folded (a runtime fuses them as they are: rewrite/transformer_fusions.py)."""
    nameless = _mark_nameless_nodes(model)
    kept = _hide(model, keep)
    try:
        graph = onnx_ir.serde.deserialize_model(model)
    finally:
        _unmark_nameless_nodes(model, nameless)
        _unhide(model, kept)
    with _attribute_tensor_names_kept(model):
        return _folded(model, graph, nameless, kept)


def _folded(model: onnx.ModelProto, graph, nameless: int, kept: bool) -> onnx.ModelProto:
    with quiet_libraries():  # onnxscript logs each node it will not fold
        result = onnxscript.optimizer.fold_constants(
            graph,
            onnx_shape_inference=False,
            input_size_limit=FOLD_LIMIT_ELEMENTS,
            output_size_limit=FOLD_LIMIT_ELEMENTS,
            should_fold=_small_constant_of_shape,
        )
    lifted = LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(graph)
    if not (result.modified or lifted.modified):
        return model
    onnxscript.optimizer.remove_unused_nodes(graph)
    folded = onnx_ir.serde.serialize_model(graph)
    _unmark_nameless_nodes(folded, nameless)
    _unhide(folded, kept)
    return folded


@contextlib.contextmanager
def _attribute_tensor_names_kept(model: onnx.ModelProto) -> Iterator[None]:
    """onnx-ir holds the model's tensors without copying them, and lifting a Constant node's
    tensor to an initializer names that tensor, in `model` too: the tensors of the nodes'
    attributes get their names back (none where they had none) once the folding is done."""
    tensors = [
        attribute.t
        for scope in proto_scopes(model.graph)
        for node in scope.node
        for attribute in node.attribute
        if attribute.HasField("t")
    ]
    names = [tensor.name if tensor.HasField("name") else None for tensor in tensors]
    try:
        yield
    finally:
        for tensor, name in zip(tensors, names):
            if name is None:
                tensor.ClearField("name")
            else:
                tensor.name = name


_HIDDEN = "convexport.kept."  # a domain no model imports: onnxscript folds no node of it
_IN_SCOPE = "\x00in\x00"  # (no exporter writes a NUL into a name)


def scoped_name(graph: onnx.GraphProto, node: onnx.NodeProto) -> str:
    """A node's name with its graph's, for `keep`: the branches of an If may repeat their node
    names (optimum's merged decoders do), and a name alone keeps the node of each."""
    return f"{node.name}{_IN_SCOPE}{graph.name}"


def _hide(model: onnx.ModelProto, keep: frozenset[str]) -> bool:
    """Put the nodes named in `keep` (by name, or by scoped_name) in the _HIDDEN domain, where
    onnxscript's folding (its should_fold hook comes after its per-op simplifications, which
    would still fold a Gather of a static dim) leaves them alone; whether any was."""
    hidden = False
    for scope in proto_scopes(model.graph) if keep else ():
        for node in scope.node:
            if (node.name in keep or scoped_name(scope, node) in keep) and node.op_type != "Constant":
                node.domain = _HIDDEN + node.domain
                hidden = True
    return hidden


def _unhide(model: onnx.ModelProto, hidden: bool) -> None:
    for scope in proto_scopes(model.graph) if hidden else ():
        for node in scope.node:
            if node.domain.startswith(_HIDDEN):
                node.domain = node.domain.removeprefix(_HIDDEN)
                if not node.domain:  # the default domain, as exporters write it: no field
                    node.ClearField("domain")


MAX_FOLD_ROUNDS = 8  # EfficientViT-M's TorchScript export settles after 2


def fold_to_fixed_point(model: onnx.ModelProto, source: str, keep: frozenset[str] = frozenset()) -> onnx.ModelProto:
    """Fold, infer shapes, fold again, until a round folds nothing (onnxsim's loop): folding
    makes a Slice's bounds constant, inference then gives its output a static shape, and the
    Shape of that output folds in the next round (the TorchScript exporter writes
    `x.shape`, `chunk` and `view` as such chains). A dim that is dynamic stays symbolic: only
    what does not depend on it folds (static_dims.py picks the static dims out of a shape
    that has a dynamic one). `model` itself when nothing folds. The nodes named in `keep` stay
    as they are."""
    current = model
    for _ in range(MAX_FOLD_ROUNDS):
        folded = fold_constants(constant_reshape_targets(fold_static_dims(current, keep), keep), keep)
        if folded is current:
            break
        current = infer_shapes(folded, source, forget_unknown_dims=True)
    return current


_NAMELESS = "\x00convexport-nameless"  # no exporter writes a NUL into a node name


def _mark_nameless_nodes(model: onnx.ModelProto) -> int:
    """Give each nameless node a marker name, and return how many there were: onnx-ir names
    every nameless node ('node', 'node_1') it holds, and a node's name is the user's (the
    report and other tools key on it), so the marker lets _unmark_nameless_nodes give those
    nodes their name back: none, or an empty one where the model wrote one."""
    count = 0
    for scope in proto_scopes(model.graph):
        for node in scope.node:
            if not node.name:
                node.name = f"{_NAMELESS}{'=' if node.HasField('name') else '-'}{count}"
                count += 1
    return count


def _unmark_nameless_nodes(model: onnx.ModelProto, marked: int) -> None:
    if not marked:
        return
    for scope in proto_scopes(model.graph):
        for node in scope.node:
            if node.name.startswith(_NAMELESS + "="):
                node.name = ""
            elif node.name.startswith(_NAMELESS):
                node.ClearField("name")


def constant_node_values(node, opset: int) -> list[np.ndarray] | None:
    """The outputs of a graph node (onnx-graphsurgeon) whose inputs are all constants, computed
    by the ONNX reference evaluator; None where it holds a subgraph, draws random numbers, is
    of another domain, or reads or would write a tensor over FOLD_LIMIT_ELEMENTS (or the
    evaluator cannot run it)."""
    from .convert import nodes_as_model  # (convert imports this package's siblings)
    from .scopes import node_subgraphs

    if (node.domain or "") not in ("", "ai.onnx") or node.op.startswith("Random") or any(node_subgraphs(node)):
        return None
    constants = [t for t in node.inputs if t.name]
    if any(t.values.size > FOLD_LIMIT_ELEMENTS for t in constants):
        return None
    outputs = [onnx.ValueInfoProto(name=t.name) for t in node.outputs]
    model = nodes_as_model([node], [], outputs, constants, opset, "constant_node")
    try:
        values = onnx.reference.ReferenceEvaluator(model).run(None, {})
    except Exception:  # an op or an input the evaluator does not take: the node stays as it is
        return None
    values = [np.asarray(v) for v in values]
    return None if any(v.size > FOLD_LIMIT_ELEMENTS for v in values) else values
