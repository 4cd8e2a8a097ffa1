"""Run-time dims in headless Chromium (kiln.js, WebGPU on SwiftShader, and WebAssembly): MiniLM at two shapes from
one package and one session, against onnxruntime; bad shapes are refused with a ShapeError naming the input and the
dim."""

from __future__ import annotations

import base64
import json

import numpy as np
import onnxruntime as ort
import pytest
from browser import CHROMIUM, evaluate_in_package
from conftest import SHARED_MODELS

import kiln

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (Debian package chromium)"),
]

MODEL = SHARED_MODELS / "all_minilm_l6_v2.onnx"

#: loads the package once, then runs it on each base64 int64 feed set; returns the outputs as base64 float32
RUN_SHAPES = """async ({runs, target}) => {
  const kiln = await import('./kiln.js');
  const session = await kiln.load('./', {target, poison: true});
  const decode = (text) => new BigInt64Array(Uint8Array.from(atob(text), (c) => c.charCodeAt(0)).buffer);
  const results = [];
  try {
    for (const feeds of runs) {
      const inputs = {};
      for (const [name, {dims, data}] of Object.entries(feeds)) inputs[name] = new kiln.Tensor('int64', decode(data), dims);
      const {last_hidden_state: h} = await session.run(inputs);
      const raw = new Uint8Array(h.data.buffer, h.data.byteOffset, h.data.byteLength);
      let text = '';
      for (let i = 0; i < raw.length; i += 8192) text += String.fromCharCode(...raw.subarray(i, i + 8192));
      results.push({dims: h.dims, data: btoa(text)});
    }
    const ids = new kiln.Tensor('int64', new BigInt64Array(2 * 3), [2, 3]);
    const mask = new kiln.Tensor('int64', new BigInt64Array(2 * 4), [2, 4]);
    try {
      await session.run({input_ids: ids, attention_mask: mask, token_type_ids: ids});
      results.push('no error');
    } catch (error) {
      results.push(`${error.name}: ${error.message}`);
    }
  } finally {
    session.destroy();
  }
  return results;
}"""


def _feeds(rng, batch, seq):
    ids = rng.integers(1000, 30000, (batch, seq)).astype(np.int64)
    mask = np.ones((batch, seq), np.int64)
    mask[-1, seq // 2:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros((batch, seq), np.int64)}


@pytest.fixture(scope="module")
def minilm_package(tmp_path_factory):
    return kiln.compile(MODEL, tmp_path_factory.mktemp("dyn") / "minilm", dims={"batch": (1, 4), "seq": (1, 64, 16)},
                        device_class="cpu", target="webgpu,wasm,webgl2")


def _run_and_check(browser, pkg, runs, target) -> list:
    """Run ``runs`` (feed dicts) in Chromium through RUN_SHAPES from one session of ``pkg`` on ``target``; check each
    output against onnxruntime within 1e-4 and return the rest of the page's results (the bad-shape run)."""
    wire = [{k: {"dims": list(v.shape), "data": base64.b64encode(v.tobytes()).decode()} for k, v in f.items()}
            for f in runs]
    results = evaluate_in_package(browser, pkg, RUN_SHAPES, {"runs": wire, "target": target})
    ref = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    for feeds, got in zip(runs, results):
        want = ref.run(["last_hidden_state"], feeds)[0]
        assert got["dims"] == list(want.shape)
        out = np.frombuffer(base64.b64decode(got["data"]), np.float32).reshape(want.shape)
        assert np.abs(out - want).max() <= 1e-4, want.shape
    return results[len(runs):]


@pytest.mark.parametrize("target", ["webgpu", "wasm", "webgl2"])
def test_minilm_two_shapes_one_package(browser, minilm_package, rng, target):
    rest = _run_and_check(browser, minilm_package, [_feeds(rng, 1, 7), _feeds(rng, 2, 12)], target)
    assert rest[0] == ("ShapeError: inconsistent dim seq: input 'attention_mask' dim 1 is 4 but input "
                       "'input_ids' gave 3")


@pytest.fixture(scope="module")
def growable_package(tmp_path_factory):
    """MiniLM compiled with no dims: by default its batch and seq are growable (docs/dynamic-shapes.md *Growable
    buffers*)."""
    return kiln.compile(MODEL, tmp_path_factory.mktemp("grow") / "minilm",
                        device_class="cpu", target="webgpu,wasm,webgl2")


@pytest.mark.parametrize("target", ["webgpu", "wasm", "webgl2"])
def test_minilm_growable_package_in_chromium(browser, growable_package, rng, target):
    """kiln.js grows the WebGPU buffers (new buffers and bind groups), the wasm arena (memory.grow, the workers
    told the new addresses) and the WebGL2 textures (more rows, framebuffers attached again) as the shapes grow, and
    keeps them when they shrink: each run within 1e-4 of onnxruntime."""
    # (WebGL2 on SwiftShader is the slowest: its runs are smaller, each larger one still growing the textures)
    runs = ([_feeds(rng, 1, 3), _feeds(rng, 2, 12), _feeds(rng, 1, 5), _feeds(rng, 2, 16)] if target == "webgl2"
            else [_feeds(rng, 1, 3), _feeds(rng, 4, 24), _feeds(rng, 1, 5), _feeds(rng, 8, 40)])
    rest = _run_and_check(browser, growable_package, runs, target)
    assert rest[0].startswith("ShapeError: inconsistent dim seq")


OWN_DEVICE_LIMITS = """async () => {
  const kiln = await import('./kiln.js');
  const session = await kiln.load('./', {target: 'webgpu', device: 'own'});
  const adapter = await navigator.gpu.requestAdapter({powerPreference: 'high-performance'});
  const names = ['maxStorageBufferBindingSize', 'maxBufferSize'];
  const result = names.map((n) => [session.device.limits[n], adapter.limits[n]]);
  session.destroy();
  return result;
}"""


def test_growable_package_on_its_own_device_asks_for_the_largest_buffers(browser, growable_package):
    """A growable package on a device of its own (kiln.js ``device: 'own'``) requests the adapter's largest buffers,
    not the first sizes its manifest's limits name, so that its buffers can grow as far as the GPU allows."""
    limits = evaluate_in_package(browser, growable_package, OWN_DEVICE_LIMITS)
    assert all(have == adapter for have, adapter in limits), limits
    m = json.loads((growable_package / "manifest.json").read_text())
    assert m["targets"]["webgpu"]["limits"]["maxStorageBufferBindingSize"] < limits[0][1]
