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

from kiln.errors import DeviceError, KilnError, ModelFormatError, PackageError, ShapeError, UnsupportedOpError
from kiln.version import __version__

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


def compile(model, *args, **options):
    """Compile a model to a package directory; returns its path.

    * ONNX: ``compile("model.onnx", out, **options)``; see :func:`kiln.compiler.compile_model` for the options.
    * PyTorch: ``compile(module, example_inputs, out=..., dims=..., input_names=..., output_names=...,
      dynamic_axes=..., opset=17, keep_onnx=None, **options)``: the module is exported with ``torch.onnx.export``
      (:mod:`kiln.frontend.torch`; torch is imported only then) and the ONNX model compiled with the same options.
      A dynamic axis (``dynamic_axes={"x": {0: "batch"}}``) is a symbolic dim bound to ``dims["batch"]``, else
      to the example input's size.

    Raises:
        KilnError: PyTorch is missing or cannot export the module, bad arguments; and whatever
            :func:`~kiln.compiler.compile_model` raises (UnsupportedOpError names every ONNX operator Kiln lacks).
    """
    from kiln.compiler import compile_model
    from kiln.frontend import torch as torch_frontend

    if not torch_frontend.is_torch_module(model) and not callable(getattr(model, "forward", None)):
        if len(args) > 1 or (args and "out" in options):
            raise KilnError("compile(model.onnx, out, **options) takes one positional argument after the model")
        out = args[0] if args else options.pop("out", None)
        if out is None:
            raise KilnError("compile: no output directory (out)")
        return compile_model(model, out, **options)
    if not torch_frontend.is_torch_module(model):
        torch_frontend._import_torch()  # a clear error when PyTorch is missing
        raise KilnError(f"compile: expected an ONNX file path or a torch.nn.Module, got {type(model).__name__}")
    if len(args) > 2:
        raise KilnError("compile(module, example_inputs, out, **options): too many positional arguments")
    example_inputs = args[0] if args else options.pop("example_inputs", None)
    out = args[1] if len(args) > 1 else options.pop("out", None)
    if example_inputs is None or out is None:
        raise KilnError("compile(module, example_inputs, out=...) needs example inputs and an output directory")
    export_opts = {k: options.pop(k) for k in ("input_names", "output_names", "dynamic_axes", "opset", "dynamo")
                   if k in options}
    dims, keep_onnx = options.pop("dims", None), options.pop("keep_onnx", None)
    import shutil
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(prefix="kiln-torch-") as tmp:
        path = Path(tmp) / "model.onnx"
        names, examples = torch_frontend.export(model, example_inputs, path, **export_opts)
        bound = torch_frontend.bind_dims(export_opts.get("dynamic_axes"), names, examples, dims)
        if keep_onnx is not None:
            from kiln.package.format import atomic_path

            with atomic_path(keep_onnx) as kept:
                shutil.copyfile(path, kept)
        return compile_model(path, out, dims=bound, **options)


def load(package, target: str = "webgpu", **options):
    """Load a package for native execution of its ``target``: ``webgpu`` (wgpu-py; see
    :class:`kiln.runtime.native.Session`), ``wasm`` (wasmtime; see :class:`kiln.runtime.wasm.WasmSession`) or
    ``cpu`` (the C kernels built for this machine; see :class:`kiln.runtime.cpu.CpuSession`, option ``threads``).
    The sessions have the same API (``run``, ``inputs``, ``outputs``, ``benchmark``, ``profile``). A speech package
    (``speech.json``) loads as a :class:`kiln.runtime.speech.SpeechSession` (``transcribe``)."""
    if target not in ("webgpu", "wasm", "cpu"):
        raise KilnError(f"the native runtime runs the webgpu, wasm and cpu targets, not {target!r}"
                        + (" (WebGL2 runs in browsers: kiln serve PACKAGE, or kiln.js)" if target == "webgl2" else ""))
    from kiln.runtime.speech import SpeechSession, is_speech_package

    if is_speech_package(package):
        return SpeechSession(package, target=target, **options)
    from kiln.runtime import open_session

    return open_session(package, target=target, **options)


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
