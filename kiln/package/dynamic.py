"""Manifest fields of packages with run-time dims (format 1.4, docs/package-format.md, docs/dynamic-shapes.md).

Size expressions are written in :func:`kiln.arith.symbolic.to_json`'s form (an int, a dim name, or
``[op, a, b]`` with ``op`` in ``+ - * // % max min``), which the runtimes evaluate with a small
interpreter (no ``eval`` of source text).
"""

from __future__ import annotations

from typing import Any

from kiln.arith import symbolic


def dims_section(graph, plan=None) -> list[dict[str, Any]]:
    """The manifest's ``dynamic_dims``: one entry per run-time dim, in dims-uniform order (word ``index``), with
    ``multiple`` when its values must be multiples of it, ``count`` (format 1.9) for a data-dependent dim: the
    id of the buffer whose first int32 element is its value once the plan step that ``bind_dims`` it has run, and
    ``grow`` (format 1.10) for a growable dim, with ``inferred``, why its ``max``, when the import inferred it."""
    counts = {name: plan.of[id(v)] for name, v in graph.data_dims.items()} if plan is not None else {}
    inferred = graph.inferred_bounds
    return [{"name": s.name, "index": s.index, "min": s.lo, "max": s.hi, "opt": s.opt,
             **({"multiple": s.multiple} if s.multiple > 1 else {}),
             **({"grow": True} if s.grow else {}), **({"inferred": inferred[s.name]} if s.name in inferred else {}),
             **({"count": counts[s.name]} if s.name in counts else {})} for s in graph.size_vars.values()]


def io_fields(v) -> dict[str, Any]:
    """Extra fields of an input/output entry with run-time dims: ``shape`` becomes the largest shape (what
    its buffer holds) and ``dynamic_shape`` the dims as size expressions (``["batch", "seq", 384]``)."""
    if v.is_static:
        return {}
    out = {"shape": [symbolic.planned(d) for d in v.shape], "dynamic_shape": [symbolic.to_json(d) for d in v.shape]}
    if not v.sym_shape:  # the model did not state this value's shape: its dims as text (``batch*seq``)
        out["symbolic_shape"] = [symbolic.to_text(d) if symbolic.is_symbolic(d) else d for d in v.shape]
    return out


def step_fields(step) -> dict[str, Any]:
    """Extra fields of a plan step over run-time dims: ``groups``, its workgroup count as a size expression
    (``dispatch`` then holds the count at the dims' upper bounds)."""
    return {} if step.groups is None else {"groups": symbolic.to_json(step.groups)}


def uniform_section(graph) -> dict[str, Any]:
    """The webgpu target's ``dims_uniform``: layout of the uniform buffer of run-time dims."""
    n = len(graph.size_vars)
    return {"bytes": 16 * max(1, -(-n // 4)), "type": "array<vec4<i32>>",
            "layout": "dim with index i in i32 word i", "binding": "after the kernel's storage buffers"}
