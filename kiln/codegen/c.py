"""Scalar C rendering of lowered kernels, for the CPU targets (WebAssembly through ``zig cc``; native next).

The lowered kernel IR (:mod:`kiln.te.loops`) describes what one *invocation* computes for its flat tile index
``gid``. On a CPU the invocation grid becomes a loop over ``gid`` in ``[begin, end)`` (so workers can split
it): :func:`render` emits the scalar function of one tile (``<export>_s``) and the exported range function.
A target may pass a ``vectorize`` hook (WebAssembly's SIMD128 vectoriser, :mod:`kiln.codegen.wasm.simd`)
that renders the same statements for several consecutive tiles at once (``<export>_v``); the range
function then runs whole vectors where they fit and single tiles elsewhere.

Semantics follow the WGSL renderer: float ``min``/``max`` propagate NaN (``f32.min``), integer ``/`` and
``%`` truncate and never trap (a zero divisor gives the dividend and 0, as WGSL), float-to-int conversions
saturate (``i32.trunc_sat_f32_s``), shift amounts are taken mod 32; :data:`PRELUDE` defines the helpers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from kiln.arith.expr import Bin, Call, Cast, Const, Expr, SizeVar
from kiln.codegen.cstyle import CStyle
from kiln.te.loops import Barrier, BufLoad, For, LoweredKernel

#: Kiln dtype -> C scalar type (bools are 0/1 ints in scalar code, all-ones/zero lane masks in vectors)
TYPES = {"float32": "float", "int32": "int", "bool": "int"}

#: expression function -> scalar C (float operands); ``{i}`` variants for int operands
FLOAT_FN = {"exp": "kiln_expf", "log": "logf", "sin": "sinf", "cos": "cosf", "tan": "tanf", "sqrt": "__builtin_sqrtf",
             "abs": "__builtin_fabsf", "floor": "__builtin_floorf", "ceil": "__builtin_ceilf",
             "trunc": "__builtin_truncf", "round": "__builtin_rintf", "max": "kiln_fmaxf",
             "min": "kiln_fminf", "tanh": "kiln_tanhf", "atan": "kiln_atanf", "pow": "kiln_powf",
             "asin": "kiln_asinf", "acos": "kiln_acosf", "sinh": "kiln_sinhf", "cosh": "kiln_coshf",
             "asinh": "kiln_asinhf", "acosh": "kiln_acoshf", "atanh": "kiln_atanhf", "sign": "kiln_signf",
             "round_f16": "kiln_round_f16", "bitcast_i32": "kiln_bits_i32", "clamp": "kiln_clampf"}
INT_FN = {"abs": "kiln_iabs", "max": "kiln_imax", "min": "kiln_imin", "sign": "kiln_isign",
           "bitcast_f32": "kiln_bits_f32", "clamp": "kiln_iclamp", "half_lo": "kiln_half_lo"}

#: the scalar helpers every kernel source starts with (after a target's own header)
PRELUDE = r"""#ifdef __wasm__
#define KILN_EXPORT(name) __attribute__((export_name(name), used))
#define kiln_fmaxf __builtin_wasm_max_f32
#define kiln_fminf __builtin_wasm_min_f32
#define kiln_f2i __builtin_wasm_trunc_saturate_s_i32_f32
#else
// the same semantics as WebAssembly's f32.max/f32.min (NaN propagates, -0 < +0) and i32.trunc_sat_f32_s
#define KILN_EXPORT(name) __attribute__((visibility("default"), used))
static inline float kiln_fmaxf(float a, float b) {
    return a != a || b != b ? a + b : (a > b ? a : (b > a ? b : (__builtin_signbit(a) ? b : a)));
}
static inline float kiln_fminf(float a, float b) {
    return a != a || b != b ? a + b : (a < b ? a : (b < a ? b : (__builtin_signbit(a) ? a : b)));
}
static inline int kiln_f2i(float x) {
    return x != x ? 0 : (x >= 2147483648.0f ? 2147483647 : (x < -2147483648.0f ? (-2147483647 - 1) : (int)x));
}
#endif
#define KILN_INF __builtin_inff()

// run-time dims (docs/dynamic-shapes.md): dim i in word i, written by the runtime before a run, read by kernels
#define KILN_MAX_DIMS 32
int kiln_dims[KILN_MAX_DIMS];
KILN_EXPORT("kiln_dims") int* kiln_dims_address(void) { return kiln_dims; }
#ifdef KILN_WORKERS
// (the threaded wasm module) one stack a worker: each worker's runtime sets its instance's exported __stack_pointer
// to kiln_worker_stack(its index) before any kernel runs (0: no stack for that many workers)
static unsigned char kiln_worker_stacks[KILN_WORKERS][KILN_WORKER_STACK] __attribute__((aligned(16)));
KILN_EXPORT("kiln_worker_stack") int kiln_worker_stack(int worker) {
    return worker >= 0 && worker < KILN_WORKERS ? (int)(kiln_worker_stacks[worker] + KILN_WORKER_STACK) : 0;
}
#endif
#define KILN_NAN __builtin_nanf("")

float expf(float); float logf(float); float sinf(float); float cosf(float); float tanf(float);
double exp(double); double log(double);

// exp(x) in float32 as Cephes' expf (S. L. Moshier): n = round(x log2 e), r = x - n ln 2 in two parts (Cody and
// Waite), a degree-5 polynomial for (exp(r) - 1 - r) / r^2, then 2^n applied in two halves (subnormal results
// too): within 2 ulp of exp over its float range, inf above 88.72, 0 below -103.98, NaN for NaN. The vector
// helpers of each target (kiln_f32x4_exp, kv_f32_exp) compute the same operations lane by lane, so a row's
// scalar tail agrees with its vectors; libm's expf called per lane was a quarter of a transformer encoder's time
// on wasm (its softmax).
#define KILN_EXP_HI 88.72283935546875f
#define KILN_EXP_LO -103.97207641601562f
// x - n ln 2 with ln 2 in two parts; Cephes' degree-5 polynomial for (exp(r) - 1 - r) / r^2 (Horner); then
// 1 + r + p r^2. Operator forms: the scalar code's and the cpu target's GNU vectors take them alike
#define KILN_EXP_REDUCE(c, fn) (((c) - (fn) * 0.693359375f) - (fn) * -2.12194440e-4f)
#define KILN_EXP_P0 1.9875691500e-4f
#define KILN_EXP_P1 1.3981999507e-3f
#define KILN_EXP_P2 8.3334519073e-3f
#define KILN_EXP_P3 4.1665795894e-2f
#define KILN_EXP_P4 1.6666665459e-1f
#define KILN_EXP_P5 5.0000001201e-1f
#define KILN_EXP_POLY(r) (((((KILN_EXP_P0 * (r) + KILN_EXP_P1) * (r) + KILN_EXP_P2) * (r) + KILN_EXP_P3) * (r) \
    + KILN_EXP_P4) * (r) + KILN_EXP_P5)
#define KILN_EXP_Y(p, r) (((p) * ((r) * (r)) + (r)) + 1.0f)
static inline float kiln_pow2i(int n) { return __builtin_bit_cast(float, (n + 127) << 23); }
static inline float kiln_expf(float x) {
    float c = x > KILN_EXP_HI ? KILN_EXP_HI : (x < KILN_EXP_LO ? KILN_EXP_LO : x);  // (NaN passes)
    float fn = __builtin_rintf(c * 1.44269504088896341f);
    float r = KILN_EXP_REDUCE(c, fn);
    float y = KILN_EXP_Y(KILN_EXP_POLY(r), r);
    int n = kiln_f2i(fn), h = n >> 1;
    y = y * kiln_pow2i(h) * kiln_pow2i(n - h);
    return x > KILN_EXP_HI ? KILN_INF : (x < KILN_EXP_LO ? 0.0f : y);
}

static inline int kiln_guard(int i, int hi) { return (unsigned)i > (unsigned)hi ? hi : i; }
static inline int kiln_idiv(int a, int b) { return b == 0 || (b == -1 && a == (-2147483647 - 1)) ? a : a / b; }
static inline int kiln_imod(int a, int b) { return b == 0 || b == -1 ? 0 : a % b; }
static inline float kiln_fmod(float a, float b) { return a - b * __builtin_truncf(a / b); }
static inline int kiln_imax(int a, int b) { return a > b ? a : b; }
static inline int kiln_imin(int a, int b) { return a < b ? a : b; }
static inline int kiln_iclamp(int x, int lo, int hi) { return kiln_imin(kiln_imax(x, lo), hi); }
static inline int kiln_iabs(int a) { return a < 0 ? -a : a; }
static inline int kiln_isign(int a) { return (a > 0) - (a < 0); }
static inline float kiln_clampf(float x, float lo, float hi) {
    return kiln_fminf(kiln_fmaxf(x, lo), hi);
}
static inline float kiln_signf(float x) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x); }
static inline int kiln_bits_i32(float x) { return __builtin_bit_cast(int, x); }
static inline float kiln_bits_f32(int x) { return __builtin_bit_cast(float, x); }
// the low 16 bits of x read as an IEEE half float, exactly (subnormals, infinities and NaN included)
static inline float kiln_half_lo(int x) {
    unsigned h = (unsigned)x & 0xffffu, s = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) { float v = (float)m * 5.9604644775390625e-08f; return s ? -v : v; }
    return __builtin_bit_cast(float, s | ((e == 31 ? 255u : e + 112u) << 23) | (m << 13));
}
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

"""

#: the run-time dims a C kernel can read (``kiln_dims`` of :data:`PRELUDE`)
MAX_DIMS = 32


def size_text(d: int | Expr) -> str:
    """A size (an int, or a size expression over run-time dims) as C text."""
    return str(d) if isinstance(d, int) else C().expr(d)


def last_index(size: int | Expr) -> str:
    """The last valid index of a buffer of ``size`` elements as C text (0 for an empty buffer of run-time size)."""
    return str(size - 1) if isinstance(size, int) else f"kiln_imax({C().expr(size)} - 1, 0)"


#: kernels whose tile grid has at most this many blocks (rows of vectors) visit them column by column
COLUMN_ROWS = 32


class C(CStyle):
    """The scalar C spelling of the C-style renderer (one tile per call)."""

    lang = "C"
    types = TYPES
    bools = ("0", "1")
    specials: ClassVar[dict[str, str]] = {"nan": "KILN_NAN", "pos_inf": "KILN_INF", "neg_inf": "(-KILN_INF)"}
    float_suffix = "f"

    def int_literal(self, v: int) -> str:
        return f"({v})" if v != -(2**31) else "(-2147483647 - 1)"

    def x_BufLoad(self, e: BufLoad) -> str:
        idx = self.expr(e.index)
        return f"{e.buf}[kiln_guard({idx}, {last_index(e.size)})]" if e.guard else f"{e.buf}[{idx}]"

    def x_SizeVar(self, e: SizeVar) -> str:
        if e.index >= MAX_DIMS:
            raise ValueError(f"run-time dim {e.name} has index {e.index}; C kernels read at most {MAX_DIMS} dims")
        return f"kiln_dims[{e.index}]"

    def bin(self, op: str, a: str, b: str, e: Bin) -> str:
        return self.bin_code(op, e.a.dtype, a, b, e.b)

    @staticmethod
    def bin_code(op: str, dt: str, a: str, b: str, eb: Expr) -> str:
        """Binary ``op`` on ``dt`` operands ``a`` and ``b`` (``eb``: the right operand, a constant divisor
        divides directly)."""
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
            return f"{(FLOAT_FN if dt == 'float32' else INT_FN)[op]}({a}, {b})"
        c = {"&&": "&", "||": "|"}.get(op, op)
        if c not in ("+", "-", "*", "/", "<", "<=", ">", ">=", "==", "!=", "&", "|", "^"):
            raise ValueError(f"C: unknown binary op {op!r}")
        return f"({a} {c} {b})"

    def x_Call(self, e: Call) -> str:
        return self.call_code(e.fn, e.args[0].dtype, [self.expr(a) for a in e.args])

    @staticmethod
    def function(fn: str, dt: str) -> str:
        """The C function computing expression function ``fn`` on ``dt`` operands (ValueError if none)."""
        table = FLOAT_FN if dt == "float32" else INT_FN
        if fn not in table:
            raise ValueError(f"C: no {fn} for {dt}")
        return table[fn]

    def call_code(self, fn: str, dt: str, args: list[str]) -> str:
        """Call of expression function ``fn`` on rendered ``dt`` arguments."""
        return f"{self.function(fn, dt)}({', '.join(args)})"

    def x_Cast(self, e: Cast) -> str:
        return self.cast_code(self.expr(e.x), e.x.dtype, e.dtype)

    @staticmethod
    def cast_code(x: str, src: str, dst: str) -> str:
        """Scalar ``x`` converted from ``src`` to ``dst`` (float to int saturates)."""
        if dst == "bool":
            return f"({x} != 0)"
        if dst == "int32" and src == "float32":
            return f"kiln_f2i({x})"
        return f"(({TYPES[dst]})({x}))"

    def s_Barrier(self, s: Barrier, pad: str, depth: int) -> list[str]:
        raise TypeError("C: workgroup barriers (reduce lanes) have no CPU form; schedule without them")


@dataclass(frozen=True)
class VectorBody:
    """What a vectoriser gives :func:`render`: the body of ``<export>_v`` for ``lanes`` consecutive tiles
    (statements at depth 1), which must lie in one aligned block of ``block`` tiles."""

    lines: list[str]
    block: int
    lanes: int


#: ``vectorize(kernel, grid)``: a kernel's vector body, or None where it has no vector form
Vectorizer = Callable[[LoweredKernel, tuple[int, ...]], "VectorBody | None"]


def _params(k: LoweredKernel) -> str:
    return ", ".join(f"{'const ' if p.access == 'read' else ''}{TYPES[p.dtype]}* restrict {p.name}" for p in k.params)


def render(k: LoweredKernel, export: str, grid: tuple[int, ...], comment: str = "",
           vectorize: Vectorizer | None = None) -> tuple[str, bool]:
    """C source of kernel ``k`` as the exported function ``export``.

    Args:
        k: a lowered kernel without reduce lanes.
        export: the exported name of the function.
        grid: the shape of the tile grid (output shape with split axes divided), whose flat index is ``gid``.
        comment: a description for people.
        vectorize: renders the kernel for several tiles at once (:data:`Vectorizer`); None: scalar only.

    Returns:
        ``(source, vectorised)``. The function takes one pointer per buffer parameter, then ``begin`` and
        ``end``: it computes tiles ``[begin, end)``.

    The tiles of a range are visited row by row of the vectors' block (``B`` tiles), except that a kernel
    with reductions and at most :data:`COLUMN_ROWS` blocks visits whole blocks column by column: one vector
    of tiles of every block, then the next. Blocks then are output channels, and the input columns a vector
    reads stay in the L1 cache for all of them (a 1x1 convolution to 24 channels re-reads a 1.8 MB input
    once instead of six times).

    Raises:
        TypeError: a kernel with reduce lanes (workgroup barriers).
    """
    if k.cooperative:
        raise TypeError(f"C: kernel {k.name} has reduce lanes or shared tiles; schedule it for the CPU (no barriers)")
    params, args, g = _params(k), ", ".join(p.name for p in k.params), k.gid.name
    scalar = C().stmts(k.body, 1)
    vector = vectorize(k, grid) if vectorize is not None else None
    lines = [f"// {k.name}" + (f": {comment}" if comment else ""),
             f"static void {export}_s({params}, const int {g}) {{", *scalar, "}"]
    if vector is None:
        lines += [f"KILN_EXPORT(\"{export}\") void {export}({params}, int begin, int end) {{",
                  f"    for (int g = begin; g < end; g++) {export}_s({args}, g);", "}", ""]
        return "\n".join(lines), False
    block, lanes = vector.block, vector.lanes
    lines += [f"static void {export}_v({params}, const int {g}) {{", *vector.lines, "}",
              f"static void {export}_rows({params}, int begin, int end) {{", "    int g = begin;", "    while (g < end) {",
              f"        if (g + {lanes} <= end && g % {block} <= {block - lanes}) {{",
              f"            {export}_v({args}, g);", f"            g += {lanes};", "        } else {",
              f"            {export}_s({args}, g);", "            g += 1;", "        }", "    }", "}"]
    rows = k.total // block if isinstance(k.total, int) and k.total % block == 0 else 0
    has_loops = any(isinstance(s, For) for s in k.body)
    lines.append(f"KILN_EXPORT(\"{export}\") void {export}({params}, int begin, int end) {{")
    if has_loops and 2 <= rows <= COLUMN_ROWS:
        lines += [f"    const int r0 = (begin + {block - 1}) / {block}, r1 = end / {block};",
                  f"    if (r1 <= r0) {{ {export}_rows({args}, begin, end); return; }}",
                  f"    {export}_rows({args}, begin, r0 * {block});",
                  f"    for (int p = 0; p < {block}; ) {{",
                  f"        if (p + {lanes} <= {block}) {{",
                  f"            for (int r = r0; r < r1; r++) {export}_v({args}, r * {block} + p);",
                  f"            p += {lanes};", "        } else {",
                  f"            for (int r = r0; r < r1; r++) {export}_s({args}, r * {block} + p);",
                  "            p += 1;", "        }", "    }",
                  f"    {export}_rows({args}, r1 * {block}, end);"]
    else:
        lines.append(f"    {export}_rows({args}, begin, end);")
    lines += ["}", ""]
    return "\n".join(lines), True
