"""Large models (issue 34): convexport's whole process against onnxslim's on the same file, time
and peak RSS, for models of 1 GB and more of weights.

    .venv/bin/python bench/large_models.py [--gigabytes 1 10] [--write bench/RESULTS.md]

The model is written tensor by tensor straight to its external-data file (building it needs
no more memory than one tensor): blocks of `MatMul -> +bias, + LoRA (rank 16, scaled) ->
BatchNormalization -> Relu` at width 4096 on a [batch, 4096] input, as a LoRA/BN MLP exports,
as many blocks as the size asks (64 MiB of weights each). Each tool runs as users run it, a
fresh process reading and writing the files (`convexport optimize --no-profile`, validated; and
`onnxslim IN OUT`), timed with GNU time (wall seconds, maximum resident set size). The targets
of issue 34: peak RSS <= 2x the weights, time <= 2x onnxslim's.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))

from families import write_section  # noqa: E402

HEADING = "## Large models: time and peak memory against onnxslim"
WIDTH, RANK, BATCH = 4096, 16, 8
BIN = Path(sys.executable).parent


def write_mlp(path: Path, blocks: int, seed: int = 0) -> int:
    """A `blocks`-block LoRA/BN MLP at `path`, its weights in `path.data`, appended one tensor
    at a time; the bytes of weights."""
    rng = np.random.default_rng(seed)
    data = path.with_name(path.name + ".data")
    initializers, nodes, offset = [], [], 0
    with open(data, "wb") as out:

        def tensor(name: str, shape: tuple[int, ...], scale: float = 1.0, low: float | None = None):
            nonlocal offset
            values = rng.uniform(low, 1.0, shape) if low is not None else rng.standard_normal(shape) * scale
            raw = values.astype(np.float32).tobytes()
            out.write(raw)
            init = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=shape)
            init.data_location = TensorProto.EXTERNAL
            for key, value in (("location", data.name), ("offset", str(offset)), ("length", str(len(raw)))):
                init.external_data.add(key=key, value=value)
            offset += len(raw)
            initializers.append(init)
            return name

        x = "x"
        for b in range(blocks):
            w, bias = tensor(f"w{b}", (WIDTH, WIDTH), WIDTH**-0.5), tensor(f"b{b}", (WIDTH,), 0.1)
            down, up = tensor(f"a{b}", (WIDTH, RANK), WIDTH**-0.5), tensor(f"u{b}", (RANK, WIDTH), RANK**-0.5)
            gamma, beta = tensor(f"g{b}", (WIDTH,), low=0.5), tensor(f"be{b}", (WIDTH,), 0.1)
            mean, var = tensor(f"m{b}", (WIDTH,), 0.1), tensor(f"v{b}", (WIDTH,), low=0.5)
            scale = helper.make_tensor(f"s{b}", TensorProto.FLOAT, [], [0.5])
            initializers.append(scale)
            nodes += [
                helper.make_node("MatMul", [x, w], [f"mm{b}"]),
                helper.make_node("Add", [f"mm{b}", bias], [f"lin{b}"]),
                helper.make_node("MatMul", [x, down], [f"d{b}"]),
                helper.make_node("MatMul", [f"d{b}", up], [f"l{b}"]),
                helper.make_node("Mul", [f"l{b}", f"s{b}"], [f"ls{b}"]),
                helper.make_node("Add", [f"lin{b}", f"ls{b}"], [f"sum{b}"]),
                helper.make_node("BatchNormalization", [f"sum{b}", gamma, beta, mean, var], [f"bn{b}"]),
                helper.make_node("Relu", [f"bn{b}"], [f"y{b}"]),
            ]
            x = f"y{b}"
    graph = helper.make_graph(
        nodes, "lora_bn_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, WIDTH])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [BATCH, WIDTH])], initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    with open(path, "wb") as out:
        out.write(model.SerializeToString())
    return offset


def timed(command: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in GiB, the last line of output) of one run under GNU time."""
    start = time.perf_counter()
    run = subprocess.run(["/usr/bin/time", "-v", *command], capture_output=True, text=True)
    wall = time.perf_counter() - start
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", run.stderr)
    output = [line for line in (run.stdout + run.stderr).splitlines() if line.strip() and "\t" not in line]
    status = "ok" if run.returncode == 0 else f"exit {run.returncode}: {output[-1][:100] if output else ''}"
    return wall, int(peak.group(1)) / 2**20 if peak else float("nan"), status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gigabytes", type=float, nargs="+", default=[1.0])
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    lines = [
        HEADING, "",
        f"`bench/large_models.py`, {datetime.date.today()}, {platform.machine()}, "
        f"{os.cpu_count()} cores, onnx {onnx.__version__}. LoRA/BN MLP at width 4096 ({BATCH} x 4096 input), "
        "weights in external data; each tool a fresh process under GNU time.", "",
        "| weights | tool | result | time (s) | peak RSS (GiB) | RSS / weights |", "|---|---|---|---|---|---|",
    ]
    for gigabytes in args.gigabytes:
        blocks = max(1, round(gigabytes * 2**30 / (WIDTH * WIDTH * 4 + WIDTH * (2 * RANK + 5) * 4)))
        with tempfile.TemporaryDirectory(dir="/tmp") as folder:
            model = Path(folder) / "mlp.onnx"
            size = write_mlp(model, blocks) / 2**30
            runs = {
                "convexport": [str(BIN / "convexport"), "optimize", str(model), "-o", str(Path(folder) / "cx.onnx"),
                               "--no-profile", "--quiet"],
                "onnxslim": [str(BIN / "onnxslim"), str(model), str(Path(folder) / "slim.onnx")],
            }
            for tool, command in runs.items():
                wall, peak, status = timed(command)
                weights = f"{size:.2f} GiB ({blocks} blocks)"
                line = f"| {weights} | {tool} | {status} | {wall:.1f} | {peak:.2f} | {peak / size:.1f}x |"
                print(line, flush=True)
                lines.append(line)
    lines.append("")
    if args.write:
        write_section(args.write, "\n".join(lines), HEADING)


if __name__ == "__main__":
    main()
