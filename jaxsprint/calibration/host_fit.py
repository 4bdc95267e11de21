r"""The runtime host's figures fitted to measured runs: learners sharing cores, the updater's cost, jitter.

The measurements come in as data (``experiments/calibrate_runtime.py`` takes them): one learner's gradient
step at a few sub-batches, a few runs of :mod:`jaxsprint.runtime` (their cycle means and cvs,
:class:`RuntimeRun`) and all-reduces between processes. :func:`fit_all` fits, in three stages, the figures of
:func:`jaxsprint.calibration.host.runtime_times`:

1. **Compute** (:func:`jaxsprint.calibration.model_fit.fit` on the lone steps): ``efficiency_fwd`` (the
   backward passes tied to it) and ``half_efficiency_batch``, on each step's mean time (a learner's mean cycle
   is made of all its steps, slow ones included), 10%-trimmed (a burst of other work on the machine during
   the timing, steps 3x the median, stays out); the cores a lone step keeps busy start ``learner_step_cores``;
   the slope of a learner's input draw over the sub-batches is ``learner_input_per_sample_s``, measured and
   held (:func:`input_per_sample`).
2. **Network** (the same fit on the all-reduces): ``network_latency_s`` and ``network_bandwidth_bytes_per_s``.
3. **Sharing and the updater** (:func:`fit_runtime`): the host figures of :data:`RUNTIME_FIELDS`, by least
   squares on the log-errors of both cycle means (``T_c``, ``T_u``) of every run, in log parameters inside
   bounds, by :func:`jaxsprint.perf.fit.least_squares` from two starts; then the jitter (``learner_cv``,
   ``updater_cv``) as medians of the measured cvs.

Figures the calibration runs cannot determine are held fixed (:data:`FIXED`, each with its reason) instead
of fitted; every fitted figure is reported with its relative standard error. With ``prior_factor``, stage 3 is
a maximum a posteriori fit: each figure also within that factor of :data:`RUNTIME_START` (one standard
deviation in log), so that a figure the runs barely see stays near it instead of being held at 0. The stages'
details and the measured figures behind them: ``docs/sprint-runtime.md`` and ``docs/fitting.md``.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxsprint.errors import check
from jaxsprint.calibration import host as hostfig
from jaxsprint.calibration import measurements
from jaxsprint.calibration.measurements import MIN_SPLIT_CYCLES, RuntimeRun
from jaxsprint.calibration import model_fit as calib
from jaxsprint.calibration.host import HostFigures
from jaxsprint.perf import fit as lsq
from jaxsprint.perf import machines
from jaxsprint.perf.machines import Machine
from jaxsprint.perf.networks import NetworkCost

__all__ = ["ALWAYS_FIXED", "COMPUTE_FIELDS", "FIXED", "HOSTS_ONLY_FIELDS", "INPUT_FIELD", "MIN_SPLIT_CYCLES",
           "NETWORK_FIELDS", "PRIOR_RUN_ERROR", "RUNTIME_BOUNDS", "RUNTIME_FIELDS", "RUNTIME_START",
           "SHARED_DEVICE_FIELDS", "SHARED_ONLY_FIELDS", "SHARED_SLEEP_FIELDS", "STEP_CORES_FIELD", "UNDETERMINED_RSE",
           "RuntimeFit", "RuntimeRun", "cross_validate", "figure", "fit_all", "fit_device", "fit_runtime",
           "predict_runs", "sensitivities", "with_figures"]

# The lone step's figures: the compute efficiency, its small-batch slowdown and the memory bandwidth of the
# memory-bound layers (a machine's whole step, not only its arithmetic, is calibrated), then a fixed cost.
COMPUTE_FIELDS = ("efficiency_fwd", "half_efficiency_batch", "memory_bandwidth_bytes_per_s", "step_overhead_s")
NETWORK_FIELDS = ("network_latency_s", "network_bandwidth_bytes_per_s")
RUNTIME_FIELDS = ("learner_overhead_s", "updater_overhead_s", "updater_per_learner_s", "updater_cores",
                  "updater_hosts_stretch", "updater_queue", "updater_apply_s",
                  "updater_shared_wait", "updater_shared_allreduce_wait", "updater_shared_sleep_wait",
                  "updater_lock_waits", "updater_sync_per_learner_s", "updater_apply_core_wait_s",
                  "updater_wake_share",
                  "learner_shared_wait", "learner_lock_wait_s", "learner_updater_stretch",
                  "learner_step_cores", "learner_step_cores_half_batch",
                  "host_memory_bandwidth_bytes_per_s")
INPUT_FIELD = "learner_input_per_sample_s"  # measured (fit_all's input_draws), held by stage 3
# Measured by fit_all's step_cores (a lone step's CPU time over wall time), which starts stage 3's fit of it.
STEP_CORES_FIELD = "learner_step_cores"
# Wide bounds of stage 3: overheads from 1 us to 1 s (0.1 s per learner and per applied update), a step on busy
# cores taking 1-4 units (half of the excess at sub-batch 0.5-1000), an updater 0.1% to all of a unit while busy,
# co-located hosts stretching it by up to 21x, waits of 1e-4 to 10 device steps.
RUNTIME_BOUNDS = {"learner_overhead_s": (1e-6, 1.0), "learner_step_cores": (1.0, 4.0),
                  "learner_step_cores_half_batch": (0.5, 1e3), "updater_overhead_s": (1e-6, 1.0),
                  "updater_per_learner_s": (1e-6, 0.1), "updater_cores": (1e-3, 1.0),
                  "updater_hosts_stretch": (1e-3, 20.0), "updater_queue": (1e-4, 10.0), "updater_apply_s": (1e-6, 0.1),
                  "updater_shared_wait": (1e-3, 4.0), "updater_shared_allreduce_wait": (1e-3, 10.0),
                  "updater_shared_sleep_wait": (1e-3, 4.0),
                  "updater_lock_waits": (1e-3, 20.0), "learner_lock_wait_s": (1e-6, 0.05),
                  "learner_updater_stretch": (1e-3, 4.0),
                  "updater_sync_per_learner_s": (1e-6, 0.05), "updater_apply_core_wait_s": (1e-6, 0.05),
                  "updater_wake_share": (1e-3, 1.0), "learner_shared_wait": (1e-3, 4.0),
                  "host_memory_bandwidth_bytes_per_s": (1e8, 1e12)}
# A second starting point of stage 3, of the order of the figures of this project's 2-core machine.
RUNTIME_START = {"learner_overhead_s": 2e-3, "learner_step_cores": 1.5, "learner_step_cores_half_batch": 30.0,
                 "updater_overhead_s": 1e-3, "updater_per_learner_s": 1e-3, "updater_cores": 0.3,
                 "updater_hosts_stretch": 1.0, "updater_queue": 0.3, "updater_apply_s": 1e-3, "updater_shared_wait": 0.3,
                 "updater_shared_allreduce_wait": 1.0, "updater_lock_waits": 3.0, "learner_lock_wait_s": 2e-3,
                 "learner_updater_stretch": 0.3, "updater_sync_per_learner_s": 1e-3, "updater_apply_core_wait_s": 3e-4,
                 "updater_wake_share": 0.5, "learner_shared_wait": 0.5, "updater_shared_sleep_wait": 0.3,
                 "host_memory_bandwidth_bytes_per_s": 2e9}
# The log-error of a run's cycle mean a prior's standard deviation is weighed against: the calibrations' runs
# fit to 6-10% (median, docs/calibration.md).
PRIOR_RUN_ERROR = 0.1
HOSTS_ONLY_FIELDS = ("updater_hosts_stretch", "updater_sync_per_learner_s", "updater_shared_allreduce_wait")  # >1 host
SHARED_ONLY_FIELDS = ("updater_shared_wait", "updater_shared_allreduce_wait")  # the device of one of 2+ learners
SHARED_DEVICE_FIELDS = ("learner_shared_wait",)  # a learner's device shared with the updater (any N_h)
SHARED_SLEEP_FIELDS = ("updater_shared_sleep_wait",)  # one host's updater on a shared device that sleeps
# A fitted figure whose relative standard error exceeds this (or that ends on a bound) is not determined: stage 1
# and fit_all(fix_undetermined=True) hold it at its neutral value (host.NEUTRAL, 0: the term off), fit the rest.
UNDETERMINED_RSE = 1.0
# Figures a calibration's data may not determine, each with its value and reason (which becomes its source):
# experiments/calibrate_runtime.py always holds those of ALWAYS_FIXED, the rest with fix_undetermined=False.
FIXED = {
    "step_overhead_s": (0.0, "fixed at 0, not fitted: five lone steps at sub-batch 8-128 cannot tell a fixed cost "
                             "per step from the small-batch slowdown (half_efficiency_batch); fitted, it ran onto "
                             "its lower bound, 1 us"),
    "updater_overhead_s": (0.0, "fixed at 0, not fitted: the calibration runs cannot tell the updater's fixed cost "
                                "per cycle from its cost per learner and per applied update; fitted, it ran onto "
                                "its lower bound, 1 us (the all-reduces' own dispatch is in the network figures)"),
    "updater_queue": (0.0, "fixed at 0 (the queue term off), not fitted: the calibration runs that fill the cores "
                           "do not separate it from the updater's other costs; fitted, it ran onto its lower "
                           "bound, 1e-4 of a device step"),
    "updater_lock_waits": (0.0, "fixed at 0 (the lock-wait term off), not fitted: the measured empty cycles of an "
                                "updater cycling back to back do not grow with the learners' host work, as this "
                                "wait does (docs/calibration.md)"),
    "learner_step_cores_half_batch": (0.0, "fixed at 0 (learner_step_cores at every sub-batch), not fitted: the "
                                           "calibration runs show no growth of a busy step's cores with the "
                                           "sub-batch; fitted, it ran onto its lower bound, 0.5"),
}
ALWAYS_FIXED = ("step_overhead_s", "updater_lock_waits")
_COMPUTE_BOUNDS = {"efficiency_fwd": (1e-3, 4.0), "half_efficiency_batch": (0.1, 1e3),
                   "memory_bandwidth_bytes_per_s": (1e9, 1e13), "step_overhead_s": (1e-6, 1.0)}


@dataclasses.dataclass
class RuntimeFit:
    """Outcome of :func:`fit_runtime` (or :func:`fit_all`).

    Attributes:
      machine: The machine with the fitted figures.
      host: The host figures with the fitted ones.
      fitted: ``{field: value}`` of every figure fitted (all stages for :func:`fit_all`).
      compute_errors: ``predicted / measured - 1`` of each run's ``T_c``.
      update_errors: The same of ``T_u``.
      loss: Mean squared log-error of stage 3.
      stages: Per-stage summaries (JSON-friendly).
      rel_std_error: ``{field: relative standard error}`` of the fitted figures (Gauss-Newton, from the
        Jacobian at the optimum; inf where the data do not see the figure).
      at_bound: Fitted figures that ended within 3% of a bound.
    """

    machine: Machine
    host: HostFigures
    fitted: dict[str, float]
    compute_errors: np.ndarray
    update_errors: np.ndarray
    loss: float
    stages: dict[str, Any] = dataclasses.field(default_factory=dict)
    rel_std_error: dict[str, float] = dataclasses.field(default_factory=dict)
    at_bound: list[str] = dataclasses.field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """JSON-friendly: the fitted figures, their standard errors and the error statistics of both cycles."""
        return dict(fitted=self.fitted, rel_std_error=self.rel_std_error, at_bound=self.at_bound, loss=self.loss,
                    compute=calib.error_stats(self.compute_errors), update=calib.error_stats(self.update_errors),
                    stages=self.stages)


def _columns(runs: Sequence[RuntimeRun]) -> np.ndarray:
    return np.asarray([[r.learners_per_host, r.hosts, r.sub_batch, r.network_time_s,
                        float(r.updater_device == "shared")] for r in runs], np.float32)


def _predict_columns(machine: Machine, host: HostFigures, network: NetworkCost, cols: jax.Array, co_located: bool
                     ) -> hostfig.RuntimeTimes:
    def one(row):
        return hostfig.runtime_times(network, machine, host, learners_per_host=row[0], hosts=row[1],
                                     sub_batch=row[2], network_time_s=row[3], co_located=co_located, shared=row[4])

    return jax.vmap(one)(cols)


_predict_columns_jit = jax.jit(_predict_columns, static_argnums=(4,))


def predict_runs(machine: Machine, host: HostFigures, network: NetworkCost, runs: Sequence[RuntimeRun], *,
                 co_located: bool = True) -> hostfig.RuntimeTimes:
    """The model's :class:`~jaxsprint.calibration.host.RuntimeTimes` of every run, stacked (one vmapped call)."""
    return _predict_columns_jit(machine, host, network, jnp.asarray(_columns(runs)), bool(co_located))


def figure(machine: Machine, host: HostFigures, field: str) -> float:
    """A figure of the host or, if it is not a host's, of the machine."""
    return float(getattr(host if field in hostfig.FIELDS else machine, field))


def _with(machine: Machine, host: HostFigures, values: dict[str, Any]) -> tuple[Machine, HostFigures]:
    """``(machine, host)`` with ``values`` replaced, each in the structure it belongs to."""
    on_host = {f: v for f, v in values.items() if f in hostfig.FIELDS}
    return (machine.replace(**{f: v for f, v in values.items() if f not in on_host}), host.replace(**on_host))


def _log_residuals(log_theta, machine, host, network, cols, meas_c, meas_u, meas_split, weights, fields,
                   co_located):
    """Log errors of the cycle means at the fit's log parameters ``log_theta``: ``T_c`` and ``T_u`` of every
    run, then its mean empty and mean applying updater cycle (``meas_split``, times ``weights``: 0 where the
    run does not measure both kinds).

    Everything that changes between fits is an argument, so every fit over as many runs (each
    leave-one-out fold of :func:`cross_validate`) reuses one compilation of this and of its Jacobian.
    """
    m, h = _with(machine, host, {f: jnp.exp(log_theta[i]) for i, f in enumerate(fields)})
    t = _predict_columns(m, h, network, cols, co_located)
    split = jnp.concatenate([jnp.log(t.t_update_empty_s), jnp.log(t.t_update_applying_s)]) - meas_split
    return jnp.concatenate([jnp.log(t.t_compute_s) - meas_c, jnp.log(t.t_update_s) - meas_u, split * weights])


_residuals, _jacobian = lsq.jax_pair(_log_residuals, static_argnums=(9, 10))


def _split(runs: Sequence[RuntimeRun]) -> tuple[np.ndarray, np.ndarray]:
    """The measured log split cycles of the runs (empty ones, then applying ones; 0 where not used) and their
    weights."""
    w = np.asarray([r.split_weights() for r in runs], np.float32).T.reshape(-1)
    t = np.asarray([[r.t_update_empty_s for r in runs], [r.t_update_applying_s for r in runs]], np.float64)
    return np.where(w > 0, np.log(np.maximum(t.reshape(-1), 1e-30)), 0.0).astype(np.float32), w


def sensitivities(machine: Machine, host: HostFigures, network: NetworkCost, runs: Sequence[RuntimeRun],
                  fields: Sequence[str], split: Sequence[bool] | None = None) -> np.ndarray:
    """``d log T / d log theta`` of every run at ``(machine, host)``: the rows ``T_c`` of each run, then ``T_u``
    of each, a column per figure (every figure > 0), the Jacobian :func:`fit_runtime` fits with. With ``split``
    (a flag per run: it measures both kinds of updater cycle) also the rows of the empty cycles, then of the
    applying ones (zero where the flag is off)."""
    fields = tuple(fields)
    theta = jnp.log(jnp.asarray([figure(machine, host, f) for f in fields], jnp.float32))
    n = len(runs)
    zeros = jnp.zeros(n, jnp.float32)
    mask = np.ones(2 * n, np.float32) if split is None else np.tile(np.asarray(split, np.float32), 2)
    jac = _jacobian(theta, machine, host, network, jnp.asarray(_columns(runs)), zeros, zeros,
                    jnp.zeros(2 * n, jnp.float32), jnp.asarray(mask), fields, True)
    return np.asarray(jac, np.float64)[:2 * n if split is None else 4 * n]


def with_figures(machine: Machine, host: HostFigures, **values: Any) -> tuple[Machine, HostFigures]:
    """``(machine, host)`` with ``values`` replaced, each figure in the structure it belongs to."""
    return _with(machine, host, {f: jnp.float32(v) for f, v in values.items()})


def _check_runs(runs: Sequence[RuntimeRun]) -> None:
    check(len(runs) > 0, "runs", len(runs), "at least one measured runtime run")
    for r in runs:
        for name in ("t_compute_s", "t_update_s"):
            v = getattr(r, name)
            check(math.isfinite(v) and v > 0, name, v, f"a finite time > 0 (run {r.label or r})")
        check(r.learners_per_host >= 1 and r.hosts >= 1 and r.sub_batch >= 1, "run", r,
              "learners_per_host, hosts and sub_batch >= 1")


def fit_runtime(machine: Machine, host: HostFigures, network: NetworkCost, runs: Sequence[RuntimeRun], *,
                fields: Sequence[str] | None = None, bounds: dict[str, tuple[float, float]] | None = None,
                co_located: bool = True, max_nfev: int | None = None, fit_cvs: bool = True,
                prior_factor: float | None = None) -> RuntimeFit:
    """Stage 3 of :func:`fit_all`: the sharing and updater figures from measured runs (module docstring).

    Args:
      machine: Starting machine (its compute and network figures are kept).
      host: Starting host figures.
      network: Cost table of the runs' network.
      runs: Measured runs.
      fields: Figures to fit (a subset of :data:`RUNTIME_FIELDS` or any positive figure of either; None: those
        of :data:`RUNTIME_FIELDS` the runs constrain).
      bounds: ``{field: (lo, hi)}`` over :data:`RUNTIME_BOUNDS`.
      co_located: The hosts of multi-host runs were processes of this machine.
      max_nfev: Residual evaluations per start at most (None: :func:`jaxsprint.perf.fit.least_squares`').
      fit_cvs: Also set ``learner_cv`` and ``updater_cv`` from the runs' measured cvs.
      prior_factor: Each figure's prior, within this factor (> 1) of :data:`RUNTIME_START` (the machine's
        figure where it has none) as one standard deviation in log, weighed against a run's log-error of
        :data:`PRIOR_RUN_ERROR` (None: no prior, least squares).

    Returns:
      :class:`RuntimeFit`.

    Raises:
      ConfigError: no runs, a non-positive or non-finite time, an unknown field, bounds not ``0 < lo < hi``,
        more fields than timings (two per run).
    """
    runs = list(runs)
    _check_runs(runs)
    fields = _constrained(RUNTIME_FIELDS, runs) if fields is None else list(fields)
    known = machines.FIELDS + hostfig.FIELDS
    for f in fields:
        check(f in known, "field", f, f"a machine figure or a host figure: one of {', '.join(known)}")
    check(len(fields) <= 2 * len(runs), "fields", fields, f"at most as many fields as timings ({2 * len(runs)})")
    bounds = {**RUNTIME_BOUNDS, **(bounds or {})}
    for f in fields:
        if f not in bounds:
            v = figure(machine, host, f)
            bounds[f] = (v / 1e3, v * 1e3) if v > 0 else (1e-7, 1e-1)
        check(0 < bounds[f][0] < bounds[f][1], f"bounds[{f!r}]", bounds[f], "0 < lo < hi")
    lo = np.log([bounds[f][0] for f in fields])
    hi = np.log([bounds[f][1] for f in fields])
    meas_c = np.log([r.t_compute_s for r in runs])
    meas_u = np.log([r.t_update_s for r in runs])
    meas_split, weights = _split(runs)
    args = (machine, host, network, jnp.asarray(_columns(runs)), jnp.asarray(meas_c, jnp.float32),
            jnp.asarray(meas_u, jnp.float32), jnp.asarray(meas_split), jnp.asarray(weights), tuple(fields),
            bool(co_located))

    def start(values):
        x0 = np.asarray([math.log(min(max(float(values(f)), bounds[f][0]), bounds[f][1])) for f in fields])
        return lo + (hi - lo) * np.clip((x0 - lo) / (hi - lo), 0.02, 0.98)

    # Two starts, the machine's figures and RUNTIME_START (a figure at its default of 0 starts at its lower
    # bound, where the form is flat in it and the descent can stall): the lower cost wins.
    starts = [start(lambda f: figure(machine, host, f)),
              start(lambda f: RUNTIME_START.get(f, figure(machine, host, f)))]
    fun, jac, rows = _residuals, _jacobian, np.concatenate([np.ones(2 * len(runs)), weights])
    if prior_factor is not None:
        check(math.isfinite(prior_factor) and prior_factor > 1, "prior_factor", prior_factor, "a number > 1")
        center = np.asarray([math.log(min(max(float(RUNTIME_START.get(f, figure(machine, host, f))) or bounds[f][0],
                                              bounds[f][0]), bounds[f][1])) for f in fields])
        w = PRIOR_RUN_ERROR / math.log(prior_factor)
        fun, jac = _with_prior(center, w), _with_prior(center, w, jacobian=True)
        rows = np.concatenate([rows, np.ones(len(fields))])
    res = lsq.least_squares(fun, np.stack(starts), args=args, jac=jac, bounds=(lo, hi), max_nfev=max_nfev,
                            bound_tol=0.03, weights=rows)  # the weights: the unused split rows are not data
    r = res.residuals
    fitted_machine, fitted_host = _with(machine, host, {f: jnp.float32(math.exp(res.x[i]))
                                                        for i, f in enumerate(fields)})
    fitted = {f: figure(fitted_machine, fitted_host, f) for f in fields}
    if fit_cvs:
        fitted_host, cvs = _fit_cvs(fitted_machine, fitted_host, network, runs, co_located)
        fitted.update(cvs)
    n = len(runs)
    rse, at_bound = _standard_errors(res, fields)
    return RuntimeFit(fitted_machine, fitted_host, fitted, np.expm1(r[:n]), np.expm1(r[n:2 * n]), res.cost / n,
                      rel_std_error=rse, at_bound=at_bound)


def _with_prior(center: np.ndarray, weight: float, jacobian: bool = False):
    """The residuals (or their Jacobian) of :func:`_log_residuals` with the prior's rows after them:
    ``weight (log theta - center)``."""
    def residuals(log_theta, *args):
        x = np.asarray(log_theta, np.float64)
        if jacobian:
            return np.vstack([np.asarray(_jacobian(log_theta, *args), np.float64), weight * np.eye(len(x))])
        return np.concatenate([np.asarray(_residuals(log_theta, *args), np.float64), weight * (x - center)])

    return residuals


def _standard_errors(res: lsq.LeastSquaresFit, fields: Sequence[str]) -> tuple[dict[str, float], list[str]]:
    """Relative standard errors and the figures at a bound of a fit in ``log theta``.

    ``Cov = s^2 (J^T J)^+``, ``s^2 = r.r / (m - k)`` (the Laplace covariance of
    :func:`jaxsprint.perf.fit.least_squares`) and the relative error ``expm1(sd)`` (inf where the column is
    near zero), as :func:`jaxsprint.calibration.model_fit.fit` reports; at a bound: within 3% (``0.03`` in log).
    """
    at_bound = [f for i, f in enumerate(fields) if res.at_bound[i]]
    if not np.all(np.isfinite(res.jacobian)):
        return {f: math.inf for f in fields}, at_bound
    out = {}
    for i, f in enumerate(fields):
        sd = float(res.std_error[i])
        seen = np.linalg.norm(res.jacobian[:, i]) > 1e-6
        out[f] = math.expm1(sd) if seen and math.isfinite(sd) and sd < 20.0 else math.inf
    return out, at_bound


def _fit_cvs(machine: Machine, host: HostFigures, network: NetworkCost, runs: Sequence[RuntimeRun],
             co_located: bool) -> tuple[HostFigures, dict[str, float]]:
    """``learner_cv`` and ``updater_cv`` from the runs' measured cvs (module docstring)."""
    out = {}
    cv_c = [r.t_compute_cv for r in runs if r.t_compute_cv > 0]
    if cv_c:
        out["learner_cv"] = float(np.median(cv_c))
    # With updater_cv = 1 the predicted cv of T_u is own / T_u: the measured cv over it is the own part's cv.
    unit = predict_runs(machine, host.replace(updater_cv=jnp.float32(1.0)), network, runs, co_located=co_located)
    share = np.asarray(unit.t_update_cv, np.float64)
    ratios = [r.t_update_cv / s for r, s in zip(runs, share) if r.t_update_cv > 0 and s > 1e-6]
    if ratios:
        out["updater_cv"] = float(np.median(ratios))
    return host.replace(**{k: jnp.float32(v) for k, v in out.items()}), out


def _constrained(fields: Sequence[str], runs: Sequence[RuntimeRun]) -> list[str]:
    """``fields`` less :data:`HOSTS_ONLY_FIELDS` when no run has several hosts and less
    :data:`SHARED_ONLY_FIELDS` when no run shares the device of one of 2+ learners (other than one host's run
    with network time, whose update waits ``w_S`` instead), less
    :data:`SHARED_DEVICE_FIELDS` when no run shares one at all, less :data:`SHARED_SLEEP_FIELDS` when no one-host
    run that shares one has network time (nothing would constrain them)."""
    several = any(r.hosts > 1 for r in runs)
    # w and w_R: a shared device of 2+ learners, where the update does not follow one host's sleep (there: w_S)
    shared = any(r.updater_device == "shared" and r.learners_per_host > 1
                 and (r.hosts > 1 or r.network_time_s == 0) for r in runs)
    any_shared = any(r.updater_device == "shared" for r in runs)
    slept = any(r.updater_device == "shared" and r.network_time_s > 0 and r.hosts == 1 for r in runs)
    return [f for f in fields if (several or f not in HOSTS_ONLY_FIELDS) and (shared or f not in SHARED_ONLY_FIELDS)
            and (any_shared or f not in SHARED_DEVICE_FIELDS) and (slept or f not in SHARED_SLEEP_FIELDS)]


def cross_validate(machine: Machine, host: HostFigures, network: NetworkCost, runs: Sequence[RuntimeRun], *,
                   fields: Sequence[str] | None = None, co_located: bool = True
                   ) -> list[tuple[Machine, HostFigures]]:
    """Leave-one-out: for every run, the ``(machine, host)`` fitted (:func:`fit_runtime`) to all the OTHER runs.

    The honest specs prediction of a measured grid: run ``i`` is predicted by ``result[i]``, whose figures
    never saw it. ``fields`` defaults to :data:`RUNTIME_FIELDS` (as many as the other runs' timings allow);
    hosts-only figures are dropped when no other run has several hosts (nothing would constrain them).

    Raises:
      ConfigError: fewer than 2 runs, or a run :func:`fit_runtime` refuses.
    """
    runs = list(runs)
    check(len(runs) >= 2, "runs", len(runs), "at least 2 measured runs (one is left out at a time)")
    out = []
    for i in range(len(runs)):
        rest = runs[:i] + runs[i + 1:]
        f = _constrained(RUNTIME_FIELDS if fields is None else fields, rest)
        r = fit_runtime(machine, host, network, rest, fields=f[:2 * len(rest)], co_located=co_located)
        out.append((r.machine, r.host))
    return out


def fit_device(machine: Machine, host: HostFigures, network: NetworkCost, *,
               steps: Sequence[calib.StepTiming] = (), allreduces: Sequence[calib.AllreduceTiming] = (),
               step_cores: float | None = None, input_draws: Sequence[tuple[int, Sequence[float]]] = (),
               seed: int = 0, fixed: dict[str, tuple[float, str]] | None = None
               ) -> tuple[Machine, HostFigures, dict[str, float], dict[str, float], list[str], dict[str, Any]]:
    """Stages 1 and 2 of :func:`fit_all` (the lone step, the input draws and the all-reduces; a stage without
    measurements is skipped), with ``fixed`` held; where the steps do not determine a compute figure, the memory
    bandwidth (at its top) and then the small-batch half batch (at 0) are held off and added to ``fixed``.

    Returns:
      ``(machine, host, fitted, rel_std_error, at_bound, stages)`` after the two stages.
    """
    fitted: dict[str, float] = {}
    stages: dict[str, Any] = {}
    rse: dict[str, float] = {}
    at_bound: list[str] = []
    fixed = {} if fixed is None else fixed
    m, host = _with(machine, host, {f: jnp.float32(v) for f, (v, _) in fixed.items()})
    if step_cores is not None:
        check(isinstance(step_cores, (int, float)) and math.isfinite(step_cores) and step_cores > 0, "step_cores",
              step_cores, "a finite number > 0 (process CPU seconds per wall second of a lone step)")
        host = host.replace(**{STEP_CORES_FIELD: jnp.float32(step_cores)})
        fitted[STEP_CORES_FIELD] = float(step_cores)
        stages["step_cores"] = float(step_cores)
    input_draws = list(input_draws)
    if input_draws:
        per_sample, per_sample_rse = measurements.input_per_sample(input_draws)
        host = host.replace(**{INPUT_FIELD: jnp.float32(per_sample)})
        fitted[INPUT_FIELD], rse[INPUT_FIELD] = per_sample, per_sample_rse
        stages["input_per_sample_s"] = per_sample
    steps = list(steps)
    if steps:
        fields = [f for f in COMPUTE_FIELDS if f not in fixed][:len(steps)]
        def stage1(fields):
            return calib.fit(m, steps, fields=fields, bounds={f: _COMPUTE_BOUNDS[f] for f in fields},
                             tied={"efficiency_bwd_data": "efficiency_fwd", "efficiency_bwd_weight": "efficiency_fwd"},
                             seed=seed)
        r = stage1(fields)
        bw, half = "memory_bandwidth_bytes_per_s", "half_efficiency_batch"
        top, low = _COMPUTE_BOUNDS[bw][1], _COMPUTE_BOUNDS[half][0]
        for f, value, off in ((bw, top, "the memory-bound layers' terms off"), (half, 0.0, "no small-batch slowdown")):
            loose = {g: e for g, e in r.rel_std_error.items() if g in fields and not e <= UNDETERMINED_RSE}
            edge = f in r.at_bound and (r.fitted[f] > top / 1.05 if f == bw else r.fitted[f] < low * 1.05)
            if f in fields and (edge or loose):  # the steps do not show it: its terms off, the rest fitted again
                why = (f"it ran onto its {'upper' if f == bw else 'lower'} bound" if edge else
                       "relative standard errors " + ", ".join(f"{g} {e:.3g}" for g, e in loose.items()))
                fixed[f] = (value, f"held at {value:g} ({off}), not fitted: the lone steps do not determine it "
                                   f"(fitted, {why})")
                m = m.replace(**{f: jnp.float32(value)})
                fields = [g for g in fields if g != f]
                r = stage1(fields)
        m = r.machine
        fitted.update(r.fitted)
        rse.update(r.rel_std_error)
        at_bound += list(r.at_bound)
        stages["compute"] = dict(r.summary(), errors=[float(e) for e in r.step_errors])
    allreduces = list(allreduces)
    if allreduces:
        fields = [f for f in NETWORK_FIELDS if f not in fixed][:len(allreduces)]
        r = calib.fit(m.replace(updater_overhead_s=jnp.float32(0.0)), allreduces=allreduces, fields=fields,
                          seed=seed)
        m = m.replace(**{f: jnp.float32(r.fitted[f]) for f in fields})
        fitted.update({f: r.fitted[f] for f in fields})
        rse.update({f: r.rel_std_error[f] for f in fields})
        at_bound += [f for f in r.at_bound if f in fields]
        stages["network"] = dict(r.summary(), errors=[float(e) for e in r.allreduce_errors])
    return m, host, fitted, rse, at_bound, stages


def fit_all(machine: Machine, host: HostFigures, network: NetworkCost, *, steps: Sequence[calib.StepTiming] = (),
            allreduces: Sequence[calib.AllreduceTiming] = (), runs: Sequence[RuntimeRun] = (),
            step_cores: float | None = None, input_draws: Sequence[tuple[int, Sequence[float]]] = (),
            co_located: bool = True, seed: int = 0, fixed: dict[str, tuple[float, str]] | None = None,
            fix_undetermined: bool = False, prior_factor: float | None = None) -> RuntimeFit:
    """All three stages (module docstring); a stage without measurements is skipped.

    Args:
      machine: Starting machine (e.g. the ``cpu_runtime`` preset).
      host: Starting host figures (e.g. the ``cpu_runtime`` preset's).
      network: Cost table of the runtime's network (the same table the steps were timed on).
      steps: Single-learner gradient steps (``update_passes`` 0) at a few sub-batches.
      allreduces: All-reduces over the runtime's processes.
      runs: Measured runtime runs.
      step_cores: The measured cores of a lone learner step (``learner_step_cores``; None: the machine's).
      input_draws: ``[(sub_batch, draw seconds)]`` of a learner's input draw (:func:`input_per_sample`; none:
        the host's ``learner_input_per_sample_s`` is kept).
      co_located: The hosts of multi-host runs were processes of this machine.
      seed: Seed of the random starts of stages 1 and 2.
      fixed: ``{field: (value, reason)}`` held at ``value`` and fitted by no stage (e.g. :data:`FIXED`).
      fix_undetermined: After stage 3, hold every host figure the runs do not determine (relative standard
        error above :data:`UNDETERMINED_RSE`, or on a bound: on its lower one the form is flat; the worst first)
        at its neutral value (0 for ``updater_overhead_s``; one on its upper bound, the form's limit, where it
        is) and fit the rest again, until every fitted figure is determined; ``stages["fixed"]`` has the reasons.
        With ``prior_factor`` only those on a bound: the prior determines the rest.
      prior_factor: Stage 3's prior (:func:`fit_runtime`; None: none).

    Returns:
      :class:`RuntimeFit` of the whole (``fitted`` holds every stage's figures, ``stages`` their
      summaries).

    Raises:
      ConfigError: no runs, an invalid timing (as :func:`jaxsprint.calibration.model_fit.fit`), ``step_cores`` not a
        finite number > 0.
    """
    _check_runs(list(runs))
    fixed = dict(fixed or {})
    m, host, fitted, rse, at_bound, stages = fit_device(machine, host, network, steps=steps, allreduces=allreduces,
                                                        step_cores=step_cores, input_draws=input_draws, seed=seed,
                                                        fixed=fixed)
    fields = _constrained([f for f in RUNTIME_FIELDS if f not in fixed], runs)
    res = fit_runtime(m, host, network, runs, fields=fields[:2 * len(runs)], co_located=co_located,
                      prior_factor=prior_factor)
    while fix_undetermined:
        # On its lower bound a term is off, and the form flat in it.
        low = {f for f in res.at_bound if res.fitted[f] <= RUNTIME_BOUNDS.get(f, (0.0,))[0] * 1.05}
        loose = [f for f in res.rel_std_error if f in RUNTIME_FIELDS and f != STEP_CORES_FIELD and (
            f in res.at_bound or (prior_factor is None and not res.rel_std_error[f] <= UNDETERMINED_RSE))]
        if not loose:
            break
        worst = max(loose, key=lambda f: (f in low, f in res.at_bound, res.rel_std_error[f]))
        why = ("on its lower bound" if worst in low else "on its upper bound" if worst in res.at_bound else
               f"relative standard error {res.rel_std_error[worst]:.3g} > {UNDETERMINED_RSE:g}")
        if worst in res.at_bound and worst not in low:  # the form's limit: held where the runs pushed it
            value = res.fitted[worst]
            fixed[worst] = (value, f"held at its upper bound {value:.4g}, not fitted: the calibration runs push it "
                                   f"there but do not determine it ({why})")
        else:  # neutral: the host's (0, the term off), 0 for updater_overhead_s, another machine figure's preset
            value = (hostfig.NEUTRAL[worst][0] if worst in hostfig.NEUTRAL else 0.0 if worst == "updater_overhead_s"
                     else figure(m, host, worst))
            fixed[worst] = (value, f"held at {value:g} (neutral), not fitted: the calibration runs do not determine "
                                   f"it (fitted, it was {res.fitted[worst]:.4g}, {why})")
        m, host = _with(m, host, {worst: jnp.float32(value)})
        fields = [f for f in fields if f != worst]
        res = fit_runtime(m, host, network, runs, fields=fields[:2 * len(runs)], co_located=co_located,
                          prior_factor=prior_factor)
    fitted.update(res.fitted)
    rse.update(res.rel_std_error)
    at_bound += res.at_bound
    stages["runtime"] = dict(fitted=res.fitted, rel_std_error=res.rel_std_error, at_bound=res.at_bound, loss=res.loss,
                             compute=calib.error_stats(res.compute_errors),
                             update=calib.error_stats(res.update_errors))
    if fixed:
        stages["fixed"] = {f: dict(value=v, reason=why) for f, (v, why) in fixed.items()}
    return RuntimeFit(res.machine, res.host, fitted, res.compute_errors, res.update_errors, res.loss, stages, rse,
                      at_bound)
