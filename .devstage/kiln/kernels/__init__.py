"""The kernel library: every primitive op defined once as a tensor expression.

:func:`kiln.kernels.library.build` maps an IR node to a :class:`~kiln.te.compute.Tensor`;
codegen for each target renders the lowered expression, so no target has
hand-written shaders per op.
"""
