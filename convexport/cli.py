"""The command line. The only module that knows exit codes:

0 done; 1 user error (one line on stderr); 2 usage error; 3 validation failed (nothing
written); 70 an internal error (a bug in convexport: one line, --debug for the traceback).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import random
import sys
import traceback
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from .errors import ConvexportError, InternalError, ValidationError, did_you_mean, first_line
from .options import FLAGS, GROUPS, MODEL, OUTPUT, OptimizeOptions, from_flags
from .util.files import Terminated, ending_signals_raise, interrupts_held

EXIT_USER, EXIT_VALIDATION, EXIT_INTERNAL = 1, 3, 70

HELP = {"help_option_names": ["-h", "--help"]}
app = typer.Typer(
    no_args_is_help=True,
    context_settings=HELP,
    pretty_exceptions_enable=False,
    help="Export PyTorch models to ONNX, fold their linear structure exactly, prove it.",
)
rules_app = typer.Typer(no_args_is_help=True, context_settings=HELP, help="List, show, check and test rule files.")
app.add_typer(rules_app, name="rules")

# emoji off: a model named weights.onnx:x would print with ":x:" as a cross mark
stdout = Console(highlight=False, soft_wrap=True, emoji=False)  # user text and numbers unmarked
stderr = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)
_debug = False


def _print_version(asked: bool) -> None:
    if asked:
        from . import __version__

        stdout.print(f"convexport {__version__}", markup=False, highlight=False)
        raise typer.Exit()


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks (anywhere on the line).")] = False,
    version: Annotated[
        bool, typer.Option("--version", help="Print the version and exit.", callback=_print_version, is_eager=True)
    ] = False,
):
    global _debug
    _debug = _debug or debug  # main() takes --debug from anywhere on the line


def flag_option(name: str, *, grouped: bool = False):
    """The typer parameter of OptimizeOptions' option `name` as options.py declares it (its
    flag, help and, `grouped`, its help group): optimize takes every one, the other commands
    the ones they share."""
    flag = FLAGS[name]
    kind = flag.kind if flag.kind is bool else flag.kind | None
    shown = typer.Option(
        *flag.names,
        help=flag.help.replace("[", "\\["),  # typer's help is rich markup: RULE[@MODULE] is text, not a tag
        min=flag.minimum,
        rich_help_panel=flag.group if grouped else None,
    )
    return Annotated[kind, shown]


InputOpt = flag_option("inputs")
RtolOpt = flag_option("rtol")
AtolOpt = flag_option("atol")
OpsetOpt = flag_option("opset")
DynamicOpt = flag_option("dynamic_batch")
LibraryOpt = flag_option("custom_ops_libraries")
NoPerOpOpt = flag_option("per_op")
ThreadsOpt = flag_option("threads")
DeviceOpt = flag_option("device")
TrustOpt = flag_option("trust_pickle")


def with_option_flags(command):
    """`command` (its own parameters, then **flags) with a parameter per flag of options.py:
    typer reads the signature, and the command gets each flag's value under its option's name.
    Its help shows them by group (options.GROUPS' order), the command's own options among them."""
    own = [
        parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        for parameter in inspect.signature(command, eval_str=True).parameters.values()
        if parameter.kind is not inspect.Parameter.VAR_KEYWORD
    ]
    flags = [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            annotation=flag_option(name, grouped=True),
            default=False if flag.kind is bool else _shown_default(name),
        )
        for name, flag in FLAGS.items()
    ]
    arguments = [parameter for parameter in own if _group(parameter) is None]
    options = sorted([*flags, *(parameter for parameter in own if _group(parameter) is not None)],
                     key=lambda parameter: GROUPS.index(_group(parameter)))  # fmt: skip
    command.__signature__ = inspect.Signature([*arguments, *options])
    return command


def _group(parameter: inspect.Parameter) -> str | None:
    """The help group an option parameter names (None for an argument)."""
    metadata = getattr(parameter.annotation, "__metadata__", ())
    return next((getattr(info, "rich_help_panel", None) for info in metadata), None)


def _shown_default(name: str):
    """A value flag's default as help shows it: the option's, where it is a plain value."""
    default = OptimizeOptions.__dataclass_fields__[name].default
    return default if isinstance(default, str | int | float) and not isinstance(default, bool) else None


@app.command()
@with_option_flags
def optimize(
    model: Annotated[
        str,
        typer.Argument(help="*.onnx, *.pt/*.pth (TorchScript), *.pt2, file.py[:callable] or package.module:callable."),
    ],
    report: Annotated[
        Path | None, typer.Option("--report", help="Write the JSON report here.", rich_help_panel=OUTPUT)
    ] = None,
    html: Annotated[
        Path | None, typer.Option("--html", help="Write an HTML report here.", rich_help_panel=OUTPUT)
    ] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No summary and no progress; errors only.", rich_help_panel=OUTPUT)
    ] = False,
    inputs_besides: Annotated[
        Path | None,
        typer.Option(
            "--inputs", help="DATA.npz of real input arrays, validated on besides random ones.", rich_help_panel=MODEL
        ),
    ] = None,
    **flags,
):
    """Export MODEL, fold its linear structure, validate, profile and write the result."""

    def write_reports(written: dict) -> None:
        """--report and --html, of the run or of its failure (imported here: after the first line)."""
        from .report.sections import write_html
        from .report.words import write_json

        if report is not None:
            write_json(written, report)
        if html is not None:
            write_html(written, html)

    def run():
        reports = [("--report", report), ("--html", html)]
        if inputs_besides is not None and flags["input_data"] is not None:
            raise ConvexportError("--inputs and --input-data: give one (besides random inputs, or instead of them)")
        _check_model_is_there(model)
        _check_outputs([model_file(model), inputs_besides or flags["input_data"]], [("-o", flags["output"]), *reports])
        try:
            with _progress(quiet) as progress:
                progress("loading")  # the first line, before the libraries of the stages are imported
                with interrupts_held():
                    from . import pipeline

                options = OptimizeOptions(
                    **from_flags(flags),
                    **({"input_data": inputs_besides} if inputs_besides is not None else {}),
                    made_up_inputs=flags["input_data"] is None,
                    progress=progress,
                    other_outputs=[(option, path) for option, path in reports if path is not None],
                )
                result = pipeline.optimize(model, options=options)
        except ValidationError as exc:
            written = [f"{option} {path}" for option, path in reports if path is not None]
            if exc.report is None or not written:
                raise
            write_reports(exc.report)
            raise ValidationError(f"{exc} ({' and '.join(written)}: this failure's report)", exc.report) from exc
        from .report.sections import print_explanations, print_optimize_summary

        write_reports(result.report)
        if not quiet and not _is_stdout(report):  # the JSON is what stdout carries then
            print_optimize_summary(result.report, stdout)
            print_explanations(result.report, stdout)

    _guarded(run)


@app.command()
def export(
    model: Annotated[
        str, typer.Argument(help="*.onnx, *.pt/*.pth, *.pt2, file.py[:callable] or package.module:callable.")
    ],
    output: Annotated[Path, typer.Option("-o", "--output", help="Where to write the ONNX model.")],
    input: InputOpt = None,
    opset: OpsetOpt = None,
    dynamic_batch: DynamicOpt = False,
    trust_pickle: TrustOpt = False,
):
    """Export MODEL to ONNX without rewriting it."""

    def run():
        _check_model_is_there(model)
        with interrupts_held():
            from .pipeline import export_only
            from .report.words import tracer_warning

        def warn(warning: str) -> None:
            stdout.print(tracer_warning(warning), markup=False)

        stdout.print(f"wrote {export_only(model, output, input or [], opset, dynamic_batch, trust_pickle, warn=warn)}")

    _guarded(run)


@app.command("validate")
def validate_command(
    reference: Annotated[Path, typer.Argument(help="The reference ONNX model.")],
    candidate: Annotated[Path, typer.Argument(help="The ONNX model to check against it.")],
    inputs: Annotated[Path | None, typer.Option("--inputs", help="DATA.npz of input arrays.")] = None,
    runs: Annotated[int, typer.Option("--runs", help="Seeded random input sets.")] = 3,
    rtol: RtolOpt = None,
    atol: AtolOpt = None,
    input: InputOpt = None,
    report: Annotated[Path | None, typer.Option("--report")] = None,
    custom_ops_library: LibraryOpt = None,
):
    """Compare two ONNX models on the same inputs (exit 3 when they differ)."""
    with interrupts_held():
        from .load.inputs import input_specs
        from .report.types import SCHEMA_VERSION
        from .report.words import nonfinite_line, write_json
        from .runtime import custom_op_libraries
        from .validate.compare import validate_files
        from .validate.results import Tolerances

    def run():
        _check_outputs([reference, candidate, inputs], [("--report", report)])
        with custom_op_libraries(custom_ops_library or []):
            result = validate_files(
                reference, candidate, inputs, runs, Tolerances.parse(rtol, atol), input_specs(input)
            )
        if report is not None:
            write_json({"schema_version": SCHEMA_VERSION, **result.to_report()}, report)
        verdict = "passed" if result.passed else "FAILED"
        if not _is_stdout(report):
            rounded = any(error.exact_error_rounded is not None for error in result.outputs.values())
            judged = (
                f" (the candidate computes in {result.precision}: judged at its roundoff"
                + (f", the original with every value rounded to {result.precision} counted as its own error" * rounded)
                + ")"
                if result.precision
                else ""
            )
            stdout.print(f"validation {verdict} over {result.runs} run(s){judged}: {result.summary()}", markup=False)
            note = nonfinite_line(result.to_report())
            if note is not None:
                stdout.print(note, markup=False)
        if not result.passed:
            raise ValidationError(f"{candidate} does not match {reference}: {result.summary()}")

    _guarded(run)


@app.command()
def profile(
    model: Annotated[Path, typer.Argument(help="An ONNX model.")],
    device: DeviceOpt = "auto",
    runs: Annotated[
        int | None,
        typer.Option("--runs", help="Timed runs (default: until the median's 95% interval is within ±2%, or 1 s)."),
    ] = None,
    warmup: Annotated[int, typer.Option("--warmup")] = 3,
    report: Annotated[Path | None, typer.Option("--report")] = None,
    input: InputOpt = None,
    custom_ops_library: LibraryOpt = None,
    no_per_op: NoPerOpOpt = False,
    threads: ThreadsOpt = None,
):
    """Time an ONNX model on ONNX Runtime."""
    with interrupts_held():
        from .load.input_domains import sized_by_running
        from .load.inputs import input_specs, with_overrides
        from .load.onnx_route import graph_input_specs
        from .load.routes import load_model
        from .profile.profiler import TimingSettings, profile_models
        from .report.types import SCHEMA_VERSION
        from .report.words import mebibytes, write_json
        from .runtime import custom_op_libraries, resolve_device

    def run():
        _check_outputs([model], [("--report", report)])
        if model.suffix.lower() != ".onnx":
            raise ConvexportError(f"{model}: profile takes an ONNX model; `convexport export` makes one")
        if (runs is not None and runs < 1) or warmup < 0:
            raise ConvexportError("--runs must be >= 1 and --warmup >= 0")
        onnx_model = load_model(str(model)).onnx_model
        specs = with_overrides(graph_input_specs(onnx_model), input_specs(input), model)
        with custom_op_libraries(custom_ops_library or []):
            specs = sized_by_running(onnx_model, specs)  # an image's dynamic dims, as the model takes them
            timing = TimingSettings(runs, warmup, per_op=not no_per_op, threads=threads)
            measured = profile_models({"model": onnx_model}, specs, resolve_device(device), timing)
        if report is not None:
            write_json({"schema_version": SCHEMA_VERSION, **measured}, report)
        if _is_stdout(report):
            return
        entry = measured["model"]
        latency = entry["latency_ms"]
        ops = ""
        if "op_time_ms" in entry:
            ops = "; ms per op type: " + ", ".join(f"{op} {ms:.3f}" for op, ms in list(entry["op_time_ms"].items())[:5])
            coverage = entry.get("op_time_coverage")
            if not entry["op_times_trusted"]:
                ops += (
                    f" (these add up to {coverage:.0%} of a profiled run: not where its time goes)"
                    if coverage
                    else " (not checked against a profiled run)"
                )
        stdout.print(
            f"{model} on {measured['provider']}: median {latency['median']:.3f} ms "
            f"({latency['median_low']:.3f}-{latency['median_high']:.3f}, 95% interval), p90 {latency['p90']:.3f} ms "
            f"over {measured['runs']} runs, {entry['throughput_per_s']:.1f} samples/s, peak memory "
            f"{mebibytes(entry['peak_memory_bytes'])}{ops}",
            markup=False,
        )

    _guarded(run)


@app.command("report-schema")
def report_schema(
    report: Annotated[
        Path | None, typer.Argument(help="A report (JSON) to name: its kind and schema version.", show_default=False)
    ] = None,
    markdown: Annotated[bool, typer.Option("--markdown", help="The fields as Markdown tables instead.")] = False,
):
    """Print the JSON Schema of the reports --report writes; with REPORT, say which it is."""
    from .report import schema

    def run():
        if report is None:
            sys.stdout.write(schema.markdown_reference() if markdown else schema.schema_text())
            return
        header = schema.read_report_header(report)
        written_by = f" (convexport {header.convexport_version})" if header.convexport_version else ""
        version = "none: written before reports had one" if header.schema_version == "0" else header.schema_version
        stdout.print(f"{report}: {header.kind} report, schema version {version}{written_by}", markup=False)

    _guarded(run)


RulesOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--rules",
        help="Also these rule files or folders; their apply: file.py:f and samplers: import and run that Python code.",
    ),
]


@rules_app.command("list")
def rules_list(rules: RulesOpt = None):
    """Every rule, one line each, with its file."""

    def run():
        every = _all_rules(rules)
        locations = [f"{_shown_path(rule.file)}:{rule.line}" for rule in every]
        name_width = max((len(rule.name) for rule in every), default=0)  # columns as wide as their longest
        where_width = max(map(len, locations), default=0)
        for rule, location in zip(every, locations):
            line = f"{rule.name:{name_width}}  {location:{where_width}}  {rule.doc}"
            stdout.print(line, markup=False, highlight=False, soft_wrap=True)

    _guarded(run)


@rules_app.command("show")
def rules_show(name: Annotated[str, typer.Argument(help="A rule name.")], rules: RulesOpt = None):
    """A rule's text and doc."""

    def run():
        every = _all_rules(rules)
        found = [rule for rule in every if rule.name == name]
        if not found:
            hint = did_you_mean(name, [rule.name for rule in every], "; `convexport rules list` lists them")
            raise ConvexportError(f"no rule named {name!r}{hint}")
        rule = found[0]
        lines = Path(rule.file).read_text(encoding="utf-8").splitlines()
        end = next((i for i in range(rule.line, len(lines)) if lines[i].lstrip().startswith("- name:")), len(lines))
        stdout.print(f"# {_shown_path(rule.file)}:{rule.line}", markup=False, highlight=False)
        stdout.print("\n".join(lines[rule.line - 1 : end]).rstrip(), markup=False, highlight=False)

    _guarded(run)


@rules_app.command("check")
def rules_check(
    files: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Rule files to check; their apply: file.py:f and samplers: are imported (their code runs)."
        ),
    ] = None,
    builtin: Annotated[bool, typer.Option("--builtin", help="Also check the built-in rules.")] = False,
):
    """Parse rule files and report every error as file:line:col: message."""
    with interrupts_held():
        from .folds import builtin_primitives
        from .rewrite.rulefile import builtin_rule_files, rule_file_errors, rule_files

    if not files and not builtin:
        raise typer.BadParameter("give rule files or folders, or --builtin", param_hint="FILES")

    def run():
        checked = (builtin_rule_files() if builtin else []) + rule_files(list(files or []))
        good, errors = rule_file_errors(checked, set(builtin_primitives()))
        if len(errors) == 1:  # the one line on stderr is the error itself
            raise ConvexportError(errors[0])
        for error in errors:
            stdout.print(error, markup=False, highlight=False)
        if errors:
            raise ConvexportError(
                f"{len(errors)} error(s) in the rule files given ({good} rule(s) OK), listed on stdout"
            )
        stdout.print(f"{good} rule(s) OK")

    _guarded(run)


def coverage_lines(result) -> str:
    """What the rewritten instances exercised of the pattern's ops' cases, what only the
    instances left alone held, what no instance held; and a warning where every rewritten
    instance had a node that computes nothing worth checking."""
    lines = [f"         covered: {_cases(result.exercised)}"]
    refused_only = result.drawn - result.exercised
    never = result.possible - result.drawn
    if refused_only:
        lines.append(f"         only in instances left alone: {_cases(refused_only)}")
    if never:
        lines.append(f"         in no instance: {_cases(never)}")
    if result.only_degenerate:
        lines.append("         verified only on degenerate instances (a Pad that pads nothing, a Mul by 1, an "
                     "identity Transpose, ...): what the rule does elsewhere is untested")  # fmt: skip
    return "\n".join(lines)


def _cases(cases: set[str]) -> str:
    return "; ".join(sorted(cases)) or "none of the listed cases"


@rules_app.command("test")
def rules_test(
    files: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Rule files or folders to test; their apply: file.py:f and samplers: are imported (their code runs)."
        ),
    ] = None,
    builtin: Annotated[bool, typer.Option("--builtin", help="Also test the built-in rules.")] = False,
    only: Annotated[list[str] | None, typer.Option("--rule", help="Only this rule (repeatable).")] = None,
    examples: Annotated[int, typer.Option("--examples", min=1, help="Random instances per round.")] = 100,
    rewritten: Annotated[
        int, typer.Option("--rewritten", min=0, help="Draw rounds until this many instances were rewritten.")
    ] = 30,
    budget: Annotated[
        float, typer.Option("--budget", min=0, help="Seconds per rule for further rounds (the first always runs).")
    ] = 20.0,
    seed: Annotated[
        int | None, typer.Option("--seed", help="Seed of the random instances (default: a new one, printed).")
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="Folder for counterexamples.")] = Path("counterexamples"),
):
    """Rewrite random instances of each rule's pattern and check them with ONNX Runtime; a
    failing instance is shrunk and saved as a small ONNX model (exit 3)."""
    with interrupts_held():
        from .folds import builtin_primitives
        from .rewrite.rulefile import builtin_rule_files, load_rules, rule_files
        from .ruletest.verify import CRASHED, verify_rule

    if not files and not builtin:
        raise typer.BadParameter("give rule files or folders, or --builtin", param_hint="FILES")

    seed = random.SystemRandom().randrange(2**31) if seed is None else seed

    def run():
        primitives = builtin_primitives()
        # the built-in rules are always loaded, so that a rule that overrides one takes its place
        loaded = load_rules(builtin_rule_files() + rule_files(list(files or [])), set(primitives))
        rules = [rule for rule in loaded if (builtin or not rule.builtin) and (not only or rule.name in only)]
        if only and len(rules) < len(set(only)):
            missing = sorted(set(only) - {rule.name for rule in rules})
            raise ConvexportError(f"no rule named {', '.join(missing)} in the files given")
        failed, untested = [], []
        with _progress() as step:
            for rule in rules:
                step(f"testing {rule.name}")
                result = verify_rule(rule, primitives, examples, seed, out, rewritten, budget)
                where = f"{_shown_path(rule.file)}:{rule.line}"
                if result.failure:
                    failed.append(result)
                    status = "CRASH   " if result.failure.startswith(CRASHED) else "FAIL    "
                    stdout.print(
                        f"{status} {rule.name:28} {where}\n         {result.failure}\n         counterexample: "
                        + ", ".join(str(path) for path in result.saved),
                        markup=False,
                        highlight=False,
                    )
                elif result.untested:
                    untested.append(result)
                    stdout.print(
                        f"UNTESTED {rule.name:28} {where}\n         {result.untested}", markup=False, highlight=False
                    )
                else:
                    left = result.instances - result.applied
                    why = f"; not in {left}: {result.reasons()}" if left else ""
                    status = "WARN    " if result.only_degenerate else "ok      "
                    stdout.print(
                        f"{status} {rule.name:28} {result.instances} instances, rewritten in {result.applied}{why}",
                        markup=False,
                        highlight=False,
                        soft_wrap=True,
                    )
                    if result.possible or result.drawn:  # (an Identity has no cases to cover)
                        stdout.print(coverage_lines(result), markup=False, highlight=False, soft_wrap=True)
        stdout.print(
            f"{len(rules)} rule(s): {len(rules) - len(failed) - len(untested)} passed, {len(failed)} failed, "
            f"{len(untested)} untested (seed {seed}; --seed {seed} repeats these instances)",
            markup=False,
            highlight=False,
        )
        if failed:
            first = failed[0]
            verdict = "crashed" if first.failure.startswith(CRASHED) else "is not exact"
            raise ValidationError(
                f"rule {first.rule.name!r} {verdict}: {first.failure.removeprefix(CRASHED)}; counterexample "
                f"{first.saved[0]}" + (f" (and {len(failed) - 1} more failing rule(s))" if len(failed) > 1 else "")
            )
        if untested:
            raise ConvexportError(
                f"{len(untested)} rule(s) could not be tested: " + ", ".join(result.rule.name for result in untested)
            )

    _guarded(run)


def _check_outputs(inputs, outputs) -> None:
    from .util.files import check_paths

    check_paths([path for path in inputs if path is not None], outputs)


# The model files the routes read (routes/*.py's suffixes), named here so that a file that is not
# there is said before the stages' libraries are imported (seconds), not after.
MODEL_SUFFIXES = (".onnx", ".pt", ".pth", ".pt2", ".py")


def _check_model_is_there(model: str) -> None:
    """MODEL names a model file that does not exist: the one line loading would give, at once."""
    path = model_file(model)
    if path.suffix.lower() in MODEL_SUFFIXES and not os.path.lexists(path):
        raise ConvexportError(f"{model}: no such file")


def model_file(model: str) -> Path:
    """The file a MODEL argument reads (a factory's .py without its :callable)."""
    head, sep, tail = model.rpartition(":")
    return Path(head if sep and tail.isidentifier() and len(head) > 1 else model)


def _is_stdout(path) -> bool:
    return path is not None and str(path) == "-"


def _shown_path(path: str) -> str:
    """A rule file's path as a user finds it: a built-in one as rules/NAME (where it is in the
    repository; installed, it is deep in site-packages), another relative to the working
    directory when it lies below it."""
    from .rewrite.rulefile import builtin_rule_files

    resolved = Path(path).resolve()
    if any(resolved == builtin.resolve() for builtin in builtin_rule_files()):
        return f"rules/{resolved.name}"
    try:
        return str(resolved.relative_to(Path.cwd().resolve()))
    except ValueError:
        return path


def _all_rules(extra):
    with interrupts_held():
        from .folds import builtin_primitives
        from .rewrite.rulefile import builtin_rule_files, load_rules, rule_files

    return load_rules(builtin_rule_files() + rule_files(list(extra or [])), set(builtin_primitives()))


@contextlib.contextmanager
def _progress(quiet: bool = False):
    """Each step on one transient line with its elapsed time (and a profile's runs done), on a
    terminal only: stderr stays one line long for pipelines. The display writes to its own
    copy of stderr's descriptor: libraries are quieted meanwhile by pointing sys.stderr and
    descriptor 2 elsewhere (util/quiet.py), which must not freeze it."""
    if quiet or not stderr.is_terminal:
        yield lambda step: None
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with (
        open(os.dup(sys.stderr.fileno()), "w", encoding="utf-8", errors="replace") as terminal,
        Progress(*columns, console=Console(file=terminal, highlight=False), transient=True) as progress,
    ):
        current: dict = {}

        def show(message: str) -> None:
            step = message.split(" (")[0]
            if current.get("step") != step:
                if "task" in current:
                    progress.update(current["task"], visible=False)
                    progress.stop_task(current["task"])
                current.update(step=step, task=progress.add_task(message))
            progress.update(current["task"], description=message)

        yield show


# control characters of a path the user gave ("a\nb.onnx") written as escapes: a message is one line
_ESCAPED = {code: f"\\x{code:02x}" for code in range(32)} | {10: "\\n", 13: "\\r", 9: "\\t", 127: "\\x7f"}


def _say(message: str) -> None:
    """One line on stderr, whatever the message holds."""
    stderr.print(message.translate(_ESCAPED), markup=False)


def _guarded(action) -> None:
    """Run a command; map convexport's errors to exit codes with one line on stderr. A SIGTERM
    or SIGHUP ends it as an exception, so that its temporary files are removed."""
    from .util.api_words import speaking_to_the_command_line

    try:
        with ending_signals_raise(), speaking_to_the_command_line():
            action()
    except ValidationError as exc:
        _say(f"convexport: {exc}")
        raise typer.Exit(EXIT_VALIDATION) from None
    except InternalError as exc:
        if _debug:
            traceback.print_exception(exc.__cause__ or exc)
        _say(f"convexport: {exc}; --debug shows the traceback")
        raise typer.Exit(EXIT_INTERNAL) from None
    except ConvexportError as exc:
        if _debug:
            traceback.print_exc()
        _say(f"convexport: {exc}")
        raise typer.Exit(EXIT_USER) from None
    except KeyboardInterrupt:
        stderr.print("convexport: interrupted", markup=False)
        raise typer.Exit(130) from None
    except Terminated as exc:
        stderr.print(f"convexport: stopped by signal {exc.number}", markup=False)
        raise typer.Exit(128 + exc.number) from None
    except BrokenPipeError:  # `| head` took what it wanted: not an error of ours
        _silence_stdout()
        raise typer.Exit(0) from None
    except (typer.Exit, typer.Abort):
        raise
    except Exception as exc:
        if _debug:
            traceback.print_exc()
        _say(
            f"convexport: internal error: {type(exc).__name__}: {first_line(exc)} "
            "(please report it; --debug shows the traceback)"
        )
        raise typer.Exit(EXIT_INTERNAL) from None


def _silence_stdout() -> None:
    """Point stdout at the null device: Python's flush at exit would hit the closed pipe again."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main() -> None:
    global _debug
    _keep_stderr_to_one_line()
    arguments = sys.argv[1:]
    # --debug anywhere before a bare "--" (typer takes it only before the command's name)
    end = arguments.index("--") if "--" in arguments else len(arguments)
    if "--debug" in arguments[:end]:
        _debug = True
        arguments = [a for a in arguments[:end] if a != "--debug"] + arguments[end:]
    command = typer.main.get_command(app)
    _name_placeholders(command)
    command(args=arguments, prog_name="convexport")


# typer's help shows each parameter's Python type (`<bool>`, `<list[str]>`, an argument as
# `{model}`); a command line's help shows what to type: a placeholder, nothing for a switch
_PLACEHOLDERS = {"int": "N", "float": "F", "Path": "PATH", "str": "TEXT"}


def _name_placeholders(command) -> None:
    """Each option's placeholder in `command` and its subcommands: none for a switch, N, F,
    PATH or TEXT by its type, an argument's name in capitals."""
    from typer.core import TyperArgument, TyperOption

    for parameter in command.params:
        if isinstance(parameter, TyperArgument):
            parameter.metavar = parameter.metavar or parameter.name.upper()
        elif isinstance(parameter, TyperOption) and parameter.metavar is None:
            kind = parameter.bare_type().removeprefix("list[").removesuffix("]")
            parameter.metavar = "" if parameter.is_flag else _PLACEHOLDERS.get(kind, kind.upper())
    shown_help = command.get_help_option

    def help_option(context):
        """--help, a switch: no placeholder either."""
        option = shown_help(context)
        if option is not None:
            option.metavar = ""
        return option

    command.get_help_option = help_option
    for sub in getattr(command, "commands", {}).values():
        _name_placeholders(sub)


def _keep_stderr_to_one_line() -> None:
    """stderr carries convexport's one-line messages and nothing else: the libraries' warnings
    (torch's, numpy's floating-point ones) are not shown. The report keeps what matters of
    them (the TorchScript tracer's warnings are collected there). A rule file that runs Python
    code is a note of one line, before any other (rewrite/plugins.py)."""
    import warnings

    import numpy as np

    from .rewrite.plugins import RuleFileRunsCode

    warnings.simplefilter("ignore")
    warnings.filterwarnings("default", category=RuleFileRunsCode)  # once per rule file and code it runs
    shown = warnings.showwarning

    def note(message, category, *args, **kwargs):
        if issubclass(category, RuleFileRunsCode):
            stderr.print(f"convexport: note: {message}", markup=False, soft_wrap=True)
        else:
            shown(message, category, *args, **kwargs)

    warnings.showwarning = note
    np.seterr(all="ignore")
    for stream in (sys.stdout, sys.stderr):  # a path that is not UTF-8 is shown escaped, not a crash
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


if __name__ == "__main__":
    sys.exit(main())
