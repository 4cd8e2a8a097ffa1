"""Limits (issue 19): a model too large for what it targets is refused when compiling, naming the limit, never a
device error at run time; a malformed model cannot make the compiler allocate more than a tensor's bound on the
host (constants it would fold: ConstantOfShape, Range, random draws, folded ops); a run of a wasm module that
never ends is stopped at its time limit."""

from __future__ import annotations

import time

import numpy as np
import onnx
import pytest
import wasmtime
from conftest import save_tiny_relu_matmul
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.errors import KilnError
from kiln.package.format import read_manifest, sha256_file, write_manifest


def _save(tmp_path, nodes, inputs, outputs, inits, name="m"):
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _refused(path, out, match):
    with pytest.raises(KilnError, match=match) as info:
        kiln.compile(str(path), str(out), validate=False)
    assert "\n" not in str(info.value)
    assert not out.exists()
    return str(info.value)


def test_buffer_beyond_a_webgpu_binding_is_refused_at_compile_time(tmp_path):
    """An activation of 2.34 GiB (an Expand of a small input) is refused before any kernel is made, naming the
    tensor and maxStorageBufferBindingSize; the same model at a quarter of the size compiles."""
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024])
    nodes = [helper.make_node("Expand", ["x", "s"], ["c"]), helper.make_node("ReduceSum", ["c"], ["y"], keepdims=0)]
    big = _save(tmp_path, nodes, [x], [y], [numpy_helper.from_array(np.array([600, 1024, 1024], np.int64), "s")])
    message = _refused(big, tmp_path / "big", "maxStorageBufferBindingSize")
    assert "2.34 GiB" in message and "beyond the 2 GiB" in message
    fits = _save(tmp_path, nodes, [x], [y], [numpy_helper.from_array(np.array([150, 1024, 1024], np.int64), "s")],
                 name="fits")
    assert (kiln.compile(str(fits), str(tmp_path / "fits"), validate=False) / "manifest.json").exists()


@pytest.mark.parametrize("kind", ["ConstantOfShape", "Range", "RandomNormal", "Tile"])
def test_huge_constants_are_refused_before_allocating(tmp_path, kind):
    """A constant the compiler would fold on the host beyond 2 GiB (here 373 GiB or more) is a one-line error naming
    the node, raised before anything is allocated (the test would run out of memory otherwise)."""
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    shape = np.array([100000, 100000, 10], np.int64)
    if kind == "ConstantOfShape":
        nodes = [helper.make_node("ConstantOfShape", ["s"], ["c"],
                                  value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0]))]
        inits = [numpy_helper.from_array(shape, "s")]
    elif kind == "Range":
        nodes = [helper.make_node("Range", ["a", "b", "d"], ["r"]), helper.make_node("Cast", ["r"], ["c"], to=1)]
        inits = [numpy_helper.from_array(np.array(v, np.int64), n) for v, n in ((0, "a"), (10**11, "b"), (1, "d"))]
    elif kind == "RandomNormal":
        nodes = [helper.make_node("RandomNormal", [], ["c"], shape=shape.tolist(), seed=1.0)]
        inits = []
    else:
        nodes = [helper.make_node("Tile", ["w", "s"], ["c"])]
        inits = [numpy_helper.from_array(np.ones((1, 1, 1), np.float32), "w"), numpy_helper.from_array(shape, "s")]
    nodes.append(helper.make_node("ReduceSum", ["c"], ["y"], keepdims=0))
    path = _save(tmp_path, nodes, [], [y], inits, name=kind.lower())
    # (random draws are made on the device: refused for their buffer, before anything is allocated too)
    _refused(path, tmp_path / "out", "beyond the 2 GiB a WebGPU storage buffer" if kind == "RandomNormal"
             else "beyond the 2 GiB Kiln allows a tensor")


def _endless_wasm_package(tmp_path, where: str = "kernels"):
    """The tiny relu-matmul package with its wasm modules (single-threaded and threaded) replaced by ones that loop for
    ever, in every kernel or (``where="start"``) in a start function that instantiation runs; checksums made to
    match, as a hostile compiler would."""
    save_tiny_relu_matmul(tmp_path / "m.onnx", np.ones((2, 3), np.float32))
    pkg = kiln.compile(tmp_path / "m.onnx", tmp_path / "pkg", target="webgpu,wasm")
    m = read_manifest(pkg)
    tgt = m["targets"]["wasm"]
    pages = tgt["memory"]["pages"]
    body = "(loop $l (br $l))" if where == "kernels" else ""
    kernels = "".join(f'(func (export "{k["export"]}") {"(param i32) " * (k["params"] + 2)}{body})'
                      for k in tgt["kernels"])
    start = '(func $s (loop $l (br $l))) (start $s)' if where == "start" else ""
    memories = {tgt["module"]: f'(memory (export "memory") {pages})'}
    if tgt.get("threads"):
        most = tgt["memory"].get("max_pages", pages)
        memories[tgt["threads"]["module"]] = f'(import "env" "memory" (memory {pages} {most} shared))'
    # (the threaded module's workers each take a stack: kiln_worker_stack and __stack_pointer, docs/package-format.md)
    stacks = '(global (export "__stack_pointer") (mut i32) (i32.const 65536)) ' \
             '(func (export "kiln_worker_stack") (param i32) (result i32) (i32.const 65536))'
    for path, memory in memories.items():
        module = pkg / path
        extra = stacks if path != tgt["module"] else ""
        module.write_bytes(wasmtime.wat2wasm(f"(module {memory} {kernels} {extra} {start})"))
        entry = tgt if path == tgt["module"] else tgt["threads"]
        entry["sha256"], entry["bytes"] = sha256_file(module), module.stat().st_size
        for f in m["files"]:
            if f["path"] == path:
                f.update(bytes=entry["bytes"], sha256=entry["sha256"])
    write_manifest(pkg, m)
    return pkg


def test_an_endless_wasm_kernel_is_stopped_by_the_time_limit(tmp_path):
    """A package whose wasm module loops forever (a damaged or hostile module; its checksums made to match) ends its
    run in a KilnError naming the time limit, within a few ticks of it, run after run: never a hang."""
    pkg = _endless_wasm_package(tmp_path)
    session = kiln.load(pkg, target="wasm", timeout_s=0.5)
    # (sessions share the process's engine, which lives as long as the process: the epoch ticker once advanced an
    # engine per session that the garbage collector could be freeing, a segmentation fault in the full suite)
    assert kiln.load(pkg, target="wasm").engine is session.engine
    for _ in range(2):
        start = time.perf_counter()
        with pytest.raises(KilnError, match=r"took longer than its time limit of 0.5 s and was stopped"):
            session.run({"x": np.ones((1, 2), np.float32)})
        assert time.perf_counter() - start < 5
    for bad in (0, float("inf"), "5"):
        with pytest.raises(KilnError, match="timeout_s must be a finite number of seconds above 0"):
            kiln.load(pkg, target="wasm", timeout_s=bad)


#: loads the package on wasm with bad time limits, then with 0.5 s and runs it twice, on one thread and on two; each
#: outcome with its milliseconds, and how often a 50 ms interval fired meanwhile (the page's thread stays free)
ENDLESS_IN_THE_PAGE = """async () => {
  const kiln = await import('./kiln.js');
  const outcome = async (work) => {
    const start = performance.now();
    try { await work(); return {ok: true}; }
    catch (e) { return {ok: false, name: e.name, message: e.message, ms: performance.now() - start}; }
  };
  const bad = [];
  for (const timeoutMs of [0, -5, Infinity, '5']) bad.push(await outcome(() => kiln.load('./', {target: 'wasm', timeoutMs})));
  const x = new kiln.Tensor('float32', new Float32Array(2), [1, 2]);
  const out = {bad, isolated: crossOriginIsolated, threads: {}};
  for (const threads of [1, 2]) {
    let ticks = 0;
    const timer = setInterval(() => { ticks += 1; }, 50);
    const loaded = await outcome(async () => { out.session = await kiln.load('./', {target: 'wasm', timeoutMs: 500, threads}); });
    const runs = [];
    if (loaded.ok) {
      for (let i = 0; i < 2; i++) runs.push(await outcome(() => out.session.run({x})));
      runs.push(await outcome(() => out.session.time({x}, {repeat: 2})));
      out.session.destroy();
    }
    clearInterval(timer);
    out.threads[threads] = {loaded, runs, ticks};
  }
  delete out.session;
  return out;
}"""


@pytest.mark.browser
@pytest.mark.parametrize("where", ["kernels", "start"])
def test_an_endless_wasm_module_is_stopped_in_the_browser(browser, tmp_path, where):
    """kiln.js runs wasm in workers, never on the page's thread: an endless kernel (or start function) is stopped at
    load's ``timeoutMs``, the run (or load) rejects with a one-line DeviceError naming the limit, later calls say the
    session was stopped, and the page's thread stays free meanwhile; on one thread and on two (shared memory)."""
    from browser import evaluate_in_package

    got = evaluate_in_package(browser, _endless_wasm_package(tmp_path, where), ENDLESS_IN_THE_PAGE)
    assert [b["name"] for b in got["bad"]] == ["KilnError"] * 4, got["bad"]
    assert all("timeoutMs must be a finite number of milliseconds above 0, or null" in b["message"] for b in got["bad"])
    assert got["isolated"]
    limit = "the wasm module ran longer than its time limit of 0.5 s and was stopped"
    for threads, case in got["threads"].items():
        outcomes = [case["loaded"]] if where == "start" else case["runs"]
        assert case["loaded"]["ok"] == (where != "start"), (threads, case)
        assert len(outcomes) == (1 if where == "start" else 3), (threads, case)
        for o in outcomes:
            assert not o["ok"] and o["name"] == "DeviceError" and limit in o["message"], (threads, o)
            assert "\n" not in o["message"]
        assert 400 < outcomes[0]["ms"] < 5000, (threads, outcomes[0])
        assert all(o["ms"] < 100 for o in outcomes[1:]), (threads, outcomes)  # (stopped: refused at once)
        assert case["ticks"] >= 6, (threads, case)  # (about 10 a half second: the page's thread was free)
