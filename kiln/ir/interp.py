"""A numpy interpreter for the graph IR: the executable specification.

Every pass must leave :func:`run` results unchanged, and every generated kernel is
checked against it (and against onnxruntime) in the tests. Ops come from :mod:`kiln.ir.registry`, which
:mod:`kiln.ir.graph` fills (it imports :mod:`kiln.ir.ops`) before any graph exists.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kiln.errors import ShapeError
from kiln.ir import registry

if TYPE_CHECKING:
    from kiln.ir.graph import Graph, Node


def eval_node(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    """Evaluate one node on numpy arrays; returns its outputs in order."""
    return registry.get(node.op).evaluate(args, node.attrs)


def run(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run ``graph`` on ``feeds`` (input name -> array); returns output name -> array.

    Raises:
        ShapeError: if a feed is missing or has the wrong shape.
    """
    env: dict[int, np.ndarray] = {}
    for v in graph.inputs:
        if v.name not in feeds:
            raise ShapeError(f"missing input {v.name!r}")
        arr = np.asarray(feeds[v.name])
        if tuple(arr.shape) != v.shape:
            raise ShapeError(f"input {v.name!r}: expected shape {list(v.shape)}, got {list(arr.shape)}")
        env[id(v)] = arr

    def get(v):
        return v.const if v.is_const else env[id(v)]

    for node in graph.nodes:
        outs = eval_node(node, [get(v) for v in node.inputs])
        for v, a in zip(node.outputs, outs):
            env[id(v)] = a
    return {v.name: get(v) for v in graph.outputs}
