r"""Sensitivities of the SPRINT model's epoch time to the machine's figures: "what buys the most".

:func:`sensitivities` gives ``d log T_epoch / d log theta`` for every machine figure ``theta`` at a
configuration, (a) with the configuration fixed and (b) with the node count (continuous) moving so
that the mean mini-batch stays at its value (implicit function theorem):

.. math::
    \frac{d \log T}{d \log\theta}\Big|_{E[B]} = \frac{\partial \log T}{\partial \log\theta}
    - \frac{\partial \log T / \partial \log n}{\partial \log E[B] / \partial \log n}
      \frac{\partial \log E[B]}{\partial \log\theta},

plus the exact relative change of the epoch time when the figure is doubled (both ways). Under
(a) the network cannot matter (the epoch time does not depend on ``T_u``); under (b) it does,
since ``T_epoch = N_file T_u / E[B]``. The model is pure jnp, so the derivatives are exact
(``jax.jacrev``), not finite differences.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxsprint.errors import ConfigError
from jaxsprint.perf import machines
from jaxsprint.perf.machines import Machine
from jaxsprint.perf.space import Space, evaluate

__all__ = ["Sensitivity", "sensitivities", "sensitivity_table"]

# Figures that describe the configuration space rather than a speed.
_STRUCTURAL = ("max_nodes", "gpus_per_node", "device_memory_bytes")


class Sensitivity(NamedTuple):
    """Elasticities of the epoch time w.r.t. one machine figure at a configuration.

    Attributes:
      field: Machine field.
      value: Its value.
      fixed_config: ``d log T_epoch / d log value`` with ``(n, g, b)`` fixed.
      at_minibatch: The same with the node count moving to keep the mean mini-batch.
      double_fixed: Relative change of the epoch time when the figure doubles, config fixed.
      double_at_minibatch: The same, the node count re-solved (continuous) for the same mini-batch.
    """

    field: str
    value: float
    fixed_config: float
    at_minibatch: float
    double_fixed: float
    double_at_minibatch: float


def _log_stats(space: Space, machine: Machine, log_n: jax.Array, g: float, b: float
               ) -> tuple[jax.Array, jax.Array]:
    x = jnp.stack([jnp.exp(log_n), jnp.float32(g), jnp.float32(b)])
    s = evaluate(dataclasses.replace(space, precision=None), machine, x)
    return jnp.log(s.epoch_time_s), jnp.log(s.mean_minibatch)


def _solve_log_n(space: Space, machine: Machine, g: float, b: float, log_n0: jax.Array,
                 log_minibatch: jax.Array, iters: int = 48) -> jax.Array:
    """Bisection on ``log n`` in ``[0, log_n0 + 8]`` so that ``log E[B](n) = log_minibatch``.

    ``E[B] = n g b T_u(n) / T_c`` grows with ``n``, so the root is unique (NaN outside the
    bracket, e.g. when fewer than one node would do).
    """
    def f(u):
        return _log_stats(space, machine, u, g, b)[1] - log_minibatch

    def body(_, ab):
        a, c = ab
        mid = 0.5 * (a + c)
        up = f(mid) < 0.0
        return jnp.where(up, mid, a), jnp.where(up, c, mid)

    lo, hi = jnp.float32(0.0), log_n0 + 8.0
    a, c = jax.lax.fori_loop(0, iters, body, (lo, hi))
    inside = (f(lo) <= 0.0) & (f(hi) >= 0.0)
    return jnp.where(inside, 0.5 * (a + c), jnp.nan)


def sensitivities(space: Space, nodes: int, gpus_per_node: int, sub_batch: float,
                  fields: Sequence[str] | None = None) -> list[Sensitivity]:
    """Elasticities of the epoch time w.r.t. the machine's figures (see the module docstring).

    "Mini-batch kept" lets the node count move (as a continuous variable) so that the mean
    mini-batch keeps its value: ``E[B]`` is proportional to ``n`` up to the slow growth of
    ``T_u`` with ``n``, so such an ``n`` always exists.

    Args:
      space: Space (network, machine, dataset; the precision option is ignored: fp32).
      nodes, gpus_per_node, sub_batch: The configuration.
      fields: Machine fields (default: all but the structural ones: node and GPU counts, memory).

    Returns:
      One :class:`Sensitivity` per field, sorted by ``|at_minibatch|`` then ``|fixed_config|``.

    Raises:
      ConfigError: an unknown field.
    """
    fields = [f for f in machines.FIELDS if f not in _STRUCTURAL] if fields is None else list(fields)
    for f in fields:
        if f not in machines.FIELDS:
            raise ConfigError("field", f, f"a machine figure: one of {', '.join(machines.FIELDS)}")
    g, b = float(gpus_per_node), float(sub_batch)
    ln = jnp.log(jnp.float32(nodes))
    m0 = space.machine

    def with_log(logs):
        return m0.replace(**{f: jnp.exp(logs[i]) for i, f in enumerate(fields)})

    @jax.jit
    def elasticities(logs):
        (dt_dth, dt_dn), (dm_dth, dm_dn) = jax.jacrev(
            lambda lth, lnn: _log_stats(space, with_log(lth), lnn, g, b), argnums=(0, 1))(logs, ln)
        return dt_dth, dt_dth - dt_dn / dm_dn * dm_dth

    @jax.jit
    def doubled(logs):
        base_t, base_m = _log_stats(space, with_log(logs), ln, g, b)

        def one(i):
            m2 = with_log(logs.at[i].add(jnp.log(2.0)))
            t_fixed, _ = _log_stats(space, m2, ln, g, b)
            t_at, _ = _log_stats(space, m2, _solve_log_n(space, m2, g, b, ln, base_m), g, b)
            return jnp.expm1(t_fixed - base_t), jnp.expm1(t_at - base_t)

        return jax.lax.map(one, jnp.arange(len(fields)))

    logs = jnp.stack([jnp.log(getattr(m0, f)) for f in fields])
    fixed, at = map(np.asarray, elasticities(logs))
    d_fixed, d_at = map(np.asarray, doubled(logs))
    rows = [Sensitivity(f, float(getattr(m0, f)), float(fixed[i]), float(at[i]), float(d_fixed[i]),
                        float(d_at[i])) for i, f in enumerate(fields)]
    return sorted(rows, key=lambda r: (-abs(r.at_minibatch), -abs(r.fixed_config)))


def sensitivity_table(rows: Sequence[Sensitivity], min_abs: float = 1e-4) -> str:
    """A readable table (rows whose elasticities are both below ``min_abs`` are left out)."""
    lines = [f"  {'machine figure':36s} {'value':>10s} {'dlogT/dlog (config fixed)':>26s} "
             f"{'(mini-batch kept)':>18s} {'2x: epoch (fixed)':>18s} {'(mini-batch kept)':>18s}"]
    for r in rows:
        if abs(r.fixed_config) < min_abs and abs(r.at_minibatch) < min_abs:
            continue
        lines.append(f"  {r.field:36s} {r.value:10.4g} {r.fixed_config:+26.4f} {r.at_minibatch:+18.4f}"
                     f" {100 * r.double_fixed:+17.1f}% {100 * r.double_at_minibatch:+17.1f}%")
    return "\n".join(lines)
