"""PyTorch frontend: a ``torch.nn.Module`` to an ONNX model through ``torch.onnx.export``, for Kiln's ONNX importer.

PyTorch is an optional dependency, imported only when a module is compiled::

    kiln.compile(module, (x,), out="build/net", dynamic_axes={"x": {0: "batch"}}, dims={"batch": 4})

Inputs are named after the parameters of ``module.forward`` (or ``input_names``), outputs ``output``
(``output0``, ``output1``, ... for several) unless ``output_names`` says otherwise. A dynamic axis
becomes a symbolic dim of the ONNX model (``dim_param``), which Kiln binds to a size at compile time:
the value in ``dims``, else the example input's size along that axis.
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from kiln.errors import KilnError


def is_torch_module(obj: Any) -> bool:
    """True if ``obj`` is a ``torch.nn.Module`` (checked without importing torch when it is not loaded)."""
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def _import_torch():
    try:
        import torch
    except ImportError:
        raise KilnError("compiling a PyTorch module needs PyTorch, which is not installed (pip install torch); "
                        "or export it to ONNX yourself and compile the .onnx file") from None
    return torch


def _names(module, n_inputs: int, input_names: Sequence[str] | None) -> list[str]:
    if input_names is not None:
        if len(input_names) != n_inputs:
            raise KilnError(f"input_names has {len(input_names)} names for {n_inputs} example inputs")
        return list(input_names)
    try:
        params = [p for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    if len(params) >= n_inputs:
        return [p.name for p in params[:n_inputs]]
    return [f"input{i}" for i in range(n_inputs)]


def bind_dims(dynamic_axes: Mapping[str, Mapping[int, str] | Sequence[int]] | None, names: Sequence[str],
              examples: Sequence[Any], dims: Mapping[str, Any] | None) -> dict[str, int]:
    """Kiln dims for the symbolic dims ``dynamic_axes`` creates: ``dims``' value, else the example's size.

    ``dynamic_axes`` is torch.onnx.export's: ``{input name: {axis: dim name}}`` (or a list of axes, named
    ``<input>_dim<axis>`` as Kiln names anonymous dims). Returns ``{dim name: size}``.

    Raises:
        KilnError: an unknown input name or axis; a dim given two different example sizes; a dim value that
            is not a size (run-time ranges are not supported by this build: bind each dim to one size).
    """
    out: dict[str, int] = {}
    for k, v in (dims or {}).items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise KilnError(f"dim {k!r}: expected a size (a positive int), got {v!r}; dims are bound to one size "
                            "at compile time")
        out[k] = v
    by_name = dict(zip(names, examples))
    for name, axes in (dynamic_axes or {}).items():
        if name not in by_name:
            continue  # an output's dynamic axes: they follow from the inputs'
        shape = tuple(by_name[name].shape)
        named = dict(axes) if isinstance(axes, Mapping) else {int(a): f"{name}_dim{int(a)}" for a in axes}
        for axis, dim in named.items():
            if not -len(shape) <= int(axis) < len(shape):
                raise KilnError(f"dynamic_axes: input {name!r} of rank {len(shape)} has no axis {axis}")
            size = int(shape[int(axis)])
            if dim in (dims or {}):
                continue
            if out.setdefault(dim, size) != size:
                raise KilnError(f"dynamic_axes: dim {dim!r} has example sizes {out[dim]} and {size}")
    return out


def export(module, example_inputs: Any, path: str | os.PathLike, *, input_names: Sequence[str] | None = None,
           output_names: Sequence[str] | None = None,
           dynamic_axes: Mapping[str, Mapping[int, str] | Sequence[int]] | None = None,
           opset: int = 17, dynamo: bool = False) -> tuple[list[str], list[Any]]:
    """Export ``module`` (in eval mode) to the ONNX file ``path`` with ``torch.onnx.export``.

    Args:
        module: a ``torch.nn.Module``.
        example_inputs: a tensor or a tuple of tensors, the arguments of ``module.forward``.
        input_names, output_names: ONNX names (defaults: see the module docstring).
        dynamic_axes: torch.onnx.export's ``{name: {axis: dim name}}``.
        opset: the ONNX opset to export to.
        dynamo: use torch's ``torch.export``-based exporter (needs ``onnxscript``) instead of the TorchScript one.

    Returns:
        ``(input names, example inputs as a list)``.

    Raises:
        KilnError: PyTorch is missing, an example input is not a tensor, or the export fails (a construct
            torch.onnx cannot express; the message names torch's error).
    """
    torch = _import_torch()
    examples = list(example_inputs) if isinstance(example_inputs, (tuple, list)) else [example_inputs]
    for i, x in enumerate(examples):
        if not isinstance(x, torch.Tensor):
            raise KilnError(f"example input {i} is a {type(x).__name__}, not a torch.Tensor")
    names = _names(module, len(examples), input_names)
    was_training = module.training
    module.eval()
    try:
        kwargs: dict[str, Any] = {"dynamo": dynamo} if "dynamo" in inspect.signature(torch.onnx.export).parameters \
            else {}
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter's deprecation notice
            torch.onnx.export(module, tuple(examples), str(path), input_names=names,
                              output_names=list(output_names) if output_names else None,
                              dynamic_axes=dict(dynamic_axes) if dynamic_axes else None, opset_version=opset,
                              **kwargs)
    except KilnError:
        raise
    except Exception as e:
        first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        raise KilnError(f"torch.onnx.export could not export {type(module).__name__}: {type(e).__name__}: "
                        f"{first[:300]}") from e
    finally:
        module.train(was_training)
    if not output_names:
        import onnx

        model = onnx.load(str(path))
        outs = [o.name for o in model.graph.output]
        new = ["output"] if len(outs) == 1 else [f"output{i}" for i in range(len(outs))]
        _rename_outputs(model, dict(zip(outs, new)))
        onnx.save(model, str(path))
    return names, examples


def _rename_outputs(model, mapping: dict[str, str]) -> None:
    """Rename graph outputs (and every reference to them) in place."""
    for node in model.graph.node:
        for i, name in enumerate(node.output):
            if name in mapping:
                node.output[i] = mapping[name]
        for i, name in enumerate(node.input):
            if name in mapping:
                node.input[i] = mapping[name]
    for o in model.graph.output:
        o.name = mapping.get(o.name, o.name)
