"""Run-time dims of a package (format 1.4, docs/dynamic-shapes.md), for the native runtime.

:func:`bind_dims` reads each dim's value from the fed input shapes (every input must agree, and each
value must lie within the dim's bounds) or from an integer input's value (``value_dim``, format 1.7);
:func:`dims_words` packs the values into the dims uniform;
:func:`dispatches` evaluates every step's workgroup count (the manifest's size expressions) and
:func:`output_shapes` the outputs' shapes. The runtime never imports the compiler: expressions are
evaluated by :func:`kiln.arith.symbolic.eval_json`'s small interpreter, which depends on nothing else.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.errors import PackageError, ShapeError

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "//": lambda a, b: a // b,
        "%": lambda a, b: a % b, "max": max, "min": min}


def eval_json(j: Any, env: dict[str, int]) -> int:
    """Evaluate a manifest size expression (an int, a dim name, or ``[op, a, b]`` with ``op`` one of
    ``+ - * // % max min``; ``//`` floors) with dim values ``env``.

    Raises:
        PackageError: a malformed expression, an unknown dim, or a division by zero.
    """
    if isinstance(j, bool):
        raise PackageError(f"malformed size expression {j!r}")
    if isinstance(j, int):
        return j
    if isinstance(j, str):
        if j not in env:
            raise PackageError(f"size expression names unknown dim {j!r}")
        return int(env[j])
    if isinstance(j, list) and len(j) == 3 and j[0] in _OPS:
        a, b = eval_json(j[1], env), eval_json(j[2], env)
        if j[0] in ("//", "%") and b == 0:
            raise PackageError("size expression divides by zero")
        return int(_OPS[j[0]](a, b))
    raise PackageError(f"malformed size expression {j!r}")


def _names(j: Any) -> list[str]:
    """The dim names a size expression reads."""
    if isinstance(j, str):
        return [j]
    if isinstance(j, list):
        return [n for x in j[1:] for n in _names(x)]
    return []


def is_dynamic(manifest: dict[str, Any]) -> bool:
    """True for a package with run-time dims."""
    return bool(manifest.get("dynamic_dims"))


def bind_dims(manifest: dict[str, Any], feeds: dict[str, Any]) -> dict[str, int]:
    """Each run-time dim's value, read from the shapes of ``feeds`` (input name -> array) and from the values of
    ``value_dim`` inputs.

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
            raise ShapeError(f"missing input {name!r} ({spec['dtype']}{want})")
        shape = np.shape(feeds[name])
        if len(shape) != len(want):
            raise ShapeError(f"input {name!r}: expected rank {len(want)} {want}, got shape {list(shape)}")
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
            raise ShapeError(f"input {spec['name']!r}: expected shape {exp} (symbolic {want}), got {got}")
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


def variant(step: dict[str, Any], env: dict[str, int]) -> int:
    """Which kernel of a plan step runs for dims ``env``: 0 for the step's own, ``i + 1`` for its ``variants[i]``,
    the first whose ``when`` ranges all hold (a variant is the step's group scheduled for another part of the dims'
    range; a runtime that ignores variants still computes the same values)."""
    for i, v in enumerate(step.get("variants", ())):
        if all(lo <= env[name] <= hi for name, (lo, hi) in v["when"].items()):
            return i + 1
    return 0


def chosen(step: dict[str, Any], env: dict[str, int]) -> dict[str, Any]:
    """The plan step, or its variant, that runs for dims ``env`` (:func:`variant`)."""
    i = variant(step, env)
    return step["variants"][i - 1] if i else step


def dispatches(plan: list[dict[str, Any]], env: dict[str, int], max_x: int = 65535) -> list[tuple[int, int, int]]:
    """Workgroup counts ``(x, y, z)`` of every step (its kernel for ``env``: :func:`chosen`) for dims ``env``;
    ``(0, 0, 0)`` for a step with nothing to do (the runtime skips it). Counts above ``max_x`` wrap into y, as the
    kernels expect."""
    out = []
    for s in plan:
        s = chosen(s, env)
        if "groups" not in s:
            out.append(tuple(s["dispatch"]))
            continue
        g = eval_json(s["groups"], env)
        out.append((0, 0, 0) if g <= 0 else (g, 1, 1) if g <= max_x else (max_x, -(-g // max_x), 1))
    return out


def output_shapes(manifest: dict[str, Any], env: dict[str, int]) -> dict[str, list[int]]:
    """Each output's shape for dims ``env``."""
    return {o["name"]: [eval_json(d, env) for d in o.get("dynamic_shape", o["shape"])] for o in manifest["outputs"]}
