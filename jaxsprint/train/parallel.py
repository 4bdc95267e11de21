"""Data parallelism with jit + NamedSharding: the mesh, the shardings and BN reduction.

Batches are sharded along the mesh axis ``data`` (each device holds a contiguous block of the global batch),
parameters, optimizer state and BN statistics are replicated. XLA inserts the gradient all-reduce. Several
processes (joined by `jaxsprint.cluster.initialize`) each hold an equal share of the mesh's devices.
"""
from __future__ import annotations

from typing import Mapping

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from jaxsprint.errors import ConfigError, check, is_int

DATA_AXIS = "data"
BN_REDUCTIONS = ("global", "per_device", "group")


def make_mesh(num_devices: int = -1) -> Mesh:
    """A 1-D mesh over `num_devices` global devices (-1: all), the same number from every process.

    Process p's devices are the block p of the mesh (its first ``num_devices / process_count`` local devices),
    so each host's slice of the global batch lands on its own devices (`shard_batch`).

    Raises:
      ConfigError: ``config.num_devices`` neither -1 nor a multiple of the process count in 1..device count.
    """
    available, hosts = jax.device_count(), jax.process_count()
    n = available if num_devices in (-1, None) else num_devices
    per_host = [sorted((d for d in jax.devices() if d.process_index == p), key=lambda d: d.id)
                for p in range(hosts)]
    most = min(len(devices) for devices in per_host) * hosts
    if not is_int(n) or n < 1 or n > most or n % hosts:
        raise ConfigError("config.num_devices", num_devices, f"-1 (all) or a multiple of the process count "
                          f"({hosts}) in 1..{most}")
    devices = [d for local in per_host for d in local[:n // hosts]]
    return jax.make_mesh((n,), (DATA_AXIS,), axis_types=(AxisType.Auto,), devices=devices)


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


def validate_config(config, num_devices: int, num_hosts: int | None = None) -> None:
    """Checks the parallel layout: ``config.num_devices``, the batch sizes and accumulation, ``config.bn``.

    Needs no data: call it before anything is read or written.

    Args:
      config: the run's config (see experiments/configs/default.py).
      num_devices: devices along ``data`` (the mesh's size, ``make_mesh(config.num_devices).size``).
      num_hosts: processes sharing the batch (default: ``jax.process_count()``).

    Raises:
      ConfigError: naming the first bad field: ``num_devices`` neither -1 nor the mesh's size; a batch size or
        ``grad_accum_steps`` that is not an integer >= 1; ``batch_size`` not divisible by devices x
        accumulation steps or by the hosts; ``eval_batch_size`` not a multiple of the devices and hosts; an
        unknown ``bn.reduction``; a ``bn.group_size`` that does not divide the per-device micro-batch.
    """
    hosts = jax.process_count() if num_hosts is None else num_hosts
    n = config.num_devices
    check(is_int(n) and (n == -1 or n == num_devices >= 1), "config.num_devices", n,
          f"-1 (every device) or the device count of the mesh ({num_devices})")
    b, k, eb = config.batch_size, config.grad_accum_steps, config.eval_batch_size
    check(is_int(b) and b >= 1, "config.batch_size", b, "an integer >= 1")
    check(is_int(k) and k >= 1, "config.grad_accum_steps", k, "an integer >= 1")
    check(b % (num_devices * k) == 0, "config.batch_size", b, f"divisible by the device count ({num_devices}) x "
          f"config.grad_accum_steps ({k}) = {num_devices * k}")
    check(b % hosts == 0, "config.batch_size", b, f"divisible by the host count ({hosts})")
    check(is_int(eb) and eb >= 1 and eb % num_devices == 0 and eb % hosts == 0, "config.eval_batch_size", eb,
          f"a positive multiple of the device count ({num_devices}) and of the host count ({hosts})")
    check(is_int(config.bn.group_size) and config.bn.group_size >= 0, "config.bn.group_size",
          config.bn.group_size, "an integer >= 0 (used by bn.reduction='group')")
    bn_group_size(config.bn.reduction, micro_batch=b // k, num_devices=num_devices, group_size=config.bn.group_size)


def shard_batch(batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Turns this host's slice of the global batch into global arrays sharded along ``data``."""
    sharding = data_sharding(mesh)
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in batch.items()}
