"""What one dispatch costs the GPU: a chain of dependent tiny kernels against independent ones, and CUDA beside them.

Usage: ``python -m bench.dispatch [--dispatches 1000] [--repeat 10] [--no-torch] [--out bench/results]``

A decode step of a language model is a few hundred small kernels in a row, each reading what the one before wrote;
what a step costs beyond their work is what each dependent dispatch costs. This measures it on the adapter at hand.
One compute pass of ``--dispatches`` dispatches of a one-line kernel (``b[i] = a[i] + 1`` over 4096 floats, 64
workgroups of 64) is submitted and waited for (a 4-byte read), median per dispatch after warm-up, in three forms:

- ``dependent``: each dispatch reads the buffer the one before wrote (wgpu puts a barrier between them);
- ``independent``: each writes a buffer of its own and reads one no dispatch writes (no barrier is needed);
- ``same output``: each writes the same buffer (write after write: a barrier).

With PyTorch on a CUDA device, the same chain as ``torch.add(a, 1, out=b)`` launches, eager and replayed as one
CUDA graph (``torch.cuda.graphs``), timed the same way (synchronize, then per launch). Prints a table and writes
``dispatch-<date>.json``. No GPU needed (on lavapipe the numbers are the CPU's).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from bench.common import ROOT, time_runs, write_record

#: floats each dispatch reads and writes, and the kernel's workgroup size
ELEMENTS, WORKGROUP = 4096, 64

KERNEL = f"""
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> b: array<f32>;
@compute @workgroup_size({WORKGROUP}) fn main(@builtin(global_invocation_id) g: vec3<u32>) {{ b[g.x] = a[g.x] + 1.0; }}
"""


def wgpu_rows(n: int, repeat: int) -> tuple[dict[str, float], str]:
    """Median µs a dispatch of each form on Kiln's shared device (:func:`kiln.runtime.gpu.shared_device`), and its
    adapter's name."""
    import wgpu

    from kiln.runtime import gpu

    dev = gpu.shared_device()
    pipe = dev.create_compute_pipeline(layout="auto", compute={"module": dev.create_shader_module(code=KERNEL),
                                                               "entry_point": "main"})
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST

    def buffer():
        return dev.create_buffer(size=ELEMENTS * 4, usage=usage)

    def group(a, b):
        return dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
            {"binding": 0, "resource": {"buffer": a}}, {"binding": 1, "resource": {"buffer": b}}])

    x, y, shared = buffer(), buffer(), buffer()
    forms = {"dependent": [group(x, y) if i % 2 == 0 else group(y, x) for i in range(n)],
             "independent": [group(shared, buffer()) for _ in range(n)],
             "same output": [group(shared, x) for _ in range(n)]}

    def per_dispatch(groups) -> float:
        def encoded():  # (encoded before the clock starts: only the GPU's work is timed)
            enc = dev.create_command_encoder()
            cpass = enc.begin_compute_pass()
            gpu.record_dispatches(cpass, [(pipe, g, (ELEMENTS // WORKGROUP, 1, 1)) for g in groups])
            cpass.end()
            return enc.finish()

        passes = iter([encoded() for _ in range(repeat + 2)])

        def submit_and_wait() -> None:
            dev.queue.submit([next(passes)])
            dev.queue.read_buffer(x, 0, 4)  # (waits for the pass)

        return _per_call(submit_and_wait, n, repeat)

    info = gpu.adapter().info
    return {form: per_dispatch(groups) for form, groups in forms.items()}, f"{info['device']} ({info['backend_type']})"


def _per_call(fn, n: int, repeat: int, sync=None) -> float:
    """Median µs of one of the ``n`` dispatches (launches) ``fn`` makes, over ``repeat`` calls after 2 warm-up calls
    (:func:`bench.common.time_runs`)."""
    _, ms = time_runs(fn, repeat, 1, sync=sync)
    return float(np.median(ms)) / n * 1e3


def torch_rows(n: int, repeat: int) -> dict[str, float]:
    """Median µs a launch of the dependent chain in PyTorch on CUDA, eager and as one CUDA graph; empty without
    CUDA."""
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    a, b = torch.zeros(ELEMENTS, device="cuda"), torch.zeros(ELEMENTS, device="cuda")

    def chain():
        for i in range(n):
            src, dst = (a, b) if i % 2 == 0 else (b, a)
            torch.add(src, 1.0, out=dst)

    rows = {"torch eager (dependent)": _per_call(chain, n, repeat, torch.cuda.synchronize)}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        chain()  # (warm-up on the capture stream)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain()
    rows["torch CUDA graph (dependent)"] = _per_call(graph.replay, n, repeat, torch.cuda.synchronize)
    return rows


def main(argv: list[str] | None = None) -> None:
    """Time every form, print the table, write the JSON record."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dispatches", type=int, default=1000, help="dispatches (launches) a timed pass")
    ap.add_argument("--repeat", type=int, default=10, help="timed passes a form (after 2 warm-up passes)")
    ap.add_argument("--no-torch", action="store_true", help="leave out the PyTorch CUDA rows")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    a = ap.parse_args(argv)
    if a.dispatches < 2 or a.repeat < 1:
        raise SystemExit("--dispatches must be at least 2 and --repeat at least 1")
    console = Console()
    with console.status("timing wgpu dispatches ..."):
        rows, device = wgpu_rows(a.dispatches, a.repeat)
    if not a.no_torch:
        with console.status("timing PyTorch launches ..."):
            rows.update(torch_rows(a.dispatches, a.repeat))
    table = Table(title=f"µs a dispatch, {a.dispatches} a pass, median of {a.repeat} ({device})")
    table.add_column("form")
    table.add_column("µs a dispatch", justify="right")
    for form, us in rows.items():
        table.add_row(form, f"{us:.2f}")
    console.print(table)
    path = write_record({"benchmark": "dispatch", "device": device, "dispatches": a.dispatches, "repeat": a.repeat,
                         "elements": ELEMENTS, "us_per_dispatch": rows}, a.out, "dispatch")
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
