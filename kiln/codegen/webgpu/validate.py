"""Validation of generated WGSL by naga, through wgpu-py's ``create_shader_module``.

Compilation validates every shader before a package is written, so a codegen bug
fails at ``kiln compile`` with the shader's name rather than in a user's browser.
"""

from __future__ import annotations

import functools

from kiln.errors import KilnError
from kiln.runtime.subgroups import FEATURE as SUBGROUP_FEATURE
from kiln.runtime.subgroups import for_naga


class ShaderError(KilnError):
    """Generated WGSL failed validation (a Kiln bug: please report it with the model)."""


#: the features a validating device is made with where the adapter has them (one device serves every shader)
VALIDATION_FEATURES = ("shader-f16", SUBGROUP_FEATURE)


@functools.lru_cache(maxsize=1)
def _device():
    from kiln.errors import DeviceError
    from kiln.runtime import gpu

    try:
        adapter = gpu.request_adapter()
    except DeviceError:
        return None
    return adapter.request_device_sync(required_features=[f for f in VALIDATION_FEATURES if f in adapter.features])


def has_feature(feature: str) -> bool:
    """Whether the device that validates shaders here has WebGPU ``feature`` (one of :data:`VALIDATION_FEATURES`)."""
    dev = _device()
    return dev is not None and feature in dev.features


def validate_wgsl(source: str, name: str, features: tuple[str, ...] = ()) -> None:
    """Compile ``source`` with naga on a device with WebGPU ``features`` (``shader-f16`` for shaders that
    ``enable f16``); raise :class:`ShaderError` naming kernel ``name`` if it is invalid or no adapter here
    has the features."""
    dev = _device()
    if dev is None:
        raise ShaderError("no WebGPU adapter to validate shaders with (pass validate=False to skip)")
    missing = [f for f in features if f not in dev.features]
    if missing:
        raise ShaderError(f"the WebGPU adapter here ({dev.adapter.info.get('device', '?')}) lacks "
                          f"{', '.join(missing)}, so naga cannot validate these shaders (pass validate=False to skip)")
    try:  # (for_naga: naga enables subgroups by the device's feature alone, not by the directive)
        dev.create_shader_module(label=name, code=for_naga(source))
    except Exception as e:  # noqa: BLE001  (wgpu raises several error types for invalid WGSL)
        raise ShaderError(f"generated WGSL for kernel {name!r} is invalid: {e}") from None
