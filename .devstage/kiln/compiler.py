"""The compiler driver: model -> graph IR -> passes -> fused kernels -> WGSL -> package.

:func:`compile_model` is what ``kiln compile`` and :func:`kiln.compile` call.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.codegen import wgsl
from kiln.codegen.target import WebGPUTarget, get_target
from kiln.errors import KilnError, UnsupportedOpError
from kiln.frontend.onnx.importer import import_model, load_model, unsupported_ops
from kiln.ir import dtypes
from kiln.ir.graph import Graph
from kiln.ir.verify import verify
from kiln.kernels import library, storage
from kiln.passes.fusion import Group, fuse
from kiln.passes.manager import optimize
from kiln.passes.memory_plan import MemoryPlan, needs_buffer, plan_memory
from kiln.te import symbolic
from kiln.te.compute import Tensor, inline, placeholder
from kiln.te.lower import lower
from kiln.te.schedule import DEVICE_CLASSES, Schedule, default_schedule

#: ``kiln compile --precision`` values -> the accumulator of dot products (None: fp32 compute); see kiln.te.half
PRECISIONS = {"fp32": None, "fp16": "float32", "fp16-acc16": "float16"}

#: dtypes the WebGPU target's kernels read and write (stored as in kiln.kernels.storage)
KERNEL_DTYPES = {"float32", "float16", "int32", "int64", "bool", "uint8", "int8", "uint16", "int16", "uint32", "uint64",
                 *dtypes.NARROW_FLOATS, *dtypes.NARROW_INTS}


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

    @property
    def workgroup_size(self) -> int:
        """Invocations per workgroup (from the schedule)."""
        return self.schedule.get("workgroup_size", 64)


@dataclass
class Step:
    """One dispatch of the execution plan."""

    kernel: int
    dispatch: tuple[int, int, int]
    buffers: list[int]
    name: str
    #: workgroups as a size expression of run-time dims (None when static; ``dispatch`` then holds the upper bound)
    groups: Any = None


@dataclass
class Compiled:
    """Everything a package is written from."""

    graph: Graph
    groups: list[Group]
    plan: MemoryPlan
    kernels: list[Kernel]
    steps: list[Step]
    target: WebGPUTarget
    passes: list[str] = field(default_factory=list)
    device_class: str = "gpu"
    targets: tuple[str, ...] = ("webgpu",)
    wasm: Any = None  # kiln.codegen.wasm.WasmProgram when "wasm" is among the targets
    webgl2: Any = None  # kiln.webgl2.WebGL2Code when "webgl2" is among the targets
    training: Any = None  # kiln.train.TrainGraph of a train-step package
    precision: str = "fp32"  # a key of PRECISIONS
    infer_steps: list[int] | None = None  # a train-step package: the steps inference runs (indices into steps)
    #: the nested plan of a graph with run-time If/Loop (kiln.compile_control; ``steps`` then lists every
    #: kernel step of every branch and body); None for a flat plan
    control_plan: list[dict] | None = None


def steps_for(groups: list[Group], outputs: list[Any]) -> list[int]:
    """Indices of the plan steps (the non-alias, non-empty groups in order, as :func:`build_kernels` makes
    them) that ``outputs`` (IR values) depend on: running just those, in order, computes ``outputs``.

    Running a subset of the steps in order is safe with the shared activation buffers: every value is
    still written before it is read and not overwritten in between (dropping steps drops only writes).
    """
    producer: dict[int, Group] = {}
    for g in groups:
        for n in g.nodes:
            for o in n.outputs:
                producer[id(o)] = g
    needed: set[int] = set()
    todo = [producer[id(v)] for v in outputs if id(v) in producer]
    while todo:
        g = todo.pop()
        if id(g) in needed:
            continue
        needed.add(id(g))
        todo += [producer[id(v)] for n in g.nodes for v in n.inputs if id(v) in producer]
    work = [g for g in groups if not g.alias and g.output.size]
    return [i for i, g in enumerate(work) if id(g) in needed]


def group_expr(group: Group, plan: MemoryPlan | None = None, accumulate: str = "float32") -> Tensor:
    """The tensor expression of a fused group, producers inlined into the group's output.

    Each placeholder's ``attrs["value"]`` is the IR value it binds to. A float16 value computed inside
    the group is rounded to float16 where it is produced (:func:`kiln.kernels.storage.round_view`), so
    results do not depend on fusion. With a ``plan`` that stores
    values as f16 (fp16 compute) the expression reads and writes them as f16 and computes by the
    mixed-precision rules of :mod:`kiln.te.half` (dot products accumulated in ``accumulate``).

    Raises:
        KilnError: if the group touches a dtype the WebGPU kernels do not support yet.
    """
    env: dict[int, Any] = {}
    for node in group.nodes:
        operands = []
        for v in node.inputs:
            if id(v) in env:
                operands.append(env[id(v)])
            elif v.is_const and not needs_buffer(node, v):
                operands.append(storage.scalar(v.const.reshape(()).item(), v.dtype,
                                               f"node {node.name!r} ({node.op}) constant %{v.name}"))
            else:
                if v.dtype not in KERNEL_DTYPES:
                    raise KilnError(f"node {node.name!r} ({node.op}): {v.dtype} tensors are not supported by the "
                                    f"webgpu target yet (input %{v.name})")
                t = placeholder(v.shape, storage.placeholder_dtype(v.dtype, plan and plan.storage(v)), name=v.name)
                t.attrs["value"] = v
                env[id(v)] = storage.load_view(t, v.dtype)
                operands.append(env[id(v)])
        out = node.outputs[0]
        if out.dtype not in KERNEL_DTYPES:
            raise KilnError(f"node {node.name!r} ({node.op}): {out.dtype} results are not supported by the webgpu "
                            "target yet")
        env[id(out)] = library.build(node.op, operands, node.attrs, out.shape, group.name)
        if out is not group.output and not (plan is not None and plan.half):
            env[id(out)] = storage.round_view(env[id(out)], out.dtype)  # float16 intermediates, as if stored
    final = inline(storage.store_view(env[id(group.output)], group.output.dtype, plan and plan.storage(group.output)))
    if plan is not None and plan.half:
        from kiln.te.half import demote

        final = demote(final, accumulate)
    if group.rows:  # a row kernel (kiln.te.rows): default_schedule gives it a workgroup per row
        final.attrs = {**final.attrs, "rows": True}
    return final


def build_group(group: Group, schedule: Schedule | Callable[[Tensor], Schedule] = default_schedule,
                plan: MemoryPlan | None = None, accumulate: str = "float32"):
    """A fused group lowered under ``schedule`` (or the one ``schedule(expr)`` picks); ``plan`` and
    ``accumulate`` as for :func:`group_expr` (fp16 compute).

    Returns:
        ``(LoweredKernel, input values in binding order)``.
    """
    final = group_expr(group, plan, accumulate)
    k = lower(final, schedule if isinstance(schedule, Schedule) else schedule(final), name=group.name)
    return k, [t.attrs["value"] for t in k.inputs]


def build_kernels(groups: list[Group], plan: MemoryPlan, validate: bool = True, progress: bool = False,
                  schedule: Schedule | Callable[[Tensor], Schedule] = default_schedule, accumulate: str = "float32"):
    """Generate, deduplicate and validate the WGSL of every non-alias group; returns ``(kernels, steps)``.

    ``schedule`` is one schedule for every kernel or a function choosing one per kernel
    expression (default :func:`~kiln.te.schedule.default_schedule`). Values ``plan`` stores as f16
    are computed with fp16 compute (dot products accumulated in ``accumulate``, see :mod:`kiln.te.half`).
    """
    from kiln.codegen.validate import validate_wgsl

    kernels: list[Kernel] = []
    by_source: dict[str, int] = {}
    steps: list[Step] = []
    work = [g for g in groups if not g.alias and g.output.size]  # an empty tensor needs no kernel
    it = work
    if progress:
        from rich.progress import track

        it = track(work, description="generating kernels", transient=True)
    for g in it:
        k, ins = build_group(g, schedule, plan if plan.half else None, accumulate)
        desc = " -> ".join(f"{n.op}" for n in g.nodes) + f" {symbolic.format_shape(g.output.shape)}"
        src = wgsl.render(k, desc)
        digest = hashlib.sha256(src.encode()).hexdigest()
        if digest not in by_source:
            name = f"k{len(kernels):03d}_{g.name}"[:64]
            if validate:
                validate_wgsl(src, name, features=("shader-f16",) if plan.half else ())
            by_source[digest] = len(kernels)
            kernels.append(Kernel(name, src, [p.access for p in k.params], [n.op for n in g.nodes],
                                  k.schedule.to_json(), dict(getattr(k.schedule, "tuning", None) or {}),
                                  dims=bool(k.size_vars)))
        bufs = [plan.of[id(v)] for v in ins] + [plan.of[id(g.output)]]
        groups = k.groups
        if symbolic.is_symbolic(groups):
            steps.append(Step(by_source[digest], k.schedule.dispatch(symbolic.upper(groups) * k.schedule.workgroup_size),
                              bufs, g.nodes[0].name, groups=groups))
        else:
            steps.append(Step(by_source[digest], k.dispatch, bufs, g.nodes[0].name))
    return kernels, steps


#: targets ``kiln compile --target`` accepts (a comma list of them)
TARGETS = ("webgpu", "webgl2", "wasm")


def parse_targets(target: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``"webgpu,wasm"`` (or a list) as a tuple of known target names, in :data:`TARGETS` order.

    Raises:
        KilnError: an unknown target, or none.
    """
    names = [t.strip() for t in (target.split(",") if isinstance(target, str) else target) if t.strip()]
    unknown = [t for t in names if t not in TARGETS]
    if unknown or not names:
        raise KilnError(f"unknown target {', '.join(map(repr, unknown)) or '(none)'}; known: {', '.join(TARGETS)} "
                        "(several as a comma list: webgpu,wasm)")
    return tuple(t for t in TARGETS if t in names)


def check_precision(precision: str, targets: tuple[str, ...], training: Any = None) -> str | None:
    """The dot-product accumulator of ``precision`` (a key of :data:`PRECISIONS`; None for fp32).

    Raises:
        KilnError: an unknown precision, or fp16 with a target other than webgpu or with a train step.
    """
    if precision not in PRECISIONS:
        raise KilnError(f"unknown precision {precision!r}; known: {', '.join(PRECISIONS)}")
    if PRECISIONS[precision] is None:
        return None
    if targets != ("webgpu",):
        raise KilnError(f"--precision {precision} is for the webgpu target only (WGSL f16, WebGPU feature "
                        "shader-f16); compile webgl2 and wasm targets in a separate fp32 package")
    if training is not None:
        raise KilnError(f"--precision {precision} does not apply to train-step packages (--train): they train in fp32")
    return PRECISIONS[precision]


def compile_graph(graph: Graph, target: str | list[str] = "webgpu", validate: bool = True, progress: bool = False,
                  device_class: str = "gpu", wasm_threads: bool = True,
                  schedule: Callable[[Tensor], Schedule] | None = None, training: Any = None,
                  precision: str = "fp32") -> Compiled:
    """Optimise ``graph`` in place and generate its kernels for each of ``target`` (a name or a comma
    list: ``webgpu`` with the default schedules for ``device_class``, ``webgl2``, ``wasm``) and memory plan.

    ``schedule`` chooses each WebGPU kernel's schedule (a tuning database's
    :meth:`~kiln.tune.db.TuningDB.scheduler`); by default the default schedules for ``device_class``.
    With ``training`` (a :class:`kiln.train.TrainGraph` whose ``graph`` is ``graph``) the result also
    records the steps inference runs (``infer_steps``); train-step packages have the webgpu target only.
    ``precision`` ``fp16`` (or ``fp16-acc16``) stores float weights and activations as f16 and computes
    in f16 by the rules of :mod:`kiln.te.half`; the package then needs WebGPU's ``shader-f16``.

    Raises:
        KilnError: an unknown target or precision, a train step for a target other than webgpu, or fp16
            with a target other than webgpu or a train step.
    """
    targets = parse_targets(target)
    accumulate = check_precision(precision, targets, training)
    if graph.size_vars and (targets != ("webgpu",) or training is not None):
        dims = ", ".join(f"{s.name}={s.lo}..{s.hi}" for s in graph.size_vars.values())
        raise KilnError(f"run-time dims ({dims}) are supported by the webgpu target only (asked for "
                        f"{', '.join(targets)}{', a train step' if training is not None else ''}); bind them "
                        "statically with --dim NAME=SIZE for other targets")
    if training is not None and targets != ("webgpu",):
        raise KilnError("train-step packages (--train) have the webgpu target only for now; the webgl2 and wasm "
                        "runtimes do not run train steps yet")
    from kiln.compile_control import compile_control, has_control

    if has_control(graph):  # If/Loop decided at run time: a nested plan
        if training is not None:
            raise KilnError("train-step packages of models with run-time control flow (If/Loop) are not supported")
        if accumulate is not None:
            raise KilnError(f"--precision {precision} is not supported yet for models with run-time control flow "
                            "(If/Loop); compile them in fp32")
        if graph.size_vars:
            dims = ", ".join(f"{s.name}={s.lo}..{s.hi}" for s in graph.size_vars.values())
            raise KilnError(f"run-time dims ({dims}) are not supported yet for models with run-time control flow "
                            "(If/Loop); bind them statically with --dim NAME=SIZE")
        return compile_control(graph, targets, validate=validate, device_class=device_class, schedule=schedule)
    tgt = get_target("webgpu")  # the groups and buffers serve every target: WebGPU's limits are the tightest
    verify(graph)
    fired = optimize(graph)
    # row kernels (kiln.te.rows): the webgpu lowering of gpu schedules only (the other targets and cpu
    # schedules would compute the fused reductions once per element)
    rows = _row_kernel if (targets == ("webgpu",) and device_class == "gpu" and accumulate is None
                           and training is None) else None
    groups = fuse(graph, max_inputs=tgt.limits["maxStorageBuffersPerShaderStage"] - 1, rows=rows)
    plan = plan_memory(graph, groups, half=accumulate is not None)
    if accumulate is not None:
        tgt = dataclasses.replace(tgt, features=(*tgt.features, "shader-f16"))
    kernels, steps = [], []
    if "webgpu" in targets:
        fallback = functools.partial(default_schedule, device_class=device_class)
        if schedule is not None and graph.size_vars:
            schedule = _static_only(schedule, fallback)
        kernels, steps = build_kernels(groups, plan, validate=validate, progress=progress,
                                       schedule=schedule or fallback, accumulate=accumulate or "float32")
    webgl2_code = None
    if "webgl2" in targets:
        from kiln import webgl2

        webgl2_code = webgl2.build(graph, groups, plan, progress=progress)
    program = None
    if "wasm" in targets:
        from kiln.compile_wasm import build_wasm

        program = build_wasm(groups, plan, progress=progress, threads=wasm_threads)
    infer = None
    if training is not None:
        names = set(training.forward_outputs)
        infer = steps_for(groups, [v for v in graph.outputs if v.name in names])
    return Compiled(graph, groups, plan, kernels, steps, tgt, fired, device_class=device_class, targets=targets,
                    wasm=program, webgl2=webgl2_code, training=training, infer_steps=infer, precision=precision)


def _row_kernel(group: Group) -> bool:
    """Whether fused ``group`` lowers as a row kernel (:func:`kiln.te.rows.analyse_rows`)."""
    from kiln.te.rows import analyse_rows

    try:
        return not isinstance(analyse_rows(group_expr(group)), str)
    except KilnError:
        return False


def _static_only(schedule: Callable[[Tensor], Schedule], fallback: Callable[[Tensor], Schedule]):
    """``schedule`` (a tuning database's chooser, keyed by static shapes) for kernels of static shape; ``fallback``
    (the default schedules) for kernels over run-time dims (docs/dynamic-shapes.md)."""
    from kiln.te.compute import placeholders

    def choose(t: Tensor) -> Schedule:
        if symbolic.symbols([t.shape, *(p.shape for p in placeholders(t))]):
            return fallback(t)
        return schedule(t)

    return choose


def compile_model(model: str | os.PathLike, out: str | os.PathLike, *, target: str | list[str] = "webgpu",
                  dims: dict[str, int] | None = None, force: bool = False, preset: str = "auto",
                  labels: str | os.PathLike | None = None, validate: bool = True, progress: bool = False,
                  device_class: str = "gpu", wasm_threads: bool = True,
                  schedule: Callable[[Tensor], Schedule] | None = None, train: Any = None,
                  precision: str = "fp32") -> Path:
    """Compile an ONNX model into a package directory.

    Args:
        model: path of an ``.onnx`` file.
        out: package directory to create.
        target: code generation target(s): ``webgpu``, ``webgl2``, ``wasm`` or a comma list (``webgpu,webgl2``).
        dims: values of symbolic dims (``{"N": 1}``; unbound named dims default to 1).
        force: replace ``out`` if it already holds a Kiln package (never anything else).
        preset: ``auto`` (detect an ImageNet classifier), ``imagenet`` or ``none``: the
            pre/post-processing the demo page and ``kiln run --image`` use.
        labels: a text file of class names, one a line (overrides the preset's).
        validate: validate every shader with naga.
        progress: show progress bars on stderr.
        device_class: ``gpu`` (discrete or integrated GPUs) or ``cpu`` (WebGPU on a CPU:
            SwiftShader, lavapipe): the kind of device the default schedules are made for
            (see :func:`~kiln.te.schedule.default_schedule`); the package runs on both.
        schedule: chooses each kernel's schedule instead of the defaults (``kiln compile
            --tuning-db``: :meth:`kiln.tune.db.TuningDB.scheduler`, which falls back to them).
        wasm_threads: with the wasm target, also build its shared-memory module for workers.
        train: a :class:`kiln.train.TrainOptions`: also build the train step (forward, loss, backward,
            optimizer update; docs/training.md) into the package, whose trainable weights and optimizer
            state persist in device buffers (``Session.train_step``, ``session.trainStep`` in kiln.js).
            The package's dims (batch size) serve both training and inference.
        precision: ``fp32`` (default), ``fp16`` (float weights and activations stored as f16, arithmetic
            in f16 with f32 accumulation and f32 for fragile ops, see :mod:`kiln.te.half`; the package
            needs WebGPU's ``shader-f16``; webgpu target only) or ``fp16-acc16`` (dot products also
            accumulated in f16). Model inputs and outputs keep their dtypes.

    Returns:
        The package directory.

    Raises:
        ModelFormatError, UnsupportedOpError (all missing ops at once, before other work),
        ShapeError, PackageError (``out`` exists and ``force`` is not set), KilnError.
    """
    from kiln.package.writer import check_destination, write_package

    check_destination(out, force)
    check_precision(precision, parse_targets(target), train)
    onnx_model = load_model(model)
    missing = unsupported_ops(onnx_model)
    if missing:
        raise UnsupportedOpError(missing)
    if device_class not in DEVICE_CLASSES:
        raise KilnError(f"device class must be one of {', '.join(DEVICE_CLASSES)}, not {device_class!r}")
    training = None
    if train is not None:
        from kiln.train import build_train_graph

        training = build_train_graph(onnx_model, train, dims)
        graph = training.graph
    else:
        graph = import_model(onnx_model, dims)
    if graph.name in ("", "main_graph", "model", "torch_jit"):
        graph.name = Path(model).stem
    compiled = compile_graph(graph, target, validate=validate, progress=progress, device_class=device_class,
                             wasm_threads=wasm_threads, schedule=schedule, training=training, precision=precision)
    return write_package(compiled, out, force=force, preset=preset, labels=labels, source=Path(model).name)
