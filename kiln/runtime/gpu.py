"""GPU-resident tensors and the process-wide WebGPU device of the native runtime.

A :class:`GPUTensor` is a tensor in a storage buffer of a wgpu device: it can feed
:meth:`kiln.runtime.native.Session.run` without a host copy, and ``run(..., output="gpu")``
returns them, so sessions and repeated runs chain without round trips through host memory.
Buffers cannot move between WebGPU devices, so sessions share one device per process by
default (:func:`shared_device`), and so do eager tensors and single-kernel runs.

The waits and readbacks here call wgpu-native's C API (``wgpuDevicePoll``, ``wgpuBufferMapAsync``)
directly where wgpu-py runs on it: wgpu-py's ``map_sync`` submits an empty command buffer
before every read mapping and hands the wait to a polling thread, which costs a few hundred
microseconds a run on a fast GPU.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import DeviceError, KilnError, ShapeError
from kiln.package.format import DEFAULT_LIMITS, STORAGE, from_storage, to_storage

_lock = threading.Lock()
_adapter: Any = None
#: devices made by shared_device, oldest first
_devices: list[Any] = []
#: ids of devices found lost (and the devices, so that their ids are not reused)
_lost: set[int] = set()
_keep_lost: list[Any] = []


def _kebab(name: str) -> str:
    """A WebGPU limit's spec name (``maxBufferSize``) as wgpu-py spells it (``max-buffer-size``)."""
    return "".join("-" + c.lower() if c.isupper() else c for c in name)


def runtime_dir() -> str:
    """A private directory for ``XDG_RUNTIME_DIR`` (Mesa's Vulkan drivers complain on stderr when it is unset)."""
    d = Path(tempfile.gettempdir()) / f"kiln-runtime-{os.getuid()}"
    d.mkdir(mode=0o700, exist_ok=True)
    return str(d)


def request_adapter():
    """A new high-performance WebGPU adapter from wgpu-py (setting ``XDG_RUNTIME_DIR`` to :func:`runtime_dir`
    first where it is unset). Most callers want the process-wide one, :func:`adapter`.

    Raises:
        DeviceError: no adapter (no Vulkan, Metal or D3D12 driver).
    """
    import wgpu

    os.environ.setdefault("XDG_RUNTIME_DIR", runtime_dir())
    found = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    if found is None:
        raise DeviceError("no WebGPU adapter found (install a Vulkan driver, e.g. Debian's mesa-vulkan-drivers)")
    return found


def adapter():
    """The process-wide high-performance WebGPU adapter (:func:`request_adapter`, once).

    Raises:
        DeviceError: no adapter (no Vulkan, Metal or D3D12 driver).
    """
    global _adapter
    with _lock:
        if _adapter is None:
            _adapter = request_adapter()
        return _adapter


def _fits(device, limits: dict[str, int], features) -> bool:
    have = device.limits
    return (all(have.get(_kebab(n), 0) >= v for n, v in limits.items() if _kebab(n) in have)
            and all(f in device.features for f in features))


def shared_device(limits: dict[str, int] | None = None, features=(), optional=("timestamp-query", "subgroup")):
    """The process-wide wgpu device with at least ``limits`` (spec names -> values) and ``features``.

    The first call requests a device from :func:`adapter` with the adapter's own maxima for the
    limits packages name (:data:`kiln.package.format.DEFAULT_LIMITS`' keys) and the ``optional``
    features the adapter has, so later packages fit it too; a package needing a feature that device
    lacks gets a new device (then shared by later callers). Sessions, eager tensors and single-kernel
    runs all use it, so their buffers (:class:`GPUTensor`) and compiled pipelines can be shared.

    Raises:
        DeviceError: the adapter falls short of a limit or lacks a feature.
    """
    limits = dict(limits or {})
    ad = adapter()
    name = ad.info.get("device", "?")
    have = ad.limits
    for lim, value in limits.items():
        if _kebab(lim) in have and have[_kebab(lim)] < value:
            raise DeviceError(f"adapter {name} has {lim}={have[_kebab(lim)]}, the package needs {value}")
    missing = [f for f in features if f not in ad.features]
    if missing:
        raise DeviceError(f"adapter {name} lacks WebGPU features {missing}")
    with _lock:
        for dev in reversed(list(_devices)):  # (a copy: lost devices are removed on the way)
            if not is_usable(dev):  # lost (a driver reset, or destroyed): never handed out again
                _devices.remove(dev)
            elif _fits(dev, limits, features):
                return dev
        required = {}
        for lim in set(DEFAULT_LIMITS) | set(limits):
            key = _kebab(lim)
            if key in have and have[key] > DEFAULT_LIMITS.get(lim, 0):
                required[key] = have[key]
        wanted = set(features) | {f for f in optional if f in ad.features}
        if _devices:
            wanted |= set(_devices[-1].features) & set(ad.features)
        dev = ad.request_device_sync(required_features=sorted(wanted), required_limits=required)
        _devices.append(dev)
        return dev


def is_usable(device) -> bool:
    """Whether ``device`` still works: not lost (a driver reset, ``destroy()``); a lost device refuses to make even
    a 4-byte buffer. Lost devices are remembered (:func:`mark_lost`)."""
    import wgpu

    if is_lost(device):
        return False
    try:
        device.create_buffer(size=4, usage=wgpu.BufferUsage.COPY_DST, label="kiln_probe").destroy()
    except wgpu.GPUError:
        mark_lost(device)
        return False
    return True


def is_lost(device) -> bool:
    """Whether ``device`` is known to be lost (:func:`mark_lost`); no probe, for hot paths."""
    return id(device) in _lost


def mark_lost(device) -> None:
    """Remember that ``device`` was lost, so :func:`shared_device` never hands it out again."""
    _lost.add(id(device))
    _keep_lost.append(device)  # (kept referenced: its id stays unique)


def _raw():
    """wgpu-native's ``(ffi, lib)``, or ``None`` where wgpu-py runs on another backend."""
    try:
        from wgpu.backends.wgpu_native._ffi import ffi, lib
    except ImportError:  # pragma: no cover - wgpu-py always ships wgpu-native today
        return None
    return ffi, lib


#: seconds a wait for the GPU (:func:`synchronize`, :meth:`Readback.read`) first polls the device without blocking
#: before it blocks in the driver: waking a thread blocked on a fence costs tens to hundreds of microseconds (a VM's
#: more), as much as a small run's readback, so short waits spin, as CUDA's default synchronisation does. The
#: environment variable ``KILN_SPIN_US`` sets it in microseconds (``0``: always block).
SPIN_S = float(os.environ.get("KILN_SPIN_US", "2000")) / 1e6


def _spin(lib, ffi, handle, done) -> bool:
    """Poll device ``handle`` without blocking (which runs the callbacks that are due) until ``done()`` or
    :data:`SPIN_S` has passed; whether it was done. (The poll's own "queue empty" answer is no sign that the work has
    finished: :func:`synchronize`.)"""
    deadline = time.perf_counter() + SPIN_S
    while True:
        lib.wgpuDevicePoll(handle, 0, ffi.NULL)
        if done():
            return True
        if time.perf_counter() >= deadline:
            return False


#: (:func:`synchronize`) the tokens of the work-done callbacks that have fired, and the callback (made once)
_DONE: set[int] = set()
_WORK_DONE: list = []
_TOKENS = itertools.count(1)


def _work_done_callback(ffi):
    """The ``WGPUQueueWorkDoneCallback`` that records its ``userdata1`` (a token) in :data:`_DONE`, made once."""
    if not _WORK_DONE:
        @ffi.callback("void(WGPUQueueWorkDoneStatus, WGPUStringView, void *, void *)")
        def done(_status, _message, token, _u2):
            _DONE.add(int(ffi.cast("uintptr_t", token)))

        _WORK_DONE.append(done)
    return _WORK_DONE[0]


def watch_work_done(device) -> int | None:
    """Register a ``wgpuQueueOnSubmittedWorkDone`` callback (webgpu.h) for the work submitted to ``device`` so far;
    returns its token, in :data:`_DONE` once the callback has fired (a poll of the device runs it), or ``None`` where
    wgpu-native or that API is not there."""
    raw = _raw()
    queue = getattr(getattr(device, "queue", None), "_internal", None)
    if raw is None or queue is None:
        return None
    ffi, lib = raw
    token = next(_TOKENS)
    try:
        info = ffi.new("WGPUQueueWorkDoneCallbackInfo *", {
            "mode": lib.WGPUCallbackMode_AllowProcessEvents, "callback": _work_done_callback(ffi),
            "userdata1": ffi.cast("void *", token)})
        lib.wgpuQueueOnSubmittedWorkDone(queue, info[0])
    except (AttributeError, TypeError, ffi.error):  # pragma: no cover - an older webgpu.h
        return None
    return token


def synchronize(device) -> None:
    """Block until ``device`` has finished all submitted work: a work-done callback (:func:`watch_work_done`), the
    device polled without blocking until it fires or :data:`SPIN_S` has passed, then with wait (``wgpuDevicePoll``).
    (A non-blocking poll's "queue empty" answer is no such signal: wgpu-native gives it while the work still runs.)"""
    raw = _raw()
    handle = getattr(device, "_internal", None)
    if raw is not None and handle is not None:
        ffi, lib = raw
        token = watch_work_done(device)
        if token is None or not _spin(lib, ffi, handle, lambda: token in _DONE):
            lib.wgpuDevicePoll(handle, 1, ffi.NULL)
        _DONE.discard(token)
    else:  # pragma: no cover
        device.queue.read_buffer(device.create_buffer(size=4, usage=0x8 | 0x4), 0, 4)


def run_words(device, source: str, words: int) -> np.ndarray:
    """Run WGSL ``source`` (entry point ``main``, one storage buffer of ``words`` u32 at binding 0) on one workgroup
    of ``device`` and read the buffer back: a probe of what a device does (subgroups, loop limits)."""
    import wgpu

    buf = device.create_buffer(size=4 * words, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    submit_words(device, source, buf)
    try:
        return np.frombuffer(device.queue.read_buffer(buf), np.uint32).copy()
    finally:
        buf.destroy()


def submit_words(device, source: str, buffer, workgroups: int = 1) -> None:
    """Submit WGSL ``source`` (entry point ``main``, storage buffer ``buffer`` at binding 0) on ``workgroups``
    workgroups of ``device``, without waiting for it."""
    pipeline = device.create_compute_pipeline(layout="auto", compute={
        "module": device.create_shader_module(code=source), "entry_point": "main"})
    group = device.create_bind_group(layout=pipeline.get_bind_group_layout(0),
                                     entries=[{"binding": 0, "resource": {"buffer": buffer}}])
    enc = device.create_command_encoder()
    cpass = enc.begin_compute_pass()
    cpass.set_pipeline(pipeline)
    cpass.set_bind_group(0, group)
    cpass.dispatch_workgroups(workgroups)
    cpass.end()
    device.queue.submit([enc.finish()])


def record_dispatches(cpass, steps) -> None:
    """Record ``steps`` (``(pipeline, bind group, (x, y, z))`` each) in compute pass ``cpass`` through
    wgpu-py's checked API, setting a pipeline only when it changes."""
    last = None
    for pipeline, group, (x, y, z) in steps:
        if pipeline is not last:
            cpass.set_pipeline(pipeline)
            last = pipeline
        cpass.set_bind_group(0, group)
        cpass.dispatch_workgroups(x, y, z)


#: seconds a readback waits for its buffer's mapping once the queue is empty, before it reports the device lost
MAP_IDLE_S = 5.0


class Readback:
    """A mappable staging buffer that takes copies of several buffer ranges and reads them in one mapping.

    Args:
        device: the wgpu device.
        sizes: bytes of each slot (multiples of 4); slot ``i`` starts at :attr:`offsets` ``[i]`` (8-aligned).
    """

    def __init__(self, device, sizes: list[int]):
        import wgpu

        self.device = device
        self.offsets, end = [], 0
        for size in sizes:
            self.offsets.append(end)
            end += (max(4, size) + 7) // 8 * 8
        self.sizes = list(sizes)
        self.size = max(8, end)
        self.buffer = device.create_buffer(size=self.size, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST,
                                           label="kiln_readback")
        raw = _raw()
        self._raw = raw if raw is not None and isinstance(getattr(self.buffer, "_internal", None), raw[0].CData) else None
        self._status: list[int] = []
        self._callback = None
        self._index = None  # the submission :meth:`read` waits for (:meth:`submit`), else all work
        if self._raw is not None:
            ffi, lib = self._raw
            status = self._status
            try:  # the callback-info API of webgpu.h (wgpu-native 24+); older builds take the wgpu-py path
                @ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)")
                def mapped(code, _message, _u1, _u2):
                    status.append(int(code))

                self._callback = mapped
                self._info = ffi.new("WGPUBufferMapCallbackInfo *",
                                     {"mode": lib.WGPUCallbackMode_AllowProcessEvents, "callback": mapped})
                self._success = lib.WGPUMapAsyncStatus_Success
            except (AttributeError, TypeError, ffi.error):
                self._raw = None

    def copy(self, encoder, sources, sizes: list[int] | None = None) -> None:
        """Record copies of ``sources`` (a wgpu buffer per slot, ``None`` to skip one) into the slots: the whole
        slot, or the first ``sizes[i]`` bytes (multiples of 4, at most the slot's size)."""
        for src, off, size in zip(sources, self.offsets, sizes or self.sizes):
            if src is not None and size:
                encoder.copy_buffer_to_buffer(src, 0, self.buffer, off, size)

    def submit(self, encoder, also: list[Readback] = ()) -> None:
        """Submit ``encoder``'s work (ending with this readback's :meth:`copy`, and those of ``also``), remembering
        the submission, so that :meth:`read` waits for it and not for work submitted later (a decode step queued
        behind a token's read)."""
        if self._raw is None:  # pragma: no cover - other wgpu-py backends
            self.device.queue.submit([encoder.finish()])
            return
        ffi, lib = self._raw
        command_buffer = encoder.finish()  # (held until submitted: its release frees the handle)
        buffers = ffi.new("WGPUCommandBuffer[]", [command_buffer._internal])
        index = lib.wgpuQueueSubmitForIndex(self.device.queue._internal, 1, buffers)
        for rb in [self, *also]:
            rb._index = ffi.new("WGPUSubmissionIndex *", index)
        del command_buffer

    def read(self, convert) -> list:
        """Wait for the copies (polling without blocking for up to :data:`SPIN_S` first, then for the submission of
        :meth:`submit` if it made them, else for all submitted work), map once and return ``convert(i, memoryview
        of slot i)`` for every slot.

        ``convert`` must copy what it keeps: the memory is unmapped when this returns.

        Raises:
            DeviceError: the mapping failed (device lost or a rejected submission).
        """
        if self._raw is None:  # pragma: no cover - other wgpu-py backends, older wgpu-native
            import wgpu

            self.buffer.map_sync(wgpu.MapMode.READ)
            try:
                data = self.buffer.read_mapped(copy=False)
                return [convert(i, data[o:o + s]) for i, (o, s) in enumerate(zip(self.offsets, self.sizes))]
            finally:
                self.buffer.unmap()
        ffi, lib = self._raw
        handle = self.buffer._internal
        self._status.clear()
        lib.wgpuBufferMapAsync(handle, lib.WGPUMapMode_Read, 0, self.size, self._info[0])
        dev = self.device._internal
        index, self._index = self._index, None
        if not _spin(lib, ffi, dev, lambda: bool(self._status)) and index is not None:
            lib.wgpuDevicePoll(dev, 1, index)  # wait for that submission only (its completion fires the callback)
        idle_since = None
        while not self._status:
            if lib.wgpuDevicePoll(dev, 1, ffi.NULL):  # true: the queue is empty, so the callback is due
                # (another thread polling the shared device may be running it: a Python callback needs the GIL,
                # which a loop of quick polls would keep taking back first, so yield it)
                now = time.monotonic()
                idle_since = now if idle_since is None else idle_since
                if now - idle_since > MAP_IDLE_S:
                    raise DeviceError("the readback buffer was never mapped (the device may be lost)")
                time.sleep(0)
        if self._status[0] != self._success:
            raise DeviceError(f"could not map the readback buffer (WGPUMapAsyncStatus {self._status[0]}); "
                              "the device may be lost or the run rejected")
        try:
            ptr = lib.wgpuBufferGetConstMappedRange(handle, 0, self.size)
            data = memoryview(ffi.buffer(ptr, self.size))
            return [convert(i, data[o:o + s]) for i, (o, s) in enumerate(zip(self.offsets, self.sizes))]
        finally:
            lib.wgpuBufferUnmap(handle)


#: bytes of dropped GPUTensors' buffers kept per device for reuse (see _Pool)
POOL_BYTES = 256 << 20


class _Pool:
    """Buffers of garbage-collected :class:`GPUTensor` s of one device, by size, for the next ones.

    Releasing a buffer that a submission still uses costs wgpu-native a few hundred microseconds,
    as much as a whole small run, and ``run(output="gpu")`` makes new tensors every run; reusing
    the buffers avoids both the release and the allocation. A reused buffer is safe: WebGPU
    executes submissions in order, so work submitted before the tensor died has read it first.
    """

    def __init__(self):
        self.free: dict[int, list[Any]] = {}
        self.bytes = 0
        self.lock = threading.Lock()
        #: readbacks of :meth:`GPUTensor.read_async` whose read is done, by bytes (a decode loop reads a token a
        #: step: a staging buffer and a map callback made for each cost more than the read)
        self.readbacks: dict[int, list[Readback]] = {}

    def take_readback(self, nbytes: int) -> Readback | None:
        with self.lock:
            bucket = self.readbacks.get(nbytes)
            return bucket.pop() if bucket else None

    def give_readback(self, readback: Readback) -> None:
        with self.lock:
            bucket = self.readbacks.setdefault(readback.sizes[0], [])
            if len(bucket) < READBACKS_KEPT:
                bucket.append(readback)

    def take(self, size: int):
        with self.lock:
            bucket = self.free.get(size)
            if bucket:
                self.bytes -= size
                return bucket.pop()
        return None

    def give(self, buffer) -> None:
        with self.lock:
            if self.bytes + buffer.size <= POOL_BYTES:
                self.free.setdefault(buffer.size, []).append(buffer)
                self.bytes += buffer.size


#: readbacks of one size kept per device for reuse (:meth:`_Pool.give_readback`)
READBACKS_KEPT = 4

_pools: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _pool(device) -> _Pool:
    with _lock:
        pool = _pools.get(device)
        if pool is None:
            pool = _pools[device] = _Pool()
        return pool


def _elements(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


class GPUTensor:
    """A tensor held in a WebGPU storage buffer of the native runtime (no host copy).

    Made by :func:`to_gpu`, :meth:`kiln.runtime.native.Session.upload` or
    ``Session.run(feeds, output="gpu")``; feed it to ``Session.run`` on the same device. Elements
    are kept in their storage type (package format, *Dtypes*: bool, 8/16-bit and int64 as int32,
    float16 as float32), converted on :meth:`numpy`.

    Each tensor owns its buffer: later runs never overwrite it. When the tensor is garbage-collected
    its buffer goes to a per-device pool (at most :data:`POOL_BYTES`) that later tensors of the same
    size reuse; :meth:`release` frees it at once instead.

    Attributes:
        shape: dimensions (tuple of ints).
        dtype: the tensor's numpy dtype (the model's: ``int64`` for an int64 output).
        storage: numpy dtype of the buffer's elements.
        device: the wgpu device holding the buffer.
        buffer: the wgpu buffer (usage STORAGE | COPY_SRC | COPY_DST), or ``None`` once released.
    """

    def __init__(self, buffer, shape, dtype, device):
        self.buffer = buffer
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        if self.dtype.name not in STORAGE:
            raise ShapeError(f"GPUTensor: {self.dtype} tensors cannot be stored in WebGPU buffers")
        self.storage = np.dtype(STORAGE[self.dtype.name])
        self.device = device
        self._recycle = None
        self._pending: PendingRead | None = None  # a read started with the run that made it, for read_async

    def _own(self, buffer, pool: _Pool) -> None:
        """Hold ``buffer``; it goes back to ``pool`` when this tensor is garbage-collected."""
        self.buffer = buffer
        self._recycle = weakref.finalize(self, pool.give, buffer)
        self._recycle.atexit = False

    @property
    def size(self) -> int:
        """Number of elements."""
        return _elements(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes the elements occupy in the buffer (storage type; the buffer itself is at least 4 bytes)."""
        return self.size * self.storage.itemsize

    def _live(self):
        if self.buffer is None:
            raise KilnError("this GPUTensor was released; its buffer is gone")
        return self.buffer

    def numpy(self) -> np.ndarray:
        """The elements copied to a new host array of :attr:`dtype` and :attr:`shape` (waits for pending work).

        Raises:
            KilnError: the tensor was released.
            DeviceError: the device could not map the copy.
        """
        return self.read_async().result()

    def read_async(self) -> PendingRead:
        """Start copying the elements to host memory: the copy is submitted now, behind the work already submitted,
        and :meth:`PendingRead.result` waits for it alone, not for work submitted after this call (a language
        model's next decode step, fed this token on the device, queued while the host waits for the token).

        Raises:
            KilnError: the tensor was released.
        """
        buffer = self._live()
        if self._pending is not None:  # (started with the run that made it: Session.run's ``read``)
            pending, self._pending = self._pending, None
            return pending
        enc = self.device.create_command_encoder()
        pending = self.start_read(enc, buffer)
        pending._readback.submit(enc)
        return pending

    def start_read(self, encoder, source=None) -> PendingRead:
        """Record into ``encoder`` a copy of this tensor's bytes (or of ``source``, a buffer holding the same
        bytes) to a staging buffer, and return the read that waits for it once ``encoder`` is submitted (through
        its readback's :meth:`Readback.submit`, or :meth:`Readback.submit`'s ``also``)."""
        pool = _pool(self.device)
        rb = pool.take_readback(self.nbytes) or Readback(self.device, [self.nbytes])
        rb.copy(encoder, [self._live() if source is None else source])
        return PendingRead(rb, self.dtype.name, self.shape, pool)

    def release(self) -> None:
        """Free the buffer now (work already submitted that uses it still completes); the tensor is unusable after."""
        if self.buffer is not None:
            if self._recycle is not None:
                self._recycle.detach()
            self.buffer.destroy()
            self.buffer = None

    def __repr__(self) -> str:
        state = "released" if self.buffer is None else f"{self.nbytes} bytes"
        return f"GPUTensor(shape={list(self.shape)}, dtype={self.dtype.name}, {state})"


class PendingRead:
    """A copy of a :class:`GPUTensor` to host memory, submitted and not yet waited for (:meth:`GPUTensor.read_async`).
    """

    def __init__(self, readback: Readback, dtype: str, shape: tuple[int, ...], pool: _Pool | None = None):
        self._readback, self._dtype, self._shape, self._pool = readback, dtype, shape, pool
        self._value = None

    def result(self) -> np.ndarray:
        """The elements as a new host array (waits for the copy; later calls return the same array).

        Raises:
            DeviceError: the device could not map the copy.
        """
        if self._value is None:
            self._value = self._readback.read(lambda _i, data: from_storage(data, self._dtype, self._shape))[0]
            if self._pool is not None:  # (read and unmapped: the next read_async may take it)
                self._pool.give_readback(self._readback)
        return self._value


def empty(shape, dtype, device, label: str = "") -> GPUTensor:
    """A new :class:`GPUTensor` of ``shape`` and ``dtype`` on ``device``; its contents are undefined
    (a buffer of a dropped tensor is reused when one of the size is pooled)."""
    import wgpu

    t = GPUTensor(None, shape, dtype, device)
    size = max(4, -(-t.nbytes // 4) * 4)
    pool = _pool(device)
    buffer = pool.take(size)
    if buffer is None:
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        buffer = device.create_buffer(size=size, usage=usage, label=label)
    t._own(buffer, pool)
    return t


def to_gpu(array, dtype=None, device=None) -> GPUTensor:
    """Upload ``array`` into a new :class:`GPUTensor` (on :func:`shared_device` unless ``device`` is given).

    Args:
        array: array-like; converted to ``dtype`` first if given.
        dtype: the tensor's dtype (default: the array's).
        device: a wgpu device, e.g. ``session.device``.

    Raises:
        ShapeError: a dtype WebGPU buffers cannot hold (float64, uint32, uint64), or int64 values
            outside int32's range.
    """
    a = np.asarray(array) if dtype is None else np.asarray(array, dtype=dtype)
    if a.dtype.name not in STORAGE:
        raise ShapeError(f"to_gpu: {a.dtype} arrays cannot be stored in WebGPU buffers "
                         f"(supported: {', '.join(STORAGE)}); convert it first, e.g. .astype(np.float32)")
    device = device if device is not None else shared_device()
    t = empty(a.shape, a.dtype, device, label="kiln_tensor")
    data = to_storage(a, a.dtype.name, "to_gpu")
    if data.size:
        device.queue.write_buffer(t.buffer, 0, memoryview(data.reshape(-1)).cast("B"))
    return t
