"""The lane vectoriser of the C renderer: several consecutive tiles as the lanes of one vector register.

The vocabulary of the vector code it writes is WebAssembly SIMD128's (clang's ``wasm_simd128.h``:
``wasm_f32x4_add``, ``wasm_v128_load``, ...) with :data:`LANES` lanes; another instruction set takes the same
code under its own names (:func:`rename`) with its own lane count and a prelude defining them (the cpu
target's GNU vector extensions, :mod:`kiln.codegen.cpu.vector`). Hooked into :func:`kiln.codegen.c.render`
as its ``vectorize`` argument (:func:`vector_body`); the scalar code stays for a row's last tiles.

Vectorising renders the same statements with every value classified as

* **uniform** (``u``): one scalar for all lanes (loop counters, weights of one output channel),
* **lane-affine** (``a``): the int32 ``base + lane * stride`` (the grid index itself, output
  columns), kept as the scalar ``base``, so a load at stride 1 is one vector load,
* **vector** (``v``): a vector (anything else; int32 division and the transcendental functions
  run lane by lane).

Lanes are taken together only when they lie in one row of the tile grid's innermost (non-1) axis, so the
grid's unravelling divides them uniformly; a row's last tiles and kernels the vectoriser cannot express run
the plain scalar code. Loads guarded by lowering (the taken branch of a ``Select``: a padded window's
border) read whole vectors; their base is clamped into ``[-(lanes - 1), size)`` (``kiln_vbase`` of the
prelude), which only moves vectors whose every lane is outside the buffer, so lanes that matter read
exactly (the package's memory keeps slack around the arena). Loads at lane stride 2 (stride-2
convolutions) read two whole vectors and shuffle the even lanes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kiln.arith.expr import Bin, Call, Cast, Const, Expr, Select, SizeVar, Var
from kiln.arith.symbolic import is_symbolic
from kiln.codegen.c import TYPES, C, VectorBody, last_index, size_text
from kiln.te.loops import Assign, Barrier, BufLoad, Decl, For, If, Let, LoweredKernel, Store

#: lanes of a v128 vector of 32-bit values (the vocabulary's own width)
LANES = 4

#: vector forms of calls WebAssembly SIMD has instructions for (float, int)
_VEC_FLOAT_FN = {"sqrt": "wasm_f32x4_sqrt", "abs": "wasm_f32x4_abs", "floor": "wasm_f32x4_floor",
                 "ceil": "wasm_f32x4_ceil", "trunc": "wasm_f32x4_trunc", "round": "wasm_f32x4_nearest",
                 "max": "wasm_f32x4_max", "min": "wasm_f32x4_min", "clamp": "kiln_f32x4_clamp",
                 "sign": "kiln_f32x4_sign", "exp": "kiln_f32x4_exp"}
_VEC_INT_FN = {"abs": "wasm_i32x4_abs", "max": "wasm_i32x4_max", "min": "wasm_i32x4_min",
               "clamp": "kiln_i32x4_clamp"}

_C = C()


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


_CMP = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}


def const_factor(e: Expr) -> int:
    """A constant ``c`` with ``e`` = ``c`` times an integer (the product of ``e``'s constant factors; 1 if none)."""
    if isinstance(e, Const):
        return abs(int(e.value))
    if isinstance(e, Bin) and e.op == "*":
        return const_factor(e.a) * const_factor(e.b)
    return 1


class Vectoriser:
    """Renders the statements of one kernel for ``lanes`` tiles at once; ``env`` maps variable names to
    their :class:`Val` (scalar code comes from :class:`kiln.codegen.c.C`)."""

    def __init__(self, env: dict[str, Val], vector_accs: set[str] | None = None, rows: tuple[int, int] = (0, 0),
                 lanes: int = LANES):
        self.env = dict(env)
        self.lanes = lanes
        self.W, self.H = rows  # lanes cross rows of W tiles (in blocks of W*H): the ``d`` kind
        self.vector_accs = vector_accs if vector_accs is not None else set()
        self.promote: set[str] = set()  # accumulators found to need vectors (second pass)
        self.in_lanes = 0  # inside a lane loop (For.lanes: a simd_reduce schedule's), whose lanes are the vector's
        # accumulators combined in a lane loop (name -> sum, max or min): combined across lanes after their loop
        self.lane_sums: dict[str, str] = {}
        self.decl_indent: dict[str, int] = {}

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
            return Val("u", _C.literal(e.value, e.dtype), e.dtype)
        if isinstance(e, Var):
            if e.name not in self.env:
                raise KeyError(f"C: unbound variable {e.name}")
            return self.env[e.name]
        if isinstance(e, SizeVar):
            return Val("u", _C.expr(e), e.dtype)
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
            idx = f"kiln_guard({i.code}, {last_index(e.size)})" if e.guard else i.code
            return Val("u", f"{e.buf}[{idx}]", e.dtype)
        if i.kind == "a" and i.stride == 1:
            base = f"kiln_vbase({i.code}, {size_text(e.size)})" if e.guard else i.code
            return Val("v", f"wasm_v128_load(&{e.buf}[{base}])", e.dtype)
        if i.kind == "a" and i.stride == 2:  # two whole vectors, the even lanes shuffled together
            base = f"kiln_vbase2({i.code}, {size_text(e.size)})" if e.guard else i.code
            return Val("v", f"kiln_load_s2(&{e.buf}[{base}])", e.dtype)
        if i.kind == "a" and not e.guard:
            ctor = "wasm_f32x4_make" if e.dtype == "float32" else "wasm_i32x4_make"
            lanes = ", ".join(f"{e.buf}[{i.code} + {k * i.stride}]" for k in range(self.lanes))
            return Val("v", f"{ctor}({lanes})", e.dtype)
        idx = self.vec(i)
        if e.guard:
            idx = f"wasm_u32x4_min({idx}, wasm_i32x4_splat({last_index(e.size)}))"
        return Val("v", f"KILN_GATHER({e.buf}, {idx})", e.dtype)

    def binop(self, e: Bin) -> Val:
        a, b = self.ex(e.a), self.ex(e.b)
        op, dt = e.op, e.a.dtype
        if a.kind == "u" and b.kind == "u":
            return Val("u", _C.bin_code(op, dt, a.code, b.code, e.b), e.dtype)
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
            # lanes in one block, moved by a uniform multiple of the block, stay in one block
            block = (a.block if a.kind == "a" and b.kind == "u" and a.block and const_factor(eb) % a.block == 0
                     else b.block if op == "+" and b.kind == "a" and a.kind == "u" and b.block
                     and const_factor(ea) % b.block == 0 else 0)
            return Val("a", code, "int32", s, block) if s else Val("u", code, "int32")
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
        if op in ("//", "/", "%") and a.kind == "a" and b.kind == "u" and a.block and k is None:
            # a run-time divisor with a constant factor that is a multiple of the block (a grid unravelled over
            # run-time dims: gid / (((seq + 3) / 4) * 576) with rows of 576): the lanes stay in one block
            f = const_factor(eb)
            if f > 0 and f % a.block == 0:
                code = _C.bin_code(op, "int32", a.code, b.code, eb)
                return Val("u", code, "int32") if op != "%" else Val("a", code, "int32", a.stride, a.block)
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
        fn = _C.function(e.fn, dt)
        if all(a.kind == "u" for a in args):
            return Val("u", f"{fn}({', '.join(a.code for a in args)})", e.dtype)
        vs = [self.vec(a) for a in args]
        if e.fn == "half_lo":  # int lanes to float lanes: the prelude's bit arithmetic
            return Val("v", f"kiln_f32x4_half_lo({vs[0]})", e.dtype)
        if e.fn in ("bitcast_i32", "bitcast_f32"):
            return Val("v", vs[0], e.dtype)  # a v128 is untyped
        if dt == "float32" and e.fn in ("max", "min", "clamp"):
            bounds = self.pseudo_minmax(e, vs)
            if bounds is not None:
                return Val("v", bounds, e.dtype)
        vtable = _VEC_FLOAT_FN if dt == "float32" else _VEC_INT_FN
        if e.fn in vtable:
            return Val("v", f"{vtable[e.fn]}({', '.join(vs)})", e.dtype)
        m = "KILN_MAP_F" if dt == "float32" else "KILN_MAP_I"
        if len(vs) == 1:
            return Val("v", f"{m}({fn}, {vs[0]})", e.dtype)
        if len(vs) == 2:
            return Val("v", f"{m}2({fn}, {vs[0]}, {vs[1]})", e.dtype)
        raise VectorUnsupported(f"{e.fn} of {len(vs)} vector arguments")

    @staticmethod
    def pseudo_minmax(e: Call, vs: list[str]) -> str | None:
        """Float max/min/clamp against constant bounds (ReLU, Clip) as SIMD128's pseudo-min/max
        (``pmax(x, c) = x < c ? c : x``): one instruction instead of the NaN-propagating form, and still NaN for
        a NaN ``x`` because the bound is no NaN (only the sign of a zero result may differ from f32.max)."""
        const = [isinstance(a, Const) and a.value == a.value for a in e.args]
        if e.fn == "clamp" and const[1] and const[2]:
            return f"wasm_f32x4_pmin(wasm_f32x4_pmax({vs[0]}, {vs[1]}), {vs[2]})"
        if e.fn in ("max", "min") and (const[0] or const[1]):
            x, c = (vs[0], vs[1]) if const[1] else (vs[1], vs[0])
            return f"wasm_f32x4_p{e.fn}({x}, {c})"
        return None

    def cast(self, x: Val, src: str, dst: str) -> Val:
        if x.kind != "v":
            if x.kind in ("a", "d") and dst == "int32":
                return x
            if x.kind == "u":
                return Val("u", _C.cast_code(x.code, src, dst), dst)
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
                if self.in_lanes:  # (a reduction nested in the lane loop: its sums are per lane, not across)
                    raise VectorUnsupported("a reduction inside a lane loop")
                self.decl_indent[name] = indent
                if name in self.vector_accs:
                    out.append(f"{pad}v128_t {name} = {self.vec(x)};")
                    self.env[name] = Val("v", name, s.var.dtype)
                else:
                    out.append(f"{pad}{TYPES[s.var.dtype]} {name} = {self.scalar(x)};")
                    self.env[name] = Val("u", name, s.var.dtype)
            elif isinstance(s, Assign):
                x = self.ex(s.value)
                name = s.var.name
                if self.in_lanes:  # partial sums (maxima, minima), one a lane
                    self.lane_sums[name] = _lane_op(s)
                if self.env[name].kind == "v":
                    out.append(f"{pad}{name} = {self.vec(x)};")
                elif x.kind != "u":
                    self.promote.add(name)
                    out.append(f"{pad}/* {name} needs a vector */")
                else:
                    out.append(f"{pad}{name} = {x.code};")
            elif isinstance(s, For) and s.lanes:  # its iterations are the lanes: the body once, over vectors
                if s.lanes != self.lanes or s.extent != self.lanes:
                    raise VectorUnsupported(f"a lane loop of {s.extent} for {self.lanes} lanes")
                self.env[s.var.name] = Val("a", "0", "int32", 1, self.lanes)
                self.in_lanes += 1
                out.extend(self.stmts(s.body, indent))
                self.in_lanes -= 1
            elif isinstance(s, For):
                v = s.var.name
                out.append(f"{pad}for (int {v} = 0; {v} < {size_text(s.extent)}; {v}++) {{")
                self.env[v] = Val("u", v, "int32")
                out.extend(self.stmts(s.body, indent + 1))
                out.append(f"{pad}}}")
                # lane sums declared at this level are complete: one scalar each from here on
                for name, op in sorted(self.lane_sums.items()):
                    if self.decl_indent.get(name) == indent and self.env[name].kind == "v":
                        out.append(f"{pad}const float {name}_h = kiln_f32x4_h{op}({name});")
                        self.env[name] = Val("u", f"{name}_h", "float32")
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
        for k in range(self.lanes):
            lane = (f"{pad}    {s.buf}[wasm_i32x4_extract_lane(index, {k})] = "
                    f"wasm_{'f32x4' if x.dtype == 'float32' else 'i32x4'}_extract_lane(value, {k});")
            if mask:
                lane = f"{pad}    if (wasm_i32x4_extract_lane({mask}, {k})) " + lane.lstrip()
            lines.append(lane)
        lines.append(f"{pad}}}")
        return lines


def _lane_op(s: Assign) -> str:
    """The reduction (``sum``, ``max``, ``min``) an assignment in a lane loop accumulates: ``acc + x``, ``max(acc, x)``,
    ``min(acc, x)`` of float32 ``acc`` (VectorUnsupported otherwise)."""
    v, name = s.value, s.var.name
    if s.var.dtype == "float32":
        if isinstance(v, Bin) and v.op == "+" and isinstance(v.a, Var) and v.a.name == name:
            return "sum"
        if isinstance(v, Call) and v.fn in ("max", "min") and isinstance(v.args[0], Var) and v.args[0].name == name:
            return v.fn
    raise VectorUnsupported("a lane loop assigning other than a float sum, maximum or minimum")


def _has_lane_loop(stmts) -> bool:
    """Whether ``stmts`` hold a lane loop (``For.lanes``)."""
    return any((isinstance(s, For) and (s.lanes or _has_lane_loop(s.body))) or (isinstance(s, If) and _has_lane_loop(s.body))
               for s in stmts)


def vector_body(k: LoweredKernel, grid: tuple[int, ...], lanes: int = LANES) -> VectorBody | None:
    """The body of ``lanes`` tiles at once and the block they must lie in (``None``: no vector path), in the
    SIMD128 vocabulary (:func:`rename` for another instruction set).

    A kernel with a lane loop (a ``simd_reduce`` schedule: :class:`kiln.te.loops.For` ``lanes``) is vectorised
    within each tile instead: the lane loop's iterations are the lanes, its sums vector accumulators added across
    the lanes once their loop ends (``kiln_f32x4_hsum``), and everything else scalar; one tile a call.

    When the grid's innermost (non-1) extent ``W`` is a multiple of 4, vectors stay within a row
    (lane-affine ``gid``). Otherwise they run through rows of a ``W x H`` block (the two innermost
    axes), with the lanes' coordinates as vectors, so small feature maps (7 x 7) vectorise too.
    """
    if _has_lane_loop(k.body):  # a simd_reduce schedule: the lanes are a reduction's, one tile a call
        accs: set[str] = set()
        for _ in range(8):
            r = Vectoriser({k.gid.name: Val("u", k.gid.name, "int32")}, accs, (0, 0), lanes)
            try:
                lines = r.stmts(k.body, 3)
            except VectorUnsupported:
                return None
            if not r.promote:
                return VectorBody([line[8:] for line in lines], 1, 1)
            accs |= r.promote
        return None
    dims = [d for d in grid if is_symbolic(d) or d > 1]  # a run-time extent counts as more than 1
    if not dims or is_symbolic(dims[-1]):
        return None  # lanes must lie in one row of a known width
    W = dims[-1]
    H = dims[-2] if len(dims) > 1 else 1
    if not (W % lanes == 0 or H == 1) and is_symbolic(H):
        return None
    if W % lanes == 0 or H == 1:
        block, rows = W, (0, 0)
        gid = Val("a", k.gid.name, "int32", 1, block)
        pre: list[str] = []
    else:
        block, rows = W * H, (W, H)
        gid = Val("d", "kiln_g0", "int32", cx=1, cy=W, mult=block)
        pad = "    " * 3
        pre = [f"{pad}const int kiln_p = {k.gid.name} % {block};", f"{pad}const int kiln_g0 = {k.gid.name} - kiln_p;",
               f"{pad}const v128_t kiln_x = wasm_i32x4_make(" + ", ".join(f"(kiln_p + {j}) % {W}" for j in range(lanes))
               + ");",
               f"{pad}const v128_t kiln_y = wasm_i32x4_make(" + ", ".join(f"(kiln_p + {j}) / {W}" for j in range(lanes))
               + ");"]
    if block < lanes:
        return None
    accs: set[str] = set()
    for _ in range(8):  # accumulators start uniform; a pass promotes those assigned vectors
        r = Vectoriser({k.gid.name: gid}, accs, rows, lanes)
        try:
            lines = r.stmts(k.body, 3)
        except VectorUnsupported:
            return None
        if not r.promote:
            return VectorBody([line[8:] for line in pre + lines], block, lanes)
        accs |= r.promote
    return None


_NAME = re.compile(r"\b(?:wasm|kiln)_(f32x4|i32x4|u32x4|v128)_(\w+)|\bv128_t\b")


def rename(lines: list[str], prefix: str = "kv") -> list[str]:
    """``lines`` of vector code with the SIMD128 vocabulary renamed for another instruction set:
    ``wasm_f32x4_add`` -> ``kv_f32_add``, ``wasm_v128_load`` -> ``kv_v128_load``, ``kiln_f32x4_clamp`` ->
    ``kv_f32_clamp``, ``wasm_f32x4_convert_i32x4`` -> ``kv_f32_convert_i32``, ``v128_t`` -> ``kv_t``."""
    def sub(m: re.Match) -> str:
        if m.group(1) is None:
            return f"{prefix}_t"
        return f"{prefix}_{m.group(1).removesuffix('x4')}_{m.group(2).replace('x4', '')}"

    return [_NAME.sub(sub, line) for line in lines]
