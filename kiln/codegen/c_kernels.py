"""The kernel build loop of the C targets (wasm, cpu): every fused group lowered under the target's CPU schedule
(:func:`kiln.codegen.cpu_schedule.cpu_schedule` for its lane count), rendered to C with its vectoriser (:func:`kiln.codegen.c.render`), deduplicated and named by
:class:`~kiln.codegen.target.KernelTable` (C identifiers), and one plan step per group."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kiln.arith import symbolic
from kiln.arith.symbolic import Dim
from kiln.codegen import c
from kiln.codegen.cpu_schedule import grid_shape
from kiln.codegen.lowering import group_expr, kernel_groups
from kiln.codegen.target import KernelTable, describe, progress_over
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
class CStep:
    """One call of the plan: ``kernel`` over tiles ``[0, total)`` with ``buffers`` bound to its pointers
    (``total`` a size expression over run-time dims in a package that has them)."""

    kernel: int
    buffers: list[int]
    total: Dim
    name: str

    def to_json(self) -> dict:
        """The step's manifest entry: ``total`` at the dims' upper bounds, and ``tiles``, the size expression
        the runtime evaluates per run, when it depends on run-time dims (docs/dynamic-shapes.md)."""
        entry = {"kernel": self.kernel, "buffers": self.buffers, "total": symbolic.upper(self.total), "node": self.name}
        if symbolic.is_symbolic(self.total):
            entry["tiles"] = symbolic.to_json(self.total)
        return entry


def build_c_kernels(groups: list[Group], plan: MemoryPlan, schedule: Callable[[Tensor], Schedule],
                    vectorize: c.Vectorizer | None, target: str, progress: bool = False) -> tuple[list[CKernel], list[CStep]]:
    """The distinct C kernels of ``groups`` under ``schedule`` (the target's
    :meth:`~kiln.codegen.target.Target.default_schedule`) and the plan's steps (buffers from ``plan``).

    Raises:
        KilnError: a group whose kernel C cannot express (reduce lanes, an unknown function), naming its node.
    """
    table = KernelTable(identifier=True)
    steps: list[CStep] = []
    for g in progress_over(kernel_groups(groups), progress, f"generating {target} kernels"):
        final = group_expr(g)
        sched = schedule(final)
        k = lower(final, sched, name=g.name)
        try:
            src, vectorized = c.render(k, "KILN_NAME", grid_shape(final.shape, sched), describe(g), vectorize)
        except (TypeError, ValueError) as e:
            raise KilnError(f"node {g.nodes[0].name!r}: the {target} target cannot express its kernel ({e})") from None
        index = table.add(src, g.name, lambda name: CKernel(
            name, [(c.TYPES[p.dtype], p.access == "read") for p in k.params], [n.op for n in g.nodes],
            sched.to_json(), vectorized, src.replace("KILN_NAME", name)))
        bufs = [plan.of[id(t.attrs["value"])] for t in k.inputs] + [plan.of[id(g.output)]]
        steps.append(CStep(index, bufs, k.total, g.nodes[0].name))
    return table.kernels, steps
