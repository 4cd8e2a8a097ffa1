"""ONNX random operators (kiln/frontend/onnx/ops/random.py): statistical tests of the draws (moments and
Kolmogorov-Smirnov against the exact distribution), Bernoulli and Multinomial frequencies on webgpu, wasm and cpu,
reproducibility by seed, fresh draws at every run (the same sequence from a fresh session, the same bits on every
target), draws of run-time shape, and a model whose random term is multiplied by zero against onnxruntime exactly."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.errors import KilnError

#: Kolmogorov-Smirnov critical value at significance 0.001, times sqrt(n)
KS_001 = 1.95


def _model(nodes, inputs, outputs, opset=17):
    graph = helper.make_graph(nodes, "random", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _run(tmp_path, model, feeds, target="webgpu", **compile_kw):
    onnx.save(model, tmp_path / "m.onnx")
    pkg = kiln.compile(tmp_path / "m.onnx", tmp_path / f"pkg_{target}", target=target, force=True,
                       **({"wasm_threads": False} if target == "wasm" else {}), **compile_kw)
    return kiln.load(pkg, target=target, poison=True).run(feeds)


def _ks(sample: np.ndarray, cdf) -> float:
    x = np.sort(sample.astype(np.float64))
    f = cdf(x)
    n = len(x)
    return float(max(np.max(np.arange(1, n + 1) / n - f), np.max(f - np.arange(n) / n)))


def test_uniform_and_normal_draws(tmp_path):
    """RandomUniform in [low, high) and RandomNormal with mean and scale: moments and a KS test on 100k draws;
    the Like forms take the input's shape and dtype."""
    n = 100_000
    out = [helper.make_tensor_value_info(k, TensorProto.FLOAT, [n]) for k in ("u", "z", "ul", "zl")]
    nodes = [helper.make_node("RandomUniform", [], ["u"], shape=[n], low=-2.0, high=3.0, seed=1.0),
             helper.make_node("RandomNormal", [], ["z"], shape=[n], mean=1.5, scale=0.5, seed=2.0),
             helper.make_node("RandomUniformLike", ["x"], ["ul"], seed=3.0),
             helper.make_node("RandomNormalLike", ["x"], ["zl"], seed=4.0)]
    got = _run(tmp_path, _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])], out),
               {"x": np.zeros(n, np.float32)})
    u, z, ul, zl = got["u"], got["z"], got["ul"], got["zl"]
    assert u.min() >= -2.0 and u.max() < 3.0 and ul.min() >= 0.0 and ul.max() < 1.0
    assert _ks(u, lambda x: (x + 2.0) / 5.0) < KS_001 / math.sqrt(n)
    assert _ks(ul, lambda x: x) < KS_001 / math.sqrt(n)
    phi = np.vectorize(lambda t: 0.5 * (1.0 + math.erf(t / math.sqrt(2.0))))
    assert _ks(z, lambda x: phi((x - 1.5) / 0.5)) < KS_001 / math.sqrt(n)
    assert _ks(zl, phi) < KS_001 / math.sqrt(n)
    assert abs(z.mean() - 1.5) < 5 * 0.5 / math.sqrt(n) and abs(z.std() - 0.5) < 0.01
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 5 / math.sqrt(n)  # neighbouring counters are independent
    assert not np.array_equal(ul, (u + 2.0) / 5.0)  # other seeds, other draws


def test_draws_are_reproducible_by_seed(tmp_path):
    """The same seed gives the same values (compiled twice), another seed other values."""
    def draw(seed, where):
        node = helper.make_node("RandomNormal", [], ["z"], shape=[64], seed=seed)
        (where).mkdir()
        return _run(where, _model([node], [], [helper.make_tensor_value_info("z", TensorProto.FLOAT, [64])]), {})["z"]

    a, b, c = draw(7.0, tmp_path / "a"), draw(7.0, tmp_path / "b"), draw(8.0, tmp_path / "c")
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - c).max() > 0.1


def test_fresh_draws_every_run(tmp_path):
    """Each run draws afresh (the package's run counter); a freshly loaded session replays the same sequence, on every
    target bit for bit (uniforms are exact multiples of 2^-24); successive runs pass the KS test pooled."""
    n = 4096
    model = _model([helper.make_node("RandomUniform", [], ["u"], shape=[n], seed=5.0)], [],
                   [helper.make_tensor_value_info("u", TensorProto.FLOAT, [n])])
    onnx.save(model, tmp_path / "m.onnx")
    pkg = kiln.compile(tmp_path / "m.onnx", tmp_path / "pkg", target="webgpu,wasm,cpu", wasm_threads=False)
    sessions = {t: kiln.load(pkg, target=t) for t in ("webgpu", "wasm", "cpu")}
    runs = {t: [s.run({})["u"] for _ in range(3)] for t, s in sessions.items()}
    first = runs["webgpu"]
    assert not np.array_equal(first[0], first[1]) and not np.array_equal(first[1], first[2])
    for t in ("wasm", "cpu"):
        for a, b in zip(first, runs[t]):
            np.testing.assert_array_equal(a, b, err_msg=t)
    again = kiln.load(pkg, target="webgpu")
    np.testing.assert_array_equal(again.run({})["u"], first[0])
    pooled = np.concatenate(first)
    assert _ks(pooled, lambda x: x) < KS_001 / math.sqrt(pooled.size)
    assert abs(np.corrcoef(first[0], first[1])[0, 1]) < 5 / math.sqrt(n)  # runs are independent


def test_draws_of_run_time_shape(tmp_path):
    """RandomNormalLike of an input with a run-time dim: one package, draws of the fed length."""
    model = _model([helper.make_node("RandomNormalLike", ["x"], ["z"], seed=1.0)],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                   [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n"])])
    onnx.save(model, tmp_path / "m.onnx")
    session = kiln.load(kiln.compile(tmp_path / "m.onnx", tmp_path / "pkg", dims={"n": (1, 50_000)}))
    for n in (3, 50_000):
        z = session.run({"x": np.zeros(n, np.float32)})["z"]
        assert z.shape == (n,) and np.isfinite(z).all()
    phi = np.vectorize(lambda t: 0.5 * (1.0 + math.erf(t / math.sqrt(2.0))))
    assert _ks(z, phi) < KS_001 / math.sqrt(z.size)


@pytest.mark.parametrize("target", ["webgpu", "wasm", "cpu"])
def test_bernoulli_frequencies(tmp_path, rng, target):
    """Bernoulli of per-column probabilities: each column's frequency within 5 standard deviations of its p."""
    rows, cols = 4000, 6
    p = np.broadcast_to(np.array([0.0, 0.05, 0.3, 0.5, 0.9, 1.0], np.float32), (rows, cols)).copy()
    node = helper.make_node("Bernoulli", ["p"], ["y"], seed=5.0)
    model = _model([node], [helper.make_tensor_value_info("p", TensorProto.FLOAT, [rows, cols])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, cols])], opset=15)
    y = _run(tmp_path, model, {"p": p}, target)["y"]
    assert set(np.unique(y)) <= {0.0, 1.0}
    freq = y.mean(0)
    sigma = np.sqrt(p[0] * (1 - p[0]) / rows)
    assert np.all(np.abs(freq - p[0]) <= 5 * sigma + 1e-9), (freq, p[0])


@pytest.mark.parametrize("target", ["webgpu", "wasm", "cpu"])
def test_multinomial_frequencies(tmp_path, target):
    """Multinomial (Gumbel-max) from unnormalised log probabilities: each class's frequency over 4000 samples
    within 5 standard deviations of its softmax probability; int32 and int64 outputs."""
    logits = np.log(np.array([[0.1, 0.2, 0.3, 0.4, 0.0001], [5.0, 1.0, 1.0, 1.0, 2.0]], np.float32))
    samples = 4000
    node = helper.make_node("Multinomial", ["x"], ["y"], sample_size=samples, seed=9.0, dtype=TensorProto.INT32)
    model = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
                   [helper.make_tensor_value_info("y", TensorProto.INT32, [2, samples])])
    y = _run(tmp_path, model, {"x": logits}, target)["y"]
    assert y.dtype == np.int32 and y.shape == (2, samples) and y.min() >= 0 and y.max() < 5
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    for row in range(2):
        freq = np.bincount(y[row], minlength=5) / samples
        sigma = np.sqrt(probs[row] * (1 - probs[row]) / samples)
        assert np.all(np.abs(freq - probs[row]) <= 5 * sigma + 2e-3), (row, freq, probs[row])


def test_random_term_times_zero_matches_onnxruntime(tmp_path, rng):
    """``x + RandomNormalLike(x) * 0``: the model's output is exactly onnxruntime's."""
    x = rng.standard_normal((3, 8)).astype(np.float32)
    nodes = [helper.make_node("RandomNormalLike", ["x"], ["n"]),
             helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])),
             helper.make_node("Mul", ["n", "zero"], ["nz"]), helper.make_node("Add", ["x", "nz"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 8])])
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for target in ("webgpu", "wasm"):
        np.testing.assert_array_equal(_run(tmp_path, model, {"x": x}, target)["y"], want)


def test_random_ops_refuse_integer_dtypes(tmp_path):
    node = helper.make_node("RandomUniform", [], ["y"], shape=[4], dtype=TensorProto.INT32)
    model = _model([node], [], [helper.make_tensor_value_info("y", TensorProto.INT32, [4])])
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(KilnError, match="dtype int32 is not supported"):
        kiln.compile(tmp_path / "m.onnx", tmp_path / "pkg")


#: loads the package, runs it ``runs`` times on ``feeds`` (name -> float32 array) and returns each run's outputs
RUNS_IN_PAGE = """async ({target, runs, feeds}) => {
  const kiln = await import('./kiln.js');
  const session = await kiln.load('./', {target, poison: true});
  const inputs = {};
  for (const [name, {dims, data}] of Object.entries(feeds)) inputs[name] = new kiln.Tensor('float32', Float32Array.from(data), dims);
  const results = [];
  try {
    for (let i = 0; i < runs; i++) {
      const out = await session.run(inputs);
      results.push(Object.fromEntries(Object.entries(out).map(([k, t]) => [k, Array.from(t.data)])));
    }
  } finally {
    session.destroy();
  }
  return results;
}"""


@pytest.mark.browser
def test_random_ops_on_webgl2_in_chromium(tmp_path, browser):
    """WebGL2 kernels cannot update the run counter in place: the package computes the next value into another
    texture and kiln.js copies it back after every run (format 1.12 ``state[].update_buffer``). Three runs in
    Chromium draw what the webgpu target draws run for run (uniforms and Bernoulli bit for bit, normals to float
    rounding), afresh each run; a package with both targets is refused."""
    from browser import evaluate_in_package

    n, rows = 4096, 2000
    p = np.broadcast_to(np.array([0.1, 0.5, 0.9], np.float32), (rows, 3)).copy()
    nodes = [helper.make_node("RandomUniform", [], ["u"], shape=[n], seed=5.0),
             helper.make_node("RandomNormal", [], ["z"], shape=[n], seed=2.0),
             helper.make_node("Bernoulli", ["p"], ["y"], seed=3.0)]
    model = _model(nodes, [helper.make_tensor_value_info("p", TensorProto.FLOAT, [rows, 3])],
                   [helper.make_tensor_value_info("u", TensorProto.FLOAT, [n]),
                    helper.make_tensor_value_info("z", TensorProto.FLOAT, [n]),
                    helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, 3])], opset=15)
    onnx.save(model, tmp_path / "m.onnx")
    pkg = kiln.compile(tmp_path / "m.onnx", tmp_path / "gl", target="webgl2")
    native = kiln.load(kiln.compile(tmp_path / "m.onnx", tmp_path / "gpu", target="webgpu"))
    want = [native.run({"p": p}) for _ in range(3)]
    got = evaluate_in_package(browser, pkg, RUNS_IN_PAGE, {"target": "webgl2", "runs": 3,
                                                           "feeds": {"p": {"dims": [rows, 3], "data": p.ravel().tolist()}}})
    for run, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(np.float32(g["u"]), w["u"], err_msg=f"run {run}")
        np.testing.assert_array_equal(np.float32(g["y"]).reshape(rows, 3), w["y"], err_msg=f"run {run}")
        np.testing.assert_allclose(np.float32(g["z"]), w["z"], rtol=1e-5, atol=1e-5, err_msg=f"run {run}")
    assert not np.array_equal(got[0]["u"], got[1]["u"]) and not np.array_equal(got[1]["u"], got[2]["u"])
    with pytest.raises(KilnError, match="copied back by webgl2; compile those in separate packages"):
        kiln.compile(tmp_path / "m.onnx", tmp_path / "both", target="webgpu,webgl2")
