"""Compiled training (kiln.train, kiln.passes.autodiff): train-step graphs and packages against PyTorch.

Kiln's train steps run in float32 on lavapipe; PyTorch's reference runs in float64 on the CPU from the same
ONNX weights. Gradients and updated weights must agree within 1e-4 relative (:func:`eager_ref.close`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from eager_ref import close, torch  # eager_ref makes Triton unimportable first
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.errors import KilnError
from kiln.ir import interp
from kiln.package.format import VERSION
from kiln.train import OptimizerConfig, TrainOptions, build_train_graph

F = torch.nn.functional
ROOT = Path(__file__).resolve().parents[1]
MOBILENET = ROOT / "models" / "mobilenet_v2_imagenet.onnx"


def _model(nodes, inputs, outputs, inits: dict[str, np.ndarray]) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "m", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(m)
    return m


def small_cnn(rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Conv+bias -> BatchNormalization -> Relu -> MaxPool -> strided Conv -> Clip(0, 6) -> depthwise Conv + residual
    Add -> AveragePool -> GlobalAveragePool -> Flatten -> Gemm(transB): MobileNetV2's ops and pools, on 3x8x8."""
    def w(*s):
        return (rng.standard_normal(s) * 0.4).astype(np.float32)

    inits = {"c1.w": w(4, 3, 3, 3), "c1.b": w(4), "bn.s": 1 + 0.1 * w(4), "bn.b": w(4), "bn.m": 0.1 * w(4),
             "bn.v": 1 + np.abs(w(4)), "c2.w": w(6, 4, 3, 3), "c2.b": w(6), "c3.w": w(6, 1, 3, 3), "fc.w": w(5, 6),
             "fc.b": w(5), "lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}
    nodes = [helper.make_node("Conv", ["x", "c1.w", "c1.b"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["a", "bn.s", "bn.b", "bn.m", "bn.v"], ["bn"]),
             helper.make_node("Relu", ["bn"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["mp", "c2.w", "c2.b"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Clip", ["c2", "lo", "hi"], ["cl"]),
             helper.make_node("Conv", ["cl", "c3.w"], ["c3"], pads=[1, 1, 1, 1], group=6),
             helper.make_node("Add", ["c3", "cl"], ["res"]),
             helper.make_node("AveragePool", ["res"], ["ap"], kernel_shape=[2, 2], strides=[1, 1]),
             helper.make_node("GlobalAveragePool", ["ap"], ["gap"]),
             helper.make_node("Flatten", ["gap"], ["fl"]),
             helper.make_node("Gemm", ["fl", "fc.w", "fc.b"], ["logits"], transB=1)]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
               [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 5])], inits)
    return m, inits


def torch_cnn(p: dict, x):
    """The same network in PyTorch over parameter dict ``p`` (BatchNormalization in inference form)."""
    a = F.conv2d(x, p["c1.w"], p["c1.b"], padding=1)
    s = p["bn.s"] / torch.sqrt(p["bn.v"] + 1e-5)
    a = F.max_pool2d(F.relu(a * s[None, :, None, None] + (p["bn.b"] - p["bn.m"] * s)[None, :, None, None]), 2)
    c2 = torch.clamp(F.conv2d(a, p["c2.w"], p["c2.b"], padding=1, stride=2), 0, 6)
    r = F.avg_pool2d(F.conv2d(c2, p["c3.w"], padding=1, groups=6) + c2, 2, stride=1).mean((2, 3))
    return r @ p["fc.w"].T + p["fc.b"]


TRAINABLE = ["c1.w", "c1.b", "bn.s", "bn.b", "c2.w", "c2.b", "c3.w", "fc.w", "fc.b"]


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    """The small CNN compiled with every weight trainable (Adam, gradient outputs), batch 2."""
    rng = np.random.default_rng(5)
    model, inits = small_cnn(rng)
    d = tmp_path_factory.mktemp("train")
    onnx.save(model, str(d / "cnn.onnx"))
    opts = TrainOptions(trainable="*.w,*.b,bn.s", optimizer=OptimizerConfig("adam", lr=0.01, weight_decay=0.01),
                        gradients=True)
    pkg = kiln.compile(str(d / "cnn.onnx"), str(d / "pkg"), dims={"N": 2}, train=opts, device_class="cpu")
    return pkg, inits, rng


def test_whole_cnn_train_steps_match_pytorch(cnn):
    """Every weight trainable: the first step's loss and gradients, then 10 Adam steps (L2 weight decay)
    next to torch.optim.Adam, then inference with the trained weights."""
    pkg, inits, rng = cnn
    session = kiln.load(pkg)
    assert session.train_inputs[1]["name"] == "labels" and session.train_inputs[1]["dtype"] == "int64"
    p = {k: torch.tensor(inits[k].astype(np.float64), requires_grad=True) for k in TRAINABLE}
    frozen = {k: torch.tensor(inits[k].astype(np.float64)) for k in ("bn.m", "bn.v")}
    opt = torch.optim.Adam(p.values(), lr=0.01, weight_decay=0.01)
    for step in range(10):
        x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
        y = rng.integers(0, 5, 2)
        out = session.train_step({"x": x, "labels": y}, return_outputs=True)
        opt.zero_grad()
        loss = F.cross_entropy(torch_cnn({**p, **frozen}, torch.tensor(x, dtype=torch.float64)), torch.tensor(y))
        loss.backward()
        close(np.asarray(out["loss"]), loss, f"loss, step {step}")
        if step == 0:
            for k in TRAINABLE:
                close(out[f"grad/{k}"], p[k].grad, f"gradient of {k}")
        opt.step()
    for k, v in session.state().items():
        close(v, p[k], f"{k} after 10 Adam steps")
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    close(session.run({"x": x})["logits"], torch_cnn({**p, **frozen}, torch.tensor(x, dtype=torch.float64)),
          "inference with the trained weights")
    opt_state = session.state(optimizer=True)
    close(opt_state["step"], np.array([10.0]), "step count")
    close(opt_state["fc.w.exp_avg_sq"], opt.state[p["fc.w"]]["exp_avg_sq"], "Adam's second moment")


def test_export_weights_safetensors(cnn, tmp_path):
    from safetensors.numpy import load_file

    session = kiln.load(cnn[0])
    path = session.export_weights(tmp_path / "w.safetensors")
    loaded = load_file(str(path))
    assert sorted(loaded) == sorted(TRAINABLE)
    np.testing.assert_array_equal(loaded["fc.w"], cnn[1]["fc.w"])  # a fresh session holds the initial weights
    with pytest.raises(FileExistsError):
        session.export_weights(path)
    assert "fc.w.exp_avg" in load_file(str(session.export_weights(path, optimizer=True, force=True)))


def test_manifest_training_section(cnn):
    m = json.loads((cnn[0] / "manifest.json").read_text())
    assert m["version"] == VERSION
    t = m["training"]
    assert [i["name"] for i in m["inputs"]] == ["x"] and [o["name"] for o in m["outputs"]] == ["logits"]
    assert [i["name"] for i in t["inputs"]] == ["x", "labels"] and t["outputs"][0]["name"] == "loss"
    assert t["trainable"] == TRAINABLE and t["optimizer"]["name"] == "adam"
    kinds = {b["id"]: b for b in m["buffers"]}
    for s in t["state"]:
        assert kinds[s["update"]]["kind"] == "update"
        assert kinds[s["buffer"]]["kind"] == ("weight" if s["kind"] == "param" else "state")
        assert s["kind"] != "param" or kinds[s["buffer"]]["trainable"]
    plan, train_plan = m["targets"]["webgpu"]["plan"], m["targets"]["webgpu"]["train_plan"]
    assert len(plan) < len(train_plan)
    assert (cnn[0] / "train.html").is_file() and (cnn[0] / "train.js").is_file()


def mlp(rng):
    """x [4, 3] -> MatMul -> Add -> Tanh -> MatMul -> Add -> Sigmoid -> Mul by x-derived gate -> prediction [4, 2]."""
    inits = {"w1": (rng.standard_normal((3, 8)) * 0.5).astype(np.float32), "b1": rng.standard_normal(8).astype(np.float32),
             "w2": (rng.standard_normal((8, 2)) * 0.5).astype(np.float32), "b2": rng.standard_normal(2).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Tanh", ["hb"], ["t"]), helper.make_node("MatMul", ["t", "w2"], ["o"]),
             helper.make_node("Add", ["o", "b2"], ["ob"]), helper.make_node("Sigmoid", ["ob"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2])], inits)
    return m, inits


def test_mlp_mse_sgd_nesterov_matches_torch_optim(tmp_path, rng):
    model, inits = mlp(rng)
    onnx.save(model, str(tmp_path / "mlp.onnx"))
    cfg = OptimizerConfig("sgd", lr=0.5, momentum=0.9, nesterov=True, weight_decay=1e-3)
    session = kiln.load(kiln.compile(str(tmp_path / "mlp.onnx"), str(tmp_path / "pkg"), device_class="cpu",
                                     train=TrainOptions(trainable="*", loss="mse", optimizer=cfg)))
    p = {k: torch.tensor(v.astype(np.float64), requires_grad=True) for k, v in inits.items()}
    opt = torch.optim.SGD(p.values(), lr=0.5, momentum=0.9, nesterov=True, weight_decay=1e-3)
    for step in range(5):
        x = rng.standard_normal((4, 3)).astype(np.float32)
        t = rng.uniform(0, 1, (4, 2)).astype(np.float32)
        loss = session.train_step({"x": x, "labels": t})
        opt.zero_grad()
        xt = torch.tensor(x, dtype=torch.float64)
        want = F.mse_loss(torch.sigmoid(torch.tanh(xt @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]),
                          torch.tensor(t, dtype=torch.float64))
        want.backward()
        opt.step()
        close(np.asarray(loss), want, f"loss, step {step}")
    for k, v in session.state().items():
        close(v, p[k], f"{k} after 5 SGD steps")


def test_backward_rules_of_elementwise_layout_and_reductions_in_the_interpreter(rng):
    """Gradients of the IR's backward rules (numpy interpreter: the executable spec) against PyTorch on a graph of
    Mul, Exp, Log, Sqrt, Tanh, Sigmoid, Div, Sub, Max, Pow, LeakyRelu, Abs, Where, Transpose, Concat, Slice,
    Pad, ReduceMax, ReduceMean, Softmax and MatMul with broadcasting."""
    inits = {"a": rng.uniform(0.5, 1.5, (1, 3, 4)).astype(np.float32), "w": rng.standard_normal((6, 5)).astype(np.float32),
             "two": np.array(2.0, np.float32), "half": np.array(1.5, np.float32)}
    mk = helper.make_node
    nodes = [mk("Mul", ["x", "a"], ["xa"]), mk("Exp", ["xa"], ["e"]), mk("Add", ["e", "half"], ["e1"]),
             mk("Log", ["e1"], ["l"]), mk("Sqrt", ["e1"], ["s"]), mk("Tanh", ["xa"], ["t"]), mk("Sigmoid", ["l"], ["sg"]),
             mk("Div", ["t", "s"], ["d"]), mk("Max", ["d", "sg"], ["mx"]), mk("Pow", ["xa", "two"], ["p2"]),
             mk("Sub", ["mx", "p2"], ["sb"]), mk("LeakyRelu", ["sb"], ["lr"], alpha=0.1), mk("Abs", ["xa"], ["ab"]),
             mk("Greater", ["xa", "sg"], ["gt"]), mk("Where", ["gt", "lr", "ab"], ["wh"]),
             mk("Transpose", ["wh"], ["tr"], perm=[0, 2, 1]), mk("Concat", ["tr", "tr"], ["cc"], axis=2),
             mk("Slice", ["cc", "st", "en", "ax"], ["sl"]), mk("Pad", ["sl", "pads"], ["pd"]),
             mk("ReduceMax", ["pd"], ["rm"], axes=[1], keepdims=1), mk("Sub", ["pd", "rm"], ["cen"]),
             mk("Softmax", ["cen"], ["sm"], axis=2), mk("MatMul", ["sm", "w"], ["mm"]),
             mk("ReduceMean", ["mm"], ["y"], axes=[1], keepdims=0)]
    inits.update({"st": np.array([1], np.int64), "en": np.array([5], np.int64), "ax": np.array([2], np.int64),
                  "pads": np.array([0, 0, 1, 0, 0, 1], np.int64)})
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])], inits)
    tg = build_train_graph(model, TrainOptions(trainable="a,w", loss="mse", gradients=True))
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    t = rng.standard_normal((2, 5)).astype(np.float32)
    out = interp.run(tg.graph, {"x": x, "labels": t, **{s.value.name: s.init for s in tg.state if s.init is not None},
                                **{s.value.name: np.zeros(s.value.shape, np.float32) for s in tg.state if s.init is None}})
    p = {k: torch.tensor(inits[k].astype(np.float64), requires_grad=True) for k in ("a", "w")}
    xa = torch.tensor(x, dtype=torch.float64) * p["a"]
    e1 = torch.exp(xa) + 1.5
    sg = torch.sigmoid(torch.log(e1))
    lr = F.leaky_relu(torch.maximum(torch.tanh(xa) / torch.sqrt(e1), sg) - xa**2, 0.1)
    tr = torch.where(xa > sg, lr, xa.abs()).transpose(1, 2)
    pd = F.pad(torch.cat([tr, tr], 2)[:, :, 1:5], (1, 1))
    cen = pd - pd.amax(1, keepdim=True)
    y = (torch.softmax(cen, 2) @ p["w"]).mean(1)
    loss = F.mse_loss(y, torch.tensor(t, dtype=torch.float64))
    loss.backward()
    close(np.asarray(out["loss"]), loss, "loss")
    for k in ("a", "w"):
        close(out[f"grad/{k}"], p[k].grad, f"gradient of {k}")


@pytest.fixture(scope="module")
def trunk_features(tmp_path_factory):
    """Two random images and MobileNetV2's pooled trunk features for them, from onnxruntime."""
    import onnx.utils
    import onnxruntime as ort

    d = tmp_path_factory.mktemp("mnv2")
    model = onnx.load(str(MOBILENET))
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    onnx.utils.extract_model(str(MOBILENET), str(d / "trunk.onnx"), [model.graph.input[0].name], [gemm.input[0]])
    x = np.random.default_rng(11).standard_normal((2, 3, 224, 224)).astype(np.float32)
    feats = ort.InferenceSession(str(d / "trunk.onnx"), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    head = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if t.name.startswith("classifier")}
    return d, x, feats.reshape(2, -1).astype(np.float64), head


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_mobilenet_v2_last_layer_train_step_matches_pytorch(trunk_features, optimizer):
    """MobileNetV2 with only its classifier trainable: one SGD step (gradients and new weights), or 10 Adam steps,
    against a PyTorch Linear + cross-entropy + torch.optim on onnxruntime's trunk features of the same images.
    The frozen trunk gets no backward kernels."""
    d, x, feats, head = trunk_features
    cfg = OptimizerConfig(optimizer, lr=0.1 if optimizer == "sgd" else 1e-3)
    pkg = kiln.compile(str(MOBILENET), str(d / optimizer), dims={"N": 2}, device_class="cpu",
                       train=TrainOptions(trainable="classifier.*", optimizer=cfg, gradients=optimizer == "sgd"))
    m = json.loads((pkg / "manifest.json").read_text())
    ops = {op for s in m["targets"]["webgpu"]["train_plan"] for op in m["targets"]["webgpu"]["kernels"][s["kernel"]]["ops"]}
    assert not ops & {"ConvTranspose", "ConvWeightGrad"}, "the frozen trunk must get no backward kernels"
    session = kiln.load(pkg)
    w = torch.tensor(head["classifier.1.weight"].astype(np.float64), requires_grad=True)
    b = torch.tensor(head["classifier.1.bias"].astype(np.float64), requires_grad=True)
    opt = (torch.optim.SGD if optimizer == "sgd" else torch.optim.Adam)([w, b], lr=cfg.lr)
    labels = np.array([3, 285])
    for step in range(1 if optimizer == "sgd" else 10):
        out = session.train_step({"input": x, "labels": labels}, return_outputs=True)
        opt.zero_grad()
        loss = F.cross_entropy(torch.tensor(feats) @ w.T + b, torch.tensor(labels))
        loss.backward()
        close(np.asarray(out["loss"]), loss, f"loss, step {step}")
        if optimizer == "sgd":
            close(out["grad/classifier.1.weight"], w.grad, "gradient of the classifier's weight")
            close(out["grad/classifier.1.bias"], b.grad, "gradient of the classifier's bias")
        opt.step()
    state = session.state()
    close(state["classifier.1.weight"], w, f"classifier weight after {optimizer}")
    close(state["classifier.1.bias"], b, f"classifier bias after {optimizer}")


def test_errors(tmp_path, rng, mobilenet_package):
    model, _ = mlp(rng)
    onnx.save(model, str(tmp_path / "mlp.onnx"))
    with pytest.raises(KilnError, match="matches no float32 initializer"):
        build_train_graph(model, TrainOptions(trainable="nothing.*"))
    with pytest.raises(KilnError, match="unknown loss"):
        build_train_graph(model, TrainOptions(loss="hinge"))
    with pytest.raises(KilnError, match="webgpu target only"):
        kiln.compile(str(tmp_path / "mlp.onnx"), str(tmp_path / "p"), target="wasm", train=TrainOptions(loss="mse"))
    with pytest.raises(KilnError, match="hyperparameters out of range"):
        build_train_graph(model, TrainOptions(loss="mse", optimizer=OptimizerConfig("adam", lr=-1)))
    with pytest.raises(KilnError, match="not a train-step package"):
        kiln.load(mobilenet_package).train_step({})


def test_cli_compile_train(tmp_path, rng):
    import os
    import subprocess
    import sys

    model, _ = mlp(rng)
    onnx.save(model, str(tmp_path / "mlp.onnx"))

    def cli(*args):
        return subprocess.run([sys.executable, "-c", "from kiln.cli import run; run()", *map(str, args)],
                              check=False, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})

    proc = cli("compile", tmp_path / "mlp.onnx", "-o", tmp_path / "pkg", "--train", "--trainable", "w*,b2",
               "--loss", "mse", "--optimizer", "adam", "--lr", "0.01", "--device-class", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert "train step:" in proc.stdout and "3 trainable tensors, adam" in proc.stdout, proc.stdout
    training = json.loads((tmp_path / "pkg" / "manifest.json").read_text())["training"]
    assert training["trainable"] == ["w1", "w2", "b2"] and training["optimizer"]["lr"] == 0.01
    proc = cli("compile", tmp_path / "mlp.onnx", "-o", tmp_path / "pkg2", "--train", "--trainable", "fc.*")
    assert proc.returncode != 0 and proc.stderr.startswith("error: ") and "'fc.*'" in proc.stderr, proc.stderr
