"""Run-time dims of a package (format 1.4, docs/dynamic-shapes.md), for the native runtime.

:func:`bind_dims` reads each dim's value from the fed input shapes (every input must agree, and each
value must lie within the dim's bounds) or from an integer input's value (``value_dim``, format 1.7);
:func:`dims_words` packs the values into the dims uniform;
:class:`StepSizes` evaluates every step's workgroup count or tiles (the manifest's size expressions) and
:func:`output_shapes` the outputs' shapes. The runtime never imports the compiler: expressions are
evaluated by :func:`eval_json`'s small interpreter, or compiled into closures by :func:`compile_json` (never
``eval``); neither depends on anything else.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.errors import PackageError, ShapeError
from kiln.runtime.feeds import shape_text

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "//": lambda a, b: a // b,
        "%": lambda a, b: a % b, "max": max, "min": min}


def eval_json(j: Any, env: dict[str, int]) -> int:
    """Evaluate a manifest size expression (an int, a dim name, or ``[op, a, b]`` with ``op`` one of
    ``+ - * // % max min``; ``//`` floors) with dim values ``env`` (:func:`compile_json` once, for expressions
    evaluated at every run).

    Raises:
        PackageError: a malformed expression, an unknown dim, or a division by zero.
    """
    if isinstance(j, int) and not isinstance(j, bool):
        return j
    if isinstance(j, list):  # (compiled once per expression object: a manifest's shapes are evaluated every run)
        kept = _COMPILED.get(id(j))
        if kept is None or kept[0] is not j:
            if len(_COMPILED) >= 4096:
                _COMPILED.clear()
            kept = _COMPILED[id(j)] = (j, compile_json(j))  # (holding ``j``: its id stays its own while kept)
        return kept[1](env)
    return compile_json(j)(env)


#: :func:`eval_json`'s compiled expressions, by the expression object's id: ``(expression, function)``
_COMPILED: dict[int, tuple[Any, Callable[[dict[str, int]], int]]] = {}


def compile_json(j: Any) -> Callable[[dict[str, int]], int]:
    """A manifest size expression (as for :func:`eval_json`) checked once and made a function of the dim values:
    nested closures, no ``eval``; a plan's expressions are compiled once and evaluated at every run (a decoder's
    dispatches change with every token).

    Raises:
        PackageError: a malformed expression (at once); the function raises it for an unknown dim or a division
            by zero.
    """
    if isinstance(j, bool):
        raise PackageError(f"malformed size expression {j!r}")
    if isinstance(j, int):
        return lambda env, v=int(j): v
    if isinstance(j, str):
        def dim(env: dict[str, int], name: str = j) -> int:
            try:
                return int(env[name])
            except KeyError:
                raise PackageError(f"size expression names unknown dim {name!r}") from None
        return dim
    if isinstance(j, list) and len(j) == 3 and j[0] in _OPS:
        a, b, f = compile_json(j[1]), compile_json(j[2]), _OPS[j[0]]
        if j[0] in ("//", "%"):
            def divide(env: dict[str, int]) -> int:
                d = b(env)
                if d == 0:
                    raise PackageError("size expression divides by zero")
                return int(f(a(env), d))
            return divide
        return lambda env: int(f(a(env), b(env)))
    raise PackageError(f"malformed size expression {j!r}")


#: :class:`StepSizes` keeps the dispatches of this many distinct dims' outcomes (then starts again)
MEMO_ENTRIES = 64


class StepSizes:
    """The size expression ``key`` (``groups``: workgroups, ``tiles``: C tiles) of every plan step and of its variants,
    compiled once (:func:`compile_json`). Steps alike in their expressions and variants (a decoder's layers repeat
    the same few: a *kind*) are evaluated together, and a kind once per value of the dims it reads (kept: a decode
    step's position moves every token, which most kinds do not read).

    Calling it with dims ``env`` gives ``(choice, sizes)``: each step's kernel (0: its own, ``i``: ``variants[i -
    1]``, the first variant whose ``when`` ranges all hold: a variant is the step's group scheduled for another part
    of the dims' range, and a runtime that ignores variants still computes the same values) and the chosen kernel's
    ``key`` value (``None`` for a kernel without one); :meth:`dispatches` gives workgroup counts.
    """

    def __init__(self, plan: list[dict[str, Any]], key: str):
        kinds: dict[str, int] = {}
        self._kinds: list[tuple[Any, list[tuple[tuple[tuple[str, int, int], ...], Any]]]] = []

        def size(s: dict[str, Any]) -> Any:  # a compiled expression, or the static dispatch of a kernel without one
            return compile_json(s[key]) if key in s else tuple(s.get("dispatch", ()))

        self._step_kind = []
        reads: dict[int, tuple[str, ...]] = {}  # a kind -> the dims its sizes and variants' ranges read
        for s in plan:
            text = json.dumps([s.get(key), s.get("dispatch"), [[v["when"], v.get(key), v.get("dispatch")]
                                                              for v in s.get("variants", ())]])
            if text not in kinds:
                kinds[text] = len(self._kinds)
                self._kinds.append((size(s), [(tuple((n, lo, hi) for n, (lo, hi) in v["when"].items()), size(v))
                                              for v in s.get("variants", ())]))
            self._step_kind.append(kinds[text])
            reads[kinds[text]] = tuple(sorted({n for j in (s.get(key), *(v.get(key) for v in s.get("variants", ())))
                                               for n in _names(j)} | {n for v in s.get("variants", ())
                                                                      for n in v["when"]}))
        # A kind's outcome depends on the dims it reads alone: kept per kind and those dims' values, numbered in
        # order of first sight (a decode step's position moves every token; the layers' projections read only its
        # one-token ``sequence``, its attention's block count moves every 64)
        self._reads = [reads[i] for i in range(len(self._kinds))]
        self._seen: list[dict[tuple, int]] = [{} for _ in self._kinds]  # a kind's dims' values -> outcome number
        self._outcomes: list[list[tuple[int, Any]]] = [[] for _ in self._kinds]  # a kind's outcomes by number
        self._numbering: list[dict[tuple[int, Any], int]] = [{} for _ in self._kinds]  # and their numbers
        self._index: np.ndarray | None = None  # (the step kinds as an index array, made on first use)
        self._memo: dict[tuple, tuple] = {}  # (:meth:`_dispatches`'s results by the kinds' outcome numbers)

    def _numbers(self, env: dict[str, int]) -> tuple[int, ...]:
        """Each kind's outcome number for dims ``env`` (its kernel choice and size, :attr:`_outcomes`)."""
        out = []
        values: dict[tuple[str, ...], tuple] = {}
        for k, (names, seen) in enumerate(zip(self._reads, self._seen)):
            at = values.get(names)
            if at is None:
                at = values[names] = tuple(env.get(n) for n in names)  # (an unknown dim: raised below)
            number = seen.get(at)
            if number is None:
                own, variants = self._kinds[k]
                c, f = 0, own
                for i, (when, vf) in enumerate(variants):
                    if all(lo <= env[n] <= hi for n, lo, hi in when):
                        c, f = i + 1, vf
                        break
                got = (c, f(env) if callable(f) else f)
                numbers, outcomes = self._numbering[k], self._outcomes[k]
                number = numbers.get(got)
                if number is None:
                    if len(outcomes) >= MEMO_ENTRIES:  # (a kind sized anew for every dims' value: a prefill's)
                        numbers.clear(), outcomes.clear(), seen.clear(), self._memo.clear()
                    number = numbers[got] = len(outcomes)
                    outcomes.append(got)
                if len(seen) >= MEMO_ENTRIES * 16:
                    seen.clear()
                seen[at] = number
            out.append(number)
        return tuple(out)

    def _per_kind(self, env: dict[str, int]) -> list[tuple[int, Any]]:
        return [self._outcomes[k][n] for k, n in enumerate(self._numbers(env))]

    def __call__(self, env: dict[str, int]) -> tuple[tuple[int, ...], list[int | None]]:
        kinds = self._per_kind(env)
        return (tuple(kinds[k][0] for k in self._step_kind),
                [v if isinstance(v, int) else None for v in (kinds[k][1] for k in self._step_kind)])

    def dispatches(self, env: dict[str, int],
                   max_x: int = 65535) -> tuple[tuple[int, ...], tuple[tuple[int, int, int], ...]]:
        """``(choice, workgroup counts)`` for dims ``env`` (``key`` ``groups``): a tuple of ``(x, y, z)`` a step,
        ``(0, 0, 0)`` for a step with nothing to do (the runtime skips it); counts above ``max_x`` wrap into y, as the
        kernels expect."""
        choice, counts, _ = self._dispatches(env, max_x, False)
        return choice, counts

    def dispatch_table(self, env: dict[str, int], max_x: int = 65535) -> tuple[tuple[int, ...],
                                                                              tuple[tuple[int, int, int], ...],
                                                                              np.ndarray | None]:
        """:meth:`dispatches` and the same counts as a uint32 ``[steps, 3]`` array (a C loop records from it:
        :mod:`kiln.runtime.record`; read-only), made per kind of step rather than from the list; ``None`` for the
        array where a step's static dispatch is not three counts."""
        return self._dispatches(env, max_x, True)

    def _dispatches(self, env: dict[str, int], max_x: int, table: bool):
        # The steps' values follow from the kinds' alone, and those change far less often than the dims: the
        # expansion to every step is kept per kinds' outcomes (read-only: the counts a tuple, the table not writeable).
        key = (self._numbers(env), max_x, table)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        kinds = tuple((c, v if not isinstance(v, int) else (0, 0, 0) if v <= 0 else (v, 1, 1) if v <= max_x
                       else (max_x, -(-v // max_x), 1)) for c, v in (self._outcomes[k][n] for k, n in enumerate(key[0])))
        choice, counts = tuple(kinds[k][0] for k in self._step_kind), tuple(kinds[k][1] for k in self._step_kind)
        rows = None
        if table and all(len(v) == 3 for _, v in kinds):
            if self._index is None:
                self._index = np.array(self._step_kind, np.intp)
            rows = np.array([v for _, v in kinds], np.uint32).reshape(-1, 3)[self._index]
            rows.flags.writeable = False
        if len(self._memo) >= MEMO_ENTRIES:
            self._memo.clear()
        self._memo[key] = hit = (choice, counts, rows)
        return hit


def _names(j: Any) -> list[str]:
    """The dim names a size expression reads."""
    if isinstance(j, str):
        return [j]
    if isinstance(j, list):
        return [n for x in j[1:] for n in _names(x)]
    return []


def count_dims(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The data-dependent dims (format 1.9, docs/dynamic-shapes.md): name -> its ``dynamic_dims`` entry (``count``:
    the buffer holding its value once the step that binds it has run)."""
    return {d["name"]: d for d in manifest.get("dynamic_dims", ()) if "count" in d}


def bind_points(plan: list[dict[str, Any]]) -> list[tuple[int, list[str]]]:
    """``(i + 1, dims)`` for every plan step ``i`` after which data-dependent ``dims`` are read back and bound: the
    run stops there, reads the counts and goes on with dispatches sized by them."""
    return [(i + 1, list(s["bind_dims"])) for i, s in enumerate(plan) if s.get("bind_dims")]


def check_count(spec: dict[str, Any], value: int) -> int:
    """The value read back for data-dependent dim ``spec`` (a ``dynamic_dims`` entry), checked against its bounds.

    Raises:
        ShapeError: the count is negative or above the dim's bound (a TopK ``k`` beyond its axis; a count over a
            stated bound).
    """
    if not spec["min"] <= value <= spec["max"]:
        raise ShapeError(f"data-dependent dim {spec['name']} is {value} at run time, outside its bounds "
                         f"{spec['min']}..{spec['max']}")
    return value


def is_dynamic(manifest: dict[str, Any]) -> bool:
    """True for a package with run-time dims."""
    return bool(manifest.get("dynamic_dims"))


def bind_dims(manifest: dict[str, Any], feeds: dict[str, Any]) -> dict[str, int]:
    """Each run-time dim's value, read from the shapes of ``feeds`` (input name -> array) and from the values of
    ``value_dim`` inputs; a data-dependent dim (:func:`count_dims`) is at its bound until the run reads it back.

    Raises:
        ShapeError: an unknown or missing input, a wrong rank or static dim, inputs that disagree on a
            dim, a value outside the dim's bounds or not a multiple it must be (naming the input, the dim and the
            bounds), a ``value_dim`` input fed as a GPUTensor, or dims whose sum exceeds a ``dim_limits`` bound.
    """
    dims = {d["name"]: d for d in manifest["dynamic_dims"]}
    env: dict[str, int] = {}
    seen: dict[str, str] = {}
    names = {i["name"] for i in manifest["inputs"]}
    unknown = sorted(set(feeds) - names)
    if unknown:
        raise ShapeError(f"unknown input{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                         f"the model's inputs are {', '.join(map(repr, sorted(names)))}")
    for spec in manifest["inputs"]:
        name = spec["name"]
        want = spec.get("dynamic_shape", spec["shape"])
        if name not in feeds:
            raise ShapeError(f"missing input {name!r} ({spec['dtype']}{shape_text(want)})")
        shape = np.shape(feeds[name])
        if len(shape) != len(want):
            raise ShapeError(f"input {name!r}: expected rank {len(want)} {shape_text(want)}, got shape {list(shape)}")
        found = [(f"input {name!r} dim {axis}", w, int(got)) for axis, (got, w) in enumerate(zip(shape, want))
                 if isinstance(w, str) and w in dims]
        if "value_dim" in spec:  # an integer [1] input whose value is a dim (a decoder's past_sequence_length)
            w = spec["value_dim"]
            if hasattr(feeds[name], "release"):
                raise ShapeError(f"input {name!r} gives dim {w} by its value: feed a host array, not a GPUTensor")
            found.insert(0, (f"input {name!r}", w, int(np.asarray(feeds[name]).reshape(-1)[0])))
        for where, w, got in found:
            d = dims[w]
            if not d["min"] <= got <= d["max"]:
                raise ShapeError(f"{where} ({w}) is {got}, outside its bounds {d['min']}..{d['max']} (compile with "
                                 f"a wider --dim {w}=MIN..MAX)")
            if got % d.get("multiple", 1):
                raise ShapeError(f"{where} ({w}) is {got}, not a multiple of {d['multiple']} (the package was "
                                 "compiled for multiples only)")
            if w in env and env[w] != got:
                raise ShapeError(f"inconsistent dim {w}: {where} is {got} but input {seen[w]!r} gave {env[w]}")
            env[w], seen[w] = got, name
    for spec in manifest["inputs"]:  # dims of expressions (not plain names) follow from the bound ones
        want = spec.get("dynamic_shape", spec["shape"])
        got = list(np.shape(feeds[spec["name"]]))
        missing = [w for w in want if any(n not in env for n in _names(w))]
        if missing:
            raise ShapeError(f"input {spec['name']!r}: cannot bind dims {missing} from its shape")
        exp = [eval_json(w, env) for w in want]
        if exp != got:
            raise ShapeError(f"input {spec['name']!r}: expected shape {exp} (symbolic {shape_text(want)}), got {got}")
    for name, d in dims.items():  # data-dependent dims: their largest value until the run reads them back
        if "count" in d:
            env[name] = d["max"]
    for limit in manifest.get("dim_limits", ()):
        total = sum(env[n] for n in limit["dims"])
        if total > limit["max"]:
            raise ShapeError(f"dims {' + '.join(limit['dims'])} = {total} exceed their bound {limit['max']} "
                             f"({', '.join(f'{n}={env[n]}' for n in limit['dims'])})")
    return env


def dims_words(manifest: dict[str, Any], env: dict[str, int]) -> bytes:
    """The dims uniform's bytes: dim ``index`` in i32 word ``index``, padded to whole ``vec4``s."""
    dims = manifest["dynamic_dims"]
    words = np.zeros(4 * max(1, -(-len(dims) // 4)), np.int32)
    for d in dims:
        words[d["index"]] = env[d["name"]]
    return words.tobytes()


def output_shapes(manifest: dict[str, Any], env: dict[str, int]) -> dict[str, list[int]]:
    """Each output's shape for dims ``env``."""
    return {o["name"]: [eval_json(d, env) for d in o.get("dynamic_shape", o["shape"])] for o in manifest["outputs"]}


#: the most bytes a growable buffer may take (2 GiB: WebGPU's maxStorageBufferBindingSize in browsers, wasm32's
#: signed offsets); a run needing more is refused
MAX_GROW_BYTES = 2**31 - 4


class GrowSizes:
    """The growable buffers of a package (format 1.10, docs/dynamic-shapes.md *Growable buffers*): ``buffers[i].grow``
    compiled once; :meth:`__call__` gives each one's bytes for a run's dims."""

    def __init__(self, manifest: dict[str, Any]):
        self.exprs = [(b["id"], compile_json(b["grow"])) for b in manifest["buffers"] if "grow" in b]

    def __bool__(self) -> bool:
        return bool(self.exprs)

    def __call__(self, env: dict[str, int]) -> dict[int, int]:
        """Buffer id -> bytes its values take for dims ``env``.

        Raises:
            ShapeError: a buffer over :data:`MAX_GROW_BYTES` (dims too large for one buffer), naming the dims.
        """
        sizes = {b: int(f(env)) for b, f in self.exprs}
        over = [b for b, n in sizes.items() if n > MAX_GROW_BYTES]
        if over:
            dims = ", ".join(f"{k}={v}" for k, v in sorted(env.items()))
            raise ShapeError(f"dims {dims} need a buffer of {sizes[over[0]] / 2**30:.2f} GiB (buffer {over[0]}); one "
                             f"buffer holds at most 2 GiB: run smaller inputs")
        return sizes


def grown(have: int, need: int) -> int:
    """The new size of a buffer of ``have`` bytes that must hold ``need``: at least half as large again (a
    sequence growing a token a run reallocates rarely), a multiple of 256, at most :data:`MAX_GROW_BYTES`."""
    if need <= have:
        return have
    return max(need, min(-(-max(need, have * 3 // 2) // 256) * 256, MAX_GROW_BYTES))
