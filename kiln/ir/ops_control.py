"""Control-flow primitives of the graph IR: ``If`` and ``Loop`` with conditions known only at run time.

Registered into :mod:`kiln.ir.registry` (importing that module imports this one); their kind is ``control``.
Each holds its branches or body as closed sub-graphs (:class:`~kiln.ir.graph.Graph`): a sub-graph reads
nothing from the enclosing graph except constants and its own inputs, and the node lists the outer values
it captures as its own inputs, so every pass sees the data flow (ONNX semantics: onnx.ai Operators, If
and Loop). Conditions that fold at compile time never reach these nodes: the frontend inlines the taken
branch (and unrolls Scan, LSTM, GRU, RNN over their static lengths).

``If``: inputs ``[cond, *captured]``; attributes ``then_branch`` and ``else_branch``, each a Graph whose
inputs bind to ``captured`` in order and whose outputs are the node's outputs; a branch Kiln cannot build
for the bound shapes is a ``str`` (the reason), and taking it at run time raises :class:`KilnError`.

``Loop``: inputs ``[M?, cond?, *v_initial, *captured]`` (``has_trip_count``, ``has_cond`` say which of the
first two are present; ``n_carried`` counts ``v_initial``); attribute ``body``, a Graph with inputs
``[iteration_num int64[], cond_in bool[], *carried, *captured]`` and outputs ``[cond_out, *carried_out,
*scan_outputs]``; ``scan_rows`` is the number of iterations the scan outputs are sized for (known at compile
time), and the node's outputs are ``[*final_carried, *scan_outputs]`` with scan outputs ``[scan_rows,
*per-iteration shape]``. Loop-carried values keep their dtype and shape across iterations.
"""

from __future__ import annotations

import numpy as np

from kiln.errors import KilnError, ShapeError
from kiln.ir import dtypes, interp
from kiln.ir.registry import register


def _types(graph) -> list[tuple[str, tuple[int, ...]]]:
    return [(v.dtype, tuple(v.shape)) for v in graph.outputs]


def _run(graph, args: list[np.ndarray]) -> list[np.ndarray]:
    feeds = {v.name: a for v, a in zip(graph.inputs, args)}
    out = interp.run(graph, feeds)
    return [np.asarray(out[v.name]) for v in graph.outputs]


# ----------------------------------------------------------------------------- If
def _if_infer(ts, a):
    (_, sc), *captured = ts
    if int(np.prod(sc, dtype=np.int64)) != 1:
        raise ShapeError(f"If: the condition must hold one element, got shape {list(sc)}")
    branches = [g for g in (a["then_branch"], a["else_branch"]) if not isinstance(g, str)]
    if not branches:
        raise KilnError(f"If: neither branch can be built ({a['then_branch']}; {a['else_branch']})")
    for g in branches:
        if [(v.dtype, tuple(v.shape)) for v in g.inputs] != [(d, tuple(s)) for d, s in captured]:
            raise ShapeError("If: a branch's inputs do not match the captured values")
    kinds = [_types(g) for g in branches]
    if len(kinds) == 2 and kinds[0] != kinds[1]:
        raise ShapeError(f"If: the branches give different types at run time ({kinds[0]} vs {kinds[1]}); Kiln needs "
                         "both branches to produce the same dtypes and shapes")
    return kinds[0]


def _if_eval(xs, a):
    cond, *captured = xs
    g = a["then_branch"] if bool(np.asarray(cond).reshape(-1)[0]) else a["else_branch"]
    if isinstance(g, str):
        raise KilnError(g)
    return _run(g, captured)


register("If", "control", _if_infer, _if_eval)


# ----------------------------------------------------------------------------- Loop
def _loop_split(xs, a):
    i = 0
    m = cond = None
    if a["has_trip_count"]:
        m, i = xs[0], 1
    if a["has_cond"]:
        cond, i = xs[i], i + 1
    n = a["n_carried"]
    return m, cond, list(xs[i:i + n]), list(xs[i + n:])


def _loop_infer(ts, a):
    m, cond, carried, captured = _loop_split(ts, a)
    body = a["body"]
    if m is not None and (m[0] not in ("int64", "int32") or int(np.prod(m[1], dtype=np.int64)) != 1):
        raise ShapeError(f"Loop: the trip count M must be one integer, got {m[0]}{list(m[1])}")
    if cond is not None and int(np.prod(cond[1], dtype=np.int64)) != 1:
        raise ShapeError(f"Loop: the condition must hold one element, got shape {list(cond[1])}")
    expect = [("int64", ()), ("bool", ()), *[(d, tuple(s)) for d, s in carried], *[(d, tuple(s)) for d, s in captured]]
    got = [(v.dtype, tuple(v.shape)) for v in body.inputs]
    if got != expect:
        raise ShapeError(f"Loop: body inputs {got} do not match [iteration_num, cond, carried..., captured...] {expect}")
    outs = _types(body)
    n = a["n_carried"]
    if len(outs) < 1 + n:
        raise ShapeError(f"Loop: the body returns {len(outs)} values, fewer than 1 + {n} loop-carried")
    if int(np.prod(outs[0][1], dtype=np.int64)) != 1:
        raise ShapeError(f"Loop: the body's condition output must hold one element, got shape {list(outs[0][1])}")
    for k, ((d0, s0), (d1, s1)) in enumerate(zip(carried, outs[1:1 + n])):
        if (d0, tuple(s0)) != (d1, tuple(s1)):
            raise ShapeError(f"Loop: loop-carried value {k} changes from {d0}{list(s0)} to {d1}{list(s1)} in the body; "
                             "Kiln needs loop-carried values to keep their dtype and shape")
    scans = outs[1 + n:]
    if scans and a.get("scan_rows") is None:
        raise ShapeError("Loop: scan outputs need a trip count known at compile time (their size depends on data)")
    return [*[(d, tuple(s)) for d, s in carried], *[(d, (a["scan_rows"], *s)) for d, s in scans]]


def _loop_eval(xs, a):
    m, cond, carried, captured = _loop_split(xs, a)
    body = a["body"]
    trips = int(np.asarray(m).reshape(-1)[0]) if m is not None else None
    go = bool(np.asarray(cond).reshape(-1)[0]) if cond is not None else True
    n = a["n_carried"]
    values = [np.asarray(c) for c in carried]
    scans: list[list[np.ndarray]] = [[] for _ in body.outputs[1 + n:]]
    i = 0
    while go and (trips is None or i < trips):
        outs = _run(body, [np.array(i, np.int64), np.array(go), *values, *captured])
        go = bool(outs[0].reshape(-1)[0])
        values = [o.astype(v.dtype, copy=False) for o, v in zip(outs[1:1 + n], values)]
        for k, s in enumerate(outs[1 + n:]):
            scans[k].append(s)
        i += 1
    stacked = []
    for k, v in enumerate(body.outputs[1 + n:]):
        if i != a["scan_rows"]:
            raise ShapeError(f"Loop: ran {i} iterations but its scan outputs were sized for {a['scan_rows']}")
        stacked.append(np.stack(scans[k]) if scans[k] else np.zeros((0, *v.shape), dtypes.NUMPY[v.dtype]))
    return [*values, *stacked]


register("Loop", "control", _loop_infer, _loop_eval)
