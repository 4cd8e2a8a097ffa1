"""GPU-resident inputs and outputs of the native runtime (GPUTensor), the shared device and the pipeline cache.

Small models built here, checked against onnxruntime on fresh random inputs; a chain of two sessions
passes a GPUTensor from one to the other without host copies.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.errors import DeviceError, KilnError, ShapeError
from kiln.runtime.gpu import GPUTensor, shared_device, to_gpu
from kiln.runtime.native import Session
from kiln.runtime.pipelines import KernelSpec, pipeline_cache


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _mlp(seed: int) -> onnx.ModelProto:
    """x[2,8] -> h = relu(x W + b) [2,16], s = sum(h, axis 1) [2]: two outputs."""
    r = np.random.default_rng(seed)
    return _model(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["pre"]),
         helper.make_node("Relu", ["pre"], ["h"]), helper.make_node("ReduceSum", ["h", "axes"], ["s"], keepdims=0)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, 16]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [2])],
        {"W": r.standard_normal((8, 16)).astype(np.float32), "b": r.standard_normal(16).astype(np.float32),
         "axes": np.array([1], np.int64)})


def _head() -> onnx.ModelProto:
    """h[2,16] -> p = softmax(h V) [2,4]."""
    r = np.random.default_rng(7)
    return _model([helper.make_node("MatMul", ["h", "V"], ["hv"]), helper.make_node("Softmax", ["hv"], ["p"], axis=-1)],
                  [helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, 16])],
                  [helper.make_tensor_value_info("p", TensorProto.FLOAT, [2, 4])],
                  {"V": r.standard_normal((16, 4)).astype(np.float32)})


def _ints() -> onnx.ModelProto:
    """ids int64 [6] -> j = ids * 3 + 5 (int64), big = ids > 2 (bool)."""
    return _model([helper.make_node("Mul", ["ids", "three"], ["m"]), helper.make_node("Add", ["m", "five"], ["j"]),
                   helper.make_node("Greater", ["ids", "two"], ["big"])],
                  [helper.make_tensor_value_info("ids", TensorProto.INT64, [6])],
                  [helper.make_tensor_value_info("j", TensorProto.INT64, [6]),
                   helper.make_tensor_value_info("big", TensorProto.BOOL, [6])],
                  {"three": np.array(3, np.int64), "five": np.array(5, np.int64), "two": np.array(2, np.int64)})


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """ONNX files and packages: ``mlp``, ``mlp_again`` (the same model compiled again), ``head``, ``ints``."""
    root = tmp_path_factory.mktemp("gpu_io")
    out = {}
    for name, model in (("mlp", _mlp(1)), ("head", _head()), ("ints", _ints())):
        path = root / f"{name}.onnx"
        onnx.save(model, path)
        out[name] = (path, kiln.compile(path, root / name, force=True))
    out["mlp_again"] = (out["mlp"][0], kiln.compile(out["mlp"][0], root / "mlp_again", force=True))
    return out


def _ort(path, feeds):
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))


def test_gpu_feeds_and_outputs_match_host_runs_and_onnxruntime(models, rng):
    path, pkg = models["mlp"]
    session = Session(pkg)
    x = rng.standard_normal((2, 8)).astype(np.float32)
    expected = _ort(path, {"x": x})
    host = session.run({"x": x})
    xg = session.upload(x)
    assert isinstance(xg, GPUTensor) and xg.shape == (2, 8) and xg.dtype == np.float32 and xg.nbytes == 64
    on_gpu = session.run({"x": xg}, output="gpu")
    assert set(on_gpu) == {"h", "s"} and all(isinstance(t, GPUTensor) for t in on_gpu.values())
    assert on_gpu["s"].shape == (2,) and on_gpu["s"].nbytes == 8
    for name in ("h", "s"):
        np.testing.assert_allclose(host[name], expected[name], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(on_gpu[name].numpy(), host[name])
    mixed = session.run({"x": xg})  # GPU feed, host outputs
    np.testing.assert_array_equal(mixed["h"], host["h"])
    np.testing.assert_array_equal(xg.numpy(), x)  # the feed itself is untouched


def test_run_returns_only_the_outputs_asked_for(models, rng):
    """``run(..., outputs=[names])`` (onnxruntime's ``output_names``) returns those outputs alone, equal to a full
    run's, as host arrays and as GPUTensors, and a read of one GPUTensor after another of its size reuses the
    readback (the value still the new one); ``read=[names]`` starts those outputs' reads with the run (one
    submission), and ``read_async`` hands that read out once, with the run's values; an unknown name, or ``read``
    without ``output="gpu"`` or of an output not returned, is a one-line error."""
    path, pkg = models["mlp"]
    session = Session(pkg)
    for _ in range(2):
        x = rng.standard_normal((2, 8)).astype(np.float32)
        expected = _ort(path, {"x": x})
        full = session.run({"x": x})
        np.testing.assert_allclose(full["s"], expected["s"], rtol=1e-5, atol=1e-5)
        only = session.run({"x": x}, outputs=["s"])
        assert set(only) == {"s"}
        np.testing.assert_array_equal(only["s"], full["s"])
        on_gpu = session.run({"x": x}, output="gpu", outputs=["h"])
        assert set(on_gpu) == {"h"}
        np.testing.assert_array_equal(on_gpu["h"].numpy(), full["h"])
        np.testing.assert_array_equal(session.run({"x": x}, output="gpu", outputs="s")["s"].numpy(), full["s"])
        started = session.run({"x": x}, output="gpu", read=["s"])  # the read submitted with the run
        later = session.run({"x": 2 * x}, output="gpu", outputs=["s"], read="s")
        pending = started["s"].read_async()
        assert started["s"].read_async() is not pending  # (the started read is handed out once)
        np.testing.assert_array_equal(pending.result(), full["s"])
        np.testing.assert_array_equal(later["s"].read_async().result(), session.run({"x": 2 * x})["s"])
        np.testing.assert_array_equal(started["h"].numpy(), full["h"])
    with pytest.raises(KilnError, match=r"^run: unknown output 'logits'; the model's outputs are 'h', 's'$"):
        session.run({"x": x}, outputs=["s", "logits"])
    for bad in ({"read": ["s"]}, {"output": "gpu", "outputs": ["h"], "read": ["s"]}):
        with pytest.raises(KilnError, match=r"^run: read=\['s'\] names outputs to read back with output='gpu'"):
            session.run({"x": x}, **bad)


def test_runs_split_into_several_command_buffers(models, rng):
    """``submit_chunks`` > 1 (each run's plan in several command buffers, submitted as encoded) gives the same
    outputs as one command buffer, with host and GPU outputs, for more chunks than steps too."""
    path, pkg = models["mlp"]
    session = Session(pkg)
    x = rng.standard_normal((2, 8)).astype(np.float32)
    expected = _ort(path, {"x": x})
    one = session.run({"x": x})  # the first run validates the plan through wgpu-py; later ones take the C API
    for k in (2, 3, len(session.steps) + 5):
        session.submit_chunks = k
        got = session.run({"x": x})
        on_gpu = session.run({"x": session.upload(x)}, output="gpu")
        for name in ("h", "s"):
            np.testing.assert_array_equal(got[name], one[name], err_msg=f"{name}, {k} chunks")
            np.testing.assert_array_equal(on_gpu[name].numpy(), one[name], err_msg=f"{name}, {k} chunks, GPU I/O")
            np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-5)


def test_read_async_reads_the_values_at_its_call(models, rng):
    """``GPUTensor.read_async`` submits its copy at once: work submitted after it (a run, a write into the tensor's
    buffer) does not change what it reads, and runs as submitted."""
    path, pkg = models["mlp"]
    session = Session(pkg)
    x = rng.standard_normal((2, 8)).astype(np.float32)
    h = session.run({"x": session.upload(x)}, output="gpu")["h"]
    pending = h.read_async()
    later = session.run({"x": session.upload(x + 1)}, output="gpu")  # queued behind the read
    session.device.queue.write_buffer(h.buffer, 0, np.zeros(h.size, np.float32).tobytes())
    np.testing.assert_allclose(pending.result(), _ort(path, {"x": x})["h"], rtol=1e-5, atol=1e-5)
    assert pending.result() is pending.result()
    np.testing.assert_array_equal(h.numpy(), np.zeros_like(pending.result()))
    np.testing.assert_allclose(later["h"].numpy(), _ort(path, {"x": x + 1})["h"], rtol=1e-5, atol=1e-5)


def test_two_sessions_chain_on_the_gpu(models, rng):
    (mlp_path, mlp_pkg), (head_path, head_pkg) = models["mlp"], models["head"]
    first, second = Session(mlp_pkg), Session(head_pkg)
    assert first.device is second.device  # the shared device
    x = rng.standard_normal((2, 8)).astype(np.float32)
    h = first.run({"x": first.upload(x)}, output="gpu")["h"]
    p = second.run({"h": h}, output="gpu")["p"]
    expected = _ort(head_path, {"h": _ort(mlp_path, {"x": x})["h"]})["p"]
    np.testing.assert_allclose(p.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_gpu_outputs_stay_valid_after_later_runs(models, rng):
    path, pkg = models["mlp"]
    session = Session(pkg, poison=True)  # poison refills the session's output buffers with NaN before each run
    xs = [rng.standard_normal((2, 8)).astype(np.float32) for _ in range(3)]
    outs = [session.run({"x": session.upload(x)}, output="gpu") for x in xs]
    session.run({"x": xs[0] + 1})  # a host run after them too
    for x, out in zip(xs, outs):
        expected = _ort(path, {"x": x})
        np.testing.assert_allclose(out["h"].numpy(), expected["h"], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out["s"].numpy(), expected["s"], rtol=1e-5, atol=1e-5)
    assert outs[0]["h"].buffer is not outs[1]["h"].buffer


def test_repeated_runs_reuse_one_gpu_input(models, rng):
    _, pkg = models["mlp"]
    session = Session(pkg)
    x = rng.standard_normal((2, 8)).astype(np.float32)
    xg = to_gpu(x)  # on the shared device, which the session uses
    first = session.run({"x": xg})
    for _ in range(3):
        np.testing.assert_array_equal(session.run({"x": xg})["s"], first["s"])
    session.benchmark({"x": xg}, repeat=2, warmup=1, output="gpu")  # the GPU-resident timing path runs
    session.sync()


def test_benchmark_and_profile_warm_up_for_warmup_s(models, rng, monkeypatch):
    """warmup_s keeps running untimed runs until that many seconds have passed (a GPU's clocks ramp up under work:
    kiln.runtime.timing), on top of the warm-up count; a CPU adapter's default is none, a GPU's one second."""
    import time

    from kiln.runtime.timing import GPU_CLOCK_RAMP_S, clock_warmup_s

    _, pkg = models["mlp"]
    session = Session(pkg)
    x = {"x": rng.standard_normal((2, 8)).astype(np.float32)}
    calls = []
    run = session.run
    monkeypatch.setattr(session, "run", lambda *a, **k: calls.append(time.perf_counter()) or run(*a, **k))
    times = session.benchmark(x, repeat=2, warmup=1, warmup_s=0.3)
    assert len(times) == 2 and len(calls) >= 4 and calls[-2] - calls[0] >= 0.3  # the timed runs came 0.3 s later
    calls.clear()
    rows = session.profile(x, repeat=1, warmup_s=0.3)
    assert rows and len(calls) >= 2 and calls[-1] - calls[0] >= 0.3  # (its own warm-up run, then the timed ones)
    assert clock_warmup_s({"adapter_type": "CPU"}) == 0.0
    assert clock_warmup_s({"adapter_type": "DiscreteGPU"}) == GPU_CLOCK_RAMP_S > 0


@pytest.mark.parametrize("spin_s", [0.0, 0.5])
def test_waits_spin_then_block(models, rng, monkeypatch, spin_s):
    """The waits for the GPU (readback, sync) poll without blocking for up to gpu.SPIN_S, then block: both ways
    (never spinning, and spinning long enough to see every run finish) give the run's outputs."""
    from kiln.runtime import gpu

    monkeypatch.setattr(gpu, "SPIN_S", spin_s)
    path, pkg = models["mlp"]
    session = Session(pkg)
    x = rng.standard_normal((2, 8)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for _ in range(3):
        got = session.run({"x": x})
        np.testing.assert_allclose(got["h"], want[0], rtol=1e-5, atol=1e-5)
        out = session.run({"x": to_gpu(x)}, output="gpu")
        session.sync()
        np.testing.assert_allclose(out["s"].numpy(), want[1], rtol=1e-5, atol=1e-5)


def test_int64_and_bool_tensors_through_the_gpu(models, rng):
    path, pkg = models["ints"]
    session = Session(pkg)
    ids = rng.integers(-1000, 1000, 6).astype(np.int64)
    expected = _ort(path, {"ids": ids})
    out = session.run({"ids": session.upload(ids)}, output="gpu")
    assert out["j"].dtype == np.int64 and out["j"].storage == np.int32 and out["big"].dtype == np.bool_
    j, big = out["j"].numpy(), out["big"].numpy()
    assert j.dtype == np.int64 and big.dtype == np.bool_
    np.testing.assert_array_equal(j, expected["j"])
    np.testing.assert_array_equal(big, expected["big"])
    np.testing.assert_array_equal(session.run({"ids": ids})["j"], expected["j"])


def test_gpu_feed_errors(models):
    _, pkg = models["mlp"]
    session = Session(pkg)
    with pytest.raises(ShapeError, match="'x': expected dtype float32, got a GPUTensor of int32"):
        session.run({"x": session.upload(np.zeros((2, 8), np.int32))})
    with pytest.raises(ShapeError, match=r"'x': expected shape \[2, 8\].*got a GPUTensor of shape \[8, 2\]"):
        session.run({"x": session.upload(np.zeros((8, 2), np.float32))})
    with pytest.raises(ShapeError, match="unknown input 'y'"):
        session.run({"x": np.zeros((2, 8), np.float32), "y": session.upload(np.zeros(3, np.float32))})
    with pytest.raises(ShapeError, match="missing input 'x'"):
        session.run({})
    released = session.upload(np.zeros((2, 8), np.float32))
    released.release()
    with pytest.raises(KilnError, match="released"):
        session.run({"x": released})
    with pytest.raises(KilnError, match="released"):
        released.numpy()
    with pytest.raises(KilnError, match="output must be 'numpy' or 'gpu'"):
        session.run({"x": np.zeros((2, 8), np.float32)}, output="cpu")
    with pytest.raises(ShapeError, match="float64 arrays cannot be stored"):
        to_gpu(np.zeros(3))
    with pytest.raises(ShapeError, match="does not fit in int32"):
        to_gpu(np.array([2**40], np.int64))


def test_gpu_tensor_from_another_device_is_refused(models, rng):
    _, pkg = models["mlp"]
    own = Session(pkg, device="own")
    shared = Session(pkg)
    assert own.device is not shared.device
    x = rng.standard_normal((2, 8)).astype(np.float32)
    with pytest.raises(DeviceError, match="another WebGPU device"):
        own.run({"x": shared.upload(x)})
    np.testing.assert_array_equal(own.run({"x": own.upload(x)})["h"], shared.run({"x": x})["h"])
    with pytest.raises(KilnError, match="device must be 'shared', 'own' or a wgpu device"):
        Session(pkg, device="gpu0")
    assert Session(pkg, device=own.device).device is own.device


def test_pipeline_cache_serves_a_second_session_and_a_package_sharing_kernels(models):
    _, pkg = models["mlp"]
    first = Session(pkg)
    kernels = len(first.manifest["targets"]["webgpu"]["kernels"])
    cache = pipeline_cache(first.device)
    misses = cache.misses
    second = Session(pkg)
    assert second.pipeline_hits == kernels and cache.misses == misses
    again = Session(models["mlp_again"][1])  # another package with the same kernels
    assert again.pipeline_hits == kernels and cache.misses == misses
    own = Session(pkg, device="own")  # a fresh device has an empty cache
    assert own.pipeline_hits == 0 and pipeline_cache(own.device).misses == kernels
    assert set(second.load_ms) == {"device", "weights", "pipelines", "total"}


def test_pipeline_cache_compiles_concurrently_and_reports_errors():
    dev = shared_device()
    cache = pipeline_cache(dev)
    src = "@group(0) @binding(0) var<storage, read_write> o: array<f32>;\n" \
          "@compute @workgroup_size(1) fn main() {{ o[0] = {v}; }}\n"
    specs = [KernelSpec(src.format(v=f"{i}.5"), "main", ("read_write",), f"k{i}") for i in range(4)]
    before = cache.stats()
    got = cache.get_many(specs + specs[:1], jobs=3)  # the repeated spec is compiled once
    after = cache.stats()
    assert after["misses"] - before["misses"] == 4 and after["modules"] - before["modules"] == 4
    assert got[0] is got[4]
    assert cache.get(specs[2]) is got[2] and cache.stats()["hits"] == after["hits"] + 1
    with pytest.raises(KilnError, match="kernel broken does not compile"):
        cache.get(KernelSpec("fn main( {", "main", ("read_write",), "broken"))


def test_dropped_gpu_outputs_are_pooled_and_live_ones_kept(models, rng):
    import gc

    _, pkg = models["mlp"]
    session = Session(pkg)
    x1, x2 = (rng.standard_normal((2, 8)).astype(np.float32) for _ in range(2))
    gc.collect()  # earlier tests' garbage goes to the pool now, not in the middle of this test
    kept = session.run({"x": x1}, output="gpu")
    dropped = session.run({"x": x2}, output="gpu")
    reusable = {id(dropped["h"].buffer), id(dropped["s"].buffer)}
    del dropped  # freed by reference counting: its buffers go to the pool
    again = session.run({"x": x2}, output="gpu")
    assert {id(again["h"].buffer), id(again["s"].buffer)} == reusable  # the dropped tensors' buffers, reused
    np.testing.assert_array_equal(kept["h"].numpy(), session.run({"x": x1})["h"])
    np.testing.assert_array_equal(again["s"].numpy(), session.run({"x": x2})["s"])


def test_sync_waits_for_the_work(monkeypatch):
    """gpu.synchronize returns only once the device has finished: a long kernel (a loop of ~10^8 steps, tens of ms
    on lavapipe) submitted, synchronize, then a work-done callback registered after it fires at the first
    non-blocking poll. (wgpu-native's non-blocking poll reports its queue empty while such work still runs: a wait
    on that answer returned at once.)"""
    import wgpu

    from kiln.runtime import gpu

    monkeypatch.setattr(gpu, "SPIN_S", 0.5)
    device = shared_device()
    buf = device.create_buffer(size=256 * 4, usage=wgpu.BufferUsage.STORAGE)
    source = """@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  var x = g.x;
  for (var i = 0u; i < 400000u; i++) { x = x * 1664525u + 1013904223u; }
  out[g.x] = x;
}"""
    ffi, lib = gpu._raw()
    for _ in range(2):
        gpu.submit_words(device, source, buf, workgroups=4)
        gpu.synchronize(device)
        token = gpu.watch_work_done(device)
        lib.wgpuDevicePoll(device._internal, 0, ffi.NULL)
        assert token in gpu._DONE, "synchronize returned before the submitted work had finished"
        gpu._DONE.discard(token)
