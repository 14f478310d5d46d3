"""What a CUDA session's first run costs, and whether sessions can pay it side by side.

    python bench/first_runs.py BEFORE.onnx AFTER.onnx [--out FILE.json]

ONNX Runtime's CUDA Conv builds a cuDNN plan for each convolution in a session's first run
(seconds on a real model). `optimize --device cuda` opens four sessions on the device: the
original and the optimized graph with TF32 off for the device check (optimize=False, HEURISTIC,
as validate/compare.py makes them), and both with ORT's default options for the profile. This times:

1. those sessions one after another (creation, first run);
2. the profile's two side by side in threads, then all of them, then the original's twice:
   whether plan building overlaps across sessions;
3. the profile's sessions with HEURISTIC instead of EXHAUSTIVE (cuDNN's heuristic mode A
   against mode B), and the latency of each profile session, block-interleaved in one process.

Needs onnxruntime-gpu and a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from convexport.load.onnx_route import graph_input_specs  # noqa: E402
from convexport.load.inputs import random_inputs  # noqa: E402
from convexport.profile.profiler import session_runner  # noqa: E402
from convexport.runtime import create_session  # noqa: E402

KINDS = {  # create_session's options: the device check's and the profile's sessions
    "check": {"optimize": False, "tf32": False, "search": False},
    "profile": {"optimize": True, "tf32": True, "search": True},
    "profile heuristic": {"optimize": True, "tf32": True, "search": False},
}
ROUNDS, PER_ROUND = 15, 20


def first_runs(models: dict[str, onnx.ModelProto], feeds: dict) -> dict:
    def open_one(label: str, kind: str, into: dict) -> None:
        began = time.perf_counter()
        session = create_session(models[label], "cuda", **KINDS[kind])
        made = time.perf_counter()
        run = session_runner(session, feeds, "cuda")
        run()
        into[(label, kind)] = (session, run, round(made - began, 3), round(time.perf_counter() - made, 3))

    def phase(pairs: list[tuple[str, str]], together: bool) -> tuple[dict, dict]:
        into: dict = {}
        began = time.perf_counter()
        if together:
            threads = [threading.Thread(target=open_one, args=(*pair, into)) for pair in pairs]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        else:
            for pair in pairs:
                open_one(*pair, into)
        times = {f"{label} {kind}": {"session_s": v[2], "first_run_s": v[3]} for (label, kind), v in into.items()}
        return into, {"wall_s": round(time.perf_counter() - began, 3), **times}

    four = [("before", "check"), ("after", "check"), ("before", "profile"), ("after", "profile")]
    result = {}
    opened_seq, result["one after another"] = phase(four, together=False)
    kept = {f"{k[0]} {k[1]}, alone": opened_seq[k] for k in four[2:]}
    del opened_seq
    opened_pair, result["the profile's two side by side"] = phase(four[2:], together=True)
    kept.update({f"{k[0]} {k[1]}, side by side": opened_pair[k] for k in four[2:]})
    del opened_pair
    result["all four side by side"] = phase(four, together=True)[1]
    result["the original's twice side by side"] = phase([four[2], four[2]], together=True)[1]
    heuristic = [("before", "profile heuristic"), ("after", "profile heuristic")]
    opened_heuristic, result["HEURISTIC one after another"] = phase(heuristic, together=False)
    kept.update({f"{k[0]} {k[1]}": opened_heuristic[k] for k in heuristic})
    times: dict[str, list[float]] = {key: [] for key in kept}
    for _ in range(ROUNDS):
        for key, (_, run, *_) in kept.items():
            run()  # not counted: the previous session's work drains
            for _ in range(PER_ROUND):
                start = time.perf_counter()
                run()
                times[key].append((time.perf_counter() - start) * 1e3)
    result["latency_ms"] = {key: round(float(np.median(samples)), 4) for key, samples in times.items()}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    models = {"before": onnx.load(args.before), "after": onnx.load(args.after)}
    feeds = random_inputs(graph_input_specs(models["before"]), seed=0)
    result = first_runs(models, feeds)
    for key, value in result.items():
        print(key, value, flush=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
