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
from kiln.package.format import DEFAULT_LIMITS, from_storage, read_manifest, to_storage, verify_weights


def _request_device(limits: dict[str, int], features: list[str]):
    """An adapter and a device with the ``limits`` (package needs, spec names) and ``features`` the package uses.

    Only limits above WebGPU's defaults are requested. Raises DeviceError if the adapter falls short.
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
    return adapter, adapter.request_device_sync(required_features=features, required_limits=required)


class Session:
    """A loaded package, ready to run natively.

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
        from safetensors import safe_open

        self.path = Path(package)
        self.manifest: dict[str, Any] = read_manifest(self.path)
        if target not in self.manifest["targets"]:
            raise PackageError(f"{self.path}: package has no {target!r} target "
                               f"(has: {', '.join(self.manifest['targets'])})")
        if verify:
            verify_weights(self.path, self.manifest)
        tgt = self.manifest["targets"][target]
        self.adapter, self.device = _request_device(tgt.get("limits", {}), tgt.get("features", []))
        dev = self.device
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
        self.buffers = [dev.create_buffer(size=b["bytes"], usage=usage, label=f"b{b['id']}_{b['kind']}")
                        for b in self.manifest["buffers"]]
        handles: dict[str, Any] = {}
        try:
            for b in self.manifest["buffers"]:
                if b["kind"] != "weight":
                    continue
                f = b["file"]
                if f not in handles:
                    handles[f] = safe_open(str(self.path / f), framework="numpy")
                data = np.ascontiguousarray(handles[f].get_tensor(b["tensor"]))
                if data.nbytes > b["bytes"]:
                    raise PackageError(f"{self.path}: weight {b['tensor']} is larger than its buffer")
                if data.size:
                    dev.queue.write_buffer(self.buffers[b["id"]], 0, data.tobytes())
        except (OSError, KeyError) as e:
            raise PackageError(f"{self.path}: cannot read weights ({e})") from None
        self.pipelines = []
        for k in tgt["kernels"]:
            src = (self.path / k["source"]).read_text()
            module = dev.create_shader_module(label=k["name"], code=src)
            entries = [{"binding": b["binding"], "visibility": wgpu.ShaderStage.COMPUTE,
                        "buffer": {"type": wgpu.BufferBindingType.read_only_storage if b["access"] == "read"
                                   else wgpu.BufferBindingType.storage}} for b in k["bindings"]]
            layout = dev.create_bind_group_layout(entries=entries)
            pipeline = dev.create_compute_pipeline(
                layout=dev.create_pipeline_layout(bind_group_layouts=[layout]),
                compute={"module": module, "entry_point": k["entry_point"]})
            self.pipelines.append((pipeline, layout))
        self.steps = []
        for s in tgt["plan"]:
            pipeline, layout = self.pipelines[s["kernel"]]
            group = dev.create_bind_group(layout=layout, entries=[
                {"binding": i, "resource": {"buffer": self.buffers[bid], "offset": 0, "size": self.buffers[bid].size}}
                for i, bid in enumerate(s["buffers"])])
            self.steps.append((pipeline, group, tuple(s["dispatch"])))
        self.poison = poison
        if poison:
            for b in self.manifest["buffers"]:
                if b["kind"] in ("activation", "output"):
                    self._fill_nan(b["id"])
        self.staging = {o["name"]: dev.create_buffer(size=self.buffers[o["buffer"]].size,
                                                     usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
                        for o in self.manifest["outputs"]}

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
        names = {i["name"] for i in self.inputs}
        unknown = sorted(set(feeds) - names)
        if unknown:
            raise ShapeError(f"unknown input{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                             f"the model's inputs are {', '.join(map(repr, sorted(names)))}")
        out = []
        for spec in self.inputs:
            if spec["name"] not in feeds:
                raise ShapeError(f"missing input {spec['name']!r} ({spec['dtype']}{spec['shape']})")
            a = np.asarray(feeds[spec["name"]])
            if a.dtype != np.dtype(spec["dtype"]):
                raise ShapeError(f"input {spec['name']!r}: expected dtype {spec['dtype']}, got {a.dtype}")
            if list(a.shape) != list(spec["shape"]):
                raise ShapeError(f"input {spec['name']!r}: expected shape {spec['shape']} "
                                 f"(symbolic {spec['symbolic_shape']}), got {list(a.shape)}")
            out.append((spec, to_storage(a, spec["dtype"], f"input {spec['name']!r}")))
        return out

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model on ``feeds`` (input name -> array of the manifest's dtype and shape).

        Returns:
            Output name -> a new numpy array.

        Inputs are converted to their buffers' element type (``storage`` in the manifest: bool,
        int8, uint8 and int64 are stored as int32) and outputs back to their dtype.

        Raises:
            ShapeError: an unknown, missing, wrongly shaped or wrongly typed input, or an int64
                input value that does not fit in int32.
        """
        import wgpu

        checked = self._check_feeds(feeds)
        dev = self.device
        for spec, a in checked:
            if a.size:  # an empty tensor has nothing to write (WebGPU refuses empty writes)
                dev.queue.write_buffer(self.buffers[spec["buffer"]], 0, a.tobytes())
        if self.poison:
            for o in self.outputs:
                self._fill_nan(o["buffer"])
        enc = dev.create_command_encoder()
        cpass = enc.begin_compute_pass()
        last = None
        for pipeline, group, (x, y, z) in self.steps:
            if pipeline is not last:
                cpass.set_pipeline(pipeline)
                last = pipeline
            cpass.set_bind_group(0, group)
            cpass.dispatch_workgroups(x, y, z)
        cpass.end()
        for o in self.outputs:
            st = self.staging[o["name"]]
            enc.copy_buffer_to_buffer(self.buffers[o["buffer"]], 0, st, 0, st.size)
        dev.queue.submit([enc.finish()])
        results = {}
        for o in self.outputs:
            st = self.staging[o["name"]]
            st.map_sync(wgpu.MapMode.READ)
            try:
                raw = st.read_mapped(copy=True)
            finally:
                st.unmap()
            results[o["name"]] = from_storage(raw, o["dtype"], o["shape"])
        return results

    def benchmark(self, feeds: dict[str, np.ndarray], repeat: int = 20, warmup: int = 3) -> list[float]:
        """Wall-clock milliseconds of ``repeat`` full runs (upload, compute, readback) after ``warmup`` runs."""
        for _ in range(warmup):
            self.run(feeds)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            self.run(feeds)
            times.append((time.perf_counter() - t0) * 1e3)
        return times
