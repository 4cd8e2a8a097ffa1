"""The Target interface: what every code generation target provides, and the one kernel build loop.

A target turns the target-neutral result of the middle end (a :class:`Program`: the optimised graph, its
fused groups and the memory plan, shared by every target of a package) into its part of a package: a
manifest section (``manifest["targets"][name]``, docs/package-format.md) and files (kernel sources,
binaries). Every target builds its kernels with :class:`KernelTable`: render each group, deduplicate by
SHA-256 of the source, name new kernels ``k%03d_<group>`` and record one plan step per group.

Targets register themselves in :data:`REGISTRY` (``kiln.codegen.webgpu``, ``kiln.codegen.webgl2``,
``kiln.codegen.wasm``, ``kiln.codegen.cpu``); no target imports another. How to add one:
docs/architecture.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kiln.arith import symbolic
from kiln.codegen.lowering import kernel_groups
from kiln.errors import KilnError
from kiln.ir.graph import Graph
from kiln.passes.fusion import Group
from kiln.passes.memory_plan import MemoryPlan
from kiln.te.compute import Tensor
from kiln.te.schedule import Schedule


@dataclass
class Program:
    """The target-neutral program every target of a package builds from.

    Attributes:
        graph: the optimised graph (inputs, outputs, dims).
        groups: fused groups in execution order (:func:`kiln.passes.fusion.fuse`).
        plan: the memory plan: buffer ids and bytes shared by every target.
        device_class: ``gpu`` or ``cpu``: the device the default schedules are made for.
        precision: a key of ``kiln.compiler.PRECISIONS``; ``accumulate`` the fp16 dot-product accumulator
            (None for fp32 compute).
        schedule: chooses a WebGPU kernel's schedule (a tuning database), None for the defaults.
        training: the :class:`kiln.train.TrainGraph` of a train-step package, else None.
        infer_steps: a train-step package's inference steps (indices into the plan), else None.
        control: the graph has run-time If/Loop: ``groups`` and ``plan`` are empty until the webgpu target,
            which plans every graph level (docs/control-flow.md), fills them in.
        concat_steps: the webgpu target may run neighbouring independent kernels as one step (a plan step per
            kernel group otherwise: the tuner times each group's step).
    """

    graph: Graph
    groups: list[Group]
    plan: MemoryPlan
    device_class: str = "gpu"
    precision: str = "fp32"
    accumulate: str | None = None
    schedule: Callable[[Tensor], Schedule] | None = None
    training: Any = None
    infer_steps: list[int] | None = None
    control: bool = False
    concat_steps: bool = True


@dataclass
class TargetBuild:
    """What a target adds to a package.

    Attributes:
        name: the target's name (the key under ``manifest["targets"]``).
        section: its manifest section (JSON-ready).
        files: package path -> contents (text or bytes) of the files the section names.
        kernels, steps: the target's kernels and plan steps as objects, for tools (``kiln info``, the tuner,
            tests); the section holds their JSON form.
    """

    name: str
    section: dict[str, Any]
    files: dict[str, str | bytes] = field(default_factory=dict)
    kernels: list[Any] = field(default_factory=list)
    steps: list[Any] = field(default_factory=list)


class KernelTable:
    """Kernels deduplicated by source: the bookkeeping of every target's build loop.

    ``add(source, group_name, make)`` returns the index of the kernel with that source, calling
    ``make(name)`` for a new one (``name`` = ``k%03d_<group>``, at most 64 characters; with ``identifier``
    every character that is not alphanumeric becomes ``_``, for C and wasm exports) to build its record.
    """

    def __init__(self, identifier: bool = False):
        self.kernels: list[Any] = []
        self._by_digest: dict[str, int] = {}
        self._identifier = identifier

    def add(self, source: str, group_name: str, make: Callable[[str], Any]) -> int:
        """Index of the kernel whose source is ``source``, made by ``make(name)`` if new."""
        digest = hashlib.sha256(source.encode()).hexdigest()
        if digest not in self._by_digest:
            name = f"k{len(self.kernels):03d}_{group_name}"[:64]
            if self._identifier:
                name = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
            self.kernels.append(make(name))
            self._by_digest[digest] = len(self.kernels) - 1
        return self._by_digest[digest]


#: a run-time dim whose ``opt`` is below this (a decoder step's ``sequence`` of 1: decode) also gets kernels
#: scheduled at ``min(hi, VARIANT_AT)`` (prefill), run for the values above ``opt`` (a plan step's ``variants``)
VARIANT_AT = 64


def variant_values(size_vars: Iterable[Any]) -> dict[str, int]:
    """The run-time dims a kernel over ``size_vars`` gets a variant for (name -> the value its schedule is chosen
    at): those whose ``opt`` is below :data:`VARIANT_AT` and their bound. A decoder step's kernel scheduled at
    ``sequence = 1`` is a matrix-vector product that reloads (and dequantizes) every weight for each prompt
    token; its variant at 64 tiles the tokens too. Of several such dims only the last declared gets it (a model's
    ``seq`` after its ``batch``: the innermost of the row axes, which the variant's tiles split): a variant with
    both at 64 would split ``batch`` too and run only where both exceed their ``opt``, so that batch 1 x seq 128
    ran the matrix-vector kernels (MiniLM with growable dims on the cpu target, 5x slower than static)."""
    below = [v for v in size_vars if v.opt < VARIANT_AT and v.opt < v.hi]
    last = max(below, key=lambda v: v.index, default=None)
    return {} if last is None else {last.name: min(last.hi, VARIANT_AT)}


def scheduled_variant(size_vars: Iterable[Any], build: Callable[[], Any]) -> tuple[dict[str, list[int]], Any] | None:
    """A kernel's variant (docs/dynamic-shapes.md): ``build()`` (its lowering under the default schedule) run again
    with the dims of :func:`variant_values` at their variant value. Returns ``(when, result)``, ``when`` the range it
    runs for (each such dim above its ``opt``, inclusive bounds), or None when no dim of ``size_vars`` gets one."""
    size_vars = list(size_vars)
    values = variant_values(size_vars)
    if not values:
        return None
    with symbolic.opt_values(values):
        result = build()
    return {v.name: [v.opt + 1, v.hi] for v in size_vars if v.name in values}, result


def bind_steps(graph, groups, plan_steps: list[dict[str, Any]]) -> None:
    """Mark, in a target's flat plan (one step per kernel group, :func:`kiln.codegen.lowering.kernel_groups`), the
    step after which each data-dependent dim is read back and bound: ``"bind_dims": [name, ...]`` on the step that
    computes its count (format 1.9, docs/dynamic-shapes.md *Data-dependent shapes*).

    Raises:
        KilnError: a step that reads a data-dependent dim runs before the dim is bound (the graph's order put a
            kernel sized by it before the kernel counting it), or a count no step computes.
    """
    if not graph.data_dims:
        return
    by_value = {id(v): name for name, v in graph.data_dims.items()}
    bound: set[str] = set()
    pending = set(graph.data_dims)
    work = kernel_groups(groups)
    for step, g in zip(plan_steps, work):
        used = {s.name for v in [*g.inputs, g.output] for d in v.shape for s in symbolic.symbols(d)}
        early = sorted((used & pending) - bound)
        if early:
            raise KilnError(f"node {g.nodes[0].name!r} ({g.nodes[0].op}) is sized by data-dependent dim "
                            f"{early[0]} before the kernel that counts it has run")
        name = by_value.get(id(g.output))
        if name is not None:
            step["bind_dims"] = [*step.get("bind_dims", []), name]
            bound.add(name)
    missing = sorted(pending - bound)
    if missing:
        raise KilnError(f"data-dependent dim {missing[0]}: no kernel computes its count")


def describe(group: Group, shape_text: str | None = None) -> str:
    """``Op -> Op [shape]``: the comment a kernel's source carries."""
    if shape_text is None:
        shape_text = "[" + ", ".join(symbolic.to_text(d) for d in group.output.shape) + "]"
    return " -> ".join(n.op for n in group.nodes) + f" {shape_text}"


def progress_over(groups: Iterable[Group], show: bool, description: str) -> Iterator[Group]:
    """``groups``, with a transient progress bar on stderr when ``show`` (kernel generation can take a while)."""
    if not show:
        return iter(groups)
    from rich.progress import track

    return iter(track(list(groups), description=description, transient=True))


class Target:
    """A code generation target.

    Subclasses set :attr:`name`, :attr:`limits` and :attr:`features`, and implement :meth:`build`; they may
    refuse what they cannot build in :meth:`check` (run-time dims, control flow, fp16, train steps).

    Attributes:
        name: the target's name on the command line and in the manifest.
        limits: the device limits generated code keeps within (WebGPU limit names for webgpu).
        features: device features the generated code needs (``shader-f16``).
    """

    name: ClassVar[str] = ""
    #: whether the target's kernels and runtimes take run-time dims (docs/dynamic-shapes.md)
    run_time_dims: ClassVar[bool] = False
    #: whether its runtimes read a data-dependent dim back mid-run (NonZero's count: docs/dynamic-shapes.md)
    data_dependent: ClassVar[bool] = True
    #: whether a kernel may write part of a buffer in place (an in-place TensorScatter: a KV cache as state);
    #: WebGL2's fragment shaders write whole textures, each pixel its own
    in_place: ClassVar[bool] = True
    #: whether, without :attr:`in_place`, its runtime keeps state by copying each next value into the state's buffer
    #: after every run (``state[].update_buffer``, format 1.12: webgl2's run counter of random draws, a KV cache)
    state_copy: ClassVar[bool] = False
    limits: dict[str, int]
    features: tuple[str, ...]

    def __init__(self, limits: dict[str, int] | None = None, features: tuple[str, ...] = ()):
        self.limits = dict(limits or {})
        self.features = tuple(features)

    def default_schedule(self, t: Tensor, device_class: str = "gpu") -> Schedule:
        """The schedule a kernel of expression ``t`` gets without tuning, for ``device_class``."""
        raise NotImplementedError

    def check(self, graph: Graph, *, precision: str = "fp32", training: Any = None, control: bool = False) -> None:
        """Refuse, with a :class:`KilnError` naming the reason, a program this target cannot build: by default
        run-time dims (unless :attr:`run_time_dims`), state (unless :attr:`in_place`), run-time control flow, fp16
        compute and train steps (webgpu overrides)."""
        if graph.data_dims and (not (self.run_time_dims and self.data_dependent) or control or training is not None):
            what = "run-time control flow" if control else "train steps" if training is not None else \
                f"the {self.name} target"
            known = ", ".join(n for n, cls in REGISTRY.items() if cls.run_time_dims and cls.data_dependent)
            raise KilnError(f"data-dependent shapes (NonZero, Compress or TopK on run-time values: "
                            f"{', '.join(graph.data_dims)}) are supported by the {known} targets without run-time "
                            f"control flow or train steps; not with {what}")
        if graph.size_vars and not self.run_time_dims:
            dims = ", ".join(f"{s.name}={s.lo}..{s.hi}" for s in graph.size_vars.values())
            known = ", ".join(n for n, cls in REGISTRY.items() if cls.run_time_dims)
            raise KilnError(f"run-time dims ({dims}) are supported by the {known} targets (asked for {self.name}); "
                            "bind them statically with --dim NAME=SIZE for this one")
        if graph.state and not (self.in_place or self.state_copy):
            known = ", ".join(n for n, cls in REGISTRY.items() if cls.in_place or cls.state_copy)
            raise KilnError(f"state updated in place (a KV cache: {', '.join(graph.state)}) is supported by the "
                            f"{known} targets (asked for {self.name})")
        if control:
            raise KilnError(f"this model has control flow decided at run time (If/Loop on computed values), which only "
                            f"the webgpu target runs for now; compile it with --target webgpu (asked: {self.name})")
        if precision != "fp32":
            raise KilnError(f"--precision {precision} is for the webgpu target only (WGSL f16, WebGPU feature "
                            f"shader-f16); compile the {self.name} target in a separate fp32 package")
        if training is not None:
            raise KilnError(f"train-step packages (--train) have the webgpu target only for now; the {self.name} "
                            "runtime does not run train steps yet")

    def row_kernels(self, device_class: str, precision: str, training: Any) -> Callable[[Group], bool] | None:
        """The predicate fusion uses to fuse row reductions into row kernels (:func:`kiln.passes.fusion.fuse`),
        None when this target's lowering has no row kernels (the default)."""
        return None

    def matmul_prologues(self, device_class: str, precision: str, training: Any) -> bool:
        """Whether fusion may inline small elementwise producers into the matmuls reading them, and reshapes into
        matmul loads (:func:`kiln.passes.fusion.fuse`'s ``prologues``: redone per output column or load, cheap only
        where arithmetic is cheap beside memory); False by default."""
        return False

    def rfactor(self, device_class: str, precision: str, training: Any) -> bool:
        """Whether matrix products with few output blocks and a long reduction are split into partial products and
        their sum (:mod:`kiln.passes.split_k`), and long reductions of few outputs into their parts'
        (:mod:`kiln.passes.split_reduction`): parallelism for a GPU's many cores, a kernel more; False by default."""
        return False

    def build(self, program: Program, *, validate: bool = True, progress: bool = False) -> TargetBuild:
        """This target's manifest section and files for ``program``.

        Raises:
            KilnError: a kernel the target cannot express, naming its node; a toolchain failure.
        """
        raise NotImplementedError


#: target name -> Target class, in the order ``kiln.load(..., target="auto")`` prefers them
REGISTRY: dict[str, type[Target]] = {}


def register(cls: type[Target]) -> type[Target]:
    """Class decorator: make ``cls`` known as target ``cls.name``."""
    REGISTRY[cls.name] = cls
    return cls


def get_target(name: str, **options: Any) -> Target:
    """A new target called ``name`` (options as its constructor takes them).

    Raises:
        KilnError: an unknown name, listing the known ones.
    """
    _load_targets()
    try:
        cls = REGISTRY[name]
    except KeyError:
        raise KilnError(f"unknown target {name!r}; known: {', '.join(REGISTRY)}") from None
    return cls(**options)


def target_names() -> tuple[str, ...]:
    """Every registered target's name."""
    _load_targets()
    return tuple(REGISTRY)


#: the modules defining the targets, in preference order, imported on first use of the registry
TARGET_MODULES = ("kiln.codegen.webgpu", "kiln.codegen.webgl2", "kiln.codegen.wasm", "kiln.codegen.cpu")

_loaded = False


def _load_targets() -> None:
    """Import the target packages so they register (once), and order the registry as :data:`TARGET_MODULES`."""
    global _loaded
    if _loaded:
        return
    import importlib

    for module in TARGET_MODULES:
        importlib.import_module(module)
    order = {m.rsplit(".", 1)[1]: i for i, m in enumerate(TARGET_MODULES)}
    items = sorted(REGISTRY.items(), key=lambda kv: order.get(kv[0], len(order)))
    REGISTRY.clear()
    REGISTRY.update(items)
    _loaded = True
