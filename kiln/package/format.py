"""The package format: a directory both runtimes read (see docs/package-format.md).

Version ``MAJOR.MINOR``: a runtime reads any package of its own major version
and refuses a newer major version with a clear message.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import KilnError, PackageError, ShapeError, one_line
from kiln.package.manifest import validate_manifest

#: tensor dtype -> the element type its WebGPU buffers hold (every element 4 bytes). WGSL storage
#: buffers hold no bool, 8-, 16- or 64-bit integers: those are widened or narrowed to i32 on upload
#: and converted back on readback; int64 values must fit in int32 (checked on upload). float16 is
#: widened to f32 (exactly), so packages need no shader-f16 device feature.
STORAGE: dict[str, str] = {
    "float32": "float32",
    "float16": "float32",
    "int32": "int32",
    "int64": "int32",
    "bool": "int32",
    "int16": "int32",
    "uint16": "int32",
    "uint8": "int32",
    "int8": "int32",
    # uint32 and uint64 as int32 (values must fit, checked on upload; results wrap as the unsigned type does);
    # narrow floats (ml_dtypes) widened to f32 exactly, narrow ints to i32 (format 1.4, native runtimes)
    "uint32": "int32",
    "uint64": "int32",
    "bfloat16": "float32",
    "float8e4m3fn": "float32",
    "float8e4m3fnuz": "float32",
    "float8e5m2": "float32",
    "float8e5m2fnuz": "float32",
    "float4e2m1": "float32",
    "float8e8m0": "float32",
    "int4": "int32",
    "uint4": "int32",
    "int2": "int32",
    "uint2": "int32",
}

#: dtypes whose numpy type is ``ml_dtypes``' (their manifest names are ONNX's, lower case)
_ML_DTYPES = {"bfloat16": "bfloat16", "float8e4m3fn": "float8_e4m3fn", "float8e4m3fnuz": "float8_e4m3fnuz",
              "float8e5m2": "float8_e5m2", "float8e5m2fnuz": "float8_e5m2fnuz", "float4e2m1": "float4_e2m1fn",
              "float8e8m0": "float8_e8m0fnu",
              "int4": "int4", "uint4": "uint4", "int2": "int2", "uint2": "uint2"}


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype of a manifest dtype name (``float32``, ``int64``, ``bfloat16``, ``float8e4m3fn``, ...)."""
    if dtype in _ML_DTYPES:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, _ML_DTYPES[dtype]))
    return np.dtype(dtype)

_INT32 = np.iinfo(np.int32)


def to_storage(array: np.ndarray, dtype: str, what: str) -> np.ndarray:
    """``array`` (of ``dtype``) converted to its buffer element type (:data:`STORAGE`).

    Raises:
        ShapeError: an int64 value outside int32's range (naming ``what``, the value and where it is),
            or a dtype the WebGPU target cannot store.
    """
    if dtype not in STORAGE:
        raise ShapeError(f"{what}: {dtype} tensors cannot be stored in WebGPU buffers")
    store = np.dtype(STORAGE[dtype])
    a = np.asarray(array)
    if a.dtype == store:
        return np.ascontiguousarray(a)
    if dtype in ("int64", "uint32", "uint64") and a.size:
        bad = (a > _INT32.max) if dtype != "int64" else (a < _INT32.min) | (a > _INT32.max)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ShapeError(f"{what}: {dtype} value {int(a[where])} at index {list(where)} does not fit in int32; the "
                             f"WebGPU target computes {dtype} tensors as int32 (WGSL has no 64-bit integers)")
    return np.ascontiguousarray(a.astype(store))


def from_storage(raw: bytes | memoryview | np.ndarray, dtype: str, shape) -> np.ndarray:
    """A tensor of ``dtype`` and ``shape`` from the bytes of its buffer (:data:`STORAGE` element type)."""
    n = int(np.prod(shape, dtype=np.int64))
    stored = np.frombuffer(raw, dtype=STORAGE[dtype], count=n).reshape(shape)
    if dtype == "bool":
        return stored != 0
    return stored.astype(numpy_dtype(dtype), copy=True)

FORMAT = "kiln-package"
VERSION = "1.14"
MAJOR = 1
MANIFEST = "manifest.json"
#: the manifest's SHA-256 in ``sha256sum``'s format (format 1.8): ``sha256sum -c manifest.sha256`` checks it too
MANIFEST_DIGEST = "manifest.sha256"
#: the first format version whose packages carry MANIFEST_DIGEST and the manifest's ``files`` table
INTEGRITY_VERSION = (1, 8)

#: WebGPU's default limits (WebGPU spec §3.6.2 "Limits"), which every conformant adapter offers:
#: the compiler stays within them by default, runtimes request only limits above them
DEFAULT_LIMITS: dict[str, int] = {
    "maxStorageBuffersPerShaderStage": 8,
    "maxStorageBufferBindingSize": 134217728,
    "maxBufferSize": 268435456,
    "maxComputeWorkgroupsPerDimension": 65535,
    "maxComputeInvocationsPerWorkgroup": 256,
    "maxComputeWorkgroupSizeX": 256,
}


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path next to ``path`` to write to: renamed over ``path`` when the block ends, removed when it
    raises (an interrupt included), so ``path`` is always either what it was or complete. After a SIGKILL or power
    loss the temporary file (``.NAME.*.tmp``) may remain; ``path`` is still intact.

    Raises:
        KilnError: the file cannot be written (a full disk, no permission), naming it; the old one is kept.
    """
    path = Path(path)
    try:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise KilnError(f"cannot write {path}: {e.strerror or e} (nothing was replaced)") from None
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise KilnError(f"cannot write {path}: {e.strerror or e} (nothing was replaced)") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def has_integrity(manifest: dict[str, Any]) -> bool:
    """Whether the package's format (1.8 and later) covers every file with a checksum: ``manifest.sha256`` for the
    manifest, ``files`` for the rest (weights in ``weights.files``)."""
    try:
        return tuple(int(x) for x in str(manifest.get("version", "")).split(".")[:2]) >= INTEGRITY_VERSION
    except ValueError:
        return False


def digest_line(data: bytes, name: str = MANIFEST) -> str:
    """``manifest.sha256``'s text for manifest bytes ``data`` (``sha256sum``'s format; ``name``: the file it names,
    ``speech.json`` for a speech package's ``speech.sha256``)."""
    return f"{hashlib.sha256(data).hexdigest()}  {name}\n"


def write_manifest(package: str | os.PathLike, manifest: dict[str, Any]) -> None:
    """Write ``manifest`` as the package's ``manifest.json`` and its ``manifest.sha256``, each through a
    temporary file renamed into place (a tool that edits a package, or a test making a variant of one)."""
    root = Path(package)
    data = json.dumps(manifest, indent=1).encode()
    for name, content in ((MANIFEST, data), (MANIFEST_DIGEST, digest_line(data).encode())):
        with atomic_path(root / name) as tmp:
            tmp.write_bytes(content)


def check_manifest_digest(data: bytes, digest: bytes | None, where: str,
                          names: tuple[str, str] = (MANIFEST, MANIFEST_DIGEST)) -> None:
    """Check manifest bytes ``data`` against the text of ``manifest.sha256`` (None: missing); ``names``: the
    manifest's and the digest's file names (``speech.json`` and ``speech.sha256`` for a speech package).

    Raises:
        PackageError: the digest file is missing or malformed, or the manifest's SHA-256 differs from it.
    """
    manifest, digest_name = names
    if digest is None:
        raise PackageError(f"{where}: no {digest_name} (a package of this format has one); the package is incomplete")
    want = digest.decode("ascii", "replace").split()
    if not want or len(want[0]) != 64:
        raise PackageError(f"{where}: {digest_name} is malformed (expected a SHA-256 in sha256sum's format)")
    got = hashlib.sha256(data).hexdigest()
    if got != want[0].lower():
        raise PackageError(f"{where}: {manifest} SHA-256 checksum mismatch (expected {want[0]}, got {got}); the "
                           "package is corrupted or its manifest was edited")


def read_package_file(package: str | os.PathLike, manifest: dict[str, Any], relative: str, what: str) -> bytes:
    """The bytes of file ``relative`` of a package, checked against the manifest's ``files`` table (format 1.8;
    an older package's files are not checked).

    Raises:
        PackageError: the file is missing, unlisted in a 1.8 package, or its size or SHA-256 differs.
    """
    root = Path(package)
    try:
        data = (root / relative).read_bytes()
    except OSError as e:
        raise PackageError(f"{root}: cannot read {what} {relative} ({e.strerror or e})") from None
    if has_integrity(manifest):
        check_file(data, {f["path"]: f for f in manifest.get("files", [])}.get(relative), f"{root}: {what} {relative}")
    return data


def read_package_text(package: str | os.PathLike, manifest: dict[str, Any], relative: str, what: str) -> str:
    """:func:`read_package_file` as UTF-8 text (a kernel's source, the tokenizer).

    Raises:
        PackageError: what :func:`read_package_file` raises, or bytes that are not UTF-8.
    """
    data = read_package_file(package, manifest, relative, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PackageError(f"{Path(package)}: {what} {relative} is not UTF-8 text (byte {e.start})") from None


def check_file(data: bytes, entry: dict[str, Any] | None, where: str) -> None:
    """Check a file's bytes against its ``files`` entry ``{path, bytes, sha256}`` (None: not listed).

    Raises:
        PackageError: not listed, or a size or SHA-256 mismatch.
    """
    if entry is None:
        raise PackageError(f"{where}: not listed in the manifest's files (the package was edited)")
    got = hashlib.sha256(data).hexdigest()
    if len(data) != entry["bytes"] or got != entry["sha256"]:
        raise PackageError(f"{where}: SHA-256 checksum mismatch (expected {entry['sha256']}, got {got}); the package "
                           "is corrupted or was edited")


def verify_files(package: str | os.PathLike, manifest: dict[str, Any]) -> int:
    """Check every file the manifest's ``files`` table lists (format 1.8; kernels, modules, pages, scripts,
    tokenizer, parts) and the weights; returns how many files were checked.

    Raises:
        PackageError: the first missing or mismatching file.
    """
    verify_weights(package, manifest)
    for f in manifest.get("files", []):
        read_package_file(package, manifest, f["path"], "file")
    return len(manifest.get("files", [])) + len(manifest["weights"]["files"])


def read_manifest(package: str | os.PathLike) -> dict[str, Any]:
    """Load and check ``manifest.json`` of a package directory.

    Raises:
        PackageError: no such directory, no manifest, malformed JSON, not a Kiln package,
            a newer major format version than this runtime reads, a manifest the package contract
            refuses (see :func:`parse_manifest`), or (format 1.8) one whose SHA-256 differs from
            ``manifest.sha256`` or without that file.
    """
    root = Path(package)
    if not root.exists():
        raise PackageError(f"{root}: no such package directory")
    if not root.is_dir():
        raise PackageError(f"{root}: a package is a directory (made by `kiln compile`), not a file")
    path = root / MANIFEST
    if not path.exists():
        raise PackageError(f"{root}: not a Kiln package (no {MANIFEST})")
    data = path.read_bytes()
    manifest = parse_manifest(data, path, root)
    if has_integrity(manifest):
        digest = root / MANIFEST_DIGEST
        check_manifest_digest(data, digest.read_bytes() if digest.exists() else None, str(root))
    return manifest


def parse_manifest(data: bytes | str, path: str | os.PathLike, root: str | os.PathLike) -> dict[str, Any]:
    """Parse and check the text of a ``manifest.json`` (for packages that are not directories, e.g. uploads).

    Args:
        data: the file's bytes (UTF-8) or text.
        path: the manifest's name in error messages.
        root: the package's name in error messages.

    Returns:
        The manifest, valid against the package contract (``kiln/package/manifest.schema.json``, see
        :mod:`kiln.package.manifest`): at least ``format``, ``version``, ``inputs``, ``outputs``,
        ``buffers``, ``targets`` and ``weights``.

    Raises:
        PackageError: malformed JSON, not a Kiln package manifest, a newer major format version
            than this runtime reads (checked first), a manifest the schema refuses (one line naming the
            JSON path and the problem), or one whose references do not hold (:func:`check_references`).
    """
    try:
        manifest = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise PackageError(f"{path}: malformed JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise PackageError(f"{path}: not a Kiln package manifest")
    version = str(manifest.get("version", ""))
    try:
        major = int(version.split(".")[0])
    except ValueError:
        raise PackageError(f"{path}: bad format version {version!r}") from None
    if major > MAJOR:
        raise PackageError(f"{root}: package format {version} is newer than this Kiln reads ({VERSION}); upgrade Kiln")
    validate_manifest(manifest, str(path))
    check_references(manifest, str(path))
    return manifest


def check_references(manifest: dict[str, Any], where: str) -> None:
    """Check what refers to what in a schema-valid manifest, which the schema cannot state: buffer ids (the ids of
    inputs, outputs, state and plan steps exist, each I/O buffer holds its tensor), kernel indices and their buffer
    counts, weights files, and the C targets' memory layout (every buffer inside the module's memory, after the
    arena). A package that fails is inconsistent (a compiler bug, or an edit), so no runtime indexes past a list or
    writes past its memory because of it.

    Raises:
        PackageError: one line naming the JSON path and the problem.
    """
    buffers = manifest["buffers"]
    n = len(buffers)

    def fail(what: str) -> None:
        raise PackageError(f"{where}: {what} (the package is inconsistent)")

    def buffer(ref: Any, path: str) -> dict[str, Any]:
        if isinstance(ref, bool) or not isinstance(ref, int) or not 0 <= ref < n:
            fail(f"{path}: buffer {ref!r} does not exist (there are {n})")
        return buffers[ref]

    def whole(value: Any) -> bool:  # JSON Schema counts 24.0 as an integer; the runtimes need ints
        return isinstance(value, int) and not isinstance(value, bool)

    for i, b in enumerate(buffers):
        if b["id"] != i:
            fail(f"buffers[{i}].id is {b['id']}, not {i}")
        if not whole(b["bytes"]):
            fail(f"buffers[{i}].bytes is {b['bytes']!r}, not an integer")
        if b["bytes"] % 4:
            fail(f"buffers[{i}].bytes is {b['bytes']}, not a multiple of 4")
    for kind in ("inputs", "outputs"):
        for i, t in enumerate(manifest[kind]):
            b = buffer(t["buffer"], f"{kind}[{i}].buffer")
            if not all(whole(d) for d in t["shape"]):
                fail(f"{kind}[{i}].shape {t['shape']!r} holds a dim that is not an integer")
            storage = np.dtype(STORAGE.get(t.get("storage", t["dtype"]), "float32"))
            need = int(np.prod([max(int(d), 0) for d in t["shape"]], dtype=object)) * storage.itemsize
            if b["bytes"] < need:
                fail(f"{kind}[{i}] ({t['name']}): buffer {t['buffer']} holds {b['bytes']} bytes, the tensor needs {need}")
    for i, st in enumerate(manifest.get("state", [])):
        buffer(st["buffer"], f"state[{i}].buffer")
    counts = {d["name"] for d in manifest.get("dynamic_dims", []) if "count" in d}
    for i, d in enumerate(manifest.get("dynamic_dims", [])):
        if "count" in d and buffer(d["count"], f"dynamic_dims[{i}].count")["bytes"] < 4:
            fail(f"dynamic_dims[{i}].count: buffer {d['count']} holds no int32")
    files = {f["path"] for f in manifest["weights"]["files"]}
    for i, b in enumerate(buffers):
        if b["kind"] == "weight" and b.get("file") not in files:
            fail(f"buffers[{i}].file: {b.get('file')!r} is not one of the weights files")
    for name, target in manifest["targets"].items():
        if not isinstance(target, dict) or not isinstance(target.get("kernels"), list):
            continue
        kernels = target["kernels"]
        for j, step in enumerate(kernel_steps(target.get("plan", []))):
            k = step.get("kernel")
            if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < len(kernels):
                fail(f"targets.{name}.plan: step {j} runs kernel {k!r}, which does not exist (there are "
                     f"{len(kernels)})")
            refs = step.get("buffers", [])
            if "total" in step and not whole(step["total"]):
                fail(f"targets.{name}.plan: step {j} has a total of {step['total']!r}, not an integer")
            for r in refs:
                buffer(r, f"targets.{name}.plan[{j}].buffers")
            for d in step.get("bind_dims", []):
                if d not in counts:
                    fail(f"targets.{name}.plan: step {j} binds {d!r}, which is not a data-dependent dim")
            kernel = kernels[k]
            dispatch, most = step.get("dispatch"), (target.get("limits") or {}).get("maxComputeWorkgroupsPerDimension",
                                                                                       65535)
            if isinstance(dispatch, list) and not all(isinstance(d, int) and 0 <= d <= most for d in dispatch):
                fail(f"targets.{name}.plan: step {j} dispatches {dispatch}, beyond {most} workgroups a dimension")
            want = len(kernel["bindings"]) if isinstance(kernel.get("bindings"), list) else kernel.get("params")
            if isinstance(want, int) and len(refs) != want:
                fail(f"targets.{name}.plan: step {j} binds {len(refs)} buffers to kernel {k}, which takes {want}")
        memory = target.get("memory")
        if isinstance(memory, dict) and isinstance(memory.get("offsets"), list):
            offsets, size, arena = memory["offsets"], memory.get("bytes", 0), memory.get("arena", 0)
            if not whole(size) or not whole(arena) or not whole(memory.get("pages", 0)):
                fail(f"targets.{name}.memory: bytes, arena and pages must be integers")
            if len(offsets) != n:
                fail(f"targets.{name}.memory.offsets: {len(offsets)} offsets for {n} buffers")
            for i, (offset, b) in enumerate(zip(offsets, buffers)):
                if not isinstance(offset, int) or offset < arena or offset + b["bytes"] > size:
                    fail(f"targets.{name}.memory.offsets[{i}]: buffer {i} ({b['bytes']} bytes at {offset!r}) lies "
                         f"outside the memory after the arena ({arena}..{size})")


def verify_weights(package: str | os.PathLike, manifest: dict[str, Any]) -> None:
    """Check every weight file's size and SHA-256 against the manifest (PackageError on mismatch)."""
    root = Path(package)
    for f in manifest["weights"]["files"]:
        p = root / f["path"]
        if not p.exists():
            raise PackageError(f"{root}: weight file {f['path']} is missing")
        if p.stat().st_size != f["bytes"] or sha256_file(p) != f["sha256"]:
            raise PackageError(f"{p}: checksum mismatch (corrupted or edited weights)")


def read_weights(package: str | os.PathLike, manifest: dict[str, Any]):
    """Yield ``(buffer entry, array)`` for every ``weight`` buffer of a package, in manifest order.

    Each array is C-contiguous, of the buffer's stored dtype (see :data:`STORAGE`). Check the files
    first with :func:`verify_weights`; runtimes copy each array into their buffer or linear memory.

    Raises:
        PackageError: a weights file or tensor is missing or unreadable, or a tensor is larger than its buffer.
    """
    from safetensors import SafetensorError, safe_open

    path = Path(package)
    handles: dict[str, Any] = {}
    try:
        for b in manifest["buffers"]:
            if b["kind"] != "weight":
                continue
            f = b["file"]
            if f not in handles:
                handles[f] = safe_open(str(path / f), framework="numpy")
            data = np.ascontiguousarray(handles[f].get_tensor(b["tensor"]))
            if data.nbytes > b["bytes"]:
                raise PackageError(f"{path}: weight {b['tensor']} is larger than its buffer")
            yield b, data
    except (OSError, KeyError, SafetensorError) as e:
        raise PackageError(f"{path}: cannot read weights ({one_line(e)})") from None


def kernel_steps(plan: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every kernel step of an execution plan in order, those inside the control steps of format 1.4 included
    (both branches of an ``if``, the body of a ``loop``; docs/package-format.md). A flat plan comes back as is."""
    out: list[dict[str, Any]] = []
    for step in plan:
        if "kernel" in step:
            out.append(step)
        elif "if" in step:
            out += kernel_steps(step["then"]) + kernel_steps(step["else"])
        elif "loop" in step:
            out += kernel_steps(step["loop"]["body"])
    return out
