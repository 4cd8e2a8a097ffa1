"""Run-time control flow (ONNX If and Loop whose conditions are computed at run time) and the unrolled
recurrent ops (Scan, LSTM, GRU), natively on WebGPU against onnxruntime and Kiln's interpreter."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from opcheck import check_op

import kiln
from kiln.errors import ConstantInputError, KilnError, ShapeError
from kiln.frontend.onnx.importer import import_model
from kiln.ir import interp

F, I64, B = T.FLOAT, T.INT64, T.BOOL


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _compile(model, tmp_path, name="pkg"):
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return kiln.compile(path, tmp_path / name, device_class="cpu")


def _check(session, model, feeds, atol=1e-5):
    """Kiln (native, poisoned buffers) and the interpreter against onnxruntime on ``feeds``."""
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = session.run(feeds)
    spec = interp.run(import_model(model), feeds)
    for o, e in zip(model.graph.output, expected):
        for what, arr in (("kiln", got[o.name]), ("interpreter", spec[o.name])):
            assert arr.shape == e.shape and arr.dtype == e.dtype, (what, o.name, arr.shape, e.shape, arr.dtype)
            np.testing.assert_allclose(arr, e, atol=atol, rtol=1e-5, err_msg=f"{what} {o.name}")
    return got


# ----------------------------------------------------------------------------- If
def _if_model():
    """y, z = If(sum(x) > t): then (relu(x) * w, x) else (-x, [7, 7, 7, 7]); w and x captured."""
    then_g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "w"], ["ty"]),
         helper.make_node("Identity", ["x"], ["tz"])], "then", [], [_vi("ty", F, [3, 4]), _vi("tz", F, [3, 4])])
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["ey"]), helper.make_node("Constant", [], ["ez"],
                                                                   value=numpy_helper.from_array(np.full((3, 4), 7, np.float32)))],
        "else", [], [_vi("ey", F, [3, 4]), _vi("ez", F, [3, 4])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), helper.make_node("Greater", ["s", "t"], ["c"]),
             helper.make_node("If", ["c"], ["y", "z"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Add", ["y", "z"], ["u"])]
    return _model(nodes, [_vi("x", F, [3, 4]), _vi("t", F, [])], [_vi("y", F, [3, 4]), _vi("z", F, [3, 4]),
                                                                  _vi("u", F, [3, 4])],
                  [("w", np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))])


def test_if_runtime_condition(tmp_path, rng):
    model = _if_model()
    pkg = _compile(model, tmp_path)
    plan = json.loads((pkg / "manifest.json").read_text())["targets"]["webgpu"]["plan"]
    assert any("if" in s for s in plan)
    session = kiln.load(pkg, poison=True)
    for t in (-100.0, 100.0, 0.0):
        _check(session, model, {"x": rng.standard_normal((3, 4)).astype(np.float32), "t": np.array(t, np.float32)})
        assert session.control.readbacks == 1  # the condition is computed on the GPU and read back once


def test_if_condition_from_an_input_needs_no_readback(tmp_path, rng):
    then_g = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["a"])], "then", [], [_vi("a", F, [5])])
    else_g = helper.make_graph([helper.make_node("Tanh", ["x"], ["b"])], "else", [], [_vi("b", F, [5])])
    model = _model([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
                   [_vi("x", F, [5]), _vi("c", B, [])], [_vi("y", F, [5])])
    session = kiln.load(_compile(model, tmp_path), poison=True)
    for c in (True, False):
        _check(session, model, {"x": rng.standard_normal(5).astype(np.float32), "c": np.array(c)})
        assert session.control.readbacks == 0


def test_nested_runtime_if(tmp_path, rng):
    inner_then = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["p"])], "it", [], [_vi("p", F, [4])])
    inner_else = helper.make_graph([helper.make_node("Abs", ["x"], ["q"])], "ie", [], [_vi("q", F, [4])])
    outer_then = helper.make_graph(
        [helper.make_node("Less", ["a", "zero"], ["c2"]),
         helper.make_node("If", ["c2"], ["r"], then_branch=inner_then, else_branch=inner_else)],
        "ot", [], [_vi("r", F, [4])])
    outer_else = helper.make_graph([helper.make_node("Sub", ["x", "a"], ["d"])], "oe", [], [_vi("d", F, [4])])
    model = _model([helper.make_node("Greater", ["a", "zero"], ["c"]),
                    helper.make_node("Not", ["c"], ["nc"]),
                    helper.make_node("If", ["nc"], ["y"], then_branch=outer_then, else_branch=outer_else)],
                   [_vi("x", F, [4]), _vi("a", F, [])], [_vi("y", F, [4])], [("zero", np.array(0, np.float32))])
    session = kiln.load(_compile(model, tmp_path), poison=True)
    for a in (-1.5, 0.0, 2.0):
        _check(session, model, {"x": rng.standard_normal(4).astype(np.float32), "a": np.array(a, np.float32)})


def test_if_branch_that_cannot_be_built_fails_when_taken(tmp_path, rng):
    # the else branch reshapes 6 elements to [4]: it cannot run at these shapes (onnxruntime fails at run time too)
    then_g = helper.make_graph([helper.make_node("Reshape", ["x", "s6"], ["a"])], "then", [], [_vi("a", F, [6])])
    else_g = helper.make_graph([helper.make_node("Reshape", ["x", "s4"], ["b"])], "else", [], [_vi("b", F, [4])])
    model = _model([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
                   [_vi("x", F, [2, 3]), _vi("c", B, [])], [_vi("y", F, [6])],
                   [("s6", np.array([6], np.int64)), ("s4", np.array([4], np.int64))])
    with pytest.warns(UserWarning, match="else branch cannot run"):
        session = kiln.load(_compile(model, tmp_path), poison=True)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(session.run({"x": x, "c": np.array(True)})["y"], x.reshape(6))
    with pytest.raises(KilnError, match="else branch cannot run with the compiled shapes"):
        session.run({"x": x, "c": np.array(False)})


def test_runtime_control_flow_is_webgpu_only(tmp_path):
    path = tmp_path / "if.onnx"
    onnx.save(_if_model(), path)
    with pytest.raises(KilnError, match="only the webgpu target runs"):
        kiln.compile(path, tmp_path / "pkg", target="webgpu,wasm")


# ----------------------------------------------------------------------------- Loop
def _counter_loop(opset=16):
    """for i in range(M) while cond: x = x * 0.5 + i; k = k + 1 (cond passes through); w captured."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=F), helper.make_node("Mul", ["x_in", "half"], ["h"]),
         helper.make_node("Add", ["h", "fi"], ["h2"]), helper.make_node("Add", ["h2", "w"], ["x_out"]),
         helper.make_node("Add", ["k_in", "one"], ["k_out"]), helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body", [_vi("i", I64, []), _vi("c_in", B, []), _vi("x_in", F, [3]), _vi("k_in", I64, [])],
        [_vi("c_out", B, []), _vi("x_out", F, [3]), _vi("k_out", I64, [])],
        [numpy_helper.from_array(np.array(0.5, np.float32), "half"), numpy_helper.from_array(np.array(1, np.int64), "one")])
    return _model([helper.make_node("Mul", ["w0", "w0"], ["w"]),
                   helper.make_node("Loop", ["M", "cond", "x0", "k0"], ["x", "k"], body=body)],
                  [_vi("M", I64, []), _vi("cond", B, []), _vi("x0", F, [3]), _vi("k0", I64, []), _vi("w0", F, [3])],
                  [_vi("x", F, [3]), _vi("k", I64, [])], opset=opset)


@pytest.mark.parametrize("opset", [11, 16])
def test_loop_runtime_trip_count(tmp_path, rng, opset):
    model = _counter_loop(opset)
    session = kiln.load(_compile(model, tmp_path), poison=True)
    for m, cond in ((5, True), (0, True), (1, True), (3, False)):
        got = _check(session, model, {"M": np.array(m, np.int64), "cond": np.array(cond), "x0": rng.standard_normal(3).astype(np.float32),
                                      "k0": np.array(2, np.int64), "w0": rng.standard_normal(3).astype(np.float32)})
        assert int(got["k"]) == 2 + (m if cond else 0)
        assert session.control.readbacks == 0  # M and cond are inputs; the body passes cond through


def test_loop_condition_from_body(tmp_path, rng):
    """while sum(y) < limit: y = y * 2 + 1 (no trip count; the body computes the condition)."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["y_in", "two"], ["m"]), helper.make_node("Add", ["m", "one"], ["y_out"]),
         helper.make_node("ReduceSum", ["y_out"], ["s"], keepdims=0), helper.make_node("Less", ["s", "limit"], ["c_out"])],
        "body", [_vi("i", I64, []), _vi("c_in", B, []), _vi("y_in", F, [2, 2])],
        [_vi("c_out", B, []), _vi("y_out", F, [2, 2])],
        [numpy_helper.from_array(np.array(2, np.float32), "two"), numpy_helper.from_array(np.array(1, np.float32), "one")])
    model = _model([helper.make_node("Loop", ["", "go", "y0"], ["y"], body=body)],
                   [_vi("go", B, []), _vi("y0", F, [2, 2]), _vi("limit", F, [])], [_vi("y", F, [2, 2])], opset=13)
    session = kiln.load(_compile(model, tmp_path), poison=True)
    for limit in (1000.0, -5.0, 50.0):
        y0 = rng.uniform(0, 1, (2, 2)).astype(np.float32)
        _check(session, model, {"go": np.array(True), "y0": y0, "limit": np.array(limit, np.float32)})
    assert session.control.readbacks > 1  # one per iteration: the body computes the condition


def _scan_loop(trip=4):
    """for i in range(trip) while go: acc += x * i; scan outputs acc and i (stacked); ``go`` is an input, so the
    loop runs at run time (not unrolled)."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=F), helper.make_node("Mul", ["x", "fi"], ["xi"]),
         helper.make_node("Add", ["acc_in", "xi"], ["acc_out"]), helper.make_node("Identity", ["acc_out"], ["row"]),
         helper.make_node("Identity", ["i"], ["irow"]), helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body", [_vi("i", I64, []), _vi("c_in", B, []), _vi("acc_in", F, [2, 3])],
        [_vi("c_out", B, []), _vi("acc_out", F, [2, 3]), _vi("row", F, [2, 3]), _vi("irow", I64, [])])
    return _model([helper.make_node("Loop", ["M", "go", "acc0"], ["acc", "rows", "iters"], body=body)],
                  [_vi("x", F, [2, 3]), _vi("acc0", F, [2, 3]), _vi("go", B, [])],
                  [_vi("acc", F, [2, 3]), _vi("rows", F, [trip, 2, 3]), _vi("iters", I64, [trip])],
                  [("M", np.array(trip, np.int64))], opset=16)


def test_loop_scan_outputs(tmp_path, rng):
    model = _scan_loop()
    session = kiln.load(_compile(model, tmp_path), poison=True)
    plan = json.loads((session.path / "manifest.json").read_text())["targets"]["webgpu"]["plan"]
    assert any("loop" in s for s in plan)
    got = _check(session, model, {"x": rng.standard_normal((2, 3)).astype(np.float32),
                                  "acc0": rng.standard_normal((2, 3)).astype(np.float32), "go": np.array(True)})
    np.testing.assert_array_equal(got["iters"], np.arange(4))
    with pytest.raises(ShapeError, match="ran 0 iterations but its scan outputs were sized for 4"):
        session.run({"x": np.ones((2, 3), np.float32), "acc0": np.ones((2, 3), np.float32), "go": np.array(False)})


def test_loop_with_a_constant_trip_count_is_unrolled(tmp_path, rng):
    """for i in range(3): y = y + x[i:i+1] (Slice starts from the iteration number: they fold once unrolled), and
    the rows as a scan output; onnx's test_loop11 has this shape with a run-time trip count."""
    body = helper.make_graph(
        [helper.make_node("Unsqueeze", ["i", "ax"], ["s"]), helper.make_node("Add", ["s", "one"], ["e"]),
         helper.make_node("Slice", ["x", "s", "e"], ["row"]), helper.make_node("Add", ["y_in", "row"], ["y_out"]),
         helper.make_node("Identity", ["row"], ["scan"]), helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body", [_vi("i", I64, []), _vi("c_in", B, []), _vi("y_in", F, [1])],
        [_vi("c_out", B, []), _vi("y_out", F, [1]), _vi("scan", F, [1])],
        [numpy_helper.from_array(np.array([0], np.int64), "ax"), numpy_helper.from_array(np.array([1], np.int64), "one")])
    model = _model([helper.make_node("Loop", ["M", "", "y0"], ["y", "rows"], body=body)],
                   [_vi("x", F, [5]), _vi("y0", F, [1])], [_vi("y", F, [1]), _vi("rows", F, [3, 1])],
                   [("M", np.array(3, np.int64))], opset=13)
    session = kiln.load(_compile(model, tmp_path), poison=True)
    assert session.control is None  # unrolled: a flat plan
    _check(session, model, {"x": rng.standard_normal(5).astype(np.float32), "y0": rng.standard_normal(1).astype(np.float32)})


def test_loop_scan_outputs_need_a_static_trip_count():
    body = helper.make_graph([helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Cast", ["i"], ["f"], to=F)],
                             "body", [_vi("i", I64, []), _vi("c_in", B, [])], [_vi("c_out", B, []), _vi("f", F, [])])
    model = _model([helper.make_node("Loop", ["M", ""], ["fs"], body=body)], [_vi("M", I64, [])], [_vi("fs", F, ["n"])])
    with pytest.raises(ConstantInputError, match="trip count M known at compile time"):
        import_model(model)


def _loop_with_if():
    """for i in range(M): x = x + 1 if i is even else x * -0.5 (the If's condition changes every iteration)."""
    then_g = helper.make_graph([helper.make_node("Add", ["x_in", "one"], ["a"])], "even", [], [_vi("a", F, [3])])
    else_g = helper.make_graph([helper.make_node("Mul", ["x_in", "mhalf"], ["b"])], "odd", [], [_vi("b", F, [3])])
    body = helper.make_graph(
        [helper.make_node("Mod", ["i", "two"], ["r"]), helper.make_node("Equal", ["r", "zero"], ["even"]),
         helper.make_node("If", ["even"], ["x_out"], then_branch=then_g, else_branch=else_g),
         helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body", [_vi("i", I64, []), _vi("c_in", B, []), _vi("x_in", F, [3])], [_vi("c_out", B, []), _vi("x_out", F, [3])],
        [numpy_helper.from_array(np.array(2, np.int64), "two"), numpy_helper.from_array(np.array(0, np.int64), "zero")])
    model = _model([helper.make_node("Loop", ["M", "", "x0"], ["x"], body=body)],
                   [_vi("M", I64, []), _vi("x0", F, [3])], [_vi("x", F, [3])],
                   [("one", np.array(1, np.float32)), ("mhalf", np.array(-0.5, np.float32))])
    return model


def test_loop_with_runtime_if_in_its_body(tmp_path, rng):
    model = _loop_with_if()
    session = kiln.load(_compile(model, tmp_path), poison=True)
    for m in (0, 1, 4, 7):
        _check(session, model, {"M": np.array(m, np.int64), "x0": rng.standard_normal(3).astype(np.float32)})
        assert session.control.readbacks == m  # one If condition per iteration


# ----------------------------------------------------------------------------- Scan, LSTM, GRU (unrolled)
def test_scan_two_states_two_inputs_axes_and_directions(rng):
    body = helper.make_graph(
        [helper.make_node("Add", ["s", "a"], ["s2"]), helper.make_node("Mul", ["p", "b"], ["p2"]),
         helper.make_node("Sub", ["s2", "p2"], ["y"])], "body",
        [_vi("s", F, [3]), _vi("p", F, [3]), _vi("a", F, [3]), _vi("b", F, [3])],
        [_vi("s2", F, [3]), _vi("p2", F, [3]), _vi("y", F, [3])])
    check_op("Scan", {"s0": rng.standard_normal(3).astype(np.float32), "p0": rng.standard_normal(3).astype(np.float32),
                      "xa": rng.standard_normal((4, 3)).astype(np.float32),
                      "xb": rng.uniform(0.5, 1.5, (3, 4)).astype(np.float32)},
             {"body": body, "num_scan_inputs": 2, "scan_input_axes": [0, 1], "scan_input_directions": [0, 1],
              "scan_output_axes": [1], "scan_output_directions": [1]}, opset=16, n_outputs=3)


@pytest.mark.parametrize("kind,direction,lbr,initial,layout", [
    ("GRU", "forward", 0, False, 0), ("GRU", "bidirectional", 0, True, 1), ("LSTM", "reverse", 0, False, 0),
    ("LSTM", "forward", 0, True, 1), ("RNN", "bidirectional", 0, False, 0)])
def test_recurrent_variants(rng, kind, direction, lbr, initial, layout):
    """Directions, linear_before_reset=0, no initial state (zeros), batch-first layout, every output."""
    seq, batch, inp, hidden = 3, 2, 4, 3
    dirs = 2 if direction == "bidirectional" else 1
    g = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    inits = {"w": rng.uniform(-0.5, 0.5, (dirs, g * hidden, inp)).astype(np.float32),
             "r": rng.uniform(-0.5, 0.5, (dirs, g * hidden, hidden)).astype(np.float32),
             "b": rng.uniform(-0.5, 0.5, (dirs, 2 * g * hidden)).astype(np.float32)}
    x_shape = (batch, seq, inp) if layout else (seq, batch, inp)
    h_shape = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32)}
    order = ["x", "w", "r", "b"]
    if initial:
        inits[""] = np.zeros(0, np.float32)
        feeds["h0"] = rng.standard_normal(h_shape).astype(np.float32)
        order += ["", "h0"]
        if kind == "LSTM":
            feeds["c0"] = rng.standard_normal(h_shape).astype(np.float32)
            order.append("c0")
    attrs = {"hidden_size": hidden, "direction": direction, "layout": layout}
    if kind == "GRU":
        attrs["linear_before_reset"] = lbr
    # onnxruntime does not run batch-first (layout=1) recurrences: those compare with onnx's reference evaluator
    check_op(kind, feeds, attrs, inits, opset=14, atol=1e-5, input_order=order, n_outputs=3 if kind == "LSTM" else 2,
             oracle="onnx" if layout else "onnxruntime")


def test_lstm_peepholes(rng):
    seq, batch, inp, hidden = 3, 2, 3, 4
    inits = {"w": rng.uniform(-0.5, 0.5, (1, 4 * hidden, inp)).astype(np.float32),
             "r": rng.uniform(-0.5, 0.5, (1, 4 * hidden, hidden)).astype(np.float32),
             "b": rng.uniform(-0.5, 0.5, (1, 8 * hidden)).astype(np.float32), "": np.zeros(0, np.float32),
             "p": rng.uniform(-0.5, 0.5, (1, 3 * hidden)).astype(np.float32)}
    feeds = {"x": rng.standard_normal((seq, batch, inp)).astype(np.float32),
             "h0": rng.standard_normal((1, batch, hidden)).astype(np.float32),
             "c0": rng.standard_normal((1, batch, hidden)).astype(np.float32)}
    check_op("LSTM", feeds, {"hidden_size": hidden}, inits, opset=14, atol=1e-5,
             input_order=["x", "w", "r", "b", "", "h0", "c0", "p"], n_outputs=3)


# ----------------------------------------------------------------------------- in the browser (kiln.js, WebGPU)
@pytest.mark.browser
def test_loop_and_if_on_webgpu_in_chromium(rng):
    """The Loop with a run-time If in its body, and the counter Loop, on kiln.js's WebGPU backend (control.js)."""
    from browser import CHROMIUM, close_shared_runner
    from opcheck import run_in_browser

    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing (Debian package chromium)")
    try:
        cases = [(_counter_loop(), {"M": np.array(4, np.int64), "cond": np.array(True),
                                    "x0": rng.standard_normal(3).astype(np.float32), "k0": np.array(2, np.int64),
                                    "w0": rng.standard_normal(3).astype(np.float32)}),
                 (_if_model(), {"x": rng.standard_normal((3, 4)).astype(np.float32), "t": np.array(0.5, np.float32)})]
        body_if = _loop_with_if()
        cases += [(body_if, {"M": np.array(m, np.int64), "x0": rng.standard_normal(3).astype(np.float32)}) for m in (0, 5)]
        for model, feeds in cases:
            got = run_in_browser(model, feeds, "browser:webgpu", name="control")
            expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
            for o, e in zip(model.graph.output, expected):
                np.testing.assert_allclose(got[o.name], e, atol=1e-5, rtol=1e-5, err_msg=o.name)
    finally:
        close_shared_runner()
