"""The optimize report's sections (issue 53): one list, read by the terminal summary and the
HTML page alike, that shows every top-level field of the typed report."""

from __future__ import annotations

import inspect
import io
import json
from pathlib import Path

from rich.console import Console

from convexport.report import html as report_html, terminal as report_terminal
from convexport.report.sections import NOT_SHOWN, SECTIONS, print_optimize_summary, render
from convexport.report.types import OptimizeReport

REPORT = Path(__file__).parent / "fixtures" / "reports" / "optimize-1.0.json"


def test_every_field_of_the_report_is_shown_or_said_not_to_be():
    shown = {field for section in SECTIONS for field in section.fields}
    declared = OptimizeReport.__required_keys__ | OptimizeReport.__optional_keys__
    assert declared - shown - NOT_SHOWN == set(), "a report field no section shows (report/sections.py)"
    assert (shown | NOT_SHOWN) - declared == set(), "a section names a field the report does not declare"
    assert not shown & NOT_SHOWN


def test_every_section_is_rendered_somewhere_and_every_renderer_is_listed():
    assert all(section.terminal or section.html for section in SECTIONS)
    listed = {section.terminal for section in SECTIONS} | {section.html for section in SECTIONS}
    for module, helpers in ((report_terminal, {"explanations"}), (report_html, {"page"})):
        public = {
            function
            for name, function in inspect.getmembers(module, inspect.isfunction)
            if function.__module__ == module.__name__ and not name.startswith("_") and name not in helpers
        }
        assert public <= listed, f"{module.__name__}: renderers not in SECTIONS: {public - listed}"


def test_a_section_without_its_field_shows_nothing_of_it():
    report = json.loads(REPORT.read_text(encoding="utf-8"))
    terminal, page = _shown(report)
    assert "rewrites: conv-conv x1" in terminal and "<h2>Rewrites</h2>" in page
    assert "speed: " in terminal and "<h2>Latency on CPUExecutionProvider</h2>" in page
    report["profile"] = None
    terminal, page = _shown(report)
    assert "speed: " not in terminal and "Latency on" not in page and "latency ms" not in terminal


def test_the_operators_chart_is_in_the_graphs_order_for_equal_counts():
    report = json.loads(REPORT.read_text(encoding="utf-8"))
    report["before"]["ops"] = {"Zeta": 2, "Alpha": 2, "Mid": 2}
    report["after"]["ops"] = {"Zeta": 1, "Alpha": 1, "Mid": 1}
    page = render(report)
    chart = page[page.index("<h2>Operators</h2>") :]
    assert chart.index(">Zeta<") < chart.index(">Alpha<") < chart.index(">Mid<")


def _shown(report) -> tuple[str, str]:
    buffer = io.StringIO()
    print_optimize_summary(report, Console(file=buffer, width=120, emoji=False, soft_wrap=True))
    return buffer.getvalue(), render(report)
