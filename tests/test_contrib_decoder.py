"""onnxruntime's decoder contrib operators (kiln/frontend/onnx/ops/contrib_decoder.py) against onnxruntime's CPU
kernels: MatMulNBits (packed weights by hand and from onnxruntime's own quantizer), SimplifiedLayerNormalization,
SkipSimplifiedLayerNormalization and com.microsoft RotaryEmbedding; and the refusals."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from opcheck import check_op, make_model

import kiln
from kiln.errors import ConstantInputError, KilnError, ModelFormatError
from kiln.frontend.onnx.importer import import_model, load_model

MS = "com.microsoft"
TOL = {"rtol": 1e-4, "atol": 1e-4}  # float32 dot products over K <= 160 of O(1) terms


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned ``bits``-wide fields ``q [..., n]`` packed into bytes along the last axis, lowest bits first, the
    row padded with zeros to whole bytes (onnxruntime's layout of B and of packed zero points)."""
    per = 8 // bits
    q = np.concatenate([q, np.zeros((*q.shape[:-1], -q.shape[-1] % per), q.dtype)], axis=-1).astype(np.uint8)
    q = q.reshape(*q.shape[:-1], -1, per)
    return np.bitwise_or.reduce(q << (np.arange(per, dtype=np.uint8) * bits), axis=-1).astype(np.uint8)


def nbits_weights(rng, n: int, k: int, bits: int, block: int, zero_points: str) -> dict[str, np.ndarray]:
    """Random B, scales and zero points (``none``, ``packed`` uint8 or ``float``) of MatMulNBits."""
    blocks = -(-k // block)
    q = rng.integers(0, 2 ** bits, size=(n, blocks * block))
    out = {"B": pack(q, bits).reshape(n, blocks, block * bits // 8),
           "scales": rng.uniform(0.01, 0.1, size=(n, blocks)).astype(np.float32)}
    if zero_points == "packed":
        out["zp"] = pack(rng.integers(0, 2 ** bits, size=(n, blocks)), bits)
    elif zero_points == "float":
        out["zp"] = rng.uniform(0, 2 ** bits - 1, size=(n, blocks)).astype(np.float32)
    return out


# ----------------------------------------------------------------------------- MatMulNBits

@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zero_points", ["none", "packed"])
def test_matmul_nbits(rng, bits, zero_points):
    k, n, block = 128, 24, 32
    inits = nbits_weights(rng, n, k, bits, block, zero_points)
    check_op("MatMulNBits", {"a": f32(rng, 2, 3, k)}, {"K": k, "N": n, "bits": bits, "block_size": block}, inits,
             domain=MS, **TOL)


def test_matmul_nbits_float_zero_points_and_bias(rng):
    """float zero points (onnxruntime's CPU kernel takes them for 4 bits only), flat scales, bias, A [5, K]."""
    k, n, block = 64, 20, 16
    inits = nbits_weights(rng, n, k, 4, block, "float")
    inits["scales"] = inits["scales"].reshape(-1)
    inits["bias"] = f32(rng, n)
    check_op("MatMulNBits", {"a": f32(rng, 5, k)}, {"K": k, "N": n, "bits": 4, "block_size": block}, inits,
             input_order=["a", "B", "scales", "zp", "", "bias"], domain=MS, **TOL)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_matmul_nbits_ragged_k(rng, bits):
    """K not a multiple of block_size (the last block padded), packed zero points with a padded row (5 blocks)."""
    k, n, block = 150, 12, 32
    inits = nbits_weights(rng, n, k, bits, block, "packed")
    check_op("MatMulNBits", {"a": f32(rng, 2, 3, k)}, {"K": k, "N": n, "bits": bits, "block_size": block}, inits,
             domain=MS, **TOL)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [False, True])
def test_matmul_nbits_from_onnxruntime_quantizer(rng, bits, symmetric):
    """B, scales and zero points as onnxruntime's MatMulNBitsQuantizer writes them for a one-MatMul model."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    k, n = 96, 40
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, n])],
                              [numpy_helper.from_array(f32(rng, k, n), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    quantizer = MatMulNBitsQuantizer(model, block_size=32, is_symmetric=symmetric, bits=bits)
    quantizer.process()
    q = quantizer.model.model
    (node,) = q.graph.node
    assert node.op_type == "MatMulNBits" and (len(node.input) == 3) == symmetric
    inits = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    check_op("MatMulNBits", {"a": f32(rng, 2, 3, k)}, attrs, {name: inits[name] for name in node.input[1:]},
             domain=MS, **TOL)


def _nbits_model(rng, inputs: dict, inits: dict, order: list[str]) -> onnx.ModelProto:
    node = helper.make_node("MatMulNBits", order, ["y"], domain=MS, K=64, N=8, bits=4, block_size=32)
    graph = helper.make_graph([node], "nbits",
                              [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
                               for k, v in inputs.items()],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 8])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    return model


def test_matmul_nbits_refuses_g_idx(rng):
    inits = nbits_weights(rng, 8, 64, 4, 32, "packed")
    inits["g_idx"] = (np.arange(64) // 32).astype(np.int32)
    model = _nbits_model(rng, {"a": f32(rng, 3, 64)}, inits, ["a", "B", "scales", "zp", "g_idx"])
    with pytest.raises(KilnError, match="MatMulNBits: the g_idx input .* is not supported"):
        import_model(model)


def test_matmul_nbits_refuses_runtime_weights(rng):
    w = nbits_weights(rng, 8, 64, 4, 32, "none")
    model = _nbits_model(rng, {"a": f32(rng, 3, 64), "B": w["B"]}, {"scales": w["scales"]}, ["a", "B", "scales"])
    with pytest.raises(ConstantInputError, match=r"MatMulNBits: input B \(%B\) must be a constant initializer") as e:
        import_model(model)
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- RMS norms

@pytest.mark.parametrize("axis", [-1, 1])
def test_simplified_layer_norm(rng, axis):
    x = f32(rng, 2, 5, 16) * 3
    scale = f32(rng, *x.shape[axis % 3:])
    check_op("SimplifiedLayerNormalization", {"x": x}, {"epsilon": 1e-5, "axis": axis}, {"scale": scale},
             n_outputs=2, atol=1e-5)


def test_simplified_layer_norm_default_epsilon(rng):
    check_op("SimplifiedLayerNormalization", {"x": f32(rng, 3, 32)}, None, {"scale": f32(rng, 32)}, atol=1e-5)


def test_load_model_accepts_onnxruntime_default_domain_ops(rng, tmp_path):
    """onnx's checker knows no SimplifiedLayerNormalization: load_model checks it as another domain's operator and
    gives the model back unchanged; an operator Kiln does not convert still fails the check."""
    model = make_model("SimplifiedLayerNormalization", {"x": f32(rng, 2, 8)}, None, {"scale": f32(rng, 8)})
    onnx.save(model, tmp_path / "sln.onnx")
    loaded = load_model(tmp_path / "sln.onnx")
    assert loaded.graph.node[0].domain == "" and [(o.domain, o.version) for o in loaded.opset_import] == [("", 17)]
    model.graph.node[0].op_type = "NoSuchNormalization"
    onnx.save(model, tmp_path / "bad.onnx")
    with pytest.raises(ModelFormatError, match="No Op registered for NoSuchNormalization"):
        load_model(tmp_path / "bad.onnx")


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("n_outputs", [1, 4])
def test_skip_simplified_layer_norm(rng, bias, n_outputs):
    """3-D input with bias or not; all four outputs (mean, which onnxruntime writes as zeros; inv_std_var;
    input + skip + bias) or only the first."""
    x, skip = f32(rng, 2, 3, 32), f32(rng, 2, 3, 32)
    inits = {"gamma": f32(rng, 32)} | ({"bias": f32(rng, 32)} if bias else {})
    check_op("SkipSimplifiedLayerNormalization", {"x": x, "skip": skip}, {"epsilon": 1e-6}, inits,
             n_outputs=n_outputs, domain=MS, atol=1e-5)


@pytest.mark.parametrize("shapes", [((7, 24), (7, 24)), ((2, 3, 24), (3, 24))], ids=["tokens", "skip-broadcast"])
def test_skip_simplified_layer_norm_shapes(rng, shapes):
    """[tokens, hidden] input, or skip [S, hidden] broadcast over the batch; default epsilon."""
    check_op("SkipSimplifiedLayerNormalization", {"x": f32(rng, *shapes[0]), "skip": f32(rng, *shapes[1])}, None,
             {"gamma": f32(rng, 24)}, domain=MS, n_outputs=4, atol=1e-5)


# ----------------------------------------------------------------------------- RotaryEmbedding

ROPE = [(rank, inter, rd, pos) for rank in (3, 4) for inter in (0, 1) for rd in (0, 4) for pos in ("ids", "start")]
ROPE += [(3, 0, 0, "scalar"), (4, 1, 4, "scalar")]


@pytest.mark.parametrize("rank,interleaved,rotary_dim,positions", ROPE,
                         ids=[f"rank{r}-{'interleaved' if i else 'halves'}-rd{d}-{p}" for r, i, d, p in ROPE])
def test_rotary_embedding_ms(rng, rank, interleaved, rotary_dim, positions):
    b, s, h, d, max_pos = 2, 5, 3, 8, 16
    half = (rotary_dim or d) // 2
    x = f32(rng, b, s, h * d) if rank == 3 else f32(rng, b, h, s, d)
    pos = {"ids": rng.integers(0, max_pos, size=(b, s)), "start": rng.integers(0, max_pos - s, size=1),
           "scalar": np.array(rng.integers(0, max_pos - s))}[positions]
    attrs = {"interleaved": interleaved} | ({"rotary_embedding_dim": rotary_dim, "num_heads": h} if rotary_dim else {})
    angles = rng.uniform(0, 2 * np.pi, size=(max_pos, half))
    inits = {"cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32)}
    check_op("RotaryEmbedding", {"x": x, "pos": pos.astype(np.int64)}, attrs, inits, domain=MS, atol=1e-5,
             input_order=["x", "pos", "cos", "sin"])


def test_decoder_chain_runtime_seq(rng, tmp_path):
    """SkipSimplifiedLayerNormalization (all outputs) -> MatMulNBits (K not a multiple of the block) ->
    RotaryEmbedding from a one-element start position, with a run-time sequence length (positions through
    Iota, the zero mean output computed): one package run at several lengths against onnxruntime."""
    hidden, k_blocks, heads, d, max_pos = 40, 2, 2, 8, 32
    w = nbits_weights(rng, heads * d, hidden, 4, 32, "packed")
    angles = rng.uniform(0, 2 * np.pi, size=(max_pos, d // 2))
    inits = {"gamma": f32(rng, hidden), "bias": f32(rng, hidden), **w,
             "cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32)}
    assert w["B"].shape[1] == k_blocks
    nodes = [helper.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", "gamma", "bias"],
                              ["n", "mean", "inv", "sum"], domain=MS, epsilon=1e-6),
             helper.make_node("MatMulNBits", ["n", "B", "scales", "zp"], ["q"], domain=MS, K=hidden, N=heads * d,
                              bits=4, block_size=32),
             helper.make_node("RotaryEmbedding", ["q", "pos", "cos", "sin"], ["y"], domain=MS, num_heads=heads)]
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "chain", [vi("x", TensorProto.FLOAT, [1, "seq", hidden]),
                                               vi("skip", TensorProto.FLOAT, [1, "seq", hidden]),
                                               vi("pos", TensorProto.INT64, [1])],
                              [vi("y", TensorProto.FLOAT, [1, "seq", heads * d]),
                               vi("mean", TensorProto.FLOAT, [1, "seq", 1]), vi("inv", TensorProto.FLOAT, [1, "seq", 1]),
                               vi("sum", TensorProto.FLOAT, [1, "seq", hidden])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "chain.onnx")
    session = kiln.load(kiln.compile(tmp_path / "chain.onnx", tmp_path / "pkg", dims={"seq": (1, 8)}), poison=True)
    oracle = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for seq, start in ((1, 9), (5, 0), (8, 20)):
        feeds = {"x": f32(rng, 1, seq, hidden), "skip": f32(rng, 1, seq, hidden), "pos": np.array([start], np.int64)}
        got = session.run(feeds)
        for out, exp in zip(graph.output, oracle.run(None, feeds)):
            np.testing.assert_allclose(got[out.name], exp, rtol=1e-4, atol=1e-4, err_msg=f"{out.name} at seq {seq}")


def test_rotary_embedding_ms_refuses_packed_batching(rng):
    model = make_model("RotaryEmbedding", {"x": f32(rng, 1, 2, 8), "pos": np.zeros((1, 2), np.int64)},
                       {"num_heads": 1}, {"cos": f32(rng, 4, 4), "sin": f32(rng, 4, 4)}, domain=MS,
                       input_order=["x", "pos", "cos", "sin"])
    model.graph.node[0].attribute.append(helper.make_attribute("is_packed_batching", 1))
    with pytest.raises(KilnError, match="is_packed_batching=1"):
        import_model(model)


def test_swiglu_block_fuses_into_matmul_nbits_prologues(rng, tmp_path):
    """An RMSNorm + SwiGLU block over 4-bit weights, compiled for GPUs: gate and up are one MatMulNBits (sibling
    merge), the norm's scaling and the SiLU product run as prologues of the MatMulNBits that read them (no kernel of
    their own); natively on webgpu with the gpu schedules, NaN-poisoned, equal to onnxruntime. The wasm target (whose
    arithmetic is not cheap beside memory) keeps them apart and agrees too."""
    from kiln.package.format import read_manifest

    k, hidden, block = 64, 96, 32
    gate, up = nbits_weights(rng, hidden, k, 4, block, "none"), nbits_weights(rng, hidden, k, 4, block, "none")
    down = nbits_weights(rng, k, hidden, 4, block, "none")
    inits = {"g": (1 + 0.1 * f32(rng, k)).astype(np.float32)}
    for name, w in (("gate", gate), ("up", up), ("down", down)):
        inits.update({f"{name}.B": w["B"], f"{name}.s": w["scales"]})
    n = helper.make_node
    nodes = [n("SimplifiedLayerNormalization", ["x", "g"], ["h"], axis=-1, epsilon=1e-5),
             n("MatMulNBits", ["h", "gate.B", "gate.s"], ["a"], domain=MS, K=k, N=hidden, bits=4, block_size=block),
             n("MatMulNBits", ["h", "up.B", "up.s"], ["b"], domain=MS, K=k, N=hidden, bits=4, block_size=block),
             n("Sigmoid", ["a"], ["sa"]), n("Mul", ["a", "sa"], ["silu"]), n("Mul", ["silu", "b"], ["p"]),
             n("MatMulNBits", ["p", "down.B", "down.s"], ["d"], domain=MS, K=hidden, N=k, bits=4, block_size=block),
             n("Add", ["x", "d"], ["y"])]
    graph = helper.make_graph(nodes, "swiglu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, k])],
                              [numpy_helper.from_array(v, name) for name, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    x = f32(rng, 1, 5, k)
    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    gpu = kiln.compile(path, tmp_path / "gpu", device_class="gpu")
    names = [kr["name"] for kr in read_manifest(gpu)["targets"]["webgpu"]["kernels"]]
    assert sum("matmulnbits" in nm for nm in names) == 2, names  # gate+up merged, down
    assert any("sigmoid" in nm and "matmulnbits" in nm for nm in names), names  # SiLU product as a prologue
    assert len(names) == 3, names  # the norm's row reduction, gate+up with the norm's scaling, down with SiLU * up
    np.testing.assert_allclose(kiln.load(gpu, poison=True).run({"x": x})["y"], want, **TOL)
    cpu = kiln.compile(path, tmp_path / "wasm", target="webgpu,wasm", wasm_threads=False)
    names = [kr["name"] for kr in read_manifest(cpu)["targets"]["wasm"]["kernels"]]
    assert not any("sigmoid" in nm and "matmulnbits" in nm for nm in names), names
    np.testing.assert_allclose(kiln.load(cpu, target="wasm", poison=True).run({"x": x})["y"], want, **TOL)
