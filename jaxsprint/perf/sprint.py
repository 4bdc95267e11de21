r"""The SPRINT performance model: epoch time, mini-batch and staleness of the asynchronous protocol.

Everything here is pure jnp (jit, vmap and grad work); Python-side checks live in
:func:`validate_timings` and :func:`validate_config` and are meant for launchers.

**Protocol** (docs/perf-model.md, "The protocol").
``N`` learners each compute one sub-batch gradient in a random time ``T_i`` (mean ``T_c``,
coefficient of variation ``cv``), hand it to the updater and start again at once with the newest
published weights. The updater runs cycles of length ``T_u`` back to back; the cycle starting at
``k T_u`` gathers every gradient finished during the previous cycle and publishes version ``k+1``
at ``(k+1) T_u``. Mini-batch of an update: ``B = N_sub K`` with ``K`` the gradients gathered;
staleness of a gradient read at version ``v`` and applied in the update publishing ``u``:
``S = u - 1 - v``. Empty cycles (``K = 0``) publish a version too and are counted as updates.

**Times** ``T_c`` (learner time per sub-batch) and ``T_u`` (updater cycle) come from
:mod:`jaxsprint.perf.times` (from a network's costs and a machine's figures) or are given measured.

**Epoch** (learners never wait): ``T_epoch = N_file T_c / (N N_sub)``, updates per epoch
``T_epoch / T_u``.

**Means, exact for any compute-time distribution** (stationary learners):
``E[B] = N_sub N T_u / T_c`` and ``E[S] = T_c / T_u + 1``; hence Little's law
``(E[S] - 1) E[B] = N N_sub``.

**Distributions.** Learners are independent and stationary, so:

* ``K`` is the sum of ``N`` independent counts ``K_i`` of a stationary renewal process in a window
  of length ``T_u``. With ``G_j(t) = \int_0^t F_j(u) du`` and ``F_j`` the CDF of the sum of ``j``
  compute times (time in units of ``T_c``, ``r = T_u / T_c``), the exact renewal identity
  (Cox, *Renewal Theory*, 1962, sec. 4.1) gives ``P(K_i >= k) = G_{k-1}(r) - G_k(r)``.
* a gradient's completion time is uniform modulo ``T_u`` and independent of its own duration
  ``T`` (Palm calculus of a stationary point process), so with ``Q = T / T_u`` and ``x ~ U[0,1)``,
  ``S = 1 + ceil(Q - x)`` and exactly ``P(S >= 1 + m) = \int_{m-1}^{m} P(Q > u) du``. The
  staleness pmf is a mixture over ``T`` of the deterministic two-point law.

The only approximation is the family of the compute time: **gamma with the given mean and cv**
(exact when the jitter is gamma distributed, as in the simulator's default; with another
distribution of the same mean and cv only the shape of the pmfs is approximate, the means stay
exact). Gamma sums are gamma, so ``F_j`` is a gamma CDF of shape ``j / cv^2``; CDFs use XLA's
regularised incomplete gamma for shapes up to 100 and the Wilson-Hilferty normal approximation
(error below 6e-5) above; integrals of CDFs use the closed forms ``E[(c - Q)_+] = q[(t - 1) F(t) +
t f(t) / a]`` and ``E[(Q - c)_+] = q[(1 - t) \bar F(t) + t f(t) / a]`` (``t = c / q``), each taken
on the side where it is small so that float32 does not cancel. ``cv = 0`` uses the exact
deterministic forms ``K = N floor(r) + Binomial(N, frac r)`` and
``P(S = floor(q) + 2) = frac(q)``. The ``N``-fold convolution is a power of the characteristic
function on an FFT grid (exact up to float32 rounding when the grid covers the support).

pmfs are returned on windows ``[offset, offset + size)``; the mass outside a window (negligible
when the window is sized by :func:`suggest_windows`) is lumped into its first and last bins so
each pmf sums to 1.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammainc, gammaincc, gammaln, ndtr

from jaxsprint.errors import ConfigError
from jaxsprint.perf import times
from jaxsprint.perf.machines import Machine
from jaxsprint.perf.networks import NetworkCost

IMAGENET_TRAIN_IMAGES = 1_281_167
_GAMMA_EXACT_MAX_SHAPE = 100.0


# ----------------------------------------------------------------------------------------------
# Epoch time and exact means
# ----------------------------------------------------------------------------------------------


class Prediction(NamedTuple):
    """Summary statistics of one configuration (all float32 arrays, batched under vmap)."""

    t_compute_s: jax.Array
    t_update_s: jax.Array
    epoch_time_s: jax.Array
    updates_per_epoch: jax.Array
    mean_minibatch: jax.Array
    mean_staleness: jax.Array


def predict_from_timings(n_workers: jax.Array, t_compute_s: jax.Array, t_update_s: jax.Array,
                         sub_batch: jax.Array = 1.0,
                         dataset_size: jax.Array = IMAGENET_TRAIN_IMAGES) -> Prediction:
    """Epoch time, updates per epoch and the exact means from ``(N, T_c, T_u, N_sub)``.

    ``T_epoch = N_file T_c / (N N_sub)``, ``updates = T_epoch / T_u``,
    ``E[B] = N_sub N T_u / T_c``, ``E[S] = T_c / T_u + 1`` (exact for any jitter).
    """
    n = jnp.asarray(n_workers, jnp.float32)
    tc = jnp.asarray(t_compute_s, jnp.float32)
    tu = jnp.asarray(t_update_s, jnp.float32)
    b = jnp.asarray(sub_batch, jnp.float32)
    epoch = jnp.asarray(dataset_size, jnp.float32) * tc / (n * b)
    return Prediction(tc, tu, epoch, epoch / tu, b * n * tu / tc, tc / tu + 1.0)


def predict(network: NetworkCost, machine: Machine, nodes: jax.Array, gpus_per_node: jax.Array,
            sub_batch: jax.Array, dataset_size: jax.Array = IMAGENET_TRAIN_IMAGES, *,
            algorithm: str = "ring") -> Prediction:
    """:class:`Prediction` of a configuration from the network's costs and the machine's specs.

    Args:
      network: Cost table.
      machine: Machine preset.
      nodes: ``N_node``; ``gpus_per_node``: ``N_gpu``; ``sub_batch``: ``N_Subbatch`` (floats
        allowed, e.g. for gradient-based search).
      dataset_size: ``N_File``.
      algorithm: Inter-node all-reduce algorithm.

    Returns:
      The prediction.
    """
    tc = times.compute_time_s(network, machine, sub_batch, gpus_per_node)
    tu = times.update_time_s(network, machine, nodes, gpus_per_node, algorithm=algorithm)
    n = jnp.asarray(nodes, jnp.float32) * jnp.asarray(gpus_per_node, jnp.float32)
    return predict_from_timings(n, tc, tu, sub_batch, dataset_size)


# ----------------------------------------------------------------------------------------------
# Gamma building blocks (shape a, mean 1), float32-stable
# ----------------------------------------------------------------------------------------------


def _log1p_minus(d: jax.Array) -> jax.Array:
    """``log(1 + d) - d`` without cancellation for small ``|d|`` (atanh series)."""
    u = d / (2.0 + d)
    u2 = u * u
    series = -u * d + 2.0 * u * u2 * (1 / 3 + u2 * (1 / 5 + u2 * (1 / 7 + u2 * (1 / 9 + u2 * (
        1 / 11 + u2 * (1 / 13 + u2 * (1 / 15 + u2 / 17)))))))
    safe_d = jnp.where(jnp.abs(d) < 0.4, 0.5, d)
    direct = jnp.log1p(safe_d) - safe_d
    return jnp.where(jnp.abs(d) < 0.4, series, direct)


def _stirling_log_ratio(a: jax.Array) -> jax.Array:
    """``a log a - a - lgamma(a)`` accurately for large ``a``."""
    a_big = jnp.maximum(a, 10.0)
    inv = 1.0 / a_big
    corr = inv * (1 / 12 - inv * inv * (1 / 360 - inv * inv / 1260))
    big = 0.5 * jnp.log(a_big / (2 * math.pi)) - corr
    a_small = jnp.minimum(a, 10.0)
    small = a_small * jnp.log(a_small) - a_small - gammaln(a_small)
    return jnp.where(a >= 10.0, big, small)


def _gamma_parts(a: jax.Array, t: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """CDF, survival and ``t f(t) / a`` of Gamma(shape ``a``, mean 1) at ``t > 0``."""
    t = jnp.maximum(t, 1e-30)
    d = t - 1.0
    # t f(t) = exp(a (log t - t + 1) + a log a - a - lgamma(a)).
    tf = jnp.exp(a * _log1p_minus(d) + _stirling_log_ratio(a))
    g = tf / a
    # Exact incomplete gamma for moderate shapes, Wilson-Hilferty for large shapes.
    a_lo = jnp.minimum(a, _GAMMA_EXACT_MAX_SHAPE)
    cdf_lo, sf_lo = gammainc(a_lo, a_lo * t), gammaincc(a_lo, a_lo * t)
    a_hi = jnp.maximum(a, _GAMMA_EXACT_MAX_SHAPE)
    cube_root_m1 = jnp.expm1(jnp.log1p(jnp.maximum(d, -0.999999)) / 3.0)
    z = 3.0 * jnp.sqrt(a_hi) * (cube_root_m1 + 1.0 / (9.0 * a_hi))
    exact = a <= _GAMMA_EXACT_MAX_SHAPE
    return jnp.where(exact, cdf_lo, ndtr(z)), jnp.where(exact, sf_lo, ndtr(-z)), g


def _lower_partial(q: jax.Array, a: jax.Array, c: jax.Array) -> jax.Array:
    """``E[(c - Q)_+]`` for ``Q ~ Gamma(shape a, mean q)``."""
    t = c / q
    cdf, _, g = _gamma_parts(a, t)
    return q * ((t - 1.0) * cdf + g)


def _upper_partial(q: jax.Array, a: jax.Array, c: jax.Array) -> jax.Array:
    """``E[(Q - c)_+]`` for ``Q ~ Gamma(shape a, mean q)``."""
    t = c / q
    _, sf, g = _gamma_parts(a, t)
    return q * ((1.0 - t) * sf + g)


def _pmf_from_tail(tail: jax.Array) -> jax.Array:
    """pmf on ``[k0, k0 + W)`` from ``P(X >= k)`` at ``k0+1 .. k0+W-1``; tails lumped at the ends."""
    ones = jnp.ones(tail.shape[:-1] + (1,), tail.dtype)
    zeros = jnp.zeros(tail.shape[:-1] + (1,), tail.dtype)
    tail = jnp.clip(tail, 0.0, 1.0)
    return jnp.maximum(jnp.concatenate([ones, tail], -1) - jnp.concatenate([tail, zeros], -1), 0.0)


def _safe_shape(cv: jax.Array) -> tuple[jax.Array, jax.Array]:
    jitter = cv > 0
    cv_safe = jnp.where(jitter, cv, 1.0)
    return jitter, 1.0 / (cv_safe * cv_safe)


# ----------------------------------------------------------------------------------------------
# Distributions
# ----------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("size",))
def learner_count_pmf(ratio: jax.Array, cv: jax.Array, *, size: int = 128
                      ) -> tuple[jax.Array, jax.Array]:
    """pmf of the gradients ``K_i`` one learner finishes in one updater cycle.

    ``K_i`` is the count of a stationary renewal process (gamma intervals of mean 1 and
    coefficient of variation ``cv``) in a window of length ``ratio = T_u / T_c``:
    ``P(K_i >= k) = G_{k-1}(r) - G_k(r)`` with ``G_j(r) = E[(r - S_j)_+]`` and ``S_j`` the sum of
    ``j`` intervals. For ``cv = 0``: ``P(K_i >= k) = clip(r - k + 1, 0, 1)``.

    Args:
      ratio: ``r = T_u / T_c``.
      cv: Coefficient of variation of the compute time (0 = deterministic).
      size: Window length (static).

    Returns:
      ``(offset, pmf)`` with ``pmf[i] = P(K_i = offset + i)``, ``offset`` int32.
    """
    r = jnp.asarray(ratio, jnp.float32)
    cv = jnp.asarray(cv, jnp.float32)
    jitter, alpha = _safe_shape(cv)
    sd = jnp.sqrt(r * cv * cv + 0.25)
    k0 = jnp.maximum(jnp.floor(r - 8.0 * sd - 1.0), 0.0)
    j = k0 + jnp.arange(size, dtype=jnp.float32)  # j = k0 .. k0 + size - 1
    j_safe = jnp.maximum(j, 1.0)
    shape = j_safe * alpha
    upper = jnp.where(j > 0, _upper_partial(j_safe, shape, r), 0.0)   # E[(S_j - r)_+]
    lower = jnp.where(j > 0, _lower_partial(j_safe, shape, r), r)     # E[(r - S_j)_+]
    k = j[1:]  # tail at k = k0+1 .. k0+size-1 uses G_{k-1} - G_k
    tail_upper_form = 1.0 + upper[:-1] - upper[1:]
    tail_lower_form = lower[:-1] - lower[1:]
    tail_gamma = jnp.where(k <= r + 0.5, tail_upper_form, tail_lower_form)
    tail_det = jnp.clip(r - k + 1.0, 0.0, 1.0)
    tail = jnp.where(jitter, tail_gamma, tail_det)
    return k0.astype(jnp.int32), _pmf_from_tail(tail)


@functools.partial(jax.jit, static_argnames=("size",))
def staleness_pmf(q: jax.Array, cv: jax.Array, *, size: int = 256) -> tuple[jax.Array, jax.Array]:
    """pmf of the staleness ``S`` of a gradient (per gradient, not per update).

    ``S = 1 + ceil(Q - x)``, ``Q = T / T_u`` with ``T`` the gradient's compute time and ``x``
    uniform on ``[0, 1)`` independent of ``T``, so ``P(S >= 1 + m) = E[(Q - m + 1)_+] - E[(Q - m)_+]
    = 1 - (E[(m - Q)_+] - E[(m - 1 - Q)_+])``. For ``cv = 0``: ``P(S = floor(q) + 2) = frac(q)``,
    ``P(S = floor(q) + 1) = 1 - frac(q)``.

    Args:
      q: ``T_c / T_u``.
      cv: Coefficient of variation of the compute time.
      size: Window length (static).

    Returns:
      ``(offset, pmf)`` with ``pmf[i] = P(S = offset + i)``, ``offset >= 1`` int32.
    """
    q = jnp.asarray(q, jnp.float32)
    cv = jnp.asarray(cv, jnp.float32)
    jitter, alpha = _safe_shape(cv)
    s0 = jnp.maximum(jnp.floor(q + 1.0 - 6.0 * q * cv - 1.0), 1.0)
    m = s0 + jnp.arange(size, dtype=jnp.float32) - 1.0  # m = s0-1 .. s0+size-2
    upper = _upper_partial(q, alpha, m)
    lower = jnp.where(m > 0, _lower_partial(q, alpha, jnp.maximum(m, 1e-6)), 0.0)
    mt = m[1:]  # P(S >= 1 + mt) = P(S >= s) for s = s0+1 ..
    tail_upper_form = upper[:-1] - upper[1:]
    tail_lower_form = 1.0 - (lower[1:] - lower[:-1])
    tail_gamma = jnp.where(mt - 0.5 >= q, tail_upper_form, tail_lower_form)
    tail_det = jnp.clip(q - mt + 1.0, 0.0, 1.0)
    tail = jnp.where(jitter, tail_gamma, tail_det)
    return s0.astype(jnp.int32), _pmf_from_tail(tail)


@functools.partial(jax.jit, static_argnames=("size",))
def convolve_power(offset: jax.Array, pmf: jax.Array, n: jax.Array, *, size: int
                   ) -> tuple[jax.Array, jax.Array]:
    """pmf of the sum of ``n`` independent copies of a windowed pmf, on a window of ``size``.

    Uses ``FFT^{-1}(FFT(p)^n)`` on a ``size``-point grid, centred on the mean so that the
    characteristic function has a small phase (float32 stable) and the circular wrap-around is
    negligible when ``size`` exceeds about 14 standard deviations of the sum.

    Args:
      offset: int32 offset of ``pmf``.
      pmf: ``[W]`` pmf with ``W <= size``.
      n: Number of copies (integer valued; a float is allowed).
      size: Output window (static, a power of two is fastest).

    Returns:
      ``(offset, pmf)`` of the sum.
    """
    w = pmf.shape[-1]
    n = jnp.asarray(n, jnp.float32)
    idx = jnp.arange(w, dtype=jnp.float32)
    mean_in = jnp.sum(pmf * idx)
    c = jnp.round(mean_in)
    p = jnp.zeros((size,), jnp.float32).at[:w].set(pmf)
    p = jnp.roll(p, -c.astype(jnp.int32))  # centred: index 0 holds k = offset + c
    phi = jnp.fft.rfft(p)
    mag = jnp.abs(phi)
    safe = jnp.where(mag > 1e-30, phi, 1.0 + 0j)
    phi_n = jnp.where(mag > 1e-30, jnp.exp(n * jnp.log(safe)), 0.0)
    total = jnp.fft.irfft(phi_n, n=size)
    # float32 round-off leaves values of order 1e-9 everywhere: keep only the bins within 12
    # standard deviations of the mean (the variance of a sum of n i.i.d. copies is n Var).
    mean_rel = n * (mean_in - c)
    var_in = jnp.sum(pmf * (idx - mean_in) ** 2)
    reach = 12.0 * jnp.sqrt(n * var_in) + 2.0
    dist = jnp.abs(jnp.mod(jnp.arange(size, dtype=jnp.float32) - jnp.mod(mean_rel, size) + size / 2,
                           size) - size / 2)
    total = jnp.where((dist <= reach) & (total > 1e-7 * jnp.max(total)), total, 0.0)
    # total[j mod size] = P(sum - n (offset + c) = j); read the window centred on the mean.
    start_rel = jnp.round(mean_rel - size / 2)
    base = n * (offset.astype(jnp.float32) + c)
    start = jnp.maximum(base + start_rel, 0.0)
    rel = (start - base + jnp.arange(size, dtype=jnp.float32)).astype(jnp.int32)
    out = total[jnp.mod(rel, size)]
    return start.astype(jnp.int32), out / jnp.sum(out)


class Distributions(NamedTuple):
    """Mini-batch (in gradients per update, ``K = B / N_sub``) and staleness pmfs on windows.

    ``count_pmf[i] = P(K = count_offset + i)`` and ``staleness_pmf[i] = P(S = staleness_offset + i)``.
    Means are the exact closed forms; variances are taken from the pmfs (``Var K = N Var K_i``).
    """

    count_offset: jax.Array
    count_pmf: jax.Array
    staleness_offset: jax.Array
    staleness_pmf: jax.Array
    mean_count: jax.Array
    var_count: jax.Array
    mean_staleness: jax.Array
    var_staleness: jax.Array


def _moments(offset: jax.Array, pmf: jax.Array) -> tuple[jax.Array, jax.Array]:
    x = jnp.arange(pmf.shape[-1], dtype=jnp.float32)
    m = jnp.sum(pmf * x)
    return offset.astype(jnp.float32) + m, jnp.sum(pmf * (x - m) ** 2)


@functools.partial(jax.jit, static_argnames=("learner_size", "count_size", "staleness_size"))
def distributions(n_workers: jax.Array, t_compute_s: jax.Array, t_update_s: jax.Array,
                  cv: jax.Array = 0.0, *, learner_size: int = 128, count_size: int = 4096,
                  staleness_size: int = 1024) -> Distributions:
    """Mini-batch and staleness distributions of a configuration (see the module docstring).

    Args:
      n_workers: ``N`` learners (integer valued).
      t_compute_s: ``T_c``, mean learner time per sub-batch.
      t_update_s: ``T_u``, updater cycle.
      cv: Coefficient of variation of the learner time (gamma distributed; 0 = deterministic).
      learner_size: Window of one learner's count (static; see :func:`suggest_windows`).
      count_size: Window of the total count (static).
      staleness_size: Window of the staleness (static).

    Returns:
      :class:`Distributions`.
    """
    tc = jnp.asarray(t_compute_s, jnp.float32)
    tu = jnp.asarray(t_update_s, jnp.float32)
    n = jnp.asarray(n_workers, jnp.float32)
    r = tu / tc
    k_off, k_pmf = learner_count_pmf(r, cv, size=learner_size)
    c_off, c_pmf = convolve_power(k_off, k_pmf, n, size=count_size)
    s_off, s_pmf = staleness_pmf(tc / tu, cv, size=staleness_size)
    _, var_k = _moments(k_off, k_pmf)  # learners are independent: Var(K) = N Var(K_i)
    _, var_s = _moments(s_off, s_pmf)
    return Distributions(c_off, c_pmf, s_off, s_pmf, n * r, n * var_k, tc / tu + 1.0, var_s)


def suggest_windows(n_workers: float, t_compute_s: float, t_update_s: float, cv: float
                    ) -> dict[str, int]:
    """Static window sizes (powers of two) that hold the pmfs of a configuration.

    Sized from the standard deviations: one learner's count ``sqrt(r cv^2 + 1/4)``, the total
    ``sqrt(N)`` times that, the staleness ``q cv`` (``r = T_u / T_c``, ``q = 1 / r``). Take the
    maximum over a batch of configurations before vmapping.
    """
    r = float(t_update_s) / float(t_compute_s)
    q = 1.0 / r
    sd1 = math.sqrt(r * cv * cv + 0.25)
    pow2 = lambda x: int(2 ** math.ceil(math.log2(max(x, 8))))  # noqa: E731
    return {
        "learner_size": pow2(20.0 * sd1 + 8),
        "count_size": pow2(16.0 * math.sqrt(max(n_workers, 1.0)) * sd1 + 16),
        "staleness_size": pow2(20.0 * q * cv + 8),
    }


def delay_pmfs(n_workers: float, t_compute_s: float, t_update_s: float, cv: float = 0.0, *,
               max_staleness: int, max_count: int, tail: str = "lump"
               ) -> tuple[jax.Array, jax.Array]:
    """Staleness and mini-batch pmfs on fixed supports, for the asynchronous-staleness emulator.

    Args:
      n_workers: Learners ``N``.
      t_compute_s: Mean learner time ``T_c``.
      t_update_s: Updater cycle ``T_u``.
      cv: Coefficient of variation of the learner time (gamma jitter; 0 = deterministic).
      max_staleness: Largest staleness represented.
      max_count: Largest number of sub-batch gradients per update represented.
      tail: ``"lump"``: the mass above the maximum goes into the last entry (each pmf sums to 1);
        ``"truncate"``: it is dropped (the caller may renormalise).

    Returns:
      ``(staleness, count)``: ``staleness[s] = P(S = s)`` for ``s = 0..max_staleness`` (``S >= 1``
      under the default protocol, so ``staleness[0] = 0``) and ``count[k] = P(K = k)`` for
      ``k = 0..max_count``, the number of sub-batch gradients per update (mini-batch
      ``B = N_sub * K``; ``K = 0`` is an empty cycle). Both are float32 jnp arrays. Draw a
      gradient's delay from ``staleness`` and an update's size from ``count``.

    Raises:
      ConfigError: invalid timings or ``tail``.
    """
    validate_timings(n_workers, t_compute_s, t_update_s, cv)
    if tail not in ("lump", "truncate"):
        raise ConfigError("tail", tail, "one of lump, truncate")
    sizes = suggest_windows(n_workers, t_compute_s, t_update_s, cv)
    d = distributions(n_workers, t_compute_s, t_update_s, cv, **sizes)
    lump = tail == "lump"
    return (to_fixed_support(d.staleness_offset, d.staleness_pmf, max_staleness, lump=lump),
            to_fixed_support(d.count_offset, d.count_pmf, max_count, lump=lump))


def to_fixed_support(offset: jax.Array, pmf: jax.Array, max_value: int, *, lump: bool = True
                     ) -> jax.Array:
    """A windowed pmf on ``0..max_value``; the mass above ``max_value`` is lumped into the last
    entry (``lump=True``) or dropped."""
    idx = offset + jnp.arange(pmf.shape[-1])
    if lump:
        return jnp.zeros((max_value + 1,), pmf.dtype).at[jnp.clip(idx, 0, max_value)].add(pmf)
    return jnp.zeros((max_value + 1,), pmf.dtype).at[idx].add(pmf, mode="drop")


# ----------------------------------------------------------------------------------------------
# Python-side validation for launchers
# ----------------------------------------------------------------------------------------------


def finite_number(field: str, value: object, *, minimum: float = 0.0, allow_minimum: bool = False,
                  maximum: float = math.inf) -> float:
    """``float(value)`` if it is finite and ``minimum < value <= maximum`` (``>=`` with
    ``allow_minimum``); else :class:`~jaxsprint.errors.ConfigError` naming ``field``."""
    lo = f">= {minimum:g}" if allow_minimum else f"> {minimum:g}"
    allowed = f"a finite number {lo}" + (f" and <= {maximum:g}" if math.isfinite(maximum) else "")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(field, value, allowed) from None
    ok = math.isfinite(v) and (v >= minimum if allow_minimum else v > minimum) and v <= maximum
    if not ok:
        raise ConfigError(field, value, allowed)
    return v


def positive_int(field: str, value: object) -> int:
    """``int(value)`` if it is an integer >= 1 (an integral float is accepted, a bool is not); else
    :class:`~jaxsprint.errors.ConfigError` naming ``field``."""
    try:
        ok = not isinstance(value, bool) and float(value).is_integer() and float(value) >= 1
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ConfigError(field, value, "an integer >= 1")
    return int(value)


def validate_timings(n_workers: int, t_compute_s: float, t_update_s: float, cv: float = 0.0,
                     sub_batch: int = 1, dataset_size: int = IMAGENET_TRAIN_IMAGES) -> None:
    """Raises :class:`~jaxsprint.errors.ConfigError` naming the field when a timing configuration is invalid.

    Fields: ``workers``, ``t_compute``, ``t_update``, ``t_compute_cv`` (0..2), ``sub_batch``,
    ``dataset_size`` (the launchers' flag names).
    """
    positive_int("workers", n_workers)
    finite_number("t_compute", t_compute_s)
    finite_number("t_update", t_update_s)
    finite_number("t_compute_cv", cv, allow_minimum=True, maximum=2.0)
    positive_int("sub_batch", sub_batch)
    positive_int("dataset_size", dataset_size)


def validate_config(network: NetworkCost, machine: Machine, nodes: int, gpus_per_node: int,
                    sub_batch: int, dataset_size: int = IMAGENET_TRAIN_IMAGES) -> list[str]:
    """Checks a spec configuration; raises :class:`~jaxsprint.errors.ConfigError`, returns warnings.

    Errors: non-positive counts, more GPUs per node than the machine has, a sub-batch that does
    not fit the accelerator's memory. Warnings: more nodes than the real machine has.
    """
    nodes = positive_int("nodes", nodes)
    g = positive_int("gpus_per_node", gpus_per_node)
    b = positive_int("sub_batch", sub_batch)
    positive_int("dataset_size", dataset_size)
    g_max = int(float(machine.gpus_per_node))
    if g > g_max:
        raise ConfigError("gpus_per_node", g, f"1..{g_max} (the learners per node of machine={machine.name})")
    need = float(times.memory_bytes(network, b))
    have = float(machine.device_memory_bytes)
    if need > have:
        raise ConfigError("sub_batch", b, f"1..{times.max_sub_batch(network, machine)}: {need / 1e9:.1f} GB "
                                          f"needed for {network.name}, {have / 1e9:.1f} GB of accelerator "
                                          f"memory on machine={machine.name}")
    warnings = []
    if nodes > float(machine.max_nodes):
        warnings.append(f"nodes={nodes} exceeds the {int(float(machine.max_nodes))} nodes of "
                        f"{machine.name}: the prediction is for a hypothetical larger machine")
    return warnings


def pmf_items(offset: int, pmf: np.ndarray, scale: int = 1, threshold: float = 1e-9
              ) -> dict[str, float]:
    """``{str(scale * value): probability}`` for the entries above ``threshold`` (for JSON)."""
    pmf = np.asarray(pmf, np.float64)
    return {str(scale * (int(offset) + i)): float(f"{p:.9g}") for i, p in enumerate(pmf)
            if p > threshold}


__all__ = [
    "Distributions", "IMAGENET_TRAIN_IMAGES", "Prediction", "convolve_power", "delay_pmfs", "distributions",
    "finite_number", "learner_count_pmf", "pmf_items", "positive_int", "predict", "predict_from_timings",
    "staleness_pmf", "suggest_windows", "to_fixed_support", "validate_config", "validate_timings",
]
