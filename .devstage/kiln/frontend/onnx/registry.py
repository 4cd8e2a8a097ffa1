"""Opset-versioned registry of ONNX operator converters.

A converter turns one ONNX node into primitive IR nodes through a
:class:`~kiln.ir.graph.Builder`. It is registered with the first opset version
whose semantics it implements; for a model of opset ``v`` the converter with the
largest ``since <= v`` is used::

    @onnx_op("Softmax", since=13)
    def softmax(b: Builder, x: Value, *, axis: int = -1) -> Value:
        '''ONNX Softmax-13: exp(x - max(x)) / sum(exp(x - max(x))) along `axis`.'''

Inputs arrive positionally (``None`` for an omitted optional input), attributes
as keyword arguments with Python values; defaults come from the signature.
"""

from __future__ import annotations

from collections.abc import Callable

Converter = Callable[..., object]

#: (domain, op_type) -> list of (since, converter), sorted by since
_REGISTRY: dict[tuple[str, str], list[tuple[int, Converter]]] = {}


def onnx_op(op_type: str, since: int = 1, domain: str = "") -> Callable[[Converter], Converter]:
    """Register the decorated function as the converter of ``op_type`` from opset ``since`` on."""

    def deco(fn: Converter) -> Converter:
        entries = _REGISTRY.setdefault((domain, op_type), [])
        entries.append((since, fn))
        entries.sort(key=lambda e: e[0])
        return fn

    return deco


def lookup(op_type: str, opset: int, domain: str = "") -> Converter | None:
    """The converter for ``op_type`` in ``domain`` at ``opset``, or ``None`` if Kiln lacks one."""
    if domain == "ai.onnx":
        domain = ""
    best = None
    for since, fn in _REGISTRY.get((domain, op_type), []):
        if since <= opset:
            best = fn
    return best

