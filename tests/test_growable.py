"""Growable dims (docs/dynamic-shapes.md, *Growable buffers*): a run-time dim without an upper bound, whose buffers grow
at run time. all-MiniLM-L6-v2 compiled with no bounds runs batches and sequences of every size from one package on
webgpu, wasm and cpu (natively; tests/test_dynamic_browser.py runs it in Chromium), against onnxruntime, with the
shapes growing and shrinking between runs; the bound the model itself implies (512 positions) is inferred and
enforced."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
from conftest import SHARED_MODELS

import kiln
from kiln.arith import symbolic
from kiln.codegen.target import variant_values
from kiln.errors import KilnError, ShapeError
from kiln.frontend.onnx.importer import parse_dim_spec
from kiln.package import arena
from tools.dynamic_minilm import feeds as minilm_feeds

MODEL = SHARED_MODELS / "all_minilm_l6_v2.onnx"


@pytest.fixture(scope="module")
def growable_minilm(tmp_path_factory):
    """MiniLM compiled with no dims at all: its symbolic batch and seq become growable run-time dims by default."""
    return kiln.compile(MODEL, tmp_path_factory.mktemp("grow") / "minilm", device_class="cpu",
                        target="webgpu,wasm,cpu")


def test_manifest_marks_growable_dims_and_buffers(growable_minilm):
    m = json.loads((growable_minilm / "manifest.json").read_text())
    dims = {d["name"]: d for d in m["dynamic_dims"]}
    assert dims["batch"]["grow"] and dims["batch"]["max"] == symbolic.GROW_HI and "inferred" not in dims["batch"]
    # the position table has 512 rows: the import bounds seq by it, and says where from
    assert dims["seq"]["grow"] and dims["seq"]["max"] == 512 and "/m/embeddings/Slice" in dims["seq"]["inferred"]
    grows = [b for b in m["buffers"] if "grow" in b]
    assert {b["kind"] for b in grows} == {"input", "output", "activation"}
    assert not any("grow" in b for b in m["buffers"] if b["kind"] == "weight")
    # first sizes at the dims' lower bounds: a 1x1 batch, not the largest one
    out = next(b for b in m["buffers"] if b["id"] == m["outputs"][0]["buffer"])
    assert out["bytes"] == 384 * 4 and out["grow"] == ["*", ["*", "batch", "seq"], 1536]
    for name in ("wasm", "cpu"):  # the fixed buffers first, the growable ones after them
        offsets = m["targets"][name]["memory"]["offsets"]
        assert min(offsets[b["id"]] for b in grows) > max(offsets[b["id"]] for b in m["buffers"] if "grow" not in b)


@pytest.mark.parametrize("target", ["webgpu", "wasm", "cpu"])
def test_minilm_every_shape_from_one_growable_package(growable_minilm, target, rng):
    """Batch 1-8 x seq 1-512 from one package with no stated bounds, the buffers growing and the arena relaid out as
    the shapes grow and shrink: within 1e-4 of onnxruntime."""
    session = kiln.load(growable_minilm, target=target, poison=True)
    ref = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    shapes = [(1, 1), (2, 7), (8, 64), (1, 3), (1, 512)] if target == "webgpu" else [(1, 1), (2, 7), (8, 40), (1, 3),
                                                                                      (1, 160)]
    for batch, seq in shapes:
        feeds = minilm_feeds(rng, batch, seq)
        got = session.run(feeds)["last_hidden_state"]
        want = ref.run(["last_hidden_state"], feeds)[0]
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= 1e-4, (target, batch, seq)
    with pytest.raises(ShapeError, match="seq.*513.*1..512"):  # the inferred bound holds
        session.run(minilm_feeds(rng, 1, 513))


def test_parse_growable_dim_specs():
    assert parse_dim_spec("b", "1..") == (1, None, None) and parse_dim_spec("b", "auto") == (1, None, None)
    assert parse_dim_spec("b", "0..@8") == (0, None, 8) and parse_dim_spec("b", (2, None)) == (2, None, None)
    assert parse_dim_spec("h", "32..@64%32") == (32, None, 64, 32)
    assert parse_dim_spec("b", parse_dim_spec("b", "auto")) == (1, None, None)  # (the CLI parses, then the importer)
    for bad in ("4..@2", "x.."):
        with pytest.raises(KilnError):
            parse_dim_spec("b", bad)
    v = symbolic.size_var("b", 0, 1, None)
    assert v.grow and v.hi == symbolic.GROW_HI and v.opt == 1
    assert variant_values([v]) == {"b": 64}  # kernels over it also get a variant scheduled at 64
    assert symbolic.planned(symbolic.simplify(v * 4)) == 4  # a growable buffer's first size: at the lower bound


def test_growable_layout_moves_only_growable_buffers():
    """kiln/package/arena.py: the compile-time layout and a run's layout agree on the fixed buffers."""
    sizes, grows = [100, 8, 4000, 64], [False, True, False, True]
    offsets, total = arena.layout(sizes, grows, 64, 64, 64)
    assert offsets == [64, 4224, 192, 4288] and total == 4416
    memory = {"offsets": offsets, "bytes": total, "align": 64, "slack": 64}
    moved, need = arena.regrow(memory, {1: 1000, 3: 10})
    assert moved[0] == 64 and moved[2] == 192 and moved[1] == 4224 and moved[3] == 4224 + 1024 and need == 5376
    assert arena.regrow(memory, {}) == (offsets, total)


def test_data_dependent_dim_over_a_growable_dim_is_refused(tmp_path):
    """A NonZero over a growable dim would size its result by a bound that grows with the input: a clear error."""
    path = _nonzero_model(tmp_path / "nonzero.onnx")
    with pytest.raises(KilnError, match="grows with n, which have no upper bound"):
        kiln.compile(path, tmp_path / "pkg", dims={"n": "1.."})


@pytest.mark.parametrize("dims", [(), ("--dim", "batch=auto", "--dim", "seq=1..")], ids=["default", "stated"])
def test_cli_compiles_growable_dims_and_info_says_so(tmp_path, dims):
    """``kiln compile`` with no --dim (the default makes MiniLM's batch and seq growable) or with them stated as
    growable (parsed by the CLI, then by the importer), and ``kiln info`` naming the growable dims and the inferred
    bound."""
    from test_cli import kiln as kiln_cli

    out = kiln_cli("compile", MODEL, "-o", tmp_path / "pkg", *dims, "--device-class", "cpu", "--no-validate")
    assert out.returncode == 0, out.stderr
    assert "warning" not in out.stderr
    info = kiln_cli("info", tmp_path / "pkg")
    assert info.returncode == 0, info.stderr
    assert "batch=1..@1 (growable)" in info.stdout
    assert "seq=1..512@1 (growable; bound inferred from node '/m/embeddings/Slice'" in info.stdout
    assert "growable buffers: 11 of" in info.stdout


def _nonzero_model(path):
    """``NonZero(x)`` over an input of symbolic length ``n``."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("NonZero", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, [1, "k"])])
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path


def test_unbound_dims_fall_back_to_static_with_a_warning(tmp_path):
    """By default an unbound dim is growable; where that cannot compile (a NonZero over it; a train step) it is
    bound to 1 with one warning saying why, and ``unbound="grow"`` gives the error instead."""
    from kiln.compiler import StaticDimsWarning

    path = _nonzero_model(tmp_path / "nonzero.onnx")
    with pytest.warns(StaticDimsWarning, match=r"dim n left unbound is bound to 1 \(as growable run-time dims the "
                                               r"model does not compile: .*grows with n"):
        pkg = kiln.compile(path, tmp_path / "pkg", device_class="cpu")
    m = json.loads((pkg / "manifest.json").read_text())
    assert [d["name"] for d in m["dynamic_dims"]] == ["NonZero_0.count"] and m["inputs"][0]["shape"] == [1]
    with pytest.raises(KilnError, match="grows with n, which have no upper bound"):
        kiln.compile(path, tmp_path / "pkg2", unbound="grow")
    from onnx import TensorProto, helper, numpy_helper

    from kiln.train import TrainOptions

    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "lin",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
                              [numpy_helper.from_array(np.ones((3, 2), np.float32), "w")])
    lin = tmp_path / "lin.onnx"
    lin.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    with pytest.warns(StaticDimsWarning, match=r"dim N left unbound is bound to 1 \(a train step takes static dims\)"):
        pkg = kiln.compile(lin, tmp_path / "train", train=TrainOptions(loss="mse"), device_class="cpu")
    assert json.loads((pkg / "manifest.json").read_text())["inputs"][0]["shape"] == [1, 3]
    with pytest.raises(KilnError, match="--unbound grow: a train step takes static dims; give N with --dim"):
        kiln.compile(lin, tmp_path / "train2", train=TrainOptions(loss="mse"), unbound="grow")
    with pytest.raises(KilnError, match="unbound dims are 'auto', 'grow' or 'static'"):
        kiln.compile(MODEL, tmp_path / "bad", unbound="dynamic")


def test_growable_kernels_stay_vectorised(growable_minilm):
    """The grid over run-time dims unravels by divisors like ``((seq + 3) / 4) * 576``: the lane vectorisers see that
    a multiple of the row keeps the lanes in one row, so the QKV projection's seq variant loads weight vectors and
    divides once per tile, not per lane (5x slower on the cpu target before)."""
    src = (growable_minilm / "kernels" / "kiln-cpu.c").read_text()
    kernels = src.split("\n// ")
    qkv = [k for k in kernels if k.startswith("matmul_add: MatMul -> Add [batch, seq, 1152]") and "i1o * (4)" in k]
    assert qkv, "no seq variant of the QKV projection tiling 4 rows"
    vector = qkv[0][qkv[0].index("_v("):]
    assert "kv_v128_load(&in1[" in vector and "KILN_MAP_I2(kiln_idiv" not in vector


def test_webgl2_kernels_read_run_time_dims(growable_minilm_webgl2):
    """The webgl2 target takes run-time dims (format 1.11): kernels read them from the KilnDims uniform block and
    lay tensors out by their run-time sizes; steps carry their output's element count, growable buffers' textures
    grow. (tests/test_dynamic_browser.py runs such packages in Chromium against onnxruntime.)"""
    m = json.loads((growable_minilm_webgl2 / "manifest.json").read_text())
    assert m["version"] == "1.14" and {d["name"] for d in m["dynamic_dims"]} == {"batch", "seq"}
    gl = m["targets"]["webgl2"]
    assert any(t.get("grow") for t in gl["textures"]) and all(t["width"] == gl["texture_width"]
                                                              for t in gl["textures"] if t.get("grow"))
    steps = [s for s in gl["plan"] if "elements" in s]
    assert steps and "seq" in json.dumps(steps[0]["elements"])
    src = (growable_minilm_webgl2 / gl["kernels"][steps[0]["kernel"]]["source"]).read_text()
    assert "uniform KilnDims { ivec4 kiln_dims[1]; }" in src and "discard;" in src


@pytest.fixture(scope="module")
def growable_minilm_webgl2(tmp_path_factory):
    return kiln.compile(MODEL, tmp_path_factory.mktemp("growgl") / "minilm", target="webgl2", validate=False)
