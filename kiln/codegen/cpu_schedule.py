"""CPU schedules of the C targets (wasm, cpu): tiles for one core, with the grid's innermost axis whole for the
lane vectorisers (:mod:`kiln.codegen.wasm.simd`, :mod:`kiln.codegen.cpu`)."""

from __future__ import annotations

from kiln.arith.expr import Load, Var, free_vars, transform
from kiln.arith.symbolic import Dim, at_opt, ceil_div, is_symbolic
from kiln.codegen.lowering import group_expr
from kiln.errors import KilnError
from kiln.passes.fusion import Group
from kiln.te.compute import Tensor
from kiln.te.cpu_rows import cpu_row_plan
from kiln.te.rows import analyse_rows
from kiln.te.schedule import Schedule, Split, reduction_size, reductions, reuse_axes, tile_axes


def grid_shape(shape: tuple[Dim, ...], schedule: Schedule) -> tuple[Dim, ...]:
    """The tile grid of an output of ``shape`` under ``schedule`` (split axes divided, rounded up; a run-time
    extent gives a size expression), as :func:`kiln.te.lower.lower` unravels the invocation index over it."""
    splits = {s.axis: s.factor for s in schedule.splits if s.factor > 1 and (is_symbolic(shape[s.axis])
                                                                              or shape[s.axis] > 1)}
    return tuple(ceil_div(d, splits[a]) if a in splits else d for a, d in enumerate(shape))


def reads_rows_across(t: Tensor, lanes: int) -> bool:
    """Whether ``t``'s reductions read rows along their axis but not along the output's: float32 sums over one
    innermost axis of a static multiple of ``lanes`` (four vectors or more), some load inside indexed last by that
    axis itself, and none indexed last by anything varying along the output's innermost non-1 axis. Lanes over
    neighbouring tiles would then gather a scalar per lane (a matrix product with its right operand transposed:
    a tied embedding's output projection, attention scores against a key cache); lanes over the reduction read
    whole vectors (``simd_reduce``)."""
    found = reductions(t)
    if not found or any(r.op != "sum" or r.dtype != "float32" for r in found) or len({r.axes for r in found}) != 1:
        return False
    axis = found[0].axes[-1]
    if is_symbolic(axis.extent) or axis.extent % lanes or axis.extent < 4 * lanes:
        return False
    loads: list[Load] = []
    for r in found:
        transform(r.body, lambda y: loads.append(y) if isinstance(y, Load) else None)
    dims = [a for a, d in enumerate(t.shape) if is_symbolic(d) or at_opt(d) > 1]
    inner = t.axes[dims[-1]] if dims else None
    along = any(ld.indices and isinstance(ld.indices[-1], Var) and ld.indices[-1].name == axis.name for ld in loads)
    across = inner is not None and any(ld.indices and inner in free_vars(ld.indices[-1]) for ld in loads)
    return along and not across


def cpu_schedule(t: Tensor, lanes: int = 4, unroll: int = 8, share_rows: bool = True) -> Schedule:
    """The CPU schedule of ``t`` for the C targets (wasm, cpu): no reduce lanes, no workgroups.

    Four neighbouring tiles along the grid's innermost axis run as the lanes of a SIMD128
    vector, so that axis stays whole (a strided split of it keeps each element's columns
    contiguous): reductions of 9 iterations and more (a 3x3 window and up) tile the innermost axis
    by 2 when that leaves a multiple of 4 columns per element, and the other axis with
    complementary load reuse (output channels of a convolution, rows of a matrix product) by
    ``32 / lanes`` (8 for SIMD128's 4 lanes: 16 vector accumulators a tile; 4 for the cpu target's 8 lanes),
    or by 8 when the innermost is not tiled: each input vector used that many times. (8 rows rather than 4
    took Whisper's encoder from 2072 to 1833 ms a window and MobileNet from 34.9 to 30.7 ms in Chromium's
    wasm, one thread.) When the innermost extent is no multiple of 4, vectors run across its rows
    (:func:`kiln.codegen.wasm.simd.vector_body`), so the axis outside it is not tiled. Windows up to 9 iterations
    unroll fully; longer reductions unroll by their largest divisor up to ``unroll`` (8; the wasm target's
    :data:`kiln.codegen.wasm.toolchain.WASM_UNROLL` is 3, see there).

    Sums read along their rows (:func:`reads_rows_across`: ``simd_reduce``) compute four outputs a tile, which share
    their other operand, with ``share_rows``, else one (the wasm target: see
    :func:`kiln.codegen.wasm.toolchain.wasm_schedule`).

    A run-time dim is taken at its ``opt`` value (a decoder's ``sequence`` at 1: decode steps get the schedule
    made for them, and prefill steps a variant scheduled at a larger value, :func:`kiln.codegen.target.variant_values`);
    a run-time innermost axis is never split (vectors need rows of a known width).
    """
    if t.attrs.get("rows"):  # a fused row kernel (a Softmax, a LayerNormalization): a row a tile, vectors along it
        return Schedule(rows=True, simd_reduce=lanes)
    if reduction_size(t) < 9:
        return Schedule()
    if reads_rows_across(t, lanes):  # lanes over the reduction (four outputs a tile sharing their other operand)
        dims = [a for a, d in enumerate(t.shape) if is_symbolic(d) or at_opt(d) > 1]
        inner = dims[-1] if dims else -1
        share = share_rows and inner in reuse_axes(t) and not is_symbolic(t.shape[inner]) and t.shape[inner] % 4 == 0
        return Schedule(splits=(Split(inner, 4, contiguous=True),) if share else (), simd_reduce=lanes, unroll=unroll)
    axes = tile_axes(t)
    shape = [at_opt(d) for d in t.shape]
    dims = [a for a, d in enumerate(shape) if d > 1]
    inner = dims[-1] if dims else -1
    second = dims[-2] if len(dims) > 1 else -1
    split_inner = (inner in axes and not is_symbolic(t.shape[inner])
                   and shape[inner] % (2 * lanes) == 0)  # two vectors a row, each a multiple of lanes
    splits = []
    for a in axes:
        if a == inner:
            if split_inner:
                splits.append(Split(a, 2, contiguous=False))
        elif a == second and shape[inner] % lanes:
            continue  # vectors cross rows of the innermost axis: tiling the row axis would break their contiguity
        else:
            f = min(32 // lanes if split_inner else 8, shape[a])
            if f > 1:
                splits.append(Split(a, f, contiguous=True))
    return Schedule(splits=tuple(splits), unroll=9 if reduction_size(t) <= 9 else unroll)


def cpu_row_kernel(group: Group) -> bool:
    """Whether fused ``group`` lowers as a row kernel of the C targets (:func:`kiln.te.cpu_rows.cpu_row_plan`: a
    Softmax or LayerNormalization along the innermost axis; not attention): the predicate the wasm and cpu targets
    give fusion (:meth:`kiln.codegen.target.Target.row_kernels`)."""
    try:
        t = group_expr(group)
    except KilnError:
        return False
    return not isinstance(cpu_row_plan(analyse_rows(t), t), str)
