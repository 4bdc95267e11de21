"""The SPRINT model at the edges of its range (issue: broken pmfs at extreme timings): the six reported
failures as regressions, a property test over random valid configurations (sum to 1, exact means within 1%,
bounded sizes) and the documented input limits."""
import functools
import math

import jax
import numpy as np
import pytest

from jaxsprint.perf import sprint
from perf_util import raises_invalid


def _mean(offset, stride, pmf):
    pmf = np.asarray(pmf, np.float64)
    return np.asarray(offset, np.float64) + np.asarray(stride, np.float64) * (pmf * np.arange(pmf.shape[-1])).sum(-1)


def _check(d, n, tc, tu, max_size=4096):
    for off, stride, pmf, want in ((d.count_offset, d.count_stride, d.count_pmf, n * tu / tc),
                                   (d.staleness_offset, d.staleness_stride, d.staleness_pmf, tc / tu + 1)):
        pmf = np.asarray(pmf, np.float64)
        assert pmf.shape[-1] <= max_size                              # memory bound: the window is capped
        assert np.all(pmf >= 0) and np.all(np.abs(pmf.sum(-1) - 1) < 1e-6)
        got = _mean(off, stride, pmf)
        np.testing.assert_allclose(got, want, rtol=0.01)
        s = np.asarray(stride, np.float64)
        assert np.all(s >= 1) and np.all(np.log2(s) == np.round(np.log2(s)))   # powers of two


# The reported failures of `predict.py --json` (workers, t_compute, t_update, t_compute_cv): a staleness pmf
# summing to 1.717 and 67,281, an empty mini-batch pmf, a broadcasting ValueError, a 5-minute hang, 180 GB.
REPORTED = [(2, 1.0, 0.001, 2.0), (64, 45.83, 4.583e-05, 1.0), (4096, 1e-4, 100.0, 0.5), (1, 1e-5, 10.0, 1.0),
            (1, 1.0, 1e-9, 1.0), (3, 7.4e-05, 7.4e-14, 0.05)]


@pytest.mark.parametrize("n,tc,tu,cv", REPORTED)
def test_reported_failures(n, tc, tu, cv):
    sprint.validate_timings(n, tc, tu, cv)
    sizes = sprint.suggest_windows(n, tc, tu, cv)
    assert sizes in ({**sprint.SMALL_WINDOWS, "mix_nodes": 1}, {**sprint.LARGE_WINDOWS, "mix_nodes": 1})
    d = sprint.distributions(n, tc, tu, cv, **sizes)
    _check(d, n, tc, tu)
    # What predict.py prints: non-empty pmfs whose values are on the lattice.
    items = sprint.pmf_items(int(d.count_offset), d.count_pmf, scale=32, stride=int(d.count_stride))
    assert items and abs(sum(items.values()) - 1) < 1e-5
    stale = sprint.pmf_items(int(d.staleness_offset), d.staleness_pmf, stride=int(d.staleness_stride))
    mean = sum(int(k) * p for k, p in stale.items()) / sum(stale.values())
    assert mean == pytest.approx(tc / tu + 1, rel=0.01)


def _random_configs(k, seed, update_cv_max):
    rng = np.random.default_rng(seed)
    n = np.round(np.exp(rng.uniform(0, np.log(1e6), k))).astype(np.float32)
    ratio = np.exp(rng.uniform(np.log(1e-9), np.log(1e9), k))
    tc = np.exp(rng.uniform(np.log(1e-6), np.log(1e3), k)).astype(np.float32)
    tu = (tc * ratio).astype(np.float32)
    cv = np.where(rng.random(k) < 0.2, 0, rng.uniform(0, 2, k)).astype(np.float32)
    ucv = np.where(rng.random(k) < 0.2, 0, rng.uniform(0, update_cv_max, k)).astype(np.float32)
    return n, tc, tu, cv, ucv


@pytest.mark.slow
@pytest.mark.parametrize("update_cv_max,mix,k", [(0.0, 1, 1024), (2.0, 32, 256)])
def test_random_configurations_give_proper_pmfs(update_cv_max, mix, k):
    n, tc, tu, cv, ucv = _random_configs(k, 0, update_cv_max)
    f = jax.jit(jax.vmap(functools.partial(sprint.distributions, mix_nodes=mix, **sprint.LARGE_WINDOWS)))
    for lo in range(0, k, 256):
        sl = slice(lo, lo + 256)
        d = f(n[sl], tc[sl], tu[sl], cv[sl], ucv[sl])
        _check(d, n[sl].astype(np.float64), tc[sl].astype(np.float64), tu[sl].astype(np.float64))


def test_random_configurations_small_sample():
    """A quick version of the property test (the full one is marked slow)."""
    n, tc, tu, cv, ucv = _random_configs(64, 1, 0.0)
    f = jax.jit(jax.vmap(functools.partial(sprint.distributions, mix_nodes=1, **sprint.LARGE_WINDOWS)))
    _check(f(n, tc, tu, cv, ucv), n.astype(np.float64), tc.astype(np.float64), tu.astype(np.float64))


def test_tiny_means_keep_their_mass():
    # One learner with T_u / T_c = 1e-9: P(K = 1) = 1e-9 survives float32 (the atom is kept out of the FFT).
    for cv in (0.0, 0.5):
        d = sprint.distributions(1, 1.0, 1e-9, cv, **sprint.SMALL_WINDOWS, mix_nodes=1)
        assert float(d.count_pmf[1]) == pytest.approx(1e-9, rel=1e-3)


def test_out_of_range_inputs_are_clear_errors():
    with raises_invalid("workers", 10 ** 8, "<= 1e+07"):
        sprint.validate_timings(10 ** 8, 1.0, 1.0)
    with raises_invalid("workers", 2.5, "an integer >= 1"):
        sprint.validate_timings(2.5, 1.0, 1.0)
    with raises_invalid("t_compute", float("inf"), "a finite number > 0"):
        sprint.validate_timings(2, float("inf"), 1.0)
    with raises_invalid("t_update", 0.0, "a finite number > 0"):
        sprint.validate_timings(2, 1.0, 0.0)
    with raises_invalid("t_update", 1e-40, "[1e-30, 1e+30]"):
        sprint.validate_timings(2, 1.0, 1e-40)
    with raises_invalid("t_update", 1e-11, "t_update / t_compute in [1e-10, 1e+10]"):
        sprint.validate_timings(2, 1.0, 1e-11)
    with raises_invalid("t_compute_cv", float("nan"), "<= 2"):
        sprint.validate_timings(2, 1.0, 1.0, float("nan"))
    with raises_invalid("t_update_cv", 2.5, "a finite number >= 0 and <= 2"):
        sprint.validate_timings(2, 1.0, 1.0, 0.1, update_cv=2.5)
    with raises_invalid("t_update_cv", -0.1, ">= 0"):
        sprint.delay_pmfs(2, 1.0, 1.0, 0.1, -0.1, max_staleness=4, max_count=4)
    assert math.isclose(sprint.MAX_RATIO, 1e10)
