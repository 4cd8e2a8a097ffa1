"""Recording a plan's dispatches from a loop in C (kiln.runtime.record): the same results as the Python loop, bit
for bit, over run-time dims that skip steps and switch a step's kernel; bad arguments refused."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from test_fuzz_gguf import tiny_llama
from test_horizontal import _branches

import kiln
from kiln.codegen.webgpu.build import MAX_FUSED_KEYS
from kiln.compiler import compile_model
from kiln.runtime import record


def _feeds(ids, cached=0):
    return {"input_ids": np.asarray(ids, np.int64)[None], "past_sequence_length": np.array([cached], np.int64)}


@pytest.fixture(scope="module")
def tiny_decoder(tmp_path_factory):
    """A one-layer Llama package (webgpu) whose context passes kiln.codegen.webgpu.build.MAX_FUSED_KEYS: its decode
    step's attention switches from one kernel to three (a step's variant), and steps with no work are skipped."""
    tmp = tmp_path_factory.mktemp("record")
    pkg = tmp / "tiny"
    context = MAX_FUSED_KEYS + 80
    gguf_path = tiny_llama(tmp / "tiny.gguf", {"llama.context_length": (context, gguf.GGUFValueType.UINT32)})
    compile_model(gguf_path, pkg, max_context=context, target="webgpu", validate=False)
    return pkg


def _run_steps(pkg) -> tuple[list[np.ndarray], object]:
    """Logits of a prompt, then of one-token steps at positions on both sides of the attention's switch."""
    session = kiln.load(pkg)
    out = [session.run(_feeds([3, 0, 1]))["logits"]]
    k = MAX_FUSED_KEYS
    out += [session.run(_feeds([t % 8], pos))["logits"] for t, pos in enumerate((3, 100, k - 2, k - 1, k, k + 50, 4))]
    out.append(session.run(_feeds([3, 4, 5, 6, 2], 7))["logits"])  # (a prompt again: other steps run)
    return out, session


def test_c_loop_records_what_the_python_loop_does(tiny_decoder, monkeypatch):
    """The C loop is built here (CI has ziglang) and used by the session; its logits equal the Python loop's bit for
    bit at every step, the dispatches it reports are the steps with workgroups, and a static package's outputs equal
    too."""
    assert record.recorder() is not None, "the C loop did not build"
    got, session = _run_steps(tiny_decoder)
    plan = session._raw[4]
    assert plan is not None and plan.steps == len(session.steps)
    session._bind_dims(_feeds([1], 100))
    early = session._choice
    dispatch, _ = session._bind_dims(_feeds([1], MAX_FUSED_KEYS + 50))
    assert session._choice != early  # (the attention's kernels switched between the two)
    assert session._counts_table(dispatch).tolist() == [list(d) for d in dispatch]
    enc = session.device.create_command_encoder()
    cpass = enc.begin_compute_pass()
    assert plan.record(cpass, session._counts_table(dispatch)) == sum(1 for d in dispatch if d[0]) < len(dispatch)
    cpass.end()
    with monkeypatch.context() as m:
        m.setattr(record, "recorder", lambda: None)
        want, py_session = _run_steps(tiny_decoder)
        assert py_session._raw[4] is None
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert np.array_equal(g, w), i


def test_c_loop_on_a_static_package(tmp_path, rng, monkeypatch):
    """A package of fixed shapes (its counts made once, at load) gives the Python loop's outputs through the C
    loop."""
    path = _branches(tmp_path / "branches.onnx")
    compile_model(path, tmp_path / "pkg", target="webgpu", validate=False)
    x = rng.standard_normal((2, 48)).astype(np.float32)
    outs = {}
    for c in (True, False):
        with monkeypatch.context() as m:
            if not c:
                m.setattr(record, "recorder", lambda: None)
            s = kiln.load(tmp_path / "pkg")
            outs[c] = [s.run({"x": x}) for _ in range(2)]  # (the second run records through the raw API)
            assert (s._raw[4] is not None) == c
    for a, b in zip(outs[True], outs[False]):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_plan_record_refuses_bad_counts(tiny_decoder):
    """Counts of another dtype or shape, or steps outside the plan, are a one-line ValueError, nothing recorded."""
    session = kiln.load(tiny_decoder)
    session.run(_feeds([3, 0, 1]))
    session.run(_feeds([1], 3))
    plan = session._raw[4]
    enc = session.device.create_command_encoder()
    cpass = enc.begin_compute_pass()
    n = plan.steps
    with pytest.raises(ValueError, match=rf"must be C-contiguous uint32 \[{n}, 3\], not int64"):
        plan.record(cpass, np.zeros((n, 3), np.int64))
    with pytest.raises(ValueError, match=rf"not uint32 \[{n - 1}, 3\]"):
        plan.record(cpass, np.zeros((n - 1, 3), np.uint32))
    with pytest.raises(ValueError, match=r"C-contiguous"):
        plan.record(cpass, np.zeros((3, n), np.uint32).T)
    with pytest.raises(ValueError, match=rf"steps \[2, {n + 1}\) are not within the plan's {n}"):
        plan.record(cpass, np.zeros((n, 3), np.uint32), 2, n + 1)
    assert plan.record(cpass, np.zeros((n, 3), np.uint32)) == 0
    cpass.end()


def test_without_a_compiler_the_python_loop_runs(monkeypatch):
    """``KILN_RECORD=python``, or no C compiler (neither ziglang nor a ``cc`` on PATH): :func:`record.recorder` gives
    None (the runtime then records from Python, as test_c_loop_records_what_the_python_loop_does checks); the missing
    compiler is a one-line KilnError from :func:`record.build`."""
    import sys

    from kiln.errors import KilnError

    compiler = record._compiler
    try:
        record.recorder.cache_clear()
        monkeypatch.setenv("KILN_RECORD", "python")
        assert record.recorder() is None
        record.recorder.cache_clear()
        monkeypatch.delenv("KILN_RECORD")
        monkeypatch.setitem(sys.modules, "ziglang", None)  # (import ziglang fails)
        monkeypatch.setattr(record.shutil, "which", lambda name: None)
        with pytest.raises(KilnError, match=r"^no C compiler for the dispatch loop \(pip install ziglang\)$"):
            compiler()
        monkeypatch.setenv("KILN_CACHE", "/nonexistent-kiln-cache")  # (nothing written to the real cache)
        with pytest.raises(KilnError, match="no C compiler for the dispatch loop"):
            record.build()
        assert record.recorder() is None
    finally:
        record.recorder.cache_clear()
