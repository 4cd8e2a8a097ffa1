"""Eager kernels: tensor expressions lowered, rendered and cached per call signature.

Every eager op runs a kernel generated from the same tensor expressions as the compiler's
(:mod:`kiln.kernels`: ``unary_expr``/``binary_expr``, ``matmul``, ``conv``, ``pool``,
``reduction``, ``transpose``, ``concat``, ...), lowered by :func:`kiln.te.lower.lower` under a
:func:`~kiln.te.schedule.default_schedule` and rendered by :mod:`kiln.codegen.webgpu.wgsl`.

Two kinds of kernel (TensorJS's trick, :func:`elementwise`):

* **shape-generic** elementwise kernels read the element count, the output's strides and dims
  and every operand's strides (0 along broadcast dims) from a uniform buffer, so one kernel
  serves every shape of a given rank. Dims are coalesced first (a same-shape ``x + y`` of any
  rank is rank 1; a bias add over ``(N, C)`` is rank 2), which keeps the number of generic
  kernels small;
* **specialised** kernels have the shapes baked in (the compiler's kernels: constant index
  arithmetic, register tiles for reductions). An elementwise call signature (op, dtypes,
  shapes) gets one after it has been seen :data:`SPECIALIZE_AFTER` times; every other op
  (reductions, matmul, convolution, layout) is always specialised, cached per signature.

Scalar operands are uniforms in both kinds, so ``x * lr`` with a new ``lr`` every step reuses
its kernel. :func:`stats` counts compiles, generic and specialised hits and specialisations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from kiln.arith.expr import Expr, Var, binop, call, cast
from kiln.codegen.webgpu import wgsl
from kiln.eager.device import Pipeline, runtime
from kiln.errors import ShapeError
from kiln.kernels.elementwise import bcast_load
from kiln.te.compute import Tensor, compute, inline, placeholder
from kiln.te.loops import If
from kiln.te.lower import lower
from kiln.te.schedule import Schedule, default_schedule

#: an elementwise signature runs generic kernels this many times before it gets a specialised one
SPECIALIZE_AFTER = 3

#: eager dtypes -> numpy dtype of their buffers (bool is stored as 0/1 in int32, as in packages)
BUFFER_NP = {"float32": np.float32, "int32": np.int32, "bool": np.int32}

#: output extent given to shape-generic kernels: the real element count is a uniform
_GENERIC_EXTENT = 2**31 - 1


def set_specialize_after(k: int) -> int:
    """Specialise an elementwise call signature after ``k`` calls (0: never use generic kernels,
    a huge ``k``: never specialise). Returns the previous value."""
    global SPECIALIZE_AFTER
    old, SPECIALIZE_AFTER = SPECIALIZE_AFTER, int(k)
    return old


def stats() -> dict:
    """Kernel cache counters: ``compiles`` (pipelines built), ``generic_hits`` (calls a compiled
    generic kernel served), ``specialized_hits`` (calls a compiled specialised kernel served),
    ``specializations`` (specialised elementwise kernels built after a signature repeated),
    ``signatures`` (distinct call signatures), ``dispatches``, ``uploads``, ``readbacks``."""
    return runtime().stats.as_dict()


def _buffer_dtype(dtype: str) -> str:
    return "float32" if dtype == "float32" else "int32"


def _load(x: Expr, dtype: str) -> Expr:
    """The value of eager ``dtype`` read from a buffer element (bool is stored as 0/1)."""
    return binop("!=", x, 0) if dtype == "bool" else x


def _store(e: Expr) -> Expr:
    """``e`` as its buffer stores it (bool as 0/1 int32)."""
    return cast(e, "int32") if e.dtype == "bool" else e


def _scalar_expr(word: int, dtype: str) -> Expr:
    """Uniform word ``word`` as a scalar operand of ``dtype``."""
    v = Var(wgsl.uniform(word))
    if dtype == "float32":
        return call("bitcast_f32", v)
    return binop("!=", v, 0) if dtype == "bool" else v


def _scalar_word(value, dtype: str) -> int:
    if dtype == "float32":
        return int(np.array([value], np.float32).view(np.int32)[0])
    return int(bool(value)) if dtype == "bool" else int(value)


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    """numpy's broadcast of ``shapes``.

    Raises:
        ShapeError: shapes that do not broadcast.
    """
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(rank):
        dims = {s[len(s) - rank + k] for s in shapes if len(s) - rank + k >= 0} - {1}
        if len(dims) > 1:
            raise ShapeError(f"shapes {' and '.join(str(tuple(s)) for s in shapes)} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _coalesce(out_shape: tuple[int, ...], shapes: list[tuple[int, ...]]):
    """Output dims and per-operand element strides (0 where broadcast), with size-1 dims dropped and
    neighbouring dims merged wherever every operand is contiguous across them."""
    rank = len(out_shape)
    strides = []
    for s in shapes:
        full = (1,) * (rank - len(s)) + tuple(s)
        st, acc = [0] * rank, 1
        for d in range(rank - 1, -1, -1):
            st[d] = 0 if full[d] == 1 else acc
            acc *= full[d]
        strides.append(st)
    dims: list[int] = []
    cols: list[list[int]] = [[] for _ in shapes]
    for d in range(rank):
        if out_shape[d] == 1:
            continue
        if dims and all(c[-1] == st[d] * out_shape[d] for c, st in zip(cols, strides)):
            dims[-1] *= out_shape[d]
            for c, st in zip(cols, strides):
                c[-1] = st[d]
            continue
        dims.append(out_shape[d])
        for c, st in zip(cols, strides):
            c.append(st[d])
    return dims, cols


def elementwise(name: str, fn: Callable[..., Expr], operands: list, dtypes: list[str]):
    """Run elementwise ``fn`` over ``operands`` with numpy broadcasting.

    Args:
        name: the op's identity in the kernel cache (include attributes that change ``fn``).
        fn: operand expressions -> result expression (for example ``kiln.kernels.elementwise.binary_expr``).
        operands: eager buffers (objects with ``buf``, ``shape``, ``dtype``) or Python scalars.
        dtypes: the expression dtype of each operand (``float32``, ``int32``, ``bool``).

    Returns:
        ``(buffer, shape, dtype)`` of the result.
    """
    rt = runtime()
    is_t = [not isinstance(o, (int, float, bool, np.number)) for o in operands]
    tensors = [o for o, t in zip(operands, is_t) if t]
    out_shape = broadcast_shapes(*(o.shape for o in tensors))
    desc = tuple((dt, tuple(o.shape)) if t else (dt, None) for o, t, dt in zip(operands, is_t, dtypes))
    sig = ("ew", name, desc)
    seen = rt.stats.signatures.get(sig, 0) + 1
    rt.stats.signatures[sig] = seen
    scalars = [_scalar_word(o, dt) for o, t, dt in zip(operands, is_t, dtypes) if not t]
    size = int(np.prod(out_shape, dtype=np.int64))
    p = rt.pipelines.get(sig)
    if p is not None:
        rt.stats.specialized_hits += 1
    elif seen > SPECIALIZE_AFTER:
        p = rt.pipelines[sig] = _specialised(name, fn, desc, out_shape)
        rt.stats.specializations += 1
    if p is not None:
        if size == 0:
            return rt.empty(0), out_shape, p.out_dtype
        out = rt.empty(size * 4)
        rt.dispatch(p, [tensors[i].buf for i in p.order] + [out], p.groups, np.array(scalars, np.int32))
        return out, out_shape, p.out_dtype
    dims, cols = _coalesce(out_shape, [o.shape for o in tensors])
    gkey = ("generic", name, tuple(dt if t else (dt, "scalar") for t, dt in zip(is_t, dtypes)), len(dims))
    p = rt.pipelines.get(gkey)
    if p is None:
        p = rt.pipelines[gkey] = _generic(name, fn, is_t, dtypes, len(dims))
    else:
        rt.stats.generic_hits += 1
    if size == 0:
        return rt.empty(0), out_shape, p.out_dtype
    ostrides, acc = [], 1
    for d in reversed(dims):
        ostrides.append(acc)
        acc *= d
    words = [size, *reversed(ostrides), *dims, *(s for c in cols for s in c), *scalars]
    out = rt.empty(size * 4)
    groups = Schedule().dispatch(size)
    rt.dispatch(p, [tensors[i].buf for i in p.order] + [out], groups, np.array(words, np.int32))
    return out, out_shape, p.out_dtype


def _generic(name: str, fn, is_t: list[bool], dtypes: list[str], rank: int) -> Pipeline:
    """The shape-generic kernel of ``fn`` for coalesced rank ``rank`` (layout of its uniform words:
    element count, output strides, output dims, each tensor operand's strides, scalar operands)."""
    n_t = sum(is_t)
    u = [Var(wgsl.uniform(w)) for w in range(1 + 2 * rank + n_t * rank)]
    ostride, dims = u[1:1 + rank], u[1 + rank:1 + 2 * rank]
    phs = {}

    def body(i):
        coords = []
        for d in range(rank):  # the last output stride is 1; the first coordinate needs no modulo (i < n)
            c = i if d == rank - 1 else i // ostride[d]
            coords.append(c % dims[d] if d > 0 else c)
        args, k, s = [], 0, 0
        for t, dt in zip(is_t, dtypes):
            if t:
                ph = phs[k] = placeholder((_GENERIC_EXTENT,), _buffer_dtype(dt), f"x{k}")
                off = 0
                for d in range(rank):
                    off = off + coords[d] * u[1 + 2 * rank + k * rank + d]
                args.append(_load(ph[off], dt))
                k += 1
            else:
                args.append(_scalar_expr(1 + 2 * rank + n_t * rank + s, dt))
                s += 1
        return _store(fn(*args))

    t = compute((_GENERIC_EXTENT,), body, name)
    out_dtype = _eager_dtype(fn, dtypes)
    k = lower(t, Schedule(), name=_ident(name))
    k.body = [If(binop("<", k.gid, u[0]), k.body)]
    index = {id(ph): j for j, ph in phs.items()}
    words = len(u) + (len(is_t) - n_t)
    p = runtime().compile(wgsl.render(k, f"{name}, shape-generic rank {rank}", uniform_words=words),
                          k.schedule.workgroup_size, True, words)
    p.order = [index[id(ph)] for ph in k.inputs]
    p.out_dtype = out_dtype
    return p


def _specialised(name: str, fn, desc, out_shape) -> Pipeline:
    """The elementwise kernel of ``fn`` with shapes ``desc`` baked in (scalars stay uniforms)."""
    phs = {}
    dtypes = [dt for dt, _ in desc]
    for k, (dt, shape) in enumerate(o for o in desc if o[1] is not None):
        phs[k] = (placeholder(shape, _buffer_dtype(dt), f"x{k}"), dt)

    def body(*i):
        args, k, s = [], 0, 0
        for dt, shape in desc:
            if shape is not None:
                ph, _ = phs[k]
                args.append(_load(bcast_load(ph, i, ph.dtype), dt))
                k += 1
            else:
                args.append(_scalar_expr(s, dt))
                s += 1
        return _store(fn(*args))

    t = compute(out_shape, body, name)
    words = sum(1 for _, shape in desc if shape is None)
    p = _compile_tensor(t, name, words)
    index = {id(ph): j for j, (ph, _) in phs.items()}
    p.order = [index[id(ph)] for ph in p.inputs]
    p.out_dtype = _eager_dtype(fn, dtypes)
    return p


def _eager_dtype(fn, dtypes: list[str]) -> str:
    """The eager dtype ``fn`` returns for operands of ``dtypes`` (traced on throwaway variables)."""
    args = [Var(f"a{k}", 0, _buffer_dtype(dt)) for k, dt in enumerate(dtypes)]
    return fn(*(_load(a, dt) for a, dt in zip(args, dtypes))).dtype


def _ident(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)[:40] or "k"


def _compile_tensor(t: Tensor, name: str, uniform_words: int = 0, schedule: Schedule | None = None) -> Pipeline:
    """Lower (default schedule for the runtime's device class), render and compile computed tensor ``t``."""
    rt = runtime()
    t = inline(t)
    sched = schedule or default_schedule(t, device_class=rt.device_class)
    k = lower(t, sched, name=_ident(name))
    p = rt.compile(wgsl.render(k, name, uniform_words=uniform_words), sched.workgroup_size, False, uniform_words)
    p.inputs = k.inputs
    p.groups = k.dispatch
    return p


def run(name: str, key, build: Callable[..., Tensor], inputs: list, out_dtype: str | None = None):
    """Run a specialised kernel: ``build(*placeholders)`` gives the computed tensor expression.

    Args:
        name: op name (kernel comment and cache key).
        key: hashable attributes that change the expression (strides, axes...), part of the cache key.
        build: placeholders (one per input, of the input's shape and buffer dtype) -> computed ``Tensor``.
        inputs: eager buffers (``buf``, ``shape``, ``dtype``).
        out_dtype: the result's eager dtype (default: the expression's; ``bool`` when a result is stored 0/1).

    Returns:
        ``(buffer, shape, dtype)`` of the result.
    """
    rt = runtime()
    sig = ("op", name, key, tuple((x.dtype, tuple(x.shape)) for x in inputs))
    rt.stats.signatures[sig] = rt.stats.signatures.get(sig, 0) + 1
    p = rt.pipelines.get(sig)
    if p is None:
        phs = [placeholder(x.shape, _buffer_dtype(x.dtype), f"x{k}") for k, x in enumerate(inputs)]
        views = [ph if x.dtype != "bool" else compute(ph.shape, lambda *i, ph=ph: _load(ph[i], "bool"), ph.name)
                 for ph, x in zip(phs, inputs)]
        t = build(*views)
        dtype = out_dtype or t.dtype
        if t.dtype == "bool":
            t = compute(t.shape, lambda *i, t=t: _store(t[i]), t.name)
        if t.size == 0:  # nothing to compute: no kernel
            p = rt.pipelines[sig] = Pipeline("", None, None, 0, False)
        else:
            p = rt.pipelines[sig] = _compile_tensor(t, name)
        p.order = [next(j for j, ph in enumerate(phs) if ph is q) for q in p.inputs]
        p.out_dtype, p.out_shape = dtype, tuple(t.shape)
    else:
        rt.stats.specialized_hits += 1
    size = int(np.prod(p.out_shape, dtype=np.int64))
    out = rt.empty(size * 4)
    if size:
        rt.dispatch(p, [inputs[i].buf for i in p.order] + [out], p.groups)
    return out, p.out_shape, p.out_dtype
