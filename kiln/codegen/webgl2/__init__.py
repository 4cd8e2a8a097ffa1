"""The WebGL2 target: GLSL ES 3.00 fragment shaders (:mod:`.glsl`), one output element per fragment, over
R32F/R32I textures (:mod:`.build`: kernels and the texture plan, ``targets.webgl2``)."""

from __future__ import annotations

import functools

from kiln.codegen.target import Program, Target, TargetBuild, register
from kiln.codegen.webgl2 import glsl
from kiln.codegen.webgl2.build import build, webgl2_schedule
from kiln.te.compute import Tensor
from kiln.te.schedule import Schedule


@register
class WebGL2Target(Target):
    """The WebGL2 target (``targets.webgl2``, docs/package-format.md).

    Attributes:
        limits: ``MAX_TEXTURE_IMAGE_UNITS`` (inputs a kernel may sample; WebGL2 guarantees 16).
        features: WebGL extensions every package needs (``EXT_color_buffer_float``: float render targets).
    """

    name = "webgl2"
    in_place = False
    state_copy = True  # kiln/js/webgl2.js copies each next state value into its texture after a run
    run_time_dims = True  # sizes from a uniform block, viewports per run (kiln/js/webgl2.js)
    data_dependent = False

    def __init__(self, limits: dict[str, int] | None = None, features: tuple[str, ...] = ()):
        super().__init__(limits or {"MAX_TEXTURE_IMAGE_UNITS": glsl.MAX_TEXTURE_IMAGE_UNITS},
                         features or ("EXT_color_buffer_float",))

    def default_schedule(self, t: Tensor, device_class: str = "gpu") -> Schedule:
        """One output element per fragment (:func:`~kiln.codegen.webgl2.build.webgl2_schedule`), any device."""
        return webgl2_schedule(t)

    def build(self, program: Program, *, validate: bool = True, progress: bool = False) -> TargetBuild:
        """Fragment-shader kernels and the texture plan of ``program``."""
        schedule = functools.partial(self.default_schedule, device_class=program.device_class)
        code = build(program.graph, program.groups, program.plan, progress=progress, schedule=schedule)
        return TargetBuild(self.name, code.manifest(), code.files(), code.kernels, code.steps)


__all__ = ["WebGL2Target"]
