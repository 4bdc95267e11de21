r"""The updates-to-target law ``U(B, tau)``, its fit with uncertainty, and the configuration it picks.

What a user wants is the configuration ``x = (nodes, learners per node, sub-batch)`` that reaches a target
accuracy soonest, ``T_acc(x) = U(E[B](x), E[S](x)) T_u(x)``, with ``U`` the updater cycles to the target.
SPRINT's own rule (the fastest configuration whose mean mini-batch meets a target) leaves staleness out.
This module is pure jnp: the updates to target come in as data (emulated runs, :mod:`jaxsprint.plan.emulator`).

**The law** (:func:`law_log_updates`): McCandlish et al.'s ``S = S_min (1 + B_noise / B)`` times a staleness
factor that grows with the staleness and, through the learning rate, with the batch,

.. math::
    \log U(B, \tau) = \log S_{min} + \log(1 + B_{noise} / B) + a\, \tau^{p} (B / B_{ref})^{\delta},

``theta = (log S_min, log(B_noise / B_ref), log a, log p, delta)``, ``tau`` the mean staleness.

**Fit** (:func:`fit_law`): weighted least squares in ``log U`` with broad Gaussian priors on ``theta``, by
:func:`jaxsprint.perf.fit.least_squares` from several starts; runs that never reached the target are censored
at their length (one-sided residuals). The covariance is the Laplace approximation ``s^2 (J^T J)^-1``; a
prediction's band comes from the delta method, and :func:`least_certain` ranks unrun candidates by it.

**Choice** (:func:`plan_search`): ``log U + log T_u`` minimised over the relaxed configuration with the search
machinery of :mod:`jaxsprint.perf.search` inside the fitted data's mini-batch range and at most the mean
staleness of a cell that reached the target (never extrapolated), rounded and refined by hill climbing.
Derivation and the details: ``docs/planning.md``.

References:
  McCandlish, Kaplan, Amodei et al., "An empirical model of large-batch training", arXiv:1812.06162, 2018.
  Zhang et al., "Staleness-aware Async-SGD for Distributed Deep Learning", IJCAI 2016.
  Dai et al., "Toward understanding the impact of staleness in distributed machine learning", ICLR 2019.
"""
from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxsprint.errors import ConfigError, check
from jaxsprint.perf import fit as lsq
from jaxsprint.perf import search
from jaxsprint.perf import space as spaces

__all__ = ["LawFit", "NUM_PARAMS", "PlanResult", "Prior", "band", "candidates", "evaluate_plan", "fit_law",
           "law_log_updates", "least_certain", "measured_noise_prior", "minibatch_ladder", "plan_search",
           "predict_log_updates"]

NUM_PARAMS = 5
MAX_LOG_UPDATES = math.log(1e12)  # reported predictions are capped here (a run that never gets there)
PARAM_NAMES = ("log_s_min", "log_b_noise", "log_a", "log_p", "delta")


class Prior(NamedTuple):
    """Gaussian prior of ``theta`` (means and standard deviations, in the parameters' own units)."""

    mean: tuple[float, ...] = (math.log(100.0), 0.0, math.log(0.05), math.log(1.5), 1.0)
    sd: tuple[float, ...] = (5.0, 4.0, 4.0, 1.0, 2.0)


def measured_noise_prior(b_noise: float, b_noise_se: float, b_ref: float, prior: Prior | None = None) -> Prior:
    """`prior` with ``log(B_noise / B_ref)`` taken from a measured noise scale (:mod:`jaxsprint.train.noise`).

    Its mean is ``log(b_noise / b_ref)`` and its sd the measurement's relative standard error (the delta
    method, at least 0.01), so a fit takes B_noise from the measurement, as uncertain as it is, and fits S_min
    and the staleness factor from the runs.

    Raises:
      ConfigError: `b_noise` not finite and > 0, `b_noise_se` not finite and >= 0.
    """
    check(math.isfinite(b_noise) and b_noise > 0, "b_noise", b_noise, "a measured noise scale, finite and > 0")
    check(math.isfinite(b_noise_se) and b_noise_se >= 0, "b_noise_se", b_noise_se, "a standard error, finite, >= 0")
    prior = Prior() if prior is None else prior
    mean, sd = list(prior.mean), list(prior.sd)
    mean[1], sd[1] = math.log(b_noise / b_ref), max(b_noise_se / b_noise, 0.01)
    return Prior(tuple(mean), tuple(sd))


# ----------------------------------------------------------------------------------------------
# The law
# ----------------------------------------------------------------------------------------------


def law_log_updates(theta: jax.Array, mean_minibatch: jax.Array, mean_staleness: jax.Array,
                    b_ref: jax.Array) -> jax.Array:
    r"""``log U(B, tau)``: log updates to the target (module docstring).

    Args:
      theta: ``[5]`` parameters ``(log S_min, log(B_noise / B_ref), log a, log p, delta)``.
      mean_minibatch: ``B`` (samples; any shape, broadcast).
      mean_staleness: ``tau`` (updates, >= 0; 0 = synchronous).
      b_ref: The batch scale ``B_ref``.
    """
    b = jnp.asarray(mean_minibatch, jnp.float32) / b_ref
    tau = jnp.asarray(mean_staleness, jnp.float32)
    log_tau = jnp.log(jnp.maximum(tau, 1e-12))
    stale = jnp.where(tau > 0, jnp.exp(theta[2] + jnp.exp(theta[3]) * log_tau + theta[4] * jnp.log(b)), 0.0)
    return theta[0] + jnp.log1p(jnp.exp(theta[1]) / b) + stale


class LawFit(NamedTuple):
    """A fitted law.

    Attributes:
      theta: ``[5]`` parameters.
      cov: ``[5, 5]`` covariance (Laplace approximation).
      b_ref: Batch scale.
      residual_sd: Standard deviation of a single cell's ``log U`` around the law (seed noise and misfit).
      chi2: Weighted residual sum of squares of the observed cells (the censored ones count when violated).
      num_observed: Cells that reached the target.
      num_censored: Cells that did not.
      minibatch_range: ``(min, max)`` of the fitted mean mini-batches.
      max_staleness: Largest mean staleness of a fitted cell that reached the target (of any fitted cell
        when none did). Beyond it the staleness factor is extrapolated from censored cells only, which bound
        it from one side (docs/planning.md: such a fit chose a configuration that never reached the target).
    """

    theta: np.ndarray
    cov: np.ndarray
    b_ref: float
    residual_sd: float
    chi2: float
    num_observed: int
    num_censored: int
    minibatch_range: tuple[float, float]
    max_staleness: float

    def as_dict(self) -> dict:
        sd = np.sqrt(np.maximum(np.diag(self.cov), 0.0))
        return {"params": {n: float(v) for n, v in zip(PARAM_NAMES, self.theta)},
                "param_sd": {n: float(v) for n, v in zip(PARAM_NAMES, sd)},
                "s_min": float(np.exp(self.theta[0])), "b_noise": float(np.exp(self.theta[1]) * self.b_ref),
                "b_ref": self.b_ref, "residual_sd": self.residual_sd, "chi2": self.chi2,
                "num_observed": self.num_observed, "num_censored": self.num_censored,
                "minibatch_range": list(self.minibatch_range), "max_staleness": self.max_staleness}


def _residuals(theta, b, tau, y, w, cens, b_ref, pm, ps):
    """Weighted residuals of the cells (one-sided where censored; 0 where ``w = 0``) and the prior's rows."""
    d = law_log_updates(theta, b, tau, b_ref) - y
    d = jnp.where(cens, jnp.minimum(d, 0.0), d)
    return jnp.concatenate([jnp.sqrt(w) * d, (theta - pm) / ps])


_RESIDUALS, _JACOBIAN = lsq.jax_pair(_residuals)  # one compilation per padded cell count


def fit_law(mean_minibatch: Sequence[float], mean_staleness: Sequence[float], log_updates: Sequence[float],
            log_var: Sequence[float] | None = None, censored: Sequence[bool] | None = None, *,
            b_ref: float | None = None, prior: Prior | None = None, var_floor: float = 0.01, starts: int = 8,
            max_nfev: int = 200, seed: int = 0) -> LawFit:
    """Fits :func:`law_log_updates` to cells ``(B_i, tau_i, log U_i)`` (module docstring).

    Args:
      mean_minibatch: ``B_i`` per cell.
      mean_staleness: ``tau_i`` per cell.
      log_updates: ``log U_i`` (for a censored cell: the log of the run's length).
      log_var: Variance of each ``log U_i`` (e.g. over seeds / number of seeds); default 0.
      censored: True where the run never reached the target.
      b_ref: Batch scale (default: geometric mean of the ``B_i``).
      prior: Gaussian prior of ``theta`` (default: :class:`Prior`'s defaults).
      var_floor: Added to every cell's variance (misfit of the law, float noise).
      starts: Least-squares starts (the prior mean and random perturbations of it).
      max_nfev: Residual evaluations per start at most (:func:`jaxsprint.perf.fit.least_squares`).
      seed: Seed of the perturbations.

    Returns:
      :class:`LawFit`.

    Raises:
      ConfigError: no cell, non-finite or non-positive inputs, mismatched lengths.
    """
    b = np.asarray(mean_minibatch, np.float64).reshape(-1)
    tau = np.asarray(mean_staleness, np.float64).reshape(-1)
    y = np.asarray(log_updates, np.float64).reshape(-1)
    n = b.size
    check(n >= 1, "cells", n, "at least one (mini-batch, staleness, updates) cell to fit")
    var = np.zeros(n) if log_var is None else np.asarray(log_var, np.float64).reshape(-1)
    cens = np.zeros(n, bool) if censored is None else np.asarray(censored, bool).reshape(-1)
    check(tau.size == n and y.size == n and var.size == n and cens.size == n, "cells", n,
          "mean_minibatch, mean_staleness, log_updates, log_var and censored of equal length")
    check(bool(np.all(np.isfinite(b)) and np.all(b > 0)), "mean_minibatch", b.tolist(), "finite numbers > 0")
    check(bool(np.all(np.isfinite(tau)) and np.all(tau >= 0)), "mean_staleness", tau.tolist(), "finite numbers >= 0")
    check(bool(np.all(np.isfinite(y)) and np.all(np.isfinite(var)) and np.all(var >= 0)), "log_updates",
          y.tolist(), "finite log updates with finite variances >= 0")
    b_ref = float(np.exp(np.mean(np.log(b)))) if b_ref is None else float(b_ref)
    prior = Prior() if prior is None else prior
    w = 1.0 / (var + var_floor)
    pm, ps = np.asarray(prior.mean, np.float32), np.asarray(prior.sd, np.float32)
    rng = np.random.default_rng(seed)
    theta0 = pm + rng.normal(size=(starts, NUM_PARAMS)).astype(np.float32) * ps * 0.3
    theta0[0] = pm
    obs = ~cens
    if obs.any():  # start S_min at the data's scale
        theta0[:, 0] = float(np.min(y[obs])) + rng.normal(size=starts) * 0.3
    # Padded to a power of two with zero-weight cells, so that one compilation serves many cell counts.
    size = max(8, 1 << (n - 1).bit_length())
    pad = lambda a, v: np.concatenate([a, np.full(size - n, v, a.dtype)])  # noqa: E731
    args = tuple(jnp.asarray(pad(a, v), jnp.float32) for a, v in ((b, 1.0), (tau, 0.0), (y, 0.0), (w, 0.0)))
    args += (jnp.asarray(pad(cens, False)), jnp.float32(b_ref), jnp.asarray(pm), jnp.asarray(ps))
    rows = np.r_[0:n, size:size + NUM_PARAMS]  # the cells and the prior, without the padding
    res = lsq.least_squares(lambda t: np.asarray(_RESIDUALS(t, *args))[rows], theta0,
                            jac=lambda t: np.asarray(_JACOBIAN(t, *args))[rows], bounds=(-30.0, 30.0),
                            sigma2=1.0, max_nfev=max_nfev)
    theta = res.x
    f = np.asarray(law_log_updates(jnp.asarray(theta, jnp.float32), b, tau, b_ref), np.float64)
    d = f - y
    d = np.where(cens, np.minimum(d, 0.0), d)
    chi2 = float(np.sum(w * d * d))
    dof = max(int(obs.sum()) - NUM_PARAMS, 1)
    scale = max(1.0, chi2 / dof) if obs.sum() > NUM_PARAMS else 1.0
    cov = scale * res.cov  # the Laplace covariance (J^T J)^-1 of the cells' and the prior's rows
    res_var = scale * float(np.mean(var[obs] + var_floor)) if obs.any() else var_floor
    return LawFit(theta, cov, b_ref, math.sqrt(res_var), chi2, int(obs.sum()), int(cens.sum()),
                  (float(b.min()), float(b.max())), float(tau[obs].max() if obs.any() else tau.max()))


def predict_log_updates(fit: LawFit, mean_minibatch: Sequence[float] | float,
                        mean_staleness: Sequence[float] | float) -> tuple[np.ndarray, np.ndarray]:
    """``(log U, sd of log U from the parameters' uncertainty)`` at each ``(B, tau)`` (delta method)."""
    b = jnp.atleast_1d(jnp.asarray(mean_minibatch, jnp.float32))
    tau = jnp.broadcast_to(jnp.asarray(mean_staleness, jnp.float32), b.shape)
    theta = jnp.asarray(fit.theta, jnp.float32)
    f = lambda t, bb, tt: law_log_updates(t, bb, tt, fit.b_ref)  # noqa: E731
    mean = np.asarray(f(theta, b, tau), np.float64)
    g = np.asarray(jax.vmap(jax.grad(f), in_axes=(None, 0, 0))(theta, b, tau), np.float64)
    var = np.einsum("ni,ij,nj->n", g, fit.cov, g)
    return mean, np.sqrt(np.maximum(var, 0.0))


def band(fit: LawFit, mean_minibatch, mean_staleness, z: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(U, low, high)``: predicted updates and the band ``exp(log U +- z sqrt(sd_param^2 + residual_sd^2))``,
    each at most ``1e12``."""
    mean, sd = predict_log_updates(fit, mean_minibatch, mean_staleness)
    tot = np.sqrt(sd ** 2 + fit.residual_sd ** 2)
    # Far in the divergent corner the law's exponent is huge: report at most 1e12 updates ("never").
    cap = lambda v: np.exp(np.minimum(v, MAX_LOG_UPDATES))  # noqa: E731
    return cap(mean), cap(mean - z * tot), cap(mean + z * tot)


def least_certain(fit: LawFit, mean_minibatch, mean_staleness, done: Sequence[bool], k: int) -> list[int]:
    """Indices of the ``k`` cells not ``done`` whose prediction is least certain (largest parameter sd)."""
    _, sd = predict_log_updates(fit, mean_minibatch, mean_staleness)
    order = [int(i) for i in np.argsort(-sd, kind="stable") if not done[int(i)]]
    return order[:k]


# ----------------------------------------------------------------------------------------------
# Candidates: SPRINT's rule over a ladder of targets
# ----------------------------------------------------------------------------------------------


def minibatch_ladder(lo: float, hi: float, steps: int) -> list[float]:
    """``steps`` geometric mini-batch targets from ``lo`` to ``hi``.

    Raises:
      ConfigError: ``lo`` not in ``[1, hi]`` or ``steps`` < 1.
    """
    check(math.isfinite(lo) and math.isfinite(hi) and 1.0 <= lo <= hi, "config.minibatch_range", (lo, hi),
          "two finite numbers 1 <= lo <= hi (samples)")
    check(isinstance(steps, int) and steps >= 1, "config.ladder", steps, "an integer >= 1")
    if steps == 1:
        return [float(math.sqrt(lo * hi))]
    return [float(v) for v in np.geomspace(lo, hi, steps)]


def candidates(space: spaces.Space, minibatch_targets: Sequence[float], staleness_limits: Sequence[float], *,
               tolerance: float = 0.05, starts: int = 8, seed: int = 0) -> list[search.Candidate]:
    """The model's fastest configuration for each (mean mini-batch target, staleness limit), deduplicated.

    Each pair is one :func:`jaxsprint.perf.search.gradient_search` (they share its compilation); pairs no
    configuration meets are skipped. Sorted by mean mini-batch, then mean staleness.
    """
    seen: dict[tuple, search.Candidate] = {}
    for b in minibatch_targets:
        for s in staleness_limits:
            target = spaces.make_target(b, tolerance, None if s is None or not math.isfinite(s) else s)
            res = search.gradient_search(space, target, starts=starts, seed=seed)
            if res.best is not None:
                seen.setdefault(res.best.config, res.best)
    return sorted(seen.values(), key=lambda c: (c.mean_minibatch, c.mean_staleness))


# ----------------------------------------------------------------------------------------------
# Time to accuracy over the configuration space
# ----------------------------------------------------------------------------------------------


def _range_target(fit: LawFit, max_staleness: float | None) -> jax.Array:
    """``(B*, tau, S_max)`` whose band is exactly the fitted mini-batch range."""
    lo, hi = fit.minibatch_range
    s = fit.max_staleness if max_staleness is None else min(float(max_staleness), fit.max_staleness)
    s = max(s, 1.0 + 1e-6)
    return jnp.asarray([(lo + hi) / 2.0, max((hi - lo) / (hi + lo), 1e-6), s], jnp.float32)


def evaluate_plan(space: spaces.Space, fit: LawFit, configs: np.ndarray, *, max_staleness: float | None = None
                  ) -> tuple[spaces.Stats, np.ndarray, np.ndarray]:
    """Exact statistics, ``log T_acc`` and feasibility of discrete configurations ``[k, 3]``.

    Feasible: the mean mini-batch inside the fitted range, the mean staleness at most the fitted maximum (and
    ``max_staleness``), the memory within the accelerator's.
    """
    tgt = _range_target(fit, max_staleness)
    s, _, ok, _ = spaces.score_configs(space, tgt, np.asarray(configs, np.float32).reshape(-1, space.dims))
    lu = np.asarray(law_log_updates(jnp.asarray(fit.theta, jnp.float32), s.mean_minibatch, s.mean_staleness,
                                    fit.b_ref), np.float64)
    return s, lu + np.log(np.asarray(s.t_update_s, np.float64)), np.asarray(ok)


def _relax_fn(space: spaces.Space, batch: int, outer: int, inner: int):
    def run(machine, tgt, theta, b_ref, z0, lo, hi, lr):
        sp = dataclasses.replace(space, machine=machine)

        def parts(z):
            s = spaces.evaluate(sp, machine, jnp.exp(z))
            f = law_log_updates(theta, s.mean_minibatch, s.mean_staleness, b_ref) + jnp.log(s.t_update_s)
            return f, spaces.constraints(sp, s, tgt)

        def lagrangian(z, lam, rho):
            f, c = parts(z)
            return f + jnp.sum((jnp.maximum(0.0, lam + rho * c) ** 2 - lam ** 2) / (2.0 * rho))

        adam = optax.scale_by_adam()

        def one(z):
            lam = jnp.zeros_like(parts(z)[1])

            def inner_step(carry, _):
                z, opt, lam, rho, step = carry
                g = jax.grad(lagrangian)(z, lam, rho)
                upd, opt = adam.update(g, opt)
                return (jnp.clip(z - step * upd, lo, hi), opt, lam, rho, step), None

            def outer_step(carry, _):
                carry, _ = jax.lax.scan(inner_step, carry, None, length=inner)
                z, opt, lam, rho, step = carry
                lam = jnp.maximum(0.0, lam + rho * parts(z)[1])
                return (z, opt, lam, rho * 3.0, step * 0.8), None

            (z, *_), _ = jax.lax.scan(outer_step, (z, adam.init(z), lam, jnp.float32(10.0), lr), None, length=outer)
            return z

        return jax.vmap(one)(z0)

    return jax.jit(run)


@dataclasses.dataclass
class PlanResult:
    """The configuration with the shortest predicted time to accuracy.

    Attributes:
      config: ``(nodes, learners per node, sub-batch)``.
      log_time_to_accuracy: ``log(U T_u)`` at it (seconds).
      feasible: Whether it lies in the fitted range (and under the staleness limit and memory).
      stats: Its :class:`~jaxsprint.perf.space.Stats` (numpy scalars).
      evaluations: ``{"gradient": ..., "discrete": ...}`` model evaluations.
    """

    config: tuple[int, int, int]
    log_time_to_accuracy: float
    feasible: bool
    stats: spaces.Stats
    evaluations: dict[str, int]


def _neighbours(space: spaces.Space, x: np.ndarray) -> np.ndarray:
    """Every combination of steps 0, +-1, +-2, +-5%, +-15%, +-40% in each variable of ``x`` ``[S, 3]``."""
    out = []
    for row in x.astype(np.int64):
        per = []
        for d in range(3):
            v = int(row[d])
            steps = {0, 1, -1, 2, -2} | {s * max(3, int(round(v * f))) for f in (0.05, 0.15, 0.4) for s in (1, -1)}
            per.append(np.clip(v + np.asarray(sorted(steps)), space.lower[d], space.upper[d]))
        out.append(np.stack(np.meshgrid(*per, indexing="ij"), -1).reshape(-1, 3))
    return np.unique(np.concatenate(out), axis=0)


def plan_search(space: spaces.Space, fit: LawFit, *, max_staleness: float | None = None, starts: int = 16,
                outer: int = 5, inner: int = 40, learning_rate: float = 0.1, refine_steps: int = 30,
                seed: int = 0) -> PlanResult:
    """Minimises the predicted time to accuracy ``U(E[B], E[S]) T_u`` over the space (module docstring).

    Args:
      space: The space (without the precision option).
      fit: The fitted law; the search stays inside its mini-batch range and staleness.
      max_staleness: Optional further limit on the mean staleness.
      starts: Random starts of the relaxation (one vmapped call).
      outer, inner: Augmented-Lagrangian iterations and Adam steps per iteration.
      learning_rate: Adam step (log units).
      refine_steps: Hill-climbing steps at most.
      seed: Seed of the starts.

    Returns:
      :class:`PlanResult` (the closest infeasible point when nothing lies in the fitted range).

    Raises:
      ConfigError: a space with the precision option.
    """
    if space.precision is not None:
        raise ConfigError("precision", space.precision, "None: the time-to-accuracy search is over (n, g, b)")
    tgt = _range_target(fit, max_staleness)
    lo = np.log(space.lower.astype(np.float64)).astype(np.float32)
    hi = np.log(space.upper.astype(np.float64)).astype(np.float32)
    relax = space.jitted(("plan_relax", starts, outer, inner), lambda: _relax_fn(space, starts, outer, inner))
    u = np.asarray(jax.random.uniform(jax.random.PRNGKey(seed), (starts, 3)))
    z = np.asarray(relax(space.machine, tgt, jnp.asarray(fit.theta, jnp.float32), jnp.float32(fit.b_ref),
                         jnp.asarray(lo + (hi - lo) * u, jnp.float32), lo, hi, jnp.float32(learning_rate)))
    evals = {"gradient": starts * outer * inner, "discrete": 0}
    v = np.exp(z.astype(np.float64))
    corners = np.stack(np.meshgrid(*[[0, 1]] * 3, indexing="ij"), -1).reshape(-1, 3)
    x = np.where(corners[None] == 0, np.floor(v)[:, None], np.ceil(v)[:, None]).reshape(-1, 3)
    x = np.unique(np.clip(x, space.lower, space.upper).astype(np.int64), axis=0)

    def merit(xs):
        _, f, ok = evaluate_plan(space, fit, xs, max_staleness=max_staleness)
        evals["discrete"] += len(xs)
        return np.where(ok, f, 1e6 + f), ok

    m, _ = merit(x)
    cur = x[np.argsort(m, kind="stable")[:4]]
    cur_m = np.sort(m, kind="stable")[:4]
    for _ in range(refine_steps):
        moved = False
        for i in range(len(cur)):
            nb = _neighbours(space, cur[i:i + 1])
            mn, _ = merit(nb)
            j = int(np.argmin(mn))
            if mn[j] < cur_m[i] - 1e-9:
                cur[i], cur_m[i], moved = nb[j], mn[j], True
        if not moved:
            break
    best = cur[int(np.argmin(cur_m))]
    s, f, ok = evaluate_plan(space, fit, best[None], max_staleness=max_staleness)
    stats = spaces.Stats(*(np.asarray(a)[0] for a in s))
    return PlanResult(tuple(int(t) for t in best), float(f[0]), bool(ok[0]), stats, evals)
