"""Targets: the limits and features generated code may assume.

Limits are WebGPU's defaults (WebGPU spec §3.6.2 "Limits"), which every
conformant adapter supports, so a package compiled against them loads anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln.package.format import DEFAULT_LIMITS


@dataclass(frozen=True)
class WebGPUTarget:
    """The WebGPU target: WGSL compute shaders.

    Attributes:
        limits: WebGPU limit name -> the ceiling generated code keeps within (the package records what it uses).
        features: WebGPU features the package requires (``shader-f16`` for fp16 compute).
    """

    name: str = "webgpu"
    limits: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_LIMITS))
    features: tuple[str, ...] = ()


TARGETS = {"webgpu": WebGPUTarget}


def get_target(name: str) -> WebGPUTarget:
    """The target called ``name`` (ValueError listing the known ones otherwise)."""
    try:
        return TARGETS[name]()
    except KeyError:
        raise ValueError(f"unknown target {name!r}; known: {', '.join(TARGETS)}") from None
