"""GLSL ES 3.00 rendering of lowered kernels for the WebGL2 target (GLSL ES 3.00.6 spec).

WebGL2 has no compute shaders, so each kernel is a fragment shader that computes one output
element per fragment (the GPGPU scheme of TensorFlow.js's WebGL backend and TensorJS):

- every tensor lives in a 2-D texture, ``R32F`` for float32 storage and ``R32I`` for int32 storage
  (bool and narrow integers are stored as int32, float16 as float32, as in the package format's
  *Dtypes*), row-major: flat element ``i`` of a tensor of ``n`` elements is texel
  ``(i % w, i / w)`` with ``w = min(n, width)`` (:func:`layout`; ``width`` is the package's
  ``texture_width``);
- loads are ``texelFetch`` calls (exact texels, no filtering or normalised coordinates);
- the fragment at ``gl_FragCoord.xy`` computes flat output element ``y * w_out + x``, drawn by a
  full-screen triangle into a viewport of the output's ``w_out x h_out`` texels (fragments past the
  last element of a partial last row are discarded: they write nothing);
- the result goes to ``layout(location = 0) out`` of a float (``EXT_color_buffer_float``) or
  integer render target, and runtimes read outputs back with ``readPixels``.

Shapes, strides and sizes are baked into each specialised shader as constants (no uniforms
besides the input samplers: TensorJS measured uniform uploads costing more than small shaders).
Only schedules with one element per invocation map onto fragments: register tiles, reduce lanes and
workgroup barriers do not (:func:`check`). This module shares only the target-neutral kernel IR of
:mod:`kiln.te.lower` with the other targets.
"""

from __future__ import annotations

from kiln.arith import symbolic
from kiln.arith.expr import Bin, Call, Expr, SizeVar
from kiln.codegen.cstyle import CStyle
from kiln.errors import KilnError
from kiln.te.loops import Barrier, BufLoad, Let, LoweredKernel, Store

#: Kiln dtype -> GLSL ES 3.00 scalar type
TYPES = {"float32": "float", "int32": "int", "bool": "bool"}

#: storage dtype -> (sampler type, texture internal format)
TEXTURES = {"float32": ("sampler2D", "R32F"), "int32": ("isampler2D", "R32I")}

#: expression function -> GLSL ES 3.00 built-in (§8); ``round`` is round-half-to-even as in WGSL and ONNX
BUILTINS = {"exp": "exp", "log": "log", "sqrt": "sqrt", "abs": "abs", "floor": "floor", "ceil": "ceil",
            "tanh": "tanh", "max": "max", "min": "min", "pow": "pow", "clamp": "clamp",
            "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh",
            "asinh": "asinh", "acosh": "acosh", "atanh": "atanh", "round": "roundEven", "sign": "sign",
            "trunc": "trunc", "bitcast_i32": "floatBitsToInt", "bitcast_f32": "intBitsToFloat"}

#: sin and cos of our own: GLSL ES 3.00 leaves the built-ins' precision to the implementation, and
#: SwiftShader's are off by up to 2e-4 on [-3, 3]. Cody-Waite reduction by pi/2 (two-part constant) and
#: Cephes' single-precision minimax polynomials on [-pi/4, pi/4] (sinf.c, cosf.c): within a few ulp for
#: |x| up to about 1e4
SINCOS = """float kiln_sincos(float x, int quadrant) {
    float k = roundEven(x * 0.636619772);
    float r = (x - k * 1.57079637) + k * 4.37113883e-8;
    float z = r * r;
    float s = ((-1.9515295891e-4 * z + 8.3321608736e-3) * z - 1.6666654611e-1) * z * r + r;
    float c = ((2.443315711809948e-5 * z - 1.388731625493765e-3) * z + 4.166664568298827e-2) * z * z - 0.5 * z + 1.0;
    int q = (int(k) + quadrant) & 3;
    float v = (q & 1) == 0 ? s : c;
    return q >= 2 ? -v : v;
}"""

#: WebGL2's guaranteed minimum of MAX_TEXTURE_IMAGE_UNITS (WebGL 2.0 spec, OpenGL ES 3.0 table 6.33): the
#: most input textures a kernel may sample
MAX_TEXTURE_IMAGE_UNITS = 16

#: default texture row width (texels); WebGL2 guarantees MAX_TEXTURE_SIZE >= 2048, and 4096 is what
#: nearly every WebGL2 device offers
TEXTURE_WIDTH = 4096

#: name -> IEEE-754 bits (as a signed int) of the special float values a kernel body may use
#: ``round_f16``: f32 rounded to the nearest f16 value, beyond f16's range +-infinity (``x * 1e38`` of the
#: run-time argument), NaN kept (tested on the bits); ``packHalf2x16`` only sees values within f16's range
ROUND_F16 = """float kiln_round_f16(float x) {
    float r = unpackHalf2x16(packHalf2x16(vec2(clamp(x, -65504.0, 65504.0), 0.0))).x;
    float o = abs(x) >= 65520.0 ? x * 1e38 : r;
    return (floatBitsToInt(x) & 0x7fffffff) > 0x7f800000 ? x : o;
}"""

SPECIAL_FLOATS = {"kiln_pos_inf": 0x7F800000, "kiln_neg_inf": -0x00800000, "kiln_nan": 0x7FC00000}

_ARITH = {"+", "-", "*", "/", "<", "<=", ">", ">=", "==", "!=", "&", "|", "^", "<<", ">>"}
#: logical operators on bool (GLSL has no bitwise operators on bool)
_LOGICAL = {"&&": "&&", "||": "||", "&": "&&", "|": "||", "^": "^^"}

#: the vertex shader every kernel is drawn with: one triangle covering the viewport, no attributes
VERTEX_SHADER = """#version 300 es
// Kiln: a full-screen triangle (vertices 0, 1, 2 -> clip space (-1,-1), (3,-1), (-1,3))
void main() {
    vec2 p = vec2(float((gl_VertexID << 1) & 2), float(gl_VertexID & 2));
    gl_Position = vec4(p * 2.0 - 1.0, 0.0, 1.0);
}
"""


#: the uniform block of run-time dims (docs/dynamic-shapes.md): dim ``i`` is ``kiln_dims[i / 4][i % 4]``, the
#: block bound to uniform buffer binding point 0 (std140: an ``ivec4`` array's stride is 16 bytes, GLSL ES 3.00 §4.3.7)
DIMS = "kiln_dims"
DIMS_BLOCK = "KilnDims"


def layout(elements: int, width: int = TEXTURE_WIDTH) -> tuple[int, int]:
    """Texels ``(w, h)`` holding a tensor (or buffer) of ``elements`` elements in rows of at most ``width``."""
    w = max(1, min(elements, width))
    return w, max(1, -(-elements // w))


class GLSL(CStyle):
    """The GLSL ES 3.00 spelling of the C-style renderer; the kernel's one store writes ``out_name``."""

    lang = "GLSL"
    types = TYPES
    builtins = BUILTINS
    binops = {op: op for op in _ARITH} | {"//": "/", "&&": "&&", "||": "||"}

    def __init__(self, out_name: str = "kiln_out"):
        self.out_name = out_name

    def x_SizeVar(self, e: SizeVar) -> str:
        return f"{DIMS}[{e.index // 4}][{e.index % 4}]"

    def x_BufLoad(self, e: BufLoad) -> str:
        idx = self.expr(e.index)
        if e.guard and isinstance(e.size, Expr):
            idx = f"clamp({idx}, 0, max({self.expr(e.size)} - 1, 0))"
        elif e.guard:
            idx = f"clamp({idx}, 0, {e.size - 1})"
        return f"load_{e.buf}({idx})"

    def bin(self, op: str, a: str, b: str, e: Bin) -> str:
        if e.a.dtype == "bool" and op in _LOGICAL:
            return f"({a} {_LOGICAL[op]} {b})"
        if op == "%":  # truncated remainder, as WGSL; GLSL leaves % on negative operands undefined
            return f"kiln_rem({a}, {b})" if e.dtype == "int32" else f"({a} - {b} * trunc({a} / {b}))"
        if op in ("<<", ">>"):  # WGSL takes the shift amount modulo 32; GLSL leaves >= 32 undefined
            return f"({a} {op} ({b} & 31))"
        return super().bin(op, a, b, e)

    def x_Call(self, e: Call) -> str:
        if e.fn in ("sin", "cos"):  # see SINCOS
            return f"kiln_sincos({self.expr(e.args[0])}, {0 if e.fn == 'sin' else 1})"
        if e.fn == "round_f16":  # f32 rounded to half precision: see ROUND_F16
            return f"kiln_round_f16({self.expr(e.args[0])})"
        if e.fn == "half_lo":  # GLSL ES 3.00 §8.4: the low 16 bits as binary16
            return f"unpackHalf2x16(uint({self.expr(e.args[0])})).x"
        return super().x_Call(e)

    def s_Let(self, s: Let, pad: str, depth: int) -> list[str]:
        return [f"{pad}{TYPES[s.value.dtype]} {s.var.name} = {self.expr(s.value)};"]

    def s_Store(self, s: Store, pad: str, depth: int) -> list[str]:
        # one output element per fragment: the store's index is the fragment's own (checked in render)
        return [f"{pad}{self.out_name} = {self.expr(s.value)};"]

    def s_Barrier(self, s: Barrier, pad: str, depth: int) -> list[str]:
        raise KilnError("GLSL: fragment shaders have no workgroup barriers")


def literal(value, dtype: str) -> str:
    """A GLSL ES 3.00 literal of ``dtype`` (infinities and NaN as the names in :data:`SPECIAL_FLOATS`)."""
    return GLSL().literal(value, dtype)


def expr(e: Expr) -> str:
    """Render one expression (fully parenthesised)."""
    return GLSL().expr(e)


def check(k: LoweredKernel, node: str = "") -> None:
    """Raise :class:`KilnError` naming ``node`` if kernel ``k`` cannot be a WebGL2 fragment shader.

    A fragment computes exactly one output element and samples at most
    :data:`MAX_TEXTURE_IMAGE_UNITS` textures; register tiles, reduce lanes (workgroup memory
    and barriers) and more inputs than that do not map.
    """
    where = f"node {node!r}" if node else f"kernel {k.name}"
    if k.lanes > 1 or k.shared:
        raise KilnError(f"{where}: the webgl2 target cannot run reduce lanes (no workgroup memory in fragment shaders)")
    if symbolic.to_json(k.total) != symbolic.to_json(k.params[-1].size):
        raise KilnError(f"{where}: the webgl2 target computes one element per fragment; the schedule has register "
                        f"tiles ({k.total} invocations for {k.params[-1].size} elements)")
    stores = [s for s in k.body if isinstance(s, Store)]
    if len(stores) != 1 or k.body[-1] is not stores[0]:
        raise KilnError(f"{where}: the webgl2 target needs one unconditional output store per fragment")
    inputs = len(k.params) - 1
    if inputs > MAX_TEXTURE_IMAGE_UNITS:
        raise KilnError(f"{where}: its kernel reads {inputs} tensors, more than the {MAX_TEXTURE_IMAGE_UNITS} "
                        "textures a WebGL2 fragment shader may sample (MAX_TEXTURE_IMAGE_UNITS)")
    for p in k.params:
        if p.dtype not in TEXTURES:
            raise KilnError(f"{where}: the webgl2 target has no texture format for {p.dtype} tensors")


def render(k: LoweredKernel, comment: str = "", width: int = TEXTURE_WIDTH, node: str = "") -> str:
    """GLSL ES 3.00 fragment shader of kernel ``k`` (textures in rows of at most ``width`` texels).

    Input ``i`` is the sampler uniform ``in{i}`` (bind its texture to any unit), the output is
    fragment output 0; draw the viewport ``layout(output elements, width)``.

    Raises:
        KilnError: ``k`` does not map onto one element per fragment (:func:`check`), naming ``node``.
    """
    check(k, node)
    out = k.params[-1]
    r = GLSL("kiln_out")
    lines = ["#version 300 es", f"// Kiln kernel {k.name}" + (f": {comment}" if comment else ""),
             "// generated from a tensor expression; do not edit", "precision highp float;", "precision highp int;",
             "precision highp sampler2D;", "precision highp isampler2D;", ""]
    dims = k.size_vars
    if dims:  # run-time dims: a tensor's row width is min(its elements, width), evaluated per fragment
        lines += [f"layout(std140) uniform {DIMS_BLOCK} {{ ivec4 {DIMS}[{dims[-1].index // 4 + 1}]; }};", ""]

    def rows(p) -> str:
        if isinstance(p.size, Expr):
            return f"{p.dtype}[{r.expr(p.size)}]: {TEXTURES[p.dtype][1]}, rows of min(elements, {width})"
        w, h = layout(p.size, width)
        return f"{p.dtype}[{p.size}]: {TEXTURES[p.dtype][1]} {w}x{h}"

    for p in k.params[:-1]:
        lines.append(f"uniform {TEXTURES[p.dtype][0]} {p.name};  // {rows(p)}")
    lines.append(f"layout(location = 0) out {TYPES[out.dtype]} kiln_out;  // {rows(out)}")
    lines.append("")
    for p in k.params[:-1]:
        if isinstance(p.size, Expr):
            w = f"min({r.expr(p.size)}, {width})"
            coord = f"ivec2(i % {w}, i / {w})"
        else:
            w, _ = layout(p.size, width)
            if w >= p.size:
                coord = "ivec2(i, 0)"
            elif w & (w - 1) == 0:
                coord = f"ivec2(i & {w - 1}, i >> {w.bit_length() - 1})"
            else:
                coord = f"ivec2(i % {w}, i / {w})"
        lines.append(f"{TYPES[p.dtype]} load_{p.name}(int i) {{ return texelFetch({p.name}, {coord}, 0).x; }}")
    body = r.stmts(k.body, 1)
    text = "\n".join(body)
    if "kiln_rem(" in text:
        lines.append("int kiln_rem(int a, int b) { return a - (a / b) * b; }")
    if "kiln_sincos(" in text:
        lines.append(SINCOS)
    if "kiln_round_f16(" in text:
        lines.append(ROUND_F16)
    if isinstance(out.size, Expr):
        n = r.expr(out.size)
        gid = f"    int {k.gid.name} = int(gl_FragCoord.y) * min({n}, {width}) + int(gl_FragCoord.x);"
        lines += ["", "void main() {", gid, f"    if ({k.gid.name} >= {n}) {{", "        discard;", "    }"]
    else:
        out_w, _ = layout(out.size, width)
        lines += ["", "void main() {", f"    int {k.gid.name} = int(gl_FragCoord.y) * {out_w} + int(gl_FragCoord.x);"]
        if out.size % out_w:
            lines += [f"    if ({k.gid.name} >= {out.size}) {{", "        discard;", "    }"]
    for name, bits in SPECIAL_FLOATS.items():
        if name in text:  # made from a run-time value, so compilers cannot fold it into a literal they reject
            lines.append(f"    float {name} = intBitsToFloat({bits} + min({k.gid.name}, 0));")
    lines += body
    lines.append("}")
    return "\n".join(lines) + "\n"
