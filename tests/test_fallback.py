"""Target selection in the browser runtime: kiln.load picks WebGPU, then WebGL2, then WebAssembly by feature
detection among the targets a package holds; a forced target that the package lacks or the browser cannot
run is a clear error (headless Chromium; WebGPU, WebGL2 and WebAssembly SIMD are disabled by page init
scripts). The served pages are cross-origin isolated (COOP/COEP), so the wasm target runs on workers."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from browser import CHROMIUM, ConsoleLog, evaluate_in_package, serving
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.package.format import write_manifest

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (Debian package chromium)"),
]

#: page init scripts that take a target's API away before any page script runs
NO_WEBGPU = "delete Navigator.prototype.gpu"
NO_WEBGL2 = """for (const Canvas of [globalThis.HTMLCanvasElement, globalThis.OffscreenCanvas]) {
  if (!Canvas) continue;
  const getContext = Canvas.prototype.getContext;
  Canvas.prototype.getContext = function (type, ...rest) {
    return type === 'webgl2' ? null : getContext.call(this, type, ...rest);
  };
}"""
NO_WASM_SIMD = "WebAssembly.validate = () => false"

WEIGHT = np.array([[1, -2, 3, -4], [-5, 6, -7, 8]], dtype=np.float32)

#: loads the package with `target`, runs y = relu(x @ w) and reports the target, or the error
LOAD_AND_RUN = """async ({target, x, threads}) => {
  const kiln = await import('./kiln.js');
  try {
    const session = await kiln.load('./', {target, threads, poison: true});
    const {y} = await session.run({x: new kiln.Tensor('float32', Float32Array.from(x), [1, 2])});
    session.destroy();
    return {target: session.target, device: session.adapterInfo.device, y: Array.from(y.data)};
  } catch (error) {
    return {error: `${error.name}: ${error.message}`};
  }
}"""


def _compile(tmp_path, target: str):
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [numpy_helper.from_array(WEIGHT, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "tiny.onnx")
    return kiln.compile(str(tmp_path / "tiny.onnx"), str(tmp_path / target.replace(",", "_")), force=True,
                        target=target, device_class="cpu")


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """A package holding the webgpu, webgl2 and wasm targets, served."""
    with serving(_compile(tmp_path_factory.mktemp("both"), "webgpu,webgl2,wasm")) as url:
        yield url


@pytest.fixture(scope="module")
def webgpu_only(tmp_path_factory):
    with serving(_compile(tmp_path_factory.mktemp("webgpu"), "webgpu")) as url:
        yield url


def _load(browser, url: str, target: str, *init_scripts: str, threads: int | None = None) -> dict:
    page = browser.new_page()
    log = ConsoleLog(page)
    try:
        for script in init_scripts:
            page.add_init_script(script)
        page.goto(url + "manifest.json")
        x = np.array([0.5, -1.5], np.float32)
        result = log.evaluate(LOAD_AND_RUN, {"target": target, "x": x.tolist(), "threads": threads})
        if "y" in result:
            np.testing.assert_allclose(result["y"], np.maximum(x @ WEIGHT, 0), rtol=1e-6)
        return result
    finally:
        page.close()


def test_auto_prefers_webgpu(browser, both):
    assert _load(browser, both, "auto")["target"] == "webgpu"


def test_without_webgpu_auto_falls_back_to_webgl2(browser, both):
    assert _load(browser, both, "auto", NO_WEBGPU)["target"] == "webgl2"


def test_without_webgpu_and_webgl2_auto_falls_back_to_wasm(browser, both):
    result = _load(browser, both, "auto", NO_WEBGPU, NO_WEBGL2)
    assert result.get("target") == "wasm" and result["device"].endswith("threads"), result  # isolated: workers


def test_forcing_webgl2(browser, both):
    assert _load(browser, both, "webgl2")["target"] == "webgl2"


@pytest.mark.parametrize("threads", [1, 3])
def test_forcing_wasm(browser, both, threads):
    result = _load(browser, both, "wasm", threads=threads)
    assert result["target"] == "wasm" and result["device"] == f"{threads} thread{'s' if threads > 1 else ''}"


def test_demo_page_reports_the_chosen_target(browser, both):
    page = browser.new_page()
    log = ConsoleLog(page)
    try:
        page.add_init_script(NO_WEBGPU)
        page.goto(both + "index.html")
        log.wait_for("#status:text-is('ready')")
        assert page.text_content("#target") == "webgl2"
        assert "webgl2 on " in page.text_content("#details")
    finally:
        page.close()


def test_forcing_a_target_the_package_lacks_is_an_error(browser, webgpu_only):
    error = _load(browser, webgpu_only, "webgl2")["error"]
    assert error.startswith("PackageError: ") and "the package has no 'webgl2' target (it has: webgpu)" in error


def test_forcing_a_target_the_browser_cannot_run_is_an_error(browser, both):
    error = _load(browser, both, "webgpu", NO_WEBGPU)["error"]
    assert error == "DeviceError: cannot run the webgpu target in this browser: navigator.gpu is missing"
    error = _load(browser, both, "webgl2", NO_WEBGL2)["error"]
    assert error.startswith("DeviceError: cannot run the webgl2 target in this browser: "
                            'canvas.getContext("webgl2") returned null'), error


def test_no_runnable_target_names_each_reason(browser, both):
    error = _load(browser, both, "auto", NO_WEBGPU, NO_WEBGL2, NO_WASM_SIMD)["error"]
    assert error.startswith("DeviceError: this browser can run none of the package's targets: "
                            "webgpu (navigator.gpu is missing); webgl2 (canvas.getContext"), error
    assert error.endswith("; wasm (WebAssembly has no SIMD128 (fixed-width SIMD))"), error


def test_unknown_target_is_an_error(browser, both):
    error = _load(browser, both, "webgl3")["error"]
    assert error == "KilnError: load: target must be 'auto' or one of webgpu, webgl2, wasm, got 'webgl3'"


# ----------------------------------------------------------------------------- fp16 packages (shader-f16)
def _needs_f16(package):
    """``package``'s manifest with its webgpu target requiring ``shader-f16``, as an fp16 package's does."""
    import json

    path = package / "manifest.json"
    m = json.loads(path.read_text())
    m["targets"]["webgpu"]["features"] = ["shader-f16"]
    write_manifest(package, m)
    return package


def _lacks_f16(browser, url: str) -> bool:
    page = browser.new_page()
    try:
        page.goto(url + "manifest.json")  # WebGPU needs a secure context (localhost)
        return not page.evaluate("async () => (await navigator.gpu.requestAdapter()).features.has('shader-f16')")
    finally:
        page.close()


def test_fp16_package_on_an_adapter_without_shader_f16_is_a_clear_error(browser, tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["h2"]),
         helper.make_node("Neg", ["h2"], ["y"])], "tiny", [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [numpy_helper.from_array(WEIGHT, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "tiny.onnx")
    pkg = kiln.compile(str(tmp_path / "tiny.onnx"), str(tmp_path / "fp16"), precision="fp16")
    with serving(pkg) as url:
        if not _lacks_f16(browser, url):
            pytest.skip("this Chromium's adapter has shader-f16")
        for target in ("auto", "webgpu"):
            error = _load(browser, url, target)["error"]
            assert error.startswith("DeviceError: ") and "shader-f16" in error, error
        error = _load(browser, url, "auto")["error"]
        assert "lacks WebGPU features shader-f16, which the package needs (it computes in fp16: load a package " \
               "compiled with --precision fp32 on this adapter)" in error, error


def test_auto_falls_back_when_the_adapter_lacks_a_webgpu_feature(browser, tmp_path):
    with serving(_needs_f16(_compile(tmp_path, "webgpu,webgl2,wasm"))) as url:
        if not _lacks_f16(browser, url):
            pytest.skip("this Chromium's adapter has shader-f16")
        assert _load(browser, url, "auto")["target"] == "webgl2"
        error = _load(browser, url, "webgpu")["error"]
        assert error == "DeviceError: cannot run the webgpu target in this browser: the adapter lacks WebGPU " \
                        "features shader-f16", error


#: runs the trig package (tests/test_wasm.py's trig_package) three times on `threads` workers (null: the default);
#: answers the device, each run's worst error against float64 sin(x) + cos(x), or the error raised
TRIG = """async ({threads}) => {
  const kiln = await import('./kiln.js');
  const x = new Float32Array(await (await fetch('./x.f32')).arrayBuffer());
  try {
    const session = await kiln.load('./', {target: 'wasm', threads});
    const worst = [];
    for (let r = 0; r < 3; r++) {
      const {y} = await session.run({x: new kiln.Tensor('float32', x, [x.length])});
      let w = 0;
      for (let i = 0; i < x.length; i++) w = Math.max(w, Math.abs(y.data[i] - (Math.sin(x[i]) + Math.cos(x[i]))));
      worst.push(w);
    }
    session.destroy();
    return {device: session.adapterInfo.device, worst};
  } catch (error) {
    return {error: `${error.name}: ${error.message}`};
  }
}"""


def test_wasm_workers_have_stacks_of_their_own(browser, tmp_path, monkeypatch):
    """wasm-worker.js points each worker's instance at its own stack: sines of large arguments (libm keeps them on
    the stack) are right on 4 workers, run after run; too many threads is a clear error; a package whose threaded
    module has no worker stacks runs on one thread by default and refuses more."""
    from test_wasm import trig_package, without_worker_stacks


    pkg, x = trig_package(tmp_path)
    x.tofile(pkg / "x.f32")
    for threads in (1, 4):
        got = evaluate_in_package(browser, pkg, TRIG, {"threads": threads})
        assert got.get("device", got) == f"{threads} thread{'s' if threads > 1 else ''}"
        assert max(got["worst"]) <= 1e-6, got
    error = evaluate_in_package(browser, pkg, TRIG, {"threads": 17})["error"]
    assert error.startswith("DeviceError: cannot start the wasm worker threads: ") and "no stack for worker 16" in error
    without_worker_stacks(pkg, monkeypatch)
    got = evaluate_in_package(browser, pkg, TRIG, {"threads": None})
    assert got.get("device") == "1 thread" and max(got["worst"]) <= 1e-6, got
    error = evaluate_in_package(browser, pkg, TRIG, {"threads": 2})["error"]
    assert "the package's threaded module has no stack for each worker" in error, error
