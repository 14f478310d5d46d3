"""Is any model that `convexport optimize` writes by default slower than its input, and how long
does it take beside onnxsim? One run, side by side, on this machine's CPU:

    .venv/bin/python bench/never_slower.py [--threads 1 0] [--only NAME] [--rounds 3]

For each model of the bench set (the five seeds and the family networks of
bench/family_blocks.py, exported to ONNX by torch.onnx.export at their example inputs; the
transformer blocks of bench/transformer_blocks.py, exported as optimum exports them, their
batch and sequence dims dynamic):
- `convexport optimize F.onnx --threads N` (validated against float64, profiled: the default) as
  a fresh process, its wall time, its verdict and the interval it reported, what it dropped for
  speed; `python -m onnxsim F.onnx OUT` and `onnxslim F.onnx OUT` as fresh processes, theirs;
- an independent ratio of each written file against the input (convexport's, onnxsim's,
  onnxslim's), each pair timed in a fresh process of its own by convexport's paired timer with a
  larger budget (4 s), at the same threads: on made-up inputs sized as convexport sizes them
  (every dynamic dim 1, a waveform a Conv reads as short as the model runs on), and for a
  transformer block also at the sizes a deployment runs it at (transformer_blocks.working_sizes),
  and after ONNX Runtime's transformer optimizer (the optimizer run on the input and on each
  written file, the results timed against each other).
N = 0 is ONNX Runtime's default (one per physical core). `--no-profile` runs convexport without
its profile (what it writes is then its cost model's choice). Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
VENV = Path(sys.executable).parent

SEEDS = {
    "seed000": "sample_models/seed000_subtracted_conv.py",
    "seed001": "sample_models/seed001_bottleneck3d.py",
    "seed002": "sample_models/seed002_group_attention.py",
    "seed003": "sample_models/seed003_large_kernel.py",
    "seed004": "sample_models/seed004_full_padding.py",
}
FAMILIES = ("repvgg", "mobileone", "fastvit", "repghost", "repvit", "ghostnet")
TRANSFORMERS = {"text_encoder": "bert", "audio_encoder": "bert", "decoder_with_past": "gpt2"}  # optimizer's model type


def exported(name: str, folder: Path) -> Path:
    """The model as an ONNX file, exported as a user would: convexport export (torch.export), or
    for a transformer block as optimum does (transformer_blocks.py)."""
    if name in TRANSFORMERS:
        import transformer_blocks

        return transformer_blocks.export(name, folder)
    path = folder / f"{name}.onnx"
    source = str(ROOT / SEEDS[name]) if name in SEEDS else f"{ROOT / 'bench/family_blocks.py'}:{name}"
    subprocess.run([str(VENV / "convexport"), "export", source, "-o", str(path)], check=True, capture_output=True)
    return path


def wall(command: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - began


def _paired_in_child(original: str, candidate: str, threads: int, sizes: dict | None, queue) -> None:
    from convexport.load.input_domains import sized_by_running
    from convexport.load.onnx_route import graph_input_specs
    from convexport.profile.profiler import TimingSettings, profile_models

    try:
        model = onnx.load(original)
        specs = graph_input_specs(model)
        feeds = None if sizes is None else feeds_at(specs, sizes)
        measured = profile_models(
            {"before": model, "after": onnx.load(candidate)}, sized_by_running(model, specs), "cpu",
            TimingSettings(memory=False, per_op=False, threads=threads or None, budget_s=4.0), feeds=feeds,
        )  # fmt: skip
        queue.put(measured["paired"])
    except Exception as exc:  # said in the parent, not a wait for a result that never comes
        queue.put(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")


def feeds_at(specs, sizes: dict) -> dict:
    """Made-up inputs with each dynamic dim at its size in `sizes` (by dim name): masks of ones,
    positions counting up to the sequence's end, other integers within their range."""
    import dataclasses

    import numpy as np

    from convexport.load.inputs import random_inputs

    concrete = [dataclasses.replace(spec, dims=tuple(sizes.get(d, d) for d in spec.dims)) for spec in specs]
    feeds = random_inputs(concrete, seed=0)
    for name, array in feeds.items():
        if "mask" in name:
            array[...] = 1
        elif "position" in name:
            array[...] = np.arange(array.shape[-1]) + sizes.get("past_sequence_length", 0)
    return feeds


def independent_ratio(original: Path, candidate: Path, threads: int, sizes: dict | None = None) -> dict:
    """The candidate's paired speedup over the original, timed in a fresh process, on made-up
    inputs sized as convexport sizes them (every dynamic dim 1, an image or a waveform a Conv
    reads as small as the model runs on), or of the dims `sizes` gives."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_paired_in_child, args=(str(original), str(candidate), threads, sizes, queue))
    child.start()
    result = queue.get(timeout=600)
    child.join()
    if isinstance(result, str):
        raise RuntimeError(f"timing {candidate} against {original}: {result}")
    return result


def transformer_optimized(path: Path, model_type: str) -> Path:
    """ONNX Runtime's transformer optimizer run on `path` (CPU, as the pipeline runs it), beside it."""
    from onnxruntime.transformers.optimizer import optimize_model

    out = path.with_suffix(f".{model_type}.onnx")
    optimize_model(str(path), model_type=model_type, use_gpu=False).save_model_to_file(str(out))
    return out


def at_working_sizes(name: str, source: Path, written: dict[str, Path], threads: int) -> list[dict]:
    """Each written file against the input at each working size, as written and after ONNX
    Runtime's transformer optimizer (the optimizer's output of the input as the baseline)."""
    import transformer_blocks

    model_type = TRANSFORMERS[name]
    optimized = {tool: transformer_optimized(path, model_type) for tool, path in written.items()}
    baseline = transformer_optimized(source, model_type)
    rows = []
    for sizes in transformer_blocks.working_sizes(name):
        rows.append({
            "sizes": sizes,
            "as written": {tool: independent_ratio(source, path, threads, sizes) for tool, path in written.items()},
            "optimizer": {tool: independent_ratio(baseline, path, threads, sizes) for tool, path in optimized.items()},
        })  # fmt: skip
    return rows


def bench(name: str, folder: Path, threads: int, rounds: int, options: tuple[str, ...] = ()) -> dict:
    source = exported(name, folder)
    ours, simmed, slimmed = folder / f"{name}.cx.onnx", folder / f"{name}.sim.onnx", folder / f"{name}.slim.onnx"
    report = folder / f"{name}.json"
    walls: dict[str, list[float]] = {"convexport": [], "onnxsim": [], "onnxslim": []}
    for _ in range(rounds):  # interleaved, so a slow minute of the machine falls on all three
        command = [str(VENV / "convexport"), "optimize", str(source), "-o", str(ours), "--report", str(report), "-q"]
        command += options
        walls["convexport"].append(wall(command + (["--threads", str(threads)] if threads else [])))
        walls["onnxsim"].append(wall([sys.executable, "-m", "onnxsim", str(source), str(simmed)]))
        walls["onnxslim"].append(wall([str(VENV / "onnxslim"), str(source), str(slimmed)]))
    written = json.loads(report.read_text())
    profile = written.get("profile")
    files = {"convexport": ours, "onnxsim": simmed, "onnxslim": slimmed}
    return {
        "working": at_working_sizes(name, source, files, threads) if name in TRANSFORMERS else [],
        "name": name,
        "nodes": (len(onnx.load(source).graph.node), written["after"]["nodes"]),
        "verdict": profile["verdict"] if profile else written.get("profile_skipped", "not profiled"),
        "speedup": (profile["speedup"], *profile["speedup_interval"]) if profile else None,
        "dropped": [r["rule"] for r in written.get("dropped_for_speed", [])],
        "timings": written["timings_s"],
        "walls": {tool: statistics.median(times) for tool, times in walls.items()},
        "independent": {tool: independent_ratio(source, path, threads) for tool, path in files.items()},
    }


def ratio(paired: dict) -> str:
    return f"{paired['speedup']:.2f} ({paired['low']:.2f}-{paired['high']:.2f})"


def row(result: dict, threads: int) -> str:
    speed = result["speedup"]
    said = f"{result['verdict']} {speed[0]:.2f} ({speed[1]:.2f}-{speed[2]:.2f})" if speed else result["verdict"]
    if result["dropped"]:
        said += f"; dropped {', '.join(sorted(set(result['dropped'])))}"
    walls = result["walls"]
    timings = result["timings"]
    return (
        f"| {result['name']} | {threads or 'default'} | {result['nodes'][0]} -> {result['nodes'][1]} | {said} | "
        f"{ratio(result['independent']['convexport'])} | {ratio(result['independent']['onnxsim'])} | "
        f"{ratio(result['independent']['onnxslim'])} | {walls['convexport']:.1f} ({timings.get('profiling', 0):.1f}"
        f" profiling) | {walls['onnxsim']:.1f} | {walls['onnxslim']:.1f} | "
        f"{walls['convexport'] / walls['onnxsim']:.2f} |"
    )


def working_rows(result: dict, threads: int) -> list[str]:
    """A transformer block's rows: each working size, as written and after the optimizer."""
    rows = []
    for measured in result["working"]:
        sizes = ", ".join(f"{dim} {size}" for dim, size in measured["sizes"].items() if " " not in dim)
        cells = [ratio(measured[kind][tool]) for kind in ("as written", "optimizer") for tool in TOOLS]
        rows.append(f"| {result['name']} | {threads or 'default'} | {sizes} | {' | '.join(cells)} |")
    return rows


TOOLS = ("convexport", "onnxsim", "onnxslim")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 0])
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-profile", action="store_true", help="convexport's --no-profile: its cost model decides")
    args = parser.parse_args()
    options = ("--no-profile",) if args.no_profile else ()
    names = args.only or [*SEEDS, *FAMILIES, *TRANSFORMERS]
    print(
        "| model | threads | nodes | convexport's verdict, speedup (95% interval) | independent: convexport | "
        "onnxsim | onnxslim | wall s: convexport | onnxsim | onnxslim | convexport / onnxsim |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    working = []
    with tempfile.TemporaryDirectory() as folder:
        for threads in args.threads:
            for name in names:
                result = bench(name, Path(folder), threads, args.rounds, options)
                print(row(result, threads), flush=True)
                working += working_rows(result, threads)
    if working:
        print(
            "\nTransformer blocks at working sizes: each file's paired speedup over the input as written, and "
            "after ONNX Runtime's transformer optimizer (over the optimizer's output of the input)\n"
        )
        print(
            "| model | threads | dims | as written: convexport | onnxsim | onnxslim | "
            "after the optimizer: convexport | onnxsim | onnxslim |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        print("\n".join(working))


if __name__ == "__main__":
    main()
