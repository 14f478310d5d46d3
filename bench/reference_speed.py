"""The float64 reference's time against ONNX Runtime's float32 run (issue 48): what validation
pays for the exact result, per model family, with this checkout's kernels and, side by side in
the same run, with an earlier checkout's (--before DIR, a `git worktree` of it).

Per model: ONNX Runtime's float32 run as validation makes it (CPU provider, graph optimisations
off; the median of 5 runs, all before any float64 run: numpy's BLAS threads still spinning after
a float64 run slow ONNX Runtime's next one by up to 2x); then, in a fresh process, the float64
reference: building it (once per validation, like ONNX Runtime's session), its first run (the
first input set: one-time warm-ups of numpy and the kernels), a second run (each further input
set; the ratio to ONNX Runtime's run is this one's) and the node-by-node check of the reference
(validate/float64/node_check.py, once per validation). The graphs are TorchScript exports without constant folding (BatchNormalization
kept, as a user's first export has it) at 1x3x320x320 for detectors, 1x3x64x64 for the families,
2x128 tokens for the BERT-like stack.

    python bench/reference_speed.py [--before DIR] [--ultralytics SITE] [--json OUT.json]

--ultralytics SITE: a folder with ultralytics and a torchvision importable against this torch
(pip install --no-deps --target SITE ultralytics torchvision ...; see README's bench notes), for
yolov9t and yolov10n built from their YAML with BatchNorm calibrated on [0, 1] images.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
sys.path.insert(0, str(ROOT / "sample_models"))


def exported(module: torch.nn.Module, example: tuple) -> onnx.ModelProto:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), example, buffer, dynamo=False, do_constant_folding=False, opset_version=17)
    return onnx.load_from_string(buffer.getvalue())


def sample_models():
    import importlib

    for name in ("seed000_subtracted_conv", "seed001_bottleneck3d", "seed002_group_attention", "seed003_large_kernel",
                 "seed004_full_padding"):  # fmt: skip
        module, example = importlib.import_module(name).build()
        yield name, exported(module, example)


def families():
    import family_blocks

    for name in ("RepVGG", "MobileOne"):
        module, example = family_blocks.FAMILIES[name]()
        yield name, exported(module, example)


def detector():
    import detectors

    yield "YOLO-like (tests/fixtures, 320x320)", exported(detectors.tiny_yolo(), (torch.rand(1, 3, 320, 320),))


def bert_like():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, activation="gelu", batch_first=True)
    stack = torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).eval()
    yield "BERT-like stack (4 x 256, gelu)", exported(stack, (torch.randn(2, 128, 256),))


def ultralytics(site: str):
    sys.path.insert(0, site)
    library = torch.library.Library("torchvision", "DEF")  # the CUDA torchvision's schemas, for a CPU torch
    library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    from ultralytics import YOLO

    for name in ("yolov9t", "yolov10n"):
        model = YOLO(f"{name}.yaml").model.eval()
        for module in model.modules():
            if hasattr(module, "export"):
                module.export = True
        generator = torch.Generator().manual_seed(0)
        for module in model.modules():  # BatchNorm from [0, 1] images, as a trained model's
            if isinstance(module, torch.nn.BatchNorm2d):
                module.reset_running_stats()
                module.momentum = None
        model.train()
        with torch.no_grad():
            for _ in range(4):
                model(torch.rand(2, 3, 320, 320, generator=generator))
        yield f"{name} (ultralytics, 320x320)", exported(model.eval(), (torch.rand(1, 3, 320, 320),))


def feeds_of(model: onnx.ModelProto) -> dict:
    initializers = {init.name for init in model.graph.initializer}
    rng = np.random.default_rng(0)
    feeds = {}
    for value in model.graph.input:
        if value.name not in initializers:
            dims = [d.dim_value or 1 for d in value.type.tensor_type.shape.dim]
            feeds[value.name] = rng.random(dims, dtype=np.float32)
    return feeds


def runtime_ms(model: onnx.ModelProto, feeds: dict) -> float:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    session.run(None, feeds)
    times = []
    for _ in range(5):
        began = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


def reference_ms(path: str) -> dict:
    """The float64 reference on a saved model, in this process (the code importable as
    convexport is the one measured): building it (the graph widened, the evaluator's ops made),
    its first run (what validation pays on its first input set), a second run (each further
    set), and the node check where this checkout has one."""
    from convexport.validate.float64 import Float64Evaluator

    model = onnx.load(path)
    feeds = feeds_of(model)
    began = time.perf_counter()
    evaluator = Float64Evaluator(model)
    result = {"build_ms": (time.perf_counter() - began) * 1e3}
    for key in ("first_ms", "reference_ms"):
        began = time.perf_counter()
        evaluator.run(feeds)
        result[key] = (time.perf_counter() - began) * 1e3
    try:
        from convexport.validate.float64.node_check import check_nodes
    except ImportError:
        return result
    began = time.perf_counter()
    found = check_nodes(model, feeds, evaluator)
    result["node_check_ms"] = (time.perf_counter() - began) * 1e3
    result["disagreement"] = None if found.disagreement is None else found.disagreement.describe()
    return result


def measured_in(checkout: Path | None, path: str) -> dict:
    """reference_ms in a fresh process with `checkout` first on the path (this one's if None)."""
    env = dict(os.environ, PYTHONPATH=str(checkout or ROOT))
    code = f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import reference_speed as r; " \
           f"print(json.dumps(r.reference_ms({path!r})))"  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1][:120]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="an earlier checkout to measure beside this one")
    parser.add_argument("--ultralytics", help="a folder where ultralytics and torchvision import")
    parser.add_argument("--json", type=Path)
    arguments = parser.parse_args()
    sources = [sample_models(), families(), detector(), bert_like()]
    if arguments.ultralytics:
        sources.append(ultralytics(arguments.ultralytics))
    rows = []
    print("| model | nodes | ORT float32 ms | float64 a run, before (x ORT) | float64 a run, now (x ORT) "
          "| now: build, first run ms | node check ms |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as folder:
        for source in sources:
            for name, model in source:
                path = os.path.join(folder, "model.onnx")
                onnx.save(model, path)
                ort_ms = runtime_ms(model, feeds_of(model))
                now = measured_in(None, path)
                before = measured_in(arguments.before, path) if arguments.before else {}
                rows.append({"model": name, "nodes": len(model.graph.node), "ort_ms": ort_ms, "now": now,
                             "before": before})  # fmt: skip
                print(f"| {name} | {len(model.graph.node)} | {ort_ms:.1f} | {_cell(before, ort_ms)} | "
                      f"{_cell(now, ort_ms)} | {now.get('build_ms', 0):.0f}, {now.get('first_ms', 0):.0f} | "
                      f"{now.get('node_check_ms', float('nan')):.0f} |", flush=True)  # fmt: skip
    if arguments.json:
        arguments.json.write_text(json.dumps(rows, indent=1))


def _cell(measured: dict, ort_ms: float) -> str:
    if "reference_ms" not in measured:
        return measured.get("error", "-")
    return f"{measured['reference_ms']:.0f} ({measured['reference_ms'] / ort_ms:.1f}x)"


if __name__ == "__main__":
    main()
