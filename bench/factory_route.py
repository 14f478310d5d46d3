"""The factory route (`convexport optimize file.py:factory`) beside what a user does without
convexport: torch's own exporter on the same factory, then onnxsim on its file. One run, side by
side, on this machine:

    .venv/bin/python bench/factory_route.py [--rounds 3] [--only NAME ...]

Per model (the sample models, each its file's `build` factory): the
default `convexport optimize file.py` (exported, rewritten, validated against float64, profiled,
written) and `torch.onnx.export(dynamo=True)` in a fresh process followed by `python -m onnxsim`
in another, the two timed as one; interleaved `--rounds` times (a slow minute of the machine falls
on both), their median wall times and ratio. Prints a Markdown table and the median ratio.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VENV = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent
MODELS = [path.stem for path in sorted((ROOT / "sample_models").glob("seed*.py"))]

# torch's own export of a file's build() on its example_inputs(), as a user would write it
TORCH_EXPORT = """
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("factory", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
built = module.build()  # the module, or (module, example inputs) as convexport's factories may give
model, args = built if isinstance(built, tuple) else (built, module.example_inputs())
args = args if isinstance(args, tuple) else (args,)
torch.onnx.export(model.eval(), args, sys.argv[2], dynamo=True)
"""


def seconds(command: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, timeout=1800)
    return time.perf_counter() - began


def convexport_run(source: Path, folder: Path) -> float:
    return seconds([str(VENV / "convexport"), "optimize", str(source), "-o", str(folder / "cx.onnx"), "-q"])


def torch_then_onnxsim(source: Path, folder: Path) -> float:
    exported, simplified = folder / "torch.onnx", folder / "sim.onnx"
    return seconds([sys.executable, "-c", TORCH_EXPORT, str(source), str(exported)]) + seconds(
        [sys.executable, "-m", "onnxsim", str(exported), str(simplified)]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()
    rows, ratios = [], []
    for name in args.only or MODELS:
        source = ROOT / "sample_models" / f"{name}.py"
        ours, theirs = [], []
        with tempfile.TemporaryDirectory() as scratch:
            folder = Path(scratch)
            for _ in range(args.rounds):
                ours.append(convexport_run(source, folder))
                theirs.append(torch_then_onnxsim(source, folder))
        ratio = statistics.median(ours) / statistics.median(theirs)
        ratios.append(ratio)
        rows.append(
            f"| {name} | {statistics.median(ours):.1f} ({min(ours):.1f}-{max(ours):.1f}) | "
            f"{statistics.median(theirs):.1f} ({min(theirs):.1f}-{max(theirs):.1f}) | {ratio:.2f} |"
        )
        print(rows[-1], file=sys.stderr, flush=True)
    print("| model | convexport optimize file.py, s | torch.onnx.export + onnxsim, s | ratio |")
    print("|---|---|---|---|")
    print("\n".join(rows))
    print(f"\nmedian ratio {statistics.median(ratios):.2f} over {len(ratios)} models, {args.rounds} rounds each")


if __name__ == "__main__":
    main()
