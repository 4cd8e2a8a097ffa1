"""The ground floor: the scalar expression language (:mod:`kiln.arith.expr`) and the size algebra over
run-time dims (:mod:`kiln.arith.symbolic`). Both ``kiln.ir`` (symbolic shapes) and ``kiln.te`` (kernel
bodies) stand on it; it imports nothing of Kiln but :mod:`kiln.errors`."""
