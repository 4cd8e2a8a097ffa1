"""A GGUF Llama exported to ONNX as users' decoder exports are laid out (optimum, transformers.js), and 4-bit.

:func:`export_decoder` writes the decoder with a KV cache: inputs ``input_ids`` [batch, sequence],
``attention_mask`` [batch, past_sequence + sequence], ``position_ids`` [batch, sequence] and per layer
``past_key_values.l.key`` / ``.value`` [batch, KV, past_sequence, hd]; outputs ``logits`` [batch, sequence, vocab]
and ``present.l.key`` / ``.value``. The weights are the GGUF's, dequantized (``gguf.quants.dequantize``), with
Q and K un-permuted from llama.cpp's adjacent-pair RoPE layout to Hugging Face's half-split one, as
``transformers`` has them. :func:`quantize_4bit` then rewrites its MatMuls as ``MatMulNBits`` with onnxruntime's
own quantizer (``MatMulNBitsQuantizer``), as the q4 exports are made.

Needs PyTorch and onnxruntime (optional dependencies).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter permutes Q/K rows per head from HF's half-split order to adjacent pairs; undo it."""
    n, k = w.shape
    return w.reshape(heads, (n // heads) // 2, 2, k).swapaxes(1, 2).reshape(n, k)


def decoder_module(gguf_path: str | os.PathLike, layers: int | None = None):
    """A PyTorch Llama decoder step with a KV cache, holding a GGUF's dequantized weights (fp32, eval mode).

    ``layers`` keeps the first layers only (tests of the export path that do not need the whole depth)."""
    import gguf
    import torch
    from torch import nn

    r = gguf.GGUFReader(str(gguf_path))
    arch = r.fields["general.architecture"].contents()
    f = {k[len(arch) + 1:]: r.fields[k].contents() for k in r.fields if k.startswith(arch + ".")}
    n_layers = layers or f["block_count"]
    keep = {f"blk.{i}." for i in range(n_layers)}
    w = {t.name: gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32) for t in r.tensors
         if not t.name.startswith("blk.") or t.name[:t.name.index(".", 4) + 1] in keep}
    heads, kv = f["attention.head_count"], f["attention.head_count_kv"]
    width = f["embedding_length"]
    hd, eps, base = width // heads, f["attention.layer_norm_rms_epsilon"], f.get("rope.freq_base", 10000.0)
    ctx = f["context_length"]

    def t(a):
        return torch.tensor(np.ascontiguousarray(a))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Parameter(t(w["token_embd.weight"]), requires_grad=False)
            self.head = nn.Parameter(t(w.get("output.weight", w["token_embd.weight"]).T), requires_grad=False)
            self.norm = nn.Parameter(t(w["output_norm.weight"]), requires_grad=False)
            names = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                     "ffn_down"]
            self.p = nn.ParameterList()
            for i in range(n_layers):
                for n in names:
                    a = w[f"blk.{i}.{n}.weight"]
                    if n in ("attn_q", "attn_k"):
                        a = _unpermute(a, heads if n == "attn_q" else kv)
                    self.p.append(nn.Parameter(t(a if a.ndim == 1 else a.T), requires_grad=False))  # x @ W.T
            inv = base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
            ang = np.arange(ctx, dtype=np.float64)[:, None] * inv[None]
            self.register_buffer("cos", t(np.cos(ang).astype(np.float32)))
            self.register_buffer("sin", t(np.sin(ang).astype(np.float32)))

        @staticmethod
        def rms(x, g):
            return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * g

        def rope(self, x, pos):  # x [B, heads, S, hd], half-split pairs
            c, s = self.cos[pos][:, None], self.sin[pos][:, None]
            x0, x1 = x[..., : hd // 2], x[..., hd // 2:]
            return torch.cat([x0 * c - x1 * s, x0 * s + x1 * c], -1)

        def forward(self, input_ids, attention_mask, position_ids, *past):
            b, s = input_ids.shape
            x = self.embed[input_ids]
            past_len = past[0].shape[2]
            q_pos = torch.arange(s) + past_len
            k_pos = torch.arange(past_len + s)
            allowed = (k_pos[None, :] <= q_pos[:, None])[None, None] & (attention_mask[:, None, None, :] > 0)
            bias = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)
            presents = []
            for i in range(n_layers):
                an, wq, wk, wv, wo, fn, wg, wu, wd = self.p[9 * i: 9 * i + 9]
                h = self.rms(x, an)
                q = self.rope((h @ wq).view(b, s, heads, hd).transpose(1, 2), position_ids)
                k = self.rope((h @ wk).view(b, s, kv, hd).transpose(1, 2), position_ids)
                v = (h @ wv).view(b, s, kv, hd).transpose(1, 2)
                k = torch.cat([past[2 * i], k], 2)
                v = torch.cat([past[2 * i + 1], v], 2)
                presents += [k, v]
                kk = k.repeat_interleave(heads // kv, 1)
                vv = v.repeat_interleave(heads // kv, 1)
                a = torch.softmax(q @ kk.transpose(2, 3) / float(np.sqrt(hd)) + bias, -1) @ vv
                x = x + a.transpose(1, 2).reshape(b, s, width) @ wo
                h = self.rms(x, fn)
                g = h @ wg
                x = x + (g * torch.sigmoid(g) * (h @ wu)) @ wd
            return (self.rms(x, self.norm) @ self.head, *presents)

    module = Decoder().eval()
    module.config = {"layers": n_layers, "kv_heads": kv, "head_dim": hd, "vocab": w["token_embd.weight"].shape[0]}
    return module


def export_decoder(gguf_path: str | os.PathLike, out: str | os.PathLike, layers: int | None = None,
                   module=None) -> dict:
    """Export :func:`decoder_module` (or ``module``, one made before) to ``out`` (ONNX opset 17, the sequence and
    past dims dynamic); returns its config (``layers``, ``kv_heads``, ``head_dim``, ``vocab``)."""
    import torch

    m = module if module is not None else decoder_module(gguf_path, layers)
    c = m.config
    past = [torch.zeros(1, c["kv_heads"], 2, c["head_dim"]) for _ in range(2 * c["layers"])]
    names = [f"past_key_values.{i // 2}.{'key' if i % 2 == 0 else 'value'}" for i in range(2 * c["layers"])]
    outs = [f"present.{i // 2}.{'key' if i % 2 == 0 else 'value'}" for i in range(2 * c["layers"])]
    dynamic = {"input_ids": {1: "sequence"}, "attention_mask": {1: "total_sequence"},
               "position_ids": {1: "sequence"}, "logits": {1: "sequence"},
               **{n: {2: "past_sequence"} for n in names}, **{n: {2: "total_sequence"} for n in outs}}
    args = (torch.ones(1, 3, dtype=torch.int64), torch.ones(1, 5, dtype=torch.int64),
            torch.arange(2, 5)[None], *past)
    with torch.no_grad():
        torch.onnx.export(m, args, str(out), input_names=["input_ids", "attention_mask", "position_ids", *names],
                          output_names=["logits", *outs], dynamic_axes=dynamic, opset_version=17, dynamo=False)
    return c


def quantize_4bit(src: str | os.PathLike, out: str | os.PathLike, block_size: int = 32,
                  symmetric: bool = False) -> None:
    """Rewrite ``src``'s MatMuls with constant weights as 4-bit ``MatMulNBits`` (onnxruntime's
    ``MatMulNBitsQuantizer``, blocks of ``block_size``; asymmetric: with zero points) into ``out``."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    q = MatMulNBitsQuantizer(onnx.load(str(src)), block_size=block_size, is_symmetric=symmetric)
    q.process()
    q.model.save_model_to_file(str(Path(out)), use_external_data_format=False)
