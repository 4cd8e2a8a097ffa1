"""Shared operand tiles (``Schedule.shared_k``, :mod:`kiln.te.tiles`) compute the same numbers.

MatMul, batched MatMul, transposed Gemm and Conv kernels (with fused epilogues) are lowered under
shared-tile schedules of awkward sizes (M, N, K not multiples of the block or chunk, K smaller than a
chunk, factors of 3, every workgroup shape) and run natively with NaN-poisoned outputs against numpy /
the primitives' reference semantics; a kernel over run-time dims runs at several dim values; a small
ONNX model with shared-tile schedules runs against onnxruntime. Kernels that are not contractions
fall back to the plain lowering (recorded with ``shared_k`` 0).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.arith import symbolic
from kiln.codegen.webgpu import wgsl
from kiln.codegen.webgpu.validate import validate_wgsl
from kiln.ir import ops
from kiln.kernels import elementwise, layout, library
from kiln.runtime.kernel import KernelRunner
from kiln.te.compute import inline, placeholder
from kiln.te.lower import lower
from kiln.te.schedule import SHARED_SMALL, Schedule, Split, default_schedule, tile_axes
from kiln.te.tiles import analyse
from kiln.tune.space import SearchSpace

CONV = {"strides": (1, 1), "dilations": (1, 1), "pads": (1, 1, 1, 1), "group": 1}


def shared_schedules(rows: int, cols: int) -> dict[str, Schedule]:
    """Shared-tile schedules over output axes ``rows`` < ``cols``: every workgroup shape, every split layout
    (contiguous, strided, strided groups of 4)."""
    def s(wg, fa, fb, kc, unroll=1, ca=True, cb=False, vw=1, pf=False, ga=1, gb=1):
        return Schedule(workgroup_size=wg, splits=(Split(rows, fa, ca, ga), Split(cols, fb, cb, gb)), unroll=unroll,
                        shared_k=kc, vector_width=vw, prefetch=pf)

    return {
        "wg64_4x4_k8": s(64, 4, 4, 8, 4),
        "wg256_8x8_k8_unroll8_vec4": s(256, 8, 8, 8, 8, vw=4),
        "wg128_4x8_k16_strided_vec4": s(128, 4, 8, 16, 16, ca=False, cb=True, vw=4, pf=True),
        "wg32_2x4_k4_contiguous": s(32, 2, 4, 4, 2, cb=True),
        "wg64_3x2_k5_prefetch": s(64, 3, 2, 5, 5, pf=True),
        "wg256_8x8_k8_vec4_prefetch": s(256, 8, 8, 8, 8, vw=4, pf=True),
        "wg256_4x4_k16_vec4_both": s(256, 4, 4, 16, 1, cb=True, vw=4),
        "wg128_8x8_k8_grouped_vec4_prefetch": s(128, 8, 8, 8, 8, gb=4, vw=4, pf=True),  # SHARED_WIDE
        "wg64_8x8_k16_both_grouped_vec4": s(64, 8, 8, 16, 4, ca=False, ga=4, gb=4, vw=4),
    }


def _check(t, arrays, expected, sched, what, dims=None, groups=None, exact=True):
    """Run ``t`` under ``sched`` against ``expected``; ``exact``: every knob applies (none is recorded as off)."""
    k = lower(t, sched, name="k")
    assert k.schedule.shared_k == sched.shared_k and k.schedule.prefetch == sched.prefetch, f"{what}: fell back"
    src = wgsl.render(k)
    assert "var<workgroup> sh_p" in src and "workgroupBarrier()" in src
    if exact:
        assert k.schedule.vector_width == sched.vector_width, f"{what}: no vectors"
        assert ("vec4<f32>" in src) == (sched.vector_width == 4)
    validate_wgsl(src, what)
    dispatch = k.dispatch if groups is None else (groups, 1, 1)
    got = KernelRunner(src, arrays, expected.size, dispatch, dims=dims).run().reshape(expected.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4, err_msg=f"{what}: {sched}")
    return src


def _primitive(op, shapes, attrs, rng, epilogue=False):
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    (_, out_shape), = ops.get(op).infer([("float32", s) for s in shapes], attrs)
    expected = ops.get(op).evaluate(arrays, attrs)[0]
    t = library.build(op, [placeholder(s, name=f"x{i}") for i, s in enumerate(shapes)], attrs, out_shape, "k")
    if epilogue:  # per-channel bias and ReLU, as fusion makes them
        bias = rng.standard_normal((out_shape[1],) + (1,) * (len(out_shape) - 2)).astype(np.float32)
        t = elementwise.unary("Relu", elementwise.binary("Add", t, placeholder(bias.shape, name="b"), out_shape), {})
        arrays.append(bias)
        expected = np.maximum(expected + bias, 0)
    return inline(t), arrays, expected


@pytest.mark.parametrize("shapes", [[(37, 45), (45, 29)], [(13, 3), (3, 21)], [(1, 70), (70, 130)],
                                    [(36, 44), (44, 28)], [(8, 4), (4, 12)]],
                         ids=["awkward", "k_below_chunk", "one_row", "multiples_of_4", "k4_below_chunk"])
def test_matmul_under_shared_tiles(shapes, rng):
    t, arrays, expected = _primitive("MatMul", shapes, {}, rng)
    for name, sched in shared_schedules(0, 1).items():
        src = _check(t, arrays, expected, sched, name)
        # vec4 storage loads exactly where the walked extents are multiples of 4
        aligned = all(d % 4 == 0 for s in shapes for d in s)
        assert ("var<storage, read> in0: array<vec4<f32>>" in src) == (aligned and sched.vector_width == 4), name


def test_batched_broadcast_matmul(rng):
    t, arrays, expected = _primitive("MatMul", [(2, 1, 19, 17), (3, 17, 11)], {}, rng)
    for name in ("wg64_4x4_k8", "wg64_3x2_k5_prefetch"):
        _check(t, arrays, expected, shared_schedules(2, 3)[name], name)
    t, arrays, expected = _primitive("MatMul", [(2, 1, 20, 16), (3, 16, 12)], {}, rng)  # vec4 storage loads
    vec4_stores = ("wg128_4x8_k16_strided_vec4", "wg128_8x8_k8_grouped_vec4_prefetch")
    for name in ("wg256_8x8_k8_unroll8_vec4", *vec4_stores):
        src = _check(t, arrays, expected, shared_schedules(2, 3)[name], name)
        assert "read> in1: array<vec4<f32>>" in src
        # contiguous columns or groups of 4 (4 | 8, 4 | 12): the tile's outputs are stored as whole vec4
        assert ("out: array<vec4<f32>>" in src) == (name in vec4_stores)


def test_transposed_gemm_with_epilogue(rng):
    """Gemm(transA=1, transB=1) as the frontend builds it: transposes inlined into the MatMul, bias after."""
    a, b = rng.standard_normal((23, 18)).astype(np.float32), rng.standard_normal((31, 23)).astype(np.float32)
    c = rng.standard_normal((31,)).astype(np.float32)
    pa, pb, pc = placeholder(a.shape, name="a"), placeholder(b.shape, name="b"), placeholder(c.shape, name="c")
    at, bt = layout.transpose(pa, [1, 0], (18, 23), "at"), layout.transpose(pb, [1, 0], (23, 31), "bt")
    t = inline(elementwise.binary("Add", library.build("MatMul", [at, bt], {}, (18, 31), "mm"), pc, (18, 31)))
    for name, sched in shared_schedules(0, 1).items():
        _check(t, [a, b, c], a.T @ b.T + c, sched, name)
    # aligned: A^T is loaded along rows (i) and B^T along the reduction, both as vec4
    a, b = rng.standard_normal((24, 20)).astype(np.float32), rng.standard_normal((32, 24)).astype(np.float32)
    c = rng.standard_normal((32,)).astype(np.float32)
    pa, pb, pc = placeholder(a.shape, name="a"), placeholder(b.shape, name="b"), placeholder(c.shape, name="c")
    at, bt = layout.transpose(pa, [1, 0], (20, 24), "at"), layout.transpose(pb, [1, 0], (24, 32), "bt")
    t = inline(elementwise.binary("Add", library.build("MatMul", [at, bt], {}, (20, 32), "mm"), pc, (20, 32)))
    src = _check(t, [a, b, c], a.T @ b.T + c, Schedule(
        workgroup_size=64, splits=(Split(0, 4, True), Split(1, 4)), unroll=8, shared_k=8, vector_width=4), "aligned")
    assert src.count("array<vec4<f32>>;") == 2


@pytest.mark.parametrize("case", ["conv1x1", "conv3x3_stride2"])
def test_conv_as_implicit_gemm(case, rng):
    shapes, attrs = {"conv1x1": ([(2, 12, 5, 7), (10, 12, 1, 1)], {**CONV, "pads": (0, 0, 0, 0)}),
                     "conv3x3_stride2": ([(1, 5, 11, 10), (9, 5, 3, 3)],
                                         {**CONV, "strides": (2, 2), "pads": (0, 1, 1, 0)})}[case]
    t, arrays, expected = _primitive("Conv", shapes, attrs, rng, epilogue=True)
    for name, sched in shared_schedules(1, 3).items():
        _check(t, arrays, expected, sched, f"{case}/{name}")


def test_run_time_dims(rng):
    """MatMul [seq, k] x [k, n] with run-time seq and k: one kernel, every value in bounds."""
    seq, kd = symbolic.size_var("seq", 0, 1, 64, 32), symbolic.size_var("k", 1, 1, 40, 16)
    t = inline(library.build("MatMul", [placeholder((seq, kd)), placeholder((kd, 27))], {}, (seq, 27), "mm"))
    sched = Schedule(workgroup_size=64, splits=(Split(0, 4, True), Split(1, 4)), unroll=4, shared_k=8)
    groups = lower(t, sched).groups
    for s, k in ((1, 1), (7, 16), (33, 5), (64, 40)):
        a, b = rng.standard_normal((s, k)).astype(np.float32), rng.standard_normal((k, 27)).astype(np.float32)
        n = symbolic.evaluate(groups, {"seq": s, "k": k})
        _check(t, [a, b], a @ b, sched, f"seq={s} k={k}", dims=np.array([s, k], np.int32), groups=n)
    # 28 columns: B loaded and the output stored as vec4 (B's rows and the run-time seq stay exact at the edges)
    t = inline(library.build("MatMul", [placeholder((seq, kd)), placeholder((kd, 28))], {}, (seq, 28), "mm"))
    sched = Schedule(workgroup_size=64, splits=(Split(0, 4, True), Split(1, 4, True)), unroll=4, shared_k=8,
                     vector_width=4, prefetch=True)
    k = lower(t, sched)
    assert k.vectors == {"sh_p": 4, "sh_q": 4, "in1": 4, "out": 4}
    for s, kv in ((1, 1), (7, 16), (33, 5), (64, 40)):
        a, b = rng.standard_normal((s, kv)).astype(np.float32), rng.standard_normal((kv, 28)).astype(np.float32)
        n = symbolic.evaluate(k.groups, {"seq": s, "k": kv})
        _check(t, [a, b], a @ b, sched, f"vec4 seq={s} k={kv}", dims=np.array([s, kv], np.int32), groups=n)


def test_non_contractions_fall_back(rng):
    """Grouped convolution (the input factor varies with the output channel), a max reduction and a
    too-large block are lowered without shared tiles, and still right."""
    grouped, arrays, expected = _primitive("Conv", [(1, 8, 9, 9), (6, 4, 3, 3)], {**CONV, "group": 2}, rng)
    sched = Schedule(workgroup_size=64, splits=(Split(1, 2), Split(3, 4)), shared_k=8)
    assert "vary along exactly one" in analyse(grouped, sched)
    k = lower(grouped, sched)
    assert k.schedule.shared_k == 0 and "sh_p" not in wgsl.render(k)
    got = KernelRunner(wgsl.render(k), arrays, expected.size, k.dispatch).run().reshape(expected.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    mm = inline(library.build("MatMul", [placeholder((64, 64)), placeholder((64, 64))], {}, (64, 64), "mm"))
    big = Schedule(workgroup_size=256, splits=(Split(0, 8), Split(1, 8)), shared_k=32)
    assert "bytes of workgroup memory" in analyse(mm, big) and lower(mm, big).schedule.shared_k == 0
    # vec4 needs a contiguous split with a factor divisible by 4 (workgroup-memory reads) or extents that are
    # multiples of 4 (storage loads): otherwise it is recorded as 1
    odd = Schedule(workgroup_size=64, splits=(Split(0, 2, True), Split(1, 4)), shared_k=8, vector_width=4)
    k = lower(mm, odd)
    assert k.schedule.vector_width == 4 and k.vectors == {"in0": 4, "in1": 4}
    mm30 = inline(library.build("MatMul", [placeholder((30, 30)), placeholder((30, 30))], {}, (30, 30), "mm"))
    assert lower(mm30, odd).schedule.vector_width == 1
    assert lower(mm, Schedule(splits=(Split(0, 4, True),), vector_width=4)).schedule.vector_width == 1
    with pytest.raises(ValueError, match="shared_k"):
        Schedule(workgroup_size=64, reduce_lanes=4, shared_k=8)


def test_schedule_json_and_search_space():
    s = Schedule(workgroup_size=256, splits=(Split(0, 8, True), Split(1, 8)), unroll=8, shared_k=8)
    assert s.to_json()["shared_k"] == 8 and Schedule.from_json(s.to_json()) == s
    assert "shared_k" not in Schedule().to_json()  # manifests of other schedules unchanged
    v = Schedule(workgroup_size=64, splits=(Split(0, 4, True), Split(1, 4)), shared_k=8, vector_width=4, prefetch=True)
    assert v.to_json()["vector_width"] == 4 and v.to_json()["prefetch"] is True and Schedule.from_json(v.to_json()) == v
    with pytest.raises(ValueError, match="prefetch"):
        Schedule(prefetch=True)
    with pytest.raises(ValueError, match="vector_width"):
        Schedule(vector_width=3)
    mm = inline(library.build("MatMul", [placeholder((96, 80)), placeholder((80, 72))], {}, (96, 72), "mm"))
    space = SearchSpace(mm)
    picked = [c for c in space if c.shared_k]
    assert picked and all(space.check(c) is None for c in picked) and any(c.vector_width == 4 for c in picked)
    assert any(c.prefetch for c in picked)
    assert SearchSpace(mm, lanes=False).shared == (0,)  # CPU adapters: no barriers
    big = inline(library.build("MatMul", [placeholder((4096, 4096)), placeholder((4096, 4096))], {}, (4096, 4096),
                               "gemm"))
    assert default_schedule(big, device_class="cpu").shared_k == 0
    assert SearchSpace(big).check(default_schedule(big)) is None


def test_every_tuner_pick_is_correct(rng):
    """Every shared-tile schedule the tuner's space holds for a small awkward MatMul (a sample of them)."""
    t, arrays, expected = _primitive("MatMul", [(21, 19), (19, 26)], {}, rng)
    picked = [c for c in SearchSpace(t) if c.shared_k]
    for sched in picked[::max(1, len(picked) // 12)]:
        _check(t, arrays, expected, sched, "tuner", exact=False)


#: (a, b, x) shapes of the Gemm + Conv model: awkward, and multiples of 4 (vec4 loads and stores)
MODEL_SHAPES = {"awkward": ((19, 10), (17, 19), (1, 3, 9, 11)), "aligned": ((20, 12), (16, 20), (1, 4, 8, 12))}


def _gemm_conv_package(tmp_path, rng, shapes, out=None):
    """Gemm(transA, transB, bias) and a padded Conv + Relu in one model, compiled (into ``out``, default
    ``tmp_path / "pkg"``) with shared tiles (vec4, prefetch) wherever a kernel has two tile axes; returns
    (package, model, feeds)."""
    f = np.float32
    (sa, sb, sx) = shapes
    cout = 6
    w = rng.standard_normal((cout, sx[1], 3, 3)).astype(f)
    cb = rng.standard_normal(cout).astype(f)
    gc = rng.standard_normal(sb[0]).astype(f)
    n = helper.make_node
    nodes = [n("Gemm", ["a", "b", "gc"], ["g"], transA=1, transB=1),
             n("Conv", ["x", "w", "cb"], ["c0"], pads=[1, 1, 1, 1]), n("Relu", ["c0"], ["c"])]
    graph = helper.make_graph(
        nodes, "shared", [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(sa)),
                          helper.make_tensor_value_info("b", TensorProto.FLOAT, list(sb)),
                          helper.make_tensor_value_info("x", TensorProto.FLOAT, list(sx))],
        [helper.make_tensor_value_info("g", TensorProto.FLOAT, [sa[1], sb[0]]),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, cout, *sx[2:]])],
        [numpy_helper.from_array(v, k) for k, v in {"w": w, "cb": cb, "gc": gc}.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "m.onnx"))

    def choose(t):
        axes = tile_axes(t)
        if len(axes) != 2:
            return default_schedule(t)
        return Schedule(workgroup_size=64, splits=(Split(axes[0], 4, True), Split(axes[1], 4, True)), unroll=4,
                        shared_k=8, vector_width=4, prefetch=True)

    pkg = kiln.compile(tmp_path / "m.onnx", out or tmp_path / "pkg", schedule=choose)
    kernels = json.loads((pkg / "manifest.json").read_text())["targets"]["webgpu"]["kernels"]
    assert sum(1 for k in kernels if k["schedule"].get("shared_k") == 8) == 2
    feeds = {"a": rng.standard_normal(sa).astype(f), "b": rng.standard_normal(sb).astype(f),
             "x": rng.standard_normal(sx).astype(f)}
    return pkg, model, feeds


def _reference(model, feeds) -> dict:
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip(("g", "c"), ref.run(["g", "c"], feeds)))


@pytest.mark.parametrize("shapes", sorted(MODEL_SHAPES))
def test_model_against_onnxruntime(tmp_path, rng, shapes):
    pkg, model, feeds = _gemm_conv_package(tmp_path, rng, MODEL_SHAPES[shapes])
    sources = "".join(p.read_text() for p in (pkg / "kernels").glob("*.wgsl"))
    assert ("array<vec4<f32>>" in sources) == (shapes == "aligned")
    got = kiln.load(pkg, poison=True).run(feeds)
    for name, want in _reference(model, feeds).items():
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-4, err_msg=name)


def test_model_in_the_browser(tmp_path, rng):
    """The aligned model's shared-tile kernels (vec4 storage and workgroup arrays, prefetch) through
    Chromium's shader compiler and kiln.js (tests/browser.py's shared page, poisoned buffers)."""
    from browser import close_shared_runner, shared_runner

    runner = shared_runner()
    try:
        pkg, model, feeds = _gemm_conv_package(tmp_path, rng, MODEL_SHAPES["aligned"], runner.package_dir("shared"))
        got = runner.run(pkg, feeds, "webgpu")
    finally:
        close_shared_runner()  # its Playwright must not overlap the browser fixture's in later modules
    for name, want in _reference(model, feeds).items():
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-4, err_msg=name)


def test_default_shared_tiles_with_run_time_dims(tmp_path, rng, monkeypatch):
    """The ``"medium"`` default (made to apply to a small model) through the whole compiler with a run-time
    seq: one package, shared tiles in the manifest, right at every seq in bounds (against onnxruntime)."""
    from kiln.te import schedule as schedule_module

    monkeypatch.setattr(schedule_module, "DEFAULT_SHARED_TILES", "medium")
    monkeypatch.setattr(schedule_module, "MEDIUM_GROUPS", 1)
    w = rng.standard_normal((72, 96)).astype(np.float32)
    b = rng.standard_normal(96).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y0"]), helper.make_node("Add", ["y0", "b"], ["y"])], "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "seq", 72])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, "seq", 96])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "m.onnx"))
    pkg = kiln.compile(tmp_path / "m.onnx", tmp_path / "pkg", dims={"seq": (1, 160, 128)})
    kernels = json.loads((pkg / "manifest.json").read_text())["targets"]["webgpu"]["kernels"]
    assert [k["schedule"].get("shared_k") for k in kernels] == [16]
    session = kiln.load(pkg, poison=True)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for seq in (1, 37, 160):
        x = rng.standard_normal((2, seq, 72)).astype(np.float32)
        np.testing.assert_allclose(session.run({"x": x})["y"], ref.run(["y"], {"x": x})[0], rtol=1e-4, atol=1e-4,
                                   err_msg=f"seq={seq}")


def test_epilogue_reads_a_vec4_operand(rng):
    """``A @ B + A``: the epilogue reads single elements of an input bound as ``array<vec4<f32>>``."""
    a, b = rng.standard_normal((36, 20)).astype(np.float32), rng.standard_normal((20, 20)).astype(np.float32)
    pa, pb = placeholder(a.shape, name="a"), placeholder(b.shape, name="b")
    t = inline(elementwise.binary("Add", library.build("MatMul", [pa, pb], {}, (36, 20), "mm"), pa, (36, 20)))
    sched = Schedule(workgroup_size=64, splits=(Split(0, 4, True), Split(1, 4, True)), unroll=4, shared_k=8,
                     vector_width=4, prefetch=True)
    src = _check(t, [a, b], a @ b + a, sched, "epilogue")
    assert "read> in0: array<vec4<f32>>" in src and "% 4i]" in src


def test_head_merged_operand_loads_vec4_along_the_reduction(rng):
    """Attention's output projection: ``[b, h, s, d]`` transposed to ``[b, s, h, d]`` and reshaped to ``[b, s, h *
    d]`` before the product. Its operand is contiguous along the reduction in runs of ``d``, so the default shared
    tiles load it as vec4 along ``k`` (the reshape's index per run of dims: ``[b, k // d, s, k % d]``), and the
    numbers are the product's."""
    b_, h, s_, d, n = 2, 3, 20, 8, 16
    x, w = rng.standard_normal((b_, h, s_, d)).astype(np.float32), rng.standard_normal((h * d, n)).astype(np.float32)
    px, pw = placeholder(x.shape, name="x"), placeholder(w.shape, name="w")
    merged = layout.reshape(layout.transpose(px, [0, 2, 1, 3], (b_, s_, h, d)), (b_, s_, h * d))
    t = inline(library.build("MatMul", [merged, pw], {}, (b_, s_, n), "mm"))
    want = x.transpose(0, 2, 1, 3).reshape(b_, s_, h * d) @ w
    src = _check(t, [x, w], want, SHARED_SMALL.schedule(1, 2), "head merge", exact=False)
    assert "read> in0: array<vec4<f32>>" in src  # (the unravelled flat offset read a float at a time, rows fastest)


def test_default_large_gemm_kernel_validates():
    """The default 4096^3 MatMul kernel (shared tiles under DEFAULT_SHARED_TILES) passes naga (not run here)."""
    g = inline(library.build("MatMul", [placeholder((4096, 4096)), placeholder((4096, 4096))], {}, (4096, 4096), "g"))
    k = lower(g, default_schedule(g))
    assert k.dispatch == ((4096 // 64 * 4096 // 128, 1, 1) if k.schedule.shared_k else k.dispatch)  # 64 x 128 blocks
    validate_wgsl(wgsl.render(k), "default 4096 MatMul")
