"""Where profiling's time goes, on a device: convexport's profile of two models, phase by phase,
and what cuDNN's algorithm search costs and buys there.

    python bench/profile_phases.py BEFORE.onnx AFTER.onnx [--device cuda] [--out FILE.json]

1. `profile_models({"before", "after"})` as `optimize` calls it: its wall time against its
   timed runs (issue 37's target: at most 3 s more), each model's phases (session, first run,
   per-op pass, warm-up), the per-op times' coverage of the latency.
2. Per model and per `cudnn_conv_algo_search` (EXHAUSTIVE, ORT's default and convexport's
   timing setting; HEURISTIC, cuDNN's pick without timing): a fresh session's creation and
   first run, then the sessions' latency, block-interleaved in one process (on the CPU the
   option does not exist and this part is skipped).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from convexport.load.onnx_route import graph_input_specs  # noqa: E402
from convexport.load.inputs import random_inputs  # noqa: E402
from convexport.profile.profiler import profile_models, session_runner, warm_up  # noqa: E402
from convexport.runtime import create_session, resolve_device  # noqa: E402

ROUNDS, PER_ROUND = 20, 20


def profile_phases(models: dict[str, onnx.ModelProto], feeds: dict, device: str) -> dict:
    began = time.perf_counter()
    measured = profile_models(models, graph_input_specs(next(iter(models.values()))), device, feeds=feeds)
    wall = time.perf_counter() - began
    result = {"wall_s": round(wall, 2), "timed_s": measured["timed_s"], "runs": measured["runs"]}
    result["overhead_s"] = round(wall - measured["timed_s"], 2)
    for label in models:
        entry = measured[label]
        result[label] = {
            "median_ms": round(entry["latency_ms"]["median"], 4),
            "phases_s": entry["phases_s"],
            "op_time_coverage": entry.get("op_time_coverage"),
            "profiled_run_ms": entry.get("profiled_run_ms"),
        }
    return result


def search_costs(models: dict[str, onnx.ModelProto], feeds: dict) -> dict:
    runners, result = {}, {}
    for label, model in models.items():
        for search in (True, False):
            key = f"{label} {'EXHAUSTIVE' if search else 'HEURISTIC'}"
            began = time.perf_counter()
            session = create_session(model, "cuda", search=search)
            made = time.perf_counter()
            run = session_runner(session, feeds, "cuda")
            run()
            first = time.perf_counter()
            warm_up(run, 3)
            runners[key] = run
            result[key] = {"session_s": round(made - began, 3), "first_run_s": round(first - made, 3)}
    times: dict[str, list[float]] = {key: [] for key in runners}
    for _ in range(ROUNDS):
        for key, run in runners.items():
            run()  # not counted: the previous session's work drains
            for _ in range(PER_ROUND):
                start = time.perf_counter()
                run()
                times[key].append((time.perf_counter() - start) * 1e3)
    for key, samples in times.items():
        result[key]["median_ms"] = round(float(np.median(samples)), 4)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out")
    args = parser.parse_args()
    device = resolve_device(args.device)
    models = {"before": onnx.load(args.before), "after": onnx.load(args.after)}
    feeds = random_inputs(graph_input_specs(models["before"]), seed=0)
    result = {"device": device, "profile": profile_phases(models, feeds, device)}
    if device == "cuda":
        result["search"] = search_costs(models, feeds)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
