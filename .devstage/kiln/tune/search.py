"""Search over one kernel's schedules: an evolutionary search steered by a cost model.

Each round proposes a batch of unmeasured schedules: mutations and crossovers of the fastest
measured so far (the elite) and fresh random samples. Once a few measurements exist, a ridge
regression over quadratic features of the schedule (:meth:`~kiln.tune.space.SearchSpace.features`)
predicts log milliseconds, and most of each batch is the candidates it ranks best, the rest
random ones (exploration) -- the scheme of TVM's AutoTVM/Ansor, with a far smaller model
(Chen et al., "Learning to Optimize Tensor Programs", NeurIPS 2018).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np

from kiln.te.schedule import Schedule
from kiln.tune.space import SearchSpace


class CostModel:
    """Ridge regression of log(ms) on quadratic features of a schedule (numpy only).

    Args:
        space: gives the features.
        ridge: the L2 penalty on standardised features.
    """

    def __init__(self, space: SearchSpace, ridge: float = 1.0):
        self.space = space
        self.ridge = ridge
        self.w: np.ndarray | None = None

    def _design(self, schedules: list[Schedule]) -> np.ndarray:
        x = np.stack([self.space.features(s) for s in schedules])
        iu = np.triu_indices(x.shape[1])
        quad = (x[:, :, None] * x[:, None, :])[:, iu[0], iu[1]]
        return np.concatenate([x, quad], axis=1)

    def fit(self, schedules: list[Schedule], ms: list[float]) -> None:
        """Fit to measured ``ms`` (positive) of ``schedules``."""
        x = self._design(schedules)
        self.mu, self.sd = x.mean(axis=0), x.std(axis=0) + 1e-9
        z = (x - self.mu) / self.sd
        y = np.log(np.asarray(ms, dtype=np.float64))
        self.y0 = y.mean()
        a = z.T @ z + self.ridge * np.eye(z.shape[1])
        self.w = np.linalg.solve(a, z.T @ (y - self.y0))

    def predict(self, schedules: list[Schedule]) -> np.ndarray:
        """Predicted log milliseconds (zeros before :meth:`fit`)."""
        if self.w is None or not schedules:
            return np.zeros(len(schedules))
        z = (self._design(schedules) - self.mu) / self.sd
        return z @ self.w + self.y0


@dataclass
class Trial:
    """One measured schedule: ``ms`` per dispatch (``math.inf`` if it failed or computed wrong numbers)."""

    schedule: Schedule
    ms: float
    error: str | None = None


class Search:
    """The search state of one kernel.

    Args:
        space: the kernel's :class:`SearchSpace`.
        default: the default schedule (measured first: the baseline and the correctness reference).
        seed: the random seed (searches are reproducible for a given sequence of measurements).
        start: schedules to measure early (e.g. the best of an earlier run, when resuming).
        explore: share of each model-ranked batch drawn at random.
    """

    #: measurements before the cost model ranks proposals
    MODEL_AFTER = 8

    def __init__(self, space: SearchSpace, default: Schedule, seed: int = 0, start: list[Schedule] | None = None,
                 explore: float = 0.25):
        self.space = space
        self.default = default
        self.rng = random.Random(seed)
        self.trials: dict[Schedule, Trial] = {}
        self.pending: list[Schedule] = [s for s in (start or []) if space.valid(s) and s != default]
        self.model = CostModel(space)
        self.explore = explore

    @property
    def best(self) -> Trial | None:
        """The fastest correct trial so far."""
        ok = [t for t in self.trials.values() if math.isfinite(t.ms)]
        return min(ok, key=lambda t: t.ms) if ok else None

    def _elite(self, k: int = 8) -> list[Schedule]:
        ok = sorted((t for t in self.trials.values() if math.isfinite(t.ms)), key=lambda t: t.ms)
        return [t.schedule for t in ok[:k]] or [self.default]

    def propose(self, n: int) -> list[Schedule]:
        """Up to ``n`` distinct schedules not measured yet (fewer when the space runs out)."""
        out: list[Schedule] = []
        seen = set(self.trials)

        def take(s: Schedule) -> None:
            if s not in seen and len(out) < n:
                seen.add(s)
                out.append(s)

        if self.default not in self.trials:
            take(self.default)
        while self.pending and len(out) < n:
            take(self.pending.pop(0))
        if len(out) >= n:
            return out
        elite = self._elite()
        pool: list[Schedule] = []
        pool_seen = set(seen)
        for _ in range(max(32, 12 * n)):
            r = self.rng.random()
            if r < 0.6:
                s = self.space.mutate(self.rng.choice(elite), self.rng)
                if self.rng.random() < 0.3:
                    s = self.space.mutate(s, self.rng)
            elif r < 0.8 and len(elite) > 1:
                a, b = self.rng.sample(elite, 2)
                s = self.space.crossover(a, b, self.rng)
            else:
                s = self.space.sample(self.rng)
            if s not in pool_seen:
                pool_seen.add(s)
                pool.append(s)
        measured = [t for t in self.trials.values() if math.isfinite(t.ms)]
        want = n - len(out)
        if len(measured) >= self.MODEL_AFTER and pool:
            self.model.fit([t.schedule for t in measured], [t.ms for t in measured])
            order = np.argsort(self.model.predict(pool), kind="stable")
            ranked = [pool[i] for i in order]
            greedy = max(1, round(want * (1 - self.explore)))
            for s in ranked[:greedy]:
                take(s)
            rest = ranked[greedy:]
            self.rng.shuffle(rest)
            for s in rest:
                take(s)
        else:
            self.rng.shuffle(pool)
            for s in pool:
                take(s)
        return out

    def record(self, schedule: Schedule, ms: float | None, error: str | None = None) -> None:
        """Record a measurement (``ms=None`` with ``error`` for a failed or incorrect candidate)."""
        self.trials[schedule] = Trial(schedule, ms if ms is not None and error is None else math.inf, error)
