"""The built-in primitives that rule files name in `apply:`.

    forward_input      the root's output is its first input
    compose_linear     h = first(x); y = second(h)  ->  one Conv of x (names: h, root)
    sum_branches       y = Add/Sub(branch(x), branch(x)) -> one Conv (names: x; with: signs)
    concat_branches    y = Concat(*parts), parts[] = branch(x) -> one Conv (names: x, parts)
A branch is x itself or a linear node reading x (Conv, BatchNormalization, per-channel
Mul/Div/Add/Sub, AveragePool, zero Pad): see linear_nodes.py.
"""

from .cleanup import forward_input
from .conv_branches import concat_branches, sum_branches
from .conv_chain import compose_linear

REGISTRY = {
    "forward_input": forward_input,
    "compose_linear": compose_linear,
    "sum_branches": sum_branches,
    "concat_branches": concat_branches,
}
