"""The WebAssembly target natively (wasmtime): per-op parity with onnxruntime, real models, threads, SIMD, errors.

The per-op tests here are a subset of tests/test_ops.py, test_ops_breadth.py and test_dtypes.py, run through
the same helper (``opcheck.check_op``) on the ``wasm`` target: the first case of every test function (so every
op family, including ones added later), plus the cases in :data:`OP_CASES` (every unary math function, since
those are the wasm target's own C, and the layouts the vectoriser treats differently). Every per-op test passes on wasm;
run them all with ``KILN_OP_TARGETS=webgpu,wasm python -m pytest tests/test_ops.py tests/test_ops_breadth.py
tests/test_dtypes.py`` (about 4 minutes on 2 cores).
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import opcheck
import pytest
import test_dtypes
import test_ops
import test_ops_breadth
from conftest import CHELSEA, MOBILENET, PPOCR_CASES, SHARED_MODELS

import kiln
from kiln.codegen.wasm import simd as c  # the C renderer with the SIMD128 vectoriser
from kiln.codegen.wasm import toolchain as wasm
from kiln.errors import KilnError, PackageError
from kiln.package.format import VERSION, write_manifest

T, B, D = test_ops, test_ops_breadth, test_dtypes

#: (test function, its arguments besides rng): a cross-section of every op family
OP_CASES = [
    *((T.test_unary, {"op": op}) for op in T.UNARY),
    *((B.test_unary_math, {"op": op}) for op in B.UNARY),
    (T.test_conv2d, {"case": T.CONV_CASES[0]}),  # 3x3 stride 2: gathers in vectors
    (T.test_conv2d, {"case": T.CONV_CASES[1]}),  # depthwise, padded: guarded whole-vector loads
    (T.test_conv2d, {"case": T.CONV_CASES[3]}),  # pointwise
    (T.test_conv2d, {"case": T.CONV_CASES[4]}),  # grouped
    (T.test_conv_auto_pad, {"auto_pad": "SAME_LOWER"}),
    (T.test_conv1d, {}),
    (B.test_conv_transpose, {"case": B.CONV_T[0]}),
    (T.test_gemm, {"case": T.GEMM_CASES[0]}),
    (T.test_gemm, {"case": T.GEMM_CASES[2]}),
    (T.test_matmul, {"sa": (2, 1, 3, 4), "sb": (5, 4, 2)}),
    (T.test_pool2d, {"case": T.POOL_CASES[0]}),
    (T.test_pool2d, {"case": T.POOL_CASES[4]}),
    (T.test_global_average_pool, {"shape": (1, 1280, 7, 7)}),
    (T.test_binary_broadcast, {"op": "Div", "shapes": T.BROADCASTS[-1]}),
    (T.test_pow, {}),
    (T.test_pow_negative_base_integral_exponent, {}),
    (T.test_clip_11_runtime_bounds, {}),
    (T.test_softmax_13, {"axis": 1}),
    (T.test_reduce, {"op": "ReduceMax", "axes": [0, 2], "keepdims": 0}),
    (T.test_transpose, {"perm": [2, 0, 1]}),
    (B.test_layer_normalization, {"axis": -1}),
    (B.test_reduce_composites, {"op": "ReduceLogSumExp", "axes": [1], "keepdims": 1}),
    (B.test_arg_reduce, {"op": "ArgMax", "axis": -1, "keepdims": 0, "last": 1}),
    (B.test_comparison, {"op": "LessOrEqual", "dtype": "int64"}),
    (B.test_logic, {"op": "Xor"}),
    (B.test_where_with_scalar_branch_and_int64, {}),
    (B.test_mod, {"fmod": 0}),
    (B.test_mod, {"fmod": 1}),
    (B.test_bitwise_and_integer_pow, {}),
    (B.test_bit_shift, {"direction": "RIGHT", "dtype": "uint8"}),
    (B.test_gather_runtime_data_and_indices, {"axis": -1}),
    (B.test_slice, {"case": B.SLICES[-1]}),
    (B.test_pad_modes, {"mode": "reflect"}),
    (B.test_resize, {"case": B.RESIZES[0]}),
    (B.test_cumsum, {"exclusive": 1, "reverse": 1}),
    (B.test_topk, {"largest": 0}),
    (B.test_scatter_elements, {"reduction": "max"}),
    (B.test_einsum, {"case": B.EINSUMS[0]}),
    (B.test_attention, {"causal": 1, "gqa": True, "mask": "float"}),
    (B.test_recurrent, {"kind": "LSTM", "direction": "bidirectional"}),
    (B.test_bitcast, {}),
    (B.test_quantize_dequantize_per_axis, {}),
    (D.test_cast_between_kernel_dtypes, {"src": "float32", "dst": "int8"}),
    (D.test_cast_between_kernel_dtypes, {"src": "bool", "dst": "float16"}),
    (D.test_integer_arithmetic_wraps_like_onnxruntime, {"dtype": "int8"}),
    (D.test_float16_computes_in_float32_rounded_at_kernel_boundaries, {}),
]


def _first_cases(*modules) -> list:
    """The first parametrization of every per-op test function of ``modules`` (those taking only ``rng``
    and their parameters): one case of every op family, found anew as tests are added."""
    import inspect

    out = []
    for module in modules:
        for name, fn in vars(module).items():
            if not name.startswith("test_") or not callable(fn) or fn.__module__ != module.__name__:
                continue
            kwargs = {}
            for mark in getattr(fn, "pytestmark", []):
                if mark.name == "parametrize":
                    names = [n.strip() for n in mark.args[0].split(",")] if isinstance(mark.args[0], str) \
                        else list(mark.args[0])
                    first = mark.args[1][0]
                    kwargs.update(zip(names, first if len(names) > 1 else [first]))
            if set(inspect.signature(fn).parameters) == {"rng", *kwargs}:
                out.append((fn, kwargs))
    return out


def _all_cases() -> list:
    cases = list(OP_CASES)
    seen = {(fn, repr(kw)) for fn, kw in cases}
    for fn, kw in _first_cases(T, B, D):
        if (fn, repr(kw)) not in seen:
            cases.append((fn, kw))
    return cases


def _case_id(case) -> str:
    fn, kwargs = case
    args = "-".join(str(v[0] if isinstance(v, tuple) else v) for v in kwargs.values())
    return fn.__name__.removeprefix("test_") + (f"[{args}]" if args else "")


CASES = _all_cases()


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_op_on_wasm(rng, monkeypatch, case):
    monkeypatch.setattr(opcheck, "TARGETS", ("wasm",))
    fn, kwargs = case
    fn(rng, **kwargs)


# ----------------------------------------------------------------------------- real models
IMAGES = ["chelsea", "coffee", "astronaut", "camera"]


@pytest.fixture(scope="module")
def mobilenet_wasm(mobilenet_package):
    return kiln.load(mobilenet_package, target="wasm", poison=True)


def test_mobilenet_reference_images(mobilenet_wasm, reference_npz):
    for name in IMAGES:
        logits = mobilenet_wasm.run({"input": reference_npz[f"{name}_input"]})["logits"]
        assert np.abs(logits - reference_npz[f"{name}_logits"]).max() <= 1e-3, name
        assert logits.argmax() == reference_npz[f"{name}_logits"].argmax()


def _ort(path, feeds):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_mobilenet_fresh_input_single_and_two_threads(mobilenet_package, mobilenet_wasm, rng):
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    expected = _ort(MOBILENET, {"input": x})[0]
    np.testing.assert_allclose(mobilenet_wasm.run({"input": x})["logits"], expected, atol=1e-4, rtol=0)
    threaded = kiln.load(mobilenet_package, target="wasm", threads=2, poison=True)
    try:
        assert threaded.adapter_info()["backend_type"] == "wasm (SIMD128, 2 threads)"
        np.testing.assert_allclose(threaded.run({"input": x})["logits"], expected, atol=1e-4, rtol=0)
    finally:
        threaded.close()


def trig_package(folder) -> tuple:
    """A wasm package (with its threaded module) of ``y = sin(x) + cos(x)`` over 2**18 float32 values, and an ``x``
    of [-3e4, 3e4], where libm's ``sinf``/``cosf`` reduce their arguments through a stack slot."""
    from onnx import TensorProto, helper

    n = 1 << 18
    graph = helper.make_graph(
        [helper.make_node("Sin", ["x"], ["s"]), helper.make_node("Cos", ["x"], ["c"]),
         helper.make_node("Add", ["s", "c"], ["y"])], "trig",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "trig.onnx")
    x = np.random.default_rng(5).uniform(-3e4, 3e4, n).astype(np.float32)
    return kiln.compile(folder / "trig.onnx", folder / "trig", target="wasm"), x


def without_worker_stacks(package, monkeypatch) -> None:
    """Rebuild ``package``'s threaded module as Kiln built it before each worker had a stack of its own (no
    ``kiln_worker_stack``), its manifest entries updated."""
    m = json.loads((package / "manifest.json").read_text())
    entry = m["targets"]["wasm"]["threads"]
    monkeypatch.setattr(wasm, "THREAD_FLAGS", [f for f in wasm.THREAD_FLAGS if "stack" not in f and "WORKER" not in f])
    memory = m["targets"]["wasm"]["memory"]
    module = wasm.compile_module((package / "kernels" / "kiln.c").read_text(), memory["pages"], True,
                                 memory.get("max_pages"))
    (package / entry["module"]).write_bytes(module)
    for e in [entry, *(f for f in m["files"] if f["path"] == entry["module"])]:
        e["bytes"], e["sha256"] = len(module), wasm.sha256(module)
    write_manifest(package, m)


def test_worker_threads_have_stacks_of_their_own(tmp_path, monkeypatch):
    """Every worker's instance of the threaded module starts with the same ``__stack_pointer``, so each runtime
    points it at the worker's own stack (``kiln_worker_stack``); with one shared stack, sines of large arguments
    came out wrong at random (a Whisper resampling filter's taps in Chromium). Too many threads for the module's
    stacks, or threads for a package whose threaded module has none, is a clear error."""
    pkg, x = trig_package(tmp_path)
    want = np.sin(x.astype(np.float64)) + np.cos(x.astype(np.float64))
    for threads in (1, 4):
        session = kiln.load(pkg, target="wasm", threads=threads)
        try:
            for _ in range(3):
                np.testing.assert_allclose(session.run({"x": x})["y"], want, atol=1e-6, rtol=0, err_msg=f"{threads}")
        finally:
            session.close()
    with pytest.raises(PackageError, match="stacks for fewer than 17 workers"):
        kiln.load(pkg, target="wasm", threads=wasm.WORKERS + 1)
    without_worker_stacks(pkg, monkeypatch)
    with pytest.raises(PackageError, match="no stack for each worker .*recompile the package, or load it with threads=1"):
        kiln.load(pkg, target="wasm", threads=2)
    np.testing.assert_allclose(kiln.load(pkg, target="wasm").run({"x": x})["y"], want, atol=1e-6, rtol=0)


def test_toolchain_warm_up_builds_both_variants():
    """``setup.sh`` warms zig's cache with :func:`~kiln.codegen.wasm.toolchain.warm_up`; its module's memory must hold
    the threaded variant's worker stacks (CI of c0801a3 failed there: wasm-ld's "initial memory too small")."""
    wasm.warm_up()


def test_mobilenet_kernels_are_vectorised(mobilenet_package):
    m = json.loads((mobilenet_package / "manifest.json").read_text())
    kernels = m["targets"]["wasm"]["kernels"]
    assert all(k["vectorized"] for k in kernels), [k["name"] for k in kernels if not k["vectorized"]]
    assert all(k["schedule"]["reduce_lanes"] == 1 for k in kernels)


def test_minilm_matches_onnxruntime(tmp_path):
    path = SHARED_MODELS / "all_minilm_l6_v2.onnx"
    with np.load(SHARED_MODELS / "reference" / "all_minilm_l6_v2_inputs.npz") as z:
        feeds = {k: z[k] for k in z.files}
    batch, seq = feeds["input_ids"].shape
    pkg = kiln.compile(path, tmp_path / "minilm", target="wasm", dims={"batch": batch, "seq": seq},
                       wasm_threads=False)
    hidden = kiln.load(pkg, target="wasm", poison=True).run(feeds)["last_hidden_state"]
    np.testing.assert_allclose(hidden, _ort(path, feeds)[0], atol=1e-4, rtol=0)


@pytest.mark.parametrize("name,shape,dims", PPOCR_CASES)
def test_ppocr_models_match_onnxruntime(tmp_path, rng, name, shape, dims):
    path = SHARED_MODELS / f"{name}.onnx"
    x = rng.uniform(-1, 1, size=shape).astype(np.float32)
    pkg = kiln.compile(path, tmp_path / "pkg", target="wasm", dims=dims, wasm_threads=False)
    got = list(kiln.load(pkg, target="wasm", poison=True).run({"x": x}).values())
    for g, e in zip(got, _ort(path, {"x": x})):
        np.testing.assert_allclose(g, e, atol=1e-4, rtol=0)


# ----------------------------------------------------------------------------- codegen
def test_conv_kernel_uses_simd128_and_no_stack(mobilenet_package, tmp_path):
    """The C of a package compiles to v128 loads and f32x4 arithmetic, and never touches the stack
    pointer: a kernel's values stay in wasm locals (registers), never in linear memory."""
    src = (mobilenet_package / "kernels" / "kiln.c").read_text()
    kernels = src[len(c.PRELUDE):].split("\n// ")
    conv = next(k for k in kernels if k.split("\n", 1)[0].endswith(", 144, 56, 56]") and "KILN_EXPORT" in k)
    (tmp_path / "k.c").write_text(c.PRELUDE + "\n// " + conv)  # a convolution (with bias and clip)
    flags = [f for f in wasm.CFLAGS if not f.startswith("-Wl") and f != "-s"]
    subprocess.run(wasm._zig() + ["cc", *flags, "-S", "-g0", "-o", str(tmp_path / "k.s"), str(tmp_path / "k.c")],
                   check=True, capture_output=True)
    asm = (tmp_path / "k.s").read_text(errors="replace")
    body = [line for line in asm.splitlines() if line.startswith("\t") and not line.startswith("\t.")]
    assert any("v128.load" in line for line in body) and any("f32x4.mul" in line for line in body)
    assert not any("__stack_pointer" in line for line in body)


def test_wasm_products_unroll_less_than_the_cpu_targets():
    """A long reduction unrolls by its largest divisor up to ``WASM_UNROLL`` (3) on wasm, up to 8 on cpu; windows of
    up to 9 iterations unroll whole on both."""
    from kiln.arith.expr import reduce, reduce_axis
    from kiln.codegen.cpu_schedule import cpu_schedule
    from kiln.te.compute import compute, placeholder
    from kiln.te.lower import lower

    a, b = placeholder((8, 96), "float32", name="a"), placeholder((96, 16), "float32", name="b")
    k = reduce_axis(96, "k")
    t = compute((8, 16), lambda i, j: reduce("sum", a[i, k] * b[k, j], [k]), "matmul")
    s = wasm.wasm_schedule(t)
    assert wasm.WASM_UNROLL == 3 and s.unroll == 3 and cpu_schedule(t, 8).unroll == 8
    src, _ = c.render(lower(t, s), "f", wasm.grid_shape(t.shape, s))
    assert "< 32;" in src and "< 96;" not in src and "< 12;" not in src  # 96 iterations: 32 rounds of 3
    w = placeholder((4, 9), "float32", name="w")
    r = reduce_axis(9, "r")
    assert wasm.wasm_schedule(compute((4,), lambda i: reduce("sum", w[i, r], [r]), "window")).unroll == 9


def test_strided_reads_become_lane_gathers():
    from kiln.te.compute import compute, placeholder
    from kiln.te.lower import lower

    x = placeholder((3, 8), "float32", name="x")
    t = compute((8, 3), lambda i, j: x[j, i] * 2.0, "transpose")  # lanes along j read 8 floats apart
    k = lower(t, wasm.wasm_schedule(t))
    src, vectorised = c.render(k, "f", wasm.grid_shape(t.shape, k.schedule))
    assert vectorised and ("KILN_GATHER" in src or "wasm_f32x4_make(in0[" in src)


@pytest.mark.parametrize("target,lanes", [("wasm", 4), ("cpu", 8)])
def test_reductions_along_rows_run_on_simd_lanes(tmp_path, rng, target, lanes):
    """Sums that read rows along their axis but not along the output's (matrix products with their right operand
    transposed: a linear layer's, attention scores against keys; a row sum) are scheduled ``simd_reduce``: their
    lanes split the reduction and are added after the loop (``hsum``); the values match onnxruntime, for output
    rows of a multiple of 4 (four a tile) and not, with a bias epilogue."""
    from onnx import TensorProto, helper, numpy_helper

    f = TensorProto.FLOAT
    nodes = [helper.make_node("Transpose", ["b"], ["bt"], perm=[1, 0]), helper.make_node("MatMul", ["a", "bt"], ["ab"]),
             helper.make_node("Add", ["ab", "bias"], ["y1"]),
             helper.make_node("ReduceSum", ["c", "axes"], ["y2"], keepdims=0),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), helper.make_node("MatMul", ["q", "kt"], ["y3"])]
    shapes = {"a": [3, 64], "b": [41, 64], "c": [5, 48], "q": [2, 3, 64], "k": [2, 40, 64]}
    graph = helper.make_graph(
        nodes, "rows", [helper.make_tensor_value_info(n, f, sh) for n, sh in shapes.items()],
        [helper.make_tensor_value_info(n, f, sh) for n, sh in (("y1", [3, 41]), ("y2", [5]), ("y3", [2, 3, 40]))],
        [numpy_helper.from_array(rng.standard_normal(41).astype(np.float32), "bias"),
         numpy_helper.from_array(np.array([1], np.int64), "axes")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "rows.onnx")
    pkg = kiln.compile(tmp_path / "rows.onnx", tmp_path / "pkg", target=target, device_class="cpu")
    section = json.loads((pkg / "manifest.json").read_text())["targets"][target]
    dot = {k["name"] for k in section["kernels"] if k["schedule"].get("simd_reduce") == lanes}
    assert len(dot) == 3 and any("matmul_add" in n for n in dot) and any("reducesum" in n for n in dot), dot
    assert all(k["vectorized"] for k in section["kernels"] if k["name"] in dot)  # (the lane loops as vectors)
    # two accumulators a sum (kiln.te.lower.SIMD_CHAINS) for its one output a tile (41 columns: no four-output tiles)
    source = (pkg / section["source"]).read_text()
    dot_kernel = next(n for n in dot if "matmul_add" in n)
    body = source.split(f"static void {dot_kernel}_v(")[1].split("\n}\n")[0]
    assert body.count("kv_f32_hsum(" if target == "cpu" else "kiln_f32x4_hsum(") == 2
    feeds = {n: rng.standard_normal(sh).astype(np.float32) for n, sh in shapes.items()}
    got = kiln.load(pkg, target=target, poison=True).run(feeds)
    want = ort.InferenceSession(str(tmp_path / "rows.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)
    for name, w in zip(("y1", "y2", "y3"), want):
        np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("target,lanes", [("wasm", 4), ("cpu", 8)])
def test_softmax_and_layernorm_are_one_row_kernel(tmp_path, rng, target, lanes):
    """On the C targets a Softmax or LayerNormalization along the innermost axis is one row kernel (a row a tile,
    vectors along it: kiln.te.cpu_rows) whose Softmax computes each ``exp`` once (stored in the row, divided there);
    rows of a multiple of the lanes, with a scalar tail, shorter than a vector, with axes of one element beside
    them, match onnxruntime. A Softmax over another axis stays three kernels."""
    from onnx import TensorProto, helper, numpy_helper

    shapes = {"a": [2, 3, 4 * lanes], "b": [2, 3, 4 * lanes + 3], "c": [5, 48], "d": [3, 2], "e": [1, 2, 1, 12],
              "f": [2, 8, 5]}
    nodes = [helper.make_node("Softmax", [x], [f"y{x}"], axis=-1) for x in "abde"]
    nodes += [helper.make_node("LayerNormalization", ["c", "g", "beta"], ["yc"], axis=-1, epsilon=1e-5),
              helper.make_node("Softmax", ["f"], ["yf"], axis=1)]
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "rows", [helper.make_tensor_value_info(n, f, sh) for n, sh in shapes.items()],
        [helper.make_tensor_value_info(f"y{n}", f, sh) for n, sh in shapes.items()],
        [numpy_helper.from_array(rng.standard_normal(48).astype(np.float32), n) for n in ("g", "beta")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "rows.onnx")
    pkg = kiln.compile(tmp_path / "rows.onnx", tmp_path / "pkg", target=target, device_class="cpu")
    section = json.loads((pkg / "manifest.json").read_text())["targets"][target]
    rows = [k for k in section["kernels"] if k["schedule"].get("rows")]
    assert sorted(k["ops"].count("ReduceMax") for k in rows) == [0, 1, 1, 1, 1]
    assert sum(k["vectorized"] for k in rows) >= 4  # (d's rows of 2 are shorter than a vector)
    assert sum("ReduceMean" in k["ops"] for k in rows) == 1
    assert any(k["name"].endswith("reducemax") and not k["schedule"].get("rows") for k in section["kernels"])  # (f)
    source = (pkg / section["source"]).read_text()
    exp, hmax = ("kv_f32_exp(", "kv_f32_hmax(") if target == "cpu" else ("kiln_f32x4_exp(", "kiln_f32x4_hmax(")
    bodies = [source.split(f"static void {k['name']}_v(")[1].split("\n}\n")[0] for k in rows
              if "Exp" in k["ops"] and k["vectorized"]]
    assert all(b.count(exp) <= 1 for b in bodies) and sum(hmax in b and exp in b for b in bodies) == 3  # (a, b, e)
    feeds = {n: (3 * rng.standard_normal(sh)).astype(np.float32) for n, sh in shapes.items()}
    got = kiln.load(pkg, target=target, poison=True).run(feeds)
    want = ort.InferenceSession(str(tmp_path / "rows.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)
    for n, w in zip(shapes, want):
        np.testing.assert_allclose(got[f"y{n}"], w, rtol=1e-5, atol=1e-6, err_msg=n)


@pytest.mark.parametrize("target", ["wasm", "cpu"])
def test_exp_within_an_ulp_in_vectors_and_scalar_tails(tmp_path, rng, target):
    """The C targets' exp (Cephes' expf, the prelude's kiln_expf and its vector twins): within 1.5 ulp of the exact
    value over float32's whole range (the vectors and a row's scalar tail alike: an odd length), subnormal results
    within one subnormal step, exactly 1, inf, 0 and NaN at 0, above 88.72, below -103.98 and for NaN."""
    from kiln.compiler import compile_graph
    from kiln.ir.graph import Builder, Graph, Value
    from kiln.package.writer import write_package

    n = 4 * 16384 + 3
    g = Graph(name="exp")
    x = Value("x", "float32", (n,))
    g.inputs.append(x)
    y = Builder(g).op("Exp", [x])
    y.name = "y"
    g.outputs = [y]
    write_package(compile_graph(g, target, validate=False, device_class="cpu"), tmp_path / "pkg")
    special = np.array([0.0, -0.0, 88.72, 88.73, -103.96, -104.0, 1e4, -1e4, np.inf, -np.inf, np.nan], np.float32)
    xs = np.concatenate([rng.uniform(-110, 90, n - len(special)).astype(np.float32), special])
    got = kiln.load(tmp_path / "pkg", target=target).run({"x": xs})["y"].astype(np.float64)
    want = np.exp(xs.astype(np.float64))
    normal = (want >= np.finfo(np.float32).tiny) & (want <= np.finfo(np.float32).max)
    ulp = np.spacing(want[normal].astype(np.float32)).astype(np.float64)
    assert (np.abs(got[normal] - want[normal]) / ulp).max() <= 1.5
    sub = (want > 0) & (want < np.finfo(np.float32).tiny)
    assert np.abs(got[sub] - want[sub]).max() <= np.finfo(np.float32).smallest_subnormal
    tail = got[-len(special):]
    np.testing.assert_array_equal(tail[[0, 1, 3, 5, 6, 7, 8, 9, 10]], [1, 1, np.inf, 0, np.inf, 0, np.inf, 0, np.nan])
    assert np.isfinite(tail[2]) and 0 < tail[4] < np.finfo(np.float32).tiny


# ----------------------------------------------------------------------------- package and errors
def test_manifest_wasm_section(mobilenet_package):
    m = json.loads((mobilenet_package / "manifest.json").read_text())
    assert m["version"] == VERSION  # the writer's version (wasm needs 1.2 or later)
    w = m["targets"]["wasm"]
    assert set(m["targets"]) == {"webgpu", "wasm"}
    assert (mobilenet_package / w["module"]).read_bytes()[:4] == b"\0asm"
    assert w["threads"] and (mobilenet_package / w["threads"]["module"]).exists()
    offsets = w["memory"]["offsets"]
    assert len(offsets) == len(m["buffers"]) and min(offsets) >= w["memory"]["arena"]
    spans = sorted((offsets[b["id"]], offsets[b["id"]] + b["bytes"]) for b in m["buffers"])
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # no two buffers overlap
    assert spans[-1][1] <= w["memory"]["bytes"] <= w["memory"]["pages"] * 65536
    for s in w["plan"]:
        assert len(s["buffers"]) == w["kernels"][s["kernel"]]["params"] and s["total"] > 0


def test_wasm_target_missing_or_corrupted_is_a_clear_error(mobilenet_package, tmp_path):
    webgpu_only = tmp_path / "webgpu_only"
    shutil.copytree(mobilenet_package, webgpu_only)
    m = json.loads((webgpu_only / "manifest.json").read_text())
    del m["targets"]["wasm"]
    write_manifest(webgpu_only, m)
    with pytest.raises(PackageError, match="no 'wasm' target"):
        kiln.load(webgpu_only, target="wasm")
    corrupt = tmp_path / "corrupt"
    shutil.copytree(mobilenet_package, corrupt)
    data = bytearray((corrupt / "kernels" / "kiln.wasm").read_bytes())
    data[-1] ^= 0xFF
    (corrupt / "kernels" / "kiln.wasm").write_bytes(bytes(data))
    with pytest.raises(PackageError, match="checksum mismatch"):
        kiln.load(corrupt, target="wasm")
    with pytest.raises(KilnError, match="unknown target 'wasm64'"):
        kiln.compile(MOBILENET, tmp_path / "x", target="webgpu,wasm64")


def test_cli_runs_the_wasm_target(mobilenet_package):
    from click.testing import CliRunner

    from kiln.cli import main

    r = CliRunner().invoke(main, ["run", str(mobilenet_package), "--target", "wasm", "--image", str(CHELSEA),
                                  "--repeat", "1", "--warmup", "0"])
    assert r.exit_code == 0, r.output
    assert "285  Egyptian cat" in r.output and "wasm (SIMD128, 1 thread)" in r.output
