"""WebAssembly SIMD128 code of the C kernels: the lane vectoriser (:mod:`kiln.codegen.vectorize`) with four
lanes as a ``v128`` (the WebAssembly SIMD proposal, phase 5, through clang's ``wasm_simd128.h``), and the
prelude every WebAssembly kernel module starts with."""

from __future__ import annotations

from kiln.codegen.c import PRELUDE as C_PRELUDE
from kiln.codegen.c import VectorBody
from kiln.codegen.c import render as render_c
from kiln.codegen.vectorize import LANES, vector_body
from kiln.te.loops import LoweredKernel

#: the source every WebAssembly kernel module starts with: the SIMD128 header, the scalar helpers of
#: :data:`kiln.codegen.c.PRELUDE`, then the vector helpers
PRELUDE = (r"""// Kiln kernels for WebAssembly (SIMD128); generated from tensor expressions, do not edit.
#include <wasm_simd128.h>

""" + C_PRELUDE + r"""// whole-vector load bases: clamped into [-3, size) (-7 for two vectors), moving only vectors of no lane inside
static inline int kiln_vbase(int i, int size) { return i < -3 ? -3 : (i >= size ? size - 1 : i); }
static inline int kiln_vbase2(int i, int size) { return i < -7 ? -7 : (i >= size ? size - 1 : i); }

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
// kiln_expf of the C prelude, lane by lane in vectors: the same operations in the same order
static inline v128_t kiln_f32x4_exp(v128_t x) {
    v128_t hi = wasm_f32x4_splat(KILN_EXP_HI), lo = wasm_f32x4_splat(KILN_EXP_LO);
    v128_t c = wasm_v128_bitselect(hi, wasm_v128_bitselect(lo, x, wasm_f32x4_lt(x, lo)), wasm_f32x4_gt(x, hi));
    v128_t fn = wasm_f32x4_nearest(wasm_f32x4_mul(c, wasm_f32x4_splat(1.44269504088896341f)));
    v128_t r = wasm_f32x4_sub(wasm_f32x4_sub(c, wasm_f32x4_mul(fn, wasm_f32x4_splat(0.693359375f))),
                              wasm_f32x4_mul(fn, wasm_f32x4_splat(-2.12194440e-4f)));
    v128_t p = wasm_f32x4_splat(KILN_EXP_P0);
    p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(KILN_EXP_P1));
    p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(KILN_EXP_P2));
    p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(KILN_EXP_P3));
    p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(KILN_EXP_P4));
    p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(KILN_EXP_P5));
    v128_t y = wasm_f32x4_add(wasm_f32x4_add(wasm_f32x4_mul(p, wasm_f32x4_mul(r, r)), r), wasm_f32x4_splat(1.0f));
    v128_t n = wasm_i32x4_trunc_sat_f32x4(fn), h = wasm_i32x4_shr(n, 1), bias = wasm_i32x4_splat(127);
    y = wasm_f32x4_mul(wasm_f32x4_mul(y, wasm_i32x4_shl(wasm_i32x4_add(h, bias), 23)),
                       wasm_i32x4_shl(wasm_i32x4_add(wasm_i32x4_sub(n, h), bias), 23));
    y = wasm_v128_bitselect(wasm_f32x4_splat(0.0f), y, wasm_f32x4_lt(x, lo));
    return wasm_v128_bitselect(wasm_f32x4_splat(KILN_INF), y, wasm_f32x4_gt(x, hi));
}
static inline v128_t kiln_load_s2(const void* p) {  // elements 0, 2, 4, 6 from p
    return wasm_i32x4_shuffle(wasm_v128_load(p), wasm_v128_load((const char*)p + 16), 0, 2, 4, 6);
}
// kiln_half_lo lane by lane: the low 16 bits of each int lane read as an IEEE half, exactly. The exponent and
// mantissa moved into f32's places and scaled by 2^112 give every finite half (subnormals too: WebAssembly keeps
// f32 subnormals); exponent 31 becomes f32's 255 (infinities, NaN); then the sign.
static inline v128_t kiln_f32x4_half_lo(v128_t x) {
    v128_t em = wasm_i32x4_shl(wasm_v128_and(x, wasm_i32x4_splat(0x7fff)), 13);
    v128_t f = wasm_f32x4_mul(em, wasm_f32x4_splat(0x1p112f));
    v128_t special = wasm_i32x4_eq(wasm_v128_and(x, wasm_i32x4_splat(0x7c00)), wasm_i32x4_splat(0x7c00));
    f = wasm_v128_bitselect(wasm_v128_or(em, wasm_i32x4_splat(0x7f800000)), f, special);
    return wasm_v128_or(f, wasm_i32x4_shl(wasm_v128_and(x, wasm_i32x4_splat(0x8000)), 16));
}
// the sum of the lanes (simd_reduce accumulators): lanes 0+2 and 1+3, then the two
static inline float kiln_f32x4_hsum(v128_t v) {
    v128_t s = wasm_f32x4_add(v, wasm_i32x4_shuffle(v, v, 2, 3, 0, 1));
    return wasm_f32x4_extract_lane(s, 0) + wasm_f32x4_extract_lane(s, 1);
}
// the largest and the smallest lane (f32.max/f32.min: NaN propagates), as kiln_f32x4_hsum
static inline float kiln_f32x4_hmax(v128_t v) {
    v128_t s = wasm_f32x4_max(v, wasm_i32x4_shuffle(v, v, 2, 3, 0, 1));
    return __builtin_wasm_max_f32(wasm_f32x4_extract_lane(s, 0), wasm_f32x4_extract_lane(s, 1));
}
static inline float kiln_f32x4_hmin(v128_t v) {
    v128_t s = wasm_f32x4_min(v, wasm_i32x4_shuffle(v, v, 2, 3, 0, 1));
    return __builtin_wasm_min_f32(wasm_f32x4_extract_lane(s, 0), wasm_f32x4_extract_lane(s, 1));
}
static inline v128_t kiln_iota(int base, int stride) {
    return wasm_i32x4_make(base, base + stride, base + 2 * stride, base + 3 * stride);
}
""")


def vectorize(k: LoweredKernel, grid: tuple[int, ...]) -> VectorBody | None:
    """The wasm target's ``vectorize`` hook: :func:`kiln.codegen.vectorize.vector_body` with :data:`LANES` lanes."""
    return vector_body(k, grid, LANES)


def render(k: LoweredKernel, export: str, grid: tuple[int, ...], comment: str = "") -> tuple[str, bool]:
    """C source of kernel ``k`` as the exported function ``export``, vectorised for SIMD128 where it can be
    (:func:`kiln.codegen.c.render` with :func:`kiln.codegen.vectorize.vector_body`, :data:`LANES` lanes);
    returns ``(source, vectorised)``."""
    return render_c(k, export, grid, comment, vectorize=vectorize)
