r"""The SPRINT model judged against the runtime: predictions from measured timings or from specs, and errors.

Two predictions of a run's statistics (:func:`jaxsprint.runtime.events.statistics`):

* **from timings** (:func:`predict_from_timings`): the model's distributions
  (:func:`jaxsprint.perf.sprint.distributions`) from the run's measured learner cycle ``T_c`` (mean and cv)
  and updater cycle ``T_u`` (mean, cv, and its fixed part ``update_shift_s``: the 1st percentile of the
  measured cycles, docs/perf-model.md "A shifted updater cycle"). This judges the
  protocol's mathematics on a real run: the paper reports 5% / 9% / 19% average error (epoch time,
  mini-batch, staleness) at this level.
* **from specs** (:func:`predict_from_specs`): ``T_c`` and ``T_u`` predicted by the runtime's cost form
  (:func:`jaxsprint.calibration.host.runtime_times`) from the cost table of the run's network
  (:func:`network_cost`), a machine preset and its host figures (e.g. the calibrated ``cpu_runtime``), the
  way a plan is made before anything runs.

:func:`compare` gives the errors: relative errors ``predicted / measured - 1`` of the epoch time, the mean
mini-batch and the mean staleness, and the total-variation distance
``TV(p, q) = 1/2 sum_x |p(x) - q(x)|`` of the mini-batch and staleness pmfs.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from jaxsprint.errors import ConfigError

__all__ = ["ERROR_KEYS", "MEASURED_KEYS", "REPORT_KEYS", "compare", "cycle_shift", "format_table", "jsonable",
           "network_cost", "plot", "predict", "predict_from_specs", "predict_from_timings", "report", "spec_cycles",
           "spec_times", "summarize_errors", "tv_distance", "tv_floor", "two_moment_tv", "update_shift"]

ERROR_KEYS = ("epoch_time_rel_error", "mean_minibatch_rel_error", "mean_staleness_rel_error", "minibatch_tv",
              "staleness_tv", "minibatch_tv_floor", "staleness_tv_floor", "minibatch_tv_two_moment")
TV_FLOOR_DRAWS = 200  # samples of the sampling floor (tv_floor): its mean is known to about 1% of itself


def _pow2(x: float) -> int:
    return int(2 ** math.ceil(math.log2(max(x, 8.0))))


_DEFAULT_WINDOWS = dict(learner_size=128, count_size=4096, staleness_size=1024)  # of sprint.distributions


def _windows(n: int, tc: float, tu: float, cv: float, update_cv: float, shift: float = 0.0) -> dict[str, int]:
    """Static pmf windows of :func:`jaxsprint.perf.sprint.distributions`, widened for updater jitter.

    A jittering updater cycle spreads the count by about ``N r update_cv`` (``r = T_u / T_c``) and the
    staleness by about ``sqrt(q + 1) update_cv`` (``q = T_c / T_u``), on top of what
    :func:`~jaxsprint.perf.sprint.suggest_windows` sizes for the compute jitter.
    """
    from jaxsprint.perf import sprint

    kw = dict(update_cv=update_cv)
    if shift > 0:
        kw["update_shift_s"] = shift
    sizes = dict(sprint.suggest_windows(n, tc, tu, cv, **kw))
    # At least the model's default windows: most configurations then share one compilation.
    for name, size in _DEFAULT_WINDOWS.items():
        sizes[name] = max(sizes[name], size)
    r, q = tu / tc, tc / tu
    sizes["learner_size"] = max(sizes["learner_size"], _pow2(20.0 * r * update_cv * tu / (tu - shift) + 8))
    sizes["count_size"] = max(sizes["count_size"], _pow2(16.0 * n * r * update_cv + 16))
    sizes["staleness_size"] = max(sizes["staleness_size"], _pow2(20.0 * math.sqrt(q + 1.0) * update_cv + 8))
    sizes["count_size"] = max(sizes["count_size"], sizes["learner_size"])  # the N-fold sum holds one learner's
    return sizes


def _pmf_dict(offset: Any, pmf: Any, scale: int = 1, threshold: float = 1e-9) -> dict[int, float]:
    p = np.asarray(pmf, np.float64)
    p = p / p.sum()
    return {scale * (int(offset) + i): float(v) for i, v in enumerate(p) if v > threshold}


def predict(n_learners: int, t_compute_s: float, t_update_s: float, cv: float = 0.0, update_cv: float = 0.0, *,
            sub_batch: int, dataset_size: int, update_shift_s: float = 0.0) -> dict[str, Any]:
    """The model's statistics of a configuration given its two cycles (mean and cv of each, and the
    updater cycle's fixed part ``update_shift_s``).

    ``update_cv`` is passed to :func:`jaxsprint.perf.sprint.distributions` (``update_cv_used`` repeats it).

    Args:
      n_learners: ``N``, all hosts.
      t_compute_s: ``T_c``.
      t_update_s: ``T_u``.
      cv: Coefficient of variation of ``T_c`` (gamma).
      update_cv: Coefficient of variation of ``T_u``.
      sub_batch: Images per gradient.
      dataset_size: Images per epoch.
      update_shift_s: Fixed part of the updater cycle, in ``[0, T_u)`` (0: a gamma cycle).

    Returns:
      ``epoch_time_s`` (``N_file T_c / (N N_sub)``), ``images_per_s``, ``mean_count``, ``std_count``,
      ``count_pmf``, ``mean_minibatch``, ``std_minibatch``, ``minibatch_pmf``, ``mean_staleness``,
      ``std_staleness``, ``staleness_pmf`` (pmfs: dicts value -> probability), the inputs
      ``t_compute_s``, ``t_compute_cv``, ``t_update_s``, ``t_update_cv``, ``t_update_shift_s``, and
      ``update_cv_used``.

    Raises:
      ConfigError: invalid timings (:func:`jaxsprint.perf.sprint.validate_timings`).
    """
    from jaxsprint.perf import sprint

    n, b = int(n_learners), int(sub_batch)
    tc, tu, cv, update_cv = float(t_compute_s), float(t_update_s), float(cv), float(update_cv)
    shift = float(update_shift_s)
    kw = dict(update_cv=update_cv)
    if shift != 0:
        kw["update_shift_s"] = shift
        sprint.validate_timings(n, tc, tu, cv, b, int(dataset_size), update_cv=update_cv, update_shift_s=shift)
    else:
        sprint.validate_timings(n, tc, tu, cv, b, int(dataset_size))
        if not (math.isfinite(update_cv) and update_cv >= 0):
            raise ConfigError("t_update_cv", update_cv, "a finite number >= 0")
    d = sprint.distributions(n, tc, tu, cv, **kw, **_windows(n, tc, tu, cv, update_cv, shift))
    mean_count, mean_stale = float(d.mean_count), float(d.mean_staleness)
    images_per_s = n * b / tc
    return dict(
        epoch_time_s=int(dataset_size) / images_per_s, images_per_s=images_per_s,
        mean_count=mean_count, std_count=math.sqrt(max(float(d.var_count), 0.0)),
        count_pmf=_pmf_dict(d.count_offset, d.count_pmf),
        mean_minibatch=b * mean_count, std_minibatch=b * math.sqrt(max(float(d.var_count), 0.0)),
        minibatch_pmf=_pmf_dict(d.count_offset, d.count_pmf, b),
        mean_staleness=mean_stale, std_staleness=math.sqrt(max(float(d.var_staleness), 0.0)),
        staleness_pmf=_pmf_dict(d.staleness_offset, d.staleness_pmf),
        t_compute_s=tc, t_compute_cv=cv, t_update_s=tu, t_update_cv=update_cv, t_update_shift_s=shift,
        update_cv_used=update_cv,
    )


def update_shift(stats: Mapping[str, Any], update_cv: float) -> float:
    """The fixed part of the updater cycle taken from a run: the 1st percentile of its measured cycles
    (``t_update_p01_s``), capped so that the tail keeps a cv ``update_cv T_u / (T_u - s)`` within
    :data:`jaxsprint.perf.sprint.MAX_UPDATE_TAIL_CV` (0 without the percentile or jitter).

    Why the percentile of the whole cycle, not ``network_time_s`` plus a floor of the update's own work:
    the cycle is what the model takes, it needs no split of the cycle the log does not record, and it
    holds whatever else is fixed in a cycle (the swap, the publish, the all-reduce's latency). A shifted
    gamma's 1st percentile is ``s`` plus the tail's, which is near 0 for the bursty tails where the shift
    matters, and for a tight cycle (large tail shape) over-estimating ``s`` changes little.
    """
    from jaxsprint.perf import sprint

    tu, p01 = float(stats["t_update_s"]), float(stats.get("t_update_p01_s", math.nan))
    if not (math.isfinite(p01) and p01 > 0 and update_cv > 0):
        return 0.0
    cap = tu * (1.0 - update_cv / getattr(sprint, "MAX_UPDATE_TAIL_CV", 4.0))
    return max(0.0, min(p01, cap * (1.0 - 1e-6)))


def predict_from_timings(stats: Mapping[str, Any], *, use_update_cv: bool = True,
                         use_update_shift: bool = True) -> dict[str, Any]:
    """The model's prediction of a run from its measured cycles (:func:`predict`).

    Args:
      stats: :func:`jaxsprint.runtime.events.statistics` of the run (``learners``, ``sub_batch``,
        ``dataset_size``, ``t_compute_s``, ``t_compute_cv``, ``t_update_s``, ``t_update_cv``,
        ``t_update_p01_s``).
      use_update_cv: Give the model the measured updater jitter (where it takes one); False: a
        deterministic updater cycle, the original protocol.
      use_update_shift: Give the model the cycle's fixed part (:func:`update_shift`); False: a gamma
        cycle.

    Returns:
      :func:`predict`'s dict. The measured cvs are clipped to the model's limits (2; ``update_cv_used``).
    """
    for key in ("t_compute_s", "t_update_s"):
        if not (math.isfinite(stats[key]) and stats[key] > 0):
            raise ConfigError(f"measured {key}", stats[key], "a finite time > 0: the run is too short after the "
                                                             "warm-up (too few gradients or updates)")
    cv = stats["t_compute_cv"] if math.isfinite(stats["t_compute_cv"]) else 0.0
    ucv = stats["t_update_cv"] if use_update_cv and math.isfinite(stats["t_update_cv"]) else 0.0
    ucv = min(ucv, 2.0)
    shift = update_shift(stats, ucv) if use_update_shift else 0.0
    return predict(stats["learners"], stats["t_compute_s"], stats["t_update_s"], min(cv, 2.0), ucv,
                   sub_batch=stats["sub_batch"], dataset_size=stats["dataset_size"], update_shift_s=shift)


def network_cost(config: Any) -> Any:
    """The cost table (:class:`~jaxsprint.perf.networks.NetworkCost`) of a SPRINT config's network.

    The two-row XLA table of the flax model the learners run (:func:`jaxsprint.perf.networks.from_flax`
    of ``config.model`` at ``config.image_size`` with the dataset's channels and classes, BatchNorm in
    training mode), which is what the ``cpu_runtime`` preset is calibrated on:
    :func:`jaxsprint.calibration.timing.runtime_network`, so that the calibration and this prediction share one
    table.
    """
    from jaxsprint.calibration import timing

    return timing.runtime_network(config)


def spec_times(network: Any, machine: Any, host: Any, *, learners_per_host: int, num_hosts: int, sub_batch: int,
               network_time_s: float, updater_device: str = "shared") -> tuple[float, float, float, float]:
    """``(T_c, T_u, cv, update_cv)`` of a runtime configuration from the machine's and the host's figures.

    The one place the specs prediction calls the runtime's cost form,
    :func:`jaxsprint.calibration.host.runtime_times` (learners that share the cores, the updater's own cost,
    both cycles' jitter; the hosts taken as processes of one machine). ``updater_device``: the run's
    ``config.sprint.updater_device`` (``shared``: the updater's programs on the first learner's device).
    """
    from jaxsprint.calibration import host as hostfig

    t = hostfig.runtime_times(network, machine, host, learners_per_host=learners_per_host, sub_batch=sub_batch,
                              hosts=num_hosts, network_time_s=network_time_s,
                              shared=float(updater_device == "shared"))
    return float(t.t_compute_s), float(t.t_update_s), float(t.t_compute_cv), float(t.t_update_cv)


def spec_cycles(network: Any, machine: Any, host: Any, entries: Sequence[Any]) -> list[tuple[float, float]]:
    """``(T_c, T_u)`` of each of ``entries`` (``hosts``, ``learners_per_host``, ``sub_batch``, ``network_ms``,
    ``updater_device``; None: ``shared``) as :func:`spec_times` gives them, in one compiled call: the form's
    fixed-point loop, called configuration by configuration, compiles anew for each (0.2 s apiece here)."""
    import jax
    import jax.numpy as jnp

    from jaxsprint.calibration import host as hostfig

    if not entries:
        return []

    def one(lph, b, h, nt, shared):
        t = hostfig.runtime_times(network, machine, host, learners_per_host=lph, sub_batch=b, hosts=h,
                                  network_time_s=nt, shared=shared)
        return t.t_compute_s, t.t_update_s

    def column(f, dtype=jnp.float32):
        return jnp.asarray([f(e) for e in entries], dtype)

    tc, tu = jax.jit(jax.vmap(one))(column(lambda e: e.learners_per_host), column(lambda e: e.sub_batch, jnp.int32),
                                    column(lambda e: e.hosts), column(lambda e: e.network_ms / 1e3),
                                    column(lambda e: float((e.updater_device or "shared") == "shared")))
    return [(float(a), float(b)) for a, b in zip(np.asarray(tc), np.asarray(tu))]


def predict_from_specs(machine: Any, host: Any, network: Any, config: Any, *, num_hosts: int = 1,
                       learners_per_host: int | None = None, dataset_size: int | None = None) -> dict[str, Any]:
    """The model's prediction of a run from the machine's specs and the network's costs alone.

    Args:
      machine: A :class:`~jaxsprint.perf.machines.Machine` (e.g. ``machines.get("cpu_runtime")``).
      host: Its :class:`~jaxsprint.calibration.host.HostFigures` (e.g. ``host.load_host(machine, "cpu_runtime")``).
      network: The cost table of the run's network (:func:`network_cost`).
      config: The SPRINT config (``config.sprint.sub_batch``, ``network_time_s``, ``learners_per_host``,
        ``updater_device``).
      num_hosts: Processes of the run.
      learners_per_host: Overrides ``config.sprint.learners_per_host`` (needed when that is None, i.e.
        one learner per local device: give the number of devices).
      dataset_size: Images per epoch (default: the training set of ``config``'s dataset).

    Returns:
      :func:`predict`'s dict, ``T_c``/``T_u`` and their cvs from :func:`spec_times`.
    """
    s = config.sprint
    lph = learners_per_host if learners_per_host is not None else s.learners_per_host
    if lph is None:
        raise ConfigError("learners_per_host", None, "an integer >= 1 (config.sprint.learners_per_host is None: "
                                                     "give the number of local devices)")
    if dataset_size is None:
        from jaxsprint.train import data

        dataset_size = data.load_dataset(config).num_train
    tc, tu, cv, ucv = spec_times(network, machine, host, learners_per_host=int(lph), num_hosts=int(num_hosts),
                                 sub_batch=int(s.sub_batch), network_time_s=float(s.network_time_s),
                                 updater_device=str(s.get("updater_device", "shared")))
    return predict(int(lph) * int(num_hosts), tc, tu, cv, ucv, sub_batch=int(s.sub_batch),
                   dataset_size=int(dataset_size))


def tv_distance(p: Mapping[Any, float], q: Mapping[Any, float]) -> float:
    """Total-variation distance ``1/2 sum_x |p(x) - q(x)|`` of two pmfs given as dicts (keys compared as
    integers, so ``"3"`` and ``3`` are one value); each is normalised first (empty: NaN)."""
    p = {int(k): float(v) for k, v in p.items()}
    q = {int(k): float(v) for k, v in q.items()}
    sp, sq = sum(p.values()), sum(q.values())
    if sp <= 0 or sq <= 0:
        return math.nan
    return 0.5 * sum(abs(p.get(k, 0.0) / sp - q.get(k, 0.0) / sq) for k in set(p) | set(q))


def tv_floor(pmf: Mapping[Any, float], n: int, *, draws: int = TV_FLOOR_DRAWS, seed: int = 0) -> float:
    """The sampling floor of a measured pmf's TV distance: the mean :func:`tv_distance` between ``pmf``
    and the empirical pmf of ``n`` independent draws from it.

    A model that were exactly right would still score this against a run of ``n`` updates (or gradients):
    the empirical pmf of a finite run is noisy. For a pmf of standard deviation ``sigma`` (in its
    lattice's steps) and large ``n`` it is about ``0.89 sqrt(sigma / n)`` (``1/2 sum_k E|p_k - p^_k|``
    with ``E|p - p^| ~ sqrt(2 p / (pi n))`` and ``sum_k sqrt(p_k) ~ 2.24 sqrt(sigma)`` for a bell shape), so
    wide pmfs over few updates have a high floor.
    Consecutive cycles of a real run are correlated, which makes its effective ``n`` smaller: the floor
    is a lower bound.

    Args:
      pmf: Value -> probability (normalised first).
      n: Draws per sample (the run's updates, or its gradients).
      draws: Samples averaged.
      seed: Seed of the draws (deterministic).

    Returns:
      The mean TV (NaN for an empty pmf or ``n < 1``).
    """
    items = [(int(k), float(v)) for k, v in pmf.items() if float(v) > 0]
    total = sum(v for _, v in items)
    if not items or total <= 0 or int(n) < 1:
        return math.nan
    p = np.asarray([v for _, v in items]) / total
    counts = np.random.default_rng(seed).multinomial(int(n), p, size=int(draws))
    return float(np.mean(0.5 * np.abs(counts / int(n) - p).sum(axis=1)))


def two_moment_tv(pmf: Mapping[Any, float]) -> float:
    """TV between a measured pmf and the discretised gamma of ITS OWN mean and variance.

    A reference for the mini-batch pmf: what a model that predicted the run's first two moments exactly (with
    the gamma shape the model uses where its exact form does not fit,
    :func:`jaxsprint.perf.renewal.discretised_gamma`) would still score, from the shape and the run's sampling noise together. A model's TV
    well above it is an error in the moments; near it, only a better shape (or a longer run) helps. Values
    are taken on the pmf's lattice (the greatest common divisor of its values, e.g. the sub-batch); bins are
    ``[k - 1/2, k + 1/2)`` with the first bin holding everything below. 0 for a one-point pmf, NaN for an
    empty one.
    """
    from scipy import stats as st

    items = sorted((int(k), float(v)) for k, v in pmf.items() if float(v) > 0)
    total = sum(v for _, v in items)
    if not items or total <= 0:
        return math.nan
    stride = math.gcd(*[k for k, _ in items]) or 1
    k = np.asarray([k // stride for k, _ in items], np.float64)
    p = np.asarray([v for _, v in items]) / total
    mean = float(p @ k)
    var = float(p @ (k - mean) ** 2)
    if var <= 0 or mean <= 0:
        return 0.0
    hi = int(k.max() + 10.0 * math.sqrt(var) + 10.0)
    edges = np.arange(hi + 1) + 0.5  # upper edges of the bins 0..hi
    cdf = st.gamma.cdf(edges, mean * mean / var, scale=var / mean)
    q = np.diff(np.concatenate([[0.0], cdf]))
    q[-1] += 1.0 - cdf[-1]
    measured = np.zeros(hi + 1)
    measured[k.astype(np.int64)] = p
    return float(0.5 * np.abs(measured - q).sum())


def _rel(pred: float, meas: float) -> float:
    if not (math.isfinite(pred) and math.isfinite(meas)) or meas == 0:
        return math.nan
    return pred / meas - 1.0


def compare(measured: Mapping[str, Any], predicted: Mapping[str, Any]) -> dict[str, float]:
    """Errors of a prediction against a measurement (both dicts of this module's / events' form).

    Returns:
      ``epoch_time_rel_error``, ``mean_minibatch_rel_error``, ``mean_staleness_rel_error`` (signed:
      ``predicted / measured - 1``), ``minibatch_tv`` and ``staleness_tv`` (:func:`tv_distance`), and
      their sampling floors ``minibatch_tv_floor`` and ``staleness_tv_floor`` (:func:`tv_floor` of the
      predicted pmf over the measured ``updates`` and ``gradients``; NaN where those are not given), and
      ``minibatch_tv_two_moment`` (:func:`two_moment_tv` of the measured mini-batch pmf: what a model with the
      run's own mean and variance would score).
    """
    return dict(
        epoch_time_rel_error=_rel(predicted["epoch_time_s"], measured["epoch_time_s"]),
        mean_minibatch_rel_error=_rel(predicted["mean_minibatch"], measured["mean_minibatch"]),
        mean_staleness_rel_error=_rel(predicted["mean_staleness"], measured["mean_staleness"]),
        minibatch_tv=tv_distance(measured["minibatch_pmf"], predicted["minibatch_pmf"]),
        staleness_tv=tv_distance(measured["staleness_pmf"], predicted["staleness_pmf"]),
        minibatch_tv_floor=tv_floor(predicted["minibatch_pmf"], measured.get("updates", 0)),
        staleness_tv_floor=tv_floor(predicted["staleness_pmf"], measured.get("gradients", 0)),
        minibatch_tv_two_moment=two_moment_tv(measured["minibatch_pmf"]),
    )


# ----------------------------------------------------------------------------------------------
# Reports: JSON, a printed table, a plot
# ----------------------------------------------------------------------------------------------

REPORT_KEYS = ("epoch_time_s", "mean_minibatch", "mean_staleness", "minibatch_pmf", "staleness_pmf")
MEASURED_KEYS = REPORT_KEYS + ("t_compute_s", "t_compute_cv", "t_update_s", "t_update_cv", "images_per_s",
                               "gradients", "updates", "t_update_empty_s", "t_update_applying_s", "empty_cycles",
                               "applying_cycles")


def jsonable(value: Any) -> Any:
    """``value`` with pmf dicts keyed by strings, numpy scalars as Python numbers and NaN/inf as None."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return value


def report(measured: Mapping[str, Any], predictions: Mapping[str, Mapping[str, Any] | None]) -> dict[str, Any]:
    """One JSON-ready object: ``measured`` and each prediction (``predicted_from_<name>``), with the errors of
    each against the measurement (``errors_from_<name>``). A prediction that is None stays None."""
    out: dict[str, Any] = {"measured": jsonable(measured)}
    for name, pred in predictions.items():
        out[f"predicted_from_{name}"] = None if pred is None else jsonable(pred)
        out[f"errors_from_{name}"] = None if pred is None else jsonable(compare(measured, pred))
    return out


_TABLE_ROWS = (("epoch time (s)", "epoch_time_s", "{:.4g}"), ("images/s", "images_per_s", "{:.4g}"),
               ("T_c (ms)", "t_compute_s", "ms"), ("T_c cv", "t_compute_cv", "{:.3f}"),
               ("T_u (ms)", "t_update_s", "ms"), ("T_u cv", "t_update_cv", "{:.3f}"),
               ("mean mini-batch", "mean_minibatch", "{:.4g}"), ("std mini-batch", "std_minibatch", "{:.4g}"),
               ("mean staleness", "mean_staleness", "{:.4g}"), ("std staleness", "std_staleness", "{:.4g}"))


def _fmt(fmt: str, v: Any) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{1e3 * v:.3f}" if fmt == "ms" else fmt.format(v)


def format_table(measured: Mapping[str, Any], predictions: Mapping[str, Mapping[str, Any] | None]) -> str:
    """Measured against each prediction, with relative errors and the TV distances of both pmfs."""
    names = list(predictions)
    head = f"{'':18s} {'measured':>12s}" + "".join(f" {'from ' + n:>14s} {'error':>8s}" for n in names)
    lines = [head]
    for label, key, fmt in _TABLE_ROWS:
        row = f"{label:18s} {_fmt(fmt, measured.get(key)):>12s}"
        for n in names:
            p = predictions[n]
            v = None if p is None else p.get(key)
            err = _rel(v, measured.get(key, math.nan)) if v is not None else math.nan
            row += f" {_fmt(fmt, v):>14s} {_fmt('{:+.1%}', err):>8s}"
        lines.append(row)
    for label, key in (("TV mini-batch", "minibatch_tv"), ("TV staleness", "staleness_tv")):
        row = f"{label:18s} {'':>12s}"
        for n in names:
            v = None if predictions[n] is None else compare(measured, predictions[n])[key]
            row += f" {_fmt('{:.4f}', v):>14s} {'':>8s}"
        lines.append(row)
    lines.append(f"gradients {measured['gradients']} and updates {measured['updates']} after the warm-up "
                 f"({measured['warmup_until_s']:g} s of {measured['t_stop_s']:.3g} s), "
                 f"{measured['in_flight']} in flight at the stop; {measured['learners']} learners "
                 f"({measured['num_hosts']} host(s) x {measured['learners_per_host']}), sub-batch "
                 f"{measured['sub_batch']}, emulated network {1e3 * measured['network_time_s']:g} ms")
    return "\n".join(lines)


def plot(path: str, measured: Mapping[str, Any], predictions: Mapping[str, Mapping[str, Any] | None]) -> None:
    """Measured histograms of the mini-batch and the staleness (bars) over the predicted pmfs (lines).

    Needs matplotlib (the ``plot`` extra).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    styles = {"timings": dict(color="C1", marker="o"), "specs": dict(color="C2", marker="s", linestyle="--")}
    for ax, key, label in ((axes[0], "minibatch_pmf", "mini-batch (images)"),
                           (axes[1], "staleness_pmf", "staleness (updates)")):
        m = {int(k): float(v) for k, v in measured[key].items()}
        xs = sorted(m)
        width = 0.8 * (min(np.diff(xs)) if len(xs) > 1 else 1)
        ax.bar(xs, [m[x] for x in xs], width=width, color="C0", alpha=0.6, label="measured")
        for name, pred in predictions.items():
            if pred is None:
                continue
            p = {int(k): float(v) for k, v in pred[key].items() if float(v) > 1e-4}
            px = sorted(p)
            tv = tv_distance(measured[key], pred[key])
            ax.plot(px, [p[x] for x in px], markersize=3, label=f"model from {name} (TV {tv:.3f})",
                    **styles.get(name, {}))
        ax.set_xlabel(label)
        ax.set_ylabel("probability")
        ax.legend(fontsize=8)
    fig.suptitle(f"SPRINT runtime: {measured['learners']} learners ({measured['num_hosts']} host(s)), "
                 f"sub-batch {measured['sub_batch']}, network {1e3 * measured['network_time_s']:g} ms; "
                 f"T_u/T_c = {measured['t_update_s'] / measured['t_compute_s']:.3g}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summarize_errors(errors: list[Mapping[str, float] | None]) -> dict[str, dict[str, float]]:
    """Median and 90th percentile of the ABSOLUTE value of each of :data:`ERROR_KEYS` over runs.

    Args:
      errors: :func:`compare` dicts (None entries and NaN values are left out).

    Returns:
      ``{key: {"median": ..., "p90": ..., "n": runs counted}}`` (NaN where no run counts).
    """
    out = {}
    for key in ERROR_KEYS:
        v = [abs(e[key]) for e in errors if e is not None and e.get(key) is not None and math.isfinite(e[key])]
        out[key] = {"median": float(np.percentile(v, 50)) if v else math.nan,
                    "p90": float(np.percentile(v, 90)) if v else math.nan, "n": len(v)}
    return out


def cycle_shift(runs: list[Mapping[str, Any]], source: str = "specs") -> tuple[float, int]:
    """How much longer the predicted learner cycles are than the measured ones over runs, ``exp(mean log(p /
    m)) - 1``, and over how many: each run a record with ``measured`` and ``predicted_from_<source>`` holding
    ``t_compute_s`` (as ``validate_runtime.py`` writes them; a run without a finite positive pair is left out,
    NaN where none has one). From specs it is the share by which the machine ran faster than during its
    calibration, plus the form's mean error: a speed change moves every run alike (docs/calibration.md)."""
    logs = []
    for r in runs:
        m = (r.get("measured") or {}).get("t_compute_s")
        p = (r.get(f"predicted_from_{source}") or {}).get("t_compute_s")
        if m is not None and p is not None and math.isfinite(m) and math.isfinite(p) and m > 0 and p > 0:
            logs.append(math.log(p / m))
    return (math.expm1(sum(logs) / len(logs)) if logs else math.nan), len(logs)
