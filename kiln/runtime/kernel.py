"""Run and time one compute shader natively: the measuring primitive of schedule tests and the tuner.

Unlike :class:`kiln.runtime.native.Session` this needs no package: a WGSL source, its
storage buffers in binding order (inputs ``read``, the last ``read_write``) and a dispatch.
"""

from __future__ import annotations

import time

import numpy as np


def device():
    """The process-wide native WebGPU device used for single kernels and eager tensors: the one
    sessions share (:func:`kiln.runtime.gpu.shared_device`), so they share buffers and compiled pipelines. Not
    cached here: after a device loss ``shared_device`` hands out a new one (a cached answer kept the lost device).

    Raises:
        DeviceError: no WebGPU adapter.
    """
    from kiln.runtime.gpu import shared_device

    return shared_device()


class KernelRunner:
    """A compiled compute pipeline with its buffers, ready to run or time.

    Args:
        source: WGSL with entry point ``main`` and storage buffers at ``@group(0) @binding(i)``.
        inputs: arrays for bindings ``0..n-1`` (uploaded once, read-only).
        out_elements: elements of the output buffer (binding ``n``), float32 or ``out_dtype``.
        dispatch: workgroup counts ``(x, y, z)``.
        out_dtype: numpy dtype of the output.
        poison: fill the output with NaN before each run, so unwritten elements show.
        dims: values of the kernel's run-time dims by uniform index (int32), bound as the dims
            uniform (``kiln_dims``) at binding ``n + 1``; ``None`` for a kernel without run-time dims.

    Raises:
        wgpu's GPUError (with the compiler's message) when the shader does not compile.
    """

    def __init__(self, source: str, inputs: list[np.ndarray], out_elements: int, dispatch: tuple[int, int, int],
                 out_dtype=np.float32, poison: bool = True, dims=None):
        import wgpu

        dev = self.device = device()
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
        self.buffers = []
        for a in inputs:
            data = np.ascontiguousarray(a)
            buf = dev.create_buffer(size=max(4, data.nbytes), usage=usage)
            if data.nbytes:
                dev.queue.write_buffer(buf, 0, data.tobytes())
            self.buffers.append(buf)
        self.out_dtype = np.dtype(out_dtype)
        self.out_elements = out_elements
        self.out = dev.create_buffer(size=max(4, out_elements * self.out_dtype.itemsize), usage=usage)
        self.buffers.append(self.out)
        bindings = list(self.buffers)
        if dims is not None:  # array<vec4<i32>, K>: whole vec4s
            words = np.zeros(-(-max(1, len(dims)) // 4) * 4, np.int32)
            words[:len(dims)] = dims
            ubuf = dev.create_buffer(size=words.nbytes, usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
            dev.queue.write_buffer(ubuf, 0, words.tobytes())
            bindings.append(ubuf)
        self.staging = dev.create_buffer(size=self.out.size, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
        module = dev.create_shader_module(code=source)
        self.pipeline = dev.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
        layout = self.pipeline.get_bind_group_layout(0)
        self.group = dev.create_bind_group(layout=layout, entries=[
            {"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}} for i, b in enumerate(bindings)])
        self.dispatch = tuple(dispatch)
        self.poison = poison

    def _submit(self, times: int = 1, readback: bool = False, fence: bool = False, timestamps=None) -> None:
        enc = self.device.create_command_encoder()
        cpass = enc.begin_compute_pass(timestamp_writes=timestamps) if timestamps else enc.begin_compute_pass()
        cpass.set_pipeline(self.pipeline)
        cpass.set_bind_group(0, self.group)
        for _ in range(times):
            cpass.dispatch_workgroups(*self.dispatch)
        cpass.end()
        if readback or fence:
            enc.copy_buffer_to_buffer(self.out, 0, self.staging, 0, self.out.size if readback else 4)
        self.device.queue.submit([enc.finish()])

    def _wait(self) -> None:
        """Block until submitted work is done (mapping the staging buffer waits for the copy into it)."""
        import wgpu

        self.staging.map_sync(wgpu.MapMode.READ)
        self.staging.unmap()

    def run(self) -> np.ndarray:
        """Run once and return the output (flat, ``out_elements`` long)."""
        import wgpu

        if self.poison:
            self.device.queue.write_buffer(self.out, 0, np.full(self.out.size // 4, np.nan, np.float32).tobytes())
        self._submit(readback=True)
        self.staging.map_sync(wgpu.MapMode.READ)
        try:
            raw = self.staging.read_mapped(copy=True)
        finally:
            self.staging.unmap()
        return np.frombuffer(raw, dtype=self.out_dtype, count=self.out_elements).copy()

    def time(self, repeat: int = 10, batch: int = 1, warmup: int = 2) -> list[float]:
        """Wall-clock milliseconds per dispatch: ``repeat`` samples of ``batch`` back-to-back
        dispatches in one submit (divided by ``batch``), each waited for, after ``warmup`` samples."""
        out = []
        for i in range(warmup + repeat):
            t0 = time.perf_counter()
            self._submit(batch, fence=True)
            self._wait()
            if i >= warmup:
                out.append((time.perf_counter() - t0) * 1e3 / batch)
        return out

    def gpu_time(self, repeat: int = 10, batch: int = 1, warmup: int = 2) -> list[float] | None:
        """GPU milliseconds per dispatch, as :meth:`time` but from timestamp queries written at the start and the
        end of the samples' compute pass (the host's encoding left out); ``None`` where the device lacks the
        ``timestamp-query`` feature. The dispatches write one output, so each waits for the one before."""
        import wgpu

        dev = self.device
        if "timestamp-query" not in dev.features:
            return None
        queries = dev.create_query_set(type="timestamp", count=2)
        resolve = dev.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        staging = dev.create_buffer(size=16, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
        writes = {"query_set": queries, "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1}
        out = []
        for i in range(warmup + repeat):
            self._submit(batch, timestamps=writes)
            enc = dev.create_command_encoder()
            enc.resolve_query_set(queries, 0, 2, resolve, 0)
            enc.copy_buffer_to_buffer(resolve, 0, staging, 0, 16)
            dev.queue.submit([enc.finish()])
            staging.map_sync(wgpu.MapMode.READ)
            try:
                ticks = np.frombuffer(staging.read_mapped(copy=True), np.uint64)
            finally:
                staging.unmap()
            if i >= warmup:  # (an end stamp before the start one, which some drivers give: 0, as profile() does)
                out.append(float(ticks[1] - ticks[0]) / 1e6 / batch if ticks[1] >= ticks[0] else 0.0)
        for b in (resolve, staging, queries):
            b.destroy()
        return out
