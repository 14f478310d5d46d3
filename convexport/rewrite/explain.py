"""--explain RULE[@MODULE]: what a rule did at each node it looked at, limited, with @MODULE,
to the nodes of one PyTorch module (a dotted path as the report's `module` fields write it,
`stages.2.blocks.0`: that module and every module inside it)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import did_you_mean
from ..ir import Provenance


@dataclass(frozen=True)
class ExplainRequest:
    rule: str
    module: str | None  # a dotted module path, or None: every node

    @classmethod
    def parse(cls, given: str) -> ExplainRequest:
        rule, at, module = given.partition("@")
        return cls(rule, module.strip(".") if at else None)

    @property
    def key(self) -> str:
        """The request as given, the report's key for its verdicts."""
        return self.rule if self.module is None else f"{self.rule}@{self.module}"


def explanations(
    requests: list[ExplainRequest], explained: dict[str, dict[str, str]], provenance: Provenance
) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """The report's `explain` (request -> node -> verdict) and `explain_modules` (node -> the
    module it comes from, `block.expand (Conv2d)`, where the model says). A request whose
    module holds none of the nodes looked at gets one entry, `(module)`, saying so and naming
    the modules of the graph closest to it."""
    shown: dict[str, dict[str, str]] = {}
    for request in requests:
        verdicts = explained.get(request.rule, {})
        if request.module is not None:
            verdicts = {node: why for node, why in verdicts.items() if provenance.within(node, request.module)}
            if not verdicts:
                verdicts = {"(module)": _no_nodes_in(request, provenance)}
        shown[request.key] = verdicts
    modules = {}
    for verdicts in shown.values():
        for node in verdicts:
            found = provenance.modules([node])
            if found:
                modules[node] = found[0]
    return shown, modules


def _no_nodes_in(request: ExplainRequest, provenance: Provenance) -> str:
    paths = provenance.module_paths()
    if request.module in paths:
        return f"the rule looked at no node of {request.module}"
    if not paths:
        return f"no module {request.module}: the model records no module paths"
    hint = did_you_mean(request.module, paths)
    return f"no module {request.module} in the model{hint}"
