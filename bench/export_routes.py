"""convexport against onnxsim and onnxslim on every export route, for networks whose exports
carry shape arithmetic (issue 31, "One tool after export").

    .venv/bin/python bench/export_routes.py [--only NAME] [--write bench/RESULTS.md]

The networks: EfficientViT-M, GhostNetV3 and ShuffleNetV2 (bench/shape_blocks.py), LeViT and
EfficientViT (MIT) (bench/family_blocks.py), own re-implementations in their training form.
Each is exported five ways, as users export: dynamo with its optimizer (the default) and
without, the TorchScript exporter without constant folding and with it, and without it with a
dynamic batch (the batch stays dynamic: a view(B, ...) of it is 0 or -1 after convexport). On each export: node
counts of the original, of convexport (validated against the original, not profiled), of
onnxsim and of onnxslim, beside the hand re-parameterised form (the family's own fuse(),
exported by dynamo); BatchNormalization and shape-arithmetic nodes left by convexport, and
whether convexport's count is no larger than the best peer's and the hand form's.
Then the whole command, `convexport optimize --no-profile` against `python -m onnxsim`, each
run as a user runs it (a fresh process, the file read and written), taking turns, on the
largest export.

`--write FILE` replaces the section HEADING of FILE, or appends it.
"""

from __future__ import annotations

import datetime
import io
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import family_blocks  # noqa: E402
import shape_blocks  # noqa: E402
from families import arguments, write_section  # noqa: E402
from peers import run_onnxsim, run_onnxslim  # noqa: E402

import convexport  # noqa: E402
from convexport.util.quiet import quiet_libraries  # noqa: E402

ROUTES = ("dynamo", "dynamo unoptimized", "torchscript unfolded", "torchscript folded",
          "torchscript unfolded, dynamic batch")
NETWORKS = {
    **shape_blocks.FAMILIES,
    "LeViT": family_blocks.levit,
    "EfficientViT (MIT)": family_blocks.efficientvit,
}
SHAPE_OPS = ("Shape", "Size", "Gather", "Unsqueeze", "Squeeze", "ConstantOfShape", "Range")
COMMAND_CALLS = 3  # whole-command timings: the median of this many runs of each
HEADING = "## Every export route against onnxsim and onnxslim"


def export(module: torch.nn.Module, inputs: tuple, route: str) -> onnx.ModelProto:
    """The module as ONNX by one of ROUTES, at each exporter's own defaults otherwise."""
    with quiet_libraries():
        if route.startswith("dynamo"):
            return torch.onnx.export(module, inputs, dynamo=True, optimize=route == "dynamo", verbose=False).model_proto
        buffer = io.BytesIO()
        dynamic = route.endswith("dynamic batch")
        torch.onnx.export(module, inputs, buffer, dynamo=False, do_constant_folding=route == "torchscript folded",
                          training=torch.onnx.TrainingMode.EVAL, input_names=["x"],
                          dynamic_axes={"x": {0: "batch"}} if dynamic else None)
    return onnx.load_from_string(buffer.getvalue())


def peer_nodes(run, model: onnx.ModelProto) -> int | str:
    """The peer's node count, or the first words of its error."""
    try:
        with quiet_libraries():
            return len(run(model).graph.node)
    except Exception as error:  # a peer's failure is a row's result, not the benchmark's end
        return f"error ({type(error).__name__})"


def bench_route(module, inputs, route: str, hand_nodes: int) -> dict:
    original = export(module, inputs, route)
    start = time.perf_counter()
    result = convexport.optimize(original, write=False, profile=False)  # raises if not exact
    seconds = time.perf_counter() - start
    ops = [node.op_type for node in result.model.graph.node]
    row = {
        "route": route,
        "original": original,
        "before": len(original.graph.node),
        "convexport": len(ops),
        "seconds": seconds,
        "onnxsim": peer_nodes(run_onnxsim, original),
        "onnxslim": peer_nodes(run_onnxslim, original),
        "hand": hand_nodes,
        "bn": ops.count("BatchNormalization"),
        "shape ops": sum(ops.count(op) for op in SHAPE_OPS),
        "exact": result.report["validation"]["passed"],
    }
    peers = [row[name] for name in ("onnxsim", "onnxslim") if isinstance(row[name], int)]
    row["holds"] = row["convexport"] <= min([*peers, hand_nodes]) and row["bn"] == 0 and row["exact"]
    return row


def bench_network(name: str, factory) -> list[dict]:
    module, inputs = factory()
    hand = export(family_blocks.reparameterized(module), inputs, "dynamo")
    rows = [bench_route(module, inputs, route, len(hand.graph.node)) for route in ROUTES]
    for row in rows:
        row["network"] = name
    return rows


def table_row(row: dict) -> str:
    cells = [row["network"], row["route"], row["before"], row["convexport"], row["onnxsim"], row["onnxslim"],
             row["hand"], row["bn"], row["shape ops"], "yes" if row["exact"] else "NO", f"{row['seconds']:.1f}",
             "yes" if row["holds"] else "**NO**"]
    return "| " + " | ".join(map(str, cells)) + " |"


def command_seconds(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def whole_commands(row: dict) -> dict[str, list[float]]:
    """Wall times of the two commands on the row's export, taking turns."""
    times: dict[str, list[float]] = {"convexport optimize --no-profile": [], "python -m onnxsim": []}
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "model.onnx"
        onnx.save(row["original"], source)
        commands = {
            "convexport optimize --no-profile": [sys.executable, "-m", "convexport", "optimize", str(source),
                                                 "-o", str(Path(folder) / "cx.onnx"), "--no-profile", "--quiet"],
            "python -m onnxsim": [sys.executable, "-m", "onnxsim", str(source), str(Path(folder) / "sim.onnx")],
        }
        for _ in range(COMMAND_CALLS):
            for label, command in commands.items():
                times[label].append(command_seconds(command))
    return times


def section(rows: list[dict], largest: dict, times: dict[str, list[float]], seconds: float) -> str:
    medians = {label: statistics.median(values) for label, values in times.items()}
    ours, theirs = medians["convexport optimize --no-profile"], medians["python -m onnxsim"]
    lines = [
        HEADING, "",
        f"{datetime.date.today()}, {platform.machine()}, {platform.python_version()}, torch {torch.__version__}, "
        f"`bench/export_routes.py` ({seconds:.0f} s). Nodes of each export: the original, convexport's "
        "(validated against the original), onnxsim's, onnxslim's, and the hand re-parameterised form "
        "(the family's own fuse(), exported by dynamo); BatchNormalization and shape-arithmetic nodes "
        f"({', '.join(SHAPE_OPS)}) left by convexport; \"holds\": convexport no larger than the best "
        "peer and the hand form, 0 BN, exact.", "",
        "| network | route | original | convexport | onnxsim | onnxslim | hand | BN left | shape ops left "
        "| exact | convexport s | holds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *map(table_row, rows), "",
        f"Whole command on the largest export ({largest['network']}, {largest['route']}, {largest['before']} nodes), "
        f"a fresh process each, taking turns, median of {COMMAND_CALLS}: "
        f"`convexport optimize --no-profile` {ours:.1f} s (folds, validates, writes), "
        f"`python -m onnxsim` {theirs:.1f} s; ratio {theirs / ours:.2f}x "
        f"({'below' if ours < theirs else '**not below**'} onnxsim's).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    args = arguments(__doc__, "networks")
    start = time.perf_counter()
    rows = []
    for name, factory in NETWORKS.items():
        if args.only is None or args.only.lower() in name.lower():
            rows += bench_network(name, factory)
            print("\n".join(map(table_row, rows[-len(ROUTES):])), flush=True)
    largest = max(rows, key=lambda row: row["before"])
    times = whole_commands(largest)
    text = section(rows, largest, times, time.perf_counter() - start)
    print("\n" + text)
    if args.write:
        write_section(args.write, text, HEADING)
    medians = [statistics.median(values) for values in times.values()]
    if not all(row["holds"] for row in rows) or medians[0] >= medians[1]:
        raise SystemExit(1)  # a target missed: make bench and CI scripts see it


if __name__ == "__main__":
    main()
