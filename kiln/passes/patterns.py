"""Recognise activations that exporters spell out in primitives, and put the one operator back.

PyTorch's ONNX export before opset 20 writes BERT's exact GELU, ``x * 0.5 * (1 + erf(x / sqrt(2)))``, as five
nodes (``Div``, ``Erf``, ``Add``, ``Mul``, ``Mul``). ``x`` is read twice, so fusion's chains (one reader at a time)
stop at it and the GELU becomes a kernel of its own after the matrix product that makes ``x``. As the ``Gelu``
operator (ONNX ``Gelu``-20, ``approximate="none"``) it is one reader and joins the product's epilogue: a dispatch
less a layer (onnxruntime's ``GeluFusion`` does the same rewrite).
"""

from __future__ import annotations

import math

import numpy as np

from kiln.ir.graph import Builder, Graph, Node, Value
from kiln.passes.simplify import dead_code


def _scalar(v: Value, want: float) -> bool:
    """Whether ``v`` is a float constant holding one value within 1e-4 (relative) of ``want``."""
    if not v.is_const or v.is_shape_const or v.const.size != 1 or v.dtype not in ("float32", "float16"):
        return False
    return abs(float(np.asarray(v.const).reshape(())) - want) <= 1e-4 * abs(want)


def _other(node: Node, v: Value) -> Value | None:
    """The operand of binary ``node`` that is not ``v`` (``None`` if ``v`` is not one of them)."""
    a, b = node.inputs
    return b if a is v else a if b is v else None


def _only_reader(v: Value, uses: dict, outputs: set[int], op: str) -> Node | None:
    readers = uses.get(id(v), [])
    if len(readers) != 1 or id(v) in outputs or readers[0].op != op:
        return None
    return readers[0]


def _gelu_input(erf: Node) -> Value | None:
    """``x`` where ``erf`` reads ``x / sqrt(2)`` (a ``Div`` by it or a ``Mul`` by its reciprocal), else ``None``."""
    d = erf.inputs[0].producer
    if d is None:
        return None
    if d.op == "Div" and _scalar(d.inputs[1], math.sqrt(2.0)):
        return d.inputs[0]
    if d.op == "Mul":
        for x, c in (d.inputs, d.inputs[::-1]):
            if _scalar(c, 1 / math.sqrt(2.0)):
                return x
    return None


def fuse_gelu(graph: Graph) -> bool:
    """Replace ``x * 0.5 * (1 + erf(x / sqrt(2)))`` (either order of the two products, ``x / sqrt(2)`` as a ``Div``
    or a ``Mul`` by ``1 / sqrt(2)``) by one ``Gelu`` node (``approximate="none"``; ONNX Gelu-20). The intermediate
    nodes must have no other readers. Returns True if anything changed."""
    uses = graph.consumers()
    outputs = {id(v) for v in graph.outputs}
    changed = False
    for erf in [n for n in graph.nodes if n.op == "Erf"]:
        x = _gelu_input(erf)
        add = _only_reader(erf.outputs[0], uses, outputs, "Add")
        if x is None or add is None or len(uses.get(id(erf.inputs[0]), [])) != 1 or \
                not _scalar(_other(add, erf.outputs[0]), 1.0):
            continue
        m1 = _only_reader(add.outputs[0], uses, outputs, "Mul")
        if m1 is None:
            continue
        y = _other(m1, add.outputs[0])
        if y is x:  # x * (1 + erf), then * 0.5
            m2 = _only_reader(m1.outputs[0], uses, outputs, "Mul")
            if m2 is None or not _scalar(_other(m2, m1.outputs[0]), 0.5):
                continue
            out = m2.outputs[0]
        else:  # (x * 0.5) * (1 + erf)
            h = y.producer
            if h is None or h.op != "Mul" or len(uses.get(id(y), [])) != 1 or id(y) in outputs or \
                    _other(h, x) is None or not _scalar(_other(h, x), 0.5):
                continue
            out = m1.outputs[0]
        if out.shape != x.shape or out.dtype != x.dtype:
            continue
        b = Builder.beside(graph)
        gelu = b.op("Gelu", [x], name=(erf.name or "Erf") + ".gelu", approximate="none")
        at = graph.nodes.index(out.producer) + 1
        graph.nodes[at:at] = b.graph.nodes
        graph.replace_uses(out, gelu)
        changed = True
        uses = graph.consumers()
    if changed:
        dead_code(graph)  # (the spelled-out nodes; one of them may have had the graph output's name, now the Gelu's)
    return changed
