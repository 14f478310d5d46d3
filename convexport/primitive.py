"""What a rule's own primitive needs, in one module (docs/rules.md, "Your own primitive").

    from convexport.primitive import Rewrite, Refusal, constant_value, reach

A primitive is `f(match, context) -> Rewrite`, which raises `Refusal` to say no:

- `match` (Match): `match.values[name]` the tensor a pattern name bound (a list for `name[]`;
  None for an absent optional input), `match.nodes[name]` the node whose first output is
  `name`, `match.root` the root node.
- `context` (RewriteContext): `context.fresh(base)` new names, `context.params` the rule's
  `with:`, `context.opset` the model's opset, `context.graph` the scope matched in.
- Return `Rewrite(nodes, replace, note)` (new nodes; (old tensor, new tensor) pairs; a note for
  the report), or raise `Refusal(reason)` (`reported=False` where the match is simply not a
  case). Any other exception, or returning anything else, is an error naming the rule.

Read constants with `constant_value` (an initializer and a Constant node's output alike; None
for a run-time tensor), attributes with `attribute_or(node, name, opset, default)` (the ONNX
schema's default when the node does not set it), an omitted optional input with `is_absent`.
Build with `NodeBuilder(context, dtype, base)` as the built-in folds do (`node(op, inputs,
attrs, shape=...)`, `constant(value, base)`, `conv(...)`; its `nodes` for the Rewrite), or
with the graph classes it wraps: `Node(op, name, attrs, inputs, outputs)`, `Variable(name,
dtype, shape)`, `Constant(name, value)` (an array, a NumPy scalar or a number). Declare `@reach(n)`
when the primitive reads no further than n nodes beyond its match, and `@consumes(...)` what
it reads of the pattern, so that `rules check` refuses a rule whose pattern it would misread.
docs/rules.md, "The primitive API", has each name with an example.
"""

from .algebra import Refusal
from .folds.builder import NodeBuilder
from .folds.primitives import Rewrite, consumes, reach
from .ir import (
    NOT_IN_SCHEMA,
    Constant,
    Node,
    Variable,
    attribute,
    attribute_or,
    constant_value,
    is_absent,
    is_constant,
    tensor_dtype,
)
from .rewrite.engine import RewriteContext
from .rewrite.matcher import Match

__all__ = [
    "Constant",
    "Match",
    "NOT_IN_SCHEMA",
    "Node",
    "NodeBuilder",
    "Refusal",
    "Rewrite",
    "RewriteContext",
    "Variable",
    "attribute",
    "attribute_or",
    "constant_value",
    "consumes",
    "is_absent",
    "is_constant",
    "reach",
    "tensor_dtype",
]
