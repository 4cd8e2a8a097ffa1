"""Fuzzing the browser runtime (issue 19): whatever a package holds, kiln.js loading it (``kiln.loadFiles``) and running
it in Chromium ends in a result or a rejected promise with a KilnError (PackageError, ShapeError, DeviceError) and a
one-line message: never another exception, an uncaught error in the page, a hang, or a dead page (a wasm module
edited to loop for ever is stopped at load's ``timeoutMs``, here 10 s).

The inputs are those of ``tests/test_fuzz_package.py`` (the Python runtimes' harness), made the same way a hostile or
buggy compiler would: the manifest edited structurally or byte-wise, or a kernel, the wasm module or the weights
edited, with every checksum made to match, so that kiln.js's other checks are what is tested. They go to one page as
files in memory; the wasm target runs every input, WebGPU (SwiftShader) a quarter of them. Hypothesis inputs are
fixed in the suite; ``python -m tools.fuzz_campaign browser`` runs fresh ones for a time.
"""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from browser import CHROMIUM, serving
from fuzzing import fuzz_settings
from hypothesis import event, given
from hypothesis import strategies as st
from test_fuzz_package import FEEDS, file_edits, manifest_byte_edits, manifest_edits, with_checksums

from kiln.package.format import MANIFEST, MANIFEST_DIGEST, digest_line

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (Debian package chromium)")]

FUZZ = fuzz_settings(15)

#: loads the files (base64) from memory and runs the package once; the outcome, never a throw
LOAD_AND_RUN = """async ({files, target, threads, x}) => {
  const kiln = await import('./kiln.js');
  const bytes = {};
  for (const [path, text] of Object.entries(files)) bytes[path] = Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
  let session;
  try {
    session = await kiln.loadFiles(bytes, {target, threads, timeoutMs: 10000});
    await session.run({x: new kiln.Tensor('float32', Float32Array.from(x), [1, 2])});
    return {ok: true};
  } catch (e) {
    return {ok: false, kiln: e instanceof kiln.KilnError, name: String(e?.name), message: String(e?.message ?? e)};
  } finally {
    try { session?.destroy(); } catch (e) { /* (a half-made session) */ }
  }
}"""


@pytest.fixture(scope="module")
def page(browser, seed_package):
    """One page served from the seed package (for ``import('./kiln.js')``), with its uncaught errors recorded."""
    with serving(seed_package) as url:
        p = browser.new_page()
        p.set_default_timeout(60_000)
        p.errors = []
        p.on("pageerror", lambda e: p.errors.append(str(e)))
        p.goto(url + "manifest.json")
        yield p
        p.close()


def _files(seed_package) -> dict[str, bytes]:
    m = json.loads((seed_package / MANIFEST).read_text())
    paths = [MANIFEST, MANIFEST_DIGEST, *(f["path"] for f in m["weights"]["files"]),
             *(f["path"] for f in m["files"] if f["path"].startswith("kernels/"))]
    return {p: (seed_package / p).read_bytes() for p in paths}


def _check(page, files: dict[str, bytes], data, record: bool = True) -> dict:
    """Load and run ``files`` in ``page``: a result, or a one-line KilnError; no uncaught error; the page alive.
    Returns the page's outcome."""
    target = "webgpu" if data.draw(st.integers(0, 3)) == 0 else "wasm"
    threads = data.draw(st.integers(1, 2)) if target == "wasm" else None  # (one worker, or two over shared memory)
    wire = {p: base64.b64encode(b).decode() for p, b in files.items()}
    got = page.evaluate(LOAD_AND_RUN, {"files": wire, "target": target, "threads": threads,
                                       "x": FEEDS["x"].ravel().tolist()})
    if record:  # (--hypothesis-show-statistics tells how the inputs ended)
        event(f"{target}{threads or ''}: {'ran' if got['ok'] else got['name']}")
    if not got["ok"]:
        assert got["kiln"] and got["name"] in ("KilnError", "PackageError", "ShapeError", "DeviceError"), got
        assert got["message"] and "\n" not in got["message"], got
    assert not page.errors, page.errors
    assert page.evaluate("1 + 1") == 2
    return got


def _with_manifest(files: dict[str, bytes], manifest_bytes: bytes) -> dict[str, bytes]:
    return {**files, MANIFEST: manifest_bytes, MANIFEST_DIGEST: digest_line(manifest_bytes).encode()}


def test_the_seed_package_runs_in_the_page(page, seed_package):
    class Draws:  # (a stand-in for hypothesis's data: webgpu, wasm on one thread and on two)
        def __init__(self, *values):
            self.values = iter(values)

        def draw(self, _):
            return next(self.values)

    for values in ((0,), (1, 1), (1, 2)):
        assert _check(page, _files(seed_package), Draws(*values), record=False)["ok"]  # (kiln.js takes the valid one)


@FUZZ
@given(data=st.data())
def test_edited_manifests(page, seed_package, data):
    files = _files(seed_package)
    m = data.draw(manifest_edits(json.loads(files[MANIFEST])))
    _check(page, _with_manifest(files, json.dumps(m).encode()), data)


@FUZZ
@given(data=st.data())
def test_manifest_bytes(page, seed_package, data):
    files = _files(seed_package)
    _check(page, _with_manifest(files, data.draw(manifest_byte_edits(files[MANIFEST]))), data)


@FUZZ
@given(data=st.data())
def test_edited_files(page, seed_package, data):
    files = _files(seed_package)
    # (the wasm modules too: kiln.js runs them in workers, and an edit that loops for ever is stopped at timeoutMs)
    path = data.draw(st.sampled_from(sorted(p for p in files if p not in (MANIFEST, MANIFEST_DIGEST)
                                            and not p.endswith(".c"))))
    raw = data.draw(file_edits(files[path]))
    m = json.loads(files[MANIFEST])
    with_checksums(m, path, raw)
    assert hashlib.sha256(raw).hexdigest() in json.dumps(m)
    _check(page, _with_manifest({**files, path: raw}, json.dumps(m).encode()), data)
