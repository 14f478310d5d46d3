import functools
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SAMPLES = ROOT / "sample_models"
sys.path.insert(0, str(FIXTURES))


def pytest_configure(config):
    """Under pytest-xdist (`make test` runs a worker per core) a worker has one core: the ONNX
    Runtime sessions convexport makes there run one intra-op thread unless a test asks for more,
    not ONNX Runtime's default of one per physical core, whose spinning pools on two cores made
    two workers' timings noise (the profile's verdicts among them). Set before any module of
    convexport has imported create_session."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    # numpy's OpenBLAS and torch's OpenMP pools one thread too, for the same reason: each starts
    # a thread per core, two workers' pools spinning on two cores (bench/RESULTS.md, "Measurements
    # behind the code"); the variables are read when the libraries load, none of which has yet
    assert "numpy" not in sys.modules and "torch" not in sys.modules, "a thread pool sized before this"
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(variable, "1")
    from convexport import runtime

    create_session = runtime.create_session

    @functools.wraps(create_session)
    def on_one_core(*arguments, threads=None, **keywords):
        return create_session(*arguments, threads=threads or 1, **keywords)

    runtime.create_session = on_one_core


def pytest_collection_modifyitems(items):
    """The tests marked `long` (end-to-end runs of tens of seconds each) first: make test's
    workers start on them and share what is left, rather than one of them starting a long run
    as the others finish."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture(scope="session")
def small_net_path() -> Path:
    return FIXTURES / "small_net.py"


def model_interface(model) -> list:
    """A model's inputs (not its weights) and outputs: name, element type, dims (value or name)."""
    graph = model.graph
    weights = {init.name for init in graph.initializer}

    def described(value):
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in tensor.shape.dim]
        return value.name, tensor.elem_type, dims if tensor.HasField("shape") else None

    return [[described(v) for v in graph.input if v.name not in weights], [described(v) for v in graph.output]]


@pytest.fixture(autouse=True)
def interface_is_the_contract(monkeypatch):
    """Every model the suite optimizes in this process keeps the interface of the graph it was
    validated against: input and output names, element types, every dim and dim name (issue 50;
    what --input fixes is in that graph already), but for float element types made float16 by
    --io-dtype fp16, which asks for it."""
    from convexport import pipeline

    optimize_once = pipeline._optimize

    def checked(model, options):
        result = optimize_once(model, options)
        if result.original is not None and result.model is not result.original:
            expected = model_interface(result.original)
            if options.io_dtype in ("fp16", "float16"):
                expected = [[(name, 10 if kind == 1 else kind, dims) for name, kind, dims in side] for side in expected]
            assert model_interface(result.model) == expected, "the interface changed"
        return result

    monkeypatch.setattr(pipeline, "_optimize", checked)


@pytest.fixture(scope="session")
def report_validator():
    """Validators of the shipped report schema (convexport report-schema): None's accepts any
    of the reports, each kind's (optimize, validate, profile) that kind only, whose messages
    say what is wrong with it rather than with another kind."""
    import jsonschema

    from convexport.report.schema import json_schema
    from convexport.report.types import REPORTS

    schema = json_schema()
    kinds = {kind: {**schema, "anyOf": [{"$ref": f"#/$defs/{typed.__name__}"}]} for kind, typed in REPORTS.items()}
    return {kind: jsonschema.Draft202012Validator(each) for kind, each in {None: schema, **kinds}.items()}


def schema_problem(validators, report) -> str | None:
    """Where `report` (as its JSON reads back) breaks the schema, or None."""
    import jsonschema

    from convexport.errors import ConvexportError
    from convexport.report.words import as_json_text
    from convexport.report.schema import report_header

    written = json.loads(as_json_text(report))
    try:
        validator = validators[report_header(written).kind]
    except ConvexportError:
        validator = validators[None]
    errors = list(validator.iter_errors(written))
    if not errors:
        return None
    worst = jsonschema.exceptions.best_match(errors)
    return f"{worst.json_path}: {worst.message[:300]}"


@pytest.fixture(autouse=True)
def reports_match_the_schema(monkeypatch, report_validator, request):
    """Every report the suite makes, written (optimize, validate and profile --report) or
    returned (OptimizeResult.report, a ValidationError's), is one the shipped JSON Schema
    accepts (issue 53): a field written but not declared in report/types.py, or of another
    type, fails the test that wrote it. Reports written by a `convexport` process the test
    started are read from the test's tmp_path when it ends."""
    from convexport import pipeline
    from convexport.report import words as report
    from convexport.errors import ValidationError

    def check(made: dict) -> None:
        problem = schema_problem(report_validator, made)
        assert problem is None, f"the report breaks the schema at {problem}"

    optimize_once = pipeline._optimize

    def checked(model, options):
        try:
            result = optimize_once(model, options)
        except ValidationError as failed:
            if failed.report is not None:
                check(failed.report)
            raise
        check(result.report)
        return result

    monkeypatch.setattr(pipeline, "_optimize", checked)
    write_json = report.write_json

    def written(made: dict, destination) -> None:
        check(made)
        write_json(made, destination)

    monkeypatch.setattr(report, "write_json", written)
    folder = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if folder is not None:
        for path in sorted(path for path in folder.rglob("*.json") if path.is_file()):  # never a test's FIFO
            written_report = _report_in(path)
            if written_report is not None:
                problem = schema_problem(report_validator, written_report)
                assert problem is None, f"{path.name} breaks the report schema at {problem}"


def _report_in(path: Path):
    """The report a JSON file holds, or None for any other file (or one that is not JSON)."""
    from convexport.errors import ConvexportError
    from convexport.report.schema import report_header

    try:
        found = json.loads(path.read_text(encoding="utf-8"))
        report_header(found)
    except (OSError, ValueError, RecursionError, ConvexportError):  # RecursionError: a test's hostile JSON
        return None
    return found
