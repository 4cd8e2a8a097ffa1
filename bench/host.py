"""Host overhead of one native ``Session.run``, phase by phase, and the I/O modes side by side.

Usage::

    python -m bench.host [--models mobilenet_v2,tiny] [--repeat 30] [--warmup 5] [--chunks 1,2,3,4] [--out bench/results]

For each model (``mobilenet_v2``: the bundled MobileNetV2; ``tiny``: a 2-layer MLP on a 1x64 input
whose GPU time is negligible, so its run time is host overhead; ``resnet50``, ``minilm_b1``, ``minilm_b32``:
``bench.gpu``'s exports) it times, with the device idle
before each phase (``kiln.runtime.gpu.synchronize``):

- ``check``: checking the feeds and converting them to storage form;
- ``upload``: ``queue.write_buffer`` of every host input;
- ``encode``: command encoder, the compute pass with every dispatch (C API), output copies, ``finish`` (also per
  dispatch: ``encode_us_per_dispatch``);
- ``submit``: ``queue.submit`` (host side only);
- ``wait``: until the device is idle (the GPU work; on lavapipe, the CPU running the shaders);
- ``readback``: mapping the outputs and converting them to numpy (the work already finished):
  ``readback-before`` is the previous runtime's way (one wgpu-py ``map_sync`` per output, each
  preceded by wgpu-py's empty submit), ``readback`` the current one (one staging buffer, one
  mapping through wgpu-native's C API).

and end-to-end medians of ``run(feeds)`` (host arrays in, numpy out) against ``run(gpu_feeds,
output="gpu")`` plus a device sync (GPUTensors in and out), interleaved, each also with the waits for the GPU blocking
at once instead of polling first (``kiln.runtime.gpu.SPIN_S``); then ``run(feeds)`` with the plan split
into each of ``--chunks`` command buffers submitted as they are encoded (``Session.submit_chunks``), interleaved. Prints a table and
writes JSON (``host-<date>.json``). No GPU needed: on lavapipe the ``wait`` row is CPU compute.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from bench.common import ROOT, write_record


def tiny_model(path: Path) -> Path:
    """A 2-layer MLP (1x64 -> 64 -> 10, Relu, Softmax) saved at ``path``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    r = np.random.default_rng(0)
    inits = {"W1": r.standard_normal((64, 64)).astype(np.float32), "W2": r.standard_normal((64, 10)).astype(np.float32)}
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W1"], ["a"]), helper.make_node("Relu", ["a"], ["h"]),
         helper.make_node("MatMul", ["h", "W2"], ["b"]), helper.make_node("Softmax", ["b"], ["y"], axis=-1)],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


#: the models ``--models`` takes: the bundled MobileNetV2, :func:`tiny_model`, and ``bench.gpu``'s exports (random
#: weights; PyTorch needed)
MODELS = ("mobilenet_v2", "tiny", "resnet50", "minilm_b1", "minilm_b32")


def model(name: str, tmp: Path) -> tuple[Path, dict, dict | None]:
    """``(ONNX path, dims, feeds or None for random ones)`` of benchmark model ``name`` (:data:`MODELS`).

    Raises:
        SystemExit: an unknown name."""
    if name == "mobilenet_v2":
        return ROOT / "models" / "mobilenet_v2_imagenet.onnx", {}, None
    if name == "tiny":
        return tiny_model(tmp / "tiny.onnx"), {}, None
    if name not in MODELS:
        raise SystemExit(f"bench.host: unknown model {name!r} (one of {', '.join(MODELS)})")
    from bench import gpu

    path = gpu.export_onnx(gpu.torch_model(name), name, tmp / f"{name}.onnx")
    if name in gpu.MINILM_SHAPES:
        return path, dict(zip(("batch", "seq"), gpu.MINILM_SHAPES[name])), gpu.model_inputs(name, np.random.default_rng(0))
    return path, {"N": 1}, None


def _legacy_readback(session, staging) -> dict:
    """The previous runtime's readback: one wgpu-py ``map_sync`` (and its empty submit) per output."""
    import wgpu

    from kiln.package.format import from_storage

    out = {}
    for o in session.outputs:
        st = staging[o["name"]]
        st.map_sync(wgpu.MapMode.READ)
        try:
            raw = st.read_mapped(copy=True)
        finally:
            st.unmap()
        out[o["name"]] = from_storage(raw, o["dtype"], o["shape"])
    return out


def phases(session, feeds: dict, repeat: int) -> dict[str, list[float]]:
    """Milliseconds of each phase of ``repeat`` runs (see the module docstring)."""
    import wgpu

    from kiln.package.format import from_storage
    from kiln.runtime.gpu import synchronize

    dev = session.device
    staging = {o["name"]: dev.create_buffer(size=size, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
               for o, size in zip(session.outputs, session._out_bytes)}
    times: dict[str, list[float]] = {k: [] for k in ("check", "upload", "encode", "submit", "wait", "readback",
                                                       "readback-before")}
    outs = session.outputs

    def convert(j, data):
        return from_storage(data, outs[j]["dtype"], outs[j]["shape"])

    session.run(feeds)
    for i in range(repeat):
        legacy = i % 2 == 1  # alternate the two readbacks
        synchronize(dev)
        t0 = time.perf_counter()
        host, _ = session._split_feeds(feeds)
        t1 = time.perf_counter()
        for spec, a in host:
            dev.queue.write_buffer(session.buffers[spec["buffer"]], 0, memoryview(a.reshape(-1)).cast("B"))
        t2 = time.perf_counter()
        enc = dev.create_command_encoder()
        session._encode_pass(enc)
        if legacy:
            for o, size in zip(session.outputs, session._out_bytes):
                enc.copy_buffer_to_buffer(session.buffers[o["buffer"]], 0, staging[o["name"]], 0, size)
        else:
            session._readback.copy(enc, [session.buffers[o["buffer"]] for o in session.outputs])
        commands = enc.finish()
        t3 = time.perf_counter()
        dev.queue.submit([commands])
        t4 = time.perf_counter()
        synchronize(dev)
        t5 = time.perf_counter()
        if legacy:
            _legacy_readback(session, staging)
        else:
            session._readback.read(convert)
        t6 = time.perf_counter()
        for key, a, b in (("check", t0, t1), ("upload", t1, t2), ("encode", t2, t3), ("submit", t3, t4),
                          ("wait", t4, t5), ("readback-before" if legacy else "readback", t5, t6)):
            times[key].append((b - a) * 1e3)
    return times


def end_to_end(session, feeds: dict, repeat: int, warmup: int) -> dict[str, list[float]]:
    """Interleaved wall-clock ms of ``run`` with host I/O and with GPU-resident I/O plus a sync, each with the waits
    for the GPU as the runtime makes them (polling without blocking for up to ``kiln.runtime.gpu.SPIN_S`` first)
    and blocking at once (``-block``: ``SPIN_S = 0``)."""
    from kiln.runtime import gpu

    gpu_feeds = session.upload(feeds)
    spin = gpu.SPIN_S
    out: dict[str, list[float]] = {"host-io": [], "gpu-io": [], "host-io-block": [], "gpu-io-block": []}
    try:
        for i in range(warmup + repeat):
            for suffix, spin_s in (("", spin), ("-block", 0.0)):
                gpu.SPIN_S = spin_s
                t0 = time.perf_counter()
                session.run(feeds)
                t1 = time.perf_counter()
                session.run(gpu_feeds, output="gpu")
                session.sync()
                t2 = time.perf_counter()
                if i >= warmup:
                    out["host-io" + suffix].append((t1 - t0) * 1e3)
                    out["gpu-io" + suffix].append((t2 - t1) * 1e3)
    finally:
        gpu.SPIN_S = spin
    return out


def chunked(session, feeds: dict, chunks: list[int], repeat: int, warmup: int) -> dict[int, list[float]]:
    """Interleaved wall-clock ms of ``run`` (host I/O) with the plan split into each of ``chunks`` command
    buffers (:attr:`Session.submit_chunks`), with the outputs checked equal to the one-buffer run's."""
    session.submit_chunks = 1
    want = session.run(feeds)
    out: dict[int, list[float]] = {k: [] for k in chunks}
    for i in range(warmup + repeat):
        for k in chunks:
            session.submit_chunks = k
            t0 = time.perf_counter()
            got = session.run(feeds)
            t1 = time.perf_counter()
            if i >= warmup:
                out[k].append((t1 - t0) * 1e3)
            elif i == 0:
                for name, a in want.items():
                    np.testing.assert_array_equal(got[name], a, err_msg=f"{name} with {k} command buffers")
    session.submit_chunks = 1
    return out


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; returns the JSON record."""
    import kiln
    from kiln.runtime.native import Session

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="mobilenet_v2,tiny", help=f"comma list of {', '.join(MODELS)}")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--chunks", default="1,2,3,4",
                    help="comma list of command-buffer counts a run is split into (Session.submit_chunks)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    console = Console(width=140)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            src, dims, feeds = model(name, Path(tmp))
            session = Session(kiln.compile(src, Path(tmp) / name, dims=dims, force=True))
            if feeds is None:
                rng = np.random.default_rng(0)
                feeds = {i["name"]: rng.standard_normal(i["shape"]).astype(i["dtype"]) for i in session.inputs}
            console.print(f"[bold]{name}[/]: {len(session.steps)} dispatches, {session.adapter_info().get('device')}")
            p = phases(session, feeds, args.repeat)
            e = end_to_end(session, feeds, args.repeat, args.warmup)
            c = chunked(session, feeds, [int(k) for k in args.chunks.split(",")], args.repeat, args.warmup)
            results[name] = {"dispatches": len(session.steps), "phases_ms": {k: float(np.median(v)) for k, v in p.items()},
                             "e2e_ms": {k: float(np.median(v)) for k, v in e.items()},
                             "chunks_e2e_ms": {str(k): float(np.median(v)) for k, v in c.items()},
                             "load_ms": session.load_ms}
            results[name]["encode_us_per_dispatch"] = results[name]["phases_ms"]["encode"] * 1e3 / len(session.steps)
    table = Table(title=f"Session.run host phases, median ms of {args.repeat} (wait = GPU work)")
    cols = ("check", "upload", "encode", "submit", "wait", "readback-before", "readback")
    for col in ("model", "dispatches", *cols, "encode us / dispatch", "run host-io", "run gpu-io + sync",
                "host-io, blocking waits", "gpu-io, blocking waits"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for name, r in results.items():
        table.add_row(name, str(r["dispatches"]), *(f"{r['phases_ms'][c]:.3f}" for c in cols),
                      f"{r['encode_us_per_dispatch']:.2f}", *(f"{r['e2e_ms'][k]:.3f}" for k in
                                                                ("host-io", "gpu-io", "host-io-block", "gpu-io-block")))
    console.print(table)
    chunks = Table(title=f"run (host I/O), median ms of {args.repeat}, by command buffers per run (submit_chunks)")
    chunks.add_column("model")
    keys = args.chunks.split(",")
    for k in keys:
        chunks.add_column(k, justify="right")
    for name, r in results.items():
        chunks.add_row(name, *(f"{r['chunks_e2e_ms'][k]:.3f}" for k in keys))
    console.print(chunks)
    record = {"benchmark": "host", "repeat": args.repeat, "warmup": args.warmup, "results": results}
    path = write_record(record, args.out, "host")
    console.print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
