"""Data-dependent output shapes (docs/dynamic-shapes.md, *Data-dependent shapes*): NonZero, Compress on a run-time
condition, Unique, TopK with a run-time ``k`` and NonMaxSuppression, and what consumes their results (GatherND on NonZero's indices, Shape ->
Range/Expand), against onnxruntime on fresh inputs with counts that change from run to run, from one package, on
webgpu (wgpu-py), wasm (wasmtime), cpu (native C) and in headless Chromium (kiln.js on WebGPU and wasm)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import kiln
from kiln.errors import ShapeError
from kiln.package.format import read_manifest

OPSET = 13


def _out(name: str, elem: int, rank: int) -> onnx.ValueInfoProto:
    return h.make_tensor_value_info(name, elem, [f"{name}_{i}" for i in range(rank)])


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    m = h.make_model(h.make_graph(nodes, "data_dependent", inputs, outputs, list(inits)),
                     opset_imports=[h.make_opsetid("", OPSET)])
    onnx.checker.check_model(m, full_check=True)
    return m


def nonzero_model(shape, elem=T.FLOAT) -> onnx.ModelProto:
    """``NonZero(x)`` and ``x[x != 0]`` (``GatherND`` on its transpose), ``Range(0, count)`` and a fill of the
    selection's shape (``Expand`` from ``Shape``): consumers of a data-dependent dim."""
    x = h.make_tensor_value_info("x", elem, list(shape))
    nodes = [h.make_node("NonZero", ["x"], ["nz"]),
             h.make_node("Transpose", ["nz"], ["nzt"], perm=[1, 0]),
             h.make_node("GatherND", ["x", "nzt"], ["picked"]),
             h.make_node("Shape", ["picked"], ["n"]),
             h.make_node("Squeeze", ["n", "axis0"], ["count"]),
             h.make_node("Range", ["zero", "count", "one"], ["steps"]),
             h.make_node("Expand", ["two", "n"], ["twos"])]
    inits = [h.make_tensor("axis0", T.INT64, [1], [0]), h.make_tensor("zero", T.INT64, [], [0]),
             h.make_tensor("one", T.INT64, [], [1]), h.make_tensor("two", T.FLOAT, [], [2.0])]
    return _model(nodes, [x], [_out("nz", T.INT64, 2), _out("picked", elem, 1), _out("steps", T.INT64, 1),
                               _out("twos", T.FLOAT, 1)], inits)


def compress_model(shape, axis, length=None) -> onnx.ModelProto:
    """``Compress(x, x[:, 0] > 0)`` along ``axis`` (flattened for None), the condition computed at run time."""
    x = h.make_tensor_value_info("x", T.FLOAT, list(shape))
    n = length if length is not None else (int(np.prod(shape)) if axis is None else shape[axis])
    nodes = [h.make_node("Flatten", ["x"], ["flat"], axis=0),
             h.make_node("Slice", ["flat", "start", "stop", "ax"], ["head"]),
             h.make_node("Reshape", ["head", "len"], ["v"]),
             h.make_node("Greater", ["v", "zero"], ["cond"]),
             h.make_node("Compress", ["x", "cond"], ["y"], **({} if axis is None else {"axis": axis}))]
    inits = [h.make_tensor("start", T.INT64, [1], [0]), h.make_tensor("stop", T.INT64, [1], [n]),
             h.make_tensor("ax", T.INT64, [1], [1]), h.make_tensor("len", T.INT64, [1], [n]),
             h.make_tensor("zero", T.FLOAT, [], [0.0])]
    return _model(nodes, [x], [_out("y", T.FLOAT, 1 if axis is None else len(shape))], inits)


def topk_model(shape, axis) -> onnx.ModelProto:
    """``TopK(x, k)`` with ``k`` an input."""
    x = h.make_tensor_value_info("x", T.FLOAT, list(shape))
    k = h.make_tensor_value_info("k", T.INT64, [1])
    return _model([h.make_node("TopK", ["x", "k"], ["values", "indices"], axis=axis)], [x, k],
                  [_out("values", T.FLOAT, len(shape)), _out("indices", T.INT64, len(shape))])


def unique_model(shape, axis, sorted_) -> onnx.ModelProto:
    """``Unique(x)`` with all four outputs."""
    x = h.make_tensor_value_info("x", T.FLOAT, list(shape))
    rank = 1 if axis is None else len(shape)
    attrs = {"sorted": sorted_, **({} if axis is None else {"axis": axis})}
    return _model([h.make_node("Unique", ["x"], ["y", "indices", "inverse_indices", "counts"], **attrs)], [x],
                  [_out("y", T.FLOAT, rank), _out("indices", T.INT64, 1), _out("inverse_indices", T.INT64, 1),
                   _out("counts", T.INT64, 1)])


def nms_model(batches, classes, boxes, *, center=0, limit=None, iou=None, score=True) -> onnx.ModelProto:
    """``NonMaxSuppression``: ``max_output_boxes_per_class`` a constant ``limit`` or (None) an input, the IoU threshold
    a constant ``iou`` or (None) an input, the score threshold an input or (``score=False``) omitted."""
    ins = [h.make_tensor_value_info("boxes", T.FLOAT, [batches, boxes, 4]),
           h.make_tensor_value_info("scores", T.FLOAT, [batches, classes, boxes])]
    inits = []
    if limit is None:
        ins.append(h.make_tensor_value_info("max_out", T.INT64, [1]))
    else:
        inits.append(h.make_tensor("max_out", T.INT64, [1], [limit]))
    if iou is None:
        ins.append(h.make_tensor_value_info("iou", T.FLOAT, [1]))
    else:
        inits.append(h.make_tensor("iou", T.FLOAT, [], [iou]))
    if score:
        ins.append(h.make_tensor_value_info("score", T.FLOAT, [1]))
    node = h.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "score" if score else ""],
                       ["selected"], center_point_box=center)
    return _model([node], ins, [_out("selected", T.INT64, 2)], inits)


def nms_inputs(rng, batches, classes, n, center=0):
    """Boxes in a few clusters (so that many overlap), some with their corners swapped and some of no area, and
    scores rounded to 0.05 (ties)."""
    middle = rng.uniform(0, 10, (batches, 4, 2))[:, rng.integers(0, 4, n)] + rng.normal(0, 0.4, (batches, n, 2))
    size = rng.uniform(0.5, 3, (batches, n, 2)) * (rng.random((batches, n, 1)) > 0.05)
    if center:
        boxes = np.concatenate([middle[..., ::-1], size[..., ::-1]], -1)
    else:
        lo, hi = middle - size / 2, middle + size / 2
        boxes = np.concatenate([lo, hi], -1)
        flip = rng.random((batches, n)) < 0.3
        boxes[flip] = boxes[flip][:, [2, 3, 0, 1]]
    return boxes.astype(np.float32), np.round(rng.random((batches, classes, n)) * 20).astype(np.float32) / 20


def _sparse(rng, shape, density, dtype=np.float32):
    x = rng.standard_normal(shape).astype(dtype) * (rng.random(shape) < density)
    return x


def _check(session, ref, feeds):
    got = session.run(feeds)
    names = [o.name for o in ref.get_outputs()]
    for name, want in zip(names, ref.run(None, feeds)):
        assert got[name].shape == want.shape, (name, got[name].shape, want.shape)
        assert got[name].dtype == want.dtype, (name, got[name].dtype, want.dtype)
        np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-6, err_msg=name)
    return got


@pytest.fixture(scope="module", params=["webgpu", "wasm", "cpu"])
def target(request):
    return request.param


def _compile(tmp_path, model, target):
    onnx.save(model, tmp_path / "m.onnx")
    pkg = kiln.compile(tmp_path / "m.onnx", tmp_path / "pkg", target=target, device_class="cpu")
    return kiln.load(pkg, target=target, poison=True) if target != "cpu" else kiln.load(pkg, target=target), \
        ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4)])
def test_nonzero_and_its_consumers(tmp_path, rng, target, shape):
    session, ref = _compile(tmp_path, nonzero_model(shape), target)
    for density in (0.5, 0.0, 1.0, 0.2):  # counts change every run, from none to all
        _check(session, ref, {"x": _sparse(rng, shape, density)})
    if target == "webgpu":
        m = read_manifest(tmp_path / "pkg")
        counts = [d for d in m["dynamic_dims"] if "count" in d]
        assert len(counts) == 1 and counts[0]["max"] == int(np.prod(shape))
        assert sum(len(s.get("bind_dims", [])) for s in m["targets"]["webgpu"]["plan"]) == 1
        assert [o["name"] for o in m["outputs"]] == ["nz", "picked", "steps", "twos"]  # (the count is no output)


@pytest.mark.parametrize("elem,dtype", [(T.BOOL, np.bool_), (T.INT32, np.int32), (T.INT64, np.int64)])
def test_nonzero_dtypes(tmp_path, rng, elem, dtype):
    x = h.make_tensor_value_info("x", elem, [4, 6])
    model = _model([h.make_node("NonZero", ["x"], ["nz"])], [x], [_out("nz", T.INT64, 2)])
    session, ref = _compile(tmp_path, model, "webgpu")
    for density in (0.3, 0.7):
        x = (rng.integers(-3, 4, (4, 6)) * (rng.random((4, 6)) < density)).astype(dtype)
        _check(session, ref, {"x": x})


def test_nonzero_large_two_level_count(tmp_path, rng):
    """Beyond 512 flags the prefix count runs in rows of 256 (a CumSum per row, one over the rows' totals)."""
    shape = (37, 101)  # 3737 flags: 15 rows, the last one padded
    session, ref = _compile(tmp_path, nonzero_model(shape), "webgpu")
    for density in (0.5, 0.01):
        _check(session, ref, {"x": _sparse(rng, shape, density)})


@pytest.mark.parametrize("shape,axis,length", [((6, 4), 0, None), ((3, 8), 1, 5), ((3, 4), None, None),
                                               ((2, 5, 3), 1, None)])
def test_compress_runtime_condition(tmp_path, rng, target, shape, axis, length):
    session, ref = _compile(tmp_path, compress_model(shape, axis, length), target)
    for _ in range(3):
        _check(session, ref, {"x": rng.standard_normal(shape).astype(np.float32)})
    _check(session, ref, {"x": -np.abs(rng.standard_normal(shape)).astype(np.float32) - 1})  # nothing selected


@pytest.mark.parametrize("shape,axis,sorted_", [((12,), None, 1), ((12,), None, 0), ((3, 4), None, 1),
                                                ((6, 3), 0, 1), ((6, 3), 0, 0), ((2, 5, 2), 1, 1), ((4, 5), -1, 1)])
def test_unique(tmp_path, rng, target, shape, axis, sorted_):
    session, ref = _compile(tmp_path, unique_model(shape, axis, sorted_), target)
    for high in (3, 2, 1000):  # many repeats, two values, (almost) all distinct
        x = rng.integers(-high, high, shape).astype(np.float32)
        if axis is not None:  # repeat whole slices so that some are equal
            ax = axis % len(shape)
            x = np.take(x, rng.integers(0, max(2, shape[ax] // 2), shape[ax]), axis=ax)
        _check(session, ref, {"x": x})


@pytest.mark.parametrize("shape,axis", [((4, 9), 1), ((6, 3), 0)])
def test_topk_runtime_k(tmp_path, rng, target, shape, axis):
    session, ref = _compile(tmp_path, topk_model(shape, axis), target)
    for k in (1, shape[axis], 0, 2):
        _check(session, ref, {"x": rng.standard_normal(shape).astype(np.float32), "k": np.array([k], np.int64)})
    with pytest.raises(ShapeError, match=r"TopK.*is 10 at run time, outside its bounds 0\.\.\d"):
        session.run({"x": rng.standard_normal(shape).astype(np.float32), "k": np.array([10], np.int64)})
    with pytest.raises(ShapeError, match="is -1 at run time"):
        session.run({"x": rng.standard_normal(shape).astype(np.float32), "k": np.array([-1], np.int64)})


def test_nms_runtime_limits(tmp_path, rng, target):
    """NonMaxSuppression with its limit and thresholds fed at run time: from nothing kept to every box."""
    session, ref = _compile(tmp_path, nms_model(2, 3, 40), target)
    for limit, iou, score in [(5, 0.5, 0.3), (40, 0.3, 0.0), (1, 0.7, 0.5), (0, 0.5, 0.0), (100, 1.0, -1.0),
                              (3, 0.5, 2.0)]:
        boxes, scores = nms_inputs(rng, 2, 3, 40)
        _check(session, ref, {"boxes": boxes, "scores": scores, "max_out": np.array([limit], np.int64),
                              "iou": np.array([iou], np.float32), "score": np.array([score], np.float32)})


@pytest.mark.parametrize("center", [0, 1])
def test_nms_constant_limit(tmp_path, rng, center):
    """A constant ``max_output_boxes_per_class`` bounds the count (and the buffers) by ``B * C * limit``; center-point
    boxes; no score threshold; 2 x 300 flags counted in rows (beyond 512)."""
    session, ref = _compile(tmp_path, nms_model(1, 2, 300, center=center, limit=25, iou=0.45, score=False), "webgpu")
    assert [d["max"] for d in read_manifest(tmp_path / "pkg")["dynamic_dims"] if "count" in d] == [50]
    for _ in range(2):
        boxes, scores = nms_inputs(rng, 1, 2, 300, center)
        _check(session, ref, {"boxes": boxes, "scores": scores})


def test_stated_bound_of_a_data_dependent_dim(tmp_path, rng, target):
    """``--dim NonZero_0.count=0..6`` plans the buffers for 6 and makes a run with more a clear error (before the
    kernels that would write past them run); a misspelt name lists the data-dependent dims."""
    onnx.save(nonzero_model((3, 5)), tmp_path / "m.onnx")
    pkg = kiln.compile(tmp_path / "m.onnx", tmp_path / "pkg", target=target, dims={"NonZero_0.count": "0..6"})
    assert [(d["name"], d["min"], d["max"]) for d in read_manifest(pkg)["dynamic_dims"]] == [("NonZero_0.count", 0, 6)]
    session = kiln.load(pkg, target=target)
    x = _sparse(rng, (3, 5), 0.3)
    x.ravel()[:6] = 1  # (at least 6)
    x.ravel()[6:] *= np.arange(9) < 0  # exactly 6 non-zero
    np.testing.assert_array_equal(session.run({"x": x})["nz"], np.array(np.nonzero(x)))
    with pytest.raises(ShapeError, match=r"NonZero_0.count is 15 at run time, outside its bounds 0\.\.6"):
        session.run({"x": np.ones((3, 5), np.float32)})
    np.testing.assert_array_equal(session.run({"x": x})["nz"], np.array(np.nonzero(x)))  # (still usable)
    with pytest.raises(kiln.KilnError, match="NonZero.count names no input dim or data-dependent dim; .* the "
                                             "data-dependent dims NonZero_0.count"):
        kiln.compile(tmp_path / "m.onnx", tmp_path / "bad", target=target, dims={"NonZero.count": "0..6"})


@pytest.mark.parametrize("n,axis", [(300, 1), (1000, 0)])
def test_topk_long_axis(tmp_path, rng, n, axis):
    """TopK over a long axis ranks by comparison counts and a scatter (n steps per element): recounting the ranks
    for every output (n^2 steps) ran past lavapipe's 65535 loop iterations per invocation, which it cuts silently."""
    shape = (3, n) if axis == 1 else (n, 2)
    x = h.make_tensor_value_info("x", T.FLOAT, list(shape))
    model = _model([h.make_node("TopK", ["x", "k"], ["values", "indices"], axis=axis, largest=axis)], [x],
                   [_out("values", T.FLOAT, 2), _out("indices", T.INT64, 2)], [h.make_tensor("k", T.INT64, [1], [7])])
    session, ref = _compile(tmp_path, model, "webgpu")
    _check(session, ref, {"x": np.round(rng.standard_normal(shape) * 4).astype(np.float32)})  # (ties)


def test_data_dependent_dims_refused_where_unsupported(tmp_path):
    onnx.save(nonzero_model((3, 4)), tmp_path / "m.onnx")
    with pytest.raises(kiln.KilnError, match="data-dependent shapes .* are supported by the webgpu, wasm, cpu targets"):
        kiln.compile(tmp_path / "m.onnx", tmp_path / "pkg", target="webgl2")


@pytest.mark.browser
@pytest.mark.parametrize("js_target", ["webgpu", "wasm"])
def test_data_dependent_in_chromium(rng, js_target):
    """kiln.js reads the counts back mid-run (WebGPU: a mapped staging buffer; wasm: linear memory)."""
    from browser import CHROMIUM, close_shared_runner
    from opcheck import run_in_browser

    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing (Debian package chromium)")
    try:
        _check_in_browser(rng, js_target, run_in_browser)
    finally:
        close_shared_runner()  # its Playwright must not overlap the browser fixture's in later modules


def _check_in_browser(rng, js_target, run_in_browser):
    for model, feeds in [(nonzero_model((3, 5)), {"x": _sparse(rng, (3, 5), 0.4)}),
                         (compress_model((6, 4), 0), {"x": rng.standard_normal((6, 4)).astype(np.float32)}),
                         (unique_model((5, 2), 0, 1), {"x": rng.integers(0, 2, (5, 2)).astype(np.float32)}),
                         (topk_model((4, 9), 1), {"x": rng.standard_normal((4, 9)).astype(np.float32),
                                                  "k": np.array([3], np.int64)}),
                         (nms_model(1, 2, 12, limit=4, iou=0.5, score=False),
                          dict(zip(("boxes", "scores"), nms_inputs(rng, 1, 2, 12))))]:
        got = run_in_browser(model, feeds, f"browser:{js_target}", name=f"dd_{js_target}")
        ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        for o, want in zip(ref.get_outputs(), ref.run(None, feeds)):
            assert got[o.name].shape == want.shape, (o.name, got[o.name].shape, want.shape)
            np.testing.assert_allclose(got[o.name], want, rtol=1e-6, atol=1e-6, err_msg=o.name)


def test_cpu_split_runs_on_two_threads(tmp_path, rng):
    """The cpu target runs a binding plan as two calls (steps before the count, then after): 500 runs on two threads
    (a worker leaving the first call's last barrier late once ran the second call's steps twice and deadlocked)."""
    onnx.save(nonzero_model((3, 5)), tmp_path / "m.onnx")
    session = kiln.load(kiln.compile(tmp_path / "m.onnx", tmp_path / "pkg", target="cpu"), target="cpu", threads=2)
    for _ in range(500):
        x = _sparse(rng, (3, 5), 0.5)
        np.testing.assert_array_equal(session.run({"x": x})["nz"], np.array(np.nonzero(x)))
