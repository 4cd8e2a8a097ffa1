"""ONNX random operators: RandomUniform, RandomUniformLike, RandomNormal, RandomNormalLike, Bernoulli, Multinomial.

The generator is counter-based: element ``i`` of a draw is a hash of ``i`` and the seed (Jarzynski and Olano's PCG
hash, "Hash Functions for GPU Rendering", JCGT 2020), so a draw needs no state and is the same on every target.
With the seed and the shapes known when compiling, the uniform and normal draws are computed then and kept as
constants of the package: **every run sees the same values** for a given ``seed`` attribute (a model without one
gets seed 0). onnxruntime instead draws afresh at every run (from its seed, if given), so random outputs are
compared with it statistically, not elementwise. Bernoulli and Multinomial combine such draws with their run-time
inputs on the device (a comparison; Gumbel-max sampling: ``argmax(log p + G)`` with ``G`` Gumbel noise, Gumbel
1954, as sampling from a categorical distribution).
"""

from __future__ import annotations

import numpy as np

from kiln.arith import symbolic
from kiln.errors import KilnError, ShapeError
from kiln.frontend.onnx.registry import onnx_op
from kiln.frontend.shapes import reshape
from kiln.ir import dtypes
from kiln.ir.graph import Builder, Value, check_constant_size

_FLOATS = ("float32", "float16", "float64")


def pcg_hash(x: np.ndarray) -> np.ndarray:
    """uint32 ``[...]`` -> uint32: the PCG hash (an LCG step, then a random xorshift and a multiply)."""
    with np.errstate(over="ignore"):
        state = x.astype(np.uint32) * np.uint32(747796405) + np.uint32(2891336453)
        word = ((state >> ((state >> np.uint32(28)) + np.uint32(4))) ^ state) * np.uint32(277803737)
        return (word >> np.uint32(22)) ^ word


def uniform01(seed: float, shape: tuple[int, ...], stream: int = 0) -> np.ndarray:
    """float64 uniforms in ``[0, 1)`` on a 2^-24 grid, one per element of ``shape`` (row-major counter), from
    ``seed`` and ``stream`` (independent draws of one op)."""
    key = pcg_hash(np.array([np.float32(seed).view(np.uint32) ^ np.uint32(0x9E3779B9)], np.uint32))[0]
    n = int(np.prod(shape, dtype=np.int64))
    counter = np.arange(n, dtype=np.uint64) * 4 + stream
    h = pcg_hash((counter.astype(np.uint32) ^ key) + pcg_hash((counter >> np.uint64(32)).astype(np.uint32)))
    return ((h >> np.uint32(8)).astype(np.float64) * 2.0 ** -24).reshape(shape)


def _static_shape(shape, what: str) -> tuple[int, ...]:
    if not symbolic.is_static(tuple(shape)):
        raise KilnError(f"{what}: a random draw of run-time shape {list(shape)} is not supported yet (the values are "
                        "drawn when compiling)")
    dims = tuple(int(d) for d in shape)
    check_constant_size(what, what, [("float64", dims)])  # drawn in float64 when compiling
    return dims


def _dtype(dtype: int | None, like: Value | None, what: str) -> str:
    name = dtypes.from_onnx(dtype) if dtype is not None else (like.dtype if like is not None else "float32")
    if name not in _FLOATS:
        raise KilnError(f"{what}: dtype {name} is not supported (float16, float32, float64)")
    return name


def normal(seed: float, shape: tuple[int, ...]) -> np.ndarray:
    """float64 standard normals (Box-Muller over two uniform streams)."""
    u1 = 1.0 - uniform01(seed, shape, 0)  # (0, 1]: its logarithm is finite
    u2 = uniform01(seed, shape, 1)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


@onnx_op("RandomUniform", since=1)
def random_uniform(b: Builder, *, shape, dtype: int | None = None, high: float = 1.0, low: float = 0.0,
                   seed: float = 0.0) -> Value:
    """ONNX RandomUniform-1: ``low + (high - low) u``, ``u`` uniform in ``[0, 1)`` (see the module docstring: drawn
    when compiling, the same at every run).

    Raises:
        KilnError: an integer dtype.
    """
    name = _dtype(dtype, None, "RandomUniform")
    u = uniform01(seed, _static_shape(shape, "RandomUniform"))
    return b.const((low + (high - low) * u).astype(dtypes.NUMPY[name]), name="random_uniform", dtype=name)


@onnx_op("RandomUniformLike", since=1)
def random_uniform_like(b: Builder, x: Value, *, dtype: int | None = None, high: float = 1.0, low: float = 0.0,
                        seed: float = 0.0) -> Value:
    """ONNX RandomUniformLike-1: RandomUniform of ``x``'s shape (dtype ``x``'s unless given)."""
    name = _dtype(dtype, x, "RandomUniformLike")
    u = uniform01(seed, _static_shape(x.shape, "RandomUniformLike"))
    return b.const((low + (high - low) * u).astype(dtypes.NUMPY[name]), name="random_uniform", dtype=name)


@onnx_op("RandomNormal", since=1)
def random_normal(b: Builder, *, shape, dtype: int | None = None, mean: float = 0.0, scale: float = 1.0,
                  seed: float = 0.0) -> Value:
    """ONNX RandomNormal-1: ``mean + scale z``, ``z`` standard normal (Box-Muller; drawn when compiling)."""
    name = _dtype(dtype, None, "RandomNormal")
    z = normal(seed, _static_shape(shape, "RandomNormal"))
    return b.const((mean + scale * z).astype(dtypes.NUMPY[name]), name="random_normal", dtype=name)


@onnx_op("RandomNormalLike", since=1)
def random_normal_like(b: Builder, x: Value, *, dtype: int | None = None, mean: float = 0.0, scale: float = 1.0,
                       seed: float = 0.0) -> Value:
    """ONNX RandomNormalLike-1: RandomNormal of ``x``'s shape (dtype ``x``'s unless given)."""
    name = _dtype(dtype, x, "RandomNormalLike")
    z = normal(seed, _static_shape(x.shape, "RandomNormalLike"))
    return b.const((mean + scale * z).astype(dtypes.NUMPY[name]), name="random_normal", dtype=name)


@onnx_op("Bernoulli", since=15)
def bernoulli(b: Builder, p: Value, *, dtype: int | None = None, seed: float = 0.0) -> Value:
    """ONNX Bernoulli-15: 1 where a uniform draw is below the probability ``p`` (elementwise), else 0, as ``dtype``
    (``p``'s unless given)."""
    u = uniform01(seed, _static_shape(p.shape, "Bernoulli"))
    hit = b.op("Less", [b.const(u.astype(dtypes.NUMPY[p.dtype]), name="bernoulli_draw", dtype=p.dtype), p])
    out = dtypes.from_onnx(dtype) if dtype is not None else p.dtype
    return b.op("Cast", [hit], to=out)


@onnx_op("Multinomial", since=7)
def multinomial(b: Builder, x: Value, *, dtype: int = 6, sample_size: int = 1, seed: float = 0.0) -> Value:
    """ONNX Multinomial-7: ``sample_size`` class indices per row of ``x [batch, classes]`` (unnormalised log
    probabilities), drawn by Gumbel-max: ``argmax_c x[b, c] + G[b, s, c]``, ``G = -log(-log u)``.

    Raises:
        ShapeError: ``x`` not of rank 2; KilnError: an output dtype other than int32 or int64.
    """
    if len(x.shape) != 2:
        raise ShapeError(f"Multinomial: input {list(x.shape)} must be [batch, classes]")
    out = dtypes.from_onnx(dtype)
    if out not in ("int32", "int64"):
        raise KilnError(f"Multinomial: dtype {out} is not supported (int32, int64)")
    batch, classes = _static_shape(x.shape, "Multinomial")
    u = uniform01(seed, (batch, int(sample_size), classes))
    gumbel = -np.log(-np.log(np.clip(u, 2.0 ** -25, None)))
    scores = b.op("Add", [reshape(b, x, (batch, 1, classes)),
                          b.const(gumbel.astype(dtypes.NUMPY[x.dtype]), name="gumbel", dtype=x.dtype)])
    best = b.op("ReduceMax", [scores], axes=(2,), keepdims=1)
    idx = b.op("ArgMax", [scores, best], axis=2, keepdims=0, select_last_index=0)
    return b.op("Cast", [idx], to=out) if idx.dtype != out else idx
