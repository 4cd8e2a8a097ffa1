"""Narrow dtypes (bfloat16, float8, float4, float8e8m0, int4/uint4/int2/uint2) against onnx's reference
Cast, bit for bit: every value of each format, the midpoints between neighbours (ties to even) and the
floats just either side of them, out-of-range values, infinities and NaN, plus fresh random values."""

from __future__ import annotations

import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import kiln

FLOATS = {"BFLOAT16": ml_dtypes.bfloat16, "FLOAT8E4M3FN": ml_dtypes.float8_e4m3fn,
          "FLOAT8E4M3FNUZ": ml_dtypes.float8_e4m3fnuz, "FLOAT8E5M2": ml_dtypes.float8_e5m2,
          "FLOAT8E5M2FNUZ": ml_dtypes.float8_e5m2fnuz, "FLOAT4E2M1": ml_dtypes.float4_e2m1fn}
INTS = {"INT4": ml_dtypes.int4, "UINT4": ml_dtypes.uint4, "INT2": ml_dtypes.int2, "UINT2": ml_dtypes.uint2}


def _probe(dtype, rng) -> np.ndarray:
    """Every finite value of a <= 8-bit float format (a sample of bfloat16's), the midpoints between
    neighbours and their float32 neighbours, specials, and random values over the format's range."""
    info = ml_dtypes.finfo(dtype)
    if dtype == ml_dtypes.bfloat16:  # a sample over the whole exponent range
        vals = rng.standard_normal(2000).astype(np.float32) * np.float32(10.0) ** rng.integers(-38, 38, 2000)
        vals = vals.astype(dtype).astype(np.float32)
    elif dtype == ml_dtypes.float4_e2m1fn:
        vals = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
        vals = np.concatenate([vals, -vals])
    else:  # every bit pattern of a float8 format
        vals = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32)
    vals = np.unique(vals[np.isfinite(vals)])
    mids = (vals[:-1].astype(np.float64) + vals[1:]) / 2
    mids = mids.astype(np.float32)
    near = np.concatenate([np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))])
    big = float(info.max) if dtype != ml_dtypes.bfloat16 else 3e38
    special = np.array([np.inf, -np.inf, np.nan, big * 1.02, -big * 1.02, big * 4, 1e-30, -1e-30, 0.0, -0.0],
                       np.float32)
    rand = rng.uniform(-big * 1.1, big * 1.1, 500).astype(np.float32)
    return np.concatenate([vals, mids, near, special, rand]).astype(np.float32)


def _cast_model(to: int, n: int, **attrs) -> onnx.ModelProto:
    node = helper.make_node("Cast", ["x"], ["y"], to=to, **attrs)
    graph = helper.make_graph([node], "cast", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                              [helper.make_tensor_value_info("y", to, [n])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)], ir_version=11)


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(model, Path(tmp) / "m.onnx")
        return kiln.load(kiln.compile(Path(tmp) / "m.onnx", Path(tmp) / "pkg"), poison=True).run(feeds)["y"]


def _same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype
    g, w = got.astype(np.float32), want.astype(np.float32)
    bad = ~((g == w) | (np.isnan(g) & np.isnan(w)))
    assert not bad.any(), f"{bad.sum()} differ, e.g. {list(zip(g[bad][:5], w[bad][:5]))}"


@pytest.mark.parametrize("name,saturate", [(n, 1) for n in FLOATS] + [(n, 0) for n in FLOATS if "FLOAT8" in n])
def test_cast_to_narrow_float(rng, name, saturate):
    """``saturate`` (default 1) applies to float8 targets only."""
    x = _probe(FLOATS[name], rng)
    model = _cast_model(getattr(TensorProto, name), x.size, **({} if saturate else {"saturate": 0}))
    _same(_run(model, {"x": x}), ReferenceEvaluator(model).run(None, {"x": x})[0])


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
def test_cast_to_float8e8m0(rng, round_mode):
    e = rng.integers(-126, 127, 300)
    x = np.concatenate([np.ldexp(rng.uniform(1, 2, 300), e), np.ldexp(1.0, e), np.ldexp(1.5, e),
                        [0.0, np.inf, np.nan, 3e38]]).astype(np.float32)
    model = _cast_model(TensorProto.FLOAT8E8M0, x.size, round_mode=round_mode)
    _same(_run(model, {"x": x}), ReferenceEvaluator(model).run(None, {"x": x})[0])


@pytest.mark.parametrize("name", list(INTS))
def test_cast_to_narrow_int(rng, name):
    x = np.concatenate([np.arange(-20, 21), rng.integers(-1000, 1000, 200)]).astype(np.float32)
    model = _cast_model(getattr(TensorProto, name), x.size)
    _same(_run(model, {"x": x}), ReferenceEvaluator(model).run(None, {"x": x})[0])


def test_bfloat16_arithmetic_rounds_at_kernel_boundaries(rng):
    """bfloat16 inputs upload exactly; an Add's result is rounded to bfloat16 as ml_dtypes' own add does."""
    a, c = (rng.standard_normal(64).astype(ml_dtypes.bfloat16) for _ in range(2))
    node = helper.make_node("Add", ["a", "c"], ["y"])
    vi = [helper.make_tensor_value_info(n, TensorProto.BFLOAT16, [64]) for n in ("a", "c", "y")]
    model = helper.make_model(helper.make_graph([node], "add", vi[:2], vi[2:]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    _same(_run(model, {"a": a, "c": c}), a + c)
