"""Auto-tuning: search each kernel's schedule on the target device and keep the fastest.

- :mod:`kiln.tune.space`: a kernel's knobs and the valid schedules (:class:`SearchSpace`);
- :mod:`kiln.tune.search`: evolutionary search steered by a ridge-regression cost model;
- :mod:`kiln.tune.measure`: measuring candidates natively or on RPC browser devices;
- :mod:`kiln.tune.db`: the tuning database (kernel signature x adapter -> best schedule);
- :mod:`kiln.tune.tuner`: a whole model, kernels in order of their share of GPU time (``kiln tune``).
"""
