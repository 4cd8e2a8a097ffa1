"""The GGUF frontend: a Llama-family language model as a graph-IR decoder with a KV cache.

:func:`import_gguf` reads the file (:mod:`kiln.frontend.gguf.reader`) and builds one decoder step over run-time
dims ``sequence`` (``T``, the new tokens) and ``past_sequence`` (``P``, the cached ones):

- inputs: ``input_ids`` int64 ``[1, T]``; ``past_sequence_length`` int64 ``[1]``, whose value is ``P`` (it binds
  the run-time dim, :attr:`kiln.ir.graph.Graph.value_dims`);
- outputs: ``logits`` float32 ``[1, T, vocab]`` (or ``[1, 1, vocab]``, the last token's, with
  ``logits="last"``); ``next_token`` int64 ``[1, T]`` (or ``[1, 1]``), each row's arg max (greedy decoding
  reads back these ids only);
- state (:attr:`kiln.ir.graph.Graph.state`): per layer ``l`` the KV cache ``past_key_values.l.key`` / ``.value``
  float32 ``[1, KV, max_context, hd]`` (the head-major layout of optimum's and transformers.js's decoder exports,
  sized for the context bound), updated in place by ``TensorScatter`` into ``present.l.key`` / ``.value``: a
  step writes its ``T`` rows from row ``P`` and attends over the first ``P + T``; the package keeps the cache in
  one device buffer between steps, never fed nor read back (ONNX TensorScatter-24 and onnxruntime GenAI's shared
  past/present buffers).

Token ``t`` sits at position ``P + t``. Packed weights (Q4_0, Q4_1, Q8_0) stay packed (:mod:`kiln.ir.ops_quant`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from kiln.arith import symbolic
from kiln.errors import KilnError
from kiln.frontend import decoder
from kiln.frontend.decoder import Packed
from kiln.frontend.gguf.reader import Config, GGUFModel, PackedTensor, read_gguf
from kiln.frontend.shapes import reshape
from kiln.ir.graph import Builder, Graph, Value

__all__ = ["Config", "DecoderGraph", "GGUFModel", "import_gguf", "read_gguf"]


@dataclass
class DecoderGraph:
    """A decoder step's graph and what a generation loop needs to drive it."""

    graph: Graph
    model: GGUFModel
    max_context: int
    max_tokens: int
    logits_rows: str

    @property
    def cache(self) -> list[tuple[str, str]]:
        """(state input name, its updated output's name) of every cache tensor, in layer order (``graph.state``)."""
        return list(self.graph.state.items())

    def generation(self) -> dict:
        """The package manifest's ``generation`` section (format 1.6, docs/package-format.md)."""
        meta = self.model.metadata
        eos = [int(meta["tokenizer.ggml.eos_token_id"])] if "tokenizer.ggml.eos_token_id" in meta else []
        tokens = list(meta.get("tokenizer.ggml.tokens", []))
        for extra in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>"):  # chat turn ends the template writes
            if extra in tokens and tokens.index(extra) not in eos:
                eos.append(tokens.index(extra))
        bos = meta.get("tokenizer.ggml.bos_token_id") if meta.get("tokenizer.ggml.add_bos_token") else None
        return {"architecture": self.model.config.architecture, "max_context": self.max_context,
                "max_tokens": self.max_tokens, "input_ids": "input_ids", "logits": "logits", "next_token": "next_token",
                "logits_rows": self.logits_rows,
                "cache": {"position": "past_sequence_length", "axis": 2, "state": [p for p, _ in self.cache]},
                "tokenizer": "tokenizer.json", "chat_template": str(meta.get("tokenizer.chat_template", "")),
                "bos_token_id": None if bos is None else int(bos), "eos_token_ids": eos}

    def tokenizer_json(self) -> str:
        """The model's tokenizer as HuggingFace ``tokenizer.json`` text (:mod:`kiln.frontend.gguf.tokenizer`)."""
        from kiln.frontend.gguf.tokenizer import tokenizer_json

        return tokenizer_json(self.model.metadata)


def _weight(b: Builder, t: np.ndarray | PackedTensor, name: str) -> Value | Packed:
    """A GGUF weight ``[N, K]`` as a graph constant: packed, or float32 ``[K, N]`` (MatMul's B)."""
    if isinstance(t, PackedTensor):
        return Packed(b.const(t.packed, name=name + ".q"), b.const(t.scales, name=name + ".s"), None, t.attrs)
    return b.const(np.ascontiguousarray(t.T), name=name)


def import_gguf(path: str | os.PathLike, *, max_context: int = 2048, max_tokens: int | None = None,
                logits: str = "all", model: GGUFModel | None = None) -> DecoderGraph:
    """Build the decoder step of a GGUF language model.

    Args:
        path: the ``.gguf`` file.
        max_context: the most tokens the cache holds (``P + T <= max_context``); bounds the cache buffers.
        max_tokens: the most new tokens of one step (``T``; default ``max_context``).
        logits: ``all`` (a row per new token: prefill scoring, teacher forcing) or ``last`` (generation).
        model: the file already read (skips reading it again).

    Raises:
        ModelFormatError: what :func:`read_gguf` refuses; KilnError: bounds outside the model's context.
    """
    m = model or read_gguf(path)
    c = m.config
    if not 1 <= max_context <= c.context:
        raise KilnError(f"max context {max_context} must be between 1 and the model's context length {c.context}")
    max_tokens = max_context if max_tokens is None else max_tokens
    if not 1 <= max_tokens <= max_context:
        raise KilnError(f"max tokens per step {max_tokens} must be between 1 and the max context {max_context}")
    if logits not in ("all", "last"):
        raise KilnError(f"logits must be 'all' or 'last', not {logits!r}")
    g = Graph(name=(c.name or "decoder").replace(" ", "_"))
    seq = symbolic.size_var("sequence", 0, 1, max_tokens, opt=1)  # schedules for decode steps, the hot loop
    past = symbolic.size_var("past_sequence", 1, 0, max_context - 1)
    g.size_vars = {"sequence": seq, "past_sequence": past}
    ids = Value("input_ids", "int64", (1, seq), sym_shape=(1, "sequence"))
    write = Value("past_sequence_length", "int64", (1,))  # the cache row this step's first token goes to: P
    g.inputs += [ids, write]
    g.value_dims = {write.name: "past_sequence"}
    g.dim_limits = [(("past_sequence", "sequence"), max_context)]  # the cache's rows
    kv, hd = c.kv_heads, c.head_dim
    for layer in range(c.layers):
        for part in ("key", "value"):
            g.inputs.append(Value(f"past_key_values.{layer}.{part}", "float32", (1, kv, max_context, hd)))
            g.state[f"past_key_values.{layer}.{part}"] = f"present.{layer}.{part}"
    b = Builder(g)
    t = m.tensors
    table = t["token_embd.weight"]
    embedding = _weight(b, table, "token_embd") if isinstance(table, PackedTensor) else b.const(table, "token_embd")
    x = decoder.embed(b, embedding, ids)  # [1, T, D]
    # llama.cpp's NORM rope for llama (Q, K permuted by its converter: adjacent pairs); NEOX (halves) for qwen2
    rope = decoder.rope_tables(b, max_context, hd, c.rope_base, interleaved=c.architecture == "llama")
    pos = decoder.positions(b, past, seq)
    scale = 1.0 / math.sqrt(hd)
    presents = []
    for layer in range(c.layers):
        p = f"blk.{layer}."

        def w(name, p=p):
            return _weight(b, t[p + name], p + name)

        def bias(name, p=p):
            return b.const(t[p + name]) if p + name in t else None

        h = decoder.rms_norm(b, x, b.const(t[p + "attn_norm.weight"]), c.eps)
        q = decoder.linear(b, h, w("attn_q.weight"), bias("attn_q.bias"))
        k = decoder.linear(b, h, w("attn_k.weight"), bias("attn_k.bias"))
        v = decoder.linear(b, h, w("attn_v.weight"), bias("attn_v.bias"))
        q = decoder.rotary(b, reshape(b, q, (1, seq, c.heads, hd)), rope, pos)
        k = decoder.rotary(b, reshape(b, k, (1, seq, kv, hd)), rope, pos)
        v = reshape(b, v, (1, seq, kv, hd))
        past_k, past_v = g.inputs[2 + 2 * layer], g.inputs[3 + 2 * layer]
        ctx, pk, pv = decoder.causal_attention(b, q, k, v, past_k, past_v, scale, write=write, past_len=past)
        presents += [pk, pv]
        x = b.op("Add", [x, decoder.linear(b, ctx, w("attn_output.weight"))])
        h = decoder.rms_norm(b, x, b.const(t[p + "ffn_norm.weight"]), c.eps)
        x = b.op("Add", [x, decoder.swiglu(b, h, w("ffn_gate.weight"), w("ffn_up.weight"), w("ffn_down.weight"))])
    if logits == "last":
        x = b.op("Slice", [x], starts=(0, seq - 1, 0), ends=(1, seq, c.width), steps=(1, 1, 1))
    x = decoder.rms_norm(b, x, b.const(t["output_norm.weight"]), c.eps)
    if "output.weight" in t:
        head = _weight(b, t["output.weight"], "output")
    elif isinstance(embedding, Packed):  # tied embeddings: the table is the output projection too
        head = embedding
    else:
        head = b.const(np.ascontiguousarray(embedding.const.T), name="output")
    out = decoder.linear(b, x, head)
    out.name = "logits"
    # greedy decoding on the device: the arg max of each row, so a decode step reads back one id, not the logits
    best = b.op("ReduceMax", [out], axes=(2,), keepdims=1)
    top = b.op("ArgMax", [out, best], axis=2, keepdims=0, select_last_index=0)
    top.name = "next_token"
    g.outputs = [out, top]
    for present_name, v in zip(g.state.values(), presents):
        v.name = present_name
        g.outputs.append(v)
    return DecoderGraph(g, m, max_context, max_tokens, logits)
