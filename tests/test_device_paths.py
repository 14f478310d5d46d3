"""The CUDA paths, run here without a GPU by standing the CPU provider in for it: validation on
the target device (original and optimized with TF32 off, TF32's own effect reported), and the
cost model's units (a decision does not change with the batch size alone)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx import numpy_helper
from rich.console import Console

import convexport
from convexport import ir
from convexport.profile import profiler as profile
from convexport.validate import compare as validate
from convexport.validate import runs as validation_runs
from convexport.rewrite import cost
from convexport.report.sections import print_optimize_summary, render
from convexport.runtime import create_session
from graphs import rewrite
from test_hostile import conv_bn


class Skewed:
    """A session whose outputs are off by `offset` (a device kernel that is wrong)."""

    def __init__(self, session, offset: float):
        self.session, self.offset = session, offset

    def get_outputs(self):
        return self.session.get_outputs()

    def run(self, names, feeds):
        return [value + self.offset for value in self.session.run(names, feeds)]


@pytest.fixture
def on_fake_cuda(monkeypatch):
    """optimize() believes it runs on CUDA; sessions for "cuda" are CPU sessions, recorded as
    (device, tf32, what), the optimized graph's skewed by `skew["cuda"]` there where it is set.
    The profile runs them as the CPU's (no IO binding, no device memory to read)."""
    made, skew = [], {"cuda": 0.0}

    def session(model, device="cpu", optimize=True, profile_path=None, what="the model", tf32=True, search=True,
                prepack=True, threads=None):  # fmt: skip
        made.append((device, tf32, what))
        real = create_session(model, "cpu", optimize, profile_path, what, tf32, prepack=prepack, threads=threads)
        optimized = model.graph.node[0].op_type == "Conv" and len(model.graph.node) == 1
        return Skewed(real, skew["cuda"]) if device == "cuda" and optimized and skew["cuda"] else real

    runner = profile.session_runner
    monkeypatch.setattr("convexport.stages.request.resolve_device", lambda device: "cuda")
    monkeypatch.setattr(validate, "create_session", session)  # TF32's effect
    monkeypatch.setattr(validation_runs, "create_session", session)  # validation's runs
    monkeypatch.setattr(profile, "create_session", session)
    monkeypatch.setattr(profile, "session_runner", lambda session, feeds, device: runner(session, feeds, "cpu"))
    monkeypatch.setattr(profile, "device_memory_used", lambda: 0)
    return made, skew


def test_the_optimized_graph_is_also_validated_on_the_device(on_fake_cuda):
    made, _ = on_fake_cuda
    report = convexport.optimize(conv_bn(), write=False, profile=False).report
    on_device = report["validation"]["on_device"]
    assert on_device["passed"] and on_device["provider"] == "CUDAExecutionProvider" and on_device["tf32"] is False
    assert set(on_device["tf32_effect"]) == {"y"}
    cuda_sessions = [(device, tf32) for device, tf32, _ in made if device == "cuda"]
    # original and optimized with TF32 off, then the optimized with TF32 on, once: TF32's effect
    # is read against the TF32-off session's outputs (each CUDA session's first run builds cuDNN's plans)
    assert cuda_sessions == [("cuda", False), ("cuda", False), ("cuda", True)]
    assert ("cpu", False, "the optimized graph") in made  # the CPU check stays the reference


def test_tf32s_effect_is_read_on_the_profiles_session(on_fake_cuda):
    """Profiled on the device, the optimized graph's TF32-on session is the profile's (ORT's
    default options, as deployed): four CUDA sessions, not five (each first run builds every
    convolution's cuDNN plan: seconds on a real model)."""
    made, _ = on_fake_cuda
    report = convexport.optimize(conv_bn(), write=False).report
    on_device = report["validation"]["on_device"]
    assert set(on_device["tf32_effect"]) == {"y"} and on_device["tf32_effect_options"]["use_tf32"] == "1"
    cuda_sessions = [(tf32, what) for device, tf32, what in made if device == "cuda"]
    assert [tf32 for tf32, _ in cuda_sessions] == [False, False, True, True]
    assert all("profiled" in what for _, what in cuda_sessions[2:])
    assert report["profile"]["provider"] == "CUDAExecutionProvider"
    console = Console(record=True, width=300)
    print_optimize_summary(report, console)
    worst = on_device["tf32_effect"]["y"]["max_rel"]
    assert (f"on CUDAExecutionProvider (TF32 off): passed, max rel difference "
            f"{on_device['outputs']['y']['max_rel']:.3g} from the original there; TF32 on (ORT's default) moves the "
            f"outputs by up to {worst:.3g} relative") in console.export_text()
    page = render(report)
    assert "<h3>On CUDAExecutionProvider</h3>" in page and f"<td class=num>{worst:.3g}</td></tr>" in page


def test_tf32s_effect_without_a_profile_takes_a_session_with_the_deployments_options(on_fake_cuda, monkeypatch):
    made, _ = on_fake_cuda
    options = []
    real = validate.create_session
    monkeypatch.setattr(validate, "create_session", lambda *a, **k: options.append(k) or real(*a, **k))
    on_device = convexport.optimize(conv_bn(), write=False, profile=False).report["validation"]["on_device"]
    assert set(on_device["tf32_effect"]) == {"y"}
    tf32_session = options[-1]
    assert tf32_session == {"what": "the optimized graph with TF32 on"}  # create_session's defaults: ORT's own


def test_a_graph_that_differs_on_the_device_only_is_refused_there(on_fake_cuda):
    _, skew = on_fake_cuda
    skew["cuda"] = 1e-2
    with pytest.raises(convexport.ValidationError, match="on CUDAExecutionProvider .TF32 off.") as failed:
        convexport.optimize(conv_bn(), write=False, profile=False)
    validation = failed.value.report["validation"]
    assert not validation["passed"] and not validation["on_device"]["passed"]
    assert all(error["mismatches"] == 0 for error in validation["outputs"].values())  # the CPU check passed
    assert validation["culprit"]["rule"] == "conv-batchnorm"  # found by the device's check


# --- the cost model's unit ----------------------------------------------------------------------


def two_convs(batch: int, cin, cmid, cout, k1, k2, hw, seed) -> onnx.ModelProto:
    """x -> Conv k1 (cin -> cmid, unpadded) -> Conv k2 (cmid -> cout, 'same'), weights drawn from `seed`."""
    rng = np.random.default_rng(seed)
    weights = {"w1": rng.standard_normal((cmid, cin, k1, k1)), "w2": rng.standard_normal((cout, cmid, k2, k2))}
    model = onnx.parser.parse_model(f"""
        <ir_version: 10, opset_import: ["" : 18]>
        g (float[{batch},{cin},{hw},{hw}] x) => (float[{batch},{cout},{hw - k1 + 1},{hw - k1 + 1}] y) {{
            h = Conv (x, w1)
            y = Conv <pads = [{k2 // 2}, {k2 // 2}, {k2 // 2}, {k2 // 2}]> (h, w2)
        }}
    """)
    model.graph.initializer.extend(numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items())
    return onnx.shape_inference.infer_shapes(model)


CONFIGURATIONS = [
    dict(cin=int(c), cmid=int(m), cout=int(o), k1=int(k1), k2=int(k2), hw=int(hw), seed=i)
    for i, (c, m, o, k1, k2, hw) in enumerate(zip(*(np.random.default_rng(7).integers(low, high, 40) for low, high in
                                                     ((1, 64), (1, 128), (1, 64), (1, 4), (1, 6), (4, 40)))))
    if k1 % 2 and k2 % 2
]


@pytest.mark.parametrize("config", CONFIGURATIONS, ids=lambda c: "-".join(map(str, c.values())))
def test_a_rewrites_counts_are_whole_tensors_at_any_batch(config):
    """The folds' own FLOP counts are in the cost model's unit: the whole batch (32 times the
    batch-1 count), the same as the nodes' own counts, which the bytes moved are counted in."""
    counts = {}
    for batch in (1, 32):
        outcome = rewrite(two_convs(batch, **config), "all")
        counts[batch] = [(entry["rule"], entry.get("flops_before"), entry.get("flops_after")) for entry in outcome.applied]
    assert [rule for rule, *_ in counts[1]] == [rule for rule, *_ in counts[32]]
    counted = [(one, many) for one, many in zip(counts[1], counts[32]) if one[1] is not None]
    assert counted or not counts[1]  # the conv folds give their counts
    for (_, before1, after1), (_, before32, after32) in counted:
        assert before32 == pytest.approx(32 * before1) and after32 == pytest.approx(32 * after1)


@pytest.mark.parametrize("config", CONFIGURATIONS, ids=lambda c: "-".join(map(str, c.values())))
def test_a_decision_does_not_change_with_the_batch_alone(config, monkeypatch):
    """Where every cost grows with the batch (no time per node, weights too small to count),
    the decision at batch 32 is the decision at batch 1: a count in another unit than the
    bytes (the folds counted per sample) flipped such decisions."""
    device = cost.Device("cpu", flops_per_s=80e9, bytes_per_s=4e9, seconds_per_node=0.0, copy_bytes_per_s=20e9)
    monkeypatch.setitem(cost.DEVICES, "cpu", device)
    monkeypatch.setattr(cost, "_bytes", lambda t, node, replaced: 0.0 if isinstance(t, ir.Constant) else real_bytes(t, node, replaced))
    decisions = [[entry["rule"] for entry in rewrite(two_convs(batch, **config), "cost").applied] for batch in (1, 32)]
    assert decisions[0] == decisions[1]


real_bytes = cost._bytes


def test_an_unknown_dim_after_a_flatten_counts_the_elements_it_holds():
    """Flatten of [N, 64, 256] is [N*64, 256], which shape inference leaves unknown: the
    BatchNormalization after it moves 64 x 256 values per image, not 256 (an unknown dim
    counted as 1 made LeViT's Linear_BN fold look slower than the BN it removes)."""
    model = ir.infer_shapes(onnx.parser.parse_model("""
    <ir_version: 10, opset_import: ["" : 18]>
    g (float[N, 64, 256] x, float[256] s, float[256] b, float[256] m, float[256] v) => (float[M, 256] y) {
      f = Flatten<axis = 2>(x)
      y = BatchNormalization(f, s, b, m, v)
    }"""), "m.onnx", forget_unknown_dims=True)
    graph = ir.import_graph(model)
    flatten, norm = graph.nodes
    assert not isinstance(norm.inputs[0].shape[0], int)  # inference gives a made-up symbol
    (work,) = cost.node_work([norm], cost.CPU, {})
    assert work.bytes >= 2 * 64 * 256 * 4  # read and written once per element of one image
