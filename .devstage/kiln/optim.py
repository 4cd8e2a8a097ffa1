"""``kiln.optim``: optimizers for eager tensors (implemented in :mod:`kiln.eager.optim`)."""

from kiln.eager.optim import *
from kiln.eager.optim import __all__  # noqa: F401
