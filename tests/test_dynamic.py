"""Run-time dims (docs/dynamic-shapes.md): one package serves every value of a symbolic dim within its bounds.

Small ONNX models with ``batch`` and ``seq`` dims are compiled once each with ``dims={"batch": (1, 4), "seq":
(1, 16, 8)}`` and run natively (wgpu-py) with NaN-poisoned buffers on several shapes against onnxruntime;
MiniLM runs from one package on a subset of the acceptance grid (the full grid: tools/dynamic_minilm.py).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import SHARED_MODELS
from fuzzing import fuzz_settings
from hypothesis import given
from hypothesis import strategies as hs
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.arith import symbolic
from kiln.errors import KilnError, ShapeError
from kiln.package.format import VERSION
from kiln.runtime import dynamic
from kiln.runtime.dynamic import StepSizes, eval_json
from tools.dynamic_minilm import feeds as minilm_feeds

DIMS = {"batch": (1, 4), "seq": (1, 16, 8)}  # opt 8: schedules for seq=8 must also be right for 1, 7, 16
SHAPES = [(1, 1), (2, 7), (3, 16), (4, 9)]


def _model(nodes, inputs, outputs, inits, name, opset=17):
    graph = helper.make_graph(nodes, name, inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _attention_model(rng) -> onnx.ModelProto:
    """x [batch, seq, 16] -> projections, a reshape chain into 2 heads (Shape -> Gather -> Unsqueeze -> Concat ->
    Reshape), batched matmuls, masked softmax, LayerNormalization, Erf (GELU); second output: the heads, transposed."""
    f = np.float32
    inits = {"wq": rng.standard_normal((16, 16)).astype(f) * 0.3, "wk": rng.standard_normal((16, 16)).astype(f) * 0.3,
             "wv": rng.standard_normal((16, 16)).astype(f) * 0.3, "bq": rng.standard_normal(16).astype(f),
             "gamma": rng.standard_normal(16).astype(f), "beta": rng.standard_normal(16).astype(f),
             "i0": np.array([0], np.int64), "i1": np.array([1], np.int64), "ax0": np.array([0], np.int64),
             "heads": np.array([2, 8], np.int64), "scale": np.array(0.35, f), "half": np.array(0.5, f),
             "one": np.array(1.0, f), "rsq2": np.array(1 / np.sqrt(2), f), "neg": np.array(-1e4, f),
             "zero": np.array(0.0, f), "minus1": np.array([-1], np.int64)}
    n = helper.make_node
    nodes = [
        n("Shape", ["x"], ["shp"]), n("Gather", ["shp", "i0"], ["b"], axis=0), n("Gather", ["shp", "i1"], ["s"], axis=0),
        n("Concat", ["b", "s", "heads"], ["hshape"], axis=0),
        n("MatMul", ["x", "wq"], ["q0"]), n("Add", ["q0", "bq"], ["q"]), n("MatMul", ["x", "wk"], ["k"]),
        n("MatMul", ["x", "wv"], ["v"]),
        n("Reshape", ["q", "hshape"], ["qh"]), n("Transpose", ["qh"], ["qt"], perm=[0, 2, 1, 3]),
        n("Reshape", ["k", "hshape"], ["kh"]), n("Transpose", ["kh"], ["kt"], perm=[0, 2, 3, 1]),
        n("Reshape", ["v", "hshape"], ["vh"]), n("Transpose", ["vh"], ["vt"], perm=[0, 2, 1, 3]),
        n("MatMul", ["qt", "kt"], ["sc0"]), n("Mul", ["sc0", "scale"], ["sc1"]),
        # mask [batch, seq] -> [batch, 1, 1, seq]: keys with mask 0 get -1e4
        n("Unsqueeze", ["mask", "i1"], ["m1"]), n("Unsqueeze", ["m1", "i1"], ["m2"]), n("Cast", ["m2"], ["mb"], to=9),
        n("Where", ["mb", "zero", "neg"], ["madd"]), n("Add", ["sc1", "madd"], ["sc2"]),
        n("Softmax", ["sc2"], ["p"], axis=-1), n("MatMul", ["p", "vt"], ["ctx"]),
        n("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3]),
        n("Concat", ["b", "s", "minus1"], ["flat"], axis=0), n("Reshape", ["ctxt", "flat"], ["c2"]),
        n("LayerNormalization", ["c2", "gamma", "beta"], ["ln"], axis=-1, epsilon=1e-5),
        n("Mul", ["ln", "rsq2"], ["g0"]), n("Erf", ["g0"], ["g1"]), n("Add", ["g1", "one"], ["g2"]),
        n("Mul", ["ln", "g2"], ["g3"]), n("Mul", ["g3", "half"], ["y"]),
    ]
    return _model(nodes, [_vi("x", TensorProto.FLOAT, ["batch", "seq", 16]), _vi("mask", TensorProto.INT64, ["batch", "seq"])],
                  [_vi("y", TensorProto.FLOAT, ["batch", "seq", 16]), _vi("qt", TensorProto.FLOAT, ["batch", 2, "seq", 8])], inits,
                  "attention")


def _shape_ops_model(rng) -> onnx.ModelProto:
    """ids [batch, seq] (int64): Range(0, seq) -> Gather of position embeddings, Slice of a table by seq, Gather of
    token embeddings, ConstantOfShape + Expand, Where(Equal(shape, -1)) as exporters write it, Flatten, a sum and
    a mean over seq (a reduction of run-time extent), IsNaN, Concat along seq, and a Slice that is empty for seq = 1."""
    f = np.float32
    inits = {"tok": rng.standard_normal((50, 8)).astype(f), "pos": rng.standard_normal((1, 16, 8)).astype(f),
             "i1": np.array([1], np.int64), "z": np.array([0], np.int64), "zero": np.array(0, np.int64),
             "step": np.array(1, np.int64), "minus1": np.array([-1, -1, -1], np.int64), "ax1": np.array([1], np.int64),
             "eight": np.array([8], np.int64)}
    n = helper.make_node
    nodes = [
        n("Shape", ["ids"], ["shp"]), n("Gather", ["shp", "i1"], ["s1"], axis=0),
        n("Squeeze", ["s1", "z"], ["s"]),
        n("Range", ["zero", "s", "step"], ["r"]),
        n("Slice", ["pos", "z", "s1", "ax1"], ["pslice"]),  # pos[:, :seq]
        n("Gather", ["tok", "ids"], ["te"], axis=0),  # [batch, seq, 8]
        n("Add", ["te", "pslice"], ["e0"]),
        n("Cast", ["r"], ["rf"], to=1), n("Unsqueeze", ["rf", "i1"], ["rf2"]),  # [seq, 1]
        n("Add", ["e0", "rf2"], ["e1"]),
        n("Concat", ["shp", "eight"], ["eshape"], axis=0),
        n("ConstantOfShape", ["eshape"], ["ones"], value=numpy_helper.from_array(np.array([1.0], f))),
        n("Equal", ["eshape", "minus1"], ["isneg"]), n("Where", ["isneg", "ones_shape", "eshape"], ["eshape2"]),
        n("Expand", ["e1", "eshape2"], ["e2"]), n("Add", ["e2", "ones"], ["e3"]),
        n("ReduceSum", ["e3", "ax1"], ["sum"], keepdims=1), n("ReduceMean", ["e3"], ["mean"], axes=[1], keepdims=0),
        n("Sub", ["e3", "sum"], ["e4"]), n("IsNaN", ["e4"], ["nan"]), n("Not", ["nan"], ["ok"]),
        n("Cast", ["ok"], ["okf"], to=1), n("Mul", ["e4", "okf"], ["e5"]),
        n("Concat", ["e5", "e3"], ["cat"], axis=1), n("Flatten", ["cat"], ["y"], axis=2),
        n("Slice", ["e3", "i1", "big", "ax1"], ["tail"]),  # [batch, seq - 1, 8]: empty for seq = 1 (0 workgroups)
    ]
    inits["big"] = np.array([2**62], np.int64)
    inits["ones_shape"] = np.array([1, 1, 1], np.int64)
    return _model(nodes, [_vi("ids", TensorProto.INT64, ["batch", "seq"])],
                  [_vi("y", TensorProto.FLOAT, ["rows", 8]), _vi("mean", TensorProto.FLOAT, ["batch", 8]),
                   _vi("r", TensorProto.INT64, ["seq"]), _vi("tail", TensorProto.FLOAT, ["batch", "tail", 8])],
                  inits, "shape_ops")


def _conv_model(rng) -> onnx.ModelProto:
    """img [1, 3, H, W]: Conv 3x3 stride 2 pad 1 (+ bias) -> Relu -> MaxPool 2x2 -> GlobalAveragePool, and the pooled
    map itself (run-time spatial dims, as PP-OCR's detector has)."""
    f = np.float32
    inits = {"w": rng.standard_normal((8, 3, 3, 3)).astype(f), "bias": rng.standard_normal(8).astype(f)}
    n = helper.make_node
    nodes = [n("Conv", ["img", "w", "bias"], ["c"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             n("Relu", ["c"], ["r"]), n("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             n("GlobalAveragePool", ["p"], ["g"])]
    return _model(nodes, [_vi("img", TensorProto.FLOAT, [1, 3, "H", "W"])],
                  [_vi("g", TensorProto.FLOAT, [1, 8, 1, 1]), _vi("p", TensorProto.FLOAT, [1, 8, "h", "w"])], inits,
                  "conv")


def _resize_model(rng) -> onnx.ModelProto:
    """img [1, 2, H, W]: Resize with constant scales (nearest asymmetric floor x2 as PP-OCR's FPN; linear half_pixel
    x2; linear asymmetric x0.5 of odd sizes) and with sizes from Shape arithmetic (a pooled map resized back to the
    input's H x W as FPN/UNet exports write it: Shape -> Slice -> Concat; linear half_pixel, align_corners and
    pytorch_half_pixel, nearest round_prefer_floor), all along run-time H and W."""
    f = np.float32
    inits = {"roi": np.zeros(0, f), "none": np.zeros(0, f), "s2": np.array([1, 1, 2, 2], f),
             "shalf": np.array([1, 1, 0.5, 0.5], f), "nc": np.array([1, 2], np.int64), "i2": np.array([2], np.int64),
             "i4": np.array([4], np.int64), "ax": np.array([0], np.int64)}
    n = helper.make_node
    nodes = [
        n("Resize", ["img", "roi", "s2"], ["up_nearest"], mode="nearest", coordinate_transformation_mode="asymmetric",
          nearest_mode="floor"),
        n("Resize", ["img", "roi", "s2"], ["up_linear"], mode="linear", coordinate_transformation_mode="half_pixel"),
        n("Resize", ["img", "roi", "shalf"], ["down"], mode="linear", coordinate_transformation_mode="asymmetric"),
        n("MaxPool", ["img"], ["pooled"], kernel_shape=[2, 2], strides=[2, 2]),
        n("Shape", ["img"], ["shp"]), n("Slice", ["shp", "i2", "i4", "ax"], ["hw"]),
        n("Concat", ["nc", "hw"], ["size"], axis=0),
        n("Resize", ["pooled", "roi", "none", "size"], ["back_linear"], mode="linear",
          coordinate_transformation_mode="half_pixel"),
        n("Resize", ["pooled", "roi", "none", "size"], ["back_corners"], mode="linear",
          coordinate_transformation_mode="align_corners"),
        n("Resize", ["pooled", "roi", "none", "size"], ["back_pytorch"], mode="linear",
          coordinate_transformation_mode="pytorch_half_pixel"),
        n("Resize", ["pooled", "roi", "none", "size"], ["back_nearest"], mode="nearest",
          coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_floor"),
    ]
    outs = [_vi(o, TensorProto.FLOAT, [1, 2, None, None]) for o in
            ("up_nearest", "up_linear", "down", "back_linear", "back_corners", "back_pytorch", "back_nearest")]
    return _model(nodes, [_vi("img", TensorProto.FLOAT, [1, 2, "H", "W"])], outs, inits, "resize")


def _pool_pad_model(rng) -> onnx.ModelProto:
    """img [1, 2, H, W]: ceil-mode MaxPool and AveragePool (with and without padding counted; odd sizes drop or keep
    the last window), and Pad in constant, edge and reflect modes along run-time H and W (and a crop)."""
    f = np.float32
    inits = {"p1": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64), "p2": np.array([0, 0, 2, 0, 0, 0, 1, 3], np.int64),
             "crop": np.array([0, 0, -1, 1, 0, 0, 0, -2], np.int64), "v": np.array(0.5, f)}
    n = helper.make_node
    nodes = [
        n("MaxPool", ["img"], ["max_ceil"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
        n("MaxPool", ["img"], ["max_ceil2"], kernel_shape=[2, 2], strides=[2, 2], pads=[1, 0, 1, 0], ceil_mode=1),
        n("AveragePool", ["img"], ["avg_ceil"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
        n("AveragePool", ["img"], ["avg_ceil_pad"], kernel_shape=[3, 2], strides=[3, 2], pads=[1, 1, 1, 1],
          ceil_mode=1, count_include_pad=1),
        n("Pad", ["img", "p1", "v"], ["pad_constant"], mode="constant"),
        n("Pad", ["img", "p2"], ["pad_edge"], mode="edge"),
        n("Pad", ["img", "p1"], ["pad_reflect"], mode="reflect"),
        n("Pad", ["img", "crop"], ["pad_crop"], mode="constant"),
    ]
    outs = [_vi(o, TensorProto.FLOAT, [1, 2, None, None]) for o in
            ("max_ceil", "max_ceil2", "avg_ceil", "avg_ceil_pad", "pad_constant", "pad_edge", "pad_reflect",
             "pad_crop")]
    return _model(nodes, [_vi("img", TensorProto.FLOAT, [1, 2, "H", "W"])], outs, inits, "pool_pad")


SPATIAL = {"H": (4, 24, 16), "W": (4, 24, 16)}
BUILDS = {"attention": (_attention_model, DIMS), "shape_ops": (_shape_ops_model, DIMS), "conv": (_conv_model, SPATIAL),
          "resize": (_resize_model, SPATIAL), "pool_pad": (_pool_pad_model, SPATIAL)}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    rng = np.random.default_rng(7)
    out = {}
    for name, (build, dims) in BUILDS.items():
        model = build(rng)
        path = tmp_path_factory.mktemp("dyn") / f"{name}.onnx"
        onnx.save(model, str(path))
        pkg = kiln.compile(path, path.with_suffix(""), dims=dims, device_class="cpu", target="webgpu,wasm,cpu",
                           wasm_threads=False)  # (the wasm sessions run one thread)
        out[name] = (path, pkg, kiln.load(pkg, poison=True))
    return out


@pytest.fixture(scope="module")
def c_sessions(models):
    """The wasm (wasmtime) and cpu sessions of the same packages, NaN-poisoned."""
    return {(name, target): kiln.load(pkg, target=target, poison=True)
            for name, (_, pkg, _) in models.items() for target in ("wasm", "cpu")}


def _feeds(name, b, s, rng):
    if name in ("conv", "resize", "pool_pad"):  # (b, s) as spatial sizes: 4 + 2b x 4 + s
        return {"img": rng.standard_normal((1, 3 if name == "conv" else 2, 4 + 2 * b, 4 + s)).astype(np.float32)}
    if name == "attention":
        mask = np.ones((b, s), np.int64)
        mask[0, s // 2 + 1:] = 0
        return {"x": rng.standard_normal((b, s, 16)).astype(np.float32), "mask": mask}
    return {"ids": rng.integers(0, 50, (b, s)).astype(np.int64)}


def _check_shapes(path, session, name, rng, what):
    """``session`` against onnxruntime running ``path`` at every shape of :data:`SHAPES`."""
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in ref.get_outputs()]
    for b, s in SHAPES:
        feeds = _feeds(name, b, s, rng)
        got = session.run(feeds)
        for n, want in zip(names, ref.run(None, feeds)):
            assert got[n].shape == want.shape and got[n].dtype == want.dtype, (what, n, b, s)
            np.testing.assert_allclose(got[n], want, rtol=1e-4, atol=1e-4, err_msg=f"{what}.{n} at batch={b} seq={s}")


@pytest.mark.parametrize("name", list(BUILDS))
def test_one_package_many_shapes(models, name, rng):
    path, _, session = models[name]
    _check_shapes(path, session, name, rng, name)


@pytest.mark.parametrize("target", ["wasm", "cpu"])
@pytest.mark.parametrize("name", list(BUILDS))
def test_c_targets_many_shapes(models, c_sessions, name, target, rng):
    """The C targets run the same packages: kernels read the dims from ``kiln_dims``, each step's tiles are
    its ``tiles`` size expression, inputs are written and outputs read at their run-time shapes."""
    session = c_sessions[name, target]
    _check_shapes(models[name][0], session, name, rng, f"{target} {name}")
    plan = session.manifest["targets"][target]["plan"]
    assert any("tiles" in step for step in plan)
    if name == "attention":  # seq's opt (8) is below its bound: matrix products get variants scheduled at 16
        assert any(v["when"] == {"seq": [9, 16]} for step in plan for v in step.get("variants", ()))
    for step in plan:  # the recorded total is the tiles at the upper bounds
        if "tiles" in step:
            top = {d["name"]: d["max"] for d in session.manifest["dynamic_dims"]}
            assert eval_json(step["tiles"], top) == step["total"]


def test_manifest(models):
    _, pkg, _ = models["attention"]
    m = json.loads((pkg / "manifest.json").read_text())
    assert m["version"] == VERSION == "1.14"
    assert m["dynamic_dims"] == [{"name": "batch", "index": 0, "min": 1, "max": 4, "opt": 4},
                                 {"name": "seq", "index": 1, "min": 1, "max": 16, "opt": 8}]
    x = next(i for i in m["inputs"] if i["name"] == "x")
    assert x["dynamic_shape"] == ["batch", "seq", 16] and x["shape"] == [4, 16, 16]
    tgt = m["targets"]["webgpu"]
    dynamic = [s for s in tgt["plan"] if "groups" in s]
    assert dynamic and tgt["dims_uniform"]["bytes"] == 16
    variants = [v for s in dynamic for v in s.get("variants", ())]
    assert variants and all(v["when"] == {"seq": [9, 16]} for v in variants)  # scheduled at 16 for seq > opt (8)
    for s in dynamic + variants:  # the recorded dispatch is the count at the upper bounds
        assert eval_json(s["groups"], {"batch": 4, "seq": 16}) == s["dispatch"][0] * s["dispatch"][1]
    for k in tgt["kernels"]:
        src = (pkg / k["source"]).read_text()
        assert ("kiln_dims" in src) == ("dims_binding" in k)


def test_static_package_unchanged(tmp_path):
    """``unbound="static"`` binds a symbolic dim to 1: no run-time dims machinery in the package."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [x], [_vi("y", TensorProto.FLOAT, ["N", 4])],
                   {"w": np.ones((8, 4), np.float32)}, "static")
    onnx.save(model, str(tmp_path / "m.onnx"))
    pkg = kiln.compile(tmp_path / "m.onnx", tmp_path / "pkg", unbound="static")
    m = json.loads((pkg / "manifest.json").read_text())
    assert m["inputs"][0]["shape"] == [1, 8]
    assert "dynamic_dims" not in m and all("groups" not in s for s in m["targets"]["webgpu"]["plan"])
    assert all("dims_binding" not in k for k in m["targets"]["webgpu"]["kernels"])


def test_bad_feeds(models):
    _, _, session = models["attention"]
    x = np.zeros((2, 5, 16), np.float32)
    with pytest.raises(ShapeError, match=r"'x' dim 1 \(seq\) is 17, outside its bounds 1\.\.16"):
        session.run({"x": np.zeros((2, 17, 16), np.float32), "mask": np.ones((2, 17), np.int64)})
    with pytest.raises(ShapeError, match=r"inconsistent dim seq: input 'mask' dim 1 is 6 but input 'x' gave 5"):
        session.run({"x": x, "mask": np.ones((2, 6), np.int64)})
    with pytest.raises(ShapeError, match=r"input 'x': expected shape \[2, 5, 16\]"):
        session.run({"x": np.zeros((2, 5, 15), np.float32), "mask": np.ones((2, 5), np.int64)})
    with pytest.raises(ShapeError, match="missing input 'mask'"):
        session.run({"x": x})


def test_compile_errors(models, tmp_path):
    path, _, _ = models["attention"]
    with pytest.raises(KilnError, match="run-time dim sequence names no input dim; the inputs. dims are batch, seq"):
        kiln.compile(path, tmp_path / "u", dims={"sequence": (1, 8)})
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])
    scales = np.array([1, 0.5], np.float32)  # an antialiased Resize is a constant matrix per axis: static sizes only
    resize = _model([helper.make_node("Resize", ["x", "", "scales"], ["y"], name="resize0", mode="linear",
                                      antialias=1)], [x], [_vi("y", TensorProto.FLOAT, ["batch", "seq2"])],
                    {"scales": scales}, "resize", opset=18)
    onnx.save(resize, str(tmp_path / "resize.onnx"))
    with pytest.raises(KilnError, match=r"node 'resize0' \(Resize, opset 18\).*run-time dims? .*seq.*--dim"):
        kiln.compile(tmp_path / "resize.onnx", tmp_path / "p", dims={"batch": 2, "seq": (1, 8)})
    third = _model([helper.make_node("Resize", ["x", "", "scales"], ["y"], name="resize1", mode="nearest")], [x],
                   [_vi("y", TensorProto.FLOAT, ["batch", "seq2"])], {"scales": np.array([1, 0.3333], np.float32)},
                   "third")
    onnx.save(third, str(tmp_path / "third.onnx"))
    with pytest.raises(KilnError, match=r"node 'resize1' \(Resize, opset 17\).*scale 0\.333.* run-time dim seq is not "
                                        r"a simple fraction.*--dim"):
        kiln.compile(tmp_path / "third.onnx", tmp_path / "t", dims={"batch": 2, "seq": (1, 8)})


def test_size_expressions():
    b, s = symbolic.size_var("batch", 0, 1, 4), symbolic.size_var("seq", 1, 1, 512, 128)
    assert symbolic.simplify(s * b) == symbolic.simplify(b * s)
    assert symbolic.simplify(b * s * 12 * s // 12) == symbolic.simplify(s * s * b)
    assert symbolic.upper(symbolic.simplify(b * s * s * 12)) == 4 * 512 * 512 * 12
    assert symbolic.decide("==", s, -1) is False and symbolic.decide(">=", s, 1) is True
    with pytest.raises(KilnError, match=r"seq == 1 depends on the run-time dims \(seq in \[1, 512\]\)"):
        symbolic.decide("==", s, 1)
    with pytest.raises(TypeError):
        int(s)
    with pytest.raises(TypeError):
        s > 1  # noqa: B015  (a comparison of a run-time dim must fail, never pick a branch)
    e = symbolic.simplify(symbolic.ceil_div(b * s * 384, 64))
    for bv, sv in ((1, 1), (3, 7), (4, 512)):
        assert eval_json(symbolic.to_json(e), {"batch": bv, "seq": sv}) == -(-bv * sv * 384 // 64)
    assert symbolic.resolve_reshape((b, s, 384), [0, 0, 12, -1]) == (b, s, 12, 32)
    with pytest.raises(ShapeError):
        symbolic.resolve_reshape((b, s, 384), [0, -1, 7])


_SIZE = hs.recursive(hs.integers(-2, 70000) | hs.sampled_from(["a", "b"]),
                     lambda x: hs.tuples(hs.sampled_from(["+", "*", "//", "max", "min"]), x, x).map(
                         lambda t: [t[0], t[1], t[2] if t[0] != "//" else max(1, t[2]) if isinstance(t[2], int)
                                    else ["max", 1, t[2]]]), max_leaves=4)
_STEP = hs.fixed_dictionaries({"groups": _SIZE}) | hs.fixed_dictionaries({"dispatch": hs.just([2, 1, 1])})
_VARIANT = hs.tuples(hs.sampled_from(["a", "b"]), hs.integers(0, 9), hs.integers(0, 9), _SIZE)


def _direct(plan, env, max_x=65535):
    """Each step's choice and workgroups for dims ``env``, evaluated step by step (what StepSizes must give)."""
    choice, counts = [], []
    for s in plan:
        c, chosen = next(((i + 1, v) for i, v in enumerate(s.get("variants", ()))
                          if all(lo <= env[n] <= hi for n, (lo, hi) in v["when"].items())), (0, s))
        v = eval_json(chosen["groups"], env) if "groups" in chosen else tuple(chosen["dispatch"])
        choice.append(c)
        counts.append(v if not isinstance(v, int) else (0, 0, 0) if v <= 0 else (v, 1, 1) if v <= max_x
                      else (max_x, -(-v // max_x), 1))
    return tuple(choice), tuple(counts)


@fuzz_settings(60)
@given(steps=hs.lists(hs.tuples(_STEP, hs.lists(_VARIANT, max_size=2)), min_size=1, max_size=6),
       repeat=hs.lists(hs.integers(0, 5), min_size=1, max_size=12),
       envs=hs.lists(hs.tuples(hs.integers(0, 9), hs.integers(0, 9)), min_size=1, max_size=40))
def test_step_sizes_equal_each_steps_own_evaluation(monkeypatch, steps, repeat, envs):
    """StepSizes (kinds of alike steps, each evaluated once per value of the dims it reads, the expansion kept per
    outcome, memos cleared when full) gives every step the choice and workgroups of its own evaluation, for any
    sequence of dims (a decode step's position moving by one, jumps, values seen before)."""
    monkeypatch.setattr(dynamic, "MEMO_ENTRIES", 3)  # (the memos fill and clear within an example)
    plan = []
    for i in repeat:  # (repeated steps: kinds with several steps)
        step, variants = steps[i % len(steps)]
        plan.append({**step, "variants": [{"when": {d: [lo, hi]}, "groups": g} for d, lo, hi, g in variants]})
    sizes = StepSizes(plan, "groups")
    for a, b in envs:
        env = {"a": a, "b": b}
        want = _direct(plan, env)
        choice, counts, table = sizes.dispatch_table(env)
        assert (choice, counts) == want == sizes.dispatches(env)
        assert table is None or table.tolist() == [list(c) for c in counts]
        assert sizes(env)[0] == choice


def test_minilm_one_package(tmp_path_factory):
    """all-MiniLM-L6-v2 from ONE package (batch 1..4, seq 1..512) against onnxruntime within 1e-4 on a CI subset
    of the acceptance grid; tools/dynamic_minilm.py runs all of batch 1-4 x seq 1, 7, 128, 512."""
    model = SHARED_MODELS / "all_minilm_l6_v2.onnx"
    pkg = kiln.compile(model, tmp_path_factory.mktemp("minilm") / "pkg", dims={"batch": (1, 4), "seq": (1, 512, 128)},
                       device_class="cpu")
    session = kiln.load(pkg, poison=True)
    ref = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    with np.load(SHARED_MODELS / "reference" / "all_minilm_l6_v2_inputs.npz") as z:
        sample = {k: z[k] for k in z.files}
    grid = [sample, *[minilm_feeds(rng, b, s) for b, s in ((1, 1), (2, 7), (4, 128), (1, 512))]]
    for feeds in grid:
        got = session.run(feeds)["last_hidden_state"]
        want = ref.run(["last_hidden_state"], feeds)[0]
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= 1e-4, feeds["input_ids"].shape


def test_cli_dim_ranges():
    import click

    from kiln.cli_options import parse_dims as _parse_dims

    assert _parse_dims(("seq=1..512@128", "batch=1..4", "N=4")) == {"seq": (1, 512, 128), "batch": (1, 4, 4), "N": 4}
    # a decoder's cache may be empty (LO 0), and its attention mask covers cache and new tokens (a sum of dims)
    assert _parse_dims(("past=0..63", "total=past+seq")) == {"past": (0, 63, 63), "total": "past+seq"}
    for bad in ("seq=-1..4", "seq=8..4", "seq=1..4@9", "seq=a..b", "seq", "N=0"):
        with pytest.raises((click.BadParameter, KilnError)):
            _parse_dims((bad,))


def test_gpu_resident_io(models, rng):
    """GPUTensor feeds of run-time shapes, and ``output="gpu"`` tensors shaped by the dims (docs/runtime.md)."""
    path, _, session = models["attention"]
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in ref.get_outputs()]
    for b, s in [(2, 7), (1, 3)]:
        feeds = _feeds("attention", b, s, rng)
        got = session.run(session.upload(feeds), output="gpu")
        for n, want in zip(names, ref.run(None, feeds)):
            assert list(got[n].shape) == list(want.shape), (n, b, s)
            np.testing.assert_allclose(got[n].numpy(), want, rtol=1e-4, atol=1e-4, err_msg=f"{n} at {b}x{s}")


def test_fp16_run_time_dims(models, tmp_path, rng):
    """``--precision fp16`` with run-time dims: one fp16 package, several shapes, within fp16's error."""
    path, _, _ = models["attention"]
    pkg = kiln.compile(path, tmp_path / "fp16", dims=DIMS, device_class="cpu", precision="fp16")
    try:
        session = kiln.load(pkg, poison=True)
    except kiln.errors.DeviceError as e:  # an adapter without shader-f16
        pytest.skip(str(e))
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in ref.get_outputs()]
    for b, s in [(1, 1), (3, 16), (2, 9)]:
        feeds = _feeds("attention", b, s, rng)
        got = session.run(feeds)
        for n, want in zip(names, ref.run(None, feeds)):
            assert got[n].shape == want.shape, (n, b, s)
            # f16 storage: relative rounding 2^-11 per stored value, a few layers deep
            np.testing.assert_allclose(got[n], want, rtol=2e-2, atol=2e-2, err_msg=f"{n} at {b}x{s}")


def test_ppocr_det_one_package(tmp_path_factory):
    """PP-OCRv4's DBNet detector (Resize x2 nearest, ConvTranspose, stride-2 convolutions) from ONE package with
    run-time height and width, multiples of 32 as the model needs (``--dim H=32..256@128%32``), at two sizes
    against onnxruntime within the static PP-OCR test's tolerance (tests/test_models.py); a size that is not a
    multiple of 32 is refused."""
    model = SHARED_MODELS / "ch_PP-OCRv4_det_infer.onnx"
    h, w = "p2o.DynamicDimension.1", "p2o.DynamicDimension.2"
    pkg = kiln.compile(model, tmp_path_factory.mktemp("det") / "pkg", device_class="cpu",
                       dims={"p2o.DynamicDimension.0": 1, h: "32..256@128%32", w: (32, 256, 128, 32)})
    m = json.loads((pkg / "manifest.json").read_text())
    assert [(d["name"], d["min"], d["max"], d.get("multiple")) for d in m["dynamic_dims"]] == \
        [(h, 32, 256, 32), (w, 32, 256, 32)]
    session = kiln.load(pkg, poison=True)
    ref = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for shape in [(1, 3, 64, 96), (1, 3, 96, 256)]:  # (a third, 256 x 160, trimmed for the suite's time)
        x = rng.uniform(-1, 1, size=shape).astype(np.float32)
        (got,) = session.run({"x": x}).values()
        (want,) = ref.run(None, {"x": x})
        assert got.shape == want.shape == (1, 1, *shape[2:])
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0, err_msg=str(shape))
    with pytest.raises(ShapeError, match=rf"'x' dim 2 \({h}\) is 80, not a multiple of 32"):
        session.run({"x": np.zeros((1, 3, 80, 96), np.float32)})


def test_multiple_of_dims():
    """A dim declared a multiple (``%32``) is ``32 * (H // 32)`` to the shape arithmetic: stride-2 convolutions
    (``(H - 1) // 2 + 1``) fold to exact fractions of H, so an upsampled map broadcasts against its lateral."""
    from kiln.frontend.onnx.importer import parse_dim_spec
    from kiln.ir.ops import pool_out_dim

    hv = symbolic.size_var("H", 0, 32, 960, 640, 32)
    d = hv
    for _ in range(5):
        d = symbolic.simplify((d - 1) // 2 + 1)
    assert symbolic.simplify(d * 32 - hv) == 0 and symbolic.bounds(d) == (1, 30)
    assert symbolic.upper(symbolic.simplify(d * d)) == 900
    assert parse_dim_spec("H", "32..960@640%32") == (32, 960, 640, 32) and parse_dim_spec("H", "1..9") == (1, 9, 9)
    for bad in ("30..960%32", "32..960@100%32"):
        with pytest.raises(KilnError, match="multiples of 32"):
            parse_dim_spec("H", bad)
    s = symbolic.size_var("s", 1, 3, 40)
    for k, st, pb, pe in [(3, 2, 0, 0), (3, 2, 1, 1), (1, 2, 0, 0), (2, 3, 1, 1), (3, 3, 0, 2)]:
        e = pool_out_dim(s, k, st, 1, pb, pe, 1)  # ceil mode: exact for every value in bounds
        for v in range(3, 41):
            assert symbolic.evaluate(e, {"s": v}) == pool_out_dim(v, k, st, 1, pb, pe, 1), (k, st, pb, pe, v)
    for e in [(s - 1) // 2 + 1, (3 * s + 5) // 2, (4 * s - 3) % 4, (2 * s + 1) // 2 * 3]:
        f = symbolic.simplify(e)
        for v in range(3, 41):
            assert symbolic.evaluate(f, {"s": v}) == symbolic.evaluate(e, {"s": v}), (e, f, v)
