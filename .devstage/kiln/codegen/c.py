"""C rendering of lowered kernels for WebAssembly with SIMD128 (compiled by clang through ``zig cc``).

The lowered kernel IR (:mod:`kiln.te.lower`) describes what one *invocation* computes for its
flat tile index ``gid``. On a CPU the invocation grid becomes a loop over ``gid`` in
``[begin, end)`` (so workers can split it), and the loop is vectorised by hand: four
consecutive tiles run as the four lanes of WebAssembly's 128-bit SIMD (``v128``, the
WebAssembly SIMD proposal, phase 5), through clang's ``wasm_simd128.h`` intrinsics.

Vectorising renders the same statements with every value classified as

* **uniform** (``u``): one scalar for all lanes (loop counters, weights of one output channel),
* **lane-affine** (``a``): the int32 ``base + lane * stride`` (the grid index itself, output
  columns), kept as the scalar ``base``, so a load at stride 1 is one ``v128.load``,
* **vector** (``v``): a ``v128_t`` (anything else; int32 division and the transcendental functions
  run lane by lane).

Four tiles are taken together only when they lie in one row of the tile grid's innermost
(non-1) axis, so the grid's unravelling divides them uniformly; a row's last tiles (fewer than
four) and kernels the vectoriser cannot express run the plain scalar code. Loads guarded by
lowering (the taken branch of a ``Select``: a padded window's border) read whole vectors; their
base is clamped into ``[-3, size)``, which only moves vectors whose every lane is outside the
buffer, so lanes that matter read exactly (the package's memory keeps slack around the arena).
Loads at lane stride 2 (stride-2 convolutions) read two whole vectors and shuffle the even lanes.

Semantics follow the WGSL renderer: float ``min``/``max`` propagate NaN (``f32.min``), integer
``/`` and ``%`` truncate and never trap (a zero divisor gives the dividend and 0, as WGSL),
float-to-int conversions saturate (``i32.trunc_sat_f32_s``), shift amounts are taken mod 32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kiln.te.expr import Bin, Call, Cast, Const, Expr, Select, Var
from kiln.te.lower import Assign, Barrier, BufLoad, Decl, For, If, Let, LoweredKernel, Store

#: Kiln dtype -> C scalar type (bools are 0/1 ints in scalar code, all-ones/zero lane masks in vectors)
TYPES = {"float32": "float", "int32": "int", "bool": "int"}

#: lanes of a v128 vector of 32-bit values
LANES = 4

#: expression function -> scalar C (float operands); ``{i}`` variants for int operands
_FLOAT_FN = {"exp": "expf", "log": "logf", "sin": "sinf", "cos": "cosf", "tan": "tanf", "sqrt": "__builtin_sqrtf",
             "abs": "__builtin_fabsf", "floor": "__builtin_floorf", "ceil": "__builtin_ceilf",
             "trunc": "__builtin_truncf", "round": "__builtin_rintf", "max": "__builtin_wasm_max_f32",
             "min": "__builtin_wasm_min_f32", "tanh": "kiln_tanhf", "atan": "kiln_atanf", "pow": "kiln_powf",
             "asin": "kiln_asinf", "acos": "kiln_acosf", "sinh": "kiln_sinhf", "cosh": "kiln_coshf",
             "asinh": "kiln_asinhf", "acosh": "kiln_acoshf", "atanh": "kiln_atanhf", "sign": "kiln_signf",
             "round_f16": "kiln_round_f16", "bitcast_i32": "kiln_bits_i32", "clamp": "kiln_clampf"}
_INT_FN = {"abs": "kiln_iabs", "max": "kiln_imax", "min": "kiln_imin", "sign": "kiln_isign",
           "bitcast_f32": "kiln_bits_f32", "clamp": "kiln_iclamp"}

#: vector forms of calls WebAssembly SIMD has instructions for (float, int)
_VEC_FLOAT_FN = {"sqrt": "wasm_f32x4_sqrt", "abs": "wasm_f32x4_abs", "floor": "wasm_f32x4_floor",
                 "ceil": "wasm_f32x4_ceil", "trunc": "wasm_f32x4_trunc", "round": "wasm_f32x4_nearest",
                 "max": "wasm_f32x4_max", "min": "wasm_f32x4_min", "clamp": "kiln_f32x4_clamp",
                 "sign": "kiln_f32x4_sign"}
_VEC_INT_FN = {"abs": "wasm_i32x4_abs", "max": "wasm_i32x4_max", "min": "wasm_i32x4_min",
               "clamp": "kiln_i32x4_clamp"}

PRELUDE = r"""// Kiln kernels for WebAssembly (SIMD128); generated from tensor expressions, do not edit.
#include <wasm_simd128.h>

#define KILN_EXPORT(name) __attribute__((export_name(name), used))
#define KILN_INF __builtin_inff()
#define KILN_NAN __builtin_nanf("")

float expf(float); float logf(float); float sinf(float); float cosf(float); float tanf(float);
double exp(double); double log(double);

static inline int kiln_guard(int i, int hi) { return (unsigned)i > (unsigned)hi ? hi : i; }
static inline int kiln_vbase(int i, int size) { return i < -3 ? -3 : (i >= size ? size - 1 : i); }
static inline int kiln_vbase2(int i, int size) { return i < -7 ? -7 : (i >= size ? size - 1 : i); }
static inline int kiln_idiv(int a, int b) { return b == 0 || (b == -1 && a == (-2147483647 - 1)) ? a : a / b; }
static inline int kiln_imod(int a, int b) { return b == 0 || b == -1 ? 0 : a % b; }
static inline float kiln_fmod(float a, float b) { return a - b * __builtin_truncf(a / b); }
static inline int kiln_imax(int a, int b) { return a > b ? a : b; }
static inline int kiln_imin(int a, int b) { return a < b ? a : b; }
static inline int kiln_iclamp(int x, int lo, int hi) { return kiln_imin(kiln_imax(x, lo), hi); }
static inline int kiln_iabs(int a) { return a < 0 ? -a : a; }
static inline int kiln_isign(int a) { return (a > 0) - (a < 0); }
static inline float kiln_clampf(float x, float lo, float hi) {
    return __builtin_wasm_min_f32(__builtin_wasm_max_f32(x, lo), hi);
}
static inline float kiln_signf(float x) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x); }
static inline int kiln_f2i(float x) { return __builtin_wasm_trunc_saturate_s_i32_f32(x); }
static inline int kiln_bits_i32(float x) { return __builtin_bit_cast(int, x); }
static inline float kiln_bits_f32(int x) { return __builtin_bit_cast(float, x); }
static inline int kiln_shl(int a, int b) { return (int)((unsigned)a << (b & 31)); }
static inline int kiln_shr(int a, int b) { return a >> (b & 31); }

// float functions LLVM's compiler-rt does not provide, computed in double precision (then rounded once)
static float kiln_tanhf(float x) {
    double a = __builtin_fabs((double)x);
    if (a < 1e-5) return x;
    if (a > 20.0) return x > 0 ? 1.0f : -1.0f;
    double e = exp(2.0 * a), t = (e - 1.0) / (e + 1.0);
    return (float)(x < 0 ? -t : t);
}
static float kiln_atanf(float xf) {  // Cephes atanf reduction with the double-precision atan series
    double x = xf, sign = 1.0, y = 0.0;
    if (x != x) return xf;
    if (x < 0) { sign = -1.0; x = -x; }
    if (x > 2.414213562373095) { y = 1.5707963267948966; x = -1.0 / x; }
    else if (x > 0.4142135623730950) { y = 0.7853981633974483; x = (x - 1.0) / (x + 1.0); }
    double z = x * x, p = 0.0;
    // atan(x) = x * sum_k (-z)^k / (2k+1), |x| <= tan(pi/8): 12 terms reach double rounding
    for (int k = 23; k >= 1; k -= 2) p = 1.0 / k - z * p;
    return (float)(sign * (y + x * p));
}
static float kiln_asinf(float x) { return kiln_atanf(x / __builtin_sqrtf((1.0f - x) * (1.0f + x))); }
static float kiln_acosf(float x) { return 2.0f * kiln_atanf(__builtin_sqrtf((1.0f - x) / (1.0f + x))); }
static float kiln_powf(float x, float y) {
    if (y == 0.0f) return 1.0f;
    if (x != x || y != y) return KILN_NAN;
    if (x == 1.0f) return 1.0f;
    double ax = __builtin_fabs((double)x), r;
    if (ax == 0.0) r = y > 0 ? 0.0 : KILN_INF;
    else r = exp((double)y * log(ax));
    if (x < 0.0f) {
        if (__builtin_truncf(y) != y) return KILN_NAN;
        if (__builtin_fmodf(__builtin_fabsf(y), 2.0f) == 1.0f) r = -r;
    }
    return (float)r;
}
static float kiln_sinhf(float x) {
    double a = x;
    if (__builtin_fabs(a) < 1e-4) return (float)(a + a * a * a / 6.0);
    return (float)((exp(a) - exp(-a)) * 0.5);
}
static float kiln_coshf(float x) { double a = x; return (float)((exp(a) + exp(-a)) * 0.5); }
static float kiln_asinhf(float x) {
    double a = __builtin_fabs((double)x), r;
    if (a < 1e-4) return x;
    r = log(a + __builtin_sqrt(a * a + 1.0));
    return (float)(x < 0 ? -r : r);
}
static float kiln_acoshf(float x) { double a = x; return (float)log(a + __builtin_sqrt(a * a - 1.0)); }
static float kiln_atanhf(float x) {
    double a = x;
    if (__builtin_fabs(a) < 1e-4) return x;
    return (float)(0.5 * log((1.0 + a) / (1.0 - a)));
}
// f32 rounded to the nearest half-precision value (ties to even), beyond f16's range +-infinity, NaN kept
static float kiln_round_f16(float x) {
    if ((kiln_bits_i32(x) & 0x7fffffff) > 0x7f800000) return x;
    if (__builtin_fabsf(x) >= 65520.0f) return x * 1e38f;
    if (__builtin_fabsf(x) < 6.103515625e-05f) return __builtin_rintf(x * 16777216.0f) / 16777216.0f;
    unsigned b = __builtin_bit_cast(unsigned, x);
    b += 0x0FFFu + ((b >> 13) & 1u);
    return __builtin_bit_cast(float, b & ~0x1FFFu);
}

// lane-by-lane helpers (operations SIMD128 has no instruction for)
#define KILN_MAP_F(fn, v) wasm_f32x4_make(fn(wasm_f32x4_extract_lane(v, 0)), fn(wasm_f32x4_extract_lane(v, 1)), \
    fn(wasm_f32x4_extract_lane(v, 2)), fn(wasm_f32x4_extract_lane(v, 3)))
#define KILN_MAP_F2(fn, a, b) wasm_f32x4_make(fn(wasm_f32x4_extract_lane(a, 0), wasm_f32x4_extract_lane(b, 0)), \
    fn(wasm_f32x4_extract_lane(a, 1), wasm_f32x4_extract_lane(b, 1)), \
    fn(wasm_f32x4_extract_lane(a, 2), wasm_f32x4_extract_lane(b, 2)), \
    fn(wasm_f32x4_extract_lane(a, 3), wasm_f32x4_extract_lane(b, 3)))
#define KILN_MAP_I(fn, v) wasm_i32x4_make(fn(wasm_i32x4_extract_lane(v, 0)), fn(wasm_i32x4_extract_lane(v, 1)), \
    fn(wasm_i32x4_extract_lane(v, 2)), fn(wasm_i32x4_extract_lane(v, 3)))
#define KILN_MAP_I2(fn, a, b) wasm_i32x4_make(fn(wasm_i32x4_extract_lane(a, 0), wasm_i32x4_extract_lane(b, 0)), \
    fn(wasm_i32x4_extract_lane(a, 1), wasm_i32x4_extract_lane(b, 1)), \
    fn(wasm_i32x4_extract_lane(a, 2), wasm_i32x4_extract_lane(b, 2)), \
    fn(wasm_i32x4_extract_lane(a, 3), wasm_i32x4_extract_lane(b, 3)))
#define KILN_GATHER(buf, i) wasm_v128_load32_lane(&(buf)[wasm_i32x4_extract_lane(i, 3)], \
    wasm_v128_load32_lane(&(buf)[wasm_i32x4_extract_lane(i, 2)], \
    wasm_v128_load32_lane(&(buf)[wasm_i32x4_extract_lane(i, 1)], \
    wasm_v128_load32_lane(&(buf)[wasm_i32x4_extract_lane(i, 0)], wasm_i32x4_splat(0), 0), 1), 2), 3)
static inline v128_t kiln_f32x4_clamp(v128_t x, v128_t lo, v128_t hi) {
    return wasm_f32x4_min(wasm_f32x4_max(x, lo), hi);
}
static inline v128_t kiln_i32x4_clamp(v128_t x, v128_t lo, v128_t hi) {
    return wasm_i32x4_min(wasm_i32x4_max(x, lo), hi);
}
static inline v128_t kiln_f32x4_sign(v128_t x) {
    v128_t one = wasm_f32x4_splat(1.0f), zero = wasm_f32x4_splat(0.0f);
    v128_t s = wasm_v128_bitselect(one, wasm_f32x4_neg(one), wasm_f32x4_gt(x, zero));
    return wasm_v128_bitselect(s, x, wasm_v128_or(wasm_f32x4_gt(x, zero), wasm_f32x4_lt(x, zero)));
}
static inline v128_t kiln_load_s2(const void* p) {  // elements 0, 2, 4, 6 from p
    return wasm_i32x4_shuffle(wasm_v128_load(p), wasm_v128_load((const char*)p + 16), 0, 2, 4, 6);
}
static inline v128_t kiln_iota(int base, int stride) {
    return wasm_i32x4_make(base, base + stride, base + 2 * stride, base + 3 * stride);
}
"""


#: kernels whose tile grid has at most this many blocks (rows of vectors) visit them column by column
COLUMN_ROWS = 32


class VectorUnsupported(Exception):
    """A kernel the lane vectoriser cannot express (it then runs scalar code only)."""


@dataclass(frozen=True)
class Val:
    """A rendered value: ``kind`` ``u`` (uniform scalar ``code``), ``a`` (int32 lanes ``code + lane*stride``;
    lanes stay within one aligned block of ``block`` grid tiles when ``block`` > 0), ``d`` (int32 lanes
    ``code + cx*x[lane] + cy*y[lane]`` over the lanes' two innermost grid coordinates; ``code`` is a
    multiple of ``mult`` when ``mult`` > 0) or ``v`` (``v128_t``)."""

    kind: str
    code: str
    dtype: str
    stride: int = 0
    block: int = 0
    cx: int = 0
    cy: int = 0
    mult: int = 0


def literal(value, dtype: str) -> str:
    """A C literal of ``dtype`` (special floats through the prelude's macros)."""
    if dtype == "bool":
        return "1" if value else "0"
    if dtype == "int32":
        v = int(value)
        return f"({v})" if v != -(2**31) else "(-2147483647 - 1)"
    f = float(np.float32(value))
    if math.isnan(f):
        return "KILN_NAN"
    if math.isinf(f):
        return "KILN_INF" if f > 0 else "(-KILN_INF)"
    r = repr(f)
    if "e" not in r and "." not in r:
        r += ".0"
    return f"({r}f)" if f < 0 else f"{r}f"


_CMP = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}


class _Renderer:
    """Renders statements of one kernel; ``env`` maps variable names to their :class:`Val`."""

    def __init__(self, env: dict[str, Val], vector_accs: set[str] | None = None, rows: tuple[int, int] = (0, 0)):
        self.env = dict(env)
        self.W, self.H = rows  # lanes cross rows of W tiles (in blocks of W*H): the ``d`` kind
        self.vector_accs = vector_accs if vector_accs is not None else set()
        self.promote: set[str] = set()  # accumulators found to need vectors (second pass)

    # ---------------------------------------------------------------- conversions
    def vec(self, x: Val) -> str:
        """``x`` as a ``v128_t`` expression (bools as lane masks)."""
        if x.kind == "v":
            return x.code
        if x.kind == "d":
            a = self.as_affine(x)
            if a.kind != "d":
                return self.vec(a)
            terms = [f"wasm_i32x4_mul(kiln_{n}, wasm_i32x4_splat({c}))" for n, c in (("x", x.cx), ("y", x.cy)) if c]
            out = f"wasm_i32x4_splat({x.code})"
            for t in terms:
                out = f"wasm_i32x4_add({out}, {t})"
            return out
        if x.kind == "a":
            return f"kiln_iota({x.code}, {x.stride})"
        if x.dtype == "float32":
            return f"wasm_f32x4_splat({x.code})"
        if x.dtype == "bool":
            return f"wasm_i32x4_splat(-({x.code}))"
        return f"wasm_i32x4_splat({x.code})"

    def as_affine(self, x: Val) -> Val:
        """A ``d`` value as ``a`` (or ``u``) when its lanes are contiguous in the block (``cy == cx * W``)."""
        if x.kind != "d" or x.cy != x.cx * self.W:
            return x
        if x.cx == 0:
            return Val("u", x.code, x.dtype)
        return Val("a", f"({x.code} + {x.cx} * kiln_p)", x.dtype, x.cx)

    @staticmethod
    def scalar(x: Val) -> str:
        if x.kind == "v":
            raise VectorUnsupported("vector where a scalar is needed")
        return x.code

    # ---------------------------------------------------------------- expressions
    def ex(self, e: Expr) -> Val:
        if isinstance(e, Const):
            return Val("u", literal(e.value, e.dtype), e.dtype)
        if isinstance(e, Var):
            if e.name not in self.env:
                raise KeyError(f"C: unbound variable {e.name}")
            return self.env[e.name]
        if isinstance(e, BufLoad):
            return self.load(e)
        if isinstance(e, Bin):
            return self.binop(e)
        if isinstance(e, Call):
            return self.call(e)
        if isinstance(e, Select):
            c, t, f = self.ex(e.cond), self.ex(e.t), self.ex(e.f)
            if c.kind != "v" and t.kind == f.kind == "u":
                return Val("u", f"({c.code} ? {t.code} : {f.code})", e.dtype)
            if c.kind != "v":
                return Val("v", f"({c.code} ? {self.vec(t)} : {self.vec(f)})", e.dtype)
            return Val("v", f"wasm_v128_bitselect({self.vec(t)}, {self.vec(f)}, {c.code})", e.dtype)
        if isinstance(e, Cast):
            return self.cast(self.ex(e.x), e.x.dtype, e.dtype)
        raise TypeError(f"C: cannot render {type(e).__name__}")

    def load(self, e: BufLoad) -> Val:
        i = self.as_affine(self.ex(e.index))
        if i.kind == "u":
            idx = f"kiln_guard({i.code}, {e.size - 1})" if e.guard else i.code
            return Val("u", f"{e.buf}[{idx}]", e.dtype)
        if i.kind == "a" and i.stride == 1:
            base = f"kiln_vbase({i.code}, {e.size})" if e.guard else i.code
            return Val("v", f"wasm_v128_load(&{e.buf}[{base}])", e.dtype)
        if i.kind == "a" and i.stride == 2:  # two whole vectors, the even lanes shuffled together
            base = f"kiln_vbase2({i.code}, {e.size})" if e.guard else i.code
            return Val("v", f"kiln_load_s2(&{e.buf}[{base}])", e.dtype)
        if i.kind == "a" and not e.guard:
            ctor = "wasm_f32x4_make" if e.dtype == "float32" else "wasm_i32x4_make"
            lanes = ", ".join(f"{e.buf}[{i.code} + {k * i.stride}]" for k in range(LANES))
            return Val("v", f"{ctor}({lanes})", e.dtype)
        idx = self.vec(i)
        if e.guard:
            idx = f"wasm_u32x4_min({idx}, wasm_i32x4_splat({e.size - 1}))"
        return Val("v", f"KILN_GATHER({e.buf}, {idx})", e.dtype)

    def binop(self, e: Bin) -> Val:
        a, b = self.ex(e.a), self.ex(e.b)
        op, dt = e.op, e.a.dtype
        if a.kind == "u" and b.kind == "u":
            return Val("u", self.scalar_bin(op, dt, a.code, b.code, e.b), e.dtype)
        if dt == "int32" and op in ("+", "-", "*", "//", "/", "%") and "v" not in (a.kind, b.kind):
            if "d" in (a.kind, b.kind):
                r = self.digit_bin(op, a, b, e.a, e.b)
            else:
                r = self.affine_bin(op, a, b, e.a, e.b)
            if r is not None:
                return r
        return Val("v", self.vector_bin(op, dt, self.vec(a), self.vec(b), b), e.dtype)

    @staticmethod
    def affine_bin(op: str, a: Val, b: Val, ea: Expr, eb: Expr) -> Val | None:
        """Lane-affine int arithmetic, or ``None`` when the result is no longer lane-affine."""
        k = int(eb.value) if isinstance(eb, Const) else None
        if op in ("+", "-"):
            sa = a.stride if a.kind == "a" else 0
            sb = b.stride if b.kind == "a" else 0
            s = sa + sb if op == "+" else sa - sb
            code = f"({a.code} {op} {b.code})"
            return Val("a", code, "int32", s) if s else Val("u", code, "int32")
        if op == "*":
            ka = int(ea.value) if isinstance(ea, Const) else None
            x, m = (a, k) if a.kind == "a" else (b, ka)
            if m is None:
                return None
            return Val("a", f"({x.code} * {m})", "int32", x.stride * m) if m else Val("u", "0", "int32")
        if op in ("//", "/") and a.kind == "a" and k and a.block and k % a.block == 0:
            return Val("u", f"({a.code} / {k})", "int32")
        if op == "%" and a.kind == "a" and k and a.block and k % a.block == 0:
            return Val("a", f"({a.code} % {k})", "int32", a.stride, a.block)
        return None

    @staticmethod
    def digit(base: str, cx: int, cy: int, mult: int = 0) -> Val:
        return Val("u", base, "int32") if cx == cy == 0 else Val("d", base, "int32", cx=cx, cy=cy, mult=mult)

    def digit_bin(self, op: str, a: Val, b: Val, ea: Expr, eb: Expr) -> Val | None:
        """Int arithmetic on ``d`` values (lanes crossing rows), or ``None`` when it leaves the form.

        The grid index unravels into digits: with ``base`` a multiple of ``W*H``, ``base + y*W + x``
        gives ``% W -> x``, ``// W -> base/W + y`` and ``% H`` of that ``-> y``.
        """
        if a.kind == "a" or b.kind == "a":
            return None
        W, H = self.W, self.H
        ka = int(ea.value) if isinstance(ea, Const) else None
        kb = int(eb.value) if isinstance(eb, Const) else None
        if op in ("+", "-"):
            sgn = 1 if op == "+" else -1
            return self.digit(f"({a.code} {op} {b.code})", a.cx + sgn * b.cx, a.cy + sgn * b.cy)
        if op == "*":
            x, k = (a, kb) if a.kind == "d" else (b, ka)
            if k is None:
                return None
            return self.digit(f"({x.code} * {k})", x.cx * k, x.cy * k)
        if a.kind != "d" or not kb or kb < 0 or not a.mult:
            return None
        c = kb
        if (a.cx, a.cy) == (1, W) and a.mult % (W * H) == 0:
            if c % (W * H) == 0:
                return (Val("d", f"({a.code} % {c})", "int32", cx=1, cy=W, mult=W * H) if op == "%"
                        else Val("u", f"({a.code} / {c})", "int32"))
            if c == W:
                return self.digit("0", 1, 0) if op == "%" else self.digit(f"({a.code} / {W})", 0, 1, H)
        if (a.cx, a.cy) == (0, 1) and a.mult % H == 0:
            if op == "%" and c == H:
                return self.digit("0", 0, 1)
            if c % H == 0:
                return (Val("d", f"({a.code} % {c})", "int32", cx=0, cy=1, mult=H) if op == "%"
                        else Val("u", f"({a.code} / {c})", "int32"))
        return None

    @staticmethod
    def scalar_bin(op: str, dt: str, a: str, b: str, eb: Expr) -> str:
        if op in ("//", "/", "%") and dt == "int32":
            k = int(eb.value) if isinstance(eb, Const) else 0
            if k not in (0, -1):
                return f"({a} {'%' if op == '%' else '/'} {k})"
            return f"{'kiln_imod' if op == '%' else 'kiln_idiv'}({a}, {b})"
        if op == "%":
            return f"kiln_fmod({a}, {b})"
        if op == "<<":
            return f"kiln_shl({a}, {b})"
        if op == ">>":
            return f"kiln_shr({a}, {b})"
        if op in ("max", "min"):
            return f"{(_FLOAT_FN if dt == 'float32' else _INT_FN)[op]}({a}, {b})"
        c = {"&&": "&", "||": "|"}.get(op, op)
        if c not in ("+", "-", "*", "/", "<", "<=", ">", ">=", "==", "!=", "&", "|", "^"):
            raise ValueError(f"C: unknown binary op {op!r}")
        return f"({a} {c} {b})"

    def vector_bin(self, op: str, dt: str, a: str, b: str, bv: Val) -> str:
        f = dt == "float32"
        if op in _CMP:
            return f"wasm_{'f32x4' if f else 'i32x4'}_{_CMP[op]}({a}, {b})"
        if op in ("&&", "&"):
            return f"wasm_v128_and({a}, {b})"
        if op in ("||", "|"):
            return f"wasm_v128_or({a}, {b})"
        if op == "^":
            return f"wasm_v128_xor({a}, {b})"
        if f:
            if op in ("+", "-", "*", "/"):
                return f"wasm_f32x4_{ {'+': 'add', '-': 'sub', '*': 'mul', '/': 'div'}[op]}({a}, {b})"
            if op in ("max", "min"):
                return f"wasm_f32x4_{op}({a}, {b})"
            if op == "%":
                return f"KILN_MAP_F2(kiln_fmod, {a}, {b})"
        else:
            if op in ("+", "-", "*"):
                return f"wasm_i32x4_{ {'+': 'add', '-': 'sub', '*': 'mul'}[op]}({a}, {b})"
            if op in ("max", "min"):
                return f"wasm_i32x4_{op}({a}, {b})"
            if op in ("//", "/"):
                return f"KILN_MAP_I2(kiln_idiv, {a}, {b})"
            if op == "%":
                return f"KILN_MAP_I2(kiln_imod, {a}, {b})"
            if op in ("<<", ">>"):
                if bv.kind == "u":
                    return f"wasm_i32x4_{'shl' if op == '<<' else 'shr'}({a}, {bv.code})"
                return f"KILN_MAP_I2({'kiln_shl' if op == '<<' else 'kiln_shr'}, {a}, {b})"
        raise ValueError(f"C: unknown binary op {op!r} on {dt} vectors")

    def call(self, e: Call) -> Val:
        args = [self.ex(a) for a in e.args]
        dt = e.args[0].dtype
        table = _FLOAT_FN if dt == "float32" else _INT_FN
        if e.fn not in table:
            raise ValueError(f"C: no {e.fn} for {dt}")
        if all(a.kind == "u" for a in args):
            return Val("u", f"{table[e.fn]}({', '.join(a.code for a in args)})", e.dtype)
        vs = [self.vec(a) for a in args]
        if e.fn in ("bitcast_i32", "bitcast_f32"):
            return Val("v", vs[0], e.dtype)  # a v128 is untyped
        vtable = _VEC_FLOAT_FN if dt == "float32" else _VEC_INT_FN
        if e.fn in vtable:
            return Val("v", f"{vtable[e.fn]}({', '.join(vs)})", e.dtype)
        m = "KILN_MAP_F" if dt == "float32" else "KILN_MAP_I"
        if len(vs) == 1:
            return Val("v", f"{m}({table[e.fn]}, {vs[0]})", e.dtype)
        if len(vs) == 2:
            return Val("v", f"{m}2({table[e.fn]}, {vs[0]}, {vs[1]})", e.dtype)
        raise VectorUnsupported(f"{e.fn} of {len(vs)} vector arguments")

    def cast(self, x: Val, src: str, dst: str) -> Val:
        if x.kind != "v":
            if x.kind in ("a", "d") and dst == "int32":
                return x
            if x.kind == "u":
                if dst == "bool":
                    return Val("u", f"({x.code} != 0)", dst)
                if dst == "int32" and src == "float32":
                    return Val("u", f"kiln_f2i({x.code})", dst)
                return Val("u", f"(({TYPES[dst]})({x.code}))", dst)
        v = self.vec(x)
        if dst == "bool":
            return Val("v", f"wasm_{'f32x4' if src == 'float32' else 'i32x4'}_ne({v}, "
                            f"wasm_{'f32x4' if src == 'float32' else 'i32x4'}_splat(0))", dst)
        if src == "bool":
            one = "wasm_f32x4_splat(1.0f)" if dst == "float32" else "wasm_i32x4_splat(1)"
            return Val("v", f"wasm_v128_and({v}, {one})", dst)
        if src == "int32" and dst == "float32":
            return Val("v", f"wasm_f32x4_convert_i32x4({v})", dst)
        if src == "float32" and dst == "int32":
            return Val("v", f"wasm_i32x4_trunc_sat_f32x4({v})", dst)
        return Val("v", v, dst)

    # ---------------------------------------------------------------- statements
    def stmts(self, stmts, indent: int) -> list[str]:
        pad = "    " * indent
        out: list[str] = []
        for s in stmts:
            if isinstance(s, Let):
                x = self.ex(s.value)
                name = s.var.name
                if x.kind == "u":
                    out.append(f"{pad}const {TYPES[x.dtype]} {name} = {x.code};")
                    self.env[name] = Val("u", name, x.dtype)
                elif x.kind == "a":
                    out.append(f"{pad}const int {name} = {x.code};")
                    self.env[name] = Val("a", name, x.dtype, x.stride, x.block)
                elif x.kind == "d":
                    out.append(f"{pad}const int {name} = {x.code};")
                    self.env[name] = Val("d", name, x.dtype, cx=x.cx, cy=x.cy, mult=x.mult)
                else:
                    out.append(f"{pad}const v128_t {name} = {x.code};")
                    self.env[name] = Val("v", name, x.dtype)
            elif isinstance(s, Decl):
                x = self.ex(s.value)
                name = s.var.name
                if name in self.vector_accs:
                    out.append(f"{pad}v128_t {name} = {self.vec(x)};")
                    self.env[name] = Val("v", name, s.var.dtype)
                else:
                    out.append(f"{pad}{TYPES[s.var.dtype]} {name} = {self.scalar(x)};")
                    self.env[name] = Val("u", name, s.var.dtype)
            elif isinstance(s, Assign):
                x = self.ex(s.value)
                name = s.var.name
                if self.env[name].kind == "v":
                    out.append(f"{pad}{name} = {self.vec(x)};")
                elif x.kind != "u":
                    self.promote.add(name)
                    out.append(f"{pad}/* {name} needs a vector */")
                else:
                    out.append(f"{pad}{name} = {x.code};")
            elif isinstance(s, For):
                v = s.var.name
                out.append(f"{pad}for (int {v} = 0; {v} < {s.extent}; {v}++) {{")
                self.env[v] = Val("u", v, "int32")
                out.extend(self.stmts(s.body, indent + 1))
                out.append(f"{pad}}}")
            elif isinstance(s, If):
                c = self.ex(s.cond)
                if c.kind != "v":
                    out.append(f"{pad}if ({c.code}) {{")
                    out.extend(self.stmts(s.body, indent + 1))
                    out.append(f"{pad}}}")
                else:
                    if not all(isinstance(b, Store) for b in s.body):
                        raise VectorUnsupported("a lane-dependent condition around more than stores")
                    out.append(f"{pad}{{")
                    out.append(f"{pad}    const v128_t mask = {c.code};")
                    for b in s.body:
                        out.extend(self.store(b, indent + 1, "mask"))
                    out.append(f"{pad}}}")
            elif isinstance(s, Store):
                out.extend(self.store(s, indent))
            elif isinstance(s, Barrier):
                raise TypeError("C: workgroup barriers (reduce lanes) have no CPU form; schedule without them")
            else:
                raise TypeError(f"C: cannot render statement {type(s).__name__}")
        return out

    def store(self, s: Store, indent: int, mask: str | None = None) -> list[str]:
        pad = "    " * indent
        i, x = self.as_affine(self.ex(s.index)), self.ex(s.value)
        if i.kind == "u" and x.kind == "u" and mask is None:
            return [f"{pad}{s.buf}[{i.code}] = {x.code};"]
        if i.kind == "u":
            raise VectorUnsupported("lanes storing to one address")
        v = self.vec(x)
        if i.kind == "a" and i.stride == 1 and mask is None:
            return [f"{pad}wasm_v128_store(&{s.buf}[{i.code}], {v});"]
        lines = [f"{pad}{{", f"{pad}    const v128_t value = {v};"]
        idx = self.vec(i)
        lines.append(f"{pad}    const v128_t index = {idx};")
        for k in range(LANES):
            lane = (f"{pad}    {s.buf}[wasm_i32x4_extract_lane(index, {k})] = "
                    f"wasm_{'f32x4' if x.dtype == 'float32' else 'i32x4'}_extract_lane(value, {k});")
            if mask:
                lane = f"{pad}    if (wasm_i32x4_extract_lane({mask}, {k})) " + lane.lstrip()
            lines.append(lane)
        lines.append(f"{pad}}}")
        return lines


def _params(k: LoweredKernel) -> str:
    out = []
    for p in k.params:
        const = "const " if p.access == "read" else ""
        out.append(f"{const}{TYPES[p.dtype]}* restrict {p.name}")
    return ", ".join(out + ["int begin", "int end"])


def _vector_body(k: LoweredKernel, grid: tuple[int, ...]) -> tuple[list[str], int] | None:
    """The body for four tiles at once and the block the four must lie in (``None``: no vector path).

    When the grid's innermost (non-1) extent ``W`` is a multiple of 4, vectors stay within a row
    (lane-affine ``gid``). Otherwise they run through rows of a ``W x H`` block (the two innermost
    axes), with the lanes' coordinates as vectors, so small feature maps (7 x 7) vectorise too.
    """
    dims = [d for d in grid if d > 1]
    if not dims:
        return None
    W = dims[-1]
    H = dims[-2] if len(dims) > 1 else 1
    if W % LANES == 0 or H == 1:
        block, rows = W, (0, 0)
        gid = Val("a", k.gid.name, "int32", 1, block)
        pre: list[str] = []
    else:
        block, rows = W * H, (W, H)
        gid = Val("d", "kiln_g0", "int32", cx=1, cy=W, mult=block)
        pad = "    " * 3
        pre = [f"{pad}const int kiln_p = {k.gid.name} % {block};", f"{pad}const int kiln_g0 = {k.gid.name} - kiln_p;",
               f"{pad}const v128_t kiln_x = wasm_i32x4_make(" + ", ".join(f"(kiln_p + {j}) % {W}" for j in range(LANES))
               + ");",
               f"{pad}const v128_t kiln_y = wasm_i32x4_make(" + ", ".join(f"(kiln_p + {j}) / {W}" for j in range(LANES))
               + ");"]
    if block < LANES:
        return None
    accs: set[str] = set()
    for _ in range(8):  # accumulators start uniform; a pass promotes those assigned vectors
        r = _Renderer({k.gid.name: gid}, accs, rows)
        try:
            lines = r.stmts(k.body, 3)
        except VectorUnsupported:
            return None
        if not r.promote:
            return pre + lines, block
        accs |= r.promote
    return None


def _args(k: LoweredKernel) -> str:
    return ", ".join(p.name for p in k.params)


def render(k: LoweredKernel, export: str, grid: tuple[int, ...], comment: str = "") -> tuple[str, bool]:
    """C source of kernel ``k`` as the exported function ``export``.

    Args:
        k: a lowered kernel without reduce lanes.
        export: the WebAssembly export name of the function.
        grid: the shape of the tile grid (output shape with split axes divided), whose flat
            index is ``gid`` (see :func:`_vector_body` for how four tiles make a vector).
        comment: a description for people.

    Returns:
        ``(source, vectorised)``. The function takes one pointer per buffer parameter (byte
        offsets into linear memory), then ``begin`` and ``end``: it computes tiles ``[begin, end)``.

    The tiles of a range are visited row by row of the vectors' block (``B`` tiles), except that
    a kernel with reductions and at most :data:`COLUMN_ROWS` blocks visits whole blocks column by
    column: four tiles of every block, then the next four. Blocks then are output channels, and
    the input columns a vector reads stay in the L1 cache for all of them (a 1x1 convolution to
    24 channels re-reads a 1.8 MB input once instead of six times).

    Raises:
        TypeError: a kernel with reduce lanes (workgroup barriers).
    """
    if k.cooperative:
        raise TypeError(f"C: kernel {k.name} has reduce lanes or shared tiles; schedule it for the CPU (no barriers)")
    params, args, g = _params(k).rsplit(", int begin", 1)[0], _args(k), k.gid.name
    scalar = _Renderer({g: Val("u", g, "int32")}).stmts(k.body, 1)
    vector = _vector_body(k, grid)
    lines = [f"// {k.name}" + (f": {comment}" if comment else ""),
             f"static void {export}_s({params}, const int {g}) {{", *scalar, "}"]
    if vector is None:
        lines += [f"KILN_EXPORT(\"{export}\") void {export}({params}, int begin, int end) {{",
                  f"    for (int g = begin; g < end; g++) {export}_s({args}, g);", "}", ""]
        return "\n".join(lines), False
    body, block = vector
    lines += [f"static void {export}_v({params}, const int {g}) {{", *(line[8:] for line in body), "}",
              f"static void {export}_rows({params}, int begin, int end) {{", "    int g = begin;", "    while (g < end) {",
              f"        if (g + {LANES} <= end && g % {block} <= {block - LANES}) {{",
              f"            {export}_v({args}, g);", f"            g += {LANES};", "        } else {",
              f"            {export}_s({args}, g);", "            g += 1;", "        }", "    }", "}"]
    rows = k.total // block if k.total % block == 0 else 0
    has_loops = any(isinstance(s, For) for s in k.body)
    lines.append(f"KILN_EXPORT(\"{export}\") void {export}({params}, int begin, int end) {{")
    if has_loops and 2 <= rows <= COLUMN_ROWS:
        lines += [f"    const int r0 = (begin + {block - 1}) / {block}, r1 = end / {block};",
                  f"    if (r1 <= r0) {{ {export}_rows({args}, begin, end); return; }}",
                  f"    {export}_rows({args}, begin, r0 * {block});",
                  f"    for (int p = 0; p < {block}; ) {{",
                  f"        if (p + {LANES} <= {block}) {{",
                  f"            for (int r = r0; r < r1; r++) {export}_v({args}, r * {block} + p);",
                  f"            p += {LANES};", "        } else {",
                  f"            for (int r = r0; r < r1; r++) {export}_s({args}, r * {block} + p);",
                  "            p += 1;", "        }", "    }",
                  f"    {export}_rows({args}, r1 * {block}, end);"]
    else:
        lines.append(f"    {export}_rows({args}, begin, end);")
    lines += ["}", ""]
    return "\n".join(lines), True
