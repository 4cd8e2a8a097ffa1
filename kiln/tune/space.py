"""The search space of one kernel's schedule: its knobs, their values, and validity checks.

A kernel's knobs are the fields of :class:`~kiln.te.schedule.Schedule`: the register tile (a
:class:`~kiln.te.schedule.Split` factor per tiled output axis, contiguous or strided), the
workgroup size, the unrolling budget of the innermost reduction loops, the reduce lanes and, for
contractions (MatMul, Gemm, convolutions as implicit GEMMs), the reduction chunk staged through
workgroup memory (``shared_k``, :mod:`kiln.te.tiles`) and whether those tiles are loaded and
read as ``vec4`` (``vector_width``) and whether the next chunk is prefetched into registers (``prefetch``). Other kernels load and store scalars (a tile along the
innermost axis gives the same reuse).

:class:`SearchSpace` lists the values worth trying for one tensor expression, rejects
schedules a device would refuse or that would not fit in registers (:meth:`SearchSpace.check`),
and samples, mutates and crosses schedules for the evolutionary search (:mod:`kiln.tune.search`).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from kiln.te.compute import Tensor, placeholders
from kiln.te.schedule import GEMV_ITERATIONS_PER_LANE, Schedule, Split, reductions, reuse_axes
from kiln.te.tiles import analyse, vector_split

#: register tiles per axis
FACTORS = (1, 2, 4, 8)
#: workgroup sizes (invocations)
WORKGROUP_SIZES = (32, 64, 128, 256)
#: unrolling budgets (innermost reduction iterations written out)
UNROLLS = (1, 2, 3, 4, 8, 9, 16, 27, 32)
#: reduce lanes (128 and 256: what default_schedule gives kernels of few tiles, kiln.te.schedule.FEW_TILES)
LANES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: reduction iterations per chunk of shared operand tiles (0: none)
SHARED_KS = (0, 4, 8, 16)
#: vector widths of shared operand tile reads (with ``shared_k`` only)
VECTOR_WIDTHS = (1, 4)
#: register prefetch of the next chunk (with ``shared_k`` only)
PREFETCH = (False, True)
#: the groups a strided split may keep together (:class:`~kiln.te.schedule.Split`'s ``group``: vec4 groups of a
#: shared-tile product's columns); only where the factor is larger (a group of the whole factor is contiguous)
GROUPS = (4,)


def layouts(factor: int) -> list[tuple[bool, int]]:
    """The ``(contiguous, group)`` layouts a split of ``factor`` may take: strided, contiguous, strided groups."""
    return [(False, 1), (True, 1)] + [(False, g) for g in GROUPS if factor % g == 0 and factor > g]


def _random_split(axis: int, factor: int, rng: random.Random) -> Split:
    """A split of ``axis`` by ``factor`` in a random layout (:func:`layouts`)."""
    return Split(axis, factor, *rng.choice(layouts(factor)))


@dataclass(frozen=True)
class Limits:
    """What a schedule must stay within.

    Attributes:
        workgroup_storage_bytes: workgroup memory per workgroup (WebGPU's default
            ``maxComputeWorkgroupStorageSize``, 16384 bytes).
        invocations: invocations per workgroup (``maxComputeInvocationsPerWorkgroup``, 256).
        accumulators: most accumulators per invocation (register tile elements times the
            kernel's reductions): more spills registers on every GPU seen.
        unrolled_updates: most accumulator updates written out in the innermost loop body
            (accumulators times unrolled iterations): a bound on shader size and compile time.
    """

    workgroup_storage_bytes: int = 16384
    invocations: int = 256
    accumulators: int = 64
    unrolled_updates: int = 2048


class SearchSpace:
    """The schedules worth trying for tensor expression ``t`` (producers inlined).

    Args:
        t: the kernel's expression (:func:`kiln.compiler.group_expr`).
        lanes: whether reduce lanes and shared operand tiles are searched (leave them out for CPU
            adapters, where workgroup barriers are slow and SwiftShader compiles barrier kernels slowly).
        limits: the bounds of :meth:`check`.

    Attributes:
        axes: output axes a register tile may split (at most two at once).
        n_reductions: distinct reductions of ``t`` (each tile element keeps one accumulator each).
    """

    def __init__(self, t: Tensor, lanes: bool = True, limits: Limits = Limits()):
        self.t = t
        self.limits = limits
        self.reds = reductions(t)
        self.n_reductions = len(self.reds)
        shape = t.shape
        if self.reds:
            reuse = sorted(reuse_axes(t))
            candidates = reuse or [a for a, d in enumerate(shape) if d > 1]
        else:
            candidates = [a for a, d in enumerate(shape) if d > 1]
        self.axes: list[int] = candidates[-3:]
        self.factors = {a: tuple(f for f in FACTORS if f == 1 or f <= shape[a]) for a in self.axes}
        self.max_split_axes = 2 if self.reds else 1
        self.unrolls = UNROLLS if self.reds else (1,)
        self.outer_extent = min((r.axes[0].extent for r in self.reds), default=0)
        self.lanes = tuple(n for n in LANES if n == 1 or (lanes and n * GEMV_ITERATIONS_PER_LANE <= self.outer_extent))
        # shared tiles need a contraction (one sum of products over two reuse axes)
        self.shared = SHARED_KS if lanes and len(self.reds) == 1 and len(self.axes) >= 2 else (0,)
        self._analysed: dict = {}
        self._inner_dims = [p.shape[-1] for p in placeholders(t) if p.shape and isinstance(p.shape[-1], int)]

    # ------------------------------------------------------------------ checks
    def tile(self, s: Schedule) -> int:
        """Output elements per register tile under ``s``."""
        return math.prod(sp.factor for sp in s.splits)

    def unrolled_iterations(self, s: Schedule) -> int:
        """Reduction iterations written out in the innermost loop body (as :func:`kiln.te.lower.lower` unrolls)."""
        if s.shared_k:  # the chunk loop, unrolled by the largest divisor of the chunk within the budget
            return max(d for d in range(1, min(s.unroll, s.shared_k) + 1) if s.shared_k % d == 0)
        best = 1
        for r in self.reds:
            axes = r.axes[1:] if s.reduce_lanes > 1 else r.axes
            product = 1
            for ax in reversed(axes):
                if product * ax.extent > s.unroll:
                    break
                product *= ax.extent
            if product == 1 and axes and s.unroll > 1:
                product = max((d for d in range(2, s.unroll + 1) if axes[-1].extent % d == 0), default=1)
            best = max(best, product)
        return best

    def invocations(self, s: Schedule) -> int:
        """Invocations the dispatch launches that do work (tiles times lanes)."""
        tiles = 1
        factor = {sp.axis: sp.factor for sp in s.splits}
        for a, d in enumerate(self.t.shape):
            tiles *= -(-d // factor.get(a, 1))
        return tiles * s.reduce_lanes

    def check(self, s: Schedule) -> str | None:
        """Why ``s`` is not a valid schedule of this kernel (``None`` if it is).

        Checks: workgroup size within ``limits.invocations``; split axes distinct, known, at most
        two (one without reductions), factors from the space and not beyond the axis; reduce
        lanes a power of two dividing the workgroup size, each keeping at least one iteration of
        the outermost reduction axis (:data:`~kiln.te.schedule.GEMV_ITERATIONS_PER_LANE`), and their partial sums within the workgroup memory limit;
        accumulators and unrolled updates within ``limits``.
        """
        lim = self.limits
        if not 1 <= s.workgroup_size <= lim.invocations:
            return f"workgroup size {s.workgroup_size} is outside [1, {lim.invocations}]"
        axes = [sp.axis for sp in s.splits]
        if len(set(axes)) != len(axes):
            return "an axis is split twice"
        if len(axes) > self.max_split_axes:
            return f"{len(axes)} split axes; at most {self.max_split_axes}"
        for sp in s.splits:
            if sp.axis not in self.factors:
                return f"axis {sp.axis} is not tileable here (tileable: {self.axes})"
            if sp.factor not in self.factors[sp.axis] or sp.factor < 2:
                return f"factor {sp.factor} on axis {sp.axis} (extent {self.t.shape[sp.axis]}) is not in the space"
        if s.unroll < 1:
            return "unroll must be at least 1"
        if s.reduce_lanes not in self.lanes:
            return f"{s.reduce_lanes} reduce lanes are not in the space {self.lanes}"
        if s.workgroup_size % s.reduce_lanes:
            return f"{s.reduce_lanes} reduce lanes do not divide workgroup size {s.workgroup_size}"
        accs = self.tile(s) * max(1, self.n_reductions)
        if accs > lim.accumulators:
            return f"{accs} accumulators per invocation; at most {lim.accumulators}"
        if s.reduce_lanes > 1 and accs * s.workgroup_size * 4 > lim.workgroup_storage_bytes:
            return (f"{accs * s.workgroup_size * 4} bytes of workgroup memory; the limit is "
                    f"{lim.workgroup_storage_bytes}")
        if s.shared_k:
            if s.shared_k not in self.shared:
                return f"shared_k {s.shared_k} is not in the space {self.shared}"
            if s.shared_k % s.unroll:
                return f"unroll {s.unroll} does not divide shared_k {s.shared_k}"
            why = self._contraction(s)
            if why:
                return f"no shared tiles: {why}"
        if s.prefetch and not s.shared_k:
            return "prefetch needs shared_k"
        if s.vector_width != 1 and (s.vector_width not in VECTOR_WIDTHS or not s.shared_k):
            return f"vector width {s.vector_width} needs shared_k and one of {VECTOR_WIDTHS}"
        if s.vector_width != 1 and not self._vectorizable(s):
            return f"vector width {s.vector_width} would change nothing here"
        updates = accs * self.unrolled_iterations(s)
        if updates > lim.unrolled_updates:
            return f"{updates} unrolled accumulator updates; at most {lim.unrolled_updates}"
        return None

    def _contraction(self, s: Schedule) -> str | None:
        """Why ``s``'s shared tiles do not apply to this kernel (:func:`kiln.te.tiles.analyse`), or ``None``; cached."""
        key = (s.splits, s.workgroup_size, s.shared_k)
        if key not in self._analysed:
            why = analyse(self.t, s, self.limits.workgroup_storage_bytes)
            self._analysed[key] = why if isinstance(why, str) else None
        return self._analysed[key]

    def _vectorizable(self, s: Schedule) -> bool:
        """Whether ``vector_width`` may apply: a split whose elements come in whole vectors (:func:`vector_split`:
        workgroup-memory reads), or an input whose static innermost dim it divides (storage loads; a necessary
        condition)."""
        w = s.vector_width
        return any(vector_split(sp, w) for sp in s.splits) or any(d % w == 0 for d in self._inner_dims)

    def valid(self, s: Schedule) -> bool:
        """``check(s) is None``."""
        return self.check(s) is None

    # ------------------------------------------------------------------ enumeration
    def _tiles(self) -> Iterator[tuple[Split, ...]]:
        yield ()
        for n in range(1, self.max_split_axes + 1):
            for axes in itertools.combinations(self.axes, n):
                choices = [[(f, c, g) for f in self.factors[a] if f > 1 for c, g in layouts(f)] for a in axes]
                for combo in itertools.product(*choices):
                    yield tuple(Split(a, f, c, g) for a, (f, c, g) in zip(axes, combo))

    def __iter__(self) -> Iterator[Schedule]:
        """Every valid schedule (brute force; the space has a few thousand points)."""
        for splits in self._tiles():
            for wg, unroll, lanes, kc, vw, pf in itertools.product(WORKGROUP_SIZES, self.unrolls, self.lanes,
                                                                   self.shared, VECTOR_WIDTHS, PREFETCH):
                if wg % lanes or (kc and (lanes > 1 or len(splits) != 2)) or ((vw > 1 or pf) and not kc):
                    continue
                s = Schedule(workgroup_size=wg, splits=splits, unroll=unroll, reduce_lanes=lanes, shared_k=kc,
                             vector_width=vw, prefetch=pf)
                if self.valid(s):
                    yield s

    def size(self) -> int:
        """Number of valid schedules."""
        return sum(1 for _ in self)

    def trivial(self) -> bool:
        """Whether the space has fewer than two schedules (nothing to search)."""
        return len(list(itertools.islice(iter(self), 2))) < 2

    # ------------------------------------------------------------------ evolution
    def sample(self, rng: random.Random, tries: int = 100) -> Schedule:
        """A random valid schedule (the untiled one if ``tries`` draws are all invalid)."""
        for _ in range(tries):
            n = rng.randint(0, min(self.max_split_axes, len(self.axes)))
            axes = rng.sample(self.axes, n)
            splits = tuple(sorted((_random_split(a, rng.choice([f for f in self.factors[a] if f > 1] or [1]), rng)
                                   for a in axes), key=lambda sp: sp.axis))
            splits = tuple(sp for sp in splits if sp.factor > 1)
            lanes = rng.choice(self.lanes)
            kc = rng.choice(self.shared) if lanes == 1 else 0
            vw = rng.choice(VECTOR_WIDTHS) if kc else 1
            pf = rng.choice(PREFETCH) if kc else False
            wg = rng.choice([w for w in WORKGROUP_SIZES if w % lanes == 0] or [64])
            s = Schedule(workgroup_size=wg, splits=splits, unroll=rng.choice(self.unrolls), reduce_lanes=lanes,
                         shared_k=kc, vector_width=vw, prefetch=pf)
            if self.valid(s):
                return s
        return Schedule()

    def mutate(self, s: Schedule, rng: random.Random, tries: int = 50) -> Schedule:
        """A valid neighbour of ``s``: one knob changed (a factor halved or doubled, a split
        flipped between contiguous and strided, added or removed, another workgroup size,
        unrolling or lane count). Returns ``s`` itself if no neighbour was found."""
        for _ in range(tries):
            splits = list(s.splits)
            wg, unroll, lanes, kc, vw, pf = (s.workgroup_size, s.unroll, s.reduce_lanes, s.shared_k, s.vector_width,
                                             s.prefetch)
            knob = rng.randrange(9)
            if knob == 0 and splits:
                i = rng.randrange(len(splits))
                sp = splits[i]
                options = [f for f in self.factors[sp.axis] if f != sp.factor] if sp.axis in self.factors else []
                if not options:
                    continue
                f = rng.choice(options)
                splits[i] = Split(sp.axis, f, sp.contiguous, sp.group if f % sp.group == 0 and f > sp.group else 1)
                splits = [x for x in splits if x.factor > 1]
            elif knob == 1 and splits:
                i = rng.randrange(len(splits))
                sp = splits[i]
                others = [lay for lay in layouts(sp.factor) if lay != (sp.contiguous, sp.group)]
                splits[i] = Split(sp.axis, sp.factor, *rng.choice(others))
            elif knob == 2:
                free = [a for a in self.axes if a not in {x.axis for x in splits}]
                if free and len(splits) < self.max_split_axes and rng.random() < 0.6:
                    a = rng.choice(free)
                    opts = [f for f in self.factors[a] if f > 1]
                    if not opts:
                        continue
                    splits.append(_random_split(a, rng.choice(opts), rng))
                elif splits:
                    splits.pop(rng.randrange(len(splits)))
                else:
                    continue
            elif knob == 3:
                wg = rng.choice([w for w in WORKGROUP_SIZES if w != wg])
            elif knob == 4 and len(self.unrolls) > 1:
                unroll = rng.choice([u for u in self.unrolls if u != unroll])
            elif knob == 5 and len(self.lanes) > 1:
                lanes = rng.choice([n for n in self.lanes if n != lanes])
                kc = 0 if lanes > 1 else kc
            elif knob == 6 and len(self.shared) > 1:
                kc = rng.choice([n for n in self.shared if n != kc])
                lanes = 1 if kc else lanes
            elif knob == 7 and kc:
                vw = rng.choice([n for n in VECTOR_WIDTHS if n != vw])
            elif knob == 8 and kc:
                pf = not pf
            else:
                continue
            vw, pf = (vw, pf) if kc else (1, False)
            if wg % lanes:
                wg = max(wg, lanes)
            try:
                out = Schedule(workgroup_size=wg, splits=tuple(sorted(splits, key=lambda x: x.axis)),
                               unroll=unroll, reduce_lanes=lanes, shared_k=kc, vector_width=vw, prefetch=pf)
            except ValueError:
                continue
            if out != s and self.valid(out):
                return out
        return s

    def crossover(self, a: Schedule, b: Schedule, rng: random.Random) -> Schedule:
        """A child taking the tile from one parent and each other knob from either; ``a`` if invalid."""
        tile_from, other = (a, b) if rng.random() < 0.5 else (b, a)
        pick = [tile_from, other]
        lanes = rng.choice(pick).reduce_lanes
        kc = rng.choice(pick).shared_k if lanes == 1 else 0
        vw = rng.choice(pick).vector_width if kc else 1
        pf = rng.choice(pick).prefetch if kc else False
        wg = rng.choice(pick).workgroup_size
        if wg % lanes:
            wg = max(wg, lanes)
        try:
            child = Schedule(workgroup_size=wg, splits=tile_from.splits, unroll=rng.choice(pick).unroll,
                             reduce_lanes=lanes, shared_k=kc, vector_width=vw, prefetch=pf)
        except ValueError:
            return a
        return child if self.valid(child) else a

    # ------------------------------------------------------------------ cost model features
    def features(self, s: Schedule) -> np.ndarray:
        """A feature vector of ``s`` for the cost model (:class:`kiln.tune.search.CostModel`).

        Per tileable axis: log2 of its factor, whether the split is contiguous and log2 of its group; then log2 of
        the workgroup size, unrolled iterations, reduce lanes, invocations, tile size and
        workgroups, whether the workgroups fill a large GPU (about 1000 of them), log2 of
        ``shared_k + 1`` and of the vector width, and whether the next chunk is prefetched.
        """
        factor = {sp.axis: sp for sp in s.splits}
        row = []
        for a in self.axes:
            sp = factor.get(a)
            row += [math.log2(sp.factor) if sp else 0.0, 1.0 if sp and sp.contiguous else 0.0,
                    math.log2(sp.group) if sp else 0.0]
        inv = self.invocations(s)
        groups = max(1, -(-inv // s.workgroup_size))
        row += [math.log2(s.workgroup_size), math.log2(self.unrolled_iterations(s)), math.log2(s.reduce_lanes),
                math.log2(inv), math.log2(self.tile(s)), math.log2(groups), min(groups / 1024, 1.0),
                math.log2(s.shared_k + 1), math.log2(s.vector_width), float(s.prefetch)]
        return np.asarray(row, dtype=np.float64)
