"""The cost model's device constants, fitted to measured latencies (rewrite/cost.py's Device).

    python bench/device_constants.py measure --device cuda --out DIR   # on the device
    python bench/device_constants.py fit DIR/points.json                # anywhere

`measure` times graphs on ONNX Runtime's provider for the device (IO binding on CUDA, each
graph warmed until its run time settles, as profile/profiler.py does) and writes, per graph, the sums
the cost model's time is made of as it counts them (cost.terms: FLOPs, bytes moved by
compute ops and by copy ops, nodes run) beside the median latency. The graphs: synthetic
sweeps that pull the terms apart (chains of elementwise ops: the time per node; large
elementwise ops and transposes: bytes; convolutions and matrix products of growing size:
FLOPs), and the sample models before and after convexport at batch 1 and 32. With
`--seed003` it also times seed 003's 135x135 conv three ways: cuDNN's direct conv, the ONNX
DFT graph convexport builds (DFT has no CUDA kernel: it runs on the CPU), and a graph of
com.microsoft Rfft/Irfft (which the CUDA provider runs), checked against the direct conv.

`fit` solves latency = flops/F + large_kernel_flops/L + bytes/B + copy_bytes/C + nodes*t + r
for F, L, B, C, t, r >= 0 by
least squares on relative errors (each point weighted by 1/latency), over the points without
ops the device leaves to the CPU, and prints the constants and each point's estimate against
its measurement. Run `measure` again on a new device or ORT version and paste the constants
into rewrite/cost.py with the run's numbers in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from convexport import ir  # noqa: E402
from convexport.load.onnx_route import graph_input_specs  # noqa: E402
from convexport.load.inputs import random_inputs  # noqa: E402
from convexport.profile.profiler import time_models  # noqa: E402
from convexport.rewrite import cost  # noqa: E402

SAMPLES = ["seed000_subtracted_conv", "seed001_bottleneck3d", "seed002_group_attention", "seed004_full_padding"]
TIME_EACH_S = 0.3


def model_of(nodes, inputs, outputs, weights) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=ir.IR_VERSION)
    return onnx.shape_inference.infer_shapes(model)


def value(name, shape):
    return helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape)


def elementwise_chain(length: int, elements: int) -> onnx.ModelProto:
    """x -> (Add 1, Mul 0.5) alternately, `length` nodes, on `elements` floats."""
    nodes, x = [], "x"
    for i in range(length):
        op, constant = ("Add", "one") if i % 2 == 0 else ("Mul", "half")
        nodes.append(helper.make_node(op, [x, constant], [f"t{i}"]))
        x = f"t{i}"
    weights = {"one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32)}
    return model_of(nodes, [value("x", [1, elements])], [value(x, [1, elements])], weights)


def transposes(length: int, side: int) -> onnx.ModelProto:
    """x [side, side] transposed `length` times (a copy op: bytes at the copy rate)."""
    nodes, x = [], "x"
    for i in range(length):
        nodes.append(helper.make_node("Transpose", [x], [f"t{i}"], perm=[1, 0]))
        x = f"t{i}"
    return model_of(nodes, [value("x", [side, side])], [value(x, [side, side])], {})


def conv(channels: int, size: int, kernel: int, batch: int = 1) -> onnx.ModelProto:
    weights = {"w": np.random.default_rng(0).standard_normal((channels, channels, kernel, kernel)).astype(np.float32)}
    pad = kernel // 2
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[pad] * 4)]
    shape = [batch, channels, size, size]
    return model_of(nodes, [value("x", shape)], [value("y", shape)], weights)


def matmul(rows: int, inner: int, columns: int) -> onnx.ModelProto:
    weights = {"w": np.random.default_rng(0).standard_normal((inner, columns)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    return model_of(nodes, [value("x", [rows, inner])], [value("y", [rows, columns])], weights)


def sweep() -> dict[str, onnx.ModelProto]:
    graphs = {}
    for length in (1, 4, 16, 64):
        for elements in (1 << 10, 1 << 16, 1 << 20, 1 << 23):
            graphs[f"chain{length}x{elements}"] = elementwise_chain(length, elements)
    for length in (1, 8):
        for side in (256, 1024, 4096):
            graphs[f"transpose{length}x{side}"] = transposes(length, side)
    for channels in (16, 64, 256):
        for size in (14, 56):
            for kernel in (1, 3):
                graphs[f"conv{channels}c{size}s{kernel}k"] = conv(channels, size, kernel)
    for side in (256, 1024, 4096):
        graphs[f"matmul{side}"] = matmul(side, side, side)
    for kernel in (3, 5, 7, 9, 11, 15, 21, 31, 45, 63):  # where the conv's FLOP rate falls off
        graphs[f"kernel{kernel}"] = conv(16, 128, kernel)
    return graphs


def sample_models(batches=(1, 32)) -> dict[str, onnx.ModelProto]:
    """Each sample model as exported and as convexport leaves it, at each batch size."""
    import convexport

    graphs = {}
    for name in SAMPLES:
        path = ROOT / "sample_models" / f"{name}.py"
        for batch in batches:
            first = convexport.optimize(str(path), write=False, validate=False, profile=False)
            spec = first.report["inputs"][0]
            dims = spec.split(":")[1].split("x")
            result = first if int(dims[0]) == batch else convexport.optimize(
                str(path), inputs=[f"{spec.split(':')[0]}:{'x'.join([str(batch), *dims[1:]])}"],
                write=False, validate=False, profile=False)
            graphs[f"{name}.b{batch}.original"] = result.original
            graphs[f"{name}.b{batch}.convexport"] = result.model
    return graphs


def point(name: str, model: onnx.ModelProto, device: str) -> dict:
    specs = graph_input_specs(model)
    feeds = random_inputs(specs, seed=0)
    timed = time_models({"g": model}, feeds, device, TIME_EACH_S)
    terms = cost.terms(ir.import_graph(model).nodes, cost.DEVICES[device])
    return {"name": name, **terms, "latency_ms": timed["g"], "runs": timed["runs"]}


def seed003_three_ways(device: str) -> dict:
    """Seed 003's Conv2d(1, 3, 135) (valid padding, batch 2 of 321x481) as cuDNN's direct conv,
    as convexport's ONNX DFT graph, and as com.microsoft Rfft/Irfft, timed side by side; the
    Rfft graph's output checked against the direct conv's."""
    import convexport

    path = ROOT / "sample_models" / "seed003_large_kernel.py"
    original = convexport.optimize(str(path), write=False, validate=False, profile=False).original
    with_dft = convexport.optimize(str(path), write=False, validate=False, profile=False, strategy="all").model
    graphs = {"direct": original, "onnx_dft": with_dft, "rfft": _rfft_conv(original)}
    feeds = random_inputs(graph_input_specs(original), seed=0)
    result = {"ops": {k: sorted({n.op_type for n in g.graph.node}) for k, g in graphs.items()}}
    from convexport.runtime import create_session

    outputs = {}
    for label, graph in graphs.items():
        try:
            session = create_session(graph, device, what=label)
            outputs[label] = session.run(None, feeds)[0]
            result[label] = {"latency_ms": time_models({label: graph}, feeds, device, 1.0)[label],
                             "providers": session.get_providers()}
        except Exception as exc:  # noqa: BLE001 (each way is reported, whatever fails)
            result[label] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    if "direct" in outputs:
        for label in ("onnx_dft", "rfft"):
            if label in outputs and outputs[label].shape == outputs["direct"].shape:
                want, got = outputs["direct"].astype(np.float64), outputs[label].astype(np.float64)
                ratio = float(np.nanmedian(got / np.where(np.abs(want) > 1e-3, want, np.nan)))
                result[label]["max_rel_error"] = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
                result[label]["median_ratio"] = ratio
    return result


def _rfft_conv(original: onnx.ModelProto) -> onnx.ModelProto:
    """The graph's one Conv (cross-correlation, no padding, one input channel) in the frequency
    domain with com.microsoft Rfft/Irfft over both spatial axes: the input padded to even sizes
    N1 x N2 >= its own, X = Rfft(x), Y_o = X * conj(W_o) per output channel, y = Irfft(Y)
    cropped to the valid outputs (wrap-around reaches only the last K - 1 rows and columns)."""
    conv_node = next(n for n in original.graph.node if n.op_type == "Conv")
    weight = numpy_helper.to_array(next(i for i in original.graph.initializer if i.name == conv_node.input[1]))
    x = original.graph.input[0]
    batch, channels, height, width = [d.dim_value for d in x.type.tensor_type.shape.dim]
    out_channels, _, kh, kw = weight.shape
    n1, n2 = height + height % 2, width + width % 2
    padded = np.zeros((out_channels, 1, n1, n2))
    padded[:, :, :kh, :kw] = weight
    spectrum = np.conj(np.fft.rfftn(padded, axes=(2, 3)))[..., None]  # [O, 1, N1, N2/2+1, 1]
    weights = {
        "k_real": spectrum.real.reshape(1, out_channels, n1, n2 // 2 + 1, 1).astype(np.float32),
        "k_imag": spectrum.imag.reshape(1, out_channels, n1, n2 // 2 + 1, 1).astype(np.float32),
        "pads": np.array([0, 0, 0, 0, 0, 0, n1 - height, n2 - width], np.int64),
        "split": np.array([1, 1], np.int64),
        "starts": np.array([0, 0], np.int64),
        "ends": np.array([height - kh + 1, width - kw + 1], np.int64),
        "axes": np.array([2, 3], np.int64),
    }
    if conv_node.input[2:] and conv_node.input[2]:
        bias = numpy_helper.to_array(next(i for i in original.graph.initializer if i.name == conv_node.input[2]))
        weights["bias"] = bias.reshape(1, -1, 1, 1).astype(np.float32)
    ms = "com.microsoft"
    nodes = [
        helper.make_node("Pad", [x.name, "pads"], ["xp"]),
        helper.make_node("Rfft", ["xp"], ["X"], domain=ms, signal_ndim=2, onesided=1, normalized=0),
        helper.make_node("Unsqueeze", ["X", "one_axis"], ["X1"]),
        helper.make_node("Split", ["X1", "split"], ["xr", "xi"], axis=-1),
        helper.make_node("Mul", ["xr", "k_real"], ["rr"]), helper.make_node("Mul", ["xi", "k_imag"], ["ii"]),
        helper.make_node("Mul", ["xr", "k_imag"], ["ri"]), helper.make_node("Mul", ["xi", "k_real"], ["ir"]),
        helper.make_node("Sub", ["rr", "ii"], ["yr"]), helper.make_node("Add", ["ri", "ir"], ["yi"]),
        helper.make_node("Concat", ["yr", "yi"], ["Y1"], axis=-1),
        helper.make_node("Squeeze", ["Y1", "one_axis"], ["Y"]),
        helper.make_node("Irfft", ["Y"], ["yfull"], domain=ms, signal_ndim=2, onesided=1, normalized=0),
        helper.make_node("Slice", ["yfull", "starts", "ends", "axes"], ["yc" if "bias" in weights else "y"]),
    ]
    weights["one_axis"] = np.array([1], np.int64)
    if "bias" in weights:
        nodes.append(helper.make_node("Add", ["yc", "bias"], ["y"]))
    out = [value("y", [batch, out_channels, height - kh + 1, width - kw + 1])]
    graph = helper.make_graph(nodes, "rfft_conv", [x], out, [numpy_helper.from_array(v, k) for k, v in weights.items()])
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid(ms, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=ir.IR_VERSION)


def measure(device: str, out: Path, with_samples: bool, with_seed003: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    points, began = [], time.time()
    graphs = sweep()
    if with_samples:
        graphs.update(sample_models())
    for name, model in graphs.items():
        try:
            points.append(point(name, model, device))
        except Exception as exc:  # noqa: BLE001 (a graph that fails is left out, said)
            print(f"{name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            continue
        print(json.dumps(points[-1]), flush=True)
        (out / "points.json").write_text(json.dumps({"device": device, "points": points}, indent=1))
    if with_seed003:
        result = seed003_three_ways(device)
        print(json.dumps(result), flush=True)
        (out / "seed003.json").write_text(json.dumps(result, indent=1))
    print(f"measured {len(points)} graphs in {time.time() - began:.0f} s", flush=True)


def fit(paths: list[Path]) -> None:
    points = [p for path in paths for p in json.loads(path.read_text())["points"] if not p["host_nodes"]]
    columns = ["flops", "large_kernel_flops", "bytes", "copy_bytes", "nodes"]
    # and a time per run, whatever the graph (launching the run, synchronising at its end):
    # the same before and after a rewrite, so no decision needs it, but a fit without it
    # loads it onto the other terms
    design = np.array([[p.get(c, 0.0) for c in columns] + [1.0] for p in points], float)
    latency = np.array([p["latency_ms"] / 1e3 for p in points])
    weight = 1.0 / latency
    coefficients = _nonnegative_least_squares(design * weight[:, None], latency * weight)
    rates = {f"{column}_per_s": 1 / c if c > 0 else math.inf for column, c in zip(columns[:4], coefficients)}
    rates.update(seconds_per_node=coefficients[4], seconds_per_run=coefficients[5])
    print(json.dumps({k: float(f"{v:.3g}") for k, v in rates.items()}))
    predicted = design @ coefficients
    for p, estimate in zip(points, predicted):
        print(f"{p['name']:42} measured {p['latency_ms']:9.4f} ms  estimated {estimate * 1e3:9.4f} ms  "
              f"x{estimate * 1e3 / p['latency_ms']:.2f}")
    errors = np.abs(np.log(predicted / latency))
    print(f"median |log error| {np.median(errors):.2f} (x{math.exp(np.median(errors)):.2f}), "
          f"90th percentile x{math.exp(np.percentile(errors, 90)):.2f}, over {len(points)} graphs")
    estimates = {p["name"]: e for p, e in zip(points, predicted)}
    measured = {p["name"]: p["latency_ms"] for p in points}
    pairs = [(name, name.replace(".original", ".convexport")) for name in measured if name.endswith(".original")]
    pairs = [(a, b) for a, b in pairs if b in measured]
    agree = sum((measured[a] > measured[b]) == (estimates[a] > estimates[b]) for a, b in pairs)
    print(f"the fitted model orders {agree} of {len(pairs)} before/after pairs as measured")


def _nonnegative_least_squares(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min |a x - b| for x >= 0 (Lawson-Hanson's active set, enough for four unknowns)."""
    free = list(range(a.shape[1]))
    while True:
        x = np.zeros(a.shape[1])
        x[free] = np.linalg.lstsq(a[:, free], b, rcond=None)[0]
        negative = [i for i in free if x[i] < 0]
        if not negative:
            return x
        free.remove(min(negative, key=lambda i: x[i]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    measuring = commands.add_parser("measure")
    measuring.add_argument("--device", default="cuda")
    measuring.add_argument("--out", type=Path, default=Path("device_points"))
    measuring.add_argument("--no-samples", action="store_true")
    measuring.add_argument("--seed003", action="store_true")
    fitting = commands.add_parser("fit")
    fitting.add_argument("points", type=Path, nargs="+")
    args = parser.parse_args()
    if args.command == "measure":
        measure(args.device, args.out, not args.no_samples, args.seed003)
    else:
        fit(args.points)


if __name__ == "__main__":
    main()
