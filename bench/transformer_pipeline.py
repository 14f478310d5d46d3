"""Transformers through the pipeline users deploy them with (issue 50): optimum's ONNX export ->
convexport -> ONNX Runtime's transformer optimizer, against optimum's export -> the optimizer.

    PYTHONPATH=/path/to/hf/packages .venv/bin/python bench/transformer_pipeline.py [--only NAME] [--write FILE]
    PYTHONPATH=/path/to/hf/packages:FP16_PACKAGES .venv/bin/python bench/transformer_pipeline.py --dtype fp16

Needs transformers 4.57 and optimum-onnx 0.1 (installed with `pip install --no-deps --target`,
not in convexport's environment; README "Benchmarks"). The models are small random configs
(2 layers, hidden 64, 4 heads) with every weight perturbed, so that no bias is zero and no
LayerNorm is the identity, exported by optimum as users export them: BERT, DistilBERT, ViT
(feature-extraction), GPT-2 with past (text-generation-with-past), T5 and Whisper with past
(their encoders, decoders, decoders with past and merged decoders); and BERT with an unmerged
LoRA (peft's form, rank 4) in its query and value; Llama with past (grouped-query attention),
BART with past, Swin, BEiT (relative position bias), Wav2Vec2 (a waveform input) and Gemma with
past (its RMSNorm's scale applied in float32). Every file through
convexport with its default made-up inputs (no --input).

Per model: the fused kernels `optimize_model(path, model_type=...)` makes of optimum's file and
of convexport's output, whether the interface (input and output names, dtypes, dims and dim
names) is the same, and the latency of both optimized files (ONNX Runtime CPU, made-up inputs of
every dynamic dim 16: batch 16 x sequence 16, past 16; median of 21 interleaved rounds).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

import convexport
from convexport.load.input_domains import sized_by_running
from convexport.load.inputs import random_inputs
from convexport.load.onnx_route import graph_input_specs

FUSED = {
    "Attention",
    "MultiHeadAttention",
    "GroupQueryAttention",
    "EmbedLayerNormalization",
    "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "LayerNormalization",
    "SimplifiedLayerNormalization",
    "BiasGelu",
    "Gelu",
    "FastGelu",
    "RotaryEmbedding",
}
SMALL = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128}


def _perturbed(model):
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.02)
    return model.eval()


def _bert():
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig(vocab_size=100, max_position_embeddings=64, **SMALL)), "feature-extraction", "bert"


class _LoRA(torch.nn.Module):
    """peft's LoRA layer, unmerged: base(x) + B(A(x)) * alpha / r."""

    def __init__(self, base, rank=4, alpha=8):
        super().__init__()
        self.base, self.scale = base, alpha / rank
        self.lora_A = torch.nn.Linear(base.in_features, rank, bias=False)
        self.lora_B = torch.nn.Linear(rank, base.out_features, bias=False)

    def forward(self, x):
        return self.base(x) + self.lora_B(self.lora_A(x)) * self.scale


def _bert_lora():
    model, task, model_type = _bert()
    for layer in model.encoder.layer:
        layer.attention.self.query = _LoRA(layer.attention.self.query)
        layer.attention.self.value = _LoRA(layer.attention.self.value)
    return model, task, model_type


def _distilbert():
    from transformers import DistilBertConfig, DistilBertModel

    config = DistilBertConfig(vocab_size=100, max_position_embeddings=64, n_layers=2, dim=64, n_heads=4, hidden_dim=128)
    return DistilBertModel(config), "feature-extraction", "bert"


def _vit():
    from transformers import ViTConfig, ViTModel

    return ViTModel(ViTConfig(image_size=32, patch_size=8, **SMALL)), "feature-extraction", "vit"


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=100, n_positions=64, n_layer=2, n_embd=64, n_head=4)
    return GPT2LMHeadModel(config), "text-generation-with-past", "gpt2"


def _t5():
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=100, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)
    # as "bert": the t5 type's RelativePositionBias has no CPU kernel in ONNX Runtime 1.31
    return T5ForConditionalGeneration(config), "text2text-generation-with-past", "bert"


def _whisper():
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(
        vocab_size=100,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_source_positions=1500,  # optimum's dummy features are 3000 frames, as Whisper's are
        max_target_positions=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
        suppress_tokens=[],
        begin_suppress_tokens=[],
    )
    return WhisperForConditionalGeneration(config), "automatic-speech-recognition-with-past", "bart"


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    # grouped-query attention (2 key/value heads for 4), rotary positions, RMS norms
    config = LlamaConfig(vocab_size=100, max_position_embeddings=64, num_key_value_heads=2, **SMALL)
    return LlamaForCausalLM(config), "text-generation-with-past", "bert"


def _gemma():
    from transformers import GemmaConfig, GemmaForCausalLM

    # RMS norms scaled by (1 + weight) in float32 before the projections, GeLU-gated MLP
    config = GemmaConfig(vocab_size=100, max_position_embeddings=64, num_key_value_heads=2, head_dim=16, **SMALL)
    return GemmaForCausalLM(config), "text-generation-with-past", "bert"


def _bart():
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(vocab_size=100, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                        max_position_embeddings=64)  # fmt: skip
    return BartForConditionalGeneration(config), "text2text-generation-with-past", "bart"


def _swin():
    from transformers import SwinConfig, SwinForImageClassification

    config = SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4)
    return SwinForImageClassification(config), "image-classification", "bert"


def _beit():
    from transformers import BeitConfig, BeitForImageClassification

    config = BeitConfig(image_size=32, patch_size=8, use_relative_position_bias=True, **SMALL)
    return BeitForImageClassification(config), "image-classification", "bert"


def _wav2vec2():
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    config = Wav2Vec2Config(vocab_size=32, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
                            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, **SMALL)  # fmt: skip
    return Wav2Vec2ForCTC(config), "automatic-speech-recognition", "bert"


MODELS = {
    "bert": _bert,
    "bert_lora": _bert_lora,
    "distilbert": _distilbert,
    "vit": _vit,
    "gpt2": _gpt2,
    "t5": _t5,
    "whisper": _whisper,
    # stop 67: models the rest were not written for (the first sweep found two of them refused)
    "llama": _llama,
    "bart": _bart,
    "swin": _swin,
    "beit": _beit,
    "wav2vec2": _wav2vec2,
    # stop 68: Gemma's norm, open at its scale (half/islands.py)
    "gemma": _gemma,
}


def export(name: str, folder: Path) -> list[tuple[str, Path, str]]:
    """optimum's files for one model: (label, path, the optimizer's model type)."""
    from optimum.exporters.onnx import onnx_export_from_model

    torch.manual_seed(0)  # the random config's own initialisation, before _perturbed's: a rerun gives the same model
    model, task, model_type = MODELS[name]()
    onnx_export_from_model(_perturbed(model), output=folder, task=task, do_validation=False)
    return [(f"{name}/{path.stem}", path, model_type) for path in sorted(folder.glob("*.onnx"))]


def fused(path: Path, model_type: str) -> tuple[dict, Path]:
    from onnxruntime.transformers.optimizer import optimize_model

    optimized = optimize_model(str(path), model_type=model_type, use_gpu=False)
    out = path.with_suffix(".ort.onnx")
    optimized.save_model_to_file(str(out))
    counts = Counter(node.op_type for node in optimized.model.graph.node if node.op_type in FUSED)
    return dict(sorted(counts.items())), out


def interface(path: Path) -> list:
    model = onnx.load(str(path), load_external_data=False)

    def described(values):
        return [
            (v.name, v.type.tensor_type.elem_type, [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim])
            for v in values
        ]

    initializers = {i.name for i in model.graph.initializer}
    return [described(v for v in model.graph.input if v.name not in initializers), described(model.graph.output)]


def _same(path: Path, out: Path) -> str:
    return "yes" if interface(path) == interface(out) else "NO"


def feeds(path: Path, size: int = 16) -> dict:
    """Made-up inputs as convexport makes them (token ids inside the table, masks of 0 and 1,
    related dims related, an image sized for its Conv), every dynamic dim `size`."""
    model = onnx.load(str(path))
    specs = sized_by_running(model, graph_input_specs(model))
    return random_inputs(specs, seed=0, dynamic_size=size)


def latency(paths: list[Path], inputs: dict, rounds: int = 21, round_s: float = 0.2) -> list[float]:
    """Median ms per run of each model, in interleaved rounds of about `round_s` each."""
    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in paths]
    began = time.perf_counter()
    for session in sessions:
        for _ in range(3):
            session.run(None, inputs)
    per_round = max(1, int(round_s / ((time.perf_counter() - began) / (3 * len(sessions)))))
    times = [[] for _ in paths]
    for _ in range(rounds):
        for index, session in enumerate(sessions):
            began = time.perf_counter()
            for _ in range(per_round):
                session.run(None, inputs)
            times[index].append((time.perf_counter() - began) / per_round * 1e3)
    return [statistics.median(t) for t in times]


def casts(path: Path) -> int:
    """The Casts in the model, those in its subgraphs (a merged decoder's If branches) included."""
    from convexport.ir import proto_scopes

    graph = onnx.load(str(path), load_external_data=False).graph
    return sum(node.op_type == "Cast" for scope in proto_scopes(graph) for node in scope.node)


def _right_padded(feeds: dict) -> dict:
    """`feeds` with each attention mask's ones moved to the start of its row, as a tokenizer pads
    on the right: the optimizer's fused Attention reads a BERT mask as each row's length (its
    mask index), so a made-up mask of scattered ones puts the fused model 18% off (float32)."""
    for name, mask in feeds.items():
        if "attention_mask" in name and mask.ndim == 2:
            lengths = np.maximum(mask.sum(axis=1, keepdims=True), 1)
            feeds[name] = (np.arange(mask.shape[1])[None, :] < lengths).astype(mask.dtype)
    return feeds


def half_rows(names: list[str]) -> list[str]:
    """--dtype fp16 (issue 52): per optimum file, convexport --dtype fp16 against the peers'
    float16 of the export (onnxconverter-common's convert_float_to_float16, ONNX Runtime's
    optimizer for the CPU then its float16 conversion, both keep_io_types): whether ONNX Runtime
    runs it (CPU), its error against the export's float64 result on three input sets made up as
    convexport makes them but from half_precision.py's held-out seeds (every dynamic dim 8; the
    masks right-padded),
    its Casts, and what the optimizer fuses (use_gpu=True: float16 is what it runs there) in the
    float32 export and in convexport's file."""
    from half_precision import HELD_OUT, RUNS, _quietly, error_vs_exact
    from onnxconverter_common import float16
    from onnxruntime.transformers.optimizer import optimize_model

    from convexport.validate.float64 import Float64Evaluator

    rows = ["| file | tool | runs | max error / rms | rms error / rms | Casts | fused (use_gpu=True) |",
            "|---|---|---|---|---|---|---|"]  # fmt: skip

    def gpu_fused(path: Path, model_type: str) -> str:
        optimized = _quietly(lambda: optimize_model(str(path), model_type=model_type, use_gpu=True, opt_level=0))
        counts = Counter(node.op_type for node in optimized.model.graph.node if node.op_type in FUSED)
        return ", ".join(f"{n} {op}" for op, n in sorted(counts.items())) or "none"

    def ort_route(path: Path, model_type: str) -> onnx.ModelProto:
        optimized = _quietly(lambda: optimize_model(str(path), model_type=model_type, use_gpu=False))
        optimized.convert_float_to_float16(keep_io_types=True)
        return optimized.model

    with tempfile.TemporaryDirectory() as scratch:
        for name in names:
            for label, path, model_type in _quietly(lambda: export(name, Path(scratch) / name)):
                exported = onnx.load(str(path))
                specs = sized_by_running(exported, graph_input_specs(exported))
                sets = [_right_padded(random_inputs(specs, seed=HELD_OUT + seed, dynamic_size=8)) for seed in range(RUNS)]
                evaluator = Float64Evaluator(exported)
                exact = [evaluator.run(feeds) for feeds in sets]
                merged = "merged" in label  # an If over two graphs: the optimizer fuses inside neither
                made = {}
                out = path.with_name(path.stem + ".cx16.onnx")
                result = _quietly(lambda: convexport.optimize(str(path), output=str(out), profile=False, dtype="fp16"))
                made["convexport --dtype fp16"] = out
                peers = (("onnxconverter-common fp16",
                          lambda: float16.convert_float_to_float16(onnx.load(str(path)), keep_io_types=True)),
                         ("ORT transformer optimizer fp16", lambda: ort_route(path, model_type)))  # fmt: skip
                for tool, build in peers:
                    if merged and tool.startswith("ORT"):
                        continue
                    try:
                        target = path.with_name(f"{path.stem}.{len(made)}.onnx")
                        onnx.save(_quietly(build), str(target))
                        made[tool] = target
                    except Exception as exc:  # the tool's own failure is the result
                        made[tool] = f"fails: {type(exc).__name__}: {str(exc).splitlines()[0][:60]}"
                rows.append(f"| {label} | float32 export | | | | {casts(path)} | "
                            f"{'(If)' if merged else gpu_fused(path, model_type)} |")  # fmt: skip
                for tool, made_path in made.items():
                    if isinstance(made_path, str):
                        rows.append(f"| {label} | {tool} | {made_path} | | | | |")
                        continue
                    try:
                        worst, typical = error_vs_exact(made_path, sets, exact)
                    except Exception as exc:
                        rows.append(f"| {label} | {tool} | no: {str(exc).splitlines()[0][:60]} | | | | |")
                        continue
                    fused_here = "" if merged or tool != "convexport --dtype fp16" else gpu_fused(made_path, model_type)
                    if tool == "convexport --dtype fp16" and result.report["precision"]["nodes_half"] == 0:
                        fused_here = "kept float32: " + result.report["precision"]["kept_float32"][0]["reason"]
                    rows.append(f"| {label} | {tool} | yes | {worst:.2e} | {typical:.2e} | {casts(made_path)} "
                                f"| {fused_here} |")  # fmt: skip
                print("\n".join(rows[-len(made) - 1 :]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", action="append")
    parser.add_argument("--write")
    parser.add_argument("--dtype", choices=["fp16"], help="instead: convexport --dtype fp16 against the peers (needs "
                        "onnxconverter-common on PYTHONPATH, bench/half_precision.py's)")  # fmt: skip
    args = parser.parse_args()
    if args.dtype:
        table = "\n".join(half_rows(args.only or list(MODELS)))
        print(table)
        if args.write:
            Path(args.write).write_text(table + "\n")
        return
    rows = [
        "| model | optimizer alone: fused | convexport then optimizer: fused | interface same | "
        "ms optimizer alone | ms convexport + optimizer | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.only or MODELS:
            for label, path, model_type in export(name, Path(scratch) / name):
                out = path.with_name(path.stem + ".cx.onnx")
                result = convexport.optimize(str(path), output=str(out), profile=False)
                error = result.report["validation"]["outputs"]
                print(f"{label}: validated, {len(error)} outputs, {result.report['after']['nodes']} nodes", flush=True)
                if "merged" in label:  # an If over two graphs: the optimizer fuses inside neither
                    rows.append(f"| {label} | (If: not fused) | (If: not fused) | {_same(path, out)} | | | |")
                    continue
                before, before_ort = fused(path, model_type)
                after, after_ort = fused(out, model_type)
                same = _same(path, out)
                try:
                    inputs = feeds(path)
                    ms = latency([before_ort, after_ort], inputs)
                    timing = f"{ms[0]:.3f} | {ms[1]:.3f} | {ms[0] / ms[1]:.2f}x"
                except Exception as exc:  # an input the made-up feeds do not fit
                    timing = f"not timed: {str(exc).splitlines()[0][:60]} | | "
                show = ", ".join(f"{n} {op}" for op, n in before.items()) or "none"
                shown_after = ", ".join(f"{n} {op}" for op, n in after.items()) or "none"
                rows.append(f"| {label} | {show} | {shown_after} | {same} | {timing} |")
                print(rows[-1], flush=True)
    table = "\n".join(rows)
    print(table)
    if args.write:
        Path(args.write).write_text(table + "\n")


if __name__ == "__main__":
    sys.exit(main())
