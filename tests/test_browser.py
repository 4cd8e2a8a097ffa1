"""The browser runtime (kiln.js) and demo page (index.html) in headless Chromium on WebGPU.

Chromium runs WebGPU on SwiftShader, so no GPU is needed; if Chromium is installed but
WebGPU does not work, these tests fail rather than skip.
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import kiln
from browser import CHROMIUM, ConsoleLog, launch_chromium, serving

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (Debian package chromium)"),
]

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / ".." / "shared" / "models"
MOBILENET = ROOT / "models" / "mobilenet_v2_imagenet.onnx"
REFERENCE = MODELS / "reference" / "mobilenet_v2_imagenet.npz"
IMAGES = ["chelsea", "coffee", "astronaut", "camera"]

#: imports kiln.js from the served package and loads the package from the page's directory
LOAD_SESSION = """async () => {
  const kiln = await import('./kiln.js');
  window.kiln = kiln;
  window.session = await kiln.load('./', {verify: true});
  return session.adapterInfo;
}"""

#: runs the loaded session on base64 float32 inputs [1,3,224,224]; returns {name: logits as a list}
RUN_IMAGES = """async (inputs) => {
  const results = {};
  for (const [name, encoded] of Object.entries(inputs)) {
    const bytes = Uint8Array.from(atob(encoded), (c) => c.charCodeAt(0));
    const input = new kiln.Tensor('float32', new Float32Array(bytes.buffer), [1, 3, 224, 224]);
    const {logits} = await session.run({input});
    results[name] = {dims: logits.dims, data: Array.from(logits.data)};
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
    kiln.compile(str(MOBILENET), str(out), force=True)
    return out


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium with WebGPU, shared by the module's tests."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = launch_chromium(playwright)
        yield chromium
        chromium.close()


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


def test_mobilenet_matches_onnxruntime(session_page):
    reference = np.load(REFERENCE)
    inputs = {name: base64.b64encode(reference[f"{name}_input"].astype(np.float32).tobytes()).decode()
              for name in IMAGES}
    results = session_page.evaluate(RUN_IMAGES, inputs)
    for name in IMAGES:
        expected = reference[f"{name}_logits"]
        assert results[name]["dims"] == list(expected.shape), name
        got = np.array(results[name]["data"], dtype=np.float32).reshape(expected.shape)
        error = float(np.abs(got - expected).max())
        assert error <= 1e-3, f"{name}: max abs error {error:.3g} against onnxruntime"
        assert got.argmax() == expected.argmax(), name


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


def _copy_package(package: Path, destination: Path) -> Path:
    shutil.copytree(package, destination)
    return destination


def test_corrupted_weights_are_refused(browser, package, tmp_path):
    broken = _copy_package(package, tmp_path / "corrupted")
    weights = broken / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, different bytes
    weights.write_bytes(bytes(data))
    page = browser.new_page()
    log = ConsoleLog(page)
    try:
        with serving(broken) as url:
            page.goto(url + "manifest.json")
            error = log.evaluate(LOAD_EXPECTING_ERROR)
        assert error.startswith("PackageError: weights file weights.safetensors: SHA-256 checksum mismatch"), error
    finally:
        page.close()


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
