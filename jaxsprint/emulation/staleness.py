"""Asynchronous-SGD emulation: the delayed-gradient optax transform and its mitigations.

SPRINT applies each update with gradients computed on weights several updates old, and gathers a random
number of sub-batch gradients into it. This module and :mod:`jaxsprint.emulation.samplers` (the staleness and
mini-batch distributions, parametric or predicted by the performance model; re-exported here) emulate both
inside an ordinary synchronous jitted program, so that their effect on accuracy can be studied on any machine.
:mod:`jaxsprint.emulation.adapter` builds all of it from ``config.async_emulation``.

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

Staleness convention: ``tau = 0`` is synchronous SGD, the performance model's ``S = u - 1 - v``
(docs/sprint-model.md), so a predicted staleness pmf indexes directly as ``pmf[tau]``. Mitigations: Zhang et
al., IJCAI 2016 (arXiv:1511.05950, staleness-aware rate); Zheng et al., ICML 2017 (arXiv:1609.08326, DC-ASGD).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxsprint.emulation import samplers
from jaxsprint.errors import ConfigError
# Re-exported: the samplers and the random mini-batch are part of the emulator's public surface.
from jaxsprint.emulation.samplers import (MinibatchDraw, PmfSampler, Sampler, constant, example_weights, from_pmf, geometric,
                                minibatch_weights, sampler_from_perf_model, uniform, weighted_mean)

__all__ = [
    "MITIGATIONS",
    "parse_mitigation",
    "DelayedGradientsState",
    "delayed_gradients",
    "find_delayed_state",
    "staleness_metrics",
    "buffer_nbytes",
    # From jaxsprint.emulation.samplers:
    "Sampler",
    "PmfSampler",
    "constant",
    "uniform",
    "geometric",
    "from_pmf",
    "sampler_from_perf_model",
    "MinibatchDraw",
    "minibatch_weights",
    "example_weights",
    "weighted_mean",
]

# The mitigations, spelled as ``config.async_emulation.mitigation`` and ``delayed_gradients(mitigation=...)``
# accept them: "+" joins two (delay compensation is applied first, then the staleness-aware scale).
MITIGATIONS = ("none", "staleness_lr", "dc_asgd", "staleness_lr+dc_asgd")


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


def parse_mitigation(mitigation: str | Sequence[str] | None) -> frozenset[str]:
    """The set of mitigations a name of :data:`MITIGATIONS` (or a sequence of names) selects.

    ``"none"`` and ``None`` select nothing; ``"staleness_lr+dc_asgd"`` selects both, as does
    ``("staleness_lr", "dc_asgd")``.

    Raises:
        ConfigError: Naming ``mitigation`` when a name is not in :data:`MITIGATIONS`.
    """
    names = (mitigation,) if mitigation is None or isinstance(mitigation, str) else tuple(mitigation)
    chosen = set()
    for m in names:
        m = "none" if m is None else m
        if m not in MITIGATIONS:
            raise ConfigError("mitigation", mitigation, f"one of {', '.join(MITIGATIONS)}, or a sequence of them")
        chosen.update(part for part in m.split("+") if part != "none")
    return frozenset(chosen)


def _key_data(seed: int | jax.Array) -> jax.Array:
    if isinstance(seed, jax.Array) and jnp.issubdtype(seed.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(seed)
    if isinstance(seed, (jax.Array, np.ndarray)) and seed.dtype == np.uint32:
        return jnp.asarray(seed)
    return jax.random.key_data(jax.random.key(samplers.check_nonneg_int("seed", seed)))


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
        mitigation: A name of :data:`MITIGATIONS` (``"none"``, ``"staleness_lr"``, ``"dc_asgd"``,
            ``"staleness_lr+dc_asgd"``), or a sequence of them.
        dc_lambda: The DC-ASGD ``lambda`` (used only with ``"dc_asgd"``), finite and ``>= 0``.
        seed: An int, or a PRNG key (typed or raw uint32), for the staleness draws.

    Returns:
        An ``optax.GradientTransformationExtraArgs``. ``init(params)`` builds the buffers (zeros, in the
        params' dtypes); ``update(updates, state, params=None, *, staleness=None)`` requires ``params`` when
        DC-ASGD is on (pass ``params`` to ``tx.update`` as usual; ``optax.chain`` forwards it).

    Raises:
        ConfigError: Naming ``max_staleness``, ``sampler``, ``mitigation``, ``dc_lambda`` or ``seed``.

    References:
        Zhang et al., "Staleness-aware Async-SGD for Distributed Deep Learning", IJCAI 2016.
        Zheng et al., "Asynchronous Stochastic Gradient Descent with Delay Compensation", ICML 2017.
    """
    max_staleness = samplers.check_nonneg_int("max_staleness", max_staleness)
    sampler = samplers.as_sampler("sampler", sampler)
    if sampler.max_value > max_staleness:
        raise ConfigError("max_staleness", max_staleness, f"at least the support of sampler {sampler!r} (values up "
                          f"to {sampler.max_value})")
    mitigations = parse_mitigation(mitigation)
    use_dc = "dc_asgd" in mitigations
    use_lr = "staleness_lr" in mitigations
    dc_lambda = samplers.check_nonneg_real("dc_lambda", dc_lambda)
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
            raise ConfigError("params", None, "the current params, passed to update(), when mitigation includes "
                              "'dc_asgd'")
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
