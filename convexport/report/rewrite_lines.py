"""The terminal's lines for the rewrite's report entries: ONNX Runtime's fusions kept whole,
low-rank branches left beside their layer, what ONNX Runtime's transformer optimizer fuses in
both graphs (report["runtime_fusions"], ["low_rank_branches"], ["transformer_fusions"])."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from .types import LowRankBranch, RuntimeFusion, TransformerFusions


def runtime_fusions_line(entries: Sequence[RuntimeFusion]) -> str:
    """One line for the terminal: the fusions kept whole and those broken, by kind."""
    parts = []
    for kept, verb in ((True, "kept whole"), (False, "broken (--strategy all)")):
        chosen = [entry for entry in entries if entry["kept"] == kept]
        if chosen:
            kinds = sorted({entry["fusion"] for entry in chosen})
            counted = ", ".join(f"{sum(e['fusion'] == kind for e in chosen)} {kind}" for kind in kinds)
            rules = sorted({rule for entry in chosen for rule in entry["rules"]})
            parts.append(f"{verb}: {counted} (wanted by {', '.join(rules)})")
    return "ONNX Runtime fusions " + "; ".join(parts)


def low_rank_line(branches: Sequence[LowRankBranch]) -> str:
    """One line for the terminal: how many, where, and how to ask why."""
    first = branches[0]
    where = first["module"] or first["nodes"][-1]
    more = f" and {len(branches) - 1} more" if len(branches) > 1 else ""
    return (
        f"low-rank branches left unmerged: {len(branches)} (rank {first['rank']} beside "
        f"{first['in_features']} -> {first['out_features']} at {where}{more}); "
        "--explain linear-region says why"
    )


def transformer_fusions_line(entry: TransformerFusions) -> str | None:
    """One line for the terminal: what the optimizer fuses in the original as the model type
    checked, and what of it the optimized graph keeps, loses or adds."""
    checked = [(t, counts) for t, counts in (entry.get("model_types") or {}).items() if counts["optimized"] is not None]
    if not checked:
        return None
    model_type, counts = checked[0]
    before, after = Counter(counts["original"]), Counter(counts["optimized"])
    lost_here = (entry.get("lost") or {}).get(model_type)
    verdict = f"lost {_kernel_list(lost_here)}" if lost_here else "all kept"
    gained = {op: after[op] - before[op] for op in after if after[op] > before[op]}
    if gained and not lost_here:
        verdict += f", and {_kernel_list(gained)} more in the optimized graph"
    line = f"ONNX Runtime's transformer optimizer (as {model_type}) fuses {_kernel_list(before)}: {verdict}"
    untried = not_tried_text(entry)
    return f"{line} ({untried})" if untried else line


def not_tried_text(entry: TransformerFusions) -> str | None:
    """What the check left out for time, in words, or None where it left nothing out."""
    skipped = entry.get("not_tried_for_time")
    if not skipped:
        return None
    parts = []
    if skipped["model_types"]:
        parts.append("as " + ", ".join(skipped["model_types"]))
    if skipped["shape_arithmetic_kept"]:
        parts.append("with the shape arithmetic kept")
    return (
        f"not run {' nor '.join(parts)}: one run of the optimizer took {skipped['longest_run_s']:.0f} s, "
        f"past the check's {skipped['budget_s']:.0f} s"
    )


def _kernel_list(counts) -> str:
    return ", ".join(f"{n} {op}" for op, n in sorted(counts.items()))
