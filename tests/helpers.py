"""Shared test helpers: hand-built ONNX graphs and running them."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 10   # ONNX Runtime 1.31 rejects newer IR versions


def make_model(nodes, inputs, outputs, initializers=(), opset=18) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "test", list(inputs), list(outputs),
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(initializers).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION)
    return onnx.shape_inference.infer_shapes(model)


def tensor(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def all_op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Op counts over the graph and its subgraphs (If branches, Loop and Scan bodies)."""
    from convexport.ir import proto_scopes

    counts: dict[str, int] = {}
    for scope in proto_scopes(model.graph):
        for node in scope.node:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def invoke(*args):
    """The command line in this process (typer's runner), every argument as a string."""
    from typer.testing import CliRunner

    from convexport.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def assert_user_error(result, *fragments, code=1, quiet_stdout=False):
    """Exit `code` with one line on stderr holding every fragment, no traceback (and, with
    `quiet_stdout`, nothing on stdout)."""
    assert result.exit_code == code, result.output
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert "Traceback" not in result.output
    if quiet_stdout:
        assert not result.stdout.strip(), result.stdout
    for fragment in fragments:
        assert fragment in message, message


def user_rule(folder, stem: str, primitive: str, rule: str):
    """A user's rule file `stem.yaml` with its primitive in `stem.py` beside it; the rule file's path."""
    (folder / f"{stem}.py").write_text(primitive)
    (folder / f"{stem}.yaml").write_text(rule)
    return folder / f"{stem}.yaml"


def verdict(function, *args, **kwargs):
    """What an algebra function gives: its result, or the Refusal it raises."""
    from convexport.algebra import Refusal

    try:
        return function(*args, **kwargs)
    except Refusal as refusal:
        return refusal
