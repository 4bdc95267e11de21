r"""The SPRINT performance model: epoch time, mini-batch and staleness of the asynchronous protocol.

Everything here is pure jnp (jit, vmap and grad work); Python-side checks live in
:func:`validate_timings` and :func:`validate_config` and are meant for launchers.

**Protocol** (docs/sprint-model.md, "The protocol this project models"): ``N`` learners each compute one
sub-batch gradient in a random time (mean ``T_c``, coefficient of variation ``cv``) and start again at once
with the newest weights; the updater's cycles of length ``T_u`` gather the gradients finished during the
previous cycle and publish one version each. Mini-batch ``B = N_sub K`` (``K`` the gradients gathered);
staleness ``S = u - 1 - v`` of a gradient read at version ``v`` and applied in version ``u``. Empty cycles
(``K = 0``) publish a version too and count as updates. ``T_c`` and ``T_u`` come from
:mod:`jaxsprint.perf.times` (a network's costs and a machine's figures) or are given measured.

**Epoch and means** (exact for any compute-time law): ``T_epoch = N_file T_c / (N N_sub)``, updates per epoch
``T_epoch / T_u``, ``E[B] = N_sub N T_u / T_c``, ``E[S] = T_c / T_u + 1`` (Little's law).

**Distributions**: ``K`` is the sum of ``N`` independent stationary renewal counts in a cycle (the exact
renewal identity, convolved as a power of the characteristic function on an FFT grid); ``S`` is a mixture
over a gradient's compute time of the deterministic two-point law (Palm calculus). The only approximation is
the compute-time family, **gamma with the given mean and cv**; ``cv = 0`` uses the exact deterministic forms.
Options: updater jitter (``update_cv``: gamma updater cycles, mixed over cells of exact probability) and a
shifted updater cycle (``update_shift_s``: a fixed part plus a gamma tail). Means stay exact in every case.

pmfs are returned on lattices ``offset + stride * i`` (power-of-two strides) with the mass outside a window
lumped into its end bins; where the exact form does not fit a window, a moment-matched discretised gamma on a
coarser lattice keeps memory bounded for any valid input. The derivations, the numerics and the limits are in
``docs/perf-model.md`` ("How the model works", "Updater jitter", "Limits and approximations at the edges").
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxsprint.errors import ConfigError
from jaxsprint.perf import renewal as rn
from jaxsprint.perf import times
from jaxsprint.perf.machines import Machine
from jaxsprint.perf.networks import NetworkCost
from jaxsprint.perf.pmf import pmf_items, to_fixed_support  # re-exported (they were defined here)

IMAGENET_TRAIN_IMAGES = 1_281_167


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
# Building blocks on unit-stride windows
# ----------------------------------------------------------------------------------------------


def _learner_pmf(w, cv, size: int):
    """``(k0, pmf)`` of one learner's count in a window ``w`` (units of ``T_c``), ``k0`` float."""
    sd = jnp.sqrt(w * cv * cv + 0.25)
    k0 = jnp.maximum(jnp.floor(w - 8.0 * sd - 1.0), 0.0)
    k = k0 + jnp.arange(1, size, dtype=jnp.float32)
    return k0, rn.pmf_from_tail(rn.renewal_tail(k, w, cv))


@functools.partial(jax.jit, static_argnames=("size",))
def learner_count_pmf(ratio: jax.Array, cv: jax.Array, *, size: int = 128
                      ) -> tuple[jax.Array, jax.Array]:
    """pmf of the gradients ``K_i`` one learner finishes in one updater cycle of fixed length.

    ``K_i`` is the count of a stationary renewal process (gamma intervals of mean 1 and
    coefficient of variation ``cv``) in a window of length ``ratio = T_u / T_c``:
    ``P(K_i >= k) = G_{k-1}(r) - G_k(r)`` with ``G_j(r) = E[(r - S_j)_+]`` and ``S_j`` the sum of
    ``j`` intervals (:func:`jaxsprint.perf.renewal.renewal_tail`). For ``cv = 0``:
    ``P(K_i >= k) = clip(r - k + 1, 0, 1)``. Valid while ``ratio < 2^24``.

    Args:
      ratio: ``r = T_u / T_c``.
      cv: Coefficient of variation of the compute time (0 = deterministic).
      size: Window length (static).

    Returns:
      ``(offset, pmf)`` with ``pmf[i] = P(K_i = offset + i)``, ``offset`` int32.
    """
    k0, pmf = _learner_pmf(jnp.asarray(ratio, jnp.float32), jnp.asarray(cv, jnp.float32), size)
    return k0.astype(jnp.int32), pmf


@functools.partial(jax.jit, static_argnames=("size",))
def staleness_pmf(q: jax.Array, cv: jax.Array, *, size: int = 256) -> tuple[jax.Array, jax.Array]:
    """pmf of the staleness ``S`` of a gradient (per gradient) with a fixed updater cycle.

    ``S = 1 + ceil(Q - x)``, ``Q = T / T_u`` with ``T`` the gradient's compute time and ``x``
    uniform on ``[0, 1)`` independent of ``T``, so ``P(S >= 1 + m) = E[(Q - m + 1)_+] - E[(Q - m)_+]
    = 1 - (E[(m - Q)_+] - E[(m - 1 - Q)_+])``. For ``cv = 0``: ``P(S = floor(q) + 2) = frac(q)``,
    ``P(S = floor(q) + 1) = 1 - frac(q)``. See :func:`distributions` for a jittered updater.

    Args:
      q: ``T_c / T_u``.
      cv: Coefficient of variation of the compute time.
      size: Window length (static).

    Returns:
      ``(offset, pmf)`` with ``pmf[i] = P(S = offset + i)``, ``offset >= 1`` int32.
    """
    q = jnp.asarray(q, jnp.float32)
    cv = jnp.asarray(cv, jnp.float32)
    s0 = jnp.maximum(jnp.floor(q - 6.0 * q * cv), 1.0)
    s = s0 + jnp.arange(1, size, dtype=jnp.float32)
    return s0.astype(jnp.int32), rn.pmf_from_tail(rn.staleness_tail_fixed_updater(s, q, cv))


@functools.partial(jax.jit, static_argnames=("size",))
def convolve_power(offset: jax.Array, pmf: jax.Array, n: jax.Array, *, size: int
                   ) -> tuple[jax.Array, jax.Array]:
    """pmf of the sum of ``n`` independent copies of a windowed pmf, on a window of ``size``.

    ``FFT^{-1}(FFT(p)^n)`` on a ``size``-point grid, centred on the mean so that the characteristic
    function has a small phase (float32 stable); the window starts ``size / 2`` below the mean.

    Args:
      offset: Offset of ``pmf``.
      pmf: ``[W]`` pmf with ``W <= size``.
      n: Number of copies (integer valued).
      size: Output window (static).

    Returns:
      ``(offset, pmf)`` of the sum (int32 offset).
    """
    n = jnp.asarray(n, jnp.float32)
    k0 = jnp.asarray(offset, jnp.float32)
    w = pmf.shape[-1]
    mean_in = jnp.sum(pmf * jnp.arange(w, dtype=jnp.float32))
    start = jnp.maximum(jnp.round(n * (k0 + mean_in) - size / 2), 0.0)
    cf, atom, idx = _sum_cf(k0, pmf, n, start, size)
    out = _from_cf(cf, size).at[idx].add(atom)
    return start.astype(jnp.int32), out / jnp.sum(out)


def _sum_cf(k0, pmf, n, out_offset, size: int):
    """rfft-convention cf of the sum of ``n`` copies of ``pmf`` (values ``k0 + j``), relative to
    ``out_offset`` on a ``size`` grid, and an atom kept out of the FFT.

    When the copies are nearly always 0 (``n P(K_i > 0) < 1/2``), the atom ``p_0^n`` at ``n k0`` is
    split off: ``phi^n - p_0^n = p_0^n expm1(n log1p(g / p_0))`` with ``g`` the cf of the mass
    above 0, so tiny probabilities (``n T_u / T_c = 10^-9``) survive float32. Returns
    ``(cf, atom_mass, atom_index)``.
    """
    w = pmf.shape[-1]
    omega = 2.0 * math.pi * jnp.arange(size // 2 + 1, dtype=jnp.float32) / size
    mean_in = jnp.sum(pmf * jnp.arange(w, dtype=jnp.float32))
    cen = jnp.round(mean_in)
    padded = jnp.zeros((size,), jnp.float32).at[:w].set(pmf)
    rolled = jnp.roll(padded, -cen.astype(jnp.int32))
    # phi - 1 = sum_j p_j (e^{-i omega (j - cen)} - 1), without the rounding of the mode's p near 1.
    phi_m1 = jnp.fft.rfft(rolled.at[0].set(0.0)) - (jnp.sum(pmf) - rolled[0])
    ok = jnp.abs(1.0 + phi_m1) > 1e-30
    log_phi = jnp.log1p(jnp.where(ok, phi_m1, 0j))
    shift = jnp.mod(n * (k0 + cen) - out_offset, size)
    full = jnp.where(ok, jnp.exp(n * log_phi - 1j * omega * shift), 0.0)
    # Atom path.
    p0 = pmf[0]
    mass_above = jnp.sum(pmf[1:])
    g = jnp.fft.rfft(padded.at[0].set(0.0))
    p0_safe = jnp.maximum(p0, 1e-30)
    p0_n = jnp.exp(n * jnp.log1p(-jnp.minimum(mass_above, 1.0 - 1e-7)))
    rest = p0_n * jnp.expm1(n * jnp.log1p(g / p0_safe)) * jnp.exp(-1j * omega * jnp.mod(-out_offset, size))
    use_atom = (k0 == 0) & (n * mass_above < 0.5) & (p0 > 0.5)
    atom_idx = jnp.clip(n * k0 - out_offset, 0, size - 1).astype(jnp.int32)
    return jnp.where(use_atom, rest, full), jnp.where(use_atom, p0_n, 0.0), atom_idx


def _from_cf(cf, size: int):
    """Inverse rfft, float32 round-off (below 3e-7 of the peak) and negative ripples removed."""
    x = jnp.fft.irfft(cf, n=size)
    return jnp.where(x > 3e-7 * jnp.max(x), x, 0.0)


# ----------------------------------------------------------------------------------------------
# Distributions
# ----------------------------------------------------------------------------------------------


class Distributions(NamedTuple):
    """Mini-batch (in gradients per update, ``K = B / N_sub``) and staleness pmfs on lattices.

    ``count_pmf[i] = P(K ~ count_offset + count_stride * i)`` (``count_stride = 1``: exactly
    ``P(K = count_offset + i)``; a power of two above 1: the mass of ``K`` rounded to the nearest
    lattice point), likewise for the staleness. Offsets and strides are float32 holding exact
    integers. Means are the exact closed forms; variances are taken from the pmfs.
    ``count_exact`` / ``staleness_exact``: whether the exact form was used (else the
    moment-matched discretised gamma; see the module docstring).
    """

    count_offset: jax.Array
    count_pmf: jax.Array
    staleness_offset: jax.Array
    staleness_pmf: jax.Array
    mean_count: jax.Array
    var_count: jax.Array
    mean_staleness: jax.Array
    var_staleness: jax.Array
    count_stride: jax.Array
    staleness_stride: jax.Array
    count_exact: jax.Array
    staleness_exact: jax.Array


def _moments(offset, stride, pmf):
    x = jnp.arange(pmf.shape[-1], dtype=jnp.float32)
    m = jnp.sum(pmf * x) / jnp.sum(pmf)
    return offset + stride * m, stride * stride * jnp.sum(pmf * (x - m) ** 2)


def _count(n, r, cv, ucv, shift, learner_size: int, size: int, m: int):
    """Count pmf: cells over the updater cycle ``L`` (``shift`` relative to ``T_u``), each the FFT
    power of one learner's pmf."""
    mean = n * r
    var_size = n * (cv * cv * r + jnp.minimum(r, 0.25)) + (n * r * ucv) ** 2
    lo, hi = rn.bounds(mean, var_size, 0.0)
    offset, stride = rn.lattice(lo, hi, size)
    w, c, h = rn.shifted_gamma_cells(r, ucv, shift, m)

    def node(c_m, h_m):
        k0, p = _learner_pmf(c_m, cv, learner_size)
        cf, atom, idx = _sum_cf(k0, p, n, offset, size)
        fits = 16.0 * jnp.sqrt(cv * cv * (c_m + h_m) + 0.25) + 8.0 <= learner_size
        var1 = jnp.where(fits, _moments(k0, 1.0, p)[1], rn.renewal_variance(c_m, cv))
        # The box shifts a node's law by +-n h: only where the whole law stays inside the window (no
        # wrap-around; where the law reaches 0, the spread of L changes probabilities, not positions).
        half = jnp.minimum(n * h_m, jnp.maximum(n * k0 - offset - 1.0, 0.0))
        return cf * rn.box_cf(half, size), atom, idx, fits, var1

    cf, atom, idx, fits, var1 = jax.vmap(node)(c, h)
    exact_pmf = _from_cf(jnp.sum(w[:, None] * cf, 0), size).at[idx].add(w * atom)
    exact_pmf = exact_pmf / jnp.sum(exact_pmf)
    exact = (stride == 1.0) & (hi < rn.FLOAT32_EXACT_INT) & jnp.all(fits | (w == 0))
    var = n * jnp.sum(w * var1) + (n * r * ucv) ** 2
    approx_pmf = rn.discretised_gamma(mean, var, 0.0, offset, stride, size)
    return offset, stride, jnp.where(exact, exact_pmf, approx_pmf), exact


def _staleness(q, cv, ucv, shift, size: int, m: int):
    """Staleness pmf: ``S = 1 + N_u(T)``, mixed over cells of ``Q = T / T_u`` (updater intervals
    ``shift + G`` in units of ``T_u``)."""
    mean = q + 1.0
    frac = q - jnp.floor(q)
    var_u = jnp.where(ucv > 0, rn.renewal_variance(q, ucv, shift),
                      jnp.where(q * cv >= 0.5, 1.0 / 6.0, frac * (1.0 - frac)))
    var = (q * cv) ** 2 + var_u
    lo, hi = rn.bounds(mean, (q * cv) ** 2 + ucv * ucv * q + jnp.minimum(q, 0.25), 1.0)
    offset, stride = rn.lattice(lo, hi, size, lower=1.0)
    s = offset + jnp.arange(1, size, dtype=jnp.float32)
    fixed = rn.pmf_from_tail(rn.staleness_tail_fixed_updater(s, q, cv))
    w, c, h = rn.gamma_cells(q, cv, m)

    def node(c_m, h_m):
        pmf = rn.pmf_from_tail(rn.renewal_tail(s - 1.0, c_m, ucv, shift))
        low_end = 1.0 + jnp.maximum(c_m - 8.0 * jnp.sqrt(c_m * ucv * ucv + 0.25) - 1.0, 0.0)
        half = jnp.minimum(h_m, jnp.maximum(low_end - offset - 1.0, 0.0))  # as in _count
        return jnp.fft.rfft(pmf) * rn.box_cf(half, size)

    mixed = _from_cf(jnp.sum(w[:, None] * jax.vmap(node)(c, h), 0), size)
    exact_pmf = jnp.where(ucv > 0, mixed, fixed)
    exact_pmf = exact_pmf / jnp.sum(exact_pmf)
    exact = (stride == 1.0) & (hi < rn.FLOAT32_EXACT_INT)
    approx_pmf = rn.discretised_gamma(mean, var, 1.0, offset, stride, size)
    return offset, stride, jnp.where(exact, exact_pmf, approx_pmf), exact


def distributions(n_workers: jax.Array, t_compute_s: jax.Array, t_update_s: jax.Array,
                  cv: jax.Array = 0.0, update_cv: jax.Array = 0.0, update_shift_s: jax.Array = 0.0, *,
                  learner_size: int = 128,
                  count_size: int = 4096, staleness_size: int = 1024, mix_nodes: int = 32
                  ) -> Distributions:
    """Mini-batch and staleness distributions of a configuration (see the module docstring).

    Jitted: compiled once per set of static sizes (the inputs are cast to float32 first), and it
    traces under an outer jit or vmap.

    Args:
      n_workers: ``N`` learners (integer valued).
      t_compute_s: ``T_c``, mean learner time per sub-batch.
      t_update_s: ``T_u``, mean updater cycle.
      cv: Coefficient of variation of the learner time (gamma distributed; 0 = deterministic).
      update_cv: Coefficient of variation of the updater cycle (0 = fixed cycles).
      update_shift_s: Fixed part ``s`` of the updater cycle, in ``[0, T_u)``: the cycle is
        ``s + G`` with ``G`` gamma of mean ``T_u - s`` and cv ``update_cv T_u / (T_u - s)`` (0 =
        a gamma cycle; checked by :func:`validate_timings`, not here).
      learner_size: Window of one learner's count (static; see :func:`suggest_windows`).
      count_size: Lattice size of the total count (static, >= ``learner_size``).
      staleness_size: Lattice size of the staleness (static).
      mix_nodes: Cells of the mixing variable when a law is mixed (static; 1 is enough when
        ``update_cv = 0``).

    Returns:
      :class:`Distributions`.
    """
    if learner_size > count_size:
        raise ConfigError("learner_size", learner_size, f"<= count_size={count_size}")
    # Every input as a float32 array, all six always passed: one compilation per window set, whatever
    # the callers' Python types (int / float / numpy scalar) and whichever arguments they leave out.
    args = (n_workers, t_compute_s, t_update_s, cv, update_cv, update_shift_s)
    return _distributions(*(jnp.asarray(a, jnp.float32) for a in args), learner_size=learner_size,
                          count_size=count_size, staleness_size=staleness_size, mix_nodes=mix_nodes)


@functools.partial(jax.jit, static_argnames=("learner_size", "count_size", "staleness_size", "mix_nodes"))
def _distributions(n, tc, tu, cv, ucv, shift_s, *, learner_size: int, count_size: int, staleness_size: int,
                   mix_nodes: int) -> Distributions:
    r, q = tu / tc, tc / tu
    shift = shift_s / tu
    c_off, c_stride, c_pmf, c_exact = _count(n, r, cv, ucv, shift, learner_size, count_size, mix_nodes)
    s_off, s_stride, s_pmf, s_exact = _staleness(q, cv, ucv, shift, staleness_size, mix_nodes)
    _, var_k = _moments(c_off, c_stride, c_pmf)
    _, var_s = _moments(s_off, s_stride, s_pmf)
    return Distributions(c_off, c_pmf, s_off, s_pmf, n * r, var_k, q + 1.0, var_s, c_stride, s_stride,
                         c_exact, s_exact)


# The two window sets of suggest_windows: few distinct static sizes, so compilations are reused.
SMALL_WINDOWS = {"learner_size": 64, "count_size": 256, "staleness_size": 256}
LARGE_WINDOWS = {"learner_size": 1024, "count_size": 4096, "staleness_size": 4096}


def suggest_windows(n_workers: float, t_compute_s: float, t_update_s: float, cv: float,
                    update_cv: float = 0.0, update_shift_s: float = 0.0) -> dict[str, int]:
    """Static sizes for :func:`distributions`: :data:`SMALL_WINDOWS` or :data:`LARGE_WINDOWS`.

    The small set is used when it holds both pmfs exactly, judged from the standard deviations
    (one learner's count ``sqrt(w cv^2 + 1/4)`` at the longest cycle cell ``w``; the total
    ``sqrt(N (cv^2 r + min(r, 1/4)) + (N r cv_u)^2)``; the staleness
    ``sqrt((q cv)^2 + q cv_u^2 + min(q, 1/4))``); otherwise the large one, beyond which
    :func:`distributions` uses coarser lattices (the moment-matched approximation), so memory and
    time stay bounded. ``mix_nodes`` is 1 without updater jitter, 64 with it. Take the maximum over
    a batch of configurations before vmapping. With a shift ``s`` the cycle's tail has cv
    ``update_cv / (1 - s / T_u)``, which lengthens the longest cell.
    """
    n, r = float(n_workers), float(t_update_s) / float(t_compute_s)
    q, cv, ucv = 1.0 / r, float(cv), float(update_cv)
    tail = 1.0 - float(update_shift_s) / float(t_update_s)
    w_max = r * (1.0 + 4.0 * ucv + 3.0 * ucv * ucv / tail)
    var_k = n * (cv * cv * r + min(r, 0.25)) + (n * r * ucv) ** 2
    var_s = (q * cv) ** 2 + q * ucv * ucv + min(q, 0.25)
    need = {"learner_size": 16.0 * math.sqrt(cv * cv * w_max + 0.25) + 8,
            "count_size": 16.0 * math.sqrt(var_k) + 20.0 * var_k / max(n * r, 1e-30) + 16,
            "staleness_size": 16.0 * math.sqrt(var_s) + 20.0 * var_s / max(q, 1e-30) + 16}
    small = all(need[k] <= v for k, v in SMALL_WINDOWS.items())
    return {**(SMALL_WINDOWS if small else LARGE_WINDOWS), "mix_nodes": 1 if ucv == 0 else 64}


def delay_pmfs(n_workers: float, t_compute_s: float, t_update_s: float, cv: float = 0.0,
               update_cv: float = 0.0, *, max_staleness: int, max_count: int, tail: str = "lump",
               update_shift_s: float = 0.0) -> tuple[jax.Array, jax.Array]:
    """Staleness and mini-batch pmfs on fixed supports, for the asynchronous-staleness emulator.

    Args:
      n_workers: Learners ``N``.
      t_compute_s: Mean learner time ``T_c``.
      t_update_s: Mean updater cycle ``T_u``.
      cv: Coefficient of variation of the learner time (gamma jitter; 0 = deterministic).
      update_cv: Coefficient of variation of the updater cycle (0 = fixed cycles).
      update_shift_s: Fixed part of the updater cycle (see :func:`distributions`).
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
    validate_timings(n_workers, t_compute_s, t_update_s, cv, update_cv=update_cv, update_shift_s=update_shift_s)
    if tail not in ("lump", "truncate"):
        raise ConfigError("tail", tail, "one of lump, truncate")
    sizes = suggest_windows(n_workers, t_compute_s, t_update_s, cv, update_cv, update_shift_s)
    d = distributions(n_workers, t_compute_s, t_update_s, cv, update_cv, update_shift_s, **sizes)
    lump = tail == "lump"
    return (to_fixed_support(d.staleness_offset, d.staleness_pmf, max_staleness, lump=lump,
                             stride=d.staleness_stride),
            to_fixed_support(d.count_offset, d.count_pmf, max_count, lump=lump, stride=d.count_stride))


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


# Documented limits of the model's inputs (docs/perf-model.md, "Limits").
MAX_WORKERS = 10 ** 7
MIN_RATIO, MAX_RATIO = 1e-10, 1e10      # T_u / T_c
MIN_TIME_S, MAX_TIME_S = 1e-30, 1e30    # float32 keeps them normal
MAX_CV, MAX_UPDATE_CV = 2.0, 2.0
MAX_UPDATE_TAIL_CV = 4.0                # cv of G in a shifted updater cycle shift + G


def validate_timings(n_workers: int, t_compute_s: float, t_update_s: float, cv: float = 0.0,
                     sub_batch: int = 1, dataset_size: int = IMAGENET_TRAIN_IMAGES, *,
                     update_cv: float = 0.0, update_shift_s: float = 0.0) -> None:
    """Raises :class:`~jaxsprint.errors.ConfigError` naming the field when a timing configuration is invalid.

    Fields (the launchers' flag names): ``workers`` (integer 1..10^7), ``t_compute``, ``t_update``
    (finite, in [1e-30, 1e30] s, ``T_u / T_c`` in [1e-10, 1e10]), ``t_compute_cv`` (0..2),
    ``t_update_cv`` (0..2), ``t_update_shift`` (``update_shift_s`` in ``[0, T_u)``, and the cycle's
    tail cv ``update_cv T_u / (T_u - shift)`` at most 4), ``sub_batch``, ``dataset_size``.
    """
    n = positive_int("workers", n_workers)
    if n > MAX_WORKERS:
        raise ConfigError("workers", n_workers, f"an integer >= 1 and <= {MAX_WORKERS:g}")
    tc = finite_number("t_compute", t_compute_s)
    tu = finite_number("t_update", t_update_s)
    for field, value, v in (("t_compute", t_compute_s, tc), ("t_update", t_update_s, tu)):
        if not MIN_TIME_S <= v <= MAX_TIME_S:
            raise ConfigError(field, value, f"a finite number > 0 in [{MIN_TIME_S:g}, {MAX_TIME_S:g}] (seconds)")
    if not MIN_RATIO <= tu / tc <= MAX_RATIO:
        raise ConfigError("t_update", t_update_s, f"a time with t_update / t_compute in [{MIN_RATIO:g}, "
                                                  f"{MAX_RATIO:g}] (t_compute={t_compute_s!r})")
    finite_number("t_compute_cv", cv, allow_minimum=True, maximum=MAX_CV)
    ucv = finite_number("t_update_cv", update_cv, allow_minimum=True, maximum=MAX_UPDATE_CV)
    shift = finite_number("t_update_shift", update_shift_s, allow_minimum=True)
    if not shift < tu:
        raise ConfigError("t_update_shift", update_shift_s, f"a finite number >= 0 and < t_update={t_update_s!r}")
    if ucv * tu / (tu - shift) > MAX_UPDATE_TAIL_CV:
        raise ConfigError("t_update_shift", update_shift_s,
                          f"a shift that leaves the cycle's tail a cv t_update_cv * t_update / (t_update - "
                          f"t_update_shift) <= {MAX_UPDATE_TAIL_CV:g} (t_update_cv={update_cv!r})")
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


__all__ = [
    "Distributions", "IMAGENET_TRAIN_IMAGES", "Prediction", "convolve_power", "delay_pmfs", "distributions",
    "LARGE_WINDOWS", "MAX_CV", "MAX_RATIO", "MAX_UPDATE_CV", "MAX_UPDATE_TAIL_CV", "MAX_WORKERS", "MIN_RATIO", "SMALL_WINDOWS",
    "finite_number", "learner_count_pmf", "pmf_items", "positive_int", "predict", "predict_from_timings",
    "staleness_pmf", "suggest_windows", "to_fixed_support", "validate_config", "validate_timings",
]
