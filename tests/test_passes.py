"""Unit tests of the IR, the passes and the memory plan (no GPU)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import MOBILENET

from kiln.frontend.onnx.importer import import_model
from kiln.ir import interp
from kiln.ir.graph import Builder, Graph, Value
from kiln.ir.printer import format_graph
from kiln.ir.verify import VerifyError, verify
from kiln.passes.fusion import fuse
from kiln.passes.manager import optimize
from kiln.passes.memory_plan import plan_memory


def small_graph(rng):
    g = Graph(name="t")
    x = Value("x", "float32", (1, 3, 8, 8))
    g.inputs.append(x)
    b = Builder(g)
    w = b.const(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    y = b.op("Conv", [x, w], strides=(1, 1), dilations=(1, 1), pads=(1, 1, 1, 1), group=1)
    scale = b.op("Sqrt", [b.const(np.full((4, 1, 1), 4.0, np.float32), "s")])  # folds to a constant
    y = b.op("Add", [y, b.const(rng.standard_normal((4, 1, 1)).astype(np.float32), "bias")])
    y = b.op("Mul", [y, scale])
    y = b.op("Clip", [y], min=0.0, max=6.0)
    r = b.op("Reshape", [y], shape=(1, 256))
    g.outputs.append(b.op("Relu", [r]))
    return g


def test_passes_preserve_interpreter_results(rng):
    g = small_graph(rng)
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    before = interp.run(g, {"x": x})
    fired = optimize(g)
    assert "const_fold" in fired and "fold_scale" in fired
    assert [n.op for n in g.nodes] == ["Conv", "Add", "Clip", "Reshape", "Relu"]
    after = interp.run(g, {"x": x})
    np.testing.assert_allclose(after[g.outputs[0].name], before[g.outputs[0].name], rtol=1e-5, atol=1e-5)


def test_fusion_groups_elementwise_chain_and_aliases_reshape(rng):
    g = small_graph(rng)
    optimize(g)
    groups = fuse(g)
    assert [[n.op for n in grp.nodes] for grp in groups] == [["Conv", "Add", "Clip"], ["Reshape"], ["Relu"]]
    assert groups[1].alias


def test_memory_plan_shares_buffers_by_liveness():
    graph = import_model(MOBILENET)
    optimize(graph)
    groups = fuse(graph)
    plan = plan_memory(graph, groups)
    acts = [b for b in plan.buffers if b.kind == "activation"]
    assert plan.bytes("activation") < plan.unshared_bytes / 2
    assert len(acts) < len([g for g in groups if not g.alias]) / 4
    # no two values that are live at the same step share a buffer
    step_of = {}
    for i, grp in enumerate(groups):
        if not grp.alias:
            step_of[id(grp.output)] = i
    for i, grp in enumerate(groups):
        if grp.alias:
            continue
        read = {plan.of[id(v)] for v in grp.inputs if id(v) in plan.of}
        assert plan.of[id(grp.output)] not in read, f"kernel {i} reads and writes one buffer"


def test_verify_catches_broken_graphs(rng):
    g = small_graph(rng)
    verify(g)
    g.nodes[0].outputs[0].shape = (9, 9)
    with pytest.raises(VerifyError, match="shape rule"):
        verify(g)
    g = small_graph(rng)
    g.nodes = g.nodes[::-1]
    with pytest.raises(VerifyError, match="before it is defined"):
        verify(g)


def test_printer_shows_ops_shapes_and_symbolic_inputs():
    text = format_graph(import_model(MOBILENET))
    assert text.startswith("graph ")
    assert "%input: float32['N', 3, 224, 224]" in text
    assert "Conv(" in text and "float32[1, 32, 112, 112]" in text


def _layernorm_softmax_conv(rng, n: int = 24):
    """LayerNormalization -> Softmax (elementwise producers with several readers), then a Conv whose input is
    an elementwise chain (must not be inlined into the Conv: it would be recomputed per reduction step)."""
    from onnx import TensorProto as T
    from onnx import helper as h

    x = h.make_tensor_value_info("x", T.FLOAT, [2, 4, n])
    y = h.make_tensor_value_info("y", T.FLOAT, [2, 4, n])
    z = h.make_tensor_value_info("z", T.FLOAT, [2, 3, n - 2])
    inits = [h.make_tensor("g", T.FLOAT, [n], rng.uniform(0.5, 1.5, n).astype(np.float32)),
             h.make_tensor("b", T.FLOAT, [n], rng.standard_normal(n).astype(np.float32)),
             h.make_tensor("w", T.FLOAT, [3, 4, 3], rng.standard_normal((3, 4, 3)).astype(np.float32))]
    nodes = [h.make_node("LayerNormalization", ["x", "g", "b"], ["t"], axis=-1, epsilon=1e-5),
             h.make_node("Softmax", ["t"], ["y"], axis=-1),
             h.make_node("Sigmoid", ["t"], ["s"]),
             h.make_node("Conv", ["s", "w"], ["z"])]
    return h.make_model(h.make_graph(nodes, "lnsm", [x], [y, z], inits), opset_imports=[h.make_opsetid("", 17)],
                        ir_version=8)


def test_fusion_inlines_elementwise_producers_into_reductions_and_consumers(rng, tmp_path):
    """Elementwise producers are inlined (duplicated) into elementwise and reduction consumers, never into a
    Conv; the compiled package still matches onnxruntime, with NaN-poisoned buffers."""
    import onnx
    import onnxruntime as ort

    import kiln

    model = _layernorm_softmax_conv(rng)
    graph = import_model(model)
    optimize(graph)
    groups = fuse(graph)
    kinds = [[n.op for n in g.nodes] for g in groups]
    reductions = [k for k in kinds if any(op.startswith("Reduce") for op in k)]
    assert len(reductions) == 4, kinds  # LN mean, LN variance, softmax max, softmax exp-sum
    conv = next(k for k in kinds if "Conv" in k)
    assert conv[0] == "Conv", kinds  # the Sigmoid feeding the Conv stays a kernel of its own
    assert len(groups) == 7, kinds  # mean, var, max, sum, softmax divide, sigmoid, conv
    # every value a group reads is a graph input, a constant, or another group's output (nothing inlined is read)
    written = {id(g.output) for g in groups} | {id(v) for v in graph.inputs}
    for g in groups:
        for v in g.inputs:
            assert v.is_const or id(v) in written, f"{v} is read but no kernel writes it"
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    x = rng.standard_normal((2, 4, 24)).astype(np.float32)
    got = kiln.load(kiln.compile(path, tmp_path / "pkg"), poison=True).run({"x": x})
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got["y"], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["z"], want[1], rtol=1e-5, atol=1e-5)


def test_common_subexpressions(rng):
    """Nodes with the same op, attributes and inputs (small constants by value) become one; other attributes,
    other constants and nodes defining graph outputs stay; results are unchanged."""
    from kiln.passes.simplify import common_subexpressions

    g = Graph(name="cse")
    x = Value("x", "float32", (4, 6))
    g.inputs = [x]
    b = Builder(g)
    outs = []
    for _ in range(3):  # three copies of the same computation (a decoder's per-layer mask and rotary rows)
        two = b.const(np.array(2.0, np.float32))
        s = b.op("ReduceSum", [b.op("Mul", [x, two])], axes=(1,), keepdims=1)
        outs.append(b.op("Sub", [x, s]))
    other = b.op("ReduceSum", [b.op("Mul", [x, b.const(np.array(3.0, np.float32))])], axes=(1,), keepdims=1)
    other_axis = b.op("ReduceSum", [b.op("Mul", [x, b.const(np.array(2.0, np.float32))])], axes=(0,), keepdims=1)
    y = b.op("Add", [b.op("Add", [outs[0], outs[1]]), b.op("Add", [outs[2], other])])
    g.outputs = [y, other_axis]
    feeds = {"x": rng.standard_normal((4, 6)).astype(np.float32)}
    want = interp.run(g, feeds)
    before = len(g.nodes)
    assert common_subexpressions(g)
    verify(g)
    ops_left = [n.op for n in g.nodes]
    assert ops_left.count("Sub") == 1 and ops_left.count("ReduceSum") == 3  # the x*2 row sums once; x*3, axis 0 kept
    assert len(g.nodes) == before - 7  # two copies of 3 nodes, and the axis-0 sum's x*2
    got = interp.run(g, feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6)
    assert not common_subexpressions(g)


def _attention_block(rng, seq: int = 8, width: int = 16, heads: int = 2):
    """A small attention block as ONNX: Q/K/V projections with biases on one input, head reshapes and transposes,
    QK^T, Softmax, .V, the heads merged back and an output projection; plus a Slice-then-Transpose side output."""
    import onnx
    from onnx import helper, numpy_helper

    hd = width // heads

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    def shape(name, *dims):
        return numpy_helper.from_array(np.array(dims, np.int64), name)

    inits = [w("wq", width, width), w("wk", width, width), w("wv", width, width), w("bq", width), w("bk", width),
             w("bv", width), w("wo", width, width), shape("heads", 1, seq, heads, hd), shape("merged", 1, seq, width),
             shape("st", 2), shape("en", 6), shape("ax", 1)]
    n = helper.make_node
    nodes = [n("MatMul", ["x", "wq"], ["q0"]), n("Add", ["q0", "bq"], ["q1"]),
             n("MatMul", ["x", "wk"], ["k0"]), n("Add", ["k0", "bk"], ["k1"]),
             n("MatMul", ["x", "wv"], ["v0"]), n("Add", ["v0", "bv"], ["v1"])]
    for t, perm in (("q", (0, 2, 1, 3)), ("k", (0, 2, 3, 1)), ("v", (0, 2, 1, 3))):
        nodes += [n("Reshape", [t + "1", "heads"], [t + "2"]), n("Transpose", [t + "2"], [t + "3"], perm=perm)]
    nodes += [n("MatMul", ["q3", "k3"], ["s"]), n("Softmax", ["s"], ["p"], axis=-1), n("MatMul", ["p", "v3"], ["c"]),
              n("Transpose", ["c"], ["c1"], perm=(0, 2, 1, 3)), n("Reshape", ["c1", "merged"], ["c2"]),
              n("MatMul", ["c2", "wo"], ["y"]),
              n("Slice", ["x", "st", "en", "ax"], ["xs"]), n("Transpose", ["xs"], ["xt"], perm=(0, 2, 1)),
              n("Relu", ["xt"], ["z"])]
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                                                 (1, seq, width))],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, (1, seq, width)),
                               helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, (1, width, 4))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_sibling_matmuls_merge_and_index_producers_inline(rng, tmp_path):
    """Q/K/V projections with biases on one input become one MatMul over concatenated weights (their results slices
    of it), and, fused for GPUs, no kernel is left that only moves elements (Transpose, Slice, and the views between
    them are read in place by their consumers); webgpu (gpu schedules), wasm and cpu, NaN-poisoned, match
    onnxruntime."""
    import onnx
    import onnxruntime as ort

    import kiln

    model = _attention_block(rng)
    graph = import_model(model)
    fired = optimize(graph)
    assert "merge_sibling_matmuls" in fired
    ops_left = [n.op for n in graph.nodes]
    assert ops_left.count("MatMul") == 4 and ops_left.count("Add") == 1, ops_left  # QKV (one bias add), 2 attn, out
    groups = fuse(graph, prologues=True)  # as for GPUs
    kinds = [[n.op for n in g.nodes] for g in groups if not g.alias]
    assert not [k for k in kinds if set(k) <= {"Transpose", "Slice", "Reshape"}], kinds
    assert len(kinds) == 8, kinds  # QKV, QK^T, softmax (max, exp-sum, divide), .V, out projection; the side output
    # for CPUs, the head transposes behind reshapes stay copies (a division per matmul load costs more there)
    cpu = [[n.op for n in g.nodes] for g in fuse(graph) if not g.alias]
    assert [k for k in cpu if set(k) <= {"Transpose", "Slice", "Reshape"}], cpu
    assert ["Slice", "Transpose", "Relu"] in cpu, cpu  # a slice and transpose without a reshape still go inline
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    x = rng.standard_normal((1, 8, 16)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    gpu = kiln.compile(path, tmp_path / "gpu", device_class="gpu")
    pkg = kiln.compile(path, tmp_path / "pkg", target="webgpu,wasm,cpu", wasm_threads=False)
    for p, target in ((gpu, "webgpu"), (pkg, "webgpu"), (pkg, "wasm"), (pkg, "cpu")):
        got = kiln.load(p, target=target, poison=True).run({"x": x})
        np.testing.assert_allclose(got["y"], want[0], rtol=1e-4, atol=1e-5, err_msg=target)
        np.testing.assert_array_equal(got["z"], want[1], err_msg=target)


def test_sibling_matmuls_with_some_biases_stay_apart(rng):
    """Siblings of which only some add a bias are not merged (the bias would become a kernel of its own); siblings
    of other weight shapes or other inputs are not merged either."""
    from kiln.passes.siblings import merge_sibling_matmuls

    g = Graph(name="siblings")
    x = Value("x", "float32", (3, 8))
    x2 = Value("x2", "float32", (3, 8))
    g.inputs = [x, x2]
    b = Builder(g)
    a = b.op("Add", [b.op("MatMul", [x, b.const(rng.standard_normal((8, 4)).astype(np.float32))]),
                     b.const(rng.standard_normal(4).astype(np.float32))])
    c = b.op("MatMul", [x, b.const(rng.standard_normal((8, 5)).astype(np.float32))])
    d = b.op("MatMul", [x2, b.const(rng.standard_normal((8, 5)).astype(np.float32))])
    g.outputs = [b.op("Relu", [a]), b.op("Relu", [c]), b.op("Relu", [d])]
    assert not merge_sibling_matmuls(g)
    e = b.op("MatMul", [x2, b.const(rng.standard_normal((8, 7)).astype(np.float32))])
    g.outputs.append(b.op("Sigmoid", [e]))
    feeds = {"x": rng.standard_normal((3, 8)).astype(np.float32), "x2": rng.standard_normal((3, 8)).astype(np.float32)}
    want = interp.run(g, feeds)
    assert merge_sibling_matmuls(g)  # d and e (x2, no biases) merge
    verify(g)
    assert [n.op for n in g.nodes].count("MatMul") == 3
    got = interp.run(g, feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


def _gelu_graph(rng, variant: str):
    """``Gelu(x W + b)`` spelled out as PyTorch's ONNX export writes it (``variant``: ``div`` x / sqrt(2) then
    (x * (1 + erf)) * 0.5; ``half_first``: (x * 0.5) * (1 + erf); ``reciprocal``: x * (1 / sqrt(2)); ``wrong``: a
    0.6 where 0.5 belongs, which is not a GELU)."""
    g = Graph(name="gelu")
    x = Value("x", "float32", (1, 16, 32))
    g.inputs.append(x)
    b = Builder(g)
    h = b.op("Add", [b.op("MatMul", [x, b.const(rng.standard_normal((32, 48)).astype(np.float32), "w")]),
                     b.const(rng.standard_normal(48).astype(np.float32), "b")])
    if variant == "reciprocal":
        scaled = b.op("Mul", [b.const(np.float32(1 / np.sqrt(2)), "r"), h])
    else:
        scaled = b.op("Div", [h, b.const(np.float32(np.sqrt(2)), "s")])
    one_plus = b.op("Add", [b.op("Erf", [scaled]), b.const(np.float32(1.0), "one")])
    half = b.const(np.float32(0.6 if variant == "wrong" else 0.5), "half")
    if variant == "half_first":
        y = b.op("Mul", [b.op("Mul", [h, half]), one_plus])
    else:
        y = b.op("Mul", [b.op("Mul", [h, one_plus]), half])
    g.outputs.append(y)
    return g


@pytest.mark.parametrize("variant", ["div", "half_first", "reciprocal", "wrong"])
def test_decomposed_gelu_becomes_one_op_in_the_matmul_epilogue(rng, variant):
    g = _gelu_graph(rng, variant)
    x = rng.standard_normal((1, 16, 32)).astype(np.float32)
    before = interp.run(g, {"x": x})
    fired = optimize(g)
    after = interp.run(g, {"x": x})
    np.testing.assert_allclose(after[g.outputs[0].name], before[next(iter(before))], rtol=1e-5, atol=1e-5)
    ops_left = [n.op for n in g.nodes]
    if variant == "wrong":
        assert "fuse_gelu" not in fired and "Erf" in ops_left
        return
    assert "fuse_gelu" in fired and ops_left == ["MatMul", "Add", "Gelu"]
    assert [[n.op for n in grp.nodes] for grp in fuse(g)] == [["MatMul", "Add", "Gelu"]]
