"""The speech package: a directory of packages run together (docs/speech.md).

``speech.json`` names the parts (each an ordinary package in its own folder: ``log_mel``, ``encoder``,
``decoder``) and holds what transcription needs besides them (the front end's sizes, the special tokens, the
decoding configuration); ``tokenizer.json`` is the model's own. The runtimes read it:
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
from kiln.package.manifest import validate_speech_manifest
from kiln.package.writer import MANIFEST, RUNTIME_FILES, SPEECH_FILES, check_destination, copy_runtime, write_package

SPEECH = "speech.json"


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
        (tmp / SPEECH).write_text(json.dumps(spec, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except OSError as e:
        raise PackageError(f"cannot write the speech package {out}: {e.strerror or e}"
                           + (f" ({e.filename})" if e.filename else "") + "; nothing was replaced") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
