"""Shape arithmetic and element moves as exporters leave them (issue 31): folding to a fixed
point, the static dims of a partly dynamic shape, and the layout rules (a Reshape to its
input's shape, Reshape of Reshape, Transpose of Transpose, an identity Transpose, Slices that
are a Split). Every positive case runs against the original in ONNX Runtime; the cases where
the fold would be wrong are left alone."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnx.parser
import pytest
import torch
from onnx import helper

import convexport
from convexport.ir import fold_constants, fold_to_fixed_point, infer_shapes
from convexport.ir.static_dims import fold_static_dims
import graphs
from graphs import RULES, GraphBuilder, rewrite
from helpers import all_op_counts, make_model, op_counts, run, tensor

SHAPE_OPS = {"Shape", "Gather", "Slice", "Concat", "Unsqueeze", "Squeeze", "Cast", "Div", "Mul", "Constant"}
INT64_MAX = np.iinfo(np.int64).max


def only(*names):
    return [rule for rule in RULES if rule.name in names]


def fold(builder, outputs, *names, dynamic_batch=False):
    return graphs.fold(builder, outputs, rules=only(*names), rtol=0, dynamic_batch=dynamic_batch)


def ints(builder, values):
    return builder.const(np.array(values), dtype=np.int64)


# --- a Reshape to the input's own shape ------------------------------------------------------


@pytest.mark.parametrize("target", [[2, 6, 5], [2, -1, 5], [0, 6, 0], [-1, 6, 5]])
def test_a_reshape_to_its_inputs_shape_goes(target):
    builder = GraphBuilder([2, 6, 5])
    y = builder.node("Relu", [builder.node("Reshape", ["x", ints(builder, target)])])
    outcome, counts = fold(builder, [y], "drop-same-shape-reshape")
    assert counts == {"Relu": 1}


@pytest.mark.parametrize("target", [[2, 30], [6, 2, 5], [2, 5, 6]])  # [2, 5, 6]: same elements, other shape
def test_a_reshape_that_changes_the_shape_stays(target):
    builder = GraphBuilder([2, 6, 5])
    y = builder.node("Relu", [builder.node("Reshape", ["x", ints(builder, target)])])
    outcome, counts = fold(builder, [y], "drop-same-shape-reshape")
    assert counts == {"Reshape": 1, "Relu": 1}


@pytest.mark.parametrize("target, goes", [
    ([-1, 6, 5], True),   # -1 resolves to N, whatever N is
    ([0, -1, 5], True),
    ([0, 6, 5], True),
    ([-1, 30], False),
    ([0, 5, 6], False),   # the same elements in another shape
    ([3, -1, 5], False),  # N is not 3 at every batch
])
def test_a_reshape_over_a_dynamic_batch_goes_only_where_it_keeps_every_dim(target, goes):
    builder = GraphBuilder([2, 6, 5])
    y = builder.node("Relu", [builder.node("Reshape", ["x", ints(builder, target)])])
    model = builder.model([y], dynamic_batch=True)
    outcome = rewrite(model, rules=only("drop-same-shape-reshape"))
    assert ("Reshape" not in op_counts(outcome.model)) == goes
    assert outcome.model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    for batch in (1, 3):
        feeds = {"x": np.random.default_rng(batch).standard_normal([batch, 6, 5]).astype(np.float32)}
        np.testing.assert_array_equal(run(outcome.model, feeds)[0], run(model, feeds)[0])


# --- Reshape of a Reshape ----------------------------------------------------------------------


@pytest.mark.parametrize("first, second", [
    ([6, 10], [2, 3, 10]),
    ([-1, 5], [3, -1]),
    ([60], [2, 6, 5]),        # back to the input's shape: the rule after drops it
    ([2, 30], [0, 5, 6]),     # 0 copies the first Reshape's 2, written as the static shape
    ([12, 5], [0, 1, 5]),     # 0 copies 12, not x's 2: the static shape keeps that
    ([2, 3, 10], [-1]),
])
def test_a_reshape_of_a_reshape_is_one_reshape(first, second):
    builder = GraphBuilder([2, 6, 5])
    h = builder.node("Reshape", ["x", ints(builder, first)])
    y = builder.node("Relu", [builder.node("Reshape", [h, ints(builder, second)])])
    outcome, counts = fold(builder, [y], "merge-reshapes", "drop-same-shape-reshape")
    assert counts.get("Reshape", 0) <= 1 and counts["Relu"] == 1
    assert "merge-reshapes" in [entry["rule"] for entry in outcome.applied]


def test_allowzero_keeps_a_zero_an_empty_dim_in_the_merged_reshape():
    builder = GraphBuilder([0, 3, 4])  # an empty batch
    h = builder.node("Reshape", ["x", ints(builder, [0, 12])], allowzero=1)
    y = builder.node("Reshape", [h, ints(builder, [4, 0, 3])], allowzero=1)
    model = builder.model([builder.node("Relu", [y])])
    outcome = rewrite(model, rules=only("merge-reshapes"))
    assert op_counts(outcome.model) == {"Reshape": 1, "Relu": 1}
    (merged,) = [node for node in outcome.model.graph.node if node.op_type == "Reshape"]
    assert helper.get_attribute_value(merged.attribute[0]) == 1
    feeds = {"x": np.zeros([0, 3, 4], np.float32)}
    assert run(outcome.model, feeds)[0].shape == run(model, feeds)[0].shape == (4, 0, 3)


def dynamic_reshapes(data: str, first: list, second: list):
    return infer_shapes(onnx.parser.parse_model(f"""
    <ir_version: 10, opset_import: ["" : 18]>
    g ({data} x) => (float[A, B, C] y) {{
      s1 = Constant<value = int64[{len(first)}] {{{", ".join(map(str, first))}}}>()
      s2 = Constant<value = int64[{len(second)}] {{{", ".join(map(str, second))}}}>()
      h = Reshape(x, s1)
      r = Reshape(h, s2)
      y = Relu(r)
    }}"""), "m.onnx", forget_unknown_dims=True)


@pytest.mark.parametrize("data, first, second, target", [
    ("float[N, 6, 5]", [0, 30], [0, 5, 6], [0, 5, 6]),        # 0 copies h's N, which is x's N there: still 0
    ("float[N, 6, 5]", [-1, 5], [0, 5, 1], [-1, 5, 1]),       # h's N*6 is no dim of x: the one -1
    ("float[N, 6, 5]", [0, -1], [0, 3, 10], [0, 3, 10]),
    ("float[N, K, 6]", [0, 0, 2, 3], [0, 0, 6], [0, 0, 6]),   # two named dims, each x's own
])
def test_reshapes_of_a_dynamic_batch_merge_with_their_copies_rewritten(data, first, second, target):
    model = dynamic_reshapes(data, first, second)
    outcome = rewrite(model, rules=only("merge-reshapes"))
    (merged,) = [node for node in outcome.model.graph.node if node.op_type == "Reshape"]
    shape = next(i for i in outcome.model.graph.initializer if i.name == merged.input[1])
    assert onnx.numpy_helper.to_array(shape).tolist() == target
    dims = [int(d) if d.isdigit() else None for d in data[6:-1].split(", ")]
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal([d or batch for d in dims]).astype(np.float32)
        np.testing.assert_array_equal(run(outcome.model, {"x": x})[0], run(model, {"x": x})[0])


def test_reshapes_whose_copies_would_need_two_inferred_dims_stay_and_say_why():
    """h = x [N, K, 6] as [N, K*6]; y = h as [N, K*6, 1]: K*6 is no dim of x, and -1 cannot
    stand for it beside a copied N that may be 0."""
    model = dynamic_reshapes("float[N, K, 6]", [0, -1], [0, 0, 1])
    outcome = rewrite(model, rules=only("merge-reshapes"))
    assert op_counts(outcome.model)["Reshape"] == 2
    (skipped,) = outcome.skipped
    assert "copies a dim (0) of its input that x does not have there" in skipped["reason"]


def test_a_reshape_read_elsewhere_is_not_merged():
    builder = GraphBuilder([2, 6, 5])
    h = builder.node("Reshape", ["x", ints(builder, [6, 10])])
    y = builder.node("Reshape", [h, ints(builder, [60])])
    outcome, counts = fold(builder, [y, builder.node("Relu", [h])], "merge-reshapes")
    assert counts["Reshape"] == 2 and not outcome.applied


def test_a_reshape_to_a_shape_computed_at_run_time_is_not_merged():
    builder = GraphBuilder([2, 6, 5])
    h = builder.node("Reshape", ["x", ints(builder, [6, 10])])
    shape = builder.node("Shape", ["x"])
    y = builder.node("Reshape", [h, shape])
    outcome, counts = fold(builder, [builder.node("Relu", [y])], "merge-reshapes", dynamic_batch=True)
    assert counts["Reshape"] == 2 and not outcome.applied


# --- Transposes --------------------------------------------------------------------------------


def perm_pairs(rank):
    perms = list(itertools.permutations(range(rank)))
    rng = np.random.default_rng(rank)
    return [(list(perms[i]), list(perms[j])) for i, j in rng.integers(0, len(perms), [12, 2])]


@pytest.mark.parametrize("inner, outer", perm_pairs(3) + perm_pairs(4) + perm_pairs(5))
def test_a_transpose_of_a_transpose_is_one_or_none(inner, outer):
    builder = GraphBuilder([2, 3, 4, 5, 6][: len(inner)])
    h = builder.node("Transpose", ["x"], perm=inner)
    y = builder.node("Relu", [builder.node("Transpose", [h], perm=outer)])
    outcome, counts = fold(builder, [y], "merge-transposes")
    composed = [inner[axis] for axis in outer]
    assert counts.get("Transpose", 0) == (composed != sorted(composed))


@pytest.mark.parametrize("inner, outer", [(None, None), (None, [0, 2, 1]), ([1, 0, 2], None)])
def test_a_transpose_without_perm_reverses_the_axes(inner, outer):
    builder = GraphBuilder([2, 3, 4])
    h = builder.node("Transpose", ["x"], **({} if inner is None else {"perm": inner}))
    y = builder.node("Transpose", [h], **({} if outer is None else {"perm": outer}))
    outcome, counts = fold(builder, [builder.node("Relu", [y])], "merge-transposes")
    assert counts.get("Transpose", 0) == (inner is not None or outer is not None)


def test_a_transpose_read_elsewhere_is_not_merged():
    builder = GraphBuilder([2, 3, 4])
    h = builder.node("Transpose", ["x"], perm=[0, 2, 1])
    y = builder.node("Transpose", [h], perm=[0, 2, 1])
    outcome, counts = fold(builder, [y, builder.node("Relu", [h])], "merge-transposes")
    assert counts["Transpose"] == 2


@pytest.mark.parametrize("perm, drops", [([0, 1, 2], True), ([0, 2, 1], False), ([2, 1, 0], False)])
def test_only_a_transpose_that_keeps_every_axis_goes(perm, drops):
    builder = GraphBuilder([2, 3, 4])
    y = builder.node("Relu", [builder.node("Transpose", ["x"], perm=perm)])
    outcome, counts = fold(builder, [y], "drop-identity-transpose")
    assert ("Transpose" not in counts) == drops


# --- Slices that are a Split -------------------------------------------------------------------


def slices(builder, cuts, axis=1, axes_given=True, steps=None):
    """One Slice of x per (start, end), concatenated back in reverse order (so a Split that
    put the parts in the wrong order would show)."""
    parts = []
    for start, end in cuts:
        inputs = ["x", ints(builder, [start]), ints(builder, [end])]
        if axes_given or steps is not None:
            inputs.append(ints(builder, [axis]))
        if steps is not None:
            inputs.append(ints(builder, [steps]))
        parts.append(builder.node("Slice", inputs))
    return builder.node("Concat", parts[::-1], axis=axis if axes_given else 0)


@pytest.mark.parametrize("cuts, axis, axes_given", [
    ([(0, 4), (4, 8)], 1, True),                          # chunk(2)
    ([(0, 2), (2, 5), (5, 8)], 1, True),                  # split([2, 3, 3])
    ([(4, 8), (0, 4)], 1, True),                          # written in another order
    ([(0, 3), (3, INT64_MAX)], 2, True),                  # to the end, as the TorchScript exporter writes it
    ([(0, -5), (-5, 8)], 1, True),                        # negative bounds
    ([(0, 1), (1, 2)], 0, False),                         # axes omitted: axis 0
    ([(0, 2), (2, 6)], -1, True),                         # a negative axis
    ([(-100, 3), (3, 100)], 1, True),                     # bounds clamped to the axis
])
def test_slices_that_cut_an_axis_into_parts_are_one_split(cuts, axis, axes_given):
    builder = GraphBuilder([2, 8, 6])
    y = slices(builder, cuts, axis, axes_given)
    outcome, counts = fold(builder, [y], "slices-to-split")
    assert counts == {"Split": 1, "Concat": 1}


@pytest.mark.parametrize("cuts, steps", [
    ([(0, 3), (4, 8)], None),   # a gap
    ([(0, 5), (3, 8)], None),   # an overlap
    ([(0, 4), (4, 6)], None),   # not the whole axis
    ([(0, 8), (1, 8)], 2),      # step 2
])
def test_slices_that_are_not_a_split_stay(cuts, steps):
    builder = GraphBuilder([2, 8, 6])
    y = slices(builder, cuts, steps=steps)
    outcome, counts = fold(builder, [y], "slices-to-split")
    assert counts["Slice"] == 2 and "Split" not in counts
    assert not outcome.skipped  # not a near match a user would expect folded


def test_slices_of_a_dynamic_axis_stay():
    builder = GraphBuilder([2, 8, 6])
    y = slices(builder, [(0, 1), (1, INT64_MAX)], axis=0)
    outcome, counts = fold(builder, [y], "slices-to-split", dynamic_batch=True)
    assert counts["Slice"] == 2


def test_a_slice_that_is_a_graph_output_keeps_its_name():
    builder = GraphBuilder([2, 8, 6])
    first = builder.node("Slice", ["x", ints(builder, [0]), ints(builder, [4]), ints(builder, [1])])
    second = builder.node("Slice", ["x", ints(builder, [4]), ints(builder, [8]), ints(builder, [1])])
    outcome, counts = fold(builder, [first, second], "slices-to-split")
    assert counts == {"Split": 1}
    assert [output.name for output in outcome.model.graph.output] == [first, second]


# --- static dims of a partly dynamic shape -----------------------------------------------------


def shape_reader(op, inputs, output_dims, **attrs):
    """x [N, 3, 4, 5] -> Shape -> `op`: a model whose output is what the op picks."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"], **attrs), helper.make_node(op, ["shape", *inputs], ["y"])]
    return nodes


@pytest.mark.parametrize("op, constants, picked", [
    ("Gather", {"i": np.array(1)}, [3]),                       # a scalar index, as TorchScript writes it
    ("Gather", {"i": np.array([2, 3])}, [4, 5]),
    ("Gather", {"i": np.array(-1)}, [5]),
    ("Slice", {"s": np.array([1]), "e": np.array([INT64_MAX])}, [3, 4, 5]),
    ("Slice", {"s": np.array([-2]), "e": np.array([4]), "a": np.array([0])}, [4, 5]),
])
def test_a_pick_of_static_dims_is_a_constant(op, constants, picked):
    model = make_model(shape_reader(op, list(constants), None), [tensor("x", ["N", 3, 4, 5])],
                       [tensor("y", None, onnx.TensorProto.INT64)], constants)
    folded = fold_static_dims(model)
    assert [node.op_type for node in folded.graph.node] == ["Shape", "Constant"]
    feeds = {"x": np.zeros([2, 3, 4, 5], np.float32)}
    np.testing.assert_array_equal(run(folded, feeds)[0], run(model, feeds)[0])
    np.testing.assert_array_equal(np.reshape(run(folded, feeds)[0], -1), picked)


@pytest.mark.parametrize("op, constants", [
    ("Gather", {"i": np.array(0)}),                              # the dynamic batch
    ("Gather", {"i": np.array([0, 1])}),
    ("Gather", {"i": np.array(4)}),                              # out of range: ORT's error stays
    ("Slice", {"s": np.array([0]), "e": np.array([2])}),
    ("Slice", {"s": np.array([1]), "e": np.array([4]), "a": np.array([0]), "t": np.array([2])}),
])
def test_a_pick_of_a_dynamic_dim_or_an_unusual_one_stays(op, constants):
    model = make_model(shape_reader(op, list(constants), None), [tensor("x", ["N", 3, 4, 5])],
                       [tensor("y", None, onnx.TensorProto.INT64)], constants)
    assert fold_static_dims(model) is model


def test_a_shape_with_start_picks_from_the_rest():
    model = make_model(shape_reader("Gather", ["i"], None, start=1), [tensor("x", ["N", 3, 4, 5])],
                       [tensor("y", None, onnx.TensorProto.INT64)], {"i": np.array(0)})
    folded = fold_static_dims(model)
    np.testing.assert_array_equal(run(folded, {"x": np.zeros([1, 3, 4, 5], np.float32)})[0], 3)


# --- folding to a fixed point, on the exports users make ------------------------------------


class SplitFlatten(torch.nn.Module):
    """EfficientViT-M's: a view to the input's own shape, a split, the parts flattened and put
    back; the parts' shapes are known only once the split's bounds have folded."""

    def forward(self, x):
        batch, channels, height, width = x.shape
        first, second = x.view(batch, -1, height, width).split([1, channels - 1], dim=1)
        joined = torch.cat([first.flatten(2), torch.relu(second).flatten(2)], dim=1)
        return joined.view(batch, channels, height, width) * 2


def torchscript_export(module, path, dynamic_batch=False):
    torch.onnx.export(module, (torch.randn(2, 4, 3, 5),), str(path), dynamo=False, do_constant_folding=False,
                      input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "N"}, "y": {0: "N"}} if dynamic_batch else None)
    return onnx.load(str(path))


def ops(model):
    return op_counts(model)


def test_one_folding_round_leaves_shapes_the_fixed_point_folds_them(tmp_path):
    model = infer_shapes(torchscript_export(SplitFlatten(), tmp_path / "m.onnx"), "m.onnx")
    once = infer_shapes(fold_constants(model), "m.onnx", forget_unknown_dims=True)
    assert ops(once).get("Shape", 0) > 0  # the flattened parts' shapes were not known yet
    fixed = fold_to_fixed_point(model, "m.onnx")
    assert "Shape" not in ops(fixed)
    feeds = {"x": np.random.default_rng(0).standard_normal([2, 4, 3, 5]).astype(np.float32)}
    np.testing.assert_array_equal(run(fixed, feeds)[0], run(model, feeds)[0])


def test_a_dynamic_batch_stays_dynamic_and_the_rest_folds(tmp_path):
    """view(B, ...) with B = x.shape[0] dynamic: the Reshapes take 0 for B (copy x's dim), so
    no shape arithmetic is left, and the model runs at any batch."""
    model = infer_shapes(torchscript_export(SplitFlatten(), tmp_path / "m.onnx", dynamic_batch=True), "m.onnx")
    fixed = fold_to_fixed_point(model, "m.onnx")
    assert fixed.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    assert not {"Shape", "Gather", "Unsqueeze"} & set(ops(fixed))
    for batch in (1, 3):
        feeds = {"x": np.random.default_rng(batch).standard_normal([batch, 4, 3, 5]).astype(np.float32)}
        np.testing.assert_array_equal(run(fixed, feeds)[0], run(model, feeds)[0])


def reshape_model(parts: str, target_parts: str, data="float[N, 6] x", out="float[N, 2, 3] y", allowzero=0):
    """x reshaped to Concat(target_parts), the parts built by `parts` (lines of ONNX text)."""
    return onnx.parser.parse_model(f"""
    <ir_version: 10, opset_import: ["" : 18]>
    g ({data}) => ({out}) {{
      s = Shape(x)
      zero = Constant<value = int64 {{0}}>()
      axes = Constant<value = int64[1] {{0}}>()
      {parts}
      t = Concat<axis = 0>({target_parts})
      y = Reshape<allowzero = {allowzero}>(x, t)
    }}""")


BATCH = "b = Gather(s, zero)\n bu = Unsqueeze(b, axes)"
REST = "rest = Constant<value = int64[2] {2, 3}>()"


@pytest.mark.parametrize("parts, target_parts, target", [
    (f"{BATCH}\n {REST}", "bu, rest", [0, 2, 3]),                          # view(B, 2, 3): B copied
    ("start = Constant<value = int64[1] {0}>()\n end = Constant<value = int64[1] {1}>()\n bu = Slice(s, start, end)\n"
     f" {REST}", "bu, rest", [0, 2, 3]),                                      # x.shape[:1] + (2, 3)
    ("two = Constant<value = int64 {2}>()\n b = Gather(s, zero)\n m = Mul(b, two)\n mu = Unsqueeze(m, axes)\n"
     "three = Constant<value = int64[1] {3}>()", "mu, three", [-1, 3]),       # view(B * 2, 3): the one run-time entry
])
def test_a_reshape_target_put_together_from_dims_is_a_constant(parts, target_parts, target):
    out = "float[M, 3] y" if target == [-1, 3] else "float[N, 2, 3] y"
    model = infer_shapes(reshape_model(parts, target_parts, out=out), "m.onnx")
    fixed = fold_to_fixed_point(model, "m.onnx")
    assert ops(fixed) == {"Reshape": 1}
    (shape,) = fixed.graph.initializer
    assert onnx.numpy_helper.to_array(shape).tolist() == target
    for batch in (1, 3):
        feeds = {"x": np.random.default_rng(batch).standard_normal([batch, 6]).astype(np.float32)}
        np.testing.assert_array_equal(run(fixed, feeds)[0], run(model, feeds)[0])


@pytest.mark.parametrize("parts, target_parts, data, allowzero", [
    # two entries computed at run time: no single -1 can stand for both
    ("b = Gather(s, zero)\n m = Mul(b, b)\n mu = Unsqueeze(m, axes)", "mu, mu", "float[N, 6] x", 0),
    # a run-time entry beside a -1 already there
    ("two = Constant<value = int64 {2}>()\n b = Gather(s, zero)\n m = Mul(b, two)\n mu = Unsqueeze(m, axes)\n"
     "free = Constant<value = int64[1] {-1}>()", "mu, free", "float[N, 6] x", 0),
    # allowzero: B cannot be written as a copy, and -1 beside 0-sized dims would not resolve
    (f"one_index = Constant<value = int64 {{1}}>()\n {BATCH}\n one = Gather(s, one_index)\n ou = Unsqueeze(one, axes)",
     "bu, ou", "float[N, K] x", 1),
    # B copied, and -1 for the product: B may be 0, where -1 does not resolve
    (f"one_index = Constant<value = int64 {{1}}>()\n two = Constant<value = int64 {{2}}>()\n {BATCH}\n"
     " k = Gather(s, one_index)\n m = Mul(k, two)\n mu = Unsqueeze(m, axes)", "bu, mu", "float[N, K] x", 0),
])
def test_a_reshape_target_that_needs_its_run_time_entries_stays(parts, target_parts, data, allowzero):
    model = infer_shapes(reshape_model(parts, target_parts, data=data, out="float[A, B] y", allowzero=allowzero),
                         "m.onnx")
    fixed = fold_to_fixed_point(model, "m.onnx")
    assert "Concat" in ops(fixed)


def test_a_dim_of_another_name_is_not_copied():
    """t's batch is M, x's N: the entry is not x's own dim, so it is the one -1."""
    model = onnx.parser.parse_model("""
    <ir_version: 10, opset_import: ["" : 18]>
    g (float[N, 6] x, float[M] t) => (float[A, 2, 3] y) {
      s = Shape(t)
      zero = Constant<value = int64 {0}>()
      axes = Constant<value = int64[1] {0}>()
      b = Gather(s, zero)
      bu = Unsqueeze(b, axes)
      rest = Constant<value = int64[2] {2, 3}>()
      target = Concat<axis = 0>(bu, rest)
      y = Reshape(x, target)
    }""")
    fixed = fold_to_fixed_point(infer_shapes(model, "m.onnx"), "m.onnx")
    assert [onnx.numpy_helper.to_array(i).tolist() for i in fixed.graph.initializer] == [[-1, 2, 3]]


def test_nothing_to_fold_is_the_model_itself(tmp_path):
    builder = GraphBuilder([2, 3, 4])
    model = builder.model([builder.node("Relu", ["x"])])
    assert fold_to_fixed_point(model, "m.onnx") is model


class ShapeAsOutput(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x).flatten(1), torch.tensor(x.shape)


def test_a_shape_read_by_a_graph_output_is_still_an_output(tmp_path):
    path = tmp_path / "m.onnx"
    torch.onnx.export(ShapeAsOutput(), (torch.randn(2, 4, 3),), str(path), dynamo=False,
                      do_constant_folding=False, input_names=["x"], output_names=["y", "shape"])
    result = convexport.optimize(str(path), write=False, profile=False)
    model = result.model
    assert [output.name for output in model.graph.output] == ["y", "shape"]
    feeds = {"x": np.random.default_rng(0).standard_normal([2, 4, 3]).astype(np.float32)}
    y, shape = run(model, feeds)
    np.testing.assert_array_equal(shape, [2, 4, 3])
    np.testing.assert_array_equal(y, np.maximum(feeds["x"], 0).reshape(2, 12))
    assert "Shape" not in ops(model)


class ShuffleUnit(torch.nn.Module):
    """ShuffleNetV2's stride-1 unit: half the channels pass, half go through conv-BN, then the
    channel shuffle (view to groups, transpose, view back)."""

    def __init__(self, channels=8):
        super().__init__()
        half = channels // 2
        self.branch = torch.nn.Sequential(torch.nn.Conv2d(half, half, 3, padding=1, groups=half),
                                          torch.nn.BatchNorm2d(half), torch.nn.Conv2d(half, half, 1), torch.nn.ReLU())
        self.branch[1].running_mean.uniform_(-1, 1), self.branch[1].running_var.uniform_(0.5, 2)

    def forward(self, x):
        kept, moved = x.chunk(2, dim=1)
        x = torch.cat([kept, self.branch(moved)], dim=1)
        batch, channels, height, width = x.shape
        return x.view(batch, 2, channels // 2, height, width).transpose(1, 2).reshape(batch, channels, height, width)


@pytest.mark.parametrize("route", ["dynamo", "dynamo-unoptimized", "torchscript", "torchscript-folded"])
def test_channel_shuffle_exports_fold_to_the_same_small_graph(tmp_path, route):
    """The TorchScript exporter writes the chunk as Slices, dynamo as a Split, each x.shape a
    Shape chain: every route ends at the same graph, with no shape arithmetic and no BN."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(ShuffleUnit(), ShuffleUnit()).eval()
    path = tmp_path / "m.onnx"
    example = (torch.randn(2, 8, 5, 5),)
    if route.startswith("dynamo"):
        torch.onnx.export(module, example, str(path), dynamo=True, optimize=route == "dynamo", external_data=False)
    else:
        torch.onnx.export(module, example, str(path), dynamo=False, do_constant_folding=route == "torchscript-folded")
    result = convexport.optimize(str(path), write=False, profile=False)
    assert result.report["validation"]["passed"]
    assert result.report["after"]["ops"] == {"Split": 2, "Conv": 2, "Relu": 2, "Concat": 2, "Reshape": 4,
                                             "Transpose": 2}


def test_targets_inside_both_branches_of_an_if_become_constants():
    """Both scopes of an If hold a view(B, 2, 3) of the outer x: each gets its constant target
    in its own scope, and the model runs at any batch on either branch."""
    branch = """{{
          s{n} = Shape(x)
          zero{n} = Constant<value = int64 {{0}}>()
          axes{n} = Constant<value = int64[1] {{0}}>()
          b{n} = Gather(s{n}, zero{n})
          bu{n} = Unsqueeze(b{n}, axes{n})
          rest{n} = Constant<value = int64[2] {{{rest}}}>()
          t{n} = Concat<axis = 0>(bu{n}, rest{n})
          y{n} = Reshape(x, t{n})
        }}"""
    model = infer_shapes(onnx.parser.parse_model(f"""
    <ir_version: 10, opset_import: ["" : 18]>
    g (float[N, 6] x, bool c) => (float[N, A, B] y) {{
      y = If(c) <then_branch = g1 () => (float[N, 2, 3] y1) {branch.format(n=1, rest="2, 3")},
                 else_branch = g2 () => (float[N, 3, 2] y2) {branch.format(n=2, rest="3, 2")}>
    }}"""), "m.onnx")
    fixed = fold_to_fixed_point(model, "m.onnx")
    assert all_op_counts(fixed) == {"If": 1, "Reshape": 2}
    for batch, condition in itertools.product((1, 3), (True, False)):
        feeds = {"x": np.random.default_rng(batch).standard_normal([batch, 6]).astype(np.float32),
                 "c": np.array(condition)}
        np.testing.assert_array_equal(run(fixed, feeds)[0], run(model, feeds)[0])
