"""onnxruntime's GroupQueryAttention (com.microsoft) against onnxruntime itself, natively on WebGPU."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.compiler import compile_graph
from kiln.frontend.onnx.importer import import_model
from kiln.package.writer import write_package

H, KV, HD = 4, 2, 16


def _model(s: int, past: int, attrs: dict, packed: bool = False, rotary: bool = False):
    f = TensorProto.FLOAT
    ins = ([helper.make_tensor_value_info("qkv", f, [1, s, (H + 2 * KV) * HD])] if packed else
           [helper.make_tensor_value_info("q", f, [1, s, H * HD]), helper.make_tensor_value_info("k", f, [1, s, KV * HD]),
            helper.make_tensor_value_info("v", f, [1, s, KV * HD])])
    ins += [helper.make_tensor_value_info("past_key", f, [1, KV, past, HD]),
            helper.make_tensor_value_info("past_value", f, [1, KV, past, HD]),
            helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
            helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])]
    names = (["qkv", "", ""] if packed else ["q", "k", "v"]) + ["past_key", "past_value", "seqlens_k",
                                                               "total_sequence_length"]
    inits = []
    if rotary:
        ang = np.arange(64)[:, None] * 10000.0 ** (-np.arange(0, HD, 2) / HD)[None]
        inits = [helper.make_tensor("cos", f, list(ang.shape), np.cos(ang).astype(np.float32).ravel()),
                 helper.make_tensor("sin", f, list(ang.shape), np.sin(ang).astype(np.float32).ravel())]
        names += ["cos", "sin"]
    node = helper.make_node("GroupQueryAttention", names, ["out", "present_key", "present_value"],
                            domain="com.microsoft", num_heads=H, kv_num_heads=KV, do_rotary=int(rotary), **attrs)
    outs = [helper.make_tensor_value_info(n, f, None) for n in ("out", "present_key", "present_value")]
    graph = helper.make_graph([node], "gqa", ins, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("s,past,attrs,packed,rotary", [
    (5, 0, {}, False, False),                                   # prefill
    (1, 7, {}, False, True),                                    # decode step with rotary
    (3, 4, {"rotary_interleaved": 1}, False, True),             # chunk after a cache, adjacent-pair rotary
    (6, 2, {"local_window_size": 3, "softcap": 5.0}, True, False),  # packed QKV, sliding window, soft cap
    (2, 3, {"smooth_softmax": 1, "scale": 0.3}, False, False),
])
def test_group_query_attention_matches_onnxruntime(tmp_path, rng, s, past, attrs, packed, rotary):
    model = _model(s, past, attrs, packed, rotary)
    feeds = {"past_key": rng.standard_normal((1, KV, past, HD)).astype(np.float32),
             "past_value": rng.standard_normal((1, KV, past, HD)).astype(np.float32),
             "seqlens_k": np.array([past + s - 1], np.int32), "total_sequence_length": np.array(past + s, np.int32)}
    if packed:
        feeds["qkv"] = rng.standard_normal((1, s, (H + 2 * KV) * HD)).astype(np.float32)
    else:
        feeds.update(q=rng.standard_normal((1, s, H * HD)).astype(np.float32),
                     k=rng.standard_normal((1, s, KV * HD)).astype(np.float32),
                     v=rng.standard_normal((1, s, KV * HD)).astype(np.float32))
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    compiled = compile_graph(import_model(model), "webgpu", device_class="cpu")
    got = kiln.load(write_package(compiled, tmp_path / "pkg")).run(feeds)
    for name, w in zip(("out", "present_key", "present_value"), want):
        np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-4, err_msg=name)
