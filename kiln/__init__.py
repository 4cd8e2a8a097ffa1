"""Kiln: a deep-learning compiler for the web.

Public API::

    import kiln
    kiln.compile("model.onnx", "build/model")      # -> package directory
    session = kiln.load("build/model")              # native WebGPU through wgpu-py
    outputs = session.run({"input": x})             # dict[str, np.ndarray]
"""

from __future__ import annotations

__version__ = "0.1.0"

from kiln.errors import DeviceError, KilnError, ModelFormatError, PackageError, ShapeError, UnsupportedOpError


def compile(model, out, **options):
    """Compile an ONNX model file to a package directory; see :func:`kiln.compiler.compile_model`."""
    from kiln.compiler import compile_model

    return compile_model(model, out, **options)


def load(package, target: str = "webgpu", **options):
    """Load a package for native execution of its ``target``: ``webgpu`` (wgpu-py; see
    :class:`kiln.runtime.native.Session`) or ``wasm`` (wasmtime; see :class:`kiln.runtime.wasm.WasmSession`).
    Both sessions have the same API (``run``, ``inputs``, ``outputs``, ``benchmark``, ``profile``)."""
    if target not in ("webgpu", "wasm"):
        raise KilnError(f"the native runtime runs the webgpu and wasm targets, not {target!r}"
                        + (" (WebGL2 runs in browsers: kiln serve PACKAGE, or kiln.js)" if target == "webgl2" else ""))
    if target == "wasm":
        from kiln.runtime.wasm import WasmSession

        return WasmSession(package, **options)
    from kiln.runtime.native import Session

    return Session(package, target=target, **options)


__all__ = [
    "DeviceError",
    "KilnError",
    "ModelFormatError",
    "PackageError",
    "ShapeError",
    "UnsupportedOpError",
    "__version__",
    "compile",
    "load",
]
