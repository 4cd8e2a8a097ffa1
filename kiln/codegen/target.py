"""Targets: the limits and features generated code may assume.

Limits are WebGPU's defaults (WebGPU spec §3.6.2 "Limits"), which every
conformant adapter supports, so a package compiled against them loads anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class WebGPUTarget:
    """The WebGPU target: WGSL compute shaders.

    Attributes:
        limits: WebGPU limit name -> value the package assumes (manifest ``limits``).
        features: WebGPU features the package requires (``shader-f16`` for fp16 compute).
    """

    name: str = "webgpu"
    limits: dict[str, int] = field(default_factory=lambda: {
        "maxStorageBuffersPerShaderStage": 8,
        "maxStorageBufferBindingSize": 134217728,
        "maxBufferSize": 268435456,
        "maxComputeWorkgroupsPerDimension": 65535,
        "maxComputeInvocationsPerWorkgroup": 256,
        "maxComputeWorkgroupSizeX": 256,
    })
    features: tuple[str, ...] = ()


TARGETS = {"webgpu": WebGPUTarget}


def get_target(name: str) -> WebGPUTarget:
    """The target called ``name`` (ValueError listing the known ones otherwise)."""
    try:
        return TARGETS[name]()
    except KeyError:
        raise ValueError(f"unknown target {name!r}; known: {', '.join(TARGETS)}") from None
