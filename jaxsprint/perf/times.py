r"""Times of the SPRINT model: layer, device-step, learner (``T_c``) and updater (``T_u``) times.

Pure jnp (jit, vmap and grad work, also w.r.t. every machine figure). The protocol that turns these
times into epoch times and distributions is :mod:`jaxsprint.perf.sprint`.

**Times** (RECONSTRUCTION, calibrated through the machine's efficiency fields):

.. math::
    T_c(b) = t_{input} + t_{copy} + t_{step} + \sum_l n_l \big(t^{f}_l(b) + t^{b}_l(b)
             + 3\,t_{layer}\big), \qquad
    t_l(b) = \mathrm{smax}\Big(\sum_p \frac{b F_{l,p}}{\pi\,e_{l,p}(b)},
             \frac{b A_l + W_l}{\beta_{mem}\,e_{mem}}\Big)

with ``e_p = e_p^max s(rows) s(cols) s(depth) s(b)``, ``s(x) = x / (x + x_half)``, the efficiency of
pass ``p`` (forward, input gradient, weight gradient) as a GEMM: it grows with the batch (rows =
batch x pixels) and the channel counts and saturates; ``pi`` is the peak FLOP/s,
``A_l`` activation bytes per sample, ``W_l`` weight bytes, ``smax`` a smooth maximum (the
roofline), ``t_input = b * input_bytes * gpus_per_node / storage_bw`` and ``t_copy = 2 * 4P /
pcie_bw`` (weights down, gradient up). The updater cycle:
``T_u = (gpus_per_node + passes) * 4P / host_bw + allreduce(4P, nodes) + t_overhead``.

**The runtime on one machine** (:mod:`jaxsprint.runtime`: learner threads that may share cores, an updater
thread per host process). A closed network with two shared resources: each host process's interpreter lock
(the learners' host work ``g`` per cycle, ``learner_overhead_s``, is serialised within a process) and the
``C`` compute units (``cores_per_node``; a step on busy cores takes ``p(b)`` of them, and the ``H``
co-located updaters take ``c_u`` each while they work, ``updater_cores``, for their busy fraction ``beta`` of
the cycle). The learner cycle is the smooth maximum (exponent ``k`` = :data:`RUNTIME_SHARPNESS`) of its three
bounds:

.. math::
    T_c = \big(t_{lone}^k + t_{lock}^k + t_{cores}^k\big)^{1/k}, \quad
    t_{lone} = T_c(b) + g, \quad t_{lock} = \frac{N_h\,g}{1 - \beta/2}, \quad
    t_{cores} = \frac{N\,p(b)\,T_c(b)}{C - H \beta c_u}, \quad
    p(b) = 1 + (p - 1)\frac{b}{b + b_p}, \\
    T_u = t_{own} + t_{net} + \mathrm{allreduce}(4P, nodes), \\
    t_{own} = \big((N_h + passes)\,4P/\beta_{host} + t_{overhead} + c\,N_h + q\,u\,T_c(b)
              + t_{apply}\,(1 - e^{-N_{all} T_u / T_c})\big)\big(1 + s_H [nodes > 1]\big), \quad
    \beta = t_{own} / T_u

``T_c(b)`` the learner's device step above, ``N_h`` the learners of one host (whose gradients its updater
takes in, ``c = updater_per_learner_s`` each), ``N`` the learners on the cores (every host's when the hosts are
processes of one machine), ``N_all`` every host's learners, ``t_net`` the runtime's emulated network time
(``config.sprint.network_time_s``), the all-reduce the gloo (or NCCL) sum across the hosts (0 for one host).
The step's cores: ``p`` = ``learner_step_cores``, reached at large sub-batches when ``b_p`` =
``learner_step_cores_half_batch`` > 0 (a small step on busy cores costs about one core; a large one more, as
its memory traffic and the intra-op threads of a CPU step grow with it), at every sub-batch when ``b_p = 0``.
The apply term: a cycle that gathered no gradient skips the optimizer (``jaxsprint.runtime.updater``), so the
update's own cost ``t_apply`` (``updater_apply_s``) is paid in the fraction ``1 - exp(-m)`` of cycles that
gather any, ``m = N_all T_u / T_c`` the mean global count (arrivals taken as Poisson); as ``T_u`` and ``T_c``
then depend on each other, :func:`runtime_times` iterates the two :data:`RUNTIME_ITERATIONS` times from
every cycle non-empty. The queue term: once the learners alone fill the cores (``u = clip(N - C + 1, 0,
1)``), the updater's work also waits about a fraction ``q`` (``updater_queue``) of one device step per cycle.
With several co-located hosts the updater's own work stretches by ``1 + s_H`` (``updater_hosts_stretch``:
each all-reduce waits for the slower process). The interpreter lock's bound counts the updater's hold as half
its busy fraction. The form was chosen from measured runs of the runtime on two CPUs
(screened with an earlier version, commit eb38136; ``docs/sprint-runtime.md``); with ``g = c = q = s_H = c_u =
t_apply = 0`` and ``p = 1`` the learner's cycle is the smooth maximum of ``T_c(b)`` and ``N T_c(b) / C`` (at
most ``2^{1/k}`` above the larger, at ``N = C``) and the updater's the SPRINT model's.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsprint.perf import collectives
from jaxsprint.perf.machines import Machine
from jaxsprint.perf.networks import (BYTES_PER_VALUE, KIND_CONV, KIND_DENSE, KIND_MAXPOOL, KIND_NORM, KIND_XLA,
                                     NetworkCost)

__all__ = ["RUNTIME_ITERATIONS", "RUNTIME_SHARPNESS", "RuntimeTimes", "SMOOTH_MAX_EPS", "compute_time_s",
           "device_step_time_s", "layer_times_s", "max_sub_batch", "memory_bytes", "nonempty_probability",
           "runtime_compute_time_s", "runtime_times", "runtime_update_time_s", "smooth_max", "step_cores",
           "update_time_s"]

SMOOTH_MAX_EPS = 0.05  # relative width of the roofline's smooth corner
RUNTIME_ITERATIONS = 12  # fixed-point steps of runtime_times (the empty cycles' share couples T_u and T_c)
# Exponent of the smooth maximum of the learner cycle's three bounds (runtime_times): 4 puts N = C learners
# 19% above either bound alone, as two learners on this project's two cores measure (8 and 2 fit worse on
# both CPUs of docs/sprint-runtime.md).
RUNTIME_SHARPNESS = 4.0


def smooth_max(a: jax.Array, b: jax.Array, eps: float = SMOOTH_MAX_EPS) -> jax.Array:
    """Smooth maximum ``(a + b + sqrt((a - b)^2 + eps^2 (a + b)^2)) / 2`` of non-negative values.

    Exceeds ``max(a, b)`` by at most ``eps / 2 (a + b)``, i.e. a relative ``eps`` at the corner ``a = b``
    and less away from it (plus 5e-16 s, a floor that keeps the derivative finite at ``a = b = 0``); it is
    differentiable everywhere
    (both arguments get gradient near the corner) and costs one square root.
    """
    s = a + b
    # The tiny floor keeps the derivative finite where both are 0 (a pass a table row does not have, as in
    # the two-row XLA tables): sqrt'(0) is infinite and would turn the whole gradient into NaN.
    return 0.5 * (s + jnp.sqrt((a - b) ** 2 + (eps * s) ** 2 + 1e-30))


def _slowdown(log_size: jax.Array, known: jax.Array, half: jax.Array,
              sharpness: jax.Array) -> jax.Array:
    """``1 / s(x) = 1 + (half / x)^g`` from ``log x``; unknown sizes (``known`` False) cost 1.

    Taking logs once (``log(b rows) = log b + log rows``, the second a constant of the network)
    leaves one ``exp`` per factor, which keeps vmapped evaluation fast.
    """
    return jnp.where(known, 1.0 + jnp.exp(sharpness * (jnp.log(half) - log_size)), 1.0)


def _layer_times(network: NetworkCost, machine: Machine, sub_batch: jax.Array,
                 matmul: jax.Array | bool | None = None) -> tuple[jax.Array, jax.Array]:
    """Core of :func:`layer_times_s`; ``matmul`` may be a static bool for a homogeneous table."""
    b = jnp.asarray(sub_batch, jnp.float32)
    m = machine
    net = network
    if matmul is None:
        matmul = (net.kind == KIND_CONV) | (net.kind == KIND_DENSE) | (net.kind == KIND_XLA)
    weight_bytes = BYTES_PER_VALUE * net.params
    norm = net.kind == KIND_NORM
    bw_fwd = m.memory_bandwidth_bytes_per_s * jnp.where(norm, m.norm_memory_efficiency,
                                                        m.memory_efficiency)
    bw_bwd = m.memory_bandwidth_bytes_per_s * jnp.where(
        norm, m.norm_memory_efficiency,
        jnp.where(net.kind == KIND_MAXPOOL, m.maxpool_backward_memory_efficiency,
                  m.memory_efficiency))
    hr, hc, hd = m.half_efficiency_rows, m.half_efficiency_cols, m.half_efficiency_depth
    g = m.efficiency_sharpness

    log_b = jnp.log(b)

    def log_of(x):  # (log x, known); unknown sizes get a harmless finite log
        return jnp.where(x > 0, jnp.log(jnp.maximum(x, 1e-30)), 0.0), x > 0

    (l_rows, k_rows), (l_cols, k_cols), (l_depth, k_depth) = map(
        log_of, (net.rows, net.cols, net.depth))
    (l_irows, k_irows), (l_icols, k_icols), (l_idepth, k_idepth) = map(
        log_of, (net.in_rows, net.in_cols, net.in_depth))

    hb = m.half_efficiency_batch
    batch_slow = jnp.where(hb > 0, _slowdown(log_b, True, jnp.maximum(hb, 1e-30), g), 1.0)  # 0: off

    def gemm(flops, eff_max, rows, cols, depth, working_set_bytes, cache_slowdown):
        # rows, cols, depth: (log size, known) pairs.
        plain = b * flops / m.peak_flops_per_s
        if matmul is False:
            return plain
        slow = (_slowdown(*rows, hr, g) * _slowdown(*cols, hc, g) * _slowdown(*depth, hd, g)) * batch_slow
        slow = slow * (1.0 + cache_slowdown * working_set_bytes / (working_set_bytes + m.cache_bytes))
        if matmul is True:
            return plain * slow / eff_max
        return jnp.where(matmul, plain * slow / eff_max, plain)

    ws_fwd, ws_bwd = b * net.fwd_bytes + weight_bytes, b * net.bwd_bytes + 2.0 * weight_bytes
    t_fwd = smooth_max(gemm(net.fwd_flops, m.efficiency_fwd, (log_b + l_rows, k_rows),
                            (l_cols, k_cols), (l_depth, k_depth), ws_fwd, m.cache_miss_slowdown),
                       (b * net.fwd_bytes + weight_bytes) / bw_fwd)
    t_bwd_compute = (
        gemm(net.bwd_data_flops, m.efficiency_bwd_data, (log_b + l_irows, k_irows),
             (l_icols, k_icols), (l_idepth, k_idepth), ws_bwd, m.cache_miss_slowdown)
        + gemm(net.bwd_weight_flops, m.efficiency_bwd_weight, (l_depth, k_depth), (l_cols, k_cols),
               (log_b + l_rows, k_rows), ws_bwd, m.cache_miss_slowdown_weight_grad))
    t_bwd = smooth_max(t_bwd_compute, (b * net.bwd_bytes + 2.0 * weight_bytes) / bw_bwd)
    return t_fwd, t_bwd


def layer_times_s(network: NetworkCost, machine: Machine, sub_batch: jax.Array
                  ) -> tuple[jax.Array, jax.Array]:
    """Forward and backward time of one copy of each row of the network's table.

    Matmul-like layers (conv, dense) run each pass as a GEMM at efficiency
    ``e_p s(rows) s(cols) s(depth) s(b)``, ``s(x) = x^g / (x^g + half_x^g)`` (``s(b)``: the
    sub-batch itself, 1 when ``half_efficiency_batch`` is 0): forward
    ``[b H_out W_out x k^2 C_in] x [k^2 C_in x C_out]``, input gradient
    ``[b H_in W_in x k^2 C_out] x [k^2 C_out x C_in]``, weight gradient
    ``[k^2 C_in x b H_out W_out] x [b H_out W_out x C_out]``. The time of a pass is the smooth
    maximum of that compute time and the memory time of its bytes (the roofline). A GEMM whose
    working set (activation bytes of the pass plus weights) outgrows the cache is slowed by
    ``1 + k * ws / (ws + cache_bytes)`` (``k``: ``cache_miss_slowdown``, or
    ``cache_miss_slowdown_weight_grad`` for the weight gradient). Memory-bound
    layers move their bytes at ``memory_efficiency`` of the bandwidth (``norm_memory_efficiency``
    for normalisation, ``maxpool_backward_memory_efficiency`` for the max-pool backward pass).

    Args:
      network: Cost table.
      machine: Machine (peak, memory bandwidth, efficiency fields).
      sub_batch: Samples per learner step (float allowed).

    Returns:
      ``(t_forward_s, t_backward_s)``, each of shape ``[rows]``, without per-layer overheads.
    """
    parts = _split_times(network, machine, sub_batch)
    if parts is None:
        return _layer_times(network, machine, sub_batch)
    order = np.argsort(np.concatenate([idx for idx, _ in parts]))
    t_fwd = jnp.concatenate([f for _, (f, _) in parts])[order]
    t_bwd = jnp.concatenate([b for _, (_, b) in parts])[order]
    return t_fwd, t_bwd


def _split_times(network: NetworkCost, machine: Machine, sub_batch: jax.Array):
    """Row times of the GEMM rows and of the memory-bound rows computed separately.

    Returns ``[(row indices, (t_fwd, t_bwd)), ...]``, or None when the table is traced (then the
    element-wise selection of :func:`_layer_times` is used). Splitting a concrete table halves
    the work of a vmapped evaluation.
    """
    try:
        kind = np.asarray(network.kind)
    except jax.errors.TracerArrayConversionError:
        return None
    is_mm = np.isin(kind, (KIND_CONV, KIND_DENSE, KIND_XLA))
    parts = []
    for mask, flag in ((is_mm, True), (~is_mm, False)):
        idx = np.nonzero(mask)[0]
        if idx.size:
            sub = jax.tree_util.tree_map(lambda a: a[idx] if jnp.ndim(a) == 1 else a, network)
            parts.append((idx, _layer_times(sub, machine, sub_batch, matmul=flag)))
    return parts


def device_step_time_s(network: NetworkCost, machine: Machine, sub_batch: jax.Array) -> jax.Array:
    """On-device forward + backward time of one sub-batch, plus per-layer and per-step overheads."""
    parts = _split_times(network, machine, sub_batch)
    if parts is None:
        parts = [(slice(None), _layer_times(network, machine, sub_batch))]
    total = machine.step_overhead_s + 3.0 * machine.per_layer_overhead_s * jnp.sum(network.count)
    for idx, (t_fwd, t_bwd) in parts:
        total = total + jnp.sum(network.count[idx] * (t_fwd + t_bwd))
    return total


def compute_time_s(network: NetworkCost, machine: Machine, sub_batch: jax.Array,
                   gpus_per_node: jax.Array | None = None) -> jax.Array:
    """Learner time ``T_c`` for one sub-batch gradient (see the module docstring).

    Args:
      network: Cost table.
      machine: Machine preset.
      sub_batch: ``N_Subbatch``, samples per learner step.
      gpus_per_node: Learners per node sharing the node's storage (default: the machine's).

    Returns:
      Seconds.
    """
    g = machine.gpus_per_node if gpus_per_node is None else jnp.asarray(gpus_per_node, jnp.float32)
    b = jnp.asarray(sub_batch, jnp.float32)
    t_input = b * network.input_bytes_per_sample * g / machine.storage_bandwidth_bytes_per_s
    param_bytes = BYTES_PER_VALUE * network.total_params
    t_copy = 2.0 * param_bytes / machine.host_device_bandwidth_bytes_per_s
    return device_step_time_s(network, machine, b) + t_input + t_copy


def update_time_s(network: NetworkCost, machine: Machine, nodes: jax.Array,
                  gpus_per_node: jax.Array | None = None, *, algorithm: str = "ring") -> jax.Array:
    """Updater cycle time ``T_u``: gather, momentum update and inter-node all-reduce of 4P bytes.

    ``T_u = (gpus_per_node + updater_passes) * 4P / host_bw + allreduce(4P, nodes) + overhead``.

    Args:
      network: Cost table (only the parameter count matters).
      machine: Machine preset.
      nodes: ``N_node`` (float allowed).
      gpus_per_node: ``N_gpu`` gradient buffers gathered per cycle (default: the machine's).
      algorithm: Inter-node all-reduce, one of :data:`jaxsprint.perf.collectives.ALGORITHMS`.

    Returns:
      Seconds.
    """
    g = machine.gpus_per_node if gpus_per_node is None else jnp.asarray(gpus_per_node, jnp.float32)
    param_bytes = BYTES_PER_VALUE * network.total_params
    t_host = (g + machine.updater_passes) * param_bytes / machine.host_memory_bandwidth_bytes_per_s
    t_net = collectives.allreduce_time_s(param_bytes, nodes, machine.network_latency_s,
                                         machine.network_bandwidth_bytes_per_s, algorithm=algorithm)
    return t_host + t_net + machine.updater_overhead_s


def memory_bytes(network: NetworkCost, sub_batch: jax.Array) -> jax.Array:
    """Accelerator memory of one learner: ``4 (3P + b * activations)`` bytes.

    Weights, gradients and one spare copy (convolution workspace), plus every layer output (and
    the input) kept for the backward pass, in fp32, without fusion or recomputation.
    """
    return BYTES_PER_VALUE * (3.0 * network.total_params
                              + jnp.asarray(sub_batch, jnp.float32) * network.activation_elems)


def max_sub_batch(network: NetworkCost, machine: Machine) -> int:
    """Largest sub-batch whose :func:`memory_bytes` fits the accelerator memory (0 if none)."""
    fixed = BYTES_PER_VALUE * 3.0 * float(network.total_params)
    per_sample = BYTES_PER_VALUE * float(network.activation_elems)
    return max(0, int(math.floor((float(machine.device_memory_bytes) - fixed) / per_sample)))



def runtime_compute_time_s(network: NetworkCost, machine: Machine, sub_batch: jax.Array,
                           learners: jax.Array, *, learners_per_host: jax.Array | None = None,
                           cores: jax.Array | None = None, updater_demand: jax.Array = 0.0,
                           updater_busy: jax.Array = 0.0) -> jax.Array:
    """Learner cycle ``T_c`` of the runtime: the smooth maximum of its three bounds (module docstring).

    Args:
      network: Cost table of the learners' network.
      machine: Machine (``learner_overhead_s``, ``learner_step_cores``, ``learner_step_cores_half_batch``,
        ``cores_per_node``).
      sub_batch: Samples per learner gradient.
      learners: ``N``, the learner threads sharing the cores (every host's when the hosts are processes
        of one machine).
      learners_per_host: ``N_h``, the learners of one process, which share its interpreter lock (default
        ``learners``).
      cores: ``C`` (default: the machine's ``cores_per_node``).
      updater_demand: ``H beta c_u``, the compute units the updaters take on average (0: none).
      updater_busy: ``beta``, the busy fraction of one host's updater (its share of the lock).

    Returns:
      Seconds.
    """
    n = jnp.asarray(learners, jnp.float32)
    step = compute_time_s(network, machine, sub_batch, gpus_per_node=n)
    return _learner_cycle(machine, step, sub_batch, n, learners_per_host, cores, updater_demand, updater_busy)


def _learner_cycle(machine, step, sub_batch, n, learners_per_host, cores, updater_demand, updater_busy):
    """:func:`runtime_compute_time_s` from its device step ``step`` (computed once by the callers)."""
    c = machine.cores_per_node if cores is None else cores
    n_h = n if learners_per_host is None else jnp.asarray(learners_per_host, jnp.float32)
    g = machine.learner_overhead_s
    lone = step + g
    lock = n_h * g / jnp.maximum(1e-3, 1.0 - 0.5 * updater_busy)
    units = n * step_cores(machine, sub_batch) * step / jnp.maximum(1e-3, c - updater_demand)
    k = RUNTIME_SHARPNESS
    top = jnp.maximum(jnp.maximum(lone, lock), units)  # scaled, so that the powers stay in float32 range
    return top * ((lone / top) ** k + (lock / top) ** k + (units / top) ** k) ** (1.0 / k)


def step_cores(machine: Machine, sub_batch: jax.Array) -> jax.Array:
    """Compute units one learner step takes on busy cores: ``1 + (p - 1) b / (b + b_half)``, ``p`` at ``b_half = 0``."""
    b = jnp.asarray(sub_batch, jnp.float32)
    half = machine.learner_step_cores_half_batch
    frac = jnp.where(half > 0, b / (b + jnp.maximum(half, 1e-30)), 1.0)
    return 1.0 + (machine.learner_step_cores - 1.0) * frac


def nonempty_probability(gradients_per_cycle: jax.Array) -> jax.Array:
    """Chance that an updater cycle gathers at least one gradient: ``1 - exp(-m)``, ``m`` the mean count."""
    return -jnp.expm1(-jnp.maximum(gradients_per_cycle, 0.0))


def runtime_update_time_s(network: NetworkCost, machine: Machine, nodes: jax.Array, learners: jax.Array,
                          network_time_s: jax.Array = 0.0, *, sharing_learners: jax.Array | None = None,
                          cores: jax.Array | None = None, algorithm: str = "ring", sub_batch: jax.Array | None = None,
                          co_located: bool = True, nonempty: jax.Array = 1.0) -> jax.Array:
    """Updater cycle ``T_u`` of the runtime (module docstring): its own work, the emulated network, the all-reduce.

    Args:
      network: Cost table (only the parameter count matters, and the device step for the queue term).
      machine: Machine (host bandwidth, ``updater_overhead_s``, ``updater_per_learner_s``, ``updater_queue``,
        ``updater_hosts_stretch``, ``updater_apply_s``, network figures).
      nodes: Hosts all-reducing every cycle (1: no all-reduce).
      learners: Learners of one host (the gradients its updater takes in).
      network_time_s: The runtime's emulated network time added to every cycle.
      sharing_learners: ``N``, the learner threads on the updater's cores (default ``learners``; every
        host's when the hosts are processes of one machine).
      cores: ``C`` (default: the machine's ``cores_per_node``).
      algorithm: Inter-node all-reduce, one of :data:`jaxsprint.perf.collectives.ALGORITHMS`.
      sub_batch: The learners' sub-batch, for the queue term (None: no queue term).
      co_located: The hosts are processes of one machine (their updaters stretch by ``1 + s_H``).
      nonempty: Fraction of cycles that gather a gradient and so apply an update (``updater_apply_s`` each;
        :func:`runtime_times` derives it from ``T_u / T_c``).

    Returns:
      Seconds.
    """
    t_base, t_apply, t_wait = _runtime_update_parts(network, machine, nodes, learners, network_time_s,
                                                    sharing_learners, cores, algorithm, sub_batch, co_located)
    return t_base + t_apply * nonempty + t_wait


def _runtime_update_parts(network, machine, nodes, learners, network_time_s, sharing_learners, cores, algorithm,
                          sub_batch=None, co_located=True):
    """``(own work of every cycle, own work of applying an update, the network's part)`` of
    :func:`runtime_update_time_s`: the own work of a cycle is ``base + apply x [it gathered a gradient]``."""
    c = machine.cores_per_node if cores is None else cores
    n = jnp.asarray(learners if sharing_learners is None else sharing_learners, jnp.float32)
    g = jnp.asarray(learners, jnp.float32)
    h = jnp.asarray(nodes, jnp.float32)
    param_bytes = BYTES_PER_VALUE * network.total_params
    t_host = (g + machine.updater_passes) * param_bytes / machine.host_memory_bandwidth_bytes_per_s
    t_queue = 0.0
    if sub_batch is not None:
        full = jnp.clip(n - c + 1.0, 0.0, 1.0)  # the learners alone keep every core busy
        t_queue = machine.updater_queue * full * compute_time_s(network, machine, sub_batch, gpus_per_node=learners)
    stretch = (1.0 + jnp.where(h > 1, machine.updater_hosts_stretch, 0.0)) if co_located else 1.0
    t_base = (t_host + machine.updater_overhead_s + machine.updater_per_learner_s * g + t_queue) * stretch
    t_net = collectives.allreduce_time_s(param_bytes, nodes, machine.network_latency_s,
                                         machine.network_bandwidth_bytes_per_s, algorithm=algorithm)
    return t_base, machine.updater_apply_s * stretch, t_net + jnp.asarray(network_time_s, jnp.float32)


class RuntimeTimes(NamedTuple):
    """What the model needs of a runtime configuration: both cycle means and their coefficients of variation."""

    t_compute_s: jax.Array  # mean learner cycle (s)
    t_update_s: jax.Array  # mean updater cycle (s)
    t_compute_cv: jax.Array
    t_update_cv: jax.Array


def runtime_times(network: NetworkCost, machine: Machine, *, learners_per_host: jax.Array,
                  sub_batch: jax.Array, hosts: jax.Array = 1, network_time_s: jax.Array = 0.0,
                  co_located: bool = True, algorithm: str = "ring") -> RuntimeTimes:
    """``T_c``, ``T_u`` and their cvs of a runtime configuration, from the machine's figures alone.

    The specs prediction of the runtime: feed the result to :func:`jaxsprint.perf.sprint.distributions`
    (``n = learners_per_host * hosts``, ``cv = t_compute_cv``, ``update_cv = t_update_cv``).

    Args:
      network: Cost table of the learners' network.
      machine: Machine preset (e.g. ``cpu_runtime``).
      learners_per_host: Learner threads per host.
      sub_batch: Samples per learner gradient.
      hosts: Processes (hosts) all-reducing every cycle.
      network_time_s: The emulated network time of every updater cycle.
      co_located: True when the hosts are processes of one machine sharing its ``cores_per_node`` cores
        (this project's tests and validation grid); False for separate machines.
      algorithm: Inter-node all-reduce.

    Returns:
      :class:`RuntimeTimes`. The learner's cv is the machine's ``learner_cv``; the updater's own work
      jitters with cv ``updater_cv`` while the network's part (an emulated wait, a collective) is taken as
      steady, so ``t_update_cv = updater_cv * own / T_u``.
    """
    per_host = jnp.asarray(learners_per_host, jnp.float32)
    h = jnp.asarray(hosts, jnp.float32)
    sharing = per_host * h if co_located else per_host
    updaters = h if co_located else jnp.float32(1.0)

    t_base, t_apply, t_wait = _runtime_update_parts(network, machine, hosts, per_host, network_time_s, sharing,
                                                    None, algorithm, sub_batch, co_located)
    step = compute_time_s(network, machine, sub_batch, gpus_per_node=sharing)

    def cycles(nonempty):  # scalar arithmetic only: the fixed point below repeats it
        t_own = t_base + t_apply * nonempty
        t_u = t_own + t_wait
        beta = t_own / t_u
        t_c = _learner_cycle(machine, step, sub_batch, sharing, per_host, None,
                             updaters * beta * machine.updater_cores, beta)
        return t_own, t_u, t_c

    t_own, t_u, t_c = cycles(1.0)
    for _ in range(RUNTIME_ITERATIONS):
        t_own, t_u, t_c = cycles(nonempty_probability(per_host * h * t_u / t_c))
    return RuntimeTimes(t_c, t_u, jnp.asarray(machine.learner_cv, jnp.float32), machine.updater_cv * t_own / t_u)
