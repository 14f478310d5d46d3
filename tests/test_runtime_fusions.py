"""Subgraphs ONNX Runtime fuses into one kernel (rewrite/runtime_fusions.py) stay whole under
the default strategy, and --strategy all says which it broke (issue 39, item 3). The check is
ONNX Runtime's own optimized graph."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper

import adapters
import convexport
from convexport import ir
from convexport.rewrite.runtime_fusions import find_fusions

RNG = np.random.default_rng(0)


def runtime_ops(model: onnx.ModelProto, tmp_path) -> Counter:
    """The ops of the graph ONNX Runtime runs, after its own fusions (CPU provider)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "runtime.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return Counter(node.op_type for node in onnx.load(tmp_path / "runtime.onnx").graph.node)


def parsed(body: str, weights: dict, opset: int = 18) -> onnx.ModelProto:
    model = onnx.parser.parse_model(f'<ir_version: 10, opset_import: ["" : {opset}]>\n' + body)
    for name, value in weights.items():
        model.graph.initializer.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
    return ir.infer_shapes(model, "test")


def optimized(model, strategy="cost"):
    return convexport.optimize(model, inputs=["x:4x16"], write=False, profile=False, strategy=strategy)


SQRT2, HALF = math.sqrt(2.0), 0.5
GELUS = {
    # x * (1 + erf(x / sqrt 2)) * 0.5: the TorchScript exporter's order below opset 20
    "trailing half": "d = Div(h, r2)\n e = Erf(d)\n p = Add(e, one)\n m = Mul(h, p)\n g = Mul(m, half)",
    # (x * 0.5) * (1 + erf(x / sqrt 2))
    "leading half": "d = Div(h, r2)\n e = Erf(d)\n p = Add(e, one)\n s = Mul(h, half)\n g = Mul(s, p)",
}


def gelu_between_linears(gelu: str) -> onnx.ModelProto:
    body = f"""
        gelu (float[4, 16] x) => (float[4, 8] y) {{
            h = Gemm(x, w1, b1)
            {gelu}
            y = Gemm(g, w2, b2)
        }}"""
    weights = {"w1": RNG.standard_normal((16, 32)), "b1": RNG.standard_normal(32), "w2": RNG.standard_normal((32, 8)),
               "b2": RNG.standard_normal(8), "r2": SQRT2, "ir2": 1 / SQRT2, "one": 1.0, "half": HALF}
    return parsed(body, weights)


@pytest.mark.parametrize("order", GELUS)
def test_gelu_stays_one_kernel(order, tmp_path):
    model = gelu_between_linears(GELUS[order])
    assert [fusion.kind for fusion in find_fusions(ir.import_graph(model))] == ["Gelu"]
    result = optimized(model)
    assert runtime_ops(result.model, tmp_path)["Gelu"] == runtime_ops(model, tmp_path)["Gelu"] == 1
    # only a trailing * 0.5 is something a rule would fold (into the next Gemm)
    wanted = [("Gelu", True)] if order == "trailing half" else []
    assert [(entry["fusion"], entry["kept"]) for entry in result.report["runtime_fusions"]] == wanted


def test_strategy_all_breaks_it_and_says_so(tmp_path):
    model = gelu_between_linears(GELUS["trailing half"])
    result = optimized(model, strategy="all")
    assert runtime_ops(result.model, tmp_path)["Gelu"] == 0
    (entry,) = result.report["runtime_fusions"]
    assert entry["fusion"] == "Gelu" and entry["kept"] is False and entry["rules"]


@pytest.mark.parametrize("scale", ["Div(h, two)", "Mul(h, ir2)"])
def test_an_erf_the_runtime_does_not_fuse_is_folded(scale, tmp_path):
    """Div by 2, not sqrt 2, or Mul by 1 / sqrt 2 (which ONNX Runtime 1.31 does not fuse): no
    kernel to keep, so the trailing scale folds into the Gemm."""
    model = gelu_between_linears(GELUS["trailing half"].replace("Div(h, r2)", scale))
    model.graph.initializer.append(numpy_helper.from_array(np.array(2.0, np.float32), "two"))
    assert runtime_ops(model, tmp_path)["Gelu"] == 0
    result = optimized(model)
    assert result.report["runtime_fusions"] == []
    muls = [Counter(node.op_type for node in graph.node)["Mul"] for graph in (model.graph, result.model.graph)]
    assert muls[1] == muls[0] - 1  # the trailing * 0.5, folded


NORMS = {
    "LayerNorm": """
        mu = ReduceMean <axes = [-1]> (x)
        d = Sub(x, mu)
        sq = Pow(d, two)
        var = ReduceMean <axes = [-1]> (sq)
        ve = Add(var, eps)
        sd = Sqrt(ve)
        n = Div(d, sd)
        gn = Mul(n, gamma)
        g = Add(gn, beta)""",
    "RMSNorm": """
        sq = Pow(x, two)
        var = ReduceMean <axes = [-1]> (sq)
        ve = Add(var, eps)
        sd = Sqrt(ve)
        n = Div(x, sd)
        g = Mul(n, gamma)""",
    # torch's rsqrt as the TorchScript exporter writes it (Llama's LlamaRMSNorm)
    "RMSNorm, rsqrt": """
        sq = Pow(x, two)
        var = ReduceMean <axes = [-1]> (sq)
        ve = Add(var, eps)
        sd = Sqrt(ve)
        r = Div(one, sd)
        n = Mul(x, r)
        g = Mul(gamma, n)""",
}
KINDS = {"LayerNorm": "LayerNormalization"}


@pytest.mark.parametrize("gamma", ["trained", "ones"])
@pytest.mark.parametrize("norm", NORMS)
def test_a_decomposed_norm_keeps_its_scale_and_shift(norm, gamma, tmp_path):
    """The norm's gamma (and beta) before a Linear would fold into it, and a gamma of ones (a
    fresh model's) would be dropped; the runtime then would not fuse the norm."""
    kind = KINDS.get(norm, "SimplifiedLayerNormalization")
    scale = RNG.uniform(0.5, 2, 16) if gamma == "trained" else np.ones(16)
    model = parsed(f"""
        norm (float[4, 16] x) => (float[4, 8] y) {{
            {NORMS[norm]}
            y = Gemm(g, w, b)
        }}""", {"two": 2.0, "eps": 1e-5, "one": 1.0, "gamma": scale, "beta": RNG.standard_normal(16),
                "w": RNG.standard_normal((16, 8)), "b": RNG.standard_normal(8)}, opset=17)
    assert [fusion.kind for fusion in find_fusions(ir.import_graph(model))] == [kind]
    before = runtime_ops(model, tmp_path)[kind]
    result = optimized(model)
    assert before == 1 and runtime_ops(result.model, tmp_path)[kind] == 1
    assert [entry["kept"] for entry in result.report["runtime_fusions"]] == [True]


@pytest.mark.parametrize("route", ["dynamo", "torchscript"])
def test_bert_keeps_its_gelu_and_merges_its_adapters(route, tmp_path):
    """Issue 39's BERT: LoRA on every projection, GELU as TorchScript writes it below opset 20."""
    module = adapters.bert(gelu=adapters.gelu_erf)
    example = torch.randn(2, 5, 32)
    model = adapters.exported(module, example, route)
    result = convexport.optimize(model, inputs=[f"{model.graph.input[0].name}:2x5x32"], write=False, profile=False)
    hand = adapters.exported(adapters.merge_and_unload(module), example, route)
    assert runtime_ops(result.model, tmp_path)["Gelu"] == runtime_ops(hand, tmp_path)["Gelu"] == 2
    dense = Counter(node.op_type for node in result.model.graph.node)
    hand_dense = Counter(node.op_type for node in hand.graph.node)
    assert dense["MatMul"] + dense["Gemm"] == hand_dense["MatMul"] + hand_dense["Gemm"]
    assert all(entry["kept"] for entry in result.report["runtime_fusions"])
