"""``config.async_emulation`` -> the delayed-gradient transform and the random mini-batch distribution.

The config adapter of the asynchronous-SGD emulator (:mod:`jaxsprint.emulation.staleness`, :mod:`jaxsprint.emulation.samplers`):
:func:`validate_config` checks the fields before anything is read or written, :func:`from_config` builds the
objects a training run needs. The fields (see ``experiments/configs/default.py``):

  * ``enabled``: off by default; every other field is ignored (and not checked) when it is False.
  * ``max_staleness``: ring-buffer depth - 1 of :func:`jaxsprint.emulation.staleness.delayed_gradients`.
  * ``sampler``: one of :data:`jaxsprint.emulation.samplers.SAMPLERS`: "constant" (``staleness``), "uniform" on
    ``{0..staleness}``, "geometric" with ``mean_staleness`` (truncated at ``max_staleness``), "pmf" (``pmf``)
    or "perf_model", the SPRINT model's predicted pmf for the cluster given by ``workers``, ``t_compute_s``,
    ``t_compute_cv`` and ``t_update_s``.
  * ``mitigation``: one of :data:`jaxsprint.emulation.staleness.MITIGATIONS`; ``dc_lambda`` for DC-ASGD.
  * ``num_sub_batches``: 0 (every update uses the whole batch) or the number of sub-batches of the global batch
    of which each update uses K, drawn from ``k_pmf`` (``k_pmf[k] = P(K = k)``, ``k_pmf[0] = 0``) or, when
    ``k_pmf`` is empty, from the model's predicted count pmf conditioned on K >= 1 (an update with no
    gradient changes nothing in SPRINT, so the emulator skips none and draws again).
"""
from __future__ import annotations

import jax
import numpy as np
import optax

from jaxsprint.emulation import samplers, staleness
from jaxsprint.errors import ConfigError, check, is_int, is_real

__all__ = ["validate_config", "from_config", "sampler_from_config", "k_pmf_from_config"]

_FIELD = "config.async_emulation"
# The PRNG stream of the staleness draws: the run's seed offset, so that it differs from the other streams.
_SEED_OFFSET = 7


def _last_positive(pmf: np.ndarray) -> int:
    return int(np.flatnonzero(pmf > 0)[-1])


def _uses_perf_model(a) -> bool:
    return a.sampler == "perf_model" or (a.num_sub_batches > 0 and not len(a.k_pmf))


def _validate_fields(config) -> None:
    """Every check of ``config.async_emulation`` except ``enabled``."""
    a = config.async_emulation
    m = samplers.check_nonneg_int(f"{_FIELD}.max_staleness", a.max_staleness)
    check(a.sampler in samplers.SAMPLERS, f"{_FIELD}.sampler", a.sampler,
          f"allowed: {', '.join(samplers.SAMPLERS)}")
    if a.sampler in ("constant", "uniform"):
        s = samplers.check_nonneg_int(f"{_FIELD}.staleness", a.staleness)
        check(s <= m, f"{_FIELD}.staleness", a.staleness,
              f"an integer in 0..{_FIELD}.max_staleness={m} (the ring buffer holds {m + 1} gradients)")
    elif a.sampler == "geometric":
        check(is_real(a.mean_staleness) and 0 <= a.mean_staleness <= m, f"{_FIELD}.mean_staleness",
              a.mean_staleness, f"a finite number in [0, {_FIELD}.max_staleness={m}] (the law is truncated there)")
    elif a.sampler == "pmf":
        pmf = samplers.check_pmf(f"{_FIELD}.pmf", a.pmf)
        check(_last_positive(pmf) <= m, f"{_FIELD}.pmf", a.pmf,
              f"probabilities of tau = 0..{_FIELD}.max_staleness={m} (the last positive entry is at "
              f"{_last_positive(pmf)})")
    check(a.mitigation in staleness.MITIGATIONS, f"{_FIELD}.mitigation", a.mitigation,
          f"allowed: {', '.join(staleness.MITIGATIONS)}")
    check(is_real(a.dc_lambda) and a.dc_lambda >= 0, f"{_FIELD}.dc_lambda", a.dc_lambda, "a finite number >= 0")
    n = a.num_sub_batches
    b, k = config.batch_size, config.grad_accum_steps
    check(is_int(n) and n >= 0 and (n == 0 or (b % n == 0 and k == 1)), f"{_FIELD}.num_sub_batches", n,
          f"0 (off) or a divisor of config.batch_size={b} (without gradient accumulation)")
    if n and len(a.k_pmf):
        k_pmf = samplers.check_pmf(f"{_FIELD}.k_pmf", a.k_pmf)
        check(k_pmf[0] == 0, f"{_FIELD}.k_pmf", a.k_pmf,
              "k_pmf[0] = 0: k_pmf[k] = P(K = k) and an update uses at least one sub-batch")
        check(_last_positive(k_pmf) <= n, f"{_FIELD}.k_pmf", a.k_pmf,
              f"probabilities of K = 0..{_FIELD}.num_sub_batches={n} (the last positive entry is at "
              f"{_last_positive(k_pmf)})")
    if _uses_perf_model(a):
        check(is_int(a.workers) and a.workers >= 1, f"{_FIELD}.workers", a.workers, "an integer >= 1")
        for name in ("t_compute_s", "t_update_s"):
            check(is_real(a[name]) and a[name] > 0, f"{_FIELD}.{name}", a[name], "a finite number of seconds > 0")
        check(is_real(a.t_compute_cv) and a.t_compute_cv >= 0, f"{_FIELD}.t_compute_cv", a.t_compute_cv,
              "a finite coefficient of variation >= 0")


def validate_config(config) -> None:
    """Checks ``config.async_emulation`` (and, for the mini-batch, ``batch_size`` / ``grad_accum_steps``).

    Needs no data and no devices: call it before anything is read or written. With ``enabled`` False nothing
    else is checked (the emulation is off and ignores its fields).

    Raises:
      ConfigError: naming the first bad field (``config.async_emulation.<name>``), its value and what is
        allowed: an unknown sampler or mitigation; a negative or non-integer ``max_staleness``, ``staleness``
        or ``num_sub_batches``; a staleness, geometric mean or pmf support beyond ``max_staleness``; a pmf or
        ``k_pmf`` that is not a finite, non-negative 1-D array summing to 1, a ``k_pmf[0] != 0`` or a support
        beyond ``num_sub_batches``; ``num_sub_batches`` not dividing the batch or used with accumulation; a
        NaN or negative ``dc_lambda``; and, where the performance model is used, ``workers`` < 1, a timing
        that is not finite and > 0 or a negative ``t_compute_cv``.
    """
    enabled = config.async_emulation.enabled
    check(isinstance(enabled, (bool, np.bool_)), f"{_FIELD}.enabled", enabled, "True or False")
    if enabled:
        _validate_fields(config)


def _perf_model_pmfs(a, max_staleness: int, max_count: int) -> tuple[np.ndarray, np.ndarray]:
    """The SPRINT model's (staleness, count) pmfs on ``0..max_staleness`` and ``0..max_count``."""
    from jaxsprint.perf import sprint as sprint_model  # lazy: the emulator runs without the model

    stale, count = sprint_model.delay_pmfs(a.workers, a.t_compute_s, a.t_update_s, a.t_compute_cv,
                                           max_staleness=max_staleness, max_count=max_count)
    return np.asarray(stale, np.float64), np.asarray(count, np.float64)


def _wrap(a, error: Exception) -> ConfigError:
    """A build error (e.g. from the performance model) as a ConfigError naming the emulation's settings."""
    if isinstance(error, ConfigError) and error.field.startswith("config."):
        return error
    keys = ("sampler", "max_staleness", "staleness", "mean_staleness", "pmf", "num_sub_batches", "k_pmf")
    return ConfigError(_FIELD, {k: a[k] for k in keys}, str(error))


def sampler_from_config(config) -> samplers.PmfSampler:
    """The staleness sampler of ``config.async_emulation`` (whether or not ``enabled`` is set).

    "constant" and "uniform" use ``staleness``, "geometric" ``mean_staleness`` truncated at ``max_staleness``,
    "pmf" the explicit ``pmf``, and "perf_model" the model's predicted pmf on ``0..max_staleness`` (mass above
    it lumped into the last entry by the model, then renormalised), in non-empty updates: the model's staleness
    counts versions, empty cycles included, while every emulated update applies a gradient, so the pmf is
    thinned by the predicted chance of an empty cycle (:func:`jaxsprint.emulation.samplers.nonempty_staleness_pmf`).

    Raises:
      ConfigError: as :func:`validate_config`, or naming ``config.async_emulation`` when the model fails.
    """
    _validate_fields(config)
    a = config.async_emulation
    m = int(a.max_staleness)
    try:
        if a.sampler == "constant":
            return samplers.constant(int(a.staleness))
        if a.sampler == "uniform":
            return samplers.uniform(int(a.staleness))
        if a.sampler == "geometric":
            return samplers.geometric(float(a.mean_staleness), m)
        if a.sampler == "pmf":
            return samplers.from_pmf(np.asarray(a.pmf, np.float64))
        pmf, count = _perf_model_pmfs(a, m, 1)
        # The model counts versions, empty cycles included; the emulator's ring counts the updates it applies.
        pmf = samplers.nonempty_staleness_pmf(pmf, count[0] / count.sum())
        return samplers.sampler_from_perf_model(pmf, max_staleness=m, tail="renormalize")
    except (ValueError, TypeError) as e:  # JaxsprintError is a ValueError
        raise _wrap(a, e) from None


def k_pmf_from_config(config) -> np.ndarray | None:
    """The pmf of K, the sub-batches per update, or None when ``num_sub_batches`` is 0.

    ``k_pmf`` itself when given, else the model's count pmf on ``0..num_sub_batches`` with ``k_pmf[0]`` set to
    0 and renormalised (conditioned on K >= 1).

    Raises:
      ConfigError: as :func:`validate_config`, or naming ``config.async_emulation`` when the model fails or
        predicts no update with K >= 1.
    """
    _validate_fields(config)
    a = config.async_emulation
    n_sub = int(a.num_sub_batches)
    if not n_sub:
        return None
    try:
        if len(a.k_pmf):
            k_pmf = np.asarray(a.k_pmf, np.float64)
        else:
            _, k_pmf = _perf_model_pmfs(a, max(int(a.max_staleness), 1), n_sub)
            k_pmf[0] = 0.0
            if not k_pmf.sum() > 0:
                raise ValueError("the performance model predicts no update with K >= 1 sub-batch")
            k_pmf = k_pmf / k_pmf.sum()
        samplers.minibatch_weights(jax.random.key(0), n_sub, k_pmf)  # validates now, not inside jit
    except (ValueError, TypeError) as e:
        raise _wrap(a, e) from None
    return k_pmf


def from_config(config) -> tuple[optax.GradientTransformation | None, tuple[int, np.ndarray] | None]:
    """The delayed-gradient transform and the (num_sub_batches, K distribution) of ``config.async_emulation``.

    Both are None when the emulation is off; the second is also None when ``num_sub_batches`` is 0. The
    transform is :func:`jaxsprint.emulation.staleness.delayed_gradients` with :func:`sampler_from_config`'s sampler,
    ``max_staleness``, ``mitigation`` and ``dc_lambda``, its draws seeded by ``config.seed + 7``; chain it
    before the optimizer (SPRINT's updater applies momentum to the gradients that arrive). The K distribution
    is :func:`k_pmf_from_config`'s: draw each update's sub-batch weights with
    :func:`jaxsprint.emulation.samplers.minibatch_weights`.

    Raises:
      ConfigError: naming the field, as :func:`validate_config` (which it calls first).
    """
    validate_config(config)
    a = config.async_emulation
    if not a.enabled:
        return None, None
    sampler = sampler_from_config(config)
    try:
        tx = staleness.delayed_gradients(int(a.max_staleness), sampler, mitigation=a.mitigation,
                                         dc_lambda=float(a.dc_lambda), seed=config.seed + _SEED_OFFSET)
    except (ValueError, TypeError) as e:
        raise _wrap(a, e) from None
    k_pmf = k_pmf_from_config(config)
    return tx, (None if k_pmf is None else (int(a.num_sub_batches), k_pmf))
