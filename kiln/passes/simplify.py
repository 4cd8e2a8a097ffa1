"""Graph simplification: constant folding, scale folding into Conv/MatMul weights, dead-code elimination, common
subexpressions.

Each pass maps a graph to an equivalent graph (same :func:`kiln.ir.interp.run`
results up to float rounding) and edits it in place.
"""

from __future__ import annotations

import numpy as np

from kiln.ir import interp, ops
from kiln.ir.graph import Graph, Node, Value, check_constant_size

#: a constant at least this large (bytes) that several nodes read is not copied transposed by :func:`const_fold`
SHARED_WEIGHT_BYTES = 1 << 20


def const_fold(graph: Graph) -> bool:
    """Evaluate every node whose inputs are all constants; its outputs become constants.

    Nodes defining graph outputs stay, so every output is written by a kernel. So does a Transpose of a large
    constant that other nodes read too (a tied embedding, read by a Gather and, transposed, by the output
    projection's MatMul): folding it would store the weight twice; the transpose is read through instead
    (:func:`kiln.passes.fusion.inline_index`).

    Returns True if anything changed.
    """
    changed = False
    keep: list[Node] = []
    outputs = {id(v) for v in graph.outputs}
    readers: dict[int, int] = {}
    for node in graph.nodes:
        for v in node.inputs:
            readers[id(v)] = readers.get(id(v), 0) + 1
    for node in graph.nodes:
        shared = node.op == "Transpose" and readers.get(id(node.inputs[0]), 0) > 1 \
            and node.inputs[0].is_const and node.inputs[0].const.nbytes >= SHARED_WEIGHT_BYTES
        if node.inputs and not shared and all(v.is_const and not v.is_shape_const for v in node.inputs) \
                and all(o.is_static for o in node.outputs) and not any(id(o) in outputs for o in node.outputs):
            check_constant_size(node.op, node.name, [(o.dtype, o.shape) for o in node.outputs])
            outs = interp.eval_node(node, [v.const for v in node.inputs])
            for v, a in zip(node.outputs, outs):
                v.const = np.array(a, order="C")
                v.producer = None
            changed = True
        else:
            keep.append(node)
    graph.nodes = keep
    return changed


def remove_identities(graph: Graph) -> bool:
    """Drop Identity nodes, Reshapes to the same shape, and x+0, x*1 with scalar constants."""
    changed = False
    outputs = {id(v) for v in graph.outputs}
    keep = []
    for node in graph.nodes:
        src = None
        if node.op == "Identity" or (node.op == "Reshape" and node.inputs[0].shape == node.outputs[0].shape):
            src = node.inputs[0]
        elif node.op in ("Add", "Mul", "Sub", "Div") and node.inputs[1].is_const and not node.inputs[1].is_shape_const \
                and node.outputs[0].shape == node.inputs[0].shape:
            c = node.inputs[1].const
            neutral = 0 if node.op in ("Add", "Sub") else 1
            if c.size and np.all(c == neutral):
                src = node.inputs[0]
        if src is not None and id(node.outputs[0]) not in outputs:
            graph.replace_uses(node.outputs[0], src)
            changed = True
            continue
        keep.append(node)
    graph.nodes = keep
    return changed


def _channel_scale(s: np.ndarray, out_shape: tuple[int, ...], axis: int) -> np.ndarray | None:
    """``s`` as a vector over ``axis`` of ``out_shape`` if it broadcasts along that axis only, else None."""
    rank = len(out_shape)
    if s.ndim > rank:
        return None
    full = (1,) * (rank - s.ndim) + s.shape
    if any(d != 1 for i, d in enumerate(full) if i != axis):
        return None
    return np.broadcast_to(s.reshape(full[axis]), (out_shape[axis],)).astype(np.float32)


def fold_scale(graph: Graph) -> bool:
    """Fold ``Mul`` by a per-output-channel constant into the weights of the Conv or MatMul before it.

    ``Conv(x, W) * s -> Conv(x, W * s[:, None, ...])`` and ``(Conv(x, W) + b) * s -> Conv(x, W*s) + b*s``
    (likewise MatMul with a constant right operand, scaled per column). This is how a
    BatchNormalization after a convolution disappears.
    """
    uses = graph.consumers()
    outputs = {id(v) for v in graph.outputs}

    def single_use(v: Value) -> bool:
        return len(uses.get(id(v), [])) == 1 and id(v) not in outputs

    changed = False
    for node in list(graph.nodes):
        if node.op != "Mul" or not node.inputs[1].is_const or node.inputs[1].is_shape_const or node not in graph.nodes:
            continue
        y, s = node.inputs
        add = None
        prod = y.producer
        if prod is not None and prod.op == "Add" and prod.inputs[1].is_const and not prod.inputs[1].is_shape_const \
                and single_use(y):
            add, y = prod, prod.inputs[0]
            prod = y.producer
        if prod is None or prod.op not in ("Conv", "MatMul") or not prod.inputs[1].is_const or not single_use(y):
            continue
        if node.outputs[0].shape != y.shape:
            continue
        axis = 1 if prod.op == "Conv" else len(y.shape) - 1
        vec = _channel_scale(s.const, node.outputs[0].shape, axis)
        if vec is None or (add is not None and _channel_scale(add.inputs[1].const, y.shape, axis) is None):
            continue
        w = prod.inputs[1]
        wshape = [1] * w.const.ndim
        wshape[0 if prod.op == "Conv" else -1] = -1
        prod.inputs[1] = Value(w.name + "_scaled", w.dtype, w.shape, const=(w.const * vec.reshape(wshape)).astype(w.const.dtype))
        if add is not None:
            b = add.inputs[1]
            rank = len(y.shape)
            vshape = [1] * rank
            vshape[axis] = -1
            scaled = b.const.reshape((1,) * (rank - b.const.ndim) + b.const.shape) * vec.reshape(vshape)
            add.inputs[1] = Value(b.name + "_scaled", b.dtype, scaled.shape, const=scaled.astype(b.const.dtype))
        graph.replace_uses(node.outputs[0], node.inputs[0])
        graph.nodes.remove(node)
        uses = graph.consumers()
        changed = True
    return changed


def dead_code(graph: Graph) -> bool:
    """Remove nodes none of whose outputs is read or returned."""
    live = {id(v) for v in graph.outputs}
    keep = []
    for node in reversed(graph.nodes):
        if any(id(o) in live for o in node.outputs):
            keep.append(node)
            live.update(id(v) for v in node.inputs)
    changed = len(keep) != len(graph.nodes)
    graph.nodes = keep[::-1]
    return changed


def _frozen(x):
    """A hashable stand-in for an attribute value, equal exactly when the values are (arrays by their bytes)."""
    if isinstance(x, np.ndarray):
        return ("ndarray", x.dtype.str, x.shape, x.tobytes() if x.dtype != object else tuple(map(_frozen, x.flat)))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, *map(_frozen, x))
    if isinstance(x, dict):
        return ("dict", *sorted((k, _frozen(v)) for k, v in x.items()))
    try:
        hash(x)
    except TypeError:
        return ("id", id(x))
    return (type(x).__name__, x)


#: constants up to this many elements are compared by value (larger ones by identity: weights are never equal)
_SMALL_CONST = 64


def common_subexpressions(graph: Graph) -> bool:
    """Give nodes that compute the same op with the same attributes on the same inputs one node (CSE).

    A decoder recomputes, in every layer, what depends only on the positions: RoPE's cos/sin rows, the causal
    mask. After this pass each is computed once. Small constants are compared by value; control-flow ops
    (their subgraphs) are left alone. Returns True if anything changed.
    """
    seen: dict[tuple, Node] = {}
    outputs = {id(v) for v in graph.outputs}
    changed = False
    keep = []

    def key_of(v: Value):
        if v.is_const and not v.is_shape_const and v.const.size <= _SMALL_CONST:
            return ("const", v.dtype, v.shape, v.const.tobytes())
        return ("value", id(v))

    for node in graph.nodes:
        if ops.kind(node.op) == "control" or any(id(o) in outputs for o in node.outputs):
            keep.append(node)
            continue
        key = (node.op, len(node.outputs), tuple(key_of(v) for v in node.inputs),
               _frozen(sorted(node.attrs.items())))
        first = seen.get(key)
        if first is None:
            seen[key] = node
            keep.append(node)
            continue
        for old, new in zip(node.outputs, first.outputs):
            graph.replace_uses(old, new)
        changed = True
    graph.nodes = keep
    return changed
