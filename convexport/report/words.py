"""The report as a JSON file, and the words the terminal summary and the HTML page both say
of it (report/terminal.py, report/html.py)."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..util.files import write_text_atomically
from .types import OnDevice, OptimizeReport, Precision, Profile, Rewrite


def write_json(report: Mapping[str, Any], destination: str | Path) -> None:
    """Atomically write the report as indented, standard JSON ("-": to stdout): a number that
    is not finite (an error ratio against zero, say) is written as null, never as the
    non-standard Infinity or NaN."""
    write_text_atomically(as_json_text(report) + "\n", destination)


def as_json_text(report: Mapping[str, Any]) -> str:
    """The report as the JSON write_json writes."""
    return json.dumps(_standard(report), indent=2, default=_jsonable, allow_nan=False)


def _standard(value):
    """`value` with every float that is not finite as None, in nested dicts and lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _standard(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_standard(item) for item in value]
    if hasattr(value, "item") and not hasattr(value, "__len__"):  # a numpy scalar
        return _standard(value.item())
    return value


def _jsonable(value):
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def tracer_warning(warning: str) -> str:
    """How one of the report's export_warnings is shown (terminal, HTML, `convexport export`)."""
    return f"export: the TorchScript tracer warned: {warning}"


def model_lines(report: OptimizeReport) -> list[str]:
    """What the run did to the model as given or noticed about it, one sentence a line: the
    notes (a module in train mode, an output another model writes too), the fixed dims --input
    changed, the conversions of an old ONNX model. The terminal summary and the HTML page both
    show these."""
    return (
        [f"note: {note}" for note in report.get("notes", [])]
        + [f"changed: {change}" for change in report.get("input_changes", [])]
        + [
            f"converted: {conversion} (validated against the model as given)"
            for conversion in report.get("conversions", [])
        ]
    )


def plural(count: int, one: str, many: str | None = None) -> str:
    """`1 copy`, `2 copies`."""
    return f"{count} {one if count == 1 else many or one + 's'}"


def module_lines(rewrites: Sequence[Rewrite], most: int = 12) -> list[str]:
    """The rewrites by the PyTorch module they folded inside (the innermost one holding all
    their nodes), one line each: `block (Block): conv-batchnorm x1, conv-mul x1`; at most
    `most` lines, the rest counted."""
    by_module: dict[str, dict[str, int]] = {}
    for entry in rewrites:
        module = entry.get("module") or (_modules_label(entry["modules"]) if entry.get("modules") else None)
        if module:
            rules = by_module.setdefault(module, {})
            rules[entry["rule"]] = rules.get(entry["rule"], 0) + 1
    lines = [f"{module}: {', '.join(f'{r} x{n}' for r, n in rules.items())}" for module, rules in by_module.items()]
    if len(lines) > most:
        lines = lines[:most] + [f"... and {len(lines) - most} more modules (--report lists each rewrite's)"]
    return lines


def _modules_label(modules: list[str], width: int = 80) -> str:
    """The modules a rewrite spans, joined with " + " up to about `width` characters, the rest
    counted ("a (Conv2d) + b (Conv2d) and 64 more"): one line a terminal shows whole."""
    shown: list[str] = []
    for module in modules:
        if shown and len(" + ".join([*shown, module])) > width:
            break
        shown.append(module)
    rest = len(modules) - len(shown)
    return " + ".join(shown) + (f" and {rest} more" if rest else "")


def growth_line(report: OptimizeReport) -> str | None:
    """FLOPs and parameters that grew by more than 5% (a fold can trade them for fewer, larger
    ops; `--strategy all` takes every such trade), in words; None where neither did."""
    growth: Mapping[str, Any] = report.get("growth") or {}
    before: Mapping[str, Any] = report["before"]
    after: Mapping[str, Any] = report["after"]
    grown = [
        f"{label} {si(before[key])} -> {si(after[key])} ({growth[key]:.3g}x)"
        for key, label in (("flops", "FLOPs"), ("params", "parameters"))
        if growth.get(key) and growth[key] > 1.05
    ]
    if not grown:
        return None
    why = " under --strategy all (every exact rewrite, whatever it costs)" if report.get("strategy") == "all" else ""
    return f"grew: {', '.join(grown)}{why}"


def validation_line(validation: Mapping[str, Any]) -> str:
    """The validation's verdict in one line: against the exact (float64) result, the
    optimized graph's error and the original's own (its noise floor), each the largest over
    the outputs; against float32 runs, the largest difference (and why there was no float64)."""
    verdict = "[green]passed[/green]" if validation["passed"] else "[red]FAILED[/red]"
    runs = f"{validation['runs']} run" + ("" if validation["runs"] == 1 else "s")
    outputs = validation["outputs"].values()
    worst = max((e["max_abs"] for e in outputs), default=0.0)
    exact = [e for e in outputs if e.get("exact_error") is not None]
    if not exact:
        why = f" (no float64 reference: {validation['reference_note']})" if validation.get("reference_note") else ""
        return f"validation: {verdict} over {runs}, max abs error {worst:.3g}{why}"
    error = max(e["exact_error"] for e in exact)
    own = max(e["exact_error_original"] for e in exact)
    where = f", {validation['reference_note']}" if validation.get("reference_note") else ""
    whose = " (the torch model's own)" if validation.get("reference_source") == "torch" else ""
    return (
        f"validation: {verdict} over {runs} against the float64 result{whose}{where}: error {error:.3g}, "
        f"the original's own {own:.3g} (max abs)"
    )


def precision_lines(precision: Precision, where_listed: str = "the report's kept_float32") -> list[str]:
    """The half-precision model in two lines: its error against the exact result with the
    bound (the worst output by its bound), then what runs in which type (the nodes kept
    float32 listed, with why, `where_listed`)."""
    judged = precision["validation"]
    name, worst = max(judged["outputs"].items(), key=lambda item: _over_bound(item[1]["error"], item[1]["bound"]))
    verdict = "passed" if judged["passed"] else "FAILED"
    which = f" (output {name!r})" if len(judged["outputs"]) > 1 else ""
    kept = Counter(entry["op"] for entry in precision["kept_float32"])
    listed = ", ".join(f"{op} x{count}" for op, count in kept.most_common(6))
    more = f" and {len(kept) - 6} more ops" if len(kept) > 6 else ""
    total = precision["nodes_half"] + precision["nodes_float32"]
    interface = "" if precision["io_dtype"] == "float32" else f", {precision['io_dtype']} inputs and outputs"
    if precision["nodes_half"] == 0:
        where = f"  no node runs in {precision['dtype']}: the model written computes in float32"
    else:
        where = f"  {precision['nodes_half']} of {total} nodes in {precision['dtype']}"
    own = " (max abs)"
    if judged.get("bound_by") == "rounded" and "error_rounded" in worst:  # (schema 1.2)
        own = (
            f", the model's with every value rounded to {precision['dtype']} {worst['error_rounded']:.3g} (max abs; "
            "the bound counts the latter: the error is spread through the model)"
        )
    return [
        f"{precision['dtype']}: {verdict} against the {judged['against']} result{which}: error {worst['error']:.3g}, "
        f"bound {worst['bound']:.3g}, the original's own {worst['error_original']:.3g}{own}",
        f"{where}, {plural(precision['casts'], 'Cast')}{interface}"
        + (f"; float32: {listed}{more} (each with why: {where_listed})" if kept else ""),
    ]


def nonfinite_line(validation: Mapping[str, Any]) -> str | None:
    """A note where the original itself gives NaN or infinities: there the optimized graph is
    only checked to give the same, so the validation says less than its verdict suggests."""
    counted = [(name, e) for name, e in validation["outputs"].items() if e.get("nonfinite")]
    if not counted:
        return None
    name, worst = max(counted, key=lambda item: item[1]["nonfinite"])
    others = f" (and {len(counted) - 1} more output{'s' if len(counted) > 2 else ''})" if len(counted) > 1 else ""
    data = validation.get("nonfinite_on", "the input sets")  # (a report before 1.6 does not say which)
    return (
        f"note: on {data} the original gives NaN or infinity at {worst['nonfinite']} of {worst['elements']} "
        f"elements of output {name!r}{others}; there the optimized graph was only checked to give the same"
        + ("; give real inputs with --input-data DATA.npz for a full check" if data == "made-up inputs" else "")
    )


def export_check_line(validation: Mapping[str, Any]) -> str | None:
    """A line where the torch model's own float64 run and the exported ONNX graph's disagree:
    the exporter changed the model (convexport then judged its rewrite against the ONNX graph)."""
    check = validation.get("export_check") or {}
    if check.get("agrees") is not False:
        return None
    where = (
        f"on input set(s) {', '.join(str(i + 1) for i in check['parted_on_input_sets'])}"
        if check.get("parted_on_input_sets")
        else f"output {check.get('output')!r} by {check.get('max_abs_difference', 0):.3g} (float32 rounding explains "
        f"{check.get('bound', 0):.3g})"
    )
    return (
        f"warning: the exported ONNX graph does not compute the torch model ({where}): the exporter changed it; "
        "the rewrite was judged against the ONNX graph"
    )


def device_check_line(on_device: OnDevice) -> str:
    """The check on the device in one line: original and optimized there with TF32 off (the
    largest relative difference over the outputs), and how far TF32 on, ORT's default, moves
    the optimized graph's outputs."""
    verdict = "passed" if on_device["passed"] else "FAILED"
    worst = max((_known(e["max_rel"]) for e in on_device["outputs"].values()), default=0.0)
    line = f"on {on_device['provider']} (TF32 off): {verdict}, max rel difference {worst:.3g} from the original there"
    effect = on_device.get("tf32_effect")
    if effect:
        moved = max(_known(e["max_rel"]) for e in effect.values())
        line += f"; TF32 on (ORT's default) moves the outputs by up to {moved:.3g} relative"
    return line


def speed_line(profile: Profile) -> str:
    """The latency verdict in words: faster or slower only where the whole paired interval says
    so, with the interval's larger side as ± and what was timed (pairs, threads). A report of
    schema 1.4 or older has no interval: its noise stands for it."""
    noise, speedup = profile.get("noise", 0.0), _known(profile["speedup"])
    low, high = profile.get("speedup_interval") or (speedup * (1 - noise), speedup * (1 + noise))
    pairs = profile.get("paired", {}).get("pairs", 0)
    timed = f"{pairs} pairs" if pairs else "timed apart"
    threads = profile.get("threads")
    where = f"{profile['provider']}, " + (plural(threads, "thread") if threads else "ONNX Runtime's default threads")
    if profile["verdict"] in ("no measurable change", "unchanged graph"):
        interval = f"95% interval {low:.2f}-{high:.2f}x"
        itself = profile.get("against_itself")
        if itself:  # slower, by no more than the original reads against a session of itself
            interval += f"; the original against itself {itself['speedup']:.2f}x"
        return f"speed: no measurable change ({profile['speedup']:.2f}x, {interval}, {timed}) on {where}"
    if profile["verdict"] == "faster":
        said = f"[green]{profile['speedup']:.2f}x faster[/green]"
    else:
        said = f"[red]{1 / speedup:.2f}x slower[/red]"
    return f"speed: {said} (±{profile['noise']:.1%}, {timed}) on {where}"


def dropped_for_speed_line(report: OptimizeReport) -> str | None:
    """What was left out because the whole rewrite was slower, or None."""
    choice = report.get("speed_choice")
    if not choice:
        return None
    whole = choice["all_rewrites"]
    every = f"every rewrite timed {whole['speedup']:.2f}x ({whole['low']:.2f}-{whole['high']:.2f})"
    if choice["written_as_given"]:
        return f"written as given: {every}, and no subset of them was faster"
    dropped = report.get("dropped_for_speed", [])
    counts = Counter(rewrite["rule"] for rewrite in dropped)
    left_out = ", ".join(f"{rule} x{count}" for rule, count in counts.items())
    without = f"{dropped[0]['speedup_without']:.2f}x without them" if dropped else "the rest faster"
    return f"dropped for speed: {left_out} ({every}; {without})"


# A first run this long is worth a line: a deployment pays it in every new session (on CUDA,
# cuDNN sets up each convolution, and a folded model has fewer: bench/RESULTS.md, "Measurements
# behind the code").
FIRST_RUN_NOTE_S = 0.5


def timed_inputs_line(report: OptimizeReport) -> str | None:
    """The made-up inputs the profile timed, where the model leaves dims dynamic (their sizes
    are convexport's choice, profile/timed_sizes.py), else None."""
    profile: Mapping[str, Any] = report.get("profile") or {}
    timed = profile.get("inputs")
    dynamic = any(not dim.isdigit() for given in report.get("inputs", []) for dim in given.split(":")[1].split("x"))
    if not timed or not dynamic:
        return None
    names = [":".join(spec.split(":")[:2]) for spec in timed]
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (
        f"timed at {shown} (made up: the dims the model leaves dynamic, but the batch, grown until a run takes "
        "2 ms; --input-data times other sizes)"
    )


def first_run_line(profile: Profile) -> str | None:
    """The first run's time before -> after where either is long (see FIRST_RUN_NOTE_S)."""
    sides: Mapping[str, Any] = profile
    first = [sides.get(side, {}).get("phases_s", {}).get("first_run") for side in ("before", "after")]
    if None in first or max(first) < FIRST_RUN_NOTE_S:
        return None
    return (
        f"first run: {first[0]:.1f} s -> {first[1]:.1f} s (one-off work each new session pays before its "
        "runs settle; the latency above leaves it out)"
    )


def size(count: int) -> str:
    """A byte count in B, KB, MB or GB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


def mebibytes(count: float | None, unit: bool = True) -> str:
    """Memory in MiB, one decimal ("12.3 MiB"; the number alone under a column that names the
    unit); "n/a" for none measured."""
    if count is None:
        return "n/a"
    return f"{count / 2**20:.1f}" + (" MiB" if unit else "")


def si(value: float) -> str:
    """A count with an SI suffix: 16.5M, 2.99k."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"


def _known(value: float | None) -> float:
    """A number the report writes null where it is not finite (JSON has no inf or NaN): inf."""
    return math.inf if value is None else value


def _over_bound(error: float | None, bound: float | None) -> float:
    """An output's error as a multiple of its bound (a null, not finite, as inf)."""
    return _known(error) / max(_known(bound), 1e-300)
