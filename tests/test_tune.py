"""Auto-tuning: the search space, the tuning database, and a tiny local tuning run on lavapipe.

The end-to-end run tunes a small Conv + MatMul model with a budget of a few candidates per
kernel through ``kiln tune``, compiles it with ``--tuning-db``, and checks the tuned package
against onnxruntime. (The RPC half, in headless Chromium, is in test_tune_rpc.py.)
"""

from __future__ import annotations

import json
import random

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from kiln.cli import main
from kiln.codegen.webgpu import wgsl
from kiln.errors import KilnError
from kiln.kernels import elementwise, library
from kiln.runtime.kernel import KernelRunner
from kiln.te.compute import inline, placeholder
from kiln.te.lower import lower
from kiln.te.schedule import Schedule, Split, default_schedule
from kiln.tune.db import TunedSchedule, TuningDB, adapter_identity, code_digest, kernel_signature
from kiln.tune.measure import Measurement, matches, sample_indices
from kiln.tune.search import Search
from kiln.tune.space import Limits, SearchSpace

CONV = {"strides": (1, 1), "dilations": (1, 1), "pads": (1, 1, 1, 1), "group": 1}
NVIDIA = {"vendor": "nvidia", "architecture": "hopper", "device": "NVIDIA H100 80GB HBM3", "description": "580.95"}
LLVMPIPE = {"vendor": "llvmpipe", "architecture": "", "device": "llvmpipe (LLVM 15.0.6, 256 bits)",
            "description": "Mesa 22.3.6 (LLVM 15.0.6)"}


def conv_expr(cin=16, cout=32, hw=14, bias=True):
    x, w = placeholder((1, cin, hw, hw), name="x"), placeholder((cout, cin, 3, 3), name="w")
    t = library.build("Conv", [x, w], CONV, (1, cout, hw, hw), "conv")
    if bias:
        t = elementwise.binary("Add", t, placeholder((cout, 1, 1), name="b"), (1, cout, hw, hw))
    return inline(t)


def matmul_expr(m=1, k=512, n=100):
    return inline(library.build("MatMul", [placeholder((m, k)), placeholder((k, n))], {}, (m, n), "fc"))


# ---------------------------------------------------------------------- search space
def test_space_holds_only_valid_schedules_and_rejects_invalid_ones():
    conv = SearchSpace(conv_expr())
    points = list(conv)
    assert len(points) > 1000 and all(conv.check(s) is None for s in points)
    for s in points[::97]:
        assert s.workgroup_size <= 256
        accs = conv.tile(s) * conv.n_reductions
        assert accs <= 64
        if s.reduce_lanes > 1:
            assert accs * s.workgroup_size * 4 <= 16384
    assert "workgroup memory" in conv.check(Schedule(256, splits=(Split(1, 4), Split(3, 8)), reduce_lanes=4))
    assert "outside" in conv.check(Schedule(512))
    small = SearchSpace(conv_expr(), limits=Limits(accumulators=16, unrolled_updates=64))
    assert "accumulators" in small.check(Schedule(64, splits=(Split(1, 8), Split(3, 4))))
    assert "unrolled" in small.check(Schedule(64, splits=(Split(1, 4), Split(3, 4)), unroll=9))
    assert small.check(Schedule(64, splits=(Split(1, 4), Split(3, 4)), unroll=4)) is None
    assert "not tileable" in conv.check(Schedule(64, splits=(Split(0, 2),)))  # batch axis of extent 1
    assert "twice" in conv.check(Schedule(64, splits=(Split(1, 2), Split(1, 4))))
    # every default schedule lies in the space
    for t in (conv_expr(), matmul_expr(), conv_expr(3, 8, 9, bias=False)):
        for cls in ("gpu", "cpu"):
            assert SearchSpace(t).check(default_schedule(t, device_class=cls)) is None
    # no lanes on CPU adapters
    assert SearchSpace(matmul_expr(), lanes=False).lanes == (1,)
    assert not conv.trivial()
    assert max(SearchSpace(matmul_expr()).lanes) == 256  # (up to a workgroup, as default_schedule gives few tiles)
    assert max(SearchSpace(matmul_expr(k=96)).lanes) == 64  # (no lane without an iteration of the reduction)


def test_mutation_crossover_and_sampling_stay_valid():
    rng = random.Random(1)
    space = SearchSpace(conv_expr())
    s = default_schedule(space.t)
    seen = {s}
    for _ in range(300):
        child = space.mutate(s, rng)
        assert space.valid(child)
        other = space.sample(rng)
        assert space.valid(other)
        assert space.valid(space.crossover(child, other, rng))
        seen.add(child)
        s = child
    assert len(seen) > 50


@pytest.mark.parametrize("which", ["conv", "matmul"])
def test_sampled_schedules_compute_the_same_numbers(which, rng):
    t = conv_expr(6, 10, 7) if which == "conv" else matmul_expr(3, 40, 9)
    space = SearchSpace(t)
    pick = random.Random(2)
    inputs = [rng.standard_normal(p.shape).astype(np.float32) for p in lower(t, Schedule()).inputs]
    n = lower(t, Schedule()).params[-1].size
    expected = KernelRunner(wgsl.render(lower(t, Schedule())), inputs, n, lower(t, Schedule()).dispatch).run()
    for s in {space.sample(pick) for _ in range(6)}:
        k = lower(t, s)
        got = KernelRunner(wgsl.render(k), inputs, n, k.dispatch).run()
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4, err_msg=str(s))


def test_search_proposes_unmeasured_valid_schedules_and_ranks_with_its_model():
    space = SearchSpace(matmul_expr())
    default = default_schedule(space.t)
    search = Search(space, default, seed=3)
    first = search.propose(8)
    assert first[0] == default and len(set(first)) == 8 and all(space.valid(s) for s in first)
    for s in first:  # a made-up cost: more invocations are faster
        search.record(s, 1.0 / space.invocations(s))
    search.record(space.sample(random.Random(5)), None, "failed to compile")
    nxt = search.propose(8)
    assert not set(nxt) & set(search.trials) and len(nxt) == 8
    assert search.model.w is not None  # the cost model ranked this batch
    assert search.best.ms == min(1.0 / space.invocations(s) for s in first)


def test_output_check_catches_wrong_and_unwritten_outputs():
    y = np.linspace(-1, 1, 10000).astype(np.float32)
    idx = sample_indices(y.size)
    assert len(idx) == 4096 and idx[-1] < y.size and np.all(np.diff(idx) > 0)

    def meas(a):
        return Measurement(1.0, a[idx], float(a.astype(np.float64).sum()), float(np.abs(a).astype(np.float64).sum()))

    ref = meas(y)
    assert matches(meas(y * (1 + 1e-6)), ref)
    wrong = y.copy()
    wrong[idx[7] + 1] += 3  # between sampled elements: caught by the sums
    assert not matches(meas(wrong), ref)
    unwritten = y.copy()
    unwritten[5] = np.nan
    assert not matches(meas(unwritten), ref)
    assert not matches(Measurement(None, error="shader error"), ref)


def test_local_measurer_checks_every_candidate_then_times_them_warm(rng, monkeypatch):
    """LocalMeasurer makes and checks every candidate's pipeline, then runs the first one for ``warmup_s`` (a GPU's
    clocks ramp up; 0 on lavapipe, set here), then times each: results stay in the candidates' order, a shader that
    fails is an error in its place, and the warm-up runs before the first timed pass."""
    import time

    from kiln.tune.measure import Candidate, LocalMeasurer

    t = matmul_expr(3, 40, 9)
    space = SearchSpace(t)
    base = lower(t, Schedule())
    inputs = [rng.standard_normal(p.shape).astype(np.float32) for p in base.inputs]
    n = base.params[-1].size
    other = lower(t, space.sample(random.Random(4)))
    cands = [Candidate(wgsl.render(base), base.dispatch), Candidate("fn main( {", (1, 1, 1)),
             Candidate(wgsl.render(other), other.dispatch)]
    m = LocalMeasurer()
    assert m.warmup_s == (0.0 if m.is_cpu else 1.0)
    m.warmup_s = 0.3
    passes = []
    timed = m._time
    monkeypatch.setattr(m, "_time", lambda *a: passes.append((time.perf_counter(), a[-1])) or timed(*a))
    res = m.measure(inputs, n, cands, batch=1, repeat=2)
    assert res[1].ms is None and res[1].error and res[0].ms > 0 and res[2].ms > 0
    assert matches(res[2], res[0])
    warmups = [t for t, repeat in passes if repeat == 1]
    first_timed = next(t for t, repeat in passes if repeat == 2)
    assert warmups and first_timed - warmups[0] >= 0.3 and len(passes) == len(warmups) + 2


# ---------------------------------------------------------------------- database
def test_signature_is_stable_and_tells_kernels_apart():
    a, b = conv_expr(), conv_expr()  # rebuilt: fresh variable and tensor names
    assert kernel_signature(a) == kernel_signature(b)
    assert kernel_signature(conv_expr(hw=15)) != kernel_signature(a)  # shape
    assert kernel_signature(conv_expr(bias=False)) != kernel_signature(a)  # fused epilogue
    x = placeholder((4, 5), "int32")
    assert kernel_signature(inline(elementwise.unary("Relu", x, {}))) != kernel_signature(
        inline(elementwise.unary("Relu", placeholder((4, 5)), {})))  # dtype


def test_database_round_trip_resume_and_adapter_matching(tmp_path):
    path = tmp_path / "tuning.json"
    db = TuningDB(path)
    t = conv_expr()
    sig = kernel_signature(t)
    best = Schedule(128, splits=(Split(1, 4, True), Split(3, 2)), unroll=9)
    db.put(sig, adapter_identity(NVIDIA), best, best_ms=0.02, default_ms=0.03, trials=64,
           clock="timestamp-query", device_class="gpu", ops="Conv+Add", shape=[1, 32, 14, 14],
           code=code_digest(t, best), default_code=code_digest(t, default_schedule(t)))
    db.put(sig, adapter_identity(LLVMPIPE), Schedule(), best_ms=1.0, default_ms=1.0, trials=8, clock="wall",
           device_class="cpu")
    db.save()
    assert not list(tmp_path.glob(".tuning.json.*"))  # the temporary file was renamed
    text = path.read_text()
    assert text.count("\n") > 20 and json.loads(text)["format"] == "kiln-tuning"
    again = TuningDB(path)
    rec = again.get(sig, adapter_identity(NVIDIA))
    assert Schedule.from_json(rec["schedule"]) == best and rec["speedup"] == 1.5 and rec["trials"] == 64
    assert again.get("0" * 24, adapter_identity(NVIDIA)) is None
    assert again.get(sig, adapter_identity({**NVIDIA, "description": "581.00"})) is None  # another driver
    assert again.match_adapter("nvidia h100")["device"] == NVIDIA["device"]
    assert again.match_adapter("amd") is None
    with pytest.raises(KilnError, match="matches 2 adapters"):
        again.match_adapter("e")  # in both keys
    choose = again.scheduler(again.match_adapter("hopper"), default_schedule)
    tuned = choose(conv_expr())
    assert isinstance(tuned, TunedSchedule) and tuned.to_json() == best.to_json() and tuned.tuning["speedup"] == 1.5
    other = matmul_expr()
    assert choose(other) == default_schedule(other) and not isinstance(choose(other), TunedSchedule)
    assert choose.stale == []
    path.write_text('{"format": "kiln-tuning", "version": 99, "records": []}')
    with pytest.raises(KilnError, match="version 99"):
        TuningDB(path)
    path.write_text("[1, 2")
    with pytest.raises(KilnError, match="not a readable"):
        TuningDB(path)


def test_stale_records_are_not_used(tmp_path):
    """A record holds for the code it measured: one whose schedule, or the default it was measured against, lowers
    to other code today (another Kiln), or that predates the digests, falls back to the default and is reported."""
    t = conv_expr()
    sig, best, default = kernel_signature(t), Schedule(128, splits=(Split(1, 4, True), Split(3, 2)), unroll=9), \
        default_schedule(t)
    assert code_digest(conv_expr(), best) == code_digest(t, best) != code_digest(t, default)  # fresh names: equal
    cases = {"current": (code_digest(t, best), code_digest(t, default)),
             "schedule's code changed": ("0" * 16, code_digest(t, default)),
             "default's code changed": (code_digest(t, best), "0" * 16), "no digests": ("", "")}
    for case, (code, default_code) in cases.items():
        db = TuningDB(tmp_path / f"{len(case)}.json")
        db.put(sig, adapter_identity(NVIDIA), best, best_ms=0.02, default_ms=0.03, trials=64, clock="wall",
               device_class="gpu", code=code, default_code=default_code)
        choose = db.scheduler(adapter_identity(NVIDIA), default_schedule)
        chosen = [choose(conv_expr()) for _ in range(2)]
        if case == "current":
            assert all(isinstance(c, TunedSchedule) and c.to_json() == best.to_json() for c in chosen), case
            assert choose.stale == [], case
        else:
            assert all(c == default and not isinstance(c, TunedSchedule) for c in chosen), case
            assert [r["kernel"] for r in choose.stale] == [sig], case  # reported once per kernel


# ---------------------------------------------------------------------- a tiny local tuning run
def small_model(path, batch=1):
    """Conv (8 -> 16 channels, 3x3) + bias + Relu, then Flatten and MatMul to 10 outputs (``batch``: 1, or a name for
    a symbolic batch dim, as exported classifiers have)."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    m = (rng.standard_normal((16 * 6 * 6, 10)) * 0.05).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("MatMul", ["f", "m"], ["y"])]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])],
                              [numpy_helper.from_array(a, n) for a, n in ((w, "w"), (b, "b"), (m, "m"))])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_local_tuning_run_and_tuned_package(tmp_path, rng):
    import onnxruntime as ort

    from kiln.runtime.native import Session

    model = small_model(tmp_path / "small.onnx")
    db = tmp_path / "tuning.json"
    runner = CliRunner()
    out = runner.invoke(main, ["tune", str(model), "--db", str(db), "--trials", "4", "--jobs", "1",
                               "--json", str(tmp_path / "report.json")])
    assert out.exit_code == 0, out.output
    records = json.loads(db.read_text())["records"]
    assert len(records) == 2 and {r["ops"] for r in records} == {"Conv+Add+Relu", "MatMul"}
    assert all(r["trials"] == 4 and r["best_ms"] <= r["default_ms"] * 1.5 for r in records)
    report = json.loads((tmp_path / "report.json").read_text())
    assert all(r["status"] == "tuned" for r in report)
    # resuming with the same budget measures nothing new
    again = runner.invoke(main, ["tune", str(model), "--db", str(db), "--trials", "4", "--jobs", "1"])
    assert again.exit_code == 0 and "recorded" in again.output, again.output
    assert [r["date"] for r in json.loads(db.read_text())["records"]] == [r["date"] for r in records]
    # a larger budget continues from the records
    more = runner.invoke(main, ["tune", str(model), "--db", str(db), "--trials", "5", "--jobs", "1"])
    assert more.exit_code == 0, more.output
    assert [r["trials"] for r in json.loads(db.read_text())["records"]] == [5, 5]
    # a record measured on code this Kiln no longer generates is searched again, not skipped, and compiles warn
    doc = json.loads(db.read_text())
    doc["records"][0]["code"] = "0" * 16
    db.write_text(json.dumps(doc))
    out = runner.invoke(main, ["compile", str(model), "-o", str(tmp_path / "stale"), "--tuning-db", str(db),
                               "--device-class", "cpu"])
    assert out.exit_code == 0 and "1 tuned" in out.output and "1 tuning record of" in out.output, out.output
    again = runner.invoke(main, ["tune", str(model), "--db", str(db), "--trials", "5", "--jobs", "1",
                                 "--json", str(tmp_path / "report.json")])
    assert again.exit_code == 0, again.output
    report = json.loads((tmp_path / "report.json").read_text())
    assert sorted((r["status"], r.get("replaced_stale", False)) for r in report) == [("recorded", False),
                                                                                     ("tuned", True)]
    records = json.loads(db.read_text())["records"]
    assert len(records[0]["code"]) == 16 and records[0]["code"] != "0" * 16 and records[0]["trials"] == 5  # (the
    # whole budget again, and digests of what it measured)
    # compile with the records of this machine's adapter; the package is correct
    pkg = tmp_path / "pkg"
    out = runner.invoke(main, ["compile", str(model), "-o", str(pkg), "--tuning-db", str(db), "--device-class", "cpu"])
    assert out.exit_code == 0 and "2 tuned" in out.output, out.output
    kernels = json.loads((pkg / "manifest.json").read_text())["targets"]["webgpu"]["kernels"]
    assert all(k["tuned"] and k["tuning"]["speedup"] > 0 for k in kernels)
    info = runner.invoke(main, ["info", str(pkg)])
    assert "tuned: 2 of 2 kernels" in info.output
    x = rng.standard_normal((1, 8, 6, 6)).astype(np.float32)
    expected = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(Session(pkg, poison=True).run({"x": x})["y"], expected, rtol=1e-4, atol=1e-4)
    # bad arguments are refused with a message
    bad = runner.invoke(main, ["tune", str(model), "--db", str(db), "--device", "gpu0"])
    assert bad.exit_code == 2 and "expected 'local' or an RPC server" in bad.output
    bad = runner.invoke(main, ["compile", str(model), "-o", str(tmp_path / "p2"), "--adapter", "nvidia"])
    assert bad.exit_code == 2 and "--adapter needs --tuning-db" in bad.output
    (tmp_path / "notes.json").write_text("{}")
    bad = runner.invoke(main, ["compile", str(model), "-o", str(tmp_path / "p2"), "--tuning-db",
                               str(tmp_path / "notes.json")])
    assert bad.exit_code == 1 and "not a Kiln tuning database" in bad.output
    # another adapter's records are not used
    out = runner.invoke(main, ["compile", str(model), "-o", str(pkg), "--force", "--tuning-db", str(db),
                               "--adapter", "nvidia"])
    assert out.exit_code == 0 and "no records" in out.output and "0 tuned" in out.output, out.output


def test_tuned_package_of_a_model_with_an_unbound_batch(tmp_path, rng):
    """``kiln tune`` binds an unbound batch dim to 1 and records static shapes; ``kiln compile --tuning-db`` binds it
    too (with a warning) rather than making it a run-time dim whose kernels no record fits (it did: 0 tuned)."""
    import onnxruntime as ort

    from kiln.runtime.native import Session

    model = small_model(tmp_path / "small.onnx", batch="N")
    db = tmp_path / "tuning.json"
    runner = CliRunner()
    out = runner.invoke(main, ["tune", str(model), "--db", str(db), "--trials", "2", "--jobs", "1"])
    assert out.exit_code == 0, out.output
    pkg = tmp_path / "pkg"
    out = runner.invoke(main, ["compile", str(model), "-o", str(pkg), "--tuning-db", str(db), "--device-class", "cpu"])
    assert out.exit_code == 0 and "2 tuned" in out.output, out.output
    assert "dim N left unbound is bound to 1 (tuned schedules (--tuning-db)" in out.output
    assert json.loads((pkg / "manifest.json").read_text())["dims"] == {"N": 1}
    x = rng.standard_normal((1, 8, 6, 6)).astype(np.float32)
    expected = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(Session(pkg, poison=True).run({"x": x})["y"], expected, rtol=1e-4, atol=1e-4)
    # without the database the batch stays a run-time dim
    out = runner.invoke(main, ["compile", str(model), "-o", str(tmp_path / "plain"), "--device-class", "cpu"])
    assert out.exit_code == 0 and "bound to 1" not in out.output, out.output


def test_row_kernels_are_not_searched(tmp_path):
    """A row kernel (LayerNormalization then Softmax fused into one kernel a row on ``gpu``) is left at its default:
    the search space's schedules would lower it element by element, recomputing the row's reductions per output."""
    from kiln.tune.tuner import model_tasks

    g = helper.make_graph([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1),
                           helper.make_node("Softmax", ["y"], ["z"], axis=-1)], "ln_softmax",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 96])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [8, 96])],
                          [numpy_helper.from_array(np.ones(96, np.float32), "g"),
                           numpy_helper.from_array(np.zeros(96, np.float32), "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "ln.onnx")
    tasks, _, _ = model_tasks(tmp_path / "ln.onnx", {}, "gpu")
    assert len(tasks) == 1 and tasks[0].default.rows
    assert tasks[0].tunable and "row kernel" in tasks[0].tunable
    tasks, _, _ = model_tasks(tmp_path / "ln.onnx", {}, "cpu")  # no row kernels for cpu: three kernels, searched
    assert len(tasks) > 1 and not any(t.default.rows for t in tasks)
