"""A CTranslate2 Whisper model as PyTorch modules, and their ONNX export laid out as optimum's (what transformers.js
and onnxruntime users run): the peers ``bench/asr.py`` times Kiln against, on the very same weights.

:func:`whisper_modules` builds the encoder (normalised log-mel ``[1, n_mels, 3000]`` -> states ``[1, 1500, D]``)
and a decoder step (``input_ids [1, T]``, the self-attention cache of ``P`` tokens per layer, the cross-attention
keys and values) from the file's variables (:func:`kiln.frontend.whisper.read_whisper`), fp32; the first step is fed
the encoder's states instead of the cross keys and values and returns them. :func:`export_onnx` writes
``encoder.onnx``, ``decoder.onnx`` (the first step) and ``decoder_with_past.onnx``.

Needs PyTorch (an optional dependency) and, for the export, onnx.
"""

from __future__ import annotations

import os
from pathlib import Path


def whisper_modules(folder: str | os.PathLike):
    """``(encoder, decoder, config)``: PyTorch modules (eval mode, fp32) holding a CTranslate2 Whisper model's
    weights, and its :class:`kiln.frontend.whisper.WhisperConfig`.

    Batch 1 (reshapes name it, so the ONNX export keeps the token dims dynamic).
    ``decoder(ids, hidden=None, past=None, cross=None)``: ``ids`` int64 ``[1, T]``; the first step gives ``hidden``
    ``[1, 1500, D]``, later steps ``past`` (per layer ``(key, value)`` ``[1, H, P, hd]``) and ``cross`` (per layer
    ``(key, value)`` ``[1, H, 1500, hd]``). Returns ``(logits [1, T, vocab], presents, cross)``.
    """
    import torch
    import torch.nn.functional as F
    from torch import nn

    from kiln.frontend.whisper import read_whisper

    m = read_whisper(folder)
    c = m.config

    def t(name):
        return torch.tensor(m.w(name))

    class Part(nn.Module):
        """The file's variables under ``prefix`` as frozen parameters, and linear/LayerNorm by variable scope."""

        def __init__(self, prefix: str):
            super().__init__()
            self.w = nn.ParameterDict({k.replace("/", "__"): nn.Parameter(t(k), requires_grad=False)
                                       for k in m.variables if k.startswith(prefix) and m.variables[k].ndim
                                       and not k.startswith("decoder/projection")})

        def p(self, name):
            return self.w[name.replace("/", "__")]

        def lin(self, x, name):
            return F.linear(x, self.p(name + "/weight"), self.w.get((name + "/bias").replace("/", "__")))

        def ln(self, x, name):
            return F.layer_norm(x, (c.width,), self.p(name + "/gamma"), self.p(name + "/beta"), 1e-5)

    class Encoder(Part):
        def __init__(self):
            super().__init__("encoder/")

        def forward(self, mel):
            x = F.gelu(F.conv1d(mel, self.p("encoder/conv1/weight"), self.p("encoder/conv1/bias"), padding=1))
            x = F.gelu(F.conv1d(x, self.p("encoder/conv2/weight"), self.p("encoder/conv2/bias"), stride=2, padding=1))
            x = x.permute(0, 2, 1) + self.p("encoder/position_encodings/encodings")
            h_n = c.encoder_heads
            for i in range(c.encoder_layers):
                p = f"encoder/layer_{i}/"
                h = self.ln(x, p + "self_attention/layer_norm")
                qkv = self.lin(h, p + "self_attention/linear_0")
                q, k, v = (z.reshape(1, -1, h_n, c.width // h_n).transpose(1, 2) for z in qkv.chunk(3, dim=-1))
                a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(1, -1, c.width)
                x = x + self.lin(a, p + "self_attention/linear_1")
                h = F.gelu(self.lin(self.ln(x, p + "ffn/layer_norm"), p + "ffn/linear_0"))
                x = x + self.lin(h, p + "ffn/linear_1")
            return self.ln(x, "encoder/layer_norm")

    class Decoder(Part):
        def __init__(self):
            super().__init__("decoder/")

        def forward(self, ids, hidden=None, past=None, cross=None):
            heads = c.decoder_heads
            # positions and the causal mask from the run-time lengths: counted from tensors (an arange of a shape
            # would be traced as a constant into the ONNX export)
            steps = torch.cumsum(torch.ones_like(ids[0]), 0) - 1
            if past is not None:
                steps = steps + torch.ones_like(past[0][0][0, 0, :, 0], dtype=torch.long).sum()
            pos = F.embedding(steps, self.p("decoder/position_encodings/encodings"))
            x = F.embedding(ids, self.p("decoder/embeddings/weight")) + pos
            presents, crosses = [], []
            for i in range(c.decoder_layers):
                p = f"decoder/layer_{i}/"
                h = self.ln(x, p + "self_attention/layer_norm")
                q, k, v = (z.reshape(1, -1, heads, c.width // heads).transpose(1, 2)
                           for z in self.lin(h, p + "self_attention/linear_0").chunk(3, dim=-1))
                if past is not None:
                    k, v = torch.cat([past[i][0], k], dim=2), torch.cat([past[i][1], v], dim=2)
                presents.append((k, v))
                keys = torch.cumsum(torch.ones_like(k[0, 0, :, 0], dtype=torch.long), 0) - 1
                seen = keys[None, :] <= steps[:, None]  # causal: keys up to each query's position
                mask = torch.zeros_like(seen, dtype=q.dtype).masked_fill(~seen, float("-inf"))  # (exports dynamic)
                a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(1, -1, c.width)
                x = x + self.lin(a, p + "self_attention/linear_1")
                h = self.ln(x, p + "attention/layer_norm")
                q = self.lin(h, p + "attention/linear_0").reshape(1, -1, heads, c.width // heads).transpose(1, 2)
                if cross is None:
                    ck, cv = (z.reshape(1, -1, heads, c.width // heads).transpose(1, 2)
                              for z in self.lin(hidden, p + "attention/linear_1").chunk(2, dim=-1))
                else:
                    ck, cv = cross[i]
                crosses.append((ck, cv))
                a = F.scaled_dot_product_attention(q, ck, cv).transpose(1, 2).reshape(1, -1, c.width)
                x = x + self.lin(a, p + "attention/linear_2")
                h = self.ln(x, p + "ffn/layer_norm")
                x = x + self.lin(F.gelu(self.lin(h, p + "ffn/linear_0")), p + "ffn/linear_1")
            x = self.ln(x, "decoder/layer_norm")
            return x @ self.p("decoder/embeddings/weight").T, presents, crosses

    return Encoder().eval(), Decoder().eval(), c


def export_onnx(folder: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write ``encoder.onnx`` (``mel`` -> ``encoder_hidden_states``), ``decoder.onnx`` (``input_ids``,
    ``encoder_hidden_states`` -> ``logits``, ``present.l.key/value``, ``cross.l.key/value``) and
    ``decoder_with_past.onnx`` (``input_ids``, ``past.l.key/value``, ``cross.l.key/value`` -> ``logits``,
    ``present.l.key/value``) into folder ``out``, with run-time token and cache lengths (opset 18)."""
    import torch

    enc, dec, c = whisper_modules(folder)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    L, heads, hd = c.decoder_layers, c.decoder_heads, c.width // c.decoder_heads
    mel = torch.zeros(1, c.n_mels, 3000)
    ids = torch.tensor([[50257, 50362]])
    with torch.no_grad():
        torch.onnx.export(enc, (mel,), str(out / "encoder.onnx"), input_names=["mel"],
                          output_names=["encoder_hidden_states"], opset_version=18, dynamo=False)
        hidden = enc(mel)

        class First(torch.nn.Module):
            def forward(self, ids, hidden):
                logits, presents, crosses = dec(ids, hidden=hidden)
                return (logits, *[t for kv in presents for t in kv], *[t for kv in crosses for t in kv])

        names = [f"present.{i}.{kv}" for i in range(L) for kv in ("key", "value")]
        cross_names = [f"cross.{i}.{kv}" for i in range(L) for kv in ("key", "value")]
        torch.onnx.export(First(), (ids, hidden), str(out / "decoder.onnx"),
                          input_names=["input_ids", "encoder_hidden_states"],
                          output_names=["logits", *names, *cross_names], opset_version=18, dynamo=False,
                          dynamic_axes={"input_ids": {1: "sequence"}, "logits": {1: "sequence"},
                                        **{n: {2: "sequence"} for n in names}})

        class Step(torch.nn.Module):
            def forward(self, ids, *flat):
                past = [(flat[2 * i], flat[2 * i + 1]) for i in range(L)]
                cross = [(flat[2 * L + 2 * i], flat[2 * L + 2 * i + 1]) for i in range(L)]
                logits, presents, _ = dec(ids, past=past, cross=cross)
                return (logits, *[t for kv in presents for t in kv])

        past = [torch.zeros(1, heads, 2, hd) for _ in range(2 * L)]
        cross = [torch.zeros(1, heads, 1500, hd) for _ in range(2 * L)]
        past_names = [f"past.{i}.{kv}" for i in range(L) for kv in ("key", "value")]
        torch.onnx.export(Step(), (ids[:, :1], *past, *cross), str(out / "decoder_with_past.onnx"),
                          input_names=["input_ids", *past_names, *cross_names], output_names=["logits", *names],
                          opset_version=18, dynamo=False,
                          dynamic_axes={"input_ids": {1: "sequence"}, "logits": {1: "sequence"},
                                        **{n: {2: "past"} for n in past_names},
                                        **{n: {2: "total"} for n in names}})
    return out
