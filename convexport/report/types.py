"""The reports convexport writes, as types: the one place a report's fields are declared.

`optimize --report`, `validate --report` and `profile --report` write JSON objects of the
types below (OptimizeReport, ValidateReport, ProfileReport); the Python API's
`OptimizeResult.report` is the same object as a dict. They are TypedDicts, not dataclasses, so
that the report stays what the contract says it is (a dict that is its own JSON, read as
`report["validation"]["passed"]`) while each field has one declared type and meaning.
report/schema.py makes the JSON Schema from these declarations (`convexport report-schema`
prints it); the test suite checks every report it writes against that schema.

Each field is `Annotated[type, "what it means"]`; the text becomes the schema's description.
`NotRequired` marks a field present only where it applies (said in its text). A number that
is not finite is written as null, so a measured float that can be infinite is `float | None`.

Adding a field: declare it here, write it where the value is known, and render it in
report/sections.py if a person should see it. Bump SCHEMA_VERSION's minor number for a field
added, its major number for one removed, renamed or retyped.
"""

from typing import Annotated, Any, Literal, NotRequired, TypedDict

SCHEMA_VERSION = "1.8"


# -- what several sections share ------------------------------------------------------------


class GraphStats(TypedDict):
    """A graph's size: nodes, ops, FLOPs (a multiply-add counts 2), parameters, file bytes."""

    nodes: Annotated[int, "nodes in the main graph"]
    ops: Annotated[dict[str, int], "nodes per op type"]
    flops: Annotated[float, "floating-point operations of one run (symbolic dims count as 1)"]
    params: Annotated[int, "elements of the float initializers"]
    model_bytes: Annotated[int, "the serialised model's bytes, external data included"]


class Growth(TypedDict):
    """After over before; over 1.05 the summary says how much the graph grew."""

    flops: Annotated[float | None, "FLOPs after over before (null where before has none)"]
    params: Annotated[float | None, "parameters after over before (null where before has none)"]


class Decision(TypedDict):
    """The cost model's or the measurement's numbers behind a rewrite made or refused; each
    method adds its own fields."""

    method: Annotated[str, "how it was decided: 'cost', 'measure', a guard's name"]


# -- rewrites and refusals ------------------------------------------------------------------


class Rewrite(TypedDict):
    """One rewrite made. Its primitive may add fields of its own (primitives.Rewrite.extra: a
    user's primitive too); the built-in ones add those declared here."""

    rule: Annotated[str, "the rule's name"]
    file: Annotated[str, "its rule file (rules/<name>.yaml for a built-in one)"]
    nodes: Annotated[list[str], "the nodes it replaced"]
    reason: Annotated[str, "what it did, in words"]
    modules: NotRequired[Annotated[list[str], "the innermost PyTorch module of each node, where recorded"]]
    module: NotRequired[Annotated[str | None, "the innermost module holding all of the nodes"]]
    ops_before: NotRequired[Annotated[list[str], "the region's ops before (drawn in the HTML report)"]]
    ops_after: NotRequired[Annotated[list[str], "the region's ops after"]]
    decision: NotRequired[Annotated[Decision, "why it was made: the cost or measure numbers"]]
    flops_before: NotRequired[Annotated[float, "the region's FLOPs before, where the rule counts them"]]
    flops_after: NotRequired[Annotated[float, "the region's FLOPs after"]]
    border_map_bytes: NotRequired[Annotated[int, "bytes of the constant border map a fold added"]]
    branches: NotRequired[Annotated[int, "parallel branches merged into one batched op"]]
    batched_steps: NotRequired[Annotated[int, "steps of the branches batched together"]]
    rank: NotRequired[Annotated[int, "the rank of a kernel split into a tall and a wide conv"]]
    breaks_runtime_fusion: NotRequired[
        Annotated[Decision, "under --strategy all: the ONNX Runtime fusion the rewrite splits"]
    ]


# The sections a primitive or a decision's method may add fields to: the schema lets them.
OPEN_SECTIONS: tuple[type, ...] = (Decision, Rewrite)


class Skipped(TypedDict):
    """A rewrite a rule matched but did not make, and why (only those whose nodes are still in
    the final graph)."""

    rule: Annotated[str, "the rule's name"]
    file: Annotated[str, "its rule file"]
    nodes: Annotated[list[str], "the nodes it matched"]
    reason: Annotated[str, "why it was not made"]
    modules: NotRequired[Annotated[list[str], "the innermost PyTorch module of each node, where recorded"]]
    module: NotRequired[Annotated[str | None, "the innermost module holding all of the nodes"]]
    decision: NotRequired[Annotated[Decision, "the numbers that refused it"]]


class LowRankBranch(TypedDict):
    """Two dense nodes through a rank at most a quarter of their width, summed with a dense
    layer of the same input and not merged into it."""

    nodes: Annotated[list[str], "the branch's nodes"]
    beside: Annotated[str, "the dense node it is summed with"]
    in_features: Annotated[int, "the input width"]
    rank: Annotated[int, "the width between the two nodes"]
    out_features: Annotated[int, "the output width"]
    module: Annotated[str | None, "the module holding them, where recorded"]


class RuntimeFusion(TypedDict):
    """A subgraph ONNX Runtime fuses into one kernel that a rewrite would have split."""

    fusion: Annotated[str, "the kernel: Gelu, FastGelu, LayerNormalization, ..."]
    nodes: Annotated[list[str], "the subgraph's nodes"]
    module: Annotated[str | None, "the module holding them, where recorded"]
    rules: Annotated[list[str], "the rules that wanted to rewrite part of it"]
    kept: Annotated[bool, "true under cost and measure (the rewrite refused), false under all"]


class TransformerModelType(TypedDict):
    """The kernels ONNX Runtime's transformer optimizer makes as one model type."""

    original: Annotated[dict[str, int], "kernels made of the original graph, by op"]
    optimized: Annotated[dict[str, int] | None, "of the optimized graph (null but for the type checked)"]


class NotTriedForTime(TypedDict):
    """The optimizer's runs beyond the check's two left out: one took too long."""

    model_types: Annotated[list[str], "model types not run on the original graph"]
    shape_arithmetic_kept: Annotated[bool, "the rewrite with the shape arithmetic unfolded was not tried"]
    longest_run_s: Annotated[float, "the optimizer's longest run on this model, seconds"]
    budget_s: Annotated[float, "its seconds on one model past which no further run starts"]


class TransformerFusions(TypedDict):
    """What ONNX Runtime's transformer optimizer fuses before and after the rewrite."""

    checked_with: Annotated[str, "the optimizer and ONNX Runtime's version"]
    shape_arithmetic_kept: Annotated[bool, "the rules ran with the shape arithmetic left unfolded"]
    model_types: Annotated[dict[str, TransformerModelType], "per model type that fuses anything"]
    lost: Annotated[dict[str, dict[str, int]], "per model type, the kernels the optimized graph no longer gets"]
    not_tried_for_time: NotRequired[Annotated[NotTriedForTime, "where a run took too long for the others"]]


class ConstantFolding(TypedDict):
    """Constant folding before and between the rules."""

    nodes_before: Annotated[int, "nodes as exported"]
    nodes_after: Annotated[int, "nodes after constant folding, before the rules"]
    between_rules: Annotated[int, "nodes folded between the rules' passes"]


class DeduplicatedInitializers(TypedDict):
    """Initializers equal to an earlier one in type, dims and bytes, written once."""

    merged: Annotated[int, "initializers merged into an earlier one"]
    bytes_saved: Annotated[int, "bytes the model no longer holds"]


# -- validation -----------------------------------------------------------------------------


class OutputError(TypedDict):
    """How far one output of the candidate is from the reference."""

    max_abs: Annotated[float | None, "largest absolute difference from the original's output"]
    mean_abs: Annotated[float | None, "mean absolute difference"]
    max_rel: Annotated[float | None, "largest relative difference"]
    mean_rel: Annotated[float | None, "mean relative difference"]
    cosine: Annotated[float | None, "cosine similarity of the two outputs"]
    mismatches: Annotated[int, "elements beyond the bound"]
    elements: Annotated[int, "elements compared"]
    rtol: Annotated[float | None, "the relative tolerance (null: judged against float64)"]
    atol: Annotated[float | None, "the absolute tolerance (null: judged against float64)"]
    exact_error_original: Annotated[float | None, "the original's own error against the float64 result"]
    exact_error: Annotated[float | None, "the candidate's error against the float64 result"]
    exact_error_float64: Annotated[float | None, "the candidate's error, run in float64, against it"]
    exact_bound: Annotated[float | None, "the bound the candidate's error is judged against"]
    exact_error_rounded: NotRequired[
        Annotated[
            float | None,
            "`validate` of a half-precision candidate: the reference's error with every value rounded to the "
            "candidate's type, counted in the bound (from schema 1.2)",
        ]
    ]
    nonfinite: Annotated[int, "elements NaN or infinite in one output and not in the other"]


class NodeDisagreement(TypedDict):
    """A node whose float64 kernel and ONNX Runtime's disagree beyond rounding."""

    node: Annotated[str, "the node"]
    op: Annotated[str, "its op"]
    output: Annotated[str, "the output compared"]
    difference: Annotated[float | None, "the relative difference (null: unequal shapes or integers)"]


class ReferenceCheck(TypedDict):
    """The float64 reference's own check: its kernels against ONNX Runtime's, node by node."""

    nodes_checked: Annotated[int, "nodes compared"]
    disagreement: NotRequired[Annotated[NodeDisagreement | None, "the first node that disagreed"]]
    note: NotRequired[Annotated[str, "why no node was checked, or where the check stopped"]]


class ExportCheck(TypedDict):
    """The torch model's float64 run against the exported ONNX graph's."""

    # absent where torch's run was not compared at all (note says why; until 1.8 the schema
    # required them, though such a report had only the note)
    agrees: NotRequired[Annotated[bool, "whether they compute the same function"]]
    output: NotRequired[Annotated[str | int, "the output of the largest difference"]]
    max_abs_difference: NotRequired[Annotated[float | None, "the largest difference"]]
    bound: NotRequired[Annotated[float | None, "what the exporter's float32 constants explain"]]
    note: NotRequired[Annotated[str, "why torch's run was not used (alone: why it was not compared, since 1.8)"]]
    parted_on_input_sets: NotRequired[Annotated[list[int], "input sets (from 0) on which they part"]]


class Culprit(TypedDict):
    """The first rewrite after which the graph fails (index 0: it fails before any)."""

    index: Annotated[int, "the rewrite's number, from 1; 0 for none"]
    rule: Annotated[str | None, "its rule"]
    file: Annotated[str | None, "its rule file"]
    nodes: Annotated[list[str], "the nodes it replaced"]
    reason: Annotated[str, "what it did"]
    modules: NotRequired[Annotated[list[str], "the modules of its nodes"]]
    module: NotRequired[Annotated[str | None, "the module holding them"]]


class Comparison(TypedDict):
    """One comparison of a candidate with its reference on the same inputs."""

    passed: Annotated[bool, "whether every output is within its bound"]
    runs: Annotated[int, "input sets compared"]
    rtol: Annotated[float | None, "--rtol (null: by each output's dtype, or judged against float64)"]
    atol: Annotated[float | None, "--atol (null: as rtol)"]
    reference: Annotated[Literal["float64", "float32"], "what the outputs were judged against"]
    inputs: Annotated[list[str], "the inputs as NAME:DIMS:DTYPE"]
    outputs: Annotated[dict[str, OutputError], "per output"]
    reference_note: NotRequired[Annotated[str, "input sets without a float64 reference, and why"]]
    reference_check: NotRequired[Annotated[ReferenceCheck, "the float64 reference's node check"]]
    reference_source: NotRequired[Annotated[str, "whose float64 run: the ONNX graph's or torch's"]]
    export_check: NotRequired[Annotated[ExportCheck, "torch's float64 run against the exported graph's"]]
    problem: NotRequired[Annotated[str, "a structural mismatch: a missing output, a shape"]]
    nonfinite_on: NotRequired[
        Annotated[
            Literal["made-up inputs", "the given inputs", "made-up and given inputs"],
            "the input sets on which the original gives NaN or infinity (since 1.6)",
        ]
    ]
    precision: NotRequired[
        Annotated[
            str,
            "the half type judged at: the candidate's where coarser than its outputs', or the weights'",
        ]
    ]


class OutputDifference(TypedDict):
    """TF32's effect on one output."""

    max_abs: Annotated[float | None, "largest absolute difference"]
    max_rel: Annotated[float | None, "largest relative difference"]


class _OnDeviceCheck(Comparison):
    provider: Annotated[str, "CUDAExecutionProvider"]
    provider_options: Annotated[dict[str, Any], "the provider's options for the check"]
    tf32: Annotated[bool, "whether TF32 was on (false: only the rewrite can differ)"]


class TF32Effect(TypedDict, total=False):
    """TF32's effect on the device check's outputs, measured once the profile has a session."""

    tf32_effect: Annotated[dict[str, OutputDifference], "per output, TF32 on against off"]
    tf32_effect_options: Annotated[dict[str, Any], "the provider's options with TF32 on"]
    tf32_effect_note: Annotated[str, "why TF32's effect was not measured"]


class OnDevice(_OnDeviceCheck, TF32Effect):
    """The same check on the CUDA provider the model is deployed on, TF32 off."""


class Validation(Comparison):
    """optimize's validation: the optimized graph against the original."""

    culprit: NotRequired[Annotated[Culprit | None, "where it failed: the first rewrite that breaks it"]]
    on_device: NotRequired[Annotated[OnDevice, "the check on CUDA, where the model is deployed there"]]


class InvalidModel(TypedDict):
    """optimize's validation where the optimized graph is not a valid model."""

    passed: Annotated[Literal[False], "false"]
    invalid_model: Annotated[str, "what onnx's checker or ONNX Runtime says"]
    culprit: Annotated[Culprit | None, "the first rewrite after which it is not valid"]


# -- half precision -------------------------------------------------------------------------


class KeptFloat32(TypedDict):
    """A node with float data that computes in float32 in a half-precision model."""

    node: Annotated[str, "its name, or its first output's"]
    op: Annotated[str, "its op"]
    reason: Annotated[str, "why it stays float32"]
    error: Annotated[float | None, "its own error in half precision, where measured"]
    bound: Annotated[float | None, "the bound that error missed, where measured"]


class HalfOutput(TypedDict):
    """One output of the half-precision model against the exact result."""

    error: Annotated[float | None, "its error"]
    error_original: Annotated[float | None, "the float32 original's own"]
    bound: Annotated[float | None, "the bound at half precision's roundoff"]
    beyond: Annotated[int, "elements beyond it"]
    elements: Annotated[int, "elements compared"]
    error_rounded: NotRequired[
        Annotated[
            float,
            "the model's error with every value rounded to half, where the bound counts it (bound_by rounded; "
            "from schema 1.2)",
        ]
    ]


class HalfValidation(TypedDict):
    """The half-precision model judged against the exact result."""

    passed: Annotated[bool, "whether every output is within its bound"]
    against: Annotated[Literal["float64", "float32"], "float32 where the model was too large for float64"]
    bound_by: NotRequired[
        Annotated[
            Literal["float32", "rounded"],
            "the model's own error the bound counts: the float32 original's; rounded: also the model's with "
            "every value rounded to half, where no float32 region within a tenth of the FLOPs met the bound "
            "(from schema 1.2)",
        ]
    ]
    outputs: Annotated[dict[str, HalfOutput], "per output"]


class WeightsRounded(TypedDict):
    """How the weights stored in half precision were rounded (docs/commands.md, --dtype)."""

    keeping_row_sums: Annotated[
        int, "weights a Conv, ConvTranspose, Gemm or MatMul sums into its outputs, rounded keeping each output's sum"
    ]
    by_input_moments: NotRequired[
        Annotated[
            int,
            "such weights rounded instead by their input's second moments, each element to one of its two half "
            "neighbours (from schema 1.3)",
        ]
    ]
    to_nearest: Annotated[int, "the other constants stored in half precision, rounded to nearest"]


class Precision(TypedDict):
    """--dtype fp16 or bf16: what computes in half precision and what stayed float32."""

    dtype: Annotated[str, "the model's compute type (float16 or bfloat16)"]
    io_dtype: Annotated[str, "its inputs' and outputs' type"]
    nodes_half: Annotated[int, "nodes computing in half precision"]
    nodes_float32: Annotated[int, "nodes with float data computing in float32"]
    casts: Annotated[int, "Casts added, less the model's own merged into them (a tail it casts to float64)"]
    kept_float32: Annotated[list[KeptFloat32], "each node kept float32, and why"]
    nodes_measured: Annotated[int, "nodes whose own error was measured"]
    attempts: Annotated[int, "conversions judged"]
    weights_rounded: NotRequired[
        Annotated[WeightsRounded, "how the weights stored in half precision were rounded (from schema 1.1)"]
    ]
    validation: Annotated[HalfValidation, "the half-precision model's check"]


# -- profile --------------------------------------------------------------------------------


class Latency(TypedDict):
    """Milliseconds per run over the timed runs."""

    median: Annotated[float, "median"]
    p10: Annotated[float, "10th percentile"]
    p25: Annotated[float, "25th percentile"]
    p75: Annotated[float, "75th percentile"]
    p90: Annotated[float, "90th percentile"]
    min: Annotated[float, "fastest run"]
    mean: Annotated[float, "mean"]
    median_low: NotRequired[Annotated[float, "lower end of the median's 95% interval (order statistics)"]]
    median_high: NotRequired[Annotated[float, "upper end of the median's 95% interval"]]


class ProfiledModel(TypedDict):
    """One model's timing and memory."""

    latency_ms: Annotated[Latency, "milliseconds per run"]
    throughput_per_s: Annotated[float | None, "samples per second (batch / median latency)"]
    warmup_runs: Annotated[int, "runs before the timed ones"]
    phases_s: Annotated[dict[str, float], "seconds of each phase: session, first_run, per_op, warm_up, memory"]
    op_time_ms: NotRequired[Annotated[dict[str, float], "milliseconds per op type in a run (ORT's profiler)"]]
    profiled_run_ms: NotRequired[Annotated[float, "a profiled run's milliseconds"]]
    op_time_total_ms: NotRequired[Annotated[float, "the per-op times summed"]]
    op_time_coverage: NotRequired[Annotated[float | None, "that sum over the profiled runs' own median"]]
    op_times_trusted: NotRequired[
        Annotated[bool, "whether the sum is within 10% of the profiled runs' (never on CUDA: host launch times)"]
    ]
    peak_memory_bytes: NotRequired[Annotated[int, "peak memory of the run: resident set (CPU) or device memory"]]
    peak_rss_bytes: NotRequired[Annotated[int, "peak resident set of the process that ran it"]]


class Timing(TypedDict):
    """How the models were timed."""

    device: Annotated[Literal["cpu", "cuda"], "where they ran"]
    provider: Annotated[str, "ONNX Runtime's execution provider"]
    provider_options: Annotated[dict[str, Any], "its options"]
    runs: Annotated[int, "timed runs of each model"]
    warmup: Annotated[int, "most warm-up runs of a model"]
    batch: Annotated[int, "samples per run"]
    timed_s: Annotated[float, "seconds of timed runs"]
    threads: NotRequired[Annotated[int | None, "ONNX Runtime's intra-op threads (null: its default, one per core)"]]
    interval_target: NotRequired[Annotated[float, "the interval's half-width the runs aimed for, relative"]]
    one_at_a_time: NotRequired[Annotated[bool, "a large model's sessions made one after the other"]]


class Paired(TypedDict):
    """Two models timed against each other in pairs of runs (profile/paired_timer.py)."""

    speedup: Annotated[float, "the median over the pairs of before's run time over after's"]
    low: Annotated[float, "lower end of its 95% interval"]
    high: Annotated[float, "upper end of its 95% interval"]
    pairs: Annotated[int, "pairs timed (0: a large model's, timed apart)"]
    stopped: Annotated[
        Literal["interval", "budget", "runs", "apart"],
        "interval: narrow enough; budget: time ran out first; runs: as many as asked; apart: timed one after the other",
    ]


class TimedRatio(TypedDict):
    """A speedup over the original with its 95% interval."""

    speedup: Annotated[float, "the paired speedup"]
    low: Annotated[float, "lower end of its interval"]
    high: Annotated[float, "upper end"]


class Profile(Timing):
    """optimize's profile: the original and the optimized graph side by side."""

    before: Annotated[ProfiledModel, "the original"]
    after: Annotated[ProfiledModel, "the optimized graph"]
    paired: NotRequired[Annotated[Paired, "the two timed against each other (since 1.5)"]]
    speedup: Annotated[float | None, "the paired speedup of after over before (before 1.5: of the medians)"]
    speedup_interval: NotRequired[Annotated[list[float], "its 95% interval, [low, high] (since 1.5)"]]
    noise: Annotated[float, "the interval's larger side, relative to the speedup"]
    verdict: Annotated[
        Literal["faster", "slower", "no measurable change", "unchanged graph"],
        "faster or slower where the whole interval says so (unchanged graph: before 1.5, now not timed)",
    ]
    memory_ratio: NotRequired[Annotated[float, "after's peak memory over before's"]]
    memory_regression: NotRequired[Annotated[bool, "after's peak memory over 1.05 before's"]]
    inputs: NotRequired[
        Annotated[
            list[str],
            "the made-up inputs timed, as NAME:DIMS:DTYPE: the dims the model leaves dynamic, but its batch, grown "
            "until a run takes 2 ms (since 1.7; absent where --input-data was timed)",
        ]
    ]
    against_itself: NotRequired[
        Annotated[
            TimedRatio,
            "where the optimized graph read slower: the original timed against a fresh session of itself; a "
            "slowdown within its distance from 1 is no measurable change (since 1.7)",
        ]
    ]


class SpeedCandidate(TimedRatio):
    """A graph that leaves out some rules' rewrites, timed against the original."""

    dropped: Annotated[list[str], "the rules whose rewrites it leaves out"]
    nodes: Annotated[int, "its nodes"]
    as_given: NotRequired[Annotated[bool, "the model as given (its speedup 1 by definition, not timed)"]]


class SpeedChoice(TypedDict):
    """What was written instead of the whole rewrite, which the profile found slower."""

    all_rewrites: Annotated[TimedRatio, "the whole rewrite's paired speedup"]
    candidates: Annotated[list[SpeedCandidate], "every graph timed, and the model as given"]
    chosen: Annotated[list[str], "the rules whose rewrites the written graph leaves out"]
    written_as_given: Annotated[bool, "the model as given was the fastest"]


class DroppedRewrite(Rewrite):
    """A rewrite left out for speed."""

    speedup_without: Annotated[float, "the written graph's paired speedup"]
    speedup_with_all: Annotated[float, "the whole rewrite's"]


class Environment(TypedDict):
    """What the numbers were measured with."""

    onnxruntime: Annotated[str, "ONNX Runtime's version"]
    python: Annotated[str, "Python's version"]
    platform: Annotated[str, "the operating system"]
    device: Annotated[Literal["cpu", "cuda"], "where the model runs"]
    provider: Annotated[str, "ONNX Runtime's execution provider"]
    cpu: Annotated[str, "the processor"]
    cpu_threads: Annotated[int | None, "logical processors"]
    gpu: Annotated[str | None, "the GPU, where the device is cuda"]


# -- the reports ----------------------------------------------------------------------------


class OptimizeReport(TypedDict):
    """`convexport optimize --report`, and the Python API's OptimizeResult.report."""

    schema_version: Annotated[str, "this schema's version, MAJOR.MINOR"]
    convexport_version: Annotated[str, "the convexport that wrote it"]
    model: Annotated[str, "the model as given"]
    output: Annotated[str | None, "where the optimized model was written (null: not written)"]
    exporter: Annotated[str, "how the model became ONNX"]
    export_warnings: Annotated[list[str], "the TorchScript tracer's warnings, where the module was traced"]
    opset: Annotated[int | None, "the model's default-domain opset (null: it imports none)"]
    conversions: Annotated[list[str], "what was done to an old ONNX model before the rules"]
    input_changes: Annotated[list[str], "an ONNX model's fixed input dims that --input changed"]
    notes: Annotated[list[str], "what a user should know of how the model was read"]
    overridable_inputs: Annotated[int, "weights that are graph inputs, not folded"]
    inputs: Annotated[list[str], "the inputs as NAME:DIMS:DTYPE"]
    outputs: Annotated[list[str], "the outputs as NAME:DIMS:DTYPE"]
    before: Annotated[GraphStats, "the exported graph"]
    after: Annotated[GraphStats, "the optimized graph (the half-precision one with --dtype fp16)"]
    size_regression: Annotated[bool, "the file over 5% larger"]
    growth: Annotated[Growth, "FLOPs and parameters after over before"]
    strategy: Annotated[Literal["all", "cost", "measure"], "the strategy applied"]
    environment: Annotated[Environment, "what it was measured with"]
    rewrites: Annotated[list[Rewrite], "the rewrites made, in order"]
    skipped: Annotated[list[Skipped], "the rewrites refused whose nodes are still in the graph"]
    constant_folding: Annotated[ConstantFolding, "constant folding before and between the rules"]
    low_rank_branches_left: Annotated[list[LowRankBranch], "low-rank branches not merged"]
    runtime_fusions: Annotated[list[RuntimeFusion], "ONNX Runtime fusions a rewrite would have split"]
    validation: Annotated[Validation | InvalidModel | None, "the check against the original (null: not run)"]
    profile: Annotated[Profile | None, "the timing of both (null: not run or skipped)"]
    deduplicated_initializers: NotRequired[Annotated[DeduplicatedInitializers, "where any were merged"]]
    transformer_fusions: NotRequired[Annotated[TransformerFusions, "for a model with attention or normalisation"]]
    explain: NotRequired[Annotated[dict[str, dict[str, str]], "--explain: per request, per node, the verdict"]]
    explain_modules: NotRequired[Annotated[dict[str, str], "--explain: each node's module"]]
    made_up_inputs: NotRequired[Annotated[str, "why the random inputs were not used"]]
    precision: NotRequired[Annotated[Precision, "--dtype fp16's choices and check"]]
    profile_skipped: NotRequired[Annotated[str, "why the profile did not run (an unchanged graph, no kernel)"]]
    speed_choice: NotRequired[Annotated[SpeedChoice, "where the whole rewrite was slower: what was written"]]
    dropped_for_speed: NotRequired[Annotated[list[DroppedRewrite], "the rewrites left out because they cost"]]
    speed_choice_skipped: NotRequired[Annotated[str, "why a slower rewrite was written all the same"]]
    output_weights: NotRequired[Annotated[str | None, "the weights file beside output (null: the model holds them)"]]
    timings_s: NotRequired[Annotated[dict[str, float], "seconds per step, and total (absent where it failed)"]]


class ValidateReport(Comparison):
    """`convexport validate --report`: a candidate against its reference."""

    schema_version: Annotated[str, "this schema's version, MAJOR.MINOR"]


class ProfileReport(Timing):
    """`convexport profile --report`: one model's timing."""

    schema_version: Annotated[str, "this schema's version, MAJOR.MINOR"]
    model: Annotated[ProfiledModel, "the model"]


REPORTS: dict[str, type] = {"optimize": OptimizeReport, "validate": ValidateReport, "profile": ProfileReport}
