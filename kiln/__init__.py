"""Kiln: a deep-learning compiler for the web.

Public API::

    import kiln
    kiln.compile("model.onnx", "build/model")      # -> package directory
    session = kiln.load("build/model")              # native WebGPU through wgpu-py
    outputs = session.run({"input": x})             # dict[str, np.ndarray]

    x = kiln.tensor([1.0, 2.0], requires_grad=True) # eager tensors on WebGPU (kiln.eager, docs/eager.md)
    (x * x).sum().backward()                        # x.grad; kiln.nn and kiln.optim for training
"""

from __future__ import annotations

__version__ = "0.1.0"

from kiln.errors import DeviceError, KilnError, ModelFormatError, PackageError, ShapeError, UnsupportedOpError

#: eager-mode names re-exported from kiln.eager on first use (importing kiln stays light)
_EAGER = ("Tensor", "tensor", "zeros", "ones", "full", "randn", "rand", "arange", "zeros_like", "ones_like",
          "no_grad", "enable_grad", "manual_seed", "cat", "stack", "where", "matmul", "exp", "log", "sqrt", "tanh",
          "sigmoid", "relu", "softmax", "log_softmax", "maximum", "minimum")


def __getattr__(name):
    if name in _EAGER:
        import kiln.eager

        return getattr(kiln.eager, name)
    if name in ("eager", "nn", "optim"):
        import importlib

        return importlib.import_module(f"kiln.{name}")
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")


def compile(model, out, **options):
    """Compile an ONNX model file to a package directory; see :func:`kiln.compiler.compile_model`."""
    from kiln.compiler import compile_model

    return compile_model(model, out, **options)


def load(package, target: str = "webgpu", **options):
    """Load a package for native execution of its ``target``: ``webgpu`` (wgpu-py; see
    :class:`kiln.runtime.native.Session`) or ``wasm`` (wasmtime; see :class:`kiln.runtime.wasm.WasmSession`).
    Both sessions have the same API (``run``, ``inputs``, ``outputs``, ``benchmark``, ``profile``)."""
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
