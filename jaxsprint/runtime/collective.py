"""Cross-host collectives of the SPRINT runtime: one process per host, joined by ``jax.distributed``.

Only the updaters talk across hosts, and they are synchronous with each other, so every process issues the
same collectives in the same order from one thread at a time (the updater thread during the run, the main
thread before and after it): the multi-controller rule of JAX. Each collective is a jitted ``psum`` under
``shard_map`` over a mesh of ONE device per process (gloo on CPU, NCCL on GPU), with the local value as that
process's shard. ``psum`` only: ``psum_scatter`` over gloo returned wrong values for large chunks (jax
#40830).

`HostCollective.gather` moves 8-byte data (event times in float64, versions) bit-exactly through an int32
``psum`` in which every other host contributes zeros, because with 64-bit types disabled JAX would round
float64 to float32.

The processes are joined by `jaxsprint.cluster.initialize` (which the launchers call) before JAX starts.
"""
from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxsprint.errors import check

AXIS = "hosts"


class HostCollective:
    """All-reduce and all-gather across the processes, over one device per process."""

    def __init__(self, *, last_device: bool = False):
        """Over the first local device of every process, or its last with `last_device` (the same on all)."""
        self.num_hosts = jax.process_count()
        self.host = jax.process_index()
        pick = max if last_device else min
        devices = [pick((d for d in jax.devices() if d.process_index == p), key=lambda d: d.id)
                   for p in range(self.num_hosts)]
        self.device = devices[self.host]
        self._mesh = Mesh(np.asarray(devices), (AXIS,))
        self._sharding = NamedSharding(self._mesh, P(AXIS))
        self._psum = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, AXIS), mesh=self._mesh, in_specs=P(AXIS),
                                           out_specs=P()))

    def allreduce(self, x: np.ndarray) -> np.ndarray:
        """The sum over hosts of `x` (same shape and dtype on every host; float32 or int32)."""
        x = np.asarray(x)
        arr = jax.make_array_from_process_local_data(self._sharding, x[None])
        out = self._psum(arr)
        return np.asarray(out.addressable_data(0))[0]

    def barrier(self) -> None:
        """Returns when every host has reached it (an all-reduce of one number)."""
        got = self.allreduce(np.ones(1, np.int32))
        if int(got[0]) != self.num_hosts:
            raise RuntimeError(f"barrier: {int(got[0])} of {self.num_hosts} hosts answered")

    def gather(self, rows: np.ndarray) -> list[np.ndarray]:
        """Every host's `rows` (2-D, 8-byte dtype, the same number of columns everywhere), bit-exact."""
        rows = np.ascontiguousarray(rows)
        check(rows.ndim == 2 and rows.dtype.itemsize == 8, "rows", rows.shape, "a 2-D array of an 8-byte dtype")
        counts = np.zeros(self.num_hosts, np.int32)
        counts[self.host] = len(rows)
        counts = self.allreduce(counts)
        width = rows.shape[1] * 2
        buf = np.zeros((self.num_hosts, max(int(counts.max()), 1), width), np.int32)
        buf[self.host, :len(rows)] = rows.view(np.int32).reshape(len(rows), width)
        total = self.allreduce(buf)
        return [np.ascontiguousarray(total[h, :int(counts[h])]).view(rows.dtype).reshape(int(counts[h]), -1)
                for h in range(self.num_hosts)]
