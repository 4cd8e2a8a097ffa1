"""The WebGPU target's build: one WGSL compute shader per fused group and the dispatch plan.

Each group is lowered under its schedule (the defaults for the device class, or a tuning database's),
rendered by :mod:`kiln.codegen.webgpu.wgsl`, validated by naga and deduplicated by source
(:class:`~kiln.codegen.target.KernelTable`). :func:`section` writes the manifest's ``targets.webgpu``
(docs/package-format.md).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kiln.arith import symbolic
from kiln.arith.expr import call
from kiln.codegen.lowering import build_group, group_expr, kernel_groups
from kiln.codegen.target import KernelTable, Program, describe, progress_over, scheduled_variant
from kiln.codegen.webgpu import wgsl
from kiln.codegen.webgpu.validate import SUBGROUP_FEATURE, has_feature, validate_wgsl
from kiln.package import dynamic
from kiln.package.format import DEFAULT_LIMITS
from kiln.passes.fusion import Group
from kiln.passes.memory_plan import MemoryPlan
from kiln.te.compute import Tensor
from kiln.te.horizontal import concat, concatenable, ride
from kiln.te.loops import loop_iterations, pin_dims
from kiln.te.rows import analyse_rows
from kiln.te.schedule import Schedule, default_schedule


@dataclass
class Kernel:
    """One generated shader (shared by every step with identical source)."""

    name: str
    source: str
    access: list[str]
    ops: list[str]
    schedule: dict = field(default_factory=dict)
    #: what the manifest records about a tuned schedule (``speedup``, ``trials``, ``adapter``); empty if untuned
    tuning: dict = field(default_factory=dict)
    #: True when the kernel reads the run-time dims uniform (binding after its storage buffers)
    dims: bool = False
    #: loop iterations one invocation runs in all (:func:`kiln.te.loops.loop_iterations`): an int or a size expression
    loop_iterations: Any = 0
    #: the kernel's subgroup form (:func:`kiln.codegen.webgpu.wgsl.render` with ``subgroups``), where it has one,
    #: and its loop iterations
    subgroup_source: str | None = None
    subgroup_loop_iterations: Any = 0

    @property
    def workgroup_size(self) -> int:
        """Invocations per workgroup (from the schedule)."""
        return self.schedule.get("workgroup_size", 64)

    @property
    def path(self) -> str:
        """The kernel's file in a package."""
        return f"kernels/{self.name}.wgsl"

    @property
    def subgroup_path(self) -> str:
        """The file of the kernel's subgroup form in a package."""
        return f"kernels/{self.name}.subgroups.wgsl"

    def to_json(self) -> dict[str, Any]:
        """The kernel's entry in ``targets.webgpu.kernels``."""
        return {"name": self.name, "source": self.path, "entry_point": "main",
                "workgroup_size": [self.workgroup_size, 1, 1],
                "bindings": [{"binding": i, "access": a} for i, a in enumerate(self.access)],
                "ops": self.ops, "schedule": self.schedule, **({"dims_binding": len(self.access)} if self.dims else {}),
                **({"loop_iterations": symbolic.to_json(self.loop_iterations)} if self.loop_iterations else {}),
                **({"subgroups": {"source": self.subgroup_path, **({"loop_iterations": symbolic.to_json(
                    self.subgroup_loop_iterations)} if self.subgroup_loop_iterations else {})}}
                   if self.subgroup_source else {}),
                **({"tuned": True, "tuning": self.tuning} if self.tuning else {})}


@dataclass
class Step:
    """One dispatch of the execution plan."""

    kernel: int
    dispatch: tuple[int, int, int]
    buffers: list[int]
    name: str
    #: workgroups as a size expression of run-time dims (None when static; ``dispatch`` then holds the upper bound)
    groups: Any = None
    #: kernels of the same group scheduled for another range of run-time dims (see :func:`kiln.codegen.target.scheduled_variant`)
    variants: list[Variant] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The step's entry in ``targets.webgpu.plan``."""
        return {"kernel": self.kernel, "dispatch": list(self.dispatch), "buffers": self.buffers, "node": self.name,
                **dynamic.step_fields(self),
                **({"variants": [v.to_json() for v in self.variants]} if self.variants else {})}


@dataclass
class Variant:
    """A plan step's kernel for dims inside ``when`` (name -> ``[lo, hi]``, all must hold): the same group and
    buffers, lowered under the schedule chosen at another point of the dims' range."""

    when: dict[str, list[int]]
    kernel: int
    dispatch: tuple[int, int, int]
    groups: Any

    def to_json(self) -> dict[str, Any]:
        """The variant's entry in a plan step's ``variants``."""
        return {"when": self.when, "kernel": self.kernel, "dispatch": list(self.dispatch),
                "groups": symbolic.to_json(self.groups)}


class WebGPUKernels(KernelTable):
    """The WGSL kernels of a plan: rendered, validated and deduplicated (also used by the control-flow plan)."""

    def __init__(self, validate: bool = True, features: tuple[str, ...] = ()):
        super().__init__()
        self.validate, self.features = validate, features
        self._variants: dict[int, Variant | None] = {}  # kernel index -> its variant
        #: lowered kernels by group structure (kiln.codegen.lowering.build_group): a decoder's layers lowered once
        self.memo: dict = {}
        self._rendered: dict[tuple[int, str], tuple[Any, str]] = {}  # (id, comment) -> (kernel, its WGSL)

    def step(self, g: Group, schedule: Schedule | Callable[[Tensor], Schedule], plan: MemoryPlan,
             accumulate: str = "float32", shape_text: str | None = None, variants: bool = True,
             lowered: tuple[Any, list] | None = None, pinned: dict[str, int] | None = None) -> Step:
        """Lower (unless ``lowered`` gives ``(kernel, input values)``), render and add group ``g``; returns its plan
        step (buffers from ``plan.of``), with a :class:`Variant` where the schedule at
        :func:`~kiln.codegen.target.scheduled_variant` differs (unless not ``variants``). ``pinned`` (dim name ->
        value): run-time dims constant wherever the step runs (:func:`~kiln.te.loops.pin_dims`)."""
        k, ins = lowered if lowered is not None else build_group(g, schedule, plan if plan.half else None, accumulate,
                                                                 self.memo)
        if pinned:
            k = pin_dims(k, pinned)
        index = self._add([g], k, describe(g, shape_text))
        bufs = [plan.of[id(v)] for v in ins] + [plan.of[id(g.output)]]
        step = self._step(index, k, bufs, g)
        if step.groups is None or not variants:
            return step
        if index not in self._variants:  # steps of one kernel (same source: same computation) share its variant
            self._variants[index] = None
            made = self.variant(g, k, ins, schedule, plan, accumulate)
            if made is not None:
                when, kv = made
                self._variants[index] = Variant(when, self._add([g], kv, describe(g, shape_text)), self._dispatch(kv),
                                                kv.groups)
        if self._variants[index] is not None:
            step.variants.append(self._variants[index])
        return step

    def variant(self, g: Group, k, ins: list, schedule: Schedule | Callable[[Tensor], Schedule], plan: MemoryPlan,
                accumulate: str = "float32") -> tuple[dict[str, list[int]], Any] | None:
        """``(when, kernel)`` of group ``g``'s variant (``k``, ``ins``: its kernel and input values), or None (the
        variant's lowering kept in :attr:`memo` too: its key holds the dims' values it is scheduled at)."""
        if not callable(schedule) or not symbolic.is_symbolic(k.groups):
            return None
        made = scheduled_variant(k.size_vars, lambda: build_group(g, schedule, plan if plan.half else None, accumulate,
                                                                  self.memo))
        if made is None:
            return None
        when, (kv, ins_v) = made
        if kv.schedule.to_json() != k.schedule.to_json() and [id(v) for v in ins_v] == [id(v) for v in ins]:
            return when, kv
        return None

    def concat_step(self, run: list[tuple[Group, Any, list[int]]]) -> Step:
        """One step running the kernels of ``run`` (``(group, lowered kernel, buffers)`` each: independent,
        :func:`~kiln.te.horizontal.concatenable`) as one dispatch (:func:`kiln.te.horizontal.concat`)."""
        groups = [g for g, _, _ in run]
        name = "_".join(g.name for g in groups)
        k, bufs = concat([k for _, k, _ in run], [b for _, _, b in run], name)
        index = self._add(groups, k, " + ".join(describe(g) for g in groups))
        return self._step(index, k, bufs, groups[0])

    def ride_step(self, g: Group, schedule: Schedule | Callable[[Tensor], Schedule], plan: MemoryPlan,
                  accumulate: str = "float32", pinned: dict[str, int] | None = None) -> Step:
        """The step of group ``g`` (a cooperative kernel) with its riders' (``g.riders``: kernels whose invocations
        work alone, :func:`~kiln.te.horizontal.concat` joins them first) in workgroups after its own
        (:func:`kiln.te.horizontal.ride`); ``pinned`` as for :meth:`step`, for all of them."""
        def lowered(x: Group) -> tuple[Any, list[int]]:
            k, ins = build_group(x, schedule, plan if plan.half else None, accumulate, self.memo)
            return (pin_dims(k, pinned) if pinned else k), [plan.of[id(v)] for v in ins] + [plan.of[id(x.output)]]

        host, bufs = lowered(g)
        parts = [lowered(r) for r in g.riders]
        rider, rider_bufs = parts[0] if len(parts) == 1 else \
            concat([k for k, _ in parts], [b for _, b in parts], "_".join(r.name for r in g.riders))
        k, bufs = ride(host, rider, bufs, rider_bufs, "_".join(x.name for x in (g, *g.riders)))
        index = self._add([g, *g.riders], k, " + ".join([describe(g, symbolic.format_shape(g.output.shape)),
                                                          *(describe(r) for r in g.riders)]))
        return self._step(index, k, bufs, g)

    def _step(self, index: int, k, bufs: list[int], g: Group) -> Step:
        """The plan step running kernel ``index`` (lowered as ``k``) over ``bufs``, named by group ``g``'s first node:
        a static dispatch, or the workgroups as a size expression of run-time dims."""
        if not symbolic.is_symbolic(k.groups):
            return Step(index, k.dispatch, bufs, g.nodes[0].name)
        return Step(index, self._dispatch(k), bufs, g.nodes[0].name, groups=k.groups)

    def _add(self, groups: list[Group], k, comment: str) -> int:
        src = self._render(k, comment)

        def make(name: str) -> Kernel:
            if self.validate:
                validate_wgsl(src, name, features=self.features)
            sub = wgsl.render(k, comment, subgroups=True)
            if sub == src:
                sub = None
            elif self.validate and has_feature(SUBGROUP_FEATURE):  # (else checked where a runtime compiles it)
                validate_wgsl(sub, name, features=(*self.features, SUBGROUP_FEATURE))
            return Kernel(name, src, [p.access for p in k.params], [n.op for g in groups for n in g.nodes],
                          k.schedule.to_json(), dict(getattr(k.schedule, "tuning", None) or {}),
                          dims=bool(k.size_vars), loop_iterations=loop_iterations(k.body), subgroup_source=sub,
                          subgroup_loop_iterations=loop_iterations(k.body, subgroups=True) if sub else 0)

        return self.add(src, "_".join(g.name for g in groups), make)

    def _render(self, k, comment: str) -> str:
        """``wgsl.render(k, comment)``, once per lowered kernel object (the memo hands a decoder's layers one)."""
        key = (id(k), comment)
        kept = self._rendered.get(key)
        if kept is None or kept[0] is not k:
            kept = self._rendered[key] = (k, wgsl.render(k, comment))
        return kept[1]

    @staticmethod
    def _dispatch(k) -> tuple[int, int, int]:
        return k.schedule.dispatch(symbolic.planned(k.groups) * k.schedule.workgroup_size)


def build_kernels(groups: list[Group], plan: MemoryPlan, validate: bool = True, progress: bool = False,
                  schedule: Schedule | Callable[[Tensor], Schedule] = default_schedule, accumulate: str = "float32",
                  concat_steps: bool = False):
    """Generate, deduplicate and validate the WGSL of every non-alias group; returns ``(kernels, steps)``.

    ``schedule`` is one schedule for every kernel or a function choosing one per kernel
    expression (default :func:`~kiln.te.schedule.default_schedule`). Values ``plan`` stores as f16
    are computed with fp16 compute (dot products accumulated in ``accumulate``, see :mod:`kiln.te.half`).
    With ``concat_steps``, runs of neighbouring independent kernels whose invocations work alone and that have no
    loops become one step (:func:`kiln.te.horizontal.concat`; :func:`_joins` says which): the plan then has fewer
    steps than groups.
    """
    table = WebGPUKernels(validate, ("shader-f16",) if plan.half else ())
    work = kernel_groups(groups)
    boxes = {id(g): g.alternative_box if g.alternative_box is not None else split_range(g) if g.split else
             alternative_range(g) for g in work if g.alternative_to}
    within: dict[int, list] = {}  # a replaced group -> the ranges where alternatives run instead (one per alternative)
    for g in work:
        for r in (*g.alternative_to, *g.riders):  # (a rider runs within its host's dispatch there)
            if boxes[id(g)] and boxes[id(g)] not in within.setdefault(id(r), []):
                within[id(r)].append(boxes[id(g)])
    steps = []
    run: list[tuple[Group, Any, list[int]]] = []  # neighbouring kernels to run as one step
    ins_of: dict[int, list] = {}  # a run's kernel -> its input values

    def one(g: Group, lowered: tuple[Any, list] | None = None) -> Step:
        # an alternative runs only inside its range: dims the range pins (a decode step's one token) are constants
        box = boxes.get(id(g)) or ()
        pinned = {d.name: lo for d, lo, hi in box if lo == hi}
        if g.riders:
            return table.ride_step(g, schedule, plan, accumulate, pinned)
        return table.step(g, schedule, plan, accumulate, symbolic.format_shape(g.output.shape),
                          variants=not g.alternative_to, lowered=lowered, pinned=pinned)

    def flush() -> None:
        if len(run) == 1:
            g, k, _ = run[0]
            steps.append(one(g, (k, ins_of[id(k)])))
        elif run:
            steps.append(table.concat_step(run))
        if run:  # (replaced, or riding on another step's dispatch, in those ranges: no workgroups there)
            vacate(steps[-1], run[0][0])
        run.clear()

    def vacate(step: Step, g: Group) -> None:
        step.variants[:0] = [Variant(_when(box), step.kernel, step.dispatch, 0) for box in within.get(id(g), ())]

    for g in progress_over(work, progress, "generating kernels"):
        if concat_steps and not g.alternative_to:
            k, ins = build_group(g, schedule, plan if plan.half else None, accumulate, table.memo)
            bufs = [plan.of[id(v)] for v in ins] + [plan.of[id(g.output)]]
            # (kernels without loops only: a concatenated kernel's loop count is the sum of its parts', which
            # llvmpipe limits per invocation, and a long kernel gains nothing from sharing its dispatch)
            if concatenable(k) and not loop_iterations(k.body) and \
                    table.variant(g, k, ins, schedule, plan, accumulate) is None:
                if not _joins(run, k, bufs) or within.get(id(g)) != within.get(id(run[0][0])):
                    flush()
                run.append((g, k, bufs))
                ins_of[id(k)] = ins
                continue
            flush()
            step = one(g, (k, ins))
            vacate(step, g)
            steps.append(step)
            continue
        flush()
        step = one(g)
        if g.alternative_to:  # runs inside its range only (nowhere when it has none)
            box = boxes[id(g)]
            count = step.groups if step.groups is not None else step.dispatch[0] * step.dispatch[1] * step.dispatch[2]
            step.groups = symbolic.simplify(count * _inside(box)) if box else 0
        else:  # replaced by an alternative inside its range: no workgroups there
            vacate(step, g)
        steps.append(step)
    flush()
    return table.kernels, steps


#: the most kernels one concatenated step runs, and the storage buffers it may bind (WebGPU's default
#: ``maxStorageBuffersPerShaderStage``, which the target keeps within)
MAX_CONCAT, MAX_CONCAT_BUFFERS = 4, DEFAULT_LIMITS["maxStorageBuffersPerShaderStage"]


def _joins(run: list[tuple[Group, Any, list[int]]], k, bufs: list[int]) -> bool:
    """Whether kernel ``k`` (binding ``bufs``, its output last) may run in one dispatch with the kernels of ``run``:
    one workgroup size, no buffer that one writes bound by another (reading it would race with the write; the memory
    plan may also have given a later value the buffer of an earlier one's last read), and few enough buffers."""
    if not run or len(run) >= MAX_CONCAT or k.schedule.workgroup_size != run[0][1].schedule.workgroup_size:
        return False
    written = {b[-1] for _, _, b in run}
    if bufs[-1] in {x for _, _, b in run for x in b} or written & set(bufs):
        return False
    reads = {x for _, _, b in run for x in b[:-1]} | set(bufs[:-1])
    return len(reads) + len(run) + 1 <= MAX_CONCAT_BUFFERS


#: most keys (cached tokens and new ones) a query row of an attention alternative reads: one workgroup a row (the
#: rows of a decode step are few) against three kernels of many workgroups. Measured on an H100 (SmolLM2's decode
#: step, bench/results/llm-attention-20261127-h100.txt), with a group of lanes a key in the stage
#: (kiln.te.rows._stage_shared): at 512 keys the one kernel took 0.53 ms a step (each dispatch alone) against ~0.78
#: for the three, and a step queued back to back 1.57-1.66 ms against 1.65-1.82; at 768 the steps queued took 1.92
#: against 1.73-1.74, at 1000 they were level (1.88-1.89 against 1.89-1.94). Each row's workgroup alone reads its
#: keys and values, so its time grows with them faster than the three kernels' does
MAX_FUSED_KEYS = 512


def alternative_range(g: Group, t: Tensor | None = None, rows_plan=None) -> list[tuple[Any, int, int]] | None:
    """The run-time dims' range (``(dim, lo, hi)`` for each bounded dim) where alternative group ``g`` (an attention
    row kernel, :func:`kiln.passes.fusion.fuse_attention`) runs instead of the groups it replaces: every dim its rows'
    count reads at its lowest value (a decode step's one token), and the keys at most :data:`MAX_FUSED_KEYS` (one
    further dim bounded by it). ``None`` where that range is empty or not of that form. (Kept per group: fusion asks
    first, with the group's expression ``t`` and its :class:`~kiln.te.rows.RowPlan`, the build again.)"""
    if g in _RANGES:
        return _RANGES[g]
    if t is None:
        t = group_expr(g)
        rows_plan = analyse_rows(t)
    _RANGES[g] = got = _range(t, rows_plan)
    return got


#: alternative_range's answers, per group
_RANGES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _range(t: Tensor, rows_plan) -> list[tuple[Any, int, int]] | None:
    if isinstance(rows_plan, str) or not rows_plan.stages:
        return None
    row_dims = symbolic.symbols([t.shape[a] for a in rows_plan.rows])
    box = {d.name: (d, d.lo, d.lo) for d in row_dims}
    at_lo = {d.name: d.lo for d in row_dims}
    for _, sigma in rows_plan.stages:
        rest = [d for d in symbolic.symbols(sigma.extent) if d.name not in at_lo]
        if len(rest) > 1:
            return None

        def keys(v: int, rest=rest, extent=sigma.extent) -> int:
            return int(symbolic.evaluate(extent, {**at_lo, **({rest[0].name: v} if rest else {})}))

        if keys(rest[0].lo if rest else 0) > MAX_FUSED_KEYS:
            return None
        if not rest:
            continue
        d = rest[0]
        lo, hi = d.lo, box[d.name][2] if d.name in box else d.hi
        while lo < hi:  # the largest value within the bound (keys grow with the dim)
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if keys(mid) <= MAX_FUSED_KEYS else (lo, mid - 1)
        box[d.name] = (d, d.lo, lo)
    return list(box.values())


def split_range(g: Group) -> list[tuple[Any, int, int]] | None:
    """The run-time dims' range where the split attention's groups (``g.split``: block, keys, row dims;
    :mod:`kiln.passes.split_attention`) run: the row dims at their lowest value (a decode step's one token) and the
    keys past :data:`MAX_FUSED_KEYS`, up to their bound (where the fused row kernel, :func:`alternative_range`, does
    not run). ``None`` where the keys never get there or depend on more than one other dim."""
    _, keys, rows = g.split
    at_lo = {d.name: d.lo for d in rows}
    rest = [d for d in symbolic.symbols(keys) if d.name not in at_lo]
    if len(rest) != 1:
        return None
    d = rest[0]

    def count(v: int) -> int:
        return int(symbolic.evaluate(keys, {**at_lo, d.name: v}))

    if count(d.hi) <= MAX_FUSED_KEYS:
        return None
    lo, hi = d.lo, d.hi
    while lo < hi:  # the smallest value past MAX_FUSED_KEYS keys (keys grow with the dim)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if count(mid) > MAX_FUSED_KEYS else (mid + 1, hi)
    return [*((r, r.lo, r.lo) for r in rows), (d, lo, d.hi)]


def _when(box: list[tuple[Any, int, int]]) -> dict[str, list[int]]:
    return {d.name: [lo, hi] for d, lo, hi in box}


def _inside(box: list[tuple[Any, int, int]]) -> Any:
    """A size expression that is 1 when every dim of ``box`` is in its range and 0 otherwise (a dim is never below
    its own lower bound)."""
    one: Any = 1
    for d, lo, hi in box:
        one = one * call("min", 1, call("max", 0, hi + 1 - d))
        if lo > d.lo:
            one = one * call("min", 1, call("max", 0, d - (lo - 1)))
    return one


def needed_limits(kernels: list[Kernel], steps: list[Step], plan: MemoryPlan) -> dict[str, int]:
    """The WebGPU limits (spec names) the package's plan actually uses: a runtime asks the device for these."""
    biggest = max((b.nbytes for b in plan.buffers), default=4)
    return {
        "maxStorageBuffersPerShaderStage": max((len(k.access) for k in kernels), default=1),
        "maxStorageBufferBindingSize": biggest,
        "maxBufferSize": biggest,
        "maxComputeWorkgroupsPerDimension": max((max(d) for s in steps for d in [s.dispatch, *(v.dispatch for v in
                                                                                            s.variants)]), default=1),
        "maxComputeInvocationsPerWorkgroup": max((k.workgroup_size for k in kernels), default=1),
        "maxComputeWorkgroupSizeX": max((k.workgroup_size for k in kernels), default=1),
    }


def section(program: Program, kernels: list[Kernel], steps: list[Step], features: tuple[str, ...],
            control_plan: list[dict] | None = None) -> dict[str, Any]:
    """The manifest's ``targets.webgpu``: features, limits, kernels and the plan (nested for run-time
    control flow; a train-step package's inference plan, with the whole ``train_plan`` beside it)."""
    graph = program.graph
    plan_steps = control_plan if control_plan is not None else [s.to_json() for s in steps]
    train_steps = None
    if program.infer_steps is not None:
        train_steps, plan_steps = plan_steps, [plan_steps[i] for i in program.infer_steps]
    return {
        "features": list(features),
        "device_class": program.device_class,
        "limits": needed_limits(kernels, steps, program.plan),
        "kernels": [k.to_json() for k in kernels],
        "plan": plan_steps,
        **({"dims_uniform": dynamic.uniform_section(graph)} if graph.size_vars else {}),
        **({"train_plan": train_steps} if train_steps is not None else {}),
    }
