"""The reports' JSON Schema (issue 53): made from report/types.py, shipped, documented, and
able to tell a report that breaks it. That every report the suite writes meets it is checked
by conftest.reports_match_the_schema, on every test."""

from __future__ import annotations

import json
import os
import re
import typing
from pathlib import Path

import jsonschema
import pytest
from conftest import ROOT, schema_problem
from helpers import assert_user_error, invoke

from convexport.report import types as report_types
from convexport.errors import ConvexportError
from convexport.report.schema import json_schema, report_header, schema_text, with_fields

REPORTS = Path(__file__).parent / "fixtures" / "reports"  # written by this version (schema 1.0)
DOCS = ROOT / "docs"


def test_the_schema_is_a_valid_draft_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(json_schema())


def test_the_shipped_schema_is_the_generated_one():
    shipped = (DOCS / "report.schema.json").read_text(encoding="utf-8")
    assert shipped == schema_text(), "docs/report.schema.json is stale: make report-docs"


def test_the_command_prints_the_schema_and_names_a_report():
    printed = invoke("report-schema")
    assert printed.exit_code == 0 and json.loads(printed.stdout) == json_schema()
    named = invoke("report-schema", REPORTS / "optimize-1.0.json")
    assert named.exit_code == 0
    assert "optimize report, schema version 1.0 (convexport " in named.stdout


def test_the_fields_in_the_docs_are_the_generated_ones():
    text = (DOCS / "commands.md").read_text(encoding="utf-8")
    assert with_fields(text) == text, "docs/commands.md's fields are stale: make report-docs"
    assert "|" not in "".join(_descriptions(json_schema())), "a description with | breaks its Markdown table"


def _descriptions(schema) -> list[str]:
    if isinstance(schema, dict):
        return [schema.get("description", ""), *(d for value in schema.values() for d in _descriptions(value))]
    if isinstance(schema, list):
        return [d for value in schema for d in _descriptions(value)]
    return []


@pytest.mark.parametrize("kind", ["optimize", "validate", "profile"])
def test_a_report_of_this_version_reads_back_and_says_which_it_is(kind, report_validator):
    report = json.loads((REPORTS / f"{kind}-1.0.json").read_text(encoding="utf-8"))
    assert schema_problem(report_validator, report) is None
    header = report_header(report)
    assert (header.kind, header.schema_version) == (kind, "1.0")  # read by the schema of 1.1: a field added


def test_a_report_from_before_the_schema_is_version_0():
    report = json.loads((REPORTS / "optimize-1.0.json").read_text(encoding="utf-8"))
    del report["schema_version"]
    assert report_header(report).schema_version == "0"
    assert (report_header(report).kind, report_header(report).convexport_version) == ("optimize", "0.1.0")


def test_what_is_not_a_report_is_said_in_one_line(tmp_path):
    with pytest.raises(ConvexportError, match="not a convexport report"):
        report_header([1, 2])
    notes = tmp_path / "notes.json"
    notes.write_text('{"speed": "fast"}')
    assert_user_error(invoke("report-schema", notes), "notes.json", "not a convexport report")
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert_user_error(invoke("report-schema", broken), "broken.json", "not JSON")
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)  # reading it would wait for a writer forever
    assert_user_error(invoke("report-schema", fifo), "pipe.json", "not a regular file", "give a report's JSON file")
    assert "model" not in invoke("report-schema", fifo).stderr
    assert_user_error(invoke("report-schema", tmp_path), str(tmp_path), "is a folder, not a report's JSON file")


@pytest.mark.parametrize(
    "text",
    ["[" * 100_000 + "]" * 100_000, '{"a": ' * 50_000 + "1" + "}" * 50_000, '{"schema_version": 1' + "0" * 100_000 + "}"],
    ids=["nested-arrays", "nested-objects", "a-number-of-100000-digits"],
)
def test_hostile_json_is_one_line_and_exit_1(tmp_path, text):
    """JSON that Python's reader cannot take (RecursionError, the integer digits limit) was an
    internal error, exit 70."""
    hostile = tmp_path / "hostile.json"
    hostile.write_text(text)
    assert_user_error(invoke("report-schema", hostile), "hostile.json", "not a convexport report")


def _mutated(change) -> dict:
    report = json.loads((REPORTS / "optimize-1.0.json").read_text(encoding="utf-8"))
    change(report)
    return report


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda r: r["before"].update(nodes="12"), "$.before.nodes"),
        (lambda r: r["before"].update(surprise=1), "$.before"),
        (lambda r: r["environment"].update(gpu=3), "$.environment.gpu"),
        (lambda r: r["validation"]["outputs"]["conv2d_1"].pop("max_abs"), "$.validation.outputs.conv2d_1"),
        (lambda r: r["profile"].update(verdict="quicker"), "$.profile.verdict"),
        (lambda r: r.pop("rewrites"), "$"),
    ],
)
def test_the_schema_catches_a_field_missing_mistyped_or_undeclared(change, where, report_validator):
    problem = schema_problem(report_validator, _mutated(change))
    assert problem is not None and problem.startswith(where), problem


def test_a_rewrite_and_its_decision_may_carry_their_primitives_own_fields(report_validator):
    report = _mutated(lambda r: r["rewrites"][0]["decision"].update(macs_per_row=12))
    assert schema_problem(report_validator, report) is None
    report = _mutated(lambda r: r["rewrites"][0].update(my_primitives_note="a user primitive's Rewrite.extra"))
    assert schema_problem(report_validator, report) is None


def test_every_declared_type_is_part_of_a_report():
    declared = {name: value for name, value in vars(report_types).items() if typing.is_typeddict(value)}
    defined = set(json_schema()["$defs"])
    assert defined <= set(declared)

    def fields(name: str) -> frozenset[str]:
        return declared[name].__required_keys__ | declared[name].__optional_keys__

    for unnamed in set(declared) - defined:  # a base of a section the reports name: its fields are that one's
        assert any(fields(unnamed) < fields(name) for name in defined), f"{unnamed} is in no report"


def test_the_report_says_its_schema_version():
    assert re.fullmatch(r"\d+\.\d+", report_types.SCHEMA_VERSION)
    for kind in ("optimize", "validate", "profile"):
        report = json.loads((REPORTS / f"{kind}-1.0.json").read_text(encoding="utf-8"))
        assert next(iter(report)) == "schema_version"


def test_the_result_objects_hold_every_field_their_report_entry_declares():
    """A result object's to_report() writes the fields its TypedDict declares (report/types.py, the
    one list): the object holds each of them, and nothing it holds goes unreported but by design."""
    import dataclasses

    from convexport.half.kept import KeptFloat32
    from convexport.validate.results import OutputError

    for result, declared in [(OutputError, report_types.OutputError), (KeptFloat32, report_types.KeptFloat32)]:
        assert [slot.name for slot in dataclasses.fields(result)] == list(declared.__annotations__), result.__name__
    error = OutputError(max_abs=2.0, elements=4, exact_error=1e-3)
    assert list(error.to_report()) == [name for name in report_types.OutputError.__annotations__
                                       if name != "exact_error_rounded"]
    merged = error.merge(OutputError(max_abs=1.0, mean_abs=1.0, elements=12, cosine=0.5, exact_error=2e-3, nonfinite=1))
    assert (merged.max_abs, merged.mean_abs, merged.elements, merged.cosine, merged.exact_error, merged.nonfinite) == (
        2.0, 0.75, 16, 0.5, 2e-3, 1)
