"""Vector code of the cpu target: the lane vectoriser (:mod:`kiln.codegen.vectorize`) with :data:`LANES` lanes
in clang's GNU vector extensions (``__attribute__((vector_size(32)))``), which ``-march=native`` lowers to
the host's vector unit (AVX2 with FMA on x86-64; halves on narrower units), and the prelude defining the
vocabulary (:func:`kiln.codegen.vectorize.rename`: ``kv_f32_add`` ...) with the semantics of WebAssembly's
SIMD128 instructions of the same names (NaN-propagating min/max, saturating float-to-int, shift amounts
mod 32) so both targets compute the same numbers.
"""

from __future__ import annotations

from kiln.codegen.c import VectorBody
from kiln.codegen.vectorize import rename, vector_body
from kiln.te.loops import LoweredKernel

#: lanes of a vector (8 x 32 bits: one AVX2 register)
LANES = 8

#: the vector helpers, after :data:`kiln.codegen.c.PRELUDE`
PRELUDE = r"""
// ---- vectors of KILN_LANES 32-bit lanes (GNU vector extensions); kv_t holds any lane type's bits
#define KILN_LANES @LANES@
typedef int kv_t __attribute__((vector_size(4 * KILN_LANES)));
typedef float kv_f __attribute__((vector_size(4 * KILN_LANES)));
typedef unsigned kv_u __attribute__((vector_size(4 * KILN_LANES)));
#define KILN_IOTA ((kv_t){@IOTA@})

#define kv_i32_splat(x) ((kv_t){} + (int)(x))
static inline kv_t kv_f32_splat(float x) { return (kv_t)(kv_f){@SPLAT@}; }  // (not 0 + x: that is no identity for -0)
#define kv_i32_make(...) ((kv_t){__VA_ARGS__})
#define kv_f32_make(...) ((kv_t)(kv_f){__VA_ARGS__})
#define kv_i32_extract_lane(v, k) ((v)[k])
#define kv_f32_extract_lane(v, k) (((kv_f)(v))[k])
static inline kv_t kv_v128_load(const void* p) { kv_t v; __builtin_memcpy(&v, p, sizeof v); return v; }
static inline void kv_v128_store(void* p, kv_t v) { __builtin_memcpy(p, &v, sizeof v); }
#define kv_v128_and(a, b) ((a) & (b))
#define kv_v128_or(a, b) ((a) | (b))
#define kv_v128_xor(a, b) ((a) ^ (b))
#define kv_v128_bitselect(t, f, m) (((t) & (m)) | ((f) & ~(m)))

#define kv_f32_add(a, b) ((kv_t)((kv_f)(a) + (kv_f)(b)))
#define kv_f32_sub(a, b) ((kv_t)((kv_f)(a) - (kv_f)(b)))
#define kv_f32_mul(a, b) ((kv_t)((kv_f)(a) * (kv_f)(b)))
#define kv_f32_div(a, b) ((kv_t)((kv_f)(a) / (kv_f)(b)))
#define kv_f32_lt(a, b) ((kv_t)((kv_f)(a) < (kv_f)(b)))
#define kv_f32_le(a, b) ((kv_t)((kv_f)(a) <= (kv_f)(b)))
#define kv_f32_gt(a, b) ((kv_t)((kv_f)(a) > (kv_f)(b)))
#define kv_f32_ge(a, b) ((kv_t)((kv_f)(a) >= (kv_f)(b)))
#define kv_f32_eq(a, b) ((kv_t)((kv_f)(a) == (kv_f)(b)))
#define kv_f32_ne(a, b) ((kv_t)((kv_f)(a) != (kv_f)(b)))
#define kv_i32_add(a, b) ((a) + (b))
#define kv_i32_sub(a, b) ((a) - (b))
#define kv_i32_mul(a, b) ((a) * (b))
#define kv_i32_lt(a, b) ((kv_t)((a) < (b)))
#define kv_i32_le(a, b) ((kv_t)((a) <= (b)))
#define kv_i32_gt(a, b) ((kv_t)((a) > (b)))
#define kv_i32_ge(a, b) ((kv_t)((a) >= (b)))
#define kv_i32_eq(a, b) ((kv_t)((a) == (b)))
#define kv_i32_ne(a, b) ((kv_t)((a) != (b)))
#define kv_i32_shl(a, n) ((kv_t)((kv_u)(a) << ((n) & 31)))
#define kv_i32_shr(a, n) ((a) >> ((n) & 31))
#define kv_u32_min(a, b) ((kv_t)__builtin_elementwise_min((kv_u)(a), (kv_u)(b)))
#define kv_f32_convert_i32(a) ((kv_t)__builtin_convertvector((a), kv_f))
#define kv_f32_sqrt(a) ((kv_t)__builtin_elementwise_sqrt((kv_f)(a)))
#define kv_f32_floor(a) ((kv_t)__builtin_elementwise_floor((kv_f)(a)))
#define kv_f32_ceil(a) ((kv_t)__builtin_elementwise_ceil((kv_f)(a)))
#define kv_f32_trunc(a) ((kv_t)__builtin_elementwise_trunc((kv_f)(a)))
#define kv_f32_nearest(a) ((kv_t)__builtin_elementwise_roundeven((kv_f)(a)))
#define kv_f32_abs(a) ((a) & 0x7fffffff)
#define kv_f32_neg(a) ((a) ^ (int)0x80000000u)

// f32x4.pmax / pmin (x86's maxps/minps with the operands swapped): b if a < b (b < a), else a
#define kv_f32_pmax(a, b) kv_v128_bitselect((b), (a), kv_f32_lt((a), (b)))
#define kv_f32_pmin(a, b) kv_v128_bitselect((b), (a), kv_f32_lt((b), (a)))
// f32.max / f32.min: NaN propagates, -0 < +0
static inline kv_t kv_f32_max(kv_t a, kv_t b) {
    kv_f x = (kv_f)a, y = (kv_f)b;
    kv_t nan = (kv_t)(x != x) | (kv_t)(y != y);
    kv_t r = ((kv_t)(x > y) & a) | ((kv_t)(y > x) & b) | ((kv_t)(x == y) & (a & b));
    return (nan & (kv_t)(x + y)) | (~nan & r);
}
static inline kv_t kv_f32_min(kv_t a, kv_t b) {
    kv_f x = (kv_f)a, y = (kv_f)b;
    kv_t nan = (kv_t)(x != x) | (kv_t)(y != y);
    kv_t r = ((kv_t)(x < y) & a) | ((kv_t)(y < x) & b) | ((kv_t)(x == y) & (a | b));
    return (nan & (kv_t)(x + y)) | (~nan & r);
}
static inline kv_t kv_i32_max(kv_t a, kv_t b) { return kv_v128_bitselect(a, b, (kv_t)(a > b)); }
static inline kv_t kv_i32_min(kv_t a, kv_t b) { return kv_v128_bitselect(a, b, (kv_t)(a < b)); }
static inline kv_t kv_i32_abs(kv_t a) { kv_t s = a >> 31; return (kv_t)(((kv_u)a ^ (kv_u)s) - (kv_u)s); }
static inline kv_t kv_f32_clamp(kv_t x, kv_t lo, kv_t hi) { return kv_f32_min(kv_f32_max(x, lo), hi); }
static inline kv_t kv_i32_clamp(kv_t x, kv_t lo, kv_t hi) { return kv_i32_min(kv_i32_max(x, lo), hi); }
static inline kv_t kv_f32_sign(kv_t x) {
    kv_t pos = kv_f32_gt(x, kv_f32_splat(0.0f)), neg = kv_f32_lt(x, kv_f32_splat(0.0f));
    return kv_v128_bitselect(kv_v128_bitselect(kv_f32_splat(1.0f), kv_f32_splat(-1.0f), pos), x, pos | neg);
}
// i32.trunc_sat_f32_s: NaN -> 0, beyond the int range -> its ends
static inline kv_t kv_i32_trunc_sat_f32(kv_t a) {
    kv_f x = (kv_f)a;
    kv_f c = __builtin_elementwise_min(__builtin_elementwise_max(x, (kv_f){} - 2147483648.0f),
                                       (kv_f){} + 2147483520.0f);
    kv_t r = __builtin_convertvector(c, kv_t), big = (kv_t)(x >= 2147483648.0f);
    return ((big & 2147483647) | (~big & r)) & (kv_t)(x == x);
}

// kiln_expf of the C prelude lane by lane (the wasm prelude's kiln_f32x4_exp)
static inline kv_t kv_f32_exp(kv_t a) {
    kv_f x = (kv_f)a;
    kv_t big = (kv_t)(x > KILN_EXP_HI), small = (kv_t)(x < KILN_EXP_LO);
    kv_f c = (kv_f)kv_v128_bitselect(kv_f32_splat(KILN_EXP_HI), kv_v128_bitselect(kv_f32_splat(KILN_EXP_LO), a, small),
                                     big);
    kv_f fn = __builtin_elementwise_roundeven(c * 1.44269504088896341f);
    kv_f r = KILN_EXP_REDUCE(c, fn);
    kv_f y = KILN_EXP_Y(KILN_EXP_POLY(r), r);
    kv_t n = kv_i32_trunc_sat_f32((kv_t)fn), h = n >> 1;
    y = y * (kv_f)((h + 127) << 23) * (kv_f)((n - h + 127) << 23);
    return kv_v128_bitselect(kv_f32_splat(KILN_INF), kv_v128_bitselect(kv_f32_splat(0.0f), (kv_t)y, small), big);
}

// kiln_half_lo lane by lane (as kiln_f32x4_half_lo of the wasm prelude; needs subnormals kept, as by default)
static inline kv_t kv_f32_half_lo(kv_t x) {
    kv_t em = (x & 0x7fff) << 13;
    kv_t f = (kv_t)((kv_f)em * 0x1p112f);
    kv_t special = (kv_t)((x & 0x7c00) == 0x7c00);
    f = kv_v128_bitselect(em | 0x7f800000, f, special);
    return f | ((x & 0x8000) << 16);
}

// whole-vector load bases: clamped into [-(lanes - 1), size) ([-(2 lanes - 1), size) for two vectors)
static inline int kiln_vbase(int i, int size) {
    return i < 1 - KILN_LANES ? 1 - KILN_LANES : (i >= size ? size - 1 : i);
}
static inline int kiln_vbase2(int i, int size) {
    return i < 1 - 2 * KILN_LANES ? 1 - 2 * KILN_LANES : (i >= size ? size - 1 : i);
}
static inline kv_t kiln_iota(int base, int stride) { return kv_i32_splat(base) + stride * KILN_IOTA; }
static inline kv_t kiln_load_s2(const void* p) {  // elements 0, 2, 4, ... of two vectors from p
    kv_t lo = kv_v128_load(p), hi = kv_v128_load((const char*)p + sizeof(kv_t));
    return __builtin_shufflevector(lo, hi, @EVENS@);
}
// lane-by-lane helpers (operations without a vector instruction)
#define KILN_MAP_F(fn, v) ({ kv_f m_ = (kv_f)(v); for (int k_ = 0; k_ < KILN_LANES; k_++) m_[k_] = fn(m_[k_]); (kv_t)m_; })
#define KILN_MAP_F2(fn, a, b) ({ kv_f m_ = (kv_f)(a), n_ = (kv_f)(b); \
    for (int k_ = 0; k_ < KILN_LANES; k_++) m_[k_] = fn(m_[k_], n_[k_]); (kv_t)m_; })
#define KILN_MAP_I(fn, v) ({ kv_t m_ = (v); for (int k_ = 0; k_ < KILN_LANES; k_++) m_[k_] = fn(m_[k_]); m_; })
#define KILN_MAP_I2(fn, a, b) ({ kv_t m_ = (a), n_ = (b); \
    for (int k_ = 0; k_ < KILN_LANES; k_++) m_[k_] = fn(m_[k_], n_[k_]); m_; })
static inline float kv_f32_hsum(kv_t v) {  // the sum of the lanes (simd_reduce accumulators)
    kv_f f = (kv_f)v; float s = 0.0f;
    for (int k = 0; k < KILN_LANES; k++) s += f[k];
    return s;
}
static inline float kv_f32_hmax(kv_t v) {  // the largest lane (NaN propagates, as kiln_fmaxf)
    kv_f f = (kv_f)v; float m = f[0];
    for (int k = 1; k < KILN_LANES; k++) m = kiln_fmaxf(m, f[k]);
    return m;
}
static inline float kv_f32_hmin(kv_t v) {  // the smallest lane (NaN propagates, as kiln_fminf)
    kv_f f = (kv_f)v; float m = f[0];
    for (int k = 1; k < KILN_LANES; k++) m = kiln_fminf(m, f[k]);
    return m;
}
#define KILN_GATHER(buf, idx) ({ kv_t i_ = (idx), g_; \
    for (int k_ = 0; k_ < KILN_LANES; k_++) __builtin_memcpy((int*)&g_ + k_, (const int*)(buf) + i_[k_], 4); g_; })
""".replace("@LANES@", str(LANES)).replace("@SPLAT@", ", ".join(["x"] * LANES)).replace("@IOTA@", ", ".join(map(str, range(LANES)))).replace(
    "@EVENS@", ", ".join(str(2 * k) for k in range(LANES)))


def vector_body_native(k: LoweredKernel, grid: tuple[int, ...]) -> VectorBody | None:
    """The cpu target's ``vectorize`` hook: :func:`kiln.codegen.vectorize.vector_body` with :data:`LANES` lanes,
    renamed to this prelude's vocabulary."""
    body = vector_body(k, grid, LANES)
    return None if body is None else VectorBody(rename(body.lines), body.block, body.lanes)
