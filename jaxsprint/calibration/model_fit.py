r"""The SPRINT model's machine figures fitted to measured train-step and all-reduce times.

A measurement table holds train-step times (:class:`StepTiming`: a network's cost table, a sub-batch, the
measured seconds) and all-reduce times (:class:`AllreduceTiming`: bytes, ranks, seconds). :func:`fit` adjusts
chosen fields of a :class:`~jaxsprint.perf.machines.Machine` to minimise the mean log-error loss

.. math::
    \mathcal{L}(\theta) = \sum_{kind} \frac{1}{|kind|} \sum_{i \in kind}
        \rho\big(\log \hat t_i(\theta) - \log t_i\big),

each kind weighted equally, ``rho`` squared or ``soft_l1`` (robust to a few run-to-run outliers), solved in
``log theta`` inside the bounds by :func:`jaxsprint.perf.fit.least_squares` from several starts. A step is
:func:`step_time_s` (the device step plus the optimiser's passes over the parameters); an all-reduce
:func:`allreduce_time_s` (the alpha-beta form plus ``updater_overhead_s``).

Each fitted figure gets a relative standard error from the Gauss-Newton covariance at the optimum; a figure
at a bound or one the data cannot see is flagged (and should be held fixed instead). :func:`holdout_split`
and :func:`leave_one_group_out` give held-out checks, :func:`error_stats` summarises relative errors,
:func:`estimate_cv` the robust cv of repeated step times. Timing this machine is
:mod:`jaxsprint.calibration.timing`; reading measurement files :mod:`jaxsprint.calibration.measurements`.
The loss, the error formulas and the references: ``docs/fitting.md``.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Hashable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxsprint.errors import check
from jaxsprint.perf import collectives, machines, times
from jaxsprint.perf import fit as lsq
from jaxsprint.perf.machines import Machine
from jaxsprint.perf.networks import BYTES_PER_VALUE, NetworkCost

LOSSES = ("squared", "soft_l1")
# Efficiency-like fields live in (0, 1]; the others default to 1/1000..1000 times their value.
_UNIT_FIELDS = ("efficiency_fwd", "efficiency_bwd_data", "efficiency_bwd_weight", "memory_efficiency",
                "norm_memory_efficiency", "maxpool_backward_memory_efficiency")


# Except the convolution pass efficiencies, which may exceed 1: the model counts a convolution's direct
# multiply-accumulates, and a fast algorithm does fewer (Winograd's F(2x2, 3x3), which this project's CPU
# kernels run for 3x3 stride-1 layers, does 2.25x fewer), so its effective rate can be above the peak.
_CONV_EFFICIENCY_FIELDS = ("efficiency_fwd", "efficiency_bwd_data", "efficiency_bwd_weight")
_MAX_CONV_EFFICIENCY = 4.0


@dataclasses.dataclass(frozen=True)
class StepTiming:
    """One measured train step.

    Attributes:
      network: Cost table of the trained network.
      sub_batch: Samples per step.
      measured_s: Seconds per step (one learner).
      update_passes: Passes of the optimiser update over the ``4P`` parameter bytes inside the
        timed step (plain SGD: 3, momentum SGD: 5).
      label: Name for tables.
    """

    network: NetworkCost
    sub_batch: int
    measured_s: float
    update_passes: float = 3.0
    label: str = ""


@dataclasses.dataclass(frozen=True)
class AllreduceTiming:
    """One measured all-reduce of ``message_bytes`` per rank over ``ranks`` ranks."""

    message_bytes: float
    ranks: int
    measured_s: float
    label: str = ""


def step_time_s(network: NetworkCost, machine: Machine, sub_batch: jax.Array,
                update_passes: jax.Array = 3.0) -> jax.Array:
    """Model of one train step on one learner: forward, backward and the optimiser update.

    ``device_step_time_s(b) + update_passes * 4P / memory_bandwidth`` (the update streams the
    parameters, gradients and optimiser state through memory).
    """
    update = update_passes * BYTES_PER_VALUE * network.total_params / machine.memory_bandwidth_bytes_per_s
    return times.device_step_time_s(network, machine, sub_batch) + update


def allreduce_time_s(machine: Machine, message_bytes: jax.Array, ranks: jax.Array, *,
                     algorithm: str = "ring") -> jax.Array:
    """Model of one all-reduce call: the alpha-beta form plus ``updater_overhead_s``."""
    return collectives.allreduce_time_s(message_bytes, ranks, machine.network_latency_s,
                                        machine.network_bandwidth_bytes_per_s,
                                        algorithm=algorithm) + machine.updater_overhead_s


def predict_timings(machine: Machine, steps: Sequence[StepTiming] = (),
                    allreduces: Sequence[AllreduceTiming] = (), *, algorithm: str = "ring"
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Model times of the measured configurations: ``(step_s [n_steps], allreduce_s [n_ar])``."""
    f = jax.jit(lambda m: _predict(m, _group(steps), allreduces, algorithm))
    a, b = f(machine)
    return np.asarray(a), np.asarray(b)


def _group(steps: Sequence[StepTiming]) -> list[tuple[NetworkCost, np.ndarray, np.ndarray, np.ndarray]]:
    """Steps grouped by network (one vmapped evaluation each): (net, indices, batches, passes)."""
    groups: dict[int, list[int]] = {}
    nets: dict[int, NetworkCost] = {}
    for i, s in enumerate(steps):
        key = next((k for k, n in nets.items() if n is s.network), None)
        if key is None:
            key = len(nets)
            nets[key] = s.network
        groups.setdefault(key, []).append(i)
    return [(nets[k], np.asarray(idx), np.asarray([steps[i].sub_batch for i in idx], np.float32),
             np.asarray([steps[i].update_passes for i in idx], np.float32))
            for k, idx in groups.items()]


def _predict(machine: Machine, groups, allreduces: Sequence[AllreduceTiming], algorithm: str
             ) -> tuple[jax.Array, jax.Array]:
    n_steps = sum(len(g[1]) for g in groups)
    out = jnp.zeros((n_steps,), jnp.float32)
    for net, idx, batch, passes in groups:
        t = jax.vmap(lambda b, p, net=net: step_time_s(net, machine, b, p))(batch, passes)
        out = out.at[idx].set(t)
    if allreduces:
        m_bytes = jnp.asarray([a.message_bytes for a in allreduces], jnp.float32)
        ranks = jnp.asarray([a.ranks for a in allreduces], jnp.float32)
        ar = allreduce_time_s(machine, m_bytes, ranks, algorithm=algorithm)
    else:
        ar = jnp.zeros((0,), jnp.float32)
    return out, ar


# ----------------------------------------------------------------------------------------------
# Fit
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class FitResult:
    """Outcome of :func:`fit`.

    Attributes:
      machine: The machine with the fitted figures.
      fitted: ``{field: value}``.
      rel_std_error: ``{field: relative standard error}`` (Gauss-Newton; inf if not identified).
      at_bound: Fields that ended within 3% (relative) of a bound.
      step_errors: Relative errors ``predicted / measured - 1`` of the step timings.
      allreduce_errors: The same for the all-reduce timings.
      loss: Final loss (mean of ``rho`` of the log-errors, kinds weighted equally).
      start_losses: Final loss of every start.
    """

    machine: Machine
    fitted: dict[str, float]
    rel_std_error: dict[str, float]
    at_bound: list[str]
    step_errors: np.ndarray
    allreduce_errors: np.ndarray
    loss: float
    start_losses: np.ndarray

    def summary(self) -> dict[str, Any]:
        """JSON-friendly summary: fitted values with their errors and the residual statistics."""
        return dict(fitted=self.fitted, rel_std_error=self.rel_std_error, at_bound=self.at_bound,
                    loss=self.loss, steps=error_stats(self.step_errors),
                    allreduces=error_stats(self.allreduce_errors))

    def table(self) -> str:
        """The fitted figures with their relative standard errors."""
        lines = [f"  {'figure':36s} {'fitted':>12s} {'rel. std. error':>16s}"]
        for f, v in self.fitted.items():
            se = self.rel_std_error[f]
            flag = "  (at bound)" if f in self.at_bound else ""
            se_s = f"{100 * se:15.1f}%" if math.isfinite(se) else f"{'not identified':>16s}"
            lines.append(f"  {f:36s} {v:12.4g} {se_s}{flag}")
        return "\n".join(lines)


def default_bounds(machine: Machine, fields: Iterable[str]) -> dict[str, tuple[float, float]]:
    """Bounds of :func:`fit`: ``(1e-3, 1)`` for efficiencies (``(1e-3, 4)`` for the convolution passes': a fast
    algorithm does fewer multiplications than the direct count), ``0.1 .. 1000`` samples for
    ``half_efficiency_batch``, ``value / 1e3 .. value * 1e3`` else (``1e-7 .. 1e-1`` s for overheads
    that are zero)."""
    out = {}
    for f in fields:
        v = float(getattr(machine, f))
        if f in _CONV_EFFICIENCY_FIELDS:
            out[f] = (1e-3, _MAX_CONV_EFFICIENCY)
        elif f in _UNIT_FIELDS:
            out[f] = (1e-3, 1.0)
        elif f == "half_efficiency_batch":  # off (0) in the presets: samples per step
            out[f] = (0.1, 1e3)
        elif v > 0:
            out[f] = (v / 1e3, v * 1e3)
        else:
            out[f] = (1e-7, 1e-1)
    return out


def fit(machine: Machine, steps: Sequence[StepTiming] = (),
        allreduces: Sequence[AllreduceTiming] = (), *, fields: Sequence[str],
        bounds: dict[str, tuple[float, float]] | None = None, tied: dict[str, str] | None = None,
        starts: int = 6, max_nfev: int | None = None, seed: int = 0,
        algorithm: str = "ring", loss: str = "squared", loss_scale: float = 0.1) -> FitResult:
    """Fits ``fields`` of ``machine`` to measured timings (see the module docstring).

    Args:
      machine: Starting machine; the other fields keep its values.
      steps: Measured train steps.
      allreduces: Measured all-reduces.
      fields: Fields to fit.
      bounds: ``{field: (lo, hi)}`` (default :func:`default_bounds`).
      tied: ``{field: other}``: ``field`` takes the fitted value of ``other``.
      starts: Starting points (the first is the machine's own values, clipped into the bounds).
      max_nfev: Residual evaluations per start at most (None: :func:`jaxsprint.perf.fit.least_squares`'
        default).
      seed: Seed of the random starts.
      algorithm: All-reduce algorithm of the model.
      loss: ``"squared"`` or ``"soft_l1"`` (module docstring).
      loss_scale: Scale ``s`` of ``soft_l1``, in log units (0.1: about 10%).

    Returns:
      :class:`FitResult`.

    Raises:
      ConfigError: no timings, an unknown field, bounds that are not ``0 < lo < hi``, a
        non-positive or non-finite measured time, more fitted fields than timings, an unknown loss, a fit
        that overflowed from every start.
    """
    steps, allreduces = list(steps), list(allreduces)
    fields = list(fields)
    tied = dict(tied or {})
    n_timings = len(steps) + len(allreduces)
    check(n_timings > 0, "timings", n_timings, "at least one step or all-reduce timing")
    for f in fields + list(tied) + list(tied.values()):
        check(f in machines.FIELDS, "field", f, f"a machine figure: one of {', '.join(machines.FIELDS)}")
    for t in steps + allreduces:
        check(math.isfinite(t.measured_s) and t.measured_s > 0, "measured_s", t.measured_s,
              f"a finite time > 0 (timing {t.label or t})")
    check(len(fields) <= n_timings, "fields", fields, f"at most as many fields as timings ({n_timings})")
    check(loss in LOSSES, "loss", loss, f"one of {', '.join(LOSSES)}")
    check(math.isfinite(loss_scale) and loss_scale > 0, "loss_scale", loss_scale, "a finite number > 0")
    bounds = {**default_bounds(machine, fields), **(bounds or {})}
    for f in fields:
        lo, hi = bounds[f]
        check(0 < lo < hi, f"bounds[{f!r}]", bounds[f], "0 < lo < hi")
    lo_np = np.asarray([math.log(bounds[f][0]) for f in fields])
    hi_np = np.asarray([math.log(bounds[f][1]) for f in fields])
    groups = _group(steps)
    log_step = jnp.log(jnp.asarray([s.measured_s for s in steps], jnp.float32))
    log_ar = jnp.log(jnp.asarray([a.measured_s for a in allreduces], jnp.float32))

    def machine_of(log_theta):
        figs = {f: jnp.exp(log_theta[i]) for i, f in enumerate(fields)}
        figs.update({k: figs[v] if v in figs else getattr(machine, v) for k, v in tied.items()})
        return machine.replace(**figs)

    def residuals(log_theta):
        ps, pa = _predict(machine_of(log_theta), groups, allreduces, algorithm)
        return jnp.log(ps) - log_step, jnp.log(pa) - log_ar

    # Each kind's losses weighted by 1 / its count: the least-squares cost 1/2 sum w rho is half the loss.
    weights = np.concatenate([np.full(len(steps), 1.0 / max(len(steps), 1)),
                              np.full(len(allreduces), 1.0 / max(len(allreduces), 1))])

    def stacked(log_theta):
        return jnp.concatenate(residuals(log_theta))

    # Start 0: the machine's values (clipped just inside the bounds); the others at random in the box.
    x0 = np.asarray([math.log(float(getattr(machine, f))) if float(getattr(machine, f)) > 0
                     else lo_np[i] for i, f in enumerate(fields)])
    frac = [np.clip((x0 - lo_np) / (hi_np - lo_np), 0.02, 0.98)]
    frac += list(np.random.default_rng(seed).uniform(0.05, 0.95, size=(max(starts - 1, 0), len(fields))))
    res = lsq.least_squares(jax.jit(stacked), lo_np + (hi_np - lo_np) * np.asarray(frac),
                            jac=jax.jit(jax.jacfwd(stacked)), bounds=(lo_np, hi_np),
                            loss="linear" if loss == "squared" else "soft_l1", f_scale=loss_scale,
                            weights=weights, max_nfev=max_nfev, bound_tol=0.03)
    check(math.isfinite(res.cost), "fields", fields,
          f"fewer fields or narrower bounds: the fit overflowed from every one of {starts} starts")
    log_theta = jnp.asarray(res.x, jnp.float32)
    fitted_machine = machine_of(log_theta)
    rs, ra = res.residuals[:len(steps)], res.residuals[len(steps):]

    # Gauss-Newton standard errors in log space: each kind's residual variance is estimated
    # from its own residuals (degrees of freedom shared in proportion), then
    # Cov(log theta) = (J^T diag(1 / s_kind^2) J)^-1.
    jac = res.jacobian
    n_all, k = len(steps) + len(allreduces), len(fields)
    dof_scale = n_all / max(n_all - k, 1)
    w = np.concatenate([np.full(r_k.size, 1.0 / max(float(np.mean(r_k ** 2)) * dof_scale, 1e-12))
                        for r_k in (rs, ra) if r_k.size])
    diag = np.diag(lsq.gauss_newton_covariance(np.sqrt(w)[:, None] * jac, 1.0, rcond=1e-10))
    se = {}
    for i, f in enumerate(fields):
        seen = not np.linalg.norm(jac[:, i]) <= 1e-6  # a non-finite column counts as seen (its sd is inf)
        sd = math.sqrt(max(float(diag[i]), 0.0)) if math.isfinite(float(diag[i])) else math.inf
        se[f] = math.expm1(sd) if seen and sd < 20.0 else math.inf
    at_bound = [f for i, f in enumerate(fields) if res.at_bound[i]]
    fitted = {f: min(max(math.exp(float(res.x[i])), bounds[f][0]), bounds[f][1]) for i, f in enumerate(fields)}
    fitted.update({k2: fitted.get(v, float(getattr(machine, v))) for k2, v in tied.items()})
    return FitResult(fitted_machine, fitted, {f: se.get(f, se.get(tied.get(f, ""), math.inf))
                                              for f in fitted},
                     at_bound, np.expm1(rs), np.expm1(ra), 2.0 * res.cost, 2.0 * res.start_costs)


def estimate_cv(samples: Sequence[Sequence[float]]) -> float:
    """Compute-time jitter: the median over configurations of ``1.4826 MAD / median``."""
    cvs = []
    for s in samples:
        s = np.asarray(s, np.float64)
        if s.size >= 3:
            med = float(np.median(s))
            cvs.append(1.4826 * float(np.median(np.abs(s - med))) / med)
    check(bool(cvs), "samples", [len(s) for s in samples], "at least one configuration with 3 or more samples")
    return float(np.median(cvs))


# ----------------------------------------------------------------------------------------------
# Held-out checks
# ----------------------------------------------------------------------------------------------


def error_stats(errors: Sequence[float]) -> dict[str, float] | None:
    """``{n, median_abs_error, mean_abs_error, max_abs_error}`` of relative errors (None when empty)."""
    e = np.abs(np.asarray(errors, np.float64))
    if e.size == 0:
        return None
    return dict(n=int(e.size), median_abs_error=float(np.median(e)), mean_abs_error=float(np.mean(e)),
                max_abs_error=float(np.max(e)))


def holdout_split(n: int, fraction: float, seed: int = 0) -> np.ndarray:
    """A random held-out mask of ``n`` timings: ``round(fraction n)`` of them, drawn by a permutation.

    The held-out ones are the last ``round(fraction n)`` of ``np.random.default_rng(seed).permutation(n)``.
    """
    check(0.0 <= fraction < 1.0, "holdout_fraction", fraction, "a number >= 0 and < 1")
    order = np.random.default_rng(seed).permutation(n)
    held = np.zeros(n, bool)
    held[order[n - int(round(fraction * n)):]] = True
    return held


def leave_one_group_out(machine: Machine, steps: Sequence[StepTiming], groups: Sequence[Hashable], *,
                        fields: Sequence[str], **fit_kwargs: Any) -> dict[Hashable, np.ndarray]:
    """Relative errors of each group's steps predicted by a fit on the other groups' steps.

    Args:
      machine: Starting machine of every fit.
      steps: Measured steps.
      groups: A group per step (e.g. its network's name).
      fields: Fields to fit.
      **fit_kwargs: Further arguments of :func:`fit`.

    Returns:
      ``{group: predicted / measured - 1 of its steps}`` in the order of first appearance.
    """
    steps, groups = list(steps), list(groups)
    check(len(groups) == len(steps), "groups", len(groups), f"one group per step ({len(steps)})")
    out = {}
    for g in dict.fromkeys(groups):
        held = [s for s, k in zip(steps, groups) if k == g]
        rest = [s for s, k in zip(steps, groups) if k != g]
        r = fit(machine, rest, fields=fields, **fit_kwargs)
        pred, _ = predict_timings(r.machine, held)
        out[g] = np.asarray(pred) / np.asarray([s.measured_s for s in held]) - 1.0
    return out


__all__ = ["AllreduceTiming", "FitResult", "LOSSES", "StepTiming", "allreduce_time_s", "default_bounds",
           "error_stats", "estimate_cv", "fit", "holdout_split", "leave_one_group_out", "predict_timings",
           "step_time_s"]
