"""Tests of jaxsprint.plan.law: the convergence law, its fit, the time-to-accuracy search, the candidates."""
import itertools
import math

import numpy as np
import pytest

from jaxsprint.errors import ConfigError
from jaxsprint.perf import machines, zoo
from jaxsprint.plan import law
from jaxsprint.perf import space as spaces

TRUE = np.array([math.log(40.0), math.log(1.5), math.log(0.05), math.log(2.0), 1.5])
B_REF = 45.0


def _cells(noise=0.03, seed=0):
    rng = np.random.default_rng(seed)
    b = np.repeat(np.geomspace(8, 256, 6), 4)
    tau = np.tile([0.0, 1.0, 2.0, 4.0], 6)
    y = np.asarray(law.law_log_updates(TRUE, b, tau, B_REF), np.float64) + rng.normal(size=b.size) * noise
    return b, tau, y


@pytest.fixture(scope="module")
def space():
    return spaces.make_space(zoo.get("resnet8"), machines.get("tsubame_kfc_dl"), max_nodes=16, max_sub_batch=32)


def test_the_law_is_mccandlish_without_staleness():
    b = np.array([4.0, 45.0, 400.0])
    u = np.exp(np.asarray(law.law_log_updates(TRUE, b, 0.0, B_REF)))
    s_min, e_min = 40.0, 40.0 * 1.5 * B_REF
    # (S / S_min - 1)(E / E_min - 1) = 1 with E = S B.
    np.testing.assert_allclose((u / s_min - 1.0) * (u * b / e_min - 1.0), 1.0, rtol=1e-4)


def test_staleness_costs_updates_and_more_at_larger_batches():
    lu = lambda b, t: float(law.law_log_updates(TRUE, b, t, B_REF))  # noqa: E731
    assert lu(32.0, 0.0) < lu(32.0, 1.0) < lu(32.0, 4.0)
    assert lu(128.0, 4.0) - lu(128.0, 0.0) > lu(8.0, 4.0) - lu(8.0, 0.0)


def test_fit_recovers_the_parameters_of_a_synthetic_law():
    b, tau, y = _cells()
    fit = law.fit_law(b, tau, y, np.full(b.size, 0.03 ** 2), b_ref=B_REF)
    sd = np.sqrt(np.diag(fit.cov))
    assert np.all(np.abs(fit.theta - TRUE) <= 4 * sd + 0.02), (fit.theta, TRUE, sd)
    np.testing.assert_allclose(fit.theta, TRUE, atol=0.15)
    assert fit.num_observed == b.size and fit.num_censored == 0
    # The band covers the truth at a new cell inside the range.
    u, lo, hi = law.band(fit, 60.0, 3.0, z=2.0)
    true_u = math.exp(float(law.law_log_updates(TRUE, 60.0, 3.0, B_REF)))
    assert lo[0] < true_u < hi[0]
    assert abs(u[0] / true_u - 1) < 0.1


def test_censored_cells_push_the_law_above_the_run_length():
    b, tau, y = _cells(noise=0.0)
    cens = y > math.log(400.0)
    y_obs = np.where(cens, math.log(400.0), y)
    fit = law.fit_law(b, tau, y_obs, None, cens, b_ref=B_REF)
    assert fit.num_censored == int(cens.sum()) > 0
    pred, _ = law.predict_log_updates(fit, b[cens], tau[cens])
    assert np.all(pred >= math.log(400.0) - 0.1)


def test_the_staleness_range_is_that_of_the_cells_that_reached_the_target():
    # Beyond it the staleness factor is bounded by censored cells from one side only: the choice stays inside.
    b, tau, y = _cells(noise=0.0)
    cens = tau >= 4.0
    y_obs = np.where(cens, float(y[cens].min()) - 0.1, y)  # the stale runs stopped before the target
    fit = law.fit_law(b, tau, y_obs, None, cens, b_ref=B_REF)
    assert fit.num_censored == int(cens.sum()) > 0 and fit.max_staleness == pytest.approx(2.0)
    none = law.fit_law(b[:4], tau[:4], np.full(4, 6.0), None, np.ones(4, bool), b_ref=B_REF)
    assert none.max_staleness == pytest.approx(4.0)  # nothing reached: the range of all cells


def test_least_certain_goes_where_there_is_no_data():
    b, tau, y = _cells()
    keep = tau <= 1.0
    fit = law.fit_law(b[keep], tau[keep], y[keep], b_ref=B_REF)
    cand_b = np.array([16.0, 16.0, 128.0])
    cand_tau = np.array([0.0, 1.0, 4.0])
    assert law.least_certain(fit, cand_b, cand_tau, [False, False, False], 1) == [2]
    assert law.least_certain(fit, cand_b, cand_tau, [False, False, True], 3) == [1, 0] or \
        set(law.least_certain(fit, cand_b, cand_tau, [False, False, True], 3)) == {0, 1}


def test_fit_refuses_bad_cells():
    with pytest.raises(ConfigError, match="mean_minibatch"):
        law.fit_law([0.0], [1.0], [3.0])
    with pytest.raises(ConfigError, match="cells"):
        law.fit_law([], [], [])
    with pytest.raises(ConfigError, match="log_updates"):
        law.fit_law([4.0], [1.0], [math.nan])


def test_ladder():
    np.testing.assert_allclose(law.minibatch_ladder(8, 128, 5), [8, 16, 32, 64, 128])
    with pytest.raises(ConfigError, match="minibatch_range"):
        law.minibatch_ladder(100, 10, 3)


def test_plan_search_finds_the_grid_optimum_of_a_known_law(space):
    b, tau, y = _cells(noise=0.0)
    fit = law.fit_law(b, tau, y, b_ref=B_REF)
    fit = fit._replace(theta=TRUE.copy(), minibatch_range=(16.0, 256.0), max_staleness=8.0)
    res = law.plan_search(space, fit, starts=8)
    grid = np.asarray(list(itertools.product(range(1, space.max_nodes + 1), range(1, space.max_gpus_per_node + 1),
                                             range(1, space.max_sub_batch + 1))))
    s, f, ok = law.evaluate_plan(space, fit, grid)
    i = int(np.argmin(np.where(ok, f, np.inf)))
    assert res.feasible
    assert res.log_time_to_accuracy <= f[i] + 1e-6, (res.config, tuple(grid[i]))
    assert 16.0 <= float(res.stats.mean_minibatch) <= 256.0
    # The choice is not SPRINT's fastest epoch in the range: staleness is priced.
    j = int(np.argmin(np.where(ok, np.log(s.epoch_time_s), np.inf)))
    assert f[j] >= f[i]


def test_candidates_are_distinct_and_meet_their_targets(space):
    cands = law.candidates(space, [32.0, 128.0], [2.0, math.inf], starts=4)
    assert 1 <= len(cands) <= 4
    assert len({c.config for c in cands}) == len(cands)
    for c in cands:
        assert c.feasible
        assert any(abs(c.mean_minibatch / t - 1) <= 0.05 + 1e-6 for t in (32.0, 128.0))
