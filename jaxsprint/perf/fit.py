r"""Least squares for the model's figures and the law: one helper over ``scipy.optimize.least_squares``.

Every fit of the package (the machine figures of :mod:`jaxsprint.calibration.model_fit`, the runtime host's
figures of :mod:`jaxsprint.calibration.host_fit`, the time-to-accuracy law of :mod:`jaxsprint.plan.law`) is a
nonlinear least-squares problem

.. math::
    \min_{lo \le x \le hi} \tfrac12 \sum_i w_i\, \rho\big(r_i(x)\big),

with residuals ``r(x)`` (usually log errors), optional weights ``w`` and a loss ``rho`` (``r^2``, or scipy's
robust ``soft_l1``: quadratic below ``f_scale``, linear beyond). :func:`least_squares` solves it with scipy's
trust-region reflective method (bounds held by the method itself, no change of variables), stops on its
``ftol`` / ``xtol`` / ``gtol`` tests or ``max_nfev``, runs from one or several starts and keeps the lowest cost.
Residuals and Jacobians may come from JAX: :func:`jax_pair` jits a residual function and its forward-mode
Jacobian once, so that repeated fits of the same shapes reuse one compilation; scipy works in float64 on their
outputs (the JAX functions run in JAX's default precision).

At the optimum the result carries the Laplace (Gauss-Newton) covariance ``sigma^2 (J^T J)^{-1}`` of the
weighted residuals (:func:`gauss_newton_covariance`; Seber and Wild, *Nonlinear Regression*, 1989, sec. 2.1;
for a robust loss the same squared-loss approximation at the robust optimum), ``sigma^2`` the reduced
chi-square unless given, the standard errors and which parameters sit at a bound.

This module is plain numpy and scipy (and JAX for :func:`jax_pair`): it sits in the model's layer so that the
model, the calibration and the law all use it.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["LOSSES", "LeastSquaresFit", "gauss_newton_covariance", "jax_pair", "least_squares"]

LOSSES = ("linear", "soft_l1")


@dataclasses.dataclass
class LeastSquaresFit:
    """Outcome of :func:`least_squares`.

    Attributes:
      x: ``[n]`` parameters of the best start.
      cost: ``1/2 sum w_i rho(r_i)`` at ``x`` (``inf`` when no start gave finite residuals).
      residuals: ``[m]`` residuals ``r(x)`` (unweighted).
      jacobian: ``[m, n]`` ``d r / d x`` at ``x`` (unweighted).
      cov: ``[n, n]`` Laplace covariance ``sigma^2 (J_w^T J_w)^{-1}`` (``J_w``: the weighted Jacobian).
      sigma2: The ``sigma^2`` of ``cov``.
      std_error: ``sqrt(diag(cov))``.
      rel_std_error: ``std_error / |x|`` (``inf`` where ``x`` is 0).
      at_bound: ``[n]`` True where ``x`` lies within ``bound_tol`` of a bound.
      start_costs: Cost reached from every start.
      nfev: Residual evaluations over all starts.
      success: scipy's flag for the best start.
      message: scipy's stopping reason for the best start.
    """

    x: np.ndarray
    cost: float
    residuals: np.ndarray
    jacobian: np.ndarray
    cov: np.ndarray
    sigma2: float
    std_error: np.ndarray
    rel_std_error: np.ndarray
    at_bound: np.ndarray
    start_costs: np.ndarray
    nfev: int
    success: bool
    message: str


def gauss_newton_covariance(jacobian: np.ndarray, sigma2: float = 1.0, rcond: float = 1e-10) -> np.ndarray:
    """``sigma2 (J^T J)^{-1}`` by a pseudo-inverse (directions the data cannot see get no variance; a Jacobian
    with a non-finite entry gives an all-``inf`` covariance)."""
    j = np.asarray(jacobian, np.float64)
    n = j.shape[1]
    if not np.all(np.isfinite(j)):
        return np.full((n, n), np.inf)
    return float(sigma2) * np.linalg.pinv(j.T @ j, rcond=rcond)


def jax_pair(fn: Callable[..., Any], static_argnums: Sequence[int] = ()) -> tuple[Callable, Callable]:
    """``(jit(fn), jit(jacfwd(fn)))`` of a residual function ``fn(x, *args)``: build once (at module level) and
    pass both to :func:`least_squares` with ``args`` (which may be arrays, pytrees or static values)."""
    import jax

    static = tuple(static_argnums)
    return jax.jit(fn, static_argnums=static), jax.jit(jax.jacfwd(fn), static_argnums=static)


def _soft_l1_weighted(w: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """scipy's ``soft_l1`` ``rho(z) = 2 (sqrt(1 + z) - 1)`` times per-residual weights (a callable loss)."""

    def rho(z):
        s = np.sqrt(1.0 + z)
        return np.stack([w * 2.0 * (s - 1.0), w / s, -w / (2.0 * s ** 3)])

    return rho


def _central_difference(f: Callable[[np.ndarray], np.ndarray], x: np.ndarray, m: int) -> np.ndarray:
    """``[m, n]`` central-difference Jacobian of ``f`` at ``x`` (steps ``eps^(1/3) max(1, |x|)``)."""
    out = np.empty((m, x.size))
    for k in range(x.size):
        h = np.finfo(np.float64).eps ** (1 / 3) * max(1.0, abs(float(x[k])))
        e = np.zeros_like(x)
        e[k] = h
        out[:, k] = (f(x + e) - f(x - e)) / (2 * h)
    return out


def least_squares(fun: Callable[..., Any], x0: Sequence[float] | np.ndarray, *, args: tuple = (),
                  jac: Callable[..., Any] | None = None,
                  bounds: tuple[Sequence[float] | float, Sequence[float] | float] = (-np.inf, np.inf),
                  loss: str = "linear", f_scale: float = 1.0, weights: Sequence[float] | None = None,
                  sigma2: float | None = None, ftol: float = 1e-10, xtol: float = 1e-10, gtol: float = 1e-10,
                  max_nfev: int | None = None, bound_tol: float = 1e-6, rcond: float = 1e-10) -> LeastSquaresFit:
    """Bounded, optionally robust, multi-start nonlinear least squares (module docstring).

    Args:
      fun: Residuals ``fun(x, *args) -> [m]`` (numpy or JAX arrays).
      x0: One start ``[n]`` or several ``[k, n]`` (each clipped into the bounds); the lowest cost wins.
      args: Further arguments of ``fun`` and ``jac``.
      jac: Jacobian ``jac(x, *args) -> [m, n]``; None: scipy's finite differences.
      bounds: ``(lo, hi)``, scalars or ``[n]`` each (``+-inf``: unbounded).
      loss: ``"linear"`` (``rho(r) = r^2``) or ``"soft_l1"`` (``rho(r) = 2 s^2 (sqrt(1 + (r/s)^2) - 1)``).
      f_scale: ``s`` of ``soft_l1``.
      weights: ``[m]`` weights ``w_i >= 0`` of the residuals' losses (default 1).
      sigma2: ``sigma^2`` of the covariance; None: the reduced chi-square ``sum w r^2 / max(m - n, 1)``.
      ftol, xtol, gtol: scipy's stopping tolerances (relative change of the cost, of ``x``, the gradient).
      max_nfev: Residual evaluations per start at most (None: scipy's default, ``100 n``).
      bound_tol: A parameter this close to a bound (in its own units) is reported at that bound.
      rcond: Cut-off of the pseudo-inverse of ``J^T J``.

    Returns:
      :class:`LeastSquaresFit` (a start whose residuals are not finite at its start point costs ``inf``; if
      every start does, ``cost`` is ``inf`` and ``x`` the first start).

    Raises:
      ValueError: an unknown loss, bounds not ``lo < hi``, a start of the wrong length.
    """
    from scipy import optimize

    if loss not in LOSSES:
        raise ValueError(f"loss {loss!r}: one of {', '.join(LOSSES)}")
    starts = np.atleast_2d(np.asarray(x0, np.float64))
    n = starts.shape[1]
    lo = np.broadcast_to(np.asarray(bounds[0], np.float64), (n,)).copy()
    hi = np.broadcast_to(np.asarray(bounds[1], np.float64), (n,)).copy()
    if not np.all(lo < hi):
        raise ValueError(f"bounds ({lo}, {hi}): lo < hi in every parameter")
    # Strictly inside the bounds (the trust-region reflective method starts from an interior point).
    pad = 1e-10 * np.maximum(1.0, np.abs(np.where(np.isfinite(lo), lo, 0.0)))
    inner_lo = np.where(np.isfinite(lo), lo + pad, lo)
    pad = 1e-10 * np.maximum(1.0, np.abs(np.where(np.isfinite(hi), hi, 0.0)))
    inner_hi = np.where(np.isfinite(hi), hi - pad, hi)
    inside = lambda v: np.clip(v, inner_lo, inner_hi)  # noqa: E731
    res_fn = lambda x: np.asarray(fun(x, *args), np.float64).reshape(-1)  # noqa: E731
    jac_fn = "2-point" if jac is None else (lambda x: np.asarray(jac(x, *args), np.float64).reshape(-1, n))
    w = None if weights is None else np.asarray(weights, np.float64).reshape(-1)
    if w is not None and loss == "linear":  # exact: sqrt(w) r
        sw = np.sqrt(w)
        f = lambda x: sw * res_fn(x)  # noqa: E731
        j = jac_fn if jac is None else (lambda x: sw[:, None] * jac_fn(x))
        opt_loss = "linear"
    else:
        f, j = res_fn, jac_fn
        opt_loss = _soft_l1_weighted(w) if w is not None else loss
    best, costs, nfev = None, [], 0
    for s in starts:
        s = inside(s)
        r0 = f(s)
        if not np.all(np.isfinite(r0)):
            costs.append(math.inf)
            continue
        try:
            out = optimize.least_squares(f, s, jac=j, bounds=(lo, hi), method="trf", loss=opt_loss,
                                         f_scale=f_scale, ftol=ftol, xtol=xtol, gtol=gtol, max_nfev=max_nfev)
        except ValueError:  # the descent reached residuals or a Jacobian that are not finite: this start loses
            costs.append(math.inf)
            continue
        nfev += int(out.nfev)
        c = float(out.cost) if np.isfinite(out.cost) else math.inf
        costs.append(c)
        if best is None or c < float(best.cost):
            best = out
    if best is None:  # no start with finite residuals
        x = inside(starts[0])
        r = res_fn(x)
        jac_x = np.full((r.size, n), np.nan)
        cov = np.full((n, n), np.inf)
        return LeastSquaresFit(x, math.inf, r, jac_x, cov, math.inf, np.full(n, np.inf), np.full(n, np.inf),
                               np.zeros(n, bool), np.asarray(costs), nfev, False, "no start with finite residuals")
    x = np.asarray(best.x, np.float64)
    r = res_fn(x)
    jac_x = jac_fn(x) if jac is not None else _central_difference(res_fn, x, r.size)
    ww = np.ones(r.size) if w is None else w
    jw = np.sqrt(ww)[:, None] * jac_x
    m_eff = int(np.count_nonzero(ww > 0))
    s2 = float(np.sum(ww * r * r)) / max(m_eff - n, 1) if sigma2 is None else float(sigma2)
    cov = gauss_newton_covariance(jw, s2, rcond)
    sd = np.sqrt(np.maximum(np.diag(cov), 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(np.abs(x) > 0, sd / np.abs(x), np.inf)
    at_bound = (x - lo <= bound_tol) | (hi - x <= bound_tol)
    return LeastSquaresFit(x, float(best.cost), r, jac_x, cov, s2, sd, rel, at_bound, np.asarray(costs), nfev,
                           bool(best.success), str(best.message))
