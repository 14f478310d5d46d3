"""A rule's pattern against its primitive's contract (primitives.consumes): what would make
the primitive read the match other than the author meant, found when the rule file is read.

A three-line pattern `h = Conv(x, ...)`, `m = Mul(h, k)`, `y = Add(m, b)` given to
compose_linear, which reads `h` and the root, rewrites Add(Conv(x)) and drops the Mul: every
test the rule passes then depends on the Mul being neutral. `rules check` says so instead.
"""

from __future__ import annotations

from ..folds.primitives import Contract
from .pattern import PatternNode


def contract_problems(pattern: tuple[PatternNode, ...], contract: Contract, apply: str) -> list[tuple[int, str]]:
    """(pattern line in the file, message) for each way the pattern breaks the contract; the
    line is 0 where the problem is the pattern as a whole."""
    root = pattern[-1]
    named = {ref.name for line in pattern for ref in (*line.outputs, *line.inputs) if not ref.wildcard}
    read = {name.rstrip("?") for name in contract.names}
    problems = []
    for name in contract.names:
        if not name.endswith("?") and name not in named:
            problems.append((0, f"{apply} reads {name!r}, which the pattern does not name ({_reads(contract)})"))
    if not contract.every_line:
        for line in pattern[:-1]:
            if not read.intersection(line.output_names):
                problems.append(
                    (
                        line.line,
                        f"`{line.text}`: {apply} does not read this line ({_reads(contract)}): what it "
                        "computes would be dropped from the rewrite",
                    )  # fmt: skip
                )
    for name, ops in contract.ops.items():
        line = root if name == "root" else next((line for line in pattern if name in line.output_names), None)
        if line is not None and not line.op_types <= ops:
            taken = ", ".join(sorted(ops))
            problems.append((line.line, f"`{line.text}`: {apply} handles {taken} there, not {line.op_type}"))
    return problems


def _reads(contract: Contract) -> str:
    names = [name.rstrip("?") for name in contract.names]
    return f"it reads {', '.join(names)} and the root line" if names else "it reads the root line alone"
