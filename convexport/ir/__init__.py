"""The one place that touches ONNX protos and graph objects.

The rewrite stage works on an onnx-graphsurgeon graph, imported once and exported once
(convert.py); everything else reads and writes ModelProtos. The graph classes are
`ir.Node(op, name, attrs, inputs, outputs)`, `ir.Variable(name, dtype, shape)`,
`ir.Constant(name, array)`: a node joins its inputs' readers and its outputs' producers as it
is made. The folds build through one builder over them, convexport.folds.builder.NodeBuilder.

    convert.py   ModelProto <-> Graph; a few nodes as a model of their own
    query.py     constant values, attributes with schema defaults, dtypes, the opset
    naming.py    names for nameless nodes, fresh names
    scopes.py    subgraphs, topological order, clean-up
    shapes.py    shape inference, and whether a model needs it
    large.py     models of 1 GiB of weights or more: external data, the weightless skeleton
    weight_files.py  a large model's weights left in their files, read one at a time
    disk.py      a large model's weights written beside its output; the model handed to ORT as a file
    provenance.py  what the exporter wrote about nodes, values and scopes, kept; the modules a rewrite folded
    folding.py   constant folding before the rules (onnxscript's) and between them (one node at a time)
    same.py      whether two models compute alike node for node
"""

from onnx_graphsurgeon import Graph, Node, Tensor, Variable

from .constant import Constant
from .convert import IR_VERSION, export_graph, import_graph, nodes_as_model, overridable_initializers
from .dedupe import Deduplicated, deduplicate_initializers
from .disk import (
    SPILL_KIND,
    SPILL_PREFIX,
    files_for_runtime,
    scratch_beside,
    scratch_folder,
    spill,
    spilled_weights,
)
from .folding import constant_node_values, fold_constants, fold_to_fixed_point, scoped_name
from .large import (
    external_data_files,
    kept_from_serialisation,
    needs_external_data,
    save_with_external_data,
    serialized_bytes,
    weight_bytes,
)
from .naming import NameGenerator
from .provenance import Provenance
from .query import (
    DEFAULT_OPSET,
    NOT_IN_SCHEMA,
    SHAPE_ONLY_OPS,
    attribute,
    attribute_or,
    constant_value,
    is_absent,
    is_constant,
    is_static,
    numpy_dtype,
    onnx_opset,
    tensor_dtype,
)
from .same import same_computation
from .scopes import (
    all_graphs,
    cleaned_up,
    node_subgraphs,
    proto_constants,
    proto_outer_reads,
    proto_own_names,
    proto_scopes,
    proto_subgraphs,
    read_as,
    read_outer_as,
    tensor_map,
    toposort,
)
from .shapes import as_declared, carry_dim_names, declared_entries, declared_value_info, fully_shaped, infer_shapes
from .weight_files import counting_bytes, is_file_backed, moved_weights, point_at_files, relative_to, tensor_array

__all__ = [
    "Constant",
    "Graph",
    "Node",
    "Tensor",
    "Variable",
    "IR_VERSION",
    "export_graph",
    "import_graph",
    "nodes_as_model",
    "overridable_initializers",
    "external_data_files",
    "carry_dim_names",
    "fold_constants",
    "Deduplicated",
    "deduplicate_initializers",
    "fold_to_fixed_point",
    "scoped_name",
    "constant_node_values",
    "needs_external_data",
    "kept_from_serialisation",
    "save_with_external_data",
    "weight_bytes",
    "serialized_bytes",
    "NameGenerator",
    "SPILL_KIND",
    "SPILL_PREFIX",
    "files_for_runtime",
    "scratch_beside",
    "scratch_folder",
    "counting_bytes",
    "is_file_backed",
    "moved_weights",
    "spilled_weights",
    "point_at_files",
    "relative_to",
    "spill",
    "tensor_array",
    "Provenance",
    "DEFAULT_OPSET",
    "NOT_IN_SCHEMA",
    "SHAPE_ONLY_OPS",
    "attribute",
    "attribute_or",
    "constant_value",
    "is_absent",
    "is_constant",
    "is_static",
    "numpy_dtype",
    "onnx_opset",
    "tensor_dtype",
    "same_computation",
    "all_graphs",
    "cleaned_up",
    "node_subgraphs",
    "proto_outer_reads",
    "proto_constants",
    "proto_own_names",
    "proto_scopes",
    "proto_subgraphs",
    "read_as",
    "read_outer_as",
    "tensor_map",
    "toposort",
    "fully_shaped",
    "infer_shapes",
    "as_declared",
    "declared_entries",
    "declared_value_info",
]
