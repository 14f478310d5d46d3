"""Conv counts and ONNX Runtime latency before/after convexport for every sample model and a
RepVGG-style network (its automatic fold against the hand re-parameterised export).

    .venv/bin/python bench/linear_folds.py [--device cpu|cuda] [--runs N]

Each row is measured in one process, the models taking turns in blocks of runs (see
convexport/profile/profiler.py), so machine noise hits all of them alike; ratios are `before / after`
medians.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))

import convexport  # noqa: E402
from convexport.load.onnx_route import graph_input_specs  # noqa: E402
from convexport.profile.profiler import TimingSettings, profile_models  # noqa: E402

CASES = [
    ("seed000_subtracted_conv.py", ("cost", "all")),
    ("seed001_bottleneck3d.py", ("cost", "all")),
    ("seed002_group_attention.py", ("cost", "all")),
    ("seed003_large_kernel.py:build_small", ("cost",)),
    ("seed004_full_padding.py", ("cost",)),
    ("seed004_full_padding.py:build_nobias", ("cost",)),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, ONNX Runtime on {args.device}, {args.runs} runs")
    print(f"{'model':40} {'strategy':8} {'Conv':>9} {'nodes':>9} {'before ms':>10} {'after ms':>9} {'speedup':>8}")
    for model, strategies in CASES:
        for strategy in strategies:
            result = convexport.optimize(str(ROOT / "sample_models" / model), strategy=strategy, write=False,
                                         profile=False)
            row(model, strategy, result, args)
    auto = convexport.optimize(str(ROOT / "tests/fixtures/repvgg.py:build"), write=False, profile=False)
    hand = convexport.optimize(str(ROOT / "tests/fixtures/repvgg.py:build_deploy"), write=False, profile=False,
                               builtin_rules=False)
    row("repvgg (training form)", "cost", auto, args)
    measured = profile_models({"hand": hand.model, "auto": auto.model}, graph_input_specs(auto.model),
                              args.device, TimingSettings(args.runs, memory=False, per_op=False))
    ratio = measured["hand"]["latency_ms"]["median"] / measured["auto"]["latency_ms"]["median"]
    print(f"repvgg: automatic fold {measured['auto']['latency_ms']['median']:.3f} ms vs hand re-parameterised "
          f"{measured['hand']['latency_ms']['median']:.3f} ms (hand/auto {ratio:.3f}); Conv "
          f"{auto.report['after']['ops']['Conv']} vs {hand.report['after']['ops']['Conv']}")


def row(model, strategy, result, args) -> None:
    report = result.report
    measured = profile_models({"before": result.original, "after": result.model},
                              graph_input_specs(result.original), args.device,
                              TimingSettings(args.runs, memory=False, per_op=False))
    before, after = (measured[key]["latency_ms"]["median"] for key in ("before", "after"))
    conv = f"{report['before']['ops'].get('Conv', 0)}->{report['after']['ops'].get('Conv', 0)}"
    nodes = f"{report['before']['nodes']}->{report['after']['nodes']}"
    print(f"{model:40} {strategy:8} {conv:>9} {nodes:>9} {before:10.3f} {after:9.3f} {before / after:7.2f}x")


if __name__ == "__main__":
    main()
