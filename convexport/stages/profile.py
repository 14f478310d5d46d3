"""The profile stage: the original and the optimized graph timed against each other on the device, the
speedup judged by its paired interval (profile/paired_timer.py); and where the whole rewrite is slower
there, the fastest of the graphs that leave out the rewrites that cost, the original among them.

A graph the rewrite left as it was is not timed at all: nothing changed. Where the optimized
graph is measurably slower (the whole interval below 1) and the strategy is not `all`, the
candidates are the rewrite with one rule's rewrites left out (each rule that fired), with half
of those rules left out (either half), and with every rule left out (constant folding and
clean-ups alone), each timed against the original in the same paired way; the original as
given is the last candidate, at a speedup of 1 by definition (a rewrite slower by less than
SLOWER_MARGIN is kept; a large model's graphs, timed one after the other rather than in pairs,
are not searched: `speed_choice_skipped` says so). The candidate with the highest
speedup whose interval does not lie below 1 is written, and the rewrites it leaves out are
reported under `dropped_for_speed` with the ratio measured.

Each function hands back the report sections it found; pipeline.py places them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import onnx

from .. import ir
from ..load.export import ExportResult
from ..profile.paired_timer import TARGET
from ..profile.profiler import TimingSettings, profile_models
from ..report.types import DroppedRewrite, Profile, Rewrite, Skipped, SpeedCandidate, SpeedChoice, TimedRatio
from ..runtime import MissingKernel
from .inputs import RunInputs
from .report import REGRESSION_RATIO
from .request import Request
from .rewrite import Rewritten

MAX_CANDIDATES = 6  # graphs timed beside the original, after the whole rewrite
# A rewrite is replaced only where it is slower by more than the timer aims to resolve: two
# graphs that ONNX Runtime runs alike (a Conv and BatchNormalization it fuses itself) can read
# 0.99x with an interval of a few tenths of a percent, a difference no deployment would see.
SLOWER_MARGIN = TARGET


@dataclass
class Profiled:
    """The report's profile section, or why there is none (its profile_skipped)."""

    profile: Profile | None = None
    skipped: str | None = None


def profiled(
    exported: ExportResult,
    optimized: onnx.ModelProto,
    inputs: RunInputs,
    request: Request,
    after_timing: Callable[[object], None] | None = None,
) -> Profiled:
    """The profile of `optimized` (annotated as it is written) against the model as given, or
    why it was skipped: the device has no kernel for a graph, or the graph is unchanged.
    `after_timing` is handed the optimized graph's session once it is timed (TF32's effect is
    read on it: stages/validate.py)."""
    original = exported.as_given()
    if ir.same_computation(original, optimized):
        return Profiled(skipped="the optimized graph computes as the original does, node for node: nothing to time")
    device = request.device
    say = request.steps.start
    say(f"profiling on {device}")
    try:
        measured = profile_models(
            {"before": original, "after": optimized},
            _timed_specs(inputs),
            device,
            TimingSettings(per_op=request.options.per_op, threads=request.options.threads),
            feeds=_feeds(inputs),
            progress=lambda done, total: say(
                f"profiling on {device}", f"{done}/{total} timed" if total else f"{done} pairs"
            ),
            after_timing={"after": after_timing} if after_timing else None,
        )
    except MissingKernel as exc:
        return Profiled(skipped=str(exc))
    profile = judged_profile(measured)
    if inputs.sets.made_up:
        profile["inputs"] = [str(spec) for spec in _timed_specs(inputs)]
    if profile["verdict"] == "slower" and measured["paired"]["stopped"] != "apart":
        say(f"profiling on {device}", "the original against itself")
        _against_itself(profile, original, inputs, request)
    return Profiled(profile)


def _against_itself(profile: Profile, original: onnx.ModelProto, inputs: RunInputs, request: Request) -> None:
    """Where the optimized graph read slower: the original timed against a fresh session of
    itself (profile["against_itself"]), and the verdict "no measurable change" where the
    slowdown lies within how far from 1 that reads. Two sessions of one graph can differ by a
    few percent for as long as they live (ONNX Runtime's arena places their buffers apart:
    bench/RESULTS.md), which no interval of pairs within one pair of sessions sees."""
    itself = profile_models(
        {"before": original, "after": original}, _timed_specs(inputs), request.device, _ratio_only(request),
        feeds=_feeds(inputs),
    )["paired"]  # fmt: skip
    profile["against_itself"] = {"speedup": itself["speedup"], "low": itself["low"], "high": itself["high"]}
    apart = max(abs(itself["speedup"] - 1), 1 - itself["low"], itself["high"] - 1)
    if profile["speedup_interval"][1] >= 1 - apart:
        profile["verdict"] = "no measurable change"


def _ratio_only(request: Request) -> TimingSettings:
    """The timing of a ratio alone: no peak memory, no per-op times."""
    return TimingSettings(memory=False, per_op=False, threads=request.options.threads)


def _feeds(inputs: RunInputs) -> dict | None:
    return inputs.sets.given[0] if inputs.sets.made_up == 0 else None


def _timed_specs(inputs: RunInputs) -> list:
    """The sizes made-up inputs are timed at: grown where the model leaves dims dynamic (profile/timed_sizes.py)."""
    return inputs.timed or inputs.sets.specs


def judged_profile(measured: dict) -> Profile:
    """The profile with its speedup, the interval of that ratio and a verdict a person can
    read: faster or slower where the whole 95% interval of the paired ratio says so, else no
    measurable change. `noise` is the interval's larger side, relative to the speedup."""
    paired = measured["paired"]
    speedup, low, high = paired["speedup"], paired["low"], paired["high"]
    noise = max(speedup - low, high - speedup) / speedup if speedup > 0 else float("inf")
    if low > 1:
        verdict = "faster"
    elif high < 1:
        verdict = "slower"
    else:
        verdict = "no measurable change"
    judged = {**measured, "speedup": speedup, "speedup_interval": [low, high], "noise": noise, "verdict": verdict}
    profile = cast(Profile, judged)  # profile_models' Timing fields, and these
    peak_before, peak_after = measured["before"].get("peak_memory_bytes"), measured["after"].get("peak_memory_bytes")
    if peak_before and peak_after:
        profile["memory_ratio"] = peak_after / peak_before
        profile["memory_regression"] = peak_after > REGRESSION_RATIO * peak_before
    return profile


@dataclass
class Candidate:
    """A graph made with the rules of `dropped` left out, timed against the original; `applied`
    and `skipped` are its own rewrites and refusals (leaving a rule out can change what another
    rule does: a conv no longer folded into its BatchNorm may merge with a sibling)."""

    dropped: tuple[str, ...]
    model: onnx.ModelProto
    applied: list[Rewrite] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    speedup: float = 1.0
    low: float = 1.0
    high: float = 1.0


@dataclass
class SpeedSearch:
    """What the search for a faster graph found: the report's speed_choice_skipped where it was
    not made; else the graph chosen (with the annotations the rewrite gave it; the reference
    itself for the model as given), the report's speed_choice, the chosen graph's rewrites and
    refusals (its rewrites and skipped), and the whole rewrite's rewrites it does not make
    (dropped_for_speed)."""

    not_made: str | None = None
    model: onnx.ModelProto | None = None
    choice: SpeedChoice | None = None
    applied: list[Rewrite] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    dropped: list[DroppedRewrite] = field(default_factory=list)


def faster_candidate(
    exported: ExportResult,
    rewritten: Rewritten,
    inputs: RunInputs,
    request: Request,
    profile: Profile | None,
    rewrites: list[Rewrite],
) -> SpeedSearch | None:
    """The graph to write instead of the whole rewrite (`rewrites`), where `profile` found it
    slower (module doc); None where nothing is to change. Each candidate is timed annotated as it
    would be written (ir.as_declared) against the model as given."""
    if not profile or request.strategy == "all" or request.dtype != "float32":
        return None
    if profile["verdict"] != "slower" or profile["speedup_interval"][1] >= 1 - SLOWER_MARGIN:
        return None
    if profile["paired"]["stopped"] == "apart":  # a large model's, timed apart: no paired ratio to act on
        return SpeedSearch(
            not_made="the models were timed one after the other (each holds its weights), not in pairs: their "
            "ratio mixes two moments of the machine, too uncertain to drop rewrites for"
        )
    say = request.steps.start
    original = exported.as_given()
    fired = list(dict.fromkeys(rewrite["rule"] for rewrite in rewrites))
    timed: list[Candidate] = []
    for left_out in _drop_sets(fired):
        say("choosing for speed", f"without {', '.join(left_out)}")
        outcome = rewritten.without(frozenset(left_out), exported.reference)
        if ir.same_computation(original, outcome.model):
            continue
        measured = profile_models(
            {"before": original, "after": _as_written(outcome.model, exported.declared)}, _timed_specs(inputs),
            request.device, _ratio_only(request), feeds=_feeds(inputs),
        )["paired"]  # fmt: skip
        timed.append(Candidate(
            left_out, outcome.model, outcome.applied, outcome.skipped,
            measured["speedup"], measured["low"], measured["high"],
        ))  # fmt: skip
    given = Candidate(tuple(fired), exported.reference)
    chosen = max([c for c in timed if c.high >= 1] + [given], key=lambda c: c.speedup)
    speedup, (low, high) = profile["speedup"] or 0.0, profile["speedup_interval"]
    whole: TimedRatio = {"speedup": speedup, "low": low, "high": high}
    choice: SpeedChoice = {
        "all_rewrites": whole,
        "candidates": [*(_entry(c) for c in timed), {**_entry(given), "as_given": True}],
        "chosen": list(chosen.dropped),
        "written_as_given": chosen is given,
    }
    made = {_made(rewrite) for rewrite in chosen.applied}
    dropped: list[DroppedRewrite] = [
        {**rewrite, "speedup_without": chosen.speedup, "speedup_with_all": speedup}
        for rewrite in rewrites
        if _made(rewrite) not in made
    ]
    return SpeedSearch(
        model=chosen.model, choice=choice, applied=chosen.applied, skipped=chosen.skipped, dropped=dropped
    )


def _as_written(model: onnx.ModelProto, declared) -> onnx.ModelProto:
    """A copy of `model` annotated as it would be written (ir.as_declared)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return ir.as_declared(copy, declared)


def _made(rewrite: Rewrite) -> tuple:
    """A rewrite as what it did: its rule and the nodes it replaced."""
    return rewrite["rule"], tuple(rewrite["nodes"])


def _entry(candidate: Candidate) -> SpeedCandidate:
    return {
        "dropped": list(candidate.dropped),
        "nodes": len(candidate.model.graph.node),
        "speedup": candidate.speedup,
        "low": candidate.low,
        "high": candidate.high,
    }


def _drop_sets(fired: list[str]) -> list[tuple[str, ...]]:
    """The rule sets to leave out, in order: each rule alone, each half, all of them; at most
    MAX_CANDIDATES, the single rules cut first."""
    singles = [(rule,) for rule in fired] if len(fired) > 1 else []
    middle = len(fired) // 2
    halves = [tuple(fired[:middle]), tuple(fired[middle:])] if len(fired) > 2 else []
    wider = [*halves, tuple(fired)]
    return singles[: max(0, MAX_CANDIDATES - len(wider))] + wider
