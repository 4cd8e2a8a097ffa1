"""The WebGPU target: WGSL compute shaders (:mod:`.wgsl`), validated by naga (:mod:`.validate`), built into a
dispatch plan (:mod:`.build`), with run-time If/Loop as a nested plan (:mod:`.control`).

Limits are WebGPU's defaults (WebGPU spec §3.6.2 "Limits"), which every conformant adapter supports, so a
package compiled against them loads anywhere; the package records the limits it actually uses.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from kiln.arith import symbolic
from kiln.codegen.lowering import group_expr
from kiln.codegen.target import Program, Target, TargetBuild, register
from kiln.codegen.webgpu import build as _build
from kiln.codegen.webgpu import wgsl
from kiln.codegen.webgpu.control import compile_control
from kiln.errors import KilnError
from kiln.ir.graph import Graph
from kiln.package.format import DEFAULT_LIMITS
from kiln.passes.fusion import Group
from kiln.te.compute import Tensor, placeholders
from kiln.te.rows import MAX_STAGED_ROWS, analyse_rows
from kiln.te.schedule import Schedule, default_schedule


@register
class WebGPUTarget(Target):
    """The WebGPU target: WGSL compute shaders and a dispatch plan (``targets.webgpu``).

    Attributes:
        limits: WebGPU limit name -> the ceiling generated code keeps within (WebGPU's defaults).
        features: WebGPU features the package requires (``shader-f16`` for fp16 compute).
    """

    name = "webgpu"
    run_time_dims = True

    def __init__(self, limits: dict[str, int] | None = None, features: tuple[str, ...] = ()):
        super().__init__(limits or DEFAULT_LIMITS, features)

    def default_schedule(self, t: Tensor, device_class: str = "gpu") -> Schedule:
        """:func:`kiln.te.schedule.default_schedule` for ``device_class``."""
        return default_schedule(t, device_class=device_class)

    def check(self, graph: Graph, *, precision: str = "fp32", training: Any = None, control: bool = False) -> None:
        """Refuse the combinations the webgpu runtimes do not run: run-time If/Loop with fp16, run-time dims or a
        train step, and run-time dims with a train step."""
        if graph.size_vars and training is not None:
            dims = ", ".join(f"{s.name}={s.lo}..{s.hi}" for s in graph.size_vars.values())
            raise KilnError(f"run-time dims ({dims}) are supported by the webgpu target only (asked for webgpu, a "
                            "train step); bind them statically with --dim NAME=SIZE for other targets")
        if not control:
            return
        if training is not None:
            raise KilnError("train-step packages of models with run-time control flow (If/Loop) are not supported")
        if precision != "fp32":
            raise KilnError(f"--precision {precision} is not supported yet for models with run-time control flow "
                            "(If/Loop); compile them in fp32")
        if graph.size_vars:
            dims = ", ".join(f"{s.name}={s.lo}..{s.hi}" for s in graph.size_vars.values())
            raise KilnError(f"run-time dims ({dims}) are not supported yet for models with run-time control flow "
                            "(If/Loop); bind them statically with --dim NAME=SIZE")

    def row_kernels(self, device_class: str, precision: str, training: Any) -> Callable[[Group], bool] | None:
        """The predicate :func:`kiln.passes.fusion.fuse` fuses row reductions with: gpu schedules, inference only
        (cpu schedules would compute the fused reductions once per element)."""
        if device_class == "gpu" and training is None:
            return _row_kernel
        return None

    def matmul_prologues(self, device_class: str, precision: str, training: Any) -> bool:
        """True for gpu schedules of inference (a GPU's arithmetic is cheap beside the weights it reads)."""
        return device_class == "gpu" and training is None

    def rfactor(self, device_class: str, precision: str, training: Any) -> bool:
        """True for gpu schedules of inference (``device_class="cpu"``: SwiftShader and lavapipe have few cores)."""
        return device_class == "gpu" and training is None

    def build(self, program: Program, *, validate: bool = True, progress: bool = False) -> TargetBuild:
        """WGSL kernels and the dispatch plan of ``program`` (a nested plan when it has run-time If/Loop).

        Raises:
            KilnError: a buffer larger than a WebGPU storage binding can be in browsers (:data:`MAX_BINDING_BYTES`),
                naming its tensor, before any kernel is generated.
        """
        biggest = max(program.plan.buffers, key=lambda b: b.nbytes, default=None)
        if biggest is not None and biggest.nbytes > MAX_BINDING_BYTES:
            raise KilnError(f"{', '.join(biggest.values[:2]) or 'a buffer'} needs a buffer of "
                            f"{biggest.nbytes / 2**30:.3g} GiB, beyond the 2 GiB a WebGPU storage buffer binding can be "
                            "in browsers (maxStorageBufferBindingSize; gpuweb/gpuweb#6338): bind its dims smaller "
                            "(--dim) or split the model")
        fallback = functools.partial(self.default_schedule, device_class=program.device_class)
        features = (*self.features, *(("shader-f16",) if program.accumulate is not None else ()))
        if program.control:
            kernels, steps, nested = compile_control(program, validate=validate,
                                                     schedule=program.schedule or fallback,
                                                     max_inputs=self.limits["maxStorageBuffersPerShaderStage"] - 1)
        else:
            schedule = program.schedule
            if schedule is not None and program.graph.size_vars:
                schedule = _static_only(schedule, fallback)
            # (a train step's inference steps and the steps binding data-dependent dims are indices of groups)
            concat_steps = program.concat_steps and program.infer_steps is None and not program.graph.data_dims
            kernels, steps = _build.build_kernels(program.groups, program.plan, validate=validate, progress=progress,
                                                  schedule=schedule or fallback,
                                                  accumulate=program.accumulate or "float32", concat_steps=concat_steps)
            nested = None
        section = _build.section(program, kernels, steps, features, nested)
        files = {k.path: k.source for k in kernels}
        files.update({k.subgroup_path: k.subgroup_source for k in kernels if k.subgroup_source})
        if any(k.subgroup_source for k in kernels):  # what a runtime checks a device with before running them
            files[wgsl.SUBGROUP_PROBE_FILE] = wgsl.SUBGROUP_PROBE
            section["subgroup_probe"] = wgsl.SUBGROUP_PROBE_FILE
        return TargetBuild(self.name, section, files, kernels, steps)


#: the most bytes a buffer of a WebGPU package may hold: browsers bind at most 2 GiB to a shader (Chromium caps
#: maxStorageBufferBindingSize and usually maxBufferSize there; binding ranges beyond it are gpuweb/gpuweb#6338)
MAX_BINDING_BYTES = 1 << 31


def _row_kernel(group: Group) -> bool:
    """Whether fused ``group`` lowers as a row kernel (:func:`kiln.te.rows.analyse_rows`); for attention (column
    reductions) also whether it has keys few enough (:data:`~kiln.codegen.webgpu.build.MAX_FUSED_KEYS`): all of them
    over static shapes, or, for an alternative (``group.alternative_to``, run-time dims), somewhere in the dims'
    range (:func:`~kiln.codegen.webgpu.build.alternative_range`), its stages then sized for that many
    (``group.stage_bound``)."""
    if group.split:  # (FlashDecoding's split kernel, kiln.passes.split_attention: a stage of a block of keys; it
        # runs for one query token only, each row reading its own block: no bound on its rows)
        plan = analyse_rows(group_expr(group))
        return not isinstance(plan, str) and bool(plan.columns) and _build.split_range(group) is not None
    if group.alternative_to:  # it runs only up to MAX_FUSED_KEYS keys: its stages are sized for that many
        group.stage_bound = _build.MAX_FUSED_KEYS
    try:
        t = group_expr(group)
        plan = analyse_rows(t, max_staged_rows=MAX_STAGED_ROWS)
    except KilnError:
        plan = "not a kernel of this target"
    if isinstance(plan, str) or group.alternative_to and not plan.columns:
        group.stage_bound = None
        return False
    if not plan.columns:
        return True
    if group.alternative_to:
        return _build.alternative_range(group, t, plan) is not None
    return all(int(sigma.extent) <= _build.MAX_FUSED_KEYS for _, sigma in plan.stages)


def _static_only(schedule: Callable[[Tensor], Schedule], fallback: Callable[[Tensor], Schedule]):
    """``schedule`` (a tuning database's chooser, keyed by static shapes) for kernels of static shape; ``fallback``
    (the default schedules) for kernels over run-time dims (docs/dynamic-shapes.md)."""
    def choose(t: Tensor) -> Schedule:
        if symbolic.symbols([t.shape, *(p.shape for p in placeholders(t))]):
            return fallback(t)
        return schedule(t)

    return choose


#: the WebGPU target's public names (``WebGPUTarget`` also through :func:`kiln.codegen.target.get_target`)
__all__ = ["WebGPUTarget"]
