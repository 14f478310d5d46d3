"""optimum's merged decoders at the sizes users deploy, in float16 (issue 52): t5-base's and
whisper-small's dims (random weights, perturbed as transformer_pipeline.py's are), exported by
optimum as users export them (`decoder_model_merged.onnx`: one If on `use_cache_branch` over the
decoder without past and the one with it; 651 and 774 MB, over the 256 MiB from which
convexport keeps a model's attempts on disk), beside optimum's decoder without past.

    PYTHONPATH=/path/to/hf/packages:FP16_PACKAGES .venv/bin/python bench/merged_decoders.py [--only t5|whisper]

Per file: `convexport optimize --dtype fp16 --no-profile`, with a float32 interface and with
`--io-dtype fp16`, in a process of its own (its time and peak RSS), the bytes written, the nodes
in float16 and float32, and the error against the export's float64 result on held-out input
sets (half_precision.py's seeds, every dynamic dim 8, masks right-padded) taking each branch
(use_cache_branch false and true: two sets each), as max error / rms and rms error / rms (a
float16 interface's inputs rounded to float16 as a caller's would be: that rounding counts);
onnxconverter-common's convert_float_to_float16 (keep_io_types) beside it, the one peer that
takes a merged decoder at all (ONNX Runtime's optimizer fuses nothing inside an If).
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from convexport.load.input_domains import sized_by_running
from convexport.load.inputs import random_inputs
from convexport.load.onnx_route import graph_input_specs

SIZES = {
    # t5-base: d_model 768, 12 layers, 12 heads of 64, d_ff 3072, vocabulary 32128
    "t5": {"vocab_size": 32128, "d_model": 768, "d_kv": 64, "d_ff": 3072, "num_layers": 12, "num_heads": 12},
    # whisper-small's decoder (its encoder cut to 2 layers: only the decoders are converted here)
    "whisper": {
        "vocab_size": 51865, "d_model": 768, "encoder_layers": 2, "decoder_layers": 12,
        "encoder_attention_heads": 12, "decoder_attention_heads": 12, "encoder_ffn_dim": 3072,
        "decoder_ffn_dim": 3072, "max_source_positions": 1500, "max_target_positions": 448,
        "pad_token_id": 50257, "bos_token_id": 50257, "eos_token_id": 50257, "decoder_start_token_id": 50258,
        "suppress_tokens": [], "begin_suppress_tokens": [],
    },
}  # fmt: skip
FILES = ("decoder_model_merged.onnx", "decoder_model.onnx")

_CONVERT = """
import json, os, resource, sys, time
import convexport
began = time.perf_counter()
result = convexport.optimize(sys.argv[1], output=sys.argv[2], profile=False, dtype="fp16", io_dtype=sys.argv[3])
precision = result.report["precision"]
# VmHWM: ru_maxrss carries over the parent's peak across exec (Linux), here a float64 evaluator's
status = open("/proc/self/status").read().splitlines() if os.path.exists("/proc/self/status") else []
peak = next((int(line.split()[1]) for line in status if line.startswith("VmHWM")), None)
peak = 1024 * (peak or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
print(json.dumps({"s": time.perf_counter() - began, "peak": peak,
                  "half": precision["nodes_half"], "float32": precision["nodes_float32"],
                  "against": precision["validation"]["against"]}))
"""


def export(name: str, folder: Path) -> None:
    import torch
    from optimum.exporters.onnx import onnx_export_from_model
    from transformer_pipeline import _perturbed
    from transformers import T5Config, T5ForConditionalGeneration, WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    if name == "t5":
        model, task = T5ForConditionalGeneration(T5Config(**SIZES[name])), "text2text-generation-with-past"
    else:
        model, task = (
            WhisperForConditionalGeneration(WhisperConfig(**SIZES[name])),
            "automatic-speech-recognition-with-past",
        )
    onnx_export_from_model(_perturbed(model), output=folder, task=task, do_validation=False)


def held_out_sets(path: Path) -> list[dict]:
    """Input sets as convexport makes them up, from held-out seeds, every dynamic dim 8; a merged
    decoder's taking each branch twice."""
    from half_precision import HELD_OUT
    from transformer_pipeline import _right_padded

    model = onnx.load(str(path), load_external_data=False)
    specs = sized_by_running(onnx.load(str(path)), graph_input_specs(model))
    branches = (False, True) if any(value.name == "use_cache_branch" for value in model.graph.input) else (None,)
    sets = []
    for seed in range(2):
        for branch in branches:
            feeds = _right_padded(random_inputs(specs, seed=HELD_OUT + seed, dynamic_size=8))
            if branch is not None:
                feeds["use_cache_branch"] = np.array([branch])
            sets.append(feeds)
    return sets


def converted(path: Path, out: Path, io_dtype: str) -> dict:
    command = [sys.executable, "-c", _CONVERT, str(path), str(out), io_dtype]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        return {"failed": (run.stderr.strip().splitlines() or ["?"])[-1][:80]}
    return json.loads(run.stdout.strip().splitlines()[-1])


def written_bytes(out: Path) -> int:
    return sum(path.stat().st_size for path in out.parent.glob(out.name + "*"))


def rows_for(name: str, folder: Path) -> list[str]:
    from half_precision import _quietly, error_vs_exact
    from onnxconverter_common import float16

    from convexport.validate.float64 import Float64Evaluator

    rows = []
    for file in FILES:
        path = folder / file
        label = f"{name}/{path.stem}"
        sets = held_out_sets(path)
        evaluator = Float64Evaluator(onnx.load(str(path)))
        exact = [evaluator.run(feeds) for feeds in sets]
        del evaluator
        for io_dtype in ("fp32", "fp16"):
            tool = "convexport --dtype fp16" + (" --io-dtype fp16" if io_dtype == "fp16" else "")
            out = path.with_name(f"{path.stem}.cx16.{io_dtype}.onnx")
            made = converted(path, out, io_dtype)
            if "failed" in made:
                rows.append(f"| {label} | {tool} | no: {made['failed']} | | | | | | |")
            else:
                worst, typical = error_vs_exact(out, sets, exact)
                rows.append(
                    f"| {label} | {tool} | {made['s']:.0f} | {made['peak'] / 2**30:.2f} | "
                    f"{written_bytes(out) / path.stat().st_size:.2f}x | {made['half']} / {made['float32']} | "
                    f"{made['against']} | {worst:.2e} | {typical:.2e} |"
                )
            print(rows[-1], flush=True)
        began = time.perf_counter()
        peer = path.with_name(path.stem + ".occ16.onnx")
        try:
            loaded = onnx.load(str(path))
            model = _quietly(functools.partial(float16.convert_float_to_float16, loaded, keep_io_types=True))
            onnx.save(model, str(peer), save_as_external_data=True, location=peer.name + ".data")
            del model, loaded
            seconds = time.perf_counter() - began
            worst, typical = error_vs_exact(peer, sets, exact)
            ratio = written_bytes(peer) / path.stat().st_size
            rows.append(f"| {label} | onnxconverter-common fp16 | {seconds:.0f} | | {ratio:.2f}x | | | {worst:.2e} "
                        f"| {typical:.2e} |")  # fmt: skip
        except Exception as exc:  # the tool's own failure is the result: ONNX Runtime's reason for it
            reason = str(exc).split("failed:")[-1].strip().splitlines()[0][:100]
            rows.append(f"| {label} | onnxconverter-common fp16 | no: {reason} | | | | | | |")
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", action="append", choices=list(SIZES))
    parser.add_argument("--folder", help="keep the exports here (reused when present) rather than in a temporary one")
    parser.add_argument("--write")
    args = parser.parse_args()
    rows = ["| file | tool | s | peak RSS GiB | written / input | nodes float16 / float32 | judged against | "
            "max error / rms | rms error / rms |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.only or list(SIZES):
            folder = Path(args.folder or scratch) / name
            if not (folder / FILES[0]).exists():
                export(name, folder)
            rows += rows_for(name, folder)
    table = "\n".join(rows)
    print(table)
    if args.write:
        Path(args.write).write_text(table + "\n")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    sys.exit(main())
