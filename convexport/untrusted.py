"""Reading torch archives without running code from them.

torch.export.load reads a `.pt2` through several doors that run code the archive supplies:
pickled sample inputs, weights and constants (torch.load, which falls back to
weights_only=False when the safe load fails), opaque constants (pickle.loads), TorchScript
custom objects (torch._C._pickle_load_obj), compiled AOTInductor kernels (a shared library
loaded from data/aotinductor/) and symbolic sizes, which it parses with sympy.sympify, an
eval. `no_code_from_archive` closes each door while a load runs, unless the user trusts the
file: torch.load may only take its safe path, the pickle loaders are refused, sympify gets
only arithmetic over sizes. A refusal is an ArchiveRunsCode naming what would have run.

The doors are closed by replacing module attributes (torch.load, pickle.loads, ...) for the
duration of the block, so the block is not thread-safe: convexport loads one model at a time.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import keyword
import pickle
import tokenize
import zipfile
from pathlib import Path


class ArchiveRunsCode(Exception):
    """Loading the archive would have run code from it (what, in the message). Not a
    RuntimeError, which torch.export.load catches to try its older format."""


# Names an exported program's size expressions use (torch's serializer writes
# Symbol('s77', positive=True, integer=True), 2*s77, FloorDiv(s0, 2), ...): sympy's
# arithmetic and torch.utils._sympy.functions. Any other bare name in an expression is a
# symbol (s77, u0), anything else is refused.
# fmt: off
_SYMPY_NAMES = frozenset({
    "Symbol", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Mod", "Max", "Min", "Abs", "floor", "ceiling",
    "sqrt", "Piecewise", "And", "Or", "Not", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "StrictLessThan",
    "StrictGreaterThan", "LessThan", "GreaterThan", "Equality", "Unequality", "True", "False", "oo", "zoo", "nan",
    "Identity", "FloorDiv", "ModularIndexing", "Where", "PythonMod", "CleanDiv", "CeilToInt", "FloorToInt",
    "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv",
    "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal", "ToFloat",
    "BitwiseFn_bitwise_and", "BitwiseFn_bitwise_or", "OpaqueUnaryFn_sqrt",
})
_SAFE_OPERATORS = frozenset({"(", ")", ",", "+", "-", "*", "/", "%", "=", "**", "//", "<", ">", "<=", ">=", "==", "!=",
                             "&", "|", "~"})
# fmt: on


def is_size_expression(text: str) -> bool:
    """Whether `text` is arithmetic over sizes that sympify can parse without running
    anything: numbers, operators, the names above, symbol names, a quoted symbol name and
    keyword arguments (Symbol('s0', positive=True)). No attribute access, no subscript, no
    other name: sympify evaluates its string with Python's eval, builtins included."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return False
    for index, token in enumerate(tokens):
        kind, value = token.type, token.string
        if kind in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER, tokenize.NUMBER):
            continue
        if kind == tokenize.OP and value in _SAFE_OPERATORS:
            continue
        if kind == tokenize.STRING and value[:1] in "'\"" and value[1:-1].isidentifier() and value[0] == value[-1]:
            continue
        if kind == tokenize.NAME and _is_safe_name(value, tokens[index + 1 :]):
            continue
        return False
    return True


def _is_safe_name(name: str, rest: list) -> bool:
    if name in _SYMPY_NAMES:
        return True
    if keyword.iskeyword(name) or name.startswith("_") or hasattr(builtins, name):
        return False
    follows = next((token.string for token in rest if token.type != tokenize.NL), "")
    is_keyword_argument = follows == "=" and name.isidentifier()
    is_symbol = name.rstrip("0123456789") != name and name.rstrip("0123456789").isalpha()  # s77, u0, q12
    return is_keyword_argument or is_symbol


def compiled_code_members(path: Path) -> list[str]:
    """The members of a `.pt2` archive that hold compiled code (AOTInductor packages, shared
    libraries), which torch.export.load loads and so runs."""
    with zipfile.ZipFile(path) as archive:
        return [
            name
            for name in archive.namelist()
            if "/aotinductor/" in f"/{name}" or name.lower().endswith((".so", ".dll", ".dylib", ".pyd"))
        ]


@contextlib.contextmanager
def no_code_from_archive():
    """While the block runs, the loaders torch uses for archive contents run no code from them
    (see the module doc); what would have is raised as ArchiveRunsCode. Even where torch
    swallows that exception and tries another way, the block ends with it."""
    import sympy
    import torch

    refused: list[str] = []

    def refuse(what: str):
        refused.append(what)
        raise ArchiveRunsCode(what)

    real_load, real_sympify = torch.load, sympy.sympify

    def safe_torch_load(*args, **kwargs):
        if kwargs.get("weights_only") is False:
            refuse("a pickled object that is not a plain tensor or container (unpickling it runs code)")
        kwargs["weights_only"] = True
        return real_load(*args, **kwargs)

    def safe_sympify(value, *args, **kwargs):
        if isinstance(value, str) and not is_size_expression(value):
            refuse(f"a size expression that is not arithmetic ({value[:60]!r}); sympy would evaluate it")
        return real_sympify(value, *args, **kwargs)

    def no_pickle(*_args, **_kwargs):
        refuse("a pickled Python object (unpickling it runs code)")

    def no_custom_object(*_args, **_kwargs):
        refuse("a TorchScript custom object (loading it runs its class's code)")

    replaced = [
        (torch, "load", safe_torch_load),
        (sympy, "sympify", safe_sympify),
        (pickle, "loads", no_pickle),
        (pickle, "load", no_pickle),
        (torch._C, "_pickle_load_obj", no_custom_object),
    ]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in replaced]
    for owner, name, stand_in in replaced:
        setattr(owner, name, stand_in)
    try:
        yield
    except Exception:
        if refused:  # whatever torch made of the refusal, the refusal is the reason
            raise ArchiveRunsCode(refused[0]) from None
        raise
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
    if refused:  # torch caught it and loaded the archive another way
        raise ArchiveRunsCode(refused[0])
