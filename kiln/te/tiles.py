"""Workgroup-shared operand tiles for contractions (the schedule knob ``shared_k``).

A *contraction* is a kernel whose one reduction is ``sum_k P * Q``, where factor ``P`` varies
along one register-tiled output axis (rows, ``a``) but not the other (columns, ``b``) and ``Q``
the other way round: MatMul and Gemm (``P = A[i, k]``, ``Q = B[k, j]``), a 1x1 convolution, and a
k x k convolution as an implicit GEMM (``P`` the padded input window, ``Q`` the weights, the
reduction axes ``(ci, kh, kw)`` flattened into one ``k``). The factors are arbitrary expressions
(a fused transpose, a padding select), evaluated where they are loaded.

Under ``Schedule(shared_k=KC)`` each workgroup computes a block of ``TY * fa`` rows by ``TX * fb``
columns (``TX * TY = workgroup_size`` invocations, each a register tile of ``fa x fb``) at fixed
values of the other output axes. For each chunk of ``KC`` reduction iterations the workgroup
stores ``P`` over its rows and ``Q`` over its columns into workgroup arrays (zero outside the
extents, so any M, N, K works, run-time dims included), ``workgroupBarrier()``, every invocation
accumulates its tile from workgroup memory, barrier, next chunk. As in the classic blocked
SGEMM (Volkov and Demmel, "Benchmarking GPUs to tune dense linear algebra", SC 2008), each
operand element read from the storage buffer then feeds ``TX * fb`` (or ``TY * fa``) products.
With ``vector_width`` 4 the tiles are read from workgroup memory as ``vec4`` where a thread's
rows (columns) are contiguous, loaded from storage as ``vec4`` where the operand is contiguous
along the direction the cooperative load walks (:func:`_storage_vector`), and the outputs stored as
``vec4`` where a thread's columns are consecutive outputs.
Barriers sit at the top level of the chunk loop, whose bound is a constant or a dims uniform
(uniform control flow, WGSL §14.2); invocations out of range compute clamped values and do not store.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kiln.arith.expr import (
    FLOATS,
    Bin,
    Cast,
    Const,
    Expr,
    Load,
    Reduce,
    Var,
    binop,
    call,
    cast,
    const,
    free_vars,
    linear,
    select,
    substitute,
    transform,
)
from kiln.arith.symbolic import ceil_div, is_symbolic, simplify
from kiln.te.compute import Tensor
from kiln.te.loops import Assign, Barrier, BufLoad, Decl, For, If, Lane, Let, Store, Vec, VecLoad, unravel

if TYPE_CHECKING:
    from kiln.te.schedule import Schedule, Split

#: bytes per element of a workgroup array
_ITEMSIZE = {"float32": 4, "float16": 2, "int32": 4}

#: extra words per row of a workgroup array written reduction-fastest (fewer bank conflicts on the stores)
PAD = 4


@dataclass(frozen=True)
class Contraction:
    """How a kernel is a contraction under a schedule (see the module docstring).

    Attributes:
        reduce: the kernel's one reduction (``sum`` of ``P * Q``).
        rows, cols: the :class:`Split` of output axis ``a`` (varies ``P``) and of ``b`` (varies ``Q``).
        p, q: the factors over ``rows`` and over ``cols``; ``p_first``: ``P`` is the left operand.
        tx, ty: invocations of a workgroup along columns and along rows.
    """

    reduce: Reduce
    rows: Split
    cols: Split
    p: Expr
    q: Expr
    p_first: bool
    tx: int
    ty: int
    row_axis: Var
    col_axis: Var

    def block(self) -> tuple[int, int]:
        """Output rows and columns one workgroup computes."""
        return self.ty * self.rows.factor, self.tx * self.cols.factor


def threads(workgroup_size: int) -> tuple[int, int]:
    """``(tx, ty)``: a power-of-two workgroup as columns x rows, columns the larger (16 x 16 for 256,
    16 x 8 for 128, 8 x 8 for 64, 8 x 4 for 32)."""
    tx = 1 << ((workgroup_size.bit_length()) // 2)
    return tx, workgroup_size // tx


def analyse(out: Tensor, schedule: Schedule, shared_bytes: int = 16384) -> Contraction | str:
    """The :class:`Contraction` of ``out`` (canonical, producers inlined) under ``schedule``, or why it is none.

    Needs: one distinct reduction, a ``sum`` of a product; exactly two splits (factor > 1), one
    per factor's axis; a power-of-two workgroup of at least 4; float operands; and the two
    workgroup arrays within ``shared_bytes`` (WebGPU's ``maxComputeWorkgroupStorageSize``).
    """
    found: dict = {}

    def visit(x):
        if isinstance(x, Reduce):
            found.setdefault(x, None)
            return x
        return None

    transform(out.body, visit)
    if len(found) != 1:
        return f"{len(found)} reductions (a contraction has one)"
    (r,) = found
    if r.op != "sum" or not isinstance(r.body, Bin) or r.body.op != "*":
        return "the reduction is not a sum of products"
    if r.dtype not in FLOATS:
        return f"{r.dtype} accumulation"
    nested: list = []
    transform(r.body, lambda x: nested.append(x) if isinstance(x, Reduce) else None)
    if nested:
        return "a nested reduction"
    wg = schedule.workgroup_size
    if wg < 4 or wg & (wg - 1):
        return f"workgroup size {wg} is not a power of two of at least 4"
    splits = [s for s in schedule.splits if s.factor > 1]
    if len(splits) != 2 or splits[0].axis == splits[1].axis:
        return "shared tiles need a register tile over two output axes"
    first, second = sorted(splits, key=lambda s: s.axis)
    ax1, ax2 = out.axes[first.axis], out.axes[second.axis]
    left, right = r.body.a, r.body.b
    dl, dr = free_vars(left), free_vars(right)
    if ax1 in dl and ax2 not in dl and ax2 in dr and ax1 not in dr:
        p, q, p_first = left, right, True
    elif ax1 in dr and ax2 not in dr and ax2 in dl and ax1 not in dl:
        p, q, p_first = right, left, False
    else:
        return "each factor of the product must vary along exactly one of the two split axes"
    tx, ty = threads(wg)
    c = Contraction(r, first, second, p, q, p_first, tx, ty, ax1, ax2)
    need = shared_size(c, schedule.shared_k)
    if need > shared_bytes:
        return f"{need} bytes of workgroup memory; the limit is {shared_bytes}"
    return c


def _k_fastest(f: Expr, axis: Var) -> bool:
    """Whether a cooperative load of factor ``f`` should walk the reduction fastest: its first
    load's innermost index does not vary along the output ``axis`` (``A[i, k]``, weights ``W[co, ci]``)."""
    loads: list[Load] = []
    transform(f, lambda x: loads.append(x) if isinstance(x, Load) else None)
    return bool(loads) and axis not in free_vars(loads[0].indices[-1])


def _row_strides(c: Contraction) -> tuple[int, int]:
    """Words per reduction step of the ``P`` and ``Q`` workgroup arrays (block width plus padding)."""
    ba, bb = c.block()
    return (ba + (PAD if _k_fastest(c.p, c.row_axis) else 0), bb + (PAD if _k_fastest(c.q, c.col_axis) else 0))


def shared_size(c: Contraction, kc: int) -> int:
    """Bytes of workgroup memory the two operand tiles of a chunk of ``kc`` iterations take."""
    sp, sq = _row_strides(c)
    return kc * (sp * _ITEMSIZE.get(c.p.dtype, 4) + sq * _ITEMSIZE.get(c.q.dtype, 4))


def _storage_vector(f: Expr, axis: Var, r_axes, kfast: bool, extent, width: int, kc: int, w: int) -> int:
    """``w`` if factor ``f``'s tile can be loaded from storage as ``w``-vectors, else 1.

    ``f`` must be a plain float32 placeholder load, or a float16 one widened to f32 (``--precision fp16``: loaded as
    ``vec4<f16>``, widened lane by lane), whose innermost index is exactly the direction
    the cooperative load walks fastest (the reduction axis, or the tile's output ``axis``), not
    used by its other indices; that innermost dim, and the walked extent, static multiples of
    ``w`` (so a vector lies wholly inside or outside the extents, and starts aligned). Along the reduction
    ``k % c`` also qualifies, ``c`` a multiple of ``w``, where the other indices see ``k`` only as ``k // c``
    (a head-merged operand, :func:`kiln.kernels.layout.reshape_index`).
    """
    f = _widened_half(f) or f
    if w == 1 or not isinstance(f, Load) or f.dtype not in ("float32", "float16") or not f.tensor.is_placeholder:
        return 1
    last, dim = f.indices[-1], f.tensor.shape[-1]
    if is_symbolic(dim) or dim % w:
        return 1
    if kfast:
        k = r_axes[0] if len(r_axes) == 1 else None
        if k is None or kc % w or is_symbolic(k.extent) or k.extent % w:
            return 1
        # k itself, or k % c (a head-merged operand: [b, s, h * d] read from [b, h, s, d]) whose other indices see k
        # only as k // c: w consecutive iterations from a multiple of w stay in one run of c
        blocks = _blocks_of(k, last, w)
        if blocks is None or any(k in free_vars(transform(i, blocks)) for i in f.indices[:-1]):
            return 1
        return w
    ok = last == axis and width % w == 0 and not is_symbolic(extent) and extent % w == 0
    return w if ok and not any(last in free_vars(i) for i in f.indices[:-1]) else 1


def _blocks_of(k: Var, last: Expr, w: int):
    """For an innermost index ``last`` that is ``k``, or ``k % c`` with ``c`` a multiple of ``w``: a :func:`transform`
    function that hides ``k // c`` (the run's number) from the other indices; ``None`` for any other index."""
    if last == k:
        c = None
    elif isinstance(last, Bin) and last.op == "%" and last.a == k and isinstance(last.b, Const) and \
            last.b.value % w == 0:
        c = last.b.value
    else:
        return None

    def hide(x):
        if c is not None and isinstance(x, Bin) and x.op == "//" and x.a == k and isinstance(x.b, Const) and \
                x.b.value == c:
            return const(0, "int32")
        return None
    return hide


def lower_shared(out: Tensor, c: Contraction, schedule: Schedule, flatten, cse, counter):
    """Statements, total invocations and workgroup arrays of ``out`` under contraction ``c``.

    ``flatten(e, guarded)`` and ``cse(values, block)`` are :mod:`kiln.te.lower`'s load flattening
    and load common-subexpression elimination. Returns ``(body, total, shared, vectors)``: ``body`` binds
    everything from the builtins ``lid`` (local invocation index) and ``wid`` (flat workgroup
    index); ``total`` is the invocations of the dispatch (workgroups times ``workgroup_size``);
    ``vectors`` names the workgroup arrays read as vectors (``schedule.vector_width``).
    """
    wg, kc = schedule.workgroup_size, schedule.shared_k
    r = c.reduce
    a, b = c.rows.axis, c.cols.axis
    fa, fb = c.rows.factor, c.cols.factor
    ba, bb = c.block()
    A, B = out.shape[a], out.shape[b]
    K = simplify(_prod(ax.extent for ax in r.axes))
    grid = [ceil_div(A, ba) if q == a else ceil_div(B, bb) if q == b else d for q, d in enumerate(out.shape)]
    n_groups = simplify(_prod(grid))
    lid, wid = Var("lid"), Var("wid")
    blk, ta, tb, kv0 = Var("blk"), Var("ta"), Var("tb"), Var("kc")
    grid_vars = [Var("ba") if q == a else Var("bb") if q == b else ax for q, ax in enumerate(out.axes)]
    body: list = [Let(blk, call("min", wid, n_groups - 1)), Let(tb, lid % c.tx), Let(ta, lid // c.tx)]
    body += unravel(blk, grid_vars, grid, n_groups)
    row0, col0 = grid_vars[a] * ba, grid_vars[b] * bb

    rows = [c.rows.offset(ta, c.ty, i) for i in range(fa)]
    cols = [c.cols.offset(tb, c.tx, j) for j in range(fb)]
    acc_dtype = r.dtype
    accs = {}
    for i, j in itertools.product(range(fa), range(fb)):
        v = Var(f"acc{next(counter)}", 0, acc_dtype)
        body.append(Decl(v, const(0.0, acc_dtype)))
        accs[i, j] = v
    loop = For(kv0, ceil_div(K, kc))
    body.append(loop)
    arrays = {}
    w = schedule.vector_width
    # workgroup arrays read as vectors: those whose invocations' rows (columns) are contiguous
    vectors: dict[str, int] = {name: w for name, split in (("sh_p", c.rows), ("sh_q", c.cols))
                               if w > 1 and vector_split(split, w)}
    strides = _row_strides(c)
    operands = (("sh_p", c.p, out.axes[a], A, ba, row0, strides[0]), ("sh_q", c.q, out.axes[b], B, bb, col0, strides[1]))
    for name, f, _, _, width, _, stride in operands:
        arrays[name] = (f.dtype, kc * stride, stride)
    decls: list = []

    def chunk_loads(kbase: Expr, registers: bool) -> tuple[list, list]:
        """Statements loading the operand tiles of the chunk starting at reduction iteration ``kbase``:
        ``(fetch, store)``; with ``registers`` the fetch assigns registers (declared in ``decls``) and the
        store moves them to workgroup memory, otherwise the fetch stores directly and ``store`` is empty."""
        fetch_all, store_all = [], []
        for name, f, axis, extent, width, origin, stride in operands:
            kfast = stride != width
            dtype = f.dtype
            vl = _storage_vector(f, axis, r.axes, kfast, extent, width, kc, schedule.vector_width)
            fast_n = (kc if kfast else width) // vl  # loads along the contiguous direction of one line
            n = kc * width // vl
            for step in range(-(-n // wg)):
                e = lid + step * wg
                if wg % fast_n == 0:  # the same position along the line for every step of the workgroup
                    fast, slow = lid % fast_n * vl, lid // fast_n + step * (wg // fast_n)
                else:
                    fast, slow = e % fast_n * vl, e // fast_n
                kk, row = (fast, slow) if kfast else (slow, fast)
                xv, kv = origin + row, kbase + kk
                cond = const(True, "bool")
                xc, kcl = xv, kv
                if is_symbolic(extent) or _prod([ceil_div(extent, width), width]) != extent:
                    cond, xc = cond & binop("<", xv, extent), call("min", xv, extent - (1 if kfast else vl))
                if is_symbolic(K) or K % kc:
                    cond, kcl = cond & binop("<", kv, K), call("min", kv, K - (vl if kfast else 1))
                mapping = {axis: xc}
                rem: Expr = kcl
                for m, ax in reversed(list(enumerate(r.axes))):
                    inner = simplify(_prod(x.extent for x in r.axes[m + 1:]))
                    v = rem if m == len(r.axes) - 1 else rem // inner
                    if m:
                        v = v % ax.extent
                    mapping[ax] = v
                value = flatten(substitute(f, mapping), False)
                # an operand widened from f16 (--precision fp16) is fetched as f16 and widened at the store: widening
                # at the fetch would wait for a prefetched load before the products
                raw = value.x if isinstance(value, Cast) else value
                fetch: list = []
                if vl == 1:
                    values, targets = [raw], [kk * stride + row]
                else:  # one vector load of storage, stored element by element
                    vec = Var(f"ld{next(counter)}", 0, raw.dtype)
                    fetch.append(Let(vec, VecLoad(raw.buf, linear(raw.index) // vl, vl, raw.dtype)))
                    vectors[raw.buf] = vl
                    values = [Lane(vec, q, raw.dtype) for q in range(vl)]
                    targets = [(kk + q) * stride + row if kfast else kk * stride + row + q for q in range(vl)]
                if registers:  # the raw loads (masking them here would wait for them before the products)
                    regs = [Var(f"pf{next(counter)}", 0, raw.dtype) for _ in values]
                    decls.extend(Decl(x, const(0.0, raw.dtype)) for x in regs)
                    fetch += [Assign(x, v) for x, v in zip(regs, values)]
                    values = regs
                values = [cast(x, dtype) for x in values]
                if not (isinstance(cond, Const) and cond.value is True):
                    values = [select(cond, x, const(0.0, dtype)) for x in values]
                store: list = []
                if vl > 1 and not kfast and vectors.get(name) == vl:  # consecutive and aligned: one vector store
                    store.append(Store(name, linear(kk * (stride // vl) + row // vl), Vec(tuple(values), dtype)))
                else:
                    store += [Store(name, linear(target), x) for x, target in zip(values, targets)]
                if not registers:
                    fetch, store = fetch + store, []
                partial = (step + 1) * wg > n  # the last step of a tile that does not divide the workgroup
                fetch_all += [If(binop("<", e, n), fetch)] if partial else fetch
                store_all += [If(binop("<", e, n), store)] if partial and store else store
        return fetch_all, store_all

    chunks = ceil_div(K, kc)
    if schedule.prefetch:
        # chunk 0 before the loop; in the loop, the next chunk's loads are issued before this chunk's
        # products (their latency overlaps the arithmetic) and stored once every invocation has read it
        prologue, _ = chunk_loads(const(0, "int32"), False)
        fetch, store = chunk_loads((kv0 + 1) * kc, True)
        body.insert(body.index(loop), If(binop("<", const(0, "int32"), chunks), prologue))
        body[body.index(loop):body.index(loop)] = decls
        more = binop("<", kv0 + 1, chunks)  # uniform: no barrier inside
        loop.body += [Barrier(), If(more, fetch)]
    else:
        fetch, _ = chunk_loads(kv0 * kc, False)
        loop.body += fetch + [Barrier()]
    unroll = max(d for d in range(1, max(1, schedule.unroll) + 1) if kc % d == 0)
    inner = loop.body
    ko = None
    if kc // unroll > 1:
        ko = Var("kk", kc // unroll)
        sub = For(ko, kc // unroll)
        inner.append(sub)
        inner = sub.body
    w = schedule.vector_width

    def reads(name: str, split: Split, t: Var, locals_: list[Expr], kk: Expr, block: list) -> list[Expr]:
        """The tile's values of reduction step ``kk`` from array ``name``: scalars, or whole vectors."""
        dtype, size, stride = arrays[name]
        if name not in vectors:
            return [BufLoad(name, linear(kk * stride + x), size, False, dtype) for x in locals_]
        out = []
        n_threads = c.tx if split is c.cols else c.ty
        for q in range(split.factor // w):
            v = Var(f"{name}{next(counter)}", 0, dtype)
            at = t * (split.factor // w) + q if split.contiguous else t + q * n_threads  # (a group of w: w apart)
            block.append(Let(v, VecLoad(name, linear(kk * (stride // w) + at), w, dtype)))
            out += [Lane(v, lane, dtype) for lane in range(w)]
        return out

    for u in range(unroll):
        kk = ko * unroll + u if ko is not None else const(u, "int32")
        ps = reads("sh_p", c.rows, ta, rows, kk, inner)
        qs = reads("sh_q", c.cols, tb, cols, kk, inner)
        updates = []
        for (i, j), acc in accs.items():
            prod = binop("*", ps[i], qs[j]) if c.p_first else binop("*", qs[j], ps[i])
            updates.append(acc + prod)
        values = cse(updates, inner)
        inner.extend(Assign(acc, v) for acc, v in zip(accs.values(), values))
    loop.body.append(Barrier())
    if schedule.prefetch:
        loop.body.append(If(more, store))
    # epilogue: the fused elementwise tail of every tile element, stored where in range
    ok = binop("<", wid, n_groups)
    results, conds, indices = [], [], []
    for (i, j), acc in accs.items():
        rv, cv = row0 + rows[i], col0 + cols[j]
        vals, clamped, cond = {out.axes[a]: rv, out.axes[b]: cv}, {}, ok
        for ax, v, extent, width in ((out.axes[a], rv, A, ba), (out.axes[b], cv, B, bb)):
            clamped[ax] = v
            if is_symbolic(extent) or _prod([ceil_div(extent, width), width]) != extent:
                cond = cond & binop("<", v, extent)
                clamped[ax] = call("min", v, extent - 1)
        e = substitute(transform(out.body, lambda x, acc=acc: acc if isinstance(x, Reduce) else None), clamped)
        results.append(flatten(e, False))
        conds.append(cond)
        indices.append(linear(_ravel([vals.get(ax, ax) for ax in out.axes], out.shape)))
    results = cse(results, body)
    w = schedule.vector_width
    if (w > 1 and vector_split(c.cols, w) and b == len(out.shape) - 1 and out.dtype in ("float32", "float16")
            and not is_symbolic(B) and B % w == 0):
        # the tile's columns are consecutive outputs, whole vectors in or out of range together: vec4 stores
        vectors["out"] = w
        for i in range(fa):
            for q in range(0, fb, w):
                first = i * fb + q
                items = Vec(tuple(results[first:first + w]), out.dtype)
                body.append(If(conds[first], [Store("out", linear(indices[first]) // w, items)]))
    else:
        for cond, index, value in zip(conds, indices, results):
            body.append(If(cond, [Store("out", index, value)]))
    shared = {name: (dtype, size) for name, (dtype, size, _) in arrays.items()}
    return body, simplify(n_groups * wg), shared, vectors


def _widened_half(f: Expr) -> Load | None:
    """The float16 load ``f`` widens to f32 (an operand of an ``--precision fp16`` kernel), or ``None``."""
    if isinstance(f, Cast) and f.dtype == "float32" and isinstance(f.x, Load) and f.x.dtype == "float16":
        return f.x
    return None


def vector_split(split: Split, w: int) -> bool:
    """Whether an invocation's elements along ``split`` come in whole ``w``-vectors of consecutive elements: a
    contiguous split with a factor ``w`` divides, or groups of exactly ``w``."""
    return split.factor % w == 0 and (split.contiguous or split.group == w)


def _ravel(indices, shape) -> Expr:
    flat: Expr = const(0, "int32")
    for i, d in zip(indices, shape):
        flat = flat * d + i
    return flat


def _prod(xs):
    n = 1
    for x in xs:
        n = n * x
    return n
