"""The speech package: a directory of packages run together (docs/speech.md).

``speech.json`` names the parts (each an ordinary package in its own folder: ``log_mel``, ``encoder``,
``decoder``) and holds what transcription needs besides them (the front end's sizes, the special tokens, the
decoding configuration); ``tokenizer.json`` is the model's own. Since format 1.2 ``speech.json`` lists the files
beside the parts with their SHA-256 (``files``) and ``speech.sha256`` holds its own, as a part's manifest does. The runtimes read it:
:class:`kiln.runtime.speech.SpeechSession` natively, ``kiln.js``'s ``loadSpeech`` in browsers.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from kiln.errors import PackageError
from kiln.package.format import digest_line
from kiln.package.manifest import validate_speech_manifest
from kiln.package.writer import (
    MANIFEST,
    RUNTIME_FILES,
    SPEECH_FILES,
    check_destination,
    copy_runtime,
    file_table,
    write_package,
)

SPEECH = "speech.json"
#: (speech format 1.2) speech.json's SHA-256 in sha256sum's format
SPEECH_DIGEST = "speech.sha256"


def check_speech_destination(out: str | os.PathLike, force: bool) -> None:
    """Refuse an existing ``out`` unless ``force`` and it is empty, a Kiln package or a speech package.

    Raises:
        PackageError: naming the directory and what to do.
    """
    check_destination(out, force, markers=(MANIFEST, SPEECH))


def write_speech_package(parts: dict[str, Any], out: str | os.PathLike, *, spec: dict[str, Any],
                         files: dict[str, Path], force: bool = False, source: str = "") -> Path:
    """Write a speech package: each compiled part (:class:`kiln.compiler.Compiled`) as a package in folder
    ``spec["parts"][name]``, ``speech.json`` (``spec``), ``files`` (name -> a file to copy, the tokenizer) and the
    browser runtime with ``speech.js`` and ``transcribe.html``.
    Everything is written in a temporary directory first, so a failure leaves ``out`` as it was.

    Raises:
        PackageError: ``out`` exists and is not replaceable (:func:`check_speech_destination`), or a write fails
            (a full disk, no permission: ``out`` is left as it was).
    """
    out = Path(out)
    check_speech_destination(out, force)
    validate_speech_manifest(spec, SPEECH)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as e:
        raise PackageError(f"cannot write the speech package {out}: {e.strerror or e}") from None
    try:
        for name, compiled in parts.items():
            write_package(compiled, tmp / spec["parts"][name], preset="none", source=source)
        for name, src in files.items():
            shutil.copyfile(src, tmp / name)
        copy_runtime(tmp, (*(f for f in RUNTIME_FILES if f != "index.html"), *SPEECH_FILES))
        # (1.2) the files beside the parts (the parts cover theirs), and speech.json's own digest
        folders = {folder.split("/")[0] for folder in spec["parts"].values()}
        spec = {**spec, "files": [f for f in file_table(tmp, set()) if f["path"].split("/")[0] not in folders]}
        text = (json.dumps(spec, indent=1) + "\n").encode()
        (tmp / SPEECH).write_bytes(text)
        (tmp / SPEECH_DIGEST).write_text(digest_line(text, SPEECH))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except OSError as e:
        raise PackageError(f"cannot write the speech package {out}: {e.strerror or e}"
                           + (f" ({e.filename})" if e.filename else "") + "; nothing was replaced") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
