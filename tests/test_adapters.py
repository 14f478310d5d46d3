"""Adapters merged on every layer class and export route (issue 39): LoRA on GPT-2's Conv1D,
DoRA on Linear; each compared with peft's merge_and_unload() (tests/fixtures/adapters.py)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnxruntime as ort
import pytest
import torch
from rich.console import Console

import adapters
import convexport
from convexport.report.sections import print_optimize_summary

EXAMPLE = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0))


def dense_count(model) -> int:
    ops = Counter(node.op_type for node in model.graph.node)
    return ops["MatMul"] + ops["Gemm"]


def optimized(module, route):
    model = adapters.exported(module, EXAMPLE, route)
    name = model.graph.input[0].name
    return model, convexport.optimize(model, inputs=[f"{name}:2x5x32"], write=False, profile=False)


def assert_is_the_merged_model(module, route):
    """Validated, as many dense nodes as the hand-merged model exported the same way, and its
    output that of the merged model in torch; no low-rank branch left."""
    _, result = optimized(module, route)
    merged = adapters.merge_and_unload(module)
    assert result.report["validation"]["passed"]
    assert dense_count(result.model) == dense_count(adapters.exported(merged, EXAMPLE, route)), result.report["skipped"]
    assert result.report["low_rank_branches_left"] == []
    session = ort.InferenceSession(result.model.SerializeToString(), providers=["CPUExecutionProvider"])
    actual = session.run(None, {session.get_inputs()[0].name: EXAMPLE.numpy()})[0]
    with torch.no_grad():
        expected = merged(EXAMPLE).numpy()
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())


@pytest.mark.parametrize("route", adapters.ROUTES)
def test_lora_on_gpt2_conv1d_is_merged(route):
    assert_is_the_merged_model(adapters.gpt2(), route)


@pytest.mark.parametrize("route", adapters.ROUTES)
def test_dora_on_llama_mlps_is_merged(route):
    assert_is_the_merged_model(adapters.llama_mlp(dora=True), route)


@pytest.mark.parametrize("route", ["dynamo", "torchscript"])
def test_dora_on_bert_is_merged(route):
    assert_is_the_merged_model(adapters.bert(dora=True), route)


@pytest.mark.parametrize("bias", [True, False])
def test_dora_on_one_linear_is_one_matmul(bias):
    module = adapters.dora_linear(bias=bias)
    _, result = optimized(module, "torchscript")
    assert Counter(node.op_type for node in result.model.graph.node) == ({"MatMul": 1, "Add": 1} if bias else {"MatMul": 1})


def test_a_low_rank_branch_left_is_listed_with_its_module():
    result = convexport.optimize(adapters.gpt2(), inputs=["x:2x5x32"], write=False, profile=False,
                                 disable_rules=["linear-region"])
    left = result.report["low_rank_branches_left"]
    assert len(left) == 8  # c_attn, c_proj, mlp.c_fc, mlp.c_proj in two blocks
    first = left[0]
    assert (first["in_features"], first["rank"], first["out_features"]) == (32, 8, 96)
    assert first["module"] == "0.c_attn (Adapted)"
    console = Console(record=True, width=300)
    print_optimize_summary(result.report, console)
    assert (
        "low-rank branches left unmerged: 8 (rank 8 beside 32 -> 96 at 0.c_attn (Adapted) and 7 more); "
        "--explain linear-region says why"
    ) in console.export_text()


def test_explain_says_how_many_inputs_a_dense_makes():
    """GPT-2's base layer ends in a Reshape: dense-lora's root has one dense input of two."""
    result = convexport.optimize(adapters.gpt2(), inputs=["x:2x5x32"], write=False, profile=False,
                                 disable_rules=["linear-region"], explain=["dense-lora"])
    verdicts = result.report["explain"]["dense-lora"].values()
    assert any("1 of its inputs is made by a Gemm or MatMul node, the pattern needs 2 (made by Reshape, MatMul)"
               in verdict for verdict in verdicts), verdicts
