"""Split-K: a matrix product with few output tiles and a long reduction becomes partial products and their sum.

``C[M, N] = A[M, K] @ B[K, N]`` with ``M x N`` small (MiniLM at batch 1: 128 x 384) and ``K`` long (its FFN's 1536)
leaves most of a large GPU idle: each of its few output blocks walks the whole reduction alone. Split in ``S``
parts (TVM's ``rfactor``; cuBLAS and CUTLASS's split-K GEMMs)::

    P[s, m, n] = sum_k A[m, s K/S + k] B[s K/S + k, n]      (a batched MatMul: S times the blocks, K/S long)
    C[m, n]    = sum_s P[s, m, n]                           (adds or a ReduceSum, the product's epilogue fused after it)

(``A``'s leading axes, ``[1, 128]`` for MiniLM's ``[1, 128, K]``, stay the partials' axes after ``s``.)

The reshapes and the transpose that present ``A`` and ``B`` to the batched product are index-only: fusion reads them
in place. At batch 1 (a leading unit axis, which the parts' axis takes) the sum is ``S - 1`` adds of slices of the
partials: elementwise, so it joins the kernel after it with the product's bias and residual adds (MiniLM: the
LayerNorm's row kernel), and the rewrite costs only the partials' buffer (``S M N`` floats). Otherwise it is a
``ReduceSum``, one kernel more (which takes over the product's epilogue). Measured on an H100 (``bench.gemm_small``,
``bench/results/gemm-small-20261128-031837.json``): MiniLM's ``128 x 1536 x 384`` product took 86 us under the
default schedule, 54-64 us with shared tiles of 32 x 32 and 23 us split in 4 (19.8 the partials, 3.3 the sum);
its ``128 x 384 x 384`` 24, 16-18 and 10 us. Products whose shared-tile blocks already fill the GPU (``128 x 384 x
1536``: 192 blocks, 17.7 us against 16.8 split, a separate sum's kernel included) are left whole.

The decision depends on the device (a GPU with many cores), so the pass runs only for targets that ask for it
(:meth:`kiln.codegen.target.Target.rfactor`), after the target-independent passes.
"""

from __future__ import annotations

import numpy as np

from kiln.arith import symbolic
from kiln.ir.graph import Builder, Graph, Node
from kiln.passes.simplify import dead_code

#: output blocks (of :data:`BLOCK` x :data:`BLOCK`) a product must fill without splitting: below this it is split
MIN_BLOCKS = 128
#: the block edge of the shared-tile schedule such products get (:data:`kiln.te.schedule.SHARED_SMALL`)
BLOCK = 32
#: the shortest reduction a part keeps (and each part a whole number of 16-long workgroup-memory chunks)
MIN_PART = 64
#: the most parts
MAX_PARTS = 8


def parts_for(m: int, k: int, n: int) -> int:
    """How many parts ``C[m, n] = A[m, k] @ B[k, n]`` is split into: the fewest power of two (2 to
    :data:`MAX_PARTS`) that brings its blocks to :data:`MIN_BLOCKS` (else the most that stays valid), each part at
    least :data:`MIN_PART` long and a multiple of 16; 1 (not split) when the blocks are that many already, an output
    axis is shorter than a block, or no valid split exists."""
    blocks = -(-m // BLOCK) * -(-n // BLOCK)
    if blocks >= MIN_BLOCKS or m < BLOCK or n < BLOCK:
        return 1
    best, s = 1, 2
    while s <= MAX_PARTS:
        if k % s == 0 and (k // s) % 16 == 0 and k // s >= MIN_PART:
            best = s
            if blocks * s >= MIN_BLOCKS:
                break
        s *= 2
    return best


def split_k(graph: Graph) -> bool:
    """Split every float32 ``MatMul`` whose right operand is 2-D (``[K, N]``), whose shapes are static, whose result
    is not a graph output (an epilogue follows in the models this is for) and for which :func:`parts_for` gives more
    than one part (see the module docstring). Returns True if anything changed."""
    outputs = {id(v) for v in graph.outputs}
    changed = False
    for node in list(graph.nodes):
        if node.op != "MatMul" or id(node.outputs[0]) in outputs:
            continue
        a, b = node.inputs
        if len(b.shape) != 2 or len(a.shape) < 2 or a.dtype != "float32" or b.dtype != "float32" or \
                symbolic.symbols([a.shape, b.shape]):
            continue
        k, n = (int(d) for d in b.shape)
        m = int(np.prod(a.shape[:-1], dtype=np.int64))
        s = parts_for(m, k, n)
        if s > 1:
            _split(graph, node, k, n, s)
            changed = True
    if changed:
        dead_code(graph)  # (the products replaced, and a reshape _split read through where nothing else reads it)
    return changed


def _split(graph: Graph, node: Node, k: int, n: int, s: int) -> None:
    """Replace ``node`` by the batched partial product over ``s`` parts and its sum (module docstring)."""
    a, b = node.inputs
    out = node.outputs[0]
    g = Builder.beside(graph)
    name = node.name or "MatMul"
    lead = tuple(int(d) for d in a.shape[:-1])
    # the partials keep the product's leading axes after the parts' axis (so that the sum is the product's shape and
    # its epilogue fuses after it), but a leading unit axis (batch 1), which the parts' axis takes: each part is then
    # a slice of the product's shape, and their sum elementwise adds that fuse into the next kernel (a LayerNorm's row
    # kernel reading the residual sum) instead of a reduction kernel of their own
    keep = lead[1:] if lead[0] == 1 and len(lead) > 1 else lead
    r = len(keep)
    while a.producer is not None and a.producer.op == "Reshape":  # (a reshape of a reshape is one: fusion reads one
        a = a.producer.inputs[0]                                 # view in place, not a chain of them)
    split_a = g.op("Reshape", [a], name=f"{name}.split_a", shape=(*keep, s, k // s))
    parts_a = g.op("Transpose", [split_a], name=f"{name}.parts_a", perm=(r, *range(r), r + 1))
    parts_b = g.op("Reshape", [b], name=f"{name}.parts_b", shape=(s, *(1,) * (r - 1), k // s, n))
    partial = g.op("MatMul", [parts_a, parts_b], name=f"{name}.partial")
    if keep != lead:
        total = None
        for i in range(s):
            part = g.op("Slice", [partial], name=f"{name}.part{i}", starts=(i,) + (0,) * (r + 1), ends=(i + 1, *keep, n),
                        steps=(1,) * (r + 2))
            total = part if total is None else g.op("Add", [total, part], name=f"{name}.sum{i}")
    else:
        total = g.op("ReduceSum", [partial], name=f"{name}.sum", axes=(0,), keepdims=0)
    graph.replace_uses(out, total)
    at = graph.nodes.index(node)
    graph.nodes[at:at + 1] = g.graph.nodes
