r"""Building blocks of the SPRINT model (:mod:`jaxsprint.perf.sprint`): gamma laws, stationary
renewal counts, mixing cells, lattices and a moment-matched discretised gamma. Pure jnp, float32.

**Gamma laws** are parametrised by their mean and shape ``a = 1 / cv^2``. CDFs use XLA's
regularised incomplete gamma for shapes up to 100 and the Wilson-Hilferty normal approximation
(error below 6e-5) above. Arguments are passed as a relative deviation ``d = x / mean - 1`` or an
absolute difference ``x - mean`` computed by the caller from exact float32 integers, so that
windows far from 0 (counts of 10^7) keep their unit resolution.

**Stationary renewal count.** For a renewal process with gamma intervals of mean 1 and shape
``alpha`` observed from a time independent of it, the count ``K(w)`` in a window ``w`` obeys the
exact identity (Cox, *Renewal Theory*, 1962, sec. 4.1) ``P(K(w) >= k) = G_{k-1}(w) - G_k(w)``,
``G_j(w) = E[(w - S_j)_+]``, ``S_j`` the sum of ``j`` intervals (gamma of shape ``j alpha``). Its
mean is ``w`` and its variance ``cv^2 w + (1 - cv^4)/6 + o(1)`` (from the Laplace transform of the
renewal function: ``Var K = w - w^2 + 2 int_0^w m(u) du`` and ``int_0^w m = w^2/2 + (mu_2/2 - 1) w
+ mu_2^2/4 - mu_3/6 + o(1)`` with ``mu_k`` the raw moments of an interval; the constant is ``1/6``
for deterministic intervals (the average of ``frac(w)(1 - frac(w))``) and 0 for Poisson).

**Mixing cells.** A gamma mixing variable (a window length) is split into ``M`` cells of about
equal probability; each cell carries its exact probability, its exact conditional mean (so the
mixture's mean is exact) and a box of half-width ``h`` centred on that mean which stands for the
spread inside the cell.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import jax
from jax.scipy.special import gammaln, ndtr, ndtri

GAMMA_EXACT_MAX_SHAPE = 100.0
# Largest integer below which every integer is a float32: lattices of unit stride stay below it.
FLOAT32_EXACT_INT = float(2 ** 24)


# ----------------------------------------------------------------------------------------------
# Gamma law (mean 1, shape a)
# ----------------------------------------------------------------------------------------------


def _log1p_minus(d, t=None):
    """``log(1 + d) - d`` without cancellation for small ``|d|`` (atanh series); ``t = 1 + d``
    if the caller has it more accurately (``d`` near -1)."""
    u = d / (2.0 + d)
    u2 = u * u
    series = -u * d + 2.0 * u * u2 * (1 / 3 + u2 * (1 / 5 + u2 * (1 / 7 + u2 * (1 / 9 + u2 * (
        1 / 11 + u2 * (1 / 13 + u2 * (1 / 15 + u2 / 17)))))))
    safe_d = jnp.where(jnp.abs(d) < 0.4, 0.5, d)
    if t is None:
        direct = jnp.log1p(safe_d) - safe_d
    else:
        direct = jnp.log(jnp.where(jnp.abs(d) < 0.4, 1.5, jnp.maximum(t, 1e-38))) - safe_d
    return jnp.where(jnp.abs(d) < 0.4, series, direct)


def _stirling_log_ratio(a):
    """``a log a - a - lgamma(a)`` accurately for large ``a``."""
    a_big = jnp.maximum(a, 10.0)
    inv = 1.0 / a_big
    corr = inv * (1 / 12 - inv * inv * (1 / 360 - inv * inv / 1260))
    big = 0.5 * jnp.log(a_big / (2 * math.pi)) - corr
    a_small = jnp.minimum(a, 10.0)
    small = a_small * jnp.log(a_small) - a_small - gammaln(a_small)
    return jnp.where(a >= 10.0, big, small)


_SERIES_TERMS, _FRACTION_TERMS = 112, 64


def incomplete_gamma(a, d, t=None):
    """Regularised ``(P(a, x), Q(a, x))`` at ``x = a (1 + d)`` for ``0 < a <= ~101``.

    Series for ``x < a + 1`` and Lentz's continued fraction above (Numerical Recipes, sec. 6.2),
    each with a fixed number of terms (enough for float32 at these shapes) so that the loops
    compile in a fraction of a second, unlike XLA's general ``igamma``; the prefactor
    ``x^a e^{-x} / Gamma(a)`` is ``exp(a (log(1 + d) - d) + a log a - a - lgamma(a))``, free of
    cancellation for large ``a``.
    """
    a = jnp.asarray(a, jnp.float32)
    t = jnp.maximum(1.0 + d, 0.0) if t is None else t
    x = a * t
    pre = jnp.exp(a * _log1p_minus(d, t) + _stirling_log_ratio(a))   # x^a e^-x / Gamma(a)
    lower_side = x < a + 1.0
    xs = jnp.where(lower_side, x, 0.0)

    def series_step(n, carry):
        term, total = carry
        term = term * xs / (a + n)
        return term, total + term

    one = jnp.ones_like(x)
    _, series = jax.lax.fori_loop(1, _SERIES_TERMS, series_step, (one, one))
    p_series = pre / a * series
    xc = jnp.where(lower_side, a + 2.0, x)
    tiny = 1e-30
    b = xc + 1.0 - a
    dd = 1.0 / b
    init = (b, 1.0 / tiny * one, dd, dd)

    def fraction_step(i, carry):
        b, c, dd, h = carry
        an = -i * (i - a)
        b = b + 2.0
        dd = an * dd + b
        dd = jnp.where(jnp.abs(dd) < tiny, tiny, dd)
        c = b + an / c
        c = jnp.where(jnp.abs(c) < tiny, tiny, c)
        dd = 1.0 / dd
        return b, c, dd, h * dd * c

    h = jax.lax.fori_loop(1, _FRACTION_TERMS, fraction_step, init)[3]
    q_fraction = pre * h
    p = jnp.where(lower_side, p_series, 1.0 - q_fraction)
    q = jnp.where(lower_side, 1.0 - p_series, q_fraction)
    return jnp.clip(p, 0.0, 1.0), jnp.clip(q, 0.0, 1.0)


def gamma_parts(a, d, t=None):
    """CDF, survival and ``t f(t) / a`` of Gamma(shape ``a``, mean 1) at ``t = 1 + d >= 0``
    (``t`` passed too where it is known more accurately than ``1 + d``, i.e. near 0)."""
    d = jnp.maximum(d, -1.0)
    t = jnp.maximum(1.0 + d, 0.0) if t is None else jnp.maximum(t, 0.0)
    tf = jnp.exp(a * _log1p_minus(d, t) + _stirling_log_ratio(a))  # t f(t)
    g = tf / a
    a_lo = jnp.minimum(a, GAMMA_EXACT_MAX_SHAPE)
    lo = a <= GAMMA_EXACT_MAX_SHAPE
    cdf_lo, sf_lo = incomplete_gamma(a_lo, jnp.where(lo, d, 0.0), jnp.where(lo, t, 1.0))
    a_hi = jnp.maximum(a, GAMMA_EXACT_MAX_SHAPE)
    cube_root_m1 = jnp.expm1(jnp.log1p(jnp.maximum(d, -0.999999)) / 3.0)
    z = 3.0 * jnp.sqrt(a_hi) * (cube_root_m1 + 1.0 / (9.0 * a_hi))
    exact = a <= GAMMA_EXACT_MAX_SHAPE
    return jnp.where(exact, cdf_lo, ndtr(z)), jnp.where(exact, sf_lo, ndtr(-z)), g


def partials(mean, a, diff, c=None):
    """``(E[(c - X)_+], E[(X - c)_+])`` for ``X ~ Gamma(shape a, mean)``, ``c = mean + diff``
    (one evaluation of the incomplete gamma for both; pass ``c`` too when it is small)."""
    cdf, sf, g = gamma_parts(a, diff / mean, None if c is None else c / mean)
    return diff * cdf + mean * g, -diff * sf + mean * g


def lower_partial(mean, a, diff):
    """``E[(c - X)_+]`` for ``X ~ Gamma(shape a, mean)`` and ``c = mean + diff``."""
    return partials(mean, a, diff)[0]


def upper_partial(mean, a, diff):
    """``E[(X - c)_+]`` for ``X ~ Gamma(shape a, mean)`` and ``c = mean + diff``."""
    return partials(mean, a, diff)[1]


def shape_of(cv):
    """``(jitter, 1 / cv^2)`` with a safe shape where ``cv = 0``."""
    jitter = cv > 0
    cv_safe = jnp.where(jitter, cv, 1.0)
    return jitter, 1.0 / (cv_safe * cv_safe)


def tail_shape(cv, shift):
    """``(jitter, shape)`` of the gamma tail ``G`` of an interval ``shift + G`` of mean 1 and cv ``cv``:
    ``G`` has mean ``1 - shift`` and cv ``cv / (1 - shift)``, so shape ``((1 - shift) / cv)^2``
    (``shift = 0``: :func:`shape_of`, bit for bit)."""
    jitter, alpha = shape_of(cv)
    one_minus = 1.0 - shift
    return jitter, alpha * one_minus * one_minus


# ----------------------------------------------------------------------------------------------
# Stationary renewal count
# ----------------------------------------------------------------------------------------------


def integer_part_tail(k, w):
    """``clip(w - k + 1, 0, 1)`` for integer ``k`` without float32 absorbing a tiny ``frac(w)``."""
    fl = jnp.floor(w)
    return jnp.where(k <= fl, 1.0, jnp.where(k == fl + 1.0, w - fl, 0.0))


def renewal_tail(k, w, cv, shift=0.0):
    """``P(K(w) >= k)`` of a stationary renewal process with (shifted) gamma intervals (mean 1, ``cv``).

    ``k``: consecutive integers ``k0 + 1 .. k0 + W - 1`` (float array); ``w``: window (scalar).
    Uses ``1 + U_{k-1} - U_k`` with ``U_j = E[(S_j - w)_+]`` below the mean and ``G_{k-1} - G_k``
    above it, both small there, so float32 does not cancel. ``cv = 0``: ``clip(w - k + 1, 0, 1)``.

    ``shift`` in ``[0, 1)``: each interval is ``shift + G`` with ``G`` gamma of mean ``1 - shift``
    (:func:`tail_shape`). Cox's identity holds for any interval law, and a sum of ``j`` intervals is
    ``j shift + Gamma(mean j (1 - shift), shape j a_G)``, so ``G_j(w) = E[(c - Gamma)_+]`` and
    ``U_j = E[(Gamma - c)_+]`` at ``c = w - j shift`` (the difference to the sum's mean, ``w - j``,
    is the same as without a shift; ``c <= 0`` gives ``G_j = 0``, ``U_j = j - w``).
    """
    jitter, alpha = tail_shape(cv, shift)
    j = jnp.concatenate([k[:1] - 1.0, k])          # j = k0 .. k0 + W - 1
    safe = jnp.maximum(j, 1.0)
    g_lo, u_up = partials(safe * (1.0 - shift), safe * alpha, w - safe, jnp.maximum(w - safe * shift, 0.0))
    g_lo = jnp.where(j > 0, g_lo, w)               # G_0(w) = w
    u_up = jnp.where(j > 0, u_up, 0.0)             # U_0 = 0
    upper = 1.0 + u_up[:-1] - u_up[1:]
    lower = g_lo[:-1] - g_lo[1:]
    tail = jnp.where(k <= w + 0.5, upper, lower)
    det = integer_part_tail(k, w)
    return jnp.where(k <= 0, 1.0, jnp.clip(jnp.where(jitter, tail, det), 0.0, 1.0))


def renewal_variance(w, cv, shift=0.0):
    """Asymptotic variance ``cv^2 w + C`` of the count in a long window, floored at the Bernoulli
    bound ``w (1 - w)`` for short ones and, with a shift, at ``cv^2 w / 2`` (used to size windows and for the
    moment-matched approximation).

    ``C = mu_2^2 / 2 - mu_3 / 3 = 1/6 + cv^4 / 2 - k_3 / 3`` with ``k_3`` the third central moment
    of an interval: ``2 cv^4`` for a gamma (``C = (1 - cv^4) / 6``), ``2 cv^4 / (1 - shift)`` for
    ``shift + G``.
    """
    c2 = cv * cv
    const = (1.0 - c2 * c2) / 6.0 - 2.0 * c2 * c2 / 3.0 * (1.0 / (1.0 - shift) - 1.0)  # shift 0: exactly
    floor = jnp.where(shift > 0, 0.5 * c2 * w, 0.0)  # C < 0 for bursty tails: keep the linear term
    return jnp.maximum(jnp.maximum(c2 * w + const, floor), jnp.maximum(w * (1.0 - w), 0.0))


def pmf_from_tail(tail):
    """pmf on ``[k0, k0 + W)`` from ``P(X >= k)`` at ``k0+1 .. k0+W-1``; tails lumped at the ends."""
    ones = jnp.ones(tail.shape[:-1] + (1,), tail.dtype)
    zeros = jnp.zeros(tail.shape[:-1] + (1,), tail.dtype)
    tail = jnp.clip(tail, 0.0, 1.0)
    return jnp.maximum(jnp.concatenate([ones, tail], -1) - jnp.concatenate([tail, zeros], -1), 0.0)


def staleness_tail_fixed_updater(s, q, cv):
    """``P(S >= s)`` at consecutive ``s`` for a fixed updater: ``S = 1 + ceil(Q - x)``, ``Q ~ Gamma(q, cv)``.

    ``P(S >= 1 + m) = E[(Q - m + 1)_+] - E[(Q - m)_+] = 1 - (E[(m - Q)_+] - E[(m - 1 - Q)_+])``,
    each form used where its terms are small; ``cv = 0``: ``clip(q - m + 1, 0, 1)``.
    """
    jitter, alpha = shape_of(cv)
    m = s - 1.0
    x = jnp.concatenate([m[:1] - 1.0, m])          # x = m - 1 for the first, then m
    low, up = partials(q, alpha, x - q, jnp.maximum(x, 0.0))  # E[(x - Q)_+], E[(Q - x)_+]
    low = jnp.where(x > 0, low, 0.0)
    upper = up[:-1] - up[1:]
    lower = 1.0 - (low[1:] - low[:-1])
    tail = jnp.where(m - 0.5 >= q, upper, lower)
    det = integer_part_tail(m, q)
    return jnp.where(m <= 0, 1.0, jnp.clip(jnp.where(jitter, tail, det), 0.0, 1.0))


def bounds(mean, var, lower):
    """Range ``[lo, hi]`` that holds a law of this mean and variance (gamma-like upper tail)."""
    sd = jnp.sqrt(var)
    excess = jnp.maximum(mean - lower, 1e-30)
    hi = mean + jnp.maximum(8.0 * sd, 20.0 * var / excess) + 4.0
    lo = jnp.maximum(mean - 8.0 * sd - 4.0, lower)
    return lo, hi


# ----------------------------------------------------------------------------------------------
# Mixing cells of a gamma variable
# ----------------------------------------------------------------------------------------------


def _approx_quantile(a, u):
    """Approximate quantile of Gamma(shape a, mean 1): Wilson-Hilferty, or the lower-tail power
    law ``(u Gamma(a + 1))^{1/a} / a`` where that is larger (small shapes)."""
    z = ndtri(u)
    wh = jnp.maximum(1.0 - 1.0 / (9.0 * a) + z / (3.0 * jnp.sqrt(a)), 0.0) ** 3
    low = jnp.exp((jnp.log(u) + gammaln(a + 1.0)) / a) / a
    return jnp.maximum(wh, jnp.minimum(low, 1.0))


def gamma_cells(mean, cv, m: int):
    """``M`` cells of ``X ~ Gamma(mean, cv)``: probabilities, conditional means, box half-widths.

    Edges are approximate quantiles ``j / M``; the probabilities and the conditional means are
    exact (regularised incomplete gamma of shapes ``a`` and ``a + 1``, since
    ``x f_a(x) = mean f_{a+1}(x)``), so the mixture's total probability and mean are exact. For
    shapes above 100 the normal law with the same mean and sd is used (truncated-normal means). A
    box of half-width ``min(c - lo, hi - c)`` about the conditional mean ``c`` stands for the spread
    inside the cell (the other side for the outer cells). ``cv = 0`` (or ``m = 1``): one cell of
    probability 1 at the mean with no width (the other cells get probability 0).
    """
    jitter, a = shape_of(cv)
    if m == 1:
        one = jnp.ones((1,), jnp.float32)
        sd = jnp.where(jitter, cv, 0.0) * mean
        return one, mean * one, jnp.sqrt(3.0) * sd * one  # a box with the law's variance
    u = jnp.arange(1, m, dtype=jnp.float32) / m
    # Gamma cells (shape <= 100).
    a_lo = jnp.minimum(a, GAMMA_EXACT_MAX_SHAPE)
    e = _approx_quantile(a_lo, u)
    e = jnp.concatenate([jnp.zeros((1,)), e, jnp.full((1,), jnp.inf)])
    e_fin = jnp.where(jnp.isinf(e), 1e30, e)
    shapes = jnp.stack([a_lo, a_lo + 1.0])[:, None]
    tt = a_lo * e_fin[None, :] / shapes
    both = incomplete_gamma(shapes, tt - 1.0, tt)[0]
    p, p1 = both[0], both[1]
    w_g = jnp.diff(p)
    c_g = jnp.diff(p1) / jnp.maximum(w_g, 1e-30)
    lo_g, hi_g = e[:-1], e[1:]
    # Normal cells (shape > 100): edges equally spaced in probability too.
    s = 1.0 / jnp.sqrt(jnp.maximum(a, GAMMA_EXACT_MAX_SHAPE))
    z = jnp.concatenate([jnp.full((1,), -jnp.inf), ndtri(u), jnp.full((1,), jnp.inf)])
    phi = jnp.where(jnp.isinf(z), 0.0, jnp.exp(-0.5 * jnp.where(jnp.isinf(z), 0.0, z) ** 2)
                    / math.sqrt(2 * math.pi))
    w_n = jnp.diff(ndtr(z))
    c_n = 1.0 + s * (phi[:-1] - phi[1:]) / jnp.maximum(w_n, 1e-30)
    lo_n, hi_n = 1.0 + s * z[:-1], 1.0 + s * z[1:]
    normal = a > GAMMA_EXACT_MAX_SHAPE
    w = jnp.where(normal, w_n, w_g)
    c = jnp.where(normal, c_n, c_g)
    lo, hi = jnp.where(normal, lo_n, lo_g), jnp.where(normal, hi_n, hi_g)
    left, right = c - lo, hi - c
    half = jnp.where(jnp.isinf(left), right, jnp.where(jnp.isinf(right), left, jnp.minimum(left, right)))
    half = jnp.clip(half, 0.0, c)  # the box stays on x >= 0
    # Where the weights do not sum to one exactly (float32), renormalise; keep the mean exact.
    w = w / jnp.sum(w)
    c = c / jnp.sum(w * c)
    point = jnp.zeros((m,)).at[0].set(1.0)
    w = jnp.where(jitter, w, point)
    c = jnp.where(jitter, c, 1.0)
    half = jnp.where(jitter, half, 0.0)
    return w, mean * c, mean * half


def shifted_gamma_cells(mean, cv, shift, m: int):
    """:func:`gamma_cells` of ``X = mean shift + G``, ``G ~ Gamma(mean (1 - shift), cv / (1 - shift))``
    (``X`` has the given mean and cv; ``shift`` in ``[0, 1)`` is relative to the mean): the cells of
    ``G`` moved by ``mean shift`` (probabilities, widths unchanged; the mixture's mean stays exact)."""
    one_minus = 1.0 - shift
    w, c, h = gamma_cells(mean * one_minus, cv / one_minus, m)
    return w, c + mean * shift, h


def box_cf(half, size: int):
    """rfft of a uniform on ``[-half, half]`` put on the integer lattice by linear interpolation
    (each point's mass goes to its two neighbours): a nonnegative kernel of mean 0 and finite
    support, so it neither rings nor wraps around (a continuous ``sinc`` would). ``half = 0``: the
    unit kernel."""
    k = jnp.arange(size, dtype=jnp.float32)
    k = jnp.where(k > size // 2, k - size, k)
    h = jnp.maximum(half, 1e-6)

    def hat_cdf(y):  # integral of max(0, 1 - |u|) from -inf to y
        return jnp.where(y < -1.0, 0.0, jnp.where(y < 0.0, 0.5 * (y + 1.0) ** 2,
                                                  jnp.where(y < 1.0, 1.0 - 0.5 * (1.0 - y) ** 2, 1.0)))

    kernel = (hat_cdf(k + h) - hat_cdf(k - h)) / (2.0 * h)
    return jnp.fft.rfft(kernel / jnp.sum(kernel))


# ----------------------------------------------------------------------------------------------
# Lattices and the moment-matched discretised gamma
# ----------------------------------------------------------------------------------------------


def lattice(lo, hi, size: int, lower=0.0):
    """Lattice ``offset + stride * i`` (``i < size``) covering ``[lo, hi]``.

    ``stride`` is a power of two, at least 1 and at least the float32 spacing at ``hi``;
    ``offset`` is a multiple of ``stride``, or ``lower`` where that multiple would fall below it
    (the lattice never holds impossible values). Returns ``(offset, stride)`` as float32.
    """
    lo = jnp.maximum(lo, lower)
    width = jnp.maximum(hi - lo, 1.0)
    need = jnp.ceil(jnp.log2(width / (size - 2)))
    ulp = jnp.floor(jnp.log2(jnp.maximum(hi, 1.0))) - 23.0
    k = jnp.maximum(jnp.maximum(need, ulp), 0.0).astype(jnp.int32)
    stride = jnp.ldexp(jnp.float32(1.0), k)
    offset = jnp.maximum(jnp.floor(lo / stride) * stride, lower)
    return offset, stride


def discretised_gamma(mean, var, lower, offset, stride, size: int):
    """pmf on the lattice ``offset + stride * i`` of ``lower + Gamma(mean - lower, var)`` rounded
    to the nearest lattice point (bins ``[x - stride/2, x + stride/2)``; outer bins unbounded).

    ``mean`` and ``var`` are the moments of the variable itself; the offset from ``lower`` is
    computed from exact float32 differences so that huge means keep their resolution.
    """
    m = jnp.maximum(mean - lower, 1e-30)
    a = jnp.clip(m * m / jnp.maximum(var, 1e-30), 1e-3, 1e30)
    i = jnp.arange(1, size, dtype=jnp.float32)
    diff = (offset - mean) + stride * (i - 0.5)   # edge - mean
    cdf, _, _ = gamma_parts(a, diff / m, jnp.maximum(offset - lower + stride * (i - 0.5), 0.0) / m)
    cdf = jnp.where(diff + m <= 0.0, 0.0, cdf)
    return pmf_from_tail(1.0 - cdf)


__all__ = ["FLOAT32_EXACT_INT", "GAMMA_EXACT_MAX_SHAPE", "bounds", "box_cf", "incomplete_gamma", "discretised_gamma", "gamma_cells",
           "gamma_parts", "integer_part_tail", "lattice", "lower_partial", "partials", "pmf_from_tail", "renewal_tail", "renewal_variance",
           "shape_of", "shifted_gamma_cells", "staleness_tail_fixed_updater", "tail_shape", "upper_partial"]
