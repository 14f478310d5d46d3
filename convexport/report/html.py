"""The optimize report as a self-contained HTML page (no scripts, no network), charts as
inline SVG: one function per section (report/sections.py lists them in the page's order),
each giving its HTML parts, none where the report has nothing of it."""

from __future__ import annotations

import html
from collections.abc import Mapping
from pathlib import Path
from typing import cast

from .rewrite_lines import not_tried_text
from .types import OnDevice, OptimizeReport, Precision, Profile, TransformerFusions
from .words import (
    export_check_line,
    growth_line,
    mebibytes,
    model_lines,
    nonfinite_line,
    plural,
    precision_lines,
    si,
    size,
    timed_inputs_line,
    tracer_warning,
)

BEFORE, AFTER = "#9aa5b1", "#2f7de1"
STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:980px;color:#1f2933;padding:0 1rem}
h1{font-size:1.4rem;margin:0 0 .2rem}h2{font-size:1.1rem;margin:2rem 0 .6rem;border-bottom:1px solid #e4e7eb;padding-bottom:.3rem}
.sub{color:#616e7c;margin:0 0 1rem}.badges span{display:inline-block;border-radius:4px;padding:.15rem .55rem;margin-right:.4rem;font-weight:600}
.ok{background:#e3f9e5;color:#05400a}.bad{background:#ffe3e3;color:#610404}.info{background:#e6f0ff;color:#0b3b8c}
table{border-collapse:collapse;width:100%;margin:.3rem 0}th,td{text-align:left;padding:.3rem .5rem;border-bottom:1px solid #eef0f2;vertical-align:top;overflow-wrap:anywhere}td code{white-space:nowrap}small.path{overflow-wrap:normal}tr:first-child th{white-space:nowrap;overflow-wrap:normal}td.done{min-width:12em}
th{color:#52606d;font-weight:600}td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}td:first-child{white-space:nowrap}
.legend span{display:inline-block;width:.8rem;height:.8rem;border-radius:2px;margin:0 .3rem 0 1rem;vertical-align:-1px}
svg text{font:12px system-ui,sans-serif;fill:#323f4b}code{font-size:12px}
"""


def _path_breaks(path: str) -> str:
    """A file path that a narrow cell breaks after a slash, never inside a name."""
    return _e(path).replace("/", "/<wbr>")


def _weights_beside(report: OptimizeReport) -> str:
    weights = report.get("output_weights")
    return f" (weights in <code>{_e(Path(weights).name)}</code> beside it)" if weights else ""


def page(parts: list[str]) -> str:
    """The page around its sections' HTML."""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>convexport report</title>"
        f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>\n"
    )


def title(report: OptimizeReport) -> list[str]:
    """The model, where it went, what made it; the verdicts as badges."""
    return [
        f"<h1>convexport: {_e(report['model'])}</h1>",
        f"<p class=sub>written to <code>{_e(report.get('output') or '(not written)')}</code>{_weights_beside(report)}"
        " · convexport "
        f"{_e(report['convexport_version'])} · exporter {_e(report.get('exporter'))} · opset {_e(report.get('opset'))}</p>",
        _badges(report),
    ]


def interface(report: OptimizeReport) -> list[str]:
    if not (report.get("inputs") or report.get("outputs")):
        return []
    return [
        f"<p class=sub>inputs <code>{_e(', '.join(report.get('inputs', [])))}</code> · outputs "
        f"<code>{_e(', '.join(report.get('outputs', [])))}</code></p>"
    ]


def notes(report: OptimizeReport) -> list[str]:
    return [f"<p class=sub>{_e(line)}</p>" for line in model_lines(report)]


def environment(report: OptimizeReport) -> list[str]:
    """What it was measured with, and how long it all took."""
    measured_with, timings = report.get("environment"), report.get("timings_s")
    if not measured_with:
        return []
    return [
        f"<p class=sub>measured with ONNX Runtime {_e(measured_with['onnxruntime'])} · {_e(measured_with['provider'])}"
        f" · {_e(measured_with['cpu_threads'])} threads · {_e(measured_with.get('gpu') or measured_with['cpu'])}"
        + (f" · done in {timings['total']:.1f} s" if timings else "")
        + "</p>"
    ]


def export_warnings(report: OptimizeReport) -> list[str]:
    return [f"<p class=sub>{_e(tracer_warning(warning))}</p>" for warning in report.get("export_warnings", [])]


def graph(report: OptimizeReport) -> list[str]:
    return ["<h2>Graph</h2>", _summary_table(report)]


def operators(report: OptimizeReport) -> list[str]:
    rows = _op_rows(report["before"]["ops"], report["after"]["ops"])
    return ["<h2>Operators</h2>", _legend(), _grouped_bars(rows, unit="")]


def latency(report: OptimizeReport) -> list[str]:
    """Latency before and after, then the time per op type where it can be trusted."""
    profile = report.get("profile")
    if not profile:
        return []
    timed = timed_inputs_line(report)
    shown = [f"<p>{_e(timed)}</p>"] if timed else []
    return [f"<h2>Latency on {_e(profile['provider'])}</h2>", *shown, _legend(), _latency_chart(profile)] + (
        _op_time_section(profile)
    )


def rewrites(report: OptimizeReport) -> list[str]:
    return ["<h2>Rewrites</h2>", _rewrites(report["rewrites"])]


def skipped(report: OptimizeReport) -> list[str]:
    return ["<h2>Skipped</h2>", _skipped(report["skipped"])]


def runtime_fusions(report: OptimizeReport) -> list[str]:
    if not report.get("runtime_fusions"):
        return []
    return ["<h2>ONNX Runtime fusions</h2>", _fusions(report["runtime_fusions"])]


def transformer_fusions(report: OptimizeReport) -> list[str]:
    if not report.get("transformer_fusions", {}).get("model_types"):
        return []
    return ["<h2>ONNX Runtime's transformer optimizer</h2>", _transformer_fusions(report["transformer_fusions"])]


def low_rank_branches(report: OptimizeReport) -> list[str]:
    if not report.get("low_rank_branches_left"):
        return []
    return ["<h2>Low-rank branches left</h2>", _low_rank(report["low_rank_branches_left"])]


def validation(report: OptimizeReport) -> list[str]:
    if not report.get("validation"):
        return []
    return ["<h2>Validation</h2>", _validation(report["validation"])]


def precision(report: OptimizeReport) -> list[str]:
    if not report.get("precision"):
        return []
    return [f"<h2>In {_e(report['precision']['dtype'])}</h2>", _precision(report["precision"])]


def _op_time_section(profile: Profile) -> list[str]:
    """The chart of time per op type, where the profiler's kernel times add up to the profiled
    runs' own time (op_times_trusted: within 10% on both sides, never on CUDA); else a line
    saying they do not, and by how much."""
    before, after = profile["before"], profile["after"]
    if "op_time_ms" not in before or "op_time_ms" not in after:
        return []
    if before.get("op_times_trusted", True) and after.get("op_times_trusted", True):
        rows = _op_rows(before["op_time_ms"], after["op_time_ms"])
        return ["<h2>Time per op type (ms per run)</h2>", _legend(), _grouped_bars(rows, unit=" ms")]
    sides = [("before", before), ("after", after)]
    coverage = ", ".join(f"{side} {e['op_time_coverage']:.0%}" for side, e in sides if e.get("op_time_coverage"))
    profiled = ", ".join(
        f"{side} {e['latency_ms']['median']:.3f} -> {e['profiled_run_ms']:.3f} ms"
        for side, e in sides
        if e.get("profiled_run_ms")
    )
    why = (
        "on CUDA ONNX Runtime times each kernel's launch on the host, not its work on the device"
        if profile.get("device") == "cuda"
        else f"the kernels add up to {coverage} of the profiled runs' own time: the rest is spent between kernels, "
        "most where they are many and short"
    )
    return [
        "<h2>Time per op type</h2>",
        f"<p class=sub>not charted as time: {_e(why)}. The profiler itself slows a run ({_e(profiled)} per run). "
        "The JSON report has the times.</p>",
    ]


def _e(value) -> str:
    return html.escape(str(value))


def _badges(report) -> str:
    validation, profile = report.get("validation"), report.get("profile")
    badges = []
    if validation:
        badges.append(
            "<span class=ok>validation passed</span>"
            if validation["passed"]
            else "<span class=bad>validation FAILED</span>"
        )
    if profile and profile.get("speedup"):
        verdict = profile.get("verdict", "faster")
        kind = {"faster": "ok", "slower": "bad"}.get(verdict, "info")
        label = f"{profile['speedup']:.2f}x faster" if verdict == "faster" else verdict
        if verdict == "slower":
            label = f"{1 / profile['speedup']:.2f}x slower"
        threads = f", {plural(profile['threads'], 'thread')}" if profile.get("threads") else ""
        badges.append(f"<span class={kind}>{_e(label)} (±{profile.get('noise', 0):.1%}{threads})</span>")
    if profile and profile.get("memory_ratio"):
        kind = "bad" if profile.get("memory_regression") else "info"
        badges.append(f"<span class={kind}>{profile['memory_ratio']:.2f}x peak memory</span>")
    if report.get("size_regression"):
        badges.append(
            f"<span class=bad>model file {report['before']['model_bytes']:,} → {report['after']['model_bytes']:,} bytes</span>"
        )
    grown = growth_line(report)
    if grown:
        badges.append(f"<span class=bad>{_e(grown)}</span>")
    badges.append(f"<span class=info>{report['before']['nodes']} → {report['after']['nodes']} nodes</span>")
    return f"<p class=badges>{''.join(badges)}</p>"


def _summary_table(report) -> str:
    before, after, profile = report["before"], report["after"], report.get("profile")
    rows = [
        ("nodes", before["nodes"], after["nodes"]),
        ("FLOPs", si(before["flops"]), si(after["flops"])),
        ("parameters", si(before["params"]), si(after["params"])),
    ]
    if profile:
        for key, label in (("median", "latency median (ms)"), ("p90", "latency p90 (ms)")):
            rows.append(
                (label, f"{profile['before']['latency_ms'][key]:.3f}", f"{profile['after']['latency_ms'][key]:.3f}")
            )
        if profile["before"].get("peak_memory_bytes") is not None:
            rows.append(
                (
                    "peak memory",
                    mebibytes(profile["before"].get("peak_memory_bytes")),
                    mebibytes(profile["after"].get("peak_memory_bytes")),
                )
            )
    if "model_bytes" in before:
        rows.append(("model file", size(before["model_bytes"]), size(after["model_bytes"])))
    body = "".join(f"<tr><td>{_e(a)}</td><td class=num>{_e(b)}</td><td class=num>{_e(c)}</td></tr>" for a, b, c in rows)
    return f"<table><tr><th></th><th class=num>before</th><th class=num>after</th></tr>{body}</table>"


def _legend() -> str:
    return f'<p class=legend><span style="background:{BEFORE}"></span>before<span style="background:{AFTER}"></span>after</p>'


def _op_rows(before: dict, after: dict) -> list[tuple[str, float, float]]:
    # ties in the order the graph has them (a set's order would change from one run to the next)
    names = sorted({**before, **after}, key=lambda op: -max(before.get(op, 0), after.get(op, 0)))
    return [(op, float(before.get(op, 0)), float(after.get(op, 0))) for op in names[:16]]


def _grouped_bars(rows, unit: str) -> str:
    """Horizontal bars, one pair (before, after) per row, scaled to the largest value."""
    if not rows:
        return "<p>none</p>"
    label_width, bar_width, row_height = 140, 700, 30
    largest = max(max(b, a) for _, b, a in rows) or 1.0
    height = row_height * len(rows) + 10
    items = []
    for index, (label, before, after) in enumerate(rows):
        y = 5 + index * row_height
        items.append(f'<text x="{label_width - 8}" y="{y + 15}" text-anchor="end">{_e(label)}</text>')
        for offset, value, colour in ((0, before, BEFORE), (12, after, AFTER)):
            width = bar_width * value / largest
            items.append(
                f'<rect x="{label_width}" y="{y + offset}" width="{width:.1f}" height="11" fill="{colour}" rx="2"/>'
            )
            items.append(f'<text x="{label_width + width + 5:.1f}" y="{y + offset + 10}">{_number(value)}{unit}</text>')
    return (
        f'<svg role="img" width="{label_width + bar_width + 90}" height="{height}" '
        f'viewBox="0 0 {label_width + bar_width + 90} {height}">{"".join(items)}</svg>'
    )


def _latency_chart(profile) -> str:
    rows = [
        (f"{key} ({label})", profile["before"]["latency_ms"][key], profile["after"]["latency_ms"][key])
        for key, label in (("median", "ms"), ("p90", "ms"), ("min", "ms"))
    ]
    return _grouped_bars(rows, unit=" ms")


def _rewrites(entries) -> str:
    """The rewrites grouped by the PyTorch module they folded inside (where the exporter said
    which: docs/commands.md, provenance), in the order of each group's first rewrite."""
    if not entries:
        return "<p>none</p>"
    groups: dict[str, list[tuple[int, dict]]] = {}
    for index, entry in enumerate(entries, 1):
        module = entry.get("module") or " + ".join(entry.get("modules", [])) or ""
        groups.setdefault(module, []).append((index, entry))
    rows = []
    for module, members in groups.items():
        if module:
            rows.append(f"<tr><th colspan=4><code>{_e(module)}</code></th></tr>")
        rows += [
            f"<tr><td>{index}</td><td><code>{_e(e['rule'])}</code><br><small class=path>{_path_breaks(e.get('file', ''))}</small></td>"
            f"<td>{_region(e)}<br><small>{_e(_nodes_and_modules(e))}</small></td>"
            f"<td class=done>{_e(e['reason'])}{_decision(e.get('decision'))}</td></tr>"
            for index, e in members
        ]
    return f"<table><tr><th>#</th><th>rule</th><th>region: before → after</th><th>what was done</th></tr>{''.join(rows)}</table>"


def _nodes_and_modules(entry) -> str:
    nodes = ", ".join(entry["nodes"][:4]) + (" …" if len(entry["nodes"]) > 4 else "")
    modules = entry.get("modules", [])
    return f"{nodes} · {', '.join(modules[:4])}{' …' if len(modules) > 4 else ''}" if modules else nodes


def _nodes_and_module(entry) -> str:
    """For an entry with one `module` (or none) rather than a list of them."""
    return _nodes_and_modules({"nodes": entry["nodes"], "modules": [entry["module"]] if entry.get("module") else []})


def _region(entry) -> str:
    """The folded region as a picture: the matched nodes' ops, an arrow, the new nodes' ops."""
    before, after = entry.get("ops_before", []), entry.get("ops_after", [])
    if not before:
        return ""
    boxes: list[str] = []
    x = 2.0
    for ops, colour in ((before, BEFORE), (None, None), (after or ["(removed)"], AFTER)):
        if ops is None:
            boxes.append(f'<text x="{x + 4}" y="17" font-size="16">→</text>')
            x += 26
            continue
        for op in ops:
            width = 10 + 7.5 * len(op)
            boxes.append(f'<rect x="{x}" y="3" width="{width}" height="20" rx="4" fill="{colour}"/>')
            boxes.append(f'<text x="{x + 4}" y="17" fill="#fff" font-size="12">{_e(op)}</text>')
            x += width + 4
    return f'<svg role="img" width="{x + 2}" height="26" viewBox="0 0 {x + 2} 26">{"".join(boxes)}</svg>'


def _decision(decision) -> str:
    """A cost or measure decision's numbers, one short line."""
    if not decision:
        return ""
    if decision.get("method") == "measured":
        numbers = f"measured {decision['before_ms']:.3g} → {decision['after_ms']:.3g} ms over {decision['runs']} runs"
    elif "before_us" in decision:
        numbers = (
            f"estimated {decision['before_us']:.3g} → {decision['after_us']:.3g} µs on {decision['device']}"
            f" (FLOPs {si(decision['flops_before'])} → {si(decision['flops_after'])})"
        )
    else:
        numbers = decision.get("note", "")
    return f"<br><small>{_e(numbers)}</small>"


def _fusions(entries) -> str:
    """The subgraphs ONNX Runtime fuses that a rewrite would have split: kept whole or not."""
    body = "".join(
        f"<tr><td>{_e(e['fusion'])}</td><td>{_e(_nodes_and_module(e))}</td>"
        f"<td>{'kept whole' if e['kept'] else 'broken (--strategy all)'}</td><td><code>{_e(', '.join(e['rules']))}</code></td></tr>"
        for e in entries
    )
    return (
        f"<table><tr><th>kernel</th><th>nodes</th><th>verdict</th><th>rules that would split it</th></tr>{body}</table>"
    )


def _transformer_fusions(entry: TransformerFusions) -> str:
    """The kernels ONNX Runtime's transformer optimizer makes of the original and of the
    optimized graph, per model type, and those lost."""

    def kernels(counts) -> str:
        return ", ".join(f"{n} {op}" for op, n in sorted((counts or {}).items())) or "none"

    body = ""
    for model_type, counts in entry["model_types"].items():
        lost = entry["lost"].get(model_type)
        verdict = f"<span class=bad>lost {_e(kernels(lost))}</span>" if lost else "all kept"
        optimized = kernels(counts["optimized"])
        if counts["optimized"] is None:  # a model type the optimizer's time budget left unchecked after
            optimized, verdict = "not checked", "kept whole"
        body += (
            f"<tr><td><code>{_e(model_type)}</code></td><td>{_e(kernels(counts['original']))}</td>"
            f"<td>{_e(optimized)}</td><td>{verdict}</td></tr>"
        )
    untried = not_tried_text(entry)
    note = (
        f"<p class=sub><code>optimize_model(path, model_type=...)</code> run on both files by convexport "
        f"({_e(entry['checked_with'])}); the nodes of each kernel it makes of the original are kept whole"
        f"{'; ' + _e(untried) if untried else ''}.</p>"
    )
    head = "<tr><th>model type</th><th>original</th><th>optimized graph</th><th>verdict</th></tr>"
    return f"{note}<table>{head}{body}</table>"


def _precision(precision: Precision) -> str:
    """The half-precision model: its error against the exact result per output, with the bound
    and the original's own, then every node kept float32 and why."""
    lines = "".join(f"<p class=sub>{_e(line.strip())}</p>" for line in precision_lines(precision, "below"))
    counts = cast(Mapping[str, int], precision.get("weights_rounded") or {})  # (not in a report of schema 1.0)
    if sum(counts.values()):
        ways = {
            "by_input_moments": "by their input's second moments",  # (schema 1.3)
            "keeping_row_sums": "keeping each output's sum of its weights",
            "to_nearest": "to nearest",
        }
        said = [f"{counts[way]} {words}" for way, words in ways.items() if counts.get(way)]
        lines += f"<p class=sub>weights rounded: {_e(', '.join(said))}</p>"
    judged = precision["validation"]["outputs"].items()
    by_rounding = precision["validation"].get("bound_by") == "rounded"  # (schema 1.2)
    rows = "".join(
        f"<tr><td><code>{_e(name)}</code></td><td>{_number(j['error'])}</td><td>{_number(j['bound'])}</td>"
        f"<td>{_number(j['error_original'])}</td>"
        + (f"<td>{_number(j['error_rounded']) if 'error_rounded' in j else ''}</td>" if by_rounding else "")
        + f"<td>{j['beyond']} of {j['elements']}</td></tr>"
        for name, j in judged
    )
    against = _e(precision["validation"]["against"])
    rounded = f"<th>every value rounded to {_e(precision['dtype'])}</th>" if by_rounding else ""
    table = (
        f"<table><tr><th>output</th><th>error against {against}</th><th>bound</th><th>original's own</th>"
        f"{rounded}<th>beyond</th></tr>{rows}</table>"
    )
    if not precision["kept_float32"]:
        return f"{lines}{table}<p>every node with float data runs in {_e(precision['dtype'])}</p>"
    kept = "".join(
        f"<tr><td><code>{_e(e['node'])}</code></td><td><code>{_e(e['op'])}</code></td><td>{_e(e['reason'])}</td></tr>"
        for e in precision["kept_float32"]
    )
    return f"{lines}{table}<h3>Kept float32</h3><table><tr><th>node</th><th>op</th><th>why</th></tr>{kept}</table>"


def _low_rank(entries) -> str:
    """Low-rank pairs summed with the layer of the same input and not merged into it."""
    body = "".join(
        f"<tr><td>{_e(_nodes_and_module(e))}</td><td>{e['in_features']} &rarr; {e['rank']} &rarr; "
        f"{e['out_features']}</td><td><code>{_e(e['beside'])}</code></td></tr>"
        for e in entries
    )
    note = "<p class=sub><code>--explain linear-region</code> says why each was not merged.</p>"
    return f"{note}<table><tr><th>nodes</th><th>widths</th><th>beside the layer</th></tr>{body}</table>"


def _skipped(entries) -> str:
    if not entries:
        return "<p>none</p>"
    body = "".join(
        f"<tr><td><code>{_e(e['rule'])}</code></td><td>{_e(_nodes_and_modules(e))}</td><td>{_e(e['reason'])}</td></tr>"
        for e in entries
    )
    return f"<table><tr><th>rule</th><th>nodes</th><th>why not</th></tr>{body}</table>"


def _validation(validation) -> str:
    """Per output: against the float64 result, the optimized graph's error, the original's own
    (its noise floor) and the bound; against the original's run, the differences; the
    tolerances where they bound it."""

    def exact(o, key):
        return f"{o[key]:.3g}" if o.get(key) is not None else "–"

    def tolerance(o):
        return "–" if o.get("rtol") is None else f"{o['rtol']:g} / {o['atol']:g}"

    rows = "".join(
        f"<tr><td><code>{_e(name)}</code></td><td class=num>{exact(o, 'exact_error')}</td>"
        f"<td class=num>{exact(o, 'exact_error_original')}</td><td class=num>{exact(o, 'exact_bound')}</td>"
        f"<td class=num>{exact(o, 'exact_error_float64')}</td><td class=num>{o['max_abs']:.3g}</td>"
        f"<td class=num>{o['cosine']:.9f}</td><td class=num>{o['mismatches']} / {o['elements']}</td>"
        f"<td class=num>{tolerance(o)}</td></tr>"
        for name, o in validation["outputs"].items()
    )
    culprit = validation.get("culprit")
    blame = ""
    if culprit and culprit.get("rule"):
        blame = (
            f"<p class=badges><span class=bad>first bad rewrite: #{culprit['index']} "
            f"{_e(culprit['rule'])} ({_e(culprit['file'])})</span></p>"
        )
    elif culprit:
        blame = "<p class=badges><span class=bad>it fails before any rewrite</span></p>"
    against = "the float64 result" if validation.get("reference") == "float64" else "the original's float32 run"
    if validation.get("reference_source") == "torch":
        against += " (the torch model's own float64 run)"
    note = f" ({_e(validation['reference_note'])})" if validation.get("reference_note") else ""
    warning = export_check_line(validation)
    if warning:
        blame += f"<p class=badges><span class=bad>{_e(warning.removeprefix('warning: '))}</span></p>"
    nonfinite = nonfinite_line(validation)
    if nonfinite:
        text = nonfinite.removeprefix("note: ")
        blame += f"<p>{_e(text[0].upper() + text[1:])}</p>"
    return (
        f"{blame}<p>{validation['runs']} runs, judged against {against}{note}: the optimized graph's largest error "
        "there, the original's own (its noise floor), the bound the first had to meet (4x the second and 32 units "
        "of roundoff), and the optimized graph's in float64; then its largest difference from the original's run."
        "</p><table><tr><th>output</th><th class=num>error</th><th class=num>original's error</th>"
        "<th class=num>bound</th><th class=num>in float64</th><th class=num>vs original, max abs</th>"
        f"<th class=num>cosine</th><th class=num>beyond</th><th class=num>rtol / atol</th></tr>{rows}</table>"
        + (_device_check(validation["on_device"]) if validation.get("on_device") else "")
    )


def _device_check(on_device: OnDevice) -> str:
    """The check on the device (original and optimized there with TF32 off), per output, and how
    far TF32 on, ORT's default, moves the optimized graph's outputs."""
    effect = on_device.get("tf32_effect", {})
    verdict = "<span class=ok>passed</span>" if on_device["passed"] else "<span class=bad>FAILED</span>"

    def moved(name):
        return f"{effect[name]['max_rel']:.3g}" if name in effect else "–"

    rows = "".join(
        f"<tr><td><code>{_e(name)}</code></td><td class=num>{o['max_rel']:.3g}</td><td class=num>{o['max_abs']:.3g}</td>"
        f"<td class=num>{o['mismatches']} / {o['elements']}</td><td class=num>{moved(name)}</td></tr>"
        for name, o in on_device["outputs"].items()
    )
    return (
        f"<h3>On {_e(on_device['provider'])}</h3><p>{verdict}: the original and the optimized graph on the device "
        "they will be deployed on, with TF32 off so that only the rewrite can differ; then how far the optimized "
        "graph with ORT's default options (TF32 on) lands from its TF32-off outputs.</p>"
        "<table><tr><th>output</th><th class=num>vs original there, max rel</th><th class=num>max abs</th>"
        f"<th class=num>beyond</th><th class=num>TF32 on moves it, max rel</th></tr>{rows}</table>"
    )


def _number(value: float | None) -> str:
    """A report's number; null is one that was not finite (JSON has no inf or NaN)."""
    if value is None:
        return "not finite"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.3g}"
