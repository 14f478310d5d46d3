"""`convexport rules test`: apply each rule to random instances of its pattern and check the
rewritten model against the original with ONNX Runtime.

An instance counts when ONNX Runtime runs the original to finite outputs. The rule, alone,
rewrites it (strategy exact, so no cost decision hides a wrong fold); where it applied, the
rewrite must leave its input model untouched, load in ONNX Runtime, keep every output's name
and shape, and match within the fp32 tolerances of `convexport validate`. The first instance
that fails is shrunk by hypothesis to a small one and saved as the counterexample.
"""

from __future__ import annotations

import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
from hypothesis import HealthCheck, find, settings
from hypothesis.errors import NoSuchExample

from ..errors import ConvexportError, first_line
from ..folds.primitives import Primitive
from ..load.inputs import random_inputs
from ..load.onnx_route import graph_input_specs
from ..rewrite.engine import RewriteSettings, rewrite_model
from ..rewrite.rulefile import Rule
from ..runtime import create_session, ort
from ..util.files import write_atomically
from ..validate.float64 import Float64Evaluator, Float64Unavailable, as_float64
from ..validate.judges import compare_arrays, compare_exactly
from ..validate.results import Tolerances, ValidationResult
from .coverage import degenerate, instance_features, possible
from .instances import Instance, instances, unsupported_ops
from .samplers import SAMPLERS

NOT_APPLIED, INVALID = "not applied", "invalid"


@dataclass
class RuleTestResult:
    rule: Rule
    instances: int = 0  # valid instances tried before any failure
    applied: int = 0  # of those, where the rule rewrote something
    failure: str | None = None  # what the (shrunk) counterexample shows
    saved: list[Path] = field(default_factory=list)
    untested: str | None = None
    not_rewritten: Counter = field(default_factory=Counter)  # why, for the valid instances left alone
    exercised: set[str] = field(default_factory=set)  # coverage.py's cases, in instances it rewrote
    drawn: set[str] = field(default_factory=set)  # the same, in every valid instance
    possible: set[str] = field(default_factory=set)  # every case of the pattern's ops
    telling: int = 0  # rewritten instances with no node in its op's degenerate case
    rounds: int = 0  # rounds of `examples` draws made

    @property
    def only_degenerate(self) -> bool:
        """Verified only on instances where some pattern node computes nothing worth checking."""
        return self.applied > 0 and self.telling == 0

    def reasons(self, most: int = 3) -> str:
        """The commonest reasons instances were not rewritten, with their counts."""
        return "; ".join(f"{count}x {why}" for why, count in self.not_rewritten.most_common(most))


def verify_rule(
    rule: Rule,
    primitives: dict[str, Primitive],
    examples: int,
    seed: int,
    out_dir: Path,
    rewritten: int = 0,
    budget_s: float = 60.0,
) -> RuleTestResult:
    """Rounds of `examples` random instances (the first seeded with `seed`, each next with the
    next seed) until at least `rewritten` of them were rewritten and every case of the
    pattern's ops (coverage.py) was in one, or `budget_s` has passed."""
    ops = frozenset(op for line in rule.pattern for op in line.op_types)
    # a node computing nothing matters where the rule reads through it, not at the root it
    # rewrites (drop-empty-pad exists for the Pad that pads nothing)
    inner_ops = frozenset(op for line in rule.pattern[:-1] for op in line.op_types)
    result = RuleTestResult(rule, possible=possible(rule))
    for path, must_rewrite in rule.examples:
        problem = _check_example(path, must_rewrite, rule, primitives)
        if problem:
            result.failure, result.saved = f"example {path.name}: {problem}", [path]
            return result
    missing = unsupported_ops(rule)
    if missing:
        result.untested = f"no random instances of {', '.join(missing)} (rules test knows {_known_ops()})"
        return result
    searching = [True]  # until the first counterexample; hypothesis then shrinks it

    def is_counterexample(instance: Instance) -> bool:
        verdict, _, why_not = check_instance(instance, rule, primitives)
        if searching[0] and verdict != INVALID:
            result.instances += 1
            result.applied += verdict != NOT_APPLIED
            cases = instance_features(instance.model, instance.feeds, ops)
            result.drawn.update(*cases.values())
            if verdict == NOT_APPLIED:
                result.not_rewritten[why_not] += 1
            elif verdict is None:
                result.exercised.update(*cases.values())
                result.telling += not degenerate(cases, inner_ops)
        failed = verdict not in (None, NOT_APPLIED, INVALID)
        searching[0] = searching[0] and not failed
        return failed

    budget = settings(max_examples=examples, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    deadline = time.monotonic() + budget_s
    while True:
        try:
            draws = random.Random(seed + result.rounds)
            found = find(instances(rule), is_counterexample, settings=budget, random=draws)
        except NoSuchExample:
            result.rounds += 1
            covered = result.applied >= rewritten and (rewritten == 0 or result.possible <= result.drawn)
            if covered or time.monotonic() > deadline:
                break
            continue
        result.failure, rewritten_model, _ = check_instance(found, rule, primitives)
        result.saved = _save_counterexample(found, rewritten_model, rule, out_dir)
        return result
    if result.applied == 0:
        result.untested = (
            f"none of {result.instances} valid random instances was rewritten: the rule's "
            f"conditions or its primitive refused them all ({result.reasons()})"
        )
    return result


def _check_example(path: Path, must_rewrite: bool, rule: Rule, primitives: dict[str, Primitive]) -> str | None:
    """What is wrong with one of the rule's `examples:` (None: as it should be): a model it must
    rewrite, exactly, or leave alone."""
    model = onnx.load(str(path))
    instance = Instance(model, random_inputs(graph_input_specs(model), seed=0))
    verdict, _, why_not = check_instance(instance, rule, primitives)
    if verdict == INVALID:
        return "the model does not run to finite outputs on random inputs"
    if verdict == NOT_APPLIED:
        return f"not rewritten ({why_not})" if must_rewrite else None
    if not must_rewrite:
        return "rewritten, but the example says it must be left alone"
    return verdict


def _why_not(explained: dict[str, str]) -> str:
    """What --explain said at the instance's root node (the last node the rule looked at), with
    the instance's node and tensor names written <name> and its numbers # (so that the same
    reason counts once over instances, whole)."""
    if not explained:
        return "no node of the root's op"
    named = re.sub(r"\b[A-Za-z_]+_\d+\b", "<name>", list(explained.values())[-1])
    return re.sub(r"(?<![A-Za-z_])-?\d+(\.\d+)?(e[+-]?\d+)?(?![A-Za-z_\d])", "#", named)


CRASHED = "crashed: "  # a failure that is the primitive's exception, not a wrong result


class Checked(NamedTuple):
    verdict: str | None  # None: applied and exact; NOT_APPLIED, INVALID, or what is wrong
    rewritten: onnx.ModelProto | None  # when the rewrite produced one
    why_not: str = ""  # for NOT_APPLIED: why (the engine's --explain verdict)


def check_instance(instance: Instance, rule: Rule, primitives: dict[str, Primitive]) -> Checked:
    """The rule's verdict on one instance (INVALID: the original does not run to finite outputs)."""
    try:
        every_value = _run(_every_value_an_output(instance.model), instance.feeds)
    except Exception:
        return Checked(INVALID, None)
    expected = {output.name: every_value[output.name] for output in instance.model.graph.output}
    if not all(np.all(np.isfinite(value)) for value in expected.values() if value.dtype.kind == "f"):
        return Checked(INVALID, None)
    if not _shapes_as_inferred(instance.model, every_value):
        return Checked(INVALID, None)
    before = instance.model.SerializeToString()
    try:
        explaining = RewriteSettings("all", explain=frozenset({rule.name}))
        outcome = rewrite_model(instance.model, [rule], primitives, explaining, source="rule instance")
    except ConvexportError as exc:
        return Checked(f"{CRASHED}the rewrite failed: {exc}", None)
    except Exception as exc:
        return Checked(f"{CRASHED}the rewrite raised {type(exc).__name__}: {first_line(exc)}", None)
    if instance.model.SerializeToString() != before:
        return Checked("the rewrite modified its input model in place", outcome.model)
    if not outcome.applied:
        return Checked(NOT_APPLIED, outcome.model, _why_not(outcome.explained.get(rule.name, {})))
    problem = _compare(expected, instance.model, outcome.model, instance.feeds)
    if problem and problem.startswith(DIFFERS) and _exact_in_float64(instance, rule, primitives):
        problem = None  # float32 rounding of folded weights, magnified where the output cancels
    return Checked(problem, outcome.model)


# Where the float32 rewrite misses the bound, the rule gets a second look at its algebra: the
# instance widened to float64, rewritten there, must give the float64 result to this relative
# error of its scale. Weights rounded to float64 move a result by about 1e-16 of its terms, so
# even a result that cancels terms a million times its size stays far inside; a wrong fold is
# off by the size of what it got wrong. (A 1x1 Gemm + bias + scale whose output cancels to 0.2%
# of its terms missed the float32 bound by 2x on its weights' float32 rounding alone.)
FLOAT64_ALGEBRA_RTOL = 1e-9
DIFFERS = "differs: "


def _exact_in_float64(instance: Instance, rule: Rule, primitives: dict[str, Primitive]) -> bool:
    """Whether the rule, applied to the instance in float64, computes its float64 result."""
    wide = as_float64(instance.model)
    try:
        outcome = rewrite_model(wide, [rule], primitives, RewriteSettings("all"), source="rule instance")
        if not outcome.applied:
            return False
        expected = Float64Evaluator(wide).run(instance.feeds)
        actual = Float64Evaluator(outcome.model).run(instance.feeds)
    except Exception:  # (the failure found in float32 stands)
        return False
    for want, got in zip(expected, actual):
        scale = max(float(np.sqrt(np.mean(np.square(want)))) if want.size else 0.0, 1e-30)
        if want.shape != got.shape or np.max(np.abs(got - want), initial=0.0) > FLOAT64_ALGEBRA_RTOL * scale:
            return False
    return True


def _every_value_an_output(model: onnx.ModelProto) -> onnx.ModelProto:
    """The instance with every value shape inference typed as an output too (it is small)."""
    widened = onnx.ModelProto()
    widened.CopyFrom(model)
    named = {output.name for output in widened.graph.output}
    widened.graph.output.extend(value for value in model.graph.value_info if value.name not in named)
    return widened


def _shapes_as_inferred(model: onnx.ModelProto, values: dict[str, np.ndarray]) -> bool:
    """Whether the values ONNX Runtime computes have the shapes ONNX's shape inference gave the
    instance: where they differ (an AveragePool with ceil_mode whose last window starts past
    its input: inference counts the window, ONNX Runtime does not, and a kernel that fit the
    axis as inferred does not fit it as computed), the instance is not one model, and no
    rewrite of it can be judged."""
    for value in (*model.graph.value_info, *model.graph.output):
        dims = value.type.tensor_type.shape.dim
        declared = [dim.dim_value if dim.HasField("dim_value") else None for dim in dims]
        actual = values.get(value.name)
        if actual is not None and declared and list(actual.shape) != declared and None not in declared:
            return False
    return True


def _compare(
    expected: dict[str, np.ndarray], original: onnx.ModelProto, rewritten: onnx.ModelProto, feeds: dict
) -> str | None:
    """What is wrong with the rewritten instance, judged as optimize judges a model: against
    the instance's float64 result, the rewritten graph in float32 and in float64 (an instance is
    small), with the tolerances where no float64 run is to be had."""
    try:
        actual = _run(rewritten, feeds)
    except Exception as exc:
        return f"the rewritten model does not run in ONNX Runtime: {first_line(exc)}"
    exact, rewritten64 = _float64_runs(original, rewritten, feeds)
    for name, reference in expected.items():
        if name not in actual:
            return f"the rewritten model lacks output {name!r}"
        if actual[name].shape != reference.shape:
            return f"output {name!r} has shape {actual[name].shape} instead of {reference.shape}"
        if exact is not None and name in exact:
            error = compare_exactly(
                reference, actual[name], exact[name], rewritten64.get(name) if rewritten64 else None, Tolerances(), name
            )
        else:
            error = compare_arrays(reference, actual[name], *Tolerances().for_output(name, str(reference.dtype)))
        if error.mismatches:
            return f"{DIFFERS}{ValidationResult(False, 1, Tolerances(), {name: error}).summary()}"
    return None


def _float64_runs(original, rewritten, feeds) -> tuple[dict | None, dict | None]:
    """The original's and the rewritten graph's outputs in float64 by name (None where the
    float64 evaluator cannot run them)."""
    runs: list[dict | None] = []
    for model in (original, rewritten):
        try:
            values = Float64Evaluator(model).run(feeds)
        except Float64Unavailable:
            runs.append(None)
            continue
        runs.append(dict(zip([output.name for output in model.graph.output], values)))
    return runs[0], runs[1]


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = create_session(model, optimize=False, prepack=False)
    names = [output.name for output in session.get_outputs()]
    quiet = ort.RunOptions()
    quiet.log_severity_level = 4  # invalid instances fail in ONNX Runtime by design
    return dict(zip(names, session.run(names, feeds, quiet)))


def _save_counterexample(
    instance: Instance, rewritten: onnx.ModelProto | None, rule: Rule, out_dir: Path
) -> list[Path]:
    """The instance as <rule>.counterexample.onnx, its inputs as .npz (for `convexport
    validate --inputs`), and the rule's rewrite of it as <rule>.rewritten.onnx when it has one."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model_path = out_dir / f"{rule.name}.counterexample.onnx"
    inputs_path = out_dir / f"{rule.name}.counterexample.npz"
    write_atomically(model_path, lambda path: onnx.save(instance.model, path))
    write_atomically(inputs_path, lambda path: _save_npz(path, instance.feeds))
    saved = [model_path, inputs_path]
    if rewritten is None:
        return saved
    rewritten_path = out_dir / f"{rule.name}.rewritten.onnx"
    write_atomically(rewritten_path, lambda path: onnx.save(rewritten, path))
    return saved + [rewritten_path]


def _save_npz(path: str, feeds: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as handle:
        np.savez(handle, **feeds)  # type: ignore[arg-type]  # (numpy's stub: a key could be allow_pickle)


def _known_ops() -> str:
    return ", ".join(sorted(SAMPLERS))
