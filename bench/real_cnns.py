"""Default `convexport optimize F.onnx` on real-size CNNs beside `onnxsim F.onnx`: wall time, and
whether every input set was judged against float64. One run, side by side, on this machine:

    .venv/bin/python bench/real_cnns.py --site SITE [--only NAME ...] [--rounds 3]

SITE: a folder with timm importable against this torch (pip install --no-deps --target SITE
timm torchvision pillow safetensors huggingface_hub pyyaml; torchvision's nms schemas are
defined here first, as the README's bench notes say). Each model is timm's, random weights,
exported by torch.onnx.export (dynamo, opset 18) at 1x3x224x224, as a user would.

Per model: `convexport optimize F.onnx` (validated, profiled: the default) and
`python -m onnxsim F.onnx OUT` as fresh processes, interleaved `--rounds` times (a slow minute of
the machine falls on both), their median wall times and ratio; what convexport's report says of
the float64 reference (on how many input sets); and the reference's own rate: its second run's
FLOPs a second (float64/, the FLOPs it computes) beside numpy's float64 matrix product on the
same machine (2048^3, best of 3). Prints a Markdown table and the median ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

VENV = Path(sys.executable).parent
MODELS = (
    "resnet50", "regnety_032", "convnext_nano", "efficientnet_b0", "mobilenetv3_large_100", "repvgg_a2",
    "dla34", "densenet121",
)  # fmt: skip


def exported(name: str, site: str, folder: Path) -> Path:
    path = folder / f"{name}.onnx"
    if not path.exists():
        script = (
            f"import sys; sys.path.append({site!r}); import torch\n"
            "lib = torch.library.Library('torchvision', 'DEF')\n"
            "lib.define('nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor')\n"
            "lib.define('qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor')\n"
            "import timm\n"
            f"m = timm.create_model({name!r}, pretrained=False).eval()\n"
            f"torch.onnx.export(m, (torch.randn(1, 3, 224, 224),), {str(path)!r}, dynamo=True, opset_version=18,"
            " external_data=False)\n"
        )
        subprocess.run([sys.executable, "-c", script], check=True, capture_output=True)
    return path


def wall(command: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - began


def reference_rate(path: Path) -> tuple[float, float]:
    """The float64 reference's FLOPs a run and its second run's seconds (the first warms up)."""
    from convexport.validate.exact_check import reference_flops
    from convexport.validate.float64 import Float64Evaluator

    model = onnx.load(path)
    evaluator = Float64Evaluator(model)
    feeds = {model.graph.input[0].name: np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)}
    evaluator.run(feeds)
    began = time.perf_counter()
    evaluator.run(feeds)
    return reference_flops(model), time.perf_counter() - began


def bench(name: str, site: str, folder: Path, rounds: int) -> dict:
    source = exported(name, site, folder)
    ours, simmed, report = folder / f"{name}.cx.onnx", folder / f"{name}.sim.onnx", folder / f"{name}.json"
    walls: dict[str, list[float]] = {"convexport": [], "onnxsim": []}
    for _ in range(rounds):
        command = [str(VENV / "convexport"), "optimize", str(source), "-o", str(ours), "--report", str(report), "-q"]
        walls["convexport"].append(wall(command))
        walls["onnxsim"].append(wall([sys.executable, "-m", "onnxsim", str(source), str(simmed)]))
    written = json.loads(report.read_text())
    flops, seconds = reference_rate(source)
    validation = written["validation"]
    return {
        "name": name,
        "nodes": (written["before"]["nodes"], written["after"]["nodes"]),
        "reference": f"{validation['reference']}: {validation.get('reference_note') or 'every input set'}",
        "timings": written["timings_s"],
        "walls": {tool: statistics.median(times) for tool, times in walls.items()},
        "reference_gflops": flops / 1e9,
        "reference_rate": flops / seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", required=True)
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--folder", help="keep the exports here (default: a temporary folder)")
    args = parser.parse_args()
    from convexport.validate.exact_check import gemm_rate

    gemm = gemm_rate(2048)
    print(f"numpy float64 GEMM (2048^3): {gemm / 1e9:.1f} GFLOP/s\n")
    print(
        "| model | nodes | float64 reference | reference GFLOPs a run, GFLOP/s (share of GEMM) | "
        "wall s: convexport (validating, profiling) | onnxsim | convexport / onnxsim |"
    )
    print("|---|---|---|---|---|---|---|")
    ratios = []
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(args.folder or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        for name in args.only or MODELS:
            result = bench(name, args.site, folder, args.rounds)
            walls, timings = result["walls"], result["timings"]
            ratios.append(walls["convexport"] / walls["onnxsim"])
            print(
                f"| {name} | {result['nodes'][0]} -> {result['nodes'][1]} | {result['reference']} | "
                f"{result['reference_gflops']:.2f}, {result['reference_rate'] / 1e9:.1f} "
                f"({result['reference_rate'] / gemm:.0%}) | {walls['convexport']:.1f} "
                f"({timings.get('validating', 0):.1f}, {timings.get('profiling', 0):.1f}) | "
                f"{walls['onnxsim']:.1f} | {ratios[-1]:.2f} |",
                flush=True,
            )
    print(f"\nconvexport / onnxsim, median over {len(ratios)}: {statistics.median(ratios):.2f} "
          f"({min(ratios):.2f}-{max(ratios):.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
