"""WGSL rendering of lowered kernels (WebGPU Shading Language, W3C WGSL spec).

The renderer states its limits up front and keeps one table from expression
functions to WGSL builtins; everything else is the statement and expression
structure of :mod:`kiln.te.lower`. Every storage buffer is a runtime-sized
``array<T>`` (WGSL §6.2.9) bound in ``@group(0)``, inputs ``read`` and the output
``read_write``; the flat invocation index comes from ``global_invocation_id``
and ``num_workgroups`` so dispatches wider than 65535 workgroups wrap into y.
"""

from __future__ import annotations

import math
import re

import numpy as np

from kiln.te.expr import Bin, Call, Cast, Const, Expr, Select, SizeVar, Var
from kiln.te.lower import Assign, Barrier, BufLoad, Decl, For, If, Lane, Let, LoweredKernel, Store, Vec, VecLoad

#: Kiln dtype -> WGSL scalar type (WGSL §6.2.1); int64 is narrowed to i32 before codegen
TYPES = {"float32": "f32", "float16": "f16", "int32": "i32", "bool": "bool"}

#: expression function -> WGSL builtin (WGSL §17)
BUILTINS = {"exp": "exp", "log": "log", "sqrt": "sqrt", "abs": "abs", "floor": "floor", "ceil": "ceil",
            "sin": "sin", "cos": "cos", "tanh": "tanh", "max": "max", "min": "min", "pow": "pow", "clamp": "clamp",
            "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh",
            "asinh": "asinh", "acosh": "acosh", "atanh": "atanh", "round": "round", "sign": "sign", "trunc": "trunc",
            "bitcast_i32": "bitcast<i32>", "bitcast_f32": "bitcast<f32>"}

#: name -> IEEE-754 bits of the special float values a kernel body may use (see :func:`literal`)
SPECIAL_FLOATS = {"kiln_pos_inf": 0x7F800000, "kiln_neg_inf": 0xFF800000, "kiln_nan": 0x7FC00000}

#: ``round_f16``: f32 rounded to the nearest f16 value (ties to even), beyond f16's range +-infinity, NaN kept.
#: ``pack2x16float`` is indeterminate outside f16's finite range (WGSL §17.9), so it sees clamped values; the
#: infinity is ``x * 1e38`` of the run-time argument (Tint rejects infinite const-expressions); NaN is tested on
#: the bits (``x != x`` may be folded away by compilers that assume no NaNs)
ROUND_F16 = """fn kiln_round_f16(x: f32) -> f32 {
    let r = unpack2x16float(pack2x16float(vec2<f32>(clamp(x, -65504.0f, 65504.0f), 0.0f))).x;
    let o = select(r, x * 1e38f, abs(x) >= 65520.0f);
    return select(o, x, (bitcast<i32>(x) & 0x7fffffffi) > 0x7f800000i);
}"""

#: a use of the f16 type: WGSL's ``enable f16;`` (WebGPU feature ``shader-f16``) must come first
_F16 = re.compile(r"\bf16\b")

_BINOPS = {"+", "-", "*", "/", "<", "<=", ">", ">=", "==", "!=", "&&", "||", "&", "|", "^"}

#: logical and/or render as WGSL's non-short-circuiting ``&``/``|`` on bool (WGSL §8.6): expressions
#: have no side effects, and short-circuit forms become branches, which SwiftShader's compiler
#: handles in time superlinear in their number (a 4x4-tiled, 3x3-unrolled convolution hung it)
_LOGICAL = {"&&": "&", "||": "|"}


def literal(value, dtype: str) -> str:
    """A WGSL literal of ``dtype``.

    Infinities and NaN have no literal form, and a const-expression that evaluates to one is a
    shader-creation error (WGSL §8.1.2; Chromium's Tint enforces it even for ``bitcast``), so
    they render as the names in :data:`SPECIAL_FLOATS`, which :func:`render` binds with ``let``
    to a bitcast of a ``let`` (a runtime value, never const-evaluated).
    """
    if dtype == "bool":
        return "true" if value else "false"
    if dtype == "int32":
        v = int(value)
        return f"{v}i" if v != -(2**31) else "i32(-2147483647 - 1)"
    if dtype == "float16":  # only finite values: kiln.te.half keeps other constants in f32
        with np.errstate(over="ignore"):
            h = float(np.float16(value))
        if not math.isfinite(h):
            raise ValueError(f"WGSL: f16 literal {value!r} is not finite")
        return f"({h!r}h)" if h < 0 else f"{h!r}h"
    f = float(np.float32(value))
    if math.isnan(f):
        return "kiln_nan"
    if math.isinf(f):
        return "kiln_pos_inf" if f > 0 else "kiln_neg_inf"
    r = repr(f)
    if "e" not in r and "." not in r:
        r += ".0"
    return f"({r}f)" if f < 0 else f"{r}f"


#: the buffers of the kernel being rendered that are arrays of vectors (name -> width), set by :func:`render`
_VECTORS: dict[str, int] = {}


def expr(e: Expr) -> str:
    """Render one expression (fully parenthesised)."""
    if isinstance(e, Const):
        return literal(e.value, e.dtype)
    if isinstance(e, Var):
        return e.name
    if isinstance(e, SizeVar):
        return f"{DIMS}[{e.index // 4}][{e.index % 4}]"
    if isinstance(e, BufLoad):
        idx = expr(e.index)
        if e.guard and isinstance(e.size, Expr):
            idx = f"min(u32({idx}), u32(max({expr(e.size)} - 1i, 0i)))"
        elif e.guard:
            idx = f"min(u32({idx}), {e.size - 1}u)"
        w = _VECTORS.get(e.buf, 1)
        if w > 1:  # one element of an array of vectors
            unit = "u" if e.guard else "i"
            return f"{e.buf}[{idx} / {w}{unit}][{idx} % {w}{unit}]"
        return f"{e.buf}[{idx}]"
    if isinstance(e, VecLoad):
        return f"{e.buf}[{expr(e.index)}]"
    if isinstance(e, Lane):
        return f"{expr(e.x)}[{e.lane}]"
    if isinstance(e, Vec):
        return f"vec{len(e.items)}<{TYPES[e.dtype]}>({', '.join(expr(x) for x in e.items)})"
    if isinstance(e, Bin):
        if e.op == "//":
            return f"({expr(e.a)} / {expr(e.b)})"
        if e.op == "%":
            return f"({expr(e.a)} % {expr(e.b)})"
        if e.op in ("<<", ">>"):  # WGSL shifts take a u32 amount
            return f"({expr(e.a)} {e.op} u32({expr(e.b)}))"
        if e.op in _BINOPS:
            return f"({expr(e.a)} {_LOGICAL.get(e.op, e.op)} {expr(e.b)})"
        raise ValueError(f"WGSL: unknown binary op {e.op!r}")
    if isinstance(e, Call):
        if e.fn == "round_f16":  # f32 rounded to half precision, without the optional shader-f16 feature
            return f"kiln_round_f16({expr(e.args[0])})"
        return f"{BUILTINS[e.fn]}({', '.join(expr(a) for a in e.args)})"
    if isinstance(e, Select):
        return f"select({expr(e.f)}, {expr(e.t)}, {expr(e.cond)})"
    if isinstance(e, Cast):
        return f"{TYPES[e.dtype]}({expr(e.x)})"
    raise TypeError(f"WGSL: cannot render {type(e).__name__}")


def _stmts(stmts, indent: int, vectors: dict[str, int] | None = None) -> list[str]:
    pad = "    " * indent
    vectors = vectors or {}
    out = []
    for s in stmts:
        if isinstance(s, Let):
            out.append(f"{pad}let {s.var.name} = {expr(s.value)};")
        elif isinstance(s, Decl):
            out.append(f"{pad}var {s.var.name}: {TYPES[s.var.dtype]} = {expr(s.value)};")
        elif isinstance(s, Assign):
            out.append(f"{pad}{s.var.name} = {expr(s.value)};")
        elif isinstance(s, For):
            v = s.var.name
            extent = expr(s.extent) if isinstance(s.extent, Expr) else f"{s.extent}i"
            out.append(f"{pad}for (var {v} = 0i; {v} < {extent}; {v}++) {{")
            out.extend(_stmts(s.body, indent + 1, vectors))
            out.append(f"{pad}}}")
        elif isinstance(s, Barrier):
            out.append(f"{pad}workgroupBarrier();")
        elif isinstance(s, If):
            out.append(f"{pad}if ({expr(s.cond)}) {{")
            out.extend(_stmts(s.body, indent + 1, vectors))
            out.append(f"{pad}}}")
        elif isinstance(s, Store) and isinstance(s.value, Vec):  # a whole vector
            out.append(f"{pad}{s.buf}[{expr(s.index)}] = {expr(s.value)};")
        elif isinstance(s, Store) and s.buf in vectors:  # one element of an array of vectors
            i, w = expr(s.index), vectors[s.buf]
            out.append(f"{pad}{s.buf}[{i} / {w}i][{i} % {w}i] = {expr(s.value)};")
        elif isinstance(s, Store):
            out.append(f"{pad}{s.buf}[{expr(s.index)}] = {expr(s.value)};")
        else:
            raise TypeError(f"WGSL: cannot render statement {type(s).__name__}")
    return out


#: name of the uniform buffer of run-time parameters (shapes, scalars) a kernel may read, see :func:`uniform`
UNIFORM = "kiln_u"


def uniform(i: int) -> str:
    """The WGSL reference to 32-bit word ``i`` of a kernel's uniform buffer, as an ``i32``.

    Uniform arrays need 16-byte element strides (WGSL §14.4.4), so the words are packed four to
    a ``vec4<i32>``. Use it as the name of a :class:`~kiln.te.expr.Var` in an expression (a float
    is ``call("bitcast_f32", ...)`` of it) and pass ``uniform_words`` to :func:`render`.
    """
    return f"{UNIFORM}[{i // 4}][{i % 4}]"


#: name of the uniform array of run-time dims (docs/dynamic-shapes.md): dim ``i`` is ``kiln_dims[i / 4][i % 4]``
DIMS = "kiln_dims"


def render(k: LoweredKernel, comment: str = "", uniform_words: int = 0) -> str:
    """WGSL source of kernel ``k`` with entry point ``main``.

    ``uniform_words`` > 0 declares a uniform buffer of that many ``i32`` words (see :func:`uniform`)
    at the binding after the storage buffers: shape-generic kernels read their shapes from it.
    A kernel over run-time dims (:class:`~kiln.te.expr.SizeVar`) declares the dims uniform
    :data:`DIMS` (``array<vec4<i32>, K>``, dim ``i`` in word ``i``) at that binding instead.
    """
    wg = k.schedule.workgroup_size
    lines = [f"// Kiln kernel {k.name}" + (f": {comment}" if comment else ""), "// generated from a tensor expression; do not edit", ""]
    for i, p in enumerate(k.params):
        access = "read" if p.access == "read" else "read_write"
        w = k.vectors.get(p.name, 1)
        elem = TYPES[p.dtype] if w == 1 else f"vec{w}<{TYPES[p.dtype]}>"
        lines.append(f"@group(0) @binding({i}) var<storage, {access}> {p.name}: array<{elem}>;")
    if uniform_words:
        lines.append(f"@group(0) @binding({len(k.params)}) var<uniform> {UNIFORM}: array<vec4<i32>, "
                     f"{-(-uniform_words // 4)}>;")
    dims = k.size_vars
    if dims:
        if uniform_words:
            raise ValueError("a kernel reads either shape uniforms or run-time dims, not both")
        lines.append(f"@group(0) @binding({len(k.params)}) var<uniform> {DIMS}: array<vec4<i32>, "
                     f"{dims[-1].index // 4 + 1}>;")
    for name, (dtype, size) in k.shared.items():
        w = k.vectors.get(name, 1)
        elem = TYPES[dtype] if w == 1 else f"vec{w}<{TYPES[dtype]}>"
        lines.append(f"var<workgroup> {name}: array<{elem}, {size // w}>;")
    lines += ["", f"@compute @workgroup_size({wg})"]
    if k.cooperative:  # no early return: every invocation must reach the workgroup barriers
        lines += [
            "fn main(@builtin(local_invocation_index) local: u32, @builtin(workgroup_id) group: vec3<u32>,",
            "        @builtin(num_workgroups) groups: vec3<u32>) {",
            "    let lid = i32(local);",
            "    let wid = i32(group.x + group.y * groups.x);",
        ]
    else:
        lines += [
            "fn main(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {",
            f"    let {k.gid.name} = i32(id.x + id.y * groups.x * {wg}u);",
            f"    if ({k.gid.name} >= {expr(k.total) if isinstance(k.total, Expr) else f'{k.total}i'}) {{",
            "        return;",
            "    }",
        ]
    _VECTORS.clear()
    _VECTORS.update(k.vectors)
    try:
        body = _stmts(k.body, 1, k.vectors)
    finally:
        _VECTORS.clear()
    text = "\n".join(body)
    if any(_F16.search(line) for line in lines[3:] + body):  # f16 types need the extension (WGSL §4.1.2)
        lines.insert(3, "enable f16;")
    for name, bits in SPECIAL_FLOATS.items():
        if name in text:
            lines += [f"    let {name}_bits = {bits:#010x}u;", f"    let {name} = bitcast<f32>({name}_bits);"]
    lines += body
    lines.append("}")
    if "kiln_round_f16(" in text:
        lines += ["", ROUND_F16]
    return "\n".join(lines) + "\n"
