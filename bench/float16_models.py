"""Models that are float16 already (a float16 checkpoint's export, a converter's float16 file):
convexport's default optimize (folded as the float32 twin, written in float16 again:
convexport/load/float32_twin.py) against the model as given and against onnxslim, each judged
against the exact (float64) result of the float16 model as given.

    PYTHONPATH=FP16_PACKAGES .venv/bin/python bench/float16_models.py [--only NAME] [--write FILE]

Needs onnxconverter-common 1.16 and onnxslim 0.1 (bench/half_precision.py's folder). The float16
models are onnxconverter-common's convert_float_to_float16 of bench/half_precision.py's exports
(the sample models, RepVGG, MobileOne and FastViT networks, the YOLO-like detector), with a
float16 interface ("fp16 io") and with its float32 one kept ("fp32 io": Casts at the edges).

Per file: nodes and Casts; the worst output's largest and rms error over its rms against the
float64 result on bench/half_precision.py's three held-out input sets (rounded to float16 where
the interface is float16), twice: run by ONNX Runtime's CPU provider (which computes most
float16 ops in float32: only the weights are rounded), and with every value rounded to float16
(validate/rounded_run.py: what a device that rounds each op's output computes); CPU latency (median
of 21 interleaved rounds).
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from half_precision import MODELS, _quietly, error_vs_exact, exported, input_sets, latency_ms, relative_errors
from onnx import TensorProto

import convexport
from convexport.validate.float64 import Float64Evaluator
from convexport.validate.rounded_run import rounded_runs
from convexport.ir.slots import element_types

FAMILIES = [name for name in MODELS if "LoRA" not in name]  # optimum's exports do not convert (half_precision.py)


def float16_file(original: Path, interface_kept: bool) -> Path:
    from onnxconverter_common import float16

    path = original.with_name(f"{original.stem}.{'f16_f32io' if interface_kept else 'f16'}.onnx")
    model = onnx.load(str(original))
    onnx.save(_quietly(lambda: float16.convert_float_to_float16(model, keep_io_types=interface_kept)), str(path))
    return path


def fed_as(path: Path, sets: list[dict]) -> list[dict]:
    """The input sets in the file's input types (float16 where its interface is)."""
    kinds = {value.name: value.type.tensor_type.elem_type for value in onnx.load(str(path)).graph.input}
    return [{k: v.astype(np.float16) if kinds[k] == TensorProto.FLOAT16 else v for k, v in s.items()} for s in sets]


def device_like(path: Path, sets: list[dict], exact: list[list[np.ndarray]]) -> tuple[float, float]:
    """error_vs_exact's numbers for the file with every value rounded to float16."""
    model = onnx.load(str(path))
    runs = rounded_runs(model, element_types(model), TensorProto.FLOAT16, sets)
    names = [output.name for output in model.graph.output]
    return relative_errors([[run[name] for name in names] for run in runs], exact)


def rows_for(name: str, folder: Path) -> list[str]:
    original = exported(name, folder)
    rows = []
    for kept in (False, True):
        given = float16_file(original, kept)
        sets = fed_as(given, input_sets(original))
        evaluator = Float64Evaluator(onnx.load(str(given)))
        exact = [evaluator.run(feeds) for feeds in sets]
        made = {"float16 model as given": given}
        out = folder / f"{given.stem}.cx.onnx"
        try:
            _quietly(lambda given=given, out=out: convexport.optimize(str(given), output=str(out), profile=False))
            made["convexport optimize"] = out
        except convexport.ConvexportError as exc:
            made["convexport optimize"] = f"fails: {str(exc)[:90]}"
        slim = folder / f"{given.stem}.slim.onnx"
        try:
            import onnxslim

            onnx.save(_quietly(lambda given=given: onnxslim.slim(onnx.load(str(given)))), str(slim))
            made["onnxslim"] = slim
        except Exception as exc:  # the tool's own failure is the result
            made["onnxslim"] = f"fails: {type(exc).__name__}: {str(exc)[:70]}"
        files = {label: path for label, path in made.items() if not isinstance(path, str)}
        times = dict(zip(files, latency_ms(list(files.values()), sets[0])))
        for label, path in made.items():
            if isinstance(path, str):
                rows.append(f"| {name} | {'fp32' if kept else 'fp16'} io | {label} | {path} | | | | | |")
                continue
            ops = Counter(node.op_type for node in onnx.load(str(path)).graph.node)
            cpu, device = error_vs_exact(path, sets, exact), device_like(path, sets, exact)
            rows.append(
                f"| {name} | {'fp32' if kept else 'fp16'} io | {label} | {sum(ops.values())} | {ops['Cast']} | "
                f"{cpu[0]:.2e} / {cpu[1]:.2e} | {device[0]:.2e} / {device[1]:.2e} | {times[label]:.3f} |"
            )
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", action="append")
    parser.add_argument("--write")
    args = parser.parse_args()
    rows = [
        "| model | interface | file | nodes | Casts | CPU error: max / rms (over rms) | every value rounded: max / rms "
        "| CPU ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(rows), flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.only or FAMILIES:
            rows += rows_for(name, Path(scratch))
    if args.write:
        Path(args.write).write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
