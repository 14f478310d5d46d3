"""The optimize report's sections, in the one list both front ends render: the terminal
summary (report/terminal.py) and the HTML page (report/html.py).

A section names the report fields it shows and its renderer on each front end; a front end
without one leaves the section out. Both read the list from top to bottom. A section shown in
two places (the environment is the page's header and the summary's last lines) is two entries,
each with one renderer. Showing a new report field is one renderer function and one entry here
(tests/test_report_sections.py fails for a top-level field no entry shows or lists as unshown).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from ..util.files import write_text_atomically
from . import html, terminal
from .types import OptimizeReport


@dataclass(frozen=True)
class Section:
    fields: tuple[str, ...]  # the report's top-level fields it shows
    terminal: Callable[[OptimizeReport, Console], None] | None = None
    html: Callable[[OptimizeReport], list[str]] | None = None


_MADE = ("model", "output", "output_weights", "convexport_version", "exporter", "opset")

SECTIONS: list[Section] = [
    Section(_MADE, terminal.title, html.title),
    Section(("inputs", "outputs"), terminal.interface, html.interface),
    Section(("notes", "input_changes", "conversions"), html=html.notes),
    Section(("environment", "timings_s"), html=html.environment),
    Section(("export_warnings",), html=html.export_warnings),
    Section(("before", "after", "profile", "size_regression"), terminal.graph, html.graph),
    Section(("before", "after"), html=html.operators),
    Section(("profile",), html=html.latency),
    Section(("export_warnings",), terminal.export_warnings),
    Section(("constant_folding",), terminal.constant_folding),
    Section(("notes", "input_changes", "conversions"), terminal.notes),
    Section(("overridable_inputs",), terminal.overridable_inputs),
    Section(("rewrites",), terminal.rewrites, html.rewrites),
    Section(("skipped",), terminal.skipped, html.skipped),
    Section(("validation", "made_up_inputs"), terminal.validation),
    Section(("precision",), terminal.precision),
    Section(("profile_skipped",), terminal.profile_skipped),
    Section(("speed_choice", "dropped_for_speed", "speed_choice_skipped"), terminal.dropped_for_speed),
    Section(("profile",), terminal.speed),
    Section(("size_regression",), terminal.size_regression),
    Section(("deduplicated_initializers",), terminal.deduplicated_initializers),
    Section(("runtime_fusions",), terminal.runtime_fusions, html.runtime_fusions),
    Section(("transformer_fusions",), terminal.transformer_fusions, html.transformer_fusions),
    Section(("low_rank_branches_left",), terminal.low_rank_branches, html.low_rank_branches),
    Section(("validation", "made_up_inputs"), html=html.validation),
    Section(("precision",), html=html.precision),
    Section(("growth",), terminal.growth),
    Section(("environment",), terminal.environment),
    Section(("timings_s",), terminal.timings),
]

# Fields neither front end shows: what says how the report itself was made, the per-rewrite
# detail that the rewrites' lines sum up, and --explain's answers (print_explanations').
NOT_SHOWN = frozenset({"schema_version", "strategy", "explain", "explain_modules"})


def print_optimize_summary(report: OptimizeReport, console: Console) -> None:
    """The summary optimize prints on a terminal."""
    for section in SECTIONS:
        if section.terminal is not None:
            section.terminal(report, console)


def print_explanations(report: OptimizeReport, console: Console) -> None:
    """--explain's answers, after the summary."""
    terminal.explanations(report, console)


def render(report: OptimizeReport) -> str:
    """The HTML page of `report`."""
    return html.page([part for section in SECTIONS if section.html is not None for part in section.html(report)])


def write_html(report: OptimizeReport, destination: str | Path) -> None:
    write_text_atomically(render(report), destination)
