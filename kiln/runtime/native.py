"""Native execution of a package through wgpu-py (Vulkan, Metal or D3D12; Mesa's lavapipe on CPUs).

The runtime reads packages only; it never imports the compiler. Buffers,
pipelines and bind groups are created once at load; each :meth:`Session.run`
writes the inputs, records one command encoder with one compute pass holding
every dispatch plus the copies of the outputs into one mappable staging buffer,
submits it once, and maps that buffer once.

Inputs and outputs can also stay on the GPU (:class:`~kiln.runtime.gpu.GPUTensor`, ``run(feeds,
output="gpu")``), and sessions share one device per process and its pipeline cache
(:mod:`kiln.runtime.gpu`, :mod:`kiln.runtime.pipelines`); see docs/runtime.md.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from kiln.errors import DeviceError, DeviceLostError, KilnError, PackageError, ShapeError, one_line
from kiln.package.format import (
    DEFAULT_LIMITS,
    STORAGE,
    from_storage,
    read_manifest,
    read_package_text,
    read_weights,
    verify_weights,
)
from kiln.runtime import dynamic, gpu, record, subgroups
from kiln.runtime.control import ControlPlan, is_control_plan
from kiln.runtime.feeds import selected_outputs, storage_feeds
from kiln.runtime.generate import GenerationMixin
from kiln.runtime.gpu import GPUTensor, shared_device, synchronize, to_gpu
from kiln.runtime.loop_limit import LoopLimit
from kiln.runtime.pipelines import pipeline_cache
from kiln.runtime.timing import wall_clock_ms, warm
from kiln.runtime.training import TrainingMixin


def _request_device(limits: dict[str, int], features: list[str], optional: tuple[str, ...] = (), grows: bool = False):
    """An adapter and a device with the ``limits`` (package needs, spec names) and ``features`` the package uses.

    Only limits above WebGPU's defaults are requested; ``optional`` features are requested when the
    adapter has them; a package whose buffers grow (``grows``) gets the adapter's largest buffers. Raises
    DeviceError if the adapter falls short.
    """
    adapter = gpu.request_adapter()
    have = adapter.limits
    required = {k: have[k] for k in ("max-buffer-size", "max-storage-buffer-binding-size")} if grows else {}
    for name, value in limits.items():
        key = "".join("-" + c.lower() if c.isupper() else c for c in name)
        if key not in have:
            continue
        if have[key] < value:
            raise DeviceError(f"adapter {adapter.info.get('device', '?')} has {name}={have[key]}, the package "
                              f"needs {value}")
        if value > DEFAULT_LIMITS.get(name, 0):
            required[key] = max(value, required.get(key, 0))
    missing = [f for f in features if f not in adapter.features]
    if missing:
        why = (" (the package computes in fp16: compile it with --precision fp32 for this adapter)"
               if "shader-f16" in missing else "")
        raise DeviceError(f"adapter {adapter.info.get('device', '?')} lacks WebGPU features {missing}{why}")
    features = list(features) + [f for f in optional if f in adapter.features and f not in features]
    return adapter, adapter.request_device_sync(required_features=features, required_limits=required)


def _session_device(tgt: dict[str, Any], device, grows: bool = False):
    """The adapter and device a session runs on: ``"shared"`` (the process-wide device,
    :func:`~kiln.runtime.gpu.shared_device`), ``"own"`` (a device of its own) or a wgpu device.

    Raises:
        DeviceError: the adapter or the given device falls short of the package's limits or features.
        KilnError: ``device`` is none of these.
    """
    limits, features = tgt.get("limits", {}), tgt.get("features", [])
    if device == "shared":
        return gpu.adapter(), shared_device(limits, features)
    if device == "own":
        return _request_device(limits, features, optional=("timestamp-query", subgroups.FEATURE), grows=grows)
    if isinstance(device, str) or not hasattr(device, "create_buffer"):
        raise KilnError(f"device must be 'shared', 'own' or a wgpu device (e.g. another session's .device), "
                        f"got {device!r}")
    if not gpu._fits(device, limits, features):
        raise DeviceError(f"the given device lacks limits {limits} or features {features} the package needs")
    return device.adapter, device


#: plans with at least this many dispatches are submitted in two command buffers by default (Session.submit_chunks)
CHUNKED_STEPS = 32


def _copy_size(spec: dict[str, Any], buffer, shape=None) -> int:
    """Bytes of the tensor ``spec`` (an input or output) of ``shape`` (default: the manifest's; run-time dims
    give smaller ones) in its buffer, rounded up to WebGPU's 4-byte copies."""
    n = math.prod(int(d) for d in (spec["shape"] if shape is None else shape)) * \
        np.dtype(spec.get("storage", STORAGE[spec["dtype"]])).itemsize
    return min(buffer.size, -(-n // 4) * 4)


class RawPlan(NamedTuple):
    """A session's plan as raw wgpu-native handles (:meth:`Session._encode_raw`): the library, its ``NULL``, each step's
    ``(pipeline, bind group)`` handles, each step's static workgroup counts, and the handles as C arrays for
    :mod:`kiln.runtime.record`'s loop (``plan``; ``None`` where that loop could not be built)."""

    lib: Any
    null: Any
    handles: list[tuple[Any, Any]]
    counts: list[tuple[int, ...]]
    plan: Any


class Session(TrainingMixin, GenerationMixin):
    """A loaded package, ready to run natively (and, for train-step packages, to train: ``train_step``,
    ``state``, ``export_weights``; see :class:`~kiln.runtime.training.TrainingMixin`).

    Threads: sessions run in parallel from several threads (each owns its buffers; on one device too); the runs of
    one session take turns (runs, profiles, train steps, state reads and reorders hold its lock), so sharing a session
    between threads is safe but serial, and its state (a KV cache, the random ops' counter) is shared by all its callers.

    Args:
        package: package directory (made by ``kiln compile``).
        target: the target to run (only ``webgpu`` natively).
        verify: check the weights' SHA-256 against the manifest.
        poison: fill activation and output buffers with NaN at load and before every run, so an
            element a kernel forgets to write shows up as NaN (for tests).
        device: ``"shared"`` (default): the process-wide device (:func:`kiln.runtime.gpu.shared_device`),
            so sessions exchange :class:`~kiln.runtime.gpu.GPUTensor` s and reuse each other's compiled
            pipelines; ``"own"``: a device of its own; or a wgpu device (e.g. another session's ``device``).
        jobs: threads compiling the pipelines the device's cache lacks (default: CPU count, at most 8).
        subgroups: run kernels' subgroup forms (format 1.14, :mod:`kiln.runtime.subgroups`): ``True`` wherever the
            device can, ``False`` never, ``None`` as ``KILN_SUBGROUPS`` says or, unset, on GPUs (not CPU adapters).

    Attributes:
        load_ms: milliseconds of the load's phases: ``device``, ``weights`` (buffers and weight
            uploads, overlapping the pipelines), ``pipelines`` (compiling or fetching from the cache)
            and ``total``.
        pipeline_hits: kernels whose pipeline the device's cache already held at load.
        subgroups: whether the kernels that have subgroup forms run them.
        submit_chunks: command buffers a run's dispatches are split into (``KILN_SUBMIT_CHUNKS`` if set,
            else 2 for plans of at least :data:`CHUNKED_STEPS` dispatches, else 1): each is submitted as soon
            as it is encoded, so the GPU works on the first while the host encodes the next. On an H100,
            MobileNetV2's run went from 1.19 to 1.07 ms with 2; each further buffer costs about 0.06 ms
            (``python -m bench.host --chunks 1,2,3,4``, bench/results/host-20261122-095553.json).

    Raises:
        PackageError: missing, malformed, corrupted, or newer-format package, a kernel that does not compile, or
            buffers and bindings the device refuses.
        DeviceError: no adapter, or it lacks a limit or feature the package needs; a kernel that would run past the
            adapter's loop limit (llvmpipe, :mod:`kiln.runtime.loop_limit`).
    """

    def __init__(self, package: str | os.PathLike, target: str = "webgpu", verify: bool = True, poison: bool = False,
                 device: Any = "shared", jobs: int | None = None, subgroups: bool | None = None):
        import wgpu

        try:
            self._load(package, target, verify, poison, device, jobs, subgroups)
        except wgpu.GPUError as e:  # what the manifest asks of the device does not validate (an inconsistent package)
            raise PackageError(f"{package}: the device refused the package's buffers or bindings ({one_line(e)})") \
                from None

    def _load(self, package, target: str, verify: bool, poison: bool, device: Any, jobs: int | None,
              use_subgroups: bool | None) -> None:
        import wgpu

        t_start = time.perf_counter()
        self.path = Path(package)
        self.manifest: dict[str, Any] = read_manifest(self.path)
        if target not in self.manifest["targets"]:
            raise PackageError(f"{self.path}: package has no {target!r} target "
                               f"(has: {', '.join(self.manifest['targets'])})")
        if verify:
            verify_weights(self.path, self.manifest)
        tgt = self.manifest["targets"][target]
        grows = any("grow" in b for b in self.manifest["buffers"])
        self.adapter, self.device = _session_device(tgt, device, grows)
        self._lock = threading.RLock()
        dev = self.device
        #: whether kernels run their subgroup forms (kiln.runtime.subgroups) where the package has them
        self.subgroups = "subgroup_probe" in tgt and subgroups.usable(
            dev, use_subgroups, read_package_text(self.path, self.manifest, tgt["subgroup_probe"], "kernel"))
        #: kernels that would run past the adapter's loop limit (llvmpipe) are refused, not run wrong
        self._loops = LoopLimit(subgroups.forms_run(tgt["kernels"], self.subgroups), dict(self.adapter.info),
                                str(self.path))
        t_device = time.perf_counter()
        cache = pipeline_cache(dev)
        # a kernel over run-time dims (docs/dynamic-shapes.md) reads their uniform after its storage buffers
        specs = [subgroups.kernel_spec(k, lambda f: read_package_text(self.path, self.manifest, f, "kernel"),
                                       self.subgroups) for k in tgt["kernels"]]
        hits = cache.hits
        # the pipelines compile on their own threads while this one uploads the weights
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kiln-load") as ex:
            def compile_all():
                t0 = time.perf_counter()
                return cache.get_many(specs, jobs), time.perf_counter() - t0

            compiling = ex.submit(compile_all)
            try:
                usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
                self.buffers = [dev.create_buffer(size=b["bytes"], usage=usage, label=f"b{b['id']}_{b['kind']}")
                                for b in self.manifest["buffers"]]
                for b, data in read_weights(self.path, self.manifest):
                    if data.size:  # f16 weights of odd length: padded to WebGPU's 4-byte write granularity
                        raw = data.tobytes()
                        dev.queue.write_buffer(self.buffers[b["id"]], 0, raw + bytes(-len(raw) % 4))
            finally:
                t_weights = time.perf_counter()
                cached, compile_s = compiling.result()
        self.pipeline_hits = cache.hits - hits
        self.pipelines = [(c.pipeline, c.layout) for c in cached]
        # run-time dims (docs/dynamic-shapes.md): one uniform buffer of dim values; dispatch sizes and output
        # shapes follow from the fed shapes
        self._dyn = dynamic.is_dynamic(self.manifest)
        self._dims_env: dict[str, int] | None = None
        self._dispatch: list[tuple[int, int, int]] | None = None
        self.dims_buffer = dev.create_buffer(size=tgt["dims_uniform"]["bytes"], label="kiln_dims",
                                             usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST) \
            if self._dyn else None
        #: runs plans with run-time If/Loop (format 1.4); None for a flat plan
        self.control = ControlPlan(self, tgt["plan"]) if is_control_plan(tgt["plan"]) else None
        plan = self.control.kernel_steps if self.control is not None else tgt["plan"]
        self._plan = plan
        self._make_bind_groups()
        self._sizes = dynamic.StepSizes(plan, "groups") if self._dyn else None
        #: data-dependent dims (format 1.9): where the run stops to read counts back, and each dim's entry
        self._binds = dynamic.bind_points(plan) if self.control is None else []
        self._counts = dynamic.count_dims(self.manifest)
        self._count_staging = None  # a mappable buffer for the counts, made on first use
        self._choice: tuple[int, ...] = tuple(0 for _ in plan)
        self._validated = {self._choice}
        self.steps = [(*alts[0], tuple(s["dispatch"])) for alts, s in zip(self._alternatives, plan)]
        self._table: tuple[list, np.ndarray] | None = None  # counts and their array (_counts_table)
        self._raw = self._raw_steps()
        self._ran = False
        self._grow = dynamic.GrowSizes(self.manifest)  # buffers that grow with growable dims (format 1.10)
        chunks = os.environ.get("KILN_SUBMIT_CHUNKS")
        self.submit_chunks = max(1, int(chunks)) if chunks else 2 if len(self.steps) >= CHUNKED_STEPS else 1
        self._init_training(tgt)
        self.step_names = [f"{tgt['kernels'][s['kernel']]['name']}" for s in plan]
        self.poison = poison
        if poison:
            for b in self.manifest["buffers"]:
                if b["kind"] in ("activation", "output"):
                    self._fill_nan(b["id"])
        self._scratch = None  # reorder_state's scratch buffer, made on first use
        self._out_bytes = [_copy_size(o, self.buffers[o["buffer"]]) for o in self.outputs]
        self._readback = gpu.Readback(dev, self._out_bytes)
        t_end = time.perf_counter()
        self.load_ms = {"device": (t_device - t_start) * 1e3, "weights": (t_weights - t_device) * 1e3,
                        "pipelines": compile_s * 1e3, "total": (t_end - t_start) * 1e3}

    def _make_bind_groups(self) -> None:
        """:attr:`_alternatives`: per plan step, its kernel's (pipeline, bind group) and its variants' (kernels scheduled
        for another range of run-time dims, docs/dynamic-shapes.md); made at load and again when buffers grow."""
        tgt, dev = self.manifest["targets"]["webgpu"], self.device

        def bind(s: dict[str, Any], kernel: int) -> tuple[Any, Any]:
            pipeline, layout = self.pipelines[kernel]
            entries = [{"binding": i, "resource": {"buffer": self.buffers[bid], "offset": 0,
                                                   "size": self.buffers[bid].size}} for i, bid in enumerate(s["buffers"])]
            if "dims_binding" in tgt["kernels"][kernel]:
                entries.append({"binding": tgt["kernels"][kernel]["dims_binding"], "resource": {
                    "buffer": self.dims_buffer, "offset": 0, "size": self.dims_buffer.size}})
            return pipeline, dev.create_bind_group(layout=layout, entries=entries)

        self._alternatives = [[bind(s, s["kernel"])] + [bind(s, v["kernel"]) for v in s.get("variants", ())]
                              for s in self._plan]

    def _grow_buffers(self, env: dict[str, int]) -> None:
        """Make every growable buffer (format 1.10, docs/dynamic-shapes.md *Growable buffers*) large enough for dims
        ``env``: a larger one replaces it (a state buffer keeps its contents), and the bind groups are made again.

        Raises:
            ShapeError: a buffer over 2 GiB (:class:`~kiln.runtime.dynamic.GrowSizes`).
            DeviceError: a buffer over the device's maxBufferSize or maxStorageBufferBindingSize.
        """
        need = {b: n for b, n in self._grow(env).items() if n > self.buffers[b].size}
        if not need:
            return
        limit = min(self.device.limits["max-buffer-size"], self.device.limits["max-storage-buffer-binding-size"])
        enc = None
        for b, n in need.items():
            if n > limit:
                raise DeviceError(f"{self.path}: dims {env} need a buffer of {n} bytes; the device allows {limit} "
                                  "(maxStorageBufferBindingSize): run smaller inputs")
            spec, old = self.manifest["buffers"][b], self.buffers[b]
            new = self.device.create_buffer(size=min(dynamic.grown(old.size, n), limit), usage=old.usage,
                                            label=f"b{b}_{spec['kind']}")
            if spec["kind"] == "state":
                enc = enc or self.device.create_command_encoder()
                enc.copy_buffer_to_buffer(old, 0, new, 0, old.size)
            self.buffers[b] = new
            if self.poison and spec["kind"] in ("activation", "output"):
                self._fill_nan(b)
        if enc is not None:
            self.device.queue.submit([enc.finish()])
        self._make_bind_groups()
        self.steps = [(*alts[c], d) for alts, c, (_, _, d) in zip(self._alternatives, self._choice, self.steps)]
        self._raw = self._raw_steps()
        self._validated = {self._choice}
        self._ran = False  # (the first run of new bind groups goes through the checked API)
        # (the staging buffer takes a grown output whole: the run's shape is known only when it runs)
        self._out_bytes = [self.buffers[o["buffer"]].size if o["buffer"] in need else n
                           for o, n in zip(self.outputs, self._out_bytes)]
        self._readback = gpu.Readback(self.device, self._out_bytes)

    def _raw_steps(self) -> RawPlan | None:
        """The plan as raw wgpu-native handles, for :meth:`_encode_raw` (:class:`RawPlan`); ``None`` where the
        backend differs."""
        try:
            from wgpu.backends.wgpu_native._ffi import ffi, lib
        except ImportError:
            return None
        handles = [(p._internal, g._internal) for p, g, _ in self.steps]
        if not all(isinstance(p, ffi.CData) and isinstance(g, ffi.CData) for p, g in handles):
            return None
        counts = [tuple(d) for _, _, d in self.steps]
        rec = record.recorder()
        plan = None
        if rec is not None and all(len(d) == 3 for d in counts):
            plan = rec.plan(handles, owners=[(p, g) for p, g, _ in self.steps])
            if not self._dyn:  # (the static counts, as the C loop reads them; run-time dims make their own)
                self._table = (counts, record.counts_array(counts))
        return RawPlan(lib, ffi.NULL, handles, counts, plan)

    def _counts_table(self, counts: list[tuple[int, int, int]]) -> np.ndarray:
        """``counts`` as a uint32 ``[steps, 3]`` array: the one :meth:`_bind_dims` made with them, else a new one."""
        if self._table is None or self._table[0] is not counts:
            self._table = (counts, record.counts_array(counts))
        return self._table[1]

    def _encode_raw(self, cpass, dispatch: list[tuple[int, int, int]] | None = None, start: int = 0,
                    stop: int | None = None) -> None:
        """Record the dispatches of steps ``start:stop`` (default: all) through wgpu-native's C API directly.

        Encoding through wgpu-py's checked wrappers costs about 15 us of Python per dispatch,
        as much as a small kernel takes on a fast GPU. The plan was validated by the first
        run (encoded through the public API), and the calls are the same three per dispatch.
        Steps with no workgroups (at these dims) are skipped. The calls are made by a loop in C
        (:mod:`kiln.runtime.record`: one call from Python a pass) where it could be built, else from Python.
        (The Python loop walks the plan's handles and the run's counts side by side: building a list of the calls
        instead cost a decoder, whose counts change with every token, more than it saved.)
        """
        lib, null, handles, counts, plan = self._raw
        if dispatch is not None:
            counts = dispatch
        if plan is not None:
            first, last, _ = slice(start, stop).indices(len(handles))  # (as the Python loop's slicing)
            plan.record(cpass, self._counts_table(counts), first, max(first, last))
            return
        if start or stop is not None:
            handles, counts = handles[start:stop], counts[start:stop]
        set_pipeline = lib.wgpuComputePassEncoderSetPipeline
        set_group = lib.wgpuComputePassEncoderSetBindGroup
        dispatch_workgroups = lib.wgpuComputePassEncoderDispatchWorkgroups
        h = cpass._internal
        last = None
        for (pipeline, group), (x, y, z) in zip(handles, counts):
            if not x:
                continue
            if pipeline is not last:
                set_pipeline(h, pipeline)
                last = pipeline
            set_group(h, 0, group, 0, null)
            dispatch_workgroups(h, x, y, z)

    def _fill_nan(self, buffer_id: int) -> None:
        # 0x7FC07FC0 is a NaN as one f32 and as two f16 (fp16 packages' buffers)
        self.device.queue.write_buffer(self.buffers[buffer_id], 0,
                                       np.full(self.buffers[buffer_id].size // 4, 0x7FC07FC0, np.uint32).tobytes())

    @property
    def inputs(self) -> list[dict[str, Any]]:
        """Input descriptions from the manifest: name, dtype, shape, symbolic_shape."""
        return self.manifest["inputs"]

    @property
    def outputs(self) -> list[dict[str, Any]]:
        """Output descriptions from the manifest."""
        return self.manifest["outputs"]

    def adapter_info(self) -> dict[str, Any]:
        """The adapter's vendor, architecture, device and backend, as wgpu reports them."""
        return dict(self.adapter.info)

    def _check_feeds(self, feeds: dict[str, np.ndarray]) -> list[tuple[dict, np.ndarray]]:
        return storage_feeds(self.inputs, feeds)

    def run(self, feeds: dict[str, np.ndarray | GPUTensor], output: str = "numpy",
            outputs: Sequence[str] | None = None, read: Sequence[str] = ()) -> dict[str, Any]:
        """Run the model on ``feeds`` (input name -> array of the manifest's dtype and shape, or a
        :class:`~kiln.runtime.gpu.GPUTensor` of that dtype and shape on this session's device).

        Args:
            feeds: every model input. A GPUTensor is copied into the input's buffer on the GPU, in the
                run's own command buffer (no host copy); arrays are written from host memory.
            output: ``"numpy"``: outputs read back to new host arrays (all in one mapping);
                ``"gpu"``: outputs copied, on the GPU, into new GPUTensors that this session never
                writes again (later runs do not change them), and nothing is read back: the call
                returns once the work is submitted (``GPUTensor.numpy()`` or :meth:`sync` waits).
            outputs: the names of the outputs to return (default: all; onnxruntime's ``output_names``): the others
                are computed but neither copied nor read back (a greedy decode step wants ``next_token``, not the
                logits).
            read: with ``output="gpu"``, outputs whose copy to host memory starts with the run, in its own command
                buffer: the returned GPUTensor's first :meth:`~kiln.runtime.gpu.GPUTensor.read_async` gives that
                read instead of submitting another (a decode step's token: one submission a step, not two).

        Returns:
            Output name -> a new numpy array, or a new GPUTensor with ``output="gpu"``.

        Inputs are converted to their buffers' element type (``storage`` in the manifest: bool,
        int8, uint8 and int64 are stored as int32) and outputs back to their dtype.
        A package with run-time dims (docs/dynamic-shapes.md) takes inputs of any shape within its dims'
        bounds and returns outputs of their run-time shapes.

        Raises:
            ShapeError: an unknown, missing, wrongly shaped or wrongly typed input, or an int64
                input value that does not fit in int32; for run-time dims, a value outside its bounds or
                inputs that disagree on one.
            DeviceError: a GPUTensor on another device; the device failed to map the outputs or refused the
                work (a validation error: a package that does not fit the device); at these run-time dims, a kernel
                would run past the adapter's loop limit (llvmpipe, :mod:`kiln.runtime.loop_limit`).
            DeviceLostError: the device was lost (a driver reset, ``destroy()``): load the package again.
            KilnError: a released GPUTensor, an unknown ``output``, an unknown name in ``outputs``, or ``read``
                naming an output not returned or without ``output="gpu"``.
        """
        with self._device_work("run"), self._lock:  # (one run at a time: it owns the session's buffers)
            return self._run(feeds, output, outputs, read)

    @contextlib.contextmanager
    def _device_work(self, what: str):
        """Device work of a session (``what``: a run, an upload, a state reorder): refused at once on a lost device,
        and wgpu's errors during it made a DeviceLostError (the device is lost: marked so) or a DeviceError."""
        import wgpu

        if gpu.is_lost(self.device):
            raise self._lost_error("")
        try:
            yield
        except wgpu.GPUError as e:
            if "lost" in str(e).lower() or not gpu.is_usable(self.device):
                gpu.mark_lost(self.device)
                raise self._lost_error(f" ({one_line(e)})") from None
            raise DeviceError(f"{self.path}: the device refused the {what} ({one_line(e)})") from None

    def _lost_error(self, why: str) -> DeviceLostError:
        return DeviceLostError(f"{self.path}: the GPU device was lost{why}; this session cannot run again: "
                               "kiln.load the package again for a session on a new device")

    def _run(self, feeds: dict[str, np.ndarray | GPUTensor], output: str,
             names: Sequence[str] | None = None, read: Sequence[str] = ()) -> dict[str, Any]:
        if output not in ("numpy", "gpu"):
            raise KilnError(f"run: output must be 'numpy' or 'gpu', got {output!r}")
        wanted, read = selected_outputs(self.outputs, names, read, output)
        host, on_gpu = self._split_feeds(feeds)
        dispatch, shapes = self._bind_dims(feeds) if self._dyn else (None, None)
        dev = self.device
        for spec, a in host:
            if a.size:  # an empty tensor has nothing to write (WebGPU refuses empty writes)
                dev.queue.write_buffer(self.buffers[spec["buffer"]], 0, memoryview(a.reshape(-1)).cast("B"))
        if self.poison:
            for o in self.outputs:  # (not an input's buffer updated in place: an in-place TensorScatter)
                if self.manifest["buffers"][o["buffer"]]["kind"] == "output":
                    self._fill_nan(o["buffer"])
        enc = dev.create_command_encoder()
        for spec, t in on_gpu:
            size = _copy_size(spec, self.buffers[spec["buffer"]], t.shape)
            if size:
                enc.copy_buffer_to_buffer(t.buffer, 0, self.buffers[spec["buffer"]], 0, size)
        if self.control is not None:  # run-time If/Loop: submits and reads conditions as it goes
            enc = self.control.execute(enc, host)
        elif self._binds:  # data-dependent dims: submits and reads counts back as it goes
            enc, dispatch, shapes = self._encode_binding(enc, dispatch)
        else:
            enc = self._encode_chunks(enc, dispatch)
        self._dispatch = dispatch  # the last run's dispatches (run-time dims), for profile()
        outs = self.outputs
        # run-time dims: the outputs' shapes, and so the bytes to copy, follow from the dims
        out_shapes = [shapes[o["name"]] for o in outs] if shapes else [o["shape"] for o in outs]
        sizes = [_copy_size(o, self.buffers[o["buffer"]], s) for o, s in zip(outs, out_shapes)] if shapes \
            else self._out_bytes
        if output == "gpu":
            results = {}
            for o, shape, size, want in zip(outs, out_shapes, sizes, wanted):
                if not want:
                    continue
                t = results[o["name"]] = gpu.empty(shape, o["dtype"], dev, label=o["name"])
                if size:
                    enc.copy_buffer_to_buffer(self.buffers[o["buffer"]], 0, t.buffer, 0, size)
                if o["name"] in read:
                    t._pending = t.start_read(enc, self.buffers[o["buffer"]])
            pending = [t._pending._readback for t in results.values() if t._pending is not None]
            if pending:
                pending[0].submit(enc, pending[1:])
            else:
                dev.queue.submit([enc.finish()])
            self._ran = True
            return results
        self._readback.copy(enc, [self.buffers[o["buffer"]] if want else None for o, want in zip(outs, wanted)], sizes)
        dev.queue.submit([enc.finish()])
        self._ran = True
        values = self._readback.read(lambda i, data: from_storage(data, outs[i]["dtype"], out_shapes[i])
                                     if wanted[i] else None)
        return {o["name"]: v for o, v, want in zip(outs, values, wanted) if want}

    def _encode_chunks(self, enc, dispatch: list[tuple[int, int, int]] | None = None):
        """Record the plan into ``enc`` and return the encoder that takes the rest of the run (the output
        copies). With :attr:`submit_chunks` ``k > 1`` (after the first run), the plan is split into ``k``
        runs of steps and each but the last is submitted at once, in its own command buffer, so that the
        GPU starts while the host encodes the rest."""
        n, k = len(self.steps), min(self.submit_chunks, len(self.steps))
        if k <= 1 or self._raw is None or not self._ran:
            self._encode_pass(enc, dispatch)
            return enc
        bounds = [n * i // k for i in range(k + 1)]
        for i in range(k):
            self._encode_pass(enc, dispatch, bounds[i], bounds[i + 1])
            if i < k - 1:
                self.device.queue.submit([enc.finish()])
                enc = self.device.create_command_encoder()
        return enc

    def _encode_binding(self, enc, dispatch: list[tuple[int, int, int]]):
        """Record the plan of a package with data-dependent dims (docs/dynamic-shapes.md): up to each step that
        computes counts, submit, read them back (4 bytes each, one mapping), bind the dims, write the dims uniform
        and evaluate the later dispatches again. Returns ``(encoder for the rest of the run, the last dispatches,
        the outputs' shapes)``.

        Raises:
            ShapeError: a count outside its dim's bounds.
        """
        import wgpu

        env = dict(self._dims_env)
        start = 0
        for stop, names in self._binds:
            self._encode_pass(enc, dispatch, start, stop)
            n = 4 * len(names)
            if self._count_staging is None or self._count_staging.size < n:
                self._count_staging = self.device.create_buffer(size=max(n, 16), label="kiln_counts",
                                                                usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
            for i, name in enumerate(names):
                enc.copy_buffer_to_buffer(self.buffers[self._counts[name]["count"]], 0, self._count_staging, 4 * i, 4)
            self.device.queue.submit([enc.finish()])
            self._count_staging.map_sync(wgpu.MapMode.READ)
            try:
                values = np.frombuffer(self._count_staging.read_mapped(0, n, copy=True), np.int32)
            finally:
                self._count_staging.unmap()
            for name, v in zip(names, values):
                env[name] = dynamic.check_count(self._counts[name], int(v))
            choice, dispatch = self._sizes.dispatches(env)
            later = [b for b, _ in self._binds if b > stop]
            self._loops.check(self._plan, choice, dispatch, env, start=stop, stop=later[0] if later else None)
            self._choose_variants(choice)
            self.device.queue.write_buffer(self.dims_buffer, 0, dynamic.dims_words(self.manifest, env))
            enc = self.device.create_command_encoder()
            start = stop
        self._encode_pass(enc, dispatch, start, None)
        return enc, dispatch, dynamic.output_shapes(self.manifest, env)

    def _encode_pass(self, enc, dispatch: list[tuple[int, int, int]] | None = None, start: int = 0,
                     stop: int | None = None) -> None:
        """Record steps ``start:stop`` of the plan (default: all) in one compute pass of ``enc`` (through the C
        API once a run has validated it); ``dispatch``: each step's workgroup counts for run-time dims (steps
        with none are skipped)."""
        cpass = enc.begin_compute_pass()
        if self._raw is not None and self._ran:
            self._encode_raw(cpass, dispatch, start, stop)
        elif dispatch is None:
            gpu.record_dispatches(cpass, self.steps[start:stop])
        else:
            gpu.record_dispatches(cpass, [(p, g, d) for (p, g, _), d in zip(self.steps[start:stop], dispatch[start:stop])
                                          if d[0]])
        cpass.end()

    def _bind_dims(self, feeds: dict[str, Any]) -> tuple[list[tuple[int, int, int]], dict[str, list[int]]]:
        """Run-time dims of a package that has them: binds them from the fed shapes and, when they changed,
        writes the dims uniform and evaluates the dispatches and output shapes again; returns ``(each step's
        workgroup counts, each output's shape)``.

        Raises:
            ShapeError: as :func:`kiln.runtime.dynamic.bind_dims`.
        """
        env = dynamic.bind_dims(self.manifest, feeds)
        if env != self._dims_env:
            if self._raw is not None and self._raw.plan is not None:  # (the counts as the C loop reads them too)
                choice, counts, table = self._sizes.dispatch_table(env)
                self._table = (counts, table) if table is not None else None
            else:
                choice, counts = self._sizes.dispatches(env)
            # (steps after a data-dependent dim is read back are checked once it is: _encode_binding)
            self._loops.check(self._plan, choice, counts, env, stop=self._binds[0][0] if self._binds else None)
            if self._grow:
                self._grow_buffers(env)
            evaluated = counts, dynamic.output_shapes(self.manifest, env)
            self.device.queue.write_buffer(self.dims_buffer, 0, dynamic.dims_words(self.manifest, env))
            self._dims_env, self._dims_eval = env, evaluated
            self._choose_variants(choice)
        return self._dims_eval

    def _choose_variants(self, choice: tuple[int, ...]) -> None:
        """Point :attr:`steps` at the kernels ``choice`` names (per step, 0: its own, i: ``variants[i - 1]``; from
        :class:`~kiln.runtime.dynamic.StepSizes`)."""
        if choice is self._choice or choice == self._choice:  # (StepSizes gives one tuple for one outcome)
            return
        self._choice = choice
        tgt = self.manifest["targets"]["webgpu"]
        self.steps = [(*alts[c], d) for alts, c, (_, _, d) in zip(self._alternatives, choice, self.steps)]
        self.step_names = [tgt["kernels"][s["kernel"] if not c else s["variants"][c - 1]["kernel"]]["name"]
                           for s, c in zip(self._plan, choice)]
        self._raw = self._raw_steps()
        if choice not in self._validated:  # a first run of these pipelines goes through the checked API
            self._validated.add(choice)
            self._ran = False

    def _split_feeds(self, feeds: dict[str, Any]) -> tuple[list[tuple[dict, np.ndarray]], list[tuple[dict, GPUTensor]]]:
        """Host feeds checked and in storage form (:meth:`_check_feeds`), and GPUTensor feeds checked.

        Raises:
            ShapeError, DeviceError, KilnError: as :meth:`run`.
        """
        if not isinstance(feeds, dict):
            raise ShapeError(f"run() takes a dict {{input name: array or GPUTensor}}, got {type(feeds).__name__}")
        on_gpu = {k: v for k, v in feeds.items() if isinstance(v, GPUTensor)}
        if not on_gpu:
            return self._check_feeds(feeds), []
        specs = {i["name"]: i for i in self.inputs}
        unknown = sorted(set(on_gpu) - set(specs))
        if unknown:
            raise ShapeError(f"unknown input{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                             f"the model's inputs are {', '.join(map(repr, sorted(specs)))}")
        checked = []
        for name, t in on_gpu.items():
            spec = specs[name]
            if t.buffer is None:
                raise KilnError(f"input {name!r}: the GPUTensor was released")
            if t.dtype != np.dtype(spec["dtype"]):
                raise ShapeError(f"input {name!r}: expected dtype {spec['dtype']}, got a GPUTensor of {t.dtype}")
            if "dynamic_shape" not in spec and list(t.shape) != list(spec["shape"]):  # run-time dims: _bind_dims
                raise ShapeError(f"input {name!r}: expected shape {spec['shape']} (symbolic {spec.get('symbolic_shape', spec['shape'])}), "
                                 f"got a GPUTensor of shape {list(t.shape)}")
            if t.device is not self.device:
                raise DeviceError(f"input {name!r}: the GPUTensor lives on another WebGPU device than this session "
                                  "(buffers cannot move between devices); load the sessions on one device (the "
                                  "default, device='shared') or upload it again with session.upload()")
            checked.append((spec, t))
        rest = [i for i in self.inputs if i["name"] not in on_gpu]
        return storage_feeds(rest, {k: v for k, v in feeds.items() if k not in on_gpu}), checked

    def upload(self, data: np.ndarray | dict[str, np.ndarray]) -> GPUTensor | dict[str, GPUTensor]:
        """Copy ``data`` to new :class:`~kiln.runtime.gpu.GPUTensor` s on this session's device, to feed
        :meth:`run` without host copies later (a dict of arrays gives a dict of tensors).

        Raises:
            ShapeError: a dtype WebGPU buffers cannot hold, or int64 values outside int32's range.
            DeviceLostError: the device was lost: load the package again.
        """
        with self._device_work("upload"):
            if isinstance(data, dict):
                return {k: to_gpu(v, device=self.device) for k, v in data.items()}
            return to_gpu(data, device=self.device)

    def _move_rows(self, moves: list[tuple[int, int, list[tuple[int, int]]]]) -> None:
        """Copy state entries within their buffers (:func:`kiln.runtime.generate.state_row_moves`) on the
        device: the sources into a scratch buffer, then to their places, in one command buffer."""
        if not moves:
            return
        with self._device_work("state reorder"), self._lock:
            self._copy_rows(moves)

    def _copy_rows(self, moves: list[tuple[int, int, list[tuple[int, int]]]]) -> None:
        import wgpu

        total = sum(row * len({src for _, src in pairs}) for _, row, pairs in moves)
        scratch = self._scratch
        if scratch is None or scratch.size < total:  # kept for the next steps
            if scratch is not None:
                scratch.destroy()
            scratch = self._scratch = self.device.create_buffer(
                size=total, usage=wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST, label="kiln_reorder_state")
        enc = self.device.create_command_encoder(label="reorder_state")
        at = 0
        for buffer, row, pairs in moves:
            slot = {}
            for src in sorted({src for _, src in pairs}):
                slot[src] = at
                enc.copy_buffer_to_buffer(self.buffers[buffer], src * row, scratch, at, row)
                at += row
            for dst, src in pairs:
                enc.copy_buffer_to_buffer(scratch, slot[src], self.buffers[buffer], dst * row, row)
        self.device.queue.submit([enc.finish()])

    def sync(self) -> None:
        """Block until the device has finished every submitted run (e.g. after ``run(..., output="gpu")``)."""
        synchronize(self.device)

    def benchmark(self, feeds: dict[str, Any], repeat: int = 20, warmup: int = 3, output: str = "numpy",
                  warmup_s: float = 0.0) -> list[float]:
        """Wall-clock ms of ``repeat`` full runs after ``warmup`` runs and at least ``warmup_s`` seconds of them (GPU
        clocks ramp up: :mod:`kiln.runtime.timing`): with host arrays and ``output="numpy"``, upload, compute and
        readback; with GPUTensor feeds and ``output="gpu"``, the run and a device sync (:meth:`sync`), no copies."""
        def once():
            self.run(feeds, output=output)
            if output == "gpu":
                self.sync()
        return wall_clock_ms(once, repeat, warmup, warmup_s)

    def profile(self, feeds: dict[str, np.ndarray], repeat: int = 10, warmup_s: float = 0.0) -> list[dict[str, Any]]:
        """GPU milliseconds of every dispatch, median over ``repeat`` runs (after one warm-up run, and more runs until
        ``warmup_s`` seconds have passed: a GPU idle before reports its low clocks' times, :mod:`kiln.runtime.timing`).

        Each dispatch gets its own compute pass with WebGPU timestamp writes (feature ``timestamp-query``, requested
        at load when the adapter has it; timestamps are read as nanoseconds). Without the feature each dispatch is
        submitted and waited for alone and timed by the wall clock, which adds submission overhead to every row.

        Returns:
            One dict per dispatch in plan order: ``step``, ``kernel``, ``dispatch`` (workgroup counts), ``ms``,
            ``clock`` (``timestamp-query`` or ``wall``).
        """
        with self._device_work("profile"), self._lock:  # (its runs and dispatches use the session's buffers)
            warm(lambda: self.run(feeds), 0, warmup_s)
            return self._profile(feeds, repeat)

    def _profile(self, feeds: dict[str, np.ndarray], repeat: int) -> list[dict[str, Any]]:
        import wgpu

        self.run(feeds)
        steps = self.steps
        if getattr(self, "_dispatch", None) is not None:  # run-time dims: this run's dispatches, empty ones dropped
            steps = [(p, g, d) for (p, g, _), d in zip(self.steps, self._dispatch)]
        n = len(steps)
        samples: list[list[float]] = [[] for _ in range(n)]
        timestamps = "timestamp-query" in self.device.features
        # queries only for the steps that run: Vulkan waits for ever on a query that was never written
        slot = {i: k for k, i in enumerate(i for i, (_, _, d) in enumerate(steps) if d[0])}
        m = max(len(slot), 1)
        if timestamps:
            qs = self.device.create_query_set(type=wgpu.QueryType.timestamp, count=2 * m)
            resolve = self.device.create_buffer(size=16 * m, usage=wgpu.BufferUsage.QUERY_RESOLVE
                                                | wgpu.BufferUsage.COPY_SRC)
            staging = self.device.create_buffer(size=16 * m, usage=wgpu.BufferUsage.MAP_READ
                                                | wgpu.BufferUsage.COPY_DST)
        for _ in range(repeat):
            if timestamps:
                enc = self.device.create_command_encoder()
                for i, (pipeline, group, dispatch) in enumerate(steps):
                    if not dispatch[0]:
                        continue
                    cpass = enc.begin_compute_pass(timestamp_writes={
                        "query_set": qs, "beginning_of_pass_write_index": 2 * slot[i],
                        "end_of_pass_write_index": 2 * slot[i] + 1})
                    cpass.set_pipeline(pipeline)
                    cpass.set_bind_group(0, group)
                    cpass.dispatch_workgroups(*dispatch)
                    cpass.end()
                if not slot:
                    for i in range(n):
                        samples[i].append(0.0)
                    continue
                enc.resolve_query_set(qs, 0, 2 * len(slot), resolve, 0)
                enc.copy_buffer_to_buffer(resolve, 0, staging, 0, 16 * len(slot))
                self.device.queue.submit([enc.finish()])
                staging.map_sync(wgpu.MapMode.READ)
                try:
                    ticks = np.frombuffer(staging.read_mapped(copy=True), dtype=np.uint64).reshape(m, 2)
                finally:
                    staging.unmap()
                for i in range(n):
                    t = ticks[slot[i]] if i in slot else (0, 0)
                    samples[i].append(float(t[1] - t[0]) / 1e6 if t[1] >= t[0] else 0.0)
            else:
                for i, (pipeline, group, dispatch) in enumerate(steps):
                    if not dispatch[0]:
                        samples[i].append(0.0)
                        continue
                    t0 = time.perf_counter()
                    enc = self.device.create_command_encoder()
                    cpass = enc.begin_compute_pass()
                    cpass.set_pipeline(pipeline)
                    cpass.set_bind_group(0, group)
                    cpass.dispatch_workgroups(*dispatch)
                    cpass.end()
                    self.device.queue.submit([enc.finish()])
                    self.device.queue.read_buffer(self.buffers[0], 0, 4)  # waits for the submission
                    samples[i].append((time.perf_counter() - t0) * 1e3)
        plan = self.control.kernel_steps if self.control is not None else self.manifest["targets"]["webgpu"]["plan"]
        return [{"step": plan[i].get("node", str(i)), "kernel": self.step_names[i], "dispatch": list(steps[i][2]),
                 "ms": float(np.median(samples[i])), "clock": "timestamp-query" if timestamps else "wall"}
                for i in range(n)]
