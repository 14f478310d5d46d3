"""What `optimize` takes besides the model: one frozen object, the one place its options are
declared. Each field is one option: its Python API name and default, and, where the command
line has it, its flag, help text and help group (a `Flag`). The CLI makes its parameters from
these declarations (cli.py, `optimize`; validate, profile and export take the ones they share
by name), the API's error messages turn each flag into its keyword from them
(util/api_words.py), and the Python API takes an OptimizeOptions
(`optimize(model, options=OptimizeOptions(...))`) or the same names as keywords."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

Progress = Callable[[str], None]  # told each step as it starts (a line of text)

# The help groups, in the order `convexport optimize --help` shows them.
GROUPS = MODEL, REWRITE, CHECKS, TIMING, PRECISION, OUTPUT = (
    "Model and inputs", "Rewrite", "Validation", "Device and timing", "Precision", "Output",
)  # fmt: skip


@dataclass(frozen=True)
class Flag:
    """An option as the command line gives it.

    `names`: the flag and its short form (the first is what messages say); `kind`: the
    command line's value type (a list for a repeatable flag, bool for a switch); `negates`: a
    switch that turns the option off (--no-validate gives validate=False)."""

    names: tuple[str, ...]
    kind: object
    help: str
    group: str
    negates: bool = False
    minimum: int | None = None
    api_form: str | None = None  # keyword_form where the API takes a flag's list as one value too

    @property
    def keyword_form(self) -> str:
        """How a message's flag is written as the API's keyword (util/api_words.py): "list" a
        list of the flag's values, "value" the value itself, "True"/"False" a switch."""
        if self.api_form is not None:
            return self.api_form
        if self.kind is bool:
            return "False" if self.negates else "True"
        return "list" if getattr(self.kind, "__origin__", None) is list else "value"


def option(default, *names: str, kind: object = None, help: str = "", group: str = "", negates: bool = False,
           minimum: int | None = None, api_form: str | None = None):  # fmt: skip
    """A field of OptimizeOptions, with its flag where `names` are given (none: the API's alone)."""
    flag = Flag(names, kind, help, group, negates, minimum, api_form) if names else None
    return field(default=default, metadata={"flag": flag})


@dataclass(frozen=True)
class OptimizeOptions:
    """Every option of `convexport optimize`, under the Python API's names."""

    output: str | Path | None = option(
        None, "-o", "--output", kind=Path, group=OUTPUT,
        help="Where to write (default <stem>.opt.onnx beside MODEL).",
    )  # fmt: skip
    # --input specs (texts such as "x:1x3x224x224:0..1", or InputSpecs), or for a torch model
    # example tensors as torch.onnx.export takes them (a tensor, or a tuple of them)
    inputs: object = option(
        None, "--input", kind=list[str], group=MODEL,
        help="NAME:DIMS[:DTYPE][:LOW..HIGH], e.g. x:1x3x224x224 (N or batch = dynamic), x:1x3x320x320:0..1 "
        "(made-up values in that range).",
    )  # fmt: skip
    rules: Sequence[str | Path] | str | Path = option(
        (), "--rules", kind=list[Path], group=REWRITE,
        help="Rule file or folder (repeatable). A rule file's apply: file.py:f or module:f and its samplers: "
        "import and run that Python code (said on stderr): give only rule files you trust.",
    )  # fmt: skip
    builtin_rules: bool = option(
        True, "--no-builtin-rules", kind=bool, negates=True, group=REWRITE, help="Use only the --rules given."
    )
    strategy: str = option(
        "cost", "--strategy", kind=str, group=REWRITE,
        help="all | cost | measure (all: every exact rewrite, whatever it costs).",
    )  # fmt: skip
    device: str = option("auto", "--device", kind=str, group=TIMING, help="auto | cpu | cuda (profiling).")
    # None: ONNX Runtime's default, one per physical core
    threads: int | None = option(
        None, "--threads", kind=int, group=TIMING, minimum=1,
        help="ONNX Runtime's intra-op threads for every timing and the choice made from it (default: ONNX "
        "Runtime's, one per physical core; a server running one request per core deploys with 1).",
    )  # fmt: skip
    validate: bool = option(
        True, "--no-validate", kind=bool, negates=True, group=CHECKS, help="Skip validation (not recommended)."
    )
    profile: bool = option(True, "--no-profile", kind=bool, negates=True, group=TIMING, help="Skip profiling.")
    per_op: bool = option(
        True, "--no-per-op", kind=bool, negates=True, group=TIMING,
        help="Time runs and memory only: no pass for the time per op type.",
    )  # fmt: skip
    # --rtol, --atol: a number, or NAME:F texts per output
    rtol: float | list[str] | None = option(
        None, "--rtol", kind=list[str], group=CHECKS, api_form="value",
        help="Relative tolerance; NAME:F for one output (repeatable).",
    )  # fmt: skip
    atol: float | list[str] | None = option(
        None, "--atol", kind=list[str], group=CHECKS, api_form="value",
        help="Absolute tolerance; NAME:F for one output (repeatable).",
    )  # fmt: skip
    opset: int | None = option(
        None, "--opset", kind=int, group=MODEL,
        help="ONNX opset for torch exports (default: what the installed torch writes, 20 on 2.13).",
    )  # fmt: skip
    dynamic_batch: bool = option(
        False, "--dynamic-batch", kind=bool, group=MODEL, help="Make the first dim of every input dynamic."
    )
    freeze_input_defaults: bool = option(
        False, "--freeze-input-defaults", kind=bool, group=MODEL,
        help="Treat initializers also listed as graph inputs as constants (drops them from the inputs).",
    )  # fmt: skip
    trust_pickle: bool = option(
        False, "--trust-pickle", kind=bool, group=MODEL,
        help="Allow a pickled nn.Module (.pt/.pth); unpickling runs code.",
    )  # fmt: skip
    # an .npz of input arrays: validated and profiled on instead of made-up ones, or, with
    # made_up_inputs (the command line's --inputs), besides them
    input_data: str | Path | None = option(
        None, "--input-data", kind=Path, group=MODEL,
        help="DATA.npz of real input arrays, validated and profiled on instead of random ones.",
    )  # fmt: skip
    made_up_inputs: bool = True
    disable_rules: Sequence[str] | str = option(
        (), "--disable-rule", kind=list[str], group=REWRITE, help="Do not run this rule (repeatable)."
    )
    explain: Sequence[str] | str = option(
        (), "--explain", kind=list[str], group=REWRITE,
        help="RULE[@MODULE]: say, for each node the rule looked at (in that PyTorch module), why it did or did "
        "not fire (repeatable).",
    )  # fmt: skip
    custom_ops_libraries: Sequence[str | Path] | str | Path = option(
        (), "--custom-ops-library", kind=list[Path], group=TIMING,
        help="ONNX Runtime kernel library of the model's custom operators (repeatable).",
    )  # fmt: skip
    # None: the model's own, fp16 for a model of float16 weights (load/float32_twin.py); half
    # precision node by node, convexport/half/
    dtype: str | None = option(
        None, "--dtype", kind=str, group=PRECISION,
        help="fp32 | fp16 | bf16: the type the written model computes in (fp16 and bf16 node by node, where the "
        "error measured against float64 allows and the device has a kernel; the rest float32). Default: the "
        "model's own (fp16 for a model of float16 weights, else fp32).",
    )  # fmt: skip
    io_dtype: str | None = option(
        None, "--io-dtype", kind=str, group=PRECISION,
        help="fp32 | fp16: its inputs' and outputs' type (default: the model's own).",
    )  # fmt: skip
    write: bool = True  # False: nothing written (the API's dry run)
    progress: Progress | None = None
    other_outputs: Sequence[tuple[str, str | Path]] = ()  # (option, path) the caller will write


OPTION_NAMES = frozenset(entry.name for entry in fields(OptimizeOptions))
# the options the command line gives, by field name, in declaration order
FLAGS: dict[str, Flag] = {
    entry.name: entry.metadata["flag"] for entry in fields(OptimizeOptions) if entry.metadata.get("flag")
}


def from_flags(given: dict[str, object]) -> dict[str, object]:
    """OptimizeOptions' fields from the command line's values of FLAGS (by field name): a
    switch that negates turned around, a flag not given (None) left at the field's default."""
    chosen: dict[str, object] = {}
    for name, flag in FLAGS.items():
        value = given[name]
        if flag.negates:
            chosen[name] = not value
        elif value is not None:
            chosen[name] = value
    return chosen
