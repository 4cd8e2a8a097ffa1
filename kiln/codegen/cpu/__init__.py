"""The cpu target: the C kernels of :mod:`kiln.codegen.c` and a plan runner in one C source (:mod:`.build`,
``targets.cpu``), built into a shared library for the machine that runs it (:mod:`kiln.runtime.cpu`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from kiln.codegen.cpu.build import build_cpu
from kiln.codegen.cpu.vector import LANES
from kiln.codegen.cpu_schedule import cpu_row_kernel, cpu_schedule
from kiln.codegen.target import Program, Target, TargetBuild, register
from kiln.passes.fusion import Group
from kiln.te.compute import Tensor
from kiln.te.schedule import Schedule


@register
class CpuTarget(Target):
    """The cpu target (``targets.cpu``): native code for the machine the package runs on, many threads.

    Attributes:
        limits: none (the arena is host memory).
        features: none (the library is compiled for the host's vector units at load, ``-march=native``).
    """

    name = "cpu"
    run_time_dims = True

    def default_schedule(self, t: Tensor, device_class: str = "cpu") -> Schedule:
        """:func:`~kiln.codegen.cpu_schedule.cpu_schedule` for vectors of :data:`~kiln.codegen.cpu.vector.LANES`
        lanes (tiles for one core), any device class."""
        return cpu_schedule(t, LANES)

    def row_kernels(self, device_class: str, precision: str, training: Any) -> Callable[[Group], bool] | None:
        """:func:`~kiln.codegen.cpu_schedule.cpu_row_kernel`: a Softmax or LayerNormalization along the innermost
        axis is one kernel, a row a tile (:mod:`kiln.te.cpu_rows`)."""
        return cpu_row_kernel if training is None else None

    def build(self, program: Program, *, validate: bool = True, progress: bool = False) -> TargetBuild:
        """The C source and plan of ``program``; with ``validate``, also compiles it for this machine (which
        checks it and fills the runtime's library cache, :func:`kiln.runtime.cpu.build_library`)."""
        schedule = functools.partial(self.default_schedule, device_class=program.device_class)
        code = build_cpu(program.groups, program.plan, schedule, progress=progress)
        if validate:
            from kiln.runtime.cpu import build_library  # (compiles C with zig: only when validating)

            build_library(code.source, progress=progress)
        entry, files = code.section()
        return TargetBuild(self.name, entry, files, code.kernels, code.steps)


__all__ = ["CpuTarget"]
