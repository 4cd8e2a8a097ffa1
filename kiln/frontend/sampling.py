"""Token sampling on the device: a graph that turns one row of logits into the next token id.

A language-model package compiled for WebGPU carries this graph as its ``sampler`` part (docs/generation.md,
*Sampling on the device*): the decoder's logits stay in GPU memory and only the chosen id (8 bytes) is read back,
whatever the sampling options. The options are run-time inputs, so one compiled sampler serves every setting.

Inputs (``V`` the vocabulary, ``S`` a run-time dim ``seen``, 1..``max_seen``):

- ``logits`` float32 ``[1, 1, V]``: the decoder's last row;
- ``seen`` int32 ``[S]``: the ids the repetition penalty applies to (the prompt's and the answer's, each once);
- ``options`` float32 ``[4]``: temperature (0: greedy), top_p (1: all), repetition_penalty (1: none), top_k
  (0: all; an integer);
- ``seed`` int32 ``[2]``: the generation's seed and the step's counter (a new draw per step).

Output ``token`` int64 ``[1]``. The steps, in the order of HF transformers' logits processors:

1. **Repetition penalty** (CTRL, Keskar et al. 2019): a seen token's positive logit is divided by the penalty, a
   negative one multiplied.
2. **Temperature**: ``y = x / T``.
3. **Top-k and top-p** as thresholds on ``y``: the kept tokens are ``y >= t``. Both are "the largest value ``t`` with
   ``W(t) >= target``" for a weight ``W(t)`` that falls as ``t`` rises: for top-k the count of ``y >= t`` against
   ``k``; for top-p the probability mass of ``y >= t`` (within top-k's set) against ``top_p`` of the set's mass,
   which keeps the smallest set of most likely tokens reaching ``top_p`` (tied tokens together). Each is found by
   :data:`PASSES` passes of a :data:`BUCKETS`-way search over ``2^24`` evenly spaced thresholds from the smallest
   logit to one above the largest: a pass evaluates ``W`` at ``BUCKETS`` thresholds in one reduction and keeps the
   bracket where ``W`` crosses the target. So the kept set is exact up to tokens within ``2^-24`` of the logits'
   range below the threshold (a tie at float32 resolution for logits far from 0), and no sort is needed.
4. **Drawing**: Gumbel-max (Gumbel 1954): the arg max of ``y + G`` over the kept tokens, ``G = -log(-log(u))``
   with ``u`` uniform, is a draw from ``softmax(y)`` restricted to them. ``u`` hashes (seed, step, token id) with
   the PCG hash (Jarzynski and Olano, JCGT 2020) in int32 operations, as :mod:`kiln.frontend.onnx.ops.random`
   draws: the same seed gives the same answer on every device and in every runtime, given the same logits.

With temperature 0 the result is the arg max of the penalised logits (top-k and top-p change no arg max).
"""

from __future__ import annotations

import numpy as np

from kiln.arith import symbolic
from kiln.errors import KilnError
from kiln.frontend.hashing import i32, pcg_hash, uniform
from kiln.frontend.shapes import reshape
from kiln.ir.graph import Builder, Graph, Value

#: thresholds a search pass evaluates at once (one reduction of ``BUCKETS`` outputs over the vocabulary)
BUCKETS = 64
#: search passes: ``BUCKETS ** PASSES`` = 2^24 steps over the logits' range (exact in float32)
PASSES = 4

def _f32(b: Builder, x: float) -> Value:
    return b.const(np.array(x, np.float32))


def split(vocab: int) -> tuple[int, int]:
    """``(G, C)`` with ``G * C = vocab``: the vocabulary as ``G`` rows of ``C`` tokens, ``C`` the divisor nearest
    1024 between 128 and 8192 (one row when none is), so each reduction over it runs as ``G`` parallel row
    reductions and a short one over their results instead of one long one (a single workgroup on a GPU)."""
    divisors = [c for c in range(128, min(vocab, 8192) + 1) if vocab % c == 0]
    if not divisors:
        return 1, vocab
    c = min(divisors, key=lambda d: abs(np.log2(d / 1024)))
    return vocab // c, c


def _reduce(b: Builder, op: str, x: Value) -> Value:
    """``op`` (ReduceSum, ReduceMax, ReduceMin) of ``x [..., G, C]`` over its last two axes in two stages:
    ``[..., 1, 1]``."""
    rank = len(x.shape)
    rows = b.op(op, [x], axes=(rank - 1,), keepdims=1)
    return b.op(op, [rows], axes=(rank - 2,), keepdims=1)


def _search(b: Builder, y: Value, weight: Value | None, target: Value, threshold) -> Value:
    """The largest ``m`` in ``0 .. BUCKETS**PASSES - 1`` with ``sum(weight[y >= threshold(m)]) >= target``
    (``weight`` None: a count), given that ``m = 0`` reaches the target and ``BUCKETS**PASSES`` does not; an
    int32 ``[1, 1, 1]``. ``y`` is ``[G, C]``; ``threshold`` maps int32 values to float32 thresholds, non-decreasing."""
    m = b.const(np.zeros((1, 1, 1), np.int32))
    first = b.const((np.arange(BUCKETS) == 0).reshape(BUCKETS, 1, 1))
    for p in range(PASSES):
        stride = BUCKETS ** (PASSES - 1 - p)
        offsets = b.const((np.arange(BUCKETS, dtype=np.int32) * stride).reshape(BUCKETS, 1, 1))
        cand = threshold(b.op("Add", [m, offsets]))  # [B, 1, 1]
        w = weight if weight is not None else _f32(b, 1.0)
        total = _reduce(b, "ReduceSum", b.op("Where", [b.op("GreaterOrEqual", [y, cand]), w, _f32(b, 0.0)]))
        # total [B, 1, 1]: W at each candidate. The next m: m + stride * (the candidates reaching the target - 1),
        # W falling as m rises; summed in one reduction (m - stride riding on the first term), so its result is m
        # itself and no kernel follows it
        term = b.op("Add", [b.op("Where", [b.op("GreaterOrEqual", [total, target]), i32(b, stride), i32(b, 0)]),
                            b.op("Where", [first, b.op("Sub", [m, i32(b, stride)]), i32(b, 0)])])
        m = b.op("ReduceSum", [term], axes=(0,), keepdims=1)
    return m


def sampler_graph(vocab: int, max_seen: int, seen: int | None = None) -> Graph:
    """The sampler (module docstring) for a vocabulary of ``vocab`` tokens and up to ``max_seen`` penalised ids.

    Args:
        vocab: ``V``, the logits' length (at most 2^24, so ids and ``top_k`` are exact in float32).
        max_seen: the bound of the run-time dim ``seen`` (the package's context).
        seen: a static length instead of the run-time dim (the numpy interpreter runs static graphs only).

    Raises:
        KilnError: a vocabulary or bound out of range.
    """
    if not 1 <= vocab <= 1 << 24:
        raise KilnError(f"the sampler takes a vocabulary of 1 to 2^24 tokens, not {vocab}")
    if max_seen < 1:
        raise KilnError(f"the sampler's seen-token bound must be >= 1, not {max_seen}")
    g = Graph(name="sampler")
    if seen is None:
        n = symbolic.size_var("seen", 0, 1, max_seen)
        g.size_vars = {"seen": n}
        ids = Value("seen", "int32", (n,), sym_shape=("seen",))
    else:
        ids = Value("seen", "int32", (seen,))
    logits = Value("logits", "float32", (1, 1, vocab))
    options = Value("options", "float32", (4,))
    seed = Value("seed", "int32", (2,))
    g.inputs += [logits, ids, options, seed]
    b = Builder(g)
    rows, cols = split(vocab)

    def option(i: int) -> Value:
        return reshape(b, b.op("Slice", [options], starts=(i,), ends=(i + 1,), steps=(1,)), (1, 1))

    temperature, top_p, penalty, top_k = (option(i) for i in range(4))
    zero, one = _f32(b, 0.0), _f32(b, 1.0)
    iota = b.const(np.arange(vocab, dtype=np.int32).reshape(rows, cols))
    x = reshape(b, logits, (rows, cols))  # the vocabulary as rows x cols: every reduction runs in two stages
    # 1. repetition penalty on the seen ids: a [S, G, C] comparison reduced over S
    hit = b.op("ReduceMax", [b.op("Cast", [b.op("Equal", [reshape(b, ids, (ids.shape[0], 1, 1)), iota])],
                                  to="float32")], axes=(0,), keepdims=0)
    penalised = b.op("Where", [b.op("Greater", [x, zero]), b.op("Div", [x, penalty]), b.op("Mul", [x, penalty])])
    x = b.op("Where", [b.op("Greater", [hit, zero]), penalised, x])
    # 2. temperature (0: greedy, no draw)
    sampling = b.op("Greater", [temperature, zero])
    y = b.op("Div", [x, b.op("Where", [sampling, temperature, one])])
    # 3. top-k, then top-p within it, as thresholds on y: threshold(m) = low + (top + 1 - low) * m / B^P
    top = _reduce(b, "ReduceMax", y)  # [1, 1]
    low = _reduce(b, "ReduceMin", y)
    scale = b.op("Mul", [b.op("Sub", [b.op("Add", [top, one]), low]), _f32(b, float(BUCKETS) ** -PASSES)])

    def threshold(m: Value) -> Value:
        return b.op("Add", [low, b.op("Mul", [scale, b.op("Cast", [m], to="float32")])])

    k = b.op("Where", [b.op("Greater", [top_k, zero]), b.op("Min", [top_k, _f32(b, vocab)]), _f32(b, vocab)])
    t_k = reshape(b, threshold(_search(b, y, None, k, threshold)), (1, 1))
    e = b.op("Where", [b.op("GreaterOrEqual", [y, t_k]), b.op("Exp", [b.op("Sub", [y, top])]), zero])
    mass = _reduce(b, "ReduceSum", e)
    t_p = reshape(b, threshold(_search(b, y, e, b.op("Mul", [top_p, mass]), threshold)), (1, 1))
    kept = b.op("GreaterOrEqual", [y, b.op("Where", [b.op("Less", [top_p, one]), t_p, t_k])])
    # 4. Gumbel-max over the kept tokens
    step_key = pcg_hash(b, b.op("Slice", [seed], starts=(1,), ends=(2,), steps=(1,)))
    key = pcg_hash(b, b.op("Add", [b.op("Slice", [seed], starts=(0,), ends=(1,), steps=(1,)), step_key]))
    u = uniform(b, key, (rows, cols))  # a token's uniform: its id hashed with the key
    gumbel = b.op("Neg", [b.op("Log", [b.op("Neg", [b.op("Log", [u])])])])
    score = b.op("Where", [kept, b.op("Add", [y, b.op("Where", [sampling, gumbel, zero])]), _f32(b, -np.inf)])
    # the arg max in two stages: each row's (first) arg max, then the first row holding the largest
    row_best = b.op("ReduceMax", [score], axes=(1,), keepdims=1)  # [G, 1]
    row_arg = b.op("ArgMax", [score, row_best], axis=1, keepdims=1, select_last_index=0)  # [G, 1] int64
    best = b.op("ReduceMax", [row_best], axes=(0,), keepdims=1)
    row = b.op("ArgMax", [row_best, best], axis=0, keepdims=1, select_last_index=0)  # [1, 1]
    col = b.op("GatherElements", [row_arg, row], axis=0)
    token = b.op("Add", [b.op("Mul", [row, b.const(np.array(cols, np.int64))]), col])
    token.name = "token"
    g.outputs = [token]
    return g
