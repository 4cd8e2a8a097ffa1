"""FlashDecoding: a decode step's attention over many cached keys, split into blocks of keys across workgroups.

One query row a workgroup (the row kernel that :func:`kiln.passes.fusion.fuse_attention` makes, a few rows in a
decode step) reads every key and value of its row alone: at 1024 keys it is slower than the three kernels of
scores, softmax and ``P V`` (``kiln.codegen.webgpu.build.MAX_FUSED_KEYS``). Splitting the keys into blocks of
:data:`BLOCK` (Dao et al., *Flash-Decoding for long-context inference*, 2023) gives each (query row, block) pair a
workgroup of its own:

1. the *split* kernel, a row kernel over rows ``(kv head, block, query row)``: the block's scores (a stage), their
   softmax and ``P V`` over the block's values, with the block's log-sum-exp ``m + log l`` packed after the ``P V``
   columns: ``partial[..., block, row, 0:hd]`` and ``partial[..., block, row, hd]``;
2. the *combine* kernel: ``out = sum_b exp(lse_b - M) O_b / sum_b exp(lse_b - M)`` with ``M = max_b lse_b``.

Keys past the step's last (the last block's tail, read from the cache's rows beyond it, which exist: the cache holds
``max_context`` rows, zero rows beyond them where those are no whole number of blocks) are masked by the
attention's own causal mask (a key after the query's position), extended over the blocks. Every block of a decode
step holds at least one key it may attend to, so no block's maximum is ``-inf``. The pair is an *alternative* to the
three kernels (``Group.alternative_to``), for one query token only (``Group.split``: the target runs it where the
fused row kernel's keys would be too many).

Where the caches are updated in place (``TensorScatter`` into the cache's own buffer, :func:`~kiln.passes.memory_plan.
mark_in_place`: a decode step writes its one key and value row), the split kernel does not wait for that write: it
reads the cache as it was before the step and takes the step's new row from the keys and values being written
(``Where(row == write, new row, cache row)``), and the write *rides* on the split kernel's dispatch
(``Group.riders``, :func:`kiln.te.horizontal.ride`): one dispatch a layer fewer. No workgroup loads the row the
riders store (the split reads the row before it in its place, and discards it): nothing races in the dispatch.
The fused row kernel that :func:`~kiln.passes.fusion.fuse_attention` made for a decode step up to its keys gets the
same rewrite and riders (:func:`_ride_on_fused`): every decode step's attention carries its cache writes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln.arith import symbolic
from kiln.ir.graph import Builder, Graph, Node, Value
from kiln.passes.fusion import Group, _buffers

#: keys a split kernel's workgroup reads (a block). H200, SmolLM2's decode step at 1024 keys
#: (bench/results/llm-profile-20261128-split-h200.txt): the split kernel 14.4 us a layer at 64 keys a block (144
#: workgroups) against 18.6 at 128 (72); 9 query heads x 32 blocks at 2048 keys
BLOCK = 64


def fuse_split_attention(graph: Graph, groups: list[Group], supported: Callable[[Group], bool],
                         max_inputs: int = 7) -> list[Group]:
    """Add a split kernel and a combine kernel (module docstring) as the alternative to every attention that
    :func:`~kiln.passes.fusion.fuse_attention` gave a fused row kernel over run-time dims (the compiler calls it after
    :func:`~kiln.passes.fusion.fuse`, where the targets lower row kernels), where the attention has
    the form a decoder's importer writes: ``MatMul(Q, Transpose(Slice(K cache)))``, scaled by a constant, masked by
    ``Where(Greater(Reshape(Iota(keys)), positions), -inf, .)``, a softmax, and ``MatMul(P, Slice(V cache))`` ending
    its group. The split group must be a row kernel of the target (``supported``) within ``max_inputs`` buffers."""
    scatters = {id(g.output): g for g in groups if not g.alias and g.nodes[-1].op == "TensorScatter" and
                g.nodes[-1].attrs.get("in_place")}
    for fused in [g for g in groups if len(g.alternative_to) == 3 and g.rows and not g.split]:
        q, p, c = fused.alternative_to
        ridden = _ride_on_fused(graph, fused, scatters, supported, max_inputs)
        if ridden is not None:  # (the fused row kernel of a decode step up to its keys: the writes ride there too)
            groups[groups.index(fused)] = fused = ridden
        for writes in (scatters, {}):  # (the cache writes riding on the split kernel where its buffers allow)
            made = _split(graph, q, p, c, writes)
            if made is None or _buffers(made[0].inputs) <= max_inputs:
                break
        if made is None:
            continue
        split, combine = made
        if _buffers(split.inputs) > max_inputs or _buffers(combine.inputs) > max_inputs or not supported(split):
            continue
        at = groups.index(fused) + 1
        groups[at:at] = [split, combine]
    return groups


def _only(nodes: list[Node], op: str) -> Node | None:
    found = [n for n in nodes if n.op == op]
    return found[0] if len(found) == 1 else None


def _made_by(nodes: list[Node], v: Value, op: str) -> Node | None:
    return next((n for n in nodes if n.op == op and n.outputs[0] is v), None)


def _needed(nodes: list[Node], values: list[Value]) -> list[Node]:
    """The nodes of ``nodes`` that ``values`` depend on, in order."""
    made = {id(n.outputs[0]): n for n in nodes}
    keep: set[int] = set()
    todo = [made[id(v)] for v in values if id(v) in made]
    while todo:
        n = todo.pop()
        if id(n) not in keep:
            keep.add(id(n))
            todo += [made[id(v)] for v in n.inputs if id(v) in made]
    return [n for n in nodes if id(n) in keep]


def _split(graph: Graph, q: Group, p: Group, c: Group, scatters: dict[int, Group]) -> tuple[Group, Group] | None:
    """The split and combine groups of attention ``(q, p, c)``, or ``None`` where it has another form; ``scatters``
    (a group's output id -> the group): the in-place cache updates, which ride on the split kernel where both caches
    are such updates of one write position (module docstring)."""
    mm, where = _only(q.nodes, "MatMul"), _only(q.nodes, "Where")
    scale = mm and next((n for n in q.nodes if n.op == "Mul" and n.inputs[0] is mm.outputs[0]), None)
    pv = c.nodes[-1]
    if mm is None or where is None or scale is None or pv.op != "MatMul" or pv.inputs[0] is not p.output or \
            where.inputs[2] is not scale.outputs[0] or \
            where.outputs[0] is not q.output or not scale.inputs[1].is_const or scale.inputs[1].size != 1:
        return None
    kt = _made_by(q.nodes, mm.inputs[1], "Transpose")
    ks = kt and _made_by(q.nodes, kt.inputs[0], "Slice")
    vs = _made_by(c.nodes, pv.inputs[1], "Slice")
    greater = _made_by(q.nodes, where.inputs[0], "Greater")
    at = greater and _made_by(q.nodes, greater.inputs[0], "Reshape")
    iota = at and _made_by(q.nodes, at.inputs[0], "Iota")
    if ks is None or vs is None or iota is None or not where.inputs[1].is_const or \
            float(np.asarray(where.inputs[1].const).reshape(-1)[0]) != -np.inf or \
            (iota.attrs.get("start"), iota.attrs.get("delta")) != (0, 1) or \
            tuple(iota.outputs[0].shape) != (ks.outputs[0].shape[2],):  # (the mask: key index > query position)
        return None
    query, (k_cache, v_cache), positions = mm.inputs[0], (ks.inputs[0], vs.inputs[0]), greater.inputs[1]
    if len(query.shape) != 4 or len(k_cache.shape) != 4 or len(ks.outputs[0].shape) != 4:
        return None
    one, heads, rows, hd = query.shape
    keys = ks.outputs[0].shape[2]
    if k_cache.shape[:2] != (one, heads) or \
            v_cache.shape != k_cache.shape or k_cache.shape[3] != hd or vs.outputs[0].shape[2] != keys or \
            tuple(positions.shape) != (rows, 1) or not symbolic.is_symbolic(keys) or \
            symbolic.is_symbolic(k_cache.shape[2]) or any(symbolic.is_symbolic(d) for d in (one, heads, hd)) or \
            ks.attrs.get("starts") != (0, 0, 0, 0) or vs.attrs.get("starts") != (0, 0, 0, 0) or \
            tuple(ks.attrs.get("steps", (1, 1, 1, 1))) != (1, 1, 1, 1) or \
            tuple(vs.attrs.get("steps", (1, 1, 1, 1))) != (1, 1, 1, 1):
        return None
    writes = [scatters.get(id(x)) for x in (k_cache, v_cache)]
    riders = tuple(writes) if all(writes) and _one_write(*(w.nodes[-1] for w in writes)) else ()
    b = Builder.beside(graph)
    blocks = symbolic.simplify((keys + (BLOCK - 1)) // BLOCK)
    tail = -k_cache.shape[2] % BLOCK  # (the keys never pass the cache's rows: the dims' limits bound them)
    whole = (k_cache.shape[2] + tail) // BLOCK  # the cache's blocks

    def blocked(cache: Value) -> Value:  # [1, H, blocks, BLOCK, hd]: the cache's rows up to the last block's end
        if riders:  # the cache before the step, its row ``write`` the step's new one (a decode step's one token)
            past, new, write = _before_step(b, next(w.nodes[-1] for w in writes if w.output is cache))
            row = b.op("Reshape", [b.op("Iota", [], shape=(whole * BLOCK,), dtype="int32", start=0, delta=1)],
                       shape=(whole, BLOCK, 1))
            row = b.op("Slice", [row], starts=(0, 0, 0), ends=(blocks, BLOCK, 1), steps=(1, 1, 1))
            at_write = b.op("Equal", [row, write])  # [blocks, BLOCK, 1]
            new = b.op("Reshape", [new], shape=(one, heads, 1, 1, hd))
            return b.op("Where", [at_write, new, _blocked(past)])
        return _blocked(cache)

    def _blocked(cache: Value) -> Value:
        if tail:  # zero rows after a cache whose rows are no whole number of blocks (masked like every tail key)
            cache = b.op("Pad", [cache], pads=(0, 0, 0, 0, 0, 0, tail, 0), mode="constant", value=0.0)
        # the cache's own blocks, then the first ``blocks`` of them: a load's index is the cache's, in constants
        cache = b.op("Reshape", [cache], shape=(one, heads, whole, BLOCK, hd))
        return b.op("Slice", [cache], starts=(0, 0, 0, 0, 0), ends=(one, heads, blocks, BLOCK, hd),
                    steps=(1, 1, 1, 1, 1))

    kb = b.op("Transpose", [blocked(k_cache)], perm=(0, 1, 2, 4, 3))
    scores = b.op("MatMul", [b.op("Reshape", [query], shape=(one, heads, 1, rows, hd)), kb])  # [1, H, blocks, rows, B]
    scores = b.op("Mul", [scores, scale.inputs[1]])
    at = b.op("Reshape", [b.op("Iota", [], shape=(whole * BLOCK,), dtype="int32", start=0, delta=1)],
              shape=(whole, 1, BLOCK))
    at = b.op("Slice", [at], starts=(0, 0, 0), ends=(blocks, 1, BLOCK), steps=(1, 1, 1))
    scores = b.op("Where", [b.op("Greater", [at, positions]), where.inputs[1], scores])
    peak = b.op("ReduceMax", [scores], axes=(4,), keepdims=1)
    e = b.op("Exp", [b.op("Sub", [scores, peak])])
    total = b.op("ReduceSum", [e], axes=(4,), keepdims=1)
    values = b.op("MatMul", [b.op("Div", [e, total]), blocked(v_cache)])  # [1, H, blocks, rows, hd]
    lse = b.op("Add", [peak, b.op("Log", [total])])
    partial = b.op("Concat", [values, lse], axis=4)  # [1, H, blocks, rows, hd + 1]
    split_nodes = list({id(n): n for n in _needed(q.nodes, [query, positions]) + _new_rows(riders) +
                        b.graph.nodes}.values())
    mark = len(b.graph.nodes)
    o = b.op("Slice", [partial], starts=(0, 0, 0, 0, 0), ends=(one, heads, blocks, rows, hd), steps=(1, 1, 1, 1, 1))
    w = b.op("Slice", [partial], starts=(0, 0, 0, 0, hd), ends=(one, heads, blocks, rows, hd + 1),
             steps=(1, 1, 1, 1, 1))
    w = b.op("Exp", [b.op("Sub", [w, b.op("ReduceMax", [w], axes=(2,), keepdims=1)])])
    num = b.op("ReduceSum", [b.op("Mul", [w, o])], axes=(2,), keepdims=0)  # [1, H, rows, hd]
    den = b.op("ReduceSum", [w], axes=(2,), keepdims=0)
    combine_nodes = b.graph.nodes[mark:] + [Node("Div", [num, den], [c.output], {}, name=f"{pv.name}.combine")]
    split = Group(split_nodes, _inputs(split_nodes), rows=True, alternative_to=(q, p, c),
                  split=(BLOCK, keys, symbolic.symbols([rows])), riders=riders)
    combine = Group(combine_nodes, _inputs(combine_nodes), alternative_to=(q, p, c), split=split.split)
    return split, combine


def _ride_on_fused(graph: Graph, fused: Group, scatters: dict[int, Group], supported: Callable[[Group], bool],
                   max_inputs: int) -> Group | None:
    """The fused attention row kernel ``fused`` (an alternative for one query token) reading the caches as they were
    before the step, the step's new rows selected in, with the in-place cache updates riding on its dispatch (as for
    the split kernel, module docstring); ``None`` where it reads no such updates or the result is not a kernel of the
    target within ``max_inputs`` buffers."""
    slices = [n for n in fused.nodes if n.op == "Slice" and id(n.inputs[0]) in scatters]
    writes = [scatters[id(n.inputs[0])] for n in slices]
    if len(slices) != 2 or not _one_write(*(w.nodes[-1] for w in writes)) or \
            any(n.attrs.get("starts") != (0, 0, 0, 0) or tuple(n.attrs.get("steps", (1, 1, 1, 1))) != (1, 1, 1, 1)
                for n in slices):
        return None
    b = Builder.beside(graph)
    swap: dict[int, Value] = {}
    for sl, w in zip(slices, writes):
        past, new, write = _before_step(b, w.nodes[-1])
        one, heads, keys, hd = sl.outputs[0].shape
        old = b.op("Slice", [past], starts=(0, 0, 0, 0), ends=(one, heads, keys, hd), steps=(1, 1, 1, 1))
        row = b.op("Reshape", [b.op("Iota", [], shape=(keys,), dtype="int32", start=0, delta=1)], shape=(keys, 1))
        swap[id(sl.outputs[0])] = b.op("Where", [b.op("Equal", [row, write]), new, old])
    nodes = [n if not any(id(v) in swap for v in n.inputs) else
             Node(n.op, [swap.get(id(v), v) for v in n.inputs], n.outputs, dict(n.attrs), name=n.name)
             for n in fused.nodes if n not in slices]
    nodes = list({id(n): n for n in _new_rows(writes) + b.graph.nodes + nodes}.values())
    ridden = Group(nodes, _inputs(nodes), rows=True, alternative_to=fused.alternative_to,
                   alternative_box=fused.alternative_box, riders=tuple(writes))
    if _buffers(ridden.inputs) > max_inputs or not supported(ridden):
        return None
    return ridden


def _before_step(b: Builder, scatter: Node) -> tuple[Value, Value, Value]:
    """``(cache, new row, write)`` for in-place cache update ``scatter`` (``TensorScatter(past, new, write)``, one
    token): the cache before the step ``[B, KV, rows, hd]`` with its row ``write`` read from the row before it (the
    last row, for row 0: no load of a kernel riding the update races with its store there; the attention's
    ``Where`` takes the new row in its place), the new row ``[B, KV, 1, hd]`` and ``write`` as int32."""
    past, new, write = scatter.inputs
    write = b.op("Cast", [write], to="int32")
    rows = b.op("Iota", [], shape=(past.shape[2],), dtype="int32", start=0, delta=1)
    rows = b.op("Where", [b.op("Equal", [rows, write]), b.op("Sub", [rows, b.const(np.array(1, np.int32))]), rows])
    one, heads, _, hd = new.shape
    new = b.op("Slice", [new], starts=(0, 0, 0, 0), ends=(one, heads, 1, hd), steps=(1, 1, 1, 1))
    return b.op("Gather", [past, rows], axis=2), new, write


def _new_rows(writes) -> list[Node]:
    """The nodes of in-place cache update groups ``writes`` that compute their new rows (a kernel reading the new
    rows in their place computes them too: the keys' RoPE)."""
    return [n for w in writes for n in _needed(w.nodes, [w.nodes[-1].inputs[1]])]


def _one_write(k: Node, v: Node) -> bool:
    """Whether in-place cache updates ``k`` and ``v`` write their new rows at one position, along the rows axis."""
    return all(n.attrs.get("axis") == 2 and n.attrs.get("mode", "linear") == "linear" and len(n.inputs) == 3 and
               len(n.inputs[1].shape) == 4 for n in (k, v)) and k.inputs[2] is v.inputs[2] and \
        k.inputs[0].shape == v.inputs[0].shape


def _inputs(nodes: list[Node]) -> list[Value]:
    """The values ``nodes`` read that none of them computes, in order of first use."""
    inside = {id(o) for n in nodes for o in n.outputs}
    return list(dict.fromkeys(v for n in nodes for v in n.inputs if id(v) not in inside))
