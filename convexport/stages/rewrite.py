"""The rewrite stage: constant folding and the rules, ONNX Runtime's fusions kept whole, copies of a
weight written once; and, for a bisection, the same rewrite stopped after its first N rewrites."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NotRequired, TypedDict, cast

import onnx

from .. import ir
from ..errors import ConvexportError, did_you_mean
from ..folds import builtin_primitives
from ..half.islands import no_op_casts_in_subgraphs
from ..load.export import ExportResult
from ..load.float32_twin import is_twin_of, twin_types
from ..report.types import (
    ConstantFolding,
    DeduplicatedInitializers,
    LowRankBranch,
    RuntimeFusion,
    TransformerFusions,
)
from ..rewrite import transformer_fusions
from ..rewrite.engine import RewriteOutcome, RewriteSettings, rewrite_model
from ..rewrite.explain import ExplainRequest, explanations
from ..rewrite.low_rank import low_rank_branches_left
from ..rewrite.rulefile import builtin_rule_files, load_rules, rule_files
from ..rewrite.runtime_fusions import fusion_entries
from ..util.progress import BytesShown
from .request import Request


@dataclass
class RulesAsked:
    """The rules to run and the --explain requests, read before any work."""

    rules: list
    explain: list[ExplainRequest]


def rules_asked(request: Request) -> RulesAsked:
    explain = [ExplainRequest.parse(given) for given in request.explain]
    rules = _rules(
        request.rule_files, request.options.builtin_rules, request.disabled_rules, [asked.rule for asked in explain]
    )
    return RulesAsked(rules, explain)


def _rules(paths: Sequence[str | Path], builtin: bool, disabled: Sequence[str] = (), explained: Sequence[str] = ()):
    """The rules to run: the built-in ones (unless not `builtin`) and the files in `paths`,
    without those `disabled`; a name in `disabled` or `explained` that no rule has is an error."""
    primitives = builtin_primitives()
    files = (builtin_rule_files() if builtin else []) + rule_files(list(paths))
    rules = load_rules(files, set(primitives))
    names = [rule.name for rule in rules]
    for option, given in (("--disable-rule", disabled), ("--explain", explained)):
        for name in given:
            if name not in names:
                hint = did_you_mean(name, names, "; `convexport rules list` names them")
                raise ConvexportError(f"{option} {name}: no rule of that name{hint}")
    return [rule for rule in rules if rule.name not in set(disabled)]


class RewriteSections(TypedDict):
    """The report's sections the rewrite stage writes (report/types.py declares each)."""

    constant_folding: ConstantFolding
    low_rank_branches_left: list[LowRankBranch]
    runtime_fusions: list[RuntimeFusion]
    deduplicated_initializers: NotRequired[DeduplicatedInitializers]
    transformer_fusions: NotRequired[TransformerFusions]
    explain: NotRequired[dict[str, dict[str, str]]]
    explain_modules: NotRequired[dict[str, str]]


@dataclass
class Rewritten:
    """The rewrite's outcome (its model, the rewrites applied and refused) and what replaying
    it needs: the folded model the rules ran on, the kernels kept whole, the cost or measure
    decisions. `fused` are the kernels ONNX Runtime's transformer optimizer makes of the
    rewritten model ((kind, node names), rewrite/transformer_fusions.py): more than `kept` where the
    rewrite lets it fuse more (a merged LoRA, an attention); the half stage keeps each in one
    precision. `sections` are the report's parts this stage knows, in the report's order."""

    outcome: RewriteOutcome
    folded: onnx.ModelProto
    kept: list
    decided: dict
    rules: list
    source: str
    strategy: Literal["all", "cost", "measure"]
    device: Literal["cpu", "cuda"]
    half: str | None  # the half type of --dtype, which some folds weigh (rewrite_model)
    sections: RewriteSections
    fused: list

    def first(self, limit: int) -> onnx.ModelProto:
        """The model after the first `limit` rewrites only, for a bisection (the decisions of
        cost and measure replayed, never made again)."""
        return self._replayed(self.rules, limit).model

    def without(self, dropped: frozenset[str], reference: onnx.ModelProto):
        """The rewrite's outcome (rewrite.engine.RewriteOutcome: the model, the rewrites made and
        refused) with the rules named in `dropped` left out (the decisions of cost and measure
        replayed), its dims named as `reference` names them and copies of a weight written once,
        as the stage writes its own."""
        outcome = self._replayed([rule for rule in self.rules if rule.name not in dropped], None)
        model = ir.carry_dim_names(outcome.model, reference, same_outputs=True)
        outcome.model = ir.deduplicate_initializers(model).model
        return outcome

    def _replayed(self, rules: list, limit: int | None):
        settings = RewriteSettings(self.strategy, self.device, self.half, kept_kernels=self.kept)
        return rewrite_model(
            self.folded, rules, builtin_primitives(), settings, source=self.source, limit=limit, decided=self.decided
        )


def rewritten(exported: ExportResult, source: str, asked: RulesAsked, request: Request) -> Rewritten:
    primitives = builtin_primitives()
    explained = frozenset(question.rule for question in asked.explain)

    half = None if request.dtype == "float32" else request.dtype

    def rewrite(folded: onnx.ModelProto, kept: list, decided: dict):
        settings = RewriteSettings(request.strategy, request.device, half, explained, kept)
        return rewrite_model(folded, asked.rules, primitives, settings, source=source, decided=decided)

    say = request.steps.start
    with ir.counting_bytes(BytesShown(say, "rewriting", "of weights read", ir.weight_bytes(exported.model))):
        stage = transformer_fusions.rewrite_keeping_fusions(
            exported.model, _named_dims(exported), source, request.strategy, rewrite,
            # under --dtype, the model's no-op Casts into float32 say where it computes in float32
            no_op_casts_in_subgraphs(exported.model) if half else frozenset(),
        )  # fmt: skip
    outcome = stage.outcome
    deduplicated = ir.deduplicate_initializers(outcome.model)  # copies of a weight, written once
    outcome.model = deduplicated.model
    # in the report's key order (a RewriteSections literal would put its optional keys last)
    sections: dict[str, object] = {}
    if deduplicated.merged:
        sections["deduplicated_initializers"] = {
            "merged": deduplicated.merged,
            "bytes_saved": deduplicated.bytes_saved,
        }
    sections["low_rank_branches_left"] = low_rank_branches_left(outcome.model, outcome.provenance)
    sections["runtime_fusions"] = fusion_entries(outcome.applied, outcome.skipped)
    if stage.before.counts:
        sections["transformer_fusions"] = transformer_fusions.report_entry(stage)
    if asked.explain:
        sections["explain"], sections["explain_modules"] = explanations(
            asked.explain, outcome.explained, outcome.provenance
        )
    sections["constant_folding"] = {
        "nodes_before": len(exported.model.graph.node),
        "nodes_after": len(stage.folded.graph.node),
        "between_rules": outcome.folded,
    }
    fused = [(kernel.kind, kernel.nodes) for kernel in stage.after.kernels] if stage.after else stage.kept
    return Rewritten(
        outcome, stage.folded, stage.kept, stage.decided, asked.rules, source, request.strategy, request.device,
        half, cast(RewriteSections, sections), fused,
    )  # fmt: skip


def _named_dims(exported: ExportResult) -> onnx.ModelProto:
    """The model whose dims the rewritten one takes where it lost them: the model as given, or
    for a float16 model's float32 twin its declarations in the twin's types."""
    if exported.model is not exported.reference and is_twin_of(exported.model, exported.reference):
        return twin_types(exported.reference)
    return exported.reference
