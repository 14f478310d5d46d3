"""Profiling on the CPU provider and the HTML report."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import convexport
from convexport.cli import app
from convexport.export import graph_input_specs
from convexport.profile import profile_models
from convexport.report_html import render


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
    assert profile["speedup"] == pytest.approx(profile["before"]["latency_ms"]["median"]
                                               / profile["after"]["latency_ms"]["median"])
    assert profile["memory_ratio"] > 0


def test_profile_runs_and_blocks(optimized):
    model = optimized.model
    measured = profile_models({"a": model, "b": model}, graph_input_specs(model), "cpu", runs=13, warmup=1,
                              memory=False, per_op=False)
    assert measured["runs"] == 13 and "op_time_ms" not in measured["a"]


@pytest.mark.parametrize("runs, blocks", [(10, 5), (13, 7), (200, 20)])
def test_models_take_turns_in_at_least_five_blocks(monkeypatch, runs, blocks):
    """Blocks of up to 10 timed runs, at least 5 per model: a slow model (10 runs) goes in
    blocks of 2, so a few slow seconds of the machine do not fall on one model alone."""
    from convexport import profile

    order = []
    monkeypatch.setattr(profile, "create_session", lambda model, device, what: model)
    monkeypatch.setattr(profile, "session_runner", lambda label, feeds, device: lambda: order.append(label))
    times, counted = profile._block_latency({"a": "a", "b": "b"}, {}, "cpu", runs, warmup=1)
    assert counted == runs and all(len(samples) == runs for samples in times.values())
    timed = order[2:]                                      # after one warm-up run each
    switches = [label for i, label in enumerate(timed) if i == 0 or timed[i - 1] != label]
    assert len(switches) == 2 * blocks and switches[:2] == ["a", "b"]


def test_html_report_is_self_contained_with_charts(optimized, tmp_path):
    page = render(optimized.report)
    charts_and_regions = 3 + len(optimized.report["rewrites"])  # a picture of each folded region
    assert page.count("<svg") == charts_and_regions and "validation passed" in page and "Conv" in page
    assert "<script" not in page and "http://" not in page and "https://" not in page
    assert "Rewrites" in page and "conv-conv" in page


def test_cli_writes_html_and_json(small_net_path, tmp_path):
    result = CliRunner().invoke(app, ["optimize", f"{small_net_path}:build", "-o", str(tmp_path / "o.onnx"),
                                      "--device", "cpu", "--html", str(tmp_path / "r.html"),
                                      "--report", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    assert "<svg" in (tmp_path / "r.html").read_text()
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["profile"]["before"]["latency_ms"]["median"] > 0
    assert "peak memory MiB" in result.stdout


def test_failed_validation_still_writes_the_html_with_the_culprit(small_net_path, tmp_path):
    rules = tmp_path / "wrong.yaml"
    rules.write_text("rules:\n  - name: relu-is-identity\n    doc: wrong\n    match: [y = Relu(x)]\n"
                     "    apply: forward_input\n")
    result = CliRunner().invoke(app, ["optimize", f"{small_net_path}:build", "-o", str(tmp_path / "o.onnx"),
                                      "--rules", str(rules), "--no-profile", "--html", str(tmp_path / "r.html")])
    assert result.exit_code == 3
    page = (tmp_path / "r.html").read_text()
    assert "validation FAILED" in page and "first bad rewrite" in page and "relu-is-identity" in page
