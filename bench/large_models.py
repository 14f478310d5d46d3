"""Large models (issue 34): convexport's whole process against onnxslim's on the same file, time
and peak RSS, for models of 1 GB and more of weights.

    .venv/bin/python bench/large_models.py [--gigabytes 1 10] [--families mlp conv] [--write bench/RESULTS.md]

The model is written tensor by tensor straight to its external-data file (building it needs
no more memory than one tensor), as many blocks as the size asks, of two families (--families):
mlp, `MatMul -> +bias, + LoRA (rank 16, scaled) -> BatchNormalization -> Relu` at width 4096 on
a [batch, 4096] input, as a LoRA/BN MLP exports (64 MiB of weights a block); conv, RepVGG's
training block (3x3 conv + BN, 1x1 conv + BN and a BN identity branch, summed, Relu) at 512
channels on a [1, 512, 14, 14] input (10 MiB a block). Each tool runs as users run it, a
fresh process reading and writing the files (`convexport optimize --no-profile`, validated; and
`onnxslim IN OUT`), timed with GNU time (wall seconds, maximum resident set size); onnxslim,
which reads every weight into memory, with its address space limited to 3/4 of the machine's
memory (--onnxslim-cap-gib), so that a model too large for it ends in its MemoryError rather than the
kernel's out-of-memory killer. The targets of issue 34: peak RSS <= 2x the weights, time <= 2x
onnxslim's, the ~10 GB model done on a 24 GiB machine.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import re
import resource
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
CHANNELS, SIDE = 512, 14
BIN = Path(sys.executable).parent


class ExternalWeights:
    """Tensors appended one at a time to an external-data file (building a model needs no more
    memory than one tensor), as initializers that point into it."""

    def __init__(self, data: Path, seed: int):
        self.data, self.rng, self.offset, self.initializers = data, np.random.default_rng(seed), 0, []
        self.out = open(data, "wb")  # noqa: SIM115 (closed by save, once the last tensor is in)

    def tensor(self, name: str, shape: tuple[int, ...], scale: float = 1.0, low: float | None = None) -> str:
        values = self.rng.uniform(low, 1.0, shape) if low is not None else self.rng.standard_normal(shape) * scale
        raw = values.astype(np.float32).tobytes()
        self.out.write(raw)
        init = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=shape)
        init.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.data.name), ("offset", str(self.offset)), ("length", str(len(raw)))):
            init.external_data.add(key=key, value=value)
        self.offset += len(raw)
        self.initializers.append(init)
        return name

    def batchnorm(self, prefix: str, channels: int) -> list[str]:
        return [
            self.tensor(f"{prefix}_g", (channels,), low=0.5),
            self.tensor(f"{prefix}_b", (channels,), 0.1),
            self.tensor(f"{prefix}_m", (channels,), 0.1),
            self.tensor(f"{prefix}_v", (channels,), low=0.5),
        ]

    def save(self, path: Path, nodes, x: str, shape: list[int], name: str) -> int:
        """The model at `path` (input x, output its last node's, both of `shape`); the bytes of weights."""
        self.out.close()
        graph = helper.make_graph(
            nodes,
            name,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
            [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)],
            self.initializers,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
        with open(path, "wb") as out:
            out.write(model.SerializeToString())
        return self.offset


def write_mlp(path: Path, blocks: int, seed: int = 0) -> int:
    """A `blocks`-block LoRA/BN MLP at `path`, its weights in `path.data`; the bytes of weights."""
    weights = ExternalWeights(path.with_name(path.name + ".data"), seed)
    nodes, x = [], "x"
    for b in range(blocks):
        w, bias = weights.tensor(f"w{b}", (WIDTH, WIDTH), WIDTH**-0.5), weights.tensor(f"b{b}", (WIDTH,), 0.1)
        down, up = (
            weights.tensor(f"a{b}", (WIDTH, RANK), WIDTH**-0.5),
            weights.tensor(f"u{b}", (RANK, WIDTH), RANK**-0.5),
        )
        bn = weights.batchnorm(f"bn{b}", WIDTH)
        weights.initializers.append(helper.make_tensor(f"s{b}", TensorProto.FLOAT, [], [0.5]))
        nodes += [
            helper.make_node("MatMul", [x, w], [f"mm{b}"]),
            helper.make_node("Add", [f"mm{b}", bias], [f"lin{b}"]),
            helper.make_node("MatMul", [x, down], [f"d{b}"]),
            helper.make_node("MatMul", [f"d{b}", up], [f"l{b}"]),
            helper.make_node("Mul", [f"l{b}", f"s{b}"], [f"ls{b}"]),
            helper.make_node("Add", [f"lin{b}", f"ls{b}"], [f"sum{b}"]),
            helper.make_node("BatchNormalization", [f"sum{b}", *bn], [f"bn{b}"]),
            helper.make_node("Relu", [f"bn{b}"], [f"y{b}"]),
        ]
        x = f"y{b}"
    return weights.save(path, nodes, x, [BATCH, WIDTH], "lora_bn_mlp")


def write_repvgg(path: Path, blocks: int, seed: int = 0) -> int:
    """A `blocks`-block RepVGG-style conv network at `path` (per block: a 3x3 conv + BN, a 1x1
    conv + BN and a BN identity branch, summed, then Relu; CHANNELS channels), its weights in
    `path.data`; the bytes of weights."""
    weights = ExternalWeights(path.with_name(path.name + ".data"), seed)
    nodes, x = [], "x"
    scale = (9 * CHANNELS) ** -0.5
    for b in range(blocks):
        w3, w1 = (
            weights.tensor(f"k{b}", (CHANNELS, CHANNELS, 3, 3), scale),
            weights.tensor(f"p{b}", (CHANNELS, CHANNELS, 1, 1), scale),
        )
        bn3, bn1, bnid = (
            weights.batchnorm(f"n{b}", CHANNELS),
            weights.batchnorm(f"o{b}", CHANNELS),
            weights.batchnorm(f"i{b}", CHANNELS),
        )
        nodes += [
            helper.make_node("Conv", [x, w3], [f"c3_{b}"], pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", [f"c3_{b}", *bn3], [f"b3_{b}"]),
            helper.make_node("Conv", [x, w1], [f"c1_{b}"]),
            helper.make_node("BatchNormalization", [f"c1_{b}", *bn1], [f"b1_{b}"]),
            helper.make_node("BatchNormalization", [x, *bnid], [f"bi_{b}"]),
            helper.make_node("Add", [f"b3_{b}", f"b1_{b}"], [f"s_{b}"]),
            helper.make_node("Add", [f"s_{b}", f"bi_{b}"], [f"t_{b}"]),
            helper.make_node("Relu", [f"t_{b}"], [f"y{b}"]),
        ]
        x = f"y{b}"
    return weights.save(path, nodes, x, [1, CHANNELS, SIDE, SIDE], "repvgg")


FAMILIES = {
    "mlp": (write_mlp, WIDTH * WIDTH * 4 + WIDTH * (2 * RANK + 5) * 4, "LoRA/BN MLP at width 4096, [8, 4096] input"),
    "conv": (
        write_repvgg,
        CHANNELS * CHANNELS * 10 * 4 + 12 * CHANNELS * 4,
        "RepVGG-style convs, 512 channels, [1, 512, 14, 14] input",
    ),
}


def timed(command: list[str], cap_bytes: int | None = None) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in GiB, the last line of output) of one run under GNU time;
    with `cap_bytes`, its address space limited to that (an allocation past it fails with
    MemoryError instead of bringing the machine to its out-of-memory killer)."""

    def capped() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap_bytes, cap_bytes))

    start = time.perf_counter()
    run = subprocess.run(
        ["/usr/bin/time", "-v", *command], capture_output=True, text=True, preexec_fn=capped if cap_bytes else None
    )
    wall = time.perf_counter() - start
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", run.stderr)
    lines = (run.stdout + run.stderr).splitlines()
    killed = [line for line in lines if line.startswith("Command terminated by signal")]  # (a crash says nothing)
    output = killed or [line for line in lines if line.strip() and not _time_says(line)]
    status = "ok" if run.returncode == 0 else f"exit {run.returncode}: {output[-1][:100] if output else ''}"
    return wall, int(peak.group(1)) / 2**20 if peak else float("nan"), status


def _time_says(line: str) -> bool:
    """A line of GNU time's own (its statistics, "Command exited with non-zero status 1")."""
    return "\t" in line or line.startswith("Command ")


def _stages(report: Path) -> str:
    """The seconds of each of convexport's steps, from its report (`timings_s`)."""
    if not report.exists():
        return ""
    timings = json.loads(report.read_text())["timings_s"]
    return ", ".join(f"{step} {seconds:.1f}" for step, seconds in timings.items() if step != "total")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gigabytes", type=float, nargs="+", default=[1.0])
    parser.add_argument("--families", nargs="+", choices=sorted(FAMILIES), default=["mlp", "conv"])
    parser.add_argument("--write", type=Path)
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    parser.add_argument(
        "--onnxslim-cap-gib",
        type=float,
        default=0.75 * total / 2**30,
        help="onnxslim's address space limit (default: 3/4 of the machine's memory; it holds every weight at once)",
    )
    args = parser.parse_args()
    lines = [
        HEADING,
        "",
        f"`bench/large_models.py`, {datetime.date.today()}, {platform.machine()}, "
        f"{os.cpu_count()} cores, {total / 2**30:.1f} GiB, onnx {onnx.__version__}, onnxslim "
        f"{importlib.metadata.version('onnxslim')}. Weights in external data; each tool a fresh process under GNU "
        f"time, onnxslim's address space limited to {args.onnxslim_cap_gib:.1f} GiB.",
        "",
        "| model | weights | tool | result | time (s) | peak RSS (GiB) | RSS / weights | convexport's stages (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for family in args.families:
        write, block_bytes, described = FAMILIES[family]
        for gigabytes in args.gigabytes:
            blocks = max(1, round(gigabytes * 2**30 / block_bytes))
            with tempfile.TemporaryDirectory(dir="/tmp") as folder:
                model = Path(folder) / f"{family}.onnx"
                size = write(model, blocks) / 2**30
                runs = {
                    "convexport": [
                        str(BIN / "convexport"),
                        "optimize",
                        str(model),
                        "-o",
                        str(Path(folder) / "cx.onnx"),
                        "--no-profile",
                        "--quiet",
                        "--report",
                        str(Path(folder) / "report.json"),
                    ],
                    "onnxslim": [str(BIN / "onnxslim"), str(model), str(Path(folder) / "slim.onnx")],
                }
                for tool, command in runs.items():
                    cap = int(args.onnxslim_cap_gib * 2**30) if tool == "onnxslim" else None
                    wall, peak, status = timed(command, cap)
                    weights = f"{size:.2f} GiB ({blocks} blocks)"
                    stages = _stages(Path(folder) / "report.json") if tool == "convexport" else ""
                    measured = f"{status} | {wall:.1f} | {peak:.2f} | {peak / size:.1f}x | {stages}"
                    line = f"| {described} | {weights} | {tool} | {measured} |"
                    print(line, flush=True)
                    lines.append(line)
    lines.append("")
    if args.write:
        write_section(args.write, "\n".join(lines), HEADING)


if __name__ == "__main__":
    main()
