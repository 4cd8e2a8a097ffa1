"""The C-style base renderer: loop IR (:mod:`kiln.te.loops`) to source text of a C-family language.

WGSL, GLSL ES and C share their statement and expression structure: fully parenthesised infix operators,
``f(args)`` calls, ``for (...; v < n; v++) { ... }`` loops, ``if (c) { ... }``, ``name = value;``. A target's
renderer subclasses :class:`CStyle`, sets the tables (:attr:`~CStyle.types`, :attr:`~CStyle.builtins`,
:attr:`~CStyle.binops`, :attr:`~CStyle.specials`) and overrides the hooks where its language differs
(tinygrad's ``renderer/cstyle.py`` with its WGSL and Metal subclasses is the model of this split).

Every method renders one node; ``expr`` and ``stmts`` dispatch on the node's class name (``Bin`` ->
:meth:`~CStyle.bin`, ``For`` -> :meth:`~CStyle.for_`), so a subclass overrides exactly the nodes it
spells differently and inherits the rest.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from kiln.arith.expr import Bin, Call, Cast, Const, Expr, Select, Var
from kiln.te.loops import Assign, Decl, For, If, Let, Store


def float_text(f: float) -> str:
    """The shortest decimal text of finite float ``f`` that reads back as the same f32, with a ``.0`` where
    it would otherwise look like an integer (``1.0``, ``1e-07``, ``0.1``)."""
    r = repr(f)
    return r if "e" in r or "." in r else r + ".0"


class CStyle:
    """Renders lowered kernels to a C-family language.

    Class attributes (a subclass's tables):
        lang: the language's name, for error messages (``WGSL``).
        types: Kiln dtype -> the language's scalar type.
        builtins: expression function (:class:`~kiln.arith.expr.Call` ``fn``) -> the function it calls.
        binops: binary operator of the IR -> the language's infix operator (``//`` is integer division).
        specials: ``pos_inf``/``neg_inf``/``nan`` -> the name a literal of that value renders as (the
            renderer defines the names; WGSL and GLSL have no literal for them).
        bools: the literals of false and true.
        float_suffix, int_suffix: the suffix of f32 and i32 literals (``f``, ``i`` in WGSL).
        loop_type: the declaration of a loop counter (``var`` in WGSL, ``int`` in C).
        indent: one level of indentation.
    """

    lang: ClassVar[str] = "C"
    types: ClassVar[dict[str, str]] = {}
    builtins: ClassVar[dict[str, str]] = {}
    binops: ClassVar[dict[str, str]] = {op: op for op in (
        "+", "-", "*", "/", "%", "<", "<=", ">", ">=", "==", "!=", "&&", "||", "&", "|", "^", "<<", ">>")} | {"//": "/"}
    specials: ClassVar[dict[str, str]] = {"pos_inf": "kiln_pos_inf", "neg_inf": "kiln_neg_inf", "nan": "kiln_nan"}
    bools: ClassVar[tuple[str, str]] = ("false", "true")
    float_suffix: ClassVar[str] = ""
    int_suffix: ClassVar[str] = ""
    loop_type: ClassVar[str] = "int"
    indent: ClassVar[str] = "    "

    # ------------------------------------------------------------------------------------- literals
    def literal(self, value, dtype: str) -> str:
        """A literal of ``dtype``; negative floats parenthesised, infinities and NaN as the names of
        :attr:`specials`."""
        if dtype == "bool":
            return self.bools[bool(value)]
        if dtype == "int32":
            return self.int_literal(int(value))
        f = float(np.float32(value))
        if math.isnan(f):
            return self.specials["nan"]
        if math.isinf(f):
            return self.specials["pos_inf" if f > 0 else "neg_inf"]
        text = float_text(f) + self.float_suffix
        return f"({text})" if f < 0 else text

    def int_literal(self, v: int) -> str:
        """An i32 literal: negative ones parenthesised; i32's minimum as ``(-2147483647 - 1)`` (2**31 is no i32)."""
        if v == -(2**31):
            return "(-2147483647 - 1)"
        return f"({v})" if v < 0 else str(v)

    # ------------------------------------------------------------------------------------- expressions
    def expr(self, e: Expr) -> str:
        """Render one expression (fully parenthesised)."""
        method = getattr(self, "x_" + type(e).__name__, None)
        if method is None:
            raise TypeError(f"{self.lang}: cannot render {type(e).__name__}")
        return method(e)

    def x_Const(self, e: Const) -> str:
        return self.literal(e.value, e.dtype)

    def x_Var(self, e: Var) -> str:
        return e.name

    def x_Bin(self, e: Bin) -> str:
        return self.bin(e.op, self.expr(e.a), self.expr(e.b), e)

    def bin(self, op: str, a: str, b: str, e: Bin) -> str:
        """Binary ``op`` of rendered operands ``a`` and ``b`` (``e`` the node: its operand dtypes)."""
        if op not in self.binops:
            raise ValueError(f"{self.lang}: unknown binary op {op!r}")
        return f"({a} {self.binops[op]} {b})"

    def x_Call(self, e: Call) -> str:
        if e.fn not in self.builtins:
            raise ValueError(f"{self.lang}: no function {e.fn} for {e.args[0].dtype if e.args else 'no'} operands")
        return f"{self.builtins[e.fn]}({', '.join(self.expr(a) for a in e.args)})"

    def x_Select(self, e: Select) -> str:
        return f"({self.expr(e.cond)} ? {self.expr(e.t)} : {self.expr(e.f)})"

    def x_Cast(self, e: Cast) -> str:
        return f"{self.types[e.dtype]}({self.expr(e.x)})"

    # ------------------------------------------------------------------------------------- statements
    def stmts(self, stmts, depth: int) -> list[str]:
        """Render statements at indentation ``depth`` as lines."""
        out: list[str] = []
        pad = self.indent * depth
        for s in stmts:
            method = getattr(self, "s_" + type(s).__name__, None)
            if method is None:
                raise TypeError(f"{self.lang}: cannot render statement {type(s).__name__}")
            out.extend(method(s, pad, depth))
        return out

    def s_Subgroups(self, s, pad: str, depth: int) -> list[str]:
        """Statements with a subgroup form (:class:`~kiln.te.loops.Subgroups`): the plain form."""
        return self.stmts(s.plain, depth)

    def block(self, head: str, body, pad: str, depth: int) -> list[str]:
        """``head {``, the body one level deeper, ``}``."""
        return [f"{pad}{head} {{", *self.stmts(body, depth + 1), f"{pad}}}"]

    def s_Let(self, s: Let, pad: str, depth: int) -> list[str]:
        return [f"{pad}const {self.types[s.value.dtype]} {s.var.name} = {self.expr(s.value)};"]

    def s_Decl(self, s: Decl, pad: str, depth: int) -> list[str]:
        return [f"{pad}{self.types[s.var.dtype]} {s.var.name} = {self.expr(s.value)};"]

    def s_Assign(self, s: Assign, pad: str, depth: int) -> list[str]:
        return [f"{pad}{s.var.name} = {self.expr(s.value)};"]

    def extent(self, n) -> str:
        """A loop's trip count: a size expression, or an int literal."""
        return self.expr(n) if isinstance(n, Expr) else f"{n}{self.int_suffix}"

    def s_For(self, s: For, pad: str, depth: int) -> list[str]:
        v = s.var.name
        head = f"for ({self.loop_type} {v} = 0{self.int_suffix}; {v} < {self.extent(s.extent)}; {v}++)"
        return self.block(head, s.body, pad, depth)

    def s_If(self, s: If, pad: str, depth: int) -> list[str]:
        return self.block(f"if ({self.expr(s.cond)})", s.body, pad, depth)

    def s_Store(self, s: Store, pad: str, depth: int) -> list[str]:
        return [f"{pad}{s.buf}[{self.expr(s.index)}] = {self.expr(s.value)};"]
