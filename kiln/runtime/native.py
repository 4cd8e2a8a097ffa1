"""Native execution of a package through wgpu-py (Vulkan, Metal or D3D12; Mesa's lavapipe on CPUs).

The runtime reads packages only; it never imports the compiler. Buffers,
pipelines and bind groups are created once at load; each :meth:`Session.run`
writes the inputs, records one command encoder with one compute pass holding
every dispatch plus the copies of the outputs to mappable staging buffers,
submits it once, and maps the staging buffers.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import DeviceError, PackageError, ShapeError
from kiln.package.format import DEFAULT_LIMITS, STORAGE, from_storage, read_manifest, read_weights, verify_weights
from kiln.runtime import dynamic
from kiln.runtime.feeds import storage_feeds
from kiln.runtime.timing import wall_clock_ms
from kiln.runtime.training import TrainingMixin


def _request_device(limits: dict[str, int], features: list[str], optional: tuple[str, ...] = ()):
    """An adapter and a device with the ``limits`` (package needs, spec names) and ``features`` the package uses.

    Only limits above WebGPU's defaults are requested; ``optional`` features are requested when the
    adapter has them. Raises DeviceError if the adapter falls short.
    """
    import wgpu

    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    if adapter is None:
        raise DeviceError("no WebGPU adapter found (install a Vulkan driver, e.g. Debian's mesa-vulkan-drivers)")
    have = adapter.limits
    required = {}
    for name, value in limits.items():
        key = "".join("-" + c.lower() if c.isupper() else c for c in name)
        if key not in have:
            continue
        if have[key] < value:
            raise DeviceError(f"adapter {adapter.info.get('device', '?')} has {name}={have[key]}, the package "
                              f"needs {value}")
        if value > DEFAULT_LIMITS.get(name, 0):
            required[key] = value
    missing = [f for f in features if f not in adapter.features]
    if missing:
        raise DeviceError(f"adapter {adapter.info.get('device', '?')} lacks WebGPU features {missing}")
    features = list(features) + [f for f in optional if f in adapter.features and f not in features]
    return adapter, adapter.request_device_sync(required_features=features, required_limits=required)


class Session(TrainingMixin):
    """A loaded package, ready to run natively (and, for train-step packages, to train: ``train_step``,
    ``state``, ``export_weights``; see :class:`~kiln.runtime.training.TrainingMixin`).

    Args:
        package: package directory (made by ``kiln compile``).
        target: the target to run (only ``webgpu`` natively).
        verify: check the weights' SHA-256 against the manifest.
        poison: fill activation and output buffers with NaN at load and before every run, so an
            element a kernel forgets to write shows up as NaN (for tests).

    Raises:
        PackageError: missing, malformed, corrupted, or newer-format package.
        DeviceError: no adapter, or it lacks a limit or feature the package needs.
    """

    def __init__(self, package: str | os.PathLike, target: str = "webgpu", verify: bool = True, poison: bool = False):
        import wgpu

        self.path = Path(package)
        self.manifest: dict[str, Any] = read_manifest(self.path)
        if target not in self.manifest["targets"]:
            raise PackageError(f"{self.path}: package has no {target!r} target "
                               f"(has: {', '.join(self.manifest['targets'])})")
        if verify:
            verify_weights(self.path, self.manifest)
        tgt = self.manifest["targets"][target]
        self.adapter, self.device = _request_device(tgt.get("limits", {}), tgt.get("features", []),
                                                    optional=("timestamp-query",))
        dev = self.device
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
        self.buffers = [dev.create_buffer(size=b["bytes"], usage=usage, label=f"b{b['id']}_{b['kind']}")
                        for b in self.manifest["buffers"]]
        for b, data in read_weights(self.path, self.manifest):
            if data.size:
                dev.queue.write_buffer(self.buffers[b["id"]], 0, data.tobytes())
        self.pipelines = []
        # run-time dims (docs/dynamic-shapes.md): one uniform buffer of dim values, bound after each reading
        # kernel's storage buffers; dispatch sizes and output shapes follow from the fed shapes
        self._dyn = dynamic.is_dynamic(self.manifest)
        self._dims_env: dict[str, int] | None = None
        self.dims_buffer = dev.create_buffer(size=tgt["dims_uniform"]["bytes"], label="kiln_dims",
                                             usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST) \
            if self._dyn else None
        for k in tgt["kernels"]:
            src = (self.path / k["source"]).read_text()
            module = dev.create_shader_module(label=k["name"], code=src)
            entries = [{"binding": b["binding"], "visibility": wgpu.ShaderStage.COMPUTE,
                        "buffer": {"type": wgpu.BufferBindingType.read_only_storage if b["access"] == "read"
                                   else wgpu.BufferBindingType.storage}} for b in k["bindings"]]
            if "dims_binding" in k:
                entries.append({"binding": k["dims_binding"], "visibility": wgpu.ShaderStage.COMPUTE,
                                "buffer": {"type": wgpu.BufferBindingType.uniform}})
            layout = dev.create_bind_group_layout(entries=entries)
            pipeline = dev.create_compute_pipeline(
                layout=dev.create_pipeline_layout(bind_group_layouts=[layout]),
                compute={"module": module, "entry_point": k["entry_point"]})
            self.pipelines.append((pipeline, layout))
        self.steps = []
        for s in tgt["plan"]:
            pipeline, layout = self.pipelines[s["kernel"]]
            entries = [{"binding": i, "resource": {"buffer": self.buffers[bid], "offset": 0,
                                                   "size": self.buffers[bid].size}} for i, bid in enumerate(s["buffers"])]
            if "dims_binding" in tgt["kernels"][s["kernel"]]:
                entries.append({"binding": tgt["kernels"][s["kernel"]]["dims_binding"], "resource": {
                    "buffer": self.dims_buffer, "offset": 0, "size": self.dims_buffer.size}})
            group = dev.create_bind_group(layout=layout, entries=entries)
            self.steps.append((pipeline, group, tuple(s["dispatch"])))
        self._raw = self._raw_steps()
        self._ran = False
        self._init_training(tgt)
        self.step_names = [f"{tgt['kernels'][s['kernel']]['name']}" for s in tgt["plan"]]
        self.poison = poison
        if poison:
            for b in self.manifest["buffers"]:
                if b["kind"] in ("activation", "output"):
                    self._fill_nan(b["id"])
        self.staging = {o["name"]: dev.create_buffer(size=self.buffers[o["buffer"]].size,
                                                     usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
                        for o in self.manifest["outputs"]}

    def _raw_steps(self):
        """The plan as raw wgpu-native handles, for :meth:`_encode_raw`; ``None`` where the backend differs."""
        try:
            from wgpu.backends.wgpu_native._ffi import ffi, lib
        except ImportError:
            return None
        index = {id(p): i for i, (p, _) in enumerate(self.pipelines)}
        raw = [(index[id(p)], p._internal, g._internal, x, y, z) for p, g, (x, y, z) in self.steps]
        if not all(isinstance(r[1], ffi.CData) and isinstance(r[2], ffi.CData) for r in raw):
            return None
        return lib, ffi.NULL, raw

    def _encode_raw(self, cpass, dispatch: list[tuple[int, int, int]] | None = None) -> None:
        """Record every dispatch through wgpu-native's C API directly.

        Encoding through wgpu-py's checked wrappers costs about 15 us of Python per dispatch,
        as much as a small kernel takes on a fast GPU. The plan was validated by the first
        run (encoded through the public API), and the calls are the same three per dispatch.
        """
        lib, null, raw = self._raw
        h = cpass._internal
        last = -1
        for k, (i, pipeline, group, x, y, z) in enumerate(raw):
            if dispatch is not None:
                x, y, z = dispatch[k]
                if not x:  # nothing to do for these dims: a dispatch of 0 workgroups is skipped
                    continue
            if i != last:
                lib.wgpuComputePassEncoderSetPipeline(h, pipeline)
                last = i
            lib.wgpuComputePassEncoderSetBindGroup(h, 0, group, 0, null)
            lib.wgpuComputePassEncoderDispatchWorkgroups(h, x, y, z)

    def _fill_nan(self, buffer_id: int) -> None:
        self.device.queue.write_buffer(self.buffers[buffer_id], 0,
                                       np.full(self.buffers[buffer_id].size // 4, np.nan, np.float32).tobytes())

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

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model on ``feeds`` (input name -> array of the manifest's dtype and shape).

        Returns:
            Output name -> a new numpy array.

        Inputs are converted to their buffers' element type (``storage`` in the manifest: bool,
        int8, uint8 and int64 are stored as int32) and outputs back to their dtype.
        A package with run-time dims (docs/dynamic-shapes.md) takes inputs of any shape within its dims'
        bounds and returns outputs of their run-time shapes.

        Raises:
            ShapeError: an unknown, missing, wrongly shaped or wrongly typed input, or an int64
                input value that does not fit in int32; for run-time dims, a value outside its bounds or
                inputs that disagree on one.
        """
        import wgpu

        dev = self.device
        dispatch, shapes = None, {}
        if self._dyn:
            checked, dispatch, shapes = self._bind_dynamic(feeds)
        else:
            checked = self._check_feeds(feeds)
        for spec, a in checked:
            if a.size:  # an empty tensor has nothing to write (WebGPU refuses empty writes)
                dev.queue.write_buffer(self.buffers[spec["buffer"]], 0, memoryview(a.reshape(-1)).cast("B"))
        if self.poison:
            for o in self.outputs:
                self._fill_nan(o["buffer"])
        enc = dev.create_command_encoder()
        cpass = enc.begin_compute_pass()
        if self._raw is not None and self._ran:
            self._encode_raw(cpass, dispatch)
        else:
            last = None
            for k, (pipeline, group, (x, y, z)) in enumerate(self.steps):
                if dispatch is not None:
                    x, y, z = dispatch[k]
                    if not x:
                        continue
                if pipeline is not last:
                    cpass.set_pipeline(pipeline)
                    last = pipeline
                cpass.set_bind_group(0, group)
                cpass.dispatch_workgroups(x, y, z)
        cpass.end()
        for o in self.outputs:
            st = self.staging[o["name"]]
            size = st.size if not self._dyn else \
                -(-int(np.prod(shapes[o["name"]])) * np.dtype(STORAGE[o["dtype"]]).itemsize // 4) * 4
            if size:
                enc.copy_buffer_to_buffer(self.buffers[o["buffer"]], 0, st, 0, size)
        dev.queue.submit([enc.finish()])
        self._ran = True
        self._dispatch = dispatch  # the last run's dispatches (run-time dims), for profile()
        results = {}
        for o in self.outputs:
            st = self.staging[o["name"]]
            st.map_sync(wgpu.MapMode.READ)
            try:
                raw = st.read_mapped(copy=True)
            finally:
                st.unmap()
            results[o["name"]] = from_storage(raw, o["dtype"], shapes.get(o["name"], o["shape"]))
        return results

    def _bind_dynamic(self, feeds: dict[str, np.ndarray]):
        """Feeds of a package with run-time dims: ``(checked inputs, dispatches, output shapes)``; writes the dims
        uniform when the dims changed (ShapeError as :func:`kiln.runtime.dynamic.bind_dims`)."""
        from kiln.package.format import to_storage

        env = dynamic.bind_dims(self.manifest, feeds)
        checked = []
        for spec in self.inputs:
            a = np.asarray(feeds[spec["name"]])
            if a.dtype != np.dtype(spec["dtype"]):
                raise ShapeError(f"input {spec['name']!r}: expected dtype {spec['dtype']}, got {a.dtype}")
            checked.append((spec, np.ascontiguousarray(to_storage(a, spec["dtype"], f"input {spec['name']!r}"))))
        if env != self._dims_env:
            self.device.queue.write_buffer(self.dims_buffer, 0, dynamic.dims_words(self.manifest, env))
            self._dims_env = env
        plan = self.manifest["targets"]["webgpu"]["plan"]
        return checked, dynamic.dispatches(plan, env), dynamic.output_shapes(self.manifest, env)

    def benchmark(self, feeds: dict[str, np.ndarray], repeat: int = 20, warmup: int = 3) -> list[float]:
        """Wall-clock milliseconds of ``repeat`` full runs (upload, compute, readback) after ``warmup`` runs."""
        return wall_clock_ms(lambda: self.run(feeds), repeat, warmup)

    def profile(self, feeds: dict[str, np.ndarray], repeat: int = 10) -> list[dict[str, Any]]:
        """GPU milliseconds of every dispatch, median over ``repeat`` runs (after one warm-up run).

        Each dispatch gets its own compute pass with WebGPU timestamp writes (feature
        ``timestamp-query``, requested at load when the adapter has it; timestamps are read as
        nanoseconds). Without the feature each dispatch is submitted and waited for alone and
        timed by the wall clock, which adds submission overhead to every row.

        Returns:
            One dict per dispatch in plan order: ``step``, ``kernel``, ``dispatch`` (workgroup
            counts), ``ms``, ``clock`` (``timestamp-query`` or ``wall``).
        """
        import wgpu

        self.run(feeds)
        steps = self.steps
        if getattr(self, "_dispatch", None) is not None:  # run-time dims: this run's dispatches, empty ones dropped
            steps = [(p, g, d) for (p, g, _), d in zip(self.steps, self._dispatch)]
        n = len(steps)
        samples: list[list[float]] = [[] for _ in range(n)]
        timestamps = "timestamp-query" in self.device.features
        if timestamps:
            qs = self.device.create_query_set(type=wgpu.QueryType.timestamp, count=2 * n)
            resolve = self.device.create_buffer(size=16 * n, usage=wgpu.BufferUsage.QUERY_RESOLVE
                                                | wgpu.BufferUsage.COPY_SRC)
            staging = self.device.create_buffer(size=16 * n, usage=wgpu.BufferUsage.MAP_READ
                                                | wgpu.BufferUsage.COPY_DST)
        for _ in range(repeat):
            if timestamps:
                enc = self.device.create_command_encoder()
                for i, (pipeline, group, dispatch) in enumerate(steps):
                    if not dispatch[0]:
                        continue
                    cpass = enc.begin_compute_pass(timestamp_writes={
                        "query_set": qs, "beginning_of_pass_write_index": 2 * i, "end_of_pass_write_index": 2 * i + 1})
                    cpass.set_pipeline(pipeline)
                    cpass.set_bind_group(0, group)
                    cpass.dispatch_workgroups(*dispatch)
                    cpass.end()
                enc.resolve_query_set(qs, 0, 2 * n, resolve, 0)
                enc.copy_buffer_to_buffer(resolve, 0, staging, 0, 16 * n)
                self.device.queue.submit([enc.finish()])
                staging.map_sync(wgpu.MapMode.READ)
                try:
                    ticks = np.frombuffer(staging.read_mapped(copy=True), dtype=np.uint64).reshape(n, 2)
                finally:
                    staging.unmap()
                for i in range(n):
                    samples[i].append(float(ticks[i, 1] - ticks[i, 0]) / 1e6 if ticks[i, 1] >= ticks[i, 0] else 0.0)
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
        plan = self.manifest["targets"]["webgpu"]["plan"]
        return [{"step": plan[i].get("node", str(i)), "kernel": self.step_names[i], "dispatch": list(steps[i][2]),
                 "ms": float(np.median(samples[i])), "clock": "timestamp-query" if timestamps else "wall"}
                for i in range(n)]
