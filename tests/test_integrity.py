"""Package integrity (format 1.8): every file a package holds is covered by a checksum the runtimes verify before
use: ``manifest.sha256`` for the manifest, the manifest's ``files`` table for kernels, modules, pages, scripts and the
tokenizer, ``weights.files`` for the weights. A tampered shader or manifest is refused natively and in Chromium
(the RPC upload's server check is in tests/test_rpc.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess

import numpy as np
import pytest
from browser import CHROMIUM, ConsoleLog, serving, sync_playwright_alone
from conftest import save_tiny_relu_matmul

import kiln
from kiln.errors import PackageError
from kiln.package.format import MANIFEST_DIGEST, read_manifest, verify_files, write_manifest


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """``y = relu(x @ W)`` compiled for webgpu and wasm."""
    w = np.array([[1.0, -2.0, 0.5], [0.25, 1.0, -1.0]], np.float32)
    folder = tmp_path_factory.mktemp("integrity")
    save_tiny_relu_matmul(folder / "tiny.onnx", w)
    return kiln.compile(str(folder / "tiny.onnx"), str(folder / "pkg"), target="webgpu,wasm", device_class="cpu")


def _copy(package, tmp_path, name="copy"):
    out = tmp_path / name
    shutil.copytree(package, out)
    return out


def _flip_last_byte(path):
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x01  # same size, different bytes (a comment or whitespace in a shader: still valid WGSL)
    path.write_bytes(bytes(data))


def test_every_file_is_listed_and_checks_with_sha256sum(package):
    """The writer lists every file but the manifest, its digest and the weights, and ``manifest.sha256`` is in
    ``sha256sum``'s format (``sha256sum -c`` accepts it)."""
    m = read_manifest(package)
    on_disk = {p.relative_to(package).as_posix() for p in package.rglob("*") if p.is_file()}
    listed = {f["path"] for f in m["files"]} | {f["path"] for f in m["weights"]["files"]}
    assert on_disk - listed == {"manifest.json", MANIFEST_DIGEST}
    assert {"kiln.js", "index.html", "kernels/kiln.wasm"} <= listed
    assert verify_files(package, m) == len(listed)
    if shutil.which("sha256sum"):
        done = subprocess.run(["sha256sum", "-c", MANIFEST_DIGEST], cwd=package, capture_output=True, text=True,
                              check=False)
        assert done.returncode == 0 and "manifest.json: OK" in done.stdout, done.stdout + done.stderr


def test_tampered_files_are_refused_natively(package, tmp_path):
    """A kernel edited in place, a manifest edited without its digest, a missing digest and an edited script are
    one-line PackageErrors naming the file; rewriting the digest (``write_manifest``) makes an edit acceptable."""
    x = {"x": np.array([[1.0, 2.0]], np.float32)}
    assert np.allclose(kiln.load(package).run(x)["y"], [[1.5, 0.0, 0.0]])
    kernel = read_manifest(package)["targets"]["webgpu"]["kernels"][0]["source"]
    shader = _copy(package, tmp_path, "shader")
    _flip_last_byte(shader / kernel)
    with pytest.raises(PackageError, match=f"kernel {kernel}: SHA-256 checksum mismatch"):
        kiln.load(shader)
    edited = _copy(package, tmp_path, "edited")
    m = json.loads((edited / "manifest.json").read_text())
    m["name"] = "someone else's"
    (edited / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(PackageError, match="manifest.json SHA-256 checksum mismatch"):
        kiln.load(edited, target="wasm")
    write_manifest(edited, m)  # an edit through the tool that rewrites the digest
    assert read_manifest(edited)["name"] == "someone else's"
    missing = _copy(package, tmp_path, "missing")
    (missing / MANIFEST_DIGEST).unlink()
    with pytest.raises(PackageError, match="no manifest.sha256"):
        read_manifest(missing)
    script = _copy(package, tmp_path, "script")
    (script / "kiln.js").write_text((script / "kiln.js").read_text() + "\n// injected\n")
    with pytest.raises(PackageError, match="file kiln.js: SHA-256 checksum mismatch"):
        verify_files(script, read_manifest(script))
    ghost = _copy(package, tmp_path, "ghost")
    m = read_manifest(ghost)
    m["files"] = [f for f in m["files"] if f["path"] != kernel]
    write_manifest(ghost, m)
    with pytest.raises(PackageError, match="not listed in the manifest's files"):
        kiln.load(ghost)


LOAD_EXPECTING_ERROR = """async () => {
  const kiln = await import('./kiln.js');
  try {
    await kiln.load('./', {target: 'webgpu'});
  } catch (error) {
    return `${error.name}: ${error.message}`;
  }
  return 'no error';
}"""


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (Debian package chromium)")
def test_tampered_files_are_refused_in_the_browser(package, tmp_path):
    """kiln.js refuses a kernel edited in place, a manifest whose SHA-256 differs from manifest.sha256 (served
    edited) and a manifest with a matching digest whose plan names a buffer that does not exist, each with a
    PackageError naming the file; the untouched package loads."""
    from browser import launch_chromium
    kernel = read_manifest(package)["targets"]["webgpu"]["kernels"][0]["source"]
    shader = _copy(package, tmp_path, "shader")
    _flip_last_byte(shader / kernel)
    edited = json.loads((package / "manifest.json").read_text())
    edited["outputs"][0]["name"] = "z"
    inconsistent = json.loads((package / "manifest.json").read_text())  # served with a matching digest
    inconsistent["targets"]["webgpu"]["plan"][0]["buffers"][0] = 99
    inconsistent_text = json.dumps(inconsistent, indent=1)
    inconsistent_digest = f"{hashlib.sha256(inconsistent_text.encode()).hexdigest()}  manifest.json\n"
    with sync_playwright_alone() as playwright:
        browser = launch_chromium(playwright)
        try:
            errors = {}
            for name, folder in (("clean", package), ("shader", shader), ("manifest", package),
                                 ("inconsistent", package)):
                page = browser.new_page()
                log = ConsoleLog(page)
                with serving(folder) as url:
                    if name == "manifest":
                        page.route(url + "manifest.json", lambda route: route.fulfill(
                            status=200, content_type="application/json", body=json.dumps(edited, indent=1)))
                    if name == "inconsistent":
                        page.route(url + "manifest.json", lambda route: route.fulfill(
                            status=200, content_type="application/json", body=inconsistent_text))
                        page.route(url + "manifest.sha256", lambda route: route.fulfill(
                            status=200, content_type="text/plain", body=inconsistent_digest))
                    page.goto(url + "index.html")
                    errors[name] = log.evaluate(LOAD_EXPECTING_ERROR)
                page.close()
        finally:
            browser.close()
    assert errors["clean"] == "no error", errors["clean"]
    assert errors["shader"].startswith("PackageError: ") and f"{kernel}: kernel" in errors["shader"] \
        and "SHA-256 checksum mismatch" in errors["shader"], errors["shader"]
    assert errors["manifest"].startswith("PackageError: ") and "manifest.json: SHA-256 checksum mismatch" \
        in errors["manifest"], errors["manifest"]
    assert errors["inconsistent"].startswith("PackageError: ") and "buffer 99 does not exist" \
        in errors["inconsistent"] and "(the package is inconsistent)" in errors["inconsistent"], errors["inconsistent"]
