"""Schedules: how a tensor expression is mapped onto parallel invocations.

A schedule's fields are its knobs (the auto-tuner's search space). Each invocation
computes a *register tile* of the output: one element by default, or the product of
the :class:`Split` factors, so loads shared by the tile's elements (an input pixel
used by several output channels, a weight used by several pixels) are read once and
reused from registers. The reduction loops of a tile are shared; their innermost
iterations are unrolled up to ``unroll``. Invocations are grouped ``workgroup_size`` to a
workgroup over the flattened grid of tiles.

:func:`default_schedule` is the compiler's choice when no tuning record applies.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.arith import symbolic
from kiln.arith.expr import Load, Reduce, free_vars, reduces_in, transform
from kiln.arith.symbolic import at_opt, at_variant_top
from kiln.te.compute import Tensor
from kiln.te.rows import MAX_STAGED_ROWS, WORKGROUP_BYTES, analyse_rows, workgroup_bytes
from kiln.te.tiles import analyse, threads


@dataclass(frozen=True)
class Split:
    """Give each invocation ``factor`` elements of output ``axis``.

    ``contiguous`` elements are ``outer*factor + j`` (neighbouring windows of a convolution
    overlap, so unrolled loads coincide); otherwise they are ``outer + j*ceil(extent/factor)``
    (strided: neighbouring invocations read neighbouring addresses, which coalesces), or, with
    ``group`` g > 1, strided groups of g consecutive elements: ``(j // g)*n*g + outer*g + j % g`` for
    ``n = ceil(extent/factor)`` (a shared-tile product's columns as ``vec4`` groups: an invocation reads
    whole vectors of workgroup memory and stores whole vectors, its neighbours the next vectors, as in
    the blocked SGEMMs of siboehm's "How to optimize a CUDA matmul kernel", kernel 6). An extent that
    ``factor`` does not divide is handled by clamped loads and guarded stores.

    Raises:
        ValueError: ``group`` does not divide ``factor``, or is set on a ``contiguous`` split.
    """

    axis: int
    factor: int
    contiguous: bool = False
    group: int = 1

    def __post_init__(self):
        if self.group < 1 or self.factor % self.group or (self.contiguous and self.group > 1):
            raise ValueError(f"Split group={self.group} must divide factor={self.factor} and be 1 when contiguous")

    def offset(self, t, n, j: int):
        """Position along the axis of tile element ``j`` (0 <= j < factor) of tile ``t`` of ``n`` (expressions or
        ints; the layout of the class docstring)."""
        if self.contiguous:
            return t * self.factor + j
        g = self.group
        return t * g + ((j // g) * (n * g) + j % g) if g > 1 else t + j * n

    def to_json(self) -> dict:
        """A JSON-able description (``group`` only where it is not 1: older records read the same)."""
        d = {"axis": self.axis, "factor": self.factor, "contiguous": self.contiguous}
        if self.group > 1:
            d["group"] = self.group
        return d


@dataclass(frozen=True)
class Schedule:
    """Knobs of a kernel's schedule.

    Attributes:
        workgroup_size: invocations per workgroup (the WebGPU workgroup size; at most the
            device's ``maxComputeInvocationsPerWorkgroup``, 256 by default).
        max_groups_x: workgroups along x before the dispatch wraps into y
            (``maxComputeWorkgroupsPerDimension``, 65535 by default).
        splits: the register tile, one :class:`Split` per tiled output axis.
        unroll: fully unroll the innermost reduction loops while the product of their
            extents is at most this (1: no unrolling); an innermost axis longer than that is
            unrolled partially, by its largest divisor up to ``unroll``.
        reduce_lanes: invocations sharing one tile's reductions (a power of two dividing
            ``workgroup_size``): each takes every ``reduce_lanes``-th iteration of the outermost
            reduction axis, and the partial results are combined in workgroup memory. More
            parallelism for outputs too small to fill the GPU (batch-1 late layers, a classifier).
        shared_k: stage the operands of a contraction through workgroup memory, ``shared_k``
            reduction iterations at a time (0: off; see :mod:`kiln.te.tiles`). The two
            :class:`Split` axes become a workgroup block of (threads x factor) rows by columns; the
            workgroup loads each operand's tile for the chunk cooperatively, then every invocation
            computes its register tile from workgroup memory. Kernels that are not such a
            contraction (or whose tiles would not fit the workgroup memory limit) are lowered without it.
        vector_width: 1, or 4: with ``shared_k``, each operand tile whose register-tile split is
            contiguous with a factor divisible by 4, or strided in groups of 4, is a workgroup array of ``vec4`` and
            every invocation
            reads its rows (or columns) of a reduction step as whole vectors (a quarter of the
            workgroup-memory loads); and each float32 operand whose cooperative load walks a
            contiguous innermost dim with static extents divisible by 4 is bound as
            ``array<vec4<f32>>`` and loaded a vector at a time (float16 ones, ``--precision fp16``, as ``vec4<f16>``); a
            float32 or float16 output whose tile columns are contiguous (or in groups of 4) along a static innermost
            extent divisible by 4 is stored a vector at a time.
            Recorded as 1 where none of these applies.
        prefetch: with ``shared_k``, load the next chunk's operands into registers before computing
            on the current one (its load latency then overlaps the arithmetic; a register per loaded
            element), storing them to workgroup memory after the chunk's second barrier.
        rows: a row kernel (:mod:`kiln.te.rows`: row reductions and the elementwise work over the same rows, as
            a fused LayerNormalization or Softmax): ``reduce_lanes`` invocations a row share the row's reductions and
            then its outputs, a workgroup ``workgroup_size / reduce_lanes`` neighbouring rows. With ``simd_reduce``
            (C targets; ``reduce_lanes`` 1) a tile a row instead, the reductions and the elements in vectors along it
            (:mod:`kiln.te.cpu_rows`). A kernel that is not such a row kernel is lowered without it.
        simd_reduce: (C targets) 0, or the SIMD lanes the innermost reduction axis is dealt to: each tile's sums
            accumulate in vectors, iteration ``ro * simd_reduce + lane`` in lane ``lane`` (a ``For`` with
            ``lanes``), added across the lanes after the loop. For reductions that read rows contiguously along
            their reduction axis but not along the output's innermost axis (a matrix product whose right operand
            is read transposed: a tied embedding's output projection, attention scores), whose tile lanes would
            otherwise gather a scalar per lane.
    """

    workgroup_size: int = 64
    max_groups_x: int = 65535
    splits: tuple[Split, ...] = ()
    unroll: int = 1
    reduce_lanes: int = 1
    shared_k: int = 0
    vector_width: int = 1
    prefetch: bool = False
    rows: bool = False
    simd_reduce: int = 0

    def __post_init__(self):
        r = self.reduce_lanes
        if r < 1 or r & (r - 1) or self.workgroup_size % r:
            raise ValueError(f"reduce_lanes={r} must be a power of two dividing workgroup_size={self.workgroup_size}")
        if self.shared_k < 0 or (self.shared_k and r > 1):
            raise ValueError(f"shared_k={self.shared_k} must be 0 or positive, and reduce_lanes 1 with it")
        if self.vector_width not in (1, 4):
            raise ValueError(f"vector_width={self.vector_width} must be 1 or 4")
        if self.prefetch and not self.shared_k:
            raise ValueError("prefetch needs shared_k")
        if self.rows and self.shared_k:
            raise ValueError("rows needs no shared_k")

    def dispatch(self, total: int) -> tuple[int, int, int]:
        """Workgroup counts ``(x, y, z)`` covering ``total`` invocations."""
        groups = max(1, -(-total // self.workgroup_size))
        if groups <= self.max_groups_x:
            return (groups, 1, 1)
        return (self.max_groups_x, -(-groups // self.max_groups_x), 1)

    def to_json(self) -> dict:
        """A JSON-able description (manifests, tuning records)."""
        d = {"workgroup_size": self.workgroup_size, "splits": [sp.to_json() for sp in self.splits],
             "unroll": self.unroll, "reduce_lanes": self.reduce_lanes}
        if self.shared_k:  # only when set: records and manifests of other schedules stay as they were
            d["shared_k"] = self.shared_k
        if self.vector_width != 1:
            d["vector_width"] = self.vector_width
        if self.prefetch:
            d["prefetch"] = True
        if self.rows:
            d["rows"] = True
        if self.simd_reduce:
            d["simd_reduce"] = self.simd_reduce
        return d

    @classmethod
    def from_json(cls, d: dict) -> Schedule:
        """Inverse of :meth:`to_json`."""
        return cls(workgroup_size=int(d.get("workgroup_size", 64)),
                   splits=tuple(Split(**s) for s in d.get("splits", ())), unroll=int(d.get("unroll", 1)),
                   reduce_lanes=int(d.get("reduce_lanes", 1)), shared_k=int(d.get("shared_k", 0)),
                   vector_width=int(d.get("vector_width", 1)), prefetch=bool(d.get("prefetch", False)),
                   rows=bool(d.get("rows", False)), simd_reduce=int(d.get("simd_reduce", 0)))


def reuse_axes(t: Tensor) -> dict[int, frozenset[int]]:
    """Output axes of ``t`` along which some load inside a reduction does not vary.

    Returns axis -> the positions (in first-seen order) of the loads that do not vary along
    it. Tiling such an axis lets the tile's elements share those loads: for a convolution the
    output-channel axis shares the input window and the spatial axes share the weights; for a
    matrix product each output axis shares one operand.
    """
    loads: list[Load] = []

    def visit(x):
        if isinstance(x, Reduce):
            transform(x.body, lambda y: loads.append(y) if isinstance(y, Load) else None)

    transform(t.body, visit)
    deps = [set().union(*(free_vars(i) for i in ld.indices)) for ld in loads]
    out = {}
    for a, ax in enumerate(t.axes):
        shared = frozenset(k for k, d in enumerate(deps) if ax not in d)
        if at_opt(t.shape[a]) > 1 and shared:
            out[a] = shared
    return out


def tile_axes(t: Tensor) -> list[int]:
    """Up to two output axes to tile: the innermost with reuse, then the one sharing the most
    loads the first does not (complementary reuse, as rows and columns of a matrix product)."""
    reuse = reuse_axes(t)
    if not reuse:
        return []
    first = max(reuse)
    rest = [a for a in reuse if a != first]
    if not rest:
        return [first]
    second = max(rest, key=lambda a: (len(reuse[a] - reuse[first]), a))
    return sorted([second, first])


def reductions(t: Tensor) -> list[Reduce]:
    """The distinct :class:`Reduce` nodes of ``t`` (outermost first)."""
    return reduces_in(t.body)


def reduction_size(t: Tensor) -> int:
    """Iterations of the largest reduction in ``t`` (0 if it has none)."""
    return max((_prod(at_opt(ax.extent) for ax in r.axes) for r in reductions(t)), default=0)


#: device classes a package's default schedules can be made for
DEVICE_CLASSES = ("gpu", "cpu")

#: shared operand tiles (:mod:`kiln.te.tiles`) in the default ``gpu`` schedules, the one switch:
#: ``"off"`` (register tiles only, as before), ``"large"`` (the large GEMMs, convolutions' implicit GEMMs included,
#: that still have ``16 * min_invocations`` tiles of 8 x 8: :data:`SHARED_WIDE`, :data:`SHARED_LARGE` for
#: convolutions) or ``"medium"`` (also matrix
#: products, i.e. contractions over one reduction axis, not convolutions' implicit GEMMs, that fill
#: :data:`MEDIUM_GROUPS` workgroups of :data:`SHARED_WIDE` or else of :data:`SHARED_MEDIUM`; or, failing that,
#: :data:`SMALL_GROUPS` of :data:`SHARED_SMALL`).
#: Measured on an H100 (bench/results/gpu-20261122-102525.json against gpu-20261122-102645.json, same code
#: but for this switch): MiniLM batch 32 x 128 10.8 ms with "large", 8.7 ms with "medium"; "medium" on convolutions
#: as well made ResNet-50 no faster (2.52 -> 2.70 ms), hence matrix products only.
DEFAULT_SHARED_TILES = "medium"
#: workgroups a ``"medium"`` contraction must fill (two per streaming multiprocessor of a large GPU)
MEDIUM_GROUPS = 256
#: the fewest iterations of the outermost reduction axis each of a tile's ``reduce_lanes`` keeps (the lanes double
#: while each would keep at least this many)
ITERATIONS_PER_LANE = 4
#: the same for a matrix-vector product (one output axis longer than 1: a decode step's projections, a classifier at
#: batch 1). ``bench.gemv`` on an H200: a decode step's 4-bit products (72 or 192 words of 8 weights a column) run
#: fastest with a word or two a lane (576x960: 3.4 us at 64 lanes against 3.8 at 16; with RMSNorm's sum of squares
#: inside, 5.3-5.8 against 10.8; 1536x576 3.9 against 5.0)
GEMV_ITERATIONS_PER_LANE = 1
#: at most this many tiles, a reduction's tile may take up to a workgroup of ``reduce_lanes`` (and the kernel four
#: times ``target_invocations``). H200, SmolLM2's decode step at 1024 keys: the attention's ``P V`` (576 tiles,
#: 64 -> 256 lanes) 14.1 -> 10.0 us a layer, the down projection 9.2 -> 8.5, a step queued back to back 1.70-1.72 ->
#: 1.56-1.63 ms (bench/results/llm-profile-20261128-lanes-h200.txt)
FEW_TILES = 1024
#: a reduction at most this long (its outermost axis, at the dims' ``opt``) over at most :data:`FEW_TILES` tiles
#: takes a lane an iteration: its iterations are dependent loads, each a memory latency, and the GPU has lanes to
#: spare (FlashDecoding's combine over a decode step's blocks of keys, kiln.passes.split_attention: up to 32)
SHORT_REDUCTION = 32


@dataclass(frozen=True)
class SharedTiles:
    """A default shared-tile schedule (:mod:`kiln.te.tiles`): register tiles of ``rows`` x ``cols`` (rows
    contiguous per invocation, columns strided in groups of ``col_group``: vec4 reads of workgroup memory and vec4
    stores), ``workgroup_size`` invocations (a block of ``rows * ty`` x ``cols * tx``, :func:`kiln.te.tiles.threads`),
    chunks of ``shared_k``, ``vector_width`` 4, and the next chunk prefetched where ``prefetch``."""

    rows: int
    cols: int
    workgroup_size: int
    shared_k: int
    col_group: int
    prefetch: bool

    def schedule(self, row_axis: int, col_axis: int) -> Schedule:
        """The :class:`Schedule` of these tiles over output axes ``row_axis`` and ``col_axis``."""
        group = self.col_group if self.cols > self.col_group else 1
        cols = Split(col_axis, self.cols, contiguous=self.cols == self.col_group, group=group)
        return Schedule(workgroup_size=self.workgroup_size, splits=(Split(row_axis, self.rows, True), cols),
                        unroll=self.shared_k, shared_k=self.shared_k, vector_width=4, prefetch=self.prefetch)


#: blocks of 64 x 128 outputs: 8 x 8 tiles (columns in two vec4 groups, 64 apart), 128 invocations, chunks of 8, the
#: next chunk prefetched. H200 (bench.gemm_hand, bench/results/gemm-hand-20261129-085152.json):
#: 4096 x 384 x 1152 0.108 ms against 0.183 for the 128 x 128 blocks of strided 8 x 8 tiles before (33.7 against
#: 19.8 TFLOP/s; cuBLAS 38), 4096 x 384 x 1536 0.129 against 0.186, 4096^3 3.48 against 4.91 ms (39.5 TFLOP/s;
#: cuBLAS 51); the classic hand-written blocked SGEMM in WGSL (bench.gemm_hand) is no faster than these
SHARED_WIDE = SharedTiles(8, 8, 128, 8, 4, True)
#: large convolutions' implicit GEMMs keep blocks of 128 x 128 (8 x 8 strided tiles, 256 invocations, chunks of 8: the
#: best of ``bench.micro``'s 2026-11-22 sweep for the 4096^3 product on an H100, 28.6 TFLOP/s)
SHARED_LARGE = SharedTiles(8, 8, 256, 8, 1, False)
#: blocks of 64 x 64 (8 x 4 tiles, 128 invocations, chunks of 16 prefetched) for products whose :data:`SHARED_WIDE`
#: blocks are too few: 4096 x 384 x 384 0.038 ms against 0.064 for the 4 x 4 tiles of 256 invocations before (0.044
#: without the prefetch), 4096 x 1536 x 384 0.141 against 0.249 (0.169; cuBLAS 0.126; bench.gemm_hand,
#: gemm-hand-20261129-085152.json)
SHARED_MEDIUM = SharedTiles(8, 4, 128, 16, 4, True)
#: matrix products too small for :data:`SHARED_MEDIUM`'s blocks (MiniLM at batch 1: 128 rows) get blocks of 32 x 32
#: (4 x 4 tiles of four contiguous columns: vec4 reads of workgroup memory; 64 invocations, chunks of 16, the next
#: chunk prefetched) when they fill :data:`SMALL_GROUPS` of them and reduce at least :data:`SMALL_REDUCTION` long.
#: On an H200 (``bench.gemm_small``, bench/results/gemm-small-20261130-002601.json, GPU us): 128 x 384 x 1152 13.1
#: against 19.5 with the strided, unprefetched columns before (torch 23.7), 128 x 384 x 1536 13.1 against 19.6,
#: 128 x 1536 x 384 split in 4 (:mod:`kiln.passes.split_k` gives such products the blocks this tier wants) 37.5
#: against 53.1 the partials; MiniLM 1 x 128's GPU time 0.69 against 0.86 ms (``bench.gpu``, its products 20-21 us
#: against 29-30). The same tiles with 32 invocations (``kiln tune``'s choice there) were as fast in the model; 64
#: keep a whole wave on 64-wide GPUs.
SHARED_SMALL = SharedTiles(4, 4, 64, 16, 4, True)
SMALL_GROUPS = 96
SMALL_REDUCTION = 64


def default_schedule(t: Tensor, min_invocations: int = 4096, target_invocations: int = 65536,
                     shared_bytes: int = 16384, device_class: str = "gpu") -> Schedule:
    """The schedule the compiler uses for ``t`` (inlined, any axis names) without tuning.

    Elementwise and layout kernels and reductions of fewer than 9 iterations run one element
    per invocation. Larger reductions (a 3x3 depthwise window and up) get a register tile of up
    to 4 x 4 over the two axes with complementary load reuse (:func:`tile_axes`; the innermost
    strided for coalescing), shrunk while fewer than ``min_invocations`` tiles would remain, and
    unroll up to 9 innermost reduction iterations (a 3x3 window). Large GEMMs, which still have
    ``16 * min_invocations`` tiles of 8 x 8, get 8 x 8 tiles unrolled by 16 (the best of
    ``bench.micro``'s sweep on an H100: 49% of cuBLAS fp32). For ``device_class="gpu"``, when there are still fewer
    than ``target_invocations`` invocations (4 times as many where a reduction is nested in the body or there are at
    most :data:`FEW_TILES` tiles), up to 64 ``reduce_lanes`` (256 for at most :data:`FEW_TILES` tiles: the arg max
    over a language model's vocabulary went from 156 to 85 us on an H100) share each tile's
    reduction (each lane keeping at least :data:`ITERATIONS_PER_LANE` iterations of the outermost axis,
    :data:`GEMV_ITERATIONS_PER_LANE` in a matrix-vector product), in workgroups
    whose partial sums fit ``shared_bytes`` of workgroup memory (the WebGPU default limit).
    ``device_class="cpu"`` (WebGPU on a CPU: SwiftShader, lavapipe) has few cores and slow
    workgroup barriers: full 4 x 4 tiles, no lanes and no unrolling (MobileNetV2 on lavapipe: 0.9 s a run,
    against 2.6 s with the GPU schedules; unrolling made its shaders 5x slower to generate and 4x slower for
    lavapipe to compile, with no faster runs).
    Row kernels (a fused LayerNormalization or Softmax, ``t.attrs["rows"]``) on ``gpu`` get
    :func:`row_schedule`.
    Contractions (:mod:`kiln.te.tiles`) on ``gpu`` may stage their operands through workgroup
    memory instead (``shared_k``), as :data:`DEFAULT_SHARED_TILES` says.

    Raises:
        ValueError: unknown ``device_class``.
    """
    if device_class not in DEVICE_CLASSES:
        raise ValueError(f"device_class must be one of {', '.join(DEVICE_CLASSES)}, not {device_class!r}")
    if device_class == "gpu" and t.attrs.get("rows"):
        return row_schedule(t)
    if device_class == "cpu":
        min_invocations, target_invocations = 1, 0
    reds = reductions(t)
    if reduction_size(t) < 9:
        return Schedule()
    axes = tile_axes(t)
    # run-time dims count at their ``opt`` value here; lowering guards every split and loop of a
    # run-time extent, so the schedule stays correct for every value in bounds
    shape = [at_opt(d) for d in t.shape]
    size = _prod(shape)
    big = len(axes) == 2 and size // 64 >= 16 * min_invocations  # a large GEMM: 8 x 8 tiles still fill the GPU
    factors = {a: 8 if big else 4 for a in axes}
    for a in sorted(axes, key=lambda a: shape[a]):
        while factors[a] > 1 and (factors[a] > shape[a] or size // _prod(factors.values()) < min_invocations):
            factors[a] //= 2
    last = len(shape) - 1
    splits = tuple(Split(a, f, contiguous=a != last) for a, f in sorted(factors.items()) if f > 1)
    tiles = 1
    for a, d in enumerate(shape):
        tiles *= -(-d // factors.get(a, 1))
    outer = min(at_opt(r.axes[0].extent) for r in reds)
    lanes = 1
    # a lone long reduction (a vocabulary's arg max) takes a whole workgroup; a few hundred tiles (a decode step's
    # P V, its down projection) up to a workgroup each, and four times the invocations
    most = 256 if tiles <= FEW_TILES else 64
    # a reduction nested in the body (RMSNorm's sum of squares in the matmul after it: fuse_norm_prologues) is split
    # over the same lanes, so it wants more of them
    target = target_invocations * 4 if tiles <= FEW_TILES or any(reduces_in(r.body) for r in reds) else \
        target_invocations
    per_lane = GEMV_ITERATIONS_PER_LANE if sum(1 for d in shape if d > 1) <= 1 or \
        (tiles <= FEW_TILES and outer <= SHORT_REDUCTION) else ITERATIONS_PER_LANE
    while lanes < most and tiles * lanes < target and lanes * 2 * per_lane <= outer:
        lanes *= 2
    if device_class == "cpu":
        return _cpu_lanes(t, reds, factors, splits, shared_bytes)
    shared = _shared_default(t, axes, shape, big, shared_bytes)
    if shared:
        return shared
    if lanes == 1:
        return Schedule(splits=splits, unroll=16 if big else 9)
    accs = _prod(factors.values()) * len(reds)
    width = 256
    while width > lanes and width * accs * 4 > shared_bytes:
        width //= 2
    if width * accs * 4 > shared_bytes:
        return Schedule(splits=splits, unroll=9)
    return Schedule(workgroup_size=width, splits=splits, unroll=9, reduce_lanes=lanes)


#: the most reduction iterations one invocation runs in a ``device_class="cpu"`` schedule. lavapipe (Mesa's
#: llvmpipe) silently ends an invocation's loops after 65535 iterations in all (its guard against endless loops;
#: a single-invocation ReduceMax over 240000 elements saw the first 65535): longer reductions get lanes
CPU_SERIAL_TRIPS = 16384


def _cpu_lanes(t: Tensor, reds: list[Reduce], factors: dict[int, int], splits: tuple, shared_bytes: int) -> Schedule:
    """The ``cpu`` schedule: whole tiles, no lanes, unless a reduction (at its dims' upper bounds) is longer than
    :data:`CPU_SERIAL_TRIPS` iterations: then the fewest ``reduce_lanes`` (up to 256, over the outermost reduction
    axis) that bring each invocation's share under it."""
    serial = max(_prod(symbolic.bounds(ax.extent)[1] for ax in r.axes) for r in reds)
    outer = min(symbolic.bounds(r.axes[0].extent)[0] for r in reds)
    lanes = 1
    while serial > CPU_SERIAL_TRIPS * lanes and lanes < 256 and lanes * 2 <= outer:
        lanes *= 2
    if lanes == 1 or lanes * _prod(factors.values()) * len(reds) * 4 > shared_bytes:
        return Schedule(splits=splits)
    return Schedule(workgroup_size=lanes, splits=splits, reduce_lanes=lanes)


#: lanes a row of an attention row kernel past :data:`kiln.te.rows.MAX_STAGED_ROWS` query rows (run-time dims at
#: ``opt``; an encoder's, :data:`kiln.te.rows.MAX_STAGED_WORK`; a decode step's few rows take a workgroup of 256
#: lanes each), several rows a workgroup. H200, MiniLM's attention at batch 1 (1536 rows of
#: 128 keys): 64 lanes a row 16 us a layer, 32 lanes 21, 16 lanes (a lane a key) 77
ATTENTION_ROW_LANES = 64


def row_schedule(t: Tensor) -> Schedule:
    """The schedule of a row kernel (:mod:`kiln.te.rows`, a group the fusion pass marked ``attrs["rows"]``):
    one workgroup a row, of the power of two from 32 to 256 that leaves each lane about 4 of the row's
    elements (run-time dims at their ``opt`` value); for attention's rows (column reductions) a workgroup of 256
    lanes a row, or, past :data:`~kiln.te.rows.MAX_STAGED_ROWS` rows, :data:`ATTENTION_ROW_LANES` lanes a row and
    several rows a workgroup."""
    plan = analyse_rows(t)
    if isinstance(plan, str):
        return Schedule()
    n = _prod(at_opt(t.shape[a]) for a in plan.cols)
    if plan.columns:  # attention (kiln.te.rows): the keys of a decode step are many whatever opt says; lanes split
        # them, and the columns their sums; an encoder's many query rows share a workgroup (and a core's cache)
        # (static shapes only: a decoder's attentions over run-time dims keep their workgroup a row); fewer rows a
        # workgroup where their workgroup arrays would not fit
        rows = [t.shape[a] for a in plan.rows]
        lanes = 256 if symbolic.symbols(rows) or _prod(rows) <= MAX_STAGED_ROWS else ATTENTION_ROW_LANES
        while lanes < 256 and workgroup_bytes(plan, lanes, 256 // lanes) > WORKGROUP_BYTES:
            lanes *= 2
        return Schedule(workgroup_size=256, reduce_lanes=lanes, rows=True)
    width = 32
    while width < 256 and width * 4 < n:
        width *= 2
    return Schedule(workgroup_size=width, reduce_lanes=width, rows=True)


def _shared_default(t: Tensor, axes: list[int], shape: list[int], big: bool, shared_bytes: int) -> Schedule | None:
    """The default shared-tile schedule of contraction ``t`` under :data:`DEFAULT_SHARED_TILES`, or ``None``."""
    if DEFAULT_SHARED_TILES == "off" or len(axes) != 2:
        return None
    product = all(len(r.axes) == 1 for r in reductions(t))  # a matrix product, not a convolution's implicit GEMM
    if big:
        tiers = [(SHARED_WIDE if product else SHARED_LARGE, 0)]
    elif DEFAULT_SHARED_TILES == "medium" and product:
        # a plan step's variant serves up to its dims' bounds: a prefill's QK^T (tokens x tokens) fills the GPU at
        # 512 prompt tokens though not at the 64 its schedule is chosen for
        shape = [max(d, at_variant_top(e)) for d, e in zip(shape, t.shape)]
        tiers = [(SHARED_WIDE, MEDIUM_GROUPS), (SHARED_MEDIUM, MEDIUM_GROUPS)]
        if reduction_size(t) >= SMALL_REDUCTION:
            tiers.append((SHARED_SMALL, SMALL_GROUPS))
    else:
        return None
    for tiles, fewest in tiers:
        if not fewest or _groups(axes, shape, tiles) >= fewest:
            s = tiles.schedule(*axes)
            return s if not isinstance(analyse(t, s, shared_bytes), str) else None
    return None


def _groups(axes: list[int], shape: list[int], tiles: SharedTiles) -> int:
    """Workgroups of shared ``tiles`` over output ``shape`` tiled along ``axes`` (rows, columns); 0 where an axis is
    shorter than its block."""
    tx, ty = threads(tiles.workgroup_size)
    blocks = {axes[0]: ty * tiles.rows, axes[1]: tx * tiles.cols}
    if any(shape[a] < b for a, b in blocks.items()):
        return 0
    return _prod(-(-d // blocks[a]) if a in blocks else d for a, d in enumerate(shape))


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n
