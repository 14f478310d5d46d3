"""The float64 path checked: every op it runs against ONNX Runtime's float32 kernel (within one
op's float32 rounding, validate/float64/node_check.py's NODE_RTOL) and, where torch has the op, against
torch in float64 (within 1e-12 of the values' scale), opset by opset (issue 48).

- ONNX's own backend cases (onnx.backend.test.case.node: every op ONNX tests, with its grids of
  attributes), each at its own opset and converted by onnx's version converter to every older
  opset in which its op changed, down to 7 (ONNX Runtime's oldest for most ops).
- Grids over the attributes of the kernels convexport writes itself (Conv, BatchNormalization,
  MaxPool, AveragePool, Resize, Sigmoid, Erf), 1-D to 3-D, against both.
- REQUIRED: the (op, opset) pairs the float64 path must have been checked at; a test fails
  when the sweep no longer reaches one.
- A broken kernel (ONNX's own BatchNormalization below opset 14, which normalises with the
  batch's statistics) makes the check fail.

KNOWN_DIFFERENCES lists the backend cases where ONNX Runtime and the float64 path differ, each
with its reason; none is an op an exported model uses in the form tested.
"""

from __future__ import annotations

import functools
import itertools
import sys
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

from convexport.validate import float64
from convexport.validate.float64 import Float64Evaluator, Float64Unavailable
from convexport.validate.float64.node_check import NODE_RTOL, check_nodes, disagreement

ORT_OLDEST_OPSET = 7
RANDOM_OPS = {"Bernoulli", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial"}
TORCH_RTOL = 1e-12

KNOWN_DIFFERENCES = {
    "test_attention_4d_with_past_and_present_qk_matmul_bias_3d_mask_causal": "ORT's qk_matmul output is -inf where "
    "the causal mask hides a score, ONNX's keeps the score (the attention output agrees)",
    "test_attention_4d_with_past_and_present_qk_matmul_bias_4d_mask_causal": "as the 3-D mask case",
    "test_dynamicquantizelinear": "the scale is computed in the input's precision: rounding to uint8 differs by 1 "
    "at ties between float32 and float64",
    "test_dynamicquantizelinear_expanded": "as test_dynamicquantizelinear",
    "test_maxunpool_export_with_output_shape": "ORT places the values of an output_shape larger than the default "
    "elsewhere than ONNX's reference",
}

# (op, opset): where the float64 path must have been checked against ONNX Runtime (issue 48's list)
REQUIRED = {
    ("BatchNormalization", 7), ("BatchNormalization", 9), ("BatchNormalization", 14), ("BatchNormalization", 15),
    ("Resize", 10), ("Resize", 11), ("Resize", 13), ("Resize", 18), ("Resize", 19),
    ("Pad", 11), ("Pad", 13), ("Pad", 18), ("Pad", 19), ("Clip", 11), ("Clip", 12), ("Clip", 13),
    ("Split", 11), ("Split", 13), ("Split", 18), ("ReduceSum", 11), ("ReduceSum", 13), ("ReduceMean", 13),
    ("ReduceMean", 18), ("ReduceMax", 18), ("Squeeze", 11), ("Squeeze", 13), ("Unsqueeze", 11), ("Unsqueeze", 13),
    ("Gemm", 7), ("Gemm", 9), ("Gemm", 11), ("Gemm", 13), ("Clip", 6), ("Pad", 2), ("Resize", 10), ("Softmax", 1),
    ("MaxPool", 8), ("MaxPool", 10), ("MaxPool", 12),
    ("AveragePool", 7), ("AveragePool", 10), ("AveragePool", 11), ("AveragePool", 19), ("Conv", 11),
    ("ConvTranspose", 11), ("Softmax", 11), ("Softmax", 13), ("Erf", 13), ("Sigmoid", 13),
}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The comparison


def runtime_outputs(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def float64_outputs(model: onnx.ModelProto, feeds: dict, kernels=None) -> list[np.ndarray]:
    return Float64Evaluator(model, kernels).run(feeds)


def worst_disagreement(model: onnx.ModelProto, feeds: dict, kernels=None) -> float:
    """The largest disagreement (node_check.disagreement) between ONNX Runtime's float32 run and
    the float64 path over the model's outputs."""
    return max(
        (disagreement(a, b) for a, b in zip(runtime_outputs(model, feeds), float64_outputs(model, feeds, kernels))),
        default=0.0,
    )


def assert_agrees_with_runtime(model: onnx.ModelProto, feeds: dict) -> None:
    worst = worst_disagreement(model, feeds)
    assert worst <= NODE_RTOL, f"float64 path {worst:.3g} from ONNX Runtime (relative), more than {NODE_RTOL:.3g}"


def assert_agrees_with_torch(model: onnx.ModelProto, feeds: dict, expected: torch.Tensor) -> None:
    ours = float64_outputs(model, feeds)[0]
    exact = expected.detach().numpy()
    assert ours.shape == exact.shape
    scale = max(float(np.sqrt(np.mean(np.square(exact)))), 1e-300)
    assert float(np.abs(ours - exact).max(initial=0.0)) <= TORCH_RTOL * scale


def one_node(op: str, inputs: list[np.ndarray], opset: int, outputs: int = 1, initializers=(), **attributes):
    """A model of one node on float32 inputs x0, x1, ... (initializers by name besides)."""
    names = [f"x{i}" for i in range(len(inputs))] + [init.name for init in initializers]
    node = helper.make_node(op, names, [f"y{i}" for i in range(outputs)], name=op.lower(), **attributes)
    graph = helper.make_graph(
        [node],
        "one",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(a.shape)) for n, a in zip(names, inputs)],
        [onnx.ValueInfoProto(name=f"y{i}") for i in range(outputs)],
        list(initializers),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    return model, {f"x{i}": a for i, a in enumerate(inputs)}


def rand(*shape, seed=0, low=None):
    rng = np.random.default_rng(seed)
    values = rng.uniform(low, 2.0, shape) if low is not None else rng.normal(size=shape)
    return values.astype(np.float32)


# ---------------------------------------------------------------------------------------------
# ONNX's backend cases, at their opset and every older one in which the op changed


@functools.cache
def backend_cases() -> list:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return collect_testcases()


def _float_feeds(case) -> dict | None:
    """The case's first inputs by name, where they are float32 arrays (and integers or booleans
    beside them); None for a case the float64 path is not about."""
    if not case.data_sets:
        return None
    inputs = list(case.data_sets[0][0])
    if not all(isinstance(a, np.ndarray) for a in inputs):
        return None
    if any(a.dtype not in (np.float32, np.int64, np.int32, np.bool_) for a in inputs):
        return None
    if not any(a.dtype == np.float32 for a in inputs):
        return None
    return dict(zip([value.name for value in case.model.graph.input], inputs))


def _default_opset(model: onnx.ModelProto) -> int | None:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def _op_history(op: str) -> list[int]:
    versions = {schema.since_version for schema in onnx.defs.get_all_schemas_with_history() if schema.name == op}
    return sorted(v for v in versions if v >= ORT_OLDEST_OPSET)


def _at_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto | None:
    if opset == _default_opset(model):
        return model
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            converted = onnx.version_converter.convert_version(model, opset)
        converted.ir_version = min(converted.ir_version, 8)
        onnx.checker.check_model(converted)
        return converted
    except Exception:
        return None


@functools.cache
def backend_sweep() -> tuple[dict, list[tuple[str, int, str]]]:
    """{(op, opset): cases checked} and the disagreements (case, opset, how far) over every
    backend case with float inputs that ONNX Runtime runs, at each opset in its op's history."""
    checked: dict[tuple[str, int], int] = {}
    failures = []
    for case in backend_cases():
        feeds = _float_feeds(case)
        current = _default_opset(case.model)
        if feeds is None or len(case.model.graph.node) != 1 or current is None:
            continue
        op = case.model.graph.node[0].op_type
        if op in RANDOM_OPS:
            continue
        for opset in sorted({v for v in _op_history(op) if v <= current} | {current}):
            model = _at_opset(case.model, opset)
            if model is None:
                continue
            try:
                runtime_outputs(model, feeds)
            except Exception:  # no ORT kernel for this op, type or opset
                continue
            try:
                worst = worst_disagreement(model, feeds)
            except Float64Unavailable as exc:
                failures.append((case.name, opset, f"unavailable: {exc}"))
                continue
            checked[(op, opset)] = checked.get((op, opset), 0) + 1
            if worst > NODE_RTOL and case.name.removesuffix("_expanded") not in KNOWN_DIFFERENCES:
                failures.append((case.name, opset, f"{worst:.3g}"))
    return checked, failures


# the ones the float64 path cannot run, each for its reason (Float64Unavailable: validation says so)
UNAVAILABLE = {
    "test_bitcast_float32_to_int32": "BitCast of a float reinterprets its bits: no float64 equivalent",
    "test_bitcast_2d_float32_to_int32": "as above",
    "test_bitcast_scalar_float32_to_int32": "as above",
    "test_mvn": "MeanVarianceNormalization's function body has float32 constants ONNX's evaluator will not widen",
    "test_scan_sum": "ONNX's reference Scan fails on float64 state",
    "test_scatter_without_axis": "Scatter (opsets 9-10) has no reference implementation",
    "test_scatter_with_axis": "as above",
    "test_split_to_sequence_2": "ONNX's reference SplitToSequence fails on uneven splits",
}


@pytest.mark.long
def test_every_backend_case_agrees_with_onnx_runtime_at_every_opset():
    checked, failures = backend_sweep()
    unexpected = [f for f in failures if f[0] not in UNAVAILABLE]
    assert not unexpected, unexpected[:20]
    assert sum(checked.values()) > 1300  # the sweep runs (onnx 1.23: 1,387 case-opset pairs over 250 op-opsets)


@pytest.mark.long
@pytest.mark.parametrize("op, opset", sorted(REQUIRED))
def test_the_float64_path_was_checked_at(op, opset):
    checked, _ = backend_sweep()
    grids = opset in GRID_OPSETS.get(op, ()) or (op, opset) in OLD_FORM_OPSETS
    assert checked.get((op, opset), 0) > 0 or grids, f"{op} at opset {opset} never checked"


# ---------------------------------------------------------------------------------------------
# Grids over the kernels convexport writes, against ONNX Runtime and torch

# the opsets each grid below checks its op at
GRID_OPSETS = {
    "Conv": (1, 11), "ConvTranspose": (11,), "BatchNormalization": (7, 9, 14, 15), "MaxPool": (8, 10, 12),
    "AveragePool": (7, 10, 11, 19), "Resize": (11, 13, 18, 19), "Sigmoid": (13,), "Erf": (13,),
}  # fmt: skip


def _int64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _float(name, values):
    return numpy_helper.from_array(np.array(values, np.float32), name)


# Each op in the form of each opset where it changed and onnx's version converter cannot take
# ONNX's cases (attributes that became inputs): (op, opset, inputs, initializers, attributes)
OLD_FORMS = [
    ("Clip", 6, [rand(3, 7)], [], {"min": -0.5, "max": 0.7}),
    *[("Clip", opset, [rand(3, 7)], [_float("lo", -0.5), _float("hi", 0.7)], {}) for opset in (11, 12, 13)],
    *[("Gemm", opset, [rand(*(4, 3)[:: -1 if ta else 1]), rand(*(3, 5)[:: -1 if tb else 1], seed=1)],
       [_float("c", rand(5, seed=2))], {"transA": ta, "transB": tb, "alpha": 0.5, "beta": 2.0})
      for opset in (7, 9, 11, 13) for ta in (0, 1) for tb in (0, 1)],
    ("Pad", 2, [rand(2, 3, 4)], [], {"pads": [0, 1, 2, 0, 2, 1], "mode": "reflect"}),
    *[("Pad", opset, [rand(2, 3, 4)], [_int64("pads", [0, 1, 2, 0, 2, 1]), _float("fill", 1.5)], {"mode": mode})
      for opset in (11, 13, 18, 19) for mode in ("constant", "reflect", "edge")],
    ("Pad", 18, [rand(2, 3, 4)], [_int64("pads", [1, 2, 2, 1]), _float("fill", 0.0), _int64("axes", [1, 2])], {}),
    ("Pad", 19, [rand(2, 3, 4)], [_int64("pads", [0, 1, 2, 0, 2, 1])], {"mode": "wrap"}),
    *[(op, 11, [rand(2, 3, 4)], [], {"axes": [1], "keepdims": k}) for op in ("ReduceSum", "ReduceMean", "ReduceMax",
      "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSumExp", "ReduceSumSquare") for k in (0, 1)],
    *[(op, 13, [rand(2, 3, 4)], [], {"axes": [0, 2]}) for op in ("ReduceMean", "ReduceMax", "ReduceL2")],
    ("ReduceSum", 13, [rand(2, 3, 4)], [_int64("axes", [0, 2])], {"keepdims": 0}),
    *[(op, 18, [rand(2, 3, 4)], [_int64("axes", [-1])], {}) for op in ("ReduceMean", "ReduceMax", "ReduceL2")],
    ("Squeeze", 11, [rand(2, 1, 4, 1)], [], {"axes": [1, -1]}),
    ("Squeeze", 13, [rand(2, 1, 4, 1)], [_int64("axes", [1, -1])], {}),
    ("Unsqueeze", 11, [rand(2, 4)], [], {"axes": [0, -1]}),
    ("Unsqueeze", 13, [rand(2, 4)], [_int64("axes", [0, -1])], {}),
    ("Split", 11, [rand(2, 7)], [], {"axis": 1, "split": [3, 4]}),
    ("Split", 13, [rand(2, 7)], [_int64("split", [3, 4])], {"axis": 1}),
    ("Split", 18, [rand(2, 8)], [], {"axis": 1, "num_outputs": 2}),
    ("Resize", 10, [rand(1, 2, 3, 4)], [_float("scales", [1, 1, 2, 2])], {"mode": "nearest"}),
    ("Resize", 10, [rand(1, 2, 3, 4)], [_float("scales", [1, 1, 2, 0.5])], {"mode": "linear"}),
    *[(op, opset, [rand(3, 4, 5)], [], attributes) for op in ("Softmax", "LogSoftmax", "Hardmax")
      for opset in (1, 11, 13) for attributes in ({}, {"axis": 0}, {"axis": 1})],
]  # fmt: skip


@pytest.mark.parametrize("op, opset, inputs, initializers, attributes", OLD_FORMS,
                         ids=[f"{f[0]}-{f[1]}-{i}" for i, f in enumerate(OLD_FORMS)])  # fmt: skip
def test_each_opset_form(op, opset, inputs, initializers, attributes):
    outputs = 2 if op == "Split" else 1
    model, feeds = one_node(op, inputs, opset, outputs, initializers, **attributes)
    assert_agrees_with_runtime(model, feeds)


OLD_FORM_OPSETS = {(form[0], form[1]) for form in OLD_FORMS}


def _conv_cases():
    for rank, stride, dilation, groups, bias in itertools.product((1, 2, 3), (1, 2), (1, 2), (1, 2, 4), (False, True)):
        for pads in ("symmetric", "asymmetric", "SAME_UPPER", "SAME_LOWER", "VALID"):
            if rank == 3 and (pads in ("SAME_LOWER", "VALID") or groups == 2):
                continue  # 3-D: a smaller grid
            if dilation > 1 and pads.startswith("SAME"):
                continue  # ONNX Runtime: "Dilation not supported for AutoPadType::SAME_UPPER"
            yield rank, stride, dilation, groups, bias, pads


@pytest.mark.parametrize("rank, stride, dilation, groups, bias, pads", list(_conv_cases()))
def test_conv(rank, stride, dilation, groups, bias, pads):
    size = {1: 17, 2: 11, 3: 6}[rank]
    x = rand(2, 4, *[size] * rank)
    w = rand(8, 4 // groups, *[3] * rank, seed=1)
    b = rand(8, seed=2)
    attributes = {"strides": [stride] * rank, "dilations": [dilation] * rank, "group": groups}
    if pads in ("symmetric", "asymmetric"):
        attributes["pads"] = [1] * rank + ([1] * rank if pads == "symmetric" else [2] * rank)
    else:
        attributes["auto_pad"] = pads
    inputs = [x, w, b] if bias else [x, w]
    for opset in GRID_OPSETS["Conv"]:
        model, feeds = one_node("Conv", inputs, opset, **attributes)
        assert_agrees_with_runtime(model, feeds)
    if pads == "symmetric":
        convolve = (F.conv1d, F.conv2d, F.conv3d)[rank - 1]
        expected = convolve(*(torch.from_numpy(a).double() for a in inputs), stride=stride, padding=1,
                            dilation=dilation, groups=groups)  # fmt: skip
        assert_agrees_with_torch(model, feeds, expected)


@pytest.mark.parametrize("multiplier, stride, dilation", itertools.product((1, 3), ((1, 1), (2, 1)), ((1, 1), (1, 2))))
def test_a_depthwise_conv_of_an_uneven_kernel(multiplier, stride, dilation):
    """The depthwise path (a sum over taps): 6 channels, a 3x5 kernel, each channel's output
    `multiplier` times, against torch in float64 and ONNX Runtime."""
    x, w, b = rand(2, 6, 13, 12), rand(6 * multiplier, 1, 3, 5, seed=1), rand(6 * multiplier, seed=2)
    model, feeds = one_node(
        "Conv", [x, w, b], 11, group=6, strides=list(stride), dilations=list(dilation), pads=[1, 2, 1, 2]
    )
    assert_agrees_with_runtime(model, feeds)
    expected = F.conv2d(*(torch.from_numpy(a).double() for a in (x, w, b)), stride=stride, padding=(1, 2),
                        dilation=dilation, groups=6)  # fmt: skip
    assert_agrees_with_torch(model, feeds, expected)


@pytest.mark.parametrize("taps, groups", [(11, 1), (13, 2), (15, 4)])
def test_a_large_kernel_through_the_fft(taps, groups):
    x, w = rand(1, 4, 40, 33), rand(8, 4 // groups, taps, taps, seed=1)
    model, feeds = one_node("Conv", [x, w], 11, pads=[3, 5, 4, 2], group=groups)
    assert_agrees_with_runtime(model, feeds)
    expected = F.conv2d(F.pad(torch.from_numpy(x).double(), (5, 2, 3, 4)), torch.from_numpy(w).double(), groups=groups)
    assert_agrees_with_torch(model, feeds, expected)


@pytest.mark.parametrize("stride, pads, output_padding, groups", itertools.product((1, 2), (0, 1), (0, 1), (1, 2)))
def test_conv_transpose(stride, pads, output_padding, groups):
    if output_padding >= stride:
        return
    x, w, b = rand(2, 4, 7, 6), rand(4, 6 // groups, 3, 3, seed=1), rand(6, seed=2)
    (opset,) = GRID_OPSETS["ConvTranspose"]
    model, feeds = one_node("ConvTranspose", [x, w, b], opset, strides=[stride] * 2, pads=[pads] * 4,
                            output_padding=[output_padding] * 2, group=groups)  # fmt: skip
    assert_agrees_with_runtime(model, feeds)
    expected = F.conv_transpose2d(*(torch.from_numpy(a).double() for a in (x, w, b)), stride=stride, padding=pads,
                                  output_padding=output_padding, groups=groups)  # fmt: skip
    assert_agrees_with_torch(model, feeds, expected)


@pytest.mark.parametrize("opset", GRID_OPSETS["BatchNormalization"])
@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_batch_normalization_in_inference(opset, rank):
    x = rand(2, 5, *[4] * rank)
    parameters = [rand(5, seed=1, low=0.5), rand(5, seed=2), rand(5, seed=3), rand(5, seed=4, low=0.5)]
    model, feeds = one_node("BatchNormalization", [x, *parameters], opset, epsilon=2**-10)  # exact in float32
    assert_agrees_with_runtime(model, feeds)
    scale, bias, mean, var = (torch.from_numpy(p).double() for p in parameters)
    expected = F.batch_norm(torch.from_numpy(x).double(), mean, var, scale, bias, training=False, eps=2**-10)
    assert_agrees_with_torch(model, feeds, expected)


def _pool_cases():
    for rank, kernel, stride, pads, ceil_mode, dilation in itertools.product(
        (1, 2, 3), (2, 3), (1, 2), ("none", "symmetric", "asymmetric", "SAME_UPPER"), (0, 1), (1, 2)
    ):
        if rank == 3 and (dilation == 2 or pads == "asymmetric"):
            continue
        if dilation > 1 and pads == "SAME_UPPER":
            continue  # ONNX Runtime sizes SAME pads by the undilated kernel, against ONNX's spec
        yield rank, kernel, stride, pads, ceil_mode, dilation


def _pool_attributes(rank, kernel, stride, pads, ceil_mode, dilation, opset):
    attributes = {"kernel_shape": [kernel] * rank, "strides": [stride] * rank}
    if opset >= 10:
        attributes["ceil_mode"] = ceil_mode
    if dilation > 1:
        attributes["dilations"] = [dilation] * rank
    if pads == "symmetric":
        attributes["pads"] = [1] * (2 * rank)
    elif pads == "asymmetric":
        attributes["pads"] = [0] * rank + [1] * rank
    elif pads == "SAME_UPPER":
        attributes["auto_pad"] = pads
    return attributes


@pytest.mark.parametrize("rank, kernel, stride, pads, ceil_mode, dilation", list(_pool_cases()))
def test_max_pool(rank, kernel, stride, pads, ceil_mode, dilation):
    x = rand(2, 3, *[{1: 13, 2: 9, 3: 6}[rank]] * rank)
    for opset in GRID_OPSETS["MaxPool"]:
        if opset < 10 and (ceil_mode or dilation > 1):
            continue
        model, feeds = one_node("MaxPool", [x], opset, **_pool_attributes(rank, kernel, stride, pads, ceil_mode,
                                                                           dilation, opset))  # fmt: skip
        assert_agrees_with_runtime(model, feeds)
    if pads in ("none", "symmetric") and kernel >= 2 * (pads == "symmetric"):
        pool = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[rank - 1]
        expected = pool(torch.from_numpy(x).double(), kernel, stride, int(pads == "symmetric"), dilation,
                        ceil_mode=bool(ceil_mode))  # fmt: skip
        assert_agrees_with_torch(model, feeds, expected)


@pytest.mark.parametrize("rank, kernel, stride, pads, ceil_mode, dilation", list(_pool_cases()))
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool(rank, kernel, stride, pads, ceil_mode, dilation, count_include_pad):
    x = rand(2, 3, *[{1: 13, 2: 9, 3: 6}[rank]] * rank)
    for opset in GRID_OPSETS["AveragePool"]:
        if (opset < 10 and ceil_mode) or (opset < 19 and dilation > 1):
            continue
        attributes = _pool_attributes(rank, kernel, stride, pads, ceil_mode, dilation, opset)
        model, feeds = one_node("AveragePool", [x], opset, count_include_pad=count_include_pad, **attributes)
        assert_agrees_with_runtime(model, feeds)
    if pads in ("none", "symmetric") and dilation == 1 and not (ceil_mode and count_include_pad):
        pool = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[rank - 1]
        expected = pool(torch.from_numpy(x).double(), kernel, stride, int(pads == "symmetric"),
                        ceil_mode=bool(ceil_mode), count_include_pad=bool(count_include_pad))  # fmt: skip
        assert_agrees_with_torch(model, feeds, expected)


@pytest.mark.parametrize("mode, transform", [
    ("nearest", "asymmetric"), ("linear", "half_pixel"), ("linear", "align_corners"), ("linear", "pytorch_half_pixel"),
    ("cubic", "half_pixel"), ("cubic", "align_corners"),
])  # fmt: skip
@pytest.mark.parametrize("scale", [0.5, 2.0, 1.5])  # 7 x 0.5 = 3.5: align_corners' length is 3
def test_resize_with_scales(mode, transform, scale):
    """Scales whose coordinates are exact in float32: with 0.6, nearest's x / 0.6 falls within
    rounding of an integer and float32 and float64 pick different pixels (both right in their
    precision)."""
    x = rand(1, 2, 7, 9)
    scales = numpy_helper.from_array(np.array([1, 1, scale, scale], np.float32), "scales")
    roi = numpy_helper.from_array(np.array([], np.float32), "roi")
    extra = {"nearest_mode": "floor"} if mode == "nearest" else {}
    for opset in GRID_OPSETS["Resize"]:
        model, feeds = one_node("Resize", [x], opset, initializers=[roi, scales], mode=mode,
                                coordinate_transformation_mode=transform, **extra)  # fmt: skip
        assert_agrees_with_runtime(model, feeds)
    if mode == "linear" and transform in ("align_corners", "half_pixel"):
        x64 = torch.from_numpy(x).double()
        if transform == "align_corners":  # a ratio of lengths: torch is given the output's
            size = [int(np.floor(n * scale)) for n in x.shape[2:]]
            expected = F.interpolate(x64, size=size, mode="bilinear", align_corners=True)
        else:  # the scale itself maps coordinates, as ONNX's given scales do
            expected = F.interpolate(x64, scale_factor=scale, mode="bilinear", recompute_scale_factor=False)
        assert_agrees_with_torch(model, feeds, expected)


@pytest.mark.parametrize("op, function", [("Sigmoid", torch.sigmoid), ("Erf", torch.special.erf)])
def test_elementwise_kernels_are_float64_throughout(op, function):
    x = np.linspace(-40, 40, 4001, dtype=np.float32).reshape(1, -1)
    model, feeds = one_node(op, [x], *GRID_OPSETS[op])
    assert_agrees_with_runtime(model, feeds)
    ours = float64_outputs(model, feeds)[0]
    exact = function(torch.from_numpy(x).double()).numpy()
    assert np.allclose(ours, exact, rtol=1e-14, atol=0)  # relative: sigmoid(-40) = 4e-18 to 14 digits


def test_onnx_erf_is_not_float64_and_ours_is():
    """ONNX's reference Erf (onnx 1.23) rounds to float32; ours does not."""
    x = np.array([[0.3, 1.1, -0.7]], np.float32)
    model, feeds = one_node("Erf", [x], 13)
    exact = torch.special.erf(torch.from_numpy(x).double()).numpy()
    theirs = float64_outputs(model, feeds, kernels=[k for k in float64.KERNELS if k.__name__ != "Erf"])[0]
    assert np.abs(float64_outputs(model, feeds)[0] - exact).max() < 1e-15 < np.abs(theirs - exact).max()


def test_numpy_erf_is_within_two_ulps_of_math_erf():
    """validate/float64/erf.py, the Erf kernel's path where torch is not loaded (an .onnx route):
    against math.erf on a dense grid, random values, tiny and subnormal ones, and the edges."""
    import math

    from convexport.validate.float64.erf import erf

    rng = np.random.default_rng(0)
    x = np.concatenate(
        [np.linspace(-7, 7, 200_001), rng.normal(0, 2, 100_000), np.geomspace(5e-324, 1e-3, 2000),
         -np.geomspace(5e-324, 1e-3, 2000), [5.9999, 6.0, 6.0001, 1e300, -1e300]]
    )  # fmt: skip
    exact = np.array([math.erf(value) for value in x])
    ulps = np.abs(erf(x) - exact) / np.spacing(np.abs(exact)).clip(min=np.finfo(np.float64).smallest_subnormal)
    assert ulps.max() <= 2
    edges = erf(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0]))
    assert np.isnan(edges[0]) and edges[1] == 1 and edges[2] == -1
    assert edges[3] == 0 and not np.signbit(edges[3]) and edges[4] == 0 and np.signbit(edges[4])


def test_erf_kernel_without_torch_is_float64(monkeypatch):
    """The Erf kernel where torch is not imported uses erf.py, in float64, and keeps float32
    inputs (the node check's) float32."""
    x = np.linspace(-8, 8, 4001, dtype=np.float32).reshape(1, -1)
    model, feeds = one_node("Erf", [x], 13)
    exact = torch.special.erf(torch.from_numpy(x).double()).numpy()
    monkeypatch.setitem(sys.modules, "torch", None)  # as on a route that never imported it
    ours = float64_outputs(model, feeds)[0]
    assert ours.dtype == np.float64 and np.allclose(ours, exact, rtol=1e-15, atol=0)
    (narrow,) = float64.elementwise.Erf._run(None, x)
    assert narrow.dtype == np.float32 and np.allclose(narrow, exact, rtol=2**-24, atol=0)


# ---------------------------------------------------------------------------------------------
# A broken kernel fails the check


@pytest.mark.parametrize("opset", [9, 13])
def test_onnx_batch_normalization_below_14_is_caught(opset):
    """ONNX's own BatchNormalization kernel (the evaluator's without ours) is the broken kernel:
    the comparison with ONNX Runtime fails, and the node check names it."""
    x = rand(2, 5, 4, 4)
    parameters = [rand(5, seed=1, low=0.5), rand(5, seed=2), rand(5, seed=3), rand(5, seed=4, low=0.5)]
    model, feeds = one_node("BatchNormalization", [x, *parameters], opset)
    without_ours = [kernel for kernel in float64.KERNELS if kernel.__name__ != "BatchNormalization"]
    assert worst_disagreement(model, feeds, without_ours) > 0.1
    found = check_nodes(model, feeds, Float64Evaluator(model, without_ours)).disagreement
    assert found is not None and (found.node, found.op) == ("batchnormalization", "BatchNormalization")
    assert check_nodes(model, feeds).disagreement is None


def test_a_conv_kernel_off_by_one_pad_is_caught(monkeypatch):
    x, w = rand(1, 2, 8, 8), rand(3, 2, 3, 3, seed=1)
    model, feeds = one_node("Conv", [x, w], 11, pads=[1, 1, 1, 1])
    assert_agrees_with_runtime(model, feeds)
    shifted = float64.conv.explicit_pads
    monkeypatch.setattr(float64.conv, "explicit_pads", lambda *a: ([p + 1 for p in shifted(*a)[0]], shifted(*a)[1]))
    with pytest.raises((AssertionError, Float64Unavailable)):
        assert_agrees_with_runtime(model, feeds)


def test_a_value_infinite_in_both_runs_agrees_without_a_numpy_warning():
    """A masked score is -inf in ONNX Runtime's run and in the float64 one: the quick bound's
    inf - inf is NaN, which the element-by-element measure then treats as agreeing, and no
    RuntimeWarning reaches the user (optimum's GPT-2 printed two in every optimize call)."""
    ours = np.array([1.0, -np.inf, 2.0], np.float32)
    exact = np.array([1.0, -np.inf, 2.0 + 1e-9])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert disagreement(ours, exact, within=1e-3) < 1e-6
