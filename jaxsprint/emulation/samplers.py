"""Random draws of the asynchronous-SGD emulator: staleness samplers and the random mini-batch.

Two quantities are random in SPRINT: the staleness ``tau`` of the gradient applied at an update, and the number
``K`` of sub-batch gradients gathered into it. This module holds their distributions, independent of any
optimizer: a :class:`Sampler` is a pure function of a PRNG key returning an int32 in ``{0..max_value}``
(:func:`constant`, :func:`uniform`, :func:`geometric`, :func:`from_pmf`, :func:`sampler_from_perf_model`),
and :func:`minibatch_weights` turns a draw of ``K`` into weights over the sub-batches of a fixed global batch.
:mod:`jaxsprint.emulation.staleness` consumes the staleness samplers in its delayed-gradient transform.

Staleness convention: ``tau = 0`` is synchronous SGD, as in the performance model (``docs/perf-model.md``,
"The protocol": "S = u - 1 - v"), so a predicted staleness pmf indexes directly as ``pmf[tau]``. Mini-batch convention:
``k_pmf[k] = P(K = k)`` with ``k_pmf[0] = 0`` (an update uses at least one sub-batch).

Samplers are configuration: they are built (and validated) outside jit from concrete numbers, and every
invalid input raises :class:`jaxsprint.errors.ConfigError` naming the argument, the value and what is allowed.

References:
    Zhang, Gupta, Lian, Liu. "Staleness-aware Async-SGD for Distributed Deep Learning", IJCAI 2016
    (arXiv:1511.05950).
    Oyama, Nomura, Sato, Nishimura, Tamatsu, Matsuoka. "Predicting statistics of asynchronous SGD
    parameters for a large-scale distributed deep learning system on GPU supercomputers", IEEE BigData 2016.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

from jaxsprint.errors import ConfigError, is_int, is_real

__all__ = [
    "SAMPLERS",
    "PMF_SUM_ATOL",
    "Sampler",
    "PmfSampler",
    "constant",
    "uniform",
    "geometric",
    "from_pmf",
    "sampler_from_perf_model",
    "nonempty_staleness_pmf",
    "as_sampler",
    "check_nonneg_int",
    "check_nonneg_real",
    "check_pmf",
    "MinibatchDraw",
    "minibatch_weights",
    "example_weights",
    "weighted_mean",
]

# The kinds of staleness distribution a configuration names (``config.async_emulation.sampler``), one per
# factory below: constant, uniform, geometric, from_pmf ("pmf") and sampler_from_perf_model ("perf_model").
SAMPLERS = ("constant", "uniform", "geometric", "pmf", "perf_model")

# Default tolerance on |sum(pmf) - 1|. Loose enough for a float32 pmf from the performance model (a few
# hundred entries, each rounded to ~6e-8 relative), tight enough to catch a pmf that is not normalised at all.
PMF_SUM_ATOL = 1e-5


# --------------------------------------------------------------------------------------------------------
# Validation: every error names the field, the value and what is allowed. Public so that configuration
# checks (``jaxsprint.emulation.adapter``) apply the same rules under the config's field names.
# --------------------------------------------------------------------------------------------------------


def check_nonneg_int(field: str, value: Any) -> int:
    """Returns ``value`` as a Python int if it is a non-negative integer (not a bool).

    Raises:
        ConfigError: ``(field, value, "a non-negative integer")`` otherwise.
    """
    if not is_int(value) or value < 0:
        raise ConfigError(field, value, f"a non-negative integer (got {type(value).__name__})")
    return int(value)


def check_nonneg_real(field: str, value: Any) -> float:
    """Returns ``value`` as a float if it is a finite real number >= 0 (not a bool).

    Raises:
        ConfigError: ``(field, value, "a finite real number >= 0")`` otherwise.
    """
    if not is_real(value) or value < 0:
        raise ConfigError(field, value, "a finite real number >= 0")
    return float(value)


def check_pmf(field: str, pmf: Any, *, atol: float = PMF_SUM_ATOL) -> np.ndarray:
    """Validates a pmf (1-D, non-empty, finite, >= 0, sums to 1 within ``atol``).

    Returns:
        The pmf as float64, renormalised to sum to 1 exactly.

    Raises:
        ConfigError: Naming ``field`` and the first rule the pmf breaks.
    """
    try:
        arr = np.asarray(pmf, dtype=np.float64)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        raise ConfigError(field, type(pmf).__name__, "a concrete array (numpy or a computed jax array), not a "
                          "traced value: samplers are configuration, built outside jit") from None
    except (TypeError, ValueError):
        raise ConfigError(field, pmf, "a 1-D array of probabilities") from None
    if arr.ndim != 1 or arr.size == 0:
        raise ConfigError(field, pmf, f"a non-empty 1-D array of probabilities (got shape {arr.shape})")
    if not np.all(np.isfinite(arr)):
        bad = np.flatnonzero(~np.isfinite(arr)).tolist()
        raise ConfigError(field, pmf, f"entries must be finite (non-finite at indices {bad})")
    if np.any(arr < 0):
        bad = np.flatnonzero(arr < 0)
        raise ConfigError(field, pmf, f"entries must be non-negative ({arr[bad[0]]!r} at index {int(bad[0])}, "
                          f"{bad.size} negative entries)")
    total = float(arr.sum())
    if abs(total - 1.0) > atol:
        raise ConfigError(field, pmf, f"must sum to 1 within {atol:g} (sum {total!r})")
    return arr / total


# --------------------------------------------------------------------------------------------------------
# Samplers.
# --------------------------------------------------------------------------------------------------------


@runtime_checkable
class Sampler(Protocol):
    """What :func:`jaxsprint.emulation.staleness.delayed_gradients` and :func:`minibatch_weights` need from a sampler.

    A sampler is a pure function of a PRNG key returning an int32 scalar in ``[0, max_value]``, plus the
    static attribute ``max_value`` (the largest value it can return), used to check it against the buffer
    size before anything is traced. :class:`PmfSampler` is the implementation every factory here returns;
    a custom sampler only needs these two members.
    """

    max_value: int

    def __call__(self, key: jax.Array) -> jax.Array:
        ...


@dataclasses.dataclass(frozen=True, eq=False)
class PmfSampler:
    """A sampler of a finite distribution on ``{0, 1, ..., max_value}``, by inverse-CDF sampling.

    ``pmf[k]`` is ``P(X = k)``. A draw takes one float32 uniform ``u`` and returns the number of CDF
    boundaries ``cdf[0..max_value-1]`` that are ``<= u``; this costs one uniform and one ``searchsorted``
    over ``max_value`` boundaries, whatever the distribution, and is the same traced program for every
    distribution of the same length. Zero-probability values in the middle of the support are never
    returned. Probabilities below float32 resolution (about 6e-8) are not represented exactly.

    Build instances with :func:`constant`, :func:`uniform`, :func:`geometric`, :func:`from_pmf` or
    :func:`sampler_from_perf_model`, which validate their input; the constructor trims trailing zeros.

    Attributes:
        pmf: float64 numpy array, the exact distribution (trailing zeros trimmed, so ``pmf[-1] > 0``).
        name: A short human-readable description, e.g. ``"geometric(mean=4, max=16)"``.
    """

    pmf: np.ndarray
    name: str = "pmf"

    def __post_init__(self) -> None:
        pmf = np.asarray(self.pmf, dtype=np.float64)
        nonzero = np.flatnonzero(pmf > 0)
        if nonzero.size == 0:
            raise ConfigError("pmf", self.pmf, f"sampler {self.name!r} needs at least one positive entry")
        pmf = pmf[: nonzero[-1] + 1]
        pmf.setflags(write=False)
        object.__setattr__(self, "pmf", pmf)
        # Boundaries between consecutive values, computed in float64 then rounded once.
        boundaries = np.cumsum(pmf)[:-1] / pmf.sum()
        object.__setattr__(self, "_boundaries", boundaries.astype(np.float32))

    @property
    def max_value(self) -> int:
        """Largest value with positive probability."""
        return int(self.pmf.size - 1)

    @property
    def mean(self) -> float:
        """Exact mean of the distribution."""
        return float(np.dot(np.arange(self.pmf.size), self.pmf))

    def __call__(self, key: jax.Array) -> jax.Array:
        """Draws one value.

        Args:
            key: A PRNG key (typed or raw uint32).

        Returns:
            An int32 scalar in ``[0, max_value]``.
        """
        if self.max_value == 0:
            return jnp.zeros((), jnp.int32)
        u = jax.random.uniform(key, (), jnp.float32)
        return jnp.searchsorted(jnp.asarray(self._boundaries), u, side="right").astype(jnp.int32)

    def __repr__(self) -> str:
        return f"PmfSampler({self.name}, max_value={self.max_value}, mean={self.mean:.4g})"


def constant(tau: int) -> PmfSampler:
    """Constant staleness: ``tau_t = tau`` for every update.

    Args:
        tau: Non-negative integer.

    Returns:
        A :class:`PmfSampler` whose pmf is one-hot at ``tau``.
    """
    tau = check_nonneg_int("tau", tau)
    pmf = np.zeros(tau + 1)
    pmf[tau] = 1.0
    return PmfSampler(pmf, name=f"constant({tau})")


def uniform(max_value: int) -> PmfSampler:
    """Uniform staleness on ``{0, 1, ..., max_value}`` (mean ``max_value / 2``).

    Zhang et al. (2016) observe staleness spread over ``{0..2n}`` with mean about ``n`` for n-softsync,
    which ``uniform(2 * n)`` mimics.

    Args:
        max_value: Non-negative integer ``s``; each value has probability ``1 / (s + 1)``.

    Returns:
        A :class:`PmfSampler`.
    """
    s = check_nonneg_int("max_value", max_value)
    return PmfSampler(np.full(s + 1, 1.0 / (s + 1)), name=f"uniform(0..{s})")


def _truncated_geometric_mean(r: float, k: int) -> float:
    """Mean of ``P(tau) ~ r**tau`` on ``{0..k}``, for ``0 <= r < 1``."""
    if r == 0.0:
        return 0.0
    return r / (1.0 - r) - (k + 1) * r ** (k + 1) / (1.0 - r ** (k + 1))


def geometric(mean: float, max_staleness: int, *, exact_mean: bool = False) -> PmfSampler:
    r"""Geometric staleness with a given mean, truncated to ``{0..max_staleness}``.

    The untruncated law is ``P(tau = k) = (1 - r) r^k`` on ``k = 0, 1, ...`` with ``r = mean / (1 + mean)``
    (success probability ``p = 1 / (1 + mean)``), whose mean is ``r / (1 - r) = mean``. It is truncated by
    conditioning on ``tau <= K`` (``K = max_staleness``), i.e. renormalising ``r^k`` over ``{0..K}``. That
    lowers the mean to

    .. math::

        E[\tau \mid \tau \le K] = \frac{r}{1-r} - \frac{(K+1)\, r^{K+1}}{1 - r^{K+1}},

    i.e. by ``(K+1) r^{K+1} / (1 - r^{K+1})``: negligible when ``K`` is many times the mean (mean 4, K 64:
    3.99997), but not otherwise (mean 16, K 64: 14.7 instead of 16). The realised mean is available as
    ``sampler.mean``. With ``exact_mean=True`` the ratio ``r`` is instead solved (by bisection) so that the
    TRUNCATED law has exactly the requested mean; a truncated geometric with ``r < 1`` has mean below
    ``K / 2``, so this requires ``mean < max_staleness / 2``.

    Args:
        mean: Requested mean staleness, finite and ``>= 0``. ``mean = 0`` gives constant 0.
        max_staleness: Truncation point ``K``, a non-negative integer (use the buffer's ``max_staleness``).
        exact_mean: Solve for the truncated law's mean to equal ``mean`` instead of the untruncated one.

    Returns:
        A :class:`PmfSampler` on ``{0..max_staleness}``.
    """
    k = check_nonneg_int("max_staleness", max_staleness)
    mean = check_nonneg_real("mean", mean)
    if mean == 0.0:
        return PmfSampler(np.array([1.0]), name=f"geometric(mean=0, max={k})")
    if exact_mean:
        if not mean < k / 2:
            raise ConfigError("mean", mean, f"< max_staleness / 2 = {k / 2:g} with exact_mean=True (a truncated "
                              f"geometric law has mean below K / 2; max_staleness={k})")
        lo, hi = 0.0, 1.0
        for _ in range(200):  # The truncated mean is increasing in r; 200 halvings reach float64 precision.
            mid = 0.5 * (lo + hi)
            if _truncated_geometric_mean(mid, k) < mean:
                lo = mid
            else:
                hi = mid
        r = 0.5 * (lo + hi)
    else:
        r = mean / (1.0 + mean)
    pmf = r ** np.arange(k + 1, dtype=np.float64)
    pmf /= pmf.sum()
    suffix = ", exact_mean" if exact_mean else ""
    return PmfSampler(pmf, name=f"geometric(mean={mean:g}, max={k}{suffix})")


def from_pmf(pmf: Any, *, atol: float = PMF_SUM_ATOL, name: str = "empirical") -> PmfSampler:
    """Sampler of an arbitrary (e.g. empirical) pmf: ``P(tau = k) = pmf[k]``.

    This is also the entry point for the performance model's prediction: its staleness pmf uses the same
    convention (index = staleness, 0 = synchronous).

    Args:
        pmf: 1-D array-like of non-negative, finite probabilities summing to 1 within ``atol`` (it is then
            renormalised exactly). A histogram of counts must be divided by its total first.
        atol: Tolerance on ``|sum(pmf) - 1|``.
        name: Description used in ``repr`` and logs.

    Returns:
        A :class:`PmfSampler` with ``max_value`` the last index of positive probability.

    Raises:
        ConfigError: Naming ``pmf`` if it is not 1-D, has negative or non-finite entries, or does not sum to 1.
    """
    return PmfSampler(check_pmf("pmf", pmf, atol=atol), name=name)


def sampler_from_perf_model(
    source: Any | Callable[..., Any],
    *args: Any,
    max_staleness: int | None = None,
    tail: str = "error",
    atol: float = 1e-4,
    **kwargs: Any,
) -> PmfSampler:
    """Sampler of the staleness distribution predicted by the performance model (``jaxsprint.perf``).

    This module deliberately does not import ``jaxsprint.perf``: the caller passes either the predicted pmf
    itself or a callable that computes it, e.g.::

        sampler = sampler_from_perf_model(lambda: perf.predict(machine, cfg).staleness_pmf,
                                          max_staleness=config.async_emulation.max_staleness,
                                          tail="renormalize")

    The pmf must follow the convention of ``docs/perf-model.md``, "The protocol": ``pmf[s] = P(S = s)`` with
    ``S = u - 1 - v`` (0 = synchronous), which is the ``tau`` of the delayed-gradient model.

    Args:
        source: A 1-D pmf (numpy or a concrete jax array), or a callable returning one; it is called as
            ``source(*args, **kwargs)``. A return value with a ``staleness_pmf`` attribute is also accepted.
        *args: Positional arguments for a callable ``source``.
        max_staleness: Buffer size the sampler must fit. ``None``: no limit.
        tail: What to do with probability mass above ``max_staleness``: ``"error"`` (default) raises,
            ``"renormalize"`` conditions on ``S <= max_staleness``, ``"clip"`` moves that mass onto
            ``max_staleness`` (keeps the frequency of very stale updates, lowers the mean less).
        atol: Tolerance on ``|sum(pmf) - 1|``; looser than :func:`from_pmf` since model outputs are float32
            and may be truncated numerically.
        **kwargs: Keyword arguments for a callable ``source``.

    Returns:
        A :class:`PmfSampler` named ``"perf_model"``.

    Raises:
        ConfigError: Naming ``pmf``, ``max_staleness`` or ``tail``.
    """
    pmf = source(*args, **kwargs) if callable(source) else source
    pmf = getattr(pmf, "staleness_pmf", pmf)
    arr = check_pmf("pmf", pmf, atol=atol)
    if max_staleness is not None:
        k = check_nonneg_int("max_staleness", max_staleness)
        if tail not in ("error", "renormalize", "clip"):
            raise ConfigError("tail", tail, "one of 'error', 'renormalize', 'clip'")
        excess = float(arr[k + 1:].sum())
        if excess > 0:
            if tail == "error":
                last = int(np.flatnonzero(arr > 0)[-1])
                raise ConfigError("max_staleness", k, f"at least the predicted staleness support (up to {last}, "
                                  f"mass {excess:.3g} above {k}); or pass tail='renormalize' or 'clip'")
            head = arr[: k + 1].copy()
            if tail == "clip":
                head[k] += excess
            if head.sum() <= 0:
                raise ConfigError("max_staleness", k, "the pmf has no mass at or below it; cannot renormalise")
            arr = head / head.sum()
    return PmfSampler(arr, name="perf_model")


def as_sampler(field: str, sampler: Any) -> Any:
    """Accepts a sampler, an int (constant) or a pmf array; returns a sampler.

    Raises:
        ConfigError: Naming ``field`` when ``sampler`` is none of these or has a bad ``max_value``.
    """
    if is_int(sampler):
        return constant(check_nonneg_int(field, sampler))
    if isinstance(sampler, (np.ndarray, jax.Array, list, tuple)):
        return PmfSampler(check_pmf(field, sampler), name="pmf")
    if not callable(sampler) or not hasattr(sampler, "max_value"):
        raise ConfigError(field, sampler, "a sampler (a callable key -> int32 with a max_value attribute, e.g. "
                          "samplers.geometric(...)), an int or a pmf array")
    check_nonneg_int(f"{field}.max_value", sampler.max_value)
    return sampler


# --------------------------------------------------------------------------------------------------------
# Variable mini-batch emulation.
# --------------------------------------------------------------------------------------------------------


class MinibatchDraw(NamedTuple):
    """Result of :func:`minibatch_weights`.

    Attributes:
        weights: float32 ``[n_sub]``: ``1 / k`` on the ``k`` selected sub-batches, 0 elsewhere; sums to 1.
        k: int32 scalar, the number of sub-batches used (log its histogram).
    """

    weights: jax.Array
    k: jax.Array


def _as_k_sampler(n_sub: int, k_distribution: Any) -> Any:
    if is_int(k_distribution):
        k = check_nonneg_int("k_distribution", k_distribution)
        if not 1 <= k <= n_sub:
            raise ConfigError("k_distribution", k, f"as a constant K: an integer in [1, n_sub={n_sub}]")
        return constant(k)
    if isinstance(k_distribution, (np.ndarray, jax.Array, list, tuple)):
        k_sampler = PmfSampler(check_pmf("k_pmf", k_distribution), name="k_pmf")
    else:
        k_sampler = as_sampler("k_distribution", k_distribution)
    if isinstance(k_sampler, PmfSampler) and k_sampler.pmf[0] > 0:
        raise ConfigError("k_pmf[0]", float(k_sampler.pmf[0]), "0: an update uses at least one sub-batch (the "
                          "pmf is indexed by the number of sub-batches K, k_pmf[k] = P(K = k))")
    if k_sampler.max_value > n_sub:
        raise ConfigError("n_sub", n_sub, f"at least the largest K of the mini-batch distribution "
                          f"({k_sampler.max_value}): the global batch must hold at least max K sub-batches")
    return k_sampler


def minibatch_weights(key: jax.Array, n_sub: int, k_distribution: Any) -> MinibatchDraw:
    r"""Emulates a random mini-batch: weights selecting ``K`` of the ``n_sub`` sub-batches of the batch.

    In SPRINT an update aggregates ``K`` sub-batch gradients, ``K`` random (mini-batch size
    ``B = N_Subbatch * K``). The emulator keeps a fixed global batch of ``n_sub`` sub-batches, draws
    ``K ~ k_distribution``, picks ``K`` distinct sub-batches uniformly at random and weights them ``1/K``:

    .. math::

        \bar g = \sum_j w_j\, \bar g_j = \frac{1}{K} \sum_{j \in S} \bar g_j, \qquad |S| = K,

    where ``\bar g_j`` is the mean gradient of sub-batch ``j``. This is the mean gradient over the
    ``K * N_Subbatch`` examples actually used, so it is correctly normalised whatever ``K`` is.

    How a train step uses it (the weighted loss; one backward pass, no per-sub-batch gradients)::

        draw = samplers.minibatch_weights(step_key, n_sub, k_pmf)
        ex_w = samplers.example_weights(draw.weights, batch_size)      # [batch], sums to 1
        def loss_fn(params):
            per_example = optax.softmax_cross_entropy_with_integer_labels(logits(params), labels)
            return jnp.sum(ex_w * per_example)       # == samplers.weighted_mean(per_example, ex_w)
        grads = jax.grad(loss_fn)(params)

    Sub-batch ``j`` is the contiguous block of examples ``[j * b, (j + 1) * b)`` with ``b = batch / n_sub``;
    with a batch sharded over ``D`` data-parallel devices and ``n_sub`` a multiple of ``D``, sub-batches are
    per-device blocks, like SPRINT's per-learner sub-batches. Caveats: the dropped sub-batches are still
    computed (the emulation trades compute for simplicity) and consumed from the input stream, so count
    "examples seen" as ``sum_t K_t * b``; batch-norm statistics in the forward pass still use the whole
    batch (mask them too if that matters for the study). The key must be the same on every device (it is,
    under jit with a replicated key).

    Args:
        key: PRNG key for this update (e.g. ``fold_in(base_key, step)``).
        n_sub: Number of sub-batches in the global batch, a positive integer (static).
        k_distribution: Distribution of ``K``: a pmf array indexed by ``K`` (``k_pmf[k] = P(K = k)``,
            ``k_pmf[0]`` must be 0, length at most ``n_sub + 1``), a sampler of ``K`` (e.g.
            ``from_pmf(k_pmf)``, whose values must lie in ``[1, n_sub]``), or an int (constant ``K``).

    Returns:
        A :class:`MinibatchDraw` ``(weights [n_sub] float32, k int32)``.

    Raises:
        ConfigError: Naming ``n_sub``, ``k_pmf`` or ``k_distribution``.
    """
    n_sub = check_nonneg_int("n_sub", n_sub)
    if n_sub < 1:
        raise ConfigError("n_sub", n_sub, "a positive integer")
    k_sampler = _as_k_sampler(n_sub, k_distribution)
    key_k, key_perm = jax.random.split(key)
    # Clipping only guards a custom sampler; validated pmf samplers already return values in [1, n_sub].
    k = jnp.clip(jnp.asarray(k_sampler(key_k), jnp.int32), 1, n_sub)
    order = jax.random.permutation(key_perm, n_sub)
    # Sub-batch order[i] is selected iff i < k: a uniformly random subset of size k, with traced k.
    selected = jnp.zeros((n_sub,), bool).at[order].set(jnp.arange(n_sub) < k)
    weights = jnp.where(selected, 1.0 / k.astype(jnp.float32), 0.0)
    return MinibatchDraw(weights=weights, k=k)


def example_weights(sub_batch_weights: jax.Array, batch_size: int) -> jax.Array:
    """Expands per-sub-batch weights ``[n_sub]`` to per-example weights ``[batch_size]``.

    Example ``i`` belongs to sub-batch ``i // (batch_size // n_sub)`` and gets its sub-batch's weight divided
    by the sub-batch size, so the result sums to ``sum(sub_batch_weights)`` (1 for :func:`minibatch_weights`)
    and ``sum(example_weights * per_example_loss)`` is the mean loss over the selected examples.

    Args:
        sub_batch_weights: ``[n_sub]`` weights.
        batch_size: Global batch size, a multiple of ``n_sub``.

    Returns:
        float ``[batch_size]`` weights.
    """
    n_sub = int(sub_batch_weights.shape[0])
    batch_size = check_nonneg_int("batch_size", batch_size)
    if n_sub == 0 or batch_size % n_sub:
        raise ConfigError("batch_size", batch_size, f"a positive multiple of n_sub={n_sub}")
    per = batch_size // n_sub
    return jnp.repeat(sub_batch_weights / per, per, total_repeat_length=batch_size)


def weighted_mean(values: jax.Array, weights: jax.Array) -> jax.Array:
    """``sum_i weights[i] * values[i, ...]`` over the leading (batch) axis (a mean if weights sum to 1)."""
    weights = weights.reshape(weights.shape + (1,) * (values.ndim - 1)).astype(values.dtype)
    return jnp.sum(weights * values, axis=0)


def nonempty_staleness_pmf(staleness_pmf: np.ndarray, p_empty: float) -> np.ndarray:
    """The delay in NON-EMPTY updates of a gradient whose staleness in versions has ``staleness_pmf``.

    The emulator's delay ring stands still on an empty update (it changes nothing), so it must draw the
    delay in weight changes; a model pmf counts versions, empty cycles included. With each intervening
    version empty with probability ``p_empty`` independently, a staleness of ``s`` versions is
    ``Binomial(s, 1 - p_empty)`` non-empty updates. (On the runtime's measured logs the exact count,
    :func:`jaxsprint.runtime.events.effective_staleness`, is 5-10% above this mean where half the cycles are
    empty: emptiness is not independent. The runtime comparison uses the exact count.) Used by the planner's
    emulated runs (``jaxsprint.plan.emulator.make_spec``) and the ``perf_model`` sampler of
    ``jaxsprint.emulation.adapter``.
    """
    sp = np.asarray(staleness_pmf, np.float64)
    q = float(np.clip(p_empty, 0.0, 1.0))
    out = np.zeros(sp.size)
    row = np.zeros(sp.size)
    row[0] = 1.0  # Binomial(0, .): row[j] = P(j of s versions non-empty), built up one version at a time
    for s_versions in range(sp.size):
        if s_versions:
            row[1:] = row[1:] * q + row[:-1] * (1.0 - q)
            row[0] *= q
        out += sp[s_versions] * row
    return out
