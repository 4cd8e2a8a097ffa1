"""The native cpu target (C kernels built for this machine, loaded with ctypes): per-op parity with onnxruntime,
real models, threads, errors.

The per-op cases are tests/test_wasm.py's (a cross-section of every op family, every unary math function, the
layouts the vectoriser treats differently, and the first case of every per-op test function), run through the
same helper (``opcheck.check_op``) on the ``cpu`` target; every per-op test passes there too:
``KILN_OP_TARGETS=cpu python -m pytest tests/test_ops.py tests/test_ops_breadth.py tests/test_dtypes.py``.
"""

from __future__ import annotations

import json
import os

import numpy as np
import onnxruntime as ort
import opcheck
import pytest
from conftest import CHELSEA, MOBILENET, PPOCR_CASES, SHARED_MODELS
from test_wasm import CASES, IMAGES, _case_id

import kiln
from kiln.errors import PackageError


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_op_on_cpu(rng, monkeypatch, case):
    monkeypatch.setattr(opcheck, "TARGETS", ("cpu",))
    fn, kwargs = case
    fn(rng, **kwargs)


def _ort(path, feeds, threads: int = 0):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.fixture(scope="module")
def mobilenet_cpu(tmp_path_factory):
    return kiln.compile(str(MOBILENET), str(tmp_path_factory.mktemp("cpu") / "mobilenet_v2"), target="cpu")


def test_mobilenet_reference_images(mobilenet_cpu, reference_npz):
    session = kiln.load(mobilenet_cpu, target="cpu", poison=True)
    for name in IMAGES:
        logits = session.run({"input": reference_npz[f"{name}_input"]})["logits"]
        assert np.abs(logits - reference_npz[f"{name}_logits"]).max() <= 1e-3, name
        assert logits.argmax() == reference_npz[f"{name}_logits"].argmax()


def test_mobilenet_one_and_several_threads_agree(mobilenet_cpu, rng):
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    expected = _ort(MOBILENET, {"input": x})[0]
    one = kiln.load(mobilenet_cpu, target="cpu", threads=1, poison=True)
    assert one.adapter_info()["backend_type"] == "cpu (C, 1 thread)"
    got1 = one.run({"input": x})["logits"]
    np.testing.assert_allclose(got1, expected, atol=1e-4, rtol=0)
    for threads in (2, 3, 7):  # more threads than cores, and ranges that split vectors
        got = kiln.load(mobilenet_cpu, target="cpu", threads=threads, poison=True).run({"input": x})["logits"]
        np.testing.assert_array_equal(got, got1)  # the same arithmetic, split differently


def test_manifest_cpu_section(mobilenet_cpu):
    m = json.loads((mobilenet_cpu / "manifest.json").read_text())
    tgt = m["targets"]["cpu"]
    assert (mobilenet_cpu / tgt["source"]).read_text().startswith("// Kiln kernels for the CPU")
    offsets = tgt["memory"]["offsets"]
    assert len(offsets) == len(m["buffers"]) and all(o % tgt["memory"]["align"] == 0 for o in offsets)
    assert all(o + b["bytes"] <= tgt["memory"]["bytes"] for o, b in zip(offsets, m["buffers"]))
    assert len(tgt["plan"]) == 54 and all(s["kernel"] < len(tgt["kernels"]) for s in tgt["plan"])


def test_minilm_matches_onnxruntime(tmp_path):
    path = SHARED_MODELS / "all_minilm_l6_v2.onnx"
    with np.load(SHARED_MODELS / "reference" / "all_minilm_l6_v2_inputs.npz") as z:
        feeds = {k: z[k] for k in z.files}
    batch, seq = feeds["input_ids"].shape
    pkg = kiln.compile(path, tmp_path / "minilm", target="cpu", dims={"batch": batch, "seq": seq})
    hidden = kiln.load(pkg, target="cpu", poison=True).run(feeds)["last_hidden_state"]
    np.testing.assert_allclose(hidden, _ort(path, feeds)[0], atol=1e-4, rtol=0)


@pytest.mark.parametrize("name,shape,dims", PPOCR_CASES)
def test_ppocr_models_match_onnxruntime(tmp_path, rng, name, shape, dims):
    path = SHARED_MODELS / f"{name}.onnx"
    x = rng.uniform(-1, 1, size=shape).astype(np.float32)
    pkg = kiln.compile(path, tmp_path / "pkg", target="cpu", dims=dims)
    got = list(kiln.load(pkg, target="cpu", poison=True).run({"x": x}).values())
    for g, e in zip(got, _ort(path, {"x": x})):
        np.testing.assert_allclose(g, e, atol=1e-4, rtol=0)


def test_library_is_built_once_per_machine(mobilenet_cpu, tmp_path, monkeypatch):
    from kiln.runtime import cpu

    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "cache"))
    kiln.load(mobilenet_cpu, target="cpu", threads=1)
    libs = list((tmp_path / "cache" / "cpu").glob("kiln-*.so"))
    assert len(libs) == 1
    stamp = libs[0].stat().st_mtime_ns
    assert cpu.build_library((mobilenet_cpu / "kernels" / "kiln-cpu.c").read_text()) == libs[0]
    assert libs[0].stat().st_mtime_ns == stamp  # from the cache, not compiled again


def test_cpu_target_missing_or_corrupted_is_a_clear_error(mobilenet_package, mobilenet_cpu, tmp_path):
    with pytest.raises(PackageError, match="no 'cpu' target .*--target cpu"):
        kiln.load(mobilenet_package, target="cpu")
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(mobilenet_cpu, bad)
    src = bad / "kernels" / "kiln-cpu.c"
    src.write_text(src.read_text().replace("kiln_step", "kiln_stpe", 1))
    with pytest.raises(PackageError, match="checksum mismatch"):
        kiln.load(bad, target="cpu")
    os.remove(src)
    with pytest.raises(PackageError, match="kiln-cpu.c is missing"):
        kiln.load(bad, target="cpu")


def test_cpu_refuses_what_it_cannot_build(tmp_path):
    with pytest.raises(kiln.KilnError, match="--precision fp16 is for the webgpu target only"):
        kiln.compile(str(MOBILENET), str(tmp_path / "p"), target="cpu", precision="fp16")


def test_cli_runs_the_cpu_target(mobilenet_cpu):
    from click.testing import CliRunner

    from kiln.cli import main

    r = CliRunner().invoke(main, ["run", str(mobilenet_cpu), "--target", "cpu", "--threads", "2", "--image",
                                  str(CHELSEA), "--repeat", "2", "--warmup", "0"])
    assert r.exit_code == 0, r.output
    assert "Egyptian cat" in r.output.splitlines()[0] and "cpu (C, 2 threads)" in r.output
    r = CliRunner().invoke(main, ["info", str(mobilenet_cpu)])
    assert r.exit_code == 0 and "target cpu: 33 kernels, 54 calls" in r.output  # one a batch>1 variant, r.output
    r = CliRunner().invoke(main, ["run", str(mobilenet_cpu), "--threads", "2", "--repeat", "1"])
    assert r.exit_code != 0 and "--threads is for the wasm and cpu targets" in r.output


def test_thread_pool_survives_fork_and_serves_two_sessions_at_once(mobilenet_cpu, rng):
    """The library's worker threads are kept between runs: a forked child starts its own, and two sessions of one
    package (one library, one pool) run from two Python threads at once give their own, correct results."""
    from concurrent.futures import ThreadPoolExecutor

    xs = [rng.standard_normal((1, 3, 224, 224)).astype(np.float32) for _ in range(2)]
    expected = [_ort(MOBILENET, {"input": x})[0] for x in xs]
    sessions = [kiln.load(mobilenet_cpu, target="cpu", threads=2) for _ in xs]
    first = sessions[0].run({"input": xs[0]})["logits"]
    pid = os.fork()
    if pid == 0:  # the child: the parent's workers do not exist here
        got = kiln.load(mobilenet_cpu, target="cpu", threads=2).run({"input": xs[0]})["logits"]
        os._exit(0 if np.array_equal(got, first) else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    with ThreadPoolExecutor(2) as pool:
        for _ in range(3):
            outs = list(pool.map(lambda sx: sx[0].run({"input": sx[1]})["logits"], zip(sessions, xs)))
            for got, e in zip(outs, expected):
                np.testing.assert_allclose(got, e, atol=1e-4, rtol=0)
