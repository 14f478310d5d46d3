"""What optimize was asked, read and checked before any work: every option's value that can be
wrong without the model is refused here, in the option's words."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

import numpy as np

from ..errors import ConvexportError
from ..half import DTYPES as HALF_DTYPES
from ..load.input_data import check_data_file
from ..load.inputs import InputSpec, input_specs
from ..options import OptimizeOptions
from ..rewrite.engine import STRATEGIES, STRATEGY_ALIASES
from ..runtime import resolve_device
from ..util.progress import Steps, notebook_progress
from ..validate.results import Tolerances


@dataclass
class Request:
    """optimize's options as the stages take them."""

    options: OptimizeOptions
    specs: list[InputSpec]  # --input's
    examples: tuple | None  # example tensors given instead of --input specs
    rule_files: list  # --rules
    disabled_rules: list[str]
    explain: list[str]  # --explain's RULE[@MODULE] texts
    tolerances: Tolerances
    strategy: Literal["all", "cost", "measure"]
    # the model's compute type (float32, float16, bfloat16) and its interface's: None where not
    # given, until the model is read (stages/export.py's in_its_precision)
    dtype: str | None
    io_dtype: str | None
    device: Literal["cpu", "cuda"]  # where the model will run: what cost and measure decide for, and the profile's
    steps: Steps


def read_request(options: OptimizeOptions) -> Request:
    if not options.made_up_inputs and options.input_data is None:
        raise ConvexportError("made_up_inputs=False needs input_data: the .npz of arrays to validate on instead")
    if options.input_data is not None:
        check_data_file(Path(options.input_data))
    examples = example_tensors(options.inputs)
    inputs = [] if examples is not None else as_list(options.inputs)
    steps = Steps(options.progress if options.progress is not None else notebook_progress())
    tolerances = Tolerances.parse(options.rtol, options.atol)
    strategy = _strategy(options.strategy)
    dtype, io_dtype = _type_names(options.dtype, options.io_dtype)
    device = resolve_device(options.device)
    if options.threads is not None and (isinstance(options.threads, bool) or not isinstance(options.threads, int)
                                        or options.threads < 1):  # fmt: skip
        raise ConvexportError(f"--threads {options.threads!r}: expected a whole number of at least 1")
    specs = input_specs(inputs)
    return Request(
        options, specs, examples, as_list(options.rules), as_list(options.disable_rules), as_list(options.explain),
        tolerances,
        strategy, dtype, io_dtype, device, steps,
    )  # fmt: skip


def example_tensors(inputs) -> tuple | None:
    """`inputs` as example tensors, the way torch.onnx.export takes them (one tensor or array,
    or a tuple or list of them), or None when they are --input specs (texts, InputSpecs)."""
    given = inputs if isinstance(inputs, (tuple, list)) else [inputs]
    if not given or not all(hasattr(value, "shape") and hasattr(value, "dtype") for value in given):
        return None
    import torch

    return tuple(value if isinstance(value, torch.Tensor) else torch.from_numpy(np.asarray(value)) for value in given)


def _strategy(given: str) -> Literal["all", "cost", "measure"]:
    """--strategy's value, its old name (exact) read as the new (all)."""
    strategy = STRATEGY_ALIASES.get(given, given)
    if strategy in STRATEGIES:
        return cast(Literal["all", "cost", "measure"], strategy)
    raise ConvexportError(f"--strategy {strategy!r}: expected one of {', '.join(STRATEGIES)}")


def as_list(given) -> list:
    """One value (a str or Path) or a sequence of them, as a list: never a string's characters."""
    if given is None:
        return []
    return [given] if isinstance(given, (str, Path, InputSpec)) else list(given)


def _type_names(dtype: str | None, io_dtype: str | None) -> tuple[str | None, str | None]:
    """--dtype and --io-dtype as the types' names (None where not given), each one checked
    here, the two together where both are given."""
    for flag, given in (("--dtype", dtype), ("--io-dtype", io_dtype)):
        if given is not None and given not in HALF_DTYPES:
            raise ConvexportError(f"{flag} {given}: expected fp32, fp16 or bf16")
    if io_dtype is not None and HALF_DTYPES[io_dtype] == "bfloat16":  # its runs could not be fed, nor read
        raise ConvexportError(
            f"--io-dtype {io_dtype}: ONNX Runtime's Python API takes and gives no bfloat16 arrays, so the model could "
            "not be validated; a bf16 model keeps an fp32 interface"
        )
    model = HALF_DTYPES[dtype] if dtype is not None else None
    interface = HALF_DTYPES[io_dtype] if io_dtype is not None else None
    if model is not None and interface is not None:
        check_interface(model, interface)
    return model, interface


TYPE_FLAGS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def check_interface(model: str, interface: str) -> None:
    """A float32 model's interface is float32, a half one's float32 or its own type."""
    if interface not in ("float32", model):
        raise ConvexportError(
            f"--io-dtype {TYPE_FLAGS[interface]} with --dtype {TYPE_FLAGS[model]}: the interface is fp32 or the "
            "model's own"
        )
