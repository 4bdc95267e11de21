r"""Configuration search on the differentiable SPRINT model: gradient-based and exhaustive.

SPRINT's use of its model (Oyama et al., IEEE BigData 2016) is to pick, before running anything,
the fastest configuration ``(N_node, N_gpu, N_Subbatch)`` whose mini-batch nearly meets a target.
The model of :mod:`jaxsprint.perf.sprint` is pure jnp, so this module searches with gradients:

**Problem.** With ``x = (n, g, b[, p_1..p_L])`` (nodes, learners per node, sub-batch and,
optionally, a low-precision indicator per layer row of the network's table),

.. math::
    \min_x\; T_{epoch}(x) = \frac{N_{file}\,T_c(x)}{n g b}
    \quad\text{s.t.}\quad (1-\tau) B^* \le E[B](x) \le (1+\tau) B^*,\;
    E[S](x) \le S_{max},\; \mathrm{mem}(x) \le M,\; \sum_l w_l p_l \le \phi,

with ``E[B] = b n g T_u / T_c`` and ``E[S] = T_c / T_u + 1`` (exact means of the model),
``1 <= n <= n_max``, ``1 <= g <= g_max``, ``b_min <= b <= b_max`` integers and ``p_l`` in
``{0, 1}`` (``w_l``: share of the forward FLOPs in row ``l``; ``phi``: the low-precision budget).

**Gradient search** (:func:`gradient_search`). A continuous relaxation: the integer variables are
searched as ``z = log x`` and the precision ones as ``p`` in ``[0, 1]``, with projected steps
(each step is clipped to the box ``[log lo, log hi]``, ``[0, 1]``), so the node, learner and
sub-batch bounds hold exactly and the gradient does not vanish near them (as it would with a
sigmoid). The other constraints ``c_i(x) <= 0`` are written in log form
(``log((1-tau) B*) - log E[B]``, ``log E[B] - log((1+tau) B*)``, ``log E[S] - log S_max``,
``log mem - log M``, ``sum w p - phi``) and enter the Powell-Hestenes-Rockafellar augmented
Lagrangian of the objective ``log T_epoch``

.. math::
    L_\rho(z, \lambda) = \log T_{epoch}(x(z)) + \sum_i \frac{\max(0, \lambda_i + \rho c_i)^2
    - \lambda_i^2}{2\rho},

minimised by Adam (optax) for ``inner`` steps, after which ``lambda_i <- max(0, lambda_i + rho
c_i)`` and ``rho`` grows (Nocedal and Wright, *Numerical Optimization*, 2nd ed., sec. 17.4).
Several random starts run in one ``vmap``. The end points are rounded (floor and ceil of each
integer, ``p`` at 1/2), and the best few are refined by hill climbing over a discrete
neighbourhood (steps of 0, +-1, +-2, +-3 and +-5/15/40% of the value in each integer variable,
all combinations; plus single precision flips combined with sub-batch steps), evaluated exactly.

**Grid search** (:func:`grid_search`). Every configuration of the same space, evaluated by the
same function in vmapped chunks inside one jitted loop: the baseline and the check.

**Sensitivities** (:func:`sensitivities`). ``d log T_epoch / d log theta`` for every machine
figure ``theta`` at a configuration, (a) with the configuration fixed and (b) with the node count
(continuous) moving so that the mean mini-batch stays at its value (implicit function theorem):

.. math::
    \frac{d \log T}{d \log\theta}\Big|_{E[B]} = \frac{\partial \log T}{\partial \log\theta}
    - \frac{\partial \log T / \partial \log n}{\partial \log E[B] / \partial \log n}
      \frac{\partial \log E[B]}{\partial \log\theta},

plus the exact relative change of the epoch time when the figure is doubled (both ways). Under
(a) the network cannot matter (the epoch time does not depend on ``T_u``); under (b) it does,
since ``T_epoch = N_file T_u / E[B]``: this is the answer to "what buys the most".

**Precision option** (:class:`Precision`). Row ``l`` in low precision (i) runs its passes at
``low_peak_factor`` times the fp32 peak and moves ``bytes_factor`` of the bytes (the layer times
of :func:`jaxsprint.perf.sprint.layer_times_s` on a machine with those figures), (ii) keeps its
activations in ``bytes_factor`` of the memory and (iii) hands its gradient to the updater, which
gathers and all-reduces it, in ``bytes_factor`` of the bytes (gradient compression as in
mixed-precision data-parallel training; the momentum update stays fp32). (iii) matters most:
at a given mean mini-batch the epoch time is ``N_file T_u / E[B]`` (the identity
``T_epoch E[B] = N_file T_u`` of the model), so compute speed only decides how many learners are
needed, while the updater cycle sets the epoch time. The budget ``phi`` on the share of
forward FLOPs in low precision stands for an accuracy requirement, which turns the choice into
a knapsack coupled with ``(n, g, b)``; it is an illustrative knob, not a claim about which
layers tolerate bf16. With ``L`` rows the space has ``2^L`` times more configurations: 2^48 for
ResNet-50 and 2^23 for VGG-16, where no grid can go.

References:
  Oyama et al., "Predicting statistics of asynchronous SGD parameters for a large-scale
  distributed deep learning system on GPU supercomputers", IEEE BigData 2016.
  Qiao et al., "Pollux: co-adaptive cluster scheduling for goodput-optimized deep learning",
  OSDI 2021 (fits a throughput model, then enumerates).
  Nocedal and Wright, *Numerical Optimization*, Springer 2006, ch. 17 (augmented Lagrangian).
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxsprint.errors import JaxsprintError
from jaxsprint.perf import collectives, machines, sprint
from jaxsprint.perf.machines import Machine
from jaxsprint.perf.networks import BYTES_PER_VALUE, NetworkCost

SUB_BATCH_CAP = 4096          # default upper bound of the sub-batch when memory allows more
GRID_MAX_CONFIGS = 2 ** 31 - 1  # int32 decoding of grid indices
_BIG = 1e3                    # score offset of infeasible configurations (score = log epoch if feasible)


class SearchError(JaxsprintError):
    """Invalid search input (the message names the field, the value and what is allowed)."""


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

    @property
    def num_precision(self) -> int:
        """Binary precision variables (0 without the precision option)."""
        return 0 if self.precision is None else int(self.network.kind.shape[0])

    @property
    def dims(self) -> int:
        return 3 + self.num_precision

    @property
    def lower(self) -> np.ndarray:
        return np.array([1, 1, self.min_sub_batch], np.int64)

    @property
    def upper(self) -> np.ndarray:
        return np.array([self.max_nodes, self.max_gpus_per_node, self.max_sub_batch], np.int64)

    @property
    def size(self) -> int:
        """Number of configurations (a Python int: may exceed 2^63 with precision choices)."""
        n = self.max_nodes * self.max_gpus_per_node * (self.max_sub_batch - self.min_sub_batch + 1)
        return n * 2 ** self.num_precision


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


def _number(field: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise SearchError(f"{field}={value!r} is not a number") from None
    if not math.isfinite(v):
        raise SearchError(f"{field}={value!r} is not allowed; allowed: a finite number")
    return v


def make_target(minibatch: float, tolerance: float = 0.05,
                max_staleness: float | None = None) -> Target:
    """A validated :class:`Target`.

    Raises:
      SearchError: a target below one sample or not finite, a tolerance outside ``(0, 1)``, a
        maximum mean staleness of 1 or less (the protocol's mean staleness ``T_c / T_u + 1`` always
        exceeds 1, so such a limit can never be met).
    """
    b = _number("target_minibatch", minibatch)
    if b < 1.0:
        raise SearchError(f"target_minibatch={minibatch!r} is infeasible; allowed: a number >= 1 "
                          "(samples per update)")
    tol = _number("tolerance", tolerance)
    if not 0.0 < tol < 1.0:
        raise SearchError(f"tolerance={tolerance!r} is not allowed; allowed: 0 < tolerance < 1 "
                          "(relative, e.g. 0.05)")
    s = math.inf
    if max_staleness is not None:
        s = _number("max_staleness", max_staleness)
        if s <= 1.0:
            raise SearchError(f"max_staleness={max_staleness!r} is infeasible; allowed: a number > 1 "
                              "(the mean staleness T_c/T_u + 1 always exceeds 1)")
    return Target(b, tol, s)


def _positive_int(field: str, value: Any) -> int:
    if isinstance(value, bool) or not float(value).is_integer() or int(value) < 1:
        raise SearchError(f"{field}={value!r} is not allowed; allowed: an integer >= 1")
    return int(value)


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
      SearchError: non-positive counts, more learners per node than the machine has, an unknown
        algorithm, a precision option outside its range.
    """
    g_machine = int(float(machine.gpus_per_node))
    max_nodes = int(float(machine.max_nodes)) if max_nodes is None else max_nodes
    max_nodes = _positive_int("max_nodes", max_nodes)
    g = g_machine if max_gpus_per_node is None else _positive_int("max_gpus_per_node",
                                                                  max_gpus_per_node)
    if g > g_machine:
        raise SearchError(f"max_gpus_per_node={g} is not allowed for machine={machine.name}; "
                          f"allowed: 1..{g_machine}")
    if algorithm not in collectives.ALGORITHMS:
        raise SearchError(f"algorithm={algorithm!r} is unknown; allowed: "
                          f"{', '.join(collectives.ALGORITHMS)}")
    if precision is not None:
        for f, lo, hi in (("low_peak_factor", 1e-3, 1e3), ("bytes_factor", 1e-3, 1.0),
                          ("max_low_fraction", 0.0, 1.0)):
            v = _number(f, getattr(precision, f))
            if not lo <= v <= hi:
                raise SearchError(f"{f}={v!r} is not allowed; allowed: {lo:g}..{hi:g}")
    min_b = _positive_int("min_sub_batch", min_sub_batch)
    if max_sub_batch is None:
        max_sub_batch = max(min_b, min(SUB_BATCH_CAP, _max_fitting_sub_batch(network, machine,
                                                                             precision)))
    max_b = _positive_int("max_sub_batch", max_sub_batch)
    if max_b < min_b:
        raise SearchError(f"max_sub_batch={max_b} is below min_sub_batch={min_b}; allowed: "
                          f"max_sub_batch >= min_sub_batch")
    return Space(network, machine, max_nodes, g, max_b, min_b,
                 _positive_int("dataset_size", dataset_size), algorithm, precision)


def _max_fitting_sub_batch(network: NetworkCost, machine: Machine,
                           precision: Precision | None) -> int:
    fixed = BYTES_PER_VALUE * 3.0 * float(network.total_params)
    act = float(network.activation_elems)
    if precision is not None:  # every row low, the input stays fp32
        rows = float(jnp.sum(network.count * network.out_elems))
        act = act - rows * (1.0 - precision.bytes_factor)
    return max(0, int(math.floor((float(machine.device_memory_bytes) - fixed)
                                 / (BYTES_PER_VALUE * act))))


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
    memory of :func:`jaxsprint.perf.sprint.memory_bytes`. With them, row ``l`` contributes
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
    tc = sprint.compute_time_s(net, machine, b, g)
    mem = sprint.memory_bytes(net, b)
    low = jnp.float32(0.0)
    if space.precision is not None:
        p = x[3:]
        prec = space.precision
        f32, b32 = sprint.layer_times_s(net, machine, b)
        f16, b16 = sprint.layer_times_s(net, _low_machine(machine, prec), b)
        tc = tc - jnp.sum(net.count * p * ((f32 + b32) - (f16 + b16)))
        mem = mem - BYTES_PER_VALUE * b * (1.0 - prec.bytes_factor) * jnp.sum(
            net.count * p * net.out_elems)
        w = net.count * net.fwd_flops
        low = jnp.sum(w * p) / jnp.sum(w)
    tu = sprint.update_time_s(net, machine, n, g, algorithm=space.algorithm)
    if space.precision is not None and space.precision.compress_gradients:
        full = BYTES_PER_VALUE * net.total_params
        saved = BYTES_PER_VALUE * (1.0 - space.precision.bytes_factor) * jnp.sum(
            net.count * net.params * x[3:])
        ar = lambda nbytes: collectives.allreduce_time_s(  # noqa: E731
            nbytes, n, machine.network_latency_s, machine.network_bandwidth_bytes_per_s,
            algorithm=space.algorithm)
        tu = tu - g * saved / machine.host_memory_bandwidth_bytes_per_s - (ar(full) - ar(full - saved))
    pred = sprint.predict_from_timings(n * g, tc, tu, b, space.dataset_size)
    return Stats(pred.epoch_time_s, pred.mean_minibatch, pred.mean_staleness, tc, tu, mem, low)


def _constraints(space: Space, s: Stats, tgt: jax.Array) -> jax.Array:
    """``c_i <= 0`` in log form; ``tgt = (B*, tau, S_max)`` (``S_max = inf``: no limit)."""
    log_b = jnp.log(s.mean_minibatch)
    c = [jnp.log(tgt[0] * (1.0 - tgt[1])) - log_b, log_b - jnp.log(tgt[0] * (1.0 + tgt[1]))]
    limited = jnp.isfinite(tgt[2])
    c.append(jnp.where(limited, jnp.log(s.mean_staleness) - jnp.log(jnp.where(limited, tgt[2], 1.0)),
                       -1.0))
    c.append(jnp.log(s.memory_bytes) - jnp.log(space.machine.device_memory_bytes))
    if space.precision is not None:
        c.append(s.low_fraction - space.precision.max_low_fraction)
    return jnp.stack(c)


def _score(space: Space, s: Stats, tgt: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(score, feasible, violation)``; score = log epoch when feasible, else BIG + violation.

    Feasibility is exact on the mini-batch band: ``(1 - tau) B* <= E[B] <= (1 + tau) B*``.
    """
    c = _constraints(space, s, tgt)
    ok = ((s.mean_minibatch >= tgt[0] * (1.0 - tgt[1])) & (s.mean_minibatch <= tgt[0] * (1.0 + tgt[1]))
          & (s.mean_staleness <= tgt[2]) & (s.memory_bytes <= space.machine.device_memory_bytes))
    if space.precision is not None:
        ok = ok & (s.low_fraction <= space.precision.max_low_fraction + 1e-6)
    viol = jnp.sum(jnp.maximum(c, 0.0))
    score = jnp.where(ok, jnp.log(s.epoch_time_s), _BIG + viol)
    return score, ok, viol


# ----------------------------------------------------------------------------------------------
# Compiled functions, cached per space structure (the machine and the target are arguments)
# ----------------------------------------------------------------------------------------------


def _fingerprint(tree: Any) -> str:
    h = hashlib.sha1()
    for leaf in jax.tree_util.tree_leaves(tree):
        a = np.asarray(leaf)
        h.update(str(a.dtype).encode() + str(a.shape).encode() + a.tobytes())
    return h.hexdigest()


_CACHE: dict[tuple, dict[str, Any]] = {}


def _key(space: Space) -> tuple:
    return (_fingerprint(space.network), space.network.name, space.max_nodes,
            space.max_gpus_per_node, space.max_sub_batch, space.min_sub_batch, space.dataset_size,
            space.algorithm, space.precision)


def _compiled(space: Space) -> dict[str, Any]:
    """Jitted functions of a space, compiled once per space structure and reused across calls."""
    key = _key(space)
    if key in _CACHE:
        return _CACHE[key]
    fns: dict[str, Any] = {}

    def stats_and_score(machine, tgt, x):
        sp = dataclasses.replace(space, machine=machine)
        s = evaluate(sp, machine, x)
        score, ok, viol = _score(sp, s, tgt)
        return s, score, ok, viol

    fns["evaluate"] = jax.jit(jax.vmap(stats_and_score, in_axes=(None, None, 0)))
    _CACHE[key] = fns
    return fns


# ----------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Candidate:
    """One discrete configuration with its predicted statistics."""

    nodes: int
    gpus_per_node: int
    sub_batch: int
    epoch_time_s: float
    mean_minibatch: float
    mean_staleness: float
    t_compute_s: float
    t_update_s: float
    memory_bytes: float
    feasible: bool
    violation: float
    low_precision: tuple[int, ...] | None = None
    low_fraction: float = 0.0

    @property
    def config(self) -> tuple[int, ...]:
        base = (self.nodes, self.gpus_per_node, self.sub_batch)
        return base + (self.low_precision or ())

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if self.low_precision is None:
            d.pop("low_precision")
            d.pop("low_fraction")
        else:
            d["low_precision"] = list(self.low_precision)
        return d


@dataclasses.dataclass
class SearchResult:
    """Outcome of a search.

    Attributes:
      best: The fastest feasible configuration, or None when no configuration meets the target.
      closest: When ``best`` is None, the configuration with the smallest constraint violation.
      runner_ups: Next-best feasible configurations that differ from the best and each other in
        learners per node or by more than 2% in nodes.
      evaluations: Model evaluations by kind (``gradient``: value-and-gradient evaluations of the
        relaxation; ``discrete``: exact evaluations while rounding and refining; ``grid``).
      space_size: Configurations in the space.
      wall_s: Wall-clock seconds of the search (after compilation; ``compile_s`` separately).
      trajectory: ``[starts, steps, 2]`` (epoch time, mean mini-batch) of the relaxation, or None.
      feasible_count: Feasible configurations (grid search only).
    """

    best: Candidate | None
    closest: Candidate | None
    runner_ups: list[Candidate]
    evaluations: dict[str, int]
    space_size: int
    wall_s: float
    compile_s: float = 0.0
    trajectory: np.ndarray | None = None
    feasible_count: int | None = None

    @property
    def feasible(self) -> bool:
        return self.best is not None

    @property
    def total_evaluations(self) -> int:
        return int(sum(self.evaluations.values()))


def _candidate(space: Space, x: np.ndarray, s: Stats, i: int, ok: np.ndarray,
               viol: np.ndarray) -> Candidate:
    low = tuple(int(v) for v in x[i, 3:]) if space.precision is not None else None
    return Candidate(int(x[i, 0]), int(x[i, 1]), int(x[i, 2]), float(s.epoch_time_s[i]),
                     float(s.mean_minibatch[i]), float(s.mean_staleness[i]), float(s.t_compute_s[i]),
                     float(s.t_update_s[i]), float(s.memory_bytes[i]), bool(ok[i]), float(viol[i]),
                     low, float(s.low_fraction[i]))


EVAL_CHUNK = 2048  # exact evaluations run in chunks of this size: one compilation per space


def _evaluate_np(space: Space, target: Target | jax.Array, configs: np.ndarray,
                 chunk: int = EVAL_CHUNK) -> tuple[Stats, np.ndarray, np.ndarray, np.ndarray]:
    """``(Stats, score, feasible, violation)`` as numpy arrays, in fixed-size padded chunks."""
    fn = _compiled(space)["evaluate"]
    tgt = target if isinstance(target, jax.Array) else _tgt(target)
    x = np.asarray(configs, np.float32).reshape(-1, space.dims)
    n = len(x)
    parts = []
    for i in range(0, max(n, 1), chunk):
        part = x[i:i + chunk]
        if len(part) < chunk:
            fill = part[-1:] if len(part) else np.tile(
                np.asarray(space.lower.tolist() + [0] * space.num_precision, np.float32), (1, 1))
            part = np.concatenate([part, np.repeat(fill, chunk - len(part), 0)])
        parts.append(jax.tree_util.tree_map(np.asarray, fn(space.machine, tgt, jnp.asarray(part))))
    s, score, ok, viol = jax.tree_util.tree_map(lambda *a: np.concatenate(a)[:n], *parts)
    return s, score, ok, viol


def evaluate_configs(space: Space, target: Target, configs: Sequence[Sequence[int]]
                     ) -> list[Candidate]:
    """Exact statistics and feasibility of discrete configurations (for tables and checks)."""
    x = np.asarray(configs, np.float32).reshape(-1, space.dims)
    s, _, ok, viol = _evaluate_np(space, target, x)
    return [_candidate(space, x, s, i, ok, viol) for i in range(len(x))]


def score_configs(space: Space, target: Target, configs: np.ndarray, chunk: int = EVAL_CHUNK
                  ) -> tuple[Stats, np.ndarray, np.ndarray]:
    """Vectorised exact evaluation: ``(Stats of numpy arrays, feasible, violation)``.

    For many configurations at once (``configs``: ``[n, dims]``), e.g. custom baselines.
    """
    s, _, ok, viol = _evaluate_np(space, target, configs, chunk)
    return s, ok, viol


def _tgt(target: Target) -> jax.Array:
    return jnp.asarray([target.minibatch, target.tolerance, target.max_staleness], jnp.float32)


# ----------------------------------------------------------------------------------------------
# Grid search
# ----------------------------------------------------------------------------------------------


def _grid_fn(space: Space, chunk: int, top_k: int):
    fns = _compiled(space)
    key = ("grid", chunk, top_k)
    if key in fns:
        return fns[key]
    nb = space.max_sub_batch - space.min_sub_batch + 1
    g_max, nprec = space.max_gpus_per_node, space.num_precision
    total = space.size
    num_chunks = -(-total // chunk)

    def decode(idx):
        rest = idx
        bits = []
        for _ in range(nprec):
            bits.append(rest % 2)
            rest = rest // 2
        b = rest % nb + space.min_sub_batch
        rest = rest // nb
        g = rest % g_max + 1
        n = rest // g_max + 1
        cols = [n, g, b] + bits[::-1]
        return jnp.stack(cols, -1).astype(jnp.float32)

    def run(machine, tgt):
        sp = dataclasses.replace(space, machine=machine)
        f = jax.vmap(lambda x: _score(sp, evaluate(sp, machine, x), tgt))

        def body(i, carry):
            best_s, best_i, close_v, close_i, count = carry
            idx = i * chunk + jnp.arange(chunk, dtype=jnp.int32)
            valid = idx < total
            score, ok, viol = f(decode(jnp.minimum(idx, total - 1)))
            ok = ok & valid
            score = jnp.where(ok, score, jnp.inf)
            neg, pos = jax.lax.top_k(-score, top_k)
            all_s = jnp.concatenate([best_s, -neg])
            all_i = jnp.concatenate([best_i, idx[pos]])
            keep = jnp.argsort(all_s)[:top_k]
            viol = jnp.where(valid & ~ok, viol, jnp.inf)
            j = jnp.argmin(viol)
            better = viol[j] < close_v
            return (all_s[keep], all_i[keep], jnp.where(better, viol[j], close_v),
                    jnp.where(better, idx[j], close_i), count + jnp.sum(ok))

        init = (jnp.full((top_k,), jnp.inf), jnp.zeros((top_k,), jnp.int32), jnp.float32(jnp.inf),
                jnp.int32(0), jnp.int32(0))
        return jax.lax.fori_loop(0, num_chunks, body, init)

    fns[key] = (jax.jit(run), decode)
    return fns[key]


def grid_search(space: Space, target: Target, *, chunk: int = 1 << 16, top_k: int = 64
                ) -> SearchResult:
    """Exhaustive search: every configuration of ``space``, vmapped in chunks in one jitted loop.

    Args:
      space: The space (at most 2^31 - 1 configurations).
      target: Constraints.
      chunk: Configurations per vmapped chunk.
      top_k: Feasible configurations kept (for the runner-ups).

    Returns:
      :class:`SearchResult` with ``evaluations = {"grid": space.size}``.

    Raises:
      SearchError: a space too large to enumerate.
    """
    if space.size > GRID_MAX_CONFIGS:
        raise SearchError(f"the grid has {space.size:.3g} configurations; allowed: at most "
                          f"{GRID_MAX_CONFIGS} (use gradient_search: the launcher without --grid)")
    chunk = int(min(chunk, 1 << max(4, math.ceil(math.log2(space.size)))))
    t0 = time.perf_counter()
    run, decode = _grid_fn(space, chunk, top_k)
    tgt = _tgt(target)
    lowered = run.lower(space.machine, tgt)
    compiled = lowered.compile()
    t1 = time.perf_counter()
    best_s, best_i, close_v, close_i, count = jax.block_until_ready(compiled(space.machine, tgt))
    wall = time.perf_counter() - t1
    best_s, best_i = np.asarray(best_s), np.asarray(best_i)
    idx = best_i[np.isfinite(best_s)]
    if idx.size == 0:
        idx = np.asarray([int(close_i)])
    x = np.asarray(decode(jnp.asarray(idx, jnp.int32)))
    cands = evaluate_configs(space, target, x)
    best = cands[0] if cands[0].feasible else None
    return SearchResult(best, None if best else cands[0], _runner_ups(cands[1:], best),
                        {"grid": space.size}, space.size, wall, t1 - t0,
                        feasible_count=int(count))


def _runner_ups(cands: list[Candidate], best: Candidate | None, k: int = 5,
                min_node_gap: float = 0.02) -> list[Candidate]:
    """Feasible candidates by epoch time, each a real alternative to those already listed.

    A candidate is listed when, against every listed one (the best included), it has another
    learner count per node or a node count more than ``min_node_gap`` (relative) away.
    """
    listed = [] if best is None else [best]
    out = []
    for c in sorted((c for c in cands if c.feasible), key=lambda c: c.epoch_time_s):
        if all(c.gpus_per_node != p.gpus_per_node
               or abs(c.nodes - p.nodes) > min_node_gap * max(p.nodes, 1) for p in listed):
            listed.append(c)
            out.append(c)
        if len(out) == k:
            break
    return out


# ----------------------------------------------------------------------------------------------
# Gradient search
# ----------------------------------------------------------------------------------------------


def _box(space: Space) -> tuple[np.ndarray, np.ndarray]:
    """Bounds of the search variables ``z``: ``log x`` for the integers, ``p`` for precision."""
    lo = np.concatenate([np.log(space.lower.astype(np.float64)), np.zeros(space.num_precision)])
    hi = np.concatenate([np.log(space.upper.astype(np.float64)), np.ones(space.num_precision)])
    return lo.astype(np.float32), hi.astype(np.float32)


def _relaxation_fn(space: Space, batch: int, outer: int, inner: int):
    """Jitted augmented-Lagrangian solve of ``batch`` relaxed problems with per-problem boxes.

    ``run(machine, tgt, z0, lo, hi, lr, rho0, rho_growth, lr_decay) -> (x, merit, traj)``; a
    variable is fixed by giving it ``lo = hi``. ``merit`` is the log epoch time where the relaxed
    point meets every constraint to within 1e-3 (log units), else ``BIG`` + the violation.
    """
    fns = _compiled(space)
    key = ("relax", batch, outer, inner)
    if key in fns:
        return fns[key]
    nprec = space.num_precision

    def to_x(z):  # integer variables are searched in log space, precision ones directly
        return jnp.concatenate([jnp.exp(z[:3]), z[3:]]) if nprec else jnp.exp(z)

    def run(machine, tgt, z0, lo, hi, lr, rho0, rho_growth, lr_decay):
        sp = dataclasses.replace(space, machine=machine)

        def parts(z):
            s = evaluate(sp, machine, to_x(z))
            return jnp.log(s.epoch_time_s), _constraints(sp, s, tgt), s

        def lagrangian(z, lam, rho):
            f, c, s = parts(z)
            pen = jnp.sum((jnp.maximum(0.0, lam + rho * c) ** 2 - lam ** 2) / (2.0 * rho))
            return f + pen, s

        adam = optax.scale_by_adam()

        def one(z, lo, hi):
            z = jnp.clip(z, lo, hi)
            lam = jnp.zeros_like(parts(z)[1])

            def inner_step(carry, _):
                z, opt, lam, rho, step_size = carry
                (_, s), gz = jax.value_and_grad(lagrangian, has_aux=True)(z, lam, rho)
                upd, opt = adam.update(gz, opt)
                z = jnp.clip(z - step_size * upd, lo, hi)  # projected step: the box holds exactly
                return (z, opt, lam, rho, step_size), jnp.stack([s.epoch_time_s, s.mean_minibatch])

            def outer_step(carry, _):
                carry, traj = jax.lax.scan(inner_step, carry, None, length=inner)
                z, opt, lam, rho, step_size = carry
                lam = jnp.maximum(0.0, lam + rho * parts(z)[1])
                return (z, opt, lam, rho * rho_growth, step_size * lr_decay), traj

            carry = (z, adam.init(z), lam, jnp.float32(rho0), jnp.float32(lr))
            (z, *_), traj = jax.lax.scan(outer_step, carry, None, length=outer)
            f, c, _ = parts(z)
            viol = jnp.sum(jnp.maximum(c, 0.0))
            merit = jnp.where(viol <= 1e-3, f, _BIG + viol)
            return z, merit, traj.reshape(outer * inner, 2)

        return jax.vmap(one)(z0, lo, hi)

    fns[key] = jax.jit(run)
    return fns[key]


def _neighbourhood(space: Space, x: np.ndarray, fractions=(0.05, 0.15, 0.4)) -> np.ndarray:
    """Discrete neighbours of configurations ``x`` ``[S, dims]`` -> ``[S, C, dims]`` (C fixed).

    Integer variables: every combination of steps ``0, +-1, +-2, +-3, +-max(4, f v)`` for ``f`` in
    ``fractions``; precision variables: each single flip combined with each sub-batch step.
    Out-of-range values are clipped (duplicates are harmless).
    """
    steps = []
    for d in range(3):
        v = x[:, d:d + 1].astype(np.int64)
        rel = [np.maximum(4, np.rint(v * f).astype(np.int64)) for f in fractions]
        cols = [np.zeros_like(v)] + [np.full_like(v, s * k) for k in (1, 2, 3) for s in (-1, 1)]
        cols += [s * r for r in rel for s in (-1, 1)]
        steps.append(np.concatenate(cols, 1))  # [S, 13]
    m = steps[0].shape[1]
    sn = steps[0][:, :, None, None]
    sg = steps[1][:, None, :, None]
    sb = steps[2][:, None, None, :]
    shape = (x.shape[0], m, m, m)
    delta = np.stack([np.broadcast_to(sn, shape), np.broadcast_to(sg, shape),
                      np.broadcast_to(sb, shape)], -1).reshape(x.shape[0], m ** 3, 3)
    base = np.repeat(x[:, None, :], m ** 3, 1).astype(np.int64)
    base[:, :, :3] += delta
    out = [base]
    if space.num_precision:
        L = space.num_precision
        flips = np.repeat(x[:, None, :], L * m, 1).astype(np.int64)  # [S, L*m, dims]
        for l in range(L):
            sl = slice(l * m, (l + 1) * m)
            flips[:, sl, 3 + l] = 1 - flips[:, sl, 3 + l]
            flips[:, sl, 2] += steps[2]
        out.append(flips)
    nb = np.concatenate(out, 1)
    nb[:, :, :3] = np.clip(nb[:, :, :3], space.lower, space.upper)
    return nb


def _beam(z: np.ndarray, merit: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` best distinct points (by merit; duplicates only to fill up)."""
    order = np.argsort(merit, kind="stable")
    keys = np.round(z, 3)
    picked, seen = [], set()
    for i in order:
        key = keys[i].tobytes()
        if key not in seen:
            seen.add(key)
            picked.append(i)
        if len(picked) == k:
            break
    picked += [picked[j % len(picked)] for j in range(k - len(picked))]
    return np.asarray(picked)


def gradient_search(space: Space, target: Target, *, starts: int = 32, outer: int = 6,
                    inner: int = 50, learning_rate: float = 0.1, rho0: float = 10.0,
                    rho_growth: float = 3.0, lr_decay: float = 0.8, refine_seeds: int = 4,
                    max_refine_steps: int = 40, seed: int = 0) -> SearchResult:
    """Gradient-based search over the relaxed configuration, then rounding and discrete refinement.

    1. **Relax.** ``2 * starts`` random points in the box are optimised by the augmented
       Lagrangian with projected Adam (module docstring); the best ``starts`` are kept.
    2. **Round (relax-and-fix, as a beam).** The precision variables are rounded at 1/2; then
       the integer variables one at a time, coarsest range first: each kept point branches on
       the floor and the ceiling of the variable, the remaining free variables are re-optimised
       from there (warm start), and the ``starts`` best distinct branches are kept (so when the
       starts agree, both roundings survive). This lets the other variables absorb a rounding
       step (e.g. fewer learners per node, more nodes) instead of leaving the band.
    3. **Refine.** The best ``refine_seeds`` integer points climb over the discrete neighbourhood
       (every combination of small and relative steps) with exact evaluations, until no
       neighbour is better (feasible first, then the epoch time).

    Args:
      space: The space.
      target: Constraints.
      starts: Relaxed problems kept after step 1 (``2 * starts`` are solved in one vmapped call).
      outer: Augmented-Lagrangian outer iterations (multiplier updates) per solve.
      inner: Adam steps per outer iteration.
      learning_rate: Adam step size (log units for the integer variables), multiplied by
        ``lr_decay`` after each outer iteration.
      rho0: Initial penalty weight, multiplied by ``rho_growth`` after each outer iteration.
      rho_growth: Penalty growth factor.
      lr_decay: Step-size decay per outer iteration.
      refine_seeds: Integer points refined by hill climbing.
      max_refine_steps: Hill-climbing steps at most.
      seed: Seed of the starting points.

    Returns:
      :class:`SearchResult`: the best feasible configuration (or the closest one when none is
      feasible), runner-ups, evaluation counts (``gradient``: value-and-gradient evaluations of
      the relaxation; ``discrete``: exact evaluations) and the trajectories of step 1.
    """
    tgt = _tgt(target)
    batch = 2 * starts
    lo0, hi0 = _box(space)
    t0 = time.perf_counter()
    relax = _relaxation_fn(space, batch, outer, inner)
    hyper = tuple(jnp.float32(v) for v in (learning_rate, rho0, rho_growth, lr_decay))
    u0 = np.asarray(jax.random.uniform(jax.random.PRNGKey(seed), (batch, space.dims)))
    z0 = lo0 + (hi0 - lo0) * u0
    lo = np.tile(lo0, (batch, 1))
    hi = np.tile(hi0, (batch, 1))
    compiled = relax.lower(space.machine, tgt, z0, lo, hi, *hyper).compile()
    _evaluate_np(space, tgt, np.zeros((1, space.dims)) + 1)  # compiles the exact evaluation
    t1 = time.perf_counter()
    evals = {"gradient": 0, "discrete": 0}

    def solve(z, lo, hi):
        z, merit, traj = compiled(space.machine, tgt, z, lo, hi, *hyper)
        evals["gradient"] += batch * outer * inner
        return np.asarray(z), np.asarray(merit), np.asarray(traj)

    # 1. Relax from random starts; keep the best half.
    z, merit, traj = solve(z0, lo, hi)
    keep = np.argsort(merit, kind="stable")[:starts]
    z, lo, hi = z[keep], lo[keep], hi[keep]

    # 2. Relax-and-fix: precision at 1/2 (all at once), then each integer variable, coarsest first.
    if space.num_precision:
        p = np.rint(z[:, 3:])
        z[:, 3:], lo[:, 3:], hi[:, 3:] = p, p, p
    for d in np.argsort(space.upper - space.lower, kind="stable"):
        v = np.exp(z[:, d].astype(np.float64))
        branches = np.clip(np.stack([np.floor(v), np.ceil(v)]), space.lower[d], space.upper[d])
        zb, lob, hib = (np.concatenate([a, a]) for a in (z, lo, hi))
        fixed = np.log(branches.reshape(-1)).astype(np.float32)
        zb[:, d], lob[:, d], hib[:, d] = fixed, fixed, fixed
        zb, mb, _ = solve(zb, lob, hib)
        pick = _beam(zb, mb, starts)
        z, lo, hi = zb[pick], lob[pick], hib[pick]
    x_int = np.concatenate([np.rint(np.exp(z[:, :3].astype(np.float64))), np.rint(z[:, 3:])], 1)
    x_int = np.clip(x_int.astype(np.int64), np.concatenate([space.lower, np.zeros(space.num_precision,
                                                                                  np.int64)]),
                    np.concatenate([space.upper, np.ones(space.num_precision, np.int64)]))

    # 3. Exact evaluation and hill climbing over the discrete neighbourhood.
    seen: dict[tuple, tuple[float, Candidate]] = {}

    def run_eval(xs: np.ndarray) -> np.ndarray:
        s, score, ok, viol = _evaluate_np(space, tgt, xs)
        evals["discrete"] += len(xs)
        for i in np.nonzero(ok)[0]:  # feasible ones, for the runner-ups
            key = tuple(xs[i])
            if key not in seen:
                seen[key] = (float(score[i]), _candidate(space, xs, s, i, ok, viol))
        return score

    score = run_eval(x_int)
    seeds, keys = [], set()
    for i in np.argsort(score, kind="stable"):
        if tuple(x_int[i]) not in keys:
            keys.add(tuple(x_int[i]))
            seeds.append(i)
        if len(seeds) == refine_seeds:
            break
    seeds += [seeds[-1]] * (refine_seeds - len(seeds))
    cur, cur_score = x_int[seeds].copy(), score[seeds].copy()
    for _ in range(max_refine_steps):
        nb = _neighbourhood(space, cur)
        sc = run_eval(nb.reshape(-1, space.dims)).reshape(nb.shape[:2])
        j = np.argmin(sc, 1)
        new = sc[np.arange(len(cur)), j]
        moved = new < cur_score - 1e-7
        if not moved.any():
            break
        cur[moved] = nb[np.arange(len(cur)), j][moved]
        cur_score[moved] = new[moved]
    wall = time.perf_counter() - t1

    best = evaluate_configs(space, target, cur[int(np.argmin(cur_score))][None])[0]
    feasible = [c for _, c in sorted(seen.values(), key=lambda v: v[0])]
    if feasible and (not best.feasible or feasible[0].epoch_time_s < best.epoch_time_s):
        best = feasible[0]
    ok = best.feasible
    return SearchResult(best if ok else None, None if ok else best,
                        _runner_ups(feasible, best if ok else None), evals, space.size, wall,
                        t1 - t0, trajectory=traj[keep])


# ----------------------------------------------------------------------------------------------
# Sensitivities
# ----------------------------------------------------------------------------------------------

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
      SearchError: an unknown field.
    """
    fields = [f for f in machines._FIELDS if f not in _STRUCTURAL] if fields is None else list(fields)
    for f in fields:
        if f not in machines._FIELDS:
            raise SearchError(f"field={f!r} is unknown; allowed: {', '.join(machines._FIELDS)}")
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


__all__ = ["Candidate", "Precision", "SearchError", "SearchResult", "Sensitivity", "Space", "Stats",
           "Target", "evaluate", "evaluate_configs", "gradient_search", "grid_search", "make_space",
           "make_target", "score_configs", "sensitivities", "sensitivity_table"]
