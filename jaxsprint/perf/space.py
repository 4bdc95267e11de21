r"""Configuration spaces of the SPRINT model: what may be chosen, what must hold, the exact evaluation.

SPRINT's use of its model (Oyama et al., IEEE BigData 2016) is to pick, before running anything, the
fastest configuration ``(N_node, N_gpu, N_Subbatch)`` whose mini-batch nearly meets a target. This module
states that problem on the pure-jnp model (:mod:`jaxsprint.perf.sprint`, :mod:`jaxsprint.perf.times`);
:mod:`jaxsprint.perf.search` solves it and :mod:`jaxsprint.perf.sensitivity` differentiates its answer.

**Problem.** With ``x = (n, g, b[, p_1..p_L])`` (nodes, learners per node, sub-batch and, optionally, a
low-precision indicator per layer row of the network's table),

.. math::
    \min_x\; T_{epoch}(x) = \frac{N_{file}\,T_c(x)}{n g b}
    \quad\text{s.t.}\quad (1-\tau) B^* \le E[B](x) \le (1+\tau) B^*,\;
    E[S](x) \le S_{max},\; \mathrm{mem}(x) \le M,\; \sum_l w_l p_l \le \phi,

with ``E[B] = b n g T_u / T_c``, ``E[S] = T_c / T_u + 1``, integer ranges for ``n, g, b`` and ``p_l`` in
``{0, 1}`` (``w_l``: share of the forward FLOPs in row ``l``; ``phi``: the low-precision budget). The
constraints ``c_i(x) <= 0`` are kept in log form (:func:`constraints`) so that a relaxed solver sees
comparable scales; feasibility itself is decided exactly on the band (:func:`score`).

**Precision option** (:class:`Precision`): a row in low precision runs its passes at ``low_peak_factor``
times the fp32 peak, moves, stores and all-reduces ``bytes_factor`` of the bytes (the momentum update stays
fp32). The budget ``phi`` is an illustrative accuracy knob, which turns the choice into a knapsack coupled
with ``(n, g, b)``: ``2^L`` times more configurations than any grid can visit (``docs/perf-search.md``).

**Compiled functions.** A :class:`Space` owns the jitted functions built for it (:meth:`Space.jitted`): its
network, ranges and options are compiled in as constants, the machine and the target are arguments. They
live as long as the space object; an equal but distinct space compiles its own, so reuse one space for
several targets or machines.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsprint.errors import ConfigError
from jaxsprint.perf import collectives, sprint, times
from jaxsprint.perf.machines import Machine
from jaxsprint.perf.networks import BYTES_PER_VALUE, NetworkCost

__all__ = ["EVAL_CHUNK", "INFEASIBLE_SCORE", "SUB_BATCH_CAP", "Precision", "Space", "Stats", "Target",
           "constraints", "evaluate", "make_space", "make_target", "score", "score_configs", "target_array"]

SUB_BATCH_CAP = 4096      # default upper bound of the sub-batch when memory allows more
INFEASIBLE_SCORE = 1e3    # score of an infeasible configuration: this + its violation (feasible: log epoch)
EVAL_CHUNK = 2048         # exact evaluations run in padded chunks of this size: one compilation per space


# ----------------------------------------------------------------------------------------------
# Space and target
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Precision:
    """Per-layer precision choice (see the module docstring).

    Attributes:
      low_peak_factor: Low-precision matmul peak over the fp32 peak (DGX H100: 989 / 67 = 14.8
        with bf16 tensor cores; 1.0 on GPUs without faster half precision, e.g. K80).
      bytes_factor: Bytes of a low-precision value over fp32 (bf16 / fp16: 0.5).
      max_low_fraction: Budget ``phi``: at most this share of the forward FLOPs in low precision.
      compress_gradients: Low-precision rows gather and all-reduce their gradients in
        ``bytes_factor`` of the bytes.
    """

    low_peak_factor: float = 989.0 / 67.0
    bytes_factor: float = 0.5
    max_low_fraction: float = 0.5
    compress_gradients: bool = True


@dataclasses.dataclass(frozen=True)
class Space:
    """A search space: the network, the machine and the ranges of the configuration.

    Build it with :func:`make_space` (which validates). ``dims`` is 3 + the number of precision
    choices (one per row of the network's table when ``precision`` is given).
    """

    network: NetworkCost
    machine: Machine
    max_nodes: int
    max_gpus_per_node: int
    max_sub_batch: int
    min_sub_batch: int = 1
    dataset_size: int = sprint.IMAGENET_TRAIN_IMAGES
    algorithm: str = "ring"
    precision: Precision | None = None
    # Jitted functions of this space by key (see `jitted`); not part of its value.
    _jitted: dict = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def num_precision(self) -> int:
        """Binary precision variables (0 without the precision option)."""
        return 0 if self.precision is None else int(self.network.kind.shape[0])

    @property
    def dims(self) -> int:
        """Length of a configuration vector ``(n, g, b, p_1..p_L)``."""
        return 3 + self.num_precision

    @property
    def lower(self) -> np.ndarray:
        """Lower bounds of ``(n, g, b)``."""
        return np.array([1, 1, self.min_sub_batch], np.int64)

    @property
    def upper(self) -> np.ndarray:
        """Upper bounds of ``(n, g, b)``."""
        return np.array([self.max_nodes, self.max_gpus_per_node, self.max_sub_batch], np.int64)

    @property
    def size(self) -> int:
        """Number of configurations (a Python int: may exceed 2^63 with precision choices)."""
        n = self.max_nodes * self.max_gpus_per_node * (self.max_sub_batch - self.min_sub_batch + 1)
        return n * 2 ** self.num_precision

    def jitted(self, key: Any, build: Callable[[], Any]) -> Any:
        """The function stored under ``key``, built by ``build()`` on first use and kept with this space.

        The functions close over this space's network and ranges (compiled in as constants) and take
        the machine and the target as arguments, so one compilation serves every machine and target.
        """
        if key not in self._jitted:
            self._jitted[key] = build()
        return self._jitted[key]


class Target(NamedTuple):
    """Constraints of a search (build with :func:`make_target`, which validates).

    Attributes:
      minibatch: Target mean mini-batch ``B*`` in samples.
      tolerance: Relative tolerance ``tau``: ``|E[B] / B* - 1| <= tau``.
      max_staleness: Largest allowed mean staleness (``inf``: no limit).
    """

    minibatch: float
    tolerance: float = 0.05
    max_staleness: float = math.inf


def make_target(minibatch: float, tolerance: float = 0.05, max_staleness: float | None = None) -> Target:
    """A validated :class:`Target`.

    Raises:
      ConfigError: a target below one sample or not finite (field ``target_minibatch``), a tolerance
        outside ``(0, 1)``, a maximum mean staleness of 1 or less (the protocol's mean staleness
        ``T_c / T_u + 1`` always exceeds 1, so such a limit can never be met).
    """
    b = sprint.finite_number("target_minibatch", minibatch, minimum=1.0, allow_minimum=True)
    try:
        tol = float(tolerance)
    except (TypeError, ValueError):
        tol = math.nan
    if not 0.0 < tol < 1.0:  # NaN fails too
        raise ConfigError("tolerance", tolerance, "a number > 0 and < 1 (relative, e.g. 0.05)")
    s = math.inf
    if max_staleness is not None:
        s = sprint.finite_number("max_staleness", max_staleness, minimum=1.0)
    return Target(b, tol, s)


def make_space(network: NetworkCost, machine: Machine, *, max_nodes: int | None = None,
               max_gpus_per_node: int | None = None, max_sub_batch: int | None = None,
               min_sub_batch: int = 1, dataset_size: int = sprint.IMAGENET_TRAIN_IMAGES,
               algorithm: str = "ring", precision: Precision | None = None) -> Space:
    """A validated :class:`Space`.

    Args:
      network: Cost table.
      machine: Machine (any preset or a calibrated one).
      max_nodes: Nodes available (default: the machine's; more is a hypothetical machine).
      max_gpus_per_node: Learners per node available (default and maximum: the machine's).
      max_sub_batch: Largest sub-batch (default: the largest that fits the accelerator memory, with
        every row in low precision when ``precision`` is given, capped at 4,096; memory is also
        a constraint of the search).
      min_sub_batch: Smallest sub-batch.
      dataset_size: ``N_file``.
      algorithm: Inter-node all-reduce (:data:`jaxsprint.perf.collectives.ALGORITHMS`).
      precision: Optional per-layer precision choice.

    Raises:
      ConfigError: non-positive counts, more learners per node than the machine has, an unknown
        algorithm, a precision option outside its range.
    """
    g_machine = int(float(machine.gpus_per_node))
    max_nodes = int(float(machine.max_nodes)) if max_nodes is None else max_nodes
    max_nodes = sprint.positive_int("max_nodes", max_nodes)
    g = g_machine if max_gpus_per_node is None else sprint.positive_int("max_gpus_per_node", max_gpus_per_node)
    if g > g_machine:
        raise ConfigError("max_gpus_per_node", g, f"1..{g_machine} (the learners per node of "
                                                  f"machine={machine.name})")
    if algorithm not in collectives.ALGORITHMS:
        raise ConfigError("algorithm", algorithm, f"one of {', '.join(collectives.ALGORITHMS)}")
    if precision is not None:
        for f, lo, hi in (("low_peak_factor", 1e-3, 1e3), ("bytes_factor", 1e-3, 1.0),
                          ("max_low_fraction", 0.0, 1.0)):
            sprint.finite_number(f, getattr(precision, f), minimum=lo, allow_minimum=True, maximum=hi)
    min_b = sprint.positive_int("min_sub_batch", min_sub_batch)
    if max_sub_batch is None:
        max_sub_batch = max(min_b, min(SUB_BATCH_CAP, _max_fitting_sub_batch(network, machine, precision)))
    max_b = sprint.positive_int("max_sub_batch", max_sub_batch)
    if max_b < min_b:
        raise ConfigError("max_sub_batch", max_b, f"an integer >= min_sub_batch={min_b}")
    return Space(network, machine, max_nodes, g, max_b, min_b, sprint.positive_int("dataset_size", dataset_size),
                 algorithm, precision)


def _max_fitting_sub_batch(network: NetworkCost, machine: Machine, precision: Precision | None) -> int:
    fixed = BYTES_PER_VALUE * 3.0 * float(network.total_params)
    act = float(network.activation_elems)
    if precision is not None:  # every row low, the input stays fp32
        rows = float(jnp.sum(network.count * network.out_elems))
        act = act - rows * (1.0 - precision.bytes_factor)
    return max(0, int(math.floor((float(machine.device_memory_bytes) - fixed) / (BYTES_PER_VALUE * act))))


# ----------------------------------------------------------------------------------------------
# The model of one configuration (pure jnp)
# ----------------------------------------------------------------------------------------------


class Stats(NamedTuple):
    """Predicted statistics of configurations (arrays; batched under vmap)."""

    epoch_time_s: jax.Array
    mean_minibatch: jax.Array
    mean_staleness: jax.Array
    t_compute_s: jax.Array
    t_update_s: jax.Array
    memory_bytes: jax.Array
    low_fraction: jax.Array


def _low_machine(machine: Machine, precision: Precision) -> Machine:
    return machine.replace(
        peak_flops_per_s=machine.peak_flops_per_s * precision.low_peak_factor,
        memory_bandwidth_bytes_per_s=machine.memory_bandwidth_bytes_per_s / precision.bytes_factor)


def evaluate(space: Space, machine: Machine, x: jax.Array) -> Stats:
    """Statistics of the configuration ``x = (n, g, b[, p_1..p_L])`` (floats; relaxed allowed).

    Without precision variables this is exactly :func:`jaxsprint.perf.sprint.predict` plus the
    memory of :func:`jaxsprint.perf.times.memory_bytes`. With them, row ``l`` contributes
    ``(1 - p_l) t_l^{fp32} + p_l t_l^{low}`` to ``T_c``, its activations are stored in
    ``1 - p_l (1 - bytes_factor)`` of the fp32 memory and (with ``compress_gradients``) its
    gradient bytes in the updater's gather and all-reduce shrink by the same factor.

    Args:
      space: The space (its network, ranges and options are static here).
      machine: Machine figures (traced: gradients w.r.t. them are allowed).
      x: ``[dims]`` configuration.

    Returns:
      :class:`Stats`.
    """
    net = space.network
    n, g, b = x[0], x[1], x[2]
    tc = times.compute_time_s(net, machine, b, g)
    mem = times.memory_bytes(net, b)
    low = jnp.float32(0.0)
    if space.precision is not None:
        p = x[3:]
        prec = space.precision
        f32, b32 = times.layer_times_s(net, machine, b)
        f16, b16 = times.layer_times_s(net, _low_machine(machine, prec), b)
        tc = tc - jnp.sum(net.count * p * ((f32 + b32) - (f16 + b16)))
        mem = mem - BYTES_PER_VALUE * b * (1.0 - prec.bytes_factor) * jnp.sum(net.count * p * net.out_elems)
        w = net.count * net.fwd_flops
        low = jnp.sum(w * p) / jnp.sum(w)
    tu = times.update_time_s(net, machine, n, g, algorithm=space.algorithm)
    if space.precision is not None and space.precision.compress_gradients:
        full = BYTES_PER_VALUE * net.total_params
        saved = BYTES_PER_VALUE * (1.0 - space.precision.bytes_factor) * jnp.sum(net.count * net.params * x[3:])
        ar = lambda nbytes: collectives.allreduce_time_s(  # noqa: E731
            nbytes, n, machine.network_latency_s, machine.network_bandwidth_bytes_per_s,
            algorithm=space.algorithm)
        tu = tu - g * saved / machine.host_memory_bandwidth_bytes_per_s - (ar(full) - ar(full - saved))
    pred = sprint.predict_from_timings(n * g, tc, tu, b, space.dataset_size)
    return Stats(pred.epoch_time_s, pred.mean_minibatch, pred.mean_staleness, tc, tu, mem, low)


def target_array(target: Target) -> jax.Array:
    """``(B*, tau, S_max)`` as a float32 array: the form the jitted functions take a target in."""
    return jnp.asarray([target.minibatch, target.tolerance, target.max_staleness], jnp.float32)


def constraints(space: Space, s: Stats, tgt: jax.Array) -> jax.Array:
    """``c_i <= 0`` in log form: mini-batch band (two), staleness limit, memory, low-precision budget.

    Args:
      space: The space.
      s: Statistics of one configuration.
      tgt: :func:`target_array` of the target (``S_max = inf``: no limit, the constraint is -1).
    """
    log_b = jnp.log(s.mean_minibatch)
    c = [jnp.log(tgt[0] * (1.0 - tgt[1])) - log_b, log_b - jnp.log(tgt[0] * (1.0 + tgt[1]))]
    limited = jnp.isfinite(tgt[2])
    c.append(jnp.where(limited, jnp.log(s.mean_staleness) - jnp.log(jnp.where(limited, tgt[2], 1.0)), -1.0))
    c.append(jnp.log(s.memory_bytes) - jnp.log(space.machine.device_memory_bytes))
    if space.precision is not None:
        c.append(s.low_fraction - space.precision.max_low_fraction)
    return jnp.stack(c)


def score(space: Space, s: Stats, tgt: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(score, feasible, violation)``: score = log epoch when feasible, else
    :data:`INFEASIBLE_SCORE` + the summed violation of :func:`constraints`.

    Feasibility is exact on the mini-batch band: ``(1 - tau) B* <= E[B] <= (1 + tau) B*``.
    """
    c = constraints(space, s, tgt)
    ok = ((s.mean_minibatch >= tgt[0] * (1.0 - tgt[1])) & (s.mean_minibatch <= tgt[0] * (1.0 + tgt[1]))
          & (s.mean_staleness <= tgt[2]) & (s.memory_bytes <= space.machine.device_memory_bytes))
    if space.precision is not None:
        ok = ok & (s.low_fraction <= space.precision.max_low_fraction + 1e-6)
    viol = jnp.sum(jnp.maximum(c, 0.0))
    return jnp.where(ok, jnp.log(s.epoch_time_s), INFEASIBLE_SCORE + viol), ok, viol


def _batched_score(space: Space):
    """Jitted, vmapped ``(machine, tgt, x[k, dims]) -> (Stats, score, feasible, violation)`` of a space."""
    def stats_and_score(machine, tgt, x):
        sp = dataclasses.replace(space, machine=machine)
        s = evaluate(sp, machine, x)
        return (s, *score(sp, s, tgt))

    return jax.jit(jax.vmap(stats_and_score, in_axes=(None, None, 0)))


def score_configs(space: Space, target: Target | jax.Array, configs: np.ndarray, chunk: int = EVAL_CHUNK
                  ) -> tuple[Stats, np.ndarray, np.ndarray, np.ndarray]:
    """Exact evaluation of many discrete configurations: ``(Stats, score, feasible, violation)`` as numpy.

    Runs in fixed-size padded chunks of ``chunk`` configurations, so any count reuses one compilation.

    Args:
      space: The space.
      target: A :class:`Target` (or its :func:`target_array`).
      configs: ``[n, dims]`` configurations.
      chunk: Configurations per compiled call.
    """
    fn = space.jitted(("score", chunk), lambda: _batched_score(space))
    tgt = target if isinstance(target, jax.Array) else target_array(target)
    x = np.asarray(configs, np.float32).reshape(-1, space.dims)
    n = len(x)
    parts = []
    for i in range(0, max(n, 1), chunk):
        part = x[i:i + chunk]
        if len(part) < chunk:
            fill = part[-1:] if len(part) else np.asarray(
                [space.lower.tolist() + [0] * space.num_precision], np.float32)
            part = np.concatenate([part, np.repeat(fill, chunk - len(part), 0)])
        parts.append(jax.tree_util.tree_map(np.asarray, fn(space.machine, tgt, jnp.asarray(part))))
    s, sc, ok, viol = jax.tree_util.tree_map(lambda *a: np.concatenate(a)[:n], *parts)
    return s, sc, ok, viol
