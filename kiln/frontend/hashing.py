"""Counter-based random numbers on the device, from graph primitives (int32 arithmetic, no kernel of its own).

Element ``i`` of a draw is a hash of ``i`` and a key (the PCG hash: an LCG step, a random xorshift and a multiply;
Jarzynski and Olano, "Hash Functions for GPU Rendering", JCGT 2020), so a draw needs no state, parallelises over
elements and gives the same bits on every target. The key mixes the op's seed with the *run number*: a counter kept
by the package as state (:func:`run_number`, one int32 a package, incremented in place by every run), so each run
draws afresh, as onnxruntime does, and a fresh session replays the same sequence for the same seeds. Used by the
ONNX random operators (:mod:`kiln.frontend.onnx.ops.random`) and by the language models' sampler
(:mod:`kiln.frontend.sampling`, keyed by the caller's seed and step instead).
"""

from __future__ import annotations

import numpy as np

from kiln.arith import symbolic
from kiln.frontend.shapes import reshape
from kiln.ir.graph import Builder, Value

#: the PCG hash's constants as int32 (the uint32 values wrapped): 747796405, 2891336453, 277803737
_PCG = (747796405, 2891336453 - 2**32, 277803737)
#: the state input holding the run number (and, as ``RUN_COUNTER + ".next"``, its update)
RUN_COUNTER = "kiln_random_run"


def i32(b: Builder, x: int) -> Value:
    """An int32 scalar constant."""
    return b.const(np.array(x, np.int32))


def shr(b: Builder, x: Value, s: Value | int) -> Value:
    """Logical shift right of int32 ``x`` by ``s`` in 1..31 (an arithmetic shift, then the sign bits masked)."""
    s = i32(b, s) if isinstance(s, int) else s
    mask = b.op("Sub", [b.op("BitShiftLeft", [i32(b, 1), b.op("Sub", [i32(b, 32), s])]), i32(b, 1)])
    return b.op("BitwiseAnd", [b.op("BitShiftRight", [x, s]), mask])


def pcg_hash(b: Builder, x: Value) -> Value:
    """int32 -> int32: the PCG hash of the bit pattern (:func:`pcg_hash_numpy` in int32 operations: multiplication
    wraps, shifts are logical)."""
    state = b.op("Add", [b.op("Mul", [x, i32(b, _PCG[0])]), i32(b, _PCG[1])])
    shift = b.op("Add", [shr(b, state, 28), i32(b, 4)])
    word = b.op("Mul", [b.op("BitwiseXor", [shr(b, state, shift), state]), i32(b, _PCG[2])])
    return b.op("BitwiseXor", [shr(b, word, 22), word])


def pcg_hash_numpy(x: np.ndarray) -> np.ndarray:
    """uint32 ``[...]`` -> uint32: the PCG hash, in numpy (the reference of :func:`pcg_hash`)."""
    with np.errstate(over="ignore"):
        state = x.astype(np.uint32) * np.uint32(747796405) + np.uint32(2891336453)
        word = ((state >> ((state >> np.uint32(28)) + np.uint32(4))) ^ state) * np.uint32(277803737)
        return (word >> np.uint32(22)) ^ word


def run_number(b: Builder) -> Value:
    """The run number, int32 ``[1]``: 1 at a session's first run, 2 at its second, ... (wrapping at 2^32). It is the
    package's state :data:`RUN_COUNTER` (``[1, 1]``, zero when a package loads) updated in place by an in-place
    TensorScatter of itself plus one; the graph's first call adds it, later calls share it."""
    g = b.graph
    if RUN_COUNTER in g.state:
        nxt = next(v for v in g.outputs if v.name == g.state[RUN_COUNTER])
    else:
        counter = Value(RUN_COUNTER, "int32", (1, 1))
        g.inputs.append(counter)
        b._names.add(RUN_COUNTER)
        nxt = b.op("TensorScatter", [counter, b.op("Add", [counter, b.const(np.ones((1, 1), np.int32))])], axis=1,
                   mode="linear", name=RUN_COUNTER + ".next")
        nxt.name = RUN_COUNTER + ".next"
        g.state[RUN_COUNTER] = nxt.name
        g.outputs.append(nxt)
    return reshape(b, nxt, (1,))  # (a view: the readers are no elementwise chain after the in-place scatter)


def seed_key(seed: float) -> int:
    """The int32 key of an ONNX ``seed`` attribute (its float32 bits, hashed)."""
    bits = np.array([np.float32(seed).view(np.uint32) ^ np.uint32(0x9E3779B9)], np.uint32)
    return int(pcg_hash_numpy(bits)[0].view(np.int32))


def uniform(b: Builder, key: Value, shape, streams: int = 1, stream: int = 0) -> Value:
    """float32 uniforms in ``(0, 1)`` on a 2^-24 grid (``(k + 0.5) 2^-24``: never 0 or 1, so logarithms stay finite),
    one per element of ``shape`` (ints or size expressions), from int32 ``key`` (``[1]``): element ``i`` of ``stream``
    hashes ``i * streams + stream`` with the key."""
    n = symbolic.prod(shape)
    counter = b.op("Iota", [], shape=(n,), start=stream, delta=streams, dtype="int32")
    bits = shr(b, pcg_hash(b, b.op("BitwiseXor", [counter, key])), 8)  # 24 random bits
    u = b.op("Mul", [b.op("Add", [b.op("Cast", [bits], to="float32"), b.const(np.float32(0.5))]),
                     b.const(np.float32(2.0 ** -24))])
    return reshape(b, u, tuple(shape))


def run_key(b: Builder, seed: float) -> Value:
    """int32 ``[1]``: the key of a draw with ``seed`` in this run (the seed's key and the run number, hashed)."""
    return pcg_hash(b, b.op("Add", [pcg_hash(b, run_number(b)), i32(b, seed_key(seed))]))
