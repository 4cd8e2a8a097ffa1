"""GPU-resident inputs and outputs of kiln.js (GPUTensor, run(feeds, {output: 'gpu'})), the page's shared
device and its pipeline cache, in headless Chromium on WebGPU (SwiftShader); checked against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from browser import CHROMIUM, ConsoleLog, serving_tree
from test_gpu_io import _head, _ints, _mlp

import kiln

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (Debian package chromium)"),
]

#: loads mlp, head, ints (and mlp_again) on the shared device, an mlp on a device of its own; runs the checks
SCRIPT = """async ({x, ids}) => {
  const kiln = await import('./mlp/kiln.js');
  const out = {};
  const mlp = await kiln.load('./mlp/');
  const head = await kiln.load('./head/');
  out.sameDevice = mlp.device === head.device && mlp.device instanceof GPUDevice;
  const xt = new kiln.Tensor('float32', Float32Array.from(x), [2, 8]);
  const host = await mlp.run({x: xt});
  const xg = await mlp.upload(xt);
  out.upload = {type: xg.type, dims: xg.dims, byteLength: xg.byteLength, isGPU: xg instanceof kiln.GPUTensor};
  const g = await mlp.run({x: xg}, {output: 'gpu'});
  out.gpuOutputs = Object.entries(g).map(([k, t]) => [k, t instanceof kiln.GPUTensor, t.dims]);
  out.host = {h: Array.from(host.h.data), s: Array.from(host.s.data)};
  out.gpu = {h: Array.from((await g.h.read()).data), s: Array.from((await g.s.download()).data)};
  // outputs and read: s alone, its read back recorded with the run (a later run changes nothing of it)
  const only = await mlp.run({x: xg}, {output: 'gpu', outputs: ['s'], read: ['s']});
  await mlp.run({x: new kiln.Tensor('float32', Float32Array.from(x, (v) => v - 1), [2, 8])}, {output: 'gpu'});
  out.only = {names: Object.keys(only), s: Array.from((await only.s.read()).data),
              again: Array.from((await only.s.read()).data),
              host: Object.keys(await mlp.run({x: xt}, {outputs: ['h']}))};
  const p = await head.run({h: g.h}, {output: 'gpu'});               // chained on the GPU
  out.p = Array.from((await p.p.read()).data);
  // outputs stay valid after later runs
  const other = new kiln.Tensor('float32', Float32Array.from(x, (v) => v + 1), [2, 8]);
  const later = await mlp.run({x: other}, {output: 'gpu'});
  await mlp.run({x: other});
  out.gStillH = Array.from((await g.h.read()).data);
  out.laterH = Array.from((await later.h.read()).data);
  // GPU feed, host output, and time() with a GPU feed
  out.mixedS = Array.from((await mlp.run({x: xg})).s.data);
  out.timed = (await mlp.time({x: xg}, {repeat: 2, warmup: 0})).times.length;
  // int64 and bool through the GPU
  const ints = await kiln.load('./ints/');
  const idsG = await ints.upload({ids: new kiln.Tensor('int64', BigInt64Array.from(ids.map(BigInt)), [6])});
  const io = await ints.run(idsG, {output: 'gpu'});
  const j = await io.j.read(), big = await io.big.read();
  out.ints = {j: Array.from(j.data, String), jType: j.type, big: Array.from(big.data), bigType: big.type};
  // errors
  const error = async (fn) => { try { await fn(); return 'no error'; } catch (e) { return `${e.name}: ${e.message}`; } };
  const wrongType = await mlp.upload(new kiln.Tensor('int32', new Int32Array(16), [2, 8]));
  const wrongShape = await mlp.upload(new kiln.Tensor('float32', new Float32Array(16), [8, 2]));
  const own = await kiln.load('./mlp/', {device: 'own'});
  const destroyed = await mlp.upload(xt);
  destroyed.destroy();
  out.errors = {
    dtype: await error(() => mlp.run({x: wrongType})),
    shape: await error(() => mlp.run({x: wrongShape})),
    device: await error(() => own.run({x: xg})),
    destroyed: await error(() => mlp.run({x: destroyed})),
    read: await error(() => destroyed.read()),
    output: await error(() => mlp.run({x: xt}, {output: 'host'})),
    unknownOutput: await error(() => mlp.run({x: xt}, {output: 'gpu', outputs: ['s', 'nope']})),
    readHost: await error(() => mlp.run({x: xt}, {read: ['s']})),
    readNotReturned: await error(() => mlp.run({x: xt}, {output: 'gpu', outputs: ['s'], read: ['h']})),
    badDevice: await error(() => kiln.load('./mlp/', {device: 'gpu0'})),
  };
  out.ownDifferent = own.device !== mlp.device;
  out.ownS = Array.from((await own.run({x: await own.upload(xt)})).s.data);
  // the pipeline cache: a second session, a package sharing kernels, a device of its own
  const kernels = mlp.manifest.targets.webgpu.kernels.length;
  const again = await kiln.load('./mlp/');
  const twin = await kiln.load('./mlp_again/');
  const onGiven = await kiln.load('./head/', {device: own.device});
  out.cache = {kernels, first: mlp.pipelineHits, again: again.pipelineHits, twin: twin.pipelineHits,
               own: own.pipelineHits, givenSame: onGiven.device === own.device, loadMs: Object.keys(again.loadMs)};
  // destroying one session on the shared device leaves the others running
  again.destroy();
  out.afterDestroy = Array.from((await twin.run({x: xt})).s.data);
  out.destroyedRun = await error(() => again.run({x: xt}));
  for (const s of [mlp, head, ints, twin, own, onGiven]) s.destroy();
  return out;
}"""


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A directory of packages: mlp, mlp_again (the same model), head, ints; and their ONNX files."""
    root = tmp_path_factory.mktemp("gpu_io_browser")
    paths = {}
    for name, model in (("mlp", _mlp(1)), ("head", _head()), ("ints", _ints())):
        paths[name] = root / f"{name}.onnx"
        onnx.save(model, paths[name])
        kiln.compile(paths[name], root / name, force=True, target="webgpu")
    kiln.compile(paths["mlp"], root / "mlp_again", force=True, target="webgpu")
    return root, paths


def _ort(path, feeds):
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))


def test_gpu_tensors_chain_sessions_and_share_pipelines_in_the_browser(browser, tree, rng):
    root, paths = tree
    x = rng.standard_normal((2, 8)).astype(np.float32)
    ids = rng.integers(-1000, 1000, 6).astype(np.int64)
    page = browser.new_page()
    log = ConsoleLog(page)
    try:
        with serving_tree(root) as url:
            page.goto(url)  # the tree's root (a 404 page): the script's URLs resolve against it
            out = log.evaluate(SCRIPT, {"x": x.ravel().tolist(), "ids": ids.tolist()})
    finally:
        page.close()
    mlp = _ort(paths["mlp"], {"x": x})
    assert out["sameDevice"]
    assert out["upload"] == {"type": "float32", "dims": [2, 8], "byteLength": 64, "isGPU": True}
    assert out["gpuOutputs"] == [["h", True, [2, 16]], ["s", True, [2]]]
    np.testing.assert_allclose(out["host"]["h"], mlp["h"].ravel(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["host"]["s"], mlp["s"], rtol=1e-5, atol=1e-5)
    assert out["gpu"] == out["host"] and out["mixedS"] == out["host"]["s"] and out["gStillH"] == out["host"]["h"]
    assert out["only"] == {"names": ["s"], "s": out["host"]["s"], "again": out["host"]["s"], "host": ["h"]}
    np.testing.assert_allclose(out["laterH"], _ort(paths["mlp"], {"x": x + 1})["h"].ravel(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["p"], _ort(paths["head"], {"h": mlp["h"]})["p"].ravel(), rtol=1e-5, atol=1e-6)
    assert out["timed"] == 2
    ints = _ort(paths["ints"], {"ids": ids})
    assert out["ints"]["jType"] == "int64" and out["ints"]["j"] == [str(v) for v in ints["j"]]
    assert out["ints"]["bigType"] == "bool" and out["ints"]["big"] == ints["big"].astype(int).tolist()
    errors = out["errors"]
    assert errors["dtype"] == "ShapeError: input 'x': expected dtype float32, got a GPUTensor of int32"
    assert errors["shape"].startswith("ShapeError: input 'x': expected shape [2, 8]") and "[8, 2]" in errors["shape"]
    assert errors["device"].startswith("DeviceError: input 'x': the GPUTensor lives on another WebGPU device")
    assert errors["destroyed"] == "KilnError: input 'x': the GPUTensor was destroyed"
    assert errors["read"] == "KilnError: read: this GPUTensor was destroyed"
    assert errors["output"] == "KilnError: run: output must be 'cpu' or 'gpu', got 'host'"
    assert errors["unknownOutput"] == "KilnError: run: unknown output 'nope'; the model's outputs are 'h', 's'"
    read = "KilnError: run: read names outputs to read back with output 'gpu', among those returned"
    assert errors["readHost"] == read and errors["readNotReturned"] == read
    assert errors["badDevice"].startswith("DeviceError: load: device must be 'shared', 'own' or a GPUDevice")
    assert out["ownDifferent"] and out["ownS"] == out["host"]["s"]
    cache = out["cache"]
    assert cache["again"] == cache["kernels"] and cache["twin"] == cache["kernels"] and cache["own"] == 0
    assert cache["givenSame"] and set(cache["loadMs"]) >= {"device", "pipelines", "total"}
    assert out["afterDestroy"] == out["host"]["s"]
    assert out["destroyedRun"].startswith("DeviceError")
