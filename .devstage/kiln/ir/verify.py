"""Structural checks of the graph IR, run after import and after every pass."""

from __future__ import annotations

from kiln.errors import KilnError
from kiln.ir import ops
from kiln.ir.graph import Graph


class VerifyError(KilnError):
    """The graph breaks an IR invariant (a compiler bug, not a user error)."""


def verify(graph: Graph) -> None:
    """Check SSA form, topological order, and that each node's types match its shape rule.

    Raises:
        VerifyError: naming the first broken invariant.
    """
    defined: set[int] = {id(v) for v in graph.inputs}
    names: set[str] = set()
    for v in graph.inputs:
        if v.name in names:
            raise VerifyError(f"duplicate value name {v.name!r}")
        names.add(v.name)
    for node in graph.nodes:
        try:
            spec = ops.get(node.op)
        except KeyError:
            raise VerifyError(f"node {node.name!r}: unknown primitive {node.op!r}") from None
        for v in node.inputs:
            if not v.is_const and id(v) not in defined:
                raise VerifyError(f"node {node.name!r} reads %{v.name} before it is defined")
        expect = spec.infer([(v.dtype, v.shape) for v in node.inputs], node.attrs)
        got = [(o.dtype, tuple(o.shape)) for o in node.outputs]
        if [(d, tuple(s)) for d, s in expect] != got:
            raise VerifyError(f"node {node.name!r} ({node.op}): outputs {got} but shape rule gives {expect}")
        for o in node.outputs:
            if id(o) in defined:
                raise VerifyError(f"%{o.name} is defined twice")
            if o.name in names:
                raise VerifyError(f"duplicate value name {o.name!r}")
            if o.producer is not node:
                raise VerifyError(f"%{o.name}: producer link is stale")
            defined.add(id(o))
            names.add(o.name)
    for v in graph.outputs:
        if not v.is_const and id(v) not in defined:
            raise VerifyError(f"graph output %{v.name} is never defined")
