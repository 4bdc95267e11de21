"""Tests of jaxsprint.perf.fit: known parameters recovered, bounds, a parameter at a bound, the robust loss,
weights, several starts, and the standard errors of linear least squares against the textbook formula."""
import math

import jax.numpy as jnp
import numpy as np
import pytest

from jaxsprint.perf import fit

T = np.linspace(0.0, 4.0, 40)
TRUE = np.array([2.0, 1.3, 0.5])  # y = a exp(-b t) + c


def _decay(x, t, y):
    return x[0] * jnp.exp(-x[1] * t) + x[2] - y


RES, JAC = fit.jax_pair(_decay)


def _data(noise=0.01, seed=0):
    rng = np.random.default_rng(seed)
    return TRUE[0] * np.exp(-TRUE[1] * T) + TRUE[2] + rng.normal(size=T.size) * noise


def test_recovers_known_parameters_with_a_jax_jacobian_and_with_finite_differences():
    y = _data()
    r = fit.least_squares(RES, [1.0, 0.5, 0.0], args=(T, y), jac=JAC)
    np.testing.assert_allclose(r.x, TRUE, atol=0.03)
    assert np.all(np.abs(r.x - TRUE) < 4 * r.std_error)  # within a few standard errors
    assert r.success and r.residuals.shape == (T.size,) and r.jacobian.shape == (T.size, 3)
    assert r.sigma2 == pytest.approx(np.sum(r.residuals ** 2) / (T.size - 3))
    np.testing.assert_allclose(r.rel_std_error, r.std_error / np.abs(r.x))
    assert not r.at_bound.any()
    numeric = fit.least_squares(lambda x: x[0] * np.exp(-x[1] * T) + x[2] - y, [1.0, 0.5, 0.0])  # float64
    np.testing.assert_allclose(numeric.x, r.x, atol=1e-4)
    np.testing.assert_allclose(numeric.std_error, r.std_error, rtol=1e-3)


def test_bounds_hold_and_a_parameter_at_a_bound_is_reported():
    y = _data(noise=0.0)
    r = fit.least_squares(RES, [1.0, 0.5, 0.0], args=(T, y), jac=JAC, bounds=([0.0, 0.0, 0.0], [10.0, 1.0, 10.0]))
    assert 0.0 <= r.x[1] <= 1.0
    assert r.x[1] == pytest.approx(1.0, abs=1e-6)  # the truth (1.3) lies outside
    assert r.at_bound.tolist() == [False, True, False]
    free = fit.least_squares(RES, [1.0, 0.5, 0.0], args=(T, y), jac=JAC)
    assert r.cost > free.cost


def test_the_robust_loss_downweights_an_outlier():
    y = _data(noise=0.01)
    y[10] += 3.0
    start = [1.0, 0.5, 0.0]
    squared = fit.least_squares(RES, start, args=(T, y), jac=JAC)
    robust = fit.least_squares(RES, start, args=(T, y), jac=JAC, loss="soft_l1", f_scale=0.05)
    err = lambda r: float(np.max(np.abs(r.x - TRUE)))  # noqa: E731
    assert err(robust) < 0.05 < err(squared)
    assert err(robust) < 0.2 * err(squared)
    # The cost is scipy's soft_l1: 1/2 sum 2 s^2 (sqrt(1 + (r/s)^2) - 1).
    s = 0.05
    expect = 0.5 * np.sum(2 * s ** 2 * (np.sqrt(1 + (robust.residuals / s) ** 2) - 1))
    assert robust.cost == pytest.approx(expect, rel=1e-6)
    with pytest.raises(ValueError, match="loss"):
        fit.least_squares(RES, start, args=(T, y), loss="huber")


def test_standard_errors_are_the_textbook_ones_on_linear_least_squares():
    rng = np.random.default_rng(1)
    x = np.stack([np.ones(30), rng.normal(size=30), rng.normal(size=30)], 1)
    y = x @ np.array([1.0, -2.0, 0.5]) + rng.normal(size=30) * 0.3
    r = fit.least_squares(lambda b: x @ b - y, np.zeros(3), jac=lambda b: x)
    beta, rss, *_ = np.linalg.lstsq(x, y, rcond=None)
    s2 = float(rss[0]) / (30 - 3)
    np.testing.assert_allclose(r.x, beta, atol=1e-8)
    np.testing.assert_allclose(r.cov, s2 * np.linalg.inv(x.T @ x), rtol=1e-6)
    np.testing.assert_allclose(r.std_error, np.sqrt(np.diag(s2 * np.linalg.inv(x.T @ x))), rtol=1e-6)
    assert r.cost == pytest.approx(0.5 * float(rss[0]), rel=1e-8)
    # Given sigma^2 = 1 the covariance is (X^T X)^-1; weights are those of weighted least squares.
    np.testing.assert_allclose(fit.least_squares(lambda b: x @ b - y, np.zeros(3), sigma2=1.0).cov,
                               np.linalg.inv(x.T @ x), rtol=1e-5)
    w = rng.uniform(0.5, 2.0, size=30)
    rw = fit.least_squares(lambda b: x @ b - y, np.zeros(3), jac=lambda b: x, weights=w, sigma2=1.0)
    xtwx = x.T @ (w[:, None] * x)
    np.testing.assert_allclose(rw.x, np.linalg.solve(xtwx, x.T @ (w * y)), atol=1e-8)
    np.testing.assert_allclose(rw.cov, np.linalg.inv(xtwx), rtol=1e-6)


def test_several_starts_keep_the_best_and_a_start_that_overflows_loses():
    # Two minima: r(x) = (x^2 - 1, 0.3 (x - 1)) is lowest at x = 1, a worse one near x = -1.
    f = lambda x: np.array([x[0] ** 2 - 1.0, 0.3 * (x[0] - 1.0)])  # noqa: E731
    one = fit.least_squares(f, [-1.5])
    assert one.x[0] < 0
    many = fit.least_squares(f, [[-1.5], [2.0]])
    assert many.x[0] == pytest.approx(1.0, abs=1e-6)
    assert many.start_costs.shape == (2,) and many.start_costs[1] < many.start_costs[0]
    g = lambda x: np.array([math.log(x[0]) if x[0] > 0 else math.nan, x[0] - 2.0])  # noqa: E731
    r = fit.least_squares(g, [[-1.0], [3.0]])
    assert math.isinf(r.start_costs[0]) and math.isfinite(r.cost)
    none = fit.least_squares(g, [[-1.0]])
    assert math.isinf(none.cost) and not none.success
    # A start whose descent reaches a non-finite Jacobian (scipy raises there) loses the same way.
    h = lambda x: np.array([x[0] - 2.0])  # noqa: E731
    hj = lambda x: np.array([[1.0 if x[0] > 1.0 else math.nan]])  # noqa: E731
    r = fit.least_squares(h, [[0.5], [3.0]], jac=hj)
    assert math.isinf(r.start_costs[0]) and r.x[0] == pytest.approx(2.0) and math.isfinite(r.cost)


def test_the_weighted_soft_l1_is_the_per_residual_robust_loss():
    """Weights with the robust loss: cost 1/2 sum w_i 2 s^2 (sqrt(1 + (r_i/s)^2) - 1)."""
    y = _data(noise=0.02)
    w = np.linspace(0.5, 2.0, T.size)
    r = fit.least_squares(RES, [1.0, 0.5, 0.0], args=(T, y), jac=JAC, loss="soft_l1", f_scale=0.1, weights=w)
    s = 0.1
    cost = lambda x: 0.5 * np.sum(w * 2 * s ** 2 * (np.sqrt(1 + (np.asarray(_decay(x, T, y)) / s) ** 2) - 1))  # noqa: E731
    assert r.cost == pytest.approx(cost(r.x), rel=1e-5)
    for k in range(3):  # a minimum: no coordinate step lowers the cost
        for h in (1e-3, -1e-3):
            e = np.zeros(3)
            e[k] = h
            assert cost(r.x + e) >= r.cost - 1e-9
