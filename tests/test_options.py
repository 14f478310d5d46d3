"""optimize's options are one frozen object (convexport/options.py): the CLI builds it, the API
takes it or the same names as keywords (issue 38, item 5)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

import convexport
from convexport.options import OPTION_NAMES, OptimizeOptions
from convexport.pipeline import optimize


def test_the_api_takes_an_options_object(small_net_path):
    options = OptimizeOptions(inputs=["x:1x3x16x16"], write=False, profile=False, strategy="all")
    report = convexport.optimize(f"{small_net_path}:build", options=options).report
    assert report["strategy"] == "all" and report["validation"]["passed"]


def test_keywords_are_the_options_fields(small_net_path):
    report = convexport.optimize(f"{small_net_path}:build", write=False, profile=False, validate=False).report
    assert report["validation"] is None and report["profile"] is None


def test_options_and_arguments_together_are_refused():
    with pytest.raises(TypeError, match="not both"):
        optimize("m.onnx", strategy="all", options=OptimizeOptions())
    with pytest.raises(TypeError, match="not both"):
        optimize("m.onnx", options=OptimizeOptions(), write=False)


def test_an_unknown_keyword_is_named():
    with pytest.raises(TypeError, match="no_such_option"):
        optimize("m.onnx", no_such_option=1)


def test_options_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        OptimizeOptions().strategy = "all"


def test_the_contract_signature_is_kept():
    """DESIGN.md's `optimize(model, inputs=None, output=None, rules=(), strategy="cost",
    device="auto", validate=True, profile=True)`, each also an option of the one object."""
    parameters = list(inspect.signature(optimize).parameters.values())
    positional = [(p.name, p.default) for p in parameters[1:8]]
    assert positional == [("inputs", None), ("output", None), ("rules", ()), ("strategy", "cost"),
                          ("device", "auto"), ("validate", True), ("profile", True)]
    assert {name for name, _ in positional} <= OPTION_NAMES
    assert all(getattr(OptimizeOptions(), name) == default for name, default in positional)


def test_the_command_line_is_made_from_the_declarations():
    """Each option with a Flag in options.py is a flag of `convexport optimize` (with its help
    and group) and a keyword the API's messages know; none is declared anywhere else."""
    import typer

    from convexport.cli import app
    from convexport.options import FLAGS, GROUPS
    from convexport.util.api_words import FLAG_KEYWORDS

    command = typer.main.get_command(app).commands["optimize"]
    shown = {name: parameter for parameter in command.params for name in parameter.opts}
    for option, flag in FLAGS.items():
        for name in flag.names:
            assert shown[name].help == flag.help.replace("[", "\\[") and shown[name].rich_help_panel == flag.group
            assert FLAG_KEYWORDS[name][0] == option
    groups = [parameter.rich_help_panel for parameter in command.params if parameter.rich_help_panel]
    assert groups == sorted(groups, key=GROUPS.index)  # the help shows them group by group


def test_a_declared_option_reaches_the_command_line(monkeypatch):
    """Adding an option is its declaration: a new field with a Flag is a flag of optimize, and
    its value reaches OptimizeOptions under the field's name."""
    import typer
    from typer.testing import CliRunner

    from convexport import cli, options

    extended = dataclasses.make_dataclass(
        "Extended", [("max_passes", int, options.option(32, "--max-passes", kind=int, group=options.REWRITE,
                                                         help="At most this many passes."))],
        bases=(OptimizeOptions,), frozen=True)  # fmt: skip
    flags = {**options.FLAGS, "max_passes": dataclasses.fields(extended)[-1].metadata["flag"]}
    monkeypatch.setattr(cli, "FLAGS", flags)
    monkeypatch.setattr(options, "FLAGS", flags)
    monkeypatch.setattr(cli, "OptimizeOptions", extended)
    seen = {}

    @cli.with_option_flags
    def command(model: str, **given):
        seen.update(options.from_flags(given))

    app = typer.Typer()
    app.command()(command)
    result = CliRunner().invoke(app, ["m.onnx", "--max-passes", "5", "--no-profile"])
    assert result.exit_code == 0, result.output
    assert seen["max_passes"] == 5 and seen["profile"] is False
