"""Linear regions (folds/linear_region.py): sums of branches linear in one tensor, with
intermediates read twice (DoRA) or rows reshaped (GPT-2's Conv1D), folded into one dense node;
and what must be left alone."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import numpy_helper

from convexport import ir
from graphs import rewrite
from helpers import op_counts, run

RNG = np.random.default_rng(0)


def parsed(graph: str, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A model from onnx's text form, its constants given as arrays (float32 unless integer)."""
    model = onnx.parser.parse_model('<ir_version: 10, opset_import: ["" : 18]>\n' + graph)
    for name, value in weights.items():
        value = np.asarray(value)
        value = value if value.dtype.kind == "i" else value.astype(np.float32)
        model.graph.initializer.append(numpy_helper.from_array(value, name))
    return ir.infer_shapes(model, "test")


def normal(*shape):
    return RNG.standard_normal(shape)


def rewritten(model):
    return rewrite(model, strategy="all")


def assert_same(model, result, shape, rtol=1e-5):
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
    expected, actual = run(model, feeds)[0], run(result.model, feeds)[0]
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * np.abs(expected).max())


DORA = """
dora (float[2, 5, 16] x) => (float[2, 5, 12] y) {
    m = MatMul(x, w)
    h = Add(m, b)
    s = Sub(h, b)
    t = Mul(s, c)
    y1 = Add(h, t)
    l = MatMul(x, a)
    u = MatMul(l, up)
    v = Mul(u, k)
    y = Add(y1, v)
}
"""


def dora_weights():
    return {"w": normal(16, 12), "b": normal(12), "c": normal(12), "a": normal(16, 2), "up": normal(2, 12),
            "k": normal(12)}


def test_dora_is_one_matmul_and_its_bias():
    model = parsed(DORA, dora_weights())
    result = rewritten(model)
    assert op_counts(result.model) == {"MatMul": 1, "Add": 1}, result.skipped
    assert_same(model, result, (2, 5, 16))


CONV1D_LORA = """
gpt2 (float[2, 5, 16] x) => (float[2, 5, 12] y) {
    f = Reshape(x, flat)
    g = Gemm(f, w, b)
    a = Reshape(g, back)
    l = MatMul(x, down)
    u = MatMul(l, up)
    y = Add(a, u)
}
"""


def conv1d_weights(back=(2, 5, 12)):
    return {"flat": np.array([-1, 16]), "w": normal(16, 12), "b": normal(12), "back": np.array(back),
            "down": normal(16, 2), "up": normal(2, 12)}


def test_lora_on_a_flattened_gemm_is_one_matmul_and_its_bias():
    model = parsed(CONV1D_LORA, conv1d_weights())
    result = rewritten(model)
    assert op_counts(result.model) == {"MatMul": 1, "Add": 1}, result.skipped
    assert_same(model, result, (2, 5, 16))


def test_a_sum_of_2d_branches_with_a_bias_is_one_gemm():
    model = parsed("""
        two (float[6, 16] x) => (float[6, 12] y) {
            h = Gemm(x, w, b)
            s = Mul(h, c)
            y = Add(h, s)
        }""", {"w": normal(16, 12), "b": normal(12), "c": normal(12)})
    result = rewritten(model)
    assert op_counts(result.model) == {"Gemm": 1}, result.skipped
    assert_same(model, result, (6, 16))


def test_a_residual_around_a_dense_layer_is_one_dense_layer():
    """x + x W = x (I + W): the identity is a branch of the region too."""
    model = parsed("""
        residual (float[2, 5, 16] x) => (float[2, 5, 16] y) {
            h = MatMul(x, w)
            g = Mul(h, c)
            y = Add(x, g)
        }""", {"w": normal(16, 16), "c": normal(16)})
    result = rewritten(model)
    assert op_counts(result.model) == {"MatMul": 1}, result.skipped
    assert_same(model, result, (2, 5, 16))


# --- left alone ---------------------------------------------------------------------


def skipped_reasons(result, rule="linear-region"):
    return [entry["reason"] for entry in result.skipped if entry["rule"] == rule]


def test_an_intermediate_read_outside_stops_the_region():
    model = parsed(DORA.replace("=> (float[2, 5, 12] y)", "=> (float[2, 5, 12] y, float[2, 5, 12] h)"),
                   dora_weights())
    result = rewritten(model)
    assert op_counts(result.model)["MatMul"] >= 2  # h stays, and what reads it with it
    assert_same(model, result, (2, 5, 16))


def test_a_reshape_that_moves_features_between_rows_is_no_region_node():
    """[2, 4, 8] -> [2, 32]: each new row holds four of x's rows; no map of x's 8 features."""
    model = parsed("""
        moved (float[2, 4, 8] x) => (float[2, 12] y) {
            f1 = Reshape(x, flat)
            f2 = Reshape(x, flat)
            a = MatMul(f1, w1)
            b = MatMul(f2, w2)
            y = Add(a, b)
        }""", {"flat": np.array([2, 32]), "w1": normal(32, 12), "w2": normal(32, 12)})
    result = rewritten(model)
    assert_same(model, result, (2, 4, 8))
    assert not any(entry["rule"].startswith("linear-region") for entry in result.applied)


def test_a_sum_that_broadcasts_rows_is_refused_with_the_reason():
    """[5, 1, D] + [1, 5, D] is [5, 5, D]: no row of the result is one row of x."""
    model = parsed("""
        crossed (float[1, 5, 16] x) => (float[5, 5, 12] y) {
            f = Reshape(x, turned)
            a = MatMul(f, w1)
            b = MatMul(x, w2)
            y = Add(a, b)
        }""", {"turned": np.array([5, 1, 16]), "w1": normal(16, 12), "w2": normal(16, 12)})
    result = rewritten(model)
    assert_same(model, result, (1, 5, 16))
    assert op_counts(result.model)["MatMul"] == 2
    assert any("does not keep the leading dims" in reason for reason in skipped_reasons(result)), result.skipped


def test_a_restoring_reshape_to_other_rows_is_refused():
    """The Conv1D pattern with its Reshape back to [5, 2, 12] instead of [2, 5, 12]."""
    text = CONV1D_LORA.replace("=> (float[2, 5, 12] y)", "=> (float[2, 5, 12] y)")
    model = parsed(text.replace("y = Add(a, u)", "t = Transpose <perm = [1, 0, 2]> (a)\n y = Add(t, u)"),
                   conv1d_weights(back=(5, 2, 12)))
    result = rewritten(model)
    assert_same(model, result, (2, 5, 16))
    assert "Transpose" in op_counts(result.model)


@pytest.mark.parametrize("between", ["Relu(h)", "Div(c, h)"])
def test_a_nonlinear_node_between_is_left_alone(between):
    model = parsed(f"""
        bent (float[2, 5, 16] x) => (float[2, 5, 12] y) {{
            h = MatMul(x, w)
            n = {between}
            g = MatMul(x, w2)
            y = Add(n, g)
        }}""", {"w": normal(16, 12), "w2": normal(16, 12), "c": normal(12) + 3})
    result = rewritten(model)
    assert op_counts(result.model)["MatMul"] == 2
    assert_same(model, result, (2, 5, 16))


def test_branches_of_two_tensors_are_left_alone():
    model = parsed("""
        two (float[2, 5, 16] x, float[2, 5, 16] z) => (float[2, 5, 12] y) {
            a = MatMul(x, w1)
            b = MatMul(z, w2)
            y = Add(a, b)
        }""", {"w1": normal(16, 12), "w2": normal(16, 12)})
    result = rewritten(model)
    assert op_counts(result.model) == {"MatMul": 2, "Add": 1}


def test_a_low_rank_pair_without_a_full_layer_stays_with_the_numbers():
    """x * s + B A x, A [64, 2]: one 64 x 64 product (4096 per row) against the pair's 256."""
    model = parsed("""
        lowrank (float[2, 5, 64] x) => (float[2, 5, 64] y) {
            s = Mul(x, c)
            l = MatMul(x, a)
            u = MatMul(l, up)
            y = Add(s, u)
        }""", {"c": normal(64), "a": normal(64, 2), "up": normal(2, 64)})
    result = rewritten(model)
    assert op_counts(result.model)["MatMul"] == 2
    assert any("costs more than the region's dense nodes (256)" in reason for reason in skipped_reasons(result))


# --- random regions -----------------------------------------------------------------


@st.composite
def regions(draw):
    """A random region of x [2, 3, C]: steps of MatMul, per-feature Mul / Add and sums of two
    earlier values of one width, some values read twice, ending in a sum."""
    width = draw(st.integers(1, 5))
    values = [("x", width)]
    lines, weights = [], {}
    for index in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["matmul", "scale", "shift", "sum"]))
        source, source_width = values[draw(st.integers(0, len(values) - 1))]
        name = f"v{index}"
        if kind == "matmul":
            out = draw(st.integers(1, 5))
            weights[f"w{index}"] = normal(source_width, out)
            lines.append(f"{name} = MatMul({source}, w{index})")
            values.append((name, out))
        elif kind == "sum":
            partners = [value for value in values if value[1] == source_width]
            partner = partners[draw(st.integers(0, len(partners) - 1))][0]
            op = draw(st.sampled_from(["Add", "Sub"]))
            lines.append(f"{name} = {op}({source}, {partner})")
            values.append((name, source_width))
        else:
            weights[f"k{index}"] = normal(source_width)
            lines.append(f"{name} = {'Mul' if kind == 'scale' else 'Add'}({source}, k{index})")
            values.append((name, source_width))
    read = {operand for line in lines for operand in line.split("(", 1)[1].rstrip(")").split(", ")}
    total = "q"
    weights["wz"] = normal(width, 4)
    lines.append("q = MatMul(x, wz)")
    for name, value_width in values[1:]:
        if name not in read:  # every value is read: the region is the whole graph
            weights[f"out_{name}"] = normal(value_width, 4)
            lines += [f"p_{name} = MatMul({name}, out_{name})", f"s_{name} = Add({total}, p_{name})"]
            total = f"s_{name}"
    lines[-1] = lines[-1].replace(f"{total} =", "y =") if total != "q" else lines[-1]
    body = "\n".join(lines)
    return parsed(f"region (float[2, 3, {width}] x) => (float[2, 3, 4] y) {{\n{body}\n}}", weights), width


@settings(max_examples=60, deadline=None)
@given(regions())
def test_random_regions_fold_exactly(drawn):
    model, width = drawn
    result = rewritten(model)
    assert_same(model, result, (2, 3, width), rtol=1e-4)
    assert set(op_counts(result.model)) <= {"MatMul", "Add"} and op_counts(result.model)["MatMul"] == 1, result.skipped


def test_an_unknown_last_dim_is_read_from_the_dense_weight():
    """Llama's o_proj input is attn.reshape(*input_shape, -1): with batch and sequence dynamic,
    shape inference leaves its last dim unknown; the MatMul by a [32, 12] weight says it is 32
    (DoRA's region, W x read twice, as peft's o_proj exports by TorchScript)."""
    model = parsed("""
        heads (float[b, s, 4, 8] t) => (float[b, s, 12] y) {
            sh = Shape(t)
            lead = Slice(sh, zero, two)
            target = Concat <axis = 0> (lead, minus_one)
            x = Reshape(t, target)
            h = MatMul(x, w)
            g = Mul(h, c)
            a = Add(h, g)
            l = MatMul(x, down)
            u = MatMul(l, up)
            y = Add(a, u)
        }""", {"zero": np.array([0]), "two": np.array([2]), "minus_one": np.array([-1]), "w": normal(32, 12),
               "c": normal(12), "down": normal(32, 2), "up": normal(2, 12)})
    x = next(value for value in model.graph.value_info if value.name == "x")
    assert not x.type.tensor_type.shape.dim[2].HasField("dim_value")
    result = rewritten(model)
    assert op_counts(result.model)["MatMul"] == 1, result.skipped
    feeds = {"t": RNG.standard_normal((2, 5, 4, 8)).astype(np.float32)}
    np.testing.assert_allclose(run(result.model, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)
