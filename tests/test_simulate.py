"""Tests of jaxsprint.perf.simulate: literal event loop == vectorised, closed forms, epoch time."""
import math

import numpy as np
import pytest

from jaxsprint.perf import simulate as sim
from perf_util import raises_invalid


@pytest.mark.parametrize("n,tu,cv,jitter", [(3, 0.37, 0.2, "gamma"), (5, 2.3, 0.0, "gamma"),
                                            (4, 0.05, 0.3, "lognormal"), (1, 1.7, 0.1, "gamma")])
def test_event_loop_equals_vectorised(n, tu, cv, jitter):
    kw = dict(n_cycles=240, n_replicas=4, jitter=jitter, seed=3)
    a = sim.simulate(n, 1.0, tu, cv, **kw)
    b = sim.simulate_events(n, 1.0, tu, cv, **kw)
    np.testing.assert_array_equal(a.count_hist, b.count_hist)
    np.testing.assert_array_equal(a.staleness_hist, b.staleness_hist)
    assert a.n_gradients == b.n_gradients == int(np.dot(np.arange(a.count_hist.size), a.count_hist))


def test_chunking_does_not_change_the_statistics():
    a = sim.simulate(40, 1.0, 0.6, 0.2, n_cycles=2000, seed=5)
    b = sim.simulate(40, 1.0, 0.6, 0.2, n_cycles=2000, seed=5, chunk_events=500)
    assert a.n_cycles == b.n_cycles
    assert a.mean_count == pytest.approx(b.mean_count, rel=0.03)


@pytest.mark.parametrize("n,tu,cv", [(8, 0.37, 0.0), (8, 0.37, 0.3), (32, 4.2, 0.1), (2, 0.02, 0.5)])
def test_closed_forms_and_littles_law(n, tu, cv):
    s = sim.simulate(n, 1.0, tu, cv, n_cycles=20_000, seed=2)
    assert s.mean_count == pytest.approx(n * tu, rel=0.02)           # E[K] = N T_u / T_c
    assert s.mean_staleness == pytest.approx(1 / tu + 1, rel=0.02)   # E[S] = T_c / T_u + 1
    assert (s.mean_staleness - 1) * s.mean_count == pytest.approx(n, rel=0.03)  # Little's law


def test_deterministic_staleness_takes_two_values():
    q = 1 / 0.37
    s = sim.simulate(6, 1.0, 0.37, 0.0, n_cycles=4000, seed=1)
    support = np.nonzero(s.staleness_hist)[0]
    assert set(support) <= {math.floor(q) + 1, math.floor(q) + 2}
    assert s.staleness_pmf[math.floor(q) + 2] == pytest.approx(q - math.floor(q), abs=0.02)
    counts = np.nonzero(s.count_hist)[0]
    assert set(counts) <= set(range(0, 7))


@pytest.mark.parametrize("n,cv,b", [(4, 0.0, 64), (64, 0.3, 32), (1, 0.1, 256)])
def test_epoch_time_matches_closed_form(n, cv, b):
    t = sim.simulate_epoch_time_s(n, 0.2, cv, sub_batch=b, dataset_size=100_000, seed=0)
    assert t == pytest.approx(100_000 * 0.2 / (n * b), rel=0.02)


def test_bad_parameters_name_the_field():
    with raises_invalid("n_workers", 0, "an integer >= 1"):
        sim.simulate(0, 1.0, 1.0)
    with raises_invalid("t_update_s", float("nan"), "a finite number > 0"):
        sim.simulate(2, 1.0, float("nan"))
    with raises_invalid("cv", -0.1, "a finite number >= 0"):
        sim.simulate(2, 1.0, 1.0, -0.1)
    with raises_invalid("jitter", "weibull", "one of gamma, lognormal"):
        sim.simulate(2, 1.0, 1.0, 0.1, jitter="weibull")


@pytest.mark.parametrize("n,tu,cv,ucv", [(3, 0.37, 0.2, 0.5), (5, 2.3, 0.0, 1.0), (4, 0.05, 0.3, 2.0)])
def test_updater_jitter_event_loop_equals_vectorised(n, tu, cv, ucv):
    kw = dict(n_cycles=240, n_replicas=4, seed=3, update_cv=ucv)
    a = sim.simulate(n, 1.0, tu, cv, **kw)
    b = sim.simulate_events(n, 1.0, tu, cv, **kw)
    np.testing.assert_array_equal(a.count_hist, b.count_hist)
    np.testing.assert_array_equal(a.staleness_hist, b.staleness_hist)
    assert a.count_hist.sum() == a.n_cycles


@pytest.mark.parametrize("n,tu,cv,ucv", [(8, 0.37, 0.3, 0.5), (4, 2.0, 0.0, 1.0)])
def test_updater_jitter_keeps_the_exact_means(n, tu, cv, ucv):
    s = sim.simulate(n, 1.0, tu, cv, n_cycles=20_000, seed=2, update_cv=ucv)
    assert s.mean_count == pytest.approx(n * tu, rel=0.02)
    assert s.mean_staleness == pytest.approx(1 / tu + 1, rel=0.02)
    with raises_invalid("update_cv", -1.0, "a finite number >= 0"):
        sim.simulate(2, 1.0, 1.0, 0.1, update_cv=-1.0)
