"""All-reduce time models in the alpha-beta (latency-bandwidth) form, pure jnp.

A message of ``M`` bytes between two ranks costs ``alpha + M * beta`` with ``alpha`` the latency in
seconds and ``beta = 1 / bandwidth`` in seconds per byte. For ``n`` ranks all-reducing ``M`` bytes:

* ring (reduce-scatter + all-gather): ``2 (n - 1) alpha + 2 (n - 1) / n * M beta``;
* binary tree (reduce to a root, then broadcast, no pipelining): ``2 log2(n) (alpha + M beta)``;
* Rabenseifner (recursive halving + doubling): ``2 log2(n) alpha + 2 (n - 1) / n * M beta``;
* hierarchical (NCCL-style, g ranks per node): intra-node reduce-scatter, inter-node all-reduce of
  each rank's ``M / g`` shard over ``n_node`` nodes with the node's bandwidth split among the g
  concurrent rings, intra-node all-gather.

``n`` may be a float (for gradients w.r.t. a relaxed node count); ``log2`` is then continuous,
which equals the number of rounds exactly for powers of two and is a lower bound otherwise
(``exact_rounds=True`` uses ``ceil(log2 n)``). The reduction arithmetic itself is neglected
(it runs at memory speed, far above network bandwidth). With ``n = 1`` every form gives 0.

NCCL reports "bus bandwidth" = algorithm bandwidth times ``2 (n - 1) / n`` for all-reduce
(:func:`bus_bandwidth_factor`), i.e. the bandwidth term of the ring form.

References:
  Thakur, Rabenseifner, Gropp, "Optimization of collective communication operations in MPICH",
  IJHPCA 19(1), 2005.
  Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations",
  JPDC 69(2), 2009.
  NVIDIA, nccl-tests PERFORMANCE.md (bus bandwidth).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxsprint.errors import ConfigError

ALGORITHMS = ("ring", "tree", "rabenseifner")


def _rounds(n: jax.Array, exact_rounds: bool) -> jax.Array:
    log2n = jnp.log2(jnp.maximum(n, 1.0))
    return jnp.ceil(log2n - 1e-6) if exact_rounds else log2n


def bus_bandwidth_factor(n: jax.Array) -> jax.Array:
    """NCCL's all-reduce bus-bandwidth factor ``2 (n - 1) / n``."""
    n = jnp.asarray(n, jnp.float32)
    return 2.0 * (n - 1.0) / n


def ring_allreduce_time_s(message_bytes: jax.Array, n: jax.Array, latency_s: jax.Array,
                          bandwidth_bytes_per_s: jax.Array) -> jax.Array:
    """Ring all-reduce: ``2 (n - 1) alpha + 2 (n - 1) / n * M / bandwidth`` seconds."""
    n = jnp.asarray(n, jnp.float32)
    return 2.0 * (n - 1.0) * latency_s + bus_bandwidth_factor(n) * message_bytes / bandwidth_bytes_per_s


def tree_allreduce_time_s(message_bytes: jax.Array, n: jax.Array, latency_s: jax.Array,
                          bandwidth_bytes_per_s: jax.Array, *, exact_rounds: bool = False) -> jax.Array:
    """Binary-tree reduce + broadcast: ``2 log2(n) (alpha + M / bandwidth)`` seconds."""
    rounds = _rounds(jnp.asarray(n, jnp.float32), exact_rounds)
    return 2.0 * rounds * (latency_s + message_bytes / bandwidth_bytes_per_s)


def rabenseifner_allreduce_time_s(message_bytes: jax.Array, n: jax.Array, latency_s: jax.Array,
                                  bandwidth_bytes_per_s: jax.Array, *,
                                  exact_rounds: bool = False) -> jax.Array:
    """Recursive halving + doubling: ``2 log2(n) alpha + 2 (n - 1) / n * M / bandwidth`` seconds."""
    n = jnp.asarray(n, jnp.float32)
    rounds = _rounds(n, exact_rounds)
    return 2.0 * rounds * latency_s + bus_bandwidth_factor(n) * message_bytes / bandwidth_bytes_per_s


def allreduce_time_s(message_bytes: jax.Array, n: jax.Array, latency_s: jax.Array,
                     bandwidth_bytes_per_s: jax.Array, *, algorithm: str = "ring",
                     exact_rounds: bool = False) -> jax.Array:
    """All-reduce time of ``message_bytes`` over ``n`` ranks by one of :data:`ALGORITHMS`.

    Args:
      message_bytes: Bytes each rank contributes (and receives reduced).
      n: Number of ranks (float allowed).
      latency_s: Per-message latency alpha.
      bandwidth_bytes_per_s: Per-rank link bandwidth (1 / beta), per direction.
      algorithm: ``"ring"``, ``"tree"`` or ``"rabenseifner"`` (static).
      exact_rounds: Use ``ceil(log2 n)`` rounds for the log forms.

    Returns:
      Seconds.

    Raises:
      ConfigError: an unknown algorithm.
    """
    if algorithm == "ring":
        return ring_allreduce_time_s(message_bytes, n, latency_s, bandwidth_bytes_per_s)
    if algorithm == "tree":
        return tree_allreduce_time_s(message_bytes, n, latency_s, bandwidth_bytes_per_s,
                                     exact_rounds=exact_rounds)
    if algorithm == "rabenseifner":
        return rabenseifner_allreduce_time_s(message_bytes, n, latency_s, bandwidth_bytes_per_s,
                                             exact_rounds=exact_rounds)
    raise ConfigError("algorithm", algorithm, f"one of {', '.join(ALGORITHMS)}")


def hierarchical_allreduce_time_s(message_bytes: jax.Array, nodes: jax.Array,
                                  ranks_per_node: jax.Array, *, intra_latency_s: jax.Array,
                                  intra_bandwidth_bytes_per_s: jax.Array,
                                  inter_latency_s: jax.Array,
                                  inter_bandwidth_bytes_per_s: jax.Array,
                                  inter_algorithm: str = "ring") -> jax.Array:
    """Hierarchical all-reduce over ``nodes x ranks_per_node`` ranks.

    ``g = ranks_per_node``: intra-node ring reduce-scatter ``(g - 1) alpha_i + (g - 1) / g * M /
    bw_i``, then ``g`` concurrent inter-node all-reduces of ``M / g`` bytes, each with
    ``inter_bandwidth / g`` (the node's network bandwidth is shared), then an intra-node all-gather
    with the same cost as the reduce-scatter.

    Args:
      message_bytes: Bytes per rank.
      nodes: Number of nodes.
      ranks_per_node: Ranks (GPUs) per node.
      intra_latency_s: Intra-node message latency.
      intra_bandwidth_bytes_per_s: Intra-node bandwidth per rank.
      inter_latency_s: Inter-node message latency.
      inter_bandwidth_bytes_per_s: Inter-node bandwidth per node (all rails).
      inter_algorithm: Algorithm of the inter-node stage (:data:`ALGORITHMS`).

    Returns:
      Seconds.
    """
    g = jnp.asarray(ranks_per_node, jnp.float32)
    intra = (g - 1.0) * intra_latency_s + (g - 1.0) / g * message_bytes / intra_bandwidth_bytes_per_s
    inter = allreduce_time_s(message_bytes / g, nodes, inter_latency_s,
                             inter_bandwidth_bytes_per_s / g, algorithm=inter_algorithm)
    return 2.0 * intra + inter


__all__ = ["ALGORITHMS", "allreduce_time_s", "bus_bandwidth_factor",
           "hierarchical_allreduce_time_s", "rabenseifner_allreduce_time_s",
           "ring_allreduce_time_s", "tree_allreduce_time_s"]
