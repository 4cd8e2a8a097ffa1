"""Token sampling on the device (kiln/frontend/sampling.py): the sampler package a language model carries for
WebGPU, checked against the numpy interpreter of its graph (the same token for the same feeds) and, statistically,
against the exact distribution of the repetition penalty, temperature, top-k and top-p (chi-square)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.compiler import compile_graph
from kiln.frontend.sampling import sampler_graph
from kiln.ir import interp
from kiln.package.writer import write_package


def _sampler(tmp_path, vocab, max_seen=64):
    out = tmp_path / f"sampler{vocab}"
    write_package(compile_graph(sampler_graph(vocab, max_seen), "webgpu", device_class="cpu"), out, preset="none")
    return kiln.load(out)


def _feeds(x, seen, options, seed, step):
    """options: (temperature, top_p, repetition_penalty, top_k)."""
    return {"logits": np.asarray(x, np.float32).reshape(1, 1, -1), "seen": np.asarray(seen, np.int32),
            "options": np.asarray(options, np.float32), "seed": np.array([seed, step], np.uint32).view(np.int32)}


def chi_square_critical(df: int, z: float = 3.09) -> float:
    """The chi-square value a ``df``-degree statistic exceeds with probability ``Phi(-z)`` (z = 3.09: 1e-3), by
    Wilson and Hilferty's cube-root normal approximation (1931), within 1% for ``df >= 3``."""
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * h**0.5) ** 3


def exact_probabilities(x, seen, options):
    """The distribution the options define over ``x`` (float64), by sorting (HF transformers' logits processors:
    repetition penalty, temperature, top-k, top-p keeping the smallest prefix reaching ``top_p``)."""
    temperature, top_p, penalty, top_k = options
    x = np.asarray(x, np.float64).copy()
    ids = np.unique(seen)
    x[ids] = np.where(x[ids] > 0, x[ids] / penalty, x[ids] * penalty)
    y = x / temperature
    if 0 < top_k < y.size:
        y = np.where(y < np.sort(y)[-int(top_k)], -np.inf, y)
    p = np.exp(y - y.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    keep = np.zeros(p.size, bool)
    keep[order[np.cumsum(p[order]) - p[order] < top_p]] = True
    p = np.where(keep, p, 0.0)
    return p / p.sum()


CASES = [  # (temperature, top_p, repetition_penalty, top_k)
    (1.0, 1.0, 1.0, 0),
    (0.7, 1.0, 1.0, 5),
    (1.3, 0.8, 1.0, 0),
    (1.0, 0.9, 1.5, 12),
]


@pytest.mark.parametrize("options", CASES, ids=["plain", "top_k", "top_p", "all"])
def test_draws_follow_the_exact_distribution(tmp_path, rng, options):
    """600 seeded draws on the device (lavapipe) over 40 logits: never a token the options exclude, and frequencies
    the exact distribution explains (chi-square over the kept tokens at the 1e-3 level)."""
    session = _sampler(tmp_path, 40)
    for _ in range(100):  # logits whose distribution gives the test at least 4 cells of 5 expected draws or more
        x = rng.normal(0, 2, 40)
        seen = [3, 17, int(np.argmax(x))]
        p = exact_probabilities(x, seen, options)
        if (p * 600 >= 5).sum() >= 4:
            break
    counts = np.zeros(40)
    for step in range(600):
        counts[int(session.run(_feeds(x, seen, options, 1234, step))["token"].reshape(-1)[0])] += 1
    assert counts[p == 0].sum() == 0, np.nonzero(counts * (p == 0))
    kept = p > 0
    expected = p[kept] * counts.sum()
    pooled = expected < 5  # chi-square wants expected counts of 5 or more: pool the rare tokens into one cell
    obs = np.append(counts[kept][~pooled], counts[kept][pooled].sum())
    exp = np.append(expected[~pooled], expected[pooled].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    assert len(obs) >= 4
    statistic = float(((obs - exp) ** 2 / exp).sum())
    assert statistic < chi_square_critical(len(obs) - 1), (obs, exp.round(1))


def test_device_tokens_equal_the_interpreter(tmp_path, rng):
    """Over SmolLM2's vocabulary (49152): the device's token equals the numpy interpreter's for the same feeds
    (top-k, top-p, penalty, greedy with a penalty, and seeds and steps), and a seed and step repeat their token."""
    vocab = 49152
    session = _sampler(tmp_path, vocab)
    x = rng.normal(0, 3, vocab).astype(np.float32)
    seen = rng.choice(vocab, 9, replace=False)
    for options in [(0.8, 1.0, 1.0, 40), (1.0, 0.9, 1.3, 0), (0.0, 1.0, 2.0, 0), (1.5, 0.5, 1.1, 100)]:
        graph = sampler_graph(vocab, 64, seen=len(seen))
        for seed, step in [(7, 0), (7, 1), (2**32 - 1, 5)]:
            feeds = _feeds(x, seen, options, seed, step)
            got = int(session.run(feeds)["token"].reshape(-1)[0])
            assert got == int(interp.run(graph, feeds)["token"].reshape(-1)[0]), (options, seed, step)
    feeds = _feeds(x, seen, (0.0, 1.0, 2.0, 0), 1, 0)
    penalised = np.where(np.isin(np.arange(vocab), seen), np.where(x > 0, x / 2, x * 2), x)
    assert int(session.run(feeds)["token"].reshape(-1)[0]) == int(np.argmax(penalised))  # temperature 0: arg max


def test_sampler_graph_refuses_bad_sizes():
    from kiln.errors import KilnError

    with pytest.raises(KilnError, match="vocabulary of 1 to 2"):
        sampler_graph(0, 8)
    with pytest.raises(KilnError, match="seen-token bound"):
        sampler_graph(10, 0)
