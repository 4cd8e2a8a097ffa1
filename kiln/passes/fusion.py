"""Operator fusion: partition the graph into kernels.

Each kernel is an *anchor* node (any op) followed by a chain of elementwise or
broadcasting binary consumers of the same output shape, each reading the
previous one's result and nothing else reading it (for example
Conv → Add(bias) → Clip, or Conv → Add(bias) → Add(residual)). The chain becomes
one tensor expression, so intermediate values never reach memory.

Then purely elementwise groups are *inlined into their consumers* when every
consumer reads each of their elements once per element it computes (elementwise
chains and reductions; not a convolution or matmul, which would recompute the
producer for every reduction step, but for the GPU prologues below): the producer's nodes are prepended to each
consumer's group, duplicated when there are several, and the producer's result
never reaches memory (TVM's rule of fusing injective operators into their
consumers). LayerNormalization (mean, centre, square, mean, rsqrt, scale) thus
becomes two reductions and one elementwise kernel instead of five kernels, and
Softmax (max, exp-sum, divide) three instead of four, with no full-size temporaries.

Before that, groups that only move elements (Transpose, Slice, and the views behind them) are inlined into every
kernel that reads them, matmuls included (:func:`inline_index`): the loads do the index arithmetic. Elementwise
producers are also inlined into consumers that read each element once through such moves (a TensorScatter's
update), and, for GPUs, small ones into the matmul that takes them as its activation (a *prologue*, redone per
output column).

Optionally (:func:`fuse_rows`, for targets whose lowering has row kernels) a row reduction whose
result is read only by the elementwise group over the same rows is then fused into that group too:
LayerNormalization and Softmax each become one kernel, a workgroup per row (:mod:`kiln.te.rows`).

Reshapes (``view`` ops) make no kernel at all: their output aliases the input's
buffer (see :mod:`kiln.passes.memory_plan`) unless it is a graph output fed
straight by a graph input, which gets a copy kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kiln.arith import symbolic
from kiln.ir import ops
from kiln.ir.graph import Graph, Node, Value

#: kinds of ops that can be fused into the kernel of their producer
FUSIBLE = ("elementwise", "binary", "ternary")
#: kinds of consumers an elementwise producer is inlined into (each reads an element once per element computed)
INLINE_INTO = FUSIBLE + ("reduce",)
#: ops whose every output element is one input element, moved (no arithmetic): inlined into any consumer
#: (a Reshape in a kernel of its own is a copy; one that aliases its input's buffer is a view, inlined with them)
INDEX_ONLY = ("Transpose", "Slice", "Reshape")
#: kinds of nodes whose operands are read many times per element (a reshape's index arithmetic repeats with them)
CONTRACTIONS = ("matmul", "matmul_nbits", "conv")
#: ops whose kernel stores through a store view (``attrs["store"]``, kiln.kernels.index.compact): a group of its own,
#: nothing chained after it, and the operands that place its stores (all but the first) are never inlined into it
STORES = ("Compact",)
#: most nodes a group may reach by inlining (duplicated producers must not grow kernels without bound)
MAX_INLINED_NODES = 24
#: most nodes a row group (:func:`fuse_rows`) may reach
MAX_ROW_NODES = 48


@dataclass(eq=False)
class Group:
    """A fused kernel: ``nodes`` in order; ``nodes[-1]`` defines ``output``.

    Attributes:
        inputs: values read from outside the group (activations, weights; scalar constants included).
        alias: True for a view (reshape) that needs no kernel.
        rows: True for a row group (:func:`fuse_rows`): row reductions and the elementwise work over the
            same rows, lowered as a row kernel (:mod:`kiln.te.rows`).
        alternative_to: the groups this one computes the same output as (:func:`fuse_attention` over run-time
            dims, :func:`fuse_norm_prologues`): the plan keeps both, and each runs in its own part of the dims' range
            (``alternative_box``, ``(dim, lo, hi)`` each, where fusion knows it; else the target decides).
        stage_bound: set by the target for an alternative row kernel it runs only up to that many keys: its stage
            arrays are sized for that many (``kiln.te.rows``), not for the dims' upper bounds.
        split: ``(block, keys, row dims)`` for the two groups of an attention split over blocks of keys
            (:mod:`kiln.passes.split_attention`): the target runs them, for the row dims at their lowest value, where
            ``keys`` (a size expression) is past what it runs the fused row kernel for.
        riders: groups whose work this (alternative) group's dispatch does too, in workgroups after its own, where it
            runs; elsewhere they run as their own kernels (a decode step's KV-cache writes riding on its attention
            kernel, :mod:`kiln.passes.split_attention`; :func:`kiln.te.horizontal.ride`).
    """

    nodes: list[Node]
    inputs: list[Value] = field(default_factory=list)
    alias: bool = False
    rows: bool = False
    alternative_to: tuple = ()
    alternative_box: list | None = None
    stage_bound: int | None = None
    split: tuple | None = None
    riders: tuple = ()

    @property
    def output(self) -> Value:
        """The one value the group writes."""
        return self.nodes[-1].outputs[0]

    @property
    def name(self) -> str:
        """Readable kernel name: the ops joined by ``_``."""
        return "_".join(n.op.lower() for n in self.nodes)


def fuse(graph: Graph, max_inputs: int = 7, rows: Callable[[Group], bool] | None = None,
         prologues: bool = False) -> list[Group]:
    """Partition ``graph.nodes`` into groups in execution order.

    Args:
        max_inputs: most buffers a kernel may read (WebGPU's default
            ``maxStorageBuffersPerShaderStage`` is 8, one of which is the output).
        rows: if given, also fuse row reductions into their elementwise consumers (:func:`fuse_rows`)
            where ``rows(candidate group)`` says the target lowers the result as a row kernel.
        prologues: also inline small elementwise groups into the matmuls that take them as activation
            (:func:`inline_elementwise`), and reshapes into matmuls (:func:`inline_index`): for GPUs, whose
            arithmetic is cheap beside the bytes they move.
    """
    uses = graph.consumers()
    outputs = {id(v) for v in graph.outputs}
    ins = {id(v) for v in graph.inputs}
    assigned: set[int] = set()
    groups: list[tuple[int, Group]] = []
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    for node in graph.nodes:
        if id(node) in assigned:
            continue
        assigned.add(id(node))
        # If/Loop (kiln.codegen.webgpu.control), Compact, and scans (their kernel reads its own output as it goes)
        if ops.kind(node.op) in ("control", "scan") or node.op in STORES:
            groups.append((position[id(node)], Group([node], list(dict.fromkeys(node.inputs)))))
            continue
        if ops.kind(node.op) == "view":
            src = node.inputs[0]
            alias = not (id(node.outputs[0]) in outputs and (id(src) in ins or src.is_const))
            groups.append((position[id(node)], Group([node], [src], alias=alias)))
            continue
        chain = [node]
        external = list(dict.fromkeys(node.inputs))
        while len(node.outputs) == 1:
            out = chain[-1].outputs[0]
            readers = uses.get(id(out), [])
            if len(readers) != 1 or id(out) in outputs:
                break
            nxt = readers[0]
            if ops.kind(nxt.op) not in FUSIBLE or nxt.outputs[0].shape != out.shape or id(nxt) in assigned:
                break
            extra = [v for v in nxt.inputs if v is not out and v not in external]
            if _buffers(external + extra) > max_inputs:
                break
            chain.append(nxt)
            external += extra
            assigned.add(id(nxt))
        groups.append((position[id(chain[-1])], Group(chain, external)))
    groups.sort(key=lambda g: g[0])
    fused = inline_elementwise(graph, inline_index(graph, [g for _, g in groups], max_inputs, prologues), max_inputs,
                               prologues)
    if rows is None:
        return fused
    fused = fuse_attention(graph, fuse_rows(graph, fused, rows, max_inputs), rows, max_inputs)
    return fuse_norm_prologues(graph, fused, max_inputs)


def _holders(groups: list[Group]) -> dict[int, set[int]]:
    """Node ``id`` -> the ``id`` of every group holding it (an inlined node may be in several)."""
    held: dict[int, set[int]] = {}
    for g in groups:
        for n in g.nodes:
            held.setdefault(id(n), set()).add(id(g))
    return held


def _buffers(values: list[Value]) -> int:
    """Buffers a kernel reading ``values`` binds (scalar constants become literals)."""
    return len([v for v in values if not (v.is_const and v.size == 1)])


def inline_elementwise(graph: Graph, groups: list[Group], max_inputs: int = 7, prologues: bool = False) -> list[Group]:
    """Inline purely elementwise groups into the groups that consume them (see the module docstring).

    A group (elementwise nodes, and index-only ones :func:`inline_index` put there) is inlined when its output is
    not a graph output and each consumer group reads every element of it at most once per element it computes
    (:func:`_reads_once`), or, with ``prologues``, takes it as the activation of a matmul (a prologue:
    the few operations are redone per output column, which on a GPU costs nothing beside reading the weights; a
    decoder's SwiGLU product then feeds the down projection, and RMSNorm's scaling the projections after it,
    from registers); and every consumer group stays within ``max_inputs``
    buffers and :data:`MAX_INLINED_NODES` nodes. Otherwise it stays a kernel of its own. Repeats until nothing
    changes, so chains of such groups collapse into their consumers. With ``prologues`` the group may also hold
    generators (``Iota``; no transcendental function with them, a rotary table's ``Cos`` redone per use).
    """
    uses = graph.consumers()
    outputs = {id(v) for v in graph.outputs}
    changed = True
    while changed:
        changed = False
        group_of: dict[int, list[Group]] = {}  # an inlined node lives in every group it was copied into
        for g in groups:
            for n in g.nodes:
                group_of.setdefault(id(n), []).append(g)
        for p in groups:
            if p.alias or p.rows or id(p.output) in outputs or \
                    any(ops.kind(n.op) not in FUSIBLE and not _moves_only(n) and
                        not (prologues and ops.kind(n.op) == "generator") for n in p.nodes) or \
                    any(ops.kind(n.op) == "generator" for n in p.nodes) and any(n.op in TRANSCENDENTAL for n in p.nodes) or \
                    not any(ops.kind(n.op) in FUSIBLE for n in p.nodes):
                continue
            readers = uses.get(id(p.output), [])
            if not readers:
                continue
            targets = list({id(g): g for r in readers for g in group_of[id(r)]}.values())
            merged = []
            for t in targets:
                if t is p or t.alias or not _reads_once(t, p, prologues) or _reads_own_output(t, p):
                    break
                inputs = list(dict.fromkeys([*p.inputs, *(v for v in t.inputs if v is not p.output)]))
                if _buffers(inputs) > max_inputs or len(p.nodes) + len(t.nodes) > MAX_INLINED_NODES:
                    break
                merged.append((t, inputs))
            else:
                for t, inputs in merged:
                    t.nodes[:0] = p.nodes
                    t.inputs = inputs
                groups.remove(p)
                changed = True
                break
    return groups


#: most nodes of an elementwise group inlined as a matmul prologue (redone per output column)
MAX_PROLOGUE_NODES = 8
#: ops that keep an elementwise group out of ``MatMul`` prologues (costly when redone per output column)
TRANSCENDENTAL = ("Exp", "Log", "Erf", "Tanh", "Sigmoid", "Sin", "Cos", "Pow", "Sqrt", "Reciprocal", "Div",
                  "Softplus", "Gelu", "HardSigmoid", "Atan", "Asin", "Acos")


def _reads_once(t: Group, p: Group, prologues: bool) -> bool:
    """Whether group ``t`` may take ``p``'s output inlined: every node of ``t`` that it reaches reads each element
    once per element it computes (elementwise and reductions, index-only nodes, TensorScatter's update), or, with
    ``prologues``, it reaches (through such nodes) only the first operand of a ``MatMulNBits``, or of a ``MatMul``
    when ``p`` has no transcendental function and reads no reduction (a decoder's rotary embedding of the queries:
    a few multiplies redone per key; a LayerNorm's normalisation stays for its row kernel), and ``p`` has at most
    :data:`MAX_PROLOGUE_NODES` nodes."""
    size = len(p.nodes) if prologues and len(p.nodes) <= MAX_PROLOGUE_NODES else None
    plain = size is not None and not any(n.op in TRANSCENDENTAL for n in p.nodes) and \
        not any(v.producer is not None and ops.kind(v.producer.op) == "reduce" for v in p.inputs)
    reached = {id(p.output)}
    for n in t.nodes:
        hit = [i for i, x in enumerate(n.inputs) if id(x) in reached]
        if not hit:
            continue
        if hit == [0] and (n.op == "MatMulNBits" and size is not None or n.op == "MatMul" and plain):
            continue  # its result does not carry v's elements one to one: what follows may read it freely
        if not (ops.kind(n.op) in INLINE_INTO or _moves_only(n) or n.op in ("TensorScatter", "Gather") and hit == [1 if
                n.op == "TensorScatter" else 0]):
            return False
        reached.update(id(o) for o in n.outputs)
    return True


def _generated(p: Group) -> bool:
    """Whether group ``p`` computes its output from indices and run-time dims alone (generators such as ``Iota`` and
    ``SymConst``, and elementwise and index-only nodes over them; no buffer read, no transcendental function)."""
    return _buffers(p.inputs) == 0 and all(ops.kind(n.op) in ("generator", *FUSIBLE) or n.op in INDEX_ONLY
                                           for n in p.nodes) and \
        any(ops.kind(n.op) == "generator" for n in p.nodes) and not any(n.op in TRANSCENDENTAL for n in p.nodes)


def _reads_own_output(t: Group, p: Group) -> bool:
    """Whether inlining ``p`` into ``t`` would make ``t`` read the buffer it writes: an in-place TensorScatter whose
    update is computed from its own cache (a run counter's ``counter + 1``). One dispatch may not bind a buffer both
    read-only and read-write (WebGPU's usage scope rules), so ``p`` stays a kernel of its own."""
    last = t.nodes[-1]
    return last.op == "TensorScatter" and bool(last.attrs.get("in_place")) and any(v is last.inputs[0]
                                                                                   for v in p.inputs)


def _places_stores(n: Node, v: Value) -> bool:
    """Whether ``n`` is a :data:`STORES` op reading ``v`` as an operand that places its stores: a store view's
    coordinates read their buffers as they are (no producer is inlined into them)."""
    return n.op in STORES and any(x is v for x in n.inputs[1:])


def _moves_only(n: Node) -> bool:
    """Whether node ``n`` only moves elements (:data:`INDEX_ONLY`, or a Gather at constant indices)."""
    return n.op in INDEX_ONLY or n.op == "Gather" and n.inputs[1].is_const and not n.inputs[1].is_shape_const


def inline_index(graph: Graph, groups: list[Group], max_inputs: int = 7, reshapes: bool = True) -> list[Group]:
    """Inline groups of index-only nodes (:data:`INDEX_ONLY`: Transpose, Slice) into every group that reads them.

    Such a node computes nothing: its kernel only copies elements to new places, and a consumer can as
    well read each element where it lies (TVM inlines injective producers into matmuls and reductions
    alike). A decoder step's attention then reads its KV cache in place: the slice of the first
    ``past + sequence`` rows and the keys' transpose become index arithmetic in the matmul's loads, and the
    transpose of new keys and values into the cache's layout happens in the scatter's loads.

    A group is inlined when all its nodes are index-only, its output is not a graph output, and every
    group reading it, directly or through views (alias groups, which are inlined with it), is a kernel
    (not a view or a control step) that stays within ``max_inputs`` buffers and
    :data:`MAX_INLINED_NODES` nodes. Repeats until nothing changes, so chains (Slice, then Transpose)
    collapse into their consumers. Without ``reshapes``, a Reshape (in the group or a view after it) is not inlined
    into a matmul or convolution: its index arithmetic (a division by a run-time dim, per operand load) costs a
    CPU's inner loop more than the copy it saves (SmolLM2's prefill on wasm: 4.2 s against 3.1 s); a GPU's loads
    wait on memory either way.

    With ``reshapes`` (GPUs), groups computed from indices alone (:func:`_generated`: a decoder's mask positions from
    ``Iota`` and the run-time dims) are inlined the same way: a few integer operations redone where they are read
    cost less than a buffer written and read back, and leave the attention kernel a buffer binding to spare.
    """
    uses = graph.consumers()
    outputs = {id(v) for v in graph.outputs}
    changed = True
    while changed:
        changed = False
        group_of: dict[int, list[Group]] = {}
        for g in groups:
            for n in g.nodes:
                group_of.setdefault(id(n), []).append(g)
        for p in groups:
            if p.alias or p.rows or id(p.output) in outputs or \
                    any(n.op not in INDEX_ONLY for n in p.nodes) and not (reshapes and _generated(p)):
                continue
            plan = _index_readers(p, uses, group_of, outputs)
            if plan is None:
                continue
            views, targets = plan
            if not reshapes and (views or any(n.op == "Reshape" for n in p.nodes)) and \
                    any(ops.kind(n.op) in CONTRACTIONS for t in targets for n in t.nodes):
                continue
            merged = []
            for t in targets:
                read = [a for a in views if any(id(r) in {id(n) for n in t.nodes}
                                                for r in uses.get(id(a.output), []))]
                gone = {id(p.output), *(id(a.output) for a in read)}
                inputs = list(dict.fromkeys([*p.inputs, *(v for v in t.inputs if id(v) not in gone)]))
                nodes = [*p.nodes, *(n for a in read for n in a.nodes)]
                if _buffers(inputs) > max_inputs or len(nodes) + len(t.nodes) > MAX_INLINED_NODES:
                    break
                merged.append((t, nodes, inputs))
            else:
                for t, nodes, inputs in merged:
                    t.nodes[:0] = nodes
                    t.inputs = inputs
                for g in [p, *views]:
                    groups.remove(g)
                changed = True
                break
    return groups


def _index_readers(p: Group, uses: dict, group_of: dict, outputs: set[int]) -> tuple[list[Group], list[Group]] | None:
    """For :func:`inline_index`: the views (alias groups) reading ``p``'s output and the kernel groups reading it
    or those views, or ``None`` where a reader cannot take it inlined (a control step, a view that is a graph
    output or is read by another view)."""
    views: list[Group] = []
    targets: dict[int, Group] = {}
    for r in uses.get(id(p.output), []):
        if _places_stores(r, p.output):
            return None
        for g in group_of[id(r)]:
            if g is p or any(ops.kind(n.op) == "control" for n in g.nodes):
                return None
            if not g.alias:
                targets[id(g)] = g
                continue
            if id(g.output) in outputs or not uses.get(id(g.output)):
                return None
            views.append(g)
            for r2 in uses[id(g.output)]:
                if _places_stores(r2, g.output):
                    return None
                for g2 in group_of[id(r2)]:
                    if g2.alias or any(ops.kind(n.op) == "control" for n in g2.nodes):
                        return None
                    targets[id(g2)] = g2
    return (views, list(targets.values())) if targets else None


def fuse_rows(graph: Graph, groups: list[Group], supported: Callable[[Group], bool], max_inputs: int = 7) -> list[Group]:
    """Fuse reduction groups into the elementwise group that alone reads their result (see the module docstring).

    A group of a reduction (and the elementwise nodes inlined into it or chained after it) is merged into consumer group
    ``c`` when every node reading its output is in ``c``, the output is not a graph output, ``c`` ends in an
    elementwise node and holds only elementwise and reduction nodes, the merged group stays within
    ``max_inputs`` buffers and :data:`MAX_ROW_NODES` nodes, and ``supported(merged)`` (the target's lowering
    makes it a row kernel: the reductions depend only on output axes the consumer's other axes do not).
    Repeats until nothing changes, so LayerNormalization's mean, then its variance, join the normalisation.
    """
    uses = graph.consumers()
    outputs = {id(v) for v in graph.outputs}
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    changed = True
    while changed:
        changed = False
        producer = {id(g.output): g for g in groups if not g.alias}
        holders = _holders(groups)
        for i, c in enumerate(groups):
            if c.alias or ops.kind(c.nodes[-1].op) not in FUSIBLE or \
                    any(ops.kind(n.op) not in INLINE_INTO and not _moves_only(n) for n in c.nodes):
                continue
            mine = {id(n) for n in c.nodes}
            for v in c.inputs:
                p = producer.get(id(v))
                if p is None or p is c or id(v) in outputs or all(ops.kind(n.op) != "reduce" for n in p.nodes) or \
                        any(ops.kind(n.op) not in INLINE_INTO and not _moves_only(n) for n in p.nodes):
                    continue
                if any(id(r) not in mine or holders[id(r)] != {id(c)} for r in uses.get(id(v), [])):
                    continue
                nodes = sorted({id(n): n for n in [*p.nodes, *c.nodes]}.values(), key=lambda n: position[id(n)])
                inputs = list(dict.fromkeys([*p.inputs, *(x for x in c.inputs if x is not v)]))
                if _buffers(inputs) > max_inputs or len(nodes) > MAX_ROW_NODES:
                    continue
                merged = Group(nodes, inputs, rows=True)
                if not supported(merged):
                    continue
                groups[i] = merged
                groups.remove(p)
                changed = True
                break
            if changed:
                break
    return groups


def fuse_attention(graph: Graph, groups: list[Group], supported: Callable[[Group], bool],
                   max_inputs: int = 7) -> list[Group]:
    """Fuse attention's three kernels into one row kernel: a row group (the softmax, from :func:`fuse_rows`) read only
    by the first operand of the ``MatMul`` of group ``c`` (``P V``; no other contraction in ``c``), whose input is the
    output of a group ``q`` holding a ``MatMul`` (the scores ``Q K^T``, masked and scaled) that only the row group
    reads. The merged group is kept when
    it stays within ``max_inputs`` buffers and :data:`MAX_ROW_NODES` nodes and ``supported(merged)`` (its lowering is a
    row kernel whose scores are a stage and whose output a column reduction: :mod:`kiln.te.rows`; few query rows, as a
    decode step has). Over static shapes the merged group replaces the three. Over run-time dims it is added after
    them as their *alternative* (``alternative_to``): one workgroup a query row wins where rows and keys are few (a
    decode step early in a conversation) and loses where they are many (a prefill, a long context), so the target's
    plan runs the one kernel there and the three elsewhere (:mod:`kiln.codegen.webgpu.build`)."""
    uses = graph.consumers()
    outputs = {id(v) for v in graph.outputs}
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    producer = {id(g.output): g for g in groups if not g.alias}
    holders = _holders(groups)
    for p in [g for g in groups if g.rows]:
        readers = uses.get(id(p.output), [])
        if id(p.output) in outputs or len(readers) != 1 or readers[0].op != "MatMul" or readers[0].inputs[0] is not \
                p.output:
            continue
        c = next((g for g in groups if readers[0] in g.nodes and not g.alias), None)
        scores = [producer.get(id(v)) for v in p.inputs]
        q = next((g for g in scores if g is not None and any(n.op == "MatMul" for n in g.nodes)), None)
        if c is None or q is None or any(ops.kind(n.op) in CONTRACTIONS for n in c.nodes if n is not readers[0]) or \
                id(q.output) in outputs or any(holders.get(id(r)) != {id(p)} for r in uses.get(id(q.output), [])) or \
                holders.get(id(readers[0])) != {id(c)}:
            continue
        nodes = sorted({id(n): n for n in [*q.nodes, *p.nodes, *c.nodes]}.values(), key=lambda n: position[id(n)])
        inside = {id(n.outputs[0]) for n in nodes}
        inputs = list(dict.fromkeys(v for g in (q, p, c) for v in g.inputs if id(v) not in inside))
        if _buffers(inputs) > max_inputs or len(nodes) > MAX_ROW_NODES:
            continue
        merged = Group(nodes, inputs, rows=True)
        dynamic = bool(symbolic.symbols([merged.output.shape, *(v.shape for v in inputs)]))
        if dynamic:
            merged.alternative_to = (q, p, c)  # (see the docstring; the target's predicate reads it)
        if not supported(merged):
            continue
        if dynamic:
            groups.insert(groups.index(c) + 1, merged)
        else:
            groups[groups.index(c)] = merged
            for g in (q, p):
                groups.remove(g)
    return groups


#: most output columns of a matmul whose activation's normalisation (:func:`fuse_norm_prologues`) is redone by its
#: every tile: a decoder's projections (960, 3072 for SmolLM2), not its vocabulary's (49152)
MAX_NORM_COLUMNS = 8192


def fuse_norm_prologues(graph: Graph, groups: list[Group], max_inputs: int = 7) -> list[Group]:
    """Add, as an alternative for a decode step, a group of a row statistic and the matrix-vector product that reads
    it in its prologue: RMSNorm's ``1 / sqrt(mean(x^2) + eps)`` (a reduction group whose output only the matmul's
    group reads, through nodes no other group holds, over run-time dims) and the projection after it (a ``MatMulNBits`` of at most
    :data:`MAX_NORM_COLUMNS` columns). Every tile of the merged kernel computes the row's statistic itself beside its
    dot products (the statistic's scale leaves the product's sum, :func:`kiln.arith.expr.hoist_factors`, and the two
    sums share the lanes' loop and combining tree): one kernel instead of two where one token's row is computed
    (``alternative_box``: the dims of the rows at their lowest value), the two where many rows would each redo it."""
    uses = graph.consumers()
    outputs = {id(v) for v in graph.outputs}
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    producer = {id(g.output): g for g in groups if not g.alias and not g.alternative_to}
    holders = _holders(groups)
    for c in [g for g in groups if not g.alias and not g.rows and not g.alternative_to]:
        mm = [n for n in c.nodes if n.op == "MatMulNBits"]
        if len(mm) != 1 or any(ops.kind(n.op) in CONTRACTIONS and n is not mm[0] for n in c.nodes):
            continue
        rows = c.output.shape[:-1]
        dims = symbolic.symbols(list(rows))
        cols = c.output.shape[-1]
        if not dims or symbolic.is_symbolic(cols) or cols > MAX_NORM_COLUMNS:
            continue
        for v in c.inputs:
            p = producer.get(id(v))
            if p is None or p.rows or id(v) in outputs or not any(ops.kind(n.op) == "reduce" for n in p.nodes) or \
                    any(ops.kind(n.op) not in INLINE_INTO for n in p.nodes) or \
                    any(holders.get(id(r)) != {id(c)} for r in uses.get(id(v), [])):
                continue  # (another kernel reads the statistic: a K or V projection beside Q, each its own)
            nodes = sorted({id(n): n for n in [*p.nodes, *c.nodes]}.values(), key=lambda n: position[id(n)])
            inside = {id(n.outputs[0]) for n in nodes}
            inputs = list(dict.fromkeys(x for g in (p, c) for x in g.inputs if id(x) not in inside))
            if _buffers(inputs) > max_inputs or len(nodes) > MAX_INLINED_NODES:
                continue
            merged = Group(nodes, inputs, alternative_to=(p, c), alternative_box=[(d, d.lo, d.lo) for d in dims])
            groups.insert(groups.index(c) + 1, merged)
            break
    return groups
