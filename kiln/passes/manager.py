"""The pass pipeline: graph passes in order, each verified, run to a fixed point."""

from __future__ import annotations

from collections.abc import Callable

from kiln.ir import ops
from kiln.ir.graph import Graph
from kiln.ir.verify import verify
from kiln.passes.patterns import fuse_gelu
from kiln.passes.siblings import merge_sibling_matmuls
from kiln.passes.simplify import common_subexpressions, const_fold, dead_code, fold_scale, remove_identities

Pass = Callable[[Graph], bool]

#: the default pipeline, by name; each pass returns True if it changed the graph
DEFAULT_PASSES: list[tuple[str, Pass]] = [
    ("const_fold", const_fold),
    ("remove_identities", remove_identities),
    ("common_subexpressions", common_subexpressions),
    ("fold_scale", fold_scale),
    ("fuse_gelu", fuse_gelu),
    ("merge_sibling_matmuls", merge_sibling_matmuls),
    ("dead_code", dead_code),
]


def optimize(graph: Graph, passes: list[tuple[str, Pass]] | None = None, max_rounds: int = 10) -> list[str]:
    """Run ``passes`` (default :data:`DEFAULT_PASSES`) repeatedly until none changes ``graph``.

    The graph is verified after every pass that changed it. Returns the names of the
    passes that fired, in order (for ``kiln compile --verbose`` and tests).
    """
    fired: list[str] = []
    for _ in range(max_rounds):
        changed = False
        for name, fn in passes or DEFAULT_PASSES:
            if fn(graph):
                verify(graph)
                fired.append(name)
                changed = True
        if not changed:
            break
    return fired


def has_control(graph: Graph) -> bool:
    """Whether ``graph`` holds an If or Loop node whose condition is known only at run time
    (docs/control-flow.md)."""
    return any(ops.kind(n.op) == "control" for n in graph.nodes)


def optimize_nested(graph: Graph) -> list[str]:
    """Verify and :func:`optimize` ``graph`` and every sub-graph of its If/Loop nodes (each level on its own);
    returns the names of the passes that fired."""
    verify(graph)
    fired = optimize(graph)
    for n in graph.nodes:
        for v in n.attrs.values():
            if isinstance(v, Graph):
                fired += optimize_nested(v)
    return fired
