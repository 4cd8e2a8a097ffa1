"""onnx's backend node-test suite through Kiln: the exclusion table and the expectations list.

Used by ``tests/test_onnx_conformance.py`` (CI) and ``python -m tools.onnx_coverage`` (which
regenerates ``docs/onnx-coverage.md`` and :data:`PASSING`).

* :data:`EXCLUDED` is the one table of cases that are *not* counted, each with its reason.
* :data:`PASSING` (``tests/onnx_passing.txt``) lists the cases that passed when the coverage
  was last generated. In CI each of them must still pass, and every other non-excluded case
  is an expected failure: it runs, and if it starts passing the test fails as an "unexpected
  success" until the list is regenerated. So a regression and a silent fix are both caught.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
PASSING = HERE / "onnx_passing.txt"
CATEGORY = "OnnxBackendNodeModelTest"

_STRINGS = r"^test_(string_|strnorm|regex_full_match|tfidfvectorizer|equal_string)|^test_castlike?_.*STRING"
_SEQUENCES = (r"^test_(sequence_|split_to_sequence|identity_sequence|if_seq|loop13_seq|loop16_seq_none)"
              r"|^test_optional_get_element_(optional_)?sequence")
_OPTIONALS = r"^test_(optional_|identity_opt|if_opt)"
_TRAINING = r"^test_(adagrad|adam|momentum|nesterov_momentum|training_dropout)|^test_batchnorm_.*_training_mode"
_ML = r"^test_ai_onnx_ml_"

#: (regex on the test name without its ``_cpu`` suffix, reason): cases outside what a WebGPU
#: compiler of the default ai.onnx domain's inference graphs is for. Everything else counts.
EXCLUDED: list[tuple[str, str]] = [
    (_STRINGS, "strings: WebGPU buffers hold numbers only"),
    (_SEQUENCES, "sequence types: Kiln's IR values are tensors"),
    (_OPTIONALS, "optional types: Kiln's IR values are tensors"),
    (_TRAINING, "training (ai.onnx.preview.training ops, training_mode=1): Kiln compiles inference graphs"),
    (_ML, "ai.onnx.ml domain: only the default ai.onnx domain is in scope"),
    (r"^test_bernoulli", "random sampling: the outputs cannot be compared with fixed expected values"),
    (r"^test_image_decoder", "decodes image files (JPEG, PNG, ...): file parsing, not a tensor computation"),
]

#: the exclusions of issue 3's definition of the conformance goal: "the node test cases of the default
#: ai.onnx domain that are not about strings, sequences, optional types or training". Its denominator also
#: leaves out every case with a node outside the default domain (ai.onnx.ml, ai.onnx.preview, ...:
#: :func:`in_issue_scope`) and counts the Bernoulli and ImageDecoder cases that :data:`EXCLUDED` leaves out.
ISSUE_EXCLUDED = (_STRINGS, _SEQUENCES, _OPTIONALS, _TRAINING, _ML)

_EXCLUDED_RE = [(re.compile(p), reason) for p, reason in EXCLUDED]


def base_name(test: str) -> str:
    """The case name without the backend runner's device suffix (``test_abs_cpu`` -> ``test_abs``)."""
    return test.removesuffix("_cpu")


def exclusion(test: str) -> str | None:
    """The reason ``test`` (with or without ``_cpu``) is excluded, or None if it counts."""
    name = base_name(test)
    for rx, reason in _EXCLUDED_RE:
        if rx.search(name):
            return reason
    return None


_ISSUE_RE = [re.compile(p) for p in ISSUE_EXCLUDED]


def in_issue_scope(name: str, domains) -> bool:
    """True if case ``name`` (``domains``: its nodes' domains) counts in issue 3's conformance figure:
    only default-domain (``""``/``ai.onnx``) nodes, and not about strings, sequences, optionals or training."""
    if any(d not in ("", "ai.onnx") for d in domains):
        return False
    return not any(rx.search(base_name(name)) for rx in _ISSUE_RE)


def read_passing() -> set[str]:
    """Names (without ``_cpu``) of the cases expected to pass."""
    if not PASSING.exists():
        return set()
    return {ln.strip() for ln in PASSING.read_text().splitlines() if ln.strip() and not ln.startswith("#")}


def node_cases():
    """onnx's node test cases (``onnx.backend.test.loader.TestCase``), generated in memory by onnx."""
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_model_tests(kind="node")


def backend_test(expect: bool, parent_module: str | None = None):
    """onnx's ``BackendTest`` over Kiln's backend, restricted to the node tests on the ``CPU`` device.

    Excluded cases are skipped with their reason. With ``expect``, cases not in :data:`PASSING`
    are marked as expected failures (unittest ``expectedFailure``: a pass then fails the run).

    Returns:
        The unittest ``TestCase`` class holding one test method per case (``test_abs_cpu``, ...).
    """
    import unittest

    import onnx.backend.test

    from kiln.onnx_backend import KilnBackend

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cls = onnx.backend.test.BackendTest(KilnBackend, parent_module).test_cases[CATEGORY]
    passing = read_passing() if expect else set()
    for name in [n for n in vars(cls) if n.startswith("test_")]:
        func = getattr(cls, name)
        if not name.endswith("_cpu"):
            delattr(cls, name)
        elif (reason := exclusion(name)) is not None:
            setattr(cls, name, unittest.skip(f"excluded: {reason}")(func))
        elif expect and base_name(name) not in passing:
            setattr(cls, name, unittest.expectedFailure(func))
    return cls
