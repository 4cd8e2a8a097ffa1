"""Validation of generated WGSL by naga, through wgpu-py's ``create_shader_module``.

Compilation validates every shader before a package is written, so a codegen bug
fails at ``kiln compile`` with the shader's name rather than in a user's browser.
"""

from __future__ import annotations

import functools

from kiln.errors import KilnError


class ShaderError(KilnError):
    """Generated WGSL failed validation (a Kiln bug: please report it with the model)."""


@functools.lru_cache(maxsize=1)
def _device():
    import wgpu

    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    if adapter is None:
        return None
    return adapter.request_device_sync()


def validate_wgsl(source: str, name: str) -> None:
    """Compile ``source`` with naga; raise :class:`ShaderError` naming kernel ``name`` if it is invalid."""
    dev = _device()
    if dev is None:
        raise ShaderError("no WebGPU adapter to validate shaders with (pass validate=False to skip)")
    try:
        dev.create_shader_module(label=name, code=source)
    except Exception as e:  # noqa: BLE001  (wgpu raises several error types for invalid WGSL)
        raise ShaderError(f"generated WGSL for kernel {name!r} is invalid: {e}") from None
