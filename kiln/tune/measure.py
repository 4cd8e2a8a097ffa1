"""Measuring kernel candidates: natively through wgpu-py, or on browser devices over Kiln RPC.

A batch of candidates of one kernel (same buffers, different WGSL and dispatch) is measured
with the same random inputs: each candidate runs once into a NaN-poisoned output, whose
sample (:func:`sample_indices`) and sums come back for the correctness check, then
``repeat`` timed passes of ``batch`` back-to-back dispatches each, after one untimed pass.
Times are per dispatch, from WebGPU timestamp queries around each pass where the adapter has
``timestamp-query``, otherwise from the wall clock (submit until the work is done).

Natively (:class:`LocalMeasurer`) every candidate's pipeline is made and checked first, and then the GPU runs the
first one back to back for :data:`kiln.runtime.timing.GPU_CLOCK_RAMP_S` before the candidates are timed one after
another: a GPU lowers its clocks while the host lowers and compiles candidates (the lent H200 from 1980 to 345 MHz
within half a second), and candidates timed while the clock ramps back up would be ranked by when they ran.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from kiln.errors import KilnError
from kiln.runtime.timing import GPU_CLOCK_RAMP_S, warm
from kiln.tune.db import adapter_identity

#: output elements sampled for the correctness check
SAMPLE = 4096


def sample_indices(n: int, m: int = SAMPLE) -> np.ndarray:
    """Indices ``floor(j * n / m)`` for ``j < m`` (every index when ``n <= m``): the output
    elements a measurement returns. kiln/js/measure.js computes the same."""
    if n <= m:
        return np.arange(n, dtype=np.int64)
    return (np.arange(m, dtype=np.int64) * n) // m


@dataclass(frozen=True)
class Candidate:
    """One schedule of a kernel, lowered: WGSL source (entry point ``main``) and workgroup counts."""

    source: str
    dispatch: tuple[int, int, int]


@dataclass
class Measurement:
    """What measuring one candidate gave.

    Attributes:
        ms: median milliseconds per dispatch (``None`` if the candidate failed).
        sample: float32 output at :func:`sample_indices` (``None`` if it failed).
        total: sum of the whole output (float64; NaN if an element was NaN, e.g. never written).
        abs_total: sum of absolute values of the whole output.
        error: why it failed (shader creation or run), else ``None``.
    """

    ms: float | None
    sample: np.ndarray | None = None
    total: float = float("nan")
    abs_total: float = float("nan")
    error: str | None = None


def matches(m: Measurement, ref: Measurement, rtol: float = 1e-3, sum_rtol: float = 1e-4) -> bool:
    """Whether candidate output ``m`` equals reference ``ref`` (the default schedule's) within
    float32 rounding of a reordered reduction: every sampled element within
    ``rtol * (|ref| + max|ref sample|)``, the sums within ``sum_rtol * abs_total`` (so an error
    between sampled elements shows too), and no NaN."""
    if m.error or m.sample is None or ref.sample is None or m.sample.shape != ref.sample.shape:
        return False
    if not np.isfinite(m.total) or np.isnan(m.sample).any():
        return False
    scale = float(np.abs(ref.sample).max(initial=0.0))
    if not np.allclose(m.sample, ref.sample, rtol=rtol, atol=rtol * max(scale, 1e-6)):
        return False
    return abs(m.total - ref.total) <= sum_rtol * max(ref.abs_total, 1e-6) + 1e-6


class Measurer(Protocol):
    """Something that measures candidates of a kernel on one kind of adapter."""

    #: the :func:`~kiln.tune.db.adapter_identity` of the adapter it measures on
    adapter: dict[str, str]
    #: ``timestamp-query`` or ``wall``
    clock: str
    #: whether the adapter is a CPU (SwiftShader, lavapipe): reduce lanes are left out of the search
    is_cpu: bool
    #: milliseconds a timed pass should last (sets ``batch``)
    target_ms: float
    #: candidates worth sending in one :meth:`measure` call
    parallel: int

    def measure(self, inputs: list[np.ndarray], out_elements: int, candidates: list[Candidate], batch: int = 1,
                repeat: int = 5) -> list[Measurement]:
        """Measure ``candidates`` on ``inputs`` (float32 arrays bound at 0..n-1; the output,
        ``out_elements`` float32, at n); one :class:`Measurement` per candidate, in order."""


def _is_cpu(info: dict[str, Any]) -> bool:
    text = " ".join(str(info.get(k, "")) for k in ("vendor", "architecture", "device", "description")).lower()
    return info.get("adapter_type") == "CPU" or any(w in text for w in ("swiftshader", "llvmpipe", "lavapipe"))


class LocalMeasurer:
    """Measures candidates natively (wgpu-py) on this machine's high-performance adapter.

    Raises:
        DeviceError: no WebGPU adapter.
    """

    parallel = 8

    def __init__(self):
        from kiln.runtime import gpu

        adapter = gpu.adapter()
        self.info = dict(adapter.info)
        self.adapter = adapter_identity(self.info)
        self.is_cpu = _is_cpu(self.info)
        timestamps = "timestamp-query" in adapter.features
        limits = {k: adapter.limits[k] for k in ("max-storage-buffer-binding-size", "max-buffer-size")
                  if k in adapter.limits}
        self.device = adapter.request_device_sync(required_features=["timestamp-query"] if timestamps else [],
                                                  required_limits=limits)
        self.clock = "timestamp-query" if timestamps else "wall"
        self.target_ms = 0.5 if timestamps else 5.0
        self.parallel = 4 if self.is_cpu else 16
        self.warmup_s = 0.0 if self.is_cpu else GPU_CLOCK_RAMP_S  # (seconds of untimed work before timing)

    def describe(self) -> str:
        """One line naming the adapter and clock."""
        return f"{self.info.get('device', '?')} ({self.info.get('backend_type', '?')}, local, {self.clock})"

    def measure(self, inputs: list[np.ndarray], out_elements: int, candidates: list[Candidate], batch: int = 1,
                repeat: int = 5) -> list[Measurement]:
        """See :class:`Measurer`. A candidate whose shader or pipeline fails gets ``error``; the others go on."""
        import wgpu

        dev = self.device
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
        buffers = []
        for a in inputs:
            data = np.ascontiguousarray(a, dtype=np.float32)
            buf = dev.create_buffer(size=max(4, data.nbytes), usage=usage)
            if data.nbytes:
                dev.queue.write_buffer(buf, 0, data)
            buffers.append(buf)
        out = dev.create_buffer(size=max(4, out_elements * 4), usage=usage)
        staging = dev.create_buffer(size=out.size, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
        nan = np.full(out.size // 4, np.nan, np.float32)
        idx = sample_indices(out_elements)
        results: list[Measurement] = []
        ready = []  # (index, pipeline, group, dispatch) of the candidates whose check run went through
        for c in candidates:
            try:
                module = dev.create_shader_module(code=c.source)
                pipeline = dev.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
                group = dev.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=[
                    {"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}}
                    for i, b in enumerate([*buffers, out])])
            except Exception as e:  # noqa: BLE001  (wgpu raises its own error classes; a bad candidate is data)
                results.append(Measurement(None, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"))
                continue
            dev.queue.write_buffer(out, 0, nan)
            enc = dev.create_command_encoder()
            cpass = enc.begin_compute_pass()
            cpass.set_pipeline(pipeline)
            cpass.set_bind_group(0, group)
            cpass.dispatch_workgroups(*c.dispatch)
            cpass.end()
            enc.copy_buffer_to_buffer(out, 0, staging, 0, out.size)
            dev.queue.submit([enc.finish()])
            staging.map_sync(wgpu.MapMode.READ)
            try:
                y = np.frombuffer(staging.read_mapped(copy=True), np.float32, count=out_elements)
            finally:
                staging.unmap()
            y64 = y.astype(np.float64)
            ready.append((len(results), pipeline, group, c.dispatch))
            results.append(Measurement(None, y[idx].copy(), float(y64.sum()), float(np.abs(y64).sum())))
        if ready:  # (the clocks up first: module docstring)
            _, pipeline, group, dispatch = ready[0]
            warm(lambda: self._time(pipeline, group, dispatch, batch, 1), 0, self.warmup_s)
        for i, pipeline, group, dispatch in ready:
            results[i].ms = statistics.median(self._time(pipeline, group, dispatch, batch, repeat))
        for b in [*buffers, out, staging]:
            b.destroy()
        return results

    def _time(self, pipeline, group, dispatch, batch: int, repeat: int) -> list[float]:
        """Milliseconds per dispatch of ``repeat`` passes of ``batch`` dispatches (one untimed pass first)."""
        import wgpu

        dev = self.device
        timestamps = self.clock == "timestamp-query"
        n = repeat + 1
        if timestamps:
            qs = dev.create_query_set(type=wgpu.QueryType.timestamp, count=2 * n)
            resolve = dev.create_buffer(size=16 * n, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
            read = dev.create_buffer(size=16 * n, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
            enc = dev.create_command_encoder()
            for i in range(n):
                cpass = enc.begin_compute_pass(timestamp_writes={
                    "query_set": qs, "beginning_of_pass_write_index": 2 * i, "end_of_pass_write_index": 2 * i + 1})
                cpass.set_pipeline(pipeline)
                cpass.set_bind_group(0, group)
                for _ in range(batch):
                    cpass.dispatch_workgroups(*dispatch)
                cpass.end()
            enc.resolve_query_set(qs, 0, 2 * n, resolve, 0)
            enc.copy_buffer_to_buffer(resolve, 0, read, 0, 16 * n)
            dev.queue.submit([enc.finish()])
            read.map_sync(wgpu.MapMode.READ)
            try:
                ticks = np.frombuffer(read.read_mapped(copy=True), dtype=np.uint64).reshape(n, 2).astype(np.int64)
            finally:
                read.unmap()
            for x in (resolve, read):
                x.destroy()
            qs.destroy()
            return [max(0.0, float(t1 - t0)) / 1e6 / batch for t0, t1 in ticks[1:]]
        times = []
        for i in range(n):
            t0 = time.perf_counter()
            enc = dev.create_command_encoder()
            cpass = enc.begin_compute_pass()
            cpass.set_pipeline(pipeline)
            cpass.set_bind_group(0, group)
            for _ in range(batch):
                cpass.dispatch_workgroups(*dispatch)
            cpass.end()
            dev.queue.submit([enc.finish()])
            dev.queue.on_submitted_work_done_sync()
            if i:
                times.append((time.perf_counter() - t0) * 1e3 / batch)
        return times


class RemoteMeasurer:
    """Measures candidates on browser devices joined to a Kiln RPC server (the ``measure`` request).

    Every device whose adapter matches the first one's (:func:`~kiln.tune.db.adapter_identity`)
    measures a share of each batch, in parallel, over a connection of its own.

    Args:
        url: the server (``ws://HOST:PORT``, or the join URL with ``#token=``).
        token: the server's token (or in ``url``'s fragment).
        devices: device ids to use (default: every device with the first device's adapter).
        wait: seconds to wait for at least one device to join.

    Raises:
        RpcError, AuthError: no server there, a bad token, or no device joined within ``wait``.
    """

    def __init__(self, url: str, token: str | None = None, devices: list[int] | None = None, wait: float = 60.0):
        from kiln.rpc.client import connect

        self._connect = lambda: connect(url, token)
        first = self._connect()
        joined = first.wait_for_devices(1, timeout=wait)
        if devices:
            chosen = [d for d in joined if d.id in set(devices)]
            if len(chosen) != len(set(devices)):
                first.close()
                raise KilnError(f"devices {sorted(set(devices) - {d.id for d in chosen})} are not joined")
        else:
            key = adapter_identity(joined[0].adapter)
            chosen = [d for d in joined if adapter_identity(d.adapter) == key]
        self.devices = chosen
        self.adapter = adapter_identity(chosen[0].adapter)
        self.info = dict(chosen[0].adapter)
        self.is_cpu = _is_cpu(self.info)
        self.clock = "timestamp-query" if all("timestamp-query" in d.features for d in chosen) else "wall"
        self.target_ms = 2.0 if self.clock == "timestamp-query" else (20.0 if self.is_cpu else 5.0)
        self.parallel = (2 if self.is_cpu else 8) * len(chosen)
        self._remotes = [first] + [self._connect() for _ in chosen[1:]]

    def describe(self) -> str:
        """One line naming the adapter, the devices and the clock."""
        name = " ".join(v for v in self.info.values() if v) or "unknown adapter"
        return f"{name} (RPC, {len(self.devices)} device(s) {[d.id for d in self.devices]}, {self.clock})"

    def close(self) -> None:
        """Close the connections."""
        for r in self._remotes:
            r.close()

    def measure(self, inputs: list[np.ndarray], out_elements: int, candidates: list[Candidate], batch: int = 1,
                repeat: int = 5) -> list[Measurement]:
        """See :class:`Measurer`: candidates are dealt round-robin to the devices, measured in parallel."""
        n = len(self.devices)
        shares = [list(range(i, len(candidates), n)) for i in range(n)]

        def work(i: int) -> list[Measurement]:
            if not shares[i]:
                return []
            got = self._remotes[i].measure(inputs, out_elements, [candidates[j] for j in shares[i]],
                                           device=self.devices[i].id, batch=batch, repeat=repeat, sample=SAMPLE)
            return [Measurement(m.ms, m.sample, m.total, m.abs_total, m.error) for m in got]

        results: list[Measurement | None] = [None] * len(candidates)
        with ThreadPoolExecutor(max_workers=n) as pool:
            for i, got in enumerate(pool.map(work, range(n))):
                for j, m in zip(shares[i], got, strict=True):
                    results[j] = m
        return [m if m is not None else Measurement(None, error="not measured") for m in results]
