"""Row kernels (kiln.te.rows): LayerNormalization and Softmax fused into one kernel, a workgroup per row,
checked against onnxruntime with NaN-poisoned buffers (tests/opcheck.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from opcheck import check_op, make_model

from kiln.compiler import compile_graph
from kiln.frontend.onnx.importer import import_model


@pytest.mark.parametrize("width", [7, 384, 1000])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_rows(rng, width, bias):
    x = (rng.standard_normal((3, 2, width)) * 3 + 1).astype(np.float32)
    inits = {"scale": rng.standard_normal(width).astype(np.float32)}
    if bias:
        inits["bias"] = rng.standard_normal(width).astype(np.float32)
    check_op("LayerNormalization", {"x": x}, {"axis": -1, "epsilon": 1e-3}, inits, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("width", [7, 128, 1000])
def test_softmax_rows(rng, op, width):
    x = (rng.standard_normal((2, 3, width)) * 4).astype(np.float32)
    check_op(op, {"x": x}, {"axis": -1}, opset=13, rtol=1e-4, atol=1e-6)


def _kernels(model, **kw) -> list[list[str]]:
    return [k.ops for k in compile_graph(import_model(model), **kw).kernels]


def test_row_fusion_makes_one_kernel_per_op(rng):
    """LayerNormalization and Softmax each become one row kernel on gpu schedules; cpu schedules and the
    other targets keep the reductions in kernels of their own."""
    x = rng.standard_normal((4, 384)).astype(np.float32)
    ln = make_model("LayerNormalization", {"x": x}, {"axis": -1},
                    {"scale": np.ones(384, np.float32), "bias": np.zeros(384, np.float32)})
    sm = make_model("Softmax", {"x": x}, {"axis": -1}, opset=13)
    for model in (ln, sm):
        gpu = compile_graph(import_model(model))
        assert len(gpu.kernels) == 1, [k.ops for k in gpu.kernels]
        assert gpu.kernels[0].schedule.get("rows") and gpu.groups[-1].rows
        assert len(_kernels(model, precision="fp16")) == 1  # f16 storage and arithmetic: row kernels too
        assert len(_kernels(model, device_class="cpu")) == 3
        assert len(_kernels(model, target="webgpu,wasm")) == 3
    # a reduction whose result is also a graph output is not fused away
    assert len(_kernels(make_model("ReduceMax", {"x": x}, {"axes": [1], "keepdims": 1}, opset=13))) == 1


def test_row_kernel_in_the_browser(tmp_path, rng):
    """LayerNormalization then Softmax, one row kernel (workgroup barriers inside its row loops), through Chromium's
    shader compiler (stricter uniformity analysis than naga) and kiln.js (tests/browser.py's shared page, poisoned
    buffers), against onnxruntime."""
    import onnx
    import onnxruntime as ort
    from browser import close_shared_runner, shared_runner
    from onnx import TensorProto, helper, numpy_helper

    import kiln

    g = helper.make_graph([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5),
                           helper.make_node("Softmax", ["y"], ["z"], axis=-1)], "ln_softmax",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 200])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [6, 200])],
                          [numpy_helper.from_array(rng.standard_normal(200).astype(np.float32), "g"),
                           numpy_helper.from_array(rng.standard_normal(200).astype(np.float32), "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "ln.onnx")
    x = (rng.standard_normal((6, 200)) * 3).astype(np.float32)
    runner = shared_runner()
    try:
        pkg = kiln.compile(tmp_path / "ln.onnx", runner.package_dir("ln_softmax"))  # device class gpu: a row kernel
        assert len(json.loads((pkg / "manifest.json").read_text())["targets"]["webgpu"]["kernels"]) == 1
        got = runner.run(pkg, {"x": x}, "webgpu")["z"]
    finally:
        close_shared_runner()  # its Playwright must not overlap the browser fixture's in later modules
    want = ort.InferenceSession(str(tmp_path / "ln.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def _gqa(s, past, attrs: dict, rotary: bool = False, heads: int = 4, kv: int = 2, hd: int = 16):
    """A GroupQueryAttention (com.microsoft) node; ``s``/``past`` are sizes or dim names."""
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info("q", f, [1, s, heads * hd]), helper.make_tensor_value_info("k", f, [1, s, kv * hd]),
           helper.make_tensor_value_info("v", f, [1, s, kv * hd]),
           helper.make_tensor_value_info("past_key", f, [1, kv, past, hd]),
           helper.make_tensor_value_info("past_value", f, [1, kv, past, hd]),
           helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
           helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])]
    names = ["q", "k", "v", "past_key", "past_value", "seqlens_k", "total_sequence_length"]
    inits = []
    if rotary:
        ang = np.arange(2048)[:, None] * 10000.0 ** (-np.arange(0, hd, 2) / hd)[None]
        inits = [helper.make_tensor(n, f, list(ang.shape), fn(ang).astype(np.float32).ravel())
                 for n, fn in (("cos", np.cos), ("sin", np.sin))]
        names += ["cos", "sin"]
    node = helper.make_node("GroupQueryAttention", names, ["out", "present_key", "present_value"], domain="com.microsoft",
                            num_heads=heads, kv_num_heads=kv, do_rotary=int(rotary), **attrs)
    graph = helper.make_graph([node], "gqa", ins, [helper.make_tensor_value_info(n, f, None)
                                                   for n in ("out", "present_key", "present_value")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model


def _gqa_feeds(rng, s, past, heads=4, kv=2, hd=16):
    return {"q": rng.standard_normal((1, s, heads * hd)).astype(np.float32),
            "k": rng.standard_normal((1, s, kv * hd)).astype(np.float32),
            "v": rng.standard_normal((1, s, kv * hd)).astype(np.float32),
            "past_key": rng.standard_normal((1, kv, past, hd)).astype(np.float32),
            "past_value": rng.standard_normal((1, kv, past, hd)).astype(np.float32),
            "seqlens_k": np.array([past + s - 1], np.int32), "total_sequence_length": np.array(past + s, np.int32)}


@pytest.mark.parametrize("s,past,attrs,rotary,hd", [
    (1, 7, {}, True, 16),                                       # a decode step, RoPE applied to the query in the kernel
    (1, 40, {"local_window_size": 3, "softcap": 5.0}, False, 16),  # sliding window, soft cap
    (2, 3, {"smooth_softmax": 1, "scale": 0.3}, False, 16),      # two query rows a head, the sink's extra logit
    (1, 21, {}, False, 24),  # STAGE_LANES set to 16 below, a head width no multiple of it: a lane a key in the stage
])
def test_attention_is_one_row_kernel(tmp_path, rng, monkeypatch, s, past, attrs, rotary, hd):
    """Attention over static shapes with few query rows (kiln.passes.fusion.fuse_attention): QK^T, the mask, the
    softmax and P V in one row kernel (the scores staged in workgroup memory, kiln.te.rows: a group of STAGE_LANES
    lanes a key where the head's width allows, else a lane a key), against onnxruntime with NaN-poisoned buffers."""
    import onnxruntime as ort

    import kiln
    from kiln.package.writer import write_package
    from kiln.te import rows

    if hd == 24:  # (onnxruntime's GroupQueryAttention takes head widths that are multiples of 8 only)
        monkeypatch.setattr(rows, "STAGE_LANES", 16)
    model = _gqa(s, past, attrs, rotary, hd=hd)
    feeds = _gqa_feeds(rng, s, past, hd=hd)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    compiled = compile_graph(import_model(model), "webgpu", device_class="gpu")
    fused = [k for k in compiled.kernels if k.ops.count("MatMul") == 2]
    assert len(fused) == 1 and fused[0].schedule.get("rows") and "ReduceMax" in fused[0].ops, \
        [k.ops for k in compiled.kernels]
    assert ("var<workgroup> stp" in fused[0].source) == (hd % rows.STAGE_LANES == 0)  # (the stage's partial sums)
    got = kiln.load(write_package(compiled, tmp_path / "pkg"), poison=True).run(feeds)
    for name, w in zip(("out", "present_key", "present_value"), want):
        np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-5, err_msg=name)


def test_attention_alternative_runs_where_it_is_faster(tmp_path, rng):
    """Over run-time dims the one-kernel attention is the plan's alternative to the three kernels it fuses
    (kiln.codegen.webgpu.build.alternative_range): it runs for one query token and at most MAX_FUSED_KEYS keys, the
    three everywhere else, each step of the other set with no workgroups. Decode steps on both sides of the key bound
    and a prefill, against onnxruntime, natively with poisoned buffers."""
    import onnxruntime as ort

    import kiln
    from kiln.codegen.webgpu.build import MAX_FUSED_KEYS
    from kiln.package.writer import write_package
    from kiln.runtime.dynamic import StepSizes

    model = _gqa("S", "P", {}, rotary=True)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    compiled = compile_graph(import_model(model, dims={"S": (1, 8), "P": (0, MAX_FUSED_KEYS + 64)}), "webgpu")
    session = kiln.load(write_package(compiled, tmp_path / "pkg"), poison=True)
    plan = session.manifest["targets"]["webgpu"]["plan"]
    sizes = StepSizes(plan, "groups")

    def running(s, past):
        _, counts = sizes.dispatches({"S": s, "P": past})
        return [session.manifest["targets"]["webgpu"]["kernels"][st["kernel"]]["ops"] for st, c in zip(plan, counts)
                if c[0]]

    def attention_kernels(s, past):
        return [ops for ops in running(s, past) if "ReduceMax" in ops or "MatMul" in ops]

    assert [ops.count("MatMul") for ops in attention_kernels(1, 7)] == [2]  # the one kernel
    assert sorted(ops.count("MatMul") for ops in attention_kernels(1, MAX_FUSED_KEYS)) == [0, 1, 1]  # one key more: three
    assert sorted(ops.count("MatMul") for ops in attention_kernels(5, 7)) == [0, 1, 1]  # a prefill: three
    for s, past in ((1, 7), (1, MAX_FUSED_KEYS - 1), (1, MAX_FUSED_KEYS + 20), (5, 7), (1, 0)):
        feeds = _gqa_feeds(rng, s, past)
        got = session.run(feeds)
        for name, w in zip(("out", "present_key", "present_value"), ref.run(None, feeds)):
            np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-5, err_msg=f"{name} at S={s}, P={past}")


def _encoder_attention(heads: int, seq: int, hd: int):
    """An encoder's attention over static shapes: ``softmax(q k^T / sqrt(hd) + mask) v``, q, k, v ``[1, heads, seq,
    hd]``, an additive key mask ``[1, 1, 1, seq]``."""
    from onnx import TensorProto, helper, numpy_helper

    n = helper.make_node
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [n("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), n("MatMul", ["q", "kt"], ["s"]),
         n("Mul", ["s", "scale"], ["ss"]), n("Add", ["ss", "mask"], ["sm"]), n("Softmax", ["sm"], ["p"], axis=-1),
         n("MatMul", ["p", "v"], ["out"])], "enc",
        [helper.make_tensor_value_info(x, f, [1, heads, seq, hd]) for x in ("q", "k", "v")] +
        [helper.make_tensor_value_info("mask", f, [1, 1, 1, seq])],
        [helper.make_tensor_value_info("out", f, [1, heads, seq, hd])],
        [numpy_helper.from_array(np.array(hd ** -0.5, np.float32), "scale")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _encoder_feeds(rng, heads: int, seq: int, hd: int) -> dict[str, np.ndarray]:
    feeds = {x: rng.standard_normal((1, heads, seq, hd)).astype(np.float32) for x in ("q", "k", "v")}
    mask = np.zeros((1, 1, 1, seq), np.float32)
    mask[..., seq * 3 // 4:] = -1e9  # (a padded tail)
    return {**feeds, "mask": mask}


@pytest.mark.parametrize("heads,seq,hd,subgroups", [(3, 87, 16, True), (3, 87, 16, False), (1, 509, 256, True)])
def test_encoder_attention_takes_several_rows_a_workgroup(tmp_path, rng, heads, seq, hd, subgroups):
    """An encoder's attention, more query rows than MAX_STAGED_ROWS over static shapes but few times their keys
    (kiln.te.rows.MAX_STAGED_WORK): one row kernel whose workgroups compute ATTENTION_ROW_LANES-lane rows side by
    side, each in its own part of the workgroup arrays, the last workgroup's spare rows clamped (3 x 87 rows, 4 a
    workgroup); with 509 keys of 256 wide, 4 rows' scores and queries would not fit the workgroup memory, so 2 rows
    of 128 lanes. Both
    lane-combine forms, against onnxruntime with NaN-poisoned buffers. Past MAX_STAGED_WORK the three kernels stay."""
    import onnxruntime as ort

    import kiln
    from kiln.package.writer import write_package
    from kiln.te import rows
    from kiln.te.schedule import ATTENTION_ROW_LANES

    lanes = ATTENTION_ROW_LANES if hd < 256 else 2 * ATTENTION_ROW_LANES
    assert heads * seq > rows.MAX_STAGED_ROWS and heads * seq % (256 // lanes)
    model = _encoder_attention(heads, seq, hd)
    compiled = compile_graph(import_model(model), "webgpu", device_class="gpu")
    assert len(compiled.kernels) == 1, [k.ops for k in compiled.kernels]
    schedule = compiled.kernels[0].schedule
    assert schedule["rows"] and schedule["workgroup_size"] == 256 and schedule["reduce_lanes"] == lanes
    session = kiln.load(write_package(compiled, tmp_path / "pkg"), poison=True, subgroups=subgroups)
    if subgroups and not session.subgroups:
        pytest.skip("this adapter runs no subgroup forms")
    for _ in range(2):
        feeds = _encoder_feeds(rng, heads, seq, hd)
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        np.testing.assert_allclose(session.run(feeds)["out"], want[0], rtol=1e-4, atol=1e-5)
    many = rows.MAX_STAGED_WORK // (128 * 128) + 1  # heads of 128 queries and keys: rows x keys past the bound
    assert len(compile_graph(import_model(_encoder_attention(8, 128, 16)), "webgpu").kernels) == 1
    assert len(compile_graph(import_model(_encoder_attention(many, 128, 16)), "webgpu").kernels) == 3


def test_attention_kernels_in_the_browser(tmp_path, rng):
    """The one-kernel attention through Chromium's shader compiler (Tint's uniformity analysis around its barriers) and
    kiln.js: over static shapes (a decode step's few rows, and an encoder's rows several a workgroup), and over run-time dims as the plan's alternative (kiln.js skips the steps whose
    workgroups are zero at the run's dims), a decode step on each side of the key bound and a prefill, against
    onnxruntime."""
    import onnxruntime as ort
    from browser import close_shared_runner, shared_runner

    from kiln.codegen.webgpu.build import MAX_FUSED_KEYS
    from kiln.package.writer import write_package

    runner = shared_runner()
    cases = []
    try:
        static = _gqa(1, 9, {"softcap": 4.0}, rotary=True)
        pkg = write_package(compile_graph(import_model(static), "webgpu"), runner.package_dir("gqa_static"))
        cases.append((static, pkg, 1, 9))
        dynamic = _gqa("S", "P", {}, rotary=True)
        pkg = write_package(compile_graph(import_model(dynamic, dims={"S": (1, 8), "P": (0, MAX_FUSED_KEYS + 64)}),
                                          "webgpu"), runner.package_dir("gqa_dynamic"))
        cases += [(dynamic, pkg, s, past) for s, past in ((1, 11), (1, MAX_FUSED_KEYS + 5), (4, 3))]
        encoder = _encoder_attention(3, 87, 16)  # (several rows a workgroup, the last one's spare rows clamped)
        pkg = write_package(compile_graph(import_model(encoder), "webgpu"), runner.package_dir("encoder_attention"))
        feeds = _encoder_feeds(rng, 3, 87, 16)
        want = ort.InferenceSession(encoder.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        np.testing.assert_allclose(runner.run(pkg, feeds, "webgpu")["out"], want[0], rtol=1e-4, atol=1e-5)
        for model, pkg, s, past in cases:
            feeds = _gqa_feeds(rng, s, past)
            got = runner.run(pkg, feeds, "webgpu")
            want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
            for name, w in zip(("out", "present_key", "present_value"), want):
                np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-5, err_msg=f"{name} at S={s}, P={past}")
    finally:
        close_shared_runner()


def test_decode_alternatives_of_a_llama_in_the_browser(tmp_path, rng):
    """A one-layer Llama GGUF (tests/test_fuzz_gguf.py's) compiled with the GPU fusions: a decode step runs the plan's
    alternatives (attention in one row kernel; RMSNorm's reduction inside the gate/up projection), a prefill the
    kernels they merge. In Chromium (kiln.js picks each step's kernel or none by the dims) the logits equal the
    native runtime's on the same package, both from a zero cache."""
    from browser import close_shared_runner, shared_runner
    from test_fuzz_gguf import tiny_llama

    import kiln
    from kiln.compiler import compile_model
    from kiln.runtime.dynamic import StepSizes

    runner = shared_runner()
    try:
        pkg = runner.package_dir("tiny_llama")
        compile_model(tiny_llama(tmp_path / "tiny.gguf"), pkg, max_context=32, device_class="gpu", target="webgpu")
        manifest = kiln.load(pkg).manifest
        plan = manifest["targets"]["webgpu"]["plan"]
        counts = StepSizes(plan, "groups").dispatches({"sequence": 1, "past_sequence": 5})[1]
        ran = [manifest["targets"]["webgpu"]["kernels"][s["kernel"]]["ops"] for s, c in zip(plan, counts) if c[0]]
        assert any(ops.count("MatMul") == 2 for ops in ran), ran  # the attention alternative
        assert any("ReduceMean" in ops and "MatMulNBits" in ops for ops in ran), ran  # the norm in the projection
        for s, past in ((1, 5), (3, 0)):
            feeds = {"input_ids": rng.integers(0, 8, (1, s)).astype(np.int64),
                     "past_sequence_length": np.array([past], np.int64)}
            want = kiln.load(pkg, poison=True).run(feeds)["logits"]
            got = runner.run(pkg, feeds, "webgpu")["logits"]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"sequence {s}, past {past}")
    finally:
        close_shared_runner()
