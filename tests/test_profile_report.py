"""Profiling on the CPU provider and the HTML report."""

from __future__ import annotations

import json
import time

import onnx
import onnx.parser
import pytest
from rich.console import Console
from typer.testing import CliRunner

import convexport
from convexport.cli import app
from convexport.load.onnx_route import graph_input_specs
from convexport.profile import paired_timer, profiler as profile
from convexport.profile.profiler import TimingSettings, profile_models
from convexport.report.sections import print_optimize_summary, render


@pytest.fixture(scope="module")
def optimized(small_net_path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("profiled")
    return convexport.optimize(f"{small_net_path}:build", output=folder / "o.onnx", device="cpu")


def test_profile_numbers_are_positive_and_consistent(optimized):
    profile = optimized.report["profile"]
    assert profile["provider"] == "CPUExecutionProvider" and profile["runs"] >= 10 and profile["batch"] == 1
    for side in ("before", "after"):
        entry = profile[side]
        latency = entry["latency_ms"]
        assert 0 < latency["min"] <= latency["median"] <= latency["p90"]
        assert entry["throughput_per_s"] == pytest.approx(1e3 / latency["median"])
        assert entry["peak_memory_bytes"] > 0 and entry["peak_rss_bytes"] > entry["peak_memory_bytes"]
        assert entry["op_time_ms"]["Conv"] > 0 and all(ms >= 0 for ms in entry["op_time_ms"].values())
    low, high = profile["speedup_interval"]
    assert low <= profile["speedup"] <= high and profile["speedup"] == profile["paired"]["speedup"]
    assert profile["paired"]["pairs"] >= paired_timer.MIN_PAIRS and profile["threads"] is None
    assert profile["memory_ratio"] > 0


def test_profile_runs_and_blocks(optimized):
    model = optimized.model
    measured = profile_models({"a": model, "b": model}, graph_input_specs(model), "cpu",
                              TimingSettings(runs=13, warmup=1, memory=False, per_op=False))
    assert measured["runs"] >= 13 and measured["paired"]["stopped"] == "runs" and "op_time_ms" not in measured["a"]


class SlowStart:
    """A session whose first runs carry one-off work (cuDNN's algorithm search): `slow` runs of
    `first` seconds, then runs of `then` seconds."""

    def __init__(self, slow: int, first: float, then: float):
        self.left, self.first, self.then, self.runs = slow, first, then, 0

    def __call__(self):
        self.runs += 1
        pause = self.first if self.left > 0 else self.then
        self.left -= 1
        deadline = time.perf_counter() + pause
        while time.perf_counter() < deadline:
            pass


def test_the_warm_up_lasts_until_the_run_time_settles():
    run = SlowStart(slow=4, first=0.02, then=0.001)
    times = profile.warm_up(run, least=3)
    assert len(times) >= 4 + profile.WARM_WINDOW and max(times[-profile.WARM_WINDOW:]) < 0.01


def test_the_runs_are_sized_from_the_settled_time_not_the_first(monkeypatch):
    """A model whose first run takes 50x its settled time is timed as often as the budget allows
    at its settled time (before: sized from the slowest warm-up run, 5 runs of +-22%)."""
    monkeypatch.setattr(profile, "create_session", lambda model, device, profile_path=None, what="", threads=None: model)
    monkeypatch.setattr(profile, "session_runner", lambda session, feeds, device: session)
    slow = SlowStart(slow=1, first=0.05, then=0.001)
    measured = profile.profile_models({"m": slow}, [], "cpu", profile.TimingSettings(memory=False, per_op=False))
    assert measured["runs"] >= paired_timer.MIN_PAIRS * paired_timer.block_size(0.001) and measured["m"]["warmup_runs"] >= 2 * profile.WARM_WINDOW
    assert measured["m"]["latency_ms"]["median"] < 5


def test_a_first_run_longer_than_the_warm_up_budget_does_not_size_the_runs(monkeypatch):
    """cuDNN's exhaustive search made mobileone's first run on an H200 last longer than the
    warm-up's budget: the runs were sized from it (5 runs) until the first run stopped counting."""
    monkeypatch.setattr(profile, "create_session", lambda model, device, profile_path=None, what="", threads=None: model)
    monkeypatch.setattr(profile, "session_runner", lambda session, feeds, device: session)
    monkeypatch.setattr(profile, "WARM_BUDGET_S", 0.1)
    slow = SlowStart(slow=1, first=0.3, then=0.001)
    measured = profile.profile_models({"m": slow}, [], "cpu", profile.TimingSettings(memory=False, per_op=False))
    assert measured["runs"] >= paired_timer.MIN_PAIRS * paired_timer.block_size(0.001) and measured["m"]["warmup_runs"] >= 1 + 2 * profile.WARM_WINDOW


@pytest.mark.parametrize("large", [False, True], ids=["side by side", "one at a time"])
def test_after_timing_gets_each_session_once_timed_and_before_it_is_released(monkeypatch, large):
    """TF32's effect on CUDA is read on the profile's session of the optimized graph: the hook
    gets that model's own session after its timed runs."""
    sessions = {label: SlowStart(slow=0, first=0.0, then=0.0005) for label in ("before", "after")}
    models = {label: onnx.helper.make_model(onnx.helper.make_graph([], label, [], [])) for label in sessions}
    monkeypatch.setattr(profile, "create_session", lambda model, device, profile_path=None, what="", threads=None: sessions[model.graph.name])
    monkeypatch.setattr(profile, "session_runner", lambda session, feeds, device: session)
    monkeypatch.setattr(profile, "kept_from_serialisation", lambda model: large)
    monkeypatch.setattr(paired_timer, "TIMED_BUDGET_S", 0.05)
    seen = []

    def then(session):
        seen.append((session, session.runs))

    measured = profile.profile_models(models, [], "cpu", profile.TimingSettings(memory=False, per_op=False), after_timing={"after": then})
    assert [session for session, _ in seen] == [sessions["after"]]
    timed_runs = seen[0][1] - measured["after"]["warmup_runs"]
    assert timed_runs >= measured["runs"]  # handed over after its timed runs (and blocks' settling runs)
    assert measured.get("one_at_a_time", False) == large


class ProfiledSession:
    """A session whose runs take `profiled` seconds while ORT's profiler is on (until
    end_profiling) and `plain` seconds after; its first run takes `first` (the search). Each run
    makes one Conv kernel event as long as the run, in microseconds as ORT writes them."""

    def __init__(self, folder, first: float, profiled: float, plain: float):
        self.folder, self.first, self.profiled, self.plain = folder, first, profiled, plain
        self.events, self.profiling, self.clock = [], True, 0

    def run(self):
        pause = self.first if not self.events else self.profiled if self.profiling else self.plain
        if self.profiling:
            self.events.append({"cat": "Session", "name": "model_run", "ts": self.clock, "dur": pause * 1e6})
            self.events.append({"cat": "Node", "name": "c_kernel_time", "ts": self.clock + 1, "dur": pause * 1e6 - 2,
                                "args": {"op_name": "Conv"}})
            self.clock += int(pause * 1e6) + 10
        SlowStart(slow=0, first=0, then=pause)()

    def end_profiling(self):
        self.profiling = False
        path = self.folder / "events.json"
        path.write_text(json.dumps(self.events))
        return str(path)


def test_no_warm_up_or_timed_run_carries_the_profiler(monkeypatch, tmp_path):
    """The per-op pass follows the first run and profiling ends before the warm-up: the settled
    time that sizes the runs, and the latency, are the unprofiled run time (before: mobileone's
    warm-up on an H200 settled at its profiled 10.2 ms, not its 3.9 ms), and the per-op times
    leave out the first run's search and the lead runs."""
    session = ProfiledSession(tmp_path, first=0.05, profiled=0.004, plain=0.001)
    monkeypatch.setattr(profile, "create_session", lambda model, device, profile_path=None, what="", threads=None: session)
    monkeypatch.setattr(profile, "session_runner", lambda session, feeds, device: session.run)
    monkeypatch.setattr(paired_timer, "TIMED_BUDGET_S", 0.2)
    model = onnx.parser.parse_model("<ir_version: 10, opset_import: [\"\" : 18]> g (float[1] x) => (float[1] y) { y = Relu(x) }")
    result = profile.profile_models({"m": model}, [], "cpu", profile.TimingSettings(memory=False))
    measured = result["m"]
    assert result["runs"] >= paired_timer.MIN_PAIRS * paired_timer.block_size(0.001)  # blocks sized from the plain 1 ms, not 4
    assert measured["latency_ms"]["median"] < 2.5 and measured["op_time_ms"]["Conv"] == pytest.approx(4, rel=0.01)
    # the per-op times are read against the profiled runs they come from, not the plain latency
    assert measured["profiled_run_ms"] == pytest.approx(4, rel=0.01) and measured["op_times_trusted"]
    assert measured["phases_s"]["first_run"] >= 0.05


def ort_events(run_windows, kernels):
    """A profiler's events: model_run (start, duration) per run, and (op, start, duration) kernels."""
    events = [{"cat": "Session", "name": "model_run", "ts": start, "dur": length} for start, length in run_windows]
    events += [{"cat": "Node", "name": f"n{i}_kernel_time", "ts": start, "dur": length, "args": {"op_name": op}}
               for i, (op, start, length) in enumerate(kernels)]
    return events


def test_per_op_times_leave_out_the_warm_up_runs():
    events = ort_events([(0, 1000), (2000, 100), (3000, 100)],
                        [("Conv", 10, 900), ("Conv", 2010, 80), ("Relu", 2095, 5), ("Conv", 3010, 80), ("Relu", 3095, 5)])
    model = onnx.parser.parse_model("<ir_version: 10, opset_import: [\"\" : 18]> g (float[1] x) => (float[1] y) { y = Relu(x) }")
    times = profile.op_times(events, skip_runs=1, model=model)
    assert times == {"Conv": pytest.approx(0.08), "Relu": pytest.approx(0.005)}


@pytest.mark.parametrize("total, median, trusted", [(0.95, 1.0, True), (1.08, 1.0, True), (1.19, 1.0, False),
                                                    (0.58, 0.12, False), (131.0, 0.77, False), (0.5, 1.0, False)])
def test_per_op_times_are_trusted_only_where_they_sum_to_the_profiled_run(total, median, trusted):
    check = profile._op_time_check({"Conv": total}, median)
    assert check["op_times_trusted"] is trusted and check["op_time_coverage"] == pytest.approx(total / median)


def test_per_op_times_on_cuda_are_never_trusted_as_time():
    """ORT times a CUDA kernel's launch on the host: however well they add up, they are not charted."""
    assert profile._op_time_check({"Conv": 1.0}, 1.0, "cuda")["op_times_trusted"] is False


def test_each_nodes_time_is_its_median_over_the_runs():
    """One run slowed by the machine (the Conv's 900 us in the second run) does not move the
    Conv's time: each node's median over the runs, then summed by op type."""
    events = ort_events([(0, 1000), (2000, 1000), (4000, 100)],
                        [("Conv", 10, 80), ("Relu", 95, 5), ("Conv", 2010, 900), ("Relu", 2915, 5),
                         ("Conv", 4010, 80), ("Relu", 4095, 5)])
    events = [dict(e, name="conv_kernel_time") if e.get("args", {}).get("op_name") == "Conv" else
              dict(e, name="relu_kernel_time") if "args" in e else e for e in events]
    model = onnx.parser.parse_model("<ir_version: 10, opset_import: [\"\" : 18]> g (float[1] x) => (float[1] y) { y = Relu(x) }")
    assert profile.op_times(events, skip_runs=0, model=model) == {"Conv": pytest.approx(0.08), "Relu": pytest.approx(0.005)}


def test_per_op_times_of_a_real_profile_sum_to_its_latency(optimized):
    entry = optimized.report["profile"]["after"]
    assert entry["op_time_coverage"] > 0 and entry["op_times_trusted"] == (abs(entry["op_time_coverage"] - 1) <= 0.1)
    assert optimized.report["profile"]["provider_options"] == {}


@pytest.mark.parametrize("before, after, shown", [(10.1, 1.6, True), (0.01, 0.6, True), (0.3, 0.2, False)])
def test_a_long_first_run_is_told_before_and_after(optimized, before, after, shown):
    """mobileone_s0 on an H100: its first run took 10.1 s (cuDNN sets up each of its convolutions),
    1.6 s after convexport; every session a deployment opens pays it."""
    report = json.loads(json.dumps(optimized.report))
    report["profile"]["before"]["phases_s"]["first_run"] = before
    report["profile"]["after"]["phases_s"]["first_run"] = after
    console = Console(record=True, width=300)
    print_optimize_summary(report, console)
    assert (f"first run: {before:.1f} s -> {after:.1f} s" in console.export_text()) is shown


def test_untrusted_per_op_times_are_not_charted(optimized):
    report = json.loads(json.dumps(optimized.report))
    for side in ("before", "after"):
        report["profile"][side]["op_times_trusted"] = False
        report["profile"][side]["op_time_coverage"] = 4.0
    page = render(report)
    assert "Time per op type (ms per run)" not in page and "of the profiled runs&#x27; own time" in page


def test_html_report_is_self_contained_with_charts(optimized, tmp_path):
    page = render(optimized.report)
    profile_sides = [optimized.report["profile"][side] for side in ("before", "after")]
    op_chart = all(side["op_times_trusted"] for side in profile_sides)
    charts_and_regions = 2 + op_chart + len(optimized.report["rewrites"])  # a picture of each folded region
    assert page.count("<svg") == charts_and_regions and "validation passed" in page and "Conv" in page
    assert "<script" not in page and "http://" not in page and "https://" not in page
    assert "Rewrites" in page and "conv-conv" in page


def test_cli_writes_html_and_json(small_net_path, tmp_path):
    result = CliRunner().invoke(app, ["optimize", f"{small_net_path}:build", "-o", str(tmp_path / "o.onnx"),
                                      "--device", "cpu", "--html", str(tmp_path / "r.html"),
                                      "--report", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "r.html").read_text()
    assert "<svg" in page
    # a column header never breaks inside its word ("verdic t"), and what a rewrite did keeps room
    # beside a region of long TorchScript names (a word a line; looked at in chromium at 700 px)
    assert "tr:first-child th{white-space:nowrap;overflow-wrap:normal}" in page and "<td class=done>" in page
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["profile"]["before"]["latency_ms"]["median"] > 0
    assert "peak memory MiB" in result.stdout


def test_failed_validation_still_writes_the_html_with_the_culprit(small_net_path, tmp_path):
    rules = tmp_path / "wrong.yaml"
    rules.write_text("rules:\n  - name: relu-is-identity\n    doc: wrong\n    match: [y = Relu(x)]\n"
                     "    apply: forward_input\n")
    result = CliRunner().invoke(app, ["optimize", f"{small_net_path}:build", "-o", str(tmp_path / "o.onnx"),
                                      "--rules", str(rules), "--no-profile", "--html", str(tmp_path / "r.html"),
                                      "--report", str(tmp_path / "r.json")])
    assert result.exit_code == 3
    page = (tmp_path / "r.html").read_text()
    assert "validation FAILED" in page and "first bad rewrite" in page and "relu-is-identity" in page
    # nothing was written, and neither report says otherwise (the schema's null)
    assert not (tmp_path / "o.onnx").exists() and json.loads((tmp_path / "r.json").read_text())["output"] is None
    assert "written to <code>(not written)</code>" in page and "o.onnx" not in page
    said = " ".join(result.stderr.split())
    assert "nothing was written" in said and f"--report {tmp_path / 'r.json'}" in said and "this failure's report" in said


def test_only_the_profiles_sessions_pack_their_weights(monkeypatch):
    """ONNX Runtime packs a MatMul's weight when a session is made (convexport.runtime's
    DISABLE_PREPACKING): worth it for the sessions that time the model as deployed, not for the
    ones that check values in a few runs (validation, the half stage's measurements)."""
    import numpy as np
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), f"w{i}") for i in range(2)]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w0"], ["h"]), helper.make_node("MatMul", ["h", "w1"], ["y"])], "mlp",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 64])], weights,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    made, real = [], ort.InferenceSession

    def recorded(model, options=None, *args, **kwargs):
        try:
            disabled = options.get_session_config_entry("session.disable_prepacking")
        except RuntimeError:  # not set: ORT's default, packed
            disabled = ""
        made.append((options.enable_profiling, disabled))
        return real(model, options, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", recorded)
    convexport.optimize(model, write=False, profile=False, device="cpu", dtype="fp16")
    assert made and all(disabled == "1" for _, disabled in made)
    made.clear()
    convexport.optimize(model, write=False, device="cpu", validate=False)
    profiled = [disabled for profiling, disabled in made if profiling]
    assert profiled and all(disabled == "" for disabled in profiled)
