"""The PyTorch frontend: ``kiln.compile(module, example_inputs, out=...)`` against the module's own output."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import kiln
from kiln.errors import KilnError

torch = pytest.importorskip("torch")
nn = torch.nn


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, stride=2, groups=2), nn.Hardswish(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(16, 5)

    def forward(self, image):
        return torch.softmax(self.head(torch.flatten(self.features(image), 1)), dim=-1)


class Block(nn.Module):
    """A pre-norm transformer block: multi-head self-attention with a key padding mask, then a GELU MLP."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, tokens, mask):
        b, s, d = tokens.shape
        q, k, v = self.qkv(self.norm1(tokens)).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        scores = q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5
        scores = scores.masked_fill(mask[:, None, None, :] == 0, -1e9)
        att = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(b, s, d)
        x = tokens + self.proj(att)
        return x + self.mlp(self.norm2(x)), scores.amax(-1)


def _randomise_norms(module, gen):
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5, generator=gen)
            m.running_var.uniform_(0.5, 2.0, generator=gen)


def test_small_cnn_matches_torch(tmp_path, rng):
    gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
    torch.manual_seed(int(rng.integers(2**31)))
    model = SmallCNN().eval()
    _randomise_norms(model, gen)
    x = torch.randn(2, 3, 16, 16, generator=gen)
    pkg = kiln.compile(model, (x,), out=tmp_path / "cnn", dynamic_axes={"image": {0: "batch"}},
                       device_class="cpu")
    session = kiln.load(pkg, poison=True)
    assert [i["name"] for i in session.inputs] == ["image"] and [o["name"] for o in session.outputs] == ["output"]
    assert session.inputs[0]["shape"] == [2, 3, 16, 16] and session.inputs[0]["symbolic_shape"][0] == "batch"
    with torch.no_grad():
        expected = model(x).numpy()
    np.testing.assert_allclose(session.run({"image": x.numpy()})["output"], expected, rtol=1e-4, atol=1e-5)


def test_attention_block_matches_torch_with_bound_dims(tmp_path, rng):
    torch.manual_seed(int(rng.integers(2**31)))
    model = Block().eval()
    x = torch.randn(1, 5, 32)
    mask = torch.ones(1, 5, dtype=torch.int64)
    pkg = kiln.compile(model, (x, mask), out=tmp_path / "block", output_names=["hidden", "peak"],
                       dynamic_axes={"tokens": {0: "batch", 1: "seq"}, "mask": {0: "batch", 1: "seq"}},
                       dims={"batch": 3, "seq": 7}, device_class="cpu")
    session = kiln.load(pkg, poison=True)
    assert session.inputs[0]["shape"] == [3, 7, 32]  # dims bind the dynamic axes, not the example's sizes
    xs = torch.from_numpy(rng.standard_normal((3, 7, 32)).astype(np.float32))
    ms = torch.from_numpy((rng.uniform(size=(3, 7)) > 0.3).astype(np.int64))
    ms[:, 0] = 1
    with torch.no_grad():
        hidden, peak = (t.numpy() for t in model(xs, ms))
    got = session.run({"tokens": xs.numpy(), "mask": ms.numpy()})
    np.testing.assert_allclose(got["hidden"], hidden, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["peak"], peak, rtol=1e-4, atol=1e-4)


def test_data_dependent_shape(tmp_path, rng):
    class Positives(nn.Module):
        def forward(self, x):
            return x[x > 0] * 2  # data-dependent output shape: ONNX NonZero and GatherND

    session = kiln.load(kiln.compile(Positives(), (torch.randn(6),), out=tmp_path / "nz"))
    for _ in range(3):
        x = rng.standard_normal(6).astype(np.float32)
        np.testing.assert_allclose(session.run({session.inputs[0]["name"]: x})[session.outputs[0]["name"]],
                                   x[x > 0] * 2, rtol=1e-6)


def test_export_failure_is_a_kiln_error(tmp_path):
    class Complex(nn.Module):
        def forward(self, x):
            return torch.view_as_real(torch.fft.fft(x))

    with pytest.raises(KilnError, match="torch.onnx.export could not export Complex"):
        kiln.compile(Complex(), (torch.randn(8),), out=tmp_path / "fft")


def test_bad_arguments(tmp_path):
    with pytest.raises(KilnError, match="not a torch.Tensor"):
        kiln.compile(SmallCNN(), (np.zeros((1, 3, 8, 8), np.float32),), out=tmp_path / "a")
    with pytest.raises(KilnError, match="needs example inputs"):
        kiln.compile(SmallCNN(), out=tmp_path / "b")
    with pytest.raises(KilnError, match="expected a size"):
        kiln.compile(SmallCNN(), (torch.randn(1, 3, 8, 8),), out=tmp_path / "c",
                     dynamic_axes={"image": {0: "batch"}}, dims={"batch": (1, 8)})


def test_missing_torch_is_a_clear_error(tmp_path, monkeypatch):
    class FakeModule:  # what a module looks like when torch cannot be imported
        def forward(self, x):
            return x

    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    with pytest.raises(KilnError, match="needs PyTorch, which is not installed"):
        kiln.compile(FakeModule(), ([1.0],), out=tmp_path / "m")
