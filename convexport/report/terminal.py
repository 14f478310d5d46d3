"""The optimize report on a terminal: one function per section (report/sections.py lists them
in the order they are printed), each printing its lines to a rich Console, or nothing where the
report has nothing of it."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from rich.console import Console
from rich.table import Table

from .rewrite_lines import low_rank_line, runtime_fusions_line, transformer_fusions_line
from .types import OptimizeReport, Validation
from .words import (
    device_check_line,
    dropped_for_speed_line,
    export_check_line,
    first_run_line,
    growth_line,
    mebibytes,
    model_lines,
    module_lines,
    nonfinite_line,
    plural,
    precision_lines,
    si,
    size,
    speed_line,
    timed_inputs_line,
    tracer_warning,
    validation_line,
)


def title(report: OptimizeReport, console: Console) -> None:
    weights = report.get("output_weights")
    beside = f" (weights in {Path(weights).name} beside it)" if weights else ""
    console.print(
        f"[bold]{report['model']}[/bold] -> {report.get('output') or '(not written)'}{beside}", highlight=False
    )


def interface(report: OptimizeReport, console: Console) -> None:
    if report.get("inputs") or report.get("outputs"):
        console.print(
            f"inputs {', '.join(report.get('inputs', []))}; outputs {', '.join(report.get('outputs', []))}",
            markup=False,
            highlight=False,
        )


def graph(report: OptimizeReport, console: Console) -> None:
    """Before and after: nodes, the ops whose count changed, FLOPs, parameters, latency, peak
    memory, the file's size."""
    before, after, profile = report["before"], report["after"], report.get("profile")
    table = Table(show_edge=False)
    table.add_column("")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    table.add_row("nodes", str(before["nodes"]), str(after["nodes"]))
    for op in _interesting_ops(before["ops"], after["ops"]):
        table.add_row(op, str(before["ops"].get(op, 0)), str(after["ops"].get(op, 0)))
    table.add_row("FLOPs", si(before["flops"]), si(after["flops"]))
    table.add_row("params", si(before["params"]), si(after["params"]))
    if profile:
        table.add_row(
            f"latency ms ({profile['device']}, median)",
            f"{profile['before']['latency_ms']['median']:.3f}",
            f"{profile['after']['latency_ms']['median']:.3f}",
        )
        if profile["before"].get("peak_memory_bytes") is not None:
            flag = " [red](more)[/red]" if profile.get("memory_regression") else ""
            table.add_row(
                "peak memory MiB",
                mebibytes(profile["before"]["peak_memory_bytes"], unit=False),
                mebibytes(profile["after"]["peak_memory_bytes"], unit=False) + flag,
            )
    if "model_bytes" in before:
        flag = " [red](larger)[/red]" if report.get("size_regression") else ""
        table.add_row("model file", size(before["model_bytes"]), size(after["model_bytes"]) + flag)
    console.print(table)


def _interesting_ops(before: dict, after: dict) -> list[str]:
    """Ops whose count changed, most frequent first (at most 8)."""
    changed = [op for op in {**before, **after} if before.get(op, 0) != after.get(op, 0)]
    return sorted(changed, key=lambda op: -max(before.get(op, 0), after.get(op, 0)))[:8]


def export_warnings(report: OptimizeReport, console: Console) -> None:
    for warning in report.get("export_warnings", []):
        console.print(tracer_warning(warning), markup=False)


def constant_folding(report: OptimizeReport, console: Console) -> None:
    folding = report.get("constant_folding")
    if folding and folding["nodes_after"] != folding["nodes_before"]:
        console.print(
            f"constant folding: {folding['nodes_before']} -> {folding['nodes_after']} nodes, before the rules"
        )


def notes(report: OptimizeReport, console: Console) -> None:
    for line in model_lines(report):
        console.print(line, markup=False)


def overridable_inputs(report: OptimizeReport, console: Console) -> None:
    if report.get("overridable_inputs"):
        console.print(
            f"{report['overridable_inputs']} weights are graph inputs a caller may override, so they are not "
            "folded; --freeze-input-defaults makes them constants",
            markup=False,
        )


def rewrites(report: OptimizeReport, console: Console) -> None:
    """The rules applied and how often, then the same by the module they folded inside."""
    rules: dict[str, int] = {}
    for entry in report["rewrites"]:
        rules[entry["rule"]] = rules.get(entry["rule"], 0) + 1
    applied = ", ".join(f"{rule} x{count}" for rule, count in rules.items()) or "none"
    console.print(f"rewrites: {applied}")
    for line in module_lines(report["rewrites"]):
        console.print(f"  {line}", markup=False, highlight=False)


def skipped(report: OptimizeReport, console: Console, most: int = 5) -> None:
    """How many rewrites were refused, and the first `most` of them with why."""
    if not report["skipped"]:
        return
    count = len(report["skipped"])
    shown = "" if count <= most else f"; the first {most}:"
    console.print(f"skipped: {count} (--report lists each with its reason){shown}")
    for entry in report["skipped"][:most]:
        where = f" in {entry['module']}" if entry.get("module") else ""
        console.print(
            f"  {entry['rule']} at {', '.join(entry['nodes'][:3])}{where}: {entry['reason']}",
            markup=False,
            highlight=False,
        )


def validation(report: OptimizeReport, console: Console) -> None:
    """The verdict, then where the export or NaN weaken it, then the check on the device."""
    checked = report.get("validation")
    if not checked:
        return
    console.print(validation_line(checked))
    for line in (export_check_line(checked), nonfinite_line(checked)):
        if line:
            console.print(line, markup=False)
    if "on_device" in checked:  # a Validation's (an InvalidModel has none)
        console.print(device_check_line(cast(Validation, checked)["on_device"]), markup=False)


def precision(report: OptimizeReport, console: Console) -> None:
    if report.get("precision"):
        for line in precision_lines(report["precision"]):
            console.print(line, markup=False, highlight=False)


def profile_skipped(report: OptimizeReport, console: Console) -> None:
    if report.get("profile_skipped"):
        console.print(f"profile: skipped: {report['profile_skipped']}", markup=False)


def dropped_for_speed(report: OptimizeReport, console: Console) -> None:
    line = dropped_for_speed_line(report)
    if line:
        console.print(line, markup=False)
    if report.get("speed_choice_skipped"):
        console.print(f"written as rewritten though slower: {report['speed_choice_skipped']}", markup=False)


def speed(report: OptimizeReport, console: Console) -> None:
    """The speedup and its interval, a long first run, more peak memory."""
    profile = report.get("profile")
    if not profile:
        return
    if profile.get("speedup"):
        console.print(speed_line(profile))
    timed = timed_inputs_line(report)
    if timed:
        console.print(timed, markup=False, highlight=False)
    cold = first_run_line(profile)
    if cold:
        console.print(cold, markup=False)
    if profile.get("memory_regression"):
        console.print(f"[red]peak memory up {profile['memory_ratio'] - 1:.0%}[/red] (regression)")


def size_regression(report: OptimizeReport, console: Console) -> None:
    if report.get("size_regression"):
        before, after = report["before"]["model_bytes"], report["after"]["model_bytes"]
        console.print(
            f"[red]model file larger: {size(before)} -> {size(after)}[/red]"
            " (the rewritten weights take more room than the original ones)"
        )


def deduplicated_initializers(report: OptimizeReport, console: Console) -> None:
    merged = report.get("deduplicated_initializers")
    if merged:
        console.print(
            f"weights: {plural(merged['merged'], 'copy', 'copies')} of an initializer written once "
            f"({size(merged['bytes_saved'])} saved)",
            markup=False,
        )


def runtime_fusions(report: OptimizeReport, console: Console) -> None:
    if report.get("runtime_fusions"):
        console.print(runtime_fusions_line(report["runtime_fusions"]), markup=False, highlight=False)


def transformer_fusions(report: OptimizeReport, console: Console) -> None:
    line = transformer_fusions_line(report["transformer_fusions"]) if report.get("transformer_fusions") else None
    if line:
        lost = report["transformer_fusions"].get("lost")
        console.print(f"[red]{line}[/red]" if lost else line, markup=bool(lost), highlight=False)


def low_rank_branches(report: OptimizeReport, console: Console) -> None:
    if report.get("low_rank_branches_left"):
        console.print(f"[yellow]{low_rank_line(report['low_rank_branches_left'])}[/yellow]", highlight=False)


def growth(report: OptimizeReport, console: Console) -> None:
    grown = growth_line(report)
    if grown:
        console.print(f"[yellow]{grown}[/yellow]")


def environment(report: OptimizeReport, console: Console) -> None:
    """What the timings were measured with (nothing where there are none)."""
    measured_with = report.get("environment")
    if measured_with and report.get("profile"):
        console.print(
            f"measured with ONNX Runtime {measured_with['onnxruntime']} ({measured_with['provider']}, "
            f"{measured_with['cpu_threads']} threads, {measured_with.get('gpu') or measured_with['cpu']})",
            markup=False,
        )


def timings(report: OptimizeReport, console: Console) -> None:
    seconds = report.get("timings_s")
    if seconds:
        steps = ", ".join(f"{step} {taken:.1f}" for step, taken in seconds.items() if step != "total")
        console.print(f"done in {seconds['total']:.1f} s ({steps})", markup=False)


def explanations(report: OptimizeReport, console: Console, most: int = 40) -> None:
    """--explain: for each rule asked about, each node it looked at (and its module, where the
    model records it) and what happened there."""
    modules = report.get("explain_modules", {})
    for rule, verdicts in report.get("explain", {}).items():
        if "(module)" in verdicts:
            console.print(f"explain {rule}: {verdicts['(module)']}", markup=False, highlight=False)
            continue
        console.print(f"explain {rule}: {len(verdicts)} node(s) looked at", markup=False, highlight=False)
        if not verdicts:
            console.print("  none: an op of its pattern is not in the graph", markup=False)
        for node, verdict in list(verdicts.items())[:most]:
            where = f" in {modules[node]}" if node in modules else ""
            console.print(f"  {node}{where}: {verdict}", markup=False, highlight=False)
        if len(verdicts) > most:
            console.print(f"  ... and {len(verdicts) - most} more (--report lists them all)", markup=False)
