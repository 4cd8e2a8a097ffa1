"""fp16 compute (``kiln compile --precision fp16``): the mixed-precision rewrite, the generated WGSL, the package,
per-op numerics natively on WebGPU (lavapipe has ``shader-f16``) against onnxruntime fp32, MobileNetV2 and MiniLM
against onnxruntime, and the browser runtime's clear error on an adapter without ``shader-f16`` (SwiftShader)."""

from __future__ import annotations

import functools
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from conftest import MOBILENET, SHARED_MODELS
from onnx import TensorProto, helper, numpy_helper
from opcheck import FP16, check_op, fp16_model, make_model

import kiln
from kiln.arith.expr import Bin, Reduce, binop, call, cast, reduce, reduce_axis, select
from kiln.cli import main as cli
from kiln.codegen.webgpu import wgsl
from kiln.errors import KilnError
from kiln.te.compute import compute, inline, placeholder
from kiln.te.half import demote
from kiln.te.lower import lower


@functools.lru_cache(maxsize=1)
def _f16_missing() -> str | None:
    from kiln.errors import DeviceError
    from kiln.runtime import gpu

    try:
        adapter = gpu.adapter()
    except DeviceError:
        return "no WebGPU adapter"
    if "shader-f16" not in adapter.features:
        return (f"adapter {adapter.info.get('device')} lacks shader-f16: fp16 numerics need a device with it "
                "(NVIDIA GPUs have it; run tests/test_fp16.py there)")
    return None


needs_f16 = pytest.mark.skipif(_f16_missing() is not None, reason=str(_f16_missing()))


def f32(rng, *shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


# ----------------------------------------------------------------------------- the rewrite (no device)
def _demoted(fn, *shapes, accumulate="float32"):
    """``fn`` over f16-stored placeholders (read widened to f32, as group_expr makes them), stored as f16, demoted."""
    ins = [placeholder(s, "float16", f"in{i}") for i, s in enumerate(shapes)]
    views = [compute(t.shape, lambda *i, t=t: cast(t[i], "float32")) for t in ins]
    out = fn(*views)
    return demote(inline(compute(out.shape, lambda *i: cast(out[i], "float16"))), accumulate)


def test_elementwise_arithmetic_moves_to_f16():
    t = _demoted(lambda a, b: compute(a.shape, lambda i: call("max", a[i] + b[i] * 2.0, 0.0)), (8,), (8,))
    assert t.dtype == "float16"
    assert t.body.dtype == "float16" and t.body.args[0].dtype == "float16"  # max(a + b * 2, 0) all in f16
    src = wgsl.render(lower(t))
    assert src.splitlines()[3] == "enable f16;" and "array<f16>" in src and "2.0h" in src and "f32" not in src


def test_fragile_ops_stay_f32_and_round_once_when_stored():
    t = _demoted(lambda a: compute(a.shape, lambda i: 1.0 / (1.0 + call("exp", -a[i])) * a[i]), (8,))
    src = wgsl.render(lower(t))
    assert "exp(f32(" in src and "1.0f / " in src  # sigmoid in f32 from the f16 load
    assert src.count("f16(") == 1 and ">= 65520.0f" in src  # one rounding at the store; overflow made +-inf


def test_comparisons_keep_inexact_thresholds_in_f32():
    t = _demoted(lambda a: compute(a.shape, lambda i: call("max", a[i], 0.3) + call("max", a[i], 0.5)), (8,))
    src = wgsl.render(lower(t))
    assert "max(v0, 0.5h)" in src and "0.300048828125h" in src  # max rounds its constant (not a comparison)
    t = _demoted(lambda a: compute(a.shape, lambda i: select(binop("<", a[i], 0.3), 1.0, 0.0)
                                   + select(binop("<", a[i], 0.5), 1.0, 0.0)), (8,))
    src = wgsl.render(lower(t))
    assert "(f32(v0) < 0.30000001192092896f)" in src and "(v0 < 0.5h)" in src


def _matmul(a, b):
    k = reduce_axis(a.shape[1])
    return compute((a.shape[0], b.shape[1]), lambda i, j: reduce("sum", a[i, k] * b[k, j], [k]))


def test_dot_products_accumulate_in_f32_or_f16():
    t = _demoted(_matmul, (4, 6), (6, 5))
    red = t.body.x.a  # cast(narrowable(sum), f16): sum * select(...)
    assert isinstance(red, Reduce) and red.dtype == "float32" and red.body.dtype == "float32"
    t16 = _demoted(_matmul, (4, 6), (6, 5), accumulate="float16")
    assert isinstance(t16.body, Reduce) and t16.body.dtype == "float16" and t16.body.body.dtype == "float16"
    assert "var acc0: f16 = 0.0h;" in wgsl.render(lower(t16))


@needs_f16
@pytest.mark.parametrize("accumulate", ["float32", "float16"])
def test_products_under_shared_tiles_load_f16_vectors(rng, accumulate):
    """A demoted MatMul under the default products' shared tiles (SHARED_WIDE, SHARED_MEDIUM) reads its f16 operands
    from storage as ``vec4<f16>`` (widened lane by lane into the f32 tiles, or kept f16 with f16 accumulation) and
    computes the product of the f16 operands to f16's precision."""
    from kiln.runtime.gpu import shared_device
    from kiln.runtime.kernel import KernelRunner
    from kiln.te.schedule import SHARED_MEDIUM, SHARED_WIDE

    shared_device(features=("shader-f16",))
    a, b = f32(rng, 72, 48).astype(np.float16), f32(rng, 48, 136).astype(np.float16)
    want = a.astype(np.float64) @ b.astype(np.float64)
    t = _demoted(_matmul, a.shape, b.shape, accumulate=accumulate)
    for tiles in (SHARED_WIDE, SHARED_MEDIUM):
        k = lower(t, tiles.schedule(0, 1))
        src = wgsl.render(k)
        assert k.schedule.shared_k and "in0: array<vec4<f16>>" in src and "in1: array<vec4<f16>>" in src, tiles
        assert "out: array<vec4<f16>>" in src, tiles  # (whole vectors of the tile's columns stored)
        got = KernelRunner(src, [a, b], want.size, k.dispatch, out_dtype=np.float16).run().reshape(want.shape)
        tol = 2e-3 if accumulate == "float32" else 1e-2
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max(), err_msg=str(tiles))


def test_statistics_accumulate_in_f32_even_with_f16_accumulation():
    def variance(a):
        k, k2 = reduce_axis(a.shape[1]), reduce_axis(a.shape[1])
        mean = compute((a.shape[0],), lambda i: reduce("sum", a[i, k], [k]) / 6.0)
        return compute((a.shape[0],), lambda i: reduce("sum", (a[i, k2] - mean[i]) * (a[i, k2] - mean[i]), [k2]))

    t = _demoted(variance, (4, 6), accumulate="float16")
    sums = []

    def visit(x):
        if isinstance(x, Reduce):
            sums.append(x)

    from kiln.arith.expr import transform

    transform(t.body, visit)
    assert sums and all(r.dtype == "float32" for r in sums)
    assert not any(isinstance(r.body, Bin) and r.body.dtype == "float16" for r in sums)


def test_f16_literals():
    assert wgsl.literal(0.1, "float16") == "0.0999755859375h"
    assert wgsl.literal(-2.0, "float16") == "(-2.0h)"
    with pytest.raises(ValueError, match="not finite"):
        wgsl.literal(1e6, "float16")


# ----------------------------------------------------------------------------- the package
def _tiny_model(path, rng, weight_shape=(3, 5)):
    w = f32(rng, *weight_shape)  # 15 elements: an odd-length f16 weight (30 bytes, buffer padded to 32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Sigmoid", ["h"], ["s"]),
         helper.make_node("MatMul", ["s", "w2"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 1])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(f32(rng, 5, 1), "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tiny")
    model = _tiny_model(tmp / "tiny.onnx", np.random.default_rng(0))
    return model, kiln.compile(model, tmp / "fp16", precision="fp16")


def test_manifest_records_precision_and_feature(tiny):
    _, pkg = tiny
    m = json.loads((pkg / "manifest.json").read_text())
    assert m["version"] == "1.14" and m["precision"] == "fp16"
    assert m["targets"]["webgpu"]["features"] == ["shader-f16"]
    weights = [b for b in m["buffers"] if b["kind"] == "weight"]
    assert {b["dtype"] for b in weights} == {"float16"} and {b["model_dtype"] for b in weights} == {"float32"}
    w = next(b for b in weights if b["tensor"] == "w")
    assert w["bytes"] == 32  # 15 halves, rounded up to WebGPU's 4 bytes
    assert [i["storage"] for i in m["inputs"] + m["outputs"]] == ["float32", "float32"]  # converted by kernels
    assert all(b["bytes"] % 4 == 0 for b in m["buffers"])
    from safetensors.numpy import load_file

    assert load_file(str(pkg / "weights.safetensors"))["w"].dtype == np.float16
    for k in m["targets"]["webgpu"]["kernels"]:
        assert "enable f16;" in (pkg / k["source"]).read_text()


def test_fp32_is_the_default_and_unchanged(tmp_path, rng):
    pkg = kiln.compile(_tiny_model(tmp_path / "t.onnx", rng), tmp_path / "fp32")
    m = json.loads((pkg / "manifest.json").read_text())
    assert m["precision"] == "fp32" and m["targets"]["webgpu"]["features"] == []
    assert all(b.get("dtype", "float32") == "float32" for b in m["buffers"] if b["kind"] == "weight")
    assert not any("f16" in (pkg / k["source"]).read_text() for k in m["targets"]["webgpu"]["kernels"])


def test_cli_compile_and_info(tiny, tmp_path):
    model, pkg = tiny
    r = CliRunner().invoke(cli, ["info", str(pkg)])
    assert r.exit_code == 0 and "precision: fp16" in r.output and "shader-f16" in r.output
    r = CliRunner().invoke(cli, ["compile", str(model), "-o", str(tmp_path / "p"), "--precision", "fp16-acc16"])
    assert r.exit_code == 0 and "precision fp16-acc16" in r.output, r.output
    r = CliRunner().invoke(cli, ["compile", "--help"])
    assert "--precision [fp32|fp16|fp16-acc16]" in r.output


def test_fp16_is_for_webgpu_and_inference_only(tiny, tmp_path):
    model, _ = tiny
    with pytest.raises(KilnError, match="webgpu target only"):
        kiln.compile(model, tmp_path / "a", precision="fp16", target="webgpu,wasm")
    with pytest.raises(KilnError, match="unknown precision 'fp8'"):
        kiln.compile(model, tmp_path / "b", precision="fp8")
    from kiln.train import TrainOptions

    with pytest.raises(KilnError, match="train-step packages"):
        kiln.compile(model, tmp_path / "c", precision="fp16", train=TrainOptions())


def test_weights_beyond_f16_range_stay_f32(tmp_path, rng):
    x = f32(rng, 2, 4)
    x[:, 1] = 0  # 0 * -3.4e38 is 0; with the weight rounded to f16's -inf it would be NaN
    big = np.array([[1.0, -3.4e38, 2.0, 0.5]], np.float32)  # a mask's "-inf" (torch.finfo(float32).min)
    model = make_model("Mul", {"x": x}, initializers={"m": big})
    onnx.save(fp16_wrapped := fp16_model(model), tmp_path / "m.onnx")
    pkg = kiln.compile(tmp_path / "m.onnx", tmp_path / "pkg", precision="fp16")
    m = json.loads((pkg / "manifest.json").read_text())
    assert next(b for b in m["buffers"] if b.get("tensor") == "m")["dtype"] == "float32"
    if _f16_missing() is None:
        got = kiln.load(pkg, poison=True).run({"x": x})
        expected = ort.InferenceSession(fp16_wrapped.SerializeToString()).run(None, {"x": x})
        np.testing.assert_allclose(got["y0"], expected[1], rtol=5e-3)


# ----------------------------------------------------------------------------- per-op numerics
@needs_f16
def test_runs_natively(tiny, rng):
    model, pkg = tiny
    x = f32(rng, 2, 3)
    expected = ort.InferenceSession(str(model)).run(None, {"x": x})[0]
    np.testing.assert_allclose(kiln.load(pkg, poison=True).run({"x": x})["y"], expected, rtol=5e-3, atol=5e-3)


OPS = [
    ("Conv_3x3_pad_bias", "Conv", lambda r: {"x": f32(r, 1, 4, 7, 7)},
     lambda r: {"w": f32(r, 6, 4, 3, 3), "b": f32(r, 6)}, {"pads": [1, 1, 1, 1]}),
    ("Conv_depthwise_s2", "Conv", lambda r: {"x": f32(r, 1, 6, 9, 9)},
     lambda r: {"w": f32(r, 6, 1, 3, 3)}, {"pads": [1, 1, 1, 1], "strides": [2, 2], "group": 6}),
    ("MatMul_runtime", "MatMul", lambda r: {"a": f32(r, 2, 5, 7), "b": f32(r, 7, 6)}, None, {}),
    ("Gemm_transB_bias", "Gemm", lambda r: {"a": f32(r, 3, 10)}, lambda r: {"b": f32(r, 4, 10), "c": f32(r, 4)},
     {"transB": 1}),
    ("Add_broadcast_odd", "Add", lambda r: {"a": f32(r, 3, 5), "b": f32(r, 5)}, None, {}),
    ("Mul", "Mul", lambda r: {"a": f32(r, 2, 7, lo=-3, hi=3), "b": f32(r, 2, 7, lo=-3, hi=3)}, None, {}),
    ("Div", "Div", lambda r: {"a": f32(r, 9), "b": f32(r, 9, lo=0.5, hi=2)}, None, {}),
    ("Clip", "Clip", lambda r: {"x": f32(r, 11, lo=-8, hi=8)}, lambda r: {"lo": np.float32(0), "hi": np.float32(6)},
     {}),
    ("Sigmoid", "Sigmoid", lambda r: {"x": f32(r, 13, lo=-6, hi=6)}, None, {}),
    ("Tanh", "Tanh", lambda r: {"x": f32(r, 13, lo=-3, hi=3)}, None, {}),
    ("Erf", "Erf", lambda r: {"x": f32(r, 13, lo=-3, hi=3)}, None, {}),
    ("Exp", "Exp", lambda r: {"x": f32(r, 13, lo=-4, hi=4)}, None, {}),
    ("Sqrt", "Sqrt", lambda r: {"x": f32(r, 13, lo=0.01, hi=9)}, None, {}),
    ("Softmax", "Softmax", lambda r: {"x": f32(r, 3, 17, lo=-5, hi=5)}, None, {"axis": -1}),
    ("LayerNormalization", "LayerNormalization", lambda r: {"x": f32(r, 2, 3, 16, lo=-3, hi=5)},
     lambda r: {"g": f32(r, 16), "beta": f32(r, 16)}, {"axis": -1, "epsilon": 1e-5}),
    ("ReduceMean", "ReduceMean", lambda r: {"x": f32(r, 3, 4, 25)}, None, {"axes": [2], "keepdims": 1}),
    ("ReduceMax", "ReduceMax", lambda r: {"x": f32(r, 3, 4, 5)}, None, {"axes": [1], "keepdims": 0}),
    ("MaxPool_pad", "MaxPool", lambda r: {"x": f32(r, 1, 3, 8, 8)}, None,
     {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ("AveragePool", "AveragePool", lambda r: {"x": f32(r, 1, 3, 8, 8)}, None, {"kernel_shape": [2, 2],
                                                                               "strides": [2, 2]}),
    ("GlobalAveragePool", "GlobalAveragePool", lambda r: {"x": f32(r, 1, 5, 7, 7)}, None, {}),
    ("Transpose", "Transpose", lambda r: {"x": f32(r, 2, 3, 5)}, None, {"perm": [2, 0, 1]}),
    ("Gather_int64_indices", "Gather", lambda r: {"x": f32(r, 7, 3)},
     lambda r: {"i": r.integers(0, 7, (2, 5)).astype(np.int64)}, {"axis": 0}),
    ("Where", "Where", lambda r: {"c": r.random((3, 4)) > 0.5, "a": f32(r, 3, 4), "b": f32(r, 4)}, None, {}),
    ("Less_bool_out", "Less", lambda r: {"a": f32(r, 3, 5), "b": f32(r, 3, 5)}, None, {}),
    ("Cast_to_int32", "Cast", lambda r: {"x": f32(r, 9, lo=-50, hi=50)}, None, {"to": TensorProto.INT32}),
    ("Add_int64_untouched", "Add", lambda r: {"a": r.integers(-1000, 1000, 7).astype(np.int64),
                                               "b": r.integers(-1000, 1000, 7).astype(np.int64)}, None, {}),
    ("Resize_linear", "Resize", lambda r: {"x": f32(r, 1, 2, 4, 5)},
     lambda r: {"roi": np.zeros(0, np.float32), "scales": np.array([1, 1, 2, 1.5], np.float32)}, {"mode": "linear"}),
]


@needs_f16
@pytest.mark.parametrize("case", OPS, ids=[c[0] for c in OPS])
def test_op_fp16(rng, case):
    _, op, inputs, inits, attrs = case
    check_op(op, inputs(rng), attrs, inits(rng) if inits else None, targets=(FP16,))


# ----------------------------------------------------------------------------- real models
IMAGES = ["chelsea", "coffee", "astronaut", "camera"]


@needs_f16
def test_mobilenet_v2_fp16_agrees_with_onnxruntime(tmp_path, reference_npz):
    x = np.concatenate([reference_npz[f"{n}_input"] for n in IMAGES])
    expected = np.concatenate([reference_npz[f"{n}_logits"] for n in IMAGES])
    pkg = kiln.compile(MOBILENET, tmp_path / "mnv2", precision="fp16", dims={"N": 4}, device_class="cpu")
    m = json.loads((pkg / "manifest.json").read_text())
    assert m["memory"]["weight_bytes"] < 7.5e6  # 3.5 M parameters at 2 bytes (13.9 MB in fp32)
    logits = kiln.load(pkg, poison=True).run({"input": x})["logits"]
    assert (logits.argmax(1) == expected.argmax(1)).all()
    err = np.abs(logits - expected)
    assert err.max() <= 0.01 * np.abs(expected).max(), err.max()  # measured 2.9e-3 of the largest logit
    assert err.mean() <= 0.05, err.mean()  # measured 0.012


@needs_f16
def test_minilm_fp16_embeddings_match_fp32(tmp_path):
    path = SHARED_MODELS / "all_minilm_l6_v2.onnx"
    with np.load(SHARED_MODELS / "reference" / "all_minilm_l6_v2_inputs.npz") as z:
        feeds = {k: z[k] for k in z.files}
    batch, seq = feeds["input_ids"].shape
    pkg = kiln.compile(path, tmp_path / "minilm", dims={"batch": batch, "seq": seq}, precision="fp16",
                       device_class="cpu")
    hidden = kiln.load(pkg, poison=True).run(feeds)["last_hidden_state"]
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert np.isfinite(hidden).all()
    mask = feeds["attention_mask"][..., None].astype(np.float32)
    emb, ref = (hidden * mask).sum(1) / mask.sum(1), (expected * mask).sum(1) / mask.sum(1)
    cos = np.sum(emb * ref, 1) / np.linalg.norm(emb, axis=1) / np.linalg.norm(ref, axis=1)
    assert cos.min() > 0.9995, cos
    assert np.abs(hidden - expected).max() <= 0.02 * np.abs(expected).max()
