"""Rounding float32 values to the narrow float formats (bfloat16, float8, float4) as tensor expressions.

Narrow-float tensors are computed and stored as f32 (every value of these formats is exactly an f32);
a Cast to one, and every kernel writing one, rounds its f32 result to the format here, so a stored
value is always representable and readback converts it exactly (``ml_dtypes``).

Formats (ONNX "Float stored in 8 bits" / "4 bit floating point", ``docs/Operators.md#Cast``):

| dtype | mantissa bits | smallest normal | largest finite | overflow (saturate=0) |
|---|---:|---:|---:|---|
| float8e4m3fn | 3 | 2^-6 | 448 | NaN (no infinities) |
| float8e4m3fnuz | 3 | 2^-7 | 240 | NaN |
| float8e5m2 | 2 | 2^-14 | 57344 | +-inf |
| float8e5m2fnuz | 2 | 2^-15 | 57344 | NaN |
| float4e2m1 | 1 | 2^0 | 6 | always saturates; NaN becomes 0 (no NaN) |

Rounding is to nearest, ties to even. With ``saturate`` (ONNX Cast-19's default) values beyond the largest
finite one, infinities included, become +-largest; NaN stays NaN. bfloat16 rounds the f32 bits to their
upper 16 (ties to even), overflowing to infinity, NaN kept.
"""

from __future__ import annotations

from kiln.arith.expr import Expr, binop, call, const, select


def isnan(x: Expr) -> Expr:
    """True for NaN, from the bits (``x != x`` may be folded away by shader compilers that assume no NaNs)."""
    return binop(">", binop("&", call("bitcast_i32", x), 0x7FFFFFFF), 0x7F800000)


#: dtype -> (mantissa bits, exponent of the smallest normal, largest finite value, what overflow gives)
FORMATS: dict[str, tuple[int, int, float, str]] = {
    "float8e4m3fn": (3, -6, 448.0, "nan"),
    "float8e4m3fnuz": (3, -7, 240.0, "nan"),
    "float8e5m2": (2, -14, 57344.0, "inf"),
    "float8e5m2fnuz": (2, -15, 57344.0, "nan"),
    "float4e2m1": (1, 0, 6.0, "saturate"),
}


def _pow2(e: Expr) -> Expr:
    """``2 ** e`` for an int32 expression ``e`` in [-126, 127], exactly (built from the f32 exponent bits)."""
    return call("bitcast_f32", binop("<<", e + 127, 23))


def round_bfloat16(x: Expr) -> Expr:
    """``x`` (f32) rounded to bfloat16 (ties to even), overflowing to infinity, NaN kept."""
    bits = call("bitcast_i32", x)
    rounded = binop("&", bits + 0x7FFF + binop("&", binop(">>", bits, 16), 1), -65536)
    return select(isnan(x), x, call("bitcast_f32", rounded))


def round_e8m0(x: Expr, saturate: bool, round_mode: str) -> Expr:
    """``x`` (f32) as float8e8m0 (a power of two ``2^(e-127)``, ``e`` in [0, 254]; 255 is NaN), from the
    exponent bits of |x| rounded ``up`` (any fraction bit), ``down`` or to ``nearest`` (guard/round/sticky
    bits), as onnx.numpy_helper.to_float8e8m0: NaN and infinity give NaN; with ``saturate`` the largest
    exponent does not round up into NaN. ``e = 0`` (2^-127) is an f32 subnormal, made from its bits."""
    bits = call("bitcast_i32", x)
    e = binop("&", binop(">>", bits, 23), 255)
    frac = binop("&", bits, 0x7FFFFF)
    if round_mode == "up":
        up = binop("!=", frac, 0)
    elif round_mode == "nearest":
        g = binop("!=", binop("&", frac, 0x400000), 0)
        rest = binop("||", binop("!=", binop("&", frac, 0x3FFFFF), 0), binop(">", e, 0))
        up = binop("&&", g, rest)
    else:
        up = const(False, "bool")
    if saturate:
        up = binop("&&", up, binop("!=", e, 254))
    eo = e + select(up, const(1, "int32"), const(0, "int32"))
    out = select(binop("==", eo, 0), const(0x00400000, "int32"), binop("<<", eo, 23))
    nan = binop("||", binop("==", e, 255), binop("==", eo, 255))
    # selected as bits and bitcast once: a float select may flush the subnormal 2^-127 to zero
    return call("bitcast_f32", select(nan, const(0x7FC00000, "int32"), out))


def round_narrow(x: Expr, dtype: str, saturate: bool = False, round_mode: str = "up") -> Expr:
    """``x`` (f32) rounded to the narrow float ``dtype`` (a key of :data:`FORMATS`, ``bfloat16`` or
    ``float8e8m0``, which rounds by ``round_mode``), as f32.

    Out-of-range values saturate to +-largest with ``saturate``, else become what the format gives on
    overflow (see :data:`FORMATS`).
    """
    if dtype == "bfloat16":
        return round_bfloat16(x)
    if dtype == "float8e8m0":
        return round_e8m0(x, saturate, round_mode)
    mbits, emin, largest, overflow = FORMATS[dtype]
    a = call("abs", x)
    e = call("max", binop("&", binop(">>", call("bitcast_i32", a), 23), 255) - 127, emin)
    # a * 2^(mbits - e) < 2^(mbits + 1): scaling by powers of two is exact, round() is ties-to-even in WGSL
    r = call("round", a * _pow2(mbits - e)) * _pow2(e - mbits)
    # beyond the largest finite value after rounding; or infinite (r is NaN for infinity when mbits = 1)
    big = binop("||", binop(">", r, largest), binop(">", a, 3.4028234663852886e38))
    if saturate or overflow == "saturate":
        r = select(big, const(largest, "float32"), r)
    else:
        r = select(big, const(float("inf") if overflow == "inf" else float("nan"), "float32"), r)
    signed = select(binop("<", call("bitcast_i32", x), 0), -r, r)
    nan = const(0.0, "float32") if overflow == "saturate" else x
    return select(isnan(x), nan, signed)


def is_narrow_float(dtype: str) -> bool:
    """True for the dtypes :func:`round_narrow` rounds to."""
    return dtype in ("bfloat16", "float8e8m0") or dtype in FORMATS
