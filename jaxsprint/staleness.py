"""Asynchronous-SGD emulation: delayed gradients, staleness samplers, variable mini-batches.

SPRINT trains asynchronously: each update is applied with a gradient computed on weights that are several
updates old, and the number of sub-batch gradients gathered into one update is random. This module emulates
both effects inside an ordinary synchronous, jitted JAX program so that their effect on accuracy can be
studied on any machine, with staleness and mini-batch distributions that are either simple parametric ones
or the ones the performance model predicts for a real cluster.

Delayed-gradient model. With ``tau_t`` the staleness of the gradient applied at update ``t``::

    w_{t+1} = w_t - lr * g(w_{t - tau_t})

Storing the gradient computed at the current weights in a ring buffer and releasing it ``tau_t`` updates later
is exactly this model. :func:`delayed_gradients` is an optax ``GradientTransformation`` that does it, so it
composes with any optimizer::

    tx = optax.chain(
        staleness.delayed_gradients(16, staleness.geometric(mean=4.0, max_staleness=16), seed=0),
        optax.sgd(learning_rate, momentum=0.9),
    )

Put it FIRST in the chain: in SPRINT the learners send raw gradients and the updater applies momentum (and
weight decay) to whatever arrives, i.e. the inner optimizer sees stale gradients and current state.

Staleness convention: ``tau = 0`` is synchronous SGD. This is the convention of the performance model
(``docs/sprint-model.md``: "S = u - 1 - v", a gradient read at version v and applied in the update that
publishes version u), so a predicted staleness pmf indexes directly as ``pmf[tau]``.

Variable mini-batch. :func:`minibatch_weights` draws ``K`` from a pmf over ``{1..n_sub}`` and returns weights
over the ``n_sub`` sub-batches of the global batch that select ``K`` of them at random and sum to 1, so the
weighted loss is the mean over the examples actually used (see its docstring for the train-step recipe).

References:
    Zhang, Gupta, Lian, Liu. "Staleness-aware Async-SGD for Distributed Deep Learning", IJCAI 2016
    (arXiv:1511.05950).
    Zheng, Meng, Wang, Chen, Yu, Ma, Liu. "Asynchronous Stochastic Gradient Descent with Delay
    Compensation", ICML 2017 (arXiv:1609.08326).
    Oyama, Nomura, Sato, Nishimura, Tamatsu, Matsuoka. "Predicting statistics of asynchronous SGD
    parameters for a large-scale distributed deep learning system on GPU supercomputers", IEEE BigData 2016.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
import optax

__all__ = [
    "Sampler",
    "PmfSampler",
    "constant",
    "uniform",
    "geometric",
    "from_pmf",
    "sampler_from_perf_model",
    "MITIGATIONS",
    "DelayedGradientsState",
    "delayed_gradients",
    "find_delayed_state",
    "staleness_metrics",
    "buffer_nbytes",
    "MinibatchDraw",
    "minibatch_weights",
    "example_weights",
    "weighted_mean",
]

# Default tolerance on |sum(pmf) - 1|. Loose enough for a float32 pmf from the performance model (a few
# hundred entries, each rounded to ~6e-8 relative), tight enough to catch a pmf that is not normalised at all.
_PMF_SUM_ATOL = 1e-5


# --------------------------------------------------------------------------------------------------------
# Validation helpers: every error names the field, the value and what is allowed.
# --------------------------------------------------------------------------------------------------------


def _check_nonneg_int(name: str, value: Any) -> int:
    """Returns ``value`` as a Python int if it is a non-negative integer (not a bool), else raises."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be a non-negative integer, got {value!r} ({type(value).__name__}).")
    if value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}.")
    return int(value)


def _check_nonneg_real(name: str, value: Any) -> float:
    """Returns ``value`` as a float if it is a finite real number >= 0 (not a bool), else raises."""
    if (
        isinstance(value, (bool, np.bool_))
        or not isinstance(value, numbers.Real)
        or not np.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"{name} must be a finite real number >= 0, got {value!r}.")
    return float(value)


def _check_pmf(name: str, pmf: Any, *, atol: float) -> np.ndarray:
    """Validates a pmf (1-D, finite, >= 0, sums to 1 within ``atol``); returns it renormalised, float64."""
    try:
        arr = np.asarray(pmf, dtype=np.float64)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError) as e:
        raise ValueError(
            f"{name} must be a concrete array (numpy or a computed jax array), not a traced value: samplers "
            "are configuration, built outside jit."
        ) from e
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array of probabilities, got shape {arr.shape}.")
    if not np.all(np.isfinite(arr)):
        bad = np.flatnonzero(~np.isfinite(arr)).tolist()
        raise ValueError(f"{name} must be finite, got non-finite entries at indices {bad}.")
    if np.any(arr < 0):
        bad = np.flatnonzero(arr < 0)
        raise ValueError(
            f"{name} must have non-negative entries, got {arr[bad[0]]!r} at index {int(bad[0])} "
            f"({bad.size} negative entries)."
        )
    total = float(arr.sum())
    if abs(total - 1.0) > atol:
        raise ValueError(f"{name} must sum to 1 (within {atol:g}), got sum {total!r}.")
    return arr / total


# --------------------------------------------------------------------------------------------------------
# Samplers.
# --------------------------------------------------------------------------------------------------------


@runtime_checkable
class Sampler(Protocol):
    """What :func:`delayed_gradients` and :func:`minibatch_weights` need from a sampler.

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
            raise ValueError(f"pmf of sampler {self.name!r} has no positive entry.")
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
    tau = _check_nonneg_int("tau", tau)
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
    s = _check_nonneg_int("max_value", max_value)
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
    k = _check_nonneg_int("max_staleness", max_staleness)
    mean = _check_nonneg_real("mean", mean)
    if mean == 0.0:
        return PmfSampler(np.array([1.0]), name=f"geometric(mean=0, max={k})")
    if exact_mean:
        if not mean < k / 2:
            raise ValueError(
                f"mean must be < max_staleness / 2 = {k / 2:g} with exact_mean=True (a truncated geometric "
                f"law has mean below K / 2), got mean={mean:g}, max_staleness={k}."
            )
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


def from_pmf(pmf: Any, *, atol: float = _PMF_SUM_ATOL, name: str = "empirical") -> PmfSampler:
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
        ValueError: Naming ``pmf`` if it is not 1-D, has negative or non-finite entries, or does not sum to 1.
    """
    return PmfSampler(_check_pmf("pmf", pmf, atol=atol), name=name)


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

    The pmf must follow the convention of ``docs/sprint-model.md``: ``pmf[s] = P(S = s)`` with
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
        ValueError: Naming ``pmf``, ``max_staleness`` or ``tail``.
    """
    pmf = source(*args, **kwargs) if callable(source) else source
    pmf = getattr(pmf, "staleness_pmf", pmf)
    arr = _check_pmf("pmf", pmf, atol=atol)
    if max_staleness is not None:
        k = _check_nonneg_int("max_staleness", max_staleness)
        if tail not in ("error", "renormalize", "clip"):
            raise ValueError(f"tail must be one of 'error', 'renormalize', 'clip', got {tail!r}.")
        excess = float(arr[k + 1:].sum())
        if excess > 0:
            if tail == "error":
                last = int(np.flatnonzero(arr > 0)[-1])
                raise ValueError(
                    f"max_staleness={k} is smaller than the predicted staleness support (up to {last}, "
                    f"mass {excess:.3g} above {k}); raise max_staleness or pass tail='renormalize' or 'clip'."
                )
            head = arr[: k + 1].copy()
            if tail == "clip":
                head[k] += excess
            if head.sum() <= 0:
                raise ValueError(f"pmf has no mass at or below max_staleness={k}; cannot renormalise.")
            arr = head / head.sum()
    return PmfSampler(arr, name="perf_model")


def _as_sampler(name: str, sampler: Any) -> Any:
    """Accepts a sampler, an int (constant) or a pmf array; returns a sampler."""
    if isinstance(sampler, numbers.Integral) and not isinstance(sampler, (bool, np.bool_)):
        return constant(_check_nonneg_int(name, sampler))
    if isinstance(sampler, (np.ndarray, jax.Array, list, tuple)):
        return PmfSampler(_check_pmf(name, sampler, atol=_PMF_SUM_ATOL), name="pmf")
    if not callable(sampler) or not hasattr(sampler, "max_value"):
        raise ValueError(
            f"{name} must be a sampler (a callable key -> int32 with a max_value attribute, e.g. "
            f"staleness.geometric(...)), an int or a pmf array, got {sampler!r}."
        )
    _check_nonneg_int(f"{name}.max_value", sampler.max_value)
    return sampler


# --------------------------------------------------------------------------------------------------------
# The delayed-gradient transformation.
# --------------------------------------------------------------------------------------------------------

MITIGATIONS = ("none", "staleness_lr", "dc_asgd")


class DelayedGradientsState(NamedTuple):
    """State of :func:`delayed_gradients`; a pytree of arrays only, so it checkpoints and resumes exactly.

    Attributes:
        count: int32 scalar, number of updates done so far (``t`` of the next update).
        key: uint32 raw PRNG key data; the staleness of update ``t`` is drawn from ``fold_in(key, t)``, so
            the sequence of draws depends only on the seed and the step.
        grad_buffer: Pytree like the params, each leaf of shape ``[max_staleness + 1, *leaf.shape]`` (dtype
            of the param). The gradient of update ``t`` is in slot ``t % (max_staleness + 1)``.
        param_buffer: Same layout, the weights each buffered gradient was computed at; only with DC-ASGD,
            else ``optax.EmptyState()`` (so the buffer costs (max_staleness + 1) x param bytes, x2 with DC).
        last_tau: int32 scalar, the staleness realised in the last update (after warm-up clipping); 0 before
            the first update.
        tau_counts: int32 ``[max_staleness + 1]``, histogram of realised staleness over all updates so far.
    """

    count: jax.Array
    key: jax.Array
    grad_buffer: optax.Updates
    param_buffer: optax.Params | optax.EmptyState
    last_tau: jax.Array
    tau_counts: jax.Array


def _parse_mitigation(mitigation: str | Sequence[str] | None) -> frozenset[str]:
    names = (mitigation,) if mitigation is None or isinstance(mitigation, str) else tuple(mitigation)
    chosen = set()
    for m in names:
        m = "none" if m is None else m
        if m not in MITIGATIONS:
            raise ValueError(
                f"mitigation must be one of {MITIGATIONS} or a sequence of them, got {mitigation!r}."
            )
        if m != "none":
            chosen.add(m)
    return frozenset(chosen)


def _key_data(seed: int | jax.Array) -> jax.Array:
    if isinstance(seed, jax.Array) and jnp.issubdtype(seed.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(seed)
    if isinstance(seed, (jax.Array, np.ndarray)) and seed.dtype == np.uint32:
        return jnp.asarray(seed)
    return jax.random.key_data(jax.random.key(_check_nonneg_int("seed", seed)))


def delayed_gradients(
    max_staleness: int,
    sampler: Sampler | int | Any,
    *,
    mitigation: str | Sequence[str] | None = "none",
    dc_lambda: float = 0.04,
    seed: int | jax.Array = 0,
) -> optax.GradientTransformationExtraArgs:
    r"""Delays each gradient by a random staleness ``tau_t``: the asynchronous-SGD emulator.

    At update ``t`` (``t = 0, 1, ...``) with incoming gradient ``g_t = g(w_t)``:

    1. draw ``tau_t ~ sampler`` from ``fold_in(key, t)``, then clip for warm-up:
       ``tau_t <- min(tau_t, t)``;
    2. write ``g_t`` (and, with DC-ASGD, ``w_t``) into ring-buffer slot ``t mod (max_staleness + 1)``;
    3. emit ``g_{t - tau_t}``, read from slot ``(t - tau_t) mod (max_staleness + 1)``, with the selected
       mitigations applied.

    Followed by plain SGD this is ``w_{t+1} = w_t - lr * g(w_{t - tau_t})``. Writing before reading makes
    ``tau = 0`` emit the incoming gradient itself, bit for bit, so a chain with ``constant(0)`` equals the
    inner optimizer alone.

    Warm-up: before update ``t`` only ``t + 1`` gradients exist (``g_0..g_t``), so staleness is clipped to
    ``t`` (the oldest gradient, computed at the initial weights), exactly as in a real asynchronous run
    where no gradient can predate the start. The first ``max_staleness`` updates are therefore less stale
    than the sampler says; ``state.tau_counts`` records realised (clipped) values. Nothing is emitted as
    zero and no update is skipped.

    Mitigations (``mitigation``, a name or a sequence of names; with both, DC is applied first):

    * ``"staleness_lr"`` (Zhang et al. 2016): emit ``g / max(1, tau_t)``, which is the staleness-dependent
      learning rate ``lr / max(1, tau_t)`` for any optimizer linear in the gradient (SGD, momentum,
      Nesterov). For scale-invariant optimizers (Adam, LAMB, LARS's trust ratio) scaling the gradient does
      NOT scale the step; use a staleness-dependent schedule after the optimizer instead.
    * ``"dc_asgd"`` (Zheng et al. 2017), delay compensation by a first-order Taylor expansion with the
      diagonal outer-product approximation of the Hessian::

          g_comp = g(w_stale) + dc_lambda * g(w_stale) * g(w_stale) * (w_t - w_stale)

      where ``w_t`` are the current params (the ``params`` argument of ``update``) and ``w_stale`` the params
      the emitted gradient was computed at, stored alongside it (this doubles the buffer memory). This is
      the constant-lambda variant (DC-ASGD-c); ``dc_lambda`` is a hyper-parameter to tune (the default 0.04
      is only a small starting value).

    At ``tau = 0`` both mitigations are the identity and the raw gradient is emitted (selected, not
    recomputed, so the bit-for-bit equality with the inner optimizer holds with mitigations on).

    jit: the staleness is a traced int32 used only as data (``dynamic_slice`` / ``dynamic_update_slice``
    indices, the lr scale, a ``jnp.where``), so there is no Python branching on it and no retrace when it
    changes. The buffers take the params' dtypes: gradients in a wider dtype than the params are rounded. Use
    ``donate_argnums`` for the optimizer state in the jitted train step, or XLA copies the whole buffer
    ((max_staleness + 1) x params) every step instead of updating one slot in place.

    Replaying a recorded staleness trace: ``update(..., staleness=tau)`` (an int32 scalar, traced is fine)
    overrides the sampler for that update; it is still clipped to ``[0, min(t, max_staleness)]``. Other
    optax transforms in a chain ignore this extra argument.

    Args:
        max_staleness: Ring-buffer depth minus one, a non-negative integer. Memory: ``(max_staleness + 1)``
            copies of the params (twice that with DC-ASGD).
        sampler: Staleness distribution: a :class:`Sampler` (:func:`constant`, :func:`uniform`,
            :func:`geometric`, :func:`from_pmf`, :func:`sampler_from_perf_model`), an int (constant) or a
            pmf array. Its ``max_value`` must be ``<= max_staleness``.
        mitigation: ``"none"``, ``"staleness_lr"``, ``"dc_asgd"``, or a sequence of them.
        dc_lambda: The DC-ASGD ``lambda`` (used only with ``"dc_asgd"``), finite and ``>= 0``.
        seed: An int, or a PRNG key (typed or raw uint32), for the staleness draws.

    Returns:
        An ``optax.GradientTransformationExtraArgs``. ``init(params)`` builds the buffers (zeros, in the
        params' dtypes); ``update(updates, state, params=None, *, staleness=None)`` requires ``params`` when
        DC-ASGD is on (pass ``params`` to ``tx.update`` as usual; ``optax.chain`` forwards it).

    Raises:
        ValueError: Naming ``max_staleness``, ``sampler``, ``mitigation``, ``dc_lambda`` or ``seed``.

    References:
        Zhang et al., "Staleness-aware Async-SGD for Distributed Deep Learning", IJCAI 2016.
        Zheng et al., "Asynchronous Stochastic Gradient Descent with Delay Compensation", ICML 2017.
    """
    max_staleness = _check_nonneg_int("max_staleness", max_staleness)
    sampler = _as_sampler("sampler", sampler)
    if sampler.max_value > max_staleness:
        raise ValueError(
            f"max_staleness={max_staleness} is smaller than the support of sampler {sampler!r} (values up to "
            f"{sampler.max_value}); raise max_staleness to at least {sampler.max_value}."
        )
    mitigations = _parse_mitigation(mitigation)
    use_dc = "dc_asgd" in mitigations
    use_lr = "staleness_lr" in mitigations
    dc_lambda = _check_nonneg_real("dc_lambda", dc_lambda)
    key_data = _key_data(seed)
    depth = max_staleness + 1

    def _zeros_buffer(params: optax.Params) -> optax.Updates:
        return jax.tree.map(lambda p: jnp.zeros((depth, *jnp.shape(p)), jnp.result_type(p)), params)

    def init_fn(params: optax.Params) -> DelayedGradientsState:
        return DelayedGradientsState(
            count=jnp.zeros((), jnp.int32),
            key=jnp.asarray(key_data),
            grad_buffer=_zeros_buffer(params),
            param_buffer=_zeros_buffer(params) if use_dc else optax.EmptyState(),
            last_tau=jnp.zeros((), jnp.int32),
            tau_counts=jnp.zeros((depth,), jnp.int32),
        )

    def update_fn(
        updates: optax.Updates,
        state: DelayedGradientsState,
        params: optax.Params | None = None,
        *,
        staleness: jax.Array | int | None = None,
        **extra_args: Any,
    ) -> tuple[optax.Updates, DelayedGradientsState]:
        del extra_args
        if use_dc and params is None:
            raise ValueError("params must be passed to update() when mitigation includes 'dc_asgd'.")
        t = state.count
        if staleness is None:
            tau = sampler(jax.random.fold_in(jax.random.wrap_key_data(state.key), t))
        else:
            tau = staleness
        # Warm-up: nothing older than g_0 exists at step t. Also bound by the buffer (a no-op for a
        # validated sampler; it keeps a bad `staleness` argument from reading a wrong slot).
        tau = jnp.clip(jnp.asarray(tau, jnp.int32), 0, jnp.minimum(t, max_staleness))
        write = t % depth
        read = (t - tau) % depth

        def _push_pop(buf: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
            buf = jax.lax.dynamic_update_index_in_dim(buf, x.astype(buf.dtype)[None], write, axis=0)
            return buf, jax.lax.dynamic_index_in_dim(buf, read, axis=0, keepdims=False)

        def _push_pop_tree(buffer: optax.Updates, tree: optax.Updates) -> tuple[optax.Updates, optax.Updates]:
            pairs = jax.tree.map(_push_pop, buffer, tree)
            outer = jax.tree.structure(tree)
            inner = jax.tree.structure((0, 0))
            return jax.tree.transpose(outer, inner, pairs)

        grad_buffer, stale_grads = _push_pop_tree(state.grad_buffer, updates)
        if use_dc:
            param_buffer, stale_params = _push_pop_tree(state.param_buffer, params)
        else:
            param_buffer, stale_params = state.param_buffer, None

        def _mitigate(g: jax.Array, w: jax.Array | None, w_old: jax.Array | None) -> jax.Array:
            out = g
            if use_dc:
                out = out + dc_lambda * out * out * (w.astype(g.dtype) - w_old.astype(g.dtype))
            if use_lr:
                out = out * (1.0 / jnp.maximum(tau, 1).astype(jnp.float32)).astype(g.dtype)
            # At tau = 0 both mitigations are the identity; select the raw gradient rather than rely on
            # `g * 1 + 0` being left alone: once fused into the inner optimizer's arithmetic, XLA/LLVM may
            # contract it into a different FMA than the inner optimizer alone uses, and tau = 0 must stay
            # bit-identical to it.
            return jnp.where(tau > 0, out, g)

        if mitigations:
            if use_dc:
                stale_grads = jax.tree.map(_mitigate, stale_grads, params, stale_params)
            else:
                stale_grads = jax.tree.map(lambda g: _mitigate(g, None, None), stale_grads)
        # Emit in the dtype the caller passed in (the buffer keeps the params' dtype).
        stale_grads = jax.tree.map(lambda g, u: g.astype(jnp.result_type(u)), stale_grads, updates)

        new_state = DelayedGradientsState(
            count=optax.safe_increment(t),
            key=state.key,
            grad_buffer=grad_buffer,
            param_buffer=param_buffer,
            last_tau=tau,
            tau_counts=state.tau_counts.at[tau].add(1),
        )
        return stale_grads, new_state

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


# --------------------------------------------------------------------------------------------------------
# Helpers for train steps and metrics.
# --------------------------------------------------------------------------------------------------------


def find_delayed_state(opt_state: Any) -> DelayedGradientsState | None:
    """Returns the (first) :class:`DelayedGradientsState` inside an optimizer state, e.g. of a chain."""
    for node in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, DelayedGradientsState)):
        if isinstance(node, DelayedGradientsState):
            return node
    return None


def staleness_metrics(opt_state: Any) -> dict[str, jax.Array]:
    """Metrics to log from an optimizer state containing :func:`delayed_gradients`' state.

    Jit-friendly (returns arrays). Keys: ``"staleness/last"`` (realised tau of the last update),
    ``"staleness/mean"`` (mean realised tau so far), ``"staleness/hist"`` (int32 counts per tau value, over
    all updates so far; difference two of them for a window). Returns ``{}`` if there is no such state.
    """
    state = find_delayed_state(opt_state)
    if state is None:
        return {}
    counts = state.tau_counts
    total = jnp.maximum(jnp.sum(counts), 1).astype(jnp.float32)
    mean = jnp.sum(counts * jnp.arange(counts.shape[0])).astype(jnp.float32) / total
    return {"staleness/last": state.last_tau, "staleness/mean": mean, "staleness/hist": counts}


def buffer_nbytes(state: DelayedGradientsState) -> int:
    """Bytes held by the gradient and parameter ring buffers of a state (works on abstract states too)."""
    leaves = jax.tree.leaves((state.grad_buffer, state.param_buffer))
    return int(sum(np.prod(x.shape, dtype=np.int64) * np.dtype(x.dtype).itemsize for x in leaves))


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
    if isinstance(k_distribution, numbers.Integral) and not isinstance(k_distribution, (bool, np.bool_)):
        k = _check_nonneg_int("k_distribution", k_distribution)
        if not 1 <= k <= n_sub:
            raise ValueError(f"k_distribution as a constant must be in [1, n_sub={n_sub}], got {k}.")
        return constant(k)
    if isinstance(k_distribution, (np.ndarray, jax.Array, list, tuple)):
        k_sampler = PmfSampler(_check_pmf("k_pmf", k_distribution, atol=_PMF_SUM_ATOL), name="k_pmf")
    else:
        k_sampler = _as_sampler("k_distribution", k_distribution)
    if isinstance(k_sampler, PmfSampler) and k_sampler.pmf[0] > 0:
        raise ValueError(
            f"k_pmf[0] must be 0 (an update uses at least one sub-batch), got {k_sampler.pmf[0]!r}; the pmf "
            "is indexed by the number of sub-batches K, k_pmf[k] = P(K = k)."
        )
    if k_sampler.max_value > n_sub:
        raise ValueError(
            f"n_sub={n_sub} is smaller than the support of the mini-batch distribution (K up to "
            f"{k_sampler.max_value}); the global batch must hold at least max K sub-batches."
        )
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

        draw = staleness.minibatch_weights(step_key, n_sub, k_pmf)
        ex_w = staleness.example_weights(draw.weights, batch_size)      # [batch], sums to 1
        def loss_fn(params):
            per_example = optax.softmax_cross_entropy_with_integer_labels(logits(params), labels)
            return jnp.sum(ex_w * per_example)       # == staleness.weighted_mean(per_example, ex_w)
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
        ValueError: Naming ``n_sub``, ``k_pmf`` or ``k_distribution``.
    """
    n_sub = _check_nonneg_int("n_sub", n_sub)
    if n_sub < 1:
        raise ValueError(f"n_sub must be a positive integer, got {n_sub}.")
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
    batch_size = _check_nonneg_int("batch_size", batch_size)
    if n_sub == 0 or batch_size % n_sub:
        raise ValueError(f"batch_size must be a positive multiple of n_sub={n_sub}, got {batch_size}.")
    per = batch_size // n_sub
    return jnp.repeat(sub_batch_weights / per, per, total_repeat_length=batch_size)


def weighted_mean(values: jax.Array, weights: jax.Array) -> jax.Array:
    """``sum_i weights[i] * values[i, ...]`` over the leading (batch) axis (a mean if weights sum to 1)."""
    weights = weights.reshape(weights.shape + (1,) * (values.ndim - 1)).astype(values.dtype)
    return jnp.sum(weights * values, axis=0)
