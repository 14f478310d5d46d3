"""Adapters and detectors against their hand forms (issue 39): LoRA and DoRA merged like peft's
merge_and_unload(), the runtime's own fusions kept, a detector folded like ultralytics' fuse().

    .venv/bin/python bench/adapter_merges.py [--only NAME] [--write bench/RESULTS.md]

Rows with the real libraries where they are installed (`pip install -e .[bench-adapters]`:
transformers and peft; ultralytics, where a torchvision built for the installed torch
imports), built from small configs (Llama without grouped-query attention, which the
TorchScript exporter cannot convert)
with random weights, adapters with random A and B (peft's init_lora_weights=False: its
default B = 0 would make every adapter a no-op); and always the repository's own small
versions of the same layers (tests/fixtures/adapters.py, detectors.py), which the tests use.

Per model and export route: dense nodes (MatMul + Gemm, or Conv for detectors) of the
original, of convexport (default strategy, validated against the original) and of the hand
form exported the same way; Gelu / FastGelu / LayerNorm kernels in ONNX Runtime's optimized
graph of convexport's and the hand form's; low-rank branches left; and the latency of
convexport's graph over the hand form's (ONNX Runtime CPU, the two timed in turns in one run).
"""

from __future__ import annotations

import copy
import datetime
import io
import platform
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import onnx
import onnxruntime as ort
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fixtures"))

import adapters as own_adapters  # noqa: E402
import detectors as own_detectors  # noqa: E402
from families import arguments, write_section  # noqa: E402

import convexport  # noqa: E402
from convexport.load.inputs import InputSpec  # noqa: E402
from convexport.profile.profiler import TimingSettings, profile_models  # noqa: E402
from convexport.util.quiet import quiet_libraries  # noqa: E402

HEADING = "## Adapters and detectors against their hand forms"
FUSED_KERNELS = ("Gelu", "FastGelu", "LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization")


class Case:
    """A model, its hand form, example inputs, and the routes it is exported by."""

    def __init__(self, name: str, build: Callable, routes: tuple[str, ...], dense_ops=("MatMul", "Gemm")):
        self.name, self.build, self.routes, self.dense_ops = name, build, routes, dense_ops


# --- the real libraries ------------------------------------------------------------------


def _peft(model, targets: list[str], dora: bool = False, fan_in_fan_out: bool = False):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=8, lora_alpha=16, target_modules=targets, use_dora=dora, init_lora_weights=False,
                        fan_in_fan_out=fan_in_fan_out)
    adapted = get_peft_model(model, config).eval()
    return adapted, copy.deepcopy(adapted).merge_and_unload().eval()


class _Hidden(torch.nn.Module):
    """A transformers model's last hidden state, from token ids (the one output compared)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).last_hidden_state


def gpt2_lora():
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    base = GPT2Model(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32)).eval()
    adapted, hand = _peft(base, ["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True)
    return _Hidden(adapted), _Hidden(hand), (torch.randint(0, 100, (2, 16)),)


def llama_dora():
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=100, max_position_embeddings=32)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    adapted, hand = _peft(LlamaModel(config).eval(), targets, dora=True)
    return _Hidden(adapted), _Hidden(hand), (torch.randint(0, 100, (2, 16)),)


def bert_lora():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        vocab_size=100, max_position_embeddings=32)
    adapted, hand = _peft(BertModel(config, add_pooling_layer=False).eval(), ["query", "key", "value", "dense"])
    return _Hidden(adapted), _Hidden(hand), (torch.randint(0, 100, (2, 16)),)


def ultralytics_model(name: str):
    from ultralytics import YOLO

    model = YOLO(f"{name}.yaml").model.eval()
    for module in model.modules():
        if hasattr(module, "export"):
            module.export = True
    return model, copy.deepcopy(model).fuse().eval(), (torch.rand(1, 3, 320, 320),)


# --- the repository's own versions ---------------------------------------------------------


def own(build: Callable, hand: Callable, shape=(2, 5, 32)):
    def made():
        module = build()
        return module, hand(module), (torch.randn(*shape),)

    return made


CASES = [
    Case("GPT-2 + LoRA (transformers, peft)", gpt2_lora, ("dynamo", "torchscript")),
    Case("Llama + DoRA (transformers, peft)", llama_dora, ("dynamo", "torchscript")),
    Case("BERT + LoRA (transformers, peft)", bert_lora, ("torchscript opset 17",)),
    Case("yolov9t (ultralytics)", lambda: ultralytics_model("yolov9t"), ("torchscript",), ("Conv",)),
    Case("yolov10n (ultralytics)", lambda: ultralytics_model("yolov10n"), ("torchscript",), ("Conv",)),
    Case("own GPT-2 blocks + LoRA", own(own_adapters.gpt2, own_adapters.merge_and_unload),
         ("dynamo", "torchscript")),
    Case("own Llama MLPs + DoRA", own(lambda: own_adapters.llama_mlp(dora=True), own_adapters.merge_and_unload),
         ("dynamo", "torchscript")),
    Case("own BERT layers + LoRA, erf GELU", own(lambda: own_adapters.bert(gelu=own_adapters.gelu_erf),
                                                own_adapters.merge_and_unload), ("dynamo", "torchscript")),
    Case("own YOLO-like detector", own(own_detectors.tiny_yolo, own_detectors.fused, (1, 3, 64, 64)),
         ("dynamo", "torchscript"), ("Conv",)),
]


def export(module, example: tuple, route: str) -> onnx.ModelProto:
    with quiet_libraries(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if route == "dynamo":
            return torch.onnx.export(module, example, dynamo=True, verbose=False).model_proto
        buffer = io.BytesIO()
        opset = {"opset_version": 17} if route.endswith("opset 17") else {}
        torch.onnx.export(module, example, buffer, dynamo=False, input_names=["x"], **opset)
    return onnx.load_from_string(buffer.getvalue())


def kernels(model: onnx.ModelProto) -> Counter:
    """The ops ONNX Runtime runs after its own fusions (CPU provider)."""
    with tempfile.TemporaryDirectory() as folder:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(Path(folder) / "runtime.onnx")
        options.log_severity_level = 3
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return Counter(node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node)


def row(case: Case, route: str) -> str:
    module, hand, example = case.build()
    original, hand_graph = export(module, example, route), export(hand, example, route)
    specs = [InputSpec(value.name, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))
             for value, tensor in zip(original.graph.input, example)]
    result = convexport.optimize(original, inputs=specs, write=False, profile=False)

    def dense(model):
        ops = Counter(node.op_type for node in model.graph.node)
        return sum(ops[op] for op in case.dense_ops)

    fused = {name: kernels(model) for name, model in (("cx", result.model), ("hand", hand_graph))}
    shown = [kind for kind in FUSED_KERNELS if fused["cx"][kind] or fused["hand"][kind]]
    kept = ", ".join(f"{kind} {fused['cx'][kind]}/{fused['hand'][kind]}" for kind in shown) or "-"
    timed = profile_models({"hand": hand_graph, "convexport": result.model}, specs, "cpu",
                           TimingSettings(memory=False, per_op=False))
    ratio = timed["convexport"]["latency_ms"]["median"] / timed["hand"]["latency_ms"]["median"]
    valid = "yes" if result.report["validation"]["passed"] else "NO"
    left = len(result.report["low_rank_branches_left"])
    return (f"| {case.name} | {route} | {dense(original)} | {dense(result.model)} | {dense(hand_graph)} | {valid} "
            f"| {kept} | {left} | {ratio:.2f} |")


def fusion_cost() -> list[str]:
    """What keeping ONNX Runtime's Gelu whole is worth: a mid-size BERT with LoRA (hidden 256,
    intermediate 1024, batch 4 x 128 tokens, TorchScript at opset 17, whose GELU is the erf
    pattern), convexport's default strategy (which keeps it) and --strategy all (which folds
    its trailing * 0.5 into the next Linear), each over the hand form, timed in turns."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4,
                        vocab_size=100, max_position_embeddings=256)
    adapted, hand = _peft(BertModel(config, add_pooling_layer=False).eval(), ["query", "key", "value", "dense"])
    example = (torch.randint(0, 100, (4, 128)),)
    original = export(_Hidden(adapted), example, "torchscript opset 17")
    models = {"hand": export(_Hidden(hand), example, "torchscript opset 17")}
    specs = [InputSpec(original.graph.input[0].name, (4, 128), "int64")]
    for strategy in ("cost", "all"):
        models[strategy] = convexport.optimize(original, inputs=specs, write=False, profile=False,
                                               strategy=strategy).model
    timed = profile_models(models, specs, "cpu", TimingSettings(memory=False, per_op=False))
    median = {name: timed[name]["latency_ms"]["median"] for name in models}
    lines = ["", "Keeping the runtime's Gelu whole, on a mid-size BERT + LoRA (hidden 256, batch 4 x 128, "
             "TorchScript at opset 17), median latency over the hand form's:", "",
             "| strategy | Gelu kernels | time |", "|---|---|---|"]
    for strategy in ("cost", "all"):
        lines.append(f"| {strategy} | {kernels(models[strategy])['Gelu']} | {median[strategy] / median['hand']:.3f} |")
    return lines


def main() -> None:
    args = arguments(__doc__, "models")
    start = time.perf_counter()
    lines = [
        HEADING, "",
        f"`bench/adapter_merges.py`, {datetime.date.today()}, {platform.machine()}, torch {torch.__version__}, "
        f"ONNX Runtime {ort.__version__} (CPU). Dense nodes: MatMul + Gemm (Conv for detectors); kernels: "
        "fused ops in ONNX Runtime's optimized graph, convexport's / the hand form's; time: convexport's "
        "median latency over the hand form's.", "",
        "| model | route | dense before | convexport | hand form | validated | kernels | low-rank left | time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case in CASES:
        if args.only and args.only.lower() not in case.name.lower():
            continue
        for route in case.routes:
            try:
                line = row(case, route)
            except ImportError as missing:
                line = f"| {case.name} | {route} | not installed ({missing.name}) | | | | | | |"
            except Exception as error:  # a library's failure is this row's result
                line = f"| {case.name} | {route} | error: {type(error).__name__}: {str(error)[:80]} | | | | | | |"
            print(line, flush=True)
            lines.append(line)
    if not args.only:
        try:
            lines += fusion_cost()
        except ImportError as missing:
            lines += ["", f"(the Gelu measurement needs {missing.name})"]
        print("\n".join(lines[-4:]), flush=True)
    lines += ["", f"({time.perf_counter() - start:.0f} s)", ""]
    if args.write:
        write_section(args.write, "\n".join(lines), HEADING)


if __name__ == "__main__":
    main()
