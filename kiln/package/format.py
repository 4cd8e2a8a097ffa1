"""The package format: a directory both runtimes read (see docs/package-format.md).

Version ``MAJOR.MINOR``: a runtime reads any package of its own major version
and refuses a newer major version with a clear message.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from kiln.errors import PackageError

FORMAT = "kiln-package"
VERSION = "1.0"
MAJOR = 1
MANIFEST = "manifest.json"

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


def read_manifest(package: str | os.PathLike) -> dict[str, Any]:
    """Load and check ``manifest.json`` of a package directory.

    Raises:
        PackageError: no such directory, no manifest, malformed JSON, not a Kiln package,
            or a newer major format version than this runtime reads.
    """
    root = Path(package)
    if not root.exists():
        raise PackageError(f"{root}: no such package directory")
    if not root.is_dir():
        raise PackageError(f"{root}: a package is a directory (made by `kiln compile`), not a file")
    path = root / MANIFEST
    if not path.exists():
        raise PackageError(f"{root}: not a Kiln package (no {MANIFEST})")
    return parse_manifest(path.read_bytes(), path, root)


def parse_manifest(data: bytes | str, path: str | os.PathLike, root: str | os.PathLike) -> dict[str, Any]:
    """Parse and check the text of a ``manifest.json`` (for packages that are not directories, e.g. uploads).

    Args:
        data: the file's bytes (UTF-8) or text.
        path: the manifest's name in error messages.
        root: the package's name in error messages.

    Returns:
        The manifest, a dict with at least ``format``, ``version``, ``inputs``, ``outputs``,
        ``buffers``, ``targets`` and ``weights``.

    Raises:
        PackageError: malformed JSON, not a Kiln package manifest, a newer major format version
            than this runtime reads, or a missing section.
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
    for key in ("inputs", "outputs", "buffers", "targets", "weights"):
        if key not in manifest:
            raise PackageError(f"{path}: manifest lacks {key!r}")
    return manifest


def verify_weights(package: str | os.PathLike, manifest: dict[str, Any]) -> None:
    """Check every weight file's size and SHA-256 against the manifest (PackageError on mismatch)."""
    root = Path(package)
    for f in manifest["weights"]["files"]:
        p = root / f["path"]
        if not p.exists():
            raise PackageError(f"{root}: weight file {f['path']} is missing")
        if p.stat().st_size != f["bytes"] or sha256_file(p) != f["sha256"]:
            raise PackageError(f"{p}: checksum mismatch (corrupted or edited weights)")
