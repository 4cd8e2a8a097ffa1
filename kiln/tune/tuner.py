"""Tuning a model: its kernels, searched in order of their share of the model's GPU time.

:func:`model_tasks` compiles the model with default schedules and lists its distinct kernels
(by :func:`~kiln.tune.db.kernel_signature`); :func:`tune_model` profiles them (native
:meth:`~kiln.runtime.native.Session.profile`, or the default schedules measured on the RPC
devices), then runs a :class:`~kiln.tune.search.Search` per kernel within ``trials`` measured
candidates and its slice of ``minutes``, checks every candidate's output against the default
schedule's on the same random inputs, and records the fastest correct schedule in the
:class:`~kiln.tune.db.TuningDB` after each kernel, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import math
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import numpy as np

from kiln.arith.expr import Load, transform
from kiln.codegen.lowering import kernel_groups
from kiln.codegen.webgpu import wgsl
from kiln.compiler import compile_graph, group_expr
from kiln.errors import UnsupportedOpError
from kiln.frontend.onnx.importer import import_model, load_model, unsupported_ops
from kiln.package.writer import write_package
from kiln.te.compute import Tensor, placeholder, placeholders
from kiln.te.lower import lower
from kiln.te.schedule import Schedule, default_schedule
from kiln.tune.db import TuningDB, code_digest, kernel_signature
from kiln.tune.measure import Candidate, LocalMeasurer, Measurement, Measurer, matches
from kiln.tune.search import Search
from kiln.tune.space import SearchSpace


@dataclass
class Task:
    """One distinct kernel of a model.

    Attributes:
        signature: :func:`~kiln.tune.db.kernel_signature` of ``expr``.
        name: the first fused group's name (``conv_add_clip``).
        ops: its fused primitive ops, ``+``-joined.
        expr: the tensor expression.
        uses: dispatches of it in the plan.
        shape: output shape.
        default: the default schedule for the device class.
        profile_ms: GPU milliseconds of all its dispatches under the default schedule (0 until profiled).
        tunable: ``None`` or why it is not tuned (non-float32 buffers, a row kernel, a one-point space).
    """

    signature: str
    name: str
    ops: str
    expr: Tensor
    uses: int
    shape: list[int]
    default: Schedule
    profile_ms: float = 0.0
    tunable: str | None = None
    result: dict[str, Any] = field(default_factory=dict)


def model_tasks(model: str | os.PathLike, dims: dict[str, int] | None = None, device_class: str = "gpu"):
    """Compile ``model`` with default schedules; returns ``(tasks, compiled, steps_task)`` where
    ``steps_task[i]`` is the index in ``tasks`` of plan step ``i``'s kernel.

    Raises:
        ModelFormatError, UnsupportedOpError, ShapeError, KilnError: as :func:`kiln.compiler.compile_model`.
    """
    onnx_model = load_model(model)
    missing = unsupported_ops(onnx_model)
    if missing:
        raise UnsupportedOpError(missing)
    graph = import_model(onnx_model, dims)
    compiled = compile_graph(graph, "webgpu", validate=False, device_class=device_class, concat_steps=False)
    work = kernel_groups(compiled.groups)
    assert len(work) == len(compiled.steps), "plan steps and kernel groups differ"
    tasks: list[Task] = []
    by_sig: dict[str, int] = {}
    steps_task = []
    for g in work:
        expr = group_expr(g)
        sig = kernel_signature(expr)
        if sig not in by_sig:
            by_sig[sig] = len(tasks)
            task = Task(sig, g.name, "+".join(n.op for n in g.nodes), expr, 0, list(expr.shape),
                        default_schedule(expr, device_class=device_class))
            dtypes = {p.dtype for p in placeholders(expr)} | {expr.dtype}
            if dtypes != {"float32"}:
                task.tunable = f"buffers of {sorted(dtypes - {'float32'})} (only float32 kernels are tuned)"
            elif expr.attrs.get("rows"):
                # a row kernel (kiln.te.rows): the search space's schedules would lower it element by element,
                # recomputing the row's reductions for every output (and nested ones for every term)
                task.tunable = "row kernel (one workgroup a row; its schedule is not searched yet)"
            tasks.append(task)
        tasks[by_sig[sig]].uses += 1
        steps_task.append(by_sig[sig])
    return tasks, compiled, steps_task


def profile_local(compiled, steps_task: list[int], tasks: list[Task], repeat: int = 5) -> None:
    """Set each task's ``profile_ms`` from :meth:`Session.profile` of the default-scheduled package (after a second of
    runs on a GPU: :func:`kiln.runtime.timing.clock_warmup_s`)."""
    from kiln.runtime.native import Session
    from kiln.runtime.timing import clock_warmup_s

    with tempfile.TemporaryDirectory(prefix="kiln-tune-") as tmp:
        path = write_package(compiled, Path(tmp) / "pkg", preset="none")
        session = Session(path)
        rng = np.random.default_rng(0)
        feeds = {}
        for i in session.inputs:
            if i["dtype"].startswith("float"):
                feeds[i["name"]] = rng.uniform(-1, 1, i["shape"]).astype(i["dtype"])
            else:
                feeds[i["name"]] = np.zeros(i["shape"], dtype=i["dtype"])
        rows = session.profile(feeds, repeat=repeat, warmup_s=clock_warmup_s(session.adapter_info()))
    for task in tasks:
        task.profile_ms = 0.0
    for row, t in zip(rows, steps_task, strict=True):
        tasks[t].profile_ms += row["ms"]


# ---------------------------------------------------------------------- building candidates
_EXPRS: list[Tensor] = []


def _lower_one(job: tuple[int, dict]) -> tuple[str, tuple[int, int, int]] | str:
    index, schedule = job
    try:
        k = lower(_EXPRS[index], Schedule.from_json(schedule), name="tuned")
        return wgsl.render(k), tuple(k.dispatch)
    except Exception as e:  # noqa: BLE001  (a schedule the lowering refuses is a failed candidate, not a crash)
        return f"{type(e).__name__}: {e}"


def _init_worker(exprs: list[Tensor]) -> None:
    global _EXPRS
    _EXPRS = exprs


def _detached(t: Tensor) -> Tensor:
    """``t`` reading fresh placeholders without ``attrs`` (no IR values), so it pickles small."""
    fresh = {id(p): placeholder(p.shape, p.dtype, p.name) for p in placeholders(t)}

    def swap(x):
        if isinstance(x, Load) and id(x.tensor) in fresh:
            return Load(fresh[id(x.tensor)], tuple(transform(i, swap) for i in x.indices), x.dtype)
        return None

    return Tensor(t.name, t.shape, t.dtype, t.axes, transform(t.body, swap))


class Builder:
    """Lowers and renders candidates, in ``jobs`` worker processes when ``jobs > 1`` (lowering
    an unrolled 8 x 8 tile takes a good part of a second of Python). Workers start from a fork
    server, never from this (possibly GPU-holding) process. Use as a context manager.
    """

    def __init__(self, exprs: list[Tensor], jobs: int = 1):
        _init_worker(exprs)
        self.pool = None
        if jobs > 1:
            ctx = multiprocessing.get_context("forkserver")
            self.pool = ctx.Pool(jobs, initializer=_init_worker, initargs=([_detached(t) for t in exprs],))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()

    def build(self, index: int, schedules: list[Schedule]) -> list[Candidate | str]:
        """One :class:`Candidate` (or an error string) per schedule of kernel ``index``."""
        jobs = [(index, s.to_json()) for s in schedules]
        out = self.pool.map(_lower_one, jobs, chunksize=1) if self.pool is not None else list(map(_lower_one, jobs))
        return [Candidate(*r) if isinstance(r, tuple) else r for r in out]


# ---------------------------------------------------------------------- tuning
@dataclass
class Budget:
    """``trials`` candidates per kernel; ``seconds`` for the whole run (``None``: no limit)."""

    trials: int = 64
    seconds: float | None = None


def kernel_inputs(task: Task, seed: int = 0) -> tuple[list[np.ndarray], int]:
    """Random float32 inputs for the kernel's buffers (uniform in [0.5, 1.5): finite through
    logs, roots and divisions) and its output element count."""
    k = lower(task.expr, task.default)
    rng = np.random.default_rng(seed)
    return [rng.uniform(0.5, 1.5, t.shape).astype(np.float32) for t in k.inputs], k.params[-1].size


def tune_task(task: Task, space: SearchSpace, measurer: Measurer, builder: Builder, index: int, trials: int,
              deadline: float, start: list[Schedule] | None = None, seed: int = 0,
              on_update: Callable[[int, float], None] | None = None) -> dict[str, Any]:
    """Search kernel ``task`` until ``trials`` candidates are measured or ``deadline`` (monotonic s).

    Returns:
        ``{"schedule", "best_ms", "default_ms", "trials", "failed"}``: the fastest schedule whose output
        matched the default's (confirmed by measuring both again), or ``{"error": ...}``.
    """
    inputs, out_elements = kernel_inputs(task, seed)
    (default,) = builder.build(index, [task.default])
    if isinstance(default, str):
        return {"error": f"the default schedule does not lower: {default}"}
    (probe,) = measurer.measure(inputs, out_elements, [default], batch=1, repeat=3)
    if probe.error or probe.ms is None or not np.isfinite(probe.total):
        return {"error": f"the default schedule failed: {probe.error or 'non-finite output'}"}
    ref = probe
    batch = int(min(256, max(1, math.ceil(measurer.target_ms / max(probe.ms, 1e-4)))))
    search = Search(space, task.default, seed=seed, start=start)
    by_source: dict[str, Schedule] = {}
    measured = failed = 0
    while measured < trials and time.monotonic() < deadline:
        schedules = search.propose(min(measurer.parallel, trials - measured))
        if not schedules:
            break  # the space is exhausted
        built = builder.build(index, schedules)
        todo: list[tuple[Schedule, Candidate]] = []
        for s, c in zip(schedules, built, strict=True):
            if isinstance(c, str):
                search.record(s, None, c)
                failed += 1
                continue
            digest = hashlib.sha256(f"{c.dispatch}{c.source}".encode()).hexdigest()
            twin = by_source.get(digest)
            if twin is not None and twin in search.trials:  # the same program as a measured schedule
                search.record(s, search.trials[twin].ms, search.trials[twin].error)
                continue
            by_source[digest] = s
            todo.append((s, c))
        if todo:
            results = measurer.measure(inputs, out_elements, [c for _, c in todo], batch=batch)
            for (s, _), m in zip(todo, results, strict=True):
                ok = matches(m, ref)
                if not ok:
                    failed += 1
                search.record(s, m.ms, None if ok else (m.error or "output differs from the default schedule's"))
            measured += len(todo)
        if on_update is not None:
            best = search.best
            default_trial = search.trials.get(task.default)
            if best is not None and default_trial is not None and math.isfinite(default_trial.ms):
                on_update(measured, default_trial.ms / best.ms)
    # confirm: the default and the best few, measured again together with more repeats
    ranked = sorted((t for t in search.trials.values() if math.isfinite(t.ms) and t.schedule != task.default),
                    key=lambda t: t.ms)[:3]
    finals = [task.default] + [t.schedule for t in ranked]
    built = builder.build(index, finals)
    cands = [(s, c) for s, c in zip(finals, built, strict=True) if not isinstance(c, str)]
    results = measurer.measure(inputs, out_elements, [c for _, c in cands], batch=batch, repeat=9)
    confirmed: list[tuple[float, Schedule, Measurement]] = [
        (m.ms, s, m) for (s, _), m in zip(cands, results, strict=True) if m.ms is not None and matches(m, ref)]
    default_ms = next((ms for ms, s, _ in confirmed if s == task.default), None)
    if default_ms is None:
        return {"error": "the default schedule failed when measured again"}
    best_ms, best, _ = min(confirmed, key=lambda x: x[0])
    return {"schedule": best, "best_ms": best_ms, "default_ms": default_ms, "trials": measured, "failed": failed}


def tune_model(model: str | os.PathLike, measurer: Measurer, db: TuningDB, budget: Budget, *,
               device_class: str = "gpu", dims: dict[str, int] | None = None, jobs: int = 1, seed: int = 0,
               progress: bool = True, log: Callable[[str], None] = print) -> list[Task]:
    """Tune every float32 kernel of ``model`` on ``measurer``'s adapter, recording into ``db``.

    Kernels are tuned in order of their share of the model's GPU time; each gets at most
    ``budget.trials`` measured candidates and, when ``budget.seconds`` is set, a slice of the
    remaining time proportional to its share of the remaining kernels' time. A kernel already in
    ``db`` for this adapter with at least ``budget.trials`` trials is skipped (resuming); with
    fewer, the search starts from its record and adds the rest. A :meth:`~kiln.tune.db.TuningDB.stale` record (measured
    on code the lowering no longer generates) is searched again with the whole budget, its schedule the first
    candidate.

    Returns:
        The tasks, each with ``result``: ``status`` (``tuned``, ``recorded``, ``skipped``, ``failed``),
        ``default_ms``, ``best_ms`` (per dispatch), ``speedup``, ``trials``, and ``replaced_stale`` where a tuned
        kernel's record was stale.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    t0 = time.monotonic()
    deadline = t0 + budget.seconds if budget.seconds is not None else math.inf
    tasks, compiled, steps_task = model_tasks(model, dims, device_class)
    with Builder([t.expr for t in tasks], jobs) as builder:
        if isinstance(measurer, LocalMeasurer):
            profile_local(compiled, steps_task, tasks)
        else:
            log("profiling the default schedules on the device ...")
            _profile_remote(tasks, measurer, builder)
        total_ms = sum(t.profile_ms for t in tasks) or 1.0
        log(f"{len(tasks)} distinct kernels, {sum(t.uses for t in tasks)} dispatches, {total_ms:.3f} ms profiled; "
            f"ready to search after {time.monotonic() - t0:.0f} s")
        order = sorted(range(len(tasks)), key=lambda i: -tasks[i].profile_ms)
        remaining_ms = sum(tasks[i].profile_ms for i in order if tasks[i].tunable is None)
        columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[note]}"), TimeElapsedColumn()]
        with Progress(*columns, disable=not progress, transient=False) as bar:
            overall = bar.add_task("kernels", total=len(order), note="")
            for rank, i in enumerate(order):
                task = tasks[i]
                share = task.profile_ms / total_ms
                space = SearchSpace(task.expr, lanes=not measurer.is_cpu)
                if task.tunable is None and space.trivial():
                    task.tunable = "one schedule only"
                if task.tunable is not None:
                    task.result = {"status": "skipped", "reason": task.tunable}
                    bar.advance(overall)
                    continue
                record = db.get(task.signature, measurer.adapter)
                stale = record is not None and TuningDB.stale(record, task.expr, task.default)
                if stale:  # measured on code this run does not generate: searched again, its schedule first
                    record = {**record, "trials": 0}
                if record is not None and record["trials"] >= budget.trials:
                    task.result = {"status": "recorded", "default_ms": record["default_ms"],
                                   "best_ms": record["best_ms"], "speedup": record["speedup"],
                                   "trials": record["trials"]}
                    remaining_ms -= task.profile_ms
                    bar.advance(overall)
                    continue
                now = time.monotonic()
                if now >= deadline:
                    task.result = {"status": "skipped", "reason": "out of time"}
                    bar.advance(overall)
                    continue
                slice_s = (deadline - now) * task.profile_ms / max(remaining_ms, 1e-9) if math.isfinite(deadline) \
                    else math.inf
                remaining_ms -= task.profile_ms
                done = record["trials"] if record else 0
                start = [Schedule.from_json(record["schedule"])] if record else None
                want = budget.trials - done
                label = f"{task.name[:28]:<28} {share:5.1%}"
                current = bar.add_task(label, total=want, note="")

                def update(n: int, speedup: float, current=current) -> None:
                    bar.update(current, completed=n, note=f"best {speedup:.2f}x")

                result = tune_task(task, space, measurer, builder, i, want, now + slice_s, start=start,
                                   seed=seed + rank, on_update=update)
                bar.update(current, visible=False)
                if "error" in result:
                    task.result = {"status": "failed", "reason": result["error"]}
                else:
                    rec = db.put(task.signature, measurer.adapter, result["schedule"], best_ms=result["best_ms"],
                                 default_ms=result["default_ms"], trials=done + result["trials"],
                                 clock=measurer.clock, device_class=device_class, ops=task.ops, shape=task.shape,
                                 code=code_digest(task.expr, result["schedule"]),
                                 default_code=code_digest(task.expr, task.default))
                    db.save()
                    task.result = {"status": "tuned", "default_ms": rec["default_ms"], "best_ms": rec["best_ms"],
                                   "speedup": rec["speedup"], "trials": rec["trials"], "failed": result["failed"],
                                   **({"replaced_stale": True} if stale else {})}
                bar.advance(overall)
                bar.update(overall, note=f"model GPU est. {estimated_speedup(tasks):.2f}x")
                if not (progress and bar.console.is_terminal):
                    r = task.result
                    log(f"[{rank + 1}/{len(order)}] {task.name} {'x'.join(map(str, task.shape))} ({share:.1%}): "
                        + (f"{r['default_ms']:.4f} -> {r['best_ms']:.4f} ms ({r['speedup']:.2f}x, {r['trials']} "
                           f"trials, {r['failed']} failed" + ("; replaced a stale record" if stale else "") + ")"
                           if r["status"] == "tuned" else r.get("reason", ""))
                        + f"; {time.monotonic() - t0:.0f} s")
    return tasks


def _profile_remote(tasks: list[Task], measurer: Measurer, builder: Builder) -> None:
    """Set each task's ``profile_ms``: its default schedule measured on the devices, times its uses."""
    for i, task in enumerate(tasks):
        if task.tunable is not None:
            continue
        (c,) = builder.build(i, [task.default])
        if isinstance(c, str):
            continue
        inputs, out_elements = kernel_inputs(task)
        (m,) = measurer.measure(inputs, out_elements, [c], batch=1, repeat=3)
        task.profile_ms = (m.ms or 0.0) * task.uses


def estimated_speedup(tasks: list[Task]) -> float:
    """The model's GPU time under defaults over its time with the tuned kernels, estimated from the
    profile and each tuned kernel's measured speedup (untuned kernels unchanged)."""
    before = sum(t.profile_ms for t in tasks)
    after = sum(t.profile_ms / t.result["speedup"] if t.result.get("speedup") else t.profile_ms for t in tasks)
    return before / after if after > 0 else 1.0
