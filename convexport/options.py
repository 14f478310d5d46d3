"""What `optimize` takes besides the model: one frozen object, the one place its options are
written with their defaults and meanings. The CLI builds one from its flags; the Python API
takes one (`optimize(model, options=OptimizeOptions(...))`) or the same names as keywords."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

Progress = Callable[[str], None]  # told each step as it starts (a line of text)


@dataclass(frozen=True)
class OptimizeOptions:
    """Every option of `convexport optimize`, under the Python API's names."""

    # --input specs (texts such as "x:1x3x224x224:0..1", or InputSpecs), or for a torch model
    # example tensors as torch.onnx.export takes them (a tensor, or a tuple of them)
    inputs: object = None
    output: str | Path | None = None  # -o; None: <MODEL stem>.opt.onnx beside MODEL
    rules: Sequence[str | Path] | str | Path = ()  # --rules: rule files or folders (one or several)
    strategy: str = "cost"  # all | cost | measure (exact: all's old name)
    device: str = "auto"  # auto | cpu | cuda: where the model will run (cost, measure, profile)
    # --threads: ONNX Runtime's intra-op threads in every timing and the choice it makes (the
    # profile, --strategy measure); None: ONNX Runtime's default, one per physical core
    threads: int | None = None
    validate: bool = True
    profile: bool = True
    per_op: bool = True  # False (--no-per-op): the profile times runs and memory only, no time per op type
    builtin_rules: bool = True  # False: --no-builtin-rules
    rtol: float | list[str] | None = None  # a number, or NAME:F texts per output
    atol: float | list[str] | None = None
    opset: int | None = None
    dynamic_batch: bool = False
    freeze_input_defaults: bool = False  # initializers listed as graph inputs are constants
    trust_pickle: bool = False  # unpickle a torch.save'd module (runs code from the file)
    write: bool = True  # False: nothing written (the API's dry run)
    progress: Progress | None = None
    other_outputs: Sequence[tuple[str, str | Path]] = ()  # (option, path) the caller will write
    input_data: str | Path | None = None  # --inputs / --input-data: an .npz of input arrays
    made_up_inputs: bool = True  # False (--input-data): validate and profile on input_data alone
    disable_rules: Sequence[str] | str = ()  # --disable-rule: rule names not to run
    explain: Sequence[str] | str = ()  # --explain: RULE or RULE@MODULE
    custom_ops_libraries: Sequence[str | Path] | str | Path = ()  # --custom-ops-library
    # --dtype: fp32 | fp16 | bf16, the type the written model computes in (half: where the measured
    # error allows, convexport/half/; None: the model's own, fp16 for a model of float16 weights:
    # load/float32_twin.py); --io-dtype: its inputs' and outputs' (None: the model's own)
    dtype: str | None = None
    io_dtype: str | None = None


OPTION_NAMES = frozenset(field.name for field in fields(OptimizeOptions))
