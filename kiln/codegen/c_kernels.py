"""The kernel build loop of the C targets (wasm, cpu): every fused group lowered under the target's CPU schedule
(:func:`kiln.codegen.cpu_schedule.cpu_schedule` for its lane count), rendered to C with its vectoriser (:func:`kiln.codegen.c.render`), deduplicated and named by
:class:`~kiln.codegen.target.KernelTable` (C identifiers), and one plan step per group."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kiln.arith import symbolic
from kiln.arith.symbolic import Dim
from kiln.codegen import c
from kiln.codegen.cpu_schedule import grid_shape
from kiln.codegen.lowering import group_expr, kernel_groups
from kiln.codegen.target import KernelTable, describe, progress_over, scheduled_variant
from kiln.errors import KilnError
from kiln.passes.fusion import Group
from kiln.passes.memory_plan import MemoryPlan
from kiln.te.compute import Tensor
from kiln.te.lower import lower
from kiln.te.schedule import Schedule


@dataclass
class CKernel:
    """One kernel function: ``name(pointers..., begin, end)`` computes tiles ``[begin, end)`` of its step.

    Attributes:
        name: the function's name (a C identifier; the wasm target exports it under this name).
        params: ``(C type, read-only)`` of each pointer, inputs first, the output last.
        ops, schedule: the fused primitive ops and the schedule (for the manifest).
        vectorized: whether the kernel has a vector path.
        source: the function's C.
    """

    name: str
    params: list[tuple[str, bool]]
    ops: list[str]
    schedule: dict
    vectorized: bool
    source: str


@dataclass
class CVariant:
    """A plan step's kernel for run-time dims inside ``when`` (name -> ``[lo, hi]``, all must hold): the same group
    and buffers, scheduled at another point of the dims' range (:func:`kiln.codegen.target.scheduled_variant`)."""

    when: dict[str, list[int]]
    kernel: int
    total: Dim
    #: each dim of ``when``'s word in ``kiln_dims``
    index: dict[str, int] = field(default_factory=dict)

    def condition(self) -> str:
        """C: whether the dims in ``kiln_dims`` fall in ``when``."""
        return " && ".join(f"kiln_dims[{self.index[n]}] >= {lo} && kiln_dims[{self.index[n]}] <= {hi}"
                           for n, (lo, hi) in self.when.items())

    def to_json(self) -> dict:
        """The variant's entry in a plan step's ``variants``."""
        return {"when": self.when, "kernel": self.kernel, **_tiles(self.total)}


@dataclass
class CStep:
    """One call of the plan: ``kernel`` over tiles ``[0, total)`` with ``buffers`` bound to its pointers
    (``total`` a size expression over run-time dims in a package that has them), or one of its ``variants``
    where the dims fall in its range."""

    kernel: int
    buffers: list[int]
    total: Dim
    name: str
    variants: list[CVariant] = field(default_factory=list)

    def to_json(self) -> dict:
        """The step's manifest entry: ``total`` at the dims' upper bounds, and ``tiles``, the size expression
        the runtime evaluates per run, when it depends on run-time dims (docs/dynamic-shapes.md); ``variants``."""
        entry = {"kernel": self.kernel, "buffers": self.buffers, **_tiles(self.total), "node": self.name}
        if self.variants:
            entry["variants"] = [v.to_json() for v in self.variants]
        return entry


def _tiles(total: Dim) -> dict:
    out = {"total": symbolic.planned(total)}
    if symbolic.is_symbolic(total):
        out["tiles"] = symbolic.to_json(total)
    return out


def build_c_kernels(groups: list[Group], plan: MemoryPlan, schedule: Callable[[Tensor], Schedule],
                    vectorize: c.Vectorizer | None, target: str, progress: bool = False) -> tuple[list[CKernel], list[CStep]]:
    """The distinct C kernels of ``groups`` under ``schedule`` (the target's
    :meth:`~kiln.codegen.target.Target.default_schedule`) and the plan's steps (buffers from ``plan``).

    Raises:
        KilnError: a group whose kernel C cannot express (reduce lanes, an unknown function), naming its node.
    """
    table = KernelTable(identifier=True)
    steps: list[CStep] = []
    variants: dict[int, CVariant | None] = {}  # kernel index -> its variant (steps of one kernel share it)
    for g in progress_over(kernel_groups(groups), progress, f"generating {target} kernels"):
        final = group_expr(g)
        k, sched, index = _kernel(table, g, final, schedule, vectorize, target)
        bufs = [plan.of[id(t.attrs["value"])] for t in k.inputs] + [plan.of[id(g.output)]]
        step = CStep(index, bufs, k.total, g.nodes[0].name)
        if index not in variants:
            variants[index] = None
            made = scheduled_variant(k.size_vars, lambda: _kernel(table, g, final, schedule, vectorize, target))
            if made is not None:
                when, (kv, sched_v, index_v) = made
                if sched_v.to_json() != sched.to_json():
                    variants[index] = CVariant(when, index_v, kv.total, {v.name: v.index for v in k.size_vars})
        if variants[index] is not None:
            step.variants.append(variants[index])
        steps.append(step)
    return table.kernels, steps


def _kernel(table: KernelTable, g: Group, final: Tensor, schedule: Callable[[Tensor], Schedule],
            vectorize: c.Vectorizer | None, target: str):
    """Lower and render group ``g`` (its expression ``final``) under ``schedule`` and add it to ``table``;
    returns ``(lowered kernel, schedule, kernel index)``."""
    sched = schedule(final)
    k = lower(final, sched, name=g.name)
    try:
        src, vectorized = c.render(k, "KILN_NAME", grid_shape(final.shape, sched), describe(g), vectorize)
    except (TypeError, ValueError) as e:
        raise KilnError(f"node {g.nodes[0].name!r}: the {target} target cannot express its kernel ({e})") from None
    index = table.add(src, g.name, lambda name: CKernel(
        name, [(c.TYPES[p.dtype], p.access == "read") for p in k.params], [n.op for n in g.nodes],
        sched.to_json(), vectorized, src.replace("KILN_NAME", name)))
    return k, sched, index
