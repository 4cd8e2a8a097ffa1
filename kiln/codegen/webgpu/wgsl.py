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

from kiln.arith.expr import Bin, Call, Expr, Select, SizeVar
from kiln.codegen.cstyle import CStyle
from kiln.te.loops import (
    SUBGROUP_SIZE,
    Barrier,
    BufLoad,
    Decl,
    Lane,
    Let,
    LoweredKernel,
    Store,
    Subgroups,
    Vec,
    VecLoad,
)

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

#: invocations of the subgroup probe's workgroup (the widest a Kiln kernel has)
PROBE_LANES = 256
#: the kernel a runtime runs once per device before it runs kernels' subgroup forms (package file
#: :data:`SUBGROUP_PROBE_FILE`, ``targets.webgpu.subgroup_probe``): word ``i`` is 1 where invocation ``i`` is lane
#: ``i % size`` of its subgroup (the order the forms assume and WGSL does not promise) and its xor-1 neighbour's
#: shuffle gives ``i ^ 1``, plus the subgroup size shifted left by 8
SUBGROUP_PROBE = f"""enable subgroups;
@group(0) @binding(0) var<storage, read_write> out: array<u32>;

@compute @workgroup_size({PROBE_LANES})
fn main(@builtin(local_invocation_index) i: u32, @builtin(subgroup_size) n: u32,
        @builtin(subgroup_invocation_id) s: u32) {{
    let other = subgroupShuffleXor(i, 1u);
    out[i] = select(0u, 1u, s == i % n && other == (i ^ 1u)) + (n << 8u);
}}
"""
SUBGROUP_PROBE_FILE = "kernels/subgroup-probe.wgsl"

#: a use of the f16 type: WGSL's ``enable f16;`` (WebGPU feature ``shader-f16``) must come first
_F16 = re.compile(r"\bf16\b")

class WGSL(CStyle):
    """The WGSL spelling of the C-style renderer; ``vectors``: the buffers of the kernel that are arrays of
    vectors (name -> width)."""

    lang = "WGSL"
    types = TYPES
    builtins = BUILTINS
    #: logical and/or render as WGSL's non-short-circuiting ``&``/``|`` on bool (WGSL §8.6): expressions
    #: have no side effects, and short-circuit forms become branches, which SwiftShader's compiler
    #: handles in time superlinear in their number (a 4x4-tiled, 3x3-unrolled convolution hung it)
    binops = {op: op for op in ("+", "-", "*", "/", "%", "<", "<=", ">", ">=", "==", "!=", "&", "|", "^")} | {
        "//": "/", "&&": "&", "||": "|"}
    float_suffix = "f"
    int_suffix = "i"
    loop_type = "var"

    def __init__(self, vectors: dict[str, int] | None = None, subgroups: bool = False):
        self.vectors = vectors or {}
        self.subgroups = subgroups
        #: whether a rendered statement took its subgroup form
        self.used_subgroups = False

    def literal(self, value, dtype: str) -> str:
        """A WGSL literal of ``dtype``.

        Infinities and NaN have no literal form, and a const-expression that evaluates to one is a
        shader-creation error (WGSL §8.1.2; Chromium's Tint enforces it even for ``bitcast``), so
        they render as the names in :data:`SPECIAL_FLOATS`, which :func:`render` binds with ``let``
        to a bitcast of a ``let`` (a runtime value, never const-evaluated).
        """
        if dtype == "float16":  # only finite values: kiln.te.half keeps other constants in f32
            with np.errstate(over="ignore"):
                h = float(np.float16(value))
            if not math.isfinite(h):
                raise ValueError(f"WGSL: f16 literal {value!r} is not finite")
            return f"({h!r}h)" if h < 0 else f"{h!r}h"
        return super().literal(value, dtype)

    def int_literal(self, v: int) -> str:
        return f"{v}i" if v != -(2**31) else "i32(-2147483647 - 1)"

    def x_SizeVar(self, e: SizeVar) -> str:
        return f"{DIMS}[{e.index // 4}][{e.index % 4}]"

    def x_BufLoad(self, e: BufLoad) -> str:
        idx = self.expr(e.index)
        if e.guard and isinstance(e.size, Expr):
            idx = f"min(u32({idx}), u32(max({self.expr(e.size)} - 1i, 0i)))"
        elif e.guard:
            idx = f"min(u32({idx}), {e.size - 1}u)"
        w = self.vectors.get(e.buf, 1)
        if w > 1:  # one element of an array of vectors
            unit = "u" if e.guard else "i"
            return f"{e.buf}[{idx} / {w}{unit}][{idx} % {w}{unit}]"
        return f"{e.buf}[{idx}]"

    def x_VecLoad(self, e: VecLoad) -> str:
        return f"{e.buf}[{self.expr(e.index)}]"

    def x_Lane(self, e: Lane) -> str:
        return f"{self.expr(e.x)}[{e.lane}]"

    def x_Vec(self, e: Vec) -> str:
        return f"vec{len(e.items)}<{TYPES[e.dtype]}>({', '.join(self.expr(x) for x in e.items)})"

    def bin(self, op: str, a: str, b: str, e: Bin) -> str:
        if op in ("<<", ">>"):  # WGSL shifts take a u32 amount
            return f"({a} {op} u32({b}))"
        return super().bin(op, a, b, e)

    def x_Call(self, e: Call) -> str:
        if e.fn == "round_f16":  # f32 rounded to half precision, without the optional shader-f16 feature
            return f"kiln_round_f16({self.expr(e.args[0])})"
        if e.fn == "subgroup_shuffle_xor":  # WGSL §17.12.3.13: the value of lane (own lane ^ mask)
            return f"subgroupShuffleXor({self.expr(e.args[0])}, u32({self.expr(e.args[1])}))"
        if e.fn == "half_lo":  # WGSL §17.9.7: component 0 is bits 0..15 as binary16
            return f"unpack2x16float(bitcast<u32>({self.expr(e.args[0])})).x"
        return super().x_Call(e)

    def x_Select(self, e: Select) -> str:
        return f"select({self.expr(e.f)}, {self.expr(e.t)}, {self.expr(e.cond)})"

    def s_Let(self, s: Let, pad: str, depth: int) -> list[str]:
        return [f"{pad}let {s.var.name} = {self.expr(s.value)};"]

    def s_Decl(self, s: Decl, pad: str, depth: int) -> list[str]:
        return [f"{pad}var {s.var.name}: {TYPES[s.var.dtype]} = {self.expr(s.value)};"]

    def s_Barrier(self, s: Barrier, pad: str, depth: int) -> list[str]:
        return [f"{pad}workgroupBarrier();"]

    def s_Subgroups(self, s: Subgroups, pad: str, depth: int) -> list[str]:
        if not self.subgroups:
            return self.stmts(s.plain, depth)
        self.used_subgroups = True
        return self.stmts(s.subgroup, depth)

    def s_Store(self, s: Store, pad: str, depth: int) -> list[str]:
        if s.buf in self.vectors and not isinstance(s.value, Vec):  # one element of an array of vectors
            i, w = self.expr(s.index), self.vectors[s.buf]
            return [f"{pad}{s.buf}[{i} / {w}i][{i} % {w}i] = {self.expr(s.value)};"]
        return super().s_Store(s, pad, depth)


def literal(value, dtype: str) -> str:
    """A WGSL literal of ``dtype`` (:meth:`WGSL.literal`)."""
    return WGSL().literal(value, dtype)


def expr(e: Expr) -> str:
    """Render one expression (fully parenthesised) of a kernel without vector buffers."""
    return WGSL().expr(e)


#: name of the uniform buffer of run-time parameters (shapes, scalars) a kernel may read, see :func:`uniform`
UNIFORM = "kiln_u"


def uniform(i: int) -> str:
    """The WGSL reference to 32-bit word ``i`` of a kernel's uniform buffer, as an ``i32``.

    Uniform arrays need 16-byte element strides (WGSL §14.4.4), so the words are packed four to
    a ``vec4<i32>``. Use it as the name of a :class:`~kiln.arith.expr.Var` in an expression (a float
    is ``call("bitcast_f32", ...)`` of it) and pass ``uniform_words`` to :func:`render`.
    """
    return f"{UNIFORM}[{i // 4}][{i % 4}]"


#: name of the uniform array of run-time dims (docs/dynamic-shapes.md): dim ``i`` is ``kiln_dims[i / 4][i % 4]``
DIMS = "kiln_dims"


def render(k: LoweredKernel, comment: str = "", uniform_words: int = 0, subgroups: bool = False) -> str:
    """WGSL source of kernel ``k`` with entry point ``main``.

    With ``subgroups`` the statements that have a subgroup form (:class:`~kiln.te.loops.Subgroups`: lane combines)
    take it: the source then ``enable subgroups;`` (WebGPU feature ``subgroups``, wgpu's ``subgroup``) and reads
    ``@builtin(subgroup_size)``; a kernel with no such statements renders as without.

    ``uniform_words`` > 0 declares a uniform buffer of that many ``i32`` words (see :func:`uniform`)
    at the binding after the storage buffers: shape-generic kernels read their shapes from it.
    A kernel over run-time dims (:class:`~kiln.arith.expr.SizeVar`) declares the dims uniform
    :data:`DIMS` (``array<vec4<i32>, K>``, dim ``i`` in word ``i``) at that binding instead.
    """
    wg = k.schedule.workgroup_size
    r = WGSL(k.vectors, subgroups)
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
            f"    if ({k.gid.name} >= {r.extent(k.total)}) {{",
            "        return;",
            "    }",
        ]
    body = r.stmts(k.body, 1)
    text = "\n".join(body)
    if r.used_subgroups:  # WGSL §17.12: the subgroup builtins need the extension
        at = next(i for i, line in enumerate(lines) if line.startswith("fn main("))
        lines[at] = lines[at].replace("fn main(", "fn main(@builtin(subgroup_size) sg_size_u: u32, ")
        body.insert(0, f"    let {SUBGROUP_SIZE.name} = i32(sg_size_u);")
        lines.insert(3, "enable subgroups;")
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
