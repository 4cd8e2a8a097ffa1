"""ONNX random operators: RandomUniform, RandomUniformLike, RandomNormal, RandomNormalLike, Bernoulli, Multinomial.

The draws are made on the device at every run (:mod:`kiln.frontend.hashing`): element ``i`` hashes ``i`` with a key
of the op's ``seed`` attribute (0 when the model sets none) and the package's run number, a counter the package keeps
as state and increments in place each run. So every run draws afresh, as onnxruntime does, and a freshly loaded
session replays the same sequence for the same seeds (onnxruntime's generator differs, so random outputs are
compared with it statistically). Shapes may hold run-time dims. Normals come from Box-Muller over two uniform
streams; Bernoulli is a comparison with a uniform draw; Multinomial is Gumbel-max sampling, ``argmax(log p + G)``
with ``G = -log(-log u)`` Gumbel noise (Gumbel 1954), as sampling from a categorical distribution. The run counter
is state updated in place, which the webgl2 target does not have.
"""

from __future__ import annotations

import numpy as np

from kiln.errors import KilnError, ShapeError
from kiln.frontend.hashing import run_key, uniform
from kiln.frontend.onnx.registry import onnx_op
from kiln.frontend.shapes import reshape
from kiln.ir import dtypes
from kiln.ir.graph import Builder, Value

_FLOATS = ("float32", "float16", "float64")


def _dtype(dtype: int | None, like: Value | None, what: str) -> str:
    name = dtypes.from_onnx(dtype) if dtype is not None else (like.dtype if like is not None else "float32")
    if name not in _FLOATS:
        raise KilnError(f"{what}: dtype {name} is not supported (float16, float32, float64)")
    return name


def _shape(shape, what: str) -> tuple:
    dims = tuple(shape)
    if any(isinstance(d, (int, np.integer)) and d < 0 for d in dims):
        raise ShapeError(f"{what}: negative dim in shape {list(dims)}")
    return dims


def _uniform(b: Builder, seed: float, shape, low: float, high: float, dtype: str) -> Value:
    u = uniform(b, run_key(b, seed), shape)
    if (low, high) != (0.0, 1.0):
        u = b.op("Add", [b.op("Mul", [u, b.const(np.float32(high - low))]), b.const(np.float32(low))])
    return b.op("Cast", [u], to=dtype) if dtype != "float32" else u


def _normal(b: Builder, seed: float, shape, mean: float, scale: float, dtype: str) -> Value:
    key = run_key(b, seed)
    u1, u2 = uniform(b, key, shape, 2, 0), uniform(b, key, shape, 2, 1)
    radius = b.op("Sqrt", [b.op("Mul", [b.op("Log", [u1]), b.const(np.float32(-2.0))])])
    z = b.op("Mul", [radius, b.op("Cos", [b.op("Mul", [u2, b.const(np.float32(2 * np.pi))])])])
    if (mean, scale) != (0.0, 1.0):
        z = b.op("Add", [b.op("Mul", [z, b.const(np.float32(scale))]), b.const(np.float32(mean))])
    return b.op("Cast", [z], to=dtype) if dtype != "float32" else z


@onnx_op("RandomUniform", since=1)
def random_uniform(b: Builder, *, shape, dtype: int | None = None, high: float = 1.0, low: float = 0.0,
                   seed: float = 0.0) -> Value:
    """ONNX RandomUniform-1: ``low + (high - low) u``, ``u`` uniform in ``(0, 1)`` (drawn at every run, see the module
    docstring).

    Raises:
        KilnError: an integer dtype.
    """
    return _uniform(b, seed, _shape(shape, "RandomUniform"), low, high, _dtype(dtype, None, "RandomUniform"))


@onnx_op("RandomUniformLike", since=1)
def random_uniform_like(b: Builder, x: Value, *, dtype: int | None = None, high: float = 1.0, low: float = 0.0,
                        seed: float = 0.0) -> Value:
    """ONNX RandomUniformLike-1: RandomUniform of ``x``'s shape (dtype ``x``'s unless given)."""
    return _uniform(b, seed, x.shape, low, high, _dtype(dtype, x, "RandomUniformLike"))


@onnx_op("RandomNormal", since=1)
def random_normal(b: Builder, *, shape, dtype: int | None = None, mean: float = 0.0, scale: float = 1.0,
                  seed: float = 0.0) -> Value:
    """ONNX RandomNormal-1: ``mean + scale z``, ``z`` standard normal (Box-Muller; drawn at every run)."""
    return _normal(b, seed, _shape(shape, "RandomNormal"), mean, scale, _dtype(dtype, None, "RandomNormal"))


@onnx_op("RandomNormalLike", since=1)
def random_normal_like(b: Builder, x: Value, *, dtype: int | None = None, mean: float = 0.0, scale: float = 1.0,
                       seed: float = 0.0) -> Value:
    """ONNX RandomNormalLike-1: RandomNormal of ``x``'s shape (dtype ``x``'s unless given)."""
    return _normal(b, seed, x.shape, mean, scale, _dtype(dtype, x, "RandomNormalLike"))


@onnx_op("Bernoulli", since=15)
def bernoulli(b: Builder, p: Value, *, dtype: int | None = None, seed: float = 0.0) -> Value:
    """ONNX Bernoulli-15: 1 where a uniform draw is below the probability ``p`` (elementwise), else 0, as ``dtype``
    (``p``'s unless given)."""
    u = _uniform(b, seed, p.shape, 0.0, 1.0, "float32")
    hit = b.op("Less", [u, b.op("Cast", [p], to="float32") if p.dtype != "float32" else p])
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
    batch, classes = x.shape
    u = _uniform(b, seed, (batch, int(sample_size), classes), 0.0, 1.0, "float32")
    gumbel = b.op("Neg", [b.op("Log", [b.op("Neg", [b.op("Log", [u])])])])
    logits = b.op("Cast", [x], to="float32") if x.dtype != "float32" else x
    scores = b.op("Add", [reshape(b, logits, (batch, 1, classes)), gumbel])
    best = b.op("ReduceMax", [scores], axes=(2,), keepdims=1)
    idx = b.op("ArgMax", [scores, best], axis=2, keepdims=0, select_last_index=0)
    return b.op("Cast", [idx], to=out) if idx.dtype != out else idx
