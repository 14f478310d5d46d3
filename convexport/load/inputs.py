"""Input specifications (`--input NAME:DIMS[:DTYPE][:LOW..HIGH]`) and seeded random input data."""

from __future__ import annotations

import ast
import math
import operator
import re
from dataclasses import dataclass, field, replace

import ml_dtypes
import numpy as np

from ..errors import ConvexportError

DTYPES = {
    "float32": np.float32,
    "float": np.float32,
    "fp32": np.float32,
    "float16": np.float16,
    "half": np.float16,
    "fp16": np.float16,
    "float64": np.float64,
    "double": np.float64,
    "bfloat16": ml_dtypes.bfloat16,
    "bf16": ml_dtypes.bfloat16,
    "int64": np.int64,
    "long": np.int64,
    "int32": np.int32,
    "int": np.int32,
    "int8": np.int8,
    "uint8": np.uint8,
    "bool": np.bool_,
}
_DIM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Test data (validation, profiling) is made up in memory, several arrays of each input: an
# input larger than this is a typo (an extra digit), or a model this machine cannot test.
MAX_INPUT_BYTES = 16 << 30

# an input named like an attention mask (`attention_mask`, `decoder_attention_mask`, `pixel_mask`)
MASK_NAME = re.compile(r"mask", re.IGNORECASE)

# The size a dynamic dimension takes when data has to be made up for it (validation,
# profiling) and no concrete size was given.
DEFAULT_DYNAMIC_SIZE = 1


@dataclass(frozen=True)
class InputSpec:
    """One model input: a name, dims (an int, or a name for a dynamic dim), a dtype, and the
    range its values take (made-up data is drawn in it; None: N(0, 1) floats, small integers)."""

    name: str
    dims: tuple[int | str, ...]
    dtype: str = "float32"
    dtype_given: bool = field(default=False, compare=False)  # by --input, not the default
    value_range: tuple[float, float] | None = None
    mask: bool = field(default=False, compare=False)  # the graph reads it as a mask (load/input_domains.py)

    @property
    def numpy_dtype(self) -> np.dtype:
        if self.dtype not in DTYPES:  # an ONNX input of a type convexport makes no data for
            raise ConvexportError(
                f"input {self.name!r} is {self.dtype}: convexport makes test data only for "
                f"{', '.join(sorted({str(np.dtype(t)) for t in DTYPES.values()}))} inputs "
                "(optimize --no-validate --no-profile skips the runs that need it)"
            )
        return np.dtype(DTYPES[self.dtype])

    @property
    def is_dynamic(self) -> bool:
        return any(isinstance(d, str) for d in self.dims)

    def concrete_shape(self, dynamic_size: int = DEFAULT_DYNAMIC_SIZE) -> tuple[int, ...]:
        return tuple(d if isinstance(d, int) else dim_size(d, dynamic_size) for d in self.dims)

    def data_bytes(self, dynamic_size: int = DEFAULT_DYNAMIC_SIZE) -> int:
        """The bytes of one array of this input (a dynamic dim at `dynamic_size`)."""
        return math.prod(self.concrete_shape(dynamic_size)) * np.dtype(DTYPES.get(self.dtype, np.float32)).itemsize

    def __str__(self) -> str:
        text = f"{self.name}:{'x'.join(str(d) for d in self.dims)}:{self.dtype}"
        if self.value_range is None:
            return text
        return text + ":" + "..".join(f"{bound:g}" for bound in self.value_range)


def dim_size(dim: str, dynamic_size: int) -> int:
    """The size of a dynamic dim when every dim name takes `dynamic_size`: a name is
    `dynamic_size`; an expression of names, as exporters write related dims (GPT-2's mask is
    `past_sequence_length + sequence_length`, its past `past_sequence_length`), is evaluated,
    so that the made-up inputs agree with each other. At least 1."""
    try:
        tree = ast.parse(dim, mode="eval").body
    except (SyntaxError, ValueError):
        return dynamic_size
    value = _evaluated(tree, dynamic_size)
    return dynamic_size if value is None else max(1, value)


def _evaluated(node: ast.AST, size: int) -> int | None:
    """+, -, * and // of names and small integer literals; None for anything else."""
    if isinstance(node, ast.Name):
        return size
    if isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value < 1 << 20:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _DIM_OPERATORS:
        left, right = _evaluated(node.left, size), _evaluated(node.right, size)
        if left is None or right is None or (right == 0 and isinstance(node.op, ast.FloorDiv)):
            return None
        return _DIM_OPERATORS[type(node.op)](left, right)
    return None


_DIM_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def parse_input_spec(text: str) -> InputSpec:
    """Parse `NAME:DIMS[:DTYPE][:LOW..HIGH]`, e.g. `x:1x3x224x224`, `x:Nx3x224x224:float16`,
    `x:1x3x320x320:float32:0..1` (an image's values: made-up data is drawn in [LOW, HIGH])."""
    parts = text.split(":")
    hint = "expected NAME:DIMS[:DTYPE][:LOW..HIGH], e.g. x:1x3x224x224, x:Nx3x224x224:float16 or x:1x3x320x320:0..1"
    value_range = _value_range(text, parts.pop()) if len(parts) in (3, 4) and ".." in parts[-1] else None
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise ConvexportError(f"--input {text!r}: {hint}")
    name, dims_text = parts[0], parts[1]
    dtype = parts[2] if len(parts) == 3 else "float32"
    if dtype not in DTYPES:
        raise ConvexportError(f"--input {text!r}: unknown dtype {dtype!r} (one of {', '.join(sorted(set(DTYPES)))})")
    dims: list[int | str] = []
    for token in dims_text.split("x"):  # so a dimension name cannot contain an 'x'
        if token.isascii() and token.isdigit():  # "²" is a digit to str.isdigit; 0 is an empty dim
            dims.append(int(token))
        elif _DIM_NAME.match(token):
            dims.append("batch" if token in ("N", "n", "batch") else token)
        else:
            raise ConvexportError(f"--input {text!r}: bad dimension {token!r}; {hint}")
    if not dims:
        raise ConvexportError(f"--input {text!r}: {hint}")
    if value_range is not None and DTYPES[dtype] == np.bool_:
        raise ConvexportError(f"--input {text!r}: a bool input takes no range of values")
    if value_range is not None and (np.dtype(DTYPES[dtype]).kind == "f" or DTYPES[dtype] == ml_dtypes.bfloat16):
        largest = float(ml_dtypes.finfo(DTYPES[dtype]).max)
        if max(map(abs, value_range)) > largest:
            raise ConvexportError(f"--input {text!r}: a {dtype} holds values up to {largest:g} in magnitude")
    spec = InputSpec(
        name, tuple(dims), str(np.dtype(DTYPES[dtype])), dtype_given=len(parts) == 3, value_range=value_range
    )
    size = spec.data_bytes()
    if size > MAX_INPUT_BYTES:
        raise ConvexportError(
            f"--input {text!r}: {in_units(size)} of data for one input; convexport makes test data of at most "
            f"{in_units(MAX_INPUT_BYTES)} per input"
        )
    return spec


def _value_range(text: str, given: str) -> tuple[float, float]:
    """LOW..HIGH as two finite numbers, LOW < HIGH."""
    low, _, high = given.partition("..")
    try:
        bounds = float(low), float(high)
    except ValueError:
        raise ConvexportError(f"--input {text!r}: range {given!r} is not LOW..HIGH, e.g. 0..1 or -1..1") from None
    if not all(map(math.isfinite, bounds)) or bounds[0] >= bounds[1]:
        raise ConvexportError(f"--input {text!r}: range {given!r} needs finite LOW < HIGH")
    if not math.isfinite(bounds[1] - bounds[0]):  # -1e308..1e308: no generator draws over it
        raise ConvexportError(f"--input {text!r}: range {given!r} is wider than a float64 can hold")
    return bounds


def in_units(size: int) -> str:
    """A size in bytes in the largest binary unit it reaches, to three digits."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size} bytes"


def input_specs(given) -> list[InputSpec]:
    """The --input values (texts or InputSpecs) as InputSpecs; a name given twice is an error."""
    specs = [spec if isinstance(spec, InputSpec) else parse_input_spec(spec) for spec in given or ()]
    names = [spec.name for spec in specs]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConvexportError(f"--input {', '.join(twice)}: given more than once")
    return specs


def random_inputs(specs: list[InputSpec], seed: int, dynamic_size: int = DEFAULT_DYNAMIC_SIZE) -> dict[str, np.ndarray]:
    """Seeded data for each input: standard normal floats, small non-negative integers, or
    uniform in the input's value range (integers inclusive of both ends); a bool of one
    element True for an even seed, False for an odd one (validation's runs take both)."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        shape = spec.concrete_shape(dynamic_size)
        dtype = spec.numpy_dtype
        size = math.prod(shape) * np.dtype(dtype).itemsize
        if size > MAX_INPUT_BYTES:  # a graph's own dims (2**40) are not --input's, checked when parsed
            raise ConvexportError(
                f"input {spec.name!r} of shape {'x'.join(map(str, shape))} is {in_units(size)} of data; convexport "
                f"makes test data of at most {in_units(MAX_INPUT_BYTES)} per input (give --input with smaller dims)"
            )
        low, high = spec.value_range or (None, None)
        if np.issubdtype(dtype, np.floating) or dtype == ml_dtypes.bfloat16:
            feeds[spec.name] = _floats(rng, shape, dtype, low, high)
        elif dtype == np.bool_ and math.prod(shape) == 1:  # a switch (optimum's use_cache_branch):
            feeds[spec.name] = np.full(shape, seed % 2 == 0)  # each way in turn, as the seeds go
        elif dtype == np.bool_:
            feeds[spec.name] = rng.integers(0, 2, shape).astype(np.bool_)
        elif low is None:
            feeds[spec.name] = rng.integers(0, 4, shape).astype(dtype)
        else:
            assert high is not None, "a value range has both ends"
            feeds[spec.name] = rng.integers(math.ceil(low), math.floor(high) + 1, shape).astype(dtype)
        if (spec.mask or MASK_NAME.search(spec.name)) and spec.value_range == (0, 1) and len(shape) > 1 and shape[-1]:
            # a padding mask attends to at least one position of each row: a row of zeros has no
            # defined result (a softmax of finfo.min everywhere, uniform in float32 by absorption
            # alone, NaN or another distribution in float16), so no model's output is judged on one
            feeds[spec.name][..., 0] = 1
    return feeds


# seeded random input sets a check makes where the caller gives no number
DEFAULT_RUNS = 3


@dataclass(frozen=True)
class InputSets:
    """The input sets a check runs the models on: `made_up` sets of seeded random data made from
    `specs` (random_inputs: set r seeded `seed + r`, its dynamic dims of size r + 1, so that a
    graph that works at one size only fails), then the caller's own arrays, `given`, as they are."""

    specs: list[InputSpec]
    made_up: int = DEFAULT_RUNS
    given: list[dict] = field(default_factory=list)
    seed: int = 0

    def __len__(self) -> int:
        return self.made_up + len(self.given)

    def made_up_feeds(self) -> list[dict[str, np.ndarray]]:
        """The made-up sets' arrays (a ConvexportError where convexport makes no data of an input's type)."""
        return [random_inputs(self.specs, self.seed + run, dynamic_size=run + 1) for run in range(self.made_up)]


DRAWN_AT_ONCE = 1 << 22  # float64 draws made at a time (32 MiB) before they are rounded to the input's type


def _floats(rng: np.random.Generator, shape: tuple, dtype, low, high) -> np.ndarray:
    """Standard normal (or uniform in [low, high]) values of `dtype`, drawn into the array a
    block at a time: a 1x3x30000x30000 float32 input drawn whole in float64 first took 20 GiB
    for its 10 GiB. numpy's generator gives the same stream drawn at once or block by block,
    so the values are those of one draw."""
    values = np.empty(shape, dtype)
    flat = values.reshape(-1)
    for start in range(0, flat.size, DRAWN_AT_ONCE):
        count = min(DRAWN_AT_ONCE, flat.size - start)
        flat[start : start + count] = rng.standard_normal(count) if low is None else rng.uniform(low, high, count)
    return values


def with_overrides(specs: list[InputSpec], given: list[InputSpec], source) -> list[InputSpec]:
    """A model's input specs with those given by --input (by name) in their place."""
    by_name = {spec.name: spec for spec in given}
    unknown = set(by_name) - {spec.name for spec in specs}
    if unknown:
        raise ConvexportError(
            f"--input {', '.join(sorted(unknown))}: {source} has no such input "
            f"(inputs: {', '.join(s.name for s in specs)})"
        )
    return [_given_over(by_name[spec.name], spec) if spec.name in by_name else spec for spec in specs]


def _given_over(given: InputSpec, graph: InputSpec) -> InputSpec:
    """An --input spec in place of the graph's: the graph's range of values (load/input_domains.py)
    where --input gives none and the dtype is the graph's."""
    if given.value_range is None and graph.value_range is not None and given.dtype == graph.dtype:
        return replace(given, value_range=graph.value_range)
    return given


def dynamic_dims_note(specs: list[InputSpec], sizes: str) -> str:
    """For an error on made-up input data: the dynamic dims and the sizes they were given
    (`sizes`, e.g. "made 1"), and how to fix them; empty when no dim is dynamic."""
    dynamic = [str(spec) for spec in specs if spec.is_dynamic]
    return f" (dynamic dims {sizes}: {', '.join(dynamic)}; fix them with --input NAME:DIMS)" if dynamic else ""
