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

The runtime's cost form on a host (learners sharing cores, the updater's own cost) builds on these times
with its own figures: :mod:`jaxsprint.calibration.host`.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxsprint.perf import collectives
from jaxsprint.perf.machines import Machine
from jaxsprint.perf.networks import (BYTES_PER_VALUE, KIND_CONV, KIND_DENSE, KIND_MAXPOOL, KIND_NORM, KIND_XLA,
                                     NetworkCost)

__all__ = ["SMOOTH_MAX_EPS", "compute_time_s", "device_step_time_s", "layer_times_s", "max_sub_batch",
           "memory_bytes", "smooth_max", "update_time_s"]

SMOOTH_MAX_EPS = 0.05  # relative width of the roofline's smooth corner


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
