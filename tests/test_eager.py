"""Eager tensors and autodiff (issue 5) against PyTorch (CPU, float64) on fresh random inputs.

Every differentiable op is checked forward and backward: Kiln runs in float32 on the shared
wgpu device, PyTorch in float64 on the same inputs, and the gradients for a random upstream
gradient (a vector-Jacobian product, so every entry of the Jacobian matters) must agree within
1e-4 relative (elementwise, with an absolute floor of 1e-5 of the tensor's largest magnitude
for entries that cancel to nearly 0). Shapes are small and shared between tests so kernels
compile once (lavapipe compiles shaders slowly).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from eager_ref import close

import kiln.eager as ke
from kiln.eager import functional as F
from kiln.errors import KilnError, ShapeError


@pytest.fixture(autouse=True, scope="module")
def _torch_float64():
    """PyTorch references in float64 for this module only (the default dtype is process-wide: other
    modules, e.g. the PyTorch frontend's tests, build float32 modules)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def check(rng, kfn, tfn, shapes, positive: bool = False, grads: bool = True) -> None:
    """Run ``kfn`` on Kiln tensors and ``tfn`` on torch tensors of the same random ``shapes``; compare
    the outputs and the input gradients for a random upstream gradient."""
    data = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    if positive:
        data = [np.abs(d) + 0.5 for d in data]
    kx = [ke.tensor(d, requires_grad=grads) for d in data]
    tx = [torch.tensor(d.astype(np.float64), requires_grad=grads) for d in data]
    kout, tout = kfn(*kx), tfn(*tx)
    close(kout.numpy(), tout, "forward")
    if not grads:
        return
    up = rng.standard_normal(tuple(tout.shape)).astype(np.float32)
    kout.backward(ke.tensor(up))
    tout.backward(torch.tensor(up.astype(np.float64)))
    for k, (a, b) in enumerate(zip(kx, tx)):
        close(a.grad.numpy(), b.grad, f"gradient of input {k}")


S = (3, 4)  # the shared elementwise shape

BINARY = {
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "sub": (lambda a, b: a - b, lambda a, b: a - b),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "div": (lambda a, b: a / b, lambda a, b: a / b),
    "maximum": (ke.maximum, torch.maximum),
    "minimum": (ke.minimum, torch.minimum),
}


@pytest.mark.parametrize("op", sorted(BINARY))
@pytest.mark.parametrize("shapes", [(S, S), (S, (4,)), ((3, 1), (1, 4))], ids=["same", "row", "outer"])
def test_binary(rng, op, shapes):
    kfn, tfn = BINARY[op]
    check(rng, kfn, tfn, shapes, positive=op == "div")


def test_pow(rng):
    check(rng, lambda a: a ** 3.0, lambda a: a ** 3.0, [S])
    check(rng, lambda a: a ** 2, lambda a: a ** 2, [S])
    check(rng, lambda a, b: a ** b, lambda a, b: a ** b, [S, (4,)], positive=True)
    check(rng, lambda a: 2.0 ** a, lambda a: 2.0 ** a, [S])


def test_scalar_operands(rng):
    check(rng, lambda a: (2.5 - a) * 3.0 / 1.5 + 1, lambda a: (2.5 - a) * 3.0 / 1.5 + 1, [S])
    check(rng, lambda a: 1.0 / a, lambda a: 1.0 / a, [S], positive=True)


UNARY = {
    "neg": (lambda x: -x, lambda x: -x, False),
    "exp": (ke.exp, torch.exp, False),
    "log": (ke.log, torch.log, True),
    "sqrt": (ke.sqrt, torch.sqrt, True),
    "tanh": (ke.tanh, torch.tanh, False),
    "sigmoid": (ke.sigmoid, torch.sigmoid, False),
    "relu": (ke.relu, torch.relu, False),
    "leaky_relu": (lambda x: ke.leaky_relu(x, 0.1), lambda x: torch.nn.functional.leaky_relu(x, 0.1), False),
    "abs": (ke.abs, torch.abs, False),
    "sin": (ke.sin, torch.sin, False),
    "cos": (ke.cos, torch.cos, False),
    "reciprocal": (ke.reciprocal, torch.reciprocal, True),
    "clamp": (lambda x: ke.clamp(x, -0.5, 0.7), lambda x: torch.clamp(x, -0.5, 0.7), False),
    "square": (lambda x: x.square(), torch.square, False),
    "erf": (ke.erf, torch.erf, False),
    "gelu": (ke.gelu, torch.nn.functional.gelu, False),
    "softplus": (ke.softplus, torch.nn.functional.softplus, False),
    "elu": (lambda x: ke.elu(x, 0.7), lambda x: torch.nn.functional.elu(x, 0.7), False),
    "selu": (ke.selu, torch.selu, False),
    "silu": (ke.silu, torch.nn.functional.silu, False),
    "mish": (ke.mish, torch.nn.functional.mish, False),
    "softsign": (ke.softsign, torch.nn.functional.softsign, False),
    "hardsigmoid": (lambda x: ke.hardsigmoid(x * 4.0), lambda x: torch.nn.functional.hardsigmoid(x * 4.0), False),
    "tan": (ke.tan, torch.tan, False),
    "atan": (ke.atan, torch.atan, False),
    "sinh": (ke.sinh, torch.sinh, False),
    "cosh": (ke.cosh, torch.cosh, False),
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(rng, op):
    kfn, tfn, positive = UNARY[op]
    check(rng, kfn, tfn, [S], positive=positive)


def test_where(rng):
    check(rng, lambda a, b: ke.where(a > b, a, b * 2.0), lambda a, b: torch.where(a > b, a, b * 2.0), [S, (4,)])
    check(rng, lambda a: ke.where(a > 0.0, a, 0.5), lambda a: torch.where(a > 0.0, a, 0.5), [S])


@pytest.mark.parametrize("axis,keepdims", [(None, False), (0, False), (1, True), ((0, 2), False), (-1, True)])
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
def test_reductions(rng, op, axis, keepdims):
    t_axis = tuple(range(3)) if axis is None else axis
    tfn = {"sum": lambda x: torch.sum(x, dim=t_axis, keepdim=keepdims),
           "mean": lambda x: torch.mean(x, dim=t_axis, keepdim=keepdims),
           "max": lambda x: torch.amax(x, dim=t_axis, keepdim=keepdims),
           "min": lambda x: torch.amin(x, dim=t_axis, keepdim=keepdims)}[op]
    check(rng, lambda x: getattr(x, op)(axis, keepdims), tfn, [(2, 3, 4)])


def test_layout(rng):
    check(rng, lambda x: x.reshape(4, -1) * 2.0, lambda x: x.reshape(4, -1) * 2.0, [(2, 3, 4)])
    check(rng, lambda x: x.permute(2, 0, 1), lambda x: x.permute(2, 0, 1), [(2, 3, 4)])
    check(rng, lambda x: x.transpose(0, 2), lambda x: x.transpose(0, 2), [(2, 3, 4)])
    check(rng, lambda x: x.T, lambda x: x.T, [S])
    check(rng, lambda x: x.expand(2, 3, 4), lambda x: x.expand(2, 3, 4), [(3, 1)])
    check(rng, lambda x: x.unsqueeze(1).squeeze(1).flatten(), lambda x: x.flatten(), [(2, 3, 4)])


@pytest.mark.parametrize("key", [
    (slice(1, None), slice(None, None, 2)),
    (1,),
    (Ellipsis, 2),
    (slice(None), None, slice(1, 3)),
    (-1, slice(0, 4, 3), 1),
], ids=["slices", "int", "ellipsis", "newaxis", "mixed"])
def test_getitem(rng, key):
    shape = (3, 4) if len([k for k in key if k is not None and k is not Ellipsis]) <= 2 else (2, 5, 3)
    check(rng, lambda x: x[key], lambda x: x[key], [shape])


def test_gather_take(rng):
    idx = rng.integers(-4, 4, (3, 6))
    ki, ti = ke.tensor(idx), torch.tensor(idx % 4)
    check(rng, lambda x: ke.gather(x, 1, ki), lambda x: torch.gather(x, 1, ti), [(3, 4)])
    emb = rng.integers(0, 5, (2, 3))  # repeated rows: the gradient adds up
    ke_i, t_i = ke.tensor(emb), torch.tensor(emb)
    check(rng, lambda w: ke.take(w, ke_i, 0), lambda w: w[t_i], [(5, 4)])
    check(rng, lambda w: ke.take(w, ke_i, 1), lambda w: w[:, t_i], [(2, 5, 3)])


def test_cat_stack(rng):
    check(rng, lambda a, b: ke.cat([a, b], 1), lambda a, b: torch.cat([a, b], 1), [(2, 3), (2, 5)])
    check(rng, lambda a, b: ke.stack([a, b], 0), lambda a, b: torch.stack([a, b], 0), [(2, 3), (2, 3)])


@pytest.mark.parametrize("shapes", [((3, 5), (5, 4)), ((2, 3, 5), (5, 4)), ((2, 1, 3, 5), (3, 5, 2)), ((5,), (5, 4)),
                                    ((3, 5), (5,))], ids=["2d", "batched", "broadcast", "vec-mat", "mat-vec"])
def test_matmul(rng, shapes):
    check(rng, lambda a, b: a @ b, lambda a, b: a @ b, shapes)


def test_linear(rng):
    check(rng, F.linear, torch.nn.functional.linear, [(3, 5), (4, 5), (4,)])
    check(rng, F.linear, torch.nn.functional.linear, [(2, 3, 5), (4, 5)])


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_softmax(rng, fn):
    check(rng, lambda x: getattr(F, fn)(x, 1), lambda x: getattr(torch, fn)(x, 1), [(2, 5, 3)])


@pytest.mark.parametrize("stride,padding,dilation,groups", [(1, 0, 1, 1), (2, 1, 1, 1), (1, 1, 2, 2)],
                         ids=["plain", "strided-padded", "dilated-grouped"])
def test_conv2d(rng, stride, padding, dilation, groups):
    check(rng, lambda x, w, b: F.conv2d(x, w, b, stride, padding, dilation, groups),
          lambda x, w, b: torch.nn.functional.conv2d(x, w, b, stride, padding, dilation, groups),
          [(2, 4, 7, 6), (6, 4 // groups, 3, 3), (6,)])


@pytest.mark.parametrize("kernel,stride,padding", [(2, 2, 0), (3, 2, 1)], ids=["2x2", "3x3-overlap-padded"])
def test_pools(rng, kernel, stride, padding):
    shape = [(2, 3, 7, 6)]
    check(rng, lambda x: F.max_pool2d(x, kernel, stride, padding),
          lambda x: torch.nn.functional.max_pool2d(x, kernel, stride, padding), shape)
    for include in (True, False):
        check(rng, lambda x, inc=include: F.avg_pool2d(x, kernel, stride, padding, inc),
              lambda x, inc=include: torch.nn.functional.avg_pool2d(x, kernel, stride, padding, count_include_pad=inc),
              shape)


def test_max_pool_ties_go_to_the_first(rng):
    x = np.zeros((1, 1, 4, 4), np.float32)  # all ties, as after a ReLU
    k, t = ke.tensor(x, requires_grad=True), torch.tensor(x.astype(np.float64), requires_grad=True)
    F.max_pool2d(k, 2).sum().backward()
    torch.nn.functional.max_pool2d(t, 2).sum().backward()
    np.testing.assert_array_equal(k.grad.numpy(), t.grad.numpy())


def test_batch_norm(rng):
    shape = [(4, 3, 2, 2), (3,), (3,)]
    rm, rv = rng.standard_normal(3).astype(np.float32), rng.random(3).astype(np.float32) + 0.5
    krm, krv = ke.tensor(rm), ke.tensor(rv)
    trm, trv = torch.tensor(rm.astype(np.float64)), torch.tensor(rv.astype(np.float64))
    check(rng, lambda x, w, b: F.batch_norm(x, krm, krv, w, b, training=True, momentum=0.2),
          lambda x, w, b: torch.nn.functional.batch_norm(x, trm, trv, w, b, training=True, momentum=0.2), shape)
    close(krm.numpy(), trm, "running mean")
    close(krv.numpy(), trv, "running var")
    check(rng, lambda x, w, b: F.batch_norm(x, krm, krv, w, b), lambda x, w, b: torch.nn.functional.batch_norm(
        x, trm, trv, w, b), shape)


def test_losses(rng):
    target = rng.integers(0, 5, 4)
    kt, tt = ke.tensor(target), torch.tensor(target)
    check(rng, lambda x: F.cross_entropy(x, kt), lambda x: torch.nn.functional.cross_entropy(x, tt), [(4, 5)])
    y = rng.standard_normal((4, 5)).astype(np.float32)
    check(rng, lambda x: F.mse_loss(x, ke.tensor(y)), lambda x: torch.nn.functional.mse_loss(x, torch.tensor(
        y.astype(np.float64))), [(4, 5)])


def test_dropout_mask_and_scale(rng):
    ke.manual_seed(int(rng.integers(2**31)))
    x = ke.ones((64, 64), requires_grad=True)
    y = F.dropout(x, 0.25)
    v = y.numpy()
    assert set(np.unique(v)) <= {0.0, np.float32(1 / 0.75)}
    assert 0.2 < (v == 0).mean() < 0.3
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), v)  # d(sum)/dx is the mask times the scale
    assert F.dropout(x, 0.25, training=False) is x


def test_composite_graph_and_accumulation(rng):
    """A small network's loss, a tensor used several times, gradients accumulated over two backward passes."""
    def net(x, w1, w2):
        h = (x @ w1).tanh()
        return ((h * h + h) @ w2).sigmoid().mean() + (w1 * w1).sum() * 0.01

    check(rng, net, net, [(3, 4), (4, 5), (5, 2)])
    w = ke.tensor(rng.standard_normal((2, 2)).astype(np.float32), requires_grad=True)
    for _ in range(2):
        (w * 3.0).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), np.full((2, 2), 6.0))


def test_double_backward(rng):
    """Backward rules are eager ops, so gradients can be differentiated again (create_graph)."""
    x = rng.standard_normal(S).astype(np.float32)
    k, t = ke.tensor(x, requires_grad=True), torch.tensor(x.astype(np.float64), requires_grad=True)
    yk = (k.tanh() ** 3.0).sum()
    yk.backward(create_graph=True)
    gk = k.grad
    k.grad = None
    (gk * gk).sum().backward()
    (gt,) = torch.autograd.grad((t.tanh() ** 3.0).sum(), t, create_graph=True)
    (gt * gt).sum().backward()
    close(gk.numpy(), gt, "first derivative")
    close(k.grad.numpy(), t.grad, "second derivative")


def test_conv_double_backward(rng):
    """Convolution's gradient kernels have gradients too: d/d(x, w) of |d loss / dx|^2 + |d loss / dw|^2."""
    xs = rng.standard_normal((2, 4, 7, 6)).astype(np.float32)
    ws = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    up = rng.standard_normal((2, 6, 4, 3)).astype(np.float32)
    kx, kw = ke.tensor(xs, requires_grad=True), ke.tensor(ws, requires_grad=True)
    tx = torch.tensor(xs.astype(np.float64), requires_grad=True)
    tw = torch.tensor(ws.astype(np.float64), requires_grad=True)
    F.conv2d(kx, kw, None, 2, 1, 1, 2).backward(ke.tensor(up), create_graph=True)
    gx, gw = kx.grad, kw.grad
    kx.grad = kw.grad = None
    ((gx * gx).sum() + (gw * gw).sum()).backward()
    tgx, tgw = torch.autograd.grad(torch.nn.functional.conv2d(tx, tw, None, 2, 1, 1, 2), (tx, tw),
                                   torch.tensor(up.astype(np.float64)), create_graph=True)
    ((tgx * tgx).sum() + (tgw * tgw).sum()).backward()
    close(kx.grad.numpy(), tx.grad, "d/dx")
    close(kw.grad.numpy(), tw.grad, "d/dw")


def test_no_grad_and_detach(rng):
    w = ke.randn(3, requires_grad=True)
    with ke.no_grad():
        y = w * 2.0
    assert not y.requires_grad and y.grad_fn is None
    assert not w.detach().requires_grad
    z = (w * 2.0).detach() * w
    z.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), 2.0 * w.numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="does not require gradients"):
        y.sum().backward()
    with pytest.raises(ValueError, match="scalar"):
        (w * 2.0).backward()


def test_in_place_update_after_forward_is_refused():
    w = ke.ones(3, requires_grad=True)
    loss = (w * w).sum()
    with ke.no_grad():
        w.copy_(w * 2.0)
    with pytest.raises(KilnError, match="modified in place"):
        loss.backward()
    (w * w).sum().backward()  # a new forward pass sees the new values
    np.testing.assert_allclose(w.grad.numpy(), 4.0)


def test_forward_only_ops(rng):
    a = rng.standard_normal(S).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    ka, kb = ke.tensor(a), ke.tensor(b)
    for kf, nf in [(lambda x, y: x < y, np.less), (lambda x, y: x >= y, np.greater_equal),
                   (lambda x, y: x == y, np.equal), (lambda x, y: x != y, np.not_equal)]:
        got = kf(ka, kb)
        assert got.dtype == "bool"
        np.testing.assert_array_equal(got.numpy(), nf(a, b))
    np.testing.assert_array_equal(((ka > 0.0) & (kb > 0.0)).numpy(), (a > 0) & (b > 0))
    np.testing.assert_array_equal((~(ka > 0.0)).numpy(), ~(a > 0))
    np.testing.assert_array_equal(ka.argmax(1).numpy(), a.argmax(1))
    np.testing.assert_array_equal(ka.argmin(0).numpy(), a.argmin(0))
    i = ke.arange(6)
    assert i.dtype == "int32"
    np.testing.assert_array_equal((i * 3 + 1).numpy(), np.arange(6) * 3 + 1)
    np.testing.assert_allclose((i / 4).numpy(), np.arange(6) / 4, rtol=1e-6)
    np.testing.assert_allclose((i + 0.5).numpy(), np.arange(6) + 0.5)
    np.testing.assert_array_equal(ke.zeros((2, 3)).numpy(), np.zeros((2, 3)))
    np.testing.assert_array_equal(ke.ones(3, "int32").numpy(), np.ones(3))
    assert ke.tensor([[1, 2]]).shape == (1, 2) and ke.tensor(2.5).item() == 2.5
    empty = ke.tensor(np.zeros((0, 3), np.float32))  # empty tensors run no kernel
    assert (empty + 1.0).numpy().shape == (0, 3) and empty.sum(1).shape == (0,)
    np.testing.assert_array_equal(empty.sum(0).numpy(), np.zeros(3))
    assert ke.tensor([True, False, True]).sum().item() == 2


def test_errors():
    with pytest.raises(ShapeError, match="broadcast"):
        ke.ones((2, 3)) + ke.ones((4,))
    with pytest.raises(ShapeError, match="inner dims"):
        ke.ones((2, 3)) @ ke.ones((4, 2))
    with pytest.raises(ShapeError, match="reshape"):
        ke.ones((2, 3)).reshape(4, 2)
    with pytest.raises(IndexError, match="out of range"):
        ke.ones((2, 3))[2]
    with pytest.raises(ShapeError, match="int32"):
        ke.tensor(np.array([2**40]))
    with pytest.raises(ShapeError, match="float32"):
        ke.tensor([1, 2]).requires_grad_()


def test_generic_kernels_then_specialisation(rng):
    """One shape-generic kernel serves every shape of a (coalesced) rank; a signature seen more than
    SPECIALIZE_AFTER times gets a specialised kernel; both compute the same values."""
    def fresh(shape):
        return rng.standard_normal(shape).astype(np.float32)

    def fn(x, y):
        return (ke.tensor(x) / ke.tensor(y)).exp()
    before = ke.stats()
    for shape in [(5,), (2, 7), (3, 2, 4)]:  # one coalesced rank: no new generic compiles after the first
        x, y = fresh(shape), np.abs(fresh(shape)) + 1
        np.testing.assert_allclose(fn(x, y).numpy(), np.exp(x / y), rtol=1e-5)
    mid = ke.stats()
    assert mid["compiles"] - before["compiles"] <= 2  # at most the div and exp generic kernels
    generic = [p for key, p in ke.device.runtime().pipelines.items() if key[:2] == ("generic", "Div")]
    assert generic and all("var<uniform> kiln_u" in p.source and "24i" not in p.source for p in generic)
    assert mid["generic_hits"] > before["generic_hits"]
    x, y = fresh((6, 5)), np.abs(fresh((1, 5))) + 1
    for _ in range(ke.kernels.SPECIALIZE_AFTER + 2):
        np.testing.assert_allclose(fn(x, y).numpy(), np.exp(x / y), rtol=1e-5)
    after = ke.stats()
    assert after["specializations"] - mid["specializations"] == 2  # div and exp of this signature
    assert after["specialized_hits"] - mid["specialized_hits"] >= 2
