"""The JSON Schema of convexport's reports, made from their declarations in report/types.py,
and what a report file says of itself (its kind and schema version).

The schema (draft 2020-12) has one definition per TypedDict, named as the class: its fields
as `properties` with their declared descriptions, the fields not marked NotRequired as
`required`, and no other fields (`additionalProperties: false`) but in the sections declared
open (report_types.OPEN_SECTIONS). The document itself is any one of the three reports.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConvexportError, first_line
from ..util.files import check_readable_file
from . import types as report_types

SCHEMA_ID = f"urn:convexport:report-schema:{report_types.SCHEMA_VERSION}"  # a name, not an address to fetch


def json_schema() -> dict:
    """The schema of every report this version writes."""
    definitions: dict[str, dict] = {}
    choices = [_schema_of(report, definitions) for report in report_types.REPORTS.values()]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "convexport report",
        "description": (
            f"A report of `convexport optimize`, `validate` or `profile` (--report), schema version "
            f"{report_types.SCHEMA_VERSION}: one of {', '.join(report_types.REPORTS)}."
        ),
        "anyOf": choices,
        "$defs": dict(sorted(definitions.items())),
    }


def schema_text() -> str:
    """The schema as `convexport report-schema` prints it."""
    return json.dumps(json_schema(), indent=2) + "\n"


def _schema_of(annotation, definitions: dict[str, dict]) -> dict:
    """The schema of one declared type; a TypedDict is defined once, under its name, and
    referred to."""
    description = None
    if typing.get_origin(annotation) is typing.Annotated:
        annotation, description = annotation.__origin__, annotation.__metadata__[0]
    schema = _bare_schema(annotation, definitions)
    return {**schema, "description": description} if description else schema


def _bare_schema(annotation, definitions: dict[str, dict]) -> dict:
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if typing.is_typeddict(annotation):
        name = annotation.__name__
        if name not in definitions:
            definitions[name] = {}  # taken before its fields, which may refer to it
            definitions[name] = _object_schema(annotation, definitions)
        return {"$ref": f"#/$defs/{name}"}
    if origin in (types.UnionType, typing.Union):
        return {"anyOf": [_schema_of(argument, definitions) for argument in arguments]}
    if origin is typing.Literal:
        return {"enum": list(arguments)}
    if origin is list:
        return {"type": "array", "items": _schema_of(arguments[0], definitions)}
    if origin is dict:
        return {"type": "object", "additionalProperties": _schema_of(arguments[1], definitions)}
    if annotation is typing.Any:
        return {}
    if annotation in _SCALARS:
        return {"type": _SCALARS[annotation]}
    raise TypeError(f"report_types: no JSON Schema for {annotation!r}")


_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}


def _object_schema(declared, definitions: dict[str, dict]) -> dict:
    hints = typing.get_type_hints(declared, include_extras=True)
    properties = {}
    for field, hint in hints.items():
        while typing.get_origin(hint) in (typing.NotRequired, typing.Required):
            hint = typing.get_args(hint)[0]
        properties[field] = _schema_of(hint, definitions)
    return {
        "type": "object",
        "description": " ".join((declared.__doc__ or "").split()),
        "properties": properties,
        "required": [field for field in hints if field in declared.__required_keys__],
        "additionalProperties": declared in report_types.OPEN_SECTIONS,
    }


@dataclass(frozen=True)
class ReportHeader:
    """What a report file says of itself."""

    kind: str  # optimize, validate or profile
    schema_version: str  # "0" for a report written before reports had one
    convexport_version: str | None  # the convexport that wrote it, where the report says


def report_header(report: dict, where: str = "the report") -> ReportHeader:
    """The kind and version of a report (a dict as read from its JSON)."""
    if not isinstance(report, dict):
        raise ConvexportError(f"{where}: not a convexport report (a JSON {type(report).__name__}, not an object)")
    if "before" in report and "rewrites" in report:
        kind = "optimize"
    elif "passed" in report and "outputs" in report:
        kind = "validate"
    elif isinstance(report.get("model"), dict) and "latency_ms" in report["model"]:
        kind = "profile"
    else:
        raise ConvexportError(f"{where}: not a convexport report (none of optimize's, validate's or profile's fields)")
    version = report.get("schema_version", "0")
    return ReportHeader(kind, str(version), report.get("convexport_version"))


def read_report_header(path: str | Path) -> ReportHeader:
    """The kind and version of the report in the file at `path` (a regular file: a FIFO or a
    device is refused, never read)."""
    check_readable_file(str(path), Path(path), "a report's JSON file")
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConvexportError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConvexportError(f"{path}: not JSON ({exc})") from None
    except RecursionError:  # arrays or objects nested tens of thousands deep
        raise ConvexportError(f"{path}: not a convexport report (JSON nested too deep to read)") from None
    except ValueError as exc:  # a number of more digits than Python converts ("Exceeds the limit ...")
        reason = first_line(exc)
        raise ConvexportError(f"{path}: not a convexport report (JSON that cannot be read: {reason})") from None
    return report_header(report, str(path))


def markdown_reference() -> str:
    """Every report's fields as Markdown tables, a section per declared type in the order the
    reports first name them (docs/commands.md holds it between its markers)."""
    schema = json_schema()
    definitions = schema["$defs"]
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        order.append(name)
        for field in definitions[name]["properties"].values():
            for referred in _referred(field):
                visit(referred)

    for choice in schema["anyOf"]:
        visit(_referred(choice)[0])
    lines = []
    for name in order:
        definition = definitions[name]
        required = set(definition["required"])
        lines += [f"### `{name}`", "", definition["description"], ""]
        if definition["additionalProperties"]:
            lines += ["More fields may be present: a primitive's or a method's own.", ""]
        lines += ["| field | type | meaning |", "|---|---|---|"]
        for field, field_schema in definition["properties"].items():
            meaning = field_schema.get("description", "")
            if field not in required:
                meaning += " (where it applies)"
            lines.append(f"| `{field}` | {_type_words(field_schema)} | {meaning} |")
        lines.append("")
    return "\n".join(lines)


def _referred(schema: dict) -> list[str]:
    """The definitions a field's schema names, in order."""
    if "$ref" in schema:
        return [schema["$ref"].rsplit("/", 1)[1]]
    nested = [*schema.get("anyOf", []), schema.get("items"), schema.get("additionalProperties")]
    return [name for part in nested if isinstance(part, dict) for name in _referred(part)]


def _type_words(schema: dict) -> str:
    """A field's type as the Markdown reference writes it: `integer`, `list of Rewrite`."""
    if "$ref" in schema:
        return f"[{schema['$ref'].rsplit('/', 1)[1]}](#{schema['$ref'].rsplit('/', 1)[1].lower()})"
    if "anyOf" in schema:
        return " or ".join(_type_words(part) for part in schema["anyOf"])
    if "enum" in schema:
        return " or ".join(json.dumps(value) for value in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        return f"list of {_type_words(schema['items'])}"
    if kind == "object":
        return f"map of string to {_type_words(schema['additionalProperties'])}"
    return kind or "any JSON value"


FIELDS_BEGIN = "<!-- generated by `convexport report-schema --markdown`; tests/test_report_schema.py checks it -->\n"
FIELDS_END = "<!-- end of the generated fields -->\n"


def with_fields(document: str) -> str:
    """`document` (docs/commands.md) with the fields between its markers as this version's
    (`make report-docs` writes it back)."""
    begin = document.index(FIELDS_BEGIN) + len(FIELDS_BEGIN)
    end = document.index(FIELDS_END, begin)
    return f"{document[:begin]}\n{markdown_reference()}\n{document[end:]}"
