"""``kiln.nn``: neural-network modules on eager tensors (implemented in :mod:`kiln.eager.nn`)."""

from kiln.eager.nn import *
from kiln.eager.nn import __all__  # noqa: F401
