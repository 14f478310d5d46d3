"""Build small ONNX graphs of linear nodes with random weights, and check a rewrite on them."""

from __future__ import annotations

import numpy as np
from onnx import helper

from convexport.rewrite.engine import RewriteSettings, rewrite_model
from convexport.folds import builtin_primitives
from convexport.rewrite.rulefile import builtin_rule_files, load_rules
from helpers import make_model, op_counts, run, tensor

RULES = load_rules(builtin_rule_files(), set(builtin_primitives()))


class GraphBuilder:
    """Nodes, initializers and one float input `x`; names are generated."""

    def __init__(self, input_shape, seed=0):
        self.rng = np.random.default_rng(seed)
        self.input_shape = list(input_shape)
        self.nodes, self.initializers = [], {}
        self.shapes = {"x": list(input_shape)}
        self._count = 0

    def name(self, base):
        self._count += 1
        return f"{base}{self._count}"

    def const(self, value, base="k", dtype=np.float32):
        name = self.name(base)
        self.initializers[name] = np.asarray(value, dtype)
        return name

    def conv(self, x, out_channels, kernel, stride=1, dilation=1, pads=None, group=1, bias=True, auto_pad=None):
        nd = len(self.shapes[x]) - 2
        in_channels = self.shapes[x][1]
        kernel = [kernel] * nd if isinstance(kernel, int) else list(kernel)
        weight = self.rng.standard_normal([out_channels, in_channels // group, *kernel]) / np.sqrt(
            in_channels // group * np.prod(kernel))
        inputs = [x, self.const(weight, "w")]
        if bias:
            inputs.append(self.const(self.rng.standard_normal(out_channels), "b"))
        attrs = {"strides": [stride] * nd if isinstance(stride, int) else stride,
                 "dilations": [dilation] * nd if isinstance(dilation, int) else dilation, "group": group,
                 "kernel_shape": kernel}
        if auto_pad:
            attrs["auto_pad"] = auto_pad
        else:
            attrs["pads"] = [0] * (2 * nd) if pads is None else ([pads] * (2 * nd) if isinstance(pads, int) else pads)
        return self.node("Conv", inputs, **attrs)

    def batchnorm(self, x):
        channels = self.shapes[x][1]
        params = [self.rng.uniform(0.5, 1.5, channels), self.rng.standard_normal(channels),
                  self.rng.standard_normal(channels), self.rng.uniform(0.5, 2.0, channels)]
        return self.node("BatchNormalization", [x, *(self.const(p, "bn") for p in params)], epsilon=1e-3)

    def node(self, op, inputs, **attrs):
        output = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [output], name=self.name(op + "_node"), **attrs))
        self.shapes[output] = self._infer(output)
        return output

    def _infer(self, output):
        model = self.model([output])
        value = next(v for v in list(model.graph.output) if v.name == output)
        return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value.type.tensor_type.shape.dim]

    def model(self, outputs, dynamic_batch=False):
        shape = list(self.input_shape)
        if dynamic_batch:
            shape[0] = "N"
        return make_model(self.nodes, [tensor("x", shape)], [tensor(name, None) for name in outputs], self.initializers)


def rewrite(model, strategy="all", rules=RULES):
    return rewrite_model(model, rules, builtin_primitives(), RewriteSettings(strategy))


def assert_same_outputs(original, rewritten, input_shape, seed=0, rtol=1e-4, atol=1e-5):
    feeds = {"x": np.random.default_rng(seed).standard_normal(input_shape).astype(np.float32)}
    expected, actual = run(original, feeds), run(rewritten, feeds)
    assert [o.name for o in original.graph.output] == [o.name for o in rewritten.graph.output]
    for want, got in zip(expected, actual):
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * scale)


def fold(builder, outputs, strategy="all", dynamic_batch=False, rules=RULES, rtol=1e-4):
    """Rewrite the builder's graph, check it against the original, return (outcome, op counts)."""
    model = builder.model(outputs, dynamic_batch)
    outcome = rewrite(model, strategy, rules)
    assert_same_outputs(model, outcome.model, builder.input_shape, rtol=rtol)
    return outcome, op_counts(outcome.model)
