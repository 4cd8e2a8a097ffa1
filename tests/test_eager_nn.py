"""kiln.nn modules and kiln.optim optimizers against torch.nn / torch.optim (float64) on fresh random inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from eager_ref import close

import kiln
import kiln.eager as ke
from kiln import nn, optim
from kiln.errors import ShapeError


def _models():
    tm = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                             torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Dropout(0.5),
                             torch.nn.Linear(4 * 3 * 3, 5)).double()
    km = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                       nn.Dropout(0.5), nn.Linear(4 * 3 * 3, 5))
    return tm, km


def test_modules_match_torch(rng):
    """A small CNN with torch's weights: train-mode loss and every parameter gradient, running statistics,
    then eval-mode outputs."""
    torch.manual_seed(int(rng.integers(2**31)))
    tm, km = _models()
    assert list(km.state_dict()) == [k for k in tm.state_dict() if not k.endswith("num_batches_tracked")]
    km.load_state_dict({k: v for k, v in tm.state_dict().items() if not k.endswith("num_batches_tracked")})
    tm[5].p = km[5].p = 0.0  # dropout is random; its own test checks the mask
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    y = rng.integers(0, 5, 2)
    kl = nn.CrossEntropyLoss()(km(ke.tensor(x)), ke.tensor(y))
    tl = torch.nn.CrossEntropyLoss()(tm(torch.tensor(x.astype(np.float64))), torch.tensor(y))
    close(kl.numpy(), tl, "loss")
    kl.backward()
    tl.backward()
    scale = max(float(p.grad.abs().max()) for p in tm.parameters())
    for (name, kp), tp in zip(km.named_parameters(), tm.parameters()):
        close(kp.grad.numpy(), tp.grad, f"gradient of {name}", scale)  # 0.bias: exactly 0 (batch norm follows)
    close(km[1].running_mean.numpy(), tm[1].running_mean, "running mean")
    close(km[1].running_var.numpy(), tm[1].running_var, "running var")
    km.eval()
    tm.eval()
    assert not km[1].training
    close(km(ke.tensor(x)).numpy(), tm(torch.tensor(x.astype(np.float64))), "eval output")
    km.zero_grad()
    assert all(p.grad is None for p in km.parameters())


def test_state_dict_errors():
    m = nn.Linear(3, 2)
    sd = {k: v.numpy() for k, v in m.state_dict().items()}
    with pytest.raises(ShapeError, match="shape"):
        m.load_state_dict({**sd, "weight": np.zeros((2, 4), np.float32)})
    with pytest.raises(ShapeError, match="missing keys"):
        m.load_state_dict({"weight": sd["weight"]})
    m.load_state_dict({"weight": sd["weight"]}, strict=False)
    assert "Linear(in_features=3, out_features=2, bias=True)" in repr(nn.Sequential(m))


OPTIMIZERS = {
    "sgd": (lambda p: optim.SGD(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
    "sgd-momentum-decay": (lambda p: optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
                           lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    "sgd-nesterov": (lambda p: optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
                     lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True)),
    "adam": (lambda p: optim.Adam(p, lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
    "adam-decay": (lambda p: optim.Adam(p, lr=0.01, betas=(0.8, 0.99), weight_decay=0.1),
                   lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.99), weight_decay=0.1)),
    "adamw": (lambda p: optim.AdamW(p, lr=0.01, weight_decay=0.1), lambda p: torch.optim.AdamW(p, lr=0.01,
                                                                                             weight_decay=0.1)),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_matches_torch(rng, name):
    """10 steps on a small regression: the parameters after every step match torch.optim's."""
    make_k, make_t = OPTIMIZERS[name]
    km = nn.Linear(3, 2)
    tm = torch.nn.Linear(3, 2).double()
    tm.load_state_dict({k: torch.tensor(v.numpy().astype(np.float64)) for k, v in km.state_dict().items()})
    ko, to = make_k(km.parameters()), make_t(tm.parameters())
    x = rng.standard_normal((8, 3)).astype(np.float32)
    y = rng.standard_normal((8, 2)).astype(np.float32)
    kx, ky = ke.tensor(x), ke.tensor(y)
    tx, ty = torch.tensor(x.astype(np.float64)), torch.tensor(y.astype(np.float64))
    for step in range(10):
        ko.zero_grad()
        to.zero_grad()
        nn.MSELoss()(km(kx).tanh(), ky).backward()
        torch.nn.functional.mse_loss(tm(tx).tanh(), ty).backward()
        ko.step()
        to.step()
        for (pname, kp), tp in zip(km.named_parameters(), tm.parameters()):
            close(kp.numpy(), tp, f"{pname} after step {step + 1}")


def test_optimizer_errors():
    with pytest.raises(ValueError, match="empty"):
        optim.SGD([], lr=0.1)
    with pytest.raises(ValueError, match="requires_grad"):
        optim.Adam([kiln.zeros(3)])
    with pytest.raises(ValueError, match="Nesterov"):
        optim.SGD(nn.Linear(2, 2).parameters(), nesterov=True)


def test_fit_mlp_example(rng):
    """The TensorJS example (examples/fit_mlp.py): MLP 1 -> 128 -> 128 -> 1, ReLU, Adam, fitted to sin on [-pi, pi].

    Bound: MSE < 0.01 after 100 steps of batch 64 (8 seeds gave 4e-5 to 2.2e-4 at step 100, from 0.4-1.0 at step 1).
    """
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "fit_mlp.py"
    spec = importlib.util.spec_from_file_location("fit_mlp", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    curve = mod.fit(steps=100, batch=64, seed=int(rng.integers(2**31)), log=lambda line: None)
    assert curve[-1][0] == 100
    assert curve[-1][1] < 0.01, curve
    assert curve[-1][1] < curve[0][1] / 10, curve
