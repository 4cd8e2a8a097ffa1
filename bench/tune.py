"""Auto-tuning acceptance: tuned against untuned (default-schedule) packages, end to end and GPU only.

For each model: tune its kernels on this machine's adapter within a time budget (or load a
tuning database that already has them, resuming), compile it twice (default schedules; the
database's schedules), check both against onnxruntime CPU, then time both in the same process,
interleaved. The tuning runs in a child process and the timing ``--cool-down`` seconds after it (timed in the
tuning's own process right after the search, MobileNetV2's packages ran 2x slower on the lent H200 than in a
fresh process). Timed: end-to-end ``Session.run`` medians in both I/O modes (host I/O: upload, compute,
readback; GPU-resident I/O: the input uploaded once as a GPUTensor, ``run(feeds, output="gpu")``
plus a device sync, no host copies), GPU-only medians (the
sum of ``Session.profile``'s per-dispatch timestamp medians: each dispatch in a pass of its own, so a
fixed per-pass cost is in every row) and whole-pass GPU medians (every dispatch in one compute pass,
as ``Session.run`` records them, timestamps at its start and end). Prints a table and writes JSON.

On the lent GPU machine (recipe: ../shared/gpu/README.md and bench/gpu.py), one model per command::

    python3 -m bench.tune --models mobilenet_v2 --minutes 6 --db $OUT/tuning-h200.json --out $OUT

Models: MobileNetV2 (``models/``), ResNet-50 (torchvision's architecture, random weights, exported
here; needs torch and torchvision), MiniLM at batch 1 and 32 (``minilm_b1``, ``minilm_b32``: bench.gpu's
all-MiniLM-L6-v2 architecture, random weights, sequence 128; the dims bound as bench.gpu binds them, so its
``--tuning-db`` row finds these records). Classifiers are tuned and compiled at batch 1.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from bench.common import ROOT, write_record


def model_path(name: str, tmp: Path) -> Path:
    """The ONNX file of ``name`` (``mobilenet_v2``: the bundled model; the others exported here as bench.gpu does)."""
    if name == "mobilenet_v2":
        return ROOT / "models" / "mobilenet_v2_imagenet.onnx"
    from bench.gpu import export_onnx, torch_model

    return export_onnx(torch_model(name), name, tmp / f"{name}.onnx")


def model_feeds(name: str) -> tuple[dict[str, int], dict[str, np.ndarray]]:
    """``(dims, feeds)`` of ``name``: the dims tuned and compiled (MiniLM's batch and sequence as bench.gpu binds them;
    a classifier's batch 1) and random inputs."""
    from bench.gpu import MINILM_SHAPES, model_inputs

    rng = np.random.default_rng(0)
    if name in MINILM_SHAPES:
        return dict(zip(("batch", "seq"), MINILM_SHAPES[name])), model_inputs(name, rng)
    return {"N": 1}, {"input": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}


def load(pkg: Path, feeds: dict[str, np.ndarray], expected: np.ndarray) -> dict:
    """Load ``pkg``: its session, feeds, max error against ``expected``, kernel counts and empty time lists."""
    from kiln.runtime.native import Session

    session = Session(pkg)
    out = next(iter(session.run(feeds).values()))
    gpu_feeds = session.upload(feeds)
    out_gpu = next(iter(session.run(gpu_feeds, output="gpu").values())).numpy()
    return {"session": session, "feeds": feeds, "gpu_feeds": gpu_feeds,
            "max_abs_error": max(float(np.abs(out - expected).max()), float(np.abs(out_gpu - expected).max())),
            "e2e": [], "e2e_gpu_io": [], "gpu": [], "pass": [], "kernels": len(session.manifest["targets"]["webgpu"]["kernels"]),
            "tuned": sum(1 for k in session.manifest["targets"]["webgpu"]["kernels"] if k.get("tuned"))}


def pass_ms(session, repeat: int) -> list[float]:
    """GPU milliseconds of the whole plan as ``Session.run`` records it (one compute pass, every
    dispatch), from timestamps written at the pass's start and end; ``repeat`` passes after one."""
    import wgpu

    dev = session.device
    n = repeat + 1
    qs = dev.create_query_set(type=wgpu.QueryType.timestamp, count=2 * n)
    resolve = dev.create_buffer(size=16 * n, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
    read = dev.create_buffer(size=16 * n, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
    enc = dev.create_command_encoder()
    for i in range(n):
        cpass = enc.begin_compute_pass(timestamp_writes={"query_set": qs, "beginning_of_pass_write_index": 2 * i,
                                                         "end_of_pass_write_index": 2 * i + 1})
        for pipeline, group, dispatch in session.steps:
            cpass.set_pipeline(pipeline)
            cpass.set_bind_group(0, group)
            cpass.dispatch_workgroups(*dispatch)
        cpass.end()
    enc.resolve_query_set(qs, 0, 2 * n, resolve, 0)
    enc.copy_buffer_to_buffer(resolve, 0, read, 0, 16 * n)
    dev.queue.submit([enc.finish()])
    read.map_sync(wgpu.MapMode.READ)
    ticks = np.frombuffer(read.read_mapped(copy=True), dtype=np.uint64).reshape(n, 2).astype(np.int64)
    read.unmap()
    return [float(b - a) / 1e6 for a, b in ticks[1:]]


def tune(name: str, args, console: Console, tmp: Path) -> dict:
    """Tune (or resume) ``name`` within ``--minutes``; returns its report (``tune_s``, ``estimated_gpu_speedup``,
    ``kernels``: each kernel's outcome)."""
    from kiln.tune.db import TuningDB
    from kiln.tune.measure import LocalMeasurer
    from kiln.tune.tuner import Budget, estimated_speedup, tune_model

    onnx_path = model_path(name, tmp)
    dims, _ = model_feeds(name)
    db = TuningDB(args.db)
    t0 = time.monotonic()
    measurer = LocalMeasurer()
    console.print(f"[bold]{name}[/]: tuning on {measurer.describe()} for {args.minutes:g} min, "
                  f"{args.trials} trials per kernel, {args.jobs} lowering processes")
    tasks = tune_model(onnx_path, measurer, db, Budget(args.trials, args.minutes * 60), device_class="gpu",
                       dims=dims, jobs=args.jobs, seed=args.seed, progress=True, log=console.print)
    return {"tune_s": time.monotonic() - t0, "estimated_gpu_speedup": estimated_speedup(tasks) if tasks else None,
            "kernels": [{"kernel": t.name, "ops": t.ops, "shape": t.shape, "uses": t.uses,
                         "profile_ms": t.profile_ms, **t.result} for t in tasks]}


def bench_model(name: str, args, console: Console, tmp: Path, report: dict | None) -> dict:
    """Compare ``name``'s default and tuned packages (the database's records for this adapter), with ``report`` the
    tuning run's (``None``: only loaded ``--db``)."""
    import onnxruntime as ort

    from kiln.compiler import compile_model
    from kiln.te.schedule import default_schedule
    from kiln.tune.db import TuningDB, adapter_key

    onnx_path = model_path(name, tmp)
    dims, feeds = model_feeds(name)
    db = TuningDB(args.db)
    report = report or {"tune_s": 0.0, "estimated_gpu_speedup": None, "kernels": []}
    identity = db.match_adapter(None)
    if identity is None:
        raise SystemExit(f"{args.db} has no records for this machine's adapter")
    expected = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    chooser = db.scheduler(identity, functools.partial(default_schedule, device_class="gpu"))
    pkgs = {"default": compile_model(onnx_path, tmp / f"{name}-default", force=True, dims=dims),
            "tuned": compile_model(onnx_path, tmp / f"{name}-tuned", force=True, dims=dims, schedule=chooser)}
    if chooser.stale:
        console.print(f"[yellow]{len(chooser.stale)} stale tuning records not used[/] (measured on other code)")
    runs = {k: load(p, feeds, expected) for k, p in pkgs.items()}
    for _ in range(args.rounds):  # interleaved, so drifting clocks affect both alike
        for r in runs.values():
            r["e2e"] += r["session"].benchmark(r["feeds"], repeat=args.repeat, warmup=3)
            r["e2e_gpu_io"] += r["session"].benchmark(r["gpu_feeds"], repeat=args.repeat, warmup=3, output="gpu")
            prof = r["session"].profile(r["feeds"], repeat=args.repeat)
            r["gpu"].append(sum(p["ms"] for p in prof))
            r["clock"] = prof[0]["clock"]
            if r["clock"] == "timestamp-query":
                r["pass"] += pass_ms(r["session"], args.repeat)
    result = {**report, "adapter": adapter_key(identity), "budget_minutes": args.minutes,
              "trials_per_kernel": args.trials}
    for k, r in runs.items():
        result[k] = {"e2e_median_ms": float(np.median(r["e2e"])),
                     "e2e_gpu_io_median_ms": float(np.median(r["e2e_gpu_io"])),
                     "gpu_median_ms": float(np.median(r["gpu"])),
                     "pass_median_ms": float(np.median(r["pass"])) if r["pass"] else None,
                     "max_abs_error": r["max_abs_error"], "kernels": r["kernels"], "tuned_kernels": r["tuned"],
                     "clock": r["clock"]}
    result["speedup_e2e"] = result["default"]["e2e_median_ms"] / result["tuned"]["e2e_median_ms"]
    result["speedup_e2e_gpu_io"] = result["default"]["e2e_gpu_io_median_ms"] / result["tuned"]["e2e_gpu_io_median_ms"]
    result["speedup_gpu"] = result["default"]["gpu_median_ms"] / result["tuned"]["gpu_median_ms"]
    if result["tuned"]["pass_median_ms"]:
        result["speedup_pass"] = result["default"]["pass_median_ms"] / result["tuned"]["pass_median_ms"]
    return result


def main() -> None:
    """Parse arguments, tune every model (in a child process), then time them all, print the table, write the JSON."""
    import os
    import subprocess
    import sys

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mobilenet_v2,resnet50",
                        help="comma list of mobilenet_v2, resnet50, minilm_b1, minilm_b32")
    parser.add_argument("--minutes", type=float, default=6.0, help="tuning budget per model (0: only load --db)")
    parser.add_argument("--trials", type=int, default=400, help="candidates per kernel at most")
    parser.add_argument("--db", type=Path, default=Path("tuning.json"), help="tuning database to resume/record")
    parser.add_argument("--jobs", type=int, default=max(1, min(15, (os.cpu_count() or 2) - 1)))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=30, help="runs per timing round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument("--cool-down", type=float, default=20.0,
                        help="seconds between the tuning and the timing (the GPU's clocks recover from the search)")
    parser.add_argument("--tune-only", type=Path, default=None, help=argparse.SUPPRESS)  # (the child process)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    console = Console(width=200)
    models = args.models.split(",")
    with tempfile.TemporaryDirectory(prefix="kiln-bench-tune-") as tmp:
        if args.tune_only is not None:
            args.tune_only.write_text(json.dumps({name: tune(name, args, console, Path(tmp)) for name in models}))
            return
        reports: dict[str, dict] = {}
        if args.minutes > 0:
            # Tuning runs in a process of its own, and the timing after a pause: timed in the tuning's process
            # right after its search, MobileNetV2's packages ran 2x slower on the H200 than in a fresh process
            # (bench/results/tune-20261129-h200-session36.txt).
            report_file = Path(tmp) / "reports.json"
            subprocess.run([sys.executable, "-m", "bench.tune", *sys.argv[1:], "--tune-only", str(report_file)],
                           check=True)
            reports = json.loads(report_file.read_text())
            console.print(f"tuned; timing after {args.cool_down:g} s")
            time.sleep(args.cool_down)
        results = {}
        for name in models:
            results[name] = bench_model(name, args, console, Path(tmp), reports.get(name))
            r = results[name]
            console.print(f"{name}: GPU {r['default']['gpu_median_ms']:.3f} -> {r['tuned']['gpu_median_ms']:.3f} ms "
                          f"({r['speedup_gpu']:.2f}x), end to end {r['default']['e2e_median_ms']:.3f} -> "
                          f"{r['tuned']['e2e_median_ms']:.3f} ms ({r['speedup_e2e']:.2f}x), GPU-resident I/O "
                          f"{r['default']['e2e_gpu_io_median_ms']:.3f} -> {r['tuned']['e2e_gpu_io_median_ms']:.3f} ms "
                          f"({r['speedup_e2e_gpu_io']:.2f}x)")
    table = Table(title="Kiln tuned vs untuned (default schedules), native wgpu")
    for col in ("model", "tuning s", "tuned kernels", "GPU ms default", "GPU ms tuned", "GPU speedup",
                "pass ms default", "pass ms tuned", "pass speedup", "e2e ms default", "e2e ms tuned", "e2e speedup",
                "gpu-io e2e default", "gpu-io e2e tuned", "gpu-io e2e speedup", "max err tuned"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for name, r in results.items():
        table.add_row(name, f"{r['tune_s']:.0f}", f"{r['tuned']['tuned_kernels']}/{r['tuned']['kernels']}",
                      f"{r['default']['gpu_median_ms']:.3f}", f"{r['tuned']['gpu_median_ms']:.3f}",
                      f"{r['speedup_gpu']:.2f}x", f"{r['default']['pass_median_ms'] or float('nan'):.3f}",
                      f"{r['tuned']['pass_median_ms'] or float('nan'):.3f}", f"{r.get('speedup_pass', float('nan')):.2f}x",
                      f"{r['default']['e2e_median_ms']:.3f}",
                      f"{r['tuned']['e2e_median_ms']:.3f}", f"{r['speedup_e2e']:.2f}x",
                      f"{r['default']['e2e_gpu_io_median_ms']:.3f}", f"{r['tuned']['e2e_gpu_io_median_ms']:.3f}",
                      f"{r['speedup_e2e_gpu_io']:.2f}x", f"{r['tuned']['max_abs_error']:.1e}")
    console.print(table)
    path = write_record({"benchmark": "tune", "repeat": args.repeat, "rounds": args.rounds, "results": results},
                        args.out, "tune")
    console.print(f"wrote {path}")
    if args.db.exists() and args.out.resolve() != args.db.parent.resolve():
        shutil.copy(args.db, args.out / args.db.name)
    print(json.dumps({n: {"gpu": r["speedup_gpu"], "pass": r.get("speedup_pass"), "e2e": r["speedup_e2e"],
                          "e2e_gpu_io": r["speedup_e2e_gpu_io"]}
                      for n, r in results.items()}))


if __name__ == "__main__":
    main()
