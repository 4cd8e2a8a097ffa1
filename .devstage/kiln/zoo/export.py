"""PyTorch architectures for the zoo models that ship as PyTorch weights, and their ONNX export.

Both are written from the published architectures with parameter names matching the
checkpoints, so ``load_state_dict(strict=True)`` proves every weight found its place:

- MobileNetV2 (Sandler et al., "MobileNetV2: Inverted Residuals and Linear Bottlenecks", CVPR 2018)
  with torchvision's module layout (``features.N...``, ``classifier.1``);
- BERT (Devlin et al., NAACL 2019) with Hugging Face ``BertModel``'s names (``embeddings.*``,
  ``encoder.layer.N.*``), as all-MiniLM-L6-v2 (6 layers, hidden 384, 12 heads, GELU (erf)).

Each export is run by onnxruntime and compared with the PyTorch module on random inputs.
PyTorch and onnxruntime are optional dependencies (``pip install torch onnxruntime``).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from kiln.errors import KilnError


def require() -> None:
    """Raise KilnError unless PyTorch and onnxruntime can be imported."""
    missing = []
    for mod in ("torch", "onnxruntime"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        raise KilnError(f"exporting this model needs {' and '.join(missing)}: pip install {' '.join(missing)}")


def mobilenet_v2_module():
    """An untrained torchvision-layout MobileNetV2 (1000 classes), in eval mode."""
    import torch
    from torch import nn

    def cbr(i, o, k=3, s=1, g=1):
        return nn.Sequential(nn.Conv2d(i, o, k, s, (k - 1) // 2, groups=g, bias=False), nn.BatchNorm2d(o),
                             nn.ReLU6(inplace=True))

    class InvertedResidual(nn.Module):
        def __init__(self, i, o, stride, expand):
            super().__init__()
            hidden = round(i * expand)
            self.residual = stride == 1 and i == o
            layers = [] if expand == 1 else [cbr(i, hidden, 1)]
            layers += [cbr(hidden, hidden, 3, stride, hidden), nn.Conv2d(hidden, o, 1, 1, 0, bias=False),
                       nn.BatchNorm2d(o)]
            self.conv = nn.Sequential(*layers)

        def forward(self, x):
            return x + self.conv(x) if self.residual else self.conv(x)

    class MobileNetV2(nn.Module):
        def __init__(self):
            super().__init__()
            features, c = [cbr(3, 32, 3, 2)], 32
            for t, o, n, s in [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2], [6, 96, 3, 1],
                               [6, 160, 3, 2], [6, 320, 1, 1]]:
                for j in range(n):
                    features.append(InvertedResidual(c, o, s if j == 0 else 1, t))
                    c = o
            features.append(cbr(c, 1280, 1))
            self.features = nn.Sequential(*features)
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, 1000))

        def forward(self, x):
            x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
            return self.classifier(torch.flatten(x, 1))

    return MobileNetV2().eval()


def bert_module(vocab: int = 30522, hidden: int = 384, layers: int = 6, heads: int = 12, ff: int = 1536,
                positions: int = 512, eps: float = 1e-12):
    """An untrained BERT encoder with Hugging Face ``BertModel`` parameter names (no pooler), in eval mode.

    ``forward(input_ids, attention_mask, token_type_ids)`` (int64 [batch, seq]) returns the
    last hidden state, float32 [batch, seq, hidden]; masked keys get the float32 minimum added
    to their attention scores, as ``BertModel`` does.
    """
    import torch
    from torch import nn

    class Embeddings(nn.Module):
        def __init__(self):
            super().__init__()
            self.word_embeddings = nn.Embedding(vocab, hidden)
            self.position_embeddings = nn.Embedding(positions, hidden)
            self.token_type_embeddings = nn.Embedding(2, hidden)
            self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

        def forward(self, ids, types):
            pos = torch.arange(ids.shape[1], device=ids.device)[None]
            return self.LayerNorm(self.word_embeddings(ids) + self.position_embeddings(pos)
                                  + self.token_type_embeddings(types))

    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))

        def forward(self, x, bias):
            b, s, _ = x.shape

            def split(t):
                return t.view(b, s, heads, hidden // heads).transpose(1, 2)

            q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
            p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hidden // heads) + bias, dim=-1)
            return (p @ v).transpose(1, 2).reshape(b, s, hidden)

    class DenseNorm(nn.Module):
        def __init__(self, i):
            super().__init__()
            self.dense = nn.Linear(i, hidden)
            self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

        def forward(self, x, residual):
            return self.LayerNorm(self.dense(x) + residual)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.self = SelfAttention()
            self.output = DenseNorm(hidden)

        def forward(self, x, bias):
            return self.output(self.self(x, bias), x)

    class Intermediate(nn.Module):
        def __init__(self):
            super().__init__()
            self.dense = nn.Linear(hidden, ff)

        def forward(self, x):
            return nn.functional.gelu(self.dense(x))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = Attention()
            self.intermediate = Intermediate()
            self.output = DenseNorm(ff)

        def forward(self, x, bias):
            a = self.attention(x, bias)
            return self.output(self.intermediate(a), a)

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.ModuleList(Layer() for _ in range(layers))

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            self.embeddings = Embeddings()
            self.encoder = Encoder()

        def forward(self, input_ids, attention_mask, token_type_ids):
            bias = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * torch.finfo(torch.float32).min
            x = self.embeddings(input_ids, token_type_ids)
            for layer in self.encoder.layer:
                x = layer(x, bias)
            return x

    return Bert().eval()


def _check(module, onnx_path: Path, feeds: dict[str, np.ndarray], atol: float) -> float:
    """Max abs difference between onnxruntime on ``onnx_path`` and ``module`` (KilnError beyond ``atol``)."""
    import onnxruntime as ort
    import torch

    with torch.no_grad():
        want = module(*(torch.from_numpy(v) for v in feeds.values())).numpy()
    got = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    err = float(np.abs(got - want).max())
    if not err <= atol:
        raise KilnError(f"the exported {onnx_path.name} differs from PyTorch by {err:.2e} (> {atol})")
    return err


def _export(module, args: tuple, path: Path, inputs: list[str], outputs: list[str], dynamic: dict) -> None:
    import torch

    part = path.with_name(path.name + ".part")
    with torch.no_grad():
        torch.onnx.export(module, args, str(part), input_names=inputs, output_names=outputs, opset_version=17,
                          dynamic_axes=dynamic, dynamo=False)
    part.replace(path)


def mobilenet_v2(weights: Path, out: Path) -> None:
    """Export torchvision's MobileNetV2 checkpoint ``weights`` (``.pth``) to ONNX ``out`` (opset 17):
    input ``input`` float32 [N,3,224,224], output ``logits`` [N,1000].

    Raises:
        KilnError: the export differs from PyTorch by more than 1e-4 (logits) on random inputs.
    """
    import torch

    m = mobilenet_v2_module()
    m.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True), strict=True)
    x = np.random.default_rng(0).standard_normal((2, 3, 224, 224)).astype(np.float32)
    _export(m, (torch.from_numpy(x[:1]),), out, ["input"], ["logits"], {"input": {0: "N"}, "logits": {0: "N"}})
    _check(m, out, {"input": x}, atol=1e-4)


def minilm(weights: Path, out: Path) -> None:
    """Export all-MiniLM-L6-v2's ``model.safetensors`` to ONNX ``out`` (opset 17): inputs ``input_ids``,
    ``attention_mask``, ``token_type_ids`` int64 [batch, seq], output ``last_hidden_state`` float32
    [batch, seq, 384].

    Raises:
        KilnError: a checkpoint tensor without a place in the module (or one missing), or the export
            differing from PyTorch by more than 1e-4 on random tokens.
    """
    import torch
    from safetensors.torch import load_file

    m = bert_module()
    state = {k: v for k, v in load_file(str(weights)).items()
             if not k.startswith("pooler.") and k != "embeddings.position_ids"}
    try:
        m.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise KilnError(f"{weights.name} does not fit the BERT architecture: {e}") from None
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 30522, (2, 9), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    types = np.zeros_like(ids)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    dynamic = {k: {0: "batch", 1: "seq"} for k in [*names, "last_hidden_state"]}
    _export(m, tuple(torch.from_numpy(a) for a in (ids, mask, types)), out, names, ["last_hidden_state"], dynamic)
    _check(m, out, dict(zip(names, (ids, mask, types))), atol=1e-4)
