"""The target-neutral half of code generation: a fused group as one tensor expression, lowered.

Every target builds its kernels from :func:`group_expr` (producers inlined into the group's output,
storage conversions and fp16 rules applied) under its own schedules (:func:`build_group`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.arith import symbolic
from kiln.arith.expr import Expr, hoist_factors, substitute
from kiln.errors import KilnError
from kiln.ir import dtypes
from kiln.kernels import library, storage
from kiln.passes.fusion import Group
from kiln.passes.memory_plan import MemoryPlan, needs_buffer
from kiln.te.compute import Tensor, inline, placeholder
from kiln.te.half import demote
from kiln.te.lower import lower
from kiln.te.schedule import Schedule, default_schedule

#: dtypes the WebGPU target's kernels read and write (stored as in kiln.kernels.storage)
KERNEL_DTYPES = {"float32", "float16", "int32", "int64", "bool", "uint8", "int8", "uint16", "int16", "uint32", "uint64",
                 *dtypes.NARROW_FLOATS, *dtypes.NARROW_INTS}


def kernel_groups(groups: list[Group]) -> list[Group]:
    """The groups that become kernels, one plan step each, in order: not aliases (views of another buffer) and
    not empty tensors."""
    return [g for g in groups if not g.alias and g.output.size]


def steps_for(groups: list[Group], outputs: list[Any]) -> list[int]:
    """Indices of the plan steps (:func:`kernel_groups`) that ``outputs`` (IR values) depend on: running just
    those, in order, computes ``outputs``.

    Running a subset of the steps in order is safe with the shared activation buffers: every value is
    still written before it is read and not overwritten in between (dropping steps drops only writes).
    """
    producer: dict[int, list[Group]] = {}  # (an alternative group computes a value another group computes too)
    for g in groups:
        for n in g.nodes:
            for o in n.outputs:
                producer.setdefault(id(o), []).append(g)
    needed: set[int] = set()
    todo = [g for v in outputs for g in producer.get(id(v), [])]
    while todo:
        g = todo.pop()
        if id(g) in needed:
            continue
        needed.add(id(g))
        todo += [p for n in g.nodes for v in n.inputs for p in producer.get(id(v), [])]
    return [i for i, g in enumerate(kernel_groups(groups)) if id(g) in needed]


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
    result = env[id(group.output)]
    final = inline(storage.store_view(result, group.output.dtype, plan and plan.storage(group.output)))
    if not group.rows and not (plan is not None and plan.half and accumulate != "float32"):
        # (kiln.te.rows reads a row kernel's sums as written; float16 sums keep their factors)
        final = dataclasses.replace(final, body=hoist_factors(final.body, lambda n: symbolic.bounds(n)[0] < 1))
    if plan is not None and plan.half:
        final = demote(final, accumulate)
    if "store" in result.attrs and "store" not in final.attrs:  # a store view over the rebuilt tensor's axes
        shape, coords, keep = result.attrs["store"]
        axes = dict(zip(result.axes, final.axes))
        final.attrs = {**final.attrs, "store": (shape, tuple(substitute(e, axes) for e in coords),
                                                substitute(keep, axes))}
    if "scan" in result.attrs and "scan" not in final.attrs:  # (a scan's state reads stay reads of its output)
        final.attrs = {**final.attrs, "scan": result.attrs["scan"]}
    if group.rows:  # a row kernel (kiln.te.rows): default_schedule gives it a workgroup per row
        final.attrs = {**final.attrs, "rows": True}
    if group.stage_bound is not None:  # (its stage arrays sized for the keys it runs at; kiln.te.rows)
        final.attrs = {**final.attrs, "stage_bound": group.stage_bound}
    return final


def build_group(group: Group, schedule: Schedule | Callable[[Tensor], Schedule] = default_schedule,
                plan: MemoryPlan | None = None, accumulate: str = "float32", memo: dict | None = None):
    """A fused group lowered under ``schedule`` (or the one ``schedule(expr)`` picks); ``plan`` and
    ``accumulate`` as for :func:`group_expr` (fp16 compute). With ``memo`` (a dict kept for one target's build, the
    schedule and the dims' planned values the same throughout), a group of the same structure as one lowered before
    (:func:`group_key`: a decoder's layers) takes that kernel, bound to its own values.

    Returns:
        ``(LoweredKernel, input values in binding order)``.
    """
    made = group_key(group, plan, accumulate) if memo is not None else None
    if made is not None:  # (the schedule, and the dims' values it is chosen at, as well)
        made = ((made[0], id(schedule), symbolic.opt_overrides()), made[1])
        if made[0] in memo:
            k, at = memo[made[0]]
            return k, [made[1][j] for j in at]
    final = group_expr(group, plan, accumulate)
    k = lower(final, schedule if isinstance(schedule, Schedule) else schedule(final), name=group.name)
    ins = [t.attrs["value"] for t in k.inputs]
    if made is not None:
        where = {id(v): j for j, v in enumerate(made[1])}
        memo[made[0]] = (k, [where[id(v)] for v in ins])
    return k, ins


def group_key(group: Group, plan: MemoryPlan | None = None, accumulate: str = "float32"):
    """``(key, buffer values)``: what :func:`group_expr` builds ``group`` from, with the values it binds as buffers
    replaced by their place in ``buffer values`` (in order of first use), and their shapes, dtypes and storage: groups
    of equal keys have the same expression but for the values bound. None where an attribute is no plain data (a
    subgraph) or a constant array is large."""
    index: dict[int, tuple] = {}
    buffers: list[Any] = []
    parts = []
    try:
        for i, node in enumerate(group.nodes):
            ins = []
            for v in node.inputs:
                if id(v) in index:
                    ins.append(index[id(v)])
                elif v.is_const and not needs_buffer(node, v):  # (a scalar the expression holds)
                    ins.append(("const", v.dtype, np.asarray(v.const).tobytes()))
                else:
                    index[id(v)] = ("buffer", len(buffers), tuple(v.shape), v.dtype, plan and plan.storage(v))
                    buffers.append(v)
                    ins.append(index[id(v)])
            out = node.outputs[0]
            index[id(out)] = ("node", i)
            parts.append((node.op, _plain(node.attrs), tuple(ins), tuple(out.shape), out.dtype))
    except _NotPlain:
        return None
    key = (tuple(parts), index.get(id(group.output)), group.rows, group.stage_bound, bool(plan is not None and plan.half),
           plan and plan.storage(group.output), accumulate)
    return key, buffers


class _NotPlain(Exception):
    pass


def _plain(x: Any) -> Any:
    """Attribute value ``x`` as hashable plain data (raises :class:`_NotPlain` for anything else)."""
    if isinstance(x, float):
        return ("float", x.hex())  # (-0.0 apart from 0.0)
    if isinstance(x, bool):
        return ("bool", x)
    if x is None or isinstance(x, (int, str, bytes)):
        return x
    if isinstance(x, (list, tuple)):
        return tuple(_plain(v) for v in x)
    if isinstance(x, dict):
        return tuple((k, _plain(v)) for k, v in sorted(x.items(), key=lambda kv: str(kv[0])))
    if isinstance(x, Expr):  # (a run-time dim in a Slice's ends, a Reshape's shape: frozen, compared by structure)
        return ("dim", x)
    if isinstance(x, np.generic):
        return _plain(x.item())
    if isinstance(x, np.ndarray) and x.size <= 4096:
        return ("array", x.dtype.str, x.shape, x.tobytes())
    raise _NotPlain
