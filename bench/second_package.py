"""Does a package run slower when another one was loaded before it in the process? Each case in a fresh process.

Usage: ``python -m bench.second_package [--model models/mobilenet_v2_imagenet.onnx] [--tuning-db DB]
[--processes 4] [--repeat 20] [--out bench/results]``

An app may load two packages (an encoder and a decoder, a detector and a recogniser) into one process, sharing
Kiln's device. On the lent H200 (2026-11-30, ``bench/results/gpu-20261130-h200-session39.txt`` sections 5-7),
MobileNetV2 compiled with ``--dim N=1`` (and a tuning database) did its GPU work in 0.49 ms in a process of its own,
and in 1.50 ms in 3 of 4 processes that had loaded and released the same model's untuned, dynamic package first; in a
slow process every later session of it stayed slow, with fresh pipelines and buffers.

The package under test (``--model`` with ``--dim N=1``, ``--tuning-db``'s schedules if given) and the one loaded
before it (the same model, default compile) are compiled once; then ``--processes`` pairs of child processes each
load the package under test and time it (``alone``), or first load, run once and release the other package
(``after``). Each child reports the median run (ms, host I/O, after 5 warm-up runs) and the GPU work of a run (the
sum of its dispatches' timestamp-query times, :meth:`kiln.runtime.native.Session.profile`). Prints a table and writes
``second-package-<date>.json``. On lavapipe the GPU figures are the CPU's (and the effect, if any, is not that one).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from bench.common import ROOT, time_runs, write_record


def child(package: Path, first: Path | None, repeat: int) -> dict:
    """Time ``package`` in this process, after loading, running once and releasing ``first`` if given."""
    import gc

    import kiln

    if first is not None:
        other = kiln.load(first)
        other.run(_feeds(other))
        del other
        gc.collect()
    session = kiln.load(package)
    feeds = _feeds(session)
    session.run(feeds)
    _, times = time_runs(lambda: session.run(feeds), repeat, 5)
    profile = session.profile(feeds, repeat=5)
    return {"run_ms": float(np.median(times)), "gpu_ms": float(sum(r["ms"] for r in profile)),
            "device": session.adapter_info().get("device")}


def _feeds(session) -> dict[str, np.ndarray]:
    """Random float inputs of a session's static input shapes (run-time dims at 1)."""
    rng = np.random.default_rng(0)
    return {i["name"]: rng.standard_normal([d if isinstance(d, int) else 1 for d in i["shape"]]).astype(np.float32)
            for i in session.inputs}


def main(argv: list[str] | None = None) -> dict:
    """Run the comparison; returns the JSON record."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "mobilenet_v2_imagenet.onnx",
                    help="an ONNX model with float inputs and a batch dim N")
    ap.add_argument("--tuning-db", type=Path, default=None, help="kiln tune database for the package under test")
    ap.add_argument("--processes", type=int, default=4, help="child processes per case")
    ap.add_argument("--repeat", type=int, default=20, help="timed runs per child")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--child", nargs=2, metavar=("PACKAGE", "FIRST"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        package, first = args.child
        print(json.dumps(child(Path(package), Path(first) if first != "-" else None, args.repeat)))
        return {}
    import kiln

    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        schedule = {}
        if args.tuning_db is not None:
            from bench.gpu import tuned_schedules

            schedule = {"schedule": tuned_schedules(args.tuning_db)}
        tested = kiln.compile(args.model, Path(tmp) / "tested", dims={"N": 1}, **schedule)
        first = kiln.compile(args.model, Path(tmp) / "first")
        rows: dict[str, list[dict]] = {"alone": [], "after": []}
        for i in range(args.processes):
            for case, before in (("alone", "-"), ("after", str(first))):
                console.print(f"process {i + 1}/{args.processes}: {case} ...")
                done = subprocess.run([sys.executable, "-m", "bench.second_package", "--repeat", str(args.repeat),
                                       "--child", str(tested), before], check=False, capture_output=True,
                                      text=True, cwd=ROOT)
                if done.returncode:
                    raise SystemExit(f"the {case} child failed: {done.stderr.strip().splitlines()[-1:]}")
                rows[case].append(json.loads(done.stdout.strip().splitlines()[-1]))
    table = Table(title=f"{args.model.name} --dim N=1{' (tuned)' if schedule else ''}: GPU work and run, ms, "
                        "a process each")
    for col in ("process", "alone GPU", "alone run", "after another package: GPU", "run"):
        table.add_column(col, justify="right")
    for i, (a, b) in enumerate(zip(rows["alone"], rows["after"])):
        table.add_row(str(i + 1), f"{a['gpu_ms']:.3f}", f"{a['run_ms']:.3f}", f"{b['gpu_ms']:.3f}", f"{b['run_ms']:.3f}")
    console.print(table)
    record = {"benchmark": "second-package", "model": args.model.name, "tuned": bool(schedule),
              "repeat": args.repeat, "device": rows["alone"][0]["device"], "results": rows}
    console.print(f"wrote {write_record(record, args.out, 'second-package')}")
    return record


if __name__ == "__main__":
    main()
