"""The WebAssembly target: the C kernels of :mod:`kiln.codegen.c` (SIMD128 where they vectorise) compiled by
zig cc into one ``.wasm`` module (:mod:`.toolchain`), with its plan (:mod:`.build`, ``targets.wasm``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from kiln.codegen.cpu_schedule import cpu_row_kernel
from kiln.codegen.target import Program, Target, TargetBuild, register
from kiln.codegen.wasm import toolchain
from kiln.codegen.wasm.build import build_wasm, section
from kiln.passes.fusion import Group
from kiln.te.compute import Tensor
from kiln.te.schedule import Schedule


@register
class WasmTarget(Target):
    """The wasm target (``targets.wasm``): one module for the calling thread, and with ``threads`` a
    shared-memory module for Web Workers.

    Attributes:
        limits: ``memory_bytes``: the most linear memory a module may use (wasm32: 4 GiB).
        features: the WebAssembly proposals the module needs.
    """

    name = "wasm"
    run_time_dims = True

    def __init__(self, limits: dict[str, int] | None = None, features: tuple[str, ...] = (), threads: bool = True):
        super().__init__(limits or {"memory_bytes": toolchain.MAX_MEMORY},
                         features or ("simd128", "bulk-memory", "nontrapping-fptoint"))
        self.threads = threads

    def default_schedule(self, t: Tensor, device_class: str = "cpu") -> Schedule:
        """:func:`~kiln.codegen.wasm.toolchain.wasm_schedule` (tiles for one CPU core), any device class."""
        return toolchain.wasm_schedule(t)

    def row_kernels(self, device_class: str, precision: str, training: Any) -> Callable[[Group], bool] | None:
        """:func:`~kiln.codegen.cpu_schedule.cpu_row_kernel`: a Softmax or LayerNormalization along the innermost
        axis is one kernel, a row a tile (:mod:`kiln.te.cpu_rows`)."""
        return cpu_row_kernel if training is None else None

    def build(self, program: Program, *, validate: bool = True, progress: bool = False) -> TargetBuild:
        """The module(s), C source and plan of ``program``."""
        schedule = functools.partial(self.default_schedule, device_class=program.device_class)
        code = build_wasm(program.groups, program.plan, progress=progress, threads=self.threads, schedule=schedule)
        entry, files = section(code)
        return TargetBuild(self.name, entry, files, code.kernels, code.steps)


__all__ = ["WasmTarget"]
