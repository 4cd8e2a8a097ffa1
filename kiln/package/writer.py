"""Write a compiled model as a package directory (format in docs/package-format.md).

The package is assembled in a temporary sibling directory and renamed into place,
so a failed compile never leaves a half-written package, and an existing
directory is only replaced with ``force`` and only if it is a Kiln package.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import save_file

from kiln.arith import symbolic
from kiln.errors import KilnError, PackageError
from kiln.ir.printer import format_graph
from kiln.package import dynamic
from kiln.package.dynamic import io_fields
from kiln.package.format import (
    FORMAT,
    MANIFEST,
    MANIFEST_DIGEST,
    STORAGE,
    VERSION,
    digest_line,
    sha256_file,
    to_storage,
)
from kiln.package.manifest import validate_manifest
from kiln.package.training import io_lists, param_weights, training_manifest
from kiln.version import __version__

#: weights are split into files of at most this many bytes (browsers and WebGPU limit single buffers)
SHARD_BYTES = 256 * 1024 * 1024

#: the browser runtime (ES modules, kiln.js first) and the demo page, copied from kiln/js into every package
#: the JSON Schema validator package.js checks manifests with (vendored from npm; tools/vendor_js.py)
SCHEMA_VALIDATOR = tuple(f"vendor/json-schema/{name}" for name in (
    "index.js", "deep-compare-strict.js", "dereference.js", "format.js", "pointer.js", "types.js", "ucs2-length.js",
    "validate.js", "validator.js", "package.json"))

#: the browser runtime (ES modules, kiln.js first; the package schema and its validator) and the demo page, copied
#: from kiln/js into every package
RUNTIME_FILES = ("kiln.js", "errors.js", "tensor.js", "package.js", "preprocess.js", "webgpu.js", "pipelines.js",
                 "subgroups.js", "webgl2.js", "wasm.js", "wasm-host.js", "wasm-worker.js", "train.js", "control.js",
                 "gputensor.js", "dims.js", "manifest-schema.js",
                 *SCHEMA_VALIDATOR, "index.html", "kiln.css")

#: pages copied into train-step packages besides RUNTIME_FILES (the fine-tuning demo)
TRAINING_FILES = ("train.html",)

#: copied into language-model packages besides RUNTIME_FILES: the generation module, the chat page and the
#: libraries generate.js imports (vendored from npm, pinned by kiln/js/vendor/package-lock.json; tools/vendor_js.py)
GENERATION_FILES = ("generate.js", "chat.html", "vendor/tokenizers.mjs", "vendor/LICENSE.tokenizers",
                    "vendor/jinja.mjs", "vendor/LICENSE.jinja")

#: copied into a speech package's folder (kiln/package/speech.py): the runtime, the speech module, speech.json's
#: schema, its page and the tokenizer library speech.js imports
SPEECH_FILES = ("speech.js", "speech-schema.js", "transcribe.html", "vendor/tokenizers.mjs", "vendor/LICENSE.tokenizers")

IMAGENET = {
    "preprocess": {"type": "image", "input": None, "resize": 256, "crop": 224, "scale": 1 / 255,
                   "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "layout": "NCHW"},
    "postprocess": {"type": "classification", "output": None, "softmax": True, "labels": "labels.txt"},
}


def copy_runtime(folder: Path, names) -> None:
    """Copy the browser runtime's files ``names`` (paths under ``kiln/js``) into ``folder``."""
    js = resources.files("kiln") / "js"
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        with resources.as_file(js.joinpath(*name.split("/"))) as f:
            shutil.copyfile(f, folder / name)


def check_destination(out: str | os.PathLike, force: bool, markers: tuple[str, ...] = (MANIFEST,)) -> None:
    """Refuse an existing ``out`` unless ``force`` and it is empty or a Kiln package (it holds one of ``markers``:
    ``manifest.json``; a speech package's ``speech.json`` too, :mod:`kiln.package.speech`).

    Raises:
        PackageError: naming the directory and what to do.
    """
    p = Path(out)
    if not p.exists():
        return
    if not force:
        raise PackageError(f"{p} already exists; pass --force to replace it")
    if p.is_file() or (any(p.iterdir()) and not any((p / m).exists() for m in markers)):
        raise PackageError(f"{p} exists and is not a Kiln package; refusing to replace it even with --force")


def file_table(folder: Path, skip: set[str]) -> list[dict[str, Any]]:
    """The manifest's ``files`` (format 1.8): ``{path, bytes, sha256}`` of every file under ``folder`` except its
    manifest, manifest digest and ``skip`` (the weights, which ``weights.files`` lists), sorted by path."""
    out = []
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_file() and rel not in (MANIFEST, MANIFEST_DIGEST) and rel not in skip:
            out.append({"path": rel, "bytes": p.stat().st_size, "sha256": sha256_file(p)})
    return out


def _io(v, buffer: int) -> dict[str, Any]:
    return {"name": v.name, "dtype": v.dtype, "storage": STORAGE.get(v.dtype, v.dtype), "shape": list(v.shape),
            "symbolic_shape": list(v.sym_shape) if v.sym_shape else list(v.shape), "buffer": buffer, **io_fields(v)}


def detect_preset(inputs, outputs) -> str:
    """``imagenet`` for a model with one [N,3,H,W] float input and one [N,1000] output, else ``none``."""
    if len(inputs) == 1 and len(outputs) == 1:
        i, o = inputs[0], outputs[0]
        if i.dtype == "float32" and len(i.shape) == 4 and i.shape[1] == 3 and len(o.shape) == 2 and o.shape[1] == 1000:
            return "imagenet"
    return "none"


def write_package(compiled, out: str | os.PathLike, *, force: bool = False, preset: str = "auto",
                  labels: str | os.PathLike | None = None, source: str = "",
                  generation: dict[str, Any] | None = None, extra_files: dict[str, str] | None = None,
                  parts: dict[str, Any] | None = None, runtime: bool = True) -> Path:
    """Write ``compiled`` (a :class:`kiln.compiler.Compiled`: the program and each target's build) to directory
    ``out``; returns its path.

    The writer knows no target: each build brings its manifest section and files (:class:`kiln.codegen.target.
    TargetBuild`); the writer adds the weights, buffers, inputs/outputs, presets and the browser runtime.

    The whole manifest, target sections included, is checked against the package contract
    (``kiln/package/manifest.schema.json``) before it is written; everything is written in a temporary directory
    first, so a failure leaves ``out`` as it was.

    ``generation`` is a language model's ``generation`` section (format 1.6) and ``extra_files`` the text files it
    names (``tokenizer.json``), both from :mod:`kiln.frontend.gguf`. ``parts`` (folder name -> ``Compiled``) are
    packages written inside this one (a language model's ``sampler``, format 1.8), without the browser runtime
    (``runtime=False``: the enclosing package's runs them).

    Raises:
        PackageError: ``out`` exists and is not replaceable (see :func:`check_destination`), a manifest the
            schema refuses (a compiler bug: one line naming the JSON path and the problem), or a write that fails
            (a full disk, no permission: ``out`` is left as it was).
        KilnError: a constant that does not fit its storage type.
    """
    out = Path(out)
    check_destination(out, force)
    unwritten = f"{out / MANIFEST} (not written)"  # what a manifest the schema refuses is named in the error
    graph, plan = compiled.graph, compiled.plan
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as e:
        raise PackageError(f"cannot write the package {out}: {e.strerror or e}") from None
    try:
        (tmp / "kernels").mkdir()
        # weights, sharded
        values = {}  # buffer id -> (tensor name, array, model dtype)
        half = set()  # buffer ids of weights stored as f16 (fp16 compute)
        for g in compiled.groups:
            for n in g.nodes:
                for v in n.inputs:
                    if v.is_const and id(v) in plan.of:
                        values[plan.of[id(v)]] = (v.name, v.const, v.dtype)
                        if id(v) in plan.half:
                            half.add(plan.of[id(v)])
        if compiled.training is not None:
            values.update(param_weights(compiled))
        files: list[dict[str, Any]] = []
        shard: dict[str, np.ndarray] = {}
        shard_bytes = 0
        where: dict[int, str] = {}

        def flush():
            nonlocal shard, shard_bytes
            if not shard and files:
                return
            name = "weights.safetensors" if not files else f"weights-{len(files):05d}.safetensors"
            save_file(shard, str(tmp / name))
            files.append({"path": name, "bytes": (tmp / name).stat().st_size, "sha256": sha256_file(tmp / name)})
            shard, shard_bytes = {}, 0

        stored: dict[int, np.ndarray] = {}
        for bid in sorted(values):
            vname, varray, vdtype = values[bid]
            try:
                stored[bid] = (np.ascontiguousarray(np.asarray(varray).astype(np.float16)) if bid in half
                               else to_storage(varray, vdtype, f"constant %{vname}"))
            except KilnError as e:
                raise KilnError(f"{e} (a constant must fit the buffer type it is stored in)") from None
            if shard and shard_bytes + stored[bid].nbytes > SHARD_BYTES:
                flush()
            shard[vname] = stored[bid]
            shard_bytes += stored[bid].nbytes
            where[bid] = "weights.safetensors" if not files else f"weights-{len(files):05d}.safetensors"
        flush()
        buffers = []
        for b in plan.buffers:
            entry: dict[str, Any] = {"id": b.id, "kind": b.kind, "bytes": b.nbytes, "values": b.values}
            if b.grow is not None:  # (format 1.10) its size at run time: it grows with a growable dim
                entry["grow"] = symbolic.to_json(b.grow)
            if b.id in values:
                vname, varray, vdtype = values[b.id]
                entry.update(kind="weight", tensor=vname, file=where[b.id], dtype=str(stored[b.id].dtype),
                             shape=list(varray.shape), model_dtype=vdtype)
            buffers.append(entry)
        training = None
        if compiled.training is not None:
            training = training_manifest(compiled, buffers)
        model_inputs, model_outputs = io_lists(compiled)
        # state (a KV cache): kept by the runtime in one buffer between runs, neither fed nor read back
        model_inputs = [v for v in model_inputs if v.name not in graph.state]
        model_outputs = [v for v in model_outputs if v.name not in graph.state.values()]
        # data-dependent dims' counts: read back by the runtimes after the step computing them, not outputs
        counts = {id(v) for v in graph.data_dims.values()}
        model_outputs = [v for v in model_outputs if id(v) not in counts]
        given = {v.name: v for v in graph.inputs}
        updated = {v.name: plan.of[id(v)] for v in graph.outputs if v.name in graph.state.values()}
        state = [{"name": name, "update": update, "dtype": given[name].dtype, "shape": list(given[name].shape),
                  "buffer": plan.of[id(given[name])], "bytes": buffers[plan.of[id(given[name])]]["bytes"],
                  # (1.12) a next value computed into another buffer (webgl2), copied back by the runtime
                  **({"update_buffer": updated[update]} if updated[update] != plan.of[id(given[name])] else {})}
                 for name, update in graph.state.items()]
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "generator": f"kiln {__version__}",
            "name": graph.name,
            "source": source,
            "precision": compiled.program.precision,
            "dims": graph.dims,
            **({"dynamic_dims": dynamic.dims_section(graph, plan)} if graph.size_vars else {}),
            **({"dim_limits": [{"dims": list(d), "max": m} for d, m in graph.dim_limits]} if graph.dim_limits else {}),
            "inputs": [{**_io(v, plan.of[id(v)]), **({"value_dim": graph.value_dims[v.name]}
                                                       if v.name in graph.value_dims else {})} for v in model_inputs],
            "outputs": [_io(v, plan.of[id(v)]) for v in model_outputs],
            "buffers": buffers,
            "memory": {
                "weight_bytes": sum(b["bytes"] for b in buffers if b["kind"] == "weight"),
                "activation_bytes": plan.bytes("activation"),
                "activation_bytes_unshared": plan.unshared_bytes,
                "io_bytes": sum(b["bytes"] for b in buffers if b["kind"] in ("input", "output")),
                **({"state_bytes": sum(b["bytes"] for b in buffers if b["kind"] in ("state", "update"))}
                   if training is not None or state else {}),
            },
            **({"state": state} if state else {}),
            **({"training": training} if training is not None else {}),
            **({"generation": generation} if generation is not None else {}),
            "weights": {"files": files},
            "targets": {},
        }
        for name, build in compiled.builds.items():  # each target's section and files (kernels, modules)
            for path, data in build.files.items():
                dest = tmp / path
                dest.parent.mkdir(parents=True, exist_ok=True)
                if isinstance(data, bytes):
                    dest.write_bytes(data)
                else:
                    dest.write_text(data)
            manifest["targets"][name] = build.section
        chosen = detect_preset(model_inputs, model_outputs) if preset == "auto" else preset
        if chosen == "imagenet":
            pre = json.loads(json.dumps(IMAGENET))
            pre["preprocess"]["input"] = model_inputs[0].name
            pre["postprocess"]["output"] = model_outputs[0].name
            manifest.update(pre)
            with resources.as_file(resources.files("kiln") / "data" / "imagenet_classes.txt") as default:
                shutil.copyfile(labels or default, tmp / "labels.txt")
        elif labels:
            shutil.copyfile(labels, tmp / "labels.txt")
            manifest["postprocess"] = {"type": "classification", "output": model_outputs[0].name,
                                       "softmax": True, "labels": "labels.txt"}
        validate_manifest(json.loads(json.dumps(manifest)), unwritten)  # a refused manifest fails before more work
        (tmp / "graph.txt").write_text(format_graph(graph) + "\n")
        for path, data in (extra_files or {}).items():
            (tmp / path).write_text(data, encoding="utf-8")
        if runtime:
            copy_runtime(tmp, RUNTIME_FILES + (TRAINING_FILES if training is not None else ())
                         + (GENERATION_FILES if generation is not None else ()))
        for name, part in (parts or {}).items():
            write_package(part, tmp / name, preset="none", source=source, runtime=False)
        manifest["files"] = file_table(tmp, {f["path"] for f in files})  # every file but the manifest and weights
        text = json.dumps(manifest, indent=1)
        validate_manifest(json.loads(text), unwritten)  # exactly what is written
        (tmp / MANIFEST).write_text(text)
        (tmp / MANIFEST_DIGEST).write_text(digest_line(text.encode()))
        # the previous package moves aside by a rename (whole until the new one is in place: a kill between the two
        # renames leaves it in a hidden sibling, never half deleted), then goes
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent)) if out.exists() else None
        if old is not None:
            os.replace(out, old / "previous")
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except (OSError, SafetensorError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):
            why = (e.strerror or str(e)) + (f" ({e.filename})" if e.filename else "")
        else:  # safetensors' own I/O errors: "Error while serializing: I/O error: File too large (os error 27)"
            why = str(e).split("I/O error: ")[-1] + " (writing the weights)"
        raise PackageError(f"cannot write the package {out}: {why}; nothing was replaced") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
