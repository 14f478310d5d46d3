"""Half precision for deployment (issue 52): convexport --dtype fp16 against the converters users
reach for, each judged against the exact (float64) result of the model as exported.

    PYTHONPATH=FP16_PACKAGES[:HF_PACKAGES] .venv/bin/python bench/half_precision.py [--only NAME] [--write FILE]
    PYTHONPATH=FP16_PACKAGES .venv/bin/python bench/half_precision.py --seeds 10 [--only FAMILY]
    PYTHONPATH=FP16_PACKAGES[:HF_PACKAGES] .venv/bin/python bench/half_precision.py --bf16 [--only NAME]
    PYTHONPATH=FP16_PACKAGES:SITE .venv/bin/python bench/half_precision.py --trained SITE [--text] [--only NAME]
    any of them with --device cuda (ONNX Runtime's CUDA provider: convexport measures there, every
    file is run and timed there, inputs and outputs bound on the GPU)

Needs onnxconverter-common 1.16 and onnxslim 0.1 (`pip install --no-deps --target FOLDER`, not
in convexport's environment); the BERT and GPT-2 rows also transformers 4.57 (bench/
transformer_pipeline.py's folder), left out without it.

Models: the five sample models; RepVGG, MobileOne and FastViT networks (bench/family_blocks.py);
a YOLO-like detector at 320x320 on [0, 1] images (tests/fixtures/detectors.py); BERT with an
unmerged LoRA in its query and value, and GPT-2 with one in its MLP (small random configs, every
weight perturbed, exported by optimum for feature-extraction; batch 2 x sequence 16). With
--trained SITE, instead: trained models that PyPI packages ship as ONNX files (`pip install
--no-deps --target SITE rapidocr-onnxruntime==1.4.4 nudenet==3.4.2 pillow`): PaddleOCR's PP-OCRv4
text detection and recognition and its mobile direction classifier (inputs normalised: N(0, 1);
with --text, lines of printed text rendered by Pillow, normalised as PaddleOCR does), and
nudenet's YOLOv8n detector at 320x320 (images in [0, 1]), their dynamic input dims fixed. With
--text, convexport also chooses on one text image of its own (`--input-data`), not the three
it is measured on.

Per model and tool: whether it gives a model ONNX Runtime runs; its worst error against the
float64 result over three input sets, as a multiple of the output's rms (the worst output); the
nodes and Casts; ONNX Runtime latency on the device (median of 21 interleaved rounds). The tools:
- convexport --dtype fp16 (float32 interface, precision chosen by measured error);
- onnxconverter-common's convert_float_to_float16 (keep_io_types) of the export, and of
  convexport's float32 output (the fold, then another tool's rounding);
- onnxconverter-common's auto_convert_mixed_precision (keep_io_types), given the first input
  set and rtol 1e-2, atol 1e-3 against the float32 run (it needs data and a tolerance);
- onnxslim --dtype fp16 (its slim(model, dtype="fp16"));
- for BERT and GPT-2, ONNX Runtime's transformer optimizer then its float16 conversion
  (keep_io_types), the route its docs give.
For BERT and GPT-2, also the kernels the transformer optimizer fuses in the float32 export and
in convexport's float16 output (for the GPU, use_gpu=True: float16 is what it runs there).
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests" / "fixtures")]

import convexport  # noqa: E402
from convexport.validate.float64 import Float64Evaluator  # noqa: E402
from convexport.validate.float64.precision import rms  # noqa: E402
from convexport.load.input_domains import sized_by_running  # noqa: E402
from convexport.load.inputs import random_inputs  # noqa: E402
from convexport.load.onnx_route import graph_input_specs  # noqa: E402

RUNS = 3
SAMPLES = ["seed000_subtracted_conv", "seed001_bottleneck3d", "seed002_group_attention", "seed003_large_kernel",
           "seed004_full_padding"]  # fmt: skip


def _family(name):
    """The family's builder: its own seed, or the one given (--seeds)."""

    def build(*seed: int):
        import family_blocks

        return getattr(family_blocks, name)(*seed)

    return build


def _detector(*seed: int):
    import detectors

    return detectors.tiny_yolo(*seed), (torch.rand(1, 3, 320, 320),)


class LoRA(torch.nn.Module):
    """peft's LoRA, unmerged, around an nn.Linear or GPT-2's Conv1D: base(x) + B(A(x)) * 2."""

    def __init__(self, base, rank=4):
        super().__init__()
        linear = isinstance(base, torch.nn.Linear)
        features_in, features_out = base.weight.shape[::-1] if linear else base.weight.shape
        self.base = base
        self.lora_A = torch.nn.Linear(features_in, rank, bias=False)
        self.lora_B = torch.nn.Linear(rank, features_out, bias=False)
        torch.nn.init.normal_(self.lora_B.weight, std=0.02)

    def forward(self, x):
        return self.base(x) + self.lora_B(self.lora_A(x)) * 2.0


def _bert_lora():
    from transformer_pipeline import _bert

    model, _, _ = _bert()
    for layer in model.encoder.layer:
        layer.attention.self.query = LoRA(layer.attention.self.query)
        layer.attention.self.value = LoRA(layer.attention.self.value)
    return model


def _gpt2_lora():
    from transformers import GPT2Config, GPT2Model

    model = GPT2Model(GPT2Config(vocab_size=100, n_positions=64, n_layer=2, n_embd=64, n_head=4))
    for block in model.h:
        block.mlp.c_fc = LoRA(block.mlp.c_fc)
    return model


MODELS = {
    **{name: ROOT / "sample_models" / f"{name}.py" for name in SAMPLES},
    "repvgg": _family("repvgg"),
    "mobileone": _family("mobileone"),
    "fastvit": _family("fastvit"),
    "yolo-like detector": _detector,
    "bert + LoRA": _bert_lora,
    "gpt2 + LoRA": _gpt2_lora,
}
TRANSFORMER_TYPES = {"bert + LoRA": "bert", "gpt2 + LoRA": "gpt2"}
OCR = "rapidocr_onnxruntime/models"
TRAINED = {  # --trained SITE: name -> (the file in SITE, the input's shape)
    "PP-OCRv4 text detection": (f"{OCR}/ch_PP-OCRv4_det_infer.onnx", [1, 3, 320, 320]),
    "PP-OCRv4 text recognition": (f"{OCR}/ch_PP-OCRv4_rec_infer.onnx", [1, 3, 48, 320]),
    "PP-OCR mobile direction classifier": (f"{OCR}/ch_ppocr_mobile_v2.0_cls_infer.onnx", [1, 3, 48, 192]),
    "YOLOv8n detector (nudenet)": ("nudenet/320n.onnx", [1, 3, 320, 320]),  # "detector": images in [0, 1]
}


def exported(name: str, folder: Path) -> Path:
    """The model as ONNX, float32: convexport's export of a sample model, torch.onnx's of the others."""
    path = folder / f"{name.replace(' ', '_').replace('+', 'and')}.onnx"
    if name in TRAINED:
        return _with_fixed_input(*TRAINED[name], path)
    made = MODELS[name]
    if isinstance(made, Path):
        convexport.export_only(str(made), path)
        return path
    if name in TRANSFORMER_TYPES:  # as users export them: optimum, feature-extraction
        from optimum.exporters.onnx import onnx_export_from_model
        from transformer_pipeline import _perturbed

        out = folder / path.stem
        torch.manual_seed(0)  # the random config's own initialisation, before _perturbed's
        _quietly(lambda: onnx_export_from_model(_perturbed(made()), output=out, task="feature-extraction",
                                                do_validation=False))  # fmt: skip
        return out / "model.onnx"
    _torch_export(*made(), path)
    return path


TRAINED_SITE: list[Path] = []  # --trained SITE


def _with_fixed_input(file: str, shape: list[int], path: Path) -> Path:
    """The trained model's file (in --trained SITE) with its one input's dims fixed to `shape`."""
    model = onnx.load(str(TRAINED_SITE[0] / file))
    for dim, size in zip(model.graph.input[0].type.tensor_type.shape.dim, shape):
        dim.dim_value = size
    onnx.save(model, str(path))
    return path


def _torch_export(module: torch.nn.Module, inputs: tuple, path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), inputs, str(path), input_names=["x"], dynamo=False, opset_version=17)


# the seeds of the input sets every tool is measured on: not convexport's own (validation and
# the half stage draw theirs from seeds 0, 1, 2 with the same generator), so that what it chose
# on those is judged on inputs it has not seen
HELD_OUT = 1000


def input_sets(path: Path) -> list[dict]:
    """Three input sets, drawn from seeds HELD_OUT + 0, 1, 2: a transformer's as convexport
    makes them up (token ids inside the table, padding masks), batch 2 x sequence 16; an
    image's N(0, 1) (the detector's uniform in [0, 1]); with --text, an OCR model's rendered
    text."""
    model = onnx.load(str(path))
    if any(value.type.tensor_type.elem_type == onnx.TensorProto.INT64 for value in model.graph.input):
        specs = sized_by_running(model, graph_input_specs(model))
        return [
            {k: v[:2] for k, v in random_inputs(specs, HELD_OUT + seed, dynamic_size=16).items()}
            for seed in range(RUNS)
        ]
    if _reads_text(path):
        value = model.graph.input[0]
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        return [{value.name: text_image(shape, HELD_OUT + seed)} for seed in range(RUNS)]
    sets = []
    for seed in range(RUNS):
        rng = np.random.default_rng(HELD_OUT + seed)
        feeds = {}
        for value in model.graph.input:
            dims = [d.dim_value or 1 for d in value.type.tensor_type.shape.dim]
            if _takes_images(path):
                feeds[value.name] = rng.random(dims, dtype=np.float32)
            else:
                feeds[value.name] = rng.standard_normal(dims).astype(np.float32)
        sets.append(feeds)
    return sets


TEXT_SETS: list[bool] = []  # --text: the OCR models' input sets are rendered text


def _reads_text(path: Path) -> bool:
    """A PaddleOCR model's file (named so by `exported`), measured on rendered text (--text)."""
    return bool(TEXT_SETS) and "PP-OCR" in path.stem


def text_image(shape: list[int], seed: int) -> np.ndarray:
    """Lines of printed text (random words and numbers, 18-30 px, black to mid grey) on a white
    to light grey page at random places, shaped `shape` (N, 3, H, W), normalised as PaddleOCR
    normalises its inputs: (pixel / 255 - 0.5) / 0.5."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    _, _, height, width = shape
    page = Image.new("RGB", (width, height), tuple(int(v) for v in rng.integers(200, 256, 3)))
    draw = ImageDraw.Draw(page)
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    top = int(rng.integers(0, max(height // 8, 1)))
    while height - top > 19:  # room for a line of the smallest size
        size = int(rng.integers(18, min(31, height - top)))
        words = ["".join(rng.choice(list(letters), int(rng.integers(2, 9)))) for _ in range(int(rng.integers(1, 5)))]
        ink = tuple(int(v) for v in rng.integers(0, 110, 3))
        draw.text((int(rng.integers(0, width // 6)), top), " ".join(words), font=ImageFont.load_default(size=size),
                  fill=ink)  # fmt: skip
        top += size + int(rng.integers(size // 2, 2 * size))
    pixels = np.asarray(page, dtype=np.float32).transpose(2, 0, 1)[None]
    return ((pixels / 255.0 - 0.5) / 0.5).astype(np.float32)


def _takes_images(path: Path) -> bool:
    """The detector's file (named so by `exported` and `_seeded_errors`): its inputs are images
    in [0, 1], as its BatchNorms were calibrated on."""
    return "detector" in path.stem


def described(path: Path) -> list[str] | None:
    """The detector's input as its user describes it to convexport (docs/commands.md: images in
    [0, 1], `--input x:1x3x320x320:0..1`), so that its made-up input sets are drawn as
    input_sets draws the ones every tool is measured on; None (made up as convexport does) for
    the others."""
    if not _takes_images(path):
        return None
    value = onnx.load(str(path), load_external_data=False).graph.input[0]
    dims = "x".join(str(d.dim_value) for d in value.type.tensor_type.shape.dim)
    return [f"{value.name}:{dims}:0..1"]


def providers(device: str) -> list:
    """ONNX Runtime's providers for `device` (the CUDA provider with its default options: TF32
    where the build allows it, stated by provider_options)."""
    return [("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"] if device == "cuda" else [
        "CPUExecutionProvider"]  # fmt: skip


def provider_options(device: str) -> str:
    """The options the provider of `device` runs with, as ONNX Runtime reports them."""
    if device != "cuda":
        return "CPUExecutionProvider"
    x, y = (onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [1]) for name in "xy")
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "probe", [x], [y])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=9)
    session = ort.InferenceSession(model.SerializeToString(), providers=providers(device))
    if "CUDAExecutionProvider" not in session.get_providers():
        sys.exit("--device cuda: ONNX Runtime's CUDA provider does not load here")
    options = session.get_provider_options()["CUDAExecutionProvider"]
    return f"CUDAExecutionProvider (use_tf32={options.get('use_tf32', '?')})"


def error_vs_exact(
    path: Path, sets: list[dict], exact: list[list[np.ndarray]], device: str = "cpu"
) -> tuple[float, float]:
    """The worst max|y - exact| / rms(exact), and the worst rms(y - exact) / rms(exact), over
    outputs and input sets, run on `device`."""
    session = ort.InferenceSession(str(path), providers=providers(device))
    kinds = {i.name: i.type for i in session.get_inputs()}
    runs = []
    for feeds in sets:
        fed = {k: v.astype(np.float16) if kinds[k] == "tensor(float16)" else v for k, v in feeds.items()}
        runs.append(session.run(None, fed))
    return relative_errors(runs, exact)


def relative_errors(runs: list[list], exact: list[list[np.ndarray]]) -> tuple[float, float]:
    """The worst max|y - exact| / rms(exact), and the worst rms(y - exact) / rms(exact), over
    the outputs of each run (in the order of `exact`'s) and the runs."""
    worst, typical = 0.0, 0.0
    for outputs, expected in zip(runs, exact):
        for got, want in zip(outputs, expected):
            got = np.asarray(got).astype(np.float64)
            if got.size == 0:  # a merged decoder's present of the branch not taken
                continue
            if not np.all(np.isfinite(got)):
                return float("inf"), float("inf")
            scale = max(rms(want), 1e-300)
            worst = max(worst, float(np.abs(got - want).max()) / scale)
            typical = max(typical, rms(got - want) / scale)
    return worst, typical


def latency_ms(
    paths: list[Path], feeds: dict, device: str = "cpu", rounds: int = 21, round_s: float = 0.1
) -> list[float]:
    """Each model's median latency on `device`, interleaved in rounds: inputs and outputs bound
    on the device (io binding), so that a GPU's time is its kernels', not the copies'."""
    sessions = [ort.InferenceSession(str(p), providers=providers(device)) for p in paths]
    bindings = []
    for session in sessions:
        kinds = {i.name: i.type for i in session.get_inputs()}
        binding = session.io_binding()
        for name, value in feeds.items():
            value = value.astype(np.float16) if kinds[name] == "tensor(float16)" else value
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, device, 0))
        for output in session.get_outputs():
            binding.bind_output(output.name, device)
        bindings.append(binding)
    for session, binding in zip(sessions, bindings):
        session.run_with_iobinding(binding)
    times = [[] for _ in sessions]
    for _ in range(rounds):
        for index, (session, binding) in enumerate(zip(sessions, bindings)):
            count, start = 0, time.perf_counter()
            while time.perf_counter() - start < round_s:
                session.run_with_iobinding(binding)
                count += 1
            times[index].append((time.perf_counter() - start) / count * 1e3)
    return [statistics.median(t) for t in times]


def _quietly(call):
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return call()


def tools(name: str, original: Path, folder: Path, sets: list[dict], device: str = "cpu") -> dict:
    """Each tool's half-precision model of `original`: name -> path, or the reason it failed."""
    from onnxconverter_common import auto_mixed_precision, float16

    made = {}
    fp32 = folder / f"{original.stem}.cx32.onnx"
    cx16 = folder / f"{original.stem}.cx16.onnx"

    def attempt(label, build, out):
        try:
            model = _quietly(build)
            if model is not None:
                onnx.save(model, str(out))
            made[label] = out
        except Exception as exc:  # the tool's own failure is the result
            made[label] = f"fails: {type(exc).__name__}: {str(exc).splitlines()[0][:70]}"

    attempt("convexport --dtype fp16", lambda: convexport.optimize(str(original), output=str(cx16), dtype="fp16",
                                                                   profile=False, inputs=described(original),
                                                                   device=device) and None, cx16)  # fmt: skip
    if _reads_text(original):  # chosen and validated on one text image of its own, not the three measured on
        value = onnx.load(str(original), load_external_data=False).graph.input[0]
        page = folder / f"{original.stem}.page.npz"
        np.savez(page, **{value.name: text_image([d.dim_value for d in value.type.tensor_type.shape.dim], RUNS)})
        out = folder / f"{original.stem}.cx16_page.onnx"
        attempt("convexport --dtype fp16 --input-data (one text image)",
                lambda: convexport.optimize(str(original), output=str(out), dtype="fp16", profile=False,
                                            input_data=str(page), made_up_inputs=False, device=device) and None,
                out)  # fmt: skip
    convexport.optimize(str(original), output=str(fp32), profile=False, device=device)
    model = onnx.load(str(original))
    attempt("onnxconverter-common fp16", lambda: float16.convert_float_to_float16(model, keep_io_types=True),
            folder / f"{original.stem}.occ.onnx")  # fmt: skip
    attempt("convexport fp32 -> onnxconverter-common fp16",
            lambda: float16.convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True),
            folder / f"{original.stem}.cx_occ.onnx")  # fmt: skip

    def amp():
        return auto_mixed_precision.auto_convert_mixed_precision(
            onnx.load(str(original)), sets[0], rtol=1e-2, atol=1e-3, keep_io_types=True
        )

    attempt("onnxconverter-common auto_mixed_precision", amp, folder / f"{original.stem}.amp.onnx")

    def slim():
        import onnxslim

        return onnxslim.slim(onnx.load(str(original)), dtype="fp16")

    attempt("onnxslim --dtype fp16", slim, folder / f"{original.stem}.slim.onnx")
    if name in TRANSFORMER_TYPES:

        def optimizer():
            from onnxruntime.transformers.optimizer import optimize_model

            optimized = optimize_model(str(original), model_type=TRANSFORMER_TYPES[name], use_gpu=False)
            optimized.convert_float_to_float16(keep_io_types=True)
            return optimized.model

        attempt("ORT transformer optimizer fp16", optimizer, folder / f"{original.stem}.ortopt.onnx")
    return made


def fused(path: Path, name: str, gpu: bool) -> str:
    """The kernels ONNX Runtime's transformer optimizer makes of a model (opt_level 0)."""
    from onnxruntime.transformers.optimizer import optimize_model
    from transformer_pipeline import FUSED

    model = _quietly(lambda: optimize_model(str(path), model_type=TRANSFORMER_TYPES[name], use_gpu=gpu, opt_level=0))
    counts = Counter(node.op_type for node in model.model.graph.node if node.op_type in FUSED)
    return ", ".join(f"{count} {op}" for op, count in sorted(counts.items())) or "nothing"


SEEDED_FAMILIES = ("repvgg", "mobileone", "fastvit", "yolo-like detector")  # MODELS' builders that take a seed


def seed_spread(families: list[str], seeds: int, device: str = "cpu") -> list[str]:
    """The folded families and the detector over `seeds` initialisations each: convexport
    --dtype fp16's error against float64 over onnxconverter-common's float16 conversion of the
    unfolded export (the nearest peer that runs on all four), the largest and the rms error.
    One network's ratio is a draw: its 10 logits on 3 input sets are few numbers, and a
    rounding error's effect on them comes out larger or smaller by chance."""
    rows = ["| family | seeds | max error ratio: geometric mean x/ its standard error (min - max), seeds nearer "
            "| rms error ratio: the same |", "|---|---|---|---|"]  # fmt: skip
    for family in families:
        ratios = []
        for seed in range(seeds):
            ours, peer = _seeded_errors(family, seed, device)
            ratios.append([a / b for a, b in zip(ours, peer)])
            print(f"{family} seed {seed}: convexport {ours[0]:.2e} / {ours[1]:.2e}, "
                  f"onnxconverter-common {peer[0]:.2e} / {peer[1]:.2e}", flush=True)  # fmt: skip
        cells = [_spread(column) for column in np.array(ratios).T]
        rows.append(f"| {family} | {seeds} | {cells[0]} | {cells[1]} |")
    return rows


def _spread(ratios: np.ndarray) -> str:
    """Geometric mean x/ its standard error (min - max), and in how many ratios are under 1."""
    logs = np.log(ratios)
    error = np.exp(logs.std(ddof=1) / np.sqrt(len(logs))) if len(logs) > 1 else float("nan")
    nearer = int((ratios < 1).sum())
    return f"{np.exp(logs.mean()):.2f} x/ {error:.2f} ({ratios.min():.2f} - {ratios.max():.2f}), {nearer}"


def _seeded_errors(family: str, seed: int, device: str) -> tuple[tuple[float, float], tuple[float, float]]:
    """(convexport's, onnxconverter-common's) error_vs_exact on `device` on the family built
    from `seed`."""
    from onnxconverter_common import float16

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        original = folder / f"{family.replace(' ', '_')}.onnx"  # the detector's name asks for images in [0, 1]
        ours, peer = folder / "cx16.onnx", folder / "occ.onnx"
        _torch_export(*MODELS[family](seed), original)
        sets = input_sets(original)
        evaluator = Float64Evaluator(onnx.load(str(original)))
        exact = [evaluator.run(feeds) for feeds in sets]
        _quietly(lambda: convexport.optimize(str(original), output=str(ours), dtype="fp16", profile=False,
                                             inputs=described(original), device=device))  # fmt: skip
        onnx.save(float16.convert_float_to_float16(onnx.load(str(original)), keep_io_types=True), str(peer))
        return error_vs_exact(ours, sets, exact, device), error_vs_exact(peer, sets, exact, device)


def each_exported(names: list[str], folder: Path):
    """(name, its export in `folder`, its input sets, their float64 results) for each model; one
    whose packages are missing is left out, saying so."""
    for name in names:
        try:
            original = exported(name, folder)
        except ImportError as exc:
            print(f"{name}: left out ({exc})", flush=True)
            continue
        sets = input_sets(original)
        evaluator = Float64Evaluator(onnx.load(str(original)))
        yield name, original, sets, [evaluator.run(feeds) for feeds in sets]


def bfloat16_rows(names: list[str], device: str = "cpu") -> list[str]:
    """convexport --dtype bf16 on each model, on `device`: the nodes that run in
    bfloat16, the Casts, the error against float64 as in the float16 table, whether it passed
    its validation, and what ONNX Runtime's transformer optimizer fuses in it (use_gpu=True)."""
    rows = ["| model | nodes in bfloat16 | Casts | max error / rms | rms error / rms | passed "
            "| fused after (use_gpu=True) |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        for name, original, sets, exact in each_exported(names, folder):
            out = folder / f"{original.stem}.bf16.onnx"
            result = _quietly(lambda: convexport.optimize(str(original), output=str(out), dtype="bf16", profile=False,
                                                          inputs=described(original), device=device))  # fmt: skip
            precision = result.report["precision"]
            error = error_vs_exact(out, sets, exact, device)
            nodes = len(onnx.load(str(out), load_external_data=False).graph.node) - precision["casts"]
            after = fused(out, name, gpu=True) if name in TRANSFORMER_TYPES else ""
            passed = "yes" if precision["validation"]["passed"] else "no"
            rows.append(f"| {name} | {precision['nodes_half']} of {nodes} | {precision['casts']} | {error[0]:.2e} "
                        f"| {error[1]:.2e} | {passed} | {after} |")  # fmt: skip
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", action="append")
    parser.add_argument("--write")
    parser.add_argument("--seeds", type=int, help="instead: the folded families over this many initialisations each")
    parser.add_argument("--bf16", action="store_true", help="instead: convexport --dtype bf16 on each model")
    parser.add_argument("--trained", type=Path, help="instead: the trained models of TRAINED, from this folder")
    parser.add_argument("--text", action="store_true", help="with --trained: the OCR models on rendered text")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where convexport measures and where every file is run and timed")  # fmt: skip
    args = parser.parse_args()
    print(f"on {provider_options(args.device)}, ONNX Runtime {ort.__version__}", flush=True)
    if args.seeds or args.bf16:
        if args.seeds:
            rows = seed_spread([f for f in SEEDED_FAMILIES if not args.only or f in args.only], args.seeds, args.device)
        else:
            rows = bfloat16_rows(args.only or list(MODELS), args.device)
        print("\n".join(rows))
        if args.write:
            Path(args.write).write_text("\n".join(rows) + "\n")
        return
    fusions = []
    rows = [
        f"| model | tool | runs | max error / rms | rms error / rms | nodes | Casts | {args.device.upper()} ms (fp32 "
        f"original) | {args.device.upper()} ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        if args.trained:
            TRAINED_SITE.append(args.trained)
        if args.text:
            TEXT_SETS.append(True)
        names = args.only or list(TRAINED if args.trained else MODELS)
        for name, original, sets, exact in each_exported(names, folder):
            base = error_vs_exact(original, sets, exact, args.device)
            ops = Counter(node.op_type for node in onnx.load(str(original)).graph.node)
            rows.append(
                f"| {name} | (float32 original) | yes | {base[0]:.2e} | {base[1]:.2e} | {sum(ops.values())} | "
                f"{ops['Cast']} | | |"
            )
            made_by = tools(name, original, folder, sets, args.device)
            if name in TRANSFORMER_TYPES and not isinstance(made_by["convexport --dtype fp16"], str):
                fusions.append(
                    f"- {name}: ONNX Runtime's transformer optimizer fuses {fused(original, name, gpu=False)} in the "
                    f"float32 export, {fused(made_by['convexport --dtype fp16'], name, gpu=True)} in convexport's "
                    "float16 output (use_gpu=True)"
                )
            for label, made in made_by.items():
                if isinstance(made, str):
                    rows.append(f"| {name} | {label} | {made} | | | | | | |")
                    print(rows[-1], flush=True)
                    continue
                try:
                    error = error_vs_exact(made, sets, exact, args.device)
                    ms = latency_ms([original, made], sets[0], args.device)
                except Exception as exc:
                    rows.append(f"| {name} | {label} | no: {str(exc).splitlines()[0][:70]} | | | | | | |")
                    print(rows[-1], flush=True)
                    continue
                ops = Counter(node.op_type for node in onnx.load(str(made)).graph.node)
                rows.append(
                    f"| {name} | {label} | yes | {error[0]:.2e} | {error[1]:.2e} | {sum(ops.values())} | "
                    f"{ops['Cast']} | {ms[0]:.3f} | {ms[1]:.3f} |"
                )
                print(rows[-1], flush=True)
    table = "\n".join(rows + [""] + fusions)
    print(table)
    if args.write:
        Path(args.write).write_text(table + "\n")


if __name__ == "__main__":
    sys.exit(main())
