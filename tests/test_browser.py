"""The browser runtime (kiln.js) and demo page (index.html) in headless Chromium on WebGPU.

Chromium runs WebGPU on SwiftShader, so no GPU is needed; if Chromium is installed but
WebGPU does not work, these tests fail rather than skip.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from browser import CHROMIUM, ConsoleLog, evaluate_in_package, serving
from onnx import TensorProto, helper, numpy_helper

import kiln

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (Debian package chromium)"),
]

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / ".." / "shared" / "models"
MOBILENET = ROOT / "models" / "mobilenet_v2_imagenet.onnx"
IMAGES = ["chelsea", "coffee", "astronaut", "camera"]

#: imports kiln.js from the served package and loads the package from the page's directory
LOAD_SESSION = """async () => {
  const kiln = await import('./kiln.js');
  window.kiln = kiln;
  window.session = await kiln.load('./', {verify: true});
  return session.adapterInfo;
}"""

#: runs the loaded session on base64 float32 inputs [1,3,224,224]; returns {name: {dims, data, top5}}
RUN_IMAGES = """async (inputs) => {
  const results = {};
  for (const [name, encoded] of Object.entries(inputs)) {
    const bytes = Uint8Array.from(atob(encoded), (c) => c.charCodeAt(0));
    const input = new kiln.Tensor('float32', new Float32Array(bytes.buffer), [1, 3, 224, 224]);
    const {logits} = await session.run({input});
    results[name] = {dims: logits.dims, data: Array.from(logits.data), top5: kiln.topK(logits.data, 5)};
  }
  return results;
}"""

#: calls session.run(feeds) with feeds built in the page from a description; returns the error message
RUN_EXPECTING_ERROR = """async ({name, type, dims}) => {
  const ArrayType = {float32: Float32Array, int32: Int32Array}[type];
  const tensor = new kiln.Tensor(type, new ArrayType(dims.reduce((a, b) => a * b, 1)), dims);
  try {
    await session.run({[name]: tensor});
  } catch (error) {
    return `${error.name}: ${error.message}`;
  }
  return 'no error';
}"""

#: loads the package at the page's directory and returns the error message
LOAD_EXPECTING_ERROR = """async () => {
  const kiln = await import('./kiln.js');
  try {
    await kiln.load('./');
  } catch (error) {
    return `${error.name}: ${error.message}`;
  }
  return 'no error';
}"""


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    """MobileNetV2 compiled once for the module (it carries kiln.js and index.html)."""
    out = tmp_path_factory.mktemp("browser") / "mobilenet_v2"
    kiln.compile(str(MOBILENET), str(out), force=True, device_class="cpu")  # SwiftShader is a CPU
    return out


@pytest.fixture(scope="module")
def package_url(package):
    """Base URL of the served MobileNetV2 package."""
    with serving(package) as url:
        yield url


@pytest.fixture(scope="module")
def session_page(browser, package_url):
    """A page at the package's origin with `kiln` and a loaded `session` on `window`."""
    page = browser.new_page()
    log = ConsoleLog(page)
    page.goto(package_url + "manifest.json")
    info = log.evaluate(LOAD_SESSION)
    assert info["vendor"] or info["architecture"], f"no adapter information: {info}"
    yield log
    page.close()


def test_mobilenet_matches_onnxruntime(session_page, reference_npz):
    inputs = {name: base64.b64encode(reference_npz[f"{name}_input"].astype(np.float32).tobytes()).decode()
              for name in IMAGES}
    results = session_page.evaluate(RUN_IMAGES, inputs)
    for name in IMAGES:
        expected = reference_npz[f"{name}_logits"]
        assert results[name]["dims"] == list(expected.shape), name
        got = np.array(results[name]["data"], dtype=np.float32).reshape(expected.shape)
        error = float(np.abs(got - expected).max())
        assert error <= 1e-3, f"{name}: max abs error {error:.3g} against onnxruntime"
        exp = np.exp(got[0].astype(np.float64) - got.max())  # topK of the page's own logits
        probs = exp / exp.sum()
        top5 = results[name]["top5"]
        assert [t["index"] for t in top5] == list(np.argsort(-probs)[:5]), name
        np.testing.assert_allclose([t["prob"] for t in top5], np.sort(probs)[::-1][:5], atol=1e-4, err_msg=name)


#: preprocesses a base64 PNG with the manifest's preprocess entry; returns {dims, data: base64 float32}
PREPROCESS_PNG = """async (png) => {
  const bytes = Uint8Array.from(atob(png), (c) => c.charCodeAt(0));
  const bitmap = await createImageBitmap(new Blob([bytes], {type: 'image/png'}));
  const tensor = kiln.preprocessImage(bitmap, session.manifest.preprocess);
  const raw = new Uint8Array(tensor.data.buffer);
  let text = '';
  for (let i = 0; i < raw.length; i += 8192) text += String.fromCharCode(...raw.subarray(i, i + 8192));
  return {dims: tensor.dims, data: btoa(text)};
}"""


@pytest.mark.parametrize("name", IMAGES)
def test_preprocess_image_matches_reference_pipeline(session_page, reference_npz, name):
    # the reference inputs come from PIL (bilinear resize of the shorter side to 256, centre crop 224);
    # the canvas resamples slightly differently, so compare on average: 0.05 is about 3 levels of 255
    png = base64.b64encode((MODELS / "samples" / f"{name}.png").read_bytes()).decode()
    result = session_page.evaluate(PREPROCESS_PNG, png)
    expected = reference_npz[f"{name}_input"]
    assert result["dims"] == list(expected.shape)
    got = np.frombuffer(base64.b64decode(result["data"]), dtype=np.float32).reshape(expected.shape)
    error = float(np.abs(got - expected).mean())
    assert error < 0.05, f"{name}: mean abs difference {error:.3g} from the reference preprocessing"


@pytest.mark.parametrize("feed, message", [
    ({"name": "input", "type": "float32", "dims": [1, 3, 112, 448]},
     "input 'input': expected shape [1, 3, 224, 224] (symbolic [N, 3, 224, 224]), got [1, 3, 112, 448]"),
    ({"name": "input", "type": "int32", "dims": [1, 3, 224, 224]},
     "input 'input': expected dtype float32, got int32"),
    ({"name": "image", "type": "float32", "dims": [1, 3, 224, 224]},
     "unknown input 'image'; the model's inputs are 'input'"),
])
def test_bad_feed_is_refused(session_page, feed, message):
    assert session_page.evaluate(RUN_EXPECTING_ERROR, feed) == f"ShapeError: {message}"


def test_missing_feed_is_refused(session_page):
    error = session_page.evaluate("() => session.run({}).then(() => 'no error', (e) => e.message)")
    assert error == "missing input 'input' (float32[1, 3, 224, 224])"


def test_demo_page_classifies_an_image(browser, package_url):
    page = browser.new_page()
    log = ConsoleLog(page)
    try:
        page.goto(package_url + "index.html")
        log.wait_for("#status:text-is('ready')")
        page.set_input_files("#file", str(ROOT / "models" / "chelsea.png"))
        top1 = log.wait_for("#top1")
        assert "Egyptian cat" in top1.text_content()
        assert len(page.query_selector_all("#top5 li")) == 5
        assert float(page.text_content("#ms")) > 0
        assert page.text_content("#status") == "ready"
    finally:
        page.close()


def test_corrupted_weights_are_refused(browser, package, tmp_path):
    broken = tmp_path / "corrupted"
    shutil.copytree(package, broken)
    weights = broken / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, different bytes
    weights.write_bytes(bytes(data))
    error = evaluate_in_package(browser, broken, LOAD_EXPECTING_ERROR)
    assert error.startswith("PackageError: weights file weights.safetensors: SHA-256 checksum mismatch"), error


def test_newer_format_version_is_refused(browser, package, package_url):
    # make_server itself refuses such a package, so the newer manifest is substituted in the browser
    manifest = json.loads((package / "manifest.json").read_text())
    manifest["version"] = "2.0"
    page = browser.new_page()
    log = ConsoleLog(page)
    try:
        page.route(package_url + "manifest.json",
                   lambda route: route.fulfill(status=200, content_type="application/json", body=json.dumps(manifest)))
        page.goto(package_url + "index.html")
        error = log.evaluate(LOAD_EXPECTING_ERROR)
        assert error.startswith("PackageError: ") and "package format 2.0 is newer than this kiln.js reads" in error, error
        log.wait_for("#status.error")
        assert "package format 2.0 is newer" in page.text_content("#status")
    finally:
        page.close()


def test_demo_page_reports_missing_webgpu(browser, package_url):
    page = browser.new_page()
    log = ConsoleLog(page)
    try:
        page.add_init_script("delete Navigator.prototype.gpu")
        page.goto(package_url + "index.html")
        log.wait_for("#status.error")
        assert "WebGPU is not available in this browser" in page.text_content("#status")
    finally:
        page.close()


def test_demo_page_runs_other_models_on_random_input(browser, tmp_path):
    # y = relu(x @ w): a model without image preprocessing gets the generic page
    weight = np.array([[1, -2, 3, -4], [-5, 6, -7, 8]], dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(weight, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "tiny.onnx")
    package = kiln.compile(str(tmp_path / "tiny.onnx"), str(tmp_path / "tiny"), force=True)
    page = browser.new_page()
    log = ConsoleLog(page)
    try:
        with serving(package) as url:
            page.goto(url + "index.html")
            log.wait_for("#status:text-is('ready')")
            assert "[N, 2] = [1, 2]" in page.text_content("#io")
            page.click("#random")
            log.wait_for("#outputs")
            assert page.text_content("#outputs").startswith("y: float32[1, 4]")
            x = np.array([[0.5, -1.5]], dtype=np.float32)
            y = log.evaluate("""async (x) => {
              const kiln = await import('./kiln.js');
              const session = await kiln.load('./');
              const {y} = await session.run({x: new kiln.Tensor('float32', Float32Array.from(x), [1, 2])});
              session.destroy();
              return Array.from(y.data);
            }""", x[0].tolist())
        np.testing.assert_allclose(y, np.maximum(x @ weight, 0)[0], rtol=1e-6)
    finally:
        page.close()


def test_max_reductions_and_reduce_lanes_in_the_browser(browser, tmp_path, rng):
    # MaxPool and ReduceMax start from -inf (a constant Chromium's shader compiler must accept), and
    # the long MatMul gets reduce lanes (workgroup memory and barriers) under the gpu device class
    w = rng.standard_normal((512, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
         helper.make_node("ReduceMax", ["p"], ["m"], axes=[3], keepdims=0),
         helper.make_node("Reshape", ["x", "s"], ["f"]),
         helper.make_node("MatMul", ["f", "w"], ["y"])], "maxes",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 16, 16])],
        [helper.make_tensor_value_info("m", TensorProto.FLOAT, [1, 2, 8]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([1, 512], np.int64), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, tmp_path / "maxes.onnx")
    package = kiln.compile(str(tmp_path / "maxes.onnx"), str(tmp_path / "maxes"), force=True)
    sources = "".join(p.read_text() for p in (package / "kernels").iterdir())
    assert "kiln_neg_inf" in sources and "workgroupBarrier" in sources
    x = rng.standard_normal((1, 2, 16, 16)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    page = browser.new_page()
    log = ConsoleLog(page)
    try:
        with serving(package) as url:
            page.goto(url + "manifest.json")
            got = log.evaluate("""async (x) => {
              const kiln = await import('./kiln.js');
              const session = await kiln.load('./');
              const out = await session.run({x: new kiln.Tensor('float32', Float32Array.from(x), [1, 2, 16, 16])});
              session.destroy();
              return {m: Array.from(out.m.data), y: Array.from(out.y.data)};
            }""", x.ravel().tolist())
    finally:
        page.close()
    np.testing.assert_allclose(got["m"], expected[0].ravel(), rtol=1e-6)
    np.testing.assert_allclose(got["y"], expected[1].ravel(), rtol=1e-4, atol=1e-4)


def test_server_types_and_headers(package, package_url):
    kernel = json.loads((package / "manifest.json").read_text())["targets"]["webgpu"]["kernels"][0]["source"]
    expected = {
        "kiln.js": "text/javascript; charset=utf-8",
        "index.html": "text/html; charset=utf-8",
        "manifest.json": "application/json",
        "weights.safetensors": "application/octet-stream",
        kernel: "text/plain; charset=utf-8",
    }
    for path, content_type in expected.items():
        with urllib.request.urlopen(package_url + path) as response:
            assert response.headers["Content-Type"] == content_type, path
            assert response.headers["Cross-Origin-Opener-Policy"] == "same-origin", path
            assert response.headers["Cross-Origin-Embedder-Policy"] == "require-corp", path
            assert response.headers["Cache-Control"] == "no-cache", path
    with pytest.raises(urllib.error.HTTPError, match="404"):
        urllib.request.urlopen(package_url + "no-such-file.bin")


def test_server_refuses_a_directory_that_is_not_a_package(tmp_path):
    with pytest.raises(kiln.PackageError, match="not a Kiln package"), serving(tmp_path):
        pass


def test_server_does_not_import_the_compiler():
    compiler = ("kiln.frontend", "kiln.passes", "kiln.codegen", "kiln.te", "kiln.compiler")
    script = (f"import sys, kiln.runtime.serve; "
              f"print([m for m in sys.modules if m.startswith({compiler!r})])")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT)
    assert result.stdout.strip() == "[]", result.stdout


def test_int64_bool_float16_tensors_convert_on_upload_and_readback(browser, tmp_path):
    # int64 and bool are stored as int32, float16 as float32; kiln.js converts and range-checks like the native runtime
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["s"]), helper.make_node("Cast", ["x"], ["b"], to=TensorProto.BOOL),
         helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16)],
        "ints", [helper.make_tensor_value_info("x", TensorProto.INT64, [1, 4])],
        [helper.make_tensor_value_info("s", TensorProto.INT64, [1, 4]),
         helper.make_tensor_value_info("b", TensorProto.BOOL, [1, 4]),
         helper.make_tensor_value_info("h", TensorProto.FLOAT16, [1, 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "ints.onnx")
    package = kiln.compile(str(tmp_path / "ints.onnx"), str(tmp_path / "ints"), force=True)
    page = browser.new_page()
    log = ConsoleLog(page)
    try:
        with serving(package) as url:
            page.goto(url + "index.html")
            log.wait_for("#status:text-is('ready')")
            result = log.evaluate("""async () => {
              const kiln = await import('./kiln.js');
              const session = await kiln.load('./');
              const x = new kiln.Tensor('int64', BigInt64Array.from([3n, 0n, -5n, 1073741823n]), [1, 4]);
              const {s, b, h} = await session.run({x});
              let error = 'no error';
              try {
                await session.run({x: new kiln.Tensor('int64', BigInt64Array.from([0n, 0n, 4294967296n, 0n]), [1, 4])});
              } catch (e) {
                error = `${e.name}: ${e.message}`;
              }
              session.destroy();
              return {s: Array.from(s.data, String), sType: s.type, b: Array.from(b.data), bType: b.type,
                      h: Array.from(h.data), hType: h.type, error};
            }""")
        assert result["sType"] == "int64" and result["s"] == ["6", "0", "-10", "2147483646"]
        assert result["bType"] == "bool" and result["b"] == [1, 0, 1, 1]
        # float16 is stored as float32 and comes back as half bits (or Float16Array values)
        halves = np.array([3, 0, -5, np.inf], np.float16)  # 1073741823 overflows half precision
        assert result["hType"] == "float16"
        assert result["h"] in (halves.view(np.uint16).tolist(), halves.astype(float).tolist())
        assert result["error"].startswith("ShapeError: input 'x': int64 value 4294967296 at flat index 2 does not fit")
    finally:
        page.close()


def test_format_1_4_dtypes_are_refused_clearly(browser, tmp_path):
    # bfloat16 inputs and outputs run natively (format 1.4); kiln.js names the tensor and its dtype
    vi = [helper.make_tensor_value_info(n, TensorProto.BFLOAT16, [4]) for n in ("x", "y")]
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "bf16", vi[:1], vi[1:])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "bf16.onnx")
    package = kiln.compile(str(tmp_path / "bf16.onnx"), str(tmp_path / "bf16"), force=True)
    page = browser.new_page()
    log = ConsoleLog(page)
    try:
        with serving(package) as url:
            page.goto(url + "manifest.json")
            error = log.evaluate(LOAD_EXPECTING_ERROR)
        assert error.startswith("PackageError: ") and "x is a bfloat16 tensor, which kiln.js does not support" in error, \
            error
    finally:
        page.close()
