"""Neural-network modules on eager tensors (``kiln.nn``), after ``torch.nn``.

A :class:`Module` registers the :class:`Parameter` s, buffers (running statistics) and
sub-modules assigned to it; ``state_dict`` keys are PyTorch's (``0.weight``,
``1.running_mean``), so weights move between the two with ``load_state_dict``. Initialisation
follows PyTorch's defaults (Kaiming-uniform weights, ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``
biases), drawn on the host from :func:`kiln.eager.tensors.manual_seed`'s generator.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from kiln.eager import functional as F
from kiln.eager import ops
from kiln.eager import tensors as tensor
from kiln.eager.tensors import Tensor
from kiln.errors import ShapeError


class Parameter(Tensor):
    """A float32 tensor that is a module's trainable weight (``requires_grad=True``)."""

    __slots__ = ()

    def __init__(self, data):
        t = data if isinstance(data, Tensor) else tensor.tensor(np.asarray(data, np.float32))
        super().__init__(t.buf, t.shape, "float32", requires_grad=True)


def _uniform(shape, bound: float) -> Parameter:
    return Parameter(tensor._rng.uniform(-bound, bound, shape).astype(np.float32))


class Module:
    """Base class of layers and models: call it to run :meth:`forward`.

    Assigning a :class:`Parameter`, a :class:`Module` or (through :meth:`register_buffer`) a
    tensor to an attribute registers it under that name.
    """

    def __init__(self):
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise AttributeError("call Module.__init__() before assigning attributes")
        for d in (self._parameters, self._buffers, self._modules):
            d.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def register_buffer(self, name: str, value: Tensor | None) -> None:
        """Register a non-trainable tensor (saved in ``state_dict``), like running statistics."""
        object.__setattr__(self, name, value)
        self._buffers[name] = value

    def forward(self, *args):
        """The layer's computation (subclasses define it)."""
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """This module and every sub-module, with dotted names."""
        yield prefix, self
        for name, m in self._modules.items():
            yield from m.named_modules(f"{prefix}.{name}" if prefix else name)

    def named_parameters(self) -> Iterator[tuple[str, Parameter]]:
        """Every parameter, with its dotted name (each once)."""
        seen = set()
        for prefix, m in self.named_modules():
            for name, p in m._parameters.items():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{prefix}.{name}" if prefix else name), p

    def parameters(self) -> list[Parameter]:
        """Every parameter (what an optimizer updates)."""
        return [p for _, p in self.named_parameters()]

    def children(self) -> list[Module]:
        """The direct sub-modules."""
        return list(self._modules.values())

    def state_dict(self) -> dict[str, Tensor]:
        """Parameters and buffers by dotted name (PyTorch's keys), detached."""
        out = {}
        for prefix, m in self.named_modules():
            for name, t in (*m._parameters.items(), *m._buffers.items()):
                if t is not None:
                    out[f"{prefix}.{name}" if prefix else name] = t.detach()
        return out

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Copy values (Tensors, numpy arrays or ``torch.Tensor`` s, by name) into the parameters and buffers.

        Raises:
            ShapeError: a shape differs, or (``strict``) a key is missing or unexpected.
        """
        own = {}
        for prefix, m in self.named_modules():
            for name in (*m._parameters, *m._buffers):
                own[f"{prefix}.{name}" if prefix else name] = (m, name)
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        if strict and (missing or unexpected):
            raise ShapeError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        for key, (m, name) in own.items():
            if key not in state:
                continue
            value = state[key]
            if hasattr(value, "detach") and not isinstance(value, Tensor):  # a torch.Tensor
                value = value.detach().cpu().numpy()
            cur = getattr(m, name)
            value = value if isinstance(value, Tensor) else tensor.tensor(np.asarray(value), cur.dtype)
            if value.shape != cur.shape:
                raise ShapeError(f"load_state_dict: {key} has shape {value.shape}, the module's is {cur.shape}")
            cur.copy_(value)

    def train(self, mode: bool = True) -> Module:
        """Set training mode (dropout active, batch norm on batch statistics) here and below."""
        for _, m in self.named_modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> Module:
        """Set evaluation mode."""
        return self.train(False)

    def zero_grad(self) -> None:
        """Clear every parameter's ``.grad``."""
        for p in self.parameters():
            p.grad = None

    def __repr__(self) -> str:
        inner = "".join(f"\n  ({n}): " + repr(m).replace("\n", "\n  ") for n, m in self._modules.items())
        return f"{type(self).__name__}({self.extra_repr()}{inner}{chr(10) if inner else ''})"

    def extra_repr(self) -> str:
        """Constructor arguments shown by ``repr``."""
        return ""


class Linear(Module):
    """``y = x @ weight.T + bias``; ``weight (out_features, in_features)``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        bound = 1 / math.sqrt(in_features) if in_features else 0.0
        self.weight = _uniform((out_features, in_features), bound)
        self.bias = _uniform((out_features,), bound) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Conv2d(Module):
    """2-D convolution (``F.conv2d``); ``weight (out_channels, in_channels / groups, kh, kw)``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True):
        super().__init__()
        kh, kw = F._pair(kernel_size)
        if in_channels % groups or out_channels % groups:
            raise ShapeError(f"Conv2d: channels {in_channels} -> {out_channels} do not divide into {groups} groups")
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        fan_in = in_channels // groups * kh * kw
        bound = 1 / math.sqrt(fan_in)
        self.weight = _uniform((out_channels, in_channels // groups, kh, kw), bound)
        self.bias = _uniform((out_channels,), bound) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        o, c, kh, kw = self.weight.shape
        return f"{c * self.groups}, {o}, kernel_size=({kh}, {kw}), stride={self.stride}, padding={self.padding}"


class BatchNorm2d(Module):
    """Batch normalisation of ``(N, C, H, W)`` per channel; batch statistics in training, running ones in eval."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = True):
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.weight = Parameter(np.ones(num_features, np.float32)) if affine else None
        self.bias = Parameter(np.zeros(num_features, np.float32)) if affine else None
        self.register_buffer("running_mean", tensor.zeros(num_features))
        self.register_buffer("running_var", tensor.ones(num_features))

    def forward(self, x: Tensor) -> Tensor:
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, self.training,
                            self.momentum, self.eps)


class ReLU(Module):
    """max(x, 0)."""

    def forward(self, x: Tensor) -> Tensor:
        return tensor.relu(x)


class Tanh(Module):
    """tanh(x)."""

    def forward(self, x: Tensor) -> Tensor:
        return tensor.tanh(x)


class Sigmoid(Module):
    """1 / (1 + e ** -x)."""

    def forward(self, x: Tensor) -> Tensor:
        return tensor.sigmoid(x)


class Flatten(Module):
    """Dims ``start_dim..end_dim`` merged (default: all but the batch dim)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Tensor) -> Tensor:
        return ops.flatten(x, self.start_dim, self.end_dim)


class Dropout(Module):
    """Zero elements with probability ``p`` in training (scaled by ``1 / (1 - p)``); identity in eval."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.p, self.training)


class MaxPool2d(Module):
    """``F.max_pool2d`` as a module."""

    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        self.args = (kernel_size, stride, padding)

    def forward(self, x: Tensor) -> Tensor:
        return F.max_pool2d(x, *self.args)


class AvgPool2d(Module):
    """``F.avg_pool2d`` as a module."""

    def __init__(self, kernel_size, stride=None, padding=0, count_include_pad: bool = True):
        super().__init__()
        self.args = (kernel_size, stride, padding, count_include_pad)

    def forward(self, x: Tensor) -> Tensor:
        return F.avg_pool2d(x, *self.args)


class Sequential(Module):
    """Modules applied in order; sub-modules are named ``0``, ``1``, ... (as in PyTorch)."""

    def __init__(self, *modules: Module):
        super().__init__()
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def __len__(self) -> int:
        return len(self._modules)


class CrossEntropyLoss(Module):
    """``F.cross_entropy`` of logits ``(N, C)`` and int class indices ``(N,)``."""

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(logits, target, self.reduction)


class MSELoss(Module):
    """``F.mse_loss``."""

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, pred: Tensor, target: Tensor) -> Tensor:
        return F.mse_loss(pred, target, self.reduction)


functional = F

__all__ = ["AvgPool2d", "BatchNorm2d", "Conv2d", "CrossEntropyLoss", "Dropout", "Flatten", "Linear", "MSELoss",
           "MaxPool2d", "Module", "Parameter", "ReLU", "Sequential", "Sigmoid", "Tanh", "functional"]
