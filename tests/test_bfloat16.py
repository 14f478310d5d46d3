"""optimize --dtype bf16 (issue 52): the nodes the device has a bfloat16 kernel for, where the
error measured against float64 allows, the rest float32 with why. ONNX Runtime's CPU provider
has bfloat16 kernels for a handful of ops (Transpose, Concat, LayerNormalization, ...) and no
fallback for the others, so on this machine most nodes stay float32; what runs in bfloat16 is
checked here on its own: the file ONNX Runtime loads, its error on fresh inputs against the
float64 result, and `validate` judging it at bfloat16's roundoff."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import convexport
from convexport.validate.float64 import Float64Evaluator
from convexport.half.kernels import lacking_kernels
from convexport.ir.slots import data_slots
from helpers import assert_user_error, invoke, make_model, tensor
from test_half_precision import conv_net

BFLOAT16 = TensorProto.BFLOAT16


def normalised_rows(seed: int = 0) -> onnx.ModelProto:
    """Transpose -> LayerNormalization -> Relu: the first two have CPU bfloat16 kernels, the
    LayerNormalization alone computes."""
    rng = np.random.default_rng(seed)
    weights = {"g": rng.uniform(0.5, 1.5, 16).astype(np.float32), "b": rng.normal(0, 0.1, 16).astype(np.float32)}
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
        helper.make_node("LayerNormalization", ["t", "g", "b"], ["n"], axis=-1),
        helper.make_node("Relu", ["n"], ["y"]),
    ]
    return make_model(nodes, [tensor("x", [2, 16, 8])], [tensor("y", [2, 8, 16])], weights)


def optimized(model, tmp_path, **options):
    path, out = tmp_path / "m.onnx", tmp_path / "m.bf16.onnx"
    onnx.save(model, path)
    result = convexport.optimize(str(path), output=str(out), profile=False, dtype="bf16", **options)
    return result.report["precision"], onnx.load(str(out)), out


def test_the_nodes_with_a_bfloat16_kernel_run_in_it_and_the_rest_say_why_not(tmp_path):
    original = normalised_rows()
    precision, half, path = optimized(original, tmp_path)
    assert precision["dtype"] == "bfloat16" and precision["validation"]["passed"]
    assert precision["nodes_half"] == 1 and precision["casts"] == 2
    kept = {entry["op"]: entry["reason"] for entry in precision["kept_float32"]}
    assert "no bfloat16 kernel for Relu" in kept["Relu"], kept
    # it has a kernel, but moves what the float32 interface gives: in bfloat16 it would round nothing
    assert "only moves values, which the float32 interface makes in float32" in kept["Transpose"], kept
    types = {value.name: value.type.tensor_type.elem_type for value in half.graph.value_info}
    norm = next(node for node in half.graph.node if node.op_type == "LayerNormalization")
    (cast,) = [node for node in half.graph.node if node.output[0] == norm.input[0]]
    assert cast.op_type == "Cast" and cast.attribute[0].i == types[norm.output[0]] == BFLOAT16
    assert {tensor.data_type for tensor in half.graph.initializer} == {BFLOAT16}  # gamma, beta rounded once
    # fresh inputs, ONNX Runtime's run against the float64 result, within the bound the report gave
    bound = precision["validation"]["outputs"]["y"]["bound"]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    evaluator = Float64Evaluator(original)
    for seed in range(3):
        feeds = {"x": np.random.default_rng(200 + seed).standard_normal((2, 16, 8)).astype(np.float32)}
        (got,), (want,) = session.run(None, feeds), evaluator.run(feeds)
        error = float(np.abs(got.astype(np.float64) - want).max())
        assert 1e-4 < error <= 2 * bound, (error, bound)  # rounded (bfloat16 is coarse), and within
    checked = invoke("validate", tmp_path / "m.onnx", path)
    assert checked.exit_code == 0 and "computes in bfloat16" in checked.output, checked.output


def test_a_model_the_cpu_has_no_bfloat16_kernels_for_is_written_in_float32_saying_so(tmp_path):
    precision, half, _ = optimized(conv_net(), tmp_path)
    assert precision["validation"]["passed"] and precision["nodes_half"] == 0 and precision["casts"] == 0
    reasons = {entry["op"]: entry["reason"] for entry in precision["kept_float32"]}
    assert "has no tensor(bfloat16) form" in reasons["Conv"]  # Conv takes bfloat16 from opset 22
    assert "no bfloat16 kernel for Gemm" in reasons["Gemm"]
    assert all(tensor.data_type == TensorProto.FLOAT for tensor in half.graph.initializer)
    shown = invoke("optimize", tmp_path / "m.onnx", "-o", tmp_path / "cli.onnx", "--dtype", "bf16", "--no-profile")
    assert shown.exit_code == 0 and "no node runs in bfloat16: the model written computes in float32" in shown.output


def test_a_bfloat16_interface_is_refused_in_one_line(tmp_path):
    onnx.save(normalised_rows(), tmp_path / "m.onnx")
    result = invoke("optimize", tmp_path / "m.onnx", "--dtype", "bf16", "--io-dtype", "bf16", "-o", tmp_path / "o.onnx")
    assert_user_error(result, "--io-dtype bf16", "no bfloat16 arrays")
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize(("half", "lacking"), [(TensorProto.FLOAT16, set()), (BFLOAT16, {"MatMul"})])
def test_kernels_are_asked_of_the_provider_for_bfloat16_only(half, lacking):
    """ONNX Runtime's CPU provider runs a float16 node between Casts of its own; for bfloat16
    it has a Transpose and no MatMul."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"]), helper.make_node("MatMul", ["t", "w"], ["y"])]
    model = make_model(nodes, [tensor("x", [4, 4])], [tensor("y", [4, 4])], {"w": np.eye(4, dtype=np.float32)})
    types = {name: TensorProto.FLOAT for name in ("x", "t", "w", "y")}
    candidates = {i: data_slots(node, 18, types, half) for i, node in enumerate(model.graph.node)}
    found = lacking_kernels(model, candidates, types, half, "cpu")
    assert {model.graph.node[i].op_type for i in found} == lacking


def test_the_kernels_the_rewrite_lets_the_optimizer_fuse_stay_in_one_precision(tmp_path):
    """An encoder with an unmerged LoRA: the optimizer fuses no Attention in the export, and
    after convexport merges the LoRA it fuses both and the embeddings' EmbedLayerNormalization.
    Those kernels of the rewritten model are the ones kept in one precision: the embedding
    LayerNormalization has a CPU bfloat16 kernel but the Adds it reads have none, so all of them
    stay float32, and the bfloat16 file fuses as the float32 output does."""
    from onnxruntime.transformers.optimizer import optimize_model

    from test_transformer_pipeline import FUSED, export_encoder

    def fused(file):
        optimized = optimize_model(str(file), model_type="bert", use_gpu=False, opt_level=0)
        return {op: n for op, n in Counter(n.op_type for n in optimized.model.graph.node).items() if op in FUSED}

    path = export_encoder(tmp_path, lora=True)
    assert "Attention" not in fused(path)
    convexport.optimize(path, output=str(tmp_path / "o32.onnx"), profile=False)
    result = convexport.optimize(path, output=str(tmp_path / "bf16.onnx"), profile=False, dtype="bf16")
    assert result.report["precision"]["validation"]["passed"]
    in_float32 = fused(tmp_path / "o32.onnx")
    assert in_float32["Attention"] == 2 and in_float32["EmbedLayerNormalization"] == 1
    assert fused(tmp_path / "bf16.onnx") == in_float32
    kept = {entry["node"]: entry["reason"] for entry in result.report["precision"]["kept_float32"]}
    assert "in one precision with" in kept["/words/Gather"]  # a bfloat16 kernel, kept with its fused kernel
