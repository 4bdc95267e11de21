"""Data parallelism with jit + NamedSharding: the mesh, the shardings, BN reduction and multi-host start-up.

Batches are sharded along the mesh axis ``data`` (each device holds a contiguous block of the global batch),
parameters, optimizer state and BN statistics are replicated. XLA inserts the gradient all-reduce.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxsprint.errors import ConfigError

DATA_AXIS = "data"
BN_REDUCTIONS = ("global", "per_device", "group")


def make_mesh(num_devices: int = -1) -> Mesh:
    """A 1-D mesh over the first `num_devices` devices (-1: all, across every host)."""
    available = jax.device_count()
    n = available if num_devices in (-1, None) else int(num_devices)
    if n < 1 or n > available:
        raise ConfigError("config.num_devices", num_devices, f"allowed: -1 (all) or 1..{available}")
    devices = np.asarray(jax.devices()[:n])
    return Mesh(devices, (DATA_AXIS,))


def data_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split along ``data``."""
    return NamedSharding(mesh, P(DATA_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def bn_group_size(reduction: str, *, micro_batch: int, num_devices: int, group_size: int = 0) -> int | None:
    """Examples per BatchNorm normalisation group for a reduction mode.

    Args:
      reduction: "global" (whole micro-batch, synchronised BN), "per_device" (each device's slice) or
        "group" (`group_size` examples).
      micro_batch: global examples in one forward pass (global batch / accumulation steps).
      num_devices: devices along ``data``.
      group_size: for "group".

    Returns:
      None for global statistics, else the group size (which divides the per-device batch, so every group
      lives on one device).
    """
    if reduction not in BN_REDUCTIONS:
        raise ConfigError("config.bn.reduction", reduction, f"allowed: {', '.join(BN_REDUCTIONS)}")
    per_device = micro_batch // num_devices
    if reduction == "global":
        return None
    if reduction == "per_device":
        return per_device
    if group_size < 1 or per_device % group_size:
        raise ConfigError("config.bn.group_size", group_size,
                          f"must be >= 1 and divide the per-device micro-batch {per_device}")
    return group_size


def shard_batch(batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Turns this host's slice of the global batch into global arrays sharded along ``data``."""
    sharding = data_sharding(mesh)
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in batch.items()}


def distributed_init_kwargs(env: Mapping[str, str], *, coordinator_address: str | None = None,
                            num_processes: int | None = None, process_id: int | None = None
                            ) -> dict[str, Any] | None:
    """Decides whether (and how) to call ``jax.distributed.initialize``.

    Returns keyword arguments for it when the run is multi-process: explicit flags win; otherwise a SLURM job
    with more than one task, or the JAX_COORDINATOR_ADDRESS variable, lets JAX auto-detect. None for a
    single-process run.
    """
    if coordinator_address or (num_processes or 0) > 1:
        if not coordinator_address or num_processes is None or process_id is None:
            raise ConfigError("--coordinator_address/--num_processes/--process_id",
                              (coordinator_address, num_processes, process_id),
                              "give all three for an explicit multi-process run")
        if not 0 <= process_id < num_processes:
            raise ConfigError("--process_id", process_id, f"allowed: 0..{num_processes - 1}")
        return dict(coordinator_address=coordinator_address, num_processes=num_processes, process_id=process_id)
    if int(env.get("SLURM_NTASKS", "1") or 1) > 1:
        return {}
    if env.get("JAX_COORDINATOR_ADDRESS"):
        return {}
    return None


def maybe_initialize_distributed(**flags) -> bool:
    """Calls ``jax.distributed.initialize`` for a multi-process run; returns whether it did."""
    kwargs = distributed_init_kwargs(os.environ, **flags)
    if kwargs is None:
        return False
    jax.distributed.initialize(**kwargs)
    return True
