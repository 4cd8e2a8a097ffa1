"""Split reduction: a reduction of a long last axis into few outputs becomes a reduction of its parts, then of the
parts' results (TVM's ``rfactor``, CUB's two-pass device reduction).

A language model's greedy head is ``ArgMax`` over the vocabulary (49,152 logits for SmolLM2, 51,865 for Whisper)
with its ``ReduceMax`` before it: one output each, so one workgroup walks the whole axis alone, 192 loads a lane in
a row. Timed on an H200 (``bench.llm_profile``, SmolLM2's decode step at 8b742a1), the two took 43 and 39 us, more
than a layer's attention. Split in ``P`` parts of :data:`CHUNK` (the last part padded with the reduction's
identity)::

    ReduceMax(x)[m]   = max_p ReduceMax(x[m, p, :])                 (P workgroups of short chains, then one)
    ArgMax(x, best)[m] = p* C + ArgMax(x[m, p*, :], part_best[m, p*]) where p* = ArgMax(part_best[m], best[m])

(the first part holding the largest value, then the first index in it: the first index overall, as ONNX's
``select_last_index=0``). The arg max is five short kernels for two long ones: each part's maximum, then its arg max
(``P`` workgroups each), the parts' maximum, the first part holding it (one workgroup each), and the gather
(:func:`kiln.passes.fusion.fuse_rows` merges a reduction into elementwise consumers only, not into the reduction
that reads it).

The decision depends on the device (a GPU's many cores), so the pass runs where :mod:`kiln.passes.split_k` runs
(:meth:`kiln.codegen.target.Target.rfactor`).
"""

from __future__ import annotations

import numpy as np

from kiln.arith import symbolic
from kiln.ir.graph import Builder, Graph, Node, Value
from kiln.passes.simplify import dead_code

#: the shortest last axis split (shorter ones are a workgroup's short work already)
MIN_LENGTH = 8192
#: the most outputs a reduction may have and be split (more outputs are more workgroups already)
MAX_OUTPUTS = 16
#: the elements of a part (a workgroup's lanes, one load each)
CHUNK = 256
#: the reductions split, and the identity their padding takes
IDENTITY = {"ReduceMax": -np.inf, "ReduceMin": np.inf, "ReduceSum": 0.0}


def _splittable(node: Node) -> bool:
    """Whether ``node`` is a reduction over the last axis of a static float tensor, long and of few outputs."""
    if node.op in IDENTITY:
        axes = node.attrs.get("axes")
        if axes is None or len(axes) != 1 or len(node.inputs) != 1:
            return False
        axis = axes[0]
    elif node.op == "ArgMax":
        if len(node.inputs) != 2 or node.attrs.get("select_last_index", 0):
            return False
        axis = node.attrs["axis"]
    else:
        return False
    x = node.inputs[0]
    if x.dtype not in ("float32", "float16") or symbolic.symbols([x.shape]) or not x.shape:
        return False
    rank = len(x.shape)
    return axis % rank == rank - 1 and int(x.shape[-1]) >= MIN_LENGTH and \
        int(np.prod(x.shape[:-1], dtype=np.int64)) <= MAX_OUTPUTS


def _parts(b: Builder, x: Value, identity: float, name: str) -> Value:
    """``x [..., L]`` as ``[..., P, CHUNK]``, padded at the end with ``identity``."""
    lead = tuple(int(d) for d in x.shape[:-1])
    n = int(x.shape[-1])
    parts = -(-n // CHUNK)
    if parts * CHUNK != n:
        pads = (0,) * len(x.shape) + (0,) * len(lead) + (parts * CHUNK - n,)
        x = b.op("Pad", [x], name=f"{name}.pad", pads=pads, mode="constant", value=identity)
    return b.op("Reshape", [x], name=f"{name}.parts", shape=(*lead, parts, CHUNK))


def _split(b: Builder, node: Node) -> Value:
    """The nodes replacing ``node`` (module docstring); returns the value of its output."""
    name = node.name or node.op
    x = node.inputs[0]
    out = node.outputs[0]
    rank = len(x.shape)  # (the parts' axis is rank - 1, each part's rank)
    if node.op in IDENTITY:
        keep = node.attrs.get("keepdims", 1)
        parts = _parts(b, x, IDENTITY[node.op], name)
        part = b.op(node.op, [parts], name=f"{name}.part", axes=(rank,), keepdims=0)
        return b.op(node.op, [part], name=f"{name}.total", axes=(rank - 1,), keepdims=keep)
    parts = _parts(b, x, -np.inf, name)
    part_best = b.op("ReduceMax", [parts], name=f"{name}.part_best", axes=(rank,), keepdims=1)  # [..., P, 1]
    part_arg = b.op("ArgMax", [parts, part_best], name=f"{name}.part_arg", axis=rank, keepdims=0,
                    select_last_index=0)  # [..., P]
    bests = b.op("Reshape", [part_best], name=f"{name}.part_bests", shape=tuple(part_best.shape[:-1]))  # [..., P]
    best = b.op("ReduceMax", [bests], name=f"{name}.best", axes=(rank - 1,), keepdims=1)  # [..., 1]
    first = b.op("ArgMax", [bests, best], name=f"{name}.first_part", axis=rank - 1, keepdims=1, select_last_index=0)
    col = b.op("GatherElements", [part_arg, first], name=f"{name}.column", axis=rank - 1)  # [..., 1]
    index = b.op("Add", [b.op("Mul", [first, b.const(np.array(CHUNK, np.int64))], name=f"{name}.offset"), col],
                 name=f"{name}.index")
    return b.op("Reshape", [index], name=f"{name}.shape", shape=tuple(int(d) for d in out.shape))


def split_reduction(graph: Graph) -> bool:
    """Split every ``ReduceMax``/``ReduceMin``/``ReduceSum`` of one axis and every ``ArgMax`` (Kiln's two-input
    form, its input's maximum given; ``select_last_index=0``) whose axis is the last of a static float input at
    least :data:`MIN_LENGTH` long, with at most :data:`MAX_OUTPUTS` outputs (module docstring). Returns True if
    anything changed."""
    changed = False
    for node in list(graph.nodes):
        if not _splittable(node):
            continue
        b = Builder.beside(graph)
        total = _split(b, node)
        graph.replace_uses(node.outputs[0], total)
        at = graph.nodes.index(node)
        graph.nodes[at:at + 1] = b.graph.nodes
        changed = True
    if changed:
        dead_code(graph)  # (a maximum only the split arg max read)
    return changed
