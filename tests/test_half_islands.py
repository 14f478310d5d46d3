"""The model's own float32 islands under --dtype fp16 (half/islands.py): what its code casts into
float32 (transformers' Llama, T5 and Gemma RMSNorms) stays float32 where that brings the outputs
nearer, and what would put a Cast inside a fused kernel (a mask added to the scores inside
the Attention ONNX Runtime's optimizer fuses) is left to the other steps."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import convexport
from convexport.validate.float64 import Float64Evaluator
from convexport.half import choose
from convexport.half.islands import _splits_a_kernel, float32_islands


class LlamaRMSNorm(torch.nn.Module):
    """transformers' LlamaRMSNorm: its statistics in float32 whatever the activations' type."""

    def __init__(self, width: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = torch.nn.Parameter(1 + 0.05 * torch.randn(width)), eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps)).to(dtype)


class T5LayerNorm(LlamaRMSNorm):
    """transformers' T5LayerNorm: the variance in float32, multiplied into the activations as they are."""

    def forward(self, x):
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


class GemmaRMSNorm(LlamaRMSNorm):
    """transformers' GemmaRMSNorm: the scale (1 + weight) applied in float32 too, then `type_as`."""

    def forward(self, x):
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).type_as(x)


class Decoder(torch.nn.Module):
    """An embedding (at a random initialisation's scale), two norm -> projection blocks with a
    residual each, a final norm and a head."""

    def __init__(self, norm=LlamaRMSNorm, width: int = 128):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(50, width)
        torch.nn.init.normal_(self.embed.weight, std=0.02)
        self.norms = torch.nn.ModuleList([norm(width) for _ in range(3)])
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(width, width) for _ in range(2)])
        self.head = torch.nn.Linear(width, 50)

    def forward(self, ids):
        h = self.embed(ids)
        for norm, block in zip(self.norms, self.blocks):
            h = h + block(norm(h))
        return self.head(self.norms[-1](h))


def exported(tmp_path, norm=LlamaRMSNorm) -> str:
    path = str(tmp_path / f"{norm.__name__}.onnx")
    torch.onnx.export(Decoder(norm).eval(), (torch.randint(0, 50, (1, 16)),), path, dynamo=False, opset_version=17,
                      input_names=["ids"], output_names=["logits"])  # fmt: skip
    return path


def island_nodes(path: str, tmp_path, monkeypatch, extra_kernels=lambda model: []) -> list[set[tuple[str, str]]]:
    """The (op type, name) of each island's nodes the half stage finds in the rewritten model,
    with the kernels the rewrite kept whole and `extra_kernels(model)` (sets of node names)."""
    found = []

    def spied(model, candidates, types, flops, kernels):
        named = {node.name: index for index, node in enumerate(model.graph.node)}
        kernels = [*kernels, *({named[name] for name in kernel} for kernel in extra_kernels(model))]
        islands = float32_islands(model, candidates, types, flops, kernels)
        nodes = model.graph.node
        found.extend({(nodes[index].op_type, nodes[index].name) for index in island.nodes} for island in islands)
        return islands

    monkeypatch.setattr(choose, "float32_islands", spied)
    convexport.optimize(path, output=str(tmp_path / "spied.onnx"), profile=False, dtype="fp16")
    return found


def islands_of(path: str, tmp_path, monkeypatch) -> list[set[str]]:
    """The op types of each island (island_nodes)."""
    return [{op for op, _ in island} for island in island_nodes(path, tmp_path, monkeypatch)]


NORM = ["Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul"]
RESIDUAL_ADDS = {("Add", "/Add"), ("Add", "/Add_1")}


@pytest.mark.parametrize("norm", [LlamaRMSNorm, T5LayerNorm, GemmaRMSNorm])
def test_the_residual_stream_and_every_rms_norm_to_its_scale_are_one_island(tmp_path, monkeypatch, norm):
    """The residual Adds join the norms they feed: the stream the norms read is summed in
    float32, each block's output cast into float32 to be added; each norm goes on to its
    scale (Llama's through its cast back); the blocks' projections stay out."""
    (island,) = island_nodes(exported(tmp_path, norm), tmp_path, monkeypatch)
    assert RESIDUAL_ADDS <= island
    for layer in range(3):
        ops = {op for op, name in island if name.startswith(f"/norms.{layer}/")}
        assert set(NORM) <= ops
    assert not {op for op, _ in island} & {"MatMul", "Gemm"}


class Encoder(Decoder):
    """The decoder without its head: its last norm's output is the model's (an encoder's last
    hidden state)."""

    def forward(self, ids):
        h = self.embed(ids)
        for norm, block in zip(self.norms, self.blocks):
            h = h + block(norm(h))
        return self.norms[-1](h)


def test_an_island_may_make_the_models_output(tmp_path, monkeypatch):
    """The last norm makes the output: it is the island's all the same, and with a float32
    interface the output needs no Cast."""
    path = str(tmp_path / "encoder.onnx")
    torch.onnx.export(Encoder().eval(), (torch.randint(0, 50, (1, 16)),), path, dynamo=False, opset_version=17,
                      input_names=["ids"], output_names=["hidden"])  # fmt: skip
    (island,) = island_nodes(path, tmp_path, monkeypatch)
    assert RESIDUAL_ADDS <= island and set(NORM) <= {op for op, name in island if name.startswith("/norms.2/")}
    nodes = onnx.load(str(tmp_path / "spied.onnx")).graph.node
    (last,) = [node for node in nodes if "hidden" in node.output]
    assert last.op_type != "Cast"


def test_a_residual_add_whose_block_output_shares_a_kernel_with_it_stays_out(tmp_path, monkeypatch):
    """Where the first block's last node and its residual Add are fused into one kernel, the
    Cast of the block's output into float32 would split it: that Add stays out, the first norm
    is an island of its own, and the stream from the second on is one as before."""
    path = exported(tmp_path)

    def block_and_residual(model):
        makers = {output: node.name for node in model.graph.node for output in node.output}
        (add,) = [node for node in model.graph.node if node.name == "/Add"]
        return [{add.name, *(makers[name] for name in add.input if makers.get(name, "").startswith("/blocks"))}]

    islands = island_nodes(path, tmp_path, monkeypatch, block_and_residual)
    first, rest = islands
    assert {name for _, name in first} == {name for _, name in first if name.startswith("/norms.0/")}
    assert ("Add", "/Add_1") in rest and not any(("Add", "/Add") in island for island in islands)


def test_a_mask_added_to_the_scores_inside_a_fused_attention_is_no_island(tmp_path, monkeypatch):
    """BERT's `(1 - mask.to(float)) * min`, added to the scores: an island by its arithmetic,
    but its Cast into half would fall inside the Attention ONNX Runtime's optimizer fuses."""
    from test_transformer_pipeline import export_encoder

    path = export_encoder(tmp_path)
    mask = {"Sub", "Mul"}
    assert mask not in islands_of(path, tmp_path, monkeypatch)  # (the scale's Sqrt of a dim is one)
    # without the kernels to keep whole it would be one: the kernels are what leave it out
    taken = []

    def without_kernels(model, candidates, types, flops, kernels):
        found = float32_islands(model, candidates, types, flops, [])
        taken.extend({model.graph.node[index].op_type for index in island.nodes} for island in found)
        return []

    monkeypatch.setattr(choose, "float32_islands", without_kernels)
    convexport.optimize(path, output=str(tmp_path / "masked.onnx"), profile=False, dtype="fp16")
    assert mask in taken


def _error_on_onnx_runtime(path: str, original: str) -> float:
    """The largest error of the file as ONNX Runtime runs it by default (its fusions on), over
    the exact result's rms, on fresh token ids."""
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    evaluator = Float64Evaluator(onnx.load(original))
    worst = 0.0
    for seed in range(3):
        ids = np.random.default_rng(100 + seed).integers(0, 50, (1, 16))
        (got,), (exact,) = session.run(None, {"ids": ids}), evaluator.run({"ids": ids})
        worst = max(worst, float(np.abs(got - exact).max() / np.sqrt((exact**2).mean())))
    return worst


@pytest.mark.parametrize("norm", [LlamaRMSNorm, T5LayerNorm, GemmaRMSNorm])
def test_the_islands_stay_float32_and_onnx_runtimes_fused_norm_keeps_the_models_epsilon(tmp_path, monkeypatch, norm):
    """ONNX Runtime fuses the norm into one kernel when it loads the model, and reads its
    epsilon from the Add only where that is float32 (else 1e-5: the variance of a 0.02-scale
    embedding is 4e-4, so 1e-5 for 1e-6 puts the norm 1% off). Its transformer optimizer
    fuses the float16 file's norms as it fuses the float32 model's: the first alone, each
    after a residual Add with it (SkipSimplifiedLayerNormalization)."""
    from onnxruntime.transformers.optimizer import optimize_model

    path = exported(tmp_path, norm)
    result = convexport.optimize(path, output=str(tmp_path / "islands.onnx"), profile=False, dtype="fp16")
    kept = [entry for entry in result.report["precision"]["kept_float32"] if "its own Casts" in entry["reason"]]
    assert set(NORM) <= {entry["op"] for entry in kept}
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "as_loaded.onnx")
    ort.InferenceSession(str(tmp_path / "islands.onnx"), options, providers=["CPUExecutionProvider"])
    fused = [node for node in onnx.load(options.optimized_model_filepath).graph.node if "LayerNorm" in node.op_type]
    assert len(fused) == 3
    assert all(abs(a.f - 1e-6) < 1e-9 for node in fused for a in node.attribute if a.name == "epsilon")
    def norms(file: str) -> list[str]:
        optimized = optimize_model(file, model_type="bert", use_gpu=True, opt_level=0)
        return sorted(node.op_type for node in optimized.model.graph.node if "LayerNorm" in node.op_type)

    assert norms(str(tmp_path / "islands.onnx")) == norms(path) == [
        "SimplifiedLayerNormalization", *["SkipSimplifiedLayerNormalization"] * 2]

    monkeypatch.setattr(choose, "float32_islands", lambda *args: [])
    convexport.optimize(path, output=str(tmp_path / "no_islands.onnx"), profile=False, dtype="fp16")
    files = ("islands.onnx", "no_islands.onnx")
    with_islands, without = (_error_on_onnx_runtime(str(tmp_path / name), path) for name in files)
    assert with_islands < without / 2, (with_islands, without)


def merged_decoder(tmp_path) -> str:
    """The Llama-norm decoder twice, as the two branches of an If on `use_cache` reading the
    main graph's weights, their node and tensor names repeated as optimum's merged decoders
    repeat theirs."""
    model = onnx.load(exported(tmp_path))
    graph = model.graph

    def branch(name: str) -> onnx.GraphProto:
        nodes = [onnx.NodeProto() for _ in graph.node]
        for copy, node in zip(nodes, graph.node):
            copy.CopyFrom(node)
            copy.output[:] = [f"{output}_b" if output == "logits" else output for output in node.output]
        out = onnx.helper.make_tensor_value_info("logits_b", onnx.TensorProto.FLOAT, None)
        return onnx.helper.make_graph(nodes, name, [], [out])

    use_cache = onnx.helper.make_tensor_value_info("use_cache", onnx.TensorProto.BOOL, [])
    choice = onnx.helper.make_node("If", ["use_cache"], ["logits"], then_branch=branch("with_past"),
                                   else_branch=branch("no_past"))  # fmt: skip
    merged = onnx.helper.make_graph([choice], "merged", [*graph.input, use_cache], list(graph.output),
                                    list(graph.initializer))  # fmt: skip
    path = str(tmp_path / "merged.onnx")
    onnx.save(onnx.helper.make_model(merged, opset_imports=model.opset_import, ir_version=model.ir_version), path)
    return path


def test_a_merged_decoders_branches_have_their_islands(tmp_path, monkeypatch):
    """In an If's branches no fused kernel keeps the norms' no-op Casts into float32 from
    constant folding: under --dtype they are kept so (by their graph's name with theirs, which
    the two branches repeat), and each branch's norms are islands as the decoder's own are."""
    from convexport.stages import rewrite

    path = merged_decoder(tmp_path)
    islands = island_nodes(path, tmp_path, monkeypatch)
    assert len(islands) == 2  # each branch's residual stream with its three norms
    for island in islands:
        assert RESIDUAL_ADDS <= island and len({name.split("/")[1] for _, name in island if "norms" in name}) == 3
    float32 = convexport.optimize(path, output=str(tmp_path / "float32.onnx"), profile=False)
    assert float32.report["validation"]["passed"]  # (in float32 they fold away as before)
    branches = [a.g for a in onnx.load(str(tmp_path / "float32.onnx")).graph.node[0].attribute]
    assert not any(node.op_type == "Cast" for branch in branches for node in branch.node)
    monkeypatch.setattr(rewrite, "no_op_casts_in_subgraphs", lambda model: frozenset())
    assert islands_of(path, tmp_path, monkeypatch) == []


def test_only_the_no_op_casts_of_activations_in_subgraphs_are_kept_from_folding():
    """x's Cast into float32 in a branch is one; the same Cast of a value made from x's
    Shape (a mask's or a scale's arithmetic, which folding should take) and a Cast from an
    integer are not, nor is the main graph's (its kernels keep what matters there)."""
    from onnx import TensorProto, helper

    from convexport.half.islands import no_op_casts_in_subgraphs
    from convexport.ir import scoped_name

    def branch(name):
        nodes = [helper.make_node("Cast", ["x"], ["a"], to=TensorProto.FLOAT, name="activation"),
                 helper.make_node("Shape", ["x"], ["s"], name="shape"),
                 helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT, name="from_int"),
                 helper.make_node("Cast", ["sf"], ["sff"], to=TensorProto.FLOAT, name="of_a_shape"),
                 helper.make_node("Sum", ["a", "sff"], ["y_b"], name="sum")]  # fmt: skip
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info("y_b", TensorProto.FLOAT, [4])])

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    flag = helper.make_tensor_value_info("flag", TensorProto.BOOL, [])
    nodes = [helper.make_node("Cast", ["x"], ["x32"], to=TensorProto.FLOAT, name="main_cast"),
             helper.make_node("If", ["flag"], ["y"], then_branch=branch("then"), else_branch=branch("else"))]  # fmt: skip
    graph = helper.make_graph(nodes, "main", [x, flag], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    found = no_op_casts_in_subgraphs(model)
    branches = [a.g for a in model.graph.node[1].attribute]
    assert found == {scoped_name(b, next(n for n in b.node if n.name == "activation")) for b in branches}


def test_without_a_float64_reference_the_islands_are_tried_against_float32(tmp_path, monkeypatch):
    """A model over the weights validation makes float64 copies of (a deployed LLM) is judged
    against its float32 outputs, whose own error is orders below half's: its islands are tried
    all the same (t5-base's decoder: 1.2x nearer, bench/RESULTS.md), where before they were
    left out, measured against nothing. Here the outputs miss the bound with the norms in
    half (ONNX Runtime's fused norm reads their epsilon as 1e-5): the islands, tried before a
    region is grown to the bound, meet it, and no region is grown (grown first, it took the
    blocks' projections float32 too)."""
    monkeypatch.setattr("convexport.validate.exact_check.FLOAT64_WEIGHT_BYTES", 1000)
    calls, missed = [], []
    attempt, islands = choose._Choice.attempt, choose.float32_islands

    def judged_attempt(self, keep):
        calls.append("attempt")
        result = attempt(self, keep)
        missed.append(choose.over_bound(result[1]))
        return result

    monkeypatch.setattr(choose._Choice, "attempt", judged_attempt)
    monkeypatch.setattr(choose, "float32_islands", lambda *args: calls.append("islands") or islands(*args))
    result = convexport.optimize(exported(tmp_path), output=str(tmp_path / "half.onnx"), profile=False, dtype="fp16")
    precision = result.report["precision"]
    assert precision["validation"]["against"] == "float32" and precision["validation"]["passed"]
    assert calls[:3] == ["attempt", "islands", "attempt"] and missed[:2] == [True, False]
    reasons = {entry["reason"].split(" (")[0] for entry in precision["kept_float32"]}
    assert reasons == {"the model computes it in float32"}


def test_against_float32_the_outputs_rms_error_is_measured_too():
    from convexport.half.outputs import HalfRuns, judge_outputs
    from helpers import make_model, tensor

    model = make_model([onnx.helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [64])], [tensor("y", [64])])
    x = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    float32 = {"y": np.maximum(x, 0)}
    judged = judge_outputs(model, HalfRuns([{"x": x}], [float32], [None]), "float16", "cpu")
    assert judged["y"].rms_ratio == 0.0  # the same values: nothing off
    off = {"y": float32["y"] * (1 + 1e-3)}
    judged = judge_outputs(model, HalfRuns([{"x": x}], [off], [None]), "float16", "cpu")
    assert abs(judged["y"].rms_ratio - 1e-3 / (1 + 1e-3)) < 1e-6


@pytest.mark.parametrize("op", ["Shape", "Size", "Mul"])
def test_only_a_reader_of_elements_in_the_islands_kernel_splits_it(op):
    """A value the island makes, read in the same fused kernel by a Shape or a Size, needs no
    Cast there (they read no element); any other reader would take one inside the kernel."""
    nodes = [onnx.helper.make_node("Add", ["a", "b"], ["made"]), onnx.helper.make_node(op, ["made"], ["read"])]
    readers = {"made": [1]}
    split = _splits_a_kernel({"made": 0}, {0}, readers, set(), nodes, kernels=[{0, 1}])
    assert split is (op == "Mul")
    assert not _splits_a_kernel({"made": 0}, {0}, readers, set(), nodes, kernels=[])
