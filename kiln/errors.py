"""Kiln's error types.

Every error a user can cause derives from :class:`KilnError`; the CLI prints its
message on one line and exits non-zero (tracebacks only with ``--debug``).
"""

from __future__ import annotations


def one_line(text: str, limit: int = 600) -> str:
    """``text`` (a compiler's or driver's message) on one line: runs of whitespace, newlines included, become one
    space, and more than ``limit`` characters are cut with an ellipsis; for errors that quote another tool."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"


class KilnError(Exception):
    """Base class of all errors Kiln raises on bad input or unsupported models."""


class ModelFormatError(KilnError):
    """The file is missing, unreadable, or not a valid ONNX model."""


class UnsupportedOpError(KilnError):
    """The model uses operators Kiln has no converter for.

    Attributes:
        missing: list of ``(op_type, domain, opset, node_name)`` tuples, all of them at once.
    """

    def __init__(self, missing: list[tuple[str, str, int, str]]):
        self.missing = missing
        by_op: dict[tuple[str, str, int], list[str]] = {}
        for op, domain, opset, node in missing:
            by_op.setdefault((op, domain, opset), []).append(node)
        parts = []
        for (op, domain, opset), nodes in by_op.items():
            dom = domain or "ai.onnx"
            shown = ", ".join(repr(n) for n in nodes[:3]) + (f" (+{len(nodes) - 3} more)" if len(nodes) > 3 else "")
            parts.append(f"{op} ({dom} opset {opset}; node {shown})")
        super().__init__(f"unsupported operator{'s' if len(by_op) > 1 else ''}: " + "; ".join(parts))


class ShapeError(KilnError):
    """Shapes or dtypes do not fit: a wrong input, or an inconsistent graph."""


class ConstantInputError(KilnError):
    """An operator input Kiln must know at compile time (a shape, axes, indices...) is computed at run time.

    Attributes:
        value: name of the offending value (a graph input when the model feeds it at run time), or None.
    """

    def __init__(self, message: str, value: str | None = None):
        super().__init__(message)
        self.value = value


class PackageError(KilnError):
    """A package directory is missing, malformed, corrupted, or of an unsupported format version."""


class DeviceError(KilnError):
    """No suitable WebGPU adapter, or a device limit the package needs is exceeded."""


class DeviceLostError(DeviceError):
    """The GPU device a session ran on was lost (a driver reset, the device destroyed): its buffers are gone, so
    the session cannot run again; loading the package again gives a session on a new device."""


class RpcError(KilnError):
    """An RPC connection failed or was closed, or the RPC server refused a request."""


class AuthError(RpcError):
    """The RPC server refused the connection's token (HTTP 403 at the WebSocket handshake)."""


class ProtocolError(RpcError):
    """An RPC message is malformed or exceeds a limit (see docs/rpc-protocol.md)."""


class RemoteError(RpcError):
    """A remote device raised an error while handling a request.

    Attributes:
        kind: the error's class name on the device (``ShapeError``, ``PackageError``, ``DeviceError``, ...).
        device: the id of the device that raised it.
    """

    def __init__(self, message: str, kind: str = "Error", device: int | None = None):
        super().__init__(message)
        self.kind = kind
        self.device = device
