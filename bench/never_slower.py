"""Is any model that `convexport optimize` writes by default slower than its input, and how long
does it take beside onnxsim? One run, side by side, on this machine's CPU:

    .venv/bin/python bench/never_slower.py [--threads 1 0] [--only NAME] [--rounds 3]

For each model of the bench set (the five seeds and the family networks of
bench/family_blocks.py, exported to ONNX by torch.onnx.export at their example inputs):
- `convexport optimize F.onnx --threads N` (validated against float64, profiled: the default) as
  a fresh process, its wall time, its verdict and the interval it reported, what it dropped for
  speed; `python -m onnxsim F.onnx OUT` and `onnxslim F.onnx OUT` as fresh processes, theirs;
- an independent ratio of each written file against the input (convexport's, onnxsim's,
  onnxslim's), each pair timed in a fresh process of its own by convexport's paired timer with a
  larger budget (4 s), at the same threads.
N = 0 is ONNX Runtime's default (one per physical core). Prints a Markdown table.
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


def exported(name: str, folder: Path) -> Path:
    """The model as an ONNX file, exported as a user would (convexport export: torch.export)."""
    path = folder / f"{name}.onnx"
    source = str(ROOT / SEEDS[name]) if name in SEEDS else f"{ROOT / 'bench/family_blocks.py'}:{name}"
    subprocess.run([str(VENV / "convexport"), "export", source, "-o", str(path)], check=True, capture_output=True)
    return path


def wall(command: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - began


def _paired_in_child(original: str, candidate: str, threads: int, queue) -> None:
    from convexport.onnx_route import graph_input_specs
    from convexport.profile import profile_models

    model = onnx.load(original)
    measured = profile_models(
        {"before": model, "after": onnx.load(candidate)}, graph_input_specs(model), "cpu",
        memory=False, per_op=False, threads=threads or None, budget_s=4.0,
    )  # fmt: skip
    queue.put(measured["paired"])


def independent_ratio(original: Path, candidate: Path, threads: int) -> dict:
    """The candidate's paired speedup over the original, timed in a fresh process."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_paired_in_child, args=(str(original), str(candidate), threads, queue))
    child.start()
    result = queue.get(timeout=600)
    child.join()
    return result


def bench(name: str, folder: Path, threads: int, rounds: int) -> dict:
    source = exported(name, folder)
    ours, simmed, slimmed = folder / f"{name}.cx.onnx", folder / f"{name}.sim.onnx", folder / f"{name}.slim.onnx"
    report = folder / f"{name}.json"
    walls: dict[str, list[float]] = {"convexport": [], "onnxsim": [], "onnxslim": []}
    for _ in range(rounds):  # interleaved, so a slow minute of the machine falls on all three
        command = [str(VENV / "convexport"), "optimize", str(source), "-o", str(ours), "--report", str(report), "-q"]
        walls["convexport"].append(wall(command + (["--threads", str(threads)] if threads else [])))
        walls["onnxsim"].append(wall([sys.executable, "-m", "onnxsim", str(source), str(simmed)]))
        walls["onnxslim"].append(wall([str(VENV / "onnxslim"), str(source), str(slimmed)]))
    written = json.loads(report.read_text())
    profile = written.get("profile")
    return {
        "name": name,
        "nodes": (len(onnx.load(source).graph.node), written["after"]["nodes"]),
        "verdict": profile["verdict"] if profile else written.get("profile_skipped", "not profiled"),
        "speedup": (profile["speedup"], *profile["speedup_interval"]) if profile else None,
        "dropped": [r["rule"] for r in written.get("dropped_for_speed", [])],
        "timings": written["timings_s"],
        "walls": {tool: statistics.median(times) for tool, times in walls.items()},
        "independent": {
            "convexport": independent_ratio(source, ours, threads),
            "onnxsim": independent_ratio(source, simmed, threads),
            "onnxslim": independent_ratio(source, slimmed, threads),
        },
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 0])
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    names = args.only or [*SEEDS, *FAMILIES]
    print(
        "| model | threads | nodes | convexport's verdict, speedup (95% interval) | independent: convexport | "
        "onnxsim | onnxslim | wall s: convexport | onnxsim | onnxslim | convexport / onnxsim |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for threads in args.threads:
            for name in names:
                print(row(bench(name, Path(folder), threads, args.rounds), threads), flush=True)


if __name__ == "__main__":
    main()
