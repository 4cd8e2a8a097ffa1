"""Beam search's state (issue 17): a cache of several hypotheses that a step at a smaller run-time batch writes the
first entries of (TensorScatter with fewer update entries than the cache, Kiln's extension) and that the runtimes
reorder between steps (``reorder_state``, kiln.js ``reorderState``): natively on webgpu, wasm and cpu, and in
Chromium on WebGPU and wasm. Each step is checked against a numpy model of the cache.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.arith import symbolic
from kiln.errors import KilnError
from kiln.ir.graph import Builder, Graph, Value
from kiln.package.writer import write_package
from tests.browser import ConsoleLog, serving

BEAMS, HEADS, ROWS, DIM = 3, 2, 8, 2


def _graph() -> Graph:
    """A KV cache ``[3, 2, 8, 2]`` as state; input ``x [beam, 2, 1, 2]`` written at row ``past_sequence_length``
    of the first ``beam`` entries; output the rows in use, ``[beam, 2, past + 1, 2]``, plus one to show a reader."""
    g = Graph(name="beam_state")
    beam = symbolic.size_var("beam", 0, 1, BEAMS, opt=1)
    past = symbolic.size_var("past_sequence", 1, 0, ROWS - 1)
    g.size_vars = {"beam": beam, "past_sequence": past}
    x = Value("x", "float32", (beam, HEADS, 1, DIM), sym_shape=("beam", HEADS, 1, DIM))
    write = Value("past_sequence_length", "int64", (1,))
    cache = Value("cache", "float32", (BEAMS, HEADS, ROWS, DIM))
    g.inputs += [x, write, cache]
    g.value_dims = {write.name: "past_sequence"}
    g.state[cache.name] = "present"
    b = Builder(g)
    writes = b.op("Add", [b.op("Iota", [], shape=(beam,), start=0, delta=0, dtype="int64"), write])
    present = b.op("TensorScatter", [cache, x, writes], axis=2, mode="linear")
    rows = b.op("Slice", [present], starts=(0, 0, 0, 0), ends=(beam, HEADS, symbolic.simplify(past + 1), DIM),
                steps=(1, 1, 1, 1))
    keys = b.op("Add", [rows, b.const(np.array(1.0, np.float32))])
    keys.name = "keys"
    present.name = "present"
    g.outputs = [keys, present]
    return g


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    from kiln.compiler import compile_graph

    out = tmp_path_factory.mktemp("beam_state") / "pkg"
    write_package(compile_graph(_graph(), "webgpu,wasm,cpu", validate=False, device_class="cpu"), out)
    return out


def _steps(rng) -> list[tuple[np.ndarray, list[int] | None]]:
    """(the step's new rows, the reorder after it): a prompt at beam 1 copied to three hypotheses, then steps at
    three with swaps, a cycle and duplicates."""
    out = [(rng.standard_normal((1, HEADS, 1, DIM)).astype(np.float32), [0, 0, 0])]
    for order in ([2, 0, 1], [1, 1, 0], [0, 2, 2], None):
        out.append((rng.standard_normal((BEAMS, HEADS, 1, DIM)).astype(np.float32), order))
    return out


@pytest.mark.parametrize("target", ["webgpu", "wasm", "cpu"])
def test_reorder_state_matches_a_numpy_cache(package, target, rng):
    session = kiln.load(package, target=target)
    cache = np.zeros((BEAMS, HEADS, ROWS, DIM), np.float32)
    for past, (x, order) in enumerate(_steps(rng)):
        out = session.run({"x": x, "past_sequence_length": np.array([past], np.int64)})
        n = x.shape[0]
        cache[:n, :, past] = x[:, :, 0]
        np.testing.assert_array_equal(out["keys"], cache[:n, :, :past + 1] + 1)
        if order is not None:
            session.reorder_state(order)
            cache[:len(order)] = cache[order]
    with pytest.raises(KilnError, match="does not fit state 'cache' of 3 hypotheses"):
        session.reorder_state([0, 3])


def test_tensor_scatter_of_fewer_entries_into_a_new_buffer(tmp_path, rng):
    """The functional kernel (the cache is read by another node too, so not updated in place): entries past the
    update's are the cache's, on every target."""
    from kiln.compiler import compile_graph

    g = Graph(name="scatter_fewer")
    beam = symbolic.size_var("beam", 0, 1, BEAMS, opt=1)
    g.size_vars = {"beam": beam}
    x = Value("x", "float32", (beam, HEADS, 2, DIM), sym_shape=("beam", HEADS, 2, DIM))
    at = Value("write", "int64", (beam,), sym_shape=("beam",))
    cache = Value("cache", "float32", (BEAMS, HEADS, ROWS, DIM))
    g.inputs += [x, at, cache]
    b = Builder(g)
    y = b.op("TensorScatter", [cache, x, at], axis=2, mode="circular")
    z = b.op("Neg", [cache])
    y.name, z.name = "y", "z"
    g.outputs = [y, z]
    write_package(compile_graph(g, "webgpu,wasm,cpu", validate=False, device_class="cpu"), tmp_path / "pkg")
    feeds = {"x": rng.standard_normal((2, HEADS, 2, DIM)).astype(np.float32), "write": np.array([3, 7], np.int64),
             "cache": rng.standard_normal((BEAMS, HEADS, ROWS, DIM)).astype(np.float32)}
    want = feeds["cache"].copy()
    want[0, :, 3:5] = feeds["x"][0]
    want[1, :, [7, 0]] = feeds["x"][1].transpose(1, 0, 2)
    for target in ("webgpu", "wasm", "cpu"):
        out = kiln.load(tmp_path / "pkg", target=target).run(feeds)
        np.testing.assert_array_equal(out["y"], want, err_msg=target)
        np.testing.assert_array_equal(out["z"], -feeds["cache"], err_msg=target)


#: runs the steps in kiln.js (each step's new rows and reorder), returning each step's keys
BROWSER_STEPS = """async ({target, steps}) => {
  const kiln = await import('./kiln.js');
  const session = await kiln.load('./', {target});
  const out = [];
  try {
    for (const [past, {x, dims, order}] of steps.entries()) {
      const {keys} = await session.run({x: new kiln.Tensor('float32', Float32Array.from(x), dims),
        past_sequence_length: new kiln.Tensor('int64', BigInt64Array.of(BigInt(past)), [1])});
      out.push({dims: keys.dims, data: Array.from(keys.data)});
      if (order) await session.reorderState(order);
    }
    try { await session.reorderState([0, 3]); out.push('no error'); } catch (e) { out.push(`${e.name}: ${e.message}`); }
  } finally {
    session.destroy();
  }
  return out;
}"""


@pytest.mark.browser
@pytest.mark.parametrize("target", ["webgpu", "wasm"])
def test_reorder_state_in_chromium(package, browser, target, rng):
    steps = _steps(rng)
    page = browser.new_page()
    log = ConsoleLog(page)
    try:
        with serving(package) as url:
            page.goto(url + "manifest.json")
            got = log.evaluate(BROWSER_STEPS, {"target": target, "steps": [
                {"x": x.reshape(-1).tolist(), "dims": list(x.shape), "order": order} for x, order in steps]})
    finally:
        page.close()
    cache = np.zeros((BEAMS, HEADS, ROWS, DIM), np.float32)
    for past, ((x, order), out) in enumerate(zip(steps, got)):
        n = x.shape[0]
        cache[:n, :, past] = x[:, :, 0]
        want = cache[:n, :, :past + 1] + 1
        assert out["dims"] == list(want.shape)
        np.testing.assert_array_equal(np.asarray(out["data"], np.float32).reshape(want.shape), want)
        if order is not None:
            cache[:len(order)] = cache[order]
    assert got[-1] == "KilnError: reorderState: order [0,3] does not fit state 'cache' of 3 hypotheses"
