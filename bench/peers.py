"""convexport against onnxsim, onnxslim, onnxoptimizer and ONNX Runtime's offline optimizer.

    make bench                      (installs the peers, writes bench/RESULTS.md)
    .venv/bin/python bench/peers.py [--device cpu|cuda] [--write FILE] [--only NAME]

For every sample model and a RepVGG-style network: nodes, Conv count, latency (each variant
measured beside the original in a fresh process, the two taking turns in blocks of runs) as a
ratio to the original (> 1 is faster), peak memory, the optimizer's wall time, and the largest validation error against the
original (relative to the output's RMS). Then each optimizer's wall time on synthetic graphs
of 2,005 and 4,678 nodes and on ResNet-18 (`--only wall` for those alone).
"""

from __future__ import annotations

import argparse
import datetime
import io
import multiprocessing
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))

import convexport  # noqa: E402
from convexport.load.inputs import InputSets  # noqa: E402
from convexport.load.onnx_route import graph_input_specs  # noqa: E402
from convexport.profile.profiler import TimingSettings, profile_models  # noqa: E402
from convexport.validate.compare import compare_models  # noqa: E402

MODELS = [
    ("seed000 subtracted conv", ROOT / "sample_models/seed000_subtracted_conv.py"),
    ("seed001 3-D bottleneck", ROOT / "sample_models/seed001_bottleneck3d.py"),
    ("seed002 group attention", ROOT / "sample_models/seed002_group_attention.py"),
    ("seed003 135x135 filters", ROOT / "sample_models/seed003_large_kernel.py"),
    ("seed004 full padding", ROOT / "sample_models/seed004_full_padding.py"),
    ("RepVGG-style (training form)", ROOT / "tests/fixtures/repvgg.py:build"),
]
# Hand-written deploy forms to compare with: the RepVGG network re-parameterised by its own code.
HAND_MADE = {"RepVGG-style (training form)": ROOT / "tests/fixtures/repvgg.py:build_deploy"}


def run_convexport(model):
    return convexport.optimize(model, write=False, validate=False, profile=False).model


def run_onnxsim(model):
    import onnxsim

    simplified, ok = onnxsim.simplify(model)
    if not ok:
        raise RuntimeError("onnxsim could not check its result")
    return simplified


def run_onnxslim(model):
    import onnxslim

    return onnxslim.slim(model)


def run_onnxoptimizer(model):
    import onnxoptimizer

    return onnxoptimizer.optimize(model)


def run_ort_offline(model):
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as folder:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = os.path.join(folder, "opt.onnx")
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return onnx.load(options.optimized_model_filepath)


TOOLS = {"convexport": run_convexport, "onnxsim": run_onnxsim, "onnxslim": run_onnxslim,
         "onnxoptimizer": run_onnxoptimizer, "ort-offline": run_ort_offline}


def optimize_all(original, calls: int = 1):
    """Each tool's graph and its wall time: the median of `calls` calls in this process."""
    variants, walls = {"original": original}, {"original": 0.0}
    for name, tool in TOOLS.items():
        times = []
        for _ in range(calls):
            copy = onnx.ModelProto()
            copy.CopyFrom(original)
            start = time.perf_counter()
            try:
                variants[name] = tool(copy)
            except Exception as exc:          # a peer that fails on a model is reported, not fatal
                print(f"  {name} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}", file=sys.stderr)
                break
            times.append(time.perf_counter() - start)
        if len(times) == calls:
            walls[name] = float(np.median(times))
    return variants, walls


def relative_error(original, candidate, inputs) -> float:
    result = compare_models(original, candidate, InputSets(inputs, 2))
    return max((error.max_rel for error in result.outputs.values()), default=float("nan"))


def conv_count(model) -> int:
    return sum(node.op_type == "Conv" for node in model.graph.node)


def bench_model(label, source, device, lines):
    original = convexport.optimize(str(source), write=False, validate=False, profile=False).original
    inputs = graph_input_specs(original)
    variants, walls = optimize_all(original)
    if label in HAND_MADE:
        variants["hand re-param"] = convexport.optimize(str(HAND_MADE[label]), write=False, validate=False,
                                                        profile=False, builtin_rules=False).original
        walls["hand re-param"] = 0.0
    pairs = {name: timed_pair(original, model, inputs, device) for name, model in variants.items() if name != "original"}
    base = {key: float(np.median([pair["original"][key] for pair in pairs.values()])) for key in ("ms", "peak")}
    lines.append(f"\n### {label}\n")
    lines.append("| tool | nodes | Conv | latency ms (original's beside it) | speedup vs original | peak MiB | "
                 "optimizer s | max rel error |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, model in variants.items():
        pair = pairs.get(name, {"original": base, "variant": base})
        error = 0.0 if name == "original" else relative_error(original, model, inputs)
        beside = "" if name == "original" else f" ({pair['original']['ms']:.3f})"
        lines.append(f"| {name} | {len(model.graph.node)} | {conv_count(model)} | {pair['variant']['ms']:.3f}{beside} | "
                     f"{pair['original']['ms'] / pair['variant']['ms']:.2f}x | {pair['variant']['peak'] / 2**20:.1f} | "
                     f"{walls[name]:.2f} | {error:.1e} |")
    shown = len(variants) + 3
    if "hand re-param" in variants and "convexport" in variants:
        # the two graphs timed side by side, not through two different processes' originals
        pair = timed_pair(variants["hand re-param"], variants["convexport"], inputs, device)
        hand, ours = pair["original"]["ms"], pair["variant"]["ms"]
        lines.append(f"\nconvexport against the hand re-parameterised model, timed side by side: {hand / ours:.2f}x "
                     f"(hand {hand:.3f} ms, convexport {ours:.3f} ms; > 1 is convexport faster)")
        shown += 2
    print("\n".join(lines[-shown:]), flush=True)


def timed_pair(original, variant, inputs, device) -> dict:
    """Median latency ("ms") of the original and of one variant, taking turns in one fresh
    process, and the peak memory ("peak", bytes) of each (convexport/profile/profiler.py).

    One pair per process: with all six sessions in one process on 2 cores, ONNX Runtime's
    per-session thread pools leave a session its second core in some runs and not in others
    (seed 002's convexport graph: 0.84 ms beside the original alone, anywhere from 0.84 to 1.46 ms
    among six sessions, and 1.50 ms on one thread), while the same pair is steady."""
    with tempfile.TemporaryDirectory() as folder:
        paths = {}
        for name, model in (("original", original), ("variant", variant)):
            paths[name] = os.path.join(folder, f"{name}.onnx")
            onnx.save(model, paths[name])
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        child = context.Process(target=_time_in_child, args=(paths, inputs, device, queue))
        child.start()
        result = queue.get()
        child.join()
    return result


def _time_in_child(paths, inputs, device, queue) -> None:
    models = {name: onnx.load(path) for name, path in paths.items()}
    measured = profile_models(models, inputs, device, TimingSettings(memory=True, per_op=False))
    queue.put({name: {"ms": measured[name]["latency_ms"]["median"], "peak": measured[name]["peak_memory_bytes"]}
               for name in models})


# 2,005 and 4,678 nodes as exported (torch reads each BatchNorm parameter through an Identity)
SYNTHETIC_BLOCKS = (223, 520)


def synthetic_graph(blocks: int) -> onnx.ModelProto:
    """Conv-BN-Relu-Conv(1x1)-Add blocks: a deep graph with folds everywhere (> 2,000 nodes)."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(8, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)
            self.point = nn.Conv2d(8, 8, 1)

        def forward(self, x):
            return x + self.point(torch.relu(self.bn(self.conv(x))))

    torch.manual_seed(0)
    model = nn.Sequential(*(Block() for _ in range(blocks))).eval()
    buffer = io.BytesIO()
    torch.onnx.export(model, (torch.randn(1, 8, 8, 8),), buffer, dynamo=False, opset_version=18,
                      training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False)
    return onnx.shape_inference.infer_shapes(onnx.load_from_string(buffer.getvalue()))


WALL_CALLS = 5


def bench_wall_time(lines):
    """Each optimizer's wall time on deep synthetic graphs (per-node cost) and on ResNet-18 as
    exported (45 MB of weights: per-weight cost), the median of WALL_CALLS calls: a tool's first
    call in a process also pays its one-time imports (onnxsim's first: 0.62 s on ResNet-18,
    then 0.14 s)."""
    resnet = convexport.optimize(str(ROOT / "tests/fixtures/resnet.py:build"), write=False, validate=False,
                                 profile=False).original
    graphs = [("a synthetic graph of {} nodes", synthetic_graph(blocks)) for blocks in SYNTHETIC_BLOCKS]
    for label, model in (*graphs, ("ResNet-18 ({} nodes)", resnet)):
        lines.append(f"\n### Optimizer wall time on {label.format(len(model.graph.node))} (median of {WALL_CALLS} calls)\n")
        lines.append("| tool | nodes after | wall s |")
        lines.append("|---|---:|---:|")
        variants, walls = optimize_all(model, WALL_CALLS)
        for name, seconds in walls.items():
            if name != "original":
                lines.append(f"| {name} | {len(variants[name].graph.node)} | {seconds:.3f} |")
        print("\n".join(lines[-len(walls) - 2:]), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--write", type=Path, help="Also write the tables to this Markdown file.")
    parser.add_argument("--only", help="Only the models whose label contains this.")
    args = parser.parse_args()
    lines = ["# convexport benchmark\n",
             f"{datetime.date.today()}, {platform.machine()} with {os.cpu_count()} cores, ONNX Runtime "
             f"{__import__('onnxruntime').__version__} on {args.device}; latency is the median of block-"
             "interleaved runs (convexport/profile/profiler.py), each tool's graph beside the original in a fresh process "
             "(the original's row: the median over those pairs; a fresh process on this 2-core machine has run both graphs up to a third slower than the next process did, so compare a variant with the original timed beside it, in brackets, which is what the speedup does); peak memory is the growth of the resident set of a fresh process running the model; errors are max |cand - ref| / max(|ref|, rms(ref))."]
    for label, source in MODELS:
        if args.only is None or args.only in label:
            bench_model(label, source, args.device, lines)
    if args.only is None or args.only == "wall":
        bench_wall_time(lines)
    if args.write:
        args.write.write_text("\n".join(lines) + "\n" + kept_section(args.write))


KEPT_HEADING = "## Measurements behind the code"


def kept_section(path: Path) -> str:
    """The hand-kept section of the results file (the measurements the code's comments point
    to), from its heading to the end: rewriting the tables keeps it."""
    text = path.read_text() if path.exists() else ""
    start = text.find(KEPT_HEADING)
    return "" if start < 0 else "\n" + text[start:]


if __name__ == "__main__":
    main()
