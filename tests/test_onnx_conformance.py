"""onnx's own backend node tests (``onnx.backend.test.BackendTest``) through Kiln's ONNX backend.

Every node test of the default ai.onnx domain is compiled by Kiln and run natively on WebGPU
(:mod:`kiln.onnx_backend`). Cases in ``tests/onnx_suite.py``'s exclusion table are skipped with
their reason; the cases listed in ``tests/onnx_passing.txt`` must pass; all others are expected
failures, and one that starts to pass fails the run ("unexpected success") until
``python -m tools.onnx_coverage`` regenerates the list and ``docs/onnx-coverage.md``.

The whole suite takes a few minutes on two cores; ``KILN_ONNX_SUITE=passing`` runs only the
cases expected to pass (the regression guard, faster).
"""

from __future__ import annotations

import os

from onnx_suite import backend_test, base_name, read_passing

OnnxBackendNodeModelTest = backend_test(expect=True, parent_module=__name__)

if os.environ.get("KILN_ONNX_SUITE", "all") == "passing":
    _passing = read_passing()
    for _name in [n for n in vars(OnnxBackendNodeModelTest) if n.startswith("test_")]:
        if base_name(_name) not in _passing:
            delattr(OnnxBackendNodeModelTest, _name)
