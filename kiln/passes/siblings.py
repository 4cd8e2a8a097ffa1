"""Horizontal fusion: sibling matmuls that read one activation become one matmul over concatenated weights.

A transformer layer projects its normalised input three times (queries, keys, values) and its MLP twice (gate,
up). Each projection is a kernel that reads the same activation; merged, they are one wider kernel that reads it
once, and the siblings' results are slices of its output. The slices cost nothing: they are index-only producers,
inlined into their consumers' loads (:func:`kiln.passes.fusion.inline_index`). Decoding one token this saves
three dispatches a layer (TensorRT and onnxruntime fuse QKV the same way).
"""

from __future__ import annotations

import numpy as np

from kiln.arith import symbolic
from kiln.ir.graph import Builder, Graph, Node, Value


def _weights(node: Node) -> list[Value] | None:
    """The constant weight inputs of a mergeable matmul (``MatMulNBits``: packed, scales[, offsets], each ``[N,
    ...]``; ``MatMul``: a 2-D ``B [K, N]``), or ``None``."""
    if node.op == "MatMulNBits" and all(v.is_const and not v.is_shape_const for v in node.inputs[1:]):
        return node.inputs[1:]
    if node.op == "MatMul" and len(node.inputs[1].shape) == 2 and node.inputs[1].is_const \
            and not node.inputs[1].is_shape_const and node.inputs[1].dtype == "float32":
        return [node.inputs[1]]
    return None


def _bias(node: Node, uses: dict, outputs: set[int]) -> Value | None:
    """The constant ``[N]`` bias of the ``Add`` (either operand order) that alone reads ``node``'s output, or
    ``None``."""
    out = node.outputs[0]
    readers = uses.get(id(out), [])
    if len(readers) != 1 or id(out) in outputs:
        return None
    add = readers[0]
    if add.op != "Add" or out not in add.inputs or add.outputs[0].shape != out.shape:
        return None
    bias = add.inputs[1] if add.inputs[0] is out else add.inputs[0]
    if bias is out or not bias.is_const or bias.is_shape_const or bias.shape != (out.shape[-1],):
        return None
    return bias


def _key(node: Node) -> tuple:
    """What siblings must share to be merged: op, attributes but ``N``, and the weights' dtypes and trailing dims."""
    attrs = tuple(sorted((k, v) for k, v in node.attrs.items() if k != "N"))
    ws = _weights(node) or []
    tails = tuple((w.dtype, w.shape[1:] if node.op == "MatMulNBits" else w.shape[:1]) for w in ws)
    return node.op, attrs, tails


def merge_sibling_matmuls(graph: Graph) -> bool:
    """Merge ``MatMulNBits`` (or ``MatMul`` with a constant 2-D right operand) nodes reading the same activation,
    with weights of one format, into one node over the weights concatenated along ``N``; each sibling's result
    becomes a ``Slice`` of the last axis. When every sibling's result is read only by the ``Add`` of a constant
    ``[N]`` bias, the biases are concatenated and added once (still the merged kernel's epilogue); when only some
    are, nothing is merged (a bias added to a slice would be a kernel of its own). Returns True if anything
    changed.
    """
    uses = graph.consumers()
    outputs = {id(v) for v in graph.outputs}
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    families: dict[tuple, list[Node]] = {}
    for node in graph.nodes:
        if node.op in ("MatMulNBits", "MatMul") and _weights(node) is not None and id(node.outputs[0]) not in outputs:
            families.setdefault((id(node.inputs[0]), _key(node)), []).append(node)
    changed = False
    for siblings in families.values():
        if len(siblings) < 2:
            continue
        biases = [_bias(n, uses, outputs) for n in siblings]
        if any(b is None for b in biases) and not all(b is None for b in biases):
            continue
        adds = [uses[id(n.outputs[0])][0] for n in siblings] if biases[0] is not None else None
        _merge(graph, siblings, adds, position)
        position = {id(n): i for i, n in enumerate(graph.nodes)}
        changed = True
    return changed


def _merge(graph: Graph, siblings: list[Node], adds: list[Node] | None, position: dict[int, int]) -> None:
    """Replace ``siblings`` (and the bias ``adds`` after them) by one merged node and slices of its result (see
    :func:`merge_sibling_matmuls`)."""
    first = siblings[0]
    x = first.inputs[0]
    nbits = first.op == "MatMulNBits"
    widths = [n.outputs[0].shape[-1] for n in siblings]
    b = Builder.beside(graph)
    name = "+".join(n.name for n in siblings)
    ws = [_weights(n) for n in siblings]
    merged_ws = [b.const(np.concatenate([w[i].const for w in ws], axis=0 if nbits else 1), name=f"{name}.w{i}")
                 for i in range(len(ws[0]))]
    attrs = {**first.attrs, "N": sum(widths)} if nbits else {}
    y = b.op(first.op, [x, *merged_ws], name=name, **attrs)
    if adds is not None:
        vec = [(a.inputs[1] if a.inputs[0] is n.outputs[0] else a.inputs[0]).const for a, n in zip(adds, siblings)]
        y = b.op("Add", [y, b.const(np.concatenate(vec), name=f"{name}.bias")], name=f"{name}.bias_add")
    lead = tuple(y.shape[:-1])
    offset = 0
    replaced = adds or siblings
    for node, width in zip(replaced, widths):
        part = b.op("Slice", [y], name=f"{node.name}.slice", starts=(0,) * len(lead) + (offset,),
                    ends=tuple(symbolic.simplify(d) for d in lead) + (offset + width,), steps=(1,) * (len(lead) + 1))
        graph.replace_uses(node.outputs[0], part)
        offset += width
    gone = {id(n) for n in siblings} | {id(a) for a in adds or ()}
    at = min(position[id(n)] for n in siblings)
    kept = [n for n in graph.nodes if id(n) not in gone]
    where = sum(1 for n in graph.nodes[:at] if id(n) not in gone)
    graph.nodes = kept[:where] + b.graph.nodes + kept[where:]
