"""The eager runtime's device side: one shared wgpu device, buffers, the pipeline cache and dispatches.

Every eager tensor owns one storage buffer on the device; kernels read and write those buffers
and nothing is read back until :meth:`Runtime.read` (``Tensor.numpy()``). Dispatches are recorded
into one open compute pass and submitted together when a result is read (or after
:data:`FLUSH_EVERY` dispatches); within a pass, WebGPU makes each dispatch's writes visible to
the next (every dispatch is its own usage scope, WebGPU spec §21.2.2), so eager ops run in order.

Buffers are never written after creation (uploads use ``mappedAtCreation``), so recording
dispatches ahead of a submit cannot race with uploads. A buffer is released when the last
tensor holding it is garbage-collected (wgpu-native keeps it alive while a pending command
buffer uses it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kiln.errors import DeviceError
from kiln.runtime.gpu import is_lost

#: dispatches recorded before the pending pass is submitted even without a read
FLUSH_EVERY = 256


@dataclass
class Pipeline:
    """A compiled kernel: its WGSL, pipeline, bind group layout and how it is dispatched.

    Attributes:
        source: WGSL text (entry point ``main``).
        pipeline: the ``GPUComputePipeline``.
        layout: its bind group layout (group 0).
        workgroup_size: invocations per workgroup.
        generic: True for a shape-generic kernel (shapes read from its uniform buffer).
        uniform_words: 32-bit words of its uniform buffer (0: none).
        order: for each storage binding but the output, the index of the op's operand it reads.
        out_dtype: the eager dtype of the result.
        out_shape: the result's shape (specialised kernels).
        groups: workgroup counts (specialised kernels; generic ones size the dispatch per call).
        inputs: the placeholders the kernel reads, in binding order.
        validated: a dispatch went through wgpu-py's checked API (later ones may use the C API).
    """

    source: str
    pipeline: object
    layout: object
    workgroup_size: int
    generic: bool
    uniform_words: int = 0
    order: list = field(default_factory=list)
    out_dtype: str = "float32"
    out_shape: tuple = ()
    groups: tuple = (1, 1, 1)
    inputs: list = field(default_factory=list)
    validated: bool = False


@dataclass
class Stats:
    """Counters of the kernel cache (see :func:`kiln.eager.stats`)."""

    compiles: int = 0
    generic_hits: int = 0
    specialized_hits: int = 0
    specializations: int = 0
    dispatches: int = 0
    uploads: int = 0
    readbacks: int = 0
    signatures: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        """The counters as a plain dict (``signatures``: distinct call signatures seen)."""
        return {"compiles": self.compiles, "generic_hits": self.generic_hits,
                "specialized_hits": self.specialized_hits, "specializations": self.specializations,
                "dispatches": self.dispatches, "uploads": self.uploads, "readbacks": self.readbacks,
                "signatures": len(self.signatures)}


class Runtime:
    """The process-wide eager runtime on one wgpu device (created by :func:`runtime`).

    Raises:
        DeviceError: no WebGPU adapter.
    """

    def __init__(self):
        import wgpu

        from kiln.runtime.kernel import device

        self.wgpu = wgpu
        self.device = device()
        info = self.device.adapter.info
        #: schedules for a CPU (lavapipe, SwiftShader) or a GPU, see kiln.te.schedule.default_schedule
        self.device_class = "cpu" if info.get("adapter_type", "") == "CPU" else "gpu"
        self.usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        self.pipelines: dict = {}
        self.stats = Stats()
        self._enc = None
        self._pass = None
        self._pending = 0
        self._raw = _raw_api()
        self._raw_groups: list = []  # bind groups made through the C API, released after their submit

    # ------------------------------------------------------------------ buffers
    def upload(self, data: np.ndarray):
        """A new storage buffer holding ``data`` (4-byte elements; at least 4 bytes long)."""
        raw = np.ascontiguousarray(data).tobytes()
        if len(raw) < 4:
            raw = raw + bytes(4 - len(raw))
        self.stats.uploads += 1
        return self.device.create_buffer_with_data(data=raw, usage=self.usage)

    def empty(self, nbytes: int):
        """A new, uninitialised storage buffer of ``nbytes`` (at least 4)."""
        return self.device.create_buffer(size=max(4, int(nbytes)), usage=self.usage)

    def read(self, buffer, nbytes: int) -> bytes:
        """The first ``nbytes`` of ``buffer``, after every recorded dispatch has run."""
        wgpu = self.wgpu
        size = max(4, (int(nbytes) + 3) // 4 * 4)
        staging = self.device.create_buffer(size=size, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
        self._end_pass()
        enc = self._enc or self.device.create_command_encoder()
        enc.copy_buffer_to_buffer(buffer, 0, staging, 0, size)
        self.device.queue.submit([enc.finish()])
        self._enc, self._pending = None, 0
        self._release_groups()
        staging.map_sync(wgpu.MapMode.READ)
        try:
            raw = staging.read_mapped(copy=True)
        finally:
            staging.unmap()
        self.stats.readbacks += 1
        return bytes(raw)[:nbytes]

    # ------------------------------------------------------------------ kernels
    def compile(self, source: str, workgroup_size: int, generic: bool, uniform_words: int) -> Pipeline:
        """Compile WGSL ``source`` (cached by the caller under its signature).

        Raises:
            PackageError with the shader compiler's message (a bug in a generated kernel).
        """
        from kiln.runtime.pipelines import KernelSpec, pipeline_cache

        cached = pipeline_cache(self.device).get(KernelSpec(source, "main", None, "eager"))  # shared with sessions
        self.stats.compiles += 1
        return Pipeline(source, cached.pipeline, cached.layout, workgroup_size, generic, uniform_words)

    def dispatch(self, p: Pipeline, buffers: list, groups: tuple[int, int, int], uniforms: np.ndarray | None = None):
        """Record one dispatch of ``p`` over storage ``buffers`` (binding order) and its ``uniforms`` (int32 words).

        A pipeline's first dispatch goes through wgpu-py's checked API; later ones, whose bind group
        layout and binding kinds that first one validated, make the bind group and record the three
        pass commands through wgpu-native's C API directly, as
        :meth:`kiln.runtime.native.Session._encode_raw` does (wgpu-py's wrappers cost most of an
        eager op's time on a CPU).
        """
        buffers = list(buffers)
        if p.uniform_words:
            words = np.zeros(-(-p.uniform_words // 4) * 4, np.int32)
            words[:len(uniforms)] = uniforms
            buffers.append(self.device.create_buffer_with_data(data=words.tobytes(),
                                                               usage=self.wgpu.BufferUsage.UNIFORM))
        if self._pass is None:
            if self._enc is None:
                self._enc = self.device.create_command_encoder()
            self._pass = self._enc.begin_compute_pass()
        if self._raw is not None and p.validated:
            ffi, lib = self._raw
            entries = ffi.new("WGPUBindGroupEntry[]", len(buffers))
            for i, b in enumerate(buffers):
                e = entries[i]
                e.binding, e.buffer, e.offset, e.size = i, b._internal, 0, b.size
            desc = ffi.new("WGPUBindGroupDescriptor *")
            desc.layout, desc.entryCount, desc.entries = p.layout._internal, len(buffers), entries
            group = lib.wgpuDeviceCreateBindGroup(self.device._internal, desc)
            self._raw_groups.append(group)
            h = self._pass._internal
            lib.wgpuComputePassEncoderSetPipeline(h, p.pipeline._internal)
            lib.wgpuComputePassEncoderSetBindGroup(h, 0, group, 0, ffi.NULL)
            lib.wgpuComputePassEncoderDispatchWorkgroups(h, *groups)
        else:
            group = self.device.create_bind_group(layout=p.layout, entries=[
                {"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}} for i, b in enumerate(buffers)])
            self._pass.set_pipeline(p.pipeline)
            self._pass.set_bind_group(0, group)
            self._pass.dispatch_workgroups(*groups)
            p.validated = True
        self.stats.dispatches += 1
        self._pending += 1
        if self._pending >= FLUSH_EVERY:
            self.flush()

    def _end_pass(self) -> None:
        if self._pass is not None:
            self._pass.end()
            self._pass = None

    def flush(self) -> None:
        """Submit every recorded dispatch (without waiting for them)."""
        self._end_pass()
        if self._enc is not None:
            self.device.queue.submit([self._enc.finish()])
        self._enc, self._pending = None, 0
        self._release_groups()

    def _release_groups(self) -> None:
        """Drop this side's references to raw bind groups (submitted command buffers hold their own)."""
        if self._raw_groups:
            _, lib = self._raw
            for g in self._raw_groups:
                lib.wgpuBindGroupRelease(g)
            self._raw_groups = []


def _raw_api():
    """wgpu-native's cffi ``(ffi, lib)`` when wgpu-py runs on it, else ``None`` (then only the checked API is used)."""
    try:
        from wgpu.backends.wgpu_native._ffi import ffi, lib
    except ImportError:  # pragma: no cover - another wgpu-py backend
        return None
    return ffi, lib


_runtime: Runtime | None = None


def runtime() -> Runtime:
    """The process-wide eager runtime, created on first use (the device takes a few seconds on lavapipe), and again
    when its device is known to be lost (:func:`kiln.runtime.gpu.is_lost`: tensors made before the loss are lost with
    it, later ones work).

    Raises:
        DeviceError: no WebGPU adapter.
    """
    global _runtime
    if _runtime is not None and not is_lost(_runtime.device):
        return _runtime
    try:
        _runtime = Runtime()
        return _runtime
    except DeviceError:
        raise
    except Exception as e:  # pragma: no cover - depends on the machine's drivers
        raise DeviceError(f"cannot create a WebGPU device for eager tensors: {e}") from e
