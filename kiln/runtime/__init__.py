"""The runtimes: packages run natively (webgpu through wgpu-py, wasm through wasmtime, cpu as native C)."""

from __future__ import annotations

import os
from typing import Any


def open_session(package: str | os.PathLike, target: str = "webgpu", **options: Any):
    """A session of ``package``'s ``target``: :class:`kiln.runtime.native.Session` (``webgpu``),
    :class:`kiln.runtime.wasm.WasmSession` (``wasm``) or :class:`kiln.runtime.cpu.CpuSession` (``cpu``), each
    imported on first use. :func:`kiln.load` and the speech runtime's parts open packages through it."""
    if target == "wasm":
        from kiln.runtime.wasm import WasmSession

        return WasmSession(package, **options)
    if target == "cpu":
        from kiln.runtime.cpu import CpuSession

        return CpuSession(package, **options)
    from kiln.runtime.native import Session

    return Session(package, target=target, **options)
