"""Fuzzing the package reader and runtimes (issue 19): whatever a package's manifest, kernels, modules and weights
hold, loading it and running it ends in a result or a :class:`~kiln.errors.KilnError` with a one-line message:
never another exception, a crash, a hang or an allocation the package does not bound.

The checksums (format 1.8) would refuse every edited file at once, so the mutations are made the way a hostile or
buggy *compiler* would make them: the manifest is edited structurally (a value anywhere replaced by another of any
JSON type, extreme integers included, or an entry deleted) or byte-wise, a kernel or wasm module or weights file
is edited, and the checksums are then recomputed (``write_manifest``) so the runtimes' other checks are what is
tested. Hypothesis draws them (derandomized: the same inputs every run, a bounded number); the wasm runtime runs
every input, WebGPU (lavapipe) a share of them. The cpu target is not fuzzed this way: it compiles the package's C
and runs it in the process, so a package for it is native code, which only its checksums guard (against
corruption, not against its author; docs/reliability.md). A campaign with fresh inputs:
``KILN_FUZZ_RANDOM=1 KILN_FUZZ_EXAMPLES=30000 pytest tests/test_fuzz_package.py --hypothesis-show-statistics``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from fuzzing import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

import kiln
from kiln.errors import KilnError
from kiln.package.format import read_manifest, write_manifest

FUZZ = fuzz_settings(150)

FEEDS = {"x": np.array([[1.0, 2.0]], np.float32)}


def _paths(value, prefix=()):
    """Every JSON path of ``value`` (lists and objects), the root excluded."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield (*prefix, k)
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield (*prefix, i)
            yield from _paths(v, (*prefix, i))


SCALARS = st.one_of(st.none(), st.booleans(), st.sampled_from([0, 1, -1, 2, 3, 4, 7, 64, 65535, 65536, 2**31 - 1, 2**31,
                                                                 2**32, 2**53, -2**31, 10**30]),
                    st.integers(-1000, 100000), st.floats(allow_nan=False, allow_infinity=False, width=32),
                    st.sampled_from(["", "x", "float32", "int64", "webgpu", "../escape", "/etc/passwd", "kernels",
                                     "weights.safetensors", "k0", "main", "read", "read_write", "uniform", "1.9",
                                     "9.0"]))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                         max_size=3), max_leaves=8)


@st.composite
def manifest_edits(draw, manifest: dict) -> dict:
    """``manifest`` with 1 to 3 edits: a value replaced (by one of any JSON type, or a near neighbour of an integer),
    a key or list entry deleted, or a list entry duplicated."""
    m = copy.deepcopy(manifest)
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(m))
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = m
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        kind = draw(st.sampled_from(["replace", "replace", "nudge", "delete", "duplicate"]))
        old = parent[key]
        if kind == "nudge" and isinstance(old, int) and not isinstance(old, bool):
            parent[key] = old + draw(st.sampled_from([-1, 1, -4, 4, 1 << 20, -(1 << 20), 1 << 40]))
        elif kind == "delete":
            del parent[key]
        elif kind == "duplicate" and isinstance(parent, list):
            parent.insert(key, copy.deepcopy(old))
        else:
            parent[key] = draw(JSON)
    return m


def _load_and_run(folder: Path, target: str) -> None:
    """Load ``folder`` and run it: a result, or a one-line KilnError."""
    try:
        # (an edited module can loop for ever: a short time limit stops it, where the default is 600 s)
        session = kiln.load(folder, target=target, **({"timeout_s": 10} if target == "wasm" else {}))
        session.run(FEEDS)
    except KilnError as e:
        assert str(e) and "\n" not in str(e), repr(e)


def _fresh(seed_package: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "pkg"
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(seed_package, folder)
    return folder


def _targets(data) -> list[str]:
    return ["wasm"] + (["webgpu"] if data.draw(st.integers(0, 3)) == 0 else [])


def test_the_seed_package_runs(seed_package):
    for target in ("wasm", "cpu", "webgpu"):
        y = kiln.load(seed_package, target=target).run(FEEDS)["y"]
        np.testing.assert_allclose(y, [[2.0, 0.25, -0.125]], rtol=1e-6)


@FUZZ
@given(data=st.data())
def test_edited_manifests_end_in_kiln_errors(seed_package, tmp_path, data):
    folder = _fresh(seed_package, tmp_path)
    m = read_manifest(folder)
    write_manifest(folder, data.draw(manifest_edits(m)))
    for target in _targets(data):
        _load_and_run(folder, target)


@FUZZ
@given(data=st.data())
def test_manifest_bytes_end_in_kiln_errors(seed_package, tmp_path, data):
    folder = _fresh(seed_package, tmp_path)
    raw = data.draw(manifest_byte_edits((folder / "manifest.json").read_bytes()))
    (folder / "manifest.json").write_bytes(raw)
    (folder / "manifest.sha256").write_text(f"{hashlib.sha256(raw).hexdigest()}  manifest.json\n")
    for target in _targets(data):
        _load_and_run(folder, target)


@FUZZ
@given(data=st.data())
def test_edited_files_end_in_kiln_errors(seed_package, tmp_path, data):
    """A kernel, wasm module or weights file edited (bytes flipped, cut or spliced), the checksums
    recomputed."""
    folder = _fresh(seed_package, tmp_path)
    m = read_manifest(folder)
    files = [f["path"] for f in m["files"] if f["path"].startswith("kernels/") and not f["path"].endswith(".c")]
    files.append("weights.safetensors")
    path = data.draw(st.sampled_from(sorted(files)))
    raw = data.draw(file_edits((folder / path).read_bytes()))
    (folder / path).write_bytes(raw)
    with_checksums(m, path, raw)
    write_manifest(folder, m)
    for target in _targets(data):
        _load_and_run(folder, target)


@st.composite
def manifest_byte_edits(draw, raw: bytes) -> bytes:
    """A manifest's bytes with 1 to 3 edits: a byte replaced by one that matters to JSON, or bytes deleted."""
    raw = bytearray(raw)
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(raw) - 1))
        if draw(st.booleans()):
            raw[at] = draw(st.sampled_from(b'0123456789-.,:{}[]"ex \n\x00\xff'))
        else:
            del raw[at:at + draw(st.integers(1, 32))]
    return bytes(raw)


@st.composite
def file_edits(draw, raw: bytes) -> bytes:
    """``raw`` with 1 to 4 edits: a bit flipped, bytes cut or bytes spliced in."""
    raw = bytearray(raw)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, max(len(raw) - 1, 0)))
        kind = draw(st.sampled_from(["flip", "cut", "splice"]))
        if kind == "flip" and raw:
            raw[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "cut":
            del raw[at:at + draw(st.integers(1, 256))]
        else:
            raw[at:at] = draw(st.binary(min_size=1, max_size=16))
    return bytes(raw)


def with_checksums(m: dict, path: str, raw: bytes) -> None:
    """Make manifest ``m``'s records of file ``path`` (the files table, the weights, a wasm module's own) match its new
    bytes ``raw``, as a hostile compiler would."""
    digest = hashlib.sha256(raw).hexdigest()
    for entry in m["files"] + m["weights"]["files"]:
        if entry["path"] == path:
            entry.update(bytes=len(raw), sha256=digest)
    for target in m["targets"].values():  # the wasm modules carry their own digests too
        for mod in (target, target.get("threads") or {}):
            if isinstance(mod, dict) and mod.get("module") == path:
                mod.update(bytes=len(raw), sha256=digest)
            if isinstance(mod, dict) and mod.get("source") == path and "sha256" in mod:
                mod.update(sha256=digest)


def test_a_json_bomb_is_refused(seed_package, tmp_path):
    """A manifest nested deeper than the JSON parser recurses is a one-line error."""
    folder = _fresh(seed_package, tmp_path)
    raw = ("[" * 100_000 + "]" * 100_000).encode()
    (folder / "manifest.json").write_bytes(raw)
    (folder / "manifest.sha256").write_text(f"{hashlib.sha256(raw).hexdigest()}  manifest.json\n")
    with pytest.raises(KilnError):
        read_manifest(folder)
    assert json.loads((_fresh(seed_package, tmp_path) / "manifest.json").read_text())["format"] == "kiln-package"
