"""The command line: the main job, and clear one-line errors with non-zero exit on bad input."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from conftest import CHELSEA, MOBILENET, ROOT
from onnx import TensorProto, helper

from kiln.package.format import write_manifest


def kiln(*args, check=False, timeout=600) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (as a user would)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", "from kiln.cli import run; run()", *map(str, args)],
                          check=False, capture_output=True, text=True, timeout=timeout, env=env)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode != 0
    err = proc.stderr.strip()
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: "), err
    for n in needles:
        assert n in err, err


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "mobilenet_v2"
    kiln("compile", MOBILENET, "--target", "webgpu", "-o", out, check=True)
    return out


def test_main_job_prints_egyptian_cat(package):
    proc = kiln("run", package, "--image", CHELSEA, "--repeat", "2", "--warmup", "1", check=True)
    first = proc.stdout.splitlines()[0].split()
    assert " ".join(first[2:]) == "Egyptian cat"
    assert abs(float(first[0]) - 0.714) < 0.01
    assert "median" in proc.stdout and "ms per run" in proc.stdout


def test_run_npz_in_and_out(package, tmp_path, reference_npz):
    np.savez(tmp_path / "in.npz", input=reference_npz["coffee_input"])
    kiln("run", package, "--inputs", tmp_path / "in.npz", "--outputs", tmp_path / "out.npz", "--repeat", "1",
         "--warmup-s", "0.2", check=True)
    with np.load(tmp_path / "out.npz") as z:
        assert np.abs(z["logits"] - reference_npz["coffee_logits"]).max() <= 1e-3
    assert_one_line_error(kiln("run", package, "--inputs", tmp_path / "in.npz", "--outputs", tmp_path / "out.npz"),
                          "already exists", "--force")


def test_info(package):
    out = kiln("info", package, check=True).stdout
    for needle in ("input: float32[1, 3, 224, 224]", "logits: float32[1, 1000]", "kernels", "weights:",
                   "activations:", "unshared"):
        assert needle in out


def test_help_for_every_command():
    for cmd in ([], ["compile"], ["run"], ["serve"], ["info"]):
        proc = kiln(*cmd, "--help", check=True)
        assert "Usage:" in proc.stdout


def test_missing_model(tmp_path):
    assert_one_line_error(kiln("compile", tmp_path / "nope.onnx", "-o", tmp_path / "o"), "no such file")


def test_not_onnx(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not a protobuf \x00\xff" * 10)
    assert_one_line_error(kiln("compile", bad, "-o", tmp_path / "o"), "not an ONNX model")
    assert not (tmp_path / "o").exists()


def test_unsupported_ops_listed_at_once(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    # ops Kiln does not convert (string ops)
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="ok"),
             helper.make_node("StringNormalizer", ["a"], ["b"], name="u1"),
             helper.make_node("RegexFullMatch", ["b"], ["c"], name="nz", pattern="x"),
             helper.make_node("StringNormalizer", ["c"], ["y"], name="u2")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 20)])
    onnx.save(model, tmp_path / "m.onnx")
    proc = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "o")
    assert_one_line_error(proc, "StringNormalizer", "RegexFullMatch", "'u1'", "'u2'", "'nz'", "opset 20")


def test_existing_output_dir_needs_force(package, tmp_path):
    assert_one_line_error(kiln("compile", MOBILENET, "-o", package), "already exists", "--force")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("user data")
    assert_one_line_error(kiln("compile", MOBILENET, "-o", mine, "--force"), "not a Kiln package")
    assert (mine / "notes.txt").read_text() == "user data"


def test_wrong_input_name_shape_dtype(package, tmp_path):
    np.savez(tmp_path / "name.npz", image=np.zeros((1, 3, 224, 224), np.float32))
    assert_one_line_error(kiln("run", package, "--inputs", tmp_path / "name.npz"), "unknown input 'image'", "'input'")
    np.savez(tmp_path / "shape.npz", input=np.zeros((1, 3, 200, 224), np.float32))
    assert_one_line_error(kiln("run", package, "--inputs", tmp_path / "shape.npz"), "expected shape [1, 3, 224, 224]",
                          "[1, 3, 200, 224]")
    np.savez(tmp_path / "dtype.npz", input=np.zeros((1, 3, 224, 224), np.float64))
    assert_one_line_error(kiln("run", package, "--inputs", tmp_path / "dtype.npz"), "expected dtype float32", "float64")


def test_bad_package_and_image(package, tmp_path):
    assert_one_line_error(kiln("run", tmp_path / "nowhere"), "no such package")
    assert_one_line_error(kiln("info", tmp_path), "not a Kiln package")
    assert_one_line_error(kiln("run", package, "--image", tmp_path / "none.png"), "no such image")
    txt = tmp_path / "fake.png"
    txt.write_text("hello")
    assert_one_line_error(kiln("run", package, "--image", txt), "not an image")


def test_corrupted_weights_refused(package, tmp_path):
    import shutil

    copy = tmp_path / "pkg"
    shutil.copytree(package, copy)
    w = copy / "weights.safetensors"
    data = bytearray(w.read_bytes())
    data[-10] ^= 0xFF
    w.write_bytes(bytes(data))
    assert_one_line_error(kiln("run", copy, "--repeat", "1"), "checksum mismatch")


def test_newer_format_refused(package, tmp_path):
    import json
    import shutil

    copy = tmp_path / "pkg"
    shutil.copytree(package, copy)
    m = json.loads((copy / "manifest.json").read_text())
    m["version"] = "2.0"
    write_manifest(copy, m)
    assert_one_line_error(kiln("info", copy), "newer than this Kiln reads")
