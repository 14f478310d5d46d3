"""Constant folding before the rules: every node whose value does not depend on the values of
the model's inputs (their shapes and types may be read) is computed once and becomes a
constant. Exporters leave such subgraphs behind: torch's dynamo exporter without its optimizer
writes each Conv bias as Expand(CastLike(0, x), Shape(W)[0:1]), the TorchScript exporter
without constant folding writes F.pad's pads as a Shape/ConstantOfShape/Concat/Slice chain; a
rule that needs a constant bias or zero pads sees neither until they are folded.

The folding is onnxscript's (the optimizer torch's dynamo exporter runs), not convexport's own:
it evaluates the nodes with the ONNX reference implementation, leaves an initializer that is
also a graph input alone (a default the caller may override), and folds no tensor over
FOLD_LIMIT_ELEMENTS, so that a fold never trades a few nodes for a large new weight.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxscript.optimizer
from onnxscript import ir as onnx_ir  # onnx-ir, as onnxscript installs and uses it

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


def fold_constants(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its input-independent subgraphs folded and what they leave unused
    removed: a new model, or `model` itself when there is nothing to fold."""
    graph = onnx_ir.serde.deserialize_model(model)
    result = onnxscript.optimizer.fold_constants(
        graph,
        onnx_shape_inference=False,
        input_size_limit=FOLD_LIMIT_ELEMENTS,
        output_size_limit=FOLD_LIMIT_ELEMENTS,
        should_fold=_small_constant_of_shape,
    )
    if not result.modified:
        return model
    onnxscript.optimizer.remove_unused_nodes(graph)
    return onnx_ir.serde.serialize_model(graph)
