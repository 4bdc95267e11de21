"""Discrete-event simulator of the SPRINT protocol: the judge of :mod:`jaxsprint.perf.sprint`.

The protocol (docs/sprint-model.md, "The protocol this project models"): ``N`` learners compute sub-batch
gradients back to back, each in a random time (mean ``T_c``, coefficient of variation ``cv``); the updater's
cycle ``k`` starts at ``k T_u``, gathers every gradient finished during cycle ``k - 1`` and publishes version
``k + 1``; a gradient read at version ``v`` and gathered at ``k T_u`` has staleness ``S = k - v``.

Two implementations consume the same random draws:

* :func:`simulate_events` runs the protocol literally (a heap of learner completions, the updater's cycle
  boundaries, a buffer and a version counter): slow, the reference.
* :func:`simulate` computes the same events with numpy arrays (completion times are cumulative sums; the
  cycle of a completion at ``t`` is ``floor(t / T_u)``). Tests check that both give identical histograms.

Each replica starts in the stationary state of every learner (the compute in progress at time 0 has the
length-biased duration and a uniform position in it), with independent phases; versions before time 0 are
negative, as if the updater had been cycling forever. Several replicas are pooled because with ``cv = 0``
one replica keeps its phases forever. Compute times: ``"gamma"`` (default), ``"lognormal"`` (same mean and
cv) or deterministic when ``cv = 0``.

Updater jitter (``update_cv > 0``): i.i.d. gamma cycles of mean ``T_u``, a stationary renewal process (the
cycle in progress at time 0 is length-biased; earlier boundaries come from a second stream of the same seed),
the straddling cycle left out of the count histogram. Shifted cycles (``update_shift_s = s``): ``s + G``,
``G`` gamma of mean ``T_u - s`` with the cycle's mean and cv kept. ``update_cv = 0`` and ``s = 0`` reproduce
the simpler cycles draw for draw.
"""
from __future__ import annotations

import dataclasses
import heapq
import math

import numpy as np

from jaxsprint.errors import ConfigError

JITTERS = ("gamma", "lognormal")


@dataclasses.dataclass
class SimResult:
    """Histograms and statistics of one simulation.

    Attributes:
      count_hist: ``count_hist[k]`` = updates that gathered ``k`` gradients (mini-batch ``k N_sub``).
      staleness_hist: ``staleness_hist[s]`` = gradients applied with staleness ``s``.
      n_cycles: Updater cycles observed (all replicas).
      n_gradients: Gradients applied.
      n_replicas: Independent replicas pooled.
    """

    count_hist: np.ndarray
    staleness_hist: np.ndarray
    n_cycles: int
    n_gradients: int
    n_replicas: int

    @property
    def count_pmf(self) -> np.ndarray:
        """Empirical pmf of the gradients per update over ``0..len-1``."""
        return self.count_hist / max(self.count_hist.sum(), 1)

    @property
    def staleness_pmf(self) -> np.ndarray:
        """Empirical pmf of the staleness over ``0..len-1``."""
        return self.staleness_hist / max(self.staleness_hist.sum(), 1)

    @property
    def mean_count(self) -> float:
        """Mean gradients per update."""
        return float(np.dot(np.arange(len(self.count_hist)), self.count_pmf))

    @property
    def mean_staleness(self) -> float:
        """Mean staleness of a gradient."""
        return float(np.dot(np.arange(len(self.staleness_hist)), self.staleness_pmf))

    @property
    def var_count(self) -> float:
        """Variance of the gradients per update."""
        x = np.arange(len(self.count_hist))
        return float(np.dot((x - self.mean_count) ** 2, self.count_pmf))

    @property
    def var_staleness(self) -> float:
        """Variance of the staleness."""
        x = np.arange(len(self.staleness_hist))
        return float(np.dot((x - self.mean_staleness) ** 2, self.staleness_pmf))


def _check(n_workers: int, t_compute_s: float, t_update_s: float, cv: float, jitter: str,
           update_cv: float = 0.0, update_shift_s: float = 0.0) -> None:
    if isinstance(n_workers, bool) or int(n_workers) != n_workers or n_workers < 1:
        raise ConfigError("n_workers", n_workers, "an integer >= 1")
    for field, v in (("t_compute_s", t_compute_s), ("t_update_s", t_update_s)):
        if not (math.isfinite(v) and v > 0):
            raise ConfigError(field, v, "a finite number > 0")
    if not (math.isfinite(cv) and cv >= 0):
        raise ConfigError("cv", cv, "a finite number >= 0")
    if jitter not in JITTERS:
        raise ConfigError("jitter", jitter, f"one of {', '.join(JITTERS)}")
    if not (math.isfinite(update_cv) and update_cv >= 0):
        raise ConfigError("update_cv", update_cv, "a finite number >= 0")
    if not (math.isfinite(update_shift_s) and 0 <= update_shift_s < t_update_s):
        raise ConfigError("update_shift_s", update_shift_s, f"a finite number in [0, t_update_s={t_update_s!r})")


class _Cycles:
    """The updater's cycle boundaries of one replica: ``index(t)`` is the cycle holding ``t``
    (= the version published at ``t``), ``boundary(k)`` the start of cycle ``k``."""

    def __init__(self, rng: np.random.Generator, back: np.random.Generator, t_update_s: float,
                 update_cv: float, cycles: int, shift: float = 0.0):
        self.tu, self.cv, self.back, self.shift = t_update_s, update_cv, back, shift
        if update_cv == 0:
            self.first, self.last = 0, cycles - 1
            self.horizon = cycles * t_update_s
            return
        # Cycles shift + G, G gamma of mean T_u - shift (shift 0: the gamma cycle, draw for draw).
        tail = (t_update_s - shift) / t_update_s
        self.a = a = tail * tail / update_cv ** 2
        self.scale = scale = (t_update_s - shift) / a
        # The cycle straddling 0 is length-biased: density ~ (shift + g) f(g), a mixture of shift + G
        # (weight shift / T_u) and shift + G' with G' the size-biased gamma (shape a + 1).
        plain = shift > 0 and rng.random() < shift / t_update_s
        length = shift + rng.gamma(a if plain else a + 1.0, scale)
        b0 = -rng.random() * length
        forward = b0 + length + np.concatenate([[0.0], np.cumsum(shift + rng.gamma(a, scale, cycles))])
        self.b = np.concatenate([[b0], forward])                # b_0 .. b_{cycles+1}
        self.base = 0                                            # boundaries before b_0
        self.first, self.last = 1, cycles
        self.horizon = float(self.b[-1])

    def _extend_back(self, t_min: float) -> None:
        while self.b[0] > t_min:  # blocks of a fixed size: the same stream whatever asks for it
            lengths = self.shift + self.back.gamma(self.a, self.scale, 64)
            self.b = np.concatenate([self.b[0] - np.cumsum(lengths)[::-1], self.b])
            self.base += 64

    def index(self, t: np.ndarray) -> np.ndarray:
        if self.cv == 0:
            return np.floor(t / self.tu).astype(np.int64)
        t = np.asarray(t)
        if t.size:
            self._extend_back(float(np.min(t)))
        return np.searchsorted(self.b, t, side="right").astype(np.int64) - 1 - self.base

    def boundary(self, k: int) -> float:
        return k * self.tu if self.cv == 0 else float(self.b[self.base + k])


class _Draws:
    """Compute times of the learners: stationary first interval, then i.i.d. intervals."""

    def __init__(self, rng: np.random.Generator, t_compute_s: float, cv: float, jitter: str):
        self.rng, self.tc, self.cv, self.jitter = rng, t_compute_s, cv, jitter

    def intervals(self, shape: tuple[int, ...]) -> np.ndarray:
        if self.cv == 0:
            return np.full(shape, self.tc)
        if self.jitter == "gamma":
            a = 1.0 / self.cv ** 2
            return self.rng.gamma(a, self.tc / a, size=shape)
        s2 = math.log1p(self.cv ** 2)
        return self.rng.lognormal(math.log(self.tc) - s2 / 2, math.sqrt(s2), size=shape)

    def first(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(first completion time t1 >= 0, its duration L): L length-biased, t1 = U L."""
        if self.cv == 0:
            length = np.full(n, self.tc)
        elif self.jitter == "gamma":
            a = 1.0 / self.cv ** 2
            length = self.rng.gamma(a + 1.0, self.tc / a, size=n)  # size-biased gamma
        else:
            s2 = math.log1p(self.cv ** 2)
            length = self.rng.lognormal(math.log(self.tc) + s2 / 2, math.sqrt(s2), size=n)
        return self.rng.random(n) * length, length

    def completions(self, n: int, horizon_s: float) -> tuple[np.ndarray, np.ndarray]:
        """Completion times and durations ``[n, m]`` of ``n`` learners, covering ``[0, horizon)``.

        Entries at or beyond the horizon are set to ``inf``.
        """
        t1, first_len = self.first(n)
        mean_count = horizon_s / self.tc
        m = int(mean_count + 6.0 * self.cv * math.sqrt(mean_count) + 3)
        durations = np.concatenate([first_len[:, None], self.intervals((n, m))], axis=1)
        times = t1[:, None] + np.concatenate(
            [np.zeros((n, 1)), np.cumsum(durations[:, 1:], axis=1)], axis=1)
        while np.any(times[:, -1] < horizon_s):  # rare: extend rows that end early
            extra = self.intervals((n, max(4, m // 4)))
            durations = np.concatenate([durations, extra], axis=1)
            times = np.concatenate([times, times[:, -1:] + np.cumsum(extra, axis=1)], axis=1)
        times[times >= horizon_s] = np.inf
        return times, durations


def _plan(n_workers: int, t_compute_s: float, t_update_s: float, n_cycles: int,
          n_replicas: int | None) -> tuple[int, int]:
    if n_replicas is None:
        n_replicas = int(min(max(n_cycles // 2, 1), 256))
    n_replicas = max(1, min(int(n_replicas), int(n_cycles)))
    return n_replicas, max(1, int(n_cycles) // n_replicas)


def simulate(n_workers: int, t_compute_s: float, t_update_s: float, cv: float = 0.0, *,
             n_cycles: int = 20_000, n_replicas: int | None = None, jitter: str = "gamma",
             seed: int = 0, chunk_events: int = 2_000_000, update_cv: float = 0.0,
             update_shift_s: float = 0.0) -> SimResult:
    """Vectorised simulation: histograms of gradients per update and of staleness.

    Args:
      n_workers: Learners ``N``.
      t_compute_s: Mean learner time ``T_c``.
      t_update_s: Updater cycle ``T_u``.
      cv: Coefficient of variation of the learner time (0 = deterministic).
      n_cycles: Updater cycles observed in total (split over the replicas).
      n_replicas: Independent replicas (default ``min(n_cycles // 2, 256)``).
      jitter: ``"gamma"`` or ``"lognormal"``.
      seed: Seed of numpy's PCG64 generator.
      chunk_events: Learners are processed in chunks of about this many events (memory bound).
      update_cv: Coefficient of variation of the updater cycle (0 = fixed cycles).
      update_shift_s: Fixed part ``s`` of the updater cycle in ``[0, T_u)``: cycles ``s + G``, ``G``
        gamma of mean ``T_u - s`` (the cycle keeps mean ``T_u`` and cv ``update_cv``).

    Returns:
      :class:`SimResult`.
    """
    _check(n_workers, t_compute_s, t_update_s, cv, jitter, update_cv, update_shift_s)
    rng = np.random.default_rng(seed)
    back = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    draws = _Draws(rng, t_compute_s, cv, jitter)
    n_replicas, cycles = _plan(n_workers, t_compute_s, t_update_s, n_cycles, n_replicas)
    per_learner = cycles * t_update_s / t_compute_s + 4
    chunk = max(1, int(chunk_events // per_learner))
    expected_events = n_workers * cycles * t_update_s / t_compute_s
    sparse = cycles > 4 * expected_events + 1024
    count_hist = np.zeros(1, np.int64)
    stale_hist = np.zeros(1, np.int64)
    n_grad = 0
    for _ in range(n_replicas):
        clock = _Cycles(rng, back, t_update_s, update_cv, cycles, update_shift_s)
        per_cycle = None if sparse else np.zeros(cycles, np.int64)
        sparse_cycles = []
        for lo in range(0, n_workers, chunk):
            n = min(chunk, n_workers - lo)
            times, durations = draws.completions(n, clock.horizon)
            ok = np.isfinite(times)
            t, d = times[ok], durations[ok]
            cyc = clock.index(t)
            stale = cyc + 1 - clock.index(t - d)
            stale_hist = _add_hist(stale_hist, np.bincount(stale))
            n_grad += t.size
            seen = cyc[cyc >= clock.first] - clock.first  # observed cycles only
            if sparse:
                sparse_cycles.append(seen)
            else:
                per_cycle += np.bincount(seen, minlength=cycles)[:cycles]
        if sparse:
            cyc = np.concatenate(sparse_cycles) if sparse_cycles else np.zeros(0, np.int64)
            _, counts = np.unique(cyc, return_counts=True)
            h = np.bincount(counts)
            h[0] = cycles - counts.size
        else:
            h = np.bincount(per_cycle)
        count_hist = _add_hist(count_hist, h)
    return SimResult(count_hist, stale_hist, n_replicas * cycles, n_grad, n_replicas)


def _add_hist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if b.size > a.size:
        a, b = b.astype(np.int64), a
    a = a.copy()
    a[:b.size] += b
    return a


def simulate_events(n_workers: int, t_compute_s: float, t_update_s: float, cv: float = 0.0, *,
                    n_cycles: int = 200, n_replicas: int | None = None, jitter: str = "gamma",
                    seed: int = 0, update_cv: float = 0.0, update_shift_s: float = 0.0) -> SimResult:
    """Literal event-driven simulation (reference; use small configurations).

    Same arguments, random draws and result as :func:`simulate` (with one chunk per replica).
    """
    _check(n_workers, t_compute_s, t_update_s, cv, jitter, update_cv, update_shift_s)
    rng = np.random.default_rng(seed)
    back = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    draws = _Draws(rng, t_compute_s, cv, jitter)
    n_replicas, cycles = _plan(n_workers, t_compute_s, t_update_s, n_cycles, n_replicas)
    count_hist = np.zeros(1, np.int64)
    stale_hist = np.zeros(1, np.int64)
    n_grad = 0
    for _ in range(n_replicas):
        clock = _Cycles(rng, back, t_update_s, update_cv, cycles, update_shift_s)
        times, durations = draws.completions(n_workers, clock.horizon)
        # Learner state: index of its current computation and the version it read.
        pos = np.zeros(n_workers, np.int64)
        read = list(clock.index(times[:, 0] - durations[:, 0]))
        heap = [(times[i, 0], i) for i in range(n_workers) if np.isfinite(times[i, 0])]
        heapq.heapify(heap)
        version, buffer, counts = 0, [], []
        k = 1
        while k <= clock.last + 1:
            boundary = clock.boundary(k)
            if heap and heap[0][0] < boundary:
                t, i = heapq.heappop(heap)
                buffer.append(read[i])      # hand the gradient to the updater
                read[i] = version           # read the newest published weights, start again
                pos[i] += 1
                nxt = times[i, pos[i]] if pos[i] < times.shape[1] else np.inf
                if np.isfinite(nxt):
                    heapq.heappush(heap, (nxt, i))
            else:
                version = k                 # cycle k-1's update is published at its end
                if k - 1 >= clock.first:    # cycle k gathers the buffer of cycle k-1 ...
                    counts.append(len(buffer))
                for v in buffer:            # ... and its update publishes version k + 1
                    s = (k + 1) - 1 - v
                    if s >= stale_hist.size:
                        stale_hist = np.concatenate([stale_hist, np.zeros(s + 1 - stale_hist.size,
                                                                          np.int64)])
                    stale_hist[s] += 1
                n_grad += len(buffer)
                buffer = []
                k += 1
        count_hist = _add_hist(count_hist, np.bincount(np.asarray(counts, np.int64)))
    return SimResult(count_hist, stale_hist, n_replicas * cycles, n_grad, n_replicas)


def simulate_epoch_time_s(n_workers: int, t_compute_s: float, cv: float = 0.0, *,
                          sub_batch: int = 1, dataset_size: int = 1_281_167,
                          jitter: str = "gamma", seed: int = 0) -> float:
    """Time until the learners have computed gradients for ``dataset_size`` samples.

    The epoch ends when the ``ceil(dataset_size / sub_batch)``-th gradient (counted over all
    learners from a stationary start at time 0) finishes.
    """
    _check(n_workers, t_compute_s, 1.0, cv, jitter)
    rng = np.random.default_rng(seed)
    draws = _Draws(rng, t_compute_s, cv, jitter)
    need = math.ceil(dataset_size / sub_batch)
    horizon = (need / n_workers + 3.0 + 6.0 * cv * math.sqrt(need / n_workers + 1.0)) * t_compute_s
    while True:
        times, _ = draws.completions(n_workers, horizon)
        t = times[np.isfinite(times)]
        if t.size >= need:
            return float(np.partition(t, need - 1)[need - 1])
        horizon *= 1.5


__all__ = ["JITTERS", "SimResult", "simulate", "simulate_epoch_time_s",
           "simulate_events"]
